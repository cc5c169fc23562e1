//! The cluster seam (`../shared/ARCHITECTURE.md`): what the broker asks of the layer that
//! makes several nodes one broker (the `cluster` module, NATS JetStream, which implements it). The broker is built
//! with it ([`super::Parts`]) when `[cluster]` is configured; without (one node), every hook
//! below is one check of an empty `Option`.
//!
//! Must not: do I/O; know NATS.

use super::stranger_share::StrangerShare;
use std::sync::Arc;

use super::{Broker, Message, PublishRefused, SessionId};
use crate::codec::QoS;
use crate::storage::Durable;

/// A boxed future, for the seam's async calls (made once per CONNECT, not per message).
pub(crate) type SeamFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What a cluster-wide claim of a session found: the state to restore when the session
/// lived on another node (or this node lost it).
#[derive(Debug, Clone, Default)]
pub struct Claimed {
    /// The subscriptions to restore and where the replay of its messages starts, when the
    /// client resumes a session this node does not hold.
    pub restore: Option<Restore>,
    /// The revision of the record this claim wrote, for [`ClusterSeam::confirm`].
    pub revision: u64,
}

/// A session to rebuild here: its subscriptions, and the stream sequence from which every
/// message it has not acknowledged can be found.
#[derive(Debug, Clone, Default)]
pub struct Restore {
    /// Filter, options, identifier.
    pub subscriptions: Vec<(
        bytestring::ByteString,
        crate::codec::SubscriptionOptions,
        Option<u32>,
    )>,
    /// First stream sequence to replay.
    pub cursor: u64,
    /// QoS 2 deliveries the session had in flight: packet id and stream sequence (0: its
    /// PUBREL was sent, the PUBCOMP had not come). Sent again with the same packet ids, so
    /// the client receives each message once across the move (MQTT-4.3.3, MQTT-4.4.0-1).
    pub qos2: Vec<(u16, u64)>,
    /// Stream sequences at or above `cursor` of QoS 2 messages the client has taken already
    /// (`cluster::taken`), ascending: left out of the replay and of the consumer's routing
    /// to this session (MQTT-4.3.3: delivered once).
    pub taken: Vec<u64>,
    /// The packet ids among `qos2` of shared groups' deliveries ([`HeldSession::qos2_shared`]).
    pub qos2_shared: Vec<u16>,
}

/// A PUBLISH admitted by [`ClusterSeam::admit`]: its local id, and (QoS 1/2) a hold on the
/// node's publish fence until it has been routed here and handed to the cluster. A session
/// being restored here takes the fence whole while it subscribes, so each of this node's own
/// messages was either routed before (and is replayed) or is routed after (and delivered
/// live): never both (a QoS 2 duplicate), never neither (a loss).
#[derive(Debug)]
pub struct ClusterAdmission<'a> {
    /// This node's order of admission ([`ClusterSeam::forward`]).
    pub local_id: u64,
    _fence: Option<parking_lot::RwLockReadGuard<'a, ()>>,
}

impl<'a> ClusterAdmission<'a> {
    /// An admission holding `fence` (if any) until dropped.
    pub fn new(local_id: u64, fence: Option<parking_lot::RwLockReadGuard<'a, ()>>) -> Self {
        ClusterAdmission {
            local_id,
            _fence: fence,
        }
    }
}

/// What a CONNECT asks of [`ClusterSeam::claim`]: one value, so the trait, its engine and
/// the handshake name the claim's parts once.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The client id whose session is claimed.
    pub client_id: &'a str,
    /// The CONNECT's Clean Start (3.x: Clean Session).
    pub clean_start: bool,
    /// The session's expiry interval, seconds.
    pub expiry_interval: u32,
    /// The CONNECT's will, kept in the session's record.
    pub will: Option<&'a crate::codec::LastWill>,
    /// Whose session it is (`broker::owner`, issue 35).
    pub owner: &'a crate::storage::SessionOwner,
}

/// Why a CONNECT could not claim its session cluster-wide.
#[derive(Debug, thiserror::Error)]
pub enum ClaimRefused {
    /// The engine cannot take the claim now (CONNACK 0x88 Server unavailable).
    #[error("the cluster cannot claim the session: {0}")]
    Unavailable(String),
    /// The session belongs to another identity (issue 35; CONNACK 0x87 Not authorized): its
    /// owner's connection, wherever it is, stays.
    #[error("the session belongs to another identity")]
    NotOwner,
}

/// An unauthenticated client's PUBLISH as [`ClusterSeam::admit`] weighs it: what it adds to
/// the engine, and how much strangers' messages may hold there from this node (issue 35,
/// sixteenth adversarial pass, C5: a message nobody subscribes to holds no memory, only the
/// engine's storage, which one stranger filled).
#[derive(Debug, Clone, Copy)]
pub struct StrangerPublish {
    /// Its bytes (topic, payload and properties).
    pub bytes: u64,
    /// Whose share it counts in: anonymous clients' or a bridge's remote's, each bounded
    /// apart (seventeenth adversarial pass, D5).
    pub whose: StrangerShare,
    /// The anonymous share of this node's memory budget: the bound of strangers' bytes in
    /// the engine within its retention, too, unless the engine's config says otherwise.
    pub share: u64,
    /// A retained message's clear (empty payload): the engine lets it past the share by a
    /// small allowance, so a share used up within the retention still lets its strangers
    /// clear what they retained (issue 35, eighteenth adversarial pass, E3).
    pub clear: bool,
}

/// Whose bytes a client's QoS 1/2 PUBLISH puts into the engine, each bounded apart there.
#[derive(Debug, Clone, Copy)]
pub enum StreamCharge {
    /// An unauthenticated client's, or a bridge's remote's.
    Stranger(StrangerPublish),
    /// A verified identity's (or, where nobody is verified, one source address's): its
    /// session's share key (`broker::owner::share_key`) and the message's bytes. One
    /// password user filled the engine alone, and every QoS 1/2 PUBLISH on every node was
    /// refused until its messages aged out (issue 35, seventeenth adversarial pass, D6).
    Identity {
        /// The share key.
        key: u64,
        /// Its bytes (topic, payload and properties).
        bytes: u64,
    },
}

/// The engine-backed half of the cluster, as the broker sees it.
pub trait ClusterSeam: Send + Sync + std::fmt::Debug {
    /// Before a client's PUBLISH is routed: whether this node can make it durable
    /// cluster-wide. A QoS 1/2 message is refused while the cluster link is down, its
    /// queue to the engine is full, the engine said it has no room, or the share of the
    /// engine `charge` names (strangers', or one identity's) is used up, before anyone got
    /// it (v5 0x97, 3.x disconnect). `Ok`
    /// carries the message's local id, handed back to [`ClusterSeam::forward`], and holds
    /// the publish fence: keep it until the message is routed and forwarded.
    ///
    /// # Errors
    ///
    /// Why the message cannot be taken now.
    fn admit(&self, qos: QoS, charge: StreamCharge)
        -> Result<ClusterAdmission<'_>, PublishRefused>;

    /// Charges a message the broker itself publishes for a client (a QoS 1/2 will) to the
    /// share of the engine `charge` names, as [`ClusterSeam::admit`] charges the client's
    /// PUBLISH; false (nothing charged) past it: the will is not published (issue 35,
    /// seventeenth adversarial pass, D2: 1,500 anonymous wills filled JetStream's store; D6:
    /// one user's many sessions would put their wills past its window).
    fn charge_will(&self, charge: StreamCharge) -> bool;

    /// The publish fence for a message the broker itself publishes (a will): held from
    /// before it is routed until it is forwarded, as [`ClusterAdmission`] holds it.
    fn fence(&self) -> parking_lot::RwLockReadGuard<'_, ()>;

    /// After local routing: hands the message to the other nodes, once (not per
    /// subscriber), with the local id [`ClusterSeam::admit`] gave it (`None`: take one now).
    /// For QoS 1/2, the commit its publisher's PUBACK / PUBREC must also wait for (the
    /// engine's acknowledgement); `None` for QoS 0.
    fn forward(&self, message: &Arc<Message>, local_id: Option<u64>) -> Option<Durable>;

    /// Before a CONNECT attaches: makes this node the session's owner cluster-wide (one
    /// winner under races), closing the client's connection on any other node, and brings
    /// back what the session held elsewhere; unless the session belongs to another identity
    /// than `owner` (`broker::owner`, issue 35). The CONNECT's will goes into the session's
    /// record, so another node can publish it if this one dies with the connection.
    fn claim<'a>(
        &'a self,
        broker: &'a Arc<Broker>,
        request: ClaimRequest<'a>,
    ) -> SeamFuture<'a, Result<Claimed, ClaimRefused>>;

    /// After the CONNECT attached its session (and restored it): if another node claimed the
    /// client id after this one did, gives the session up here at once (its connection then
    /// closes with 0x8E): of two racing CONNECTs, only the last claim's stays.
    fn confirm(&self, broker: &Arc<Broker>, client_id: &str, claimed: u64);

    /// A local session's subscriptions or connection changed: its record is brought up to
    /// date soon (not on this call's path).
    fn session_changed(&self, client_id: &str);

    /// The client of local session `client_id` acknowledged `message` (QoS 2, PUBREC), one
    /// the cluster's stream holds or will: the session's next node must not send it again
    /// (`cluster::taken`). Called under the session's lock; takes only a leaf lock.
    fn taken(&self, client_id: &str, message: &Arc<Message>);

    /// A commit that completes once the record of local session `client_id` has been
    /// written with what the session holds at this call (or found already so); `None` when
    /// this node keeps no record of it. A write to the client that the next owner must know
    /// of waits for it ([`crate::broker::SessionHandle::cluster_record_barrier`]).
    fn record_barrier(&self, client_id: &str) -> Option<Durable>;

    /// Shared group `key` got its first member on this node (before the SUBACK): the
    /// group's messages from now on are this node's to take, so its pulling starts from
    /// here, not from when the puller is started.
    fn shared_group_joined(&self, key: &str);

    /// A message of shared group `group` that a session ending here still held (queued, or
    /// a QoS 1 one sent and not acknowledged; a QoS 2 one already sent is dropped,
    /// MQTT-4.8.2-5), with no other member of the group on this node (or, for one the
    /// engine still holds, a disconnecting member's with no other member connected here):
    /// given back to the group cluster-wide, so a member on another node gets it (a group's
    /// message is redelivered to another member when its member's session ends). False
    /// when it cannot be (QoS 0 with no ticket, or the engine is unreachable or its queue
    /// full): the caller counts the drop.
    fn regroup(&self, group: &str, message: &Arc<Message>) -> bool;

    /// After the CONNECT attached a new local session: rebuilds it from `restore` (its
    /// subscriptions, then its messages replayed from the stream), before the CONNACK.
    /// Called whenever [`ClusterSeam::claim`] gave a `restore` (an empty one when the
    /// session was found here after all). All or nothing: false when the session could not
    /// be rebuilt whole; it is then discarded here (its record keeps what it held, for the
    /// next attempt) and the CONNECT is refused (0x88 Server unavailable) rather than
    /// answered with a session missing messages.
    fn restore<'a>(
        &'a self,
        broker: &'a Arc<Broker>,
        session: &'a Arc<super::Session>,
        generation: u64,
        restore: Restore,
    ) -> SeamFuture<'a, bool>;
}

impl Broker {
    /// The cluster layer, when `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Arc<dyn ClusterSeam>> {
        self.cluster.as_ref()
    }

    /// [`ClusterSeam::session_changed`] when clustered.
    pub(crate) fn cluster_session_changed(&self, client_id: &str) {
        if let Some(cluster) = self.cluster.as_ref() {
            cluster.session_changed(client_id);
        }
    }

    /// The view of the local session of `client_id`, if there is one.
    pub fn held_session(&self, client_id: &str) -> Option<HeldSession> {
        let session = self.sessions.lock().get(client_id).cloned()?;
        Some(Broker::view_of(&session))
    }

    /// Every (stream sequence, session) of the deliveries local sessions hold, queued or in
    /// flight, that came through the cluster's stream. Read once at start, before anyone
    /// connects: what the store brought back. The node's consumer may be offered those
    /// sequences again (routed and committed here, but the JetStream acknowledgement was
    /// lost to a crash) and must leave these sessions out (`cluster::ahead`).
    pub(crate) fn held_stream_seqs(&self) -> Vec<(u64, SessionId)> {
        let sessions: Vec<Arc<super::Session>> = self.sessions.lock().iter().cloned().collect();
        let mut held = Vec::new();
        for session in &sessions {
            let st = session.lock();
            let queued = st.queue.iter();
            let inflight = st.inflight.iter().map(|i| &i.delivery);
            held.extend(
                queued
                    .chain(inflight)
                    .filter_map(|d| d.message.cluster_seq())
                    .map(|seq| (seq, session.id)),
            );
        }
        held
    }

    /// The stream sequence of `message`, published here, came with JetStream's
    /// acknowledgement: stored with its body when the store holds it (issue 34), so a
    /// restart brings it back with its place in the stream. The commit to await before the
    /// publisher's acknowledgement; `None` when nothing of the message is stored.
    pub(crate) fn store_cluster_seq(&self, message: &Message) -> Option<Durable> {
        self.persist(vec![super::persist::sequence(message)?])
    }

    /// [`ClusterSeam::admit`] when clustered; `Ok(None)` otherwise. `publish` is charged to
    /// `stranger` (an unauthenticated client's, bounded in the engine by the anonymous
    /// share of this node's budget, [`super::flow::anonymous_share`]) or else to the
    /// identity of the share key `identity`.
    pub(crate) fn cluster_admit(
        &self,
        publish: &crate::codec::Publish,
        stranger: Option<StrangerShare>,
        identity: u64,
    ) -> Result<Option<ClusterAdmission<'_>>, PublishRefused> {
        match self.cluster.as_ref() {
            Some(cluster) => {
                // QoS 0 goes into no stream: nothing to weigh.
                let bytes = if publish.qos == QoS::AtMostOnce {
                    0
                } else {
                    publish.held_bytes()
                };
                let charge = match stranger {
                    Some(whose) => StreamCharge::Stranger(StrangerPublish {
                        clear: publish.retain && publish.payload.is_empty(),
                        ..self.stranger_publish(bytes, whose)
                    }),
                    None => StreamCharge::Identity {
                        key: identity,
                        bytes: bytes as u64,
                    },
                };
                cluster.admit(publish.qos, charge).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Whether a QoS 1/2 will of `bytes` may go to the cluster's engine, charged to
    /// anonymous clients' share (`identity` `None`) or to the identity of that share key
    /// ([`ClusterSeam::charge_will`]); true when not clustered.
    pub(crate) fn cluster_charge_will(&self, bytes: usize, identity: Option<u64>) -> bool {
        self.cluster.as_ref().is_none_or(|cluster| {
            cluster.charge_will(match identity {
                None => {
                    StreamCharge::Stranger(self.stranger_publish(bytes, StrangerShare::ANONYMOUS))
                }
                Some(key) => StreamCharge::Identity {
                    key,
                    bytes: bytes as u64,
                },
            })
        })
    }

    /// A stranger's message of `bytes` as the engine weighs it, against this node's
    /// anonymous share (one as large for each of `whose`).
    fn stranger_publish(&self, bytes: usize, whose: StrangerShare) -> StrangerPublish {
        StrangerPublish {
            bytes: bytes as u64,
            whose,
            share: super::flow::anonymous_share(&self.flow.memory),
            clear: false,
        }
    }

    /// [`ClusterSeam::fence`] when clustered.
    pub(crate) fn cluster_fence(&self) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        self.cluster.as_ref().map(|cluster| cluster.fence())
    }

    /// [`ClusterSeam::forward`] when clustered, joined with the local commit `local`: the
    /// publisher's acknowledgement waits for both.
    pub(crate) fn cluster_forward(
        &self,
        message: &Arc<Message>,
        local_id: Option<u64>,
        local: Option<Durable>,
    ) -> Option<Durable> {
        match self.cluster.as_ref() {
            Some(cluster) => Durable::both(local, cluster.forward(message, local_id)),
            None => local,
        }
    }
}

impl Broker {
    /// Makes `message` the retained message of its topic (an empty payload deletes it,
    /// MQTT-3.3.1-10) without routing it: the cluster's retained bucket changed on another
    /// node. Stored like a local retained message, so a restart without NATS still has it.
    /// An anonymous client's message (`from_anonymous`, carried by the cluster's frame)
    /// counts in the anonymous share here too; the echo of this node's own (`own`) replaces
    /// the copy counted at publish, so it is counted once (pass 7B, P6).
    ///
    /// Another node's anonymous message is kept only within the anonymous share *here*: its
    /// node bounded it by its own share, so a stranger on a large node put a small one at
    /// 98% of its budget and its verified clients got 0x97 (issue 35, seventeenth
    /// adversarial pass, D3). Past the share the topic keeps no retained message here (the
    /// older one is stale: the bucket holds the new one), counted as dropped for memory.
    ///
    /// Returns its store commit while the store's queue is past
    /// [`super::flow::STORE_BACKLOG_PAUSE`]: the caller (the bucket's watcher) awaits it
    /// before taking the next update, as a paused publisher would, rather than queue
    /// gigabytes of rewrites of one topic for the disk (issue 35, eighteenth pass, E0).
    #[must_use]
    pub fn apply_cluster_retained(&self, message: &Arc<Message>, own: bool) -> Option<Durable> {
        let deletion;
        let message = if own || self.cluster_retained_fits(message) {
            message
        } else {
            self.metrics.messages_dropped_memory[message.qos as usize].increment(1);
            tracing::debug!(topic = %message.topic, "cluster: another node's anonymous retained message not kept: anonymous clients are at their share of the memory budget here");
            deletion = Arc::new(Message::from_publish(
                crate::codec::Publish {
                    retain: true,
                    topic: message.topic.clone(),
                    ..crate::codec::Publish::default()
                },
                None,
            ));
            &deletion
        };
        let durable = if self.store.is_some() {
            self.persist(vec![super::persist::retained(message)])
        } else {
            None
        };
        self.store_retained(message);
        durable.filter(|_| crate::storage::backlog_bytes() >= super::flow::STORE_BACKLOG_PAUSE)
    }

    /// Whether `message` (another node's retained message, charged to the anonymous share
    /// as it was made when an anonymous client published it) fits that share here, once
    /// the topic's current entry, if an anonymous one, makes way for it.
    fn cluster_retained_fits(&self, message: &Message) -> bool {
        if !message.charged_anonymous() || message.payload.is_empty() {
            return true;
        }
        let freed = self
            .retained
            .read()
            .get(&message.topic)
            .filter(|old| {
                old.charged_anonymous() && old.stranger_share() == message.stranger_share()
            })
            .map_or(0, |old| old.size());
        let held = message
            .stranger_share()
            .bytes()
            .saturating_sub(freed as u64);
        held <= super::flow::anonymous_share(&self.flow.memory)
    }
}

/// What the cluster records of a local session (`pb_sessions`): enough for another node to
/// take it over.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldSession {
    /// The client id.
    pub client_id: bytestring::ByteString,
    /// Seconds it outlives its connection (0: ends with it).
    pub expiry_interval: u32,
    /// Its subscriptions: filter, options, identifier.
    pub subscriptions: Vec<(
        bytestring::ByteString,
        crate::codec::SubscriptionOptions,
        Option<u32>,
    )>,
    /// The lowest cluster stream sequence among the QoS 1/2 messages it holds (queued or in
    /// flight, not counting QoS 2 ones the client has received) whose sequence is known;
    /// `None` when it holds none. Shared groups' messages are left out: the replay of a
    /// moved session does not send them (a group's queued jobs go back to the group, its
    /// QoS 2 ones in flight are fetched by sequence, [`HeldSession::qos2`]), and a job from
    /// a group's backlog can be far older than anything else the session holds.
    pub lowest_pending_seq: Option<u64>,
    /// Its QoS 2 deliveries in flight: packet id and stream sequence, 0 once the client has
    /// the message (PUBREL sent). Deliveries of unknown sequence are left out.
    pub qos2: Vec<(u16, u64)>,
    /// A plain QoS 2 delivery awaiting PUBREC whose sequence is still to come (this node's
    /// own message, before JetStream acknowledged it, [`Message::awaits_cluster_seq`]):
    /// [`HeldSession::qos2`] cannot list it yet, so a record written now does not cover it.
    pub unsequenced_qos2: bool,
    /// It holds a QoS 1/2 message (queued, or in flight and not yet received by the client)
    /// whose stream sequence is unknown and will not come: one the store brought back at a
    /// restart without its sequence (stored before the store kept sequences, issue 34, or
    /// its `Op::SequenceMessage` lost with a crash before it was durable). [`HeldSession::lowest_pending_seq`]
    /// cannot count it, so the cursor must not pass the last one recorded.
    pub unsequenced_pending: bool,
    /// The packet ids among `qos2` (awaiting PUBREC) of shared groups' deliveries: the next
    /// owner sends those again as its group's, and its consumer's routing (plain
    /// subscriptions only) never brings them.
    pub qos2_shared: Vec<u16>,
    /// A connection holds it now.
    pub connected: bool,
    /// The will waiting for its delay after an abnormal close, and when it is due (unix ms).
    pub pending_will: Option<(crate::codec::LastWill, u64)>,
    /// Whose session it is (issue 35): carried in its record, so no node lets another
    /// identity resume it.
    pub owner: crate::storage::SessionOwner,
}

impl Broker {
    /// The view of one local session.
    fn view_of(session: &super::Session) -> HeldSession {
        let st = session.lock();
        // The QoS 1/2 messages it holds that a replay must find again: queued, or in flight
        // and not yet received by the client; shared groups' left out (see the fields).
        let pending = || {
            st.queue
                .iter()
                .filter(|d| d.qos != QoS::AtMostOnce && d.shared.is_none())
                .map(|d| &d.message)
                .chain(
                    st.inflight
                        .iter()
                        .filter(|i| {
                            i.stage != super::OutboundStage::AwaitPubComp
                                && i.delivery.shared.is_none()
                        })
                        .map(|i| &i.delivery.message),
                )
        };
        let lowest_pending_seq = pending().filter_map(|m| m.cluster_seq()).min();
        let qos2 = st
            .inflight
            .iter()
            .filter_map(|i| match i.stage {
                super::OutboundStage::AwaitPubComp => Some((i.packet_id, 0)),
                super::OutboundStage::AwaitPubRec => i
                    .delivery
                    .message
                    .cluster_seq()
                    .map(|seq| (i.packet_id, seq)),
                super::OutboundStage::AwaitPubAck => None,
            })
            .collect();
        let unsequenced_pending =
            pending().any(|m| m.cluster_seq().is_none() && !m.awaits_cluster_seq());
        let unsequenced_qos2 = st.inflight.iter().any(|i| {
            i.stage == super::OutboundStage::AwaitPubRec
                && i.delivery.shared.is_none()
                && i.delivery.message.awaits_cluster_seq()
        });
        let qos2_shared = st
            .inflight
            .iter()
            .filter(|i| i.stage == super::OutboundStage::AwaitPubRec && i.delivery.shared.is_some())
            .map(|i| i.packet_id)
            .collect();
        let mut subscriptions: Vec<_> = st
            .subscriptions
            .iter()
            .map(|(filter, sub)| (filter.clone(), sub.options, sub.identifier))
            .collect();
        subscriptions.sort_by(|a, b| a.0.cmp(&b.0));
        HeldSession {
            client_id: session.client_id.clone(),
            expiry_interval: st.expiry_interval,
            subscriptions,
            lowest_pending_seq,
            qos2,
            unsequenced_qos2,
            unsequenced_pending,
            qos2_shared,
            connected: st.connection.is_some(),
            pending_will: st
                .pending_will
                .as_ref()
                .map(|p| (p.will.clone(), p.publish_at_unix_ms)),
            owner: st.owner.clone(),
        }
    }

    /// Every local session (the cluster keeps records of them). One pass over the sessions
    /// map (`Arc`s copied out), then one session lock each.
    pub fn held_sessions(&self) -> Vec<HeldSession> {
        let sessions: Vec<Arc<super::Session>> = self.sessions.lock().iter().cloned().collect();
        sessions
            .iter()
            .filter(|s| !s.lock().ended)
            .map(|s| Broker::view_of(s))
            .collect()
    }

    /// Whether the connection of `generation` still holds `session` (a newer CONNECT of the
    /// client may have taken it meanwhile).
    pub fn is_held_by(&self, session: &super::Session, generation: u64) -> bool {
        session.lock().is_owned_by(generation)
    }

    /// Ends `session`, attached by a CONNECT whose cluster restore failed: the CONNECT is
    /// refused, so its will never took effect and nobody is told of a takeover; the session
    /// leaves no trace here (the cluster's record still holds what it had).
    pub fn discard_unrestored(&self, session: &Arc<super::Session>) {
        {
            let mut sessions = self.sessions.lock();
            if sessions
                .get(&session.client_id)
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                sessions.remove(&session.client_id);
                self.metrics.sessions_current.set(sessions.len() as f64);
            }
        }
        {
            let mut st = session.lock();
            if st.ended {
                return;
            }
            st.connection = None;
            st.pending_will = None;
            st.end_stall();
        }
        self.end_session(session);
    }

    /// A QoS 2 delivery the session had in flight on another node, restored with its packet
    /// id: `delivery` sent again (DUP) awaiting PUBREC, or, with none, a PUBREL sent again
    /// awaiting PUBCOMP. In memory only: the cluster's record keeps it until it completes.
    /// Not done if the packet id is in flight here already: the delivery is given back.
    #[must_use]
    pub fn restore_cluster_inflight(
        &self,
        session: &Arc<super::Session>,
        packet_id: u16,
        delivery: Option<super::Delivery>,
    ) -> Option<super::Delivery> {
        let mut st = session.lock();
        if packet_id == 0 || st.inflight.iter().any(|i| i.packet_id == packet_id) {
            return delivery;
        }
        let (delivery, stage) = match delivery {
            Some(delivery) => (delivery, super::OutboundStage::AwaitPubRec),
            None => (
                super::Delivery {
                    // Not sent again: a PUBREL carries no message.
                    message: Arc::new(Message::released_placeholder()),
                    qos: QoS::ExactlyOnce,
                    retain: false,
                    subscription_ids: smallvec::SmallVec::new(),
                    seq: None,
                    shared: None,
                },
                super::OutboundStage::AwaitPubComp,
            ),
        };
        let anonymous = st.is_anonymous();
        st.inflight.push_back(
            super::session::Inflight {
                packet_id,
                delivery,
                stage,
                deliveries: 1,
            },
            anonymous,
        );
        None
    }

    /// Whether `session` has the message of cluster stream sequence `seq` in flight under
    /// `packet_id` (a resumed session's QoS 2 delivery the replay already sent again with
    /// it; the id taken by another message does not count).
    pub fn has_inflight(&self, session: &super::Session, packet_id: u16, seq: u64) -> bool {
        session
            .lock()
            .inflight
            .iter()
            .any(|i| i.packet_id == packet_id && i.delivery.message.cluster_seq() == Some(seq))
    }

    /// Whether a session with this client id exists on this node.
    pub fn has_session(&self, client_id: &str) -> bool {
        self.sessions.lock().get(client_id).is_some()
    }

    /// Gives up the local session of `client_id` because another node took it over: its
    /// connection, if any, closes with v5 DISCONNECT 0x8E Session taken over (MQTT-3.1.4-3),
    /// its delayed will goes with it (the new owner's connection cancels it, MQTT-3.1.3-9),
    /// and it ends here without a trace in the store. Returns what it held, for the
    /// hand-over record; `None` if there was no such session.
    pub fn release_to_cluster(&self, client_id: &str) -> Option<HeldSession> {
        self.release_to_cluster_holding(client_id)
            .map(|(view, _)| view)
    }

    /// As [`Broker::release_to_cluster`], and also returns the shared groups' QoS 2
    /// messages the session had sent and not had received (awaiting PUBREC) that the next
    /// owner sends again (their sequence is in the view's `qos2`): they stay the member's
    /// (MQTT-4.8.2-4), and their settlement with the group (dropping the last handle) waits
    /// until the hand-over record that lists them is written. Those of unknown sequence,
    /// which the next owner cannot fetch, are given back to their group here.
    pub fn release_to_cluster_holding(
        &self,
        client_id: &str,
    ) -> Option<(HeldSession, Vec<Arc<Message>>)> {
        let session = {
            let mut sessions = self.sessions.lock();
            let session = sessions.get(client_id).cloned()?;
            sessions.remove(client_id);
            self.metrics.sessions_current.set(sessions.len() as f64);
            session
        };
        let view = Broker::view_of(&session);
        let mut held = Vec::new();
        let (displaced, had_will) = {
            let mut st = session.lock();
            for inflight in &st.inflight {
                let message = &inflight.delivery.message;
                if inflight.stage == super::OutboundStage::AwaitPubRec
                    && inflight.delivery.shared.is_some()
                    && message.awaits_settlement()
                {
                    if message.cluster_seq().is_some() {
                        held.push(Arc::clone(message));
                    } else {
                        let _ = message.give_back();
                    }
                }
            }
            let displaced = st.connection.take().is_some();
            st.disconnected_at = Some(std::time::Instant::now());
            st.end_stall();
            (displaced, st.pending_will.take().is_some())
        };
        if had_will {
            self.forget_stored_will(&session.client_id);
        }
        if displaced {
            self.took_over(&session);
        }
        self.end_session(&session);
        Some((view, held))
    }
}
