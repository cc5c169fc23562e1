//! The dedup window's figures (`[dedup]`, `crate::guarantees::dedup`): duplicates answered
//! without routing, keys remembered now, keys pushed out by the bounds before their window
//! closed. Kept by the window itself (an atomic add under its lock's shadow), so a scrape
//! reads them without touching the window.

use super::handles::{Counter, Gauge, Reg};
use super::names;

/// Handles to the dedup metrics; registered with every broker (zero while `[dedup]` is
/// off), handed to the window by `Broker::install_guarantees`.
#[derive(Clone, Debug)]
pub struct DedupMetrics {
    /// `postbox_dedup_duplicates_total`: PUBLISHes acknowledged and not routed, their key seen
    /// inside the window.
    pub duplicates: Counter,
    /// `postbox_dedup_entries`: (topic, key) pairs remembered now.
    pub entries: Gauge,
    /// `postbox_dedup_evicted_total`: pairs forgotten before their window closed because
    /// `max_entries` or `max_bytes` was reached (oldest first): a re-send of one of them
    /// would be routed again.
    pub evicted: Counter,
}

impl DedupMetrics {
    /// Registers the three series in `r`.
    pub(super) fn register(r: Reg<'_>) -> DedupMetrics {
        DedupMetrics {
            duplicates: r.counter(
                names::DEDUP_DUPLICATES_TOTAL,
                "PUBLISHes acknowledged and not routed: their (topic, dedup.property) was seen within dedup.window.",
            ),
            entries: r.gauge(
                names::DEDUP_ENTRIES,
                "(topic, message id) pairs the dedup window remembers now.",
            ),
            evicted: r.counter(
                names::DEDUP_EVICTED_TOTAL,
                "Dedup pairs forgotten before their window closed (dedup.max_entries or dedup.max_bytes reached, oldest first).",
            ),
        }
    }

    /// Handles registered nowhere: a window built outside a broker (unit tests).
    pub fn detached() -> DedupMetrics {
        DedupMetrics {
            duplicates: Counter::detached(),
            entries: Gauge(prometheus::Gauge::new("detached", "detached").expect("valid name")),
            evicted: Counter::detached(),
        }
    }
}
