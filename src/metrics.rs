//! TEMPORARY stand-in (replaced on merge).
use metrics::{Counter, Gauge};

/// Handles.
#[derive(Clone)]
pub struct Metrics {
    pub connections_current: Gauge,
    pub connections_total: Counter,
    pub sessions_current: Gauge,
    pub subscriptions_current: Gauge,
    pub retained_messages: Gauge,
    pub messages_received: [Counter; 3],
    pub messages_sent: [Counter; 3],
    pub bytes_received: Counter,
    pub bytes_sent: Counter,
    pub messages_dropped_queue_full: Counter,
    pub messages_dropped_qos0_offline: Counter,
    pub messages_dropped_too_large: Counter,
    pub malformed_packets: Counter,
    pub protocol_errors: Counter,
    pub keepalive_timeouts: Counter,
    pub will_messages_published: Counter,
    pub session_takeovers: Counter,
}
impl Metrics {
    /// x
    pub fn register() -> Metrics {
        Metrics {
            connections_current: Gauge::noop(),
            connections_total: Counter::noop(),
            sessions_current: Gauge::noop(),
            subscriptions_current: Gauge::noop(),
            retained_messages: Gauge::noop(),
            messages_received: [Counter::noop(), Counter::noop(), Counter::noop()],
            messages_sent: [Counter::noop(), Counter::noop(), Counter::noop()],
            bytes_received: Counter::noop(),
            bytes_sent: Counter::noop(),
            messages_dropped_queue_full: Counter::noop(),
            messages_dropped_qos0_offline: Counter::noop(),
            messages_dropped_too_large: Counter::noop(),
            malformed_packets: Counter::noop(),
            protocol_errors: Counter::noop(),
            keepalive_timeouts: Counter::noop(),
            will_messages_published: Counter::noop(),
            session_takeovers: Counter::noop(),
        }
    }
}
/// x
pub fn install_exporter(bind: std::net::SocketAddr) -> anyhow::Result<()> {
    let _ = bind;
    Ok(())
}
