//! Per-bridge metrics (`[[bridge]]`, issue 15): one family per name of
//! [`names::BRIDGE`](super::names::BRIDGE), labelled by the bridge's name, registered once per
//! broker; [`super::Metrics::bridge`] takes one bridge's children once (at start), so the
//! bridge's events update them without a label lookup.
//!
//! The three queue gauges and the share gauge are scrape-time figures (read from the
//! bridge's local session and its share at each reading, like the session backlog): their
//! families live in the scrape collector, so a reading runs the refresh hook before it
//! collects them.

use super::handles::{counter_of, gauge_of, Counter, Gauge, Reg};
use super::names;

/// The `direction` label values, indexed as `bridge::Flow` (`Out` = 0, `In` = 1).
pub(crate) const DIRECTIONS: [&str; 2] = ["out", "in"];

/// The `reason` label values of `postbox_bridge_dropped_total`: a message crossed too many
/// bridges (`max_hops`), its topic maps to nothing valid (`topic`), the receiving side refused
/// it (`refused`), or it is larger than the remote's Maximum Packet Size (`too_large`). What
/// the bridge's full queue drops (`queue_overflow`) is counted where every queue's drops are,
/// `postbox_messages_dropped_total{reason="queue_full"}`.
pub(crate) const DROP_REASONS: [&str; 5] = ["max_hops", "topic", "refused", "too_large", "memory"];

/// The families updated by the bridges' events.
#[derive(Clone, Debug)]
pub(super) struct BridgeFamilies {
    up: prometheus::GaugeVec,
    reconnects: prometheus::IntCounterVec,
    forwarded: prometheus::IntCounterVec,
    dropped: prometheus::IntCounterVec,
}

impl BridgeFamilies {
    /// Registers the event families in `r` (no series until a bridge takes its children).
    pub(super) fn register(r: Reg<'_>) -> BridgeFamilies {
        use names::*;
        BridgeFamilies {
            up: r.gauge_vec(
                BRIDGE_UP,
                "1 while the bridge's link to its remote broker is up (CONNACK accepted), else 0.",
                &["bridge"],
            ),
            reconnects: r.counter_vec(
                BRIDGE_RECONNECTS_TOTAL,
                "Successful connects of the bridge to its remote after the first.",
                &["bridge"],
            ),
            forwarded: r.counter_vec(
                BRIDGE_FORWARDED_TOTAL,
                "Messages forwarded across the bridge (QoS 1/2: acknowledged by the receiving side), by direction (out: to the remote, in: from it).",
                &["bridge", "direction"],
            ),
            dropped: r.counter_vec(
                BRIDGE_DROPPED_TOTAL,
                "Messages the bridge did not forward, by direction and reason (max_hops, topic, refused, too_large).",
                &["bridge", "direction", "reason"],
            ),
        }
    }
}

/// The scrape-time families: what the bridge's local session holds for the remote, and
/// what the remote's messages hold here.
#[derive(Clone, Debug)]
pub(super) struct BridgeQueueFamilies {
    messages: prometheus::GaugeVec,
    bytes: prometheus::GaugeVec,
    oldest_seconds: prometheus::GaugeVec,
    share_bytes: prometheus::GaugeVec,
}

impl BridgeQueueFamilies {
    /// The families, not registered (the scrape collector reports them).
    pub(super) fn new() -> BridgeQueueFamilies {
        use names::*;
        let vec = |name: &str, help: &str| {
            prometheus::GaugeVec::new(prometheus::Opts::new(name, help), &["bridge"])
                .expect("valid metric name")
        };
        BridgeQueueFamilies {
            messages: vec(
                BRIDGE_QUEUED_MESSAGES,
                "Messages the bridge's local session holds for the remote: queued, or sent and not yet acknowledged by it.",
            ),
            bytes: vec(
                BRIDGE_QUEUED_BYTES,
                "Bytes (topic, payload, properties) of the messages the bridge's local session holds for the remote.",
            ),
            oldest_seconds: vec(
                BRIDGE_OLDEST_QUEUED_SECONDS,
                "Age of the oldest message the bridge's local session holds for the remote, seconds (0: none).",
            ),
            share_bytes: vec(
                BRIDGE_SHARE_BYTES,
                "Bytes the bridge's remote's messages make this broker hold now, counted in the bridge's share of the memory budget (an eighth) where they are strangers' here.",
            ),
        }
    }

    /// Every family, for the collector.
    pub(super) fn collectors(&self) -> [&dyn prometheus::core::Collector; 4] {
        [
            &self.messages,
            &self.bytes,
            &self.oldest_seconds,
            &self.share_bytes,
        ]
    }
}

/// One bridge's handles, taken once.
#[derive(Clone, Debug)]
pub struct BridgeMetrics {
    /// `postbox_bridge_up{bridge}`.
    pub up: Gauge,
    /// `postbox_bridge_reconnects_total{bridge}`.
    pub reconnects: Counter,
    /// `postbox_bridge_queued_messages{bridge}` (set by the scrape hook).
    pub queued_messages: Gauge,
    /// `postbox_bridge_queued_bytes{bridge}` (set by the scrape hook).
    pub queued_bytes: Gauge,
    /// `postbox_bridge_oldest_queued_seconds{bridge}` (set by the scrape hook).
    pub oldest_queued_seconds: Gauge,
    /// `postbox_bridge_share_bytes{bridge}` (set by the scrape hook).
    pub share_bytes: Gauge,
    /// `postbox_bridge_forwarded_total{bridge,direction}`, by [`DIRECTIONS`] index.
    forwarded: [Counter; 2],
    /// `postbox_bridge_dropped_total{bridge,direction,reason}`, by [`DIRECTIONS`] then
    /// [`DROP_REASONS`] index.
    dropped: [[Counter; DROP_REASONS.len()]; 2],
}

impl BridgeMetrics {
    /// The children of bridge `name` in every family; the series exist (at 0) from now on.
    pub(super) fn new(
        name: &str,
        families: &BridgeFamilies,
        queue: &BridgeQueueFamilies,
    ) -> BridgeMetrics {
        BridgeMetrics {
            up: gauge_of(&families.up, &[name]),
            reconnects: counter_of(&families.reconnects, &[name]),
            queued_messages: gauge_of(&queue.messages, &[name]),
            queued_bytes: gauge_of(&queue.bytes, &[name]),
            oldest_queued_seconds: gauge_of(&queue.oldest_seconds, &[name]),
            share_bytes: gauge_of(&queue.share_bytes, &[name]),
            forwarded: DIRECTIONS.map(|d| counter_of(&families.forwarded, &[name, d])),
            dropped: DIRECTIONS
                .map(|d| DROP_REASONS.map(|r| counter_of(&families.dropped, &[name, d, r]))),
        }
    }

    /// The forwarded counter of `direction` (0 = out, 1 = in; anything else counts as in).
    pub fn forwarded(&self, direction: usize) -> &Counter {
        &self.forwarded[direction.min(1)]
    }

    /// The dropped counter of `direction` and `reason`; `None` for a reason not in
    /// [`DROP_REASONS`].
    pub fn dropped(&self, direction: usize, reason: &str) -> Option<&Counter> {
        let index = DROP_REASONS.iter().position(|r| *r == reason)?;
        Some(&self.dropped[direction.min(1)][index])
    }
}
