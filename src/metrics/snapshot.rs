//! A plain reading of the figures `$SYS` and the admin API show: numbers, not series, so
//! their writers need neither the registry nor label names.

use std::sync::atomic::Ordering;

use super::{Counter, Metrics};

/// The broker's headline figures at one moment ([`Metrics::snapshot`]). Counters are totals
/// since start; the rest are current values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Clients whose CONNECT was accepted and who are connected now (all listeners).
    pub clients_connected: u64,
    /// CONNECTs accepted since start.
    pub clients_total: u64,
    /// Most clients connected at once since start.
    pub clients_peak: u64,
    /// Sessions ended because their expiry interval passed.
    pub clients_expired: u64,
    /// Sessions held, connected or not.
    pub sessions: u64,
    /// Subscriptions across all sessions.
    pub subscriptions: u64,
    /// Retained messages stored.
    pub retained: u64,
    /// PUBLISH packets received from clients, all QoS.
    pub messages_received: u64,
    /// PUBLISH packets sent to clients, all QoS.
    pub messages_sent: u64,
    /// Messages dropped instead of delivered, all reasons and QoS.
    pub messages_dropped: u64,
    /// Bytes read from client connections.
    pub bytes_received: u64,
    /// Bytes written to client connections.
    pub bytes_sent: u64,
    /// Messages waiting in session queues, all sessions.
    pub messages_queued: u64,
}

/// Sum of counters.
fn sum<'a>(counters: impl IntoIterator<Item = &'a Counter>) -> u64 {
    counters.into_iter().map(Counter::get).sum()
}

/// A gauge's value as a count (gauges hold `f64`; these hold whole, non-negative numbers).
#[allow(clippy::cast_sign_loss)] // only positive values are cast
fn count(v: f64) -> u64 {
    if v > 0.0 {
        v as u64
    } else {
        0
    }
}

/// Reads the figures (the caller refreshed the scrape-time ones).
pub(super) fn take(m: &Metrics) -> MetricsSnapshot {
    let f = &m.scrape.figures;
    MetricsSnapshot {
        clients_connected: m.clients.now.load(Ordering::Relaxed),
        clients_total: m.client_connects_total(),
        clients_peak: m.clients.peak.load(Ordering::Relaxed),
        clients_expired: m.sessions_expired.get(),
        sessions: count(m.sessions_current.get()),
        subscriptions: count(m.subscriptions_current.get()),
        retained: count(m.retained_messages.get()),
        messages_received: sum(&m.messages_received),
        messages_sent: sum(&m.messages_sent),
        messages_dropped: sum(m
            .messages_dropped_queue_full
            .iter()
            .chain([&m.messages_dropped_qos0_offline])
            .chain(&m.messages_dropped_too_large)
            .chain(&m.messages_dropped_max_deliveries)
            .chain(&m.messages_dropped_memory)
            .chain(&m.messages_dropped_expired)
            .chain(&m.messages_dropped_denied)
            .chain(&m.messages_dropped_no_subscribers)
            .chain(&m.messages_dropped_schema_invalid)),
        bytes_received: m.bytes_received.get(),
        bytes_sent: m.bytes_sent.get(),
        messages_queued: count(f.messages_queued.get()),
    }
}
