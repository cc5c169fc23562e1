//! Routing state: sessions, the subscription index, retained messages. No socket I/O here.
//!
//! Publishing tasks route directly (no central router task): they match against the
//! read-mostly subscription index under a short read lock, then append to each target
//! session's bounded queue. The hot-path indexes are hand-written tries:
//! [`topic_tree::TopicTree`] maps filters to subscribers (one walk per PUBLISH) and
//! [`retained::RetainedIndex`] maps topic names to retained messages (one walk per SUBSCRIBE).
//! Shared subscriptions live in their own index ([`shared::SharedSubscriptions`]).
//!
//! Lock order: sessions map → subscription tree → shared index → one session's state. The two
//! indexes are never held together, and no index lock is taken while a session lock is held.

pub(crate) mod admin;
mod arrival_order;
mod backlog;
pub(crate) mod cluster_seam;
pub(crate) use cluster_seam::{
    ClaimRefused, ClaimRequest, Claimed, ClusterAdmission, ClusterSeam, HeldSession, Restore,
    StrangerPublish, StreamCharge,
};
mod dedup_spool;
pub(crate) mod flow;
mod guarantees;
pub(crate) use guarantees::Gate;
mod handle;
mod level_map;
mod lifecycle;
pub(crate) mod link;
pub(crate) mod message;
pub(crate) mod owner;
mod parts;
mod persist;
mod queue_limits;
mod redistribute;
mod restore;
pub(crate) mod retained;
mod routing;
pub(crate) mod runtime_limits;
pub(crate) mod session;
mod session_map;
pub(crate) mod shared;
pub(crate) mod shared_backlog;
pub(crate) mod stranger_share;
mod subscribe_fence;
mod subscriptions;
pub(crate) mod sys;
pub(crate) mod topic_tree;
mod trie;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use parking_lot::{Mutex, RwLock};

use crate::auth::AuthRegistry;
use crate::codec::{ProtocolVersion, QoS, SubscriptionOptions};
use crate::config::{AuthConfig, MqttConfig};
use crate::metrics::Metrics;
use crate::storage::{Durable, Op, StorageError, Store};
pub(crate) use arrival_order::{ArrivalOrder, ArrivalWaker};
pub(crate) use flow::{FlowControl, MemoryLevel};
pub(crate) use handle::{Fill, SessionHandle, SubscriptionQuota};
pub use message::Message;
pub(crate) use message::{Delivery, SessionId, Settlement};
pub use parts::Parts;
pub use queue_limits::SessionQueueLimits;
use retained::RetainedIndex;
pub(crate) use session::outbound::{AckMismatch, Resend};
pub(crate) use session::{
    Admission, DeliverySink, EnqueueOutcome, OutboundStage, PendingWill, QueueLimits, Session,
    SessionSubscription, NEVER_EXPIRES,
};
use session_map::SessionMap;
use shared::SharedSubscriptions;
pub(crate) use subscribe_fence::SubscribeFence;
use topic_tree::TopicTree;

/// How often [`Broker::wake_expired_keep_alives`] runs: a connection is closed between 1.5 ×
/// its keep-alive and that plus this period (Mosquitto checks about once a second).
pub(crate) const KEEP_ALIVE_SWEEP: Duration = Duration::from_millis(500);

/// One entry of the subscription index: who subscribed and with which options.
#[derive(Clone, Debug)]
pub(crate) struct Subscriber {
    /// The subscribing session; deliveries are queued on it.
    pub session: Arc<Session>,
    /// Subscription Options granted for this filter (MQTT 3.8.3.1).
    pub options: SubscriptionOptions,
    /// Subscription Identifier (MQTT 3.8.2.1.2) to put on matching PUBLISHes (v5).
    pub identifier: Option<u32>,
    /// The ACL generation under which every topic of the filter was readable; 0 when only
    /// some were (or no ACL). With an ACL, a delivery is checked unless this is the current
    /// generation, so the common case costs nothing and a reload re-checks old grants.
    pub acl_generation: u32,
}

/// What a client asks for when it connects.
#[derive(Clone, Debug)]
pub struct SessionRequest {
    /// Client Identifier, after the broker assigned one to an empty id.
    pub client_id: ByteString,
    /// Clean Start / Clean Session: discard any existing session (MQTT-3.1.2-4).
    pub clean_start: bool,
    /// Session Expiry Interval in seconds; 0 ends the session with the connection.
    pub expiry_interval: u32,
    /// Protocol level the client connected with.
    pub protocol: ProtocolVersion,
    /// The Maximum Packet Size its CONNECT announced (MQTT 5 §3.1.2.11.4; 0: none), set in
    /// the same lock as the attach, so a shared group never sees the session's old value
    /// (issue 35, fourteenth adversarial pass, A2).
    pub client_max_packet: u32,
}

/// A connection's claim on a session, and whether the session existed before (CONNACK's
/// Session Present, MQTT-3.2.2-2).
#[derive(Debug)]
pub struct Attached {
    /// The only way the driver changes the session.
    pub handle: SessionHandle,
    /// True if an existing session was resumed.
    pub session_present: bool,
}

/// The broker's shared state. One per process, shared by every connection task.
pub struct Broker {
    config: MqttConfig,
    auth: AuthConfig,
    /// Queue bounds: the broker-wide ones and the sessions' own (bridges).
    limits: queue_limits::QueueLimitsTable,
    sessions: Mutex<SessionMap>,
    subscriptions: RwLock<TopicTree<SessionId, Subscriber>>,
    retained: RwLock<RetainedIndex<Arc<Message>>>,
    /// Shared subscription groups; consulted on publish only while `has_shared` is set.
    shared: RwLock<SharedSubscriptions>,
    has_shared: AtomicBool,
    /// Memberships in shared groups, for the subscriptions gauge without taking that lock.
    shared_members: AtomicUsize,
    /// Enhanced authentication methods offered (MQTT 5 §4.12).
    authenticators: AuthRegistry,
    /// Password file and per-listener anonymous rules (unset in brokers built directly:
    /// `auth.allow_anonymous` alone then decides).
    logins: Option<crate::auth::login::Logins>,
    next_session_id: AtomicU64,
    /// Origin of [`Broker::clock_ms`].
    epoch: Instant,
    /// [`Broker::clock_ms`] as of the last keep-alive sweep (every [`KEEP_ALIVE_SWEEP`]):
    /// what routing stamps queue progress with, so a PUBLISH costs no clock read.
    coarse_ms: AtomicU64,
    /// Set once the server stops; connections see it when woken and close with 0x8B.
    shutting_down: AtomicBool,
    /// The `[mqtt]` limits a reload may change (read per connection or per SUBSCRIBE).
    runtime_limits: runtime_limits::RuntimeLimitsSlot,
    /// Holds PUBLISHes back while a SUBSCRIBE read before them is handled.
    subscribe_fence: SubscribeFence,
    /// The order reads arrived in, for the PUBLISH of a quiet connection to wait for the
    /// reads that came before it (see [`ArrivalOrder`]).
    arrival_order: Arc<ArrivalOrder>,
    /// Back-pressure and the memory budget.
    flow: FlowControl,
    /// The durable store, when `storage.persistence` is on; `None` keeps everything in memory
    /// and skips building store ops entirely.
    store: Option<Arc<dyn Store>>,
    /// Metric handles, registered once.
    pub metrics: Metrics,
    /// The guarantees' own metric group (dead letters, dedup), declared by `guarantees`
    /// against `metrics`' registry so `metrics` stays a leaf; registered with every broker.
    guarantee_metrics: crate::guarantees::GuaranteeMetrics,
    /// The ACL (`auth.acl_file`); unset, no check runs anywhere.
    acl: Option<Arc<crate::auth::acl_slot::AclSlot>>,
    /// The facts of each connected client that only operators read (peer, listener, protocol,
    /// since when): set at attach, removed at detach, never touched per message.
    connection_facts: admin::ConnectionFactsMap,
    /// Set for good once a session got an identity with JWT `publish` / `subscribe` claims:
    /// from then on checks run even without an ACL file (until then, none do).
    claims_seen: AtomicBool,
    /// Dead letters, schema contracts, dedup (`crate::guarantees`); unset, none of them
    /// costs anything.
    guarantees: Option<crate::guarantees::Guarantees>,
    /// Dedup keys stored without a message of their own, gathered for one submit
    /// (`Broker::spool_dedup_key`).
    dedup_spool: Arc<dedup_spool::DedupSpool>,
    /// The cluster layer (`[cluster]`); unset on a single node, where it costs one check
    /// per PUBLISH.
    cluster: Option<Arc<dyn ClusterSeam>>,
}

/// The authorisation in force, when anything restricts anyone (see [`Broker::authz`]).
#[derive(Debug, Clone, Copy)]
pub struct Authz<'a> {
    /// The ACL file, if one is configured.
    pub acl: Option<&'a crate::auth::acl_slot::AclSlot>,
}

impl Authz<'_> {
    /// The generation a full grant is stamped with now (1 without an ACL file, which never
    /// reloads); a subscriber stamped otherwise is checked per delivery.
    pub fn generation(self) -> u32 {
        self.acl
            .map_or(1, crate::auth::acl_slot::AclSlot::generation)
    }
}

// By hand: the session, subscription and retained state sit behind locks a `Debug` print must
// not take (it could run while one is held).
impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("config", &self.config)
            .field("next_session_id", &self.next_session_id)
            .field("shutting_down", &self.shutting_down)
            .field("persistence", &self.store.is_some())
            .finish_non_exhaustive()
    }
}

/// What routing a PUBLISH produced for its publisher.
#[derive(Debug)]
pub struct Routed {
    /// Sessions the message was queued for.
    pub queued: usize,
    /// Sessions the message matched (after No Local, MQTT-3.8.3-3; one per shared group),
    /// queued or not: a full queue or an offline QoS 0 subscriber still counts. 0 means no
    /// subscriber at all, which a v5 publisher is told (PUBACK / PUBREC 0x10, v5 §3.4.2.1).
    pub matched: usize,
    /// Resolves once the message is durable for every persistent subscriber; the publisher's
    /// PUBACK / PUBREC waits for it. `None` when nothing had to be stored.
    pub durable: Option<Durable>,
    /// A connected, draining session whose queue the message was queued to over its bound:
    /// the publisher pauses until it has room (see [`flow`]).
    pub pressure: Option<Arc<Session>>,
}

/// Why a PUBLISH was not accepted: nothing was queued for anyone, so its publisher must not be
/// told it was (v5 gets a failure code in PUBACK / PUBREC, a 3.x publisher is disconnected).
#[derive(Debug, thiserror::Error)]
pub enum PublishRefused {
    /// The durable store did not take it (budget, backlog, full filesystem, I/O failure).
    #[error(transparent)]
    Store(#[from] StorageError),
    /// A subscriber's queue is full and `mqtt.queue_overflow = "refuse"`.
    #[error("the queue of subscriber {client_id:?} is full (queue_overflow = \"refuse\")")]
    QueueFull {
        /// The client id of the full session (for the log and the v5 reason string).
        client_id: ByteString,
    },
    /// The cluster (`[cluster]`) cannot make the message durable cluster-wide now: its link
    /// to NATS is down, or too many messages wait for it (v5 0x97).
    #[error("the cluster cannot take it now: {0}")]
    ClusterUnavailable(&'static str),
    /// The payload breaks a `[[schema]]` whose action is `reject` (v5 0x99).
    #[error("payload does not match schema {schema_id}: {why}")]
    PayloadInvalid {
        /// The schema's id.
        schema_id: String,
        /// The validator's first error.
        why: String,
        /// What a 3.x publisher gets.
        on_invalid_v3: crate::config::InvalidV3,
    },
}

impl PublishRefused {
    /// The v5 PUBACK / PUBREC reason code that says why: 0x97 Quota exceeded for "too much
    /// for now", 0x99 Payload format invalid for a schema's refusal, else 0x80.
    pub fn reason_code(&self) -> crate::codec::ReasonCode {
        use crate::codec::ReasonCode;
        match self {
            PublishRefused::PayloadInvalid { .. } => ReasonCode::PAYLOAD_FORMAT_INVALID,
            other if other.is_quota() => ReasonCode::QUOTA_EXCEEDED,
            _ => ReasonCode::UNSPECIFIED_ERROR,
        }
    }

    /// True for "too much for now" (a full queue, the store's budget or filesystem): v5
    /// 0x97 Quota exceeded, so the client may try again later; false for a broken store.
    pub fn is_quota(&self) -> bool {
        match self {
            PublishRefused::Store(error) => error.is_quota(),
            PublishRefused::QueueFull { .. } | PublishRefused::ClusterUnavailable(_) => true,
            PublishRefused::PayloadInvalid { .. } => false,
        }
    }

    /// True when the same message would be taken later, whoever it is for: the cluster or
    /// the store has no room now. A bridge holds such a message of its remote and tries it
    /// again rather than refusing it, which made the remote drop it (seventeenth
    /// adversarial pass, D5). Not a full queue: one subscriber's, which may never drain.
    pub fn is_for_now(&self) -> bool {
        match self {
            PublishRefused::Store(error) => error.is_quota(),
            PublishRefused::ClusterUnavailable(_) => true,
            PublishRefused::QueueFull { .. } | PublishRefused::PayloadInvalid { .. } => false,
        }
    }
}

impl Broker {
    /// Creates the broker state from its configuration and parts ([`Parts`]).
    pub fn new(parts: Parts) -> Arc<Broker> {
        let Parts {
            config,
            auth,
            store,
            metrics,
            logins,
            acl,
            mut guarantees,
            cluster,
        } = parts;
        let store = store.filter(|s| s.survives_restart());
        let flow = FlowControl::new(&config);
        let limits = QueueLimits {
            max_messages: config.max_queued_messages.max(1),
            max_bytes: config.max_queued_bytes,
            queue_qos0_offline: config.queue_qos0_messages,
            overflow: config.queue_overflow,
            stalled_after_ms: u64::from(config.stalled_after) * 1000,
            backpressure_qos0: config.backpressure_qos0,
            anonymous_share: flow.memory.limit / flow::ANONYMOUS_SHARE,
        };
        let runtime_limits = runtime_limits::RuntimeLimitsSlot::new(&config);
        let shared = SharedSubscriptions::new(config.shared_subscription_strategy);
        let guarantee_metrics = crate::guarantees::GuaranteeMetrics::register(&metrics);
        let mut dedup_window = None;
        if let Some(dedup) = guarantees.as_mut().and_then(|g| g.dedup.as_mut()) {
            if let Some(window) = Arc::get_mut(dedup) {
                window.attach_metrics(guarantee_metrics.dedup.clone());
            }
            if let Some(store) = &store {
                store.bound_dedup(dedup.max_entries());
            }
            dedup_window = Some(Arc::clone(dedup));
        }
        let dedup_spool = Arc::new(dedup_spool::DedupSpool::new(dedup_window));
        let broker = Arc::new(Broker {
            config,
            auth,
            limits: queue_limits::QueueLimitsTable::new(limits),
            sessions: Mutex::new(SessionMap::default()),
            subscriptions: RwLock::new(TopicTree::new()),
            retained: RwLock::new(RetainedIndex::new()),
            shared: RwLock::new(shared),
            has_shared: AtomicBool::new(false),
            shared_members: AtomicUsize::new(0),
            authenticators: AuthRegistry::new(),
            logins,
            next_session_id: AtomicU64::new(1),
            epoch: Instant::now(),
            coarse_ms: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            runtime_limits,
            subscribe_fence: SubscribeFence::default(),
            arrival_order: Arc::default(),
            flow,
            store,
            metrics,
            guarantee_metrics,
            acl,
            claims_seen: AtomicBool::new(false),
            guarantees,
            dedup_spool,
            cluster,
            connection_facts: admin::ConnectionFactsMap::default(),
        });
        broker.watch_backlog();
        broker
    }

    /// The ACL, when `auth.acl_file` is set.
    pub fn acl(&self) -> Option<&Arc<crate::auth::acl_slot::AclSlot>> {
        self.acl.as_ref()
    }

    /// What checks access: `None` when nothing restricts anyone (no ACL file, no JWT claims
    /// seen), so the hot path checks nothing; else the ACL (if any) and the sessions' claims.
    #[inline]
    pub fn authz(&self) -> Option<Authz<'_>> {
        let acl = self.acl.as_deref();
        (acl.is_some() || self.claims_seen.load(Ordering::Relaxed)).then_some(Authz { acl })
    }

    /// Counts one refused action.
    pub fn count_denied(&self, action: crate::auth::acl::Action) {
        let i = usize::from(action == crate::auth::acl::Action::Write);
        self.metrics.authz_denied[i].increment(1);
    }

    /// Back-pressure and the memory budget (see [`flow`]).
    pub fn flow(&self) -> &FlowControl {
        &self.flow
    }

    /// The guarantees' metric handles (dead letters, dedup): read by tests and counted into
    /// by the dead-letter path; the group lives with its owner, not in [`Metrics`].
    pub fn guarantee_metrics(&self) -> &crate::guarantees::GuaranteeMetrics {
        &self.guarantee_metrics
    }

    /// The durable store, if persistence is on.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Submits ops to the durable store (no-op in memory). Returns what to await before an
    /// acknowledgement that depends on them. A refused submit is logged (and counted by the
    /// store), and what it returns then fails at once ([`Durable::refused`]): a write gated on
    /// it is never sent as if the ops were stored, the connection closes without it instead.
    pub fn persist(&self, ops: Vec<Op>) -> Option<Durable> {
        self.submit(ops, false)
    }

    /// [`Broker::persist`] for ops a write to the client waits for (a handshake stage, an
    /// inbound release): submitted past the queue bound ([`Store::submit_awaited`]), so a busy
    /// or full disk delays the answer instead of closing the connection.
    pub fn persist_awaited(&self, ops: Vec<Op>) -> Option<Durable> {
        self.submit(ops, true)
    }

    /// [`Broker::persist`] (`awaited`: [`Broker::persist_awaited`]).
    #[inline]
    fn submit(&self, ops: Vec<Op>, awaited: bool) -> Option<Durable> {
        let store = self.store.as_ref()?;
        if ops.is_empty() {
            return None;
        }
        let submitted = if awaited {
            store.submit_awaited(ops)
        } else {
            store.submit(ops)
        };
        match submitted {
            Ok(submitted) => Some(submitted.durable),
            Err(rejected) => {
                tracing::warn!(error = %rejected.error, ops = rejected.ops.len(), awaited,
                    "durable store refused an update; an answer waiting for it is not sent");
                Some(Durable::refused(rejected.error))
            }
        }
    }

    /// A commit that completes once everything submitted so far is durable (an empty submit
    /// is a barrier); `None` in memory. For an answer that repeats an earlier one whose own
    /// commit another connection may still be waiting for. Fails at once when the store
    /// refuses it (closed or failed), like [`Broker::persist`].
    pub fn barrier(&self) -> Option<Durable> {
        let store = self.store.as_ref()?;
        Some(match store.submit(Vec::new()) {
            Ok(submitted) => submitted.durable,
            Err(rejected) => Durable::refused(rejected.error),
        })
    }

    /// The MQTT settings this broker enforces.
    pub fn config(&self) -> &MqttConfig {
        &self.config
    }

    /// The enhanced authentication methods on offer; register more at start-up.
    pub fn authenticators(&self) -> &AuthRegistry {
        &self.authenticators
    }

    /// `auth.session_binding`: what another identity gets for a session it does not own.
    pub fn session_binding(&self) -> crate::config::SessionBinding {
        self.auth.session_binding
    }

    /// Whether clients without credentials may connect.
    pub fn allow_anonymous(&self) -> bool {
        self.auth.allow_anonymous
    }

    /// The login rules (password file, per-listener anonymous access), if any (SIGHUP
    /// reloads the password file inside them).
    pub fn logins(&self) -> Option<&crate::auth::login::Logins> {
        self.logins.as_ref()
    }

    /// Whether a client with this id currently has a live connection (for operators and tests).
    pub fn is_connected(&self, client_id: &str) -> bool {
        self.sessions
            .lock()
            .get(client_id)
            .is_some_and(|s| s.lock().connection.is_some())
    }

    /// Milliseconds since the broker started: the coarse clock of keep-alive deadlines, small
    /// enough for an atomic.
    pub fn clock_ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// [`Broker::clock_ms`] as of the last keep-alive sweep, at most [`KEEP_ALIVE_SWEEP`]
    /// behind: for the stall clock of session queues (`broker::flow`), whose seconds do not
    /// need a clock read (54 ns here) per PUBLISH.
    pub(crate) fn coarse_ms(&self) -> u64 {
        self.coarse_ms.load(Ordering::Relaxed)
    }

    /// Wakes every connection whose keep-alive ran out, so it closes (MQTT-3.1.2-24). Called
    /// periodically ([`KEEP_ALIVE_SWEEP`]) instead of each connection holding a timer: an idle
    /// connection then costs no timer entry and no timer future, only an atomic deadline.
    /// Also advances [`Broker::coarse_ms`].
    pub fn wake_expired_keep_alives(&self) -> usize {
        let now_ms = self.clock_ms(Instant::now());
        self.coarse_ms.store(now_ms, Ordering::Relaxed);
        let sessions = self.sessions.lock();
        let mut woken = 0;
        for session in sessions.iter() {
            if session.keep_alive_expired(now_ms) {
                session.wake();
                woken += 1;
            }
        }
        woken
    }

    /// Tells every connection the server is stopping: each closes with DISCONNECT 0x8B (v5)
    /// when it wakes. Connections that attach later see the flag on their first check.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let sessions = self.sessions.lock();
        for session in sessions.iter() {
            session.wake();
        }
    }

    /// The fence that orders a SUBSCRIBE read by one connection before a PUBLISH read after
    /// it by another (see [`SubscribeFence`]).
    pub fn subscribe_fence(&self) -> &SubscribeFence {
        &self.subscribe_fence
    }

    /// The arrival order connections' reads draw their tickets from (see [`ArrivalOrder`]).
    pub fn arrival_order(&self) -> &Arc<ArrivalOrder> {
        &self.arrival_order
    }

    /// The `[mqtt]` limits in force now: the start-up config's, or a reload's (see
    /// [`runtime_limits`]). Read these rather than `config()` for the keys it holds.
    pub fn runtime_limits(&self) -> &runtime_limits::RuntimeLimitsSlot {
        &self.runtime_limits
    }

    /// True once [`Broker::begin_shutdown`] ran.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Number of sessions currently known (connected or not).
    pub fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// The broker-wide queue bounds (`mqtt.max_queued_messages`, …): what every session
    /// without bounds of its own gets (see [`Broker::queue_limits_of`]).
    pub fn queue_limits(&self) -> &QueueLimits {
        self.limits.global()
    }

    /// The queue bounds of the session of `client_id`: its own if
    /// [`Broker::set_queue_limits`] gave it some, else the broker-wide ones. One relaxed
    /// atomic load while no session has its own.
    #[inline]
    pub fn queue_limits_of(&self, client_id: &str) -> QueueLimits {
        self.limits.of(client_id)
    }

    /// Gives the session of `client_id` its own queue bound and overflow policy, in place of
    /// `mqtt.max_queued_messages` / `max_queued_bytes` / `queue_overflow`. Why: a bridge's
    /// local session (`$bridge/<name>`) buffers a remote broker's share of the traffic across
    /// outages, under the bridge's own limits. May be called before the session exists (at
    /// start, before the bridge's link connects); lasts for the life of the process (it is
    /// configuration: nothing is stored), also across the session's end and re-creation.
    pub fn set_queue_limits(&self, client_id: &str, limits: SessionQueueLimits) {
        self.limits.set(client_id, limits);
    }

    /// Smallest QoS any subscription gets: the broker's maximum.
    pub fn max_qos(&self) -> QoS {
        QoS::from_u8(self.config.max_qos.min(2)).unwrap_or(QoS::ExactlyOnce)
    }
}
