//! Shared PUBLISH encodings: encode a message once per kind of subscriber, then copy it and
//! patch only the flags byte and the packet id per subscriber ("encode once per subscriber
//! group"). The byte layout stays here; the broker only asks for a copy.
//!
//! Must not: hold per-subscriber state.

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};

use super::encode::{encode_publish, PublishHeader};
use super::error::EncodeError;
use super::types::{ProtocolVersion, PublishProperties, QoS};

/// Per-subscriber choices for one PUBLISH on the wire.
#[derive(Clone, Copy, Debug)]
pub struct PublishFlags<'a> {
    /// Delivered QoS: `min(published, granted)`.
    pub qos: QoS,
    /// RETAIN as this subscriber sees it.
    pub retain: bool,
    /// DUP: sent before (MQTT-3.3.1-1).
    pub dup: bool,
    /// The subscriber's packet id (ignored at QoS 0).
    pub packet_id: u16,
    /// Subscription identifiers to add (v5).
    pub subscription_ids: &'a [u32],
    /// Outbound topic alias for this PUBLISH, if the connection uses them.
    pub topic_alias: Option<PublishAlias>,
}

/// An outbound topic alias on one PUBLISH (chosen by the connection, which owns the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishAlias {
    /// The alias, 1..=the client's Topic Alias Maximum.
    pub alias: u16,
    /// Send the topic name too (the alias is being bound); otherwise the topic is empty.
    pub with_topic: bool,
}

/// The body of a message as every subscriber gets it (topic, payload, forwarded properties).
#[derive(Clone, Copy, Debug)]
pub struct PublishBody<'a> {
    /// Topic name.
    pub topic: &'a str,
    /// Application payload.
    pub payload: &'a [u8],
    /// v5 properties forwarded unchanged (`None`: none).
    pub properties: Option<&'a PublishProperties>,
}

/// The shared encodings of one message, by slot: v3 / v5 × without / with a packet id.
///
/// Nearly every message is encoded for one kind of subscriber only, so the first encoding
/// sits inline and the other slots are allocated only when a second kind shows up: 80 B per
/// message instead of four inline slots (224 B), which matters for every queued message.
#[derive(Debug, Default)]
pub struct PublishEncodings {
    /// The first encoding made, with its slot.
    first: OnceLock<(u8, EncodedPublish)>,
    /// Every other slot, once a second kind of subscriber needs one.
    others: OnceLock<Box<[OnceLock<EncodedPublish>; 4]>>,
}

/// A cached PUBLISH encoding and where its packet id sits.
#[derive(Debug)]
struct EncodedPublish {
    bytes: Bytes,
    packet_id_offset: Option<usize>,
}

impl PublishEncodings {
    /// Appends `body` as a PUBLISH for one subscriber to `out`, from the shared encoding for
    /// `version` (made now if nobody made it yet), with `flags`' DUP, QoS, RETAIN and packet
    /// id patched in. Subscriber-specific properties (`flags.subscription_ids`,
    /// `flags.topic_alias`) are not applied: use [`encode_publish`] for those. Returns the
    /// number of bytes written, and the bytes of the encoding made and cached by this call (0
    /// when it was cached already), for the caller's memory count: a cached encoding lives as
    /// long as the message (issue 35, ninth pass R4), see [`PublishEncodings::held_bytes`].
    ///
    /// # Errors
    ///
    /// An `EncodeError` when the shared encoding cannot be made (a field or the packet exceeds
    /// its wire limit).
    pub fn write(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
        body: PublishBody<'_>,
        flags: &PublishFlags<'_>,
    ) -> Result<(usize, usize), EncodeError> {
        let start = out.len();
        let with_id = flags.qos != QoS::AtMostOnce;
        let slot = usize::from(version.is_v5()) * 2 + usize::from(with_id);
        let mut made = 0;
        let cached =
            self.get_or_try_init(slot, &mut made, || encode_shared(body, version, with_id))?;
        out.extend_from_slice(&cached.bytes);
        out[start] =
            0x30 | (u8::from(flags.dup) << 3) | ((flags.qos as u8) << 1) | u8::from(flags.retain);
        if let Some(off) = cached.packet_id_offset {
            out[start + off..start + off + 2].copy_from_slice(&flags.packet_id.to_be_bytes());
        }
        Ok((out.len() - start, made))
    }

    /// Whether the encoding [`PublishEncodings::write`] would use for `version` and `qos` is
    /// cached already (so writing it makes no further copy).
    pub fn is_cached(&self, version: ProtocolVersion, qos: QoS) -> bool {
        let slot = usize::from(version.is_v5()) * 2 + usize::from(qos != QoS::AtMostOnce);
        self.first
            .get()
            .is_some_and(|(s, _)| usize::from(*s) == slot)
            || self
                .others
                .get()
                .is_some_and(|others| others.get(slot).is_some_and(|e| e.get().is_some()))
    }

    /// Bytes of the encodings cached: what [`PublishEncodings::write`] reported made, summed.
    pub fn held_bytes(&self) -> usize {
        let first = self.first.get().map_or(0, |(_, e)| e.bytes.len());
        let others = self.others.get().map_or(0, |others| {
            others
                .iter()
                .filter_map(OnceLock::get)
                .map(|e| e.bytes.len())
                .sum()
        });
        first + others
    }

    /// The encoding for `slot`, made with `encode` if nobody made it yet; `made` is set to its
    /// bytes when this call's encoding is the one cached (a racing thread's may win instead).
    fn get_or_try_init(
        &self,
        slot: usize,
        made: &mut usize,
        encode: impl Fn() -> Result<EncodedPublish, EncodeError>,
    ) -> Result<&EncodedPublish, EncodeError> {
        let first = match self.first.get() {
            Some(first) => first,
            None => {
                let encoded = encode()?;
                self.first.get_or_init(|| {
                    *made = encoded.bytes.len();
                    (slot as u8, encoded)
                })
            }
        };
        if usize::from(first.0) == slot {
            return Ok(&first.1);
        }
        // A second kind of subscriber (or another thread won the race for `first`: then the
        // encoding is simply made again, once).
        let others = self.others.get_or_init(Default::default);
        match others[slot].get() {
            Some(cached) => Ok(cached),
            None => {
                let encoded = encode()?;
                Ok(others[slot].get_or_init(|| {
                    *made = encoded.bytes.len();
                    encoded
                }))
            }
        }
    }
}

/// The shared encoding: QoS 1 with packet id 1 as a placeholder when `with_id`, patched later.
fn encode_shared(
    body: PublishBody<'_>,
    version: ProtocolVersion,
    with_id: bool,
) -> Result<EncodedPublish, EncodeError> {
    let mut buf = BytesMut::with_capacity(body.payload.len() + body.topic.len() + 16);
    let header = PublishHeader {
        dup: false,
        qos: if with_id {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        },
        retain: false,
        topic: body.topic,
        packet_id: 1,
        properties: body.properties,
    };
    let packet_id_offset = encode_publish(&header, body.payload, version, &mut buf)?;
    Ok(EncodedPublish {
        bytes: buf.freeze(),
        packet_id_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, Packet};

    /// A patched copy decodes exactly like a fresh encoding with the same flags, at every
    /// level and QoS: the patching never corrupts the layout.
    #[test]
    fn patched_copies_decode_like_fresh_encodings() {
        let encodings = PublishEncodings::default();
        let body = PublishBody {
            topic: "a/b",
            payload: b"hello",
            properties: None,
        };
        for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
            for (qos, packet_id) in [
                (QoS::AtMostOnce, 0),
                (QoS::AtLeastOnce, 7),
                (QoS::ExactlyOnce, 65535),
            ] {
                for (dup, retain) in [(false, false), (true, true)] {
                    let dup = dup && qos != QoS::AtMostOnce;
                    let flags = PublishFlags {
                        qos,
                        retain,
                        dup,
                        packet_id,
                        subscription_ids: &[],
                        topic_alias: None,
                    };
                    let mut out = BytesMut::new();
                    encodings.write(&mut out, version, body, &flags).unwrap();
                    let Ok(Some(Packet::Publish(p))) = decode(&mut out, Some(version), usize::MAX)
                    else {
                        panic!("not a PUBLISH");
                    };
                    assert_eq!((p.qos, p.retain, p.dup), (qos, retain, dup));
                    assert_eq!(&*p.topic, "a/b");
                    assert_eq!(&p.payload[..], b"hello");
                    if qos != QoS::AtMostOnce {
                        assert_eq!(p.packet_id, packet_id);
                    }
                }
            }
        }
    }
}
