//! Name of every metric, so dashboards, docs and tests refer to one spelling.

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
/// Counter (label `reason`: `queue_full`, `expired`, `too_large`, `schema_invalid`,
/// `max_deliveries`, `rejected`): dead letters published (`[dead_letter]`), one per message
/// dropped for that reason.
pub const DEAD_LETTERS_TOTAL: &str = "postbox_dead_letters_total";
/// Counter (label `reason`: `rate`, over `dead_letter.max_rate`; `refused`, the store refused
/// it): dead letters not published, so the loss they stood for is only counted.
pub const DEAD_LETTERS_DROPPED_TOTAL: &str = "postbox_dead_letters_dropped_total";
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
/// Gauge: bytes handed to the durable store and not yet committed (its writer's queue).
pub const STORE_QUEUE_BYTES: &str = "postbox_store_queue_bytes";
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
/// Counter (label `outcome`: `refused`, `replaced`): CONNECTs naming the client id of a
/// session another identity owns (issue 35, `auth.session_binding`).
pub const SESSION_BINDING_TOTAL: &str = "postbox_session_binding_total";
/// Gauge: connections whose handshake waits for the client (pending slots taken).
pub const CONNECTIONS_PENDING: &str = "postbox_connections_pending";
/// Counter (label `reason`): connections refused by a listener's limits.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "postbox_connections_refused_total";
/// Counter (label `reason`: `max_connections`, `max_connections_per_ip`): connections to the
/// HTTP listeners (`[metrics] bind`, `admin.bind`) closed at accept by `[metrics]`'s bounds.
pub const HTTP_CONNECTIONS_REFUSED_TOTAL: &str = "postbox_http_connections_refused_total";
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
/// Counter: connections closed for a packet over `mqtt.max_packet_size`.
pub const PACKETS_TOO_LARGE_TOTAL: &str = "postbox_packets_too_large_total";
/// Counter: anonymous connections closed because a packet they were sending, a topic alias
/// they bound or output they did not read would take what anonymous clients' connections hold
/// past their share of `mqtt.max_memory` (`connection::partial`, `connection::held`).
pub const ANONYMOUS_SHARE_CLOSES_TOTAL: &str = "postbox_anonymous_share_closes_total";
/// Gauge, by `part`: what anonymous clients make the broker hold, each part against its own
/// eighth of `mqtt.max_memory` (kept: sessions, queues, retained messages, dead letters inside the
/// budget, copies of their messages in password users' unread output outside it; connected: sessions that end with their connection; `in_transit`:
/// packets still arriving and what connections hold for them, both outside the budget).
pub const ANONYMOUS_BYTES: &str = "postbox_anonymous_bytes";
/// Gauge: bytes held in read buffers by packets that have started to arrive and are not
/// complete yet, and what connections hold beside them (inbound topic aliases, unread output:
/// `connection::held`); the connected clients' part counts in the memory budget.
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

/// Gauge (label `version`): always 1; the build's version as a label (join on it).
pub const BUILD_INFO: &str = "postbox_build_info";
/// Gauge (labels `listener`, `protocol`: `3.1`, `3.1.1`, `5.0`): clients whose CONNECT was
/// accepted and who are still connected.
pub const CLIENTS_CONNECTED: &str = "postbox_clients_connected";
/// Counter (labels `listener`, `protocol`): CONNECTs accepted.
pub const CLIENT_CONNECTS_TOTAL: &str = "postbox_client_connects_total";
/// Gauge: most clients connected at once since start (Mosquitto's
/// `$SYS/broker/clients/maximum`).
pub const CLIENTS_PEAK: &str = "postbox_clients_peak";
/// Counter (label `reason`): CONNECTs answered with a refusing CONNACK.
pub const CONNACK_REFUSALS_TOTAL: &str = "postbox_connack_refusals_total";
/// Counter: sessions ended because their expiry interval passed (Mosquitto's
/// `$SYS/broker/clients/expired`).
pub const SESSIONS_EXPIRED_TOTAL: &str = "postbox_sessions_expired_total";
/// Gauge: messages waiting in session queues, all sessions (Mosquitto's `messages/stored`).
pub const MESSAGES_QUEUED: &str = "postbox_messages_queued";
/// Histogram: seconds from a PUBLISH being read to its delivery being written to a
/// subscriber's connection.
pub const DELIVERY_LATENCY_SECONDS: &str = "postbox_delivery_latency_seconds";
/// Histogram: seconds one group commit of the durable store took (write and fsync).
pub const STORE_COMMIT_SECONDS: &str = "postbox_store_commit_seconds";
/// Gauge: sessions with at least one queued message not yet sent.
pub const SESSIONS_BACKLOGGED: &str = "postbox_sessions_backlogged";
/// Gauge: the largest queue of any session, in messages.
pub const SESSION_BACKLOG_MAX: &str = "postbox_session_backlog_max";
/// Gauge: age in seconds of the oldest queued message of any session.
pub const SESSION_BACKLOG_OLDEST_SECONDS: &str = "postbox_session_backlog_oldest_seconds";
/// Gauge: bytes (topic, payload, properties) of the messages waiting in session queues, all sessions; computed at
/// scrape.
pub const MESSAGES_QUEUED_BYTES: &str = "postbox_messages_queued_bytes";
/// Gauge: shared-subscription groups (`$share/{group}/{filter}`) existing now.
pub const SHARED_GROUPS: &str = "postbox_shared_groups";
/// Gauge: memberships of shared groups, all groups, connected or not.
pub const SHARED_GROUP_MEMBERS: &str = "postbox_shared_group_members";
/// Gauge: memberships of shared groups whose session is connected now.
pub const SHARED_GROUP_MEMBERS_CONNECTED: &str = "postbox_shared_group_members_connected";
/// Gauge: messages queued for shared groups (across their members), all groups.
pub const SHARED_MESSAGES_QUEUED: &str = "postbox_shared_messages_queued";
/// Gauge: the largest backlog of any shared group, in messages.
pub const SHARED_GROUP_BACKLOG_MAX: &str = "postbox_shared_group_backlog_max";
/// Gauge: age in seconds of the oldest message queued for any shared group.
pub const SHARED_GROUP_BACKLOG_OLDEST_SECONDS: &str = "postbox_shared_group_backlog_oldest_seconds";
/// Gauge: shared groups holding a backlog with no member connected (nobody takes it now).
pub const SHARED_GROUPS_UNSERVED: &str = "postbox_shared_groups_unserved";
/// Gauge: `storage.max_disk_bytes` (0 = unlimited).
pub const STORE_BUDGET_BYTES: &str = "postbox_store_budget_bytes";
/// Gauge (label `listener`): notAfter, in Unix seconds, of each tls/wss listener's
/// certificate; set at load and on every reload, so absent without such a listener (not in
/// [`ALL`]).
pub const TLS_CERTIFICATE_EXPIRY: &str = "postbox_tls_certificate_expiry_timestamp_seconds";
/// Counter (labels `listener`, `reason`): TLS handshakes that failed or timed out. Its
/// series appear at the first failure (not in [`ALL`]).
pub const TLS_HANDSHAKE_FAILURES_TOTAL: &str = "postbox_tls_handshake_failures_total";
/// Counter (label `reason`): logins refused by the password file or JWT check (README
/// documents it with the password file; not in [`ALL`], which the dashboard must show).
pub const AUTH_FAILURES_TOTAL: &str = "postbox_auth_failures_total";
/// Counter (label `cached`): logins accepted by the password file.
pub const AUTH_SUCCESSES_TOTAL: &str = "postbox_auth_successes_total";
/// Counter (label `key`: `address`, `user`): logins refused unchecked by the failed-login
/// limits (`auth::throttle`).
pub const AUTH_THROTTLED_TOTAL: &str = "postbox_auth_throttled_total";
/// Counter: password hashes run for logins.
pub const AUTH_HASHES_TOTAL: &str = "postbox_auth_hashes_total";
/// Counter: password checks that ended before their hash (client gone, deadline).
pub const AUTH_HASHES_SKIPPED_TOTAL: &str = "postbox_auth_hashes_skipped_total";

/// Gauge (label `bridge`): 1 while the bridge's link to its remote is up (CONNACK accepted),
/// else 0.
pub const BRIDGE_UP: &str = "postbox_bridge_up";
/// Counter (label `bridge`): successful connects to the remote after the first.
pub const BRIDGE_RECONNECTS_TOTAL: &str = "postbox_bridge_reconnects_total";
/// Gauge (label `bridge`): messages the bridge's local session holds for the remote (queued,
/// and sent but not acknowledged by it); computed at scrape.
pub const BRIDGE_QUEUED_MESSAGES: &str = "postbox_bridge_queued_messages";
/// Gauge (label `bridge`): bytes (topic, payload, properties) of those messages; computed at scrape.
pub const BRIDGE_QUEUED_BYTES: &str = "postbox_bridge_queued_bytes";
/// Gauge (label `bridge`): age in seconds of the oldest of them (0: none); computed at scrape.
pub const BRIDGE_OLDEST_QUEUED_SECONDS: &str = "postbox_bridge_oldest_queued_seconds";
/// Gauge (label `bridge`): bytes the bridge's remote's messages make this broker hold now
/// (held, queued or retained here), counted in the bridge's share (an eighth of
/// `mqtt.max_memory`) where an auth method tells identities apart and the bridge is not
/// `trusted`; computed at scrape.
pub const BRIDGE_SHARE_BYTES: &str = "postbox_bridge_share_bytes";
/// Counter (labels `bridge`, `direction`: `out`, `in`): messages forwarded across the bridge
/// (QoS 1/2: acknowledged by the receiving side).
pub const BRIDGE_FORWARDED_TOTAL: &str = "postbox_bridge_forwarded_total";
/// Counter (labels `bridge`, `direction`, `reason`: `max_hops`, `topic`, `refused`,
/// `queue_full`): messages the bridge did not forward.
pub const BRIDGE_DROPPED_TOTAL: &str = "postbox_bridge_dropped_total";

/// Every per-bridge metric. Their series exist once a `[[bridge]]` is configured (the label is
/// its name), so they are not in [`ALL`], whose tests want every series of a bare broker; the
/// README and the dashboard must still list them (tests check both lists).
pub const BRIDGE: [&str; 8] = [
    BRIDGE_UP,
    BRIDGE_RECONNECTS_TOTAL,
    BRIDGE_QUEUED_MESSAGES,
    BRIDGE_QUEUED_BYTES,
    BRIDGE_OLDEST_QUEUED_SECONDS,
    BRIDGE_SHARE_BYTES,
    BRIDGE_FORWARDED_TOTAL,
    BRIDGE_DROPPED_TOTAL,
];

/// Counter: PUBLISHes acknowledged and not routed, their (topic, `dedup.property`) seen within
/// `dedup.window`.
pub const DEDUP_DUPLICATES_TOTAL: &str = "postbox_dedup_duplicates_total";
/// Gauge: (topic, message id) pairs the dedup window remembers now.
pub const DEDUP_ENTRIES: &str = "postbox_dedup_entries";
/// Counter: dedup pairs forgotten before their window closed (a bound reached, oldest first).
pub const DEDUP_EVICTED_TOTAL: &str = "postbox_dedup_evicted_total";

/// The names of [`ALL`] that `storage::StoreMetrics` registers (with the broker's store, at
/// start), not `metrics` itself: its own tests leave them to the owner's tests.
pub(crate) const STORE: [&str; 11] = [
    STORE_LIVE_BYTES,
    STORE_DISK_BYTES,
    STORE_COMMITS_TOTAL,
    STORE_FSYNCS_TOTAL,
    STORE_COMPACTIONS_TOTAL,
    STORE_REJECTED_TOTAL,
    STORE_OUT_OF_SPACE,
    STORE_RECOVERY_LOST_FRAMES_TOTAL,
    STORE_RECOVERY_LOST_RECORDS_TOTAL,
    STORE_COMMIT_SECONDS,
    STORE_BUDGET_BYTES,
];

/// The names of [`ALL`] that `guarantees::GuaranteeMetrics` registers (with every broker),
/// not `metrics` itself: its own tests leave them to the owner's tests.
pub(crate) const GUARANTEES: [&str; 5] = [
    DEAD_LETTERS_TOTAL,
    DEAD_LETTERS_DROPPED_TOTAL,
    DEDUP_DUPLICATES_TOTAL,
    DEDUP_ENTRIES,
    DEDUP_EVICTED_TOTAL,
];

/// The names of [`ALL`] that `metrics` registers itself (the broker core's series, in
/// [`crate::metrics::Metrics::register`]).
pub(crate) const CORE: [&str; 55] = [
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
    STORE_QUEUE_BYTES,
    MALFORMED_PACKETS_TOTAL,
    PROTOCOL_ERRORS_TOTAL,
    KEEPALIVE_TIMEOUTS_TOTAL,
    CREDENTIALS_EXPIRED_TOTAL,
    WILL_MESSAGES_PUBLISHED_TOTAL,
    AUTHZ_DENIED_TOTAL,
    SESSION_TAKEOVERS_TOTAL,
    SESSION_BINDING_TOTAL,
    CONNECTIONS_PENDING,
    CONNECTIONS_REFUSED_TOTAL,
    HTTP_CONNECTIONS_REFUSED_TOTAL,
    CONNECT_TIMEOUTS_TOTAL,
    PACKET_TIMEOUTS_TOTAL,
    PACKETS_TOO_LARGE_TOTAL,
    ANONYMOUS_SHARE_CLOSES_TOTAL,
    ANONYMOUS_BYTES,
    PARTIAL_PACKET_BYTES,
    BUILD_INFO,
    CLIENTS_CONNECTED,
    CLIENT_CONNECTS_TOTAL,
    CLIENTS_PEAK,
    CONNACK_REFUSALS_TOTAL,
    SESSIONS_EXPIRED_TOTAL,
    MESSAGES_QUEUED,
    DELIVERY_LATENCY_SECONDS,
    SESSIONS_BACKLOGGED,
    SESSION_BACKLOG_MAX,
    SESSION_BACKLOG_OLDEST_SECONDS,
    MESSAGES_QUEUED_BYTES,
    SHARED_GROUPS,
    SHARED_GROUP_MEMBERS,
    SHARED_GROUP_MEMBERS_CONNECTED,
    SHARED_MESSAGES_QUEUED,
    SHARED_GROUP_BACKLOG_MAX,
    SHARED_GROUP_BACKLOG_OLDEST_SECONDS,
    SHARED_GROUPS_UNSERVED,
];

/// Every metric name of a bare broker, for docs and completeness tests: the core's and the
/// groups its owners register with every broker ([`STORE`], [`GUARANTEES`]), each listed once.
pub const ALL: [&str; 71] = concat([&CORE, &STORE, &GUARANTEES]);

/// The lists of `parts` one after the other, in a `const` (so [`ALL`] is made of the groups'
/// own lists instead of repeating them); `N` must be their total length (checked at compile
/// time).
const fn concat<const N: usize, const P: usize>(parts: [&[&'static str]; P]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut at = 0;
    let mut part = 0;
    while part < P {
        let mut i = 0;
        while i < parts[part].len() {
            out[at] = parts[part][i];
            at += 1;
            i += 1;
        }
        part += 1;
    }
    assert!(at == N, "N is not the parts' total length");
    out
}

/// Gauge: 1 while the cluster's link to NATS is up and its streams and buckets are ready.
pub const CLUSTER_UP: &str = "postbox_cluster_up";
/// Counter: connects to NATS after the first.
pub const CLUSTER_RECONNECTS_TOTAL: &str = "postbox_cluster_reconnects_total";
/// Counter (label `direction`: `out`, `in`): messages exchanged with the other nodes.
pub const CLUSTER_MESSAGES_TOTAL: &str = "postbox_cluster_messages_total";
/// Counter (label `direction`): bytes of those messages.
pub const CLUSTER_BYTES_TOTAL: &str = "postbox_cluster_bytes_total";
/// Gauge: messages sent to NATS awaiting their acknowledgement.
pub const CLUSTER_PENDING: &str = "postbox_cluster_pending";
/// Counter: QoS 1/2 PUBLISHes refused because the cluster could not take them.
pub const CLUSTER_REFUSED_TOTAL: &str = "postbox_cluster_refused_total";
/// Counter (label `reason`: `link_down`, `max_pending`): QoS 0 messages not forwarded.
pub const CLUSTER_DROPPED_TOTAL: &str = "postbox_cluster_dropped_total";
/// Gauge: other nodes' messages this node has not taken yet.
pub const CLUSTER_LAG_MESSAGES: &str = "postbox_cluster_lag_messages";
/// Gauge: shared groups' messages this node pulled and has not settled with JetStream yet.
pub const CLUSTER_SHARED_UNSETTLED: &str = "postbox_cluster_shared_unsettled";
/// Counter: frames on the cluster's subjects that were not Postbox messages.
pub const CLUSTER_BAD_FRAMES_TOTAL: &str = "postbox_cluster_bad_frames_total";

/// Gauge: nodes whose heartbeat this node heard recently (itself included).
pub const CLUSTER_NODES: &str = "postbox_cluster_nodes";

/// Every cluster metric: registered only when `[cluster]` is configured (not in [`ALL`]); the
/// README lists them.
pub const CLUSTER: [&str; 11] = [
    CLUSTER_NODES,
    CLUSTER_UP,
    CLUSTER_RECONNECTS_TOTAL,
    CLUSTER_MESSAGES_TOTAL,
    CLUSTER_BYTES_TOTAL,
    CLUSTER_PENDING,
    CLUSTER_REFUSED_TOTAL,
    CLUSTER_DROPPED_TOTAL,
    CLUSTER_LAG_MESSAGES,
    CLUSTER_SHARED_UNSETTLED,
    CLUSTER_BAD_FRAMES_TOTAL,
];
