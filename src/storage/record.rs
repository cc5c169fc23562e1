//! The record format: compact binary encoding of [`Op`]s: little-endian integers, u32-length-prefixed byte
//! strings, one tag byte per op. Hand-written (no serde format crate) so payloads are written
//! straight from their `Bytes`, and so every read from disk is bounds-checked and returns an
//! error instead of panicking.
//!
//! Must not do integrity or framing: the frames around these bytes carry CRCs (see
//! `log_store::format`). Must not change an existing tag or field order: logs and snapshots
//! on disk are decoded with it.

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;

use super::{EntryStage, Op, QueueEntry, SessionMeta, StoredMessage, SubscriptionRecord};
use crate::codec::{
    LastWill, ProtocolVersion, PublishProperties, QoS, SubscriptionOptions, UserProperties,
    WillProperties,
};

/// Why bytes could not be decoded; always means corruption or a format bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {pos}")]
pub struct DecodeError {
    /// What was expected.
    pub what: &'static str,
    /// Offset in the decoded buffer.
    pub pos: usize,
}

const PUT_SESSION: u8 = 1;
const DELETE_SESSION: u8 = 2;
const PUT_SUBSCRIPTION: u8 = 3;
const DELETE_SUBSCRIPTION: u8 = 4;
const PUT_MESSAGE: u8 = 5;
const ENQUEUE: u8 = 6;
const UPDATE_ENTRY: u8 = 7;
const REMOVE_ENTRY: u8 = 8;
const PUT_INBOUND: u8 = 9;
const REMOVE_INBOUND: u8 = 10;
const PUT_RETAINED: u8 = 11;
const DELETE_RETAINED: u8 = 12;
const PUT_WILL: u8 = 13;
const DELETE_WILL: u8 = 14;

/// Appends encodings to a `Vec<u8>`.
pub struct Enc<'a>(pub &'a mut Vec<u8>);

impl Enc<'_> {
    /// Appends a little-endian `u8` (frame kinds and counts are written with these).
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    /// Appends a little-endian `u16` (frame kinds and counts are written with these).
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Appends a little-endian `u32` (frame kinds and counts are written with these).
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    /// Appends a little-endian `u64` (frame kinds and counts are written with these).
    pub fn u64(&mut self, v: u64) {
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
    fn opt_str(&mut self, v: &Option<ByteString>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.str(x);
            }
        }
    }
    fn opt_bytes(&mut self, v: &Option<Bytes>) {
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
    fn options(&mut self, o: &SubscriptionOptions) {
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
        self.opt_str(&p.response_topic);
        self.opt_bytes(&p.correlation_data);
        self.user_properties(&p.user_properties);
        self.opt_str(&p.content_type);
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
        self.opt_str(&p.content_type);
        self.opt_str(&p.response_topic);
        self.opt_bytes(&p.correlation_data);
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
    pub fn op(&mut self, op: &Op) {
        match op {
            Op::PutSession(meta) => {
                self.u8(PUT_SESSION);
                self.str(&meta.client_id);
                self.u8(meta.protocol as u8);
                self.u32(meta.expiry_interval);
                self.opt_u64(meta.disconnected_at_unix_ms);
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
                self.options(&subscription.options);
                self.opt_u32(subscription.identifier);
            }
            Op::DeleteSubscription { client_id, filter } => {
                self.u8(DELETE_SUBSCRIPTION);
                self.str(client_id);
                self.str(filter);
            }
            Op::PutMessage { id, message } => {
                self.u8(PUT_MESSAGE);
                self.u64(*id);
                self.message(message);
            }
            Op::Enqueue {
                client_id,
                seq,
                entry,
            } => {
                self.u8(ENQUEUE);
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
                self.u8(PUT_RETAINED);
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
            Op::DeleteWill { client_id } => {
                self.u8(DELETE_WILL);
                self.str(client_id);
            }
        }
    }
}

/// Reads encodings back, bounds-checked.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    /// A reader at the start of `buf` (one frame body).
    pub fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, pos: 0 }
    }

    /// True once every byte was read: a frame with bytes left over is corrupt.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn err(&self, what: &'static str) -> DecodeError {
        DecodeError {
            what,
            pos: self.pos,
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.err(what))?;
        let slice = self.buf.get(self.pos..end).ok_or_else(|| self.err(what))?;
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    /// Reads a little-endian `u8` (frame kinds and counts are read with these).
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>("u8")?[0])
    }
    /// Reads a little-endian `u16` (frame kinds and counts are read with these).
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array("u16")?))
    }
    /// Reads a little-endian `u32` (frame kinds and counts are read with these).
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array("u32")?))
    }
    /// Reads a little-endian `u64` (frame kinds and counts are read with these).
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array("u64")?))
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.err("bool")),
        }
    }
    fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u32()? as usize;
        // Copy out of the read buffer: a slice would pin the whole file buffer in memory.
        Ok(Bytes::copy_from_slice(self.take(len, "byte string")?))
    }
    fn str(&mut self) -> Result<ByteString, DecodeError> {
        let pos = self.pos;
        let bytes = self.bytes()?;
        ByteString::try_from(bytes).map_err(|_| DecodeError {
            what: "UTF-8 string",
            pos,
        })
    }
    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.err("option tag")),
        }
    }
    fn opt_u8(&mut self) -> Result<Option<u8>, DecodeError> {
        Ok(if self.flag()? { Some(self.u8()?) } else { None })
    }
    fn opt_u32(&mut self) -> Result<Option<u32>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.u32()?)
        } else {
            None
        })
    }
    fn opt_u64(&mut self) -> Result<Option<u64>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.u64()?)
        } else {
            None
        })
    }
    fn opt_str(&mut self) -> Result<Option<ByteString>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.str()?)
        } else {
            None
        })
    }
    fn opt_bytes(&mut self) -> Result<Option<Bytes>, DecodeError> {
        Ok(if self.flag()? {
            Some(self.bytes()?)
        } else {
            None
        })
    }
    /// A count of items that each take at least `min_size` bytes; rejects counts the rest of
    /// the buffer cannot hold, so a corrupt count cannot trigger a huge allocation.
    fn count(&mut self, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.buf.len().saturating_sub(self.pos) {
            return Err(self.err("item count"));
        }
        Ok(n)
    }
    fn user_properties(&mut self) -> Result<UserProperties, DecodeError> {
        let n = self.count(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.str()?, self.str()?));
        }
        Ok(v)
    }
    fn qos(&mut self) -> Result<QoS, DecodeError> {
        let v = self.u8()?;
        QoS::from_u8(v).ok_or_else(|| self.err("QoS"))
    }
    fn protocol(&mut self) -> Result<ProtocolVersion, DecodeError> {
        match self.u8()? {
            3 => Ok(ProtocolVersion::V3_1),
            4 => Ok(ProtocolVersion::V3_1_1),
            5 => Ok(ProtocolVersion::V5),
            _ => Err(self.err("protocol version")),
        }
    }
    fn options(&mut self) -> Result<SubscriptionOptions, DecodeError> {
        Ok(SubscriptionOptions {
            qos: self.qos()?,
            no_local: self.bool()?,
            retain_as_published: self.bool()?,
            retain_handling: self.u8()?,
        })
    }
    fn message(&mut self) -> Result<StoredMessage, DecodeError> {
        let topic = self.str()?;
        let payload = self.bytes()?;
        let qos = self.qos()?;
        let retain = self.bool()?;
        let properties = PublishProperties {
            payload_format_indicator: self.opt_u8()?,
            message_expiry_interval: self.opt_u32()?,
            response_topic: self.opt_str()?,
            correlation_data: self.opt_bytes()?,
            user_properties: self.user_properties()?,
            content_type: self.opt_str()?,
            ..Default::default()
        };
        Ok(StoredMessage {
            topic,
            payload,
            qos,
            retain,
            properties,
            received_at_unix_ms: self.u64()?,
            expires_at_unix_ms: self.opt_u64()?,
        })
    }
    fn will(&mut self) -> Result<LastWill, DecodeError> {
        let topic = self.str()?;
        let payload = self.bytes()?;
        let qos = self.qos()?;
        let retain = self.bool()?;
        let properties = WillProperties {
            will_delay_interval: self.opt_u32()?,
            payload_format_indicator: self.opt_u8()?,
            message_expiry_interval: self.opt_u32()?,
            content_type: self.opt_str()?,
            response_topic: self.opt_str()?,
            correlation_data: self.opt_bytes()?,
            user_properties: self.user_properties()?,
        };
        Ok(LastWill {
            topic,
            payload,
            qos,
            retain,
            properties,
        })
    }
    fn stage(&mut self) -> Result<EntryStage, DecodeError> {
        Ok(match self.u8()? {
            0 => EntryStage::Queued,
            1 => EntryStage::AwaitPubAck {
                packet_id: self.u16()?,
            },
            2 => EntryStage::AwaitPubRec {
                packet_id: self.u16()?,
            },
            3 => EntryStage::AwaitPubComp {
                packet_id: self.u16()?,
            },
            _ => return Err(self.err("entry stage")),
        })
    }

    /// Reads one op.
    pub fn op(&mut self) -> Result<Op, DecodeError> {
        let tag_pos = self.pos;
        Ok(match self.u8()? {
            PUT_SESSION => Op::PutSession(SessionMeta {
                client_id: self.str()?,
                protocol: self.protocol()?,
                expiry_interval: self.u32()?,
                disconnected_at_unix_ms: self.opt_u64()?,
            }),
            DELETE_SESSION => Op::DeleteSession {
                client_id: self.str()?,
            },
            PUT_SUBSCRIPTION => Op::PutSubscription {
                client_id: self.str()?,
                filter: self.str()?,
                subscription: SubscriptionRecord {
                    options: self.options()?,
                    identifier: self.opt_u32()?,
                },
            },
            DELETE_SUBSCRIPTION => Op::DeleteSubscription {
                client_id: self.str()?,
                filter: self.str()?,
            },
            PUT_MESSAGE => Op::PutMessage {
                id: self.u64()?,
                message: self.message()?,
            },
            ENQUEUE => {
                let client_id = self.str()?;
                let seq = self.u64()?;
                let message = self.u64()?;
                let qos = self.qos()?;
                let retain = self.bool()?;
                let n = self.count(4)?;
                let mut subscription_ids = SmallVec::with_capacity(n);
                for _ in 0..n {
                    subscription_ids.push(self.u32()?);
                }
                Op::Enqueue {
                    client_id,
                    seq,
                    entry: QueueEntry {
                        message,
                        qos,
                        retain,
                        subscription_ids,
                        stage: self.stage()?,
                    },
                }
            }
            UPDATE_ENTRY => Op::UpdateEntry {
                client_id: self.str()?,
                seq: self.u64()?,
                stage: self.stage()?,
            },
            REMOVE_ENTRY => Op::RemoveEntry {
                client_id: self.str()?,
                seq: self.u64()?,
            },
            PUT_INBOUND => Op::PutInboundQos2 {
                client_id: self.str()?,
                packet_id: self.u16()?,
            },
            REMOVE_INBOUND => Op::RemoveInboundQos2 {
                client_id: self.str()?,
                packet_id: self.u16()?,
            },
            PUT_RETAINED => Op::PutRetained {
                topic: self.str()?,
                message: self.message()?,
            },
            DELETE_RETAINED => Op::DeleteRetained { topic: self.str()? },
            PUT_WILL => Op::PutWill {
                client_id: self.str()?,
                will: self.will()?,
                publish_at_unix_ms: self.u64()?,
            },
            DELETE_WILL => Op::DeleteWill {
                client_id: self.str()?,
            },
            _ => {
                return Err(DecodeError {
                    what: "op tag",
                    pos: tag_pos,
                })
            }
        })
    }

    /// Reads a `u32` count followed by that many ops (a log frame's body).
    pub fn ops(&mut self) -> Result<Vec<Op>, DecodeError> {
        let n = self.count(2)?;
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            ops.push(self.op()?);
        }
        Ok(ops)
    }
}
