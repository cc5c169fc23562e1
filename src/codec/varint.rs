//! Variable Byte Integers (spec 3.1.1 §2.2.3, 5.0 §1.5.5): the remaining length, property
//! lengths and a few property values.

use bytes::{BufMut, BytesMut};

use super::DecodeError;

/// The largest value four bytes can carry (268,435,455).
pub(super) const MAX_VARINT: usize = 0x0FFF_FFFF;

/// Reads a variable byte integer from the front of `buf`.
///
/// `Ok(None)`: `buf` ends inside the integer. `Ok(Some((value, bytes_used)))` otherwise.
/// Non-minimal encodings (e.g. `0x80 0x00`) are accepted: minimality binds the sender
/// (MQTT-1.5.5-1), and rejecting it buys nothing. A fifth byte is always malformed.
#[inline]
pub(super) fn decode_varint(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    // Fast path: almost every remaining length of a small packet fits in one byte.
    match buf.first() {
        None => return Ok(None),
        Some(&b) if b & 0x80 == 0 => return Ok(Some((b as usize, 1))),
        Some(_) => {}
    }
    let mut value = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(i) else {
            return Ok(None);
        };
        value |= ((b & 0x7F) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    Err(DecodeError::Malformed(
        "variable byte integer longer than 4 bytes",
    ))
}

/// How many bytes `value` takes as a (minimal) variable byte integer; `value <= MAX_VARINT`.
#[inline]
pub(super) fn varint_len(value: usize) -> usize {
    match value {
        0..=0x7F => 1,
        0x80..=0x3FFF => 2,
        0x4000..=0x1F_FFFF => 3,
        _ => 4,
    }
}

/// Appends `value` (at most `MAX_VARINT`) in its minimal encoding.
#[inline]
pub(super) fn put_varint(buf: &mut BytesMut, mut value: usize) {
    debug_assert!(value <= MAX_VARINT);
    loop {
        let byte = (value & 0x7F) as u8;
        value >>= 7;
        if value == 0 {
            buf.put_u8(byte);
            return;
        }
        buf.put_u8(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boundary values of spec 5.0 Table 1-1 / 3.1.1 Table 2.4.
    const TABLE: &[(usize, &[u8])] = &[
        (0, &[0x00]),
        (127, &[0x7F]),
        (128, &[0x80, 0x01]),
        (16_383, &[0xFF, 0x7F]),
        (16_384, &[0x80, 0x80, 0x01]),
        (2_097_151, &[0xFF, 0xFF, 0x7F]),
        (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
        (268_435_455, &[0xFF, 0xFF, 0xFF, 0x7F]),
    ];

    #[test]
    fn spec_table_round_trips() {
        for &(value, bytes) in TABLE {
            assert_eq!(decode_varint(bytes), Ok(Some((value, bytes.len()))));
            assert_eq!(varint_len(value), bytes.len());
            let mut buf = BytesMut::new();
            put_varint(&mut buf, value);
            assert_eq!(&buf[..], bytes);
        }
    }

    #[test]
    fn truncated_is_incomplete() {
        assert_eq!(decode_varint(&[]), Ok(None));
        assert_eq!(decode_varint(&[0x80]), Ok(None));
        assert_eq!(decode_varint(&[0xFF, 0xFF, 0xFF]), Ok(None));
    }

    #[test]
    fn five_bytes_are_malformed() {
        assert!(matches!(
            decode_varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            decode_varint(&[0x80, 0x80, 0x80, 0x80]),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn non_minimal_is_accepted() {
        assert_eq!(decode_varint(&[0x80, 0x00]), Ok(Some((0, 2))));
        assert_eq!(decode_varint(&[0x81, 0x80, 0x00]), Ok(Some((1, 3))));
    }
}
