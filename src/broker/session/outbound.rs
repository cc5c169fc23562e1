//! Messages to the client: the outbound QoS 1/2 handshake (MQTT 4.3.2, 4.3.3) as session state.
//!
//! Deliveries leave the session queue in order through [`SessionState::fill`] into a
//! [`DeliverySink`] (a connection's write buffer, or a link's inbox) while the inflight window
//! has room; each QoS 1/2 delivery takes a packet id and waits in `inflight` for its acks.
//! Every step returns the store ops it implies, built here on the broker side; the
//! [`SessionHandle`](crate::broker::SessionHandle) submits them. Nothing here does I/O.
//!
//! An acknowledgement of the wrong kind for an in-flight packet id (PUBREC or PUBCOMP for a
//! QoS 1 delivery, PUBACK for a QoS 2 one, PUBCOMP before any PUBREL was sent) is reported as
//! an [`AckMismatch`], for the driver to treat as a Protocol Error; the delivery stays in
//! flight untouched. An ack for an id with nothing in flight stays ignored: a client may
//! legitimately repeat acks after a reconnect.

use std::collections::VecDeque;
use std::time::Instant;

use crate::broker::message::Delivery;
use crate::broker::persist;
use crate::codec::{QoS, ReasonCode};
use crate::guarantees::DeadReason;
use crate::storage::Op;

use super::SessionState;

/// Where an outbound QoS 1/2 message stands in its acknowledgement handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(
    clippy::enum_variant_names,
    reason = "named after the MQTT packets each stage awaits"
)]
pub enum OutboundStage {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    AwaitPubAck,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    AwaitPubRec,
    /// PUBREL sent, waiting for PUBCOMP (the message itself is no longer needed).
    AwaitPubComp,
}

impl OutboundStage {
    /// The acknowledgement this stage waits for, by packet name (for logs and Reason Strings).
    pub fn awaits(self) -> &'static str {
        match self {
            OutboundStage::AwaitPubAck => "PUBACK",
            OutboundStage::AwaitPubRec => "PUBREC",
            OutboundStage::AwaitPubComp => "PUBCOMP",
        }
    }
}

/// An acknowledgement a client sends for an outbound QoS 1/2 delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names, reason = "the MQTT packets' names")]
pub enum OutboundAck {
    /// PUBACK: ends a QoS 1 delivery.
    PubAck,
    /// PUBREC: the first answer to a QoS 2 delivery.
    PubRec,
    /// PUBCOMP: ends a QoS 2 delivery, answering our PUBREL.
    PubComp,
}

impl OutboundAck {
    /// The packet's name.
    pub fn name(self) -> &'static str {
        match self {
            OutboundAck::PubAck => "PUBACK",
            OutboundAck::PubRec => "PUBREC",
            OutboundAck::PubComp => "PUBCOMP",
        }
    }

    /// The stage this acknowledgement answers.
    pub fn answers(self) -> OutboundStage {
        match self {
            OutboundAck::PubAck => OutboundStage::AwaitPubAck,
            OutboundAck::PubRec => OutboundStage::AwaitPubRec,
            OutboundAck::PubComp => OutboundStage::AwaitPubComp,
        }
    }
}

/// An acknowledgement that does not fit the in-flight delivery holding its packet id: PUBREC
/// or PUBCOMP for a QoS 1 delivery (MQTT-4.3.2-4 asks for PUBACK), PUBACK for a QoS 2 one
/// (MQTT-4.3.3-8 asks for PUBREC, MQTT-4.3.3-11 for PUBCOMP), PUBCOMP for a QoS 2 delivery
/// still waiting for PUBREC (PUBCOMP only answers a PUBREL, MQTT-4.3.3-11, and none was sent
/// for it: the stage moves to awaiting PUBCOMP before the PUBREL is written, also across a
/// restart, so no earlier PUBREL of this delivery can be answered late). Data inconsistent
/// with the sender's state: a Protocol Error (v5 §4.13.1, MQTT-4.13.1-1; 3.1.1 MQTT-4.8.0-1),
/// as Mosquitto also treats it. The delivery is left as it was (retransmitted on resume).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} for packet id {packet_id}, whose delivery awaits {}", ack.name(), stage.awaits())]
pub struct AckMismatch {
    /// The packet id of the acknowledgement.
    pub packet_id: u16,
    /// What the client sent.
    pub ack: OutboundAck,
    /// What the delivery with that packet id waits for.
    pub stage: OutboundStage,
}

/// An unacknowledged outbound message, kept for retransmission on reconnect (MQTT-4.4.0-1).
#[derive(Clone, Debug)]
pub struct Inflight {
    /// The packet id it was sent with; unique among inflight messages (MQTT-2.2.1-3).
    pub packet_id: u16,
    /// What was sent, kept to send it again with DUP=1.
    pub delivery: Delivery,
    /// Which acknowledgement it waits for.
    pub stage: OutboundStage,
    /// Times the PUBLISH was written to a client (1 at the first send, +1 per resend after a
    /// reconnect): what `mqtt.max_deliveries` bounds. Stored with the entry
    /// (`Op::CountDelivery`).
    pub deliveries: u16,
}

/// The inflight window: unacknowledged deliveries in send order. An anonymous session's
/// in-flight bytes (`Message::size`) stay in the anonymous share (`flow::ANONYMOUS_SHARE`)
/// until the entry leaves the window, as its queued bytes do (issue 35, ninth pass R2:
/// uncounted when they left the queue, an anonymous subscriber that never acknowledged held
/// `max_inflight_messages` messages outside the share). Every change goes through a method
/// here, told whether the session is anonymous ([`SessionState::is_anonymous`]), so each
/// entry is counted once and uncounted once, at its message's size then (a message swapped
/// in place is recounted); reads go through `Deref`. No running total and no flag of its
/// own: the session's state stays at its size bound, and the rare whole-window changes
/// (owner change, end, drop: [`SessionState::set_owner`], `Drop for SessionState`) walk it.
#[derive(Debug, Default)]
pub struct InflightWindow {
    entries: VecDeque<Inflight>,
}

impl std::ops::Deref for InflightWindow {
    type Target = VecDeque<Inflight>;

    fn deref(&self) -> &VecDeque<Inflight> {
        &self.entries
    }
}

fn counted(anonymous: bool, bytes: usize, up: bool) {
    if anonymous && bytes > 0 {
        crate::broker::flow::anonymous_queued_counted(bytes, up);
    }
}

impl InflightWindow {
    /// Bytes (`Message::size`) of the entries in flight (a walk).
    pub(in crate::broker) fn bytes(&self) -> usize {
        self.entries.iter().map(|f| f.delivery.message.size()).sum()
    }

    /// Puts `entry` in flight (last), in the anonymous share when `anonymous`.
    pub(in crate::broker) fn push_back(&mut self, entry: Inflight, anonymous: bool) {
        counted(anonymous, entry.delivery.message.size(), true);
        self.entries.push_back(entry);
    }

    /// Takes the entry at `i` out of flight.
    pub(in crate::broker) fn remove(&mut self, i: usize, anonymous: bool) -> Option<Inflight> {
        let entry = self.entries.remove(i)?;
        counted(anonymous, entry.delivery.message.size(), false);
        Some(entry)
    }

    /// Changes the entry at `i` with `change` (its message may be swapped: recounted).
    pub(in crate::broker) fn update<R>(
        &mut self,
        i: usize,
        anonymous: bool,
        change: impl FnOnce(&mut Inflight) -> R,
    ) -> Option<R> {
        let entry = self.entries.get_mut(i)?;
        let before = entry.delivery.message.size();
        let r = change(entry);
        let after = entry.delivery.message.size();
        counted(anonymous, before, false);
        counted(anonymous, after, true);
        Some(r)
    }

    /// Keeps the entries `keep` says to keep (it may change them), uncounting the others.
    pub(in crate::broker) fn retain_mut(
        &mut self,
        anonymous: bool,
        mut keep: impl FnMut(&mut Inflight) -> bool,
    ) {
        let (mut before, mut after) = (0, 0);
        self.entries.retain_mut(|f| {
            before += f.delivery.message.size();
            let kept = keep(f);
            if kept {
                after += f.delivery.message.size();
            }
            kept
        });
        counted(anonymous, before, false);
        counted(anonymous, after, true);
    }

    /// Takes every entry out of flight.
    pub(in crate::broker) fn clear(&mut self, anonymous: bool) {
        counted(anonymous, self.bytes(), false);
        self.entries.clear();
    }
}

impl<'a> IntoIterator for &'a InflightWindow {
    type Item = &'a Inflight;
    type IntoIter = std::collections::vec_deque::Iter<'a, Inflight>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

/// Where deliveries go once the session hands them out: a connection's write buffer, a link's
/// inbox. The session decides order, packet ids and the window; the sink only writes.
pub trait DeliverySink {
    /// True while the sink takes more deliveries, `next` the one it would take now (e.g. its
    /// write buffer is under its high-water mark, and a copy of a stranger's message fits
    /// the stranger's share); the rest stays in the session's bounded queue, in order.
    fn has_room_for(&self, next: &Delivery) -> bool;

    /// Takes one delivery with its packet id (0 for QoS 0) and DUP flag. With `after_commit`,
    /// this delivery's new stage is being stored and it must not reach the peer before that
    /// commit, nor may anything written after it (a persisted QoS 2 PUBLISH: a crash must not
    /// re-send it under another packet id). Returns false if it could not be sent at all
    /// (larger than the peer accepts): the session then forgets it.
    fn write(&mut self, delivery: &Delivery, packet_id: u16, dup: bool, after_commit: bool)
        -> bool;

    /// Why the last delivery [`DeliverySink::write`] refused was dropped, for its dead letter:
    /// too large for the peer unless the sink says otherwise; `None` for a drop that loses
    /// nothing anyone expected (a bridge cutting a loop, or whose rules no longer match).
    fn refusal(&self) -> Option<DeadReason> {
        Some(DeadReason::TooLarge)
    }
}

/// What one [`SessionState::fill`] did.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    /// Store ops to submit (new stages of persisted deliveries, expired entries removed).
    pub ops: Vec<Op>,
    /// True if some delivery was written with `after_commit`: the caller holds it back
    /// until `ops` are durable.
    pub gated: bool,
    /// Deliveries written, by QoS (for the metrics, once per batch).
    pub sent: [u64; 3],
    /// Deliveries dropped because their message expired while queued, by QoS.
    pub expired: [u64; 3],
    /// Deliveries dropped because the session may no longer read their topic, by QoS.
    pub denied: [u64; 3],
    /// What was dropped instead of sent (expired, too large for the sink), for dead letters:
    /// the caller publishes them, with the session unlocked, before it submits `ops`.
    pub dead: Vec<(Delivery, DeadReason)>,
}

/// One thing to send again on a resumed session (MQTT-4.4.0-1), in the original order.
#[derive(Debug)]
pub enum Resend {
    /// An unacknowledged PUBLISH, sent again with DUP=1 (MQTT-3.3.1-1).
    Publish(Delivery, u16),
    /// A PUBREL whose PUBCOMP never came.
    Release(u16),
}

/// What one [`SessionState::resend`] found on a resumed session.
#[derive(Debug, Default)]
pub(crate) struct Resent {
    /// What to send again, in the original order.
    pub resends: Vec<Resend>,
    /// Poison messages: deliveries already sent `mqtt.max_deliveries` times without an
    /// acknowledgement, taken out of flight, with that count. The caller dead-letters them,
    /// with the session unlocked, before it submits `ops` (a crash between the two then
    /// cannot lose both).
    pub poisoned: Vec<(Delivery, u16)>,
    /// Deliveries in flight whose topic the session's identity may no longer read (issue 35,
    /// finding 3): taken out of flight and not sent again; the caller dead-letters them
    /// (`not_authorized`) before it submits `ops`, which remove their entries.
    pub denied: Vec<Delivery>,
    /// Store ops: the poisoned entries' removals, then the new delivery counts
    /// (`Op::CountDelivery`). Always empty with `max_deliveries` = 0.
    pub ops: Vec<Op>,
}

/// The PUBREL to answer a PUBREC with.
#[derive(Debug)]
pub(crate) enum PubRecAnswer {
    /// Send PUBREL with this reason code once `ops` are durable (none for a repeated PUBREC
    /// or an unknown id, which gets 0x92).
    Release {
        /// Reason code of the PUBREL: success, or 0x92 for an unknown packet id.
        reason: ReasonCode,
        /// Store op recording the new handshake stage, if the delivery was persisted.
        ops: Vec<Op>,
        /// The message the client has now, when it is a plain (not a shared group's) one the
        /// cluster's stream holds (or will): its sequence goes into the session's record so
        /// the session's next node does not send it again (`cluster::taken`).
        taken: Option<std::sync::Arc<crate::broker::Message>>,
    },
    /// The receiver refused the message (reason ≥ 0x80): it is done, no PUBREL (v5 §4.3.3).
    Refused {
        /// Store op removing the finished delivery, if it was persisted.
        ops: Vec<Op>,
        /// The refused message, for its dead letter (`None`: the id was unknown).
        message: Option<std::sync::Arc<crate::broker::Message>>,
    },
}

impl SessionState {
    /// Moves queued deliveries into `sink` while it has room and the inflight window
    /// (`window` messages) allows. QoS 0 passes freely; QoS 1/2 waits for a free inflight
    /// slot, preserving order (MQTT-4.6.0-6). Expired messages are dropped (MQTT-3.3.2-5).
    ///
    /// With `may_read`, each delivery is checked before it is handed out (issue 35, finding
    /// 3: queued under rules or an identity no longer in force); one it refuses is dropped,
    /// its stored entry removed, and handed back for its dead letter (`not_authorized`).
    /// With `hold_qos2` (a clustered persistent session: its record lists the QoS 2
    /// deliveries in flight) every QoS 2 PUBLISH is held for a commit, stored or not.
    pub(in crate::broker) fn fill(
        &mut self,
        client_id: &bytestring::ByteString,
        window: usize,
        now: Instant,
        hold_qos2: bool,
        sink: &mut dyn DeliverySink,
        may_read: Option<&dyn Fn(&Delivery) -> bool>,
    ) -> Filled {
        let mut filled = Filled::default();
        while let Some(front) = self.queue.front() {
            if !sink.has_room_for(front) {
                break;
            }
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= window {
                break;
            }
            let Some(delivery) = self.pop() else { break };
            // Expired (MQTT-3.3.2-5), or no longer readable under the ACL: dead, not sent.
            let dead = if delivery.message.is_expired(now) {
                Some((DeadReason::Expired, &mut filled.expired))
            } else if may_read.is_some_and(|may_read| !may_read(&delivery)) {
                Some((DeadReason::NotAuthorized, &mut filled.denied))
            } else {
                None
            };
            if let Some((reason, counts)) = dead {
                counts[delivery.qos as usize] += 1;
                if let Some(seq) = delivery.seq {
                    filled.ops.push(persist::remove_entry(client_id, seq));
                }
                filled.dead.push((delivery, reason));
                continue;
            }
            let (packet_id, stage) = match delivery.qos {
                QoS::AtMostOnce => (0, None),
                qos => match self.allocate_packet_id() {
                    Some(id) if qos == QoS::AtLeastOnce => (id, Some(OutboundStage::AwaitPubAck)),
                    Some(id) => (id, Some(OutboundStage::AwaitPubRec)),
                    None => {
                        // Cannot happen with a window ≤ 65535; put it back rather than lose it.
                        self.queue.push_front(delivery);
                        break;
                    }
                },
            };
            let mut after_commit = hold_qos2 && delivery.qos == QoS::ExactlyOnce;
            if let (Some(seq), Some(stage)) = (delivery.seq, stage) {
                filled
                    .ops
                    .push(persist::update_entry(client_id, seq, stage, packet_id));
                after_commit |= delivery.qos == QoS::ExactlyOnce;
            }
            if !sink.write(&delivery, packet_id, false, after_commit) {
                if let Some(seq) = delivery.seq {
                    filled.ops.push(persist::remove_entry(client_id, seq));
                }
                if let Some(reason) = sink.refusal() {
                    filled.dead.push((delivery, reason));
                }
                continue;
            }
            filled.gated |= after_commit;
            filled.sent[delivery.qos as usize] += 1;
            if let Some(stage) = stage {
                let anonymous = self.is_anonymous();
                self.inflight.push_back(
                    Inflight {
                        packet_id,
                        delivery,
                        stage,
                        deliveries: 1,
                    },
                    anonymous,
                );
            }
        }
        filled
    }

    /// [`SessionState::finish`] returning the removal of the stored entry, if it had one (for
    /// the unit tests). PUBREC is [`SessionState::on_pubrec`]'s.
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the delivery with this id waits for another acknowledgement; it
    /// stays in flight.
    #[cfg(test)]
    pub(in crate::broker) fn complete(
        &mut self,
        client_id: &bytestring::ByteString,
        packet_id: u16,
        ack: OutboundAck,
    ) -> Result<Option<Op>, AckMismatch> {
        Ok(self
            .finish(packet_id, ack)?
            .and_then(|done| done.delivery.seq)
            .map(|seq| persist::remove_entry(client_id, seq)))
    }

    /// PUBACK (QoS 1) or PUBCOMP (QoS 2, after our PUBREL): the delivery is done and its
    /// packet id free again. Hands back the finished delivery (a refusing PUBACK's message
    /// becomes a dead letter); the caller removes its stored entry. An unknown id is ignored
    /// (`Ok(None)`).
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the delivery with this id waits for another acknowledgement; it
    /// stays in flight.
    pub(in crate::broker) fn finish(
        &mut self,
        packet_id: u16,
        ack: OutboundAck,
    ) -> Result<Option<Inflight>, AckMismatch> {
        let Some((i, found)) = self.find_inflight(packet_id) else {
            return Ok(None);
        };
        if found.stage != ack.answers() {
            return Err(AckMismatch {
                packet_id,
                ack,
                stage: found.stage,
            });
        }
        Ok(self.inflight.remove(i, self.is_anonymous()))
    }

    /// Takes out the delivery in flight under `packet_id` whose PUBLISH awaits its PUBACK or
    /// PUBREC: it cannot be sent again (too large for the resumed connection, not forwardable
    /// any more), so the session behaves as if it had completed (MQTT-3.1.2-25). `None` for an
    /// unknown id or one already released (awaiting PUBCOMP).
    pub(in crate::broker) fn discard_unacknowledged(&mut self, packet_id: u16) -> Option<Inflight> {
        let (i, _) = self
            .find_inflight(packet_id)
            .filter(|(_, f)| f.stage != OutboundStage::AwaitPubComp)?;
        self.inflight.remove(i, self.is_anonymous())
    }

    /// PUBREC: the receiver has the message (MQTT-4.3.3-4). Its stage moves to awaiting
    /// PUBCOMP, stored before the PUBREL goes out (a crash must not re-send the PUBLISH after
    /// the receiver released the id). A PUBREC for a delivery already awaiting PUBCOMP (the
    /// receiver repeating itself) is answered with PUBREL again; one for an unknown id with
    /// PUBREL 0x92 (v5 §3.6.2.1).
    ///
    /// # Errors
    ///
    /// [`AckMismatch`] when the id belongs to a QoS 1 delivery (whatever the PUBREC's reason
    /// code); it stays in flight.
    pub(in crate::broker) fn on_pubrec(
        &mut self,
        client_id: &bytestring::ByteString,
        packet_id: u16,
        refused: bool,
    ) -> Result<PubRecAnswer, AckMismatch> {
        let (i, seq) = match self.find_inflight(packet_id) {
            Some((_, f)) if f.stage == OutboundStage::AwaitPubAck => {
                return Err(AckMismatch {
                    packet_id,
                    ack: OutboundAck::PubRec,
                    stage: f.stage,
                });
            }
            Some((i, f)) if f.stage == OutboundStage::AwaitPubRec => (i, f.delivery.seq),
            // A refusing PUBREC ends the exchange whatever the id: no PUBREL (MQTT-4.3.3-4
            // only asks for one after a successful PUBREC).
            _ if refused => {
                return Ok(PubRecAnswer::Refused {
                    ops: Vec::new(),
                    message: None,
                })
            }
            // Already awaiting PUBCOMP: the PUBREL is due again, nothing changes.
            Some(_) => {
                return Ok(PubRecAnswer::Release {
                    reason: ReasonCode::SUCCESS,
                    ops: Vec::new(),
                    taken: None,
                })
            }
            None => {
                return Ok(PubRecAnswer::Release {
                    reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
                    ops: Vec::new(),
                    taken: None,
                })
            }
        };
        if refused {
            let message = self
                .inflight
                .remove(i, self.is_anonymous())
                .map(|done| done.delivery.message);
            let ops = seq
                .map(|seq| persist::remove_entry(client_id, seq))
                .into_iter()
                .collect();
            return Ok(PubRecAnswer::Refused { ops, message });
        }
        let mut taken = None;
        self.inflight.update(i, self.is_anonymous(), |entry| {
            entry.stage = OutboundStage::AwaitPubComp;
            let message = &entry.delivery.message;
            if entry.delivery.shared.is_none()
                && (message.cluster_seq().is_some() || message.awaits_cluster_seq())
            {
                taken = Some(std::sync::Arc::clone(message));
            }
            // The client has it: its engine (a clustered shared group's JetStream) is done
            // with it now, and only the packet id is needed for the PUBREL.
            if entry.delivery.message.awaits_settlement() {
                entry.delivery.message =
                    std::sync::Arc::new(crate::broker::Message::released_placeholder());
            }
        });
        let ops = seq
            .map(|seq| {
                persist::update_entry(client_id, seq, OutboundStage::AwaitPubComp, packet_id)
            })
            .into_iter()
            .collect();
        Ok(PubRecAnswer::Release {
            reason: ReasonCode::SUCCESS,
            ops,
            taken,
        })
    }

    /// Everything unacknowledged, to send again on a resumed session, in send order; each
    /// PUBLISH sent again counts one more delivery. With `max_deliveries` > 0, a PUBLISH
    /// already sent that many times is not sent again but taken out of flight (its packet id
    /// freed) as a poison message, and every new count is stored (`Op::CountDelivery`) so a
    /// restart does not reset it. A PUBREL stage is never counted: the client has the
    /// message. With 0 nothing is stored and nothing is given up on (MQTT-4.4.0-1).
    ///
    /// With `may_read`, an unacknowledged PUBLISH the session may no longer read is not sent
    /// again (issue 35, finding 3): its packet id is freed, as for a poison message. A PUBREL
    /// is sent again whatever the rules: the client has the message already.
    pub(in crate::broker) fn resend(
        &mut self,
        client_id: &bytestring::ByteString,
        max_deliveries: u16,
        may_read: Option<&dyn Fn(&Delivery) -> bool>,
    ) -> Resent {
        let mut resent = Resent::default();
        let mut counts = Vec::new();
        self.inflight.retain_mut(self.is_anonymous(), |f| {
            if f.stage == OutboundStage::AwaitPubComp {
                resent.resends.push(Resend::Release(f.packet_id));
                return true;
            }
            if may_read.is_some_and(|may_read| !may_read(&f.delivery)) {
                if let Some(seq) = f.delivery.seq {
                    resent.ops.push(persist::remove_entry(client_id, seq));
                }
                resent.denied.push(f.delivery.clone());
                return false;
            }
            if max_deliveries > 0 && f.deliveries >= max_deliveries {
                if let Some(seq) = f.delivery.seq {
                    resent.ops.push(persist::remove_entry(client_id, seq));
                }
                resent.poisoned.push((f.delivery.clone(), f.deliveries));
                return false;
            }
            f.deliveries = f.deliveries.saturating_add(1);
            if let (true, Some(seq)) = (max_deliveries > 0, f.delivery.seq) {
                counts.push(Op::CountDelivery {
                    client_id: client_id.clone(),
                    seq,
                    deliveries: f.deliveries,
                });
            }
            resent
                .resends
                .push(Resend::Publish(f.delivery.clone(), f.packet_id));
            true
        });
        resent.ops.append(&mut counts);
        resent
    }

    /// Allocates a packet id not used by any inflight message (MQTT-2.2.1-3).
    fn allocate_packet_id(&mut self) -> Option<u16> {
        for _ in 0..=u16::MAX {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id == 0 {
                self.next_packet_id = 1;
            }
            let id = self.next_packet_id;
            if !self.inflight.iter().any(|f| f.packet_id == id) {
                return Some(id);
            }
        }
        None
    }

    /// Finds the inflight entry for `packet_id`, whatever its stage: packet ids are unique
    /// among inflight messages (MQTT-2.2.1-3), so the stage tells whether an ack fits. Acks
    /// usually match the oldest.
    fn find_inflight(&self, packet_id: u16) -> Option<(usize, &Inflight)> {
        self.inflight
            .iter()
            .enumerate()
            .find(|(_, f)| f.packet_id == packet_id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::broker::{Message, Session};
    use crate::codec::{ProtocolVersion, Publish};

    /// Puts a delivery in flight under `packet_id` at `stage`, as `fill` would have.
    fn in_flight(st: &mut SessionState, packet_id: u16, stage: OutboundStage) {
        let qos = match stage {
            OutboundStage::AwaitPubAck => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        let publish = Publish {
            qos,
            topic: "t".into(),
            packet_id: 1,
            ..Default::default()
        };
        st.inflight.push_back(
            Inflight {
                deliveries: 1,
                packet_id,
                delivery: Delivery {
                    message: Arc::new(Message::from_publish(publish, None)),
                    qos,
                    retain: false,
                    subscription_ids: Default::default(),
                    seq: None,
                    shared: None,
                },
                stage,
            },
            false,
        );
    }

    /// A PUBREC with a failure code ends the QoS 2 exchange even for an id the session does not
    /// know: no PUBREL follows (MQTT-4.3.3-4 asks for PUBREL only after a successful PUBREC);
    /// a successful PUBREC for an unknown id gets PUBREL 0x92 (v5 §3.6.2.1).
    #[test]
    fn pubrec_for_an_unknown_id() {
        let session = Session::new(1, "c".into(), ProtocolVersion::V5, 0);
        let mut st = session.lock();
        let id = bytestring::ByteString::from("c");
        assert!(matches!(
            st.on_pubrec(&id, 7, true),
            Ok(PubRecAnswer::Refused { ops, message: None }) if ops.is_empty()
        ));
        assert!(matches!(
            st.on_pubrec(&id, 7, false),
            Ok(PubRecAnswer::Release {
                reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
                ..
            })
        ));
    }

    /// Acks of the wrong kind for an in-flight id are reported (a Protocol Error for the
    /// driver, v5 §4.13.1) and leave the delivery in flight: PUBREC / PUBCOMP for QoS 1
    /// (MQTT-4.3.2-4), PUBACK for QoS 2 at either stage (MQTT-4.3.3-8, -11), PUBCOMP before
    /// any PUBREL (MQTT-4.3.3-11). Acks for ids with nothing in flight stay ignored.
    #[test]
    fn acks_of_the_wrong_kind() {
        use OutboundAck::{PubAck, PubComp, PubRec};
        use OutboundStage::{AwaitPubAck, AwaitPubComp, AwaitPubRec};
        let session = Session::new(1, "c".into(), ProtocolVersion::V5, 0);
        let mut st = session.lock();
        let id = bytestring::ByteString::from("c");
        in_flight(&mut st, 1, AwaitPubAck);
        in_flight(&mut st, 2, AwaitPubRec);
        in_flight(&mut st, 3, AwaitPubComp);
        let mismatch = |packet_id, ack, stage| {
            Err::<Option<Op>, _>(AckMismatch {
                packet_id,
                ack,
                stage,
            })
        };
        assert_eq!(
            st.complete(&id, 1, PubComp),
            mismatch(1, PubComp, AwaitPubAck)
        );
        assert_eq!(
            st.on_pubrec(&id, 1, false).map(|_| None),
            mismatch(1, PubRec, AwaitPubAck)
        );
        assert_eq!(
            st.on_pubrec(&id, 1, true).map(|_| None),
            mismatch(1, PubRec, AwaitPubAck)
        );
        assert_eq!(
            st.complete(&id, 2, PubAck),
            mismatch(2, PubAck, AwaitPubRec)
        );
        assert_eq!(
            st.complete(&id, 2, PubComp),
            mismatch(2, PubComp, AwaitPubRec)
        );
        assert_eq!(
            st.complete(&id, 3, PubAck),
            mismatch(3, PubAck, AwaitPubComp)
        );
        assert_eq!(st.inflight.len(), 3, "mismatched acks change nothing");
        // Unknown ids: ignored as before.
        assert_eq!(st.complete(&id, 9, PubAck), Ok(None));
        assert_eq!(st.complete(&id, 9, PubComp), Ok(None));
        // A PUBREC repeated in the PUBREL stage gets PUBREL again, not an error.
        assert!(matches!(
            st.on_pubrec(&id, 3, false),
            Ok(PubRecAnswer::Release {
                reason: ReasonCode::SUCCESS,
                ..
            })
        ));
        // The right acks still finish each one.
        assert_eq!(st.complete(&id, 1, PubAck), Ok(None));
        assert!(matches!(
            st.on_pubrec(&id, 2, false),
            Ok(PubRecAnswer::Release {
                reason: ReasonCode::SUCCESS,
                ..
            })
        ));
        assert_eq!(st.complete(&id, 2, PubComp), Ok(None));
        assert_eq!(st.complete(&id, 3, PubComp), Ok(None));
        assert!(st.inflight.is_empty());
    }
}
