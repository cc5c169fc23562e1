//! Writes that must not reach the client before the durable store holds what they promise:
//! PUBACK / PUBREC after the message is stored, PUBCOMP after the inbound id is released,
//! PUBREL and outbound QoS 2 PUBLISH after their handshake stage is stored.
//!
//! One FIFO per connection keeps every write in order: a write with nothing to wait for still
//! queues behind earlier gated ones (PUBACKs go out in PUBLISH order, MQTT-4.6.0-2). With the
//! in-memory store nothing is ever gated and the queue stays empty.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::codec::{Packet, PubResponse};
use crate::storage::{Durable, StorageError};

/// Something to write once the store allows it.
#[derive(Debug)]
pub(super) enum Gated {
    /// An acknowledgement, encoded when released.
    Ack(AckKind, PubResponse),
    /// An already encoded PUBLISH.
    Encoded(Bytes),
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

/// The per-connection FIFO of gated writes.
#[derive(Debug, Default)]
pub(super) struct GatedWrites {
    queue: VecDeque<(Option<Durable>, Gated)>,
}

impl GatedWrites {
    /// True when nothing waits: a new ungated write may go straight to the socket.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Writes waiting; bounds how much a publisher may have unacknowledged.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when the front write waits for a commit (the connection's select arm).
    pub(super) fn waiting(&self) -> bool {
        matches!(self.queue.front(), Some((Some(_), _)))
    }

    /// Queues a write behind everything already waiting.
    pub(super) fn push(&mut self, durable: Option<Durable>, item: Gated) {
        self.queue.push_back((durable, item));
    }

    /// Ready when the front write's commit is durable (or failed). The durable future stays
    /// in place until [`Self::release_front`], so polling it again is harmless.
    pub(super) fn poll_front_durable(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), StorageError>> {
        match self.queue.front_mut() {
            Some((Some(durable), _)) => Pin::new(durable).poll(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Marks the front write as no longer waiting (its commit is durable).
    pub(super) fn release_front(&mut self) {
        if let Some(front) = self.queue.front_mut() {
            front.0 = None;
        }
    }

    /// Takes the front write if nothing holds it back any more.
    pub(super) fn pop_ready(&mut self) -> Option<Gated> {
        match self.queue.front() {
            Some((None, _)) => self.queue.pop_front().map(|(_, item)| item),
            _ => None,
        }
    }
}
