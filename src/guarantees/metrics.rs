//! The guarantees' metric group, declared here against the broker's registry so `metrics`
//! stays a leaf that knows neither [`DeadReason`] nor the dedup window (issue 36):
//! dead letters published and not published (`[dead_letter]`), and the dedup window's
//! duplicates, entries and evictions (`[dedup]`). Registered with every broker, so the
//! series exist (at 0) while a part is off.
//!
//! Must not: look a handle up by label per message.

use crate::metrics::{names, Counter, Gauge, Metrics};

use super::DeadReason;

/// Handles to the guarantees' series: registered once per broker by `Broker::new`; the
/// broker counts dead letters into them, the dedup window gets [`GuaranteeMetrics::dedup`]
/// when it is installed. Plain handles: an atomic add each, no label lookup.
#[derive(Clone, Debug)]
pub struct GuaranteeMetrics {
    /// Dead letters published, in [`DeadReason::ALL`] order (index with
    /// [`DeadReason::index`]).
    pub dead_letters: [Counter; DeadReason::ALL.len()],
    /// Dead letters not published because they were over `dead_letter.max_rate`.
    pub dead_letters_dropped_rate: Counter,
    /// Dead letters not published because the store (or a `refuse` queue) refused them.
    pub dead_letters_dropped_refused: Counter,
    /// Dead letters an anonymous client caused, not published because anonymous clients are
    /// at their share of the memory budget.
    pub dead_letters_dropped_share: Counter,
    /// `[dedup]`: duplicates, entries, evictions (zero while off).
    pub dedup: DedupMetrics,
}

impl GuaranteeMetrics {
    /// Declares the dead-letter and dedup series in `metrics`' registry (once per broker: a
    /// second call panics on the duplicate names).
    pub(crate) fn register(metrics: &Metrics) -> GuaranteeMetrics {
        let r = metrics.registrar();
        let [dead_letters_dropped_rate, dead_letters_dropped_refused, dead_letters_dropped_share] =
            r.counter_family(
                names::DEAD_LETTERS_DROPPED_TOTAL,
                "Dead letters not published, by reason (rate: over dead_letter.max_rate; refused: the store refused it; share: an anonymous client caused it and anonymous clients are at their share of the memory budget).",
                "reason",
            )
            .counters(["rate", "refused", "share"]);
        GuaranteeMetrics {
            dead_letters: r.counter_family(
                names::DEAD_LETTERS_TOTAL,
                "Dead letters published ([dead_letter]), by the reason their message was dropped (queue_full, expired, too_large, schema_invalid, max_deliveries, rejected).",
                "reason",
            )
            .counters(DeadReason::ALL.map(DeadReason::as_str)),
            dead_letters_dropped_rate,
            dead_letters_dropped_refused,
            dead_letters_dropped_share,
            dedup: DedupMetrics {
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
            },
        }
    }
}

/// The dedup window's figures (`[dedup]`, [`super::dedup`]): duplicates answered without
/// routing, keys remembered now, keys pushed out by the bounds before their window closed.
/// Kept by the window itself (an atomic add under its lock's shadow), so a scrape reads them
/// without touching the window.
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
    /// Handles registered nowhere: a window built outside a broker (unit tests).
    pub fn detached() -> DedupMetrics {
        DedupMetrics {
            duplicates: Counter::detached(),
            entries: Gauge::detached(),
            evicted: Counter::detached(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every guarantees series is exported (at 0, with HELP) once the group is registered,
    /// one `reason` child per [`DeadReason`], and the handles move them.
    #[test]
    fn the_guarantees_group_is_exported_and_follows_its_handles() {
        let m = Metrics::register();
        let g = GuaranteeMetrics::register(&m);
        g.dead_letters[DeadReason::Expired.index()].increment(2);
        g.dead_letters_dropped_rate.increment(1);
        g.dedup.entries.set(3.0);
        let out = m.render();
        crate::metrics::assert_described(&out, names::GUARANTEES.iter().copied());
        crate::metrics::assert_has_lines(
            &out,
            [
                "postbox_dead_letters_total{reason=\"expired\"} 2",
                "postbox_dead_letters_total{reason=\"queue_full\"} 0",
                "postbox_dead_letters_dropped_total{reason=\"rate\"} 1",
                "postbox_dead_letters_dropped_total{reason=\"refused\"} 0",
                "postbox_dedup_entries 3",
                "postbox_dedup_duplicates_total 0",
            ],
        );
        assert_eq!(
            out.matches("postbox_dead_letters_total{").count(),
            DeadReason::ALL.len()
        );
    }
}
