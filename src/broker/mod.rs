//! Routing state: sessions, the subscription index, retained messages. No socket I/O here.
//!
//! Publishing tasks route directly (no central router task): they match against the
//! read-mostly subscription index under a short read lock, then append to each target
//! session's bounded queue. The hot-path indexes are hand-written tries:
//! [`topic_tree::TopicTree`] maps filters to subscribers (one walk per PUBLISH) and
//! [`retained::RetainedIndex`] maps topic names to retained messages (one walk per SUBSCRIBE).

mod level_map;
pub mod message;
mod persist;
mod restore;
pub use persist::entry_stage;
pub mod retained;
pub mod session;
pub mod topic_tree;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::codec::{ProtocolVersion, QoS, ReasonCode, SubscriptionOptions};
use crate::config::{AuthConfig, MqttConfig};
use crate::metrics::Metrics;
use crate::storage::{self, Durable, Op, StorageError, Store};
pub use message::{Delivery, DeliveryFlags, Message, SessionId};
use retained::RetainedIndex;
pub use session::{
    Admission, EnqueueOutcome, Inflight, OutboundStage, QueueLimits, Session, SessionState,
    SessionSubscription, NEVER_EXPIRES,
};
use topic_tree::TopicTree;

/// One entry of the subscription index: who subscribed and with which options.
#[derive(Clone, Debug)]
pub struct Subscriber {
    pub session: Arc<Session>,
    pub options: SubscriptionOptions,
    pub identifier: Option<u32>,
}

/// What a client asks for when it connects.
#[derive(Clone, Debug)]
pub struct SessionRequest {
    pub client_id: ByteString,
    pub clean_start: bool,
    pub expiry_interval: u32,
    pub protocol: ProtocolVersion,
}

/// A connection's claim on a session.
#[derive(Debug)]
pub struct Attached {
    pub session: Arc<Session>,
    pub session_present: bool,
    pub generation: u64,
    /// Fires with the reason when a newer connection takes the session over.
    pub evicted: oneshot::Receiver<ReasonCode>,
}

/// The broker's shared state. One per process, shared by every connection task.
pub struct Broker {
    config: MqttConfig,
    auth: AuthConfig,
    limits: QueueLimits,
    sessions: Mutex<HashMap<ByteString, Arc<Session>, foldhash::fast::RandomState>>,
    subscriptions: RwLock<TopicTree<SessionId, Subscriber>>,
    retained: RwLock<RetainedIndex<Arc<Message>>>,
    next_session_id: AtomicU64,
    /// The durable store, when `storage.persistence` is on; `None` keeps everything in memory
    /// and skips building store ops entirely.
    store: Option<Arc<dyn Store>>,
    /// Metric handles, registered once.
    pub metrics: Metrics,
}

/// What routing a PUBLISH produced for its publisher.
#[derive(Debug)]
pub struct Routed {
    /// Sessions the message was queued for.
    pub queued: usize,
    /// Resolves once the message is durable for every persistent subscriber; the publisher's
    /// PUBACK / PUBREC waits for it. `None` when nothing had to be stored.
    pub durable: Option<Durable>,
}

impl Broker {
    /// Creates the broker state from the `[mqtt]` config section.
    pub fn new(
        config: MqttConfig,
        auth: AuthConfig,
        store: Option<Arc<dyn Store>>,
        metrics: Metrics,
    ) -> Arc<Broker> {
        let store = store.filter(|s| s.is_durable());
        let limits = QueueLimits {
            max_messages: config.max_queued_messages.max(1),
            max_bytes: config.max_queued_bytes,
            queue_qos0_offline: config.queue_qos0_messages,
            overflow: config.queue_overflow,
        };
        Arc::new(Broker {
            config,
            auth,
            limits,
            sessions: Mutex::new(HashMap::default()),
            subscriptions: RwLock::new(TopicTree::new()),
            retained: RwLock::new(RetainedIndex::new()),
            next_session_id: AtomicU64::new(1),
            store,
            metrics,
        })
    }

    /// The durable store, if persistence is on.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Submits ops to the durable store (no-op in memory). Returns what to await before an
    /// acknowledgement that depends on them; a refused submit is logged and counted.
    pub fn persist(&self, ops: Vec<Op>) -> Option<Durable> {
        let store = self.store.as_ref()?;
        if ops.is_empty() {
            return None;
        }
        match store.submit(ops) {
            Ok(submitted) => Some(submitted.durable),
            Err(rejected) => {
                tracing::error!(error = %rejected.error, "durable store refused an update");
                None
            }
        }
    }

    /// The MQTT settings this broker enforces.
    pub fn config(&self) -> &MqttConfig {
        &self.config
    }

    /// Opens or resumes the session for a client, evicting any connection that holds it
    /// (MQTT-3.1.4-2; v5 reason 0x8E). A clean start discards the old session (MQTT-3.1.2-4).
    pub fn connect(self: &Arc<Self>, req: SessionRequest) -> Attached {
        let mut sessions = self.sessions.lock();
        if let Some(existing) = sessions.get(&req.client_id).cloned() {
            let mut st = existing.lock();
            if !req.clean_start && !st.ended {
                let (generation, evicted, kicked_old) =
                    Session::attach(&mut st, ReasonCode::SESSION_TAKEN_OVER);
                if kicked_old {
                    self.metrics.session_takeovers.increment(1);
                }
                st.protocol = req.protocol;
                st.expiry_interval = req.expiry_interval;
                let ops =
                    persist::session_resumed(&existing.client_id, &mut st, self.store.is_some());
                drop(st);
                self.persist(ops);
                return Attached {
                    session: existing,
                    session_present: true,
                    generation,
                    evicted,
                };
            }
            if let Some(old) = st.connection.take() {
                self.metrics.session_takeovers.increment(1);
                old.evict(ReasonCode::SESSION_TAKEN_OVER);
            }
            drop(st);
            sessions.remove(&req.client_id);
            self.end_session(&existing);
        }
        let id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(Session::new(
            id,
            req.client_id.clone(),
            req.protocol,
            req.expiry_interval,
        ));
        let (generation, evicted, ops) = {
            let mut st = session.lock();
            let (generation, evicted, _) = Session::attach(&mut st, ReasonCode::SUCCESS);
            let ops = persist::session_resumed(&session.client_id, &mut st, self.store.is_some());
            (generation, evicted, ops)
        };
        self.persist(ops);
        sessions.insert(req.client_id, session.clone());
        self.metrics.sessions_current.set(sessions.len() as f64);
        Attached {
            session,
            session_present: false,
            generation,
            evicted,
        }
    }

    /// Detaches a connection from its session. The session then ends at once (expiry 0),
    /// never, or after its expiry interval (MQTT-3.1.2-23).
    pub fn disconnect(self: &Arc<Self>, session: &Arc<Session>, generation: u64) {
        let expiry = {
            let mut st = session.lock();
            if !st.is_owned_by(generation) {
                return; // taken over: the new connection owns it now
            }
            st.connection = None;
            st.disconnected_at = Some(Instant::now());
            if st.stored && st.is_persistent() {
                let meta =
                    persist::session_meta(&session.client_id, &st, Some(storage::now_unix_ms()));
                drop(st);
                self.persist(vec![Op::PutSession(meta)]);
                st = session.lock();
            }
            st.expiry_interval
        };
        self.schedule_expiry(
            session,
            generation,
            Duration::from_secs(u64::from(expiry)),
            expiry,
        );
    }

    /// Ends a disconnected session after `after`, unless a client re-attaches first.
    fn schedule_expiry(
        self: &Arc<Self>,
        session: &Arc<Session>,
        generation: u64,
        after: Duration,
        expiry: u32,
    ) {
        match expiry {
            0 => self.remove_session_if_idle(session, generation),
            NEVER_EXPIRES => {}
            _ if after.is_zero() => self.remove_session_if_idle(session, generation),
            _ => {
                let broker = Arc::clone(self);
                let session = Arc::clone(session);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    broker.remove_session_if_idle(&session, generation);
                });
            }
        }
    }

    /// Ends `session` unless a connection re-attached since `generation` detached.
    fn remove_session_if_idle(&self, session: &Arc<Session>, generation: u64) {
        let mut sessions = self.sessions.lock();
        {
            let st = session.lock();
            if st.generation != generation || st.connection.is_some() || st.ended {
                return;
            }
        }
        if sessions
            .get(&session.client_id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            sessions.remove(&session.client_id);
        }
        self.metrics.sessions_current.set(sessions.len() as f64);
        drop(sessions);
        self.end_session(session);
    }

    /// Discards a session's subscriptions and queues; it accepts nothing afterwards.
    fn end_session(&self, session: &Arc<Session>) {
        let filters: Vec<ByteString> = {
            let mut st = session.lock();
            st.ended = true;
            st.queue.clear();
            st.inflight.clear();
            st.inbound_qos2.clear();
            if std::mem::take(&mut st.stored) {
                self.persist(vec![Op::DeleteSession {
                    client_id: session.client_id.clone(),
                }]);
            }
            st.subscriptions.drain().map(|(f, _)| f).collect()
        };
        if filters.is_empty() {
            return;
        }
        let mut tree = self.subscriptions.write();
        for filter in &filters {
            tree.remove(filter, session.id);
        }
        self.metrics.subscriptions_current.set(tree.len() as f64);
    }

    /// Adds or replaces a subscription (MQTT-3.8.4-3). Returns whether one existed already.
    pub fn subscribe(
        &self,
        session: &Arc<Session>,
        filter: &ByteString,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) -> bool {
        let subscriber = Subscriber {
            session: Arc::clone(session),
            options,
            identifier,
        };
        let existed = {
            let mut tree = self.subscriptions.write();
            let existed = tree.insert(filter, session.id, subscriber).is_some();
            self.metrics.subscriptions_current.set(tree.len() as f64);
            existed
        };
        let stored = {
            let mut st = session.lock();
            st.subscriptions.insert(
                filter.clone(),
                SessionSubscription {
                    options,
                    identifier,
                },
            );
            st.stored
        };
        if stored {
            self.persist(vec![persist::put_subscription(
                &session.client_id,
                filter,
                options,
                identifier,
            )]);
        }
        existed
    }

    /// Removes a subscription; returns whether it existed (v5 reason 0x11 otherwise).
    pub fn unsubscribe(&self, session: &Arc<Session>, filter: &str) -> bool {
        let removed = {
            let mut tree = self.subscriptions.write();
            let removed = tree.remove(filter, session.id).is_some();
            self.metrics.subscriptions_current.set(tree.len() as f64);
            removed
        };
        let stored = {
            let mut st = session.lock();
            st.subscriptions.remove(filter);
            st.stored
        };
        if stored && removed {
            self.persist(vec![Op::DeleteSubscription {
                client_id: session.client_id.clone(),
                filter: ByteString::from(filter),
            }]);
        }
        removed
    }

    /// Queues the retained messages matching `filter` to `session` with RETAIN=1 (MQTT-3.3.1-6).
    pub fn deliver_retained(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubscriptionOptions,
    ) {
        let mut found: Vec<Arc<Message>> = Vec::new();
        self.retained
            .read()
            .for_each_match(filter, |_, m| found.push(Arc::clone(m)));
        let now = Instant::now();
        for message in found {
            if message.is_expired(now) {
                continue;
            }
            let qos = message.qos.min(options.qos);
            session.enqueue_unbounded(Delivery {
                message,
                qos,
                retain: true,
                subscription_ids: SmallVec::new(),
                seq: None, // re-sent from the retained store after a restart anyway
            });
        }
    }

    /// Routes one message to every matching session and updates the retained store.
    ///
    /// With a durable store, the deliveries to persistent sessions, the retained update and
    /// the publisher's inbound QoS 2 id (`inbound_qos2`) go to the store in one submit, and
    /// become visible to subscribers only after it (so no ack can overtake its entry).
    /// `Err` means the store refused the message: nothing durable was queued and the
    /// publisher must not be told it was accepted.
    pub fn publish(
        &self,
        message: Arc<Message>,
        inbound_qos2: Option<(&ByteString, u16)>,
    ) -> Result<Routed, StorageError> {
        let mut targets: SmallVec<[Target; 8]> = SmallVec::new();
        self.subscriptions
            .read()
            .for_each_match(&message.topic, |sid, sub| {
                if sub.options.no_local && message.origin == Some(*sid) {
                    return; // MQTT-3.8.3-3
                }
                targets.push(Target {
                    session: Arc::clone(&sub.session),
                    qos: message.qos.min(sub.options.qos),
                    retain: sub.options.retain_as_published && message.retain,
                    subscription_ids: sub.identifier.into_iter().collect(),
                });
            });
        merge_overlapping(&mut targets);
        let durable = self.store.is_some();
        let mut queued = 0;
        let mut reserved: SmallVec<[(Arc<Session>, Delivery); 4]> = SmallVec::new();
        let mut ops = Vec::new();
        for target in targets {
            let delivery = Delivery {
                message: Arc::clone(&message),
                qos: target.qos,
                retain: target.retain,
                subscription_ids: target.subscription_ids,
                seq: None,
            };
            let outcome = match target.session.admit(delivery, &self.limits, durable) {
                Admission::Pushed(outcome) | Admission::Refused(outcome) => outcome,
                Admission::Reserved {
                    delivery,
                    outcome,
                    victim,
                } => {
                    persist::enqueue(&mut ops, &target.session.client_id, &delivery, victim);
                    reserved.push((target.session, delivery));
                    outcome
                }
            };
            match outcome {
                EnqueueOutcome::Queued => queued += 1,
                EnqueueOutcome::QueuedDroppedOldest => {
                    queued += 1;
                    self.metrics.messages_dropped_queue_full.increment(1);
                }
                EnqueueOutcome::DroppedQueueFull => {
                    self.metrics.messages_dropped_queue_full.increment(1)
                }
                EnqueueOutcome::DroppedQoS0Offline => {
                    self.metrics.messages_dropped_qos0_offline.increment(1)
                }
                EnqueueOutcome::SessionEnded => {}
            }
        }
        let Some(store) = self.store.as_ref() else {
            if message.retain {
                self.store_retained(&message);
            }
            return Ok(Routed {
                queued,
                durable: None,
            });
        };
        if !reserved.is_empty() {
            let id = *message.store_id.get_or_init(|| store.next_message_id());
            persist::fix_message_ids(&mut ops, id);
            ops.insert(0, persist::put_message(id, &message));
        }
        if message.retain {
            ops.push(persist::retained(&message));
        }
        if let Some((client_id, packet_id)) = inbound_qos2 {
            ops.push(Op::PutInboundQos2 {
                client_id: client_id.clone(),
                packet_id,
            });
        }
        if ops.is_empty() {
            return Ok(Routed {
                queued,
                durable: None,
            });
        }
        let submitted = store.submit(ops).map_err(|rejected| {
            tracing::warn!(error = %rejected.error, topic = %message.topic, "message refused by the durable store");
            rejected.error
        })?;
        if message.retain {
            self.store_retained(&message);
        }
        for (session, delivery) in reserved {
            session.push_reserved(delivery);
        }
        Ok(Routed {
            queued,
            durable: Some(submitted.durable),
        })
    }

    fn store_retained(&self, message: &Arc<Message>) {
        let mut retained = self.retained.write();
        if message.payload.is_empty() {
            retained.remove(&message.topic); // MQTT-3.3.1-10
        } else {
            retained.insert(&message.topic, Arc::clone(message)); // MQTT-3.3.1-5
        }
        self.metrics.retained_messages.set(retained.len() as f64);
    }

    /// Whether clients without credentials may connect.
    pub fn allow_anonymous(&self) -> bool {
        self.auth.allow_anonymous
    }

    /// Number of sessions currently known (connected or not).
    pub fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Queue bounds in force.
    pub fn queue_limits(&self) -> &QueueLimits {
        &self.limits
    }

    /// Smallest QoS any subscription gets: the broker's maximum.
    pub fn max_qos(&self) -> QoS {
        QoS::from_u8(self.config.max_qos.min(2)).unwrap_or(QoS::ExactlyOnce)
    }
}

/// A matched subscription before merging.
struct Target {
    session: Arc<Session>,
    qos: QoS,
    retain: bool,
    subscription_ids: SmallVec<[u32; 1]>,
}

/// Collapses several matching subscriptions of one session into one delivery at the highest
/// granted QoS (MQTT-3.3.5-1) carrying every subscription identifier (MQTT-3.3.4-4).
fn merge_overlapping(targets: &mut SmallVec<[Target; 8]>) {
    if targets.len() < 2 {
        return;
    }
    targets.sort_unstable_by_key(|t| t.session.id);
    let mut merged: SmallVec<[Target; 8]> = SmallVec::with_capacity(targets.len());
    for t in targets.drain(..) {
        match merged.last_mut() {
            Some(last) if last.session.id == t.session.id => {
                last.qos = last.qos.max(t.qos);
                last.retain |= t.retain;
                last.subscription_ids.extend(t.subscription_ids);
            }
            _ => merged.push(t),
        }
    }
    *targets = merged;
}
