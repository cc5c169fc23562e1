//! Writes that must not reach the client before the durable store holds what they promise:
//! PUBACK / PUBREC after the message is stored, PUBCOMP after the inbound id is released,
//! PUBREL and outbound QoS 2 PUBLISH after their handshake stage is stored.
//!
//! One FIFO per connection ([`InOrder`]) keeps every write in order: a write with nothing to
//! wait for still queues behind earlier gated ones (PUBACKs go out in PUBLISH order,
//! MQTT-4.6.0-2).
//!
//! Must not: reorder writes.

use super::write_queue::WriteQueue;
use crate::codec::{Packet, PubResponse};
use crate::storage::InOrder;

/// Something to write once the store allows it.
#[derive(Debug)]
pub(super) enum Gated {
    /// An acknowledgement, encoded when released.
    Ack(AckKind, PubResponse),
    /// Already encoded PUBLISHes (or a SUBACK), payloads sent by reference included.
    Encoded(WriteQueue),
}

/// Which acknowledgement a [`Gated::Ack`] is (they share one body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AckKind {
    /// PUBACK.
    Ack,
    /// PUBREC.
    Rec,
    /// PUBREL.
    Rel,
    /// PUBCOMP.
    Comp,
}

impl AckKind {
    /// The packet to encode.
    pub(super) fn packet(self, ack: PubResponse) -> Packet {
        match self {
            AckKind::Ack => Packet::PubAck(ack),
            AckKind::Rec => Packet::PubRec(ack),
            AckKind::Rel => Packet::PubRel(ack),
            AckKind::Comp => Packet::PubComp(ack),
        }
    }
}

/// The per-connection FIFO of gated writes ([`InOrder`]: the rule the bridge keeps too).
pub(super) type GatedWrites = InOrder<Gated>;
