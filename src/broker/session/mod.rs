//! Session state: what survives a client's disconnects (MQTT-4.1.0-1).
//!
//! A session is shared between the router (which appends deliveries from publishing tasks) and
//! at most one driver (a connection or an in-process link) that drains them. Both take the
//! session's mutex only for short, non-async critical sections.
//!
//! The state is private to the broker: drivers change it only through
//! [`SessionHandle`](super::SessionHandle), whose methods also build the store ops each change
//! implies. This module holds the state and queue admission; [`outbound`] the QoS 1/2 handshake
//! of messages to the client, [`inbound`] the exactly-once ids of messages from it.
//!
//! Must not: do I/O or submit ops itself.

pub(crate) mod inbound;
pub(crate) mod outbound;
mod queue;
mod subscription_map;

pub(crate) use outbound::{DeliverySink, Inflight, InflightWindow, OutboundStage};
pub(in crate::broker) use queue::fits_client;

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytestring::ByteString;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::message::{Delivery, SessionId};
use crate::codec::{LastWill, ProtocolVersion, QoS, SubscriptionOptions};
use crate::config::OverflowPolicy;

/// Session expiry in seconds; `u32::MAX` means the session never expires.
pub(crate) const NEVER_EXPIRES: u32 = u32::MAX;

/// A client's session, shared by the router and the client's connection.
#[derive(Debug)]
pub struct Session {
    /// Broker-internal id, cheaper to compare than the client id.
    pub id: SessionId,
    /// Client Identifier the session belongs to.
    pub client_id: ByteString,
    state: Mutex<SessionState>,
    /// Wakes the connection task: deliveries arrived, a window opened, the session was taken
    /// over, the keep-alive ran out, or the server is stopping. The connection re-checks all of
    /// these whenever it wakes, so one wake-up source replaces a channel and a timer per
    /// connection (see [`Session::notified`]).
    notify: Notify,
    /// When the attached connection's keep-alive runs out, in [`super::Broker::clock_ms`]
    /// milliseconds (`u64::MAX`: no keep-alive or no connection). Read by the broker's
    /// keep-alive sweep without taking the session lock.
    keep_alive_deadline_ms: AtomicU64,
    /// Who the connection last attached is for authorisation (user name, JWT claims): read
    /// by every ACL check, also for deliveries queued while offline, from any task and without
    /// the session lock; replaced whole at attach. `None`: anonymous, no claims (and always
    /// without an ACL or claims).
    identity: arc_swap::ArcSwapOption<crate::auth::principal::Principal>,
    /// Whose share of the dedup window and of the dead-letter rate this session's traffic
    /// spends (`broker::owner::share_key`: its owner's name, else its client's address); set
    /// at each CONNECT and restore, read without the session lock.
    share_key: AtomicU64,
}

/// A subscription as the session remembers it (for unsubscribe-on-end and persistence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionSubscription {
    /// Subscription Options granted (MQTT 3.8.3.1).
    pub options: SubscriptionOptions,
    /// Subscription Identifier (MQTT 3.8.2.1.2), if the SUBSCRIBE carried one.
    pub identifier: Option<u32>,
}

/// A will held back by its Will Delay Interval after an abnormal close (MQTT-3.1.2-8).
///
/// Kept in the session state, its bytes counted while it waits (`_held`, kept for its `Drop`), so that the durable
/// store can persist it
/// (`storage::Op::PutWill` takes the will and `publish_at_unix_ms`).
#[derive(Debug)]
pub(crate) struct PendingWill {
    /// The will as sent in CONNECT (its properties are forwarded when it is published).
    pub will: LastWill,
    /// When the delay runs out. The session ending earlier publishes it at once.
    pub publish_at: Instant,
    /// `publish_at` as unix milliseconds, for persistence.
    pub publish_at_unix_ms: u64,
    /// Its bytes, counted in the budget (and the anonymous share) while it waits.
    pub(crate) _held: super::flow::HeldWill,
}

/// The live connection attached to a session. A newer connection replaces it (takeover); the
/// old one notices on its next wake-up that it no longer owns the session.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    /// Never zero (the first attach makes it 1), which lets `Option<ConnectionSlot>` take no
    /// more room than the number itself: every session carries one.
    pub generation: NonZeroU64,
}

/// Queue bounds applied when a delivery is appended.
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// Most deliveries a session may queue beyond its inflight window.
    pub max_messages: usize,
    /// 0 = no byte bound.
    pub max_bytes: usize,
    /// Queue QoS 0 messages for offline sessions too (`mqtt.queue_qos0_messages`).
    pub queue_qos0_offline: bool,
    /// What a full queue drops: the oldest delivery or the new one.
    pub overflow: OverflowPolicy,
    /// A connected session with a full queue that took nothing off it for this long is
    /// stalled: the overflow policy applies to it as if it were offline (`mqtt.stalled_after`).
    pub stalled_after_ms: u64,
    /// QoS 0 deliveries pause their publisher too (`mqtt.backpressure_qos0`).
    pub backpressure_qos0: bool,
    /// What anonymous sessions may hold together (`flow::ANONYMOUS_SHARE` of the memory
    /// budget, queued and in-flight message bytes included): an anonymous session's queue,
    /// connected or not, counts as full once they hold it, so its overflow policy applies
    /// (issue 35, sixth pass: a stranger's kept sessions could otherwise queue up to
    /// `max_queued_bytes` each; ninth pass R2: a connected one that never acknowledged took
    /// the whole budget into its inflight window).
    pub anonymous_share: u64,
}

/// The deliveries a drop-oldest admission pushed out of the queue: how many, and the stored
/// `seq` of each one the store holds (their entries must be removed there too, or they would
/// come back at restart). Boxed, and only when something was pushed out: every admission on
/// the publish path returns one, and nearly all push nothing out, so they move and drop one
/// null pointer instead of two inline vectors (issue 36: the fan-out cost of layers that are
/// not in use).
#[derive(Debug, Default)]
pub(crate) struct Victims {
    pushed_out: Option<Box<PushedOut>>,
    /// This admission found a connected session stalled that was not yet counted as stalled
    /// (counted as `session_stalls`, and in the stalled gauge until it makes progress).
    pub stall_began: bool,
}

/// What [`Victims`] holds once a delivery was pushed out.
#[derive(Debug, Default)]
struct PushedOut {
    /// Deliveries dropped, by their QoS (counted as `messages_dropped_queue_full`).
    dropped: [u64; 3],
    /// Stored queue positions among them.
    stored: SmallVec<[u64; 1]>,
    /// The messages pushed out, for their dead letters (`queue_full`): inline for the
    /// usual one, so steady drop-oldest overflow allocates only the box.
    messages: SmallVec<[std::sync::Arc<super::Message>; 1]>,
}

impl Victims {
    /// Records `old` as pushed out of the queue.
    fn push(&mut self, old: Delivery) {
        let out = self.pushed_out.get_or_insert_with(Box::default);
        out.dropped[old.qos as usize] += 1;
        out.stored.extend(old.seq);
        out.messages.push(old.message);
    }

    /// Deliveries pushed out, by their QoS.
    pub(crate) fn dropped(&self) -> [u64; 3] {
        self.pushed_out.as_ref().map_or([0; 3], |out| out.dropped)
    }

    /// The stored queue positions of those pushed out (to remove from the store).
    pub(crate) fn stored(&self) -> &[u64] {
        self.pushed_out.as_ref().map_or(&[], |out| &out.stored)
    }

    /// Whether no message was pushed out (or they were taken already).
    pub(crate) fn no_messages(&self) -> bool {
        self.pushed_out
            .as_ref()
            .is_none_or(|out| out.messages.is_empty())
    }

    /// Takes the messages pushed out, for their dead letters.
    pub(crate) fn take_messages(&mut self) -> SmallVec<[std::sync::Arc<super::Message>; 1]> {
        self.pushed_out
            .as_mut()
            .map(|out| std::mem::take(&mut out.messages))
            .unwrap_or_default()
    }
}

/// Result of [`Session::admit`]: pushed now, reserved for a stored push, or refused.
#[derive(Debug)]
pub(crate) enum Admission {
    /// In the queue already; only the victims' removals are left to persist.
    Pushed(EnqueueOutcome, Victims),
    /// Admitted with a stored `seq` but not yet visible to the connection: the caller submits
    /// the `Enqueue` op first, then calls [`Session::push_reserved`], so the subscriber's ack
    /// (a `RemoveEntry`) can never reach the log before the entry itself.
    Reserved {
        /// The delivery, held back until its `Enqueue` op is submitted.
        delivery: Delivery,
        /// What admitting it did to the queue.
        outcome: EnqueueOutcome,
        /// Deliveries dropped to make room (drop-oldest policy).
        victims: Victims,
    },
    /// Not queued; the victims are those a drop-oldest admission pushed out before it found
    /// the new one could not come in either, and `stall_began`.
    Refused(EnqueueOutcome, Victims),
}

/// What happened to a delivery handed to [`Session::enqueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EnqueueOutcome {
    /// Appended to the queue.
    Queued,
    /// Appended beyond the queue's bound, to a connected session that is taking messages:
    /// the publisher pauses until it has room (`broker::flow`).
    QueuedOverBound,
    /// Queued, and an older message was dropped to make room (drop-oldest policy).
    QueuedDroppedOldest,
    /// The queue was full and the new message was dropped (drop-new policy).
    DroppedQueueFull,
    /// QoS 0 to an offline session, and QoS 0 queueing is off.
    DroppedQoS0Offline,
    /// The session has ended; nothing is queued any more.
    SessionEnded,
}

/// Everything about a session that is guarded by its mutex.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub(in crate::broker) protocol: ProtocolVersion,
    /// Seconds the session outlives its connection; 0 = ends with it.
    pub(in crate::broker) expiry_interval: u32,
    /// Deliveries not yet written to the client, oldest first.
    pub(in crate::broker) queue: VecDeque<Delivery>,
    queued_bytes: usize,
    /// Sent QoS 1/2 messages awaiting acknowledgement, in send order.
    pub(in crate::broker) inflight: InflightWindow,
    next_packet_id: u16,
    /// Inbound QoS 2 packet ids acknowledged with PUBREC but not yet released (exactly-once).
    pub(in crate::broker) inbound_qos2: inbound::InboundIds,
    /// Counted against the memory budget (see `subscription_map`).
    pub(in crate::broker) subscriptions: subscription_map::SubscriptionMap,
    pub(in crate::broker) connection: Option<ConnectionSlot>,
    /// Bumped on every attach; a connection only detaches if it still owns the session.
    pub(in crate::broker) generation: u64,
    pub(in crate::broker) disconnected_at: Option<Instant>,
    /// Set when the session is discarded; enqueues are refused from then on.
    pub(in crate::broker) ended: bool,
    /// Next stored queue position (`Op::Enqueue` seq); restored as last seq + 1.
    pub(in crate::broker) next_seq: u64,
    /// True while the durable store holds this session (a `PutSession` was submitted and no
    /// `DeleteSession` since), so ops are only emitted for sessions the store knows.
    pub(in crate::broker) stored: bool,
    /// A will waiting for its delay; cancelled by a new connection for this client id. Boxed:
    /// rare, and 240 B inline in every session.
    pub(in crate::broker) pending_will: Option<Box<PendingWill>>,
    /// True from the first overflow drop until the queue drains, so overflow is logged once
    /// per episode rather than once per message.
    overflowing: bool,
    /// True from a delivery queued over the bound (its publisher paused) until the queue has
    /// drained to half of it, when paused publishers are woken (`broker::flow`).
    pub(in crate::broker) pressured: bool,
    /// When the session last made progress, in [`super::Broker::clock_ms`] milliseconds: its
    /// driver took a delivery off the queue, a connection attached, or work arrived for an
    /// idle session. A full queue with no progress for `stalled_after_ms` is stalled.
    pub(in crate::broker) progress_at_ms: u64,
    /// Counted as stalled (`flow::count_stalled`): set when its overflow first goes to the
    /// policy while connected, cleared by progress, detach or end.
    stalled: bool,
    /// An operator disconnected the attached connection or discarded the session
    /// (`Broker::kick`, `Broker::discard_session`): its connection closes with 0x98 when it
    /// wakes. Cleared by the next attach.
    pub(in crate::broker) kicked: bool,
    /// The connection attached now said it is a bridge (a 3.x CONNECT with Mosquitto's
    /// bridge flag, `codec::Connect::bridge`): its subscriptions get No Local and Retain As
    /// Published, as Mosquitto gives them. Here, in the padding of the state's small fields,
    /// not in the connection's state, which is at its size bound. Cleared by every attach.
    pub(in crate::broker) bridge: bool,
    /// Whose session it is (issue 35): only that identity resumes it (`broker::owner`).
    pub(in crate::broker) owner: crate::storage::SessionOwner,
    /// The ACL generation under which everything queued is known to be readable by the
    /// identity in force ([`Authz::generation`](crate::broker::Authz::generation)); anything
    /// else (`UNCHECKED` for a restored or re-identified session) and each delivery is checked
    /// again as it is handed out, until the queue has been drained once (issue 35, finding 3).
    pub(in crate::broker) acl_checked: u32,
    /// Where the session's own cost counts now (`flow::SessionCost`): moved by
    /// [`SessionState::recount_cost`] when its owner or its expiry changes.
    cost: super::flow::SessionCost,
    /// The Maximum Packet Size its client announced at its last CONNECT (MQTT 5
    /// §3.1.2.11.4; 0: none), which no PUBLISH to it may exceed (MQTT-3.1.2-24): what a
    /// shared group asks before it picks this member (`would_keep`; issue 35, fourteenth
    /// adversarial pass, A2). Kept while offline: the client reconnects the way it connected.
    pub(in crate::broker) client_max_packet: u32,
}

impl SessionState {
    /// Binds the session of `client_id` to `owner` ([`SessionState::owner`]); an anonymous
    /// session, and its filters, count in the anonymous sessions' share of the memory budget
    /// (`flow::ANONYMOUS_SHARE`, issue 35 sixth pass: one address pinned unbounded sessions
    /// of 64 KB ids, counted nowhere). Uncounted when the owner changes or the session is
    /// dropped (`Drop for Session`).
    pub(in crate::broker) fn set_owner(
        &mut self,
        client_id: &str,
        owner: crate::storage::SessionOwner,
    ) {
        let anonymous = owner == crate::storage::SessionOwner::Anonymous;
        if anonymous != self.is_anonymous() {
            self.subscriptions.owner_changed(anonymous);
            super::flow::anonymous_queued_counted(self.queued_bytes, anonymous);
            super::flow::anonymous_queued_counted(self.inflight.bytes(), anonymous);
        }
        self.owner = owner;
        self.recount_cost(client_id);
    }

    /// Counts the session's own cost where its owner and expiry now say
    /// (`flow::SessionCost`): an anonymous session that ends with its connection out of the
    /// budget (issue 35, twelfth adversarial pass, U2). Call after either changes.
    pub(in crate::broker) fn recount_cost(&mut self, client_id: &str) {
        let to = super::flow::SessionCost::of(self.is_anonymous(), self.expiry_interval);
        self.cost = self.cost.moved(to, client_id.len());
    }

    /// Whether the session is anonymous where a method tells identities apart.
    pub(in crate::broker) fn is_anonymous(&self) -> bool {
        self.owner == crate::storage::SessionOwner::Anonymous
    }

    /// Records `filter` in the session (counted in the memory budget, see
    /// `subscription_map`); the record it replaces, if any.
    pub(in crate::broker) fn add_subscription(
        &mut self,
        filter: ByteString,
        record: SessionSubscription,
    ) -> Option<SessionSubscription> {
        let anonymous = self.is_anonymous();
        self.subscriptions.insert(filter, record, anonymous)
    }

    /// Forgets `filter` (uncounted); its record, if it was held.
    pub(in crate::broker) fn remove_subscription(
        &mut self,
        filter: &str,
    ) -> Option<SessionSubscription> {
        let anonymous = self.is_anonymous();
        self.subscriptions.remove(filter, anonymous)
    }

    /// Takes every subscription out (uncounted).
    pub(in crate::broker) fn drain_subscriptions(
        &mut self,
    ) -> impl Iterator<Item = (ByteString, SessionSubscription)> + '_ {
        let anonymous = self.is_anonymous();
        self.subscriptions.drain(anonymous)
    }
}

impl Drop for SessionState {
    /// What the session still holds leaves the memory budget with it.
    fn drop(&mut self) {
        let anonymous = self.is_anonymous();
        self.subscriptions.uncount_all(anonymous);
        if anonymous {
            super::flow::anonymous_queued_counted(self.queued_bytes, false);
            super::flow::anonymous_queued_counted(self.inflight.bytes(), false);
        }
    }
}

impl Drop for Session {
    /// The session's cost leaves where it counts ([`Session::new`],
    /// [`SessionState::recount_cost`]).
    fn drop(&mut self) {
        let len = self.client_id.len();
        self.state.get_mut().cost.count(len, false);
    }
}

/// [`SessionState::acl_checked`] of a session whose queue no ACL generation has vouched for.
pub(in crate::broker) const UNCHECKED: u32 = u32::MAX;

impl Session {
    /// A fresh, empty session for `client_id`, counted in the memory budget until it is
    /// dropped (`flow::session_cost`: every session's, whoever owns it).
    pub fn new(
        id: SessionId,
        client_id: ByteString,
        protocol: ProtocolVersion,
        expiry_interval: u32,
    ) -> Session {
        super::flow::SessionCost::Budget.count(client_id.len(), true);
        Session {
            id,
            client_id,
            state: Mutex::new(SessionState {
                protocol,
                expiry_interval,
                queue: VecDeque::new(),
                queued_bytes: 0,
                inflight: InflightWindow::default(),
                next_packet_id: 0,
                inbound_qos2: inbound::InboundIds::default(),
                subscriptions: subscription_map::SubscriptionMap::default(),
                connection: None,
                generation: 0,
                disconnected_at: Some(Instant::now()),
                ended: false,
                next_seq: 0,
                stored: false,
                pending_will: None,
                overflowing: false,
                pressured: false,
                progress_at_ms: 0,
                stalled: false,
                kicked: false,
                bridge: false,
                owner: crate::storage::SessionOwner::Unbound,
                acl_checked: UNCHECKED,
                client_max_packet: 0,
                cost: super::flow::SessionCost::Budget,
            }),
            notify: Notify::new(),
            keep_alive_deadline_ms: AtomicU64::new(u64::MAX),
            identity: arc_swap::ArcSwapOption::empty(),
            share_key: AtomicU64::new(super::owner::share_key(
                &crate::storage::SessionOwner::Unbound,
                None,
            )),
        }
    }

    /// Whose shares this session spends (see [`Session::set_share_key`]).
    pub fn share_key(&self) -> u64 {
        self.share_key.load(Ordering::Relaxed)
    }

    /// Keys the session's shares by `owner` and its client's address `peer`
    /// (`broker::owner::share_key`; issue 35, pass 7b, P2 and P3: by identity, no longer
    /// by session or client id).
    pub(in crate::broker) fn set_share_key(
        &self,
        owner: &crate::storage::SessionOwner,
        peer: Option<std::net::IpAddr>,
    ) {
        self.share_key
            .store(super::owner::share_key(owner, peer), Ordering::Relaxed);
    }

    /// Records who is attached now: the identity ACL checks use (CONNECT user name, a
    /// certificate's, a token's with its claims, or the SCRAM user's).
    /// True when it differs from the one before (a resumed session with another user).
    pub fn set_principal(&self, principal: crate::auth::principal::Principal) -> bool {
        let anonymous = principal == crate::auth::principal::Principal::default();
        let old = self.identity.load();
        let same = match old.as_deref() {
            Some(old) => *old == principal,
            None => anonymous,
        };
        if !same {
            self.identity
                .store((!anonymous).then(|| std::sync::Arc::new(principal)));
        }
        !same
    }

    /// The identity in force (see [`Session::set_principal`]).
    pub fn principal(
        &self,
    ) -> arc_swap::Guard<Option<std::sync::Arc<crate::auth::principal::Principal>>> {
        self.identity.load()
    }

    /// May this session's client do `action` on `topic` under `acl` (if any) and its claims
    /// (if any)? No lock, no allocation.
    pub fn authorized(
        &self,
        acl: Option<&crate::auth::acl_slot::AclSlot>,
        action: crate::auth::acl::Action,
        topic: &str,
    ) -> bool {
        let identity = self.identity.load();
        identity
            .as_deref()
            .unwrap_or(&crate::auth::principal::ANONYMOUS)
            .allow(acl, &self.client_id, action, topic)
    }

    /// What a subscription to `filter` may receive, and the ACL generation decided under.
    pub fn filter_access(
        &self,
        acl: Option<&crate::auth::acl_slot::AclSlot>,
        filter: &str,
    ) -> (crate::auth::acl::FilterAccess, u32) {
        let identity = self.identity.load();
        identity
            .as_deref()
            .unwrap_or(&crate::auth::principal::ANONYMOUS)
            .filter_access(acl, &self.client_id, filter)
    }

    /// Locks the session state (broker internals only). Never hold the guard across an `.await`.
    pub(in crate::broker) fn lock(&self) -> MutexGuard<'_, SessionState> {
        self.state.lock()
    }

    /// A future that resolves on the next [`Session::wake`]. It counts wake-ups from the
    /// moment it is created, so the connection creates it *before* checking the session's state
    /// and then awaits it: a wake-up between the check and the await is not lost.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Records when the attached connection's keep-alive runs out (`u64::MAX`: never).
    pub fn set_keep_alive_deadline(&self, deadline_ms: u64) {
        self.keep_alive_deadline_ms
            .store(deadline_ms, Ordering::Relaxed);
    }

    /// True if the attached connection's keep-alive ran out by `now_ms` (per its last report).
    pub(in crate::broker) fn keep_alive_expired(&self, now_ms: u64) -> bool {
        self.keep_alive_deadline_ms.load(Ordering::Relaxed) <= now_ms
    }

    /// Applies the queue bounds to a delivery. With `persistence` on, a QoS 1/2 delivery to a
    /// persistent session gets a queue `seq` and is returned for the caller to persist and
    /// then [`push_reserved`](Self::push_reserved); anything else is pushed at once.
    ///
    /// A full queue of a connected session that is still taking messages (not stalled) takes
    /// the delivery anyway and says so ([`EnqueueOutcome::QueuedOverBound`]): its publisher
    /// pauses instead of the message being dropped after its PUBACK. Offline and stalled
    /// sessions get the overflow policy.
    pub(in crate::broker) fn admit(
        &self,
        mut delivery: Delivery,
        limits: &QueueLimits,
        persistence: bool,
        now_ms: u64,
    ) -> Admission {
        let mut st = self.state.lock();
        if st.ended {
            return Admission::Refused(EnqueueOutcome::SessionEnded, Victims::default());
        }
        let online = st.connection.is_some();
        if !online && delivery.qos == QoS::AtMostOnce && !limits.queue_qos0_offline {
            return Admission::Refused(EnqueueOutcome::DroppedQoS0Offline, Victims::default());
        }
        let size = delivery.message.size();
        // What it adds to the anonymous share: nothing when the message counts there for its
        // life already (a stranger's, fourteenth pass, A1), or a full share would refuse the
        // stranger's subscribers a message its publisher was just told fits.
        let share_size = if delivery.message.charged_anonymous() {
            0
        } else {
            size
        };
        let mut outcome = EnqueueOutcome::Queued;
        let mut victims = Victims::default();
        if st.is_full(limits, size)
            && online
            && (delivery.qos != QoS::AtMostOnce || limits.backpressure_qos0)
            && !st.is_stalled(now_ms, limits)
        {
            st.pressured = true;
            outcome = EnqueueOutcome::QueuedOverBound;
        }
        while outcome != EnqueueOutcome::QueuedOverBound
            && (st.is_full(limits, size) || st.over_anonymous_share(limits, share_size))
        {
            // Connected and eligible for back-pressure: full only because it stalled.
            if !st.stalled
                && online
                && st.is_full(limits, size)
                && (delivery.qos != QoS::AtMostOnce || limits.backpressure_qos0)
            {
                st.stalled = true;
                super::flow::count_stalled(true);
                victims.stall_began = true;
            }
            if !st.overflowing {
                st.overflowing = true;
                // Which bound: an anonymous session may be "full" with few messages queued,
                // because strangers together hold their share of the budget (eleventh pass:
                // `queued=15` called full left an operator guessing).
                let bound = if st.is_full(limits, size) {
                    "its queue bound"
                } else {
                    "the anonymous clients' share of mqtt.max_memory"
                };
                tracing::warn!(
                    client = %self.client_id,
                    queued = st.queue.len(),
                    policy = limits.overflow.as_str(),
                    online,
                    bound,
                    "session queue full (offline, stalled, or QoS 0 without back-pressure): dropping messages until it drains"
                );
            }
            match limits.overflow {
                // A client's QoS 1/2 message passed `Broker::refused_for_full_queue` just
                // before: this queue filled up since (another publisher raced it in). The
                // publisher will be told it was accepted, so it is kept: the overshoot is at
                // most one message per publisher racing.
                OverflowPolicy::Refuse
                    if delivery.qos != QoS::AtMostOnce && delivery.message.origin().is_some() =>
                {
                    break
                }
                OverflowPolicy::DropNew | OverflowPolicy::Refuse => {
                    return Admission::Refused(EnqueueOutcome::DroppedQueueFull, victims)
                }
                OverflowPolicy::DropOldest => match st.queue.pop_front() {
                    Some(old) => {
                        st.uncount_queued(old.message.size());
                        outcome = EnqueueOutcome::QueuedDroppedOldest;
                        victims.push(old);
                    }
                    // Nothing queued to drop, and the share is taken (by what is in flight
                    // or held elsewhere): this one does not come in.
                    None if st.over_anonymous_share(limits, share_size) => {
                        return Admission::Refused(EnqueueOutcome::DroppedQueueFull, victims)
                    }
                    None => break,
                },
            }
        }
        if persistence && st.expiry_interval > 0 && delivery.qos != QoS::AtMostOnce {
            delivery.seq = Some(st.next_seq);
            st.next_seq += 1;
            return Admission::Reserved {
                delivery,
                outcome,
                victims,
            };
        }
        st.push(delivery, now_ms);
        let wake = online && st.queue.len() == 1;
        drop(st);
        if wake {
            self.wake();
        }
        Admission::Pushed(outcome, victims)
    }

    /// Whether a delivery of `size` payload bytes would overflow this session's queue under
    /// its overflow policy now: full, and offline or stalled (a connected session that takes
    /// messages is queued over its bound and pauses the publisher instead). Read by the
    /// `refuse` policy before anything is queued for anyone.
    pub(in crate::broker) fn would_overflow(
        &self,
        size: usize,
        limits: &QueueLimits,
        now_ms: u64,
    ) -> bool {
        let st = self.state.lock();
        let online = st.connection.is_some();
        !st.ended
            && ((st.is_full(limits, size) && (!online || st.is_stalled(now_ms, limits)))
                || st.over_anonymous_share(limits, size))
    }

    /// Whether a QoS 1/2 delivery to this session is stored (it lives on, and persistence is
    /// on): the condition under which [`Session::admit`] reserves a delivery for the store.
    pub(in crate::broker) fn stores_deliveries(&self) -> bool {
        let st = self.state.lock();
        !st.ended && st.expiry_interval > 0
    }

    /// Makes a delivery visible to the connection, bypassing the queue bound: it was admitted
    /// already (a reserved delivery whose op is now submitted).
    pub(in crate::broker) fn push_reserved(&self, delivery: Delivery, now_ms: u64) {
        let mut st = self.state.lock();
        if st.ended {
            return;
        }
        st.push(delivery, now_ms);
        let wake = st.connection.is_some() && st.queue.len() == 1;
        drop(st);
        if wake {
            self.wake();
        }
    }

    /// Appends without the queue bound: for retained messages on subscribe, whose count is
    /// already bounded by the retained store and which must all arrive.
    pub(in crate::broker) fn enqueue_unbounded(&self, delivery: Delivery, now_ms: u64) {
        self.push_reserved(delivery, now_ms);
    }

    /// Attaches a new connection in place of the current one (session takeover). Returns the
    /// new generation and whether a connection was displaced; the caller then [`wake`]s the
    /// session so the displaced connection notices and closes.
    ///
    /// [`wake`]: Session::wake
    pub(in crate::broker) fn attach(st: &mut SessionState, now_ms: u64) -> (u64, bool) {
        let displaced = st.connection.take().is_some();
        // A resumed backlog is not a stall: the new connection has had no chance yet.
        st.made_progress(now_ms);
        st.generation += 1;
        st.connection =
            NonZeroU64::new(st.generation).map(|generation| ConnectionSlot { generation });
        st.disconnected_at = None;
        st.kicked = false;
        st.bridge = false;
        (st.generation, displaced)
    }

    /// Wakes the connection task(s) waiting on this session. During a takeover both the old
    /// and the new connection may wait, so all waiters are woken; each re-checks its state.
    pub fn wake(&self) {
        self.notify.notify_waiters();
    }
}

impl SessionState {
    /// True if the session outlives its connection and so is kept in the durable store.
    pub(crate) fn is_persistent(&self) -> bool {
        self.expiry_interval > 0
    }

    /// True if any queued or in-flight delivery was made for a shared subscription.
    pub(crate) fn holds_shared(&self) -> bool {
        self.queue.iter().any(|d| d.shared.is_some())
            || self.inflight.iter().any(|f| f.delivery.shared.is_some())
    }

    /// True if the connection of `generation` still owns this session.
    pub(crate) fn is_owned_by(&self, generation: u64) -> bool {
        self.connection
            .as_ref()
            .is_some_and(|c| c.generation.get() == generation)
    }
}
