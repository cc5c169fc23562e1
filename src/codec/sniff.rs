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
    match (buf.get(i + 2..i + 2 + name_len)?, level) {
        (b"MQTT", 5) => Some(ProtocolVersion::V5),
        (b"MQTT", 4) => Some(ProtocolVersion::V3_1_1),
        (b"MQIsdp", 3) => Some(ProtocolVersion::V3_1),
        _ => None,
    }
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
}
