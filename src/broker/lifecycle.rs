//! Session lifecycle: attach (new, resumed, taken over), detach, expiry, wills and the end of
//! a session. Timers are tokio tasks per disconnected session, never per connected one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;

use super::owner::{self, NotOwner, OwnerCheck};
use super::redistribute::Handover;
use super::{
    persist, Attached, Broker, Message, PendingWill, Session, SessionHandle, SessionRequest,
    NEVER_EXPIRES,
};
use crate::auth::acl::Action;
use crate::auth::principal::{Principal, ANONYMOUS};
use crate::codec::{topic, LastWill};
use crate::storage::{self, Op, SessionOwner};

impl Broker {
    /// Opens or resumes the session for a client, evicting any connection that holds it
    /// (MQTT-3.1.4-2; v5 reason 0x8E). A clean start discards the old session (MQTT-3.1.2-4).
    // Callers build the request for this call (a struct literal); by value keeps them plain.
    #[allow(clippy::needless_pass_by_value)]
    pub fn connect(self: &Arc<Self>, req: SessionRequest) -> Attached {
        match self.connect_as(req, SessionOwner::Unbound) {
            Ok(attached) => attached,
            // An unbound newcomer resumes any session (`owner::check`).
            Err(NotOwner) => unreachable!("an unbound CONNECT is never refused"),
        }
    }

    /// [`Broker::connect`] for a client authenticated as `owner` (issue 35): a session
    /// another identity owns is resumed by nobody else; the newcomer is refused, or gets a
    /// fresh session, as `owner::check` and `auth.session_binding` decide. A refused CONNECT
    /// changes nothing: the owner's connection, will and queue stay as they are.
    ///
    /// # Errors
    ///
    /// [`NotOwner`] when the session belongs to another identity and may not be replaced.
    // By value like `connect`.
    #[allow(clippy::needless_pass_by_value)]
    pub fn connect_as(
        self: &Arc<Self>,
        req: SessionRequest,
        owner: SessionOwner,
    ) -> Result<Attached, NotOwner> {
        let mut sessions = self.sessions.lock();
        if let Some(existing) = sessions.get(&req.client_id).cloned() {
            let mut st = existing.lock();
            let verdict = if st.ended {
                OwnerCheck::Resume
            } else {
                owner::check(
                    &st.owner,
                    st.connection.is_some(),
                    &owner,
                    &req.client_id,
                    self.auth.session_binding,
                )
            };
            if verdict == OwnerCheck::Refuse {
                self.metrics.session_binding[0].increment(1);
                return Err(NotOwner);
            }
            // A new connection for the client id cancels a delayed will, whether or not it
            // resumes the session (MQTT-3.1.2-8, MQTT-3.1.3-9).
            if st.pending_will.take().is_some() {
                self.forget_stored_will(&existing.client_id);
            }
            if !req.clean_start && !st.ended && verdict == OwnerCheck::Resume {
                let (generation, displaced) =
                    Session::attach(&mut st, self.clock_ms(Instant::now()));
                st.protocol = req.protocol;
                // Takes smaller packets than it was chosen by: its shared deliveries that no
                // longer fit go to members that would take them, before its queue is written
                // (issue 35, fifteenth adversarial pass, B2: dropped as too large, 50 of 100).
                let shrunk = req.client_max_packet != 0
                    && (st.client_max_packet == 0 || req.client_max_packet < st.client_max_packet)
                    && st.holds_shared();
                st.client_max_packet = req.client_max_packet;
                st.expiry_interval = req.expiry_interval;
                if st.owner != owner {
                    existing.set_share_key(&owner, None);
                    st.set_owner(&existing.client_id, owner);
                }
                st.recount_cost(&existing.client_id);
                let ops =
                    persist::session_resumed(&existing.client_id, &mut st, self.store.is_some());
                drop(st);
                if displaced {
                    self.took_over(&existing);
                }
                self.persist(ops);
                if shrunk {
                    drop(sessions);
                    self.redistribute_shared(&existing, Handover::Shrunk);
                }
                return Ok(Attached {
                    handle: SessionHandle::new(Arc::clone(self), existing, generation),
                    session_present: true,
                });
            }
            if verdict == OwnerCheck::Fresh {
                self.metrics.session_binding[1].increment(1);
                if st.owner == SessionOwner::Unbound {
                    tracing::warn!(client = %req.client_id, queued = st.queue.len() + st.inflight.len(), "a session stored before authentication was configured is replaced by a clean one: only a user whose name is the client id may resume it; its queued messages are dropped");
                }
            }
            let displaced = st.connection.take().is_some();
            drop(st);
            if displaced {
                self.took_over(&existing);
            }
            sessions.remove(&req.client_id);
            self.end_session(&existing);
        }
        let id = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(Session::new(
            id,
            // A copy of its own: the codec hands out an owned id, but `Broker::connect` is
            // public, and a caller's slice (a link's, a restored record's) would keep its
            // whole buffer alive for as long as the session lives. Once per session.
            ByteString::from(String::from(&*req.client_id)),
            req.protocol,
            req.expiry_interval,
        ));
        let (generation, ops) = {
            let mut st = session.lock();
            let (generation, _) = Session::attach(&mut st, self.clock_ms(Instant::now()));
            st.client_max_packet = req.client_max_packet;
            session.set_share_key(&owner, None);
            st.set_owner(&session.client_id, owner);
            let ops = persist::session_resumed(&session.client_id, &mut st, self.store.is_some());
            (generation, ops)
        };
        self.persist(ops);
        sessions.insert(session.clone());
        self.metrics.sessions_current.set(sessions.len() as f64);
        Ok(Attached {
            handle: SessionHandle::new(Arc::clone(self), session, generation),
            session_present: false,
        })
    }

    /// Counts a takeover and wakes the displaced connection, which then finds it no longer
    /// owns `session` and closes (0x8E, MQTT-3.1.4-2).
    pub(super) fn took_over(&self, session: &Session) {
        self.metrics.session_takeovers.increment(1);
        session.wake();
    }

    /// Detaches a connection from its session. The session then ends at once (expiry 0),
    /// never, or after its expiry interval (MQTT-3.1.2-23).
    pub fn disconnect(self: &Arc<Self>, session: &Arc<Session>, generation: u64) {
        let (expiry, will_at, holds_shared) = {
            let mut st = session.lock();
            if !st.is_owned_by(generation) {
                return; // taken over: the new connection owns it now
            }
            st.connection = None;
            st.end_stall(); // offline now: counted as offline, not as stalled
            session.set_keep_alive_deadline(u64::MAX);
            st.disconnected_at = Some(Instant::now());
            if st.stored && st.is_persistent() {
                let meta =
                    persist::session_meta(&session.client_id, &st, Some(storage::now_unix_ms()));
                drop(st);
                self.persist(vec![Op::PutSession(meta)]);
                st = session.lock();
            }
            let will_at = st.pending_will.as_ref().map(|w| w.publish_at);
            (st.expiry_interval, will_at, st.holds_shared())
        };
        self.cluster_session_changed(&session.client_id);
        // Publishers paused for it no longer wait: it is offline now.
        self.flow.wake_paused();
        if holds_shared && expiry != 0 {
            // Let connected members of its groups have what it had not acknowledged yet.
            self.redistribute_shared(session, Handover::Disconnected);
        }
        if let Some(at) = will_at {
            self.schedule_will(session, generation, at, expiry);
        }
        self.schedule_expiry(
            session,
            generation,
            Duration::from_secs(u64::from(expiry)),
            expiry,
        );
    }

    /// Ends a disconnected session after `after`, unless a client re-attaches first.
    pub(super) fn schedule_expiry(
        self: &Arc<Self>,
        session: &Arc<Session>,
        generation: u64,
        after: Duration,
        expiry: u32,
    ) {
        match expiry {
            0 => {
                self.remove_session_if_idle(session, generation);
            }
            NEVER_EXPIRES => {}
            _ if after.is_zero() => self.expire_session_if_idle(session, generation),
            _ => {
                // The timer holds the session weakly: one that ends before it fires (a clean
                // start replaced it) goes at once, with what it counts in the budget and the
                // anonymous share, not when its old expiry runs out (issue 35, eleventh
                // adversarial pass, T4: a stranger's reset sessions kept the share full).
                let broker = Arc::clone(self);
                let session = Arc::downgrade(session);
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if let Some(session) = session.upgrade() {
                        broker.expire_session_if_idle(&session, generation);
                    }
                });
            }
        }
    }

    /// Keeps the will of a connection that closed abnormally until its Will Delay Interval
    /// has passed (`delay` seconds) or the session ends, whichever comes first (MQTT-3.1.2-8).
    /// Call before [`Broker::disconnect`]. If another connection already owns the session,
    /// the will is dropped: a new connection arrived within the delay (MQTT-3.1.3-9).
    pub fn defer_will(&self, session: &Arc<Session>, generation: u64, will: LastWill, delay: u32) {
        let mut st = session.lock();
        if !st.is_owned_by(generation) {
            return;
        }
        let delay = Duration::from_secs(u64::from(delay));
        let publish_at_unix_ms = storage::now_unix_ms().saturating_add(delay.as_millis() as u64);
        if st.stored {
            // Survives a restart: published at the earlier of its delay and the session's end.
            let ends = storage::now_unix_ms()
                .saturating_add(u64::from(st.expiry_interval).saturating_mul(1000));
            self.persist(vec![Op::PutWill {
                client_id: session.client_id.clone(),
                will: will.clone(),
                publish_at_unix_ms: publish_at_unix_ms.min(ends),
            }]);
        }
        let held = super::flow::HeldWill::new(will.held_bytes(), st.is_anonymous());
        st.pending_will = Some(Box::new(PendingWill {
            will,
            publish_at: Instant::now() + delay,
            publish_at_unix_ms,
            _held: held,
        }));
    }

    /// Drops the stored copy of `client_id`'s delayed will at start: clustered, the will
    /// belongs to the session's record in the cluster, which fires it.
    pub fn forget_will_of(&self, client_id: &ByteString) {
        self.forget_stored_will(client_id);
    }

    /// Drops the stored copy of a delayed will (published, or cancelled by a reconnect).
    pub(super) fn forget_stored_will(&self, client_id: &ByteString) {
        if self.store.is_some() {
            self.persist(vec![Op::DeleteWill {
                client_id: client_id.clone(),
            }]);
        }
    }

    /// Publishes a will now: counted, and routed as a message from nobody (so No Local never
    /// suppresses it).
    ///
    /// With an ACL, the will is published only if its client may write the topic at the time
    /// it is published (as Mosquitto checks it: at publish time, so a reload in between
    /// counts); otherwise it is dropped and counted.
    pub fn publish_will(&self, session: &Session, will: LastWill) {
        let identity = session.principal();
        let principal = identity.as_deref().unwrap_or(&ANONYMOUS);
        if !self.will_allowed(principal, &session.client_id, &will.topic) {
            return;
        }
        // A retained will of an anonymous client is a retained message of theirs: it counts in
        // their share of the budget, and past it is not published, as their PUBLISH is
        // refused (`flow::ANONYMOUS_SHARE`; kept without RETAIN it would break MQTT-3.1.2-17).
        let stranger = session.lock().is_anonymous();
        let anonymous = will.retain && !will.payload.is_empty() && stranger;
        if anonymous
            && !self.anonymous_will_fits(&session.client_id, &will.topic, will.held_bytes())
        {
            return;
        }
        let identity = (!stranger).then(|| session.share_key());
        if !self.will_fits_the_cluster(
            &session.client_id,
            &will.topic,
            will.qos,
            will.held_bytes(),
            identity,
        ) {
            return;
        }
        let mut message = Message::from_will(will);
        message.set_published_anonymously(stranger);
        self.publish_allowed_will(&Arc::new(message));
    }

    /// Whether a will on `topic` of `bytes`, at `qos` 1/2 and so bound for the cluster's
    /// stream when clustered, fits its share of it: anonymous clients' (`identity` `None`)
    /// or the owner's (its share key) ([`Broker::cluster_charge_will`], charged if so);
    /// logged when it does not.
    fn will_fits_the_cluster(
        &self,
        client_id: &str,
        topic: &str,
        qos: crate::codec::QoS,
        bytes: usize,
        identity: Option<u64>,
    ) -> bool {
        if qos == crate::codec::QoS::AtMostOnce || self.cluster_charge_will(bytes, identity) {
            return true;
        }
        let whose = if identity.is_some() {
            "its identity's"
        } else {
            "anonymous clients'"
        };
        tracing::info!(client = %client_id, %topic, "will not published: {whose} share of the cluster's message stream is used up");
        false
    }

    /// Publishes a will whose session is not held here, checked exactly as
    /// [`Broker::publish_will`] checks a session's (`$SYS`, dead-letter prefix, ACL and
    /// claims), under the identity of the session's owner: `owner`'s user name, anonymous
    /// for a session bound to no user (an anonymous one, or one recorded before sessions
    /// had owners). Used for the will of a session whose node died (`cluster::orphans`) and
    /// for a stored will whose session expired while the broker was down. Published
    /// unchecked, such a will let any client write anywhere, retained, by arming a will and
    /// waiting for its node to die (issue 35, sixth adversarial pass, F1b). A token's claims
    /// are not kept with the session: a will its claims deny is dropped at CONNECT
    /// (`connection::handshake`), so none is left to check here.
    ///
    /// A retained will of an anonymous session counts in the anonymous share as
    /// [`Broker::publish_will`] counts it, and past the share is not published (pass 7B:
    /// published uncounted, it was an anonymous retained message outside the share).
    pub(crate) fn publish_will_of(
        &self,
        client_id: &str,
        owner: &SessionOwner,
        mut message: Message,
    ) {
        let principal = Principal::restored(owner.user());
        if !self.will_allowed(&principal, client_id, &message.topic) {
            return;
        }
        let stranger = *owner == SessionOwner::Anonymous;
        let anonymous = stranger && message.retain && !message.payload.is_empty();
        if anonymous && !self.anonymous_will_fits(client_id, &message.topic, message.size()) {
            return;
        }
        let identity = (!stranger).then(|| owner::share_key(owner, None));
        if !self.will_fits_the_cluster(
            client_id,
            &message.topic,
            message.qos,
            message.size(),
            identity,
        ) {
            return;
        }
        message.set_published_anonymously(stranger);
        self.publish_allowed_will(&Arc::new(message));
    }

    /// Whether a retained will on `topic` of `size` bytes (topic, payload, properties) of an
    /// anonymous client fits in their share of the budget (`flow::ANONYMOUS_SHARE`); logged
    /// when it does not.
    fn anonymous_will_fits(&self, client_id: &str, topic: &str, size: usize) -> bool {
        let fits = super::flow::anonymous_share_has_room(size as u64, &self.flow.memory);
        if !fits {
            tracing::info!(client = %client_id, %topic, "will not published: anonymous clients are at their share of the memory budget");
        }
        fits
    }

    /// Whether `principal` (the will's client `client_id`) may have a will published on
    /// `topic`; a refusal is counted and logged. The one check every will goes through.
    fn will_allowed(&self, principal: &Principal, client_id: &str, topic: &str) -> bool {
        if topic::is_sys(topic) || self.is_dead_letter_topic(topic) {
            // No client publishes under `$SYS` or the dead-letter prefix, not even through
            // its will.
            self.count_denied(Action::Write);
            tracing::info!(client = %client_id, %topic, "will not published: $SYS and dead-letter topics are the broker's own");
            return false;
        }
        if let Some(authz) = self.authz() {
            if !principal.allow(authz.acl, client_id, Action::Write, topic) {
                self.count_denied(Action::Write);
                tracing::info!(client = %client_id, %topic, "will not published: the ACL denies its topic");
                return false;
            }
        }
        true
    }

    /// Publishes a will [`Broker::will_allowed`] let through: counted, and clustered, to the
    /// other nodes' subscribers too (nobody waits for the ack).
    fn publish_allowed_will(&self, message: &Arc<Message>) {
        self.metrics.will_messages_published.increment(1);
        let _fence = self.cluster_fence();
        match self.publish(Arc::clone(message), None) {
            Ok(_) => drop(self.cluster_forward(message, None, None)),
            Err(error) => tracing::warn!(%error, "will message refused by the durable store"),
        }
    }

    /// Arms the timer of a pending will when it is due before the session would end; a will
    /// due later is published by `end_session` instead.
    pub(super) fn schedule_will(
        self: &Arc<Self>,
        session: &Arc<Session>,
        generation: u64,
        at: Instant,
        expiry: u32,
    ) {
        let delay = at.saturating_duration_since(Instant::now());
        if expiry != NEVER_EXPIRES && delay >= Duration::from_secs(u64::from(expiry)) {
            return;
        }
        let broker = Arc::clone(self);
        // Weakly, as the expiry timer: a session that ended meanwhile published its will.
        let session = Arc::downgrade(session);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(session) = session.upgrade() else {
                return;
            };
            let will = {
                let mut st = session.lock();
                if st.generation != generation || st.connection.is_some() || st.ended {
                    return; // the client came back (or the session ended and published it)
                }
                st.pending_will.take()
            };
            if let Some(pending) = will {
                broker.publish_will(&session, pending.will);
                broker.forget_stored_will(&session.client_id);
            }
        });
    }

    /// Ends `session` because its expiry interval (not 0) passed, unless a connection
    /// re-attached since `generation` detached; counted in `postbox_sessions_expired_total`.
    fn expire_session_if_idle(&self, session: &Arc<Session>, generation: u64) {
        if self.remove_session_if_idle(session, generation) {
            self.metrics.sessions_expired.increment(1);
        }
    }

    /// Ends `session` unless a connection re-attached since `generation` detached; true if it
    /// ended it.
    pub(super) fn remove_session_if_idle(&self, session: &Arc<Session>, generation: u64) -> bool {
        let mut sessions = self.sessions.lock();
        {
            let st = session.lock();
            if st.generation != generation || st.connection.is_some() || st.ended {
                return false;
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
        true
    }

    /// Discards a session's subscriptions and queues; it accepts nothing afterwards. A pending
    /// will is published first (the session ending is one of its triggers, MQTT-3.1.2-8), and
    /// shared-subscription messages it still held go to the other members of their groups.
    pub(super) fn end_session(&self, session: &Arc<Session>) {
        let (will, holds_shared) = {
            let st = &mut *session.lock();
            (st.pending_will.take(), st.holds_shared())
        };
        if let Some(pending) = will {
            self.publish_will(session, pending.will);
            self.forget_stored_will(&session.client_id);
        }
        if holds_shared {
            self.redistribute_shared(session, Handover::Ended);
        }
        let filters: Vec<ByteString> = {
            let mut st = session.lock();
            st.ended = true;
            st.end_stall();
            // What a cluster's engine still holds for it and no member took (one admitted
            // after the redistribution above): back to the engine, not settled by the drop.
            // QoS 2 ones sent are not (MQTT-4.8.2-5).
            for d in &st.queue {
                d.message.give_back();
            }
            for f in &st.inflight {
                if f.stage == super::OutboundStage::AwaitPubAck {
                    f.delivery.message.give_back();
                }
            }
            st.queue.clear();
            let anonymous = st.is_anonymous();
            st.inflight.clear(anonymous);
            st.inbound_qos2.clear();
            if std::mem::take(&mut st.stored) {
                self.persist(vec![Op::DeleteSession {
                    client_id: session.client_id.clone(),
                }]);
            }
            st.drain_subscriptions().map(|(f, _)| f).collect()
        };
        // Publishers paused for it no longer wait, and its messages are gone.
        self.flow.wake_paused();
        self.flow.on_drained();
        if filters.is_empty() {
            return;
        }
        let (shared, plain): (Vec<_>, Vec<_>) = filters
            .iter()
            .partition(|f| topic::split_shared(f).is_some());
        if !plain.is_empty() {
            let mut tree = self.subscriptions.write();
            for filter in plain {
                tree.remove(filter, session.id);
            }
        }
        if !shared.is_empty() {
            let mut index = self.shared.write();
            for filter in shared {
                index.unsubscribe(filter, session.id);
            }
            self.has_shared.store(!index.is_empty(), Ordering::Release);
        }
        self.update_subscription_gauge();
    }
}
