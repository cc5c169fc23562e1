//! Messages from the client: the exactly-once ids of inbound QoS 2 (MQTT 4.3.3, receiver side).
//!
//! A QoS 2 packet id is remembered from its PUBLISH until its PUBREL (MQTT-4.3.3-8..11): a
//! re-sent PUBLISH with a remembered id is acknowledged again but not routed again. For a
//! session the store holds, the id is stored with the message (see `Broker::publish`) and its
//! release is stored before PUBCOMP. Nothing here does I/O.

use std::collections::HashSet;

use bytestring::ByteString;

use crate::broker::persist;
use crate::codec::{QoS, ReasonCode};
use crate::storage::Op;

use super::SessionState;

/// The inbound QoS 2 ids awaiting PUBREL. Boxed and created on the first QoS 2 PUBLISH: most
/// sessions never receive one, and an empty set inline is 40 B of every session.
// Boxed on purpose (clippy's box_collection): `None` is 8 B where an empty set is 40.
#[allow(clippy::box_collection)]
#[derive(Debug, Default)]
pub(in crate::broker) struct InboundIds(Option<Box<HashSet<u16, foldhash::fast::RandomState>>>);

impl InboundIds {
    pub(in crate::broker) fn contains(&self, id: u16) -> bool {
        self.0.as_ref().is_some_and(|ids| ids.contains(&id))
    }

    pub(in crate::broker) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |ids| ids.len())
    }

    /// True if `id` was not held yet.
    pub(in crate::broker) fn insert(&mut self, id: u16) -> bool {
        self.0.get_or_insert_with(Box::default).insert(id)
    }

    /// True if `id` was held. The set is freed with its last id.
    pub(in crate::broker) fn remove(&mut self, id: u16) -> bool {
        let Some(ids) = self.0.as_mut() else {
            return false;
        };
        let removed = ids.remove(&id);
        if ids.is_empty() {
            self.0 = None;
        }
        removed
    }

    pub(in crate::broker) fn clear(&mut self) {
        self.0 = None;
    }
}

impl Extend<u16> for InboundIds {
    fn extend<I: IntoIterator<Item = u16>>(&mut self, iter: I) {
        for id in iter {
            self.insert(id);
        }
    }
}

/// Whether an inbound PUBLISH is new, and whether its QoS 2 id must be stored with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::broker) struct Receipt {
    /// Route it (false: a QoS 2 re-send of an id awaiting PUBREL, MQTT-4.3.3-10).
    pub(in crate::broker) fresh: bool,
    /// The store holds the session: its QoS 2 id goes to the store with the message.
    pub(in crate::broker) store_id: bool,
}

impl SessionState {
    /// Inbound QoS 1/2 messages this session still owes an answer for, as Receive Maximum
    /// counts them (MQTT-3.3.4-7): the QoS 2 ids awaiting PUBREL. `None` if `packet_id` is
    /// one of them at QoS 2: a re-send, which is not a new PUBLISH.
    pub(in crate::broker) fn unreleased(&self, qos: QoS, packet_id: u16) -> Option<usize> {
        if qos == QoS::ExactlyOnce && self.inbound_qos2.contains(packet_id) {
            return None;
        }
        Some(self.inbound_qos2.len())
    }

    /// Records an inbound PUBLISH: a QoS 2 id is remembered until its PUBREL.
    pub(in crate::broker) fn receive(&mut self, qos: QoS, packet_id: u16) -> Receipt {
        let fresh = qos != QoS::ExactlyOnce || self.inbound_qos2.insert(packet_id);
        Receipt {
            fresh,
            store_id: qos == QoS::ExactlyOnce && self.stored,
        }
    }

    /// Forgets a QoS 2 id whose PUBLISH was refused (never acknowledged with success, so the
    /// client may use it again, MQTT-4.3.3-9).
    pub(in crate::broker) fn forget_inbound(&mut self, packet_id: u16) {
        self.inbound_qos2.remove(packet_id);
    }

    /// PUBREL: releases the id. Returns the PUBCOMP's reason code and the store op to wait
    /// for before sending it (without it, the client's next use of the id would look like a
    /// duplicate after a crash and be dropped).
    pub(in crate::broker) fn release(
        &mut self,
        client_id: &ByteString,
        packet_id: u16,
    ) -> (ReasonCode, Option<Op>) {
        if !self.inbound_qos2.remove(packet_id) {
            return (ReasonCode::PACKET_IDENTIFIER_NOT_FOUND, None);
        }
        let op = self
            .stored
            .then(|| persist::remove_inbound_qos2(client_id, packet_id));
        (ReasonCode::SUCCESS, op)
    }
}
