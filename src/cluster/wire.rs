//! What a message looks like on NATS: one frame,
//! `[1][origin length][origin node][local id, u64 big-endian][PUBLISH]`,
//! where PUBLISH is the message encoded as an MQTT 5 PUBLISH packet by the codec (topic, QoS,
//! RETAIN, properties with the remaining Message Expiry Interval, payload). No second format
//! to keep in step with MQTT, and the receiving node decodes it with the same codec it
//! decodes clients with.
//!
//! A frame may end with one byte after the PUBLISH, [`ANONYMOUS`] and bits to come: written
//! only when a bit is set, so other frames are the bytes they always were. Nodes of earlier
//! versions decode the PUBLISH and leave what follows it unread, and a frame without the
//! byte reads as every bit clear, so a rolling upgrade works both ways.

use bytes::{BufMut, Bytes, BytesMut};

use crate::broker::stranger_share::StrangerShare;
use crate::broker::Message;
use crate::codec::{self, Packet, ProtocolVersion, Publish, PublishFlags};

/// The frame format's version byte.
const VERSION: u8 = 1;

/// The trailer's bit for a message an anonymous client published (or a dead letter one
/// caused): every node that holds it
/// charges it to the anonymous share of its memory budget, retained (pass 7B, P6: without
/// it, a node's copy from the retained bucket replaced the counted one uncounted, and one
/// stranger filled every node's budget) or queued (issue 35, fifteenth pass, B3: another
/// node queued a stranger's messages at its verified users' sessions uncharged). Nodes of
/// earlier versions wrote it for retained messages only, and read it for those only.
const ANONYMOUS: u8 = 0b1;

/// Where the trailer keeps the stranger's share ([`StrangerShare::slot`], six bits) beside
/// [`ANONYMOUS`]: a bridge's remote's message counts in that bridge's share on every node,
/// as on the node that took it, not in anonymous clients' (issue 35, seventeenth pass, D5:
/// another node's anonymous clients' messages in transit pushed the share past its bound
/// and the bridge's command was dropped there). Earlier versions read bit 0 alone: to them
/// it is an anonymous client's, as they always took it.
const SHARE_SHIFT: u8 = 1;

/// Why a frame from NATS could not be read (counted, the message skipped: it was written by
/// something that is not a Postbox node of this version).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// Shorter than its header, or of another version.
    #[error("not a Postbox cluster frame")]
    Header,
    /// The PUBLISH inside does not decode.
    #[error("its PUBLISH does not decode: {0}")]
    Publish(#[from] codec::DecodeError),
    /// Something other than a PUBLISH.
    #[error("it holds no PUBLISH")]
    NotPublish,
}

/// Encodes `message` from node `origin`, where it had `local_id` (the node's own order of
/// admission, which a session replay uses to tell the node's own messages apart).
///
/// # Errors
///
/// The codec cannot encode it (a field beyond its wire limit; never for a message a client
/// could send).
pub(crate) fn encode(
    origin: &str,
    local_id: u64,
    message: &Message,
) -> Result<Bytes, codec::EncodeError> {
    let mut buf = BytesMut::with_capacity(
        10 + origin.len() + 16 + message.topic.len() + message.payload.len(),
    );
    buf.put_u8(VERSION);
    buf.put_u8(origin.len() as u8); // config: at most 32 bytes
    buf.put_slice(origin.as_bytes());
    buf.put_u64(local_id);
    message.write_to(
        &mut buf,
        ProtocolVersion::V5,
        PublishFlags {
            qos: message.qos,
            retain: message.retain,
            dup: false,
            packet_id: 1,
            subscription_ids: &[],
            topic_alias: None,
        },
    )?;
    if message.charged_anonymous() || message.from_anonymous {
        buf.put_u8(ANONYMOUS | (message.stranger_share().slot() << SHARE_SHIFT));
    }
    Ok(buf.freeze())
}

/// The origin node of a frame, without decoding the rest (to skip a node's own messages).
pub(crate) fn origin(frame: &[u8]) -> Option<&[u8]> {
    let (&version, rest) = frame.split_first()?;
    let (&len, rest) = rest.split_first()?;
    if version != VERSION {
        return None;
    }
    rest.get(..usize::from(len))
}

/// Decodes a frame into its origin node, local id, PUBLISH, and the stranger's share the
/// frame charges its message to ([`ANONYMOUS`] and the share's slot; `None` for a verified
/// publisher's, and for any frame of a node that does not mark it): the caller marks the
/// message it makes ([`message_of`]).
///
/// # Errors
///
/// The frame is not one [`encode`] wrote.
pub(crate) fn decode(
    frame: &[u8],
) -> Result<(String, u64, Publish, Option<StrangerShare>), FrameError> {
    let origin = origin(frame).ok_or(FrameError::Header)?;
    let at = 2 + origin.len();
    let id: [u8; 8] = frame
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .ok_or(FrameError::Header)?;
    let origin = String::from_utf8_lossy(origin).into_owned();
    let mut body = BytesMut::from(&frame[at + 8..]);
    match codec::decode(&mut body, Some(ProtocolVersion::V5), usize::MAX)? {
        Some(Packet::Publish(publish)) => {
            // What follows the PUBLISH: the trailer, if any (unknown bits are ignored).
            let stranger = body
                .first()
                .filter(|&&flags| flags & ANONYMOUS != 0)
                .map(|&flags| StrangerShare::from_slot(flags >> SHARE_SHIFT));
            Ok((origin, u64::from_be_bytes(id), publish, stranger))
        }
        Some(_) => Err(FrameError::NotPublish),
        None => Err(FrameError::Header),
    }
}

/// The message of a decoded frame, marked as a stranger's when the frame says so: it then
/// counts in that share of this node's budget too, as on the node that took it, retained
/// (pass 7B, P6) or queued (issue 35, fifteenth pass, B3). Origin `None`: no session of
/// this node published it, so No Local never applies.
pub(super) fn message_of(publish: Publish, stranger: Option<StrangerShare>) -> Message {
    let mut message = Message::from_publish(publish, None);
    if let Some(share) = stranger {
        message.set_published_by_stranger(share);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{PublishProperties, QoS};

    #[test]
    fn a_message_survives_the_trip() {
        let publish = Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: "a/b".into(),
            packet_id: 7,
            payload: Bytes::from_static(b"hello"),
            properties: PublishProperties {
                content_type: Some("text/plain".into()),
                user_properties: vec![("k".into(), "v".into())],
                ..Default::default()
            },
        };
        let message = Message::from_publish(publish, None);
        let frame = encode("node-a", 42, &message).expect("encodes");
        assert_eq!(origin(&frame), Some(&b"node-a"[..]));
        let (from, id, back, stranger) = decode(&frame).expect("decodes");
        assert_eq!(stranger, None);
        assert_eq!(from, "node-a");
        assert_eq!(id, 42);
        assert_eq!(&*back.topic, "a/b");
        assert_eq!(back.qos, QoS::ExactlyOnce);
        assert!(back.retain);
        assert_eq!(&back.payload[..], b"hello");
        assert_eq!(back.properties.content_type.as_deref(), Some("text/plain"));
        assert_eq!(back.properties.user_properties.len(), 1);
    }

    /// An anonymous client's message, retained or not (fifteenth pass, B3), is marked by one
    /// byte after the PUBLISH; every other message's frame is the bytes it always was, and a
    /// frame without the byte (as a node of an earlier version writes every frame but an
    /// anonymous retained one) decodes as not anonymous. The marked frame's PUBLISH decodes
    /// as before, as a node of an earlier version reads it (it leaves what follows the
    /// PUBLISH unread): a rolling upgrade works both ways (pass 7B, P6).
    #[test]
    fn the_anonymous_mark_is_a_trailer_older_frames_lack() {
        for retain in [true, false] {
            let publish = Publish {
                qos: QoS::AtLeastOnce,
                retain,
                topic: "a/b".into(),
                packet_id: 1,
                payload: Bytes::from_static(b"hello"),
                ..Default::default()
            };
            let plain = Message::from_publish(publish.clone(), None);
            let mut marked = Message::from_publish(publish, None);
            marked.set_published_anonymously(true);
            let old = encode("node-a", 3, &plain).expect("encodes");
            let new = encode("node-a", 3, &marked).expect("encodes");
            assert_eq!(
                new[..new.len() - 1],
                old[..],
                "the PUBLISH before the mark changed"
            );
            assert_eq!(new[new.len() - 1], ANONYMOUS, "retain {retain}");

            let (_, _, from_old, stranger) = decode(&old).expect("decodes");
            assert_eq!(
                stranger, None,
                "a frame without the mark is not a stranger's"
            );
            let (origin, id, from_new, stranger) = decode(&new).expect("decodes");
            assert_eq!(stranger, Some(StrangerShare::ANONYMOUS));
            assert_eq!((origin.as_str(), id), ("node-a", 3));
            assert_eq!(from_new, from_old);
            // What an older node reads: the PUBLISH at the front, the rest left.
            let mut body = BytesMut::from(&new[2 + 6 + 8..]);
            let read = codec::decode(&mut body, Some(ProtocolVersion::V5), usize::MAX);
            assert!(matches!(read, Ok(Some(Packet::Publish(p))) if p == from_old));
            assert_eq!(&body[..], &[ANONYMOUS]);
        }
    }

    /// A bridge's remote's message keeps its bridge's share across nodes (seventeenth pass,
    /// D5), in the trailer's bits above [`ANONYMOUS`], which an older node reads alone.
    #[test]
    fn a_bridges_share_travels_in_the_trailer() {
        let publish = Publish {
            qos: QoS::AtLeastOnce,
            topic: "a/b".into(),
            packet_id: 1,
            payload: Bytes::from_static(b"hello"),
            ..Default::default()
        };
        let share = StrangerShare::of_bridge(4);
        let mut message = Message::from_publish(publish, None);
        message.set_published_by_stranger(share);
        let frame = encode("node-a", 3, &message).expect("encodes");
        let flags = frame[frame.len() - 1];
        assert_eq!(flags & ANONYMOUS, ANONYMOUS, "an older node's reading");
        let (_, _, publish, stranger) = decode(&frame).expect("decodes");
        assert_eq!(stranger, Some(share));
        assert_eq!(message_of(publish, stranger).stranger_share(), share);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for frame in [
            &b""[..],
            b"\x01",
            b"\x02\x00",
            b"\x01\x05ab",
            b"\x01\x00\x30",
            b"\x01\x00\0\0\0\0\0\0\0\x01\x30",
        ] {
            assert!(decode(frame).is_err(), "{frame:?}");
        }
    }
}
