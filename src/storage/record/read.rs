//! Decoding the record format (see the parent module). Must not panic or trust a length:
//! every read is bounds-checked, since the bytes come from disk and may be damaged.

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;

use super::*;
use crate::codec::{
    LastWill, ProtocolVersion, PublishProperties, QoS, SubscriptionOptions, UserProperties,
    WillProperties,
};
use crate::storage::{
    EntryStage, Op, QueueEntry, SessionMeta, SessionOwner, StoredMessage, SubscriptionRecord,
};

/// Reads encodings back, bounds-checked.
pub(crate) struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    /// A reader at the start of `buf` (one frame body).
    pub(crate) fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, pos: 0 }
    }

    /// True once every byte was read: a frame with bytes left over is corrupt.
    pub(crate) fn is_empty(&self) -> bool {
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
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>("u8")?[0])
    }
    /// Reads a little-endian `u16` (frame kinds and counts are read with these).
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array("u16")?))
    }
    /// Reads a little-endian `u32` (frame kinds and counts are read with these).
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array("u32")?))
    }
    /// Reads a little-endian `u64` (frame kinds and counts are read with these).
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
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
        Ok(StoredMessage {
            topic: self.str()?,
            payload: self.bytes()?,
            qos: self.qos()?,
            retain: self.bool()?,
            properties: PublishProperties {
                payload_format_indicator: self.opt_u8()?,
                message_expiry_interval: self.opt_u32()?,
                response_topic: self.opt_str()?,
                correlation_data: self.opt_bytes()?,
                user_properties: self.user_properties()?,
                content_type: self.opt_str()?,
                ..Default::default()
            },
            received_at_unix_ms: self.u64()?,
            expires_at_unix_ms: self.opt_u64()?,
            from_anonymous: false, // only the `_ANONYMOUS` tags say otherwise
        })
    }
    fn will(&mut self) -> Result<LastWill, DecodeError> {
        Ok(LastWill {
            topic: self.str()?,
            payload: self.bytes()?,
            qos: self.qos()?,
            retain: self.bool()?,
            properties: WillProperties {
                will_delay_interval: self.opt_u32()?,
                payload_format_indicator: self.opt_u8()?,
                message_expiry_interval: self.opt_u32()?,
                content_type: self.opt_str()?,
                response_topic: self.opt_str()?,
                correlation_data: self.opt_bytes()?,
                user_properties: self.user_properties()?,
            },
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
    pub(crate) fn op(&mut self) -> Result<Op, DecodeError> {
        let tag_pos = self.pos;
        Ok(match self.u8()? {
            PUT_SESSION => Op::PutSession(SessionMeta {
                client_id: self.str()?,
                protocol: self.protocol()?,
                expiry_interval: self.u32()?,
                disconnected_at_unix_ms: self.opt_u64()?,
                owner: SessionOwner::Unbound,
            }),
            PUT_SESSION_OWNED => Op::PutSession(SessionMeta {
                client_id: self.str()?,
                protocol: self.protocol()?,
                expiry_interval: self.u32()?,
                disconnected_at_unix_ms: self.opt_u64()?,
                owner: match self.u8()? {
                    1 => SessionOwner::Anonymous,
                    2 => SessionOwner::User(Box::from(&*self.str()?)),
                    _ => return Err(self.err("session owner")),
                },
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
            PUT_MESSAGE_ANONYMOUS => Op::PutMessage {
                id: self.u64()?,
                message: StoredMessage {
                    from_anonymous: true,
                    ..self.message()?
                },
            },
            tag @ (ENQUEUE | ENQUEUE_SHARED) => {
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
                let stage = self.stage()?;
                let shared = if tag == ENQUEUE_SHARED {
                    Some(std::sync::Arc::from(&*self.str()?))
                } else {
                    None
                };
                Op::Enqueue {
                    client_id,
                    seq,
                    entry: QueueEntry {
                        message,
                        qos,
                        retain,
                        subscription_ids,
                        stage,
                        deliveries: 0,
                        shared,
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
            PUT_RETAINED_ANONYMOUS => Op::PutRetained {
                topic: self.str()?,
                message: StoredMessage {
                    from_anonymous: true,
                    ..self.message()?
                },
            },
            DELETE_RETAINED => Op::DeleteRetained { topic: self.str()? },
            PUT_WILL => Op::PutWill {
                client_id: self.str()?,
                will: self.will()?,
                publish_at_unix_ms: self.u64()?,
            },
            COUNT_DELIVERY => Op::CountDelivery {
                client_id: self.str()?,
                seq: self.u64()?,
                deliveries: self.u16()?,
            },
            PUT_DEDUP => Op::PutDedup {
                topic: self.str()?,
                key: self.str()?,
                expires_at_unix_ms: self.u64()?,
            },
            DELETE_WILL => Op::DeleteWill {
                client_id: self.str()?,
            },
            SEQUENCE_MESSAGE => Op::SequenceMessage {
                id: self.u64()?,
                stream_seq: self.u64()?,
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
    pub(crate) fn ops(&mut self) -> Result<Vec<Op>, DecodeError> {
        let n = self.count(2)?;
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            ops.push(self.op()?);
        }
        Ok(ops)
    }
}
