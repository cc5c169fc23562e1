//! Broker metrics, exported in the Prometheus text format.
//!
//! Hot-path rule: nothing looks a metric up by name per message. [`Metrics::register`] runs
//! once at start and returns cheap, cloneable handles (an `Arc` each); updating one is an atomic
//! add. Register *after* [`install_exporter`]: handles taken before a recorder is installed stay
//! no-ops forever (which is exactly what tests and `metrics.enabled = false` want).
//!
//! Names follow Prometheus conventions: `postbox_` prefix, `_total` on counters, base units
//! (bytes). The table in README.md lists them; a test keeps it complete.

mod endpoint;

use std::net::SocketAddr;

use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge, Unit};

pub use endpoint::{start_exporter, MetricsEndpoint};

/// Name of every metric, so dashboards, docs and tests refer to one spelling.
pub mod names {
    /// Gauge: client network connections currently open.
    pub const CONNECTIONS_CURRENT: &str = "postbox_connections_current";
    /// Counter: client network connections accepted since start.
    pub const CONNECTIONS_TOTAL: &str = "postbox_connections_total";
    /// Gauge: sessions held, connected or not (persistent sessions of offline clients count).
    pub const SESSIONS_CURRENT: &str = "postbox_sessions_current";
    /// Gauge: subscriptions held across all sessions.
    pub const SUBSCRIPTIONS_CURRENT: &str = "postbox_subscriptions_current";
    /// Gauge: retained messages stored.
    pub const RETAINED_MESSAGES: &str = "postbox_retained_messages";
    /// Counter (label `qos`): PUBLISH packets received from clients.
    pub const MESSAGES_RECEIVED_TOTAL: &str = "postbox_messages_received_total";
    /// Counter (label `qos`): PUBLISH packets sent to clients.
    pub const MESSAGES_SENT_TOTAL: &str = "postbox_messages_sent_total";
    /// Counter: bytes read from client connections.
    pub const BYTES_RECEIVED_TOTAL: &str = "postbox_bytes_received_total";
    /// Counter: bytes written to client connections.
    pub const BYTES_SENT_TOTAL: &str = "postbox_bytes_sent_total";
    /// Counter (labels `reason`, `qos`): messages dropped instead of delivered.
    pub const MESSAGES_DROPPED_TOTAL: &str = "postbox_messages_dropped_total";
    /// Counter (labels `reason`, `qos`): PUBLISHes refused (not acknowledged as accepted,
    /// the publisher keeps them) instead of being dropped for some subscriber.
    pub const MESSAGES_REFUSED_TOTAL: &str = "postbox_messages_refused_total";
    /// Counter: connected sessions found stalled, once per stall.
    pub const SESSION_STALLS_TOTAL: &str = "postbox_session_stalls_total";
    /// Gauge: connected sessions stalled now (full queue, no progress for `stalled_after`).
    pub const SESSIONS_STALLED: &str = "postbox_sessions_stalled";
    /// Counter: pauses of a client that published faster than its rate limit.
    pub const PUBLISH_RATE_PAUSES_TOTAL: &str = "postbox_publish_rate_pauses_total";
    /// Gauge: publishing connections paused by back-pressure now.
    pub const PUBLISHERS_PAUSED: &str = "postbox_publishers_paused";
    /// Counter: seconds publishers have spent paused, all together.
    pub const PUBLISHER_PAUSE_SECONDS_TOTAL: &str = "postbox_publisher_pause_seconds_total";
    /// Gauge: the memory budget in bytes.
    pub const MEMORY_BUDGET_BYTES: &str = "postbox_memory_budget_bytes";
    /// Gauge: bytes counted against the memory budget.
    pub const MEMORY_USED_BYTES: &str = "postbox_memory_used_bytes";
    /// Counter: connections closed because a packet could not be decoded.
    pub const MALFORMED_PACKETS_TOTAL: &str = "postbox_malformed_packets_total";
    /// Counter: connections closed for a protocol violation in a well-formed packet.
    pub const PROTOCOL_ERRORS_TOTAL: &str = "postbox_protocol_errors_total";
    /// Counter: connections closed because the client missed its keep-alive.
    pub const KEEPALIVE_TIMEOUTS_TOTAL: &str = "postbox_keepalive_timeouts_total";
    /// Counter: connections closed because the credentials they connected with expired (a
    /// JWT's `exp` passed while connected).
    pub const CREDENTIALS_EXPIRED_TOTAL: &str = "postbox_credentials_expired_total";
    /// Counter: actions the ACL refused, by `action` (`read`, `write`).
    pub const AUTHZ_DENIED_TOTAL: &str = "postbox_authz_denied_total";
    /// Counter: will messages published.
    pub const WILL_MESSAGES_PUBLISHED_TOTAL: &str = "postbox_will_messages_published_total";
    /// Counter: connections closed because the same client id connected again.
    pub const SESSION_TAKEOVERS_TOTAL: &str = "postbox_session_takeovers_total";
    /// Gauge: connections whose handshake waits for the client (pending slots taken).
    pub const CONNECTIONS_PENDING: &str = "postbox_connections_pending";
    /// Counter (label `reason`): connections refused by a listener's limits.
    pub const CONNECTIONS_REFUSED_TOTAL: &str = "postbox_connections_refused_total";
    /// Counter: WebSocket upgrades refused or failed, by `listener` and `reason` (`path`,
    /// `origin`, `subprotocol`, `handshake`, `timeout`). Created at the first failure (its
    /// labels name listeners), so not in [`ALL`] (whose tests want every series at start);
    /// README lists it.
    pub const WS_UPGRADE_FAILURES_TOTAL: &str = "postbox_ws_upgrade_failures_total";
    /// Counter: connections closed because their CONNECT was not accepted within
    /// `mqtt.connect_timeout`.
    pub const CONNECT_TIMEOUTS_TOTAL: &str = "postbox_connect_timeouts_total";
    /// Counter: connections closed because a started packet did not complete in time
    /// (`mqtt.packet_timeout`, `mqtt.min_packet_rate`).
    pub const PACKET_TIMEOUTS_TOTAL: &str = "postbox_packet_timeouts_total";
    /// Gauge: bytes held in read buffers by packets that have started to arrive and are not
    /// complete yet (what a later memory budget counts).
    pub const PARTIAL_PACKET_BYTES: &str = "postbox_partial_packet_bytes";

    /// Gauge: bytes of live data in the durable store (what `storage.max_disk_bytes` limits).
    pub const STORE_LIVE_BYTES: &str = "postbox_store_live_bytes";
    /// Gauge: bytes on disk in the store's log and snapshot files.
    pub const STORE_DISK_BYTES: &str = "postbox_store_disk_bytes";
    /// Counter: group commits written by the durable store.
    pub const STORE_COMMITS_TOTAL: &str = "postbox_store_commits_total";
    /// Counter: fsyncs done by the durable store.
    pub const STORE_FSYNCS_TOTAL: &str = "postbox_store_fsyncs_total";
    /// Counter: log compactions (snapshots) of the durable store.
    pub const STORE_COMPACTIONS_TOTAL: &str = "postbox_store_compactions_total";
    /// Counter (label `reason`): store updates refused or dropped (`queue_full`, `disk_full`,
    /// `disk_full_dropped`, `no_space`).
    pub const STORE_REJECTED_TOTAL: &str = "postbox_store_rejected_total";
    /// Gauge: 1 while the store's filesystem is full and the writer waits to write again.
    pub const STORE_OUT_OF_SPACE: &str = "postbox_store_out_of_space";
    /// Counter: frames of the durable store skipped at start because they failed their
    /// checksums (or their log file was missing); everything else was kept.
    pub const STORE_RECOVERY_LOST_FRAMES_TOTAL: &str = "postbox_store_recovery_lost_frames_total";
    /// Counter (label `kind`: an op kind, or `unknown`): records in those frames.
    pub const STORE_RECOVERY_LOST_RECORDS_TOTAL: &str = "postbox_store_recovery_lost_records_total";

    /// Every metric name above, for docs and completeness tests.
    pub const ALL: [&str; 39] = [
        CONNECTIONS_CURRENT,
        CONNECTIONS_TOTAL,
        SESSIONS_CURRENT,
        SUBSCRIPTIONS_CURRENT,
        RETAINED_MESSAGES,
        MESSAGES_RECEIVED_TOTAL,
        MESSAGES_SENT_TOTAL,
        BYTES_RECEIVED_TOTAL,
        BYTES_SENT_TOTAL,
        MESSAGES_DROPPED_TOTAL,
        MESSAGES_REFUSED_TOTAL,
        SESSION_STALLS_TOTAL,
        SESSIONS_STALLED,
        PUBLISHERS_PAUSED,
        PUBLISHER_PAUSE_SECONDS_TOTAL,
        PUBLISH_RATE_PAUSES_TOTAL,
        MEMORY_BUDGET_BYTES,
        MEMORY_USED_BYTES,
        MALFORMED_PACKETS_TOTAL,
        PROTOCOL_ERRORS_TOTAL,
        KEEPALIVE_TIMEOUTS_TOTAL,
        CREDENTIALS_EXPIRED_TOTAL,
        WILL_MESSAGES_PUBLISHED_TOTAL,
        AUTHZ_DENIED_TOTAL,
        SESSION_TAKEOVERS_TOTAL,
        CONNECTIONS_PENDING,
        CONNECTIONS_REFUSED_TOTAL,
        CONNECT_TIMEOUTS_TOTAL,
        PACKET_TIMEOUTS_TOTAL,
        PARTIAL_PACKET_BYTES,
        STORE_LIVE_BYTES,
        STORE_DISK_BYTES,
        STORE_COMMITS_TOTAL,
        STORE_FSYNCS_TOTAL,
        STORE_COMPACTIONS_TOTAL,
        STORE_REJECTED_TOTAL,
        STORE_OUT_OF_SPACE,
        STORE_RECOVERY_LOST_FRAMES_TOTAL,
        STORE_RECOVERY_LOST_RECORDS_TOTAL,
    ];
}

/// Durable-store metrics, copied from [`crate::storage::StoreStats`] right before each scrape
/// ([`MetricsEndpoint::before_scrape`]): the store counts on its own thread, in atomics of its
/// own, and a copy made at scrape time shows them as they are at that moment.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    live_bytes: Gauge,
    disk_bytes: Gauge,
    commits: Counter,
    fsyncs: Counter,
    compactions: Counter,
    rejected_queue_full: Counter,
    rejected_disk_full: Counter,
    dropped_disk_full: Counter,
    rejected_no_space: Counter,
    out_of_space: Gauge,
    recovery_lost_frames: Counter,
    /// By op kind ([`crate::storage::Op::KIND_NAMES`]), then `unknown`.
    recovery_lost_records: Vec<Counter>,
}

impl StoreMetrics {
    /// Registers the store metrics (no-ops without a recorder).
    pub fn register() -> StoreMetrics {
        use names::*;
        describe_gauge!(
            STORE_LIVE_BYTES,
            Unit::Bytes,
            "Live data in the durable store."
        );
        describe_gauge!(
            STORE_DISK_BYTES,
            Unit::Bytes,
            "Bytes of the durable store's files on disk right now (logs and snapshots)."
        );
        describe_counter!(
            STORE_COMMITS_TOTAL,
            Unit::Count,
            "Group commits written by the durable store."
        );
        describe_counter!(
            STORE_FSYNCS_TOTAL,
            Unit::Count,
            "fsyncs done by the durable store."
        );
        describe_counter!(
            STORE_COMPACTIONS_TOTAL,
            Unit::Count,
            "Durable store log compactions."
        );
        describe_counter!(
            STORE_REJECTED_TOTAL,
            Unit::Count,
            "Store updates refused (queue_full, disk_full, no_space) or dropped (disk_full_dropped)."
        );
        describe_gauge!(
            STORE_OUT_OF_SPACE,
            Unit::Count,
            "1 while the store's filesystem is full: new persistent messages are refused."
        );
        describe_counter!(
            STORE_RECOVERY_LOST_FRAMES_TOTAL,
            Unit::Count,
            "Store frames skipped at start because they failed their checksums."
        );
        describe_counter!(
            STORE_RECOVERY_LOST_RECORDS_TOTAL,
            Unit::Count,
            "Records in the store frames skipped at start, by kind."
        );
        let kinds = crate::storage::Op::KIND_NAMES.iter().chain(&["unknown"]);
        StoreMetrics {
            live_bytes: gauge!(STORE_LIVE_BYTES),
            disk_bytes: gauge!(STORE_DISK_BYTES),
            commits: counter!(STORE_COMMITS_TOTAL),
            fsyncs: counter!(STORE_FSYNCS_TOTAL),
            compactions: counter!(STORE_COMPACTIONS_TOTAL),
            rejected_queue_full: counter!(STORE_REJECTED_TOTAL, "reason" => "queue_full"),
            rejected_disk_full: counter!(STORE_REJECTED_TOTAL, "reason" => "disk_full"),
            dropped_disk_full: counter!(STORE_REJECTED_TOTAL, "reason" => "disk_full_dropped"),
            rejected_no_space: counter!(STORE_REJECTED_TOTAL, "reason" => "no_space"),
            out_of_space: gauge!(STORE_OUT_OF_SPACE),
            recovery_lost_frames: counter!(STORE_RECOVERY_LOST_FRAMES_TOTAL),
            recovery_lost_records: kinds
                .map(|kind| counter!(STORE_RECOVERY_LOST_RECORDS_TOTAL, "kind" => *kind))
                .collect(),
        }
    }

    /// Publishes a stats reading.
    pub fn update(&self, stats: &crate::storage::StoreStats) {
        self.live_bytes.set(stats.live_bytes as f64);
        self.disk_bytes.set(stats.disk_bytes as f64);
        self.commits.absolute(stats.commits);
        self.fsyncs.absolute(stats.fsyncs);
        self.compactions.absolute(stats.compactions);
        self.rejected_queue_full.absolute(stats.rejected_queue_full);
        self.rejected_disk_full.absolute(stats.rejected_disk_full);
        self.dropped_disk_full.absolute(stats.dropped_disk_full);
        self.rejected_no_space.absolute(stats.rejected_no_space);
        self.out_of_space
            .set(if stats.no_space { 1.0 } else { 0.0 });
        let loss = &stats.recovery;
        self.recovery_lost_frames.absolute(loss.frames);
        let records = loss.records.iter().copied().chain([loss.unknown_records]);
        for (counter, n) in self.recovery_lost_records.iter().zip(records) {
            counter.absolute(n);
        }
    }
}

/// Handles to every broker metric, registered once at start.
///
/// Clone it into each task; a clone shares the same underlying counters. Index the per-QoS
/// arrays with `qos as usize` (0, 1, 2).
#[derive(Clone, Debug)]
pub struct Metrics {
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
    /// PUBLISHes not routed because the broker was over its memory budget (QoS 1/2 refused,
    /// QoS 0 dropped), by QoS.
    pub messages_dropped_memory: [Counter; 3],
    /// Client PUBLISHes refused because a subscriber's queue was full and
    /// `mqtt.queue_overflow = "refuse"`, by QoS.
    pub messages_refused_queue_full: [Counter; 3],
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
    /// Connections whose handshake waits for the client (every listener's pending slots).
    pub connections_pending: Gauge,
    /// Waiting handshakes closed: the listener's `max_pending_connections` were taken.
    pub connections_refused_pending: Counter,
    /// Waiting handshakes closed: their source had `max_pending_connections_per_ip`.
    pub connections_refused_per_ip: Counter,
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
    /// Connections closed because their CONNECT was not accepted within `mqtt.connect_timeout`.
    pub connect_timeouts: Counter,
    /// Connections closed because a started packet did not complete in time.
    pub packet_timeouts: Counter,
    /// Bytes held by partially read packets; set from `connection::partial_packet_bytes`
    /// by the server's periodic sweep (the connections count into one process-wide atomic).
    pub partial_packet_bytes: Gauge,
}

/// `postbox_messages_dropped_total{reason, qos}`, one counter per QoS.
fn dropped_by_qos(reason: &'static str) -> [Counter; 3] {
    use names::MESSAGES_DROPPED_TOTAL;
    [
        counter!(MESSAGES_DROPPED_TOTAL, "reason" => reason, "qos" => "0"),
        counter!(MESSAGES_DROPPED_TOTAL, "reason" => reason, "qos" => "1"),
        counter!(MESSAGES_DROPPED_TOTAL, "reason" => reason, "qos" => "2"),
    ]
}

impl Metrics {
    /// Describes and registers every metric with the installed recorder, returning the handles.
    ///
    /// Without a recorder (tests, metrics disabled) every handle is a no-op, so callers never
    /// need to check whether metrics are on.
    pub fn register() -> Metrics {
        use names::*;

        describe_gauge!(
            CONNECTIONS_CURRENT,
            Unit::Count,
            "Client network connections currently open."
        );
        describe_counter!(
            CONNECTIONS_TOTAL,
            Unit::Count,
            "Client network connections accepted since start."
        );
        describe_gauge!(
            SESSIONS_CURRENT,
            Unit::Count,
            "Sessions held, including persistent sessions of offline clients."
        );
        describe_gauge!(
            SUBSCRIPTIONS_CURRENT,
            Unit::Count,
            "Subscriptions held across all sessions."
        );
        describe_gauge!(RETAINED_MESSAGES, Unit::Count, "Retained messages stored.");
        describe_counter!(
            MESSAGES_RECEIVED_TOTAL,
            Unit::Count,
            "PUBLISH packets received from clients, by QoS."
        );
        describe_counter!(
            MESSAGES_SENT_TOTAL,
            Unit::Count,
            "PUBLISH packets sent to clients, by QoS."
        );
        describe_counter!(
            BYTES_RECEIVED_TOTAL,
            Unit::Bytes,
            "Bytes read from client connections."
        );
        describe_counter!(
            BYTES_SENT_TOTAL,
            Unit::Bytes,
            "Bytes written to client connections."
        );
        describe_counter!(
            MESSAGES_DROPPED_TOTAL,
            Unit::Count,
            "Messages dropped instead of delivered, by reason (queue_full, qos0_offline, too_large, memory) and QoS."
        );
        describe_counter!(
            WS_UPGRADE_FAILURES_TOTAL,
            Unit::Count,
            "WebSocket upgrades refused or failed on ws listeners, by listener and reason (path, origin, subprotocol, handshake, timeout)."
        );
        describe_counter!(
            SESSION_STALLS_TOTAL,
            Unit::Count,
            "Connected sessions found stalled: a full queue that took nothing off for mqtt.stalled_after (once per stall)."
        );
        describe_gauge!(
            SESSIONS_STALLED,
            Unit::Count,
            "Connected sessions stalled now: a full queue that took nothing off for mqtt.stalled_after; their overflow goes to mqtt.queue_overflow."
        );
        describe_counter!(
            MESSAGES_REFUSED_TOTAL,
            Unit::Count,
            "PUBLISHes refused and left with their publisher instead of being dropped for a subscriber, by reason (queue_full: mqtt.queue_overflow = refuse) and QoS."
        );
        describe_gauge!(
            PUBLISHERS_PAUSED,
            Unit::Count,
            "Publishing connections paused by back-pressure (a full subscriber queue or the memory budget)."
        );
        describe_counter!(
            PUBLISH_RATE_PAUSES_TOTAL,
            Unit::Count,
            "Pauses of clients that published faster than mqtt.max_publish_rate / max_publish_bytes_rate (their socket is read no faster)."
        );
        describe_counter!(
            PUBLISHER_PAUSE_SECONDS_TOTAL,
            Unit::Seconds,
            "Seconds publishers have spent paused by back-pressure, all together."
        );
        describe_gauge!(
            MEMORY_BUDGET_BYTES,
            Unit::Bytes,
            "The memory budget for messages and partial packets (mqtt.max_memory)."
        );
        describe_gauge!(
            MEMORY_USED_BYTES,
            Unit::Bytes,
            "Bytes counted against the memory budget: messages held and partial packets."
        );
        describe_counter!(
            MALFORMED_PACKETS_TOTAL,
            Unit::Count,
            "Connections closed because a packet could not be decoded."
        );
        describe_counter!(
            PROTOCOL_ERRORS_TOTAL,
            Unit::Count,
            "Connections closed for a protocol violation in a well-formed packet."
        );
        describe_counter!(
            KEEPALIVE_TIMEOUTS_TOTAL,
            Unit::Count,
            "Connections closed because the client missed its keep-alive."
        );
        describe_counter!(
            CREDENTIALS_EXPIRED_TOTAL,
            Unit::Count,
            "Connections closed because the credentials they connected with (a JWT) expired."
        );
        describe_counter!(
            AUTHZ_DENIED_TOTAL,
            Unit::Count,
            "Actions the ACL refused: publishes, subscriptions, deliveries, wills, by action."
        );
        describe_counter!(
            WILL_MESSAGES_PUBLISHED_TOTAL,
            Unit::Count,
            "Will messages published."
        );
        describe_counter!(
            SESSION_TAKEOVERS_TOTAL,
            Unit::Count,
            "Connections closed because a new connection took over their client id."
        );

        describe_gauge!(
            CONNECTIONS_PENDING,
            Unit::Count,
            "Connections whose handshake waits for the client (CONNECT incomplete, AUTH answer due)."
        );
        describe_counter!(
            CONNECTIONS_REFUSED_TOTAL,
            Unit::Count,
            "Connections refused by a listener's limits, by reason (pending_limit, pending_per_ip, max_connections, max_connections_per_ip, global_max_connections, proxy_header)."
        );
        describe_counter!(
            CONNECT_TIMEOUTS_TOTAL,
            Unit::Count,
            "Connections closed because their CONNECT was not accepted within mqtt.connect_timeout."
        );
        describe_counter!(
            PACKET_TIMEOUTS_TOTAL,
            Unit::Count,
            "Connections closed because a started packet did not complete in time."
        );
        describe_gauge!(
            PARTIAL_PACKET_BYTES,
            Unit::Bytes,
            "Bytes held by packets that have started to arrive and are not complete."
        );

        Metrics {
            connections_current: gauge!(CONNECTIONS_CURRENT),
            connections_total: counter!(CONNECTIONS_TOTAL),
            sessions_current: gauge!(SESSIONS_CURRENT),
            subscriptions_current: gauge!(SUBSCRIPTIONS_CURRENT),
            retained_messages: gauge!(RETAINED_MESSAGES),
            messages_received: [
                counter!(MESSAGES_RECEIVED_TOTAL, "qos" => "0"),
                counter!(MESSAGES_RECEIVED_TOTAL, "qos" => "1"),
                counter!(MESSAGES_RECEIVED_TOTAL, "qos" => "2"),
            ],
            messages_sent: [
                counter!(MESSAGES_SENT_TOTAL, "qos" => "0"),
                counter!(MESSAGES_SENT_TOTAL, "qos" => "1"),
                counter!(MESSAGES_SENT_TOTAL, "qos" => "2"),
            ],
            bytes_received: counter!(BYTES_RECEIVED_TOTAL),
            bytes_sent: counter!(BYTES_SENT_TOTAL),
            messages_dropped_queue_full: dropped_by_qos("queue_full"),
            messages_dropped_qos0_offline: counter!(
                MESSAGES_DROPPED_TOTAL,
                "reason" => "qos0_offline",
                "qos" => "0"
            ),
            messages_dropped_too_large: dropped_by_qos("too_large"),
            messages_dropped_memory: dropped_by_qos("memory"),
            messages_refused_queue_full: [
                counter!(MESSAGES_REFUSED_TOTAL, "reason" => "queue_full", "qos" => "0"),
                counter!(MESSAGES_REFUSED_TOTAL, "reason" => "queue_full", "qos" => "1"),
                counter!(MESSAGES_REFUSED_TOTAL, "reason" => "queue_full", "qos" => "2"),
            ],
            session_stalls: counter!(SESSION_STALLS_TOTAL),
            sessions_stalled: gauge!(SESSIONS_STALLED),
            publishers_paused: gauge!(PUBLISHERS_PAUSED),
            publish_rate_pauses: counter!(PUBLISH_RATE_PAUSES_TOTAL),
            publisher_pause_seconds: counter!(PUBLISHER_PAUSE_SECONDS_TOTAL),
            memory_budget_bytes: gauge!(MEMORY_BUDGET_BYTES),
            memory_used_bytes: gauge!(MEMORY_USED_BYTES),
            malformed_packets: counter!(MALFORMED_PACKETS_TOTAL),
            protocol_errors: counter!(PROTOCOL_ERRORS_TOTAL),
            keepalive_timeouts: counter!(KEEPALIVE_TIMEOUTS_TOTAL),
            credentials_expired: counter!(CREDENTIALS_EXPIRED_TOTAL),
            will_messages_published: counter!(WILL_MESSAGES_PUBLISHED_TOTAL),
            authz_denied: [
                counter!(AUTHZ_DENIED_TOTAL, "action" => "read"),
                counter!(AUTHZ_DENIED_TOTAL, "action" => "write"),
            ],
            session_takeovers: counter!(SESSION_TAKEOVERS_TOTAL),
            connections_pending: gauge!(CONNECTIONS_PENDING),
            connections_refused_pending: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "pending_limit"
            ),
            connections_refused_per_ip: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "pending_per_ip"
            ),
            connections_refused_max: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "max_connections"
            ),
            connections_refused_max_per_ip: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "max_connections_per_ip"
            ),
            connections_refused_server: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "global_max_connections"
            ),
            connections_refused_proxy: counter!(
                CONNECTIONS_REFUSED_TOTAL,
                "reason" => "proxy_header"
            ),
            connect_timeouts: counter!(CONNECT_TIMEOUTS_TOTAL),
            packet_timeouts: counter!(PACKET_TIMEOUTS_TOTAL),
            partial_packet_bytes: gauge!(PARTIAL_PACKET_BYTES),
        }
    }
}

/// Why the metrics exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The HTTP listener could not bind (port in use, no permission, bad address).
    #[error("cannot serve metrics on {bind}: {message}")]
    Bind {
        /// The address from `metrics.bind`.
        bind: SocketAddr,
        /// The underlying error, as text (the exporter reports it that way).
        message: String,
    },
    /// The recorder could not be installed, typically because one is installed already.
    #[error("cannot install the metrics recorder: {0}")]
    Install(String),
}

/// Installs the global Prometheus recorder and serves it over HTTP at `bind` (path /metrics).
///
/// Inside a tokio runtime the HTTP server runs as a task on it; outside one it gets a thread of
/// its own. Call it once, before [`Metrics::register`]. Any path except `/health` (which
/// answers `OK`) returns the metrics, so `/metrics` works as Prometheus expects.
///
/// # Errors
///
/// `MetricsError::Bind` when the HTTP listener cannot bind; `MetricsError::Install` when a
/// recorder is installed already.
pub fn install_exporter(bind: SocketAddr) -> Result<(), MetricsError> {
    use metrics_exporter_prometheus::{BuildError, PrometheusBuilder};

    PrometheusBuilder::new()
        .with_http_listener(bind)
        .install()
        .map_err(|e| match e {
            BuildError::FailedToCreateHTTPListener(message) => MetricsError::Bind { bind, message },
            other => MetricsError::Install(other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn register_without_recorder_is_noop() {
        let m = Metrics::register();
        m.connections_total.increment(1);
        m.messages_received[2].increment(1);
        m.connections_current.decrement(1.0);
        let clone = m.clone();
        clone.bytes_sent.increment(10);
    }

    #[test]
    fn every_metric_is_exported_with_help_and_labels() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let m = metrics::with_local_recorder(&recorder, Metrics::register);
        let store = metrics::with_local_recorder(&recorder, StoreMetrics::register);
        store.update(&crate::storage::StoreStats {
            commits: 9,
            ..Default::default()
        });

        // Handles keep working after registration: updates need no recorder lookup.
        m.connections_total.increment(3);
        m.connections_current.increment(2.0);
        m.messages_received[1].increment(5);
        m.messages_sent[2].increment(7);
        m.messages_dropped_queue_full[1].increment(1);
        m.messages_dropped_qos0_offline.increment(4);
        m.bytes_received.increment(1234);

        let out = handle.render();
        for name in names::ALL {
            assert!(
                out.contains(&format!("# HELP {name} ")),
                "no HELP for {name}:\n{out}"
            );
            assert!(
                out.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}:\n{out}"
            );
        }
        for line in [
            "postbox_connections_total 3",
            "postbox_connections_current 2",
            "postbox_messages_received_total{qos=\"1\"} 5",
            "postbox_messages_received_total{qos=\"0\"} 0",
            "postbox_messages_sent_total{qos=\"2\"} 7",
            "postbox_messages_dropped_total{reason=\"queue_full\",qos=\"1\"} 1",
            "postbox_messages_dropped_total{reason=\"qos0_offline\",qos=\"0\"} 4",
            "postbox_bytes_received_total 1234",
            "postbox_store_commits_total 9",
        ] {
            assert!(
                out.lines().any(|l| l == line),
                "missing `{line}` in:\n{out}"
            );
        }
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        let counters = [
            names::CONNECTIONS_TOTAL,
            names::MESSAGES_RECEIVED_TOTAL,
            names::MESSAGES_SENT_TOTAL,
            names::BYTES_RECEIVED_TOTAL,
            names::BYTES_SENT_TOTAL,
            names::MESSAGES_DROPPED_TOTAL,
            names::MESSAGES_REFUSED_TOTAL,
            names::SESSION_STALLS_TOTAL,
            names::PUBLISHER_PAUSE_SECONDS_TOTAL,
            names::PUBLISH_RATE_PAUSES_TOTAL,
            names::MALFORMED_PACKETS_TOTAL,
            names::PROTOCOL_ERRORS_TOTAL,
            names::KEEPALIVE_TIMEOUTS_TOTAL,
            names::CREDENTIALS_EXPIRED_TOTAL,
            names::WILL_MESSAGES_PUBLISHED_TOTAL,
            names::AUTHZ_DENIED_TOTAL,
            names::SESSION_TAKEOVERS_TOTAL,
            names::CONNECTIONS_REFUSED_TOTAL,
            names::CONNECT_TIMEOUTS_TOTAL,
            names::PACKET_TIMEOUTS_TOTAL,
            names::STORE_COMMITS_TOTAL,
            names::STORE_FSYNCS_TOTAL,
            names::STORE_COMPACTIONS_TOTAL,
            names::STORE_REJECTED_TOTAL,
            names::STORE_RECOVERY_LOST_FRAMES_TOTAL,
            names::STORE_RECOVERY_LOST_RECORDS_TOTAL,
        ];
        for name in names::ALL {
            assert!(name.starts_with("postbox_"), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            assert_eq!(name.ends_with("_total"), counters.contains(&name), "{name}");
        }
    }

    #[test]
    fn readme_lists_every_metric() {
        let readme = include_str!("../README.md");
        for name in names::ALL {
            assert!(
                readme.contains(&format!("`{name}`")),
                "README.md lacks `{name}`"
            );
        }
    }
}
