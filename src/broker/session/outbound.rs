//! Messages to the client: the outbound QoS 1/2 handshake (MQTT 4.3.2, 4.3.3) as session state.
//!
//! Deliveries leave the session queue in order through [`SessionState::fill`] into a
//! [`DeliverySink`] (a connection's write buffer, or a link's inbox) while the inflight window
//! has room; each QoS 1/2 delivery takes a packet id and waits in `inflight` for its acks.
//! Every step returns the store ops it implies, built here on the broker side; the
//! [`SessionHandle`](crate::broker::SessionHandle) submits them. Nothing here does I/O.

use std::time::Instant;

use crate::broker::message::Delivery;
use crate::broker::persist;
use crate::codec::{QoS, ReasonCode};
use crate::storage::Op;

use super::SessionState;

/// Where an outbound QoS 1/2 message stands in its acknowledgement handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutboundStage {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    AwaitPubAck,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    AwaitPubRec,
    /// PUBREL sent, waiting for PUBCOMP (the message itself is no longer needed).
    AwaitPubComp,
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
}

/// Where deliveries go once the session hands them out: a connection's write buffer, a link's
/// inbox. The session decides order, packet ids and the window; the sink only writes.
pub trait DeliverySink {
    /// True while the sink takes more deliveries (e.g. its write buffer is under its
    /// high-water mark); the rest stays in the session's bounded queue.
    fn has_room(&self) -> bool;

    /// Takes one delivery with its packet id (0 for QoS 0) and DUP flag. With `after_commit`,
    /// this delivery's new stage is being stored and it must not reach the peer before that
    /// commit, nor may anything written after it (a persisted QoS 2 PUBLISH: a crash must not
    /// re-send it under another packet id). Returns false if it could not be sent at all
    /// (larger than the peer accepts): the session then forgets it.
    fn write(&mut self, delivery: &Delivery, packet_id: u16, dup: bool, after_commit: bool)
        -> bool;
}

/// What one [`SessionState::fill`] did.
#[derive(Debug, Default)]
pub struct Filled {
    /// Store ops to submit (new stages of persisted deliveries, expired entries removed).
    pub ops: Vec<Op>,
    /// True if some delivery was written with `after_commit`: the caller holds it back
    /// until `ops` are durable.
    pub gated: bool,
    /// Deliveries written, by QoS (for the metrics, once per batch).
    pub sent: [u64; 3],
}

/// One thing to send again on a resumed session (MQTT-4.4.0-1), in the original order.
#[derive(Debug)]
pub enum Resend {
    /// An unacknowledged PUBLISH, sent again with DUP=1 (MQTT-3.3.1-1).
    Publish(Delivery, u16),
    /// A PUBREL whose PUBCOMP never came.
    Release(u16),
}

/// The PUBREL to answer a PUBREC with.
#[derive(Debug)]
pub enum PubRecAnswer {
    /// Send PUBREL with this reason code once `ops` are durable (none for a repeated PUBREC
    /// or an unknown id, which gets 0x92).
    Release {
        /// Reason code of the PUBREL: success, or 0x92 for an unknown packet id.
        reason: ReasonCode,
        /// Store op recording the new handshake stage, if the delivery was persisted.
        ops: Vec<Op>,
    },
    /// The receiver refused the message (reason ≥ 0x80): it is done, no PUBREL (v5 §4.3.3).
    Refused {
        /// Store op removing the finished delivery, if it was persisted.
        ops: Vec<Op>,
    },
}

impl SessionState {
    /// Moves queued deliveries into `sink` while it has room and the inflight window
    /// (`window` messages) allows. QoS 0 passes freely; QoS 1/2 waits for a free inflight
    /// slot, preserving order (MQTT-4.6.0-6). Expired messages are dropped (MQTT-3.3.2-5).
    pub(in crate::broker) fn fill(
        &mut self,
        client_id: &bytestring::ByteString,
        window: usize,
        now: Instant,
        sink: &mut dyn DeliverySink,
    ) -> Filled {
        let mut filled = Filled::default();
        while sink.has_room() {
            let Some(front) = self.queue.front() else {
                break;
            };
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= window {
                break;
            }
            let Some(delivery) = self.pop() else { break };
            if delivery.message.is_expired(now) {
                if let Some(seq) = delivery.seq {
                    filled.ops.push(persist::remove_entry(client_id, seq));
                }
                continue; // MQTT-3.3.2-5
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
            let mut after_commit = false;
            if let (Some(seq), Some(stage)) = (delivery.seq, stage) {
                filled
                    .ops
                    .push(persist::update_entry(client_id, seq, stage, packet_id));
                after_commit = delivery.qos == QoS::ExactlyOnce;
            }
            if !sink.write(&delivery, packet_id, false, after_commit) {
                if let Some(seq) = delivery.seq {
                    filled.ops.push(persist::remove_entry(client_id, seq));
                }
                continue;
            }
            filled.gated |= after_commit;
            filled.sent[delivery.qos as usize] += 1;
            if let Some(stage) = stage {
                self.inflight.push_back(Inflight {
                    packet_id,
                    delivery,
                    stage,
                });
            }
        }
        filled
    }

    /// PUBACK (QoS 1) or PUBCOMP (QoS 2): the message is done and its packet id is free again.
    /// Returns the removal of its stored entry, if it had one. An unknown id is ignored.
    pub(in crate::broker) fn complete(
        &mut self,
        client_id: &bytestring::ByteString,
        packet_id: u16,
        stage: OutboundStage,
    ) -> Option<Op> {
        let i = self.find_inflight(packet_id, stage)?;
        let done = self.inflight.remove(i)?;
        done.delivery
            .seq
            .map(|seq| persist::remove_entry(client_id, seq))
    }

    /// PUBREC: the receiver has the message (MQTT-4.3.3-4). Its stage moves to awaiting
    /// PUBCOMP, stored before the PUBREL goes out (a crash must not re-send the PUBLISH after
    /// the receiver released the id).
    pub(in crate::broker) fn on_pubrec(
        &mut self,
        client_id: &bytestring::ByteString,
        packet_id: u16,
        refused: bool,
    ) -> PubRecAnswer {
        let Some(i) = self.find_inflight(packet_id, OutboundStage::AwaitPubRec) else {
            if refused {
                // A refusing PUBREC ends the exchange whatever the id: no PUBREL (MQTT-4.3.3-4
                // only asks for one after a successful PUBREC).
                return PubRecAnswer::Refused { ops: Vec::new() };
            }
            let known = self
                .find_inflight(packet_id, OutboundStage::AwaitPubComp)
                .is_some();
            let reason = if known {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
            };
            return PubRecAnswer::Release {
                reason,
                ops: Vec::new(),
            };
        };
        let seq = self.inflight.get(i).and_then(|f| f.delivery.seq);
        if refused {
            self.inflight.remove(i);
            let ops = seq
                .map(|seq| persist::remove_entry(client_id, seq))
                .into_iter()
                .collect();
            return PubRecAnswer::Refused { ops };
        }
        if let Some(entry) = self.inflight.get_mut(i) {
            entry.stage = OutboundStage::AwaitPubComp;
        }
        let ops = seq
            .map(|seq| {
                persist::update_entry(client_id, seq, OutboundStage::AwaitPubComp, packet_id)
            })
            .into_iter()
            .collect();
        PubRecAnswer::Release {
            reason: ReasonCode::SUCCESS,
            ops,
        }
    }

    /// Everything unacknowledged, to send again on a resumed session, in send order.
    pub(in crate::broker) fn resend(&self) -> Vec<Resend> {
        self.inflight
            .iter()
            .map(|f| match f.stage {
                OutboundStage::AwaitPubComp => Resend::Release(f.packet_id),
                _ => Resend::Publish(f.delivery.clone(), f.packet_id),
            })
            .collect()
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

    /// Finds the inflight entry for `packet_id` in `stage` (acks usually match the oldest).
    fn find_inflight(&self, packet_id: u16, stage: OutboundStage) -> Option<usize> {
        self.inflight
            .iter()
            .position(|f| f.packet_id == packet_id && f.stage == stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::Session;
    use crate::codec::ProtocolVersion;

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
            PubRecAnswer::Refused { ops } if ops.is_empty()
        ));
        assert!(matches!(
            st.on_pubrec(&id, 7, false),
            PubRecAnswer::Release {
                reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
                ..
            }
        ));
    }
}
