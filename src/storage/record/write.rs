//! Encoding ops into the record format (see the parent module). Must not fail or allocate
//! beyond the output buffer: the writer thread calls it for every commit.

use bytes::Bytes;
use bytestring::ByteString;

use super::*;
use crate::codec::{LastWill, QoS, SubscriptionOptions, UserProperties};
use crate::storage::{EntryStage, Op, SessionOwner, StoredMessage};

/// Appends encodings to a `Vec<u8>`.
pub(crate) struct Enc<'a>(pub &'a mut Vec<u8>);

impl Enc<'_> {
    /// Appends a little-endian `u8` (frame kinds and counts are written with these).
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// Appends a little-endian `u16` (frame kinds and counts are written with these).
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Appends a little-endian `u32` (frame kinds and counts are written with these).
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Appends a little-endian `u64` (frame kinds and counts are written with these).
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn bytes(&mut self, v: &[u8]) {
        // Payloads are bounded by the MQTT packet size (< 256 MiB), so u32 always fits.
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, v: &ByteString) {
        self.bytes(v.as_bytes());
    }
    fn opt_u8(&mut self, v: Option<u8>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u8(x);
            }
        }
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u32(x);
            }
        }
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
    fn opt_str(&mut self, v: Option<&ByteString>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.str(x);
            }
        }
    }
    fn opt_bytes(&mut self, v: Option<&Bytes>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.bytes(x);
            }
        }
    }
    fn user_properties(&mut self, v: &UserProperties) {
        self.u32(v.len() as u32);
        for (k, val) in v {
            self.str(k);
            self.str(val);
        }
    }
    fn qos(&mut self, q: QoS) {
        self.u8(q as u8);
    }
    fn options(&mut self, o: SubscriptionOptions) {
        self.qos(o.qos);
        self.bool(o.no_local);
        self.bool(o.retain_as_published);
        self.u8(o.retain_handling);
    }
    fn message(&mut self, m: &StoredMessage) {
        self.str(&m.topic);
        self.bytes(&m.payload);
        self.qos(m.qos);
        self.bool(m.retain);
        let p = &m.properties;
        self.opt_u8(p.payload_format_indicator);
        self.opt_u32(p.message_expiry_interval);
        self.opt_str(p.response_topic.as_ref());
        self.opt_bytes(p.correlation_data.as_ref());
        self.user_properties(&p.user_properties);
        self.opt_str(p.content_type.as_ref());
        self.u64(m.received_at_unix_ms);
        self.opt_u64(m.expires_at_unix_ms);
    }
    fn will(&mut self, w: &LastWill) {
        self.str(&w.topic);
        self.bytes(&w.payload);
        self.qos(w.qos);
        self.bool(w.retain);
        let p = &w.properties;
        self.opt_u32(p.will_delay_interval);
        self.opt_u8(p.payload_format_indicator);
        self.opt_u32(p.message_expiry_interval);
        self.opt_str(p.content_type.as_ref());
        self.opt_str(p.response_topic.as_ref());
        self.opt_bytes(p.correlation_data.as_ref());
        self.user_properties(&p.user_properties);
    }
    fn stage(&mut self, s: EntryStage) {
        match s {
            EntryStage::Queued => self.u8(0),
            EntryStage::AwaitPubAck { packet_id } => {
                self.u8(1);
                self.u16(packet_id);
            }
            EntryStage::AwaitPubRec { packet_id } => {
                self.u8(2);
                self.u16(packet_id);
            }
            EntryStage::AwaitPubComp { packet_id } => {
                self.u8(3);
                self.u16(packet_id);
            }
        }
    }

    /// Appends one op.
    pub(crate) fn op(&mut self, op: &Op) {
        match op {
            Op::PutSession(meta) => {
                let owned = meta.owner != SessionOwner::Unbound;
                self.u8(if owned {
                    PUT_SESSION_OWNED
                } else {
                    PUT_SESSION
                });
                self.str(&meta.client_id);
                self.u8(meta.protocol as u8);
                self.u32(meta.expiry_interval);
                self.opt_u64(meta.disconnected_at_unix_ms);
                match &meta.owner {
                    SessionOwner::Unbound => {}
                    SessionOwner::Anonymous => self.u8(1),
                    SessionOwner::User(user) => {
                        self.u8(2);
                        self.bytes(user.as_bytes());
                    }
                }
            }
            Op::DeleteSession { client_id } => {
                self.u8(DELETE_SESSION);
                self.str(client_id);
            }
            Op::PutSubscription {
                client_id,
                filter,
                subscription,
            } => {
                self.u8(PUT_SUBSCRIPTION);
                self.str(client_id);
                self.str(filter);
                self.options(subscription.options);
                self.opt_u32(subscription.identifier);
            }
            Op::DeleteSubscription { client_id, filter } => {
                self.u8(DELETE_SUBSCRIPTION);
                self.str(client_id);
                self.str(filter);
            }
            Op::PutMessage { id, message } => {
                self.u8(if message.from_anonymous {
                    PUT_MESSAGE_ANONYMOUS
                } else {
                    PUT_MESSAGE
                });
                self.u64(*id);
                self.message(message);
            }
            Op::Enqueue {
                client_id,
                seq,
                entry,
            } => {
                self.u8(if entry.shared.is_some() {
                    ENQUEUE_SHARED
                } else {
                    ENQUEUE
                });
                self.str(client_id);
                self.u64(*seq);
                self.u64(entry.message);
                self.qos(entry.qos);
                self.bool(entry.retain);
                self.u32(entry.subscription_ids.len() as u32);
                for id in &entry.subscription_ids {
                    self.u32(*id);
                }
                self.stage(entry.stage);
                if let Some(group) = &entry.shared {
                    self.bytes(group.as_bytes());
                }
            }
            Op::UpdateEntry {
                client_id,
                seq,
                stage,
            } => {
                self.u8(UPDATE_ENTRY);
                self.str(client_id);
                self.u64(*seq);
                self.stage(*stage);
            }
            Op::RemoveEntry { client_id, seq } => {
                self.u8(REMOVE_ENTRY);
                self.str(client_id);
                self.u64(*seq);
            }
            Op::PutInboundQos2 {
                client_id,
                packet_id,
            } => {
                self.u8(PUT_INBOUND);
                self.str(client_id);
                self.u16(*packet_id);
            }
            Op::RemoveInboundQos2 {
                client_id,
                packet_id,
            } => {
                self.u8(REMOVE_INBOUND);
                self.str(client_id);
                self.u16(*packet_id);
            }
            Op::PutRetained { topic, message } => {
                self.u8(if message.from_anonymous {
                    PUT_RETAINED_ANONYMOUS
                } else {
                    PUT_RETAINED
                });
                self.str(topic);
                self.message(message);
            }
            Op::DeleteRetained { topic } => {
                self.u8(DELETE_RETAINED);
                self.str(topic);
            }
            Op::PutWill {
                client_id,
                will,
                publish_at_unix_ms,
            } => {
                self.u8(PUT_WILL);
                self.str(client_id);
                self.will(will);
                self.u64(*publish_at_unix_ms);
            }
            Op::CountDelivery {
                client_id,
                seq,
                deliveries,
            } => {
                self.u8(COUNT_DELIVERY);
                self.str(client_id);
                self.u64(*seq);
                self.u16(*deliveries);
            }
            Op::PutDedup {
                topic,
                key,
                expires_at_unix_ms,
            } => {
                self.u8(PUT_DEDUP);
                self.str(topic);
                self.str(key);
                self.u64(*expires_at_unix_ms);
            }
            Op::DeleteWill { client_id } => {
                self.u8(DELETE_WILL);
                self.str(client_id);
            }
            Op::SequenceMessage { id, stream_seq } => {
                self.u8(SEQUENCE_MESSAGE);
                self.u64(*id);
                self.u64(*stream_seq);
            }
        }
    }
}
