//! The session API: the one way a driver — a client connection or an in-process link —
//! changes a session.
//!
//! A [`SessionHandle`] is a driver's claim on a session (returned by [`Broker::connect`]).
//! Its methods run the QoS state machine on the session's state, build the store ops each step
//! implies and submit them; what they return says what to send and which commit
//! ([`Durable`]) must complete before it is sent. The driver decodes, calls, waits for the
//! commit, and writes: it owns no QoS state and builds no store ops.
//!
//! A handle whose session was taken over by a newer connection finds out at its next
//! [`SessionHandle::fill`] (which reports the takeover, and then the driver closes); until
//! then its acks still apply (they are about messages it was sent), and a DISCONNECT's
//! expiry from it is ignored.
//!
//! Must not: encode packets.

use super::stranger_share::StrangerShare;
use std::sync::Arc;
use std::time::Instant;

use bytestring::ByteString;
use tokio::sync::futures::Notified;

mod subscriptions;

use super::session::outbound::{AckMismatch, OutboundAck, PubRecAnswer, Resend};
use super::session::{DeliverySink, Session};
use super::{Broker, Message, PublishRefused, SessionId};
use crate::codec::{LastWill, Publish, QoS, ReasonCode};
use crate::guarantees::DeadReason;
use crate::storage::Durable;

/// A driver's claim on a session: the broker, the session and the generation of this attach.
pub struct SessionHandle {
    broker: Arc<Broker>,
    session: Arc<Session>,
    generation: u64,
}

/// Which per-client subscription bound a filter would pass (`SessionHandle::subscription_fits`):
/// each is refused with 0x97 Quota exceeded (3.x 0x80), with its own Reason String.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionQuota {
    /// `mqtt.max_subscriptions_per_client`.
    Count,
    /// `mqtt.max_subscription_bytes_per_client`.
    Bytes,
}

/// What [`SessionHandle::fill`] did.
#[derive(Debug)]
pub enum Fill {
    /// Another connection owns the session now (MQTT-3.1.4-3): close.
    TakenOver,
    /// Deliveries were handed to the sink (possibly none).
    Filled {
        /// The commit that deliveries written with `after_commit` wait for.
        gate: Option<Durable>,
    },
}

/// What a resumed session sends again ([`SessionHandle::retransmit`]).
#[derive(Debug)]
pub struct Retransmit {
    /// Unacknowledged PUBLISHes (DUP=1) and PUBRELs, in their original order.
    pub resends: Vec<Resend>,
    /// Write `resends` only once this is durable: the stored delivery counts (and poison
    /// messages' removals). `None` when nothing was stored (`mqtt.max_deliveries` = 0).
    pub gate: Option<Durable>,
}

/// An acknowledgement to send, and the commit it must wait for.
#[derive(Debug)]
pub struct Answer {
    /// The reason code of the PUBACK / PUBREC (a publish), PUBREL or PUBCOMP (3.x acks carry
    /// none; the codec leaves it out).
    pub reason: ReasonCode,
    /// Send only once this is durable (`None`: at once, behind earlier gated writes).
    pub gate: Option<Durable>,
}

/// The answer to a PUBLISH from the client, and the session it must pause for, if any.
#[derive(Debug)]
pub struct Published {
    /// The PUBACK / PUBREC to send (nothing for QoS 0) and the commit it waits for.
    pub answer: Answer,
    /// A connected, draining session the message was queued to over its bound: the
    /// connection reads nothing more until [`SessionHandle::may_resume`] says so
    /// (`broker::flow`).
    pub pressure: Option<Arc<Session>>,
}

/// The session expiry of a session opened with 0 cannot be raised at DISCONNECT
/// (v5 §3.14.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpiryRaisedFromZero;

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("client_id", &self.session.client_id)
            .field("generation", &self.generation)
            .finish()
    }
}

impl SessionHandle {
    /// Publishes the dead letter of `message`, lost at this session (`reason`, and the
    /// reason code its client gave, if any), spending this session's share of the rate
    /// ([`Broker::dead_letter`]).
    fn dead_letter_here(&self, message: &Message, reason: DeadReason, code: Option<ReasonCode>) {
        self.broker.dead_letter(
            message,
            reason,
            Some(&self.session.client_id),
            self.session.share_key(),
            code,
        );
    }

    pub(super) fn new(broker: Arc<Broker>, session: Arc<Session>, generation: u64) -> Self {
        SessionHandle {
            broker,
            session,
            generation,
        }
    }

    /// The broker this session lives in.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// The session itself (its id, client id and wake-up).
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The generation of the connection this handle belongs to: whether it still holds the
    /// session (`SessionState::is_owned_by`).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The client id of the session.
    pub fn client_id(&self) -> &ByteString {
        &self.session.client_id
    }

    /// The session's id inside this process (No Local compares it).
    pub fn id(&self) -> SessionId {
        self.session.id
    }

    /// Resolves on the next wake-up of the session (see [`Session::notified`]).
    pub fn notified(&self) -> Notified<'_> {
        self.session.notified()
    }

    /// Records that the connection attached through this handle is a bridge (its CONNECT
    /// carried Mosquitto's bridge flag): see [`SessionHandle::is_bridge`]. Set by the
    /// handshake right after attach, before the connection reads anything else.
    pub fn set_bridge(&self, bridge: bool) {
        let mut st = self.session.lock();
        if st.is_owned_by(self.generation) {
            st.bridge = bridge;
        }
    }

    /// Whether the attached connection is a bridge (Mosquitto's `try_private`): its
    /// subscriptions then get No Local and Retain As Published, so a 3.x bridge is not sent
    /// its own messages back and RETAIN travels as published (what Mosquitto does).
    pub fn is_bridge(&self) -> bool {
        self.session.lock().bridge
    }

    /// True while this handle's connection still owns the session.
    /// An operator's disconnect (`Broker::kick`) ends ownership too.
    pub fn is_owner(&self) -> bool {
        let st = self.session.lock();
        st.is_owned_by(self.generation) && !st.kicked
    }

    // ----- messages to the client -----

    /// Hands queued deliveries to `sink` while it has room and at most `window` QoS 1/2
    /// messages are unacknowledged; records each one's new stage in the store.
    pub fn fill(&self, window: usize, now: Instant, sink: &mut dyn DeliverySink) -> Fill {
        let (filled, took, freed) = {
            let mut st = self.session.lock();
            // A kicked connection closes as a taken-over one does (it asks why:
            // `SessionHandle::was_kicked`).
            if !st.is_owned_by(self.generation) || st.kicked {
                return Fill::TakenOver;
            }
            let before = st.queue.len();
            let hold_qos2 = st.expiry_interval > 0 && self.broker.cluster().is_some();
            // Issue 35, finding 3: while the queue may hold deliveries routed under other
            // rules (an ACL reloaded since, a restored or re-identified session), each one is
            // checked again as it goes out; once the queue has drained under the rules in
            // force, nothing is (one compare per fill).
            let recheck = self
                .broker
                .authz()
                .map(|authz| (authz, authz.generation()))
                .filter(|(_, generation)| *generation != st.acl_checked);
            let filled = match recheck {
                None => st.fill(&self.session.client_id, window, now, hold_qos2, sink, None),
                Some((authz, generation)) => {
                    let may_read = |d: &super::Delivery| self.may_read(authz, d);
                    let client_id = &self.session.client_id;
                    let filled = st.fill(client_id, window, now, hold_qos2, sink, Some(&may_read));
                    if st.queue.is_empty() {
                        st.acl_checked = generation;
                    }
                    filled
                }
            };
            let took = st.queue.len() < before;
            let mut freed = false;
            if took {
                st.made_progress(self.broker.clock_ms(now));
                let limits = self.broker.queue_limits_of(&self.session.client_id);
                freed = st.drained_for_publishers(&limits);
            }
            (filled, took, freed)
        };
        if took {
            self.broker.flow().on_drained();
        }
        if freed {
            self.broker.flow().wake_paused();
        }
        for (qos, n) in filled.sent.into_iter().enumerate() {
            if n > 0 {
                self.broker.metrics.messages_sent[qos].increment(n);
            }
        }
        for (qos, n) in filled.expired.into_iter().enumerate() {
            if n > 0 {
                self.broker.metrics.messages_dropped_expired[qos].increment(n);
            }
        }
        self.count_denied(filled.denied);
        // Dead letters first: their submit lands before the removals in `ops` (one log, in
        // submit order), so a crash between the two cannot lose both.
        for (delivery, reason) in &filled.dead {
            self.dead_letter_here(&delivery.message, *reason, None);
        }
        if filled.gated {
            // A held QoS 2 PUBLISH waits for its stage: past the queue bound; clustered, for
            // the session's record too, so that a node taking the session over after this
            // one died sends it again under its packet id, not as a new message.
            return Fill::Filled {
                gate: Durable::both(
                    self.broker.persist_awaited(filled.ops),
                    self.cluster_record_barrier(),
                ),
            };
        }
        self.broker.persist(filled.ops);
        Fill::Filled { gate: None }
    }

    /// Drops every delivery still queued (not yet sent) and their stored entries; returns how
    /// many. For purging a backlog (operators, benchmarks).
    pub fn purge_queue(&self) -> usize {
        let mut ops = Vec::new();
        let mut purged = 0;
        {
            let mut st = self.session.lock();
            while let Some(delivery) = st.pop() {
                purged += 1;
                if let Some(seq) = delivery.seq {
                    ops.push(super::persist::remove_entry(&self.session.client_id, seq));
                }
            }
        }
        self.broker.persist(ops);
        purged
    }

    /// Everything unacknowledged, to send again on a resumed session (MQTT-4.4.0-1), for a
    /// driver that writes it at once (a link): [`SessionHandle::retransmit`] without its
    /// commit (the new delivery counts are submitted all the same).
    pub fn retransmissions(&self) -> Vec<Resend> {
        self.retransmit().resends
    }

    /// Everything unacknowledged, to send again on a resumed session (MQTT-4.4.0-1), and
    /// the commit to send it after. Each PUBLISH sent again counts one more delivery; with
    /// `mqtt.max_deliveries` set, one already sent that many times is a poison message: it
    /// leaves the in-flight window (the queue moves on), is dead-lettered (reason
    /// `max_deliveries`) and counted, and a WARN line names it. The counts are stored, and
    /// `gate` (their commit, after the removals and the dead letters) is what the resends
    /// wait for, so a crash cannot send one more time than stored. Unconfigured (0), nothing
    /// is stored and `gate` is `None`.
    pub fn retransmit(&self) -> Retransmit {
        let max_deliveries = self.max_deliveries();
        // Issue 35, finding 3: on a resume every PUBLISH in flight is checked again (the
        // rules or the identity may have changed while the client was away; resumes are
        // rare, so always).
        let authz = self.broker.authz();
        let may_read = authz.map(|authz| move |d: &super::Delivery| self.may_read(authz, d));
        let resent = self.session.lock().resend(
            &self.session.client_id,
            max_deliveries,
            may_read
                .as_ref()
                .map(|f| f as &dyn Fn(&super::Delivery) -> bool),
        );
        let mut denied = [0; 3];
        for delivery in &resent.denied {
            denied[delivery.qos as usize] += 1;
            self.dead_letter_here(&delivery.message, DeadReason::NotAuthorized, None);
        }
        self.count_denied(denied);
        // With the session unlocked: the dead letters are routed (and submitted) before the
        // removals in `ops`, so a crash between the two cannot lose both.
        for (delivery, deliveries) in &resent.poisoned {
            tracing::warn!(
                client_id = %self.session.client_id,
                topic = %delivery.message.topic,
                deliveries,
                qos = delivery.qos as u8,
                "poison message: sent max_deliveries times without acknowledgement, dead-lettered"
            );
            self.broker.metrics.messages_dropped_max_deliveries[delivery.qos as usize].increment(1);
            self.dead_letter_here(&delivery.message, DeadReason::MaxDeliveries, None);
        }
        if !resent.poisoned.is_empty() || !resent.denied.is_empty() {
            // Window slots were freed: a driver already waiting fills them from the queue
            // (a connection fills right after resending anyway).
            self.session.wake();
        }
        Retransmit {
            resends: resent.resends,
            gate: self.broker.persist_awaited(resent.ops),
        }
    }

    /// Whether the session's identity may read `delivery`'s topic under the rules in force.
    fn may_read(&self, authz: super::Authz<'_>, delivery: &super::Delivery) -> bool {
        self.session.authorized(
            authz.acl,
            crate::auth::acl::Action::Read,
            &delivery.message.topic,
        )
    }

    /// Counts deliveries dropped as no longer readable, by QoS (each also a refused read).
    fn count_denied(&self, denied: [u64; 3]) {
        for (qos, n) in denied.into_iter().enumerate() {
            if n > 0 {
                self.broker.metrics.messages_dropped_denied[qos].increment(n);
                let reads = &self.broker.metrics.authz_denied[0];
                reads.increment(n);
            }
        }
    }

    /// `mqtt.max_deliveries` for this session: 0 (unlimited) for a bridge's own session
    /// (`$bridge/<name>`). A remote broker that keeps failing is an outage, not a poison
    /// message: its messages wait for it, as the bridge's store-and-forward promises, rather
    /// than being dead-lettered after a few reconnects.
    fn max_deliveries(&self) -> u16 {
        if self
            .session
            .client_id
            .starts_with(crate::config::BRIDGE_SESSION_PREFIX)
        {
            0
        } else {
            self.broker.config().max_deliveries
        }
    }

    /// PUBACK from the client: the QoS 1 message is done (it was unacknowledged until now,
    /// MQTT-4.3.2-3). An unknown id is ignored. A v5 PUBACK with a reason code ≥ 0x80 means
    /// the subscriber refused the message (v5 §3.4.2.1): it is published as a dead letter
    /// (reason `rejected`, with the code), before its stored entry is removed.
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the id is a QoS 2 delivery's (MQTT-4.3.3-8 asks for PUBREC,
    /// MQTT-4.3.3-11 for PUBCOMP): a Protocol Error; the session is unchanged.
    pub fn on_puback(&self, packet_id: u16, reason: ReasonCode) -> Result<(), AckMismatch> {
        self.complete(packet_id, OutboundAck::PubAck, reason)
    }

    /// PUBCOMP from the client: the QoS 2 message is done and its id free (the PUBREL was
    /// unacknowledged until now, MQTT-4.3.3-5). An unknown id is ignored.
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the id is a QoS 1 delivery's, or a QoS 2 delivery's still waiting
    /// for PUBREC (no PUBREL was sent for it to answer, MQTT-4.3.3-11): a Protocol Error; the
    /// session is unchanged.
    pub fn on_pubcomp(&self, packet_id: u16) -> Result<(), AckMismatch> {
        self.complete(packet_id, OutboundAck::PubComp, ReasonCode::SUCCESS)
    }

    fn complete(
        &self,
        packet_id: u16,
        ack: OutboundAck,
        reason: ReasonCode,
    ) -> Result<(), AckMismatch> {
        let done = self.session.lock().finish(packet_id, ack)?;
        let Some(done) = done else {
            return Ok(());
        };
        if reason.is_error() {
            // Unlocked; before the removal below (one log, in submit order).
            self.dead_letter_here(&done.delivery.message, DeadReason::Rejected, Some(reason));
        }
        if let Some(seq) = done.delivery.seq {
            self.broker.persist(vec![super::persist::remove_entry(
                &self.session.client_id,
                seq,
            )]);
        }
        Ok(())
    }

    /// Lets go of the message in flight under `packet_id` that cannot be sent again: a
    /// retransmission larger than the resumed client's Maximum Packet Size (MQTT-3.1.2-25:
    /// discarded, and the session behaves as if it were sent and completed), or one a bridge
    /// can no longer forward. With `dead`, it is published as a dead letter first. An
    /// unknown or already released id is ignored.
    pub fn discard(&self, packet_id: u16, dead: Option<DeadReason>) {
        let done = self.session.lock().discard_unacknowledged(packet_id);
        let Some(done) = done else {
            return;
        };
        if let Some(reason) = dead {
            self.dead_letter_here(&done.delivery.message, reason, None);
        }
        if let Some(seq) = done.delivery.seq {
            self.broker.persist(vec![super::persist::remove_entry(
                &self.session.client_id,
                seq,
            )]);
        }
    }

    /// PUBREC from the client. `Ok(None)`: the receiver refused the message (reason ≥ 0x80),
    /// no PUBREL, and the message is published as a dead letter (reason `rejected`, with the
    /// code) before its stored entry is removed; otherwise the PUBREL to send (again, for a
    /// delivery already awaiting PUBCOMP; 0x92 for an unknown id) and the commit it waits for.
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the id is a QoS 1 delivery's (MQTT-4.3.2-4 asks for PUBACK): a
    /// Protocol Error; the session is unchanged.
    pub fn on_pubrec(
        &self,
        packet_id: u16,
        reason: ReasonCode,
    ) -> Result<Option<Answer>, AckMismatch> {
        let answer = {
            let mut st = self.session.lock();
            let answer = st.on_pubrec(&self.session.client_id, packet_id, reason.is_error())?;
            if let PubRecAnswer::Release {
                taken: Some(message),
                ..
            } = &answer
            {
                // Under the session's lock: a hand-over that releases the session after this
                // PUBREC finds the message noted (the cluster's note is a leaf lock).
                if let Some(cluster) = self.broker.cluster() {
                    cluster.taken(&self.session.client_id, message);
                }
            }
            answer
        };
        Ok(match answer {
            PubRecAnswer::Refused { ops, message } => {
                if let Some(message) = message {
                    // Unlocked; before the removal in `ops` (one log, in submit order).
                    self.dead_letter_here(&message, DeadReason::Rejected, Some(reason));
                }
                self.broker.persist(ops);
                None
            }
            // Clustered, the PUBREL waits for the record too: once the client has it, it
            // forgets the packet id, so a next owner must not send the message again.
            PubRecAnswer::Release { reason, ops, .. } => Some(Answer {
                reason,
                gate: Durable::both(
                    self.broker.persist_awaited(ops),
                    self.cluster_record_barrier(),
                ),
            }),
        })
    }

    // ----- messages from the client -----

    /// Inbound QoS 2 messages awaiting PUBREL, the session's share of what Receive Maximum
    /// counts (the connection adds its QoS 1 PUBLISHes not yet acknowledged); `None` for a
    /// QoS 2 re-send of an id awaiting PUBREL (not a new PUBLISH).
    pub fn unreleased_inbound(&self, qos: QoS, packet_id: u16) -> Option<usize> {
        self.session.lock().unreleased(qos, packet_id)
    }

    /// Routes a PUBLISH from this session's client. A QoS 2 re-send of an id awaiting PUBREL
    /// is not routed again (MQTT-4.3.3-10) but answered like the first. `Ok` carries the
    /// PUBACK / PUBREC's reason code and the commit it must wait for; `Err`: the store refused
    /// the message, which must not be acknowledged as accepted (its QoS 2 id is forgotten,
    /// MQTT-4.3.3-9).
    ///
    /// The reason is 0x10 No matching subscribers when the message matched no subscription
    /// (none at all, shared ones included, after No Local): the publisher learns nobody got
    /// it (v5 §3.4.2.1, as Mosquitto does). That includes a retained message, which is still
    /// stored for later subscribers; 0x10 says only that no subscriber matched now, and is a
    /// success code. A QoS 2 re-send is answered 0x00: it is not routed again, so whether
    /// anyone matched is no longer known (0x00 is always allowed). Otherwise 0x00.
    ///
    /// # Errors
    ///
    /// Why the message was refused (the store, or a full queue under `queue_overflow =
    /// "refuse"`); nothing may be acknowledged.
    pub fn publish(&self, publish: Publish) -> Result<Published, PublishRefused> {
        // One atomic load: the share key carries the owner's anonymous mark.
        let anonymous = super::owner::is_anonymous_key(self.session.share_key());
        self.publish_charged(publish, anonymous.then_some(StrangerShare::ANONYMOUS))
    }

    /// [`SessionHandle::publish`] for a message whose publisher this broker did not verify
    /// though the session's owner is not anonymous: what a bridge takes from its remote
    /// (issue 35, sixteenth adversarial pass, C2). It is charged to the anonymous share for
    /// as long as it is held, as an anonymous client's, and marked so in the store and on
    /// the cluster. It counts in `share` (each bridge's remote has its own: seventeenth
    /// pass, D5). The caller checks the share has room first, as a connection does.
    ///
    /// # Errors
    ///
    /// As [`SessionHandle::publish`].
    pub fn publish_as_stranger(
        &self,
        publish: Publish,
        share: StrangerShare,
    ) -> Result<Published, PublishRefused> {
        self.publish_charged(publish, Some(share))
    }

    /// Publishes `publish`, a stranger's charged to `stranger` (`None`: a verified
    /// publisher's).
    fn publish_charged(
        &self,
        publish: Publish,
        stranger: Option<StrangerShare>,
    ) -> Result<Published, PublishRefused> {
        let (qos, packet_id) = (publish.qos, publish.packet_id);
        let receipt = self.session.lock().receive(qos, packet_id);
        if !receipt.fresh {
            // A re-send of a stored id: its first PUBREC may still wait (on an earlier
            // connection) for the commit that holds the message; this one waits for it too.
            return Ok(Published {
                answer: Answer {
                    reason: ReasonCode::SUCCESS,
                    gate: if receipt.store_id {
                        self.broker.barrier()
                    } else {
                        None
                    },
                },
                pressure: None,
            });
        }
        // Clustered: refused before anyone gets it if the cluster cannot hold it now.
        // Held until the message is routed here and handed to the cluster.
        let identity = self.session.share_key();
        let admission = match self.broker.cluster_admit(&publish, stranger, identity) {
            Ok(admission) => admission,
            Err(refused) => {
                if qos == QoS::ExactlyOnce {
                    self.session.lock().forget_inbound(packet_id);
                }
                return Err(refused);
            }
        };
        let local_id = admission.as_ref().map(|a| a.local_id);
        let mut message = Message::from_publish(publish, Some(self.session.id));
        // A stranger's message counts in the anonymous share for as long as it is held
        // anywhere, in a verified user's queue too: counted in the budget alone, 200 of them
        // queued at an offline user's session took it past 100%, and every password user's
        // QoS 1 PUBLISH got 0x97 (issue 35, fourteenth adversarial pass, A1). The connection
        // refused it before it came here if the share had no room
        // (`connection::client::inbound`).
        // Its store record and cluster frame say so, so a restart or another node charges
        // it again.
        if let Some(whose) = stranger {
            message.set_published_by_stranger(whose);
        }
        let message = Arc::new(message);
        if admission.is_some() && qos != QoS::AtMostOnce {
            // Its stream sequence comes with JetStream's acknowledgement; until then a
            // record cannot list a QoS 2 delivery of it (`cluster_record_barrier` waits).
            message.await_cluster_seq();
        }
        let inbound = receipt
            .store_id
            .then_some((&self.session.client_id, packet_id));
        // Schema and dedup: once per PUBLISH, before fan-out (`crate::guarantees`).
        let routed = self
            .broker
            .gate_publish(&message, self.session.share_key())
            .and_then(|gate| match gate {
                super::Gate::Route { dedup } => self
                    .broker
                    .publish_with(Arc::clone(&message), inbound, dedup.map(|op| *op))
                    .inspect_err(|_| self.broker.forget_dedup(&message))
                    .map(|routed| {
                        // Clustered, subscribers on other nodes are not known here.
                        let reason = if routed.matched == 0 && self.broker.cluster().is_none() {
                            ReasonCode::NO_MATCHING_SUBSCRIBERS
                        } else {
                            ReasonCode::SUCCESS
                        };
                        let durable =
                            self.broker
                                .cluster_forward(&message, local_id, routed.durable);
                        (reason, durable, routed.pressure)
                    }),
                // Its first copy's commit may still be on its way: the ack waits for it too.
                super::Gate::Duplicate => {
                    tracing::debug!(
                        topic = %message.topic,
                        key = self.broker.dedup_key_of(&message),
                        client = %self.session.client_id,
                        "duplicate PUBLISH acknowledged, not routed ([dedup])"
                    );
                    Ok((ReasonCode::SUCCESS, self.broker.dedup_barrier(), None))
                }
                super::Gate::DeadLettered { gate } => Ok((ReasonCode::SUCCESS, gate, None)),
            });
        drop(admission);
        match routed {
            Ok((reason, gate, pressure)) => Ok(Published {
                answer: Answer { reason, gate },
                pressure,
            }),
            Err(error) => {
                if qos == QoS::ExactlyOnce {
                    self.session.lock().forget_inbound(packet_id);
                }
                Err(error)
            }
        }
    }

    /// Whether a connection paused for `target` (a [`Published::pressure`]) may read again:
    /// the target drained to half its bounds, stalled, went offline or ended. Otherwise, the
    /// broker clock millisecond at which the target counts as stalled, to wake up for.
    ///
    /// # Errors
    ///
    /// Not yet: the deadline (broker clock ms) at which to look again without a wake-up.
    pub fn may_resume(&self, target: &Session, now: Instant) -> Result<(), u64> {
        let now_ms = self.broker.clock_ms(now);
        let limits = self.broker.queue_limits_of(&target.client_id);
        let mut st = target.lock();
        if st.lets_publishers_go(now_ms, &limits) {
            return Ok(());
        }
        // Still waiting: the next drain to half must wake it, even if another publisher's
        // resume took the last episode's mark away.
        st.pressured = true;
        Err(st.progress_at_ms.saturating_add(limits.stalled_after_ms))
    }

    /// PUBREL from the client: the PUBCOMP to send (0x92 for an unknown id) and the commit it
    /// waits for (MQTT-4.3.3-11).
    pub fn on_pubrel(&self, packet_id: u16) -> Answer {
        let (reason, op) = self
            .session
            .lock()
            .release(&self.session.client_id, packet_id);
        Answer {
            reason,
            gate: op.and_then(|op| self.broker.persist_awaited(vec![op])),
        }
    }

    /// Clustered, for a persistent session: a commit that completes once the session's
    /// record in the cluster holds its state as of this call, so what a SUBACK, UNSUBACK,
    /// QoS 2 PUBLISH or PUBREL promises survives this node dying (the next owner resumes
    /// from the record). `None` on one node, for a session that ends with its connection,
    /// and for one whose record this node does not keep.
    pub(crate) fn cluster_record_barrier(&self) -> Option<Durable> {
        if self.session.lock().expiry_interval == 0 {
            return None;
        }
        self.broker
            .cluster()?
            .record_barrier(&self.session.client_id)
    }

    // ----- the end of a connection -----

    /// Sets the session expiry sent in DISCONNECT, capped by the broker's maximum.
    ///
    /// # Errors
    ///
    /// `ExpiryRaisedFromZero` when the session's expiry was 0 and `expiry` is not: a protocol
    /// error (v5 §3.14.2.2.2).
    pub fn set_expiry_at_disconnect(&self, expiry: u32) -> Result<(), ExpiryRaisedFromZero> {
        let mut st = self.session.lock();
        if !st.is_owned_by(self.generation) {
            return Ok(()); // taken over: the new connection's expiry stands
        }
        if st.expiry_interval == 0 && expiry != 0 {
            return Err(ExpiryRaisedFromZero); // v5 §3.14.2.2.2
        }
        st.expiry_interval = expiry.min(self.broker.config().session_expiry_interval_max);
        st.recount_cost(&self.session.client_id);
        Ok(())
    }

    /// Publishes the will of an abnormally closed connection now, or keeps it for its Will
    /// Delay Interval (`delay` seconds, MQTT-3.1.2-8). Call before [`SessionHandle::detach`].
    pub fn publish_will(&self, will: LastWill, delay: Option<u32>) {
        match delay.filter(|d| *d > 0) {
            Some(delay) => self
                .broker
                .defer_will(&self.session, self.generation, will, delay),
            None => self.broker.publish_will(&self.session, will),
        }
    }

    /// Records this connection's facts for operators (`broker::admin`); once per attach, by
    /// the handshake. Also keys the session's shares (dedup window, dead-letter rate) by its owner, or,
    /// when nobody was verified, by this address (`broker::owner::share_key`).
    pub fn record_connection(&self, facts: super::admin::ConnectionFacts) {
        {
            let st = self.session.lock();
            self.session.set_share_key(&st.owner, Some(facts.peer.ip()));
        }
        self.broker
            .connection_facts
            .insert(&self.session.client_id, self.generation, facts);
    }

    /// True when an operator disconnected this connection or discarded its session
    /// (`Broker::kick`, `Broker::discard_session`): it closes with 0x98.
    pub fn was_kicked(&self) -> bool {
        self.session.lock().kicked
    }

    /// Detaches this driver; the session then ends, waits for its expiry, or lives on.
    pub fn detach(&self) {
        self.broker
            .forget_connection(&self.session.client_id, self.generation);
        self.broker.disconnect(&self.session, self.generation);
    }
}
