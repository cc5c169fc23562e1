//! `$SYS` topics: the broker's own figures under Mosquitto's names, for operators who watch a
//! broker with `mosquitto_sub -t '$SYS/#' -v` rather than Prometheus.
//!
//! One task publishes them every `mqtt.sys_interval` seconds through the router, as a message
//! from nobody (like a will: no origin session): routed like any message, so an ACL decides who
//! may read them; retained (a new subscriber gets the current values at once), QoS 0. It holds
//! no session, so it never shows in the session counts, the admin API or
//! `$SYS/broker/clients/*` itself, and takes no client id from clients. A value is published
//! again only when it changed (the uptime always does), as Mosquitto does. They are kept in
//! memory only (`broker::routing` stores no `$SYS` retained message), so a restart never
//! serves a stale figure: the first round runs at start. Clients cannot publish under `$SYS`
//! (`connection::client::inbound`, wills in `broker::lifecycle`).
//!
//! The figures are read from the broker's metrics once per round (atomics, no lock);
//! nothing here touches the message path.
//!
//! Must not: touch the message path; persist its values; hold a session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use tokio_util::sync::CancellationToken;

use super::message::Message;
use super::Broker;
use crate::codec::{Publish, PublishProperties, QoS};

/// The windows of the load averages, in seconds, and their topic suffixes.
const LOAD_WINDOWS: [(f64, &str); 3] = [(60.0, "1min"), (300.0, "5min"), (900.0, "15min")];

/// The figures one round publishes, read once per round.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SysFigures {
    /// Seconds since the broker started.
    pub uptime_seconds: u64,
    /// Sessions held, connected or not.
    pub clients_total: u64,
    /// Clients connected now.
    pub clients_connected: u64,
    /// Most clients connected at once since start.
    pub clients_maximum: u64,
    /// Sessions ended because their expiry interval passed.
    pub clients_expired: u64,
    /// PUBLISH packets received from clients.
    pub messages_received: u64,
    /// PUBLISH packets sent to clients.
    pub messages_sent: u64,
    /// Messages dropped instead of delivered, every reason.
    pub messages_dropped: u64,
    /// Messages waiting in session queues.
    pub messages_queued: u64,
    /// Bytes of message data held in memory (queued, in flight, retained).
    pub message_bytes: u64,
    /// Bytes read from client connections.
    pub bytes_received: u64,
    /// Bytes written to client connections.
    pub bytes_sent: u64,
    /// Subscriptions held.
    pub subscriptions: u64,
    /// Retained messages held (the `$SYS` ones included, as Mosquitto counts them).
    pub retained: u64,
    /// CONNECTs accepted since start.
    pub connects: u64,
    /// Network connections accepted since start.
    pub sockets: u64,
}

impl SysFigures {
    /// Reads the broker's figures now. Counters come from its metrics (readable atomics);
    /// `started` is when the broker started.
    pub(crate) fn read(broker: &Broker, started: Instant) -> SysFigures {
        let m = broker.metrics.snapshot();
        SysFigures {
            uptime_seconds: started.elapsed().as_secs(),
            clients_total: m.sessions,
            clients_connected: m.clients_connected,
            clients_maximum: m.clients_peak,
            clients_expired: m.clients_expired,
            messages_received: m.messages_received,
            messages_sent: m.messages_sent,
            messages_dropped: m.messages_dropped,
            messages_queued: m.messages_queued,
            message_bytes: super::flow::message_bytes()
                .saturating_sub(super::flow::bookkeeping_bytes()),
            bytes_received: m.bytes_received,
            bytes_sent: m.bytes_sent,
            subscriptions: m.subscriptions,
            retained: m.retained,
            connects: m.clients_total,
            sockets: broker.metrics.connections_total.get(),
        }
    }
}

/// Mosquitto's load averages: per-minute rates smoothed over 1, 5 and 15 minutes
/// (`rate + e^(-dt/window) * (average - rate)` at each round of `dt` seconds).
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    last: u64,
    averages: [f64; 3],
}

impl Load {
    /// Takes the counter's value after `dt` seconds; returns the three averages.
    fn update(&mut self, now: u64, dt: f64) -> [f64; 3] {
        if dt > 0.0 {
            let per_minute = now.saturating_sub(self.last) as f64 * 60.0 / dt;
            for (average, (window, _)) in self.averages.iter_mut().zip(LOAD_WINDOWS) {
                let decay = (-dt / window).exp();
                *average = per_minute + decay * (*average - per_minute);
            }
            // Only a round that measured moves the baseline: what was counted meanwhile
            // belongs to the next rate.
            self.last = now;
        }
        self.averages
    }
}

/// The counters that have load averages, with their topic stems under `$SYS/broker/load/`.
const LOADED: [&str; 9] = [
    "messages/received",
    "messages/sent",
    "publish/received",
    "publish/sent",
    "publish/dropped",
    "bytes/received",
    "bytes/sent",
    "connections",
    "sockets",
];

/// Turns rounds of figures into the `(topic, payload)` pairs to publish: every value whose
/// text changed since the last round (all of them the first time).
#[derive(Debug)]
pub(crate) struct SysTopics {
    /// The payload last published per topic, in the order of [`SysTopics::round`].
    last: Vec<String>,
    loads: [Load; LOADED.len()],
    last_round: Instant,
}

impl SysTopics {
    /// Nothing published yet; the counters were 0 at `started` (the broker's start), so the
    /// first round's rates cover everything since then, however late it runs.
    pub(crate) fn new(started: Instant) -> SysTopics {
        SysTopics {
            last: Vec::new(),
            loads: [Load::default(); LOADED.len()],
            last_round: started,
        }
    }

    /// The topics and payloads of one round at `now`, only those that changed.
    pub(crate) fn round(&mut self, f: &SysFigures, now: Instant) -> Vec<(String, String)> {
        let dt = now.saturating_duration_since(self.last_round).as_secs_f64();
        self.last_round = now;
        let mut all: Vec<(String, String)> = vec![
            (
                "$SYS/broker/version".into(),
                format!("postbox version {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "$SYS/broker/uptime".into(),
                format!("{} seconds", f.uptime_seconds),
            ),
        ];
        let counts: [(&str, u64); 17] = [
            ("clients/total", f.clients_total),
            ("clients/connected", f.clients_connected),
            ("clients/active", f.clients_connected),
            (
                "clients/disconnected",
                f.clients_total.saturating_sub(f.clients_connected),
            ),
            (
                "clients/inactive",
                f.clients_total.saturating_sub(f.clients_connected),
            ),
            ("clients/maximum", f.clients_maximum),
            ("clients/expired", f.clients_expired),
            ("messages/received", f.messages_received),
            ("messages/sent", f.messages_sent),
            ("messages/stored", f.messages_queued + f.retained),
            ("store/messages/count", f.messages_queued + f.retained),
            ("store/messages/bytes", f.message_bytes),
            ("publish/messages/received", f.messages_received),
            ("publish/messages/sent", f.messages_sent),
            ("publish/messages/dropped", f.messages_dropped),
            ("subscriptions/count", f.subscriptions),
            ("retained messages/count", f.retained),
        ];
        for (stem, value) in counts {
            all.push((format!("$SYS/broker/{stem}"), value.to_string()));
        }
        all.push((
            "$SYS/broker/bytes/received".into(),
            f.bytes_received.to_string(),
        ));
        all.push(("$SYS/broker/bytes/sent".into(), f.bytes_sent.to_string()));
        let loaded = [
            f.messages_received,
            f.messages_sent,
            f.messages_received,
            f.messages_sent,
            f.messages_dropped,
            f.bytes_received,
            f.bytes_sent,
            f.connects,
            f.sockets,
        ];
        for ((load, stem), value) in self.loads.iter_mut().zip(LOADED).zip(loaded) {
            let averages = load.update(value, dt);
            for (average, (_, suffix)) in averages.iter().zip(LOAD_WINDOWS) {
                all.push((
                    format!("$SYS/broker/load/{stem}/{suffix}"),
                    format!("{average:.2}"),
                ));
            }
        }
        if self.last.len() != all.len() {
            self.last = vec![String::new(); all.len()];
        }
        all.into_iter()
            .zip(self.last.iter_mut())
            .filter_map(|((topic, payload), last)| {
                (*last != payload).then(|| {
                    last.clone_from(&payload);
                    (topic, payload)
                })
            })
            .collect()
    }
}

/// Publishes the `$SYS` topics every `interval` until `shutdown` (or the broker stops), the
/// first round at once.
pub(crate) async fn run(broker: Arc<Broker>, interval: Duration, shutdown: CancellationToken) {
    let started = Instant::now();
    let mut topics = SysTopics::new(started);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => break,
        }
        if broker.is_shutting_down() {
            break;
        }
        let figures = SysFigures::read(&broker, started);
        for (topic, payload) in topics.round(&figures, Instant::now()) {
            publish(&broker, topic, payload);
        }
    }
}

/// Routes one retained QoS 0 value from nobody. Nothing is stored for it (`$SYS` is memory
/// only, and QoS 0 is never queued in the store), so there is no commit to wait for.
fn publish(broker: &Broker, topic: String, payload: String) {
    let publish = Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: true,
        topic: ByteString::from(topic),
        packet_id: 0,
        payload: payload.into(),
        properties: PublishProperties::default(),
    };
    if let Err(error) = broker.publish(Arc::new(Message::from_publish(publish, None)), None) {
        tracing::debug!(%error, "$SYS value not published");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> SysFigures {
        SysFigures {
            uptime_seconds: 5,
            clients_total: 3,
            clients_connected: 2,
            messages_received: 10,
            ..SysFigures::default()
        }
    }

    #[test]
    fn first_round_publishes_everything_then_only_changes() {
        let start = Instant::now();
        let mut topics = SysTopics::new(start);
        let first = topics.round(&figures(), start);
        let find = |round: &[(String, String)], topic: &str| {
            round
                .iter()
                .find(|(t, _)| t == topic)
                .map(|(_, p)| p.clone())
        };
        assert_eq!(
            find(&first, "$SYS/broker/clients/disconnected").as_deref(),
            Some("1")
        );
        assert_eq!(
            find(&first, "$SYS/broker/uptime").as_deref(),
            Some("5 seconds")
        );
        assert!(find(&first, "$SYS/broker/load/messages/received/15min").is_some());
        assert!(first.len() > 40, "{}", first.len());

        let mut later = figures();
        later.uptime_seconds = 15;
        let second = topics.round(&later, start + Duration::from_secs(10));
        let names: Vec<&str> = second.iter().map(|(t, _)| t.as_str()).collect();
        // Same counters, so only the uptime and the decaying load averages change.
        assert!(names.contains(&"$SYS/broker/uptime"), "{names:?}");
        assert!(!names.contains(&"$SYS/broker/clients/total"), "{names:?}");
        assert!(!names.contains(&"$SYS/broker/version"), "{names:?}");
    }

    #[test]
    fn load_averages_follow_mosquittos_formula() {
        let mut load = Load::default();
        load.update(0, 0.0);
        // 60 messages in 10 s = 360 per minute.
        let a = load.update(60, 10.0);
        let expect = |window: f64| 360.0 * (1.0 - (-10.0_f64 / window).exp());
        for (got, (window, _)) in a.iter().zip(LOAD_WINDOWS) {
            assert!(
                (got - expect(window)).abs() < 1e-9,
                "{got} vs {}",
                expect(window)
            );
        }
        // The 1-minute average reacts fastest.
        assert!(a[0] > a[1] && a[1] > a[2]);

        // What a round without elapsed time saw still counts in the next one (the first
        // round may run after the first messages).
        let mut late = Load::default();
        assert_eq!(late.update(7, 0.0), [0.0; 3]);
        assert!(late.update(7, 1.0)[0] > 0.0);
    }
}
