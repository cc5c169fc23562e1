//! Several Postbox nodes as one broker, over NATS JetStream (`[cluster]`, issue 17).
//!
//! The broker sees this layer through [`crate::broker::ClusterSeam`]; here is the engine side:
//!
//! - [`link`]: the NATS connection, its state (`postbox_cluster_up`), the streams and buckets
//!   made sure of at every (re)connect.
//! - [`outbound`]: what this node sends: a bounded queue (`max_pending`) drained by one
//!   task that publishes in order and one that awaits the acknowledgements in order, each
//!   resolving its publisher's PUBACK / PUBREC wait.
//! - [`inbound`]: what other nodes sent: the node's durable consumer of `PB_MSGS` (QoS 1/2),
//!   its core subscription (QoS 0), the retained bucket's watch.
//! - [`subject`], [`wire`]: topics as subjects and keys, messages as frames.
//! - [`stream_room`]: strangers' share of the stream, and a full stream refused at admission.
//! - [`ahead`]: deliveries a session here holds before the consumer reaches them (a moved
//!   session's QoS 2 in flight, what the store brought back at start), which the
//!   consumer's routing then leaves out for that session.
//!
//! What is shared, and where (names are fixed; `R` = `[cluster] replicas`):
//!
//! | name | kind | what |
//! | --- | --- | --- |
//! | `PB_MSGS` | stream, subjects `pb.m.>`, Limits, `max_age` = `retention`, `max_bytes` = `max_stream_bytes`, discard new, File, R | every QoS 1/2 message, once |
//! | `PB_REGROUP` | stream, subjects `pb.g.>`, as `PB_MSGS` | a shared group's messages given back when their member's session ended (`pb.g.<group hash>`); a stream of its own, so `PB_MSGS` sequences (cursors, floors) count only messages |
//! | `pb.q0.>` | core subjects | QoS 0 messages, at most once |
//! | `pb_retained` | KV bucket, history 1, File, R | the retained message of each topic (key: [`subject::key`]) |
//! | `pb_sessions` | KV bucket, history 1, File, R | each session's record: owner node, subscriptions, replay cursor ([`sessions`]) |
//! | `pb_nodes` | KV bucket, history 1, `max_age` 60 s, File, R | each node's heartbeat ([`nodes`]) |
//!
//! A dead node's sessions are adopted by a live one ([`orphans`]), which fires their wills
//! and expires them, once, by compare-and-set on their records.
//!
//! Delivery is node fan-in: one durable consumer per node (`node-<id>`), whatever the number
//! of sessions and subscriptions; each node routes what it takes through its own topic tree.

mod ahead;
mod barriers;
mod credentials;
pub(crate) mod inbound;
pub(crate) mod link;
mod metrics;
pub(crate) mod nodes;
pub(crate) mod orphans;
pub(crate) mod outbound;
pub(crate) mod sessions;
pub(crate) mod shared;
mod stream_room;
pub(crate) mod subject;
mod taken;
pub(crate) mod unsettled;
pub(crate) mod wire;

pub(crate) use credentials::CredentialsError;
use credentials::NatsCredentials;

pub(crate) use metrics::ClusterMetrics;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::broker::cluster_seam::SeamFuture;
use crate::broker::{
    Broker, ClaimRefused, ClaimRequest, Claimed, ClusterAdmission, ClusterSeam, Message,
    PublishRefused, Restore, Session, StrangerPublish, StreamCharge,
};
use crate::codec::QoS;
use crate::config::ClusterConfig;
use crate::storage::Durable;

/// The message stream.
pub const STREAM: &str = "PB_MSGS";
/// Subject prefix of the stream's messages.
pub(crate) const STREAM_SUBJECTS: &str = "pb.m";
/// The stream of shared groups' given-back messages.
pub(crate) const REGROUP_STREAM: &str = "PB_REGROUP";
/// Subject prefix of shared groups' given-back messages (in [`REGROUP_STREAM`]).
pub(crate) const REGROUP_SUBJECTS: &str = "pb.g";
/// Subject prefix of QoS 0 messages (core NATS).
pub(crate) const QOS0_SUBJECTS: &str = "pb.q0";
/// The retained messages' bucket.
pub(crate) const RETAINED_BUCKET: &str = "pb_retained";
/// The session records' bucket.
pub const SESSIONS_BUCKET: &str = "pb_sessions";
/// The nodes' heartbeats' bucket.
pub(crate) const NODES_BUCKET: &str = "pb_nodes";

/// The running cluster layer of one node: what the broker calls (as [`ClusterSeam`]) and
/// what the tasks share.
#[derive(Debug)]
pub(crate) struct Cluster {
    /// This node's id.
    node: String,
    /// `[cluster]`, for the tasks [`Cluster::run`] starts.
    config: ClusterConfig,
    /// What the NATS client presents (`[cluster] user` and `password_file`, or a URL's).
    credentials: Option<NatsCredentials>,
    /// Up: connected to NATS and the streams and buckets are there.
    up: AtomicBool,
    /// Messages handed to the outbound queue whose acknowledgement has not come.
    pending: AtomicUsize,
    /// `[cluster] max_pending`.
    max_pending: usize,
    /// The outbound queue (unbounded channel; `pending` is its bound, checked at admission).
    outbound: tokio::sync::mpsc::UnboundedSender<outbound::Queued>,
    /// Its receiving end, until [`Cluster::run`] hands it to the outbound task.
    outbound_rx: parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<outbound::Queued>>>,
    /// Metric handles.
    metrics: ClusterMetrics,
    /// The next local id ([`ClusterSeam::admit`]): this node's order of admission.
    next_local_id: AtomicU64,
    /// Every stream sequence below this has been routed here by the node's consumer.
    consumer_floor: AtomicU64,
    /// The lowest sequence the oldest message sent and not yet acknowledged can have
    /// (`u64::MAX`: none pending): the front of `floors`.
    pending_floor: AtomicU64,
    /// One floor per QoS 1/2 message sent and not yet acknowledged, oldest first.
    floors: parking_lot::Mutex<std::collections::VecDeque<u64>>,
    /// The highest stream sequence seen (acknowledgements and the consumer).
    seen_seq: AtomicU64,
    /// Held while the consumer routes one message and moves `consumer_floor`, and while a
    /// restored session subscribes and reads the floor: so each message is either routed
    /// to it live or replayed, not both, not neither.
    gate: parking_lot::Mutex<()>,
    /// Held (shared) by each QoS 1/2 PUBLISH of this node from its admission until it is
    /// routed and forwarded; held whole by a restore while it subscribes and reads
    /// `next_local_id` ([`crate::broker::ClusterAdmission`]).
    fence: parking_lot::RwLock<()>,
    /// Deliveries sessions here hold ahead of the consumer: the consumer leaves those
    /// sessions out when it routes them ([`ahead`]).
    resent_ahead: ahead::ResentAhead,
    /// What the store brought back at start that came through the stream (sequence,
    /// session), until the consumer knows its acknowledgement floor and notes those above
    /// it in `resent_ahead` ([`ahead`]).
    restored_ahead: parking_lot::Mutex<Vec<(u64, crate::broker::SessionId)>>,
    /// JetStream, once the link is up (for claims and replays).
    js: OnceLock<async_nats::jetstream::Context>,
    /// The session records, once the link is up.
    sessions: sessions::Records,
    /// What this node heard of the others' heartbeats.
    liveness: nodes::Liveness,
    /// Wakes the search for sessions of dead nodes ([`orphans`]).
    orphans: tokio::sync::Notify,
    /// Where a shared group that got its first member here starts, if its consumer is new:
    /// the stream sequence after the highest seen when it was joined
    /// ([`ClusterSeam::shared_group_joined`]), taken by [`shared`] when it starts pulling.
    /// With when it was joined, so starts of groups that went before their pullers started
    /// are forgotten.
    group_starts: parking_lot::Mutex<std::collections::HashMap<String, (u64, std::time::Instant)>>,
    /// What strangers put into the stream from this node within `retention`
    /// ([`stream_room`]).
    stranger_bytes: stream_room::StrangerWindows,
    /// What each verified identity put into the stream from this node within `retention`,
    /// when bounded ([`ClusterConfig::identity_stream_bound`]; `None`: not, and nothing is
    /// counted).
    identity_bytes: Option<stream_room::IdentityWindows>,
    /// JetStream refused a message for lack of room: QoS 1/2 PUBLISHes are refused at
    /// admission until [`Cluster::watch_room`] sees room again.
    stream_full: AtomicBool,
}

impl Cluster {
    /// The cluster layer of a broker about to be built ([`crate::broker::Parts`]): its
    /// metric group declared in `metrics`. Nothing runs until [`Cluster::run`]; until NATS is
    /// reached, QoS 1/2 PUBLISHes are refused.
    ///
    /// # Errors
    ///
    /// [`CredentialsError`] when `cluster.password_file` cannot be read or is empty.
    pub(crate) fn new(
        config: &ClusterConfig,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Arc<Cluster>, CredentialsError> {
        let credentials = NatsCredentials::load(config)?;
        let metrics = ClusterMetrics::register(metrics);
        let (outbound, outbound_rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Arc::new(Cluster {
            node: config.node.clone(),
            config: config.clone(),
            credentials,
            up: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            max_pending: config.max_pending,
            outbound,
            outbound_rx: parking_lot::Mutex::new(Some(outbound_rx)),
            metrics,
            next_local_id: AtomicU64::new(1),
            consumer_floor: AtomicU64::new(0),
            pending_floor: AtomicU64::new(u64::MAX),
            floors: parking_lot::Mutex::default(),
            seen_seq: AtomicU64::new(0),
            gate: parking_lot::Mutex::new(()),
            fence: parking_lot::RwLock::new(()),
            resent_ahead: ahead::ResentAhead::default(),
            restored_ahead: parking_lot::Mutex::default(),
            js: OnceLock::new(),
            sessions: sessions::Records::new(crate::storage::now_unix_ms()),
            liveness: nodes::Liveness::default(),
            orphans: tokio::sync::Notify::new(),
            group_starts: parking_lot::Mutex::default(),
            stranger_bytes: stream_room::StrangerWindows::new(std::time::Duration::from_secs(
                config.retention,
            )),
            identity_bytes: (config.identity_stream_bound() > 0).then(|| {
                stream_room::IdentityWindows::new(
                    std::time::Duration::from_secs(config.retention),
                    config.identity_stream_bound(),
                )
            }),
            stream_full: AtomicBool::new(false),
        }))
    }

    /// Starts the layer's tasks for `broker`, built with it and holding its restored state,
    /// before any client connects: the NATS client (it connects in the background and
    /// reconnects forever), the outbound tasks and, once connected, the inbound ones. A
    /// second call does nothing.
    pub(crate) fn run(self: &Arc<Self>, broker: &Arc<Broker>) {
        let Some(outbound_rx) = self.outbound_rx.lock().take() else {
            return;
        };
        *self.restored_ahead.lock() = broker.held_stream_seqs();
        link::spawn(
            self.config.clone(),
            Arc::clone(self),
            Arc::downgrade(broker),
            outbound_rx,
        );
    }

    /// True while NATS is reachable and the streams and buckets are ready.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Marks the link up or down (and its gauge).
    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
        self.metrics.up.set(if up { 1.0 } else { 0.0 });
    }

    /// Every stream sequence below this is routed here or will be routed to whoever is
    /// subscribed when it is taken: what a session's replay cursor may not pass.
    fn node_floor(&self) -> u64 {
        self.consumer_floor
            .load(Ordering::Acquire)
            .min(self.pending_floor.load(Ordering::Acquire))
    }

    /// A QoS 1/2 message is about to be sent: its sequence will be above all seen so far.
    fn push_floor(&self) {
        let mut floors = self.floors.lock();
        floors.push_back(self.seen_seq.load(Ordering::Acquire) + 1);
        if let Some(&front) = floors.front() {
            self.pending_floor.store(front, Ordering::Release);
        }
    }

    /// The oldest message sent is acknowledged (or failed).
    fn pop_floor(&self) {
        let mut floors = self.floors.lock();
        floors.pop_front();
        self.pending_floor.store(
            floors.front().copied().unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    /// Notes a stream sequence seen.
    fn saw(&self, seq: u64) {
        self.seen_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// JetStream refused a message for lack of room (`error`, [`stream_room::is_full`]): QoS
    /// 1/2 PUBLISHes are refused at admission (v5 0x97) from now until there is room again,
    /// instead of each being sent and its publisher's connection closed on the refusal.
    fn note_refusal(self: &Arc<Self>, error: &async_nats::jetstream::context::PublishError) {
        if stream_room::is_full(error) && !self.stream_full.swap(true, Ordering::AcqRel) {
            tracing::warn!(%error, "cluster: JetStream has no room for more messages; QoS 1/2 PUBLISHes are refused (0x97) until it has");
            tokio::spawn(Arc::clone(self).watch_room());
        }
    }

    /// While the stream is full: looks every [`stream_room::FULL_HOLD`] whether it has room
    /// again: with `max_stream_bytes`, a 64th of it free; otherwise (JetStream's store was
    /// full) the next message is let through to find out.
    async fn watch_room(self: Arc<Self>) {
        let bound = self.config.max_stream_bytes;
        loop {
            tokio::time::sleep(stream_room::FULL_HOLD).await;
            if bound == 0 {
                break;
            }
            let Some(js) = self.js.get() else {
                break;
            };
            let used = match js.get_stream(STREAM).await {
                Ok(mut stream) => match stream.info().await {
                    Ok(info) => info.state.bytes,
                    Err(_) => break,
                },
                Err(_) => break,
            };
            if used.saturating_add(bound / 64) <= bound {
                break;
            }
        }
        tracing::info!("cluster: JetStream has room again; QoS 1/2 PUBLISHes are taken");
        self.stream_full.store(false, Ordering::Release);
    }

    /// Charges a stranger's message to its share's window of the stream; false past it (a
    /// clear of a retained message past it and [`stream_room::CLEARS_ALLOWANCE`] more).
    fn charge_stranger(&self, stranger: StrangerPublish) -> bool {
        let share = self.config.anonymous_stream_bytes.unwrap_or(stranger.share);
        let share = if stranger.clear {
            share.saturating_add(share / stream_room::CLEARS_ALLOWANCE)
        } else {
            share
        };
        self.stranger_bytes.charge(
            stranger.whose.slot(),
            stranger.bytes,
            share,
            std::time::Instant::now(),
        )
    }

    /// Charges a QoS 1/2 PUBLISH to its share of the stream; why not, past it. Charged at
    /// admission: a message refused later (a full queue) still counts until the window
    /// passes, which errs on the side of everyone else.
    fn charge(&self, charge: StreamCharge) -> Option<&'static str> {
        match charge {
            StreamCharge::Stranger(publish) => (!self.charge_stranger(publish))
                .then_some("anonymous clients' share of the cluster's message stream is used up"),
            // Share key 0: what counts in no share (an in-process link's own session).
            StreamCharge::Identity { key, bytes } => self
                .identity_bytes
                .as_ref()
                .filter(|_| key != 0)
                .is_some_and(|windows| !windows.charge(key, bytes, std::time::Instant::now()))
                .then_some("this identity's share of the cluster's message stream is used up"),
        }
    }

    /// One message fewer waits for NATS.
    fn settled(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
        self.metrics.pending.decrement(1.0);
    }
}

impl ClusterSeam for Cluster {
    fn admit(
        &self,
        qos: QoS,
        charge: StreamCharge,
    ) -> Result<ClusterAdmission<'_>, PublishRefused> {
        let why = if qos == QoS::AtMostOnce {
            // Never replayed: no fence.
            let local_id = self.next_local_id.fetch_add(1, Ordering::AcqRel);
            return Ok(ClusterAdmission::new(local_id, None));
        } else if !self.is_up() {
            "NATS is unreachable"
        } else if self.pending.load(Ordering::Acquire) >= self.max_pending {
            "too many messages wait for NATS (cluster.max_pending)"
        } else if self.stream_full.load(Ordering::Acquire) {
            "the cluster's message stream is full"
        } else if let Some(why) = self.charge(charge) {
            why
        } else {
            // The fence before the id: a restore that read the next id saw every message
            // below it routed. Not recursive: a waiting restore goes first.
            let fence = self.fence.read();
            let local_id = self.next_local_id.fetch_add(1, Ordering::AcqRel);
            return Ok(ClusterAdmission::new(local_id, Some(fence)));
        };
        self.metrics.refused.increment(1);
        Err(PublishRefused::ClusterUnavailable(why))
    }

    fn charge_will(&self, charge: StreamCharge) -> bool {
        self.charge(charge).is_none()
    }

    fn fence(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        // Recursive: a will published while this thread routes a message under the fence
        // must not wait behind a restore waiting for that very fence.
        self.fence.read_recursive()
    }

    fn forward(&self, message: &Arc<Message>, local_id: Option<u64>) -> Option<Durable> {
        let local_id =
            local_id.unwrap_or_else(|| self.next_local_id.fetch_add(1, Ordering::AcqRel));
        if message.qos == QoS::AtMostOnce {
            let reason = if !self.is_up() {
                Some(0)
            } else if self.pending.load(Ordering::Acquire) >= self.max_pending {
                Some(1)
            } else {
                None
            };
            if let Some(reason) = reason {
                self.metrics.dropped[reason].increment(1);
                return None;
            }
        }
        let frame = match wire::encode(&self.node, local_id, message) {
            Ok(frame) => frame,
            Err(error) => {
                tracing::warn!(%error, topic = %message.topic, "cluster: message not forwarded, it cannot be encoded");
                message.set_cluster_seq(0); // no sequence will come
                return None;
            }
        };
        let (done, durable) = if message.qos == QoS::AtMostOnce {
            (None, None)
        } else {
            let (tx, durable) = Durable::pending();
            (Some(tx), Some(durable))
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.metrics.pending.increment(1.0);
        let outgoing = outbound::Outgoing {
            message: (message.qos != QoS::AtMostOnce).then(|| Arc::clone(message)),
            topic: message.topic.clone(),
            qos: message.qos,
            retain: message.retain,
            in_transit: crate::broker::flow::InTransit::new(frame.len()),
            frame,
            done,
            subject: None,
        };
        if self
            .outbound
            .send(outbound::Queued::Message(outgoing))
            .is_err()
        {
            // The tasks are gone (shutdown): the sender dropped with the message answers
            // its waiter with "closed".
            self.settled();
        }
        durable
    }

    fn claim<'a>(
        &'a self,
        broker: &'a Arc<Broker>,
        request: ClaimRequest<'a>,
    ) -> SeamFuture<'a, Result<Claimed, ClaimRefused>> {
        Box::pin(sessions::claim(self, broker, request))
    }

    fn session_changed(&self, client_id: &str) {
        self.sessions.changed(client_id);
    }

    fn taken(&self, client_id: &str, message: &Arc<Message>) {
        self.sessions.taken.note(client_id, message);
    }

    fn record_barrier(&self, client_id: &str) -> Option<Durable> {
        self.sessions.barrier(client_id)
    }

    fn shared_group_joined(&self, key: &str) {
        let start = self.seen_seq.load(Ordering::Acquire) + 1;
        self.group_starts
            .lock()
            .insert(key.to_owned(), (start, std::time::Instant::now()));
    }

    fn confirm(&self, broker: &Arc<Broker>, client_id: &str, claimed: u64) {
        sessions::confirm(self, broker, client_id, claimed);
    }

    fn regroup(&self, group: &str, message: &Arc<Message>) -> bool {
        // Pulled from the group's consumer and not yet acknowledged there: given back to it
        // (a nak), so JetStream offers it to a member's node again (after `REOFFER`).
        if message.give_back() {
            tracing::debug!(group, topic = %message.topic, "cluster: a shared group's message given back to its consumer");
            return true;
        }
        if message.qos == QoS::AtMostOnce {
            return false;
        }
        self.offer_to_group(group, message)
    }

    fn restore<'a>(
        &'a self,
        broker: &'a Arc<Broker>,
        session: &'a Arc<Session>,
        generation: u64,
        restore: Restore,
    ) -> SeamFuture<'a, bool> {
        Box::pin(sessions::restore(
            self, broker, session, generation, restore,
        ))
    }
}

impl Cluster {
    /// Publishes `message` to shared group `group`'s given-back subject in `PB_REGROUP`, so
    /// that JetStream offers it to one member's node (issue 37, seventh pass N1: also a QoS 0
    /// message that no member here may read, which the group's other nodes may). False
    /// when it cannot be (the link is down, the outbound queue is full, the frame is too
    /// big): the caller counts the drop.
    fn offer_to_group(&self, group: &str, message: &Arc<Message>) -> bool {
        if !self.is_up() || self.pending.load(Ordering::Acquire) >= self.max_pending {
            return false;
        }
        let local_id = self.next_local_id.fetch_add(1, Ordering::AcqRel);
        let Ok(frame) = wire::encode(&self.node, local_id, message) else {
            return false;
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.metrics.pending.increment(1.0);
        let outgoing = outbound::Outgoing {
            message: None,
            topic: message.topic.clone(),
            qos: message.qos,
            retain: false, // the retained bucket has it already, if it was retained
            in_transit: crate::broker::flow::InTransit::new(frame.len()),
            frame,
            done: None,
            subject: Some(shared::regroup_subject(group)),
        };
        if self
            .outbound
            .send(outbound::Queued::Message(outgoing))
            .is_err()
        {
            self.settled();
            return false;
        }
        tracing::debug!(group, topic = %message.topic, "cluster: a shared group's message given back to the group");
        true
    }
}
