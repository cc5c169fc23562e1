//! Broker metrics: one `prometheus::Registry` per broker, rendered in the Prometheus text
//! format and readable in-process.
//!
//! Per broker, not process-global: every broker (several run in one test process) counts in
//! its own registry, so tests read their own broker's figures and `$SYS` and the admin API
//! read them with [`Metrics::snapshot`] or a handle's `get()`.
//!
//! Hot-path rule: nothing looks a metric up by name per message. [`Metrics::register`] runs
//! once per broker and returns cheap, cloneable handles (an `Arc` each, [`Counter`],
//! [`Gauge`], [`Histogram`]); updating one is an atomic add. Labelled handles are taken once
//! (per listener and protocol at start: [`Metrics::listener`]).
//!
//! Names follow Prometheus conventions: `postbox_` prefix, `_total` on counters, base units
//! (bytes, seconds). The table in README.md lists them; a test keeps it complete.
//!
//! A leaf: this module imports nothing else of the crate (the crate's `layering` test checks it).
//! It holds the registry, the handles, every name and the broker core's series; each other
//! owner declares its own group against the registry ([`Metrics::registrar`],
//! [`Metrics::scrape_registrar`]): `storage::StoreMetrics`, `guarantees::GuaranteeMetrics`,
//! `cluster::ClusterMetrics`.

pub(crate) mod bridge;
mod endpoint;
mod handles;
pub mod names;
mod scrape;
mod snapshot;
#[cfg(test)]
mod tests;

/// Asserts every metric of `names` is exported with its `# HELP` and `# TYPE` lines in
/// `out` (a render): for the tests of each owner's group, here and in its owner.
#[cfg(test)]
pub(crate) fn assert_described<'a>(out: &str, names: impl IntoIterator<Item = &'a str>) {
    for name in names {
        assert!(
            out.contains(&format!("# HELP {name} ")),
            "no HELP for {name}:\n{out}"
        );
        assert!(
            out.contains(&format!("# TYPE {name} ")),
            "no TYPE for {name}:\n{out}"
        );
    }
}

/// Asserts each of `lines` is a whole line of `out` (a render): a series with its value, for
/// the tests of each owner's group, here and in its owner.
#[cfg(test)]
pub(crate) fn assert_has_lines<L: AsRef<str>>(out: &str, lines: impl IntoIterator<Item = L>) {
    for line in lines {
        let line = line.as_ref();
        assert!(
            out.lines().any(|l| l == line),
            "missing `{line}` in:\n{out}"
        );
    }
}

use std::net::SocketAddr;
use std::sync::Arc;

use handles::{counter_of, gauge_of};

pub(crate) use bridge::BridgeMetrics;
pub(crate) use endpoint::start_exporter;
pub use handles::Counter;
pub(crate) use handles::Reg;
pub(crate) use handles::{Gauge, Histogram};
pub(crate) use scrape::ScrapeFigures;
pub(crate) use scrape::ScrapeReg;
pub(crate) use snapshot::MetricsSnapshot;

/// Why a CONNECT was answered with a refusing CONNACK: the `reason` label of
/// `postbox_connack_refusals_total`, from the CONNACK's v5 reason code or 3.x return code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnackRefusal {
    /// 0x86 / 3.x 4: bad user name or password.
    BadCredentials,
    /// 0x87 / 3.x 5: not authorized.
    NotAuthorized,
    /// 0x85 / 3.x 2: client identifier not valid.
    ClientIdInvalid,
    /// 0x88 / 0x89 / 3.x 3: server unavailable or busy (connection limits).
    ServerBusy,
    /// 0x97: quota exceeded (a source's connection limit).
    QuotaExceeded,
    /// 0x84 / 3.x 1: unsupported protocol version.
    UnsupportedProtocol,
    /// 0x81 / 0x82: malformed packet or protocol error.
    Malformed,
    /// 0x8A: banned.
    Banned,
    /// 0x8C: bad authentication method.
    BadAuthMethod,
    /// Any other code.
    Other,
}

impl ConnackRefusal {
    /// Every reason, in label order.
    pub const ALL: [ConnackRefusal; 10] = [
        ConnackRefusal::BadCredentials,
        ConnackRefusal::NotAuthorized,
        ConnackRefusal::ClientIdInvalid,
        ConnackRefusal::ServerBusy,
        ConnackRefusal::QuotaExceeded,
        ConnackRefusal::UnsupportedProtocol,
        ConnackRefusal::Malformed,
        ConnackRefusal::Banned,
        ConnackRefusal::BadAuthMethod,
        ConnackRefusal::Other,
    ];

    /// The reason of an MQTT 5 CONNACK reason code (the broker decides in v5 codes and maps
    /// them to 3.x return codes on the wire).
    pub fn of_v5(code: u8) -> ConnackRefusal {
        match code {
            0x86 => ConnackRefusal::BadCredentials,
            0x87 => ConnackRefusal::NotAuthorized,
            0x85 => ConnackRefusal::ClientIdInvalid,
            0x88 | 0x89 => ConnackRefusal::ServerBusy,
            0x97 => ConnackRefusal::QuotaExceeded,
            0x84 => ConnackRefusal::UnsupportedProtocol,
            0x81 | 0x82 => ConnackRefusal::Malformed,
            0x8A => ConnackRefusal::Banned,
            0x8C => ConnackRefusal::BadAuthMethod,
            _ => ConnackRefusal::Other,
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            ConnackRefusal::BadCredentials => "bad_credentials",
            ConnackRefusal::NotAuthorized => "not_authorized",
            ConnackRefusal::ClientIdInvalid => "client_id_invalid",
            ConnackRefusal::ServerBusy => "server_busy",
            ConnackRefusal::QuotaExceeded => "quota_exceeded",
            ConnackRefusal::UnsupportedProtocol => "unsupported_protocol",
            ConnackRefusal::Malformed => "malformed",
            ConnackRefusal::Banned => "banned",
            ConnackRefusal::BadAuthMethod => "bad_auth_method",
            ConnackRefusal::Other => "other",
        }
    }
}

/// The `protocol` label values, indexed like [`ListenerMetrics`]' arrays.
pub(crate) const PROTOCOL_LABELS: [&str; 3] = ["3.1", "3.1.1", "5.0"];

/// A `{listener, reason}` failure counter family (TLS handshakes, WebSocket upgrades): one
/// `Arc`, cheap to hand to each connection; the label lookup happens only on failure.
#[derive(Clone, Debug)]
pub struct FailureCounts(prometheus::IntCounterVec);

impl FailureCounts {
    /// Counts one failure.
    pub fn failed(&self, listener: &str, reason: &str) {
        counter_of(&self.0, &[listener, reason]).increment(1);
    }

    /// Failures counted for `listener` and `reason`.
    pub fn get(&self, listener: &str, reason: &str) -> u64 {
        counter_of(&self.0, &[listener, reason]).get()
    }
}

/// One listener's client gauges and counters, by protocol ([`PROTOCOL_LABELS`] order): taken
/// once per listener at start, so a CONNECT updates them without a label lookup.
#[derive(Clone, Debug)]
pub struct ListenerMetrics {
    /// `postbox_clients_connected{listener, protocol}`.
    connected: [Gauge; 3],
    /// `postbox_client_connects_total{listener, protocol}`.
    connects: [Counter; 3],
    /// The broker-wide count behind `postbox_clients_peak`.
    clients: Arc<scrape::ClientCount>,
}

impl ListenerMetrics {
    /// A CONNECT was accepted with protocol index `protocol` (0 = 3.1, 1 = 3.1.1, 2 = 5.0).
    pub fn connected(&self, protocol: usize) {
        self.connects[protocol].increment(1);
        self.connected[protocol].increment(1.0);
        self.clients.connected();
    }

    /// The client accepted with protocol index `protocol` disconnected.
    pub fn disconnected(&self, protocol: usize) {
        self.connected[protocol].decrement(1.0);
        self.clients.disconnected();
    }
}

/// Handles to every broker metric, registered once at start.
///
/// Clone it into each task; a clone shares the same underlying counters. Index the per-QoS
/// arrays with `qos as usize` (0, 1, 2).
#[derive(Clone, Debug)]
pub struct Metrics {
    /// This broker's registry: every series below, read by [`Metrics::render`].
    registry: prometheus::Registry,
    /// The figures refreshed at each reading, and their hooks.
    scrape: Arc<scrape::ScrapeTime>,
    /// Connected clients now and at most (feeds `postbox_clients_peak`).
    clients: Arc<scrape::ClientCount>,
    /// `postbox_clients_connected{listener,protocol}`.
    clients_connected: prometheus::GaugeVec,
    /// `postbox_client_connects_total{listener,protocol}`.
    client_connects: prometheus::IntCounterVec,
    /// `postbox_connack_refusals_total{reason}`, in [`ConnackRefusal`] order.
    connack_refusals: [Counter; ConnackRefusal::ALL.len()],
    /// `postbox_tls_certificate_expiry_timestamp_seconds{listener}`.
    tls_certificate_expiry: prometheus::GaugeVec,
    /// `postbox_tls_handshake_failures_total{listener,reason}`.
    tls_handshake_failures: prometheus::IntCounterVec,
    /// `postbox_ws_upgrade_failures_total{listener,reason}`.
    ws_upgrade_failures: prometheus::IntCounterVec,
    /// `postbox_auth_failures_total{reason}`.
    auth_failures: prometheus::IntCounterVec,
    /// `postbox_auth_successes_total{cached}`.
    auth_successes: prometheus::IntCounterVec,
    /// `postbox_auth_throttled_total{key}`.
    auth_throttled: prometheus::IntCounterVec,
    /// Password hashes run (`postbox_auth_hashes_total`).
    pub auth_hashes: Counter,
    /// Password verifications ended before their hash (`postbox_auth_hashes_skipped_total`).
    pub auth_hashes_skipped: Counter,
    /// The `postbox_bridge_*` families updated by the bridges' events.
    bridges: bridge::BridgeFamilies,
    /// Sessions ended because their expiry interval passed.
    pub sessions_expired: Counter,
    /// MQTT 5 messages whose Message Expiry Interval passed while queued, by QoS.
    pub messages_dropped_expired: [Counter; 3],
    /// Deliveries the ACL refused (the subscriber may not read the topic), by QoS.
    pub messages_dropped_denied: [Counter; 3],
    /// QoS 1/2 PUBLISHes that matched no subscriber, by QoS (QoS 0 is never counted: a QoS 0
    /// message nobody wants is normal); also a shared group's QoS 1/2 messages that a
    /// member's ending session held with no other member to take them.
    pub messages_dropped_no_subscribers: [Counter; 3],
    /// Seconds from a PUBLISH being read to its delivery being written to a subscriber.
    pub delivery_latency: Histogram,
    /// Client network connections currently open (increment on accept, decrement on close).
    pub connections_current: Gauge,
    /// Client network connections accepted since start.
    pub connections_total: Counter,
    /// Sessions held, connected or not.
    pub sessions_current: Gauge,
    /// Subscriptions held across all sessions.
    pub subscriptions_current: Gauge,
    /// Retained messages stored.
    pub retained_messages: Gauge,
    /// PUBLISH packets received from clients, indexed by QoS.
    pub messages_received: [Counter; 3],
    /// PUBLISH packets sent to clients, indexed by QoS.
    pub messages_sent: [Counter; 3],
    /// Bytes read from client connections.
    pub bytes_received: Counter,
    /// Bytes written to client connections.
    pub bytes_sent: Counter,
    /// Messages dropped because the queue of an offline or stalled session was full
    /// (`mqtt.max_queued_*`), indexed by QoS.
    pub messages_dropped_queue_full: [Counter; 3],
    /// QoS 0 messages dropped for offline persistent sessions (`mqtt.queue_qos0_messages`).
    pub messages_dropped_qos0_offline: Counter,
    /// Messages not sent because they exceed the client's Maximum Packet Size (v5), by QoS.
    pub messages_dropped_too_large: [Counter; 3],
    /// Poison messages: QoS 1/2 deliveries given up after `mqtt.max_deliveries` sends
    /// without an acknowledgement (and dead-lettered), by QoS.
    pub messages_dropped_max_deliveries: [Counter; 3],
    /// PUBLISHes not routed because the broker was over its memory budget (QoS 1/2 refused,
    /// QoS 0 dropped), by QoS.
    pub messages_dropped_memory: [Counter; 3],
    /// Client PUBLISHes refused because a subscriber's queue was full and
    /// `mqtt.queue_overflow = "refuse"`, by QoS.
    pub messages_refused_queue_full: [Counter; 3],
    /// PUBLISHes whose payload broke a `[[schema]]` and that were dropped (QoS 0, a 3.x
    /// publisher under `on_invalid_v3 = "ack"`, or dead-lettered under `action =
    /// "dead-letter"`), by QoS.
    pub messages_dropped_schema_invalid: [Counter; 3],
    /// PUBLISHes whose payload broke a `[[schema]]` and that were refused (v5 0x99, or a 3.x
    /// publisher disconnected under `on_invalid_v3 = "disconnect"`), by QoS.
    pub messages_refused_schema_invalid: [Counter; 3],
    /// Connected sessions found stalled (full queue, no progress for `mqtt.stalled_after`):
    /// once per stall.
    pub session_stalls: Counter,
    /// Connected sessions stalled now; set by the sweep.
    pub sessions_stalled: Gauge,
    /// Pauses of clients that published faster than `mqtt.max_publish_rate` /
    /// `max_publish_bytes_rate`.
    pub publish_rate_pauses: Counter,
    /// Publishing connections paused by back-pressure now (`broker::flow`); set at scrape.
    pub publishers_paused: Gauge,
    /// Seconds publishers have spent paused, all together; set at scrape.
    pub publisher_pause_seconds: Counter,
    /// The memory budget in bytes (`mqtt.max_memory` resolved).
    pub memory_budget_bytes: Gauge,
    /// Bytes counted against the budget (messages alive, partial packets); set at scrape.
    pub memory_used_bytes: Gauge,
    /// Bytes handed to the store and not yet committed: outside the budget, but publishers
    /// pause past `broker::flow::STORE_BACKLOG_PAUSE` of them; set at scrape.
    pub store_queue_bytes: Gauge,
    /// What anonymous clients hold, by part: kept, connected, in transit; set at scrape.
    pub anonymous_bytes: [Gauge; 3],
    /// Connections closed because a packet could not be decoded.
    pub malformed_packets: Counter,
    /// Connections closed for a protocol violation in a well-formed packet.
    pub protocol_errors: Counter,
    /// Connections closed because the client missed its keep-alive.
    pub keepalive_timeouts: Counter,
    /// Connections closed because their credentials (a JWT) expired.
    pub credentials_expired: Counter,
    /// Will messages published (abnormal disconnect or will delay expiry).
    pub will_messages_published: Counter,
    /// Actions the ACL refused: `[read, write]`.
    pub authz_denied: [Counter; 2],
    /// Connections closed because another connection took over their client id.
    pub session_takeovers: Counter,
    /// CONNECTs naming another identity's session: `[refused, replaced]` (issue 35).
    pub session_binding: [Counter; 2],
    /// Connections whose handshake waits for the client (every listener's pending slots).
    pub connections_pending: Gauge,
    /// Waiting handshakes closed: the listener's `max_pending_connections` were taken.
    pub connections_refused_pending: Counter,
    /// Waiting handshakes closed: their source had `max_pending_connections_per_ip`.
    pub connections_refused_per_ip: Counter,
    /// `postbox_connections_refused_total{reason="pending_evicted"}`: handshakes that had
    /// waited longest for their client, closed to give a full listener's pending slot to a
    /// newcomer (`connection::slots`).
    pub connections_evicted: Counter,
    /// CONNECTs refused (CONNACK 0x89 / 0x03): the listener had `max_connections` clients.
    pub connections_refused_max: Counter,
    /// CONNECTs refused (CONNACK 0x97 / 0x03): the client's source address had the
    /// listener's `max_connections_per_ip` clients.
    pub connections_refused_max_per_ip: Counter,
    /// CONNECTs refused (CONNACK 0x89 / 0x03): the broker had `mqtt.max_connections` clients
    /// over all its listeners.
    pub connections_refused_server: Counter,
    /// Connections closed on a `proxy_protocol` listener: no valid PROXY header in time.
    pub connections_refused_proxy: Counter,
    /// Connections closed, or CONNECTs refused (CONNACK 0x97 / 0x03), because the CONNECTs
    /// not verified yet (arriving, or waiting for their login verdict) held their share, an
    /// eighth of `mqtt.max_memory`, and this one holds more than 8 KiB.
    pub connections_refused_connect_bytes: Counter,
    /// HTTP connections closed at accept: `[max_connections, max_connections_per_ip]` of
    /// `[metrics]` were open.
    pub http_connections_refused: [Counter; 2],
    /// Connections closed because their CONNECT was not accepted within `mqtt.connect_timeout`.
    pub connect_timeouts: Counter,
    /// Connections closed because a started packet did not complete in time.
    pub packet_timeouts: Counter,
    /// Connections closed for a packet over `mqtt.max_packet_size`.
    pub packets_too_large: Counter,
    /// Anonymous connections closed because a packet they were sending would take what
    /// anonymous clients' partly received packets hold past their share of `mqtt.max_memory`.
    pub anonymous_share_closes: Counter,
    /// Bytes held by partially read packets; set from `connection::partial_packet_bytes`
    /// by the server's periodic sweep (the connections count into one process-wide atomic).
    pub partial_packet_bytes: Gauge,
}

/// `[qos 0, 1, 2]` handles of a `{reason, qos}` family.
fn by_qos(family: &prometheus::IntCounterVec, reason: &str) -> [Counter; 3] {
    ["0", "1", "2"].map(|qos| counter_of(family, &[reason, qos]))
}

impl Metrics {
    /// A new registry with every broker metric registered, and the handles to them.
    ///
    /// Each call makes an independent registry (one per broker): nothing is global, so a
    /// test's broker counts only its own traffic.
    pub fn register() -> Metrics {
        use names::*;
        let registry = prometheus::Registry::new();
        let r = Reg(&registry);
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process metrics register once");
        let build_info = r.gauge_vec(
            BUILD_INFO,
            "Always 1; the build's version is the version label.",
            &["version"],
        );
        gauge_of(&build_info, &[env!("CARGO_PKG_VERSION")]).set(1.0);
        let clients = Arc::new(scrape::ClientCount::default());
        let scrape = Arc::new(scrape::ScrapeTime::new(Arc::clone(&clients)));
        registry
            .register(Box::new(scrape::Shared(Arc::clone(&scrape))))
            .expect("scrape-time metrics register once");
        let received = r.counter_vec(
            MESSAGES_RECEIVED_TOTAL,
            "PUBLISH packets received from clients, by QoS.",
            &["qos"],
        );
        let sent = r.counter_vec(
            MESSAGES_SENT_TOTAL,
            "PUBLISH packets sent to clients, by QoS.",
            &["qos"],
        );
        let dropped = r.counter_vec(
            MESSAGES_DROPPED_TOTAL,
            "Messages dropped instead of delivered, by reason (queue_full, qos0_offline, too_large, max_deliveries, memory, expired, denied, no_subscribers, schema_invalid) and QoS.",
            &["reason", "qos"],
        );
        let refused = r.counter_vec(MESSAGES_REFUSED_TOTAL, "PUBLISHes refused and left with their publisher instead of being dropped for a subscriber, by reason (queue_full: mqtt.queue_overflow = refuse; schema_invalid: a [[schema]] refused the payload) and QoS.", &["reason", "qos"]);
        let conn_refused = r.counter_vec(CONNECTIONS_REFUSED_TOTAL, "Connections refused by a listener's limits, by reason (pending_limit, pending_per_ip, pending_evicted, max_connections, max_connections_per_ip, global_max_connections, proxy_header, connect_bytes).", &["reason"]);
        let auth_failures = r.counter_vec(
            AUTH_FAILURES_TOTAL,
            "Logins refused by the password file or the JWT check, by reason (bad_credentials: a wrong password or an unknown user alike, so this page does not tell user names apart; anonymous; jwt).",
            &["reason"],
        );
        // One reason for a wrong password and an unknown user: this page is open to anyone
        // (issue 35, sixth adversarial pass, finding 10).
        for reason in ["bad_credentials", "anonymous", "jwt"] {
            auth_failures.with_label_values(&[reason]);
        }
        let auth_successes = r.counter_vec(
            AUTH_SUCCESSES_TOTAL,
            "Logins accepted by the password file, by whether the success cache answered.",
            &["cached"],
        );
        for cached in ["false", "true"] {
            auth_successes.with_label_values(&[cached]);
        }
        let auth_throttled = r.counter_vec(
            AUTH_THROTTLED_TOTAL,
            "Logins refused without a password check because their source address or user name failed too often lately, by key (address, user).",
            &["key"],
        );
        for key in ["address", "user"] {
            auth_throttled.with_label_values(&[key]);
        }
        let latency_buckets = vec![
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        Metrics {
            connections_current: r.gauge(CONNECTIONS_CURRENT, "Client network connections currently open."),
            connections_total: r.counter(CONNECTIONS_TOTAL, "Client network connections accepted since start."),
            sessions_current: r.gauge(SESSIONS_CURRENT, "Sessions held, including persistent sessions of offline clients."),
            subscriptions_current: r.gauge(SUBSCRIPTIONS_CURRENT, "Subscriptions held across all sessions."),
            retained_messages: r.gauge(RETAINED_MESSAGES, "Retained messages stored."),
            messages_received: ["0", "1", "2"].map(|q| counter_of(&received, &[q])),
            messages_sent: ["0", "1", "2"].map(|q| counter_of(&sent, &[q])),
            bytes_received: r.counter(BYTES_RECEIVED_TOTAL, "Bytes read from client connections."),
            bytes_sent: r.counter(BYTES_SENT_TOTAL, "Bytes written to client connections."),
            messages_dropped_queue_full: by_qos(&dropped, "queue_full"),
            messages_dropped_qos0_offline: counter_of(&dropped, &["qos0_offline", "0"]),
            messages_dropped_too_large: by_qos(&dropped, "too_large"),
            messages_dropped_max_deliveries: by_qos(&dropped, "max_deliveries"),
            messages_dropped_memory: by_qos(&dropped, "memory"),
            messages_dropped_expired: by_qos(&dropped, "expired"),
            messages_dropped_denied: by_qos(&dropped, "denied"),
            messages_dropped_no_subscribers: by_qos(&dropped, "no_subscribers"),
            messages_refused_queue_full: by_qos(&refused, "queue_full"),
            messages_dropped_schema_invalid: by_qos(&dropped, "schema_invalid"),
            messages_refused_schema_invalid: by_qos(&refused, "schema_invalid"),
            session_stalls: r.counter(SESSION_STALLS_TOTAL, "Connected sessions found stalled: a full queue that took nothing off for mqtt.stalled_after (once per stall)."),
            sessions_stalled: r.gauge(SESSIONS_STALLED, "Connected sessions stalled now: a full queue that took nothing off for mqtt.stalled_after; their overflow goes to mqtt.queue_overflow."),
            publishers_paused: r.gauge(PUBLISHERS_PAUSED, "Publishing connections paused by back-pressure (a full subscriber queue or the memory budget)."),
            publish_rate_pauses: r.counter(PUBLISH_RATE_PAUSES_TOTAL, "Pauses of clients that published faster than mqtt.max_publish_rate / max_publish_bytes_rate (their socket is read no faster)."),
            publisher_pause_seconds: r.counter(PUBLISHER_PAUSE_SECONDS_TOTAL, "Seconds publishers have spent paused by back-pressure, all together."),
            memory_budget_bytes: r.gauge(MEMORY_BUDGET_BYTES, "The memory budget for messages and partial packets (mqtt.max_memory)."),
            memory_used_bytes: r.gauge(MEMORY_USED_BYTES, "Bytes counted against the memory budget: messages held, subscriptions and partial packets."),
            store_queue_bytes: r.gauge(STORE_QUEUE_BYTES, "Bytes handed to the durable store and not yet committed; publishers pause past 64 MiB."),
            malformed_packets: r.counter(MALFORMED_PACKETS_TOTAL, "Connections closed because a packet could not be decoded."),
            protocol_errors: r.counter(PROTOCOL_ERRORS_TOTAL, "Connections closed for a protocol violation in a well-formed packet."),
            keepalive_timeouts: r.counter(KEEPALIVE_TIMEOUTS_TOTAL, "Connections closed because the client missed its keep-alive."),
            credentials_expired: r.counter(CREDENTIALS_EXPIRED_TOTAL, "Connections closed because the credentials they connected with (a JWT) expired."),
            will_messages_published: r.counter(WILL_MESSAGES_PUBLISHED_TOTAL, "Will messages published."),
            authz_denied: r.counter_family(AUTHZ_DENIED_TOTAL, "Actions the ACL refused: publishes, subscriptions, deliveries, wills, by action.", "action").counters(["read", "write"]),
            session_binding: r.counter_family(SESSION_BINDING_TOTAL, "CONNECTs naming the client id of a session another identity owns, by outcome (refused; replaced: a fresh session in its place).", "outcome").counters(["refused", "replaced"]),
            session_takeovers: r.counter(SESSION_TAKEOVERS_TOTAL, "Connections closed because a new connection took over their client id."),
            connections_pending: r.gauge(CONNECTIONS_PENDING, "Connections whose handshake waits for the client (CONNECT incomplete, AUTH answer due)."),
            connections_refused_pending: counter_of(&conn_refused, &["pending_limit"]),
            connections_refused_per_ip: counter_of(&conn_refused, &["pending_per_ip"]),
            connections_evicted: counter_of(&conn_refused, &["pending_evicted"]),
            connections_refused_max: counter_of(&conn_refused, &["max_connections"]),
            connections_refused_max_per_ip: counter_of(&conn_refused, &["max_connections_per_ip"]),
            connections_refused_server: counter_of(&conn_refused, &["global_max_connections"]),
            connections_refused_proxy: counter_of(&conn_refused, &["proxy_header"]),
            connections_refused_connect_bytes: counter_of(&conn_refused, &["connect_bytes"]),
            http_connections_refused: r.counter_family(HTTP_CONNECTIONS_REFUSED_TOTAL, "HTTP connections (metrics, probes, admin API) closed at accept by [metrics] max_connections (and the 4 probe slots past it) or max_connections_per_ip, by reason.", "reason").counters(["max_connections", "max_connections_per_ip"]),
            connect_timeouts: r.counter(CONNECT_TIMEOUTS_TOTAL, "Connections closed because their CONNECT was not accepted within mqtt.connect_timeout."),
            packet_timeouts: r.counter(PACKET_TIMEOUTS_TOTAL, "Connections closed because a started packet did not complete in time."),
            packets_too_large: r.counter(PACKETS_TOO_LARGE_TOTAL, "Connections closed because a client sent a packet over mqtt.max_packet_size (v5 DISCONNECT 0x95); many client libraries send it again after every reconnect."),
            anonymous_share_closes: r.counter(ANONYMOUS_SHARE_CLOSES_TOTAL, "Anonymous connections closed because a packet they were sending, a topic alias they bound or output they did not read would take what anonymous clients' connections hold past their share (an eighth of mqtt.max_memory)."),
            anonymous_bytes: {
                let family = r.gauge_vec(ANONYMOUS_BYTES, "What anonymous clients make the broker hold, by part, each against its own eighth of mqtt.max_memory (kept: sessions, queues, retained messages, dead letters inside the budget, copies of their messages in password users' unread output outside it; connected: sessions that end with their connection; in_transit: packets still arriving and what connections hold for them).", &["part"]);
                ["kept", "connected", "in_transit"].map(|part| gauge_of(&family, &[part]))
            },
            partial_packet_bytes: r.gauge(PARTIAL_PACKET_BYTES, "Bytes held by packets that have started to arrive and are not complete, and by connections' inbound topic aliases and unread output."),
            clients_connected: r.gauge_vec(
                CLIENTS_CONNECTED,
                "Clients whose CONNECT was accepted and who are connected, by listener and protocol.",
                &["listener", "protocol"],
            ),
            client_connects: r.counter_vec(
                CLIENT_CONNECTS_TOTAL,
                "CONNECTs accepted, by listener and protocol.",
                &["listener", "protocol"],
            ),
            connack_refusals: r.counter_family(CONNACK_REFUSALS_TOTAL, "CONNECTs answered with a refusing CONNACK, by reason.", "reason").counters(ConnackRefusal::ALL.map(ConnackRefusal::label)),
            tls_certificate_expiry: r.gauge_vec(
                TLS_CERTIFICATE_EXPIRY,
                "notAfter of each tls/wss listener's certificate, Unix seconds (set at load and reload).",
                &["listener"],
            ),
            tls_handshake_failures: r.counter_vec(
                TLS_HANDSHAKE_FAILURES_TOTAL,
                "TLS handshakes that failed or timed out, by listener and reason.",
                &["listener", "reason"],
            ),
            ws_upgrade_failures: r.counter_vec(
                WS_UPGRADE_FAILURES_TOTAL,
                "WebSocket upgrades refused or failed on ws listeners, by listener and reason (path, origin, subprotocol, handshake, timeout).",
                &["listener", "reason"],
            ),
            auth_failures,
            auth_successes,
            auth_throttled,
            auth_hashes: r.counter(AUTH_HASHES_TOTAL, "Password hashes run for logins (a success the cache remembers runs none)."),
            auth_hashes_skipped: r.counter(AUTH_HASHES_SKIPPED_TOTAL, "Password checks that ended before their hash: the client closed, or its handshake's deadline came, while they waited for a hash worker, or the queue had no room for them (answered 0x89)."),
            bridges: bridge::BridgeFamilies::register(r),
            sessions_expired: r.counter(
                SESSIONS_EXPIRED_TOTAL,
                "Sessions ended because their expiry interval passed (Mosquitto's $SYS/broker/clients/expired).",
            ),
            delivery_latency: r.histogram(
                DELIVERY_LATENCY_SECONDS,
                "Seconds from a PUBLISH being read to its delivery being written to a subscriber's connection.",
                latency_buckets,
            ),
            clients,
            scrape,
            registry,
        }
    }

    /// This broker's registry (to register more collectors).
    pub fn registry(&self) -> &prometheus::Registry {
        &self.registry
    }

    /// Registers an owner's group in this broker's registry: how `storage`, `guarantees`
    /// and `cluster` declare their own series without `metrics` knowing them (a leaf).
    pub(crate) fn registrar(&self) -> Reg<'_> {
        Reg(&self.registry)
    }

    /// Registers an owner's series whose values a hook ([`Metrics::on_scrape`]) copies in at
    /// each reading: they are reported after the hooks ran, so a scrape shows that moment.
    pub(crate) fn scrape_registrar(&self) -> ScrapeReg<'_> {
        ScrapeReg(&self.scrape)
    }

    /// The handles of listener `name`, one per protocol; taken once per listener at start
    /// (the series exist, at 0, from then on).
    pub fn listener(&self, name: &str) -> ListenerMetrics {
        ListenerMetrics {
            connected: PROTOCOL_LABELS.map(|p| gauge_of(&self.clients_connected, &[name, p])),
            connects: PROTOCOL_LABELS.map(|p| counter_of(&self.client_connects, &[name, p])),
            clients: Arc::clone(&self.clients),
        }
    }

    /// The handles of bridge `name` (`[[bridge]]`), taken once per bridge at start: its
    /// `postbox_bridge_*` series exist, at 0, from then on.
    pub fn bridge(&self, name: &str) -> BridgeMetrics {
        BridgeMetrics::new(name, &self.bridges, &self.scrape.figures.bridge_queues)
    }

    /// Counts a refusing CONNACK with MQTT 5 reason code `code`.
    pub fn connack_refused(&self, code: u8) {
        let reason = ConnackRefusal::of_v5(code);
        let index = ConnackRefusal::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(ConnackRefusal::ALL.len() - 1);
        self.connack_refusals[index].increment(1);
    }

    /// Refusing CONNACKs counted for `reason`.
    pub fn connack_refusals(&self, reason: ConnackRefusal) -> u64 {
        let index = ConnackRefusal::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(ConnackRefusal::ALL.len() - 1);
        self.connack_refusals[index].get()
    }

    /// Sets listener `listener`'s certificate expiry (notAfter, Unix seconds).
    pub fn set_tls_certificate_expiry(&self, listener: &str, not_after: i64) {
        gauge_of(&self.tls_certificate_expiry, &[listener]).set(not_after as f64);
    }

    /// `postbox_tls_handshake_failures_total{listener,reason}`, for a TLS listener.
    pub fn tls_handshake_failures(&self) -> FailureCounts {
        FailureCounts(self.tls_handshake_failures.clone())
    }

    /// `postbox_ws_upgrade_failures_total{listener,reason}`, for a ws/wss listener.
    pub fn ws_upgrade_failures(&self) -> FailureCounts {
        FailureCounts(self.ws_upgrade_failures.clone())
    }

    /// The `postbox_auth_failures_total{reason}` counter.
    pub fn auth_failures(&self, reason: &str) -> Counter {
        counter_of(&self.auth_failures, &[reason])
    }

    /// The `postbox_auth_successes_total{cached}` counter.
    pub fn auth_successes(&self, cached: bool) -> Counter {
        counter_of(
            &self.auth_successes,
            &[if cached { "true" } else { "false" }],
        )
    }

    /// The `postbox_auth_throttled_total{key}` counter.
    pub fn auth_throttled(&self, key: &str) -> Counter {
        counter_of(&self.auth_throttled, &[key])
    }

    /// Runs `hook` before every reading ([`Metrics::render`], [`Metrics::snapshot`]), to
    /// refresh figures kept elsewhere (the store's stats, the session backlog). It must only
    /// read atomics or take short locks.
    pub fn on_scrape(&self, hook: impl Fn(&ScrapeFigures) + Send + Sync + 'static) {
        self.scrape.add_hook(Box::new(hook));
    }

    /// Every series in the Prometheus text format 0.0.4, as `/metrics` serves it.
    pub fn render(&self) -> String {
        use prometheus::Encoder as _;
        let families = self.registry.gather();
        let mut out = Vec::with_capacity(16 * 1024);
        match prometheus::TextEncoder::new().encode(&families, &mut out) {
            Ok(()) => String::from_utf8(out).unwrap_or_default(),
            Err(error) => {
                tracing::warn!(%error, "cannot render the metrics");
                String::new()
            }
        }
    }

    /// The figures `$SYS` and the admin API show, read now (scrape-time figures refreshed
    /// first).
    pub fn snapshot(&self) -> MetricsSnapshot {
        self.scrape.refresh();
        snapshot::take(self)
    }
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MetricsError {
    /// The HTTP listener could not bind (port in use, no permission, bad address).
    #[error("cannot serve metrics on {bind}: {message}")]
    Bind {
        /// The address from `metrics.bind`.
        bind: SocketAddr,
        /// The underlying error, as text.
        message: String,
    },
}

impl Metrics {
    /// CONNECTs accepted since start, all listeners and protocols.
    #[allow(clippy::cast_sign_loss)] // counter samples are whole, non-negative numbers
    fn client_connects_total(&self) -> u64 {
        use prometheus::core::Collector as _;
        self.client_connects
            .collect()
            .iter()
            .flat_map(prometheus::proto::MetricFamily::get_metric)
            .map(|metric| metric.get_counter().get_value() as u64)
            .sum()
    }
}
