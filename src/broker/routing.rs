//! Routing one PUBLISH: match, merge overlapping subscriptions, pick shared-group members,
//! admit to each target's queue, persist in one submit, update retained messages. (Moving a
//! leaving member's deliveries to another member: `redistribute`.)
//!
//! Must not: hold an index lock while taking a session lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytestring::ByteString;
use smallvec::SmallVec;

use super::flow::MemoryLevel;
use super::guarantees::QueueLosses;
use super::session::Victims;
use super::stranger_share::{ShareFit, StrangerShare};
use super::{
    persist, Admission, Broker, Delivery, EnqueueOutcome, Message, PublishRefused, Routed, Session,
    SessionId,
};
use crate::auth::acl::{Action, FilterAccess};
use crate::codec::{QoS, SubscriptionOptions};
use crate::config::OverflowPolicy;
use crate::storage::{Op, StorageError, StoreHealth};

impl Broker {
    /// Routes one message to every matching session and updates the retained store.
    ///
    /// With a durable store, the deliveries to persistent sessions, the retained update and
    /// the publisher's inbound QoS 2 id (`inbound_qos2`) go to the store in one submit, and
    /// become visible to subscribers only after it (so no ack can overtake its entry).
    ///
    /// # Errors
    ///
    /// The store refused the message, or (`queue_overflow = "refuse"`) a target's queue is
    /// full: nothing was queued for anyone and the publisher must not be told it was
    /// accepted.
    // Callers hand over the message (a fresh `Arc`); each target and the retained index clone it.
    #[allow(clippy::needless_pass_by_value)]
    pub fn publish(
        &self,
        message: Arc<Message>,
        inbound_qos2: Option<(&ByteString, u16)>,
    ) -> Result<Routed, PublishRefused> {
        self.publish_with(message, inbound_qos2, None)
    }

    /// [`Broker::publish`] with one more op to store in the message's submit (a dedup key,
    /// `Op::PutDedup`), so the two are durable together or not at all.
    ///
    /// # Errors
    ///
    /// As [`Broker::publish`].
    #[allow(clippy::needless_pass_by_value)]
    pub fn publish_with(
        &self,
        message: Arc<Message>,
        inbound_qos2: Option<(&ByteString, u16)>,
        extra: Option<Op>,
    ) -> Result<Routed, PublishRefused> {
        self.route(message, inbound_qos2, extra, &[])
    }

    /// [`Broker::publish`] of a message from another cluster node that the sessions `skip`
    /// already have in flight: a session that moved here was sent it again under the packet
    /// id it had on its old node before this node's consumer reached it, and must not get
    /// it a second time under a new one (QoS 2: exactly once, MQTT-4.3.3).
    ///
    /// # Errors
    ///
    /// As [`Broker::publish`].
    pub fn publish_skipping(
        &self,
        message: Arc<Message>,
        skip: &[SessionId],
    ) -> Result<Routed, PublishRefused> {
        self.route(message, None, None, skip)
    }

    /// Whether a plain subscription here matches `topic`: a message not routed is counted as
    /// dropped only where someone would have got it (a shared group's are pulled apart).
    pub(crate) fn has_subscribers(&self, topic: &str) -> bool {
        let mut any = false;
        self.subscriptions
            .read()
            .for_each_match(topic, |_, _| any = true);
        any
    }

    /// Routing itself, the sessions in `skip` left out.
    #[allow(clippy::needless_pass_by_value)]
    fn route(
        &self,
        message: Arc<Message>,
        inbound_qos2: Option<(&ByteString, u16)>,
        extra: Option<Op>,
        skip: &[SessionId],
    ) -> Result<Routed, PublishRefused> {
        let mut targets: SmallVec<[Target; 8]> = SmallVec::new();
        let mut skipped = false;
        let authz = self.authz();
        let acl_generation = authz.map_or(0, super::Authz::generation);
        self.subscriptions
            .read()
            .for_each_match(&message.topic, |sid, sub| {
                if sub.options.no_local && message.origin() == Some(*sid) {
                    return; // MQTT-3.8.3-3
                }
                if !skip.is_empty() && skip.contains(sid) {
                    skipped = true; // it has the message in flight already
                    return;
                }
                if let Some(authz) = authz {
                    // Only subscriptions granted in part, or under an older ACL.
                    if sub.acl_generation != acl_generation
                        && !sub
                            .session
                            .authorized(authz.acl, Action::Read, &message.topic)
                    {
                        self.count_denied(Action::Read);
                        let qos = message.qos.min(sub.options.qos) as usize;
                        self.metrics.messages_dropped_denied[qos].increment(1);
                        return;
                    }
                }
                targets.push(Target {
                    session: Arc::clone(&sub.session),
                    qos: message.qos.min(sub.options.qos),
                    retain: sub.options.retain_as_published && message.retain,
                    subscription_ids: sub.identifier.into_iter().collect(),
                    shared: None,
                });
            });
        merge_overlapping(&mut targets);
        // Clustered, shared groups get their messages through the cluster (one member
        // cluster-wide: `cluster::shared`), not from each node's routing.
        if self.has_shared.load(Ordering::Acquire) && self.cluster().is_none() {
            self.shared_targets(&message, &mut targets);
        }
        // Counted from this one walk (no second trie walk for the publisher's ack).
        let matched = targets.len();
        if let Some(error) = self.refused_before_routing(&message, inbound_qos2, &targets) {
            return Err(error.into());
        }
        let now_ms = self.coarse_ms();
        if let Some(refused) = self.refused_for_full_queue(&message, &targets, now_ms) {
            return Err(refused);
        }
        if matched == 0
            && !skipped
            && message.qos != QoS::AtMostOnce
            && !message.retain
            && !self.is_dead_letter_topic(&message.topic)
            && self.cluster().is_none()
        {
            // Accepted, and nobody gets it (a retained message is kept for later
            // subscribers; QoS 0 with nobody listening is normal and not counted; nor is a
            // dead letter nobody reads: its loss is counted as the dead letter itself).
            // Clustered, this walk sees this node's subscribers only, and shared groups are
            // served through the cluster, never by it: another node's subscriber or a group
            // may get the message, so nobody here is no drop (issue 35, pass 7, P5; the
            // PUBACK says 0x00, not 0x10, for the same reason: `SessionHandle::publish`).
            self.metrics.messages_dropped_no_subscribers[message.qos as usize].increment(1);
        }
        self.deliver(message, targets, inbound_qos2, extra, matched, now_ms)
    }

    /// Queues `message` for the session `session` alone, as if it matched one subscription
    /// with `qos` (already the minimum of published and granted), `retain` and
    /// `subscription_ids`: persisted in one submit like a routed message. For the cluster's
    /// replay of a session that moved to this node. `message.retain` must be false (the
    /// retained index is not touched).
    ///
    /// Queued past the session's queue bound as a connected session's delivery is: what a
    /// session that moved had not taken yet (its node paused, say) is not lost to the move.
    /// The replay asks [`Broker::has_room_for`] first.
    ///
    /// # Errors
    ///
    /// As [`Broker::publish`]: the store refused it.
    pub fn enqueue_for(
        &self,
        session: &Arc<Session>,
        message: Arc<Message>,
        qos: QoS,
        retain: bool,
        subscription_ids: SmallVec<[u32; 1]>,
    ) -> Result<Routed, PublishRefused> {
        let mut targets: SmallVec<[Target; 8]> = SmallVec::new();
        targets.push(Target {
            session: Arc::clone(session),
            qos,
            retain,
            subscription_ids,
            shared: None,
        });
        let now_ms = self.coarse_ms();
        self.deliver(message, targets, None, None, 1, now_ms)
    }

    /// Whether `message`, from another node, may be held here: memory below `level` (`Over`
    /// for what would otherwise be dropped, `Near` for what can wait in JetStream instead),
    /// and, a stranger's, within the anonymous share. It is charged to the share as it is
    /// made (`cluster::wire::message_of`), so the check counts it. For what comes with no
    /// publisher to pause or refuse (issue 35, sixteenth adversarial pass, C1).
    pub fn has_room_for(&self, message: &Message, level: MemoryLevel) -> bool {
        self.flow.memory_level(super::flow::message_bytes()) < level
            && (!message.charged_anonymous()
                || message.stranger_share().has_room(0, &self.flow.memory))
    }

    /// Queues `message` for one member of the shared group `key` (`$share/{group}/{filter}`)
    /// on this node, chosen by the group's strategy among those that may read it (only
    /// connected ones if `connected_only`): the cluster's delivery of a group's message (one
    /// member cluster-wide). `Ok(None)` when the group has no such member here (any more).
    ///
    /// # Errors
    ///
    /// As [`Broker::publish`]: the store refused it.
    pub fn deliver_shared(
        &self,
        key: &str,
        message: Arc<Message>,
        connected_only: bool,
    ) -> Result<Option<Routed>, PublishRefused> {
        let authz = self.authz();
        let may_read = |session: &Session| {
            authz.is_none_or(|authz| session.authorized(authz.acl, Action::Read, &message.topic))
        };
        let member = self.shared.read().pick_other(
            key,
            &message.topic,
            SessionId::MAX,
            connected_only,
            may_read,
            self.shared_judge(&message),
        );
        let Some(member) = member else {
            return Ok(None);
        };
        let session = Arc::clone(&member.session);
        let mut targets: SmallVec<[Target; 8]> = SmallVec::new();
        targets.push(Target {
            qos: message.qos.min(member.options.qos), // MQTT-4.8.2-3
            retain: member.options.retain_as_published && message.retain,
            subscription_ids: member.identifier.into_iter().collect(),
            session: member.session,
            shared: Some(Arc::from(key)),
        });
        let now_ms = self.coarse_ms();
        match self.deliver(message, targets, None, None, 1, now_ms) {
            // The member's session ended between the pick and the admission (not a drop:
            // nothing was counted): as if there had been no member, so the caller gives the
            // message back to its group rather than letting it go.
            Ok(routed) if routed.queued == 0 && session.lock().ended => Ok(None),
            other => other.map(Some),
        }
    }

    /// Every shared group with a member on this node: its key and inner filter.
    pub fn shared_group_keys(&self) -> Vec<(Arc<str>, ByteString)> {
        self.shared.read().keys()
    }

    /// Whether the shared group `key` has a connected member on this node (the cluster
    /// pulls a group's messages only then, so none waits in an offline member's queue while
    /// a member elsewhere is connected).
    pub fn shared_group_has_connected(&self, key: &str) -> bool {
        self.shared.read().has_other_connected(key, SessionId::MAX)
    }

    /// The second half of routing: admits `message` to each target's queue, persists what
    /// must be stored in one submit, updates the retained index.
    #[allow(clippy::needless_pass_by_value)]
    fn deliver(
        &self,
        message: Arc<Message>,
        targets: SmallVec<[Target; 8]>,
        inbound_qos2: Option<(&ByteString, u16)>,
        extra: Option<Op>,
        matched: usize,
        now_ms: u64,
    ) -> Result<Routed, PublishRefused> {
        // A message an engine keeps until it is settled is not stored here too (a restart
        // would deliver it twice: once from here, once from the engine).
        let persistence = self.store.is_some() && !message.awaits_settlement();
        let mut pressure: Option<Arc<Session>> = None;
        let mut queued = 0;
        let mut reserved: SmallVec<[(Arc<Session>, Delivery); 4]> = SmallVec::new();
        let mut ops = Vec::new();
        let mut losses = QueueLosses::default();
        for target in targets {
            let delivery = Delivery {
                message: Arc::clone(&message),
                qos: target.qos,
                retain: target.retain,
                subscription_ids: target.subscription_ids,
                seq: None,
                shared: target.shared,
            };
            let session = &target.session;
            let (outcome, kept, stored) = self.admit_counted(
                session,
                delivery,
                &message,
                persistence,
                now_ms,
                &mut ops,
                &mut losses,
            );
            if let Some(delivery) = stored {
                persist::enqueue(&mut ops, &session.client_id, &delivery);
                reserved.push((Arc::clone(session), delivery));
            }
            if kept {
                queued += 1;
            }
            if outcome == EnqueueOutcome::QueuedOverBound && pressure.is_none() {
                pressure = Some(Arc::clone(session));
            }
        }
        let Some(store) = self.store.as_ref() else {
            // A cluster shared group's message: the cluster's bucket keeps the retained ones.
            if message.retain && !message.awaits_settlement() {
                self.store_retained(&message);
            }
            if !losses.is_empty() {
                losses.publish_all(self); // nothing stored: no order to keep
            }
            return Ok(Routed {
                queued,
                matched,
                durable: None,
                pressure,
            });
        };
        if !reserved.is_empty() {
            let id = message.store_id.get_or_init(|| store.next_message_id());
            persist::fix_message_ids(&mut ops, id);
            ops.insert(0, persist::put_message(id, &message));
            // Clustered, its place in the stream when known already (another node's
            // message, a replay; issue 34). Never on a single node: one load, no op.
            if let Some(stream_seq) = message.cluster_seq() {
                ops.insert(1, persist::sequenced(id, stream_seq));
            }
        }
        // `$SYS` values are the broker's own figures of this run, republished at start: they
        // live in memory only (no store traffic every `sys_interval`, nothing stale restored).
        if message.retain && !crate::codec::topic::is_sys(&message.topic) {
            ops.push(persist::retained(&message));
        }
        if let Some((client_id, packet_id)) = inbound_qos2 {
            ops.push(Op::PutInboundQos2 {
                client_id: client_id.clone(),
                packet_id,
            });
        }
        // A dedup key alone (nothing of the message itself stored): batched with other such
        // keys (`DedupSpool`), its PUBACK waiting for that batch's commit.
        if ops.is_empty() {
            if let Some(op) = extra {
                let durable = self.spool_dedup_key(store, op).map_err(|error| {
                    tracing::debug!(%error, topic = %message.topic, "message refused: the durable store cannot take its dedup key");
                    error
                })?;
                if !losses.is_empty() {
                    losses.publish_all(self);
                }
                return Ok(Routed {
                    queued,
                    matched,
                    durable: Some(durable),
                    pressure,
                });
            }
        }
        ops.extend(extra);
        if !losses.is_empty() {
            // No session lock is held here. The victims' dead letters are submitted before
            // `ops`, which remove the victims' stored entries (one log, in submit order: a
            // crash between the two keeps the message somewhere). The refused new deliveries'
            // wait for this message's own submit: refused by the store, it was not accepted,
            // so nobody lost it.
            losses.publish_victims(self);
        }
        if ops.is_empty() {
            if message.retain {
                self.store_retained(&message); // a `$SYS` value: memory only
            }
            if !losses.is_empty() {
                losses.publish_all(self);
            }
            return Ok(Routed {
                queued,
                matched,
                durable: None,
                pressure,
            });
        }
        let submitted = store.submit(ops).map_err(|rejected| {
            if matches!(rejected.error, StorageError::NoSpace(_)) {
                // The writer logged the full filesystem once; not once per message.
                tracing::debug!(error = %rejected.error, topic = %message.topic, "message refused by the durable store");
            } else {
                tracing::warn!(error = %rejected.error, topic = %message.topic, "message refused by the durable store");
            }
            rejected.error
        })?;
        // A cluster shared group's message: the cluster's bucket keeps the retained ones.
        if message.retain && !message.awaits_settlement() {
            self.store_retained(&message);
        }
        for (session, delivery) in reserved {
            session.push_reserved(delivery, now_ms);
        }
        if !losses.is_empty() {
            losses.publish_all(self);
        }
        Ok(Routed {
            queued,
            matched,
            durable: Some(submitted.durable),
            pressure,
        })
    }

    /// While the store cannot take new data (a full filesystem), a QoS 1/2 message that needs
    /// it is refused here, before it is queued for anyone: its publisher is told it was not
    /// accepted (v5 0x97, v3 disconnect), so no subscriber may have it either (a re-send would
    /// be a duplicate). One that needs no store (no persistent QoS ≥ 1 target, not retained,
    /// no stored QoS 2 id) still goes through, as does QoS 0. One atomic load when healthy.
    fn refused_before_routing(
        &self,
        message: &Message,
        inbound_qos2: Option<(&ByteString, u16)>,
        targets: &[Target],
    ) -> Option<StorageError> {
        let store = self.store.as_ref()?;
        if message.qos == QoS::AtMostOnce || store.health() == StoreHealth::Ok {
            return None;
        }
        let needs_store = message.retain
            || inbound_qos2.is_some()
            || targets
                .iter()
                .any(|t| t.qos != QoS::AtMostOnce && t.session.stores_deliveries());
        if !needs_store {
            return None;
        }
        let error = store.refuse_growth()?;
        tracing::debug!(%error, topic = %message.topic, "message refused: the durable store cannot take it now");
        Some(error)
    }

    /// With `queue_overflow = "refuse"` (broker-wide, or a session's own: a bridge's, see
    /// `Broker::set_queue_limits`), a client's QoS 1/2 message that would overflow the queue
    /// of any target under that policy (offline or stalled, and full) is refused before it is
    /// queued for anyone: a refusal after some subscribers got it would make the publisher's
    /// re-send a duplicate for them (exactly-once broken for QoS 2). Wills (no publisher to
    /// tell) and QoS 0 are not refused; they overflow as with `drop-new`. Costs nothing while
    /// no session is under `refuse`; one session lock per such target otherwise.
    fn refused_for_full_queue(
        &self,
        message: &Message,
        targets: &[Target],
        now_ms: u64,
    ) -> Option<PublishRefused> {
        if !self.limits.may_refuse() || message.qos == QoS::AtMostOnce || message.origin().is_none()
        {
            return None;
        }
        let size = message.size();
        // Each target under its own policy: a bridge's session may refuse where the others
        // drop, or the other way round.
        let full = targets.iter().find(|t| {
            if t.qos == QoS::AtMostOnce {
                return false;
            }
            let limits = self.limits.of(&t.session.client_id);
            limits.overflow == OverflowPolicy::Refuse
                && t.session.would_overflow(size, &limits, now_ms)
        })?;
        self.metrics.messages_refused_queue_full[message.qos as usize].increment(1);
        tracing::debug!(topic = %message.topic, subscriber = %full.session.client_id, "message refused: a subscriber's queue is full (queue_overflow = \"refuse\")");
        Some(PublishRefused::QueueFull {
            client_id: full.session.client_id.clone(),
        })
    }

    /// What a shared group asks of a member before it picks it for `message`: whether it is
    /// connected, and whether it would keep the message rather than drop it
    /// (`SessionState::would_keep`; issue 35, thirteenth adversarial pass, F5). One session
    /// lock.
    pub(super) fn shared_judge<'a>(
        &'a self,
        message: &'a Message,
    ) -> impl Fn(&Session) -> (bool, bool) + 'a {
        let now_ms = self.coarse_ms();
        move |session: &Session| {
            let limits = self.limits.of(&session.client_id);
            let st = session.lock();
            let connected = st.connection.is_some() && !st.ended;
            (connected, st.would_keep(message, &limits, now_ms))
        }
    }

    /// Adds one delivery per matching shared subscription group: the member the strategy
    /// picks among those that may read the topic. Kept apart from `merge_overlapping`: a
    /// shared copy is separate from any copy the same session gets through its own non-shared
    /// subscriptions (MQTT 5 §4.8.2). Only when no member may read it is the group's copy
    /// dropped (and counted as a denied read).
    fn shared_targets(&self, message: &Message, targets: &mut SmallVec<[Target; 8]>) {
        let authz = self.authz();
        let may_read = |session: &Session| {
            authz.is_none_or(|authz| session.authorized(authz.acl, Action::Read, &message.topic))
        };
        self.shared.read().pick_for_topic(
            &message.topic,
            may_read,
            self.shared_judge(message),
            |pick| match pick {
                Some(pick) => targets.push(Target {
                    qos: message.qos.min(pick.member.options.qos), // MQTT-4.8.2-3
                    retain: pick.member.options.retain_as_published && message.retain,
                    subscription_ids: pick.member.identifier.into_iter().collect(),
                    session: pick.member.session,
                    shared: Some(pick.key),
                }),
                None => {
                    self.count_denied(Action::Read);
                    self.metrics.messages_dropped_denied[message.qos as usize].increment(1);
                }
            },
        );
    }

    /// Makes `message` its topic's retained message, or (empty payload) clears it. A
    /// stranger's retained message is charged to its share for its life
    /// ([`Message::set_published_by_stranger`]), wherever it is held, so nothing is counted
    /// here.
    pub(super) fn store_retained(&self, message: &Arc<Message>) {
        let mut retained = self.retained.write();
        if message.payload.is_empty() {
            retained.remove(&message.topic); // MQTT-3.3.1-10
        } else {
            retained.insert(&message.topic, Arc::clone(message)); // MQTT-3.3.1-5
        }
        self.metrics.retained_messages.set(retained.len() as f64);
    }

    /// Whether a stranger's `publish`, charged to `share`, fits that share: room for its
    /// bytes, or, retained, room once it replaces its topic's retained message charged to
    /// the same share. A clear of such a message always fits when it is no larger than what
    /// it removes: a full share held or refused the very clear that would have emptied it,
    /// and a stranger's retained messages on a bridge's remote then stopped every message
    /// of that remote for good (issue 35, eighteenth adversarial pass, E3). The replaced
    /// message counts as freed only where the retained store is its last holder (a copy
    /// queued at a session keeps it charged). Looks at the retained store only for a
    /// retained PUBLISH.
    pub(crate) fn stranger_fits(
        &self,
        publish: &crate::codec::Publish,
        share: StrangerShare,
    ) -> ShareFit {
        let cost = publish.held_bytes() as u64;
        let replacing = || {
            if !publish.retain {
                return false;
            }
            let retained = self.retained.read();
            let Some(old) = retained.get(&publish.topic) else {
                return false;
            };
            old.charged_anonymous()
                && old.stranger_share() == share
                && share.fits_replacing(
                    cost,
                    old.size() as u64,
                    Arc::strong_count(old) == 1,
                    publish.payload.is_empty(),
                    &self.flow.memory,
                )
        };
        if replacing() {
            ShareFit::Replacing
        } else if share.has_room(cost, &self.flow.memory) {
            ShareFit::Room
        } else {
            ShareFit::No
        }
    }

    /// Queues the retained messages matching `filter` to `session` with RETAIN=1 (MQTT-3.3.1-6),
    /// carrying the subscription's identifier (MQTT-3.3.4-3: they are sent as a result of it).
    pub fn deliver_retained(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) {
        let mut found: Vec<Arc<Message>> = Vec::new();
        self.retained
            .read()
            .for_each_match(filter, |_, m| found.push(Arc::clone(m)));
        // Retained messages obey read rules like live ones; a fully readable filter needs
        // no check per message.
        if let Some(authz) = self.authz() {
            if session.filter_access(authz.acl, filter).0 != FilterAccess::Full {
                found.retain(|m| {
                    let allowed = session.authorized(authz.acl, Action::Read, &m.topic);
                    if !allowed {
                        self.count_denied(Action::Read);
                    }
                    allowed
                });
            }
        }
        let now = Instant::now();
        let now_ms = self.clock_ms(now);
        for message in found {
            if message.is_expired(now) {
                continue;
            }
            let qos = message.qos.min(options.qos);
            session.enqueue_unbounded(
                Delivery {
                    message,
                    qos,
                    retain: true,
                    subscription_ids: identifier.into_iter().collect(),
                    seq: None, // re-sent from the retained store after a restart anyway
                    shared: None,
                },
                now_ms,
            );
        }
    }

    /// Admits `delivery` of `message` at `session`, the one admission routing and a shared
    /// group's hand-over share: the stored entries of the deliveries a drop-oldest admission
    /// pushed out (or pushed out and still refused the new one, the anonymous share taken) are
    /// removed in `ops`, the drops are counted ([`Broker::count_enqueue`]) and the losses
    /// noted. Returns the outcome, whether the delivery was queued, and the delivery when it
    /// was reserved for the store: the caller writes its entry, then pushes it once the ops
    /// are submitted (`Session::push_reserved`).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn admit_counted(
        &self,
        session: &Arc<Session>,
        delivery: Delivery,
        message: &Arc<Message>,
        persistence: bool,
        now_ms: u64,
        ops: &mut Vec<Op>,
        losses: &mut QueueLosses,
    ) -> (EnqueueOutcome, bool, Option<Delivery>) {
        let qos = delivery.qos;
        let limits = self.limits.of(&session.client_id);
        let (outcome, mut victims, reserved) =
            match session.admit(delivery, &limits, persistence, now_ms) {
                Admission::Pushed(outcome, victims) | Admission::Refused(outcome, victims) => {
                    (outcome, victims, None)
                }
                Admission::Reserved {
                    delivery,
                    outcome,
                    victims,
                } => (outcome, victims, Some(delivery)),
            };
        persist::remove_victims(ops, &session.client_id, &victims);
        let kept = self.count_enqueue(outcome, qos, &victims);
        losses.note(self, session, outcome, message, &mut victims);
        (outcome, kept, reserved)
    }

    /// Counts the drops an enqueue of a `qos` delivery caused (the older deliveries it pushed
    /// out, or itself); true if the delivery was queued.
    pub(super) fn count_enqueue(
        &self,
        outcome: EnqueueOutcome,
        qos: QoS,
        victims: &Victims,
    ) -> bool {
        if victims.stall_began {
            self.metrics.session_stalls.increment(1);
        }
        match outcome {
            EnqueueOutcome::Queued | EnqueueOutcome::QueuedOverBound => true,
            EnqueueOutcome::QueuedDroppedOldest => {
                self.count_victims(victims);
                true
            }
            EnqueueOutcome::DroppedQueueFull => {
                self.metrics.messages_dropped_queue_full[qos as usize].increment(1);
                self.count_victims(victims);
                false
            }
            EnqueueOutcome::DroppedQoS0Offline => {
                self.metrics.messages_dropped_qos0_offline.increment(1);
                false
            }
            EnqueueOutcome::SessionEnded => false,
        }
    }

    /// Counts the deliveries a drop-oldest admission pushed out (`queue_full`, by QoS).
    fn count_victims(&self, victims: &Victims) {
        let counters = self.metrics.messages_dropped_queue_full.iter();
        for (counter, n) in counters.zip(victims.dropped()) {
            if n > 0 {
                counter.increment(n);
            }
        }
    }
}

/// A matched subscription before merging.
struct Target {
    session: Arc<Session>,
    qos: QoS,
    retain: bool,
    subscription_ids: SmallVec<[u32; 1]>,
    shared: Option<Arc<str>>,
}

/// Collapses several matching subscriptions of one session into one delivery at the highest
/// granted QoS (MQTT-3.3.5-1) carrying every subscription identifier (MQTT-3.3.4-4).
fn merge_overlapping(targets: &mut SmallVec<[Target; 8]>) {
    if targets.len() < 2 {
        return;
    }
    // Almost always every session matched once: find out on a sorted copy of the ids (8 B
    // each) rather than sorting and rebuilding the targets (the 2026-11-30 profile: 6% of
    // fan-out to 50 subscribers, with no duplicate at all).
    let mut ids: SmallVec<[SessionId; 64]> = targets.iter().map(|t| t.session.id).collect();
    ids.sort_unstable();
    if !ids.windows(2).any(|w| w[0] == w[1]) {
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
