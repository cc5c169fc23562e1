//! Routing state: sessions, the subscription index, retained messages. No socket I/O here.
//!
//! Publishing tasks route directly (no central router task): they match against the
//! read-mostly subscription index under a short read lock, then append to each target
//! session's bounded queue. The hot-path indexes are hand-written tries:
//! [`topic_tree::TopicTree`] maps filters to subscribers (one walk per PUBLISH) and
//! [`retained::RetainedIndex`] maps topic names to retained messages (one walk per SUBSCRIBE).

mod level_map;
pub mod message;
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
pub use message::{Delivery, DeliveryFlags, Message, SessionId};
use retained::RetainedIndex;
pub use session::{
    EnqueueOutcome, Inflight, OutboundStage, QueueLimits, Session, SessionState,
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
    /// Metric handles, registered once.
    pub metrics: Metrics,
}

impl Broker {
    /// Creates the broker state from the `[mqtt]` config section.
    pub fn new(config: MqttConfig, auth: AuthConfig, metrics: Metrics) -> Arc<Broker> {
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
            metrics,
        })
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
                drop(st);
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
        let (generation, evicted, _) = Session::attach(&mut session.lock(), ReasonCode::SUCCESS);
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
            st.expiry_interval
        };
        match expiry {
            0 => self.remove_session_if_idle(session, generation),
            NEVER_EXPIRES => {}
            secs => {
                let broker = Arc::clone(self);
                let session = Arc::clone(session);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(u64::from(secs))).await;
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
        session.lock().subscriptions.insert(
            filter.clone(),
            SessionSubscription {
                options,
                identifier,
            },
        );
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
        session.lock().subscriptions.remove(filter);
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
            });
        }
    }

    /// Routes one message to every matching session and updates the retained store.
    /// Returns how many sessions it was queued for.
    pub fn publish(&self, message: Arc<Message>) -> usize {
        if message.retain {
            self.store_retained(&message);
        }
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
        let mut queued = 0;
        for target in targets {
            let delivery = Delivery {
                message: Arc::clone(&message),
                qos: target.qos,
                retain: target.retain,
                subscription_ids: target.subscription_ids,
            };
            match target.session.enqueue(delivery, &self.limits) {
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
        queued
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
