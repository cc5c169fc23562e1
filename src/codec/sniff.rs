//! Reading the protocol level of a CONNECT that failed to decode, so that the rejection
//! CONNACK can be written in the client's own protocol version.

use super::ProtocolVersion;

/// Protocol level of the (possibly malformed) CONNECT at the front of `buf`, if the bytes get
/// that far and name a level we know.
pub fn peek_connect_version(buf: &[u8]) -> Option<ProtocolVersion> {
    if buf.first()? >> 4 != 1 {
        return None;
    }
    // Skip the variable-byte remaining length (at most 4 bytes).
    let mut i = 1;
    while *buf.get(i)? & 0x80 != 0 {
        i += 1;
        if i > 4 {
            return None;
        }
    }
    i += 1;
    let name_len = usize::from(u16::from_be_bytes([*buf.get(i)?, *buf.get(i + 1)?]));
    let level = *buf.get(i + 2 + name_len)?;
    // A bridge's 3.x level (0x83 / 0x84) is answered in its own version too.
    super::decode::protocol_level(buf.get(i + 2..i + 2 + name_len)?, level).map(|(v, _)| v)
}

/// Control packet type of SUBSCRIBE (MQTT 2.1.2).
const SUBSCRIBE: u8 = 8;

/// Whether one of the complete packets at the front of `buf` is a SUBSCRIBE, by their fixed
/// headers alone (nothing is decoded or consumed).
///
/// Why: a connection that has just read a SUBSCRIBE tells other connections to hold their
/// PUBLISHes until it is in the trie (`broker::SubscribeFence`), and must know before it
/// starts handling the read. A malformed header ends the walk: decoding reports it.
pub fn holds_subscribe(buf: &[u8]) -> bool {
    let mut rest = buf;
    while let Some((&byte1, after)) = rest.split_first() {
        let Ok(Some((remaining, n))) = super::varint::decode_varint(after) else {
            return false;
        };
        let Some(next) = rest.get(1 + n + remaining..) else {
            return false; // incomplete: not handled in this read
        };
        if byte1 >> 4 == SUBSCRIBE {
            return true;
        }
        rest = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_level_from_partial_connect() {
        let v5 = [0x10, 0x10, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0xFF];
        assert_eq!(peek_connect_version(&v5), Some(ProtocolVersion::V5));
        let v31 = [
            0x10, 0x10, 0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03,
        ];
        assert_eq!(peek_connect_version(&v31), Some(ProtocolVersion::V3_1));
        assert_eq!(peek_connect_version(&[0x10, 0x10, 0x00]), None);
        assert_eq!(peek_connect_version(&[0x30, 0x00]), None);
    }

    #[test]
    fn finds_a_complete_subscribe_behind_other_packets_only() {
        let pingreq = [0xC0, 0x00];
        let subscribe = [0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b't', 0x00];
        let publish = [0x30, 0x04, 0x00, 0x01, b't', b'x'];
        assert!(!holds_subscribe(&[]));
        assert!(!holds_subscribe(&publish));
        assert!(holds_subscribe(&subscribe));
        let mut mixed = Vec::new();
        mixed.extend_from_slice(&publish);
        mixed.extend_from_slice(&pingreq);
        mixed.extend_from_slice(&subscribe);
        assert!(holds_subscribe(&mixed));
        assert!(!holds_subscribe(&mixed[..mixed.len() - 1]), "incomplete");
        assert!(
            !holds_subscribe(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            "bad length"
        );
    }
}
