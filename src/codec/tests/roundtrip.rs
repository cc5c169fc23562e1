//! Property-based tests: encode → decode is the identity (up to what a level can carry),
//! decoding never panics, and a valid packet is incomplete until its last byte.

use bytes::BytesMut;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

use super::super::*;
use super::strategies::{for_version, packet, version};
use super::MAX;
use super::V5;

fn encoded(p: &Packet, v: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    encode(p, v, &mut buf).expect("generated packets are encodable");
    buf
}

/// Whatever the decoder accepts must survive encode → decode unchanged at its level (the
/// same check the fuzz target makes).
fn reencodes(packet: Packet, version: Option<ProtocolVersion>) -> Result<(), TestCaseError> {
    let level = match (&packet, version) {
        (Packet::Connect(c), _) => c.protocol,
        (_, Some(v)) => v,
        (_, None) => return Err(TestCaseError::fail("non-CONNECT before the handshake")),
    };
    let mut out = encoded(&packet, level);
    prop_assert_eq!(decode(&mut out, Some(level), MAX), Ok(Some(packet)));
    prop_assert!(out.is_empty());
    Ok(())
}

/// A packet and a level it exists at (AUTH only in 5.0).
fn case() -> impl Strategy<Value = (Packet, ProtocolVersion)> {
    (packet(), version()).prop_map(|(p, v)| match p {
        Packet::Auth(_) => (p, V5),
        _ => (p, v),
    })
}

fn any_version() -> impl Strategy<Value = Option<ProtocolVersion>> {
    proptest::option::of(version())
}

proptest! {
    #[test]
    fn encode_then_decode_is_identity((p, v) in case()) {
        let expected = for_version(p.clone(), v);
        let bytes = encoded(&p, v);
        let mut buf = bytes.clone();
        let decoded = decode(&mut buf, Some(v), MAX);
        prop_assert_eq!(decoded, Ok(Some(expected.clone())));
        prop_assert!(buf.is_empty());
        // The normalised packet encodes to the same bytes: the encoding is canonical.
        prop_assert_eq!(encoded(&expected, v), bytes.clone());
        // A CONNECT decodes the same before the handshake (MQTT-3.1.0-1).
        if let Packet::Connect(_) = expected {
            let mut buf = bytes;
            prop_assert_eq!(decode(&mut buf, None, MAX), Ok(Some(expected)));
        }
    }

    #[test]
    fn one_byte_at_a_time_is_incomplete_until_the_last((p, v) in case()) {
        let bytes = encoded(&p, v);
        let mut buf = BytesMut::new();
        for (i, &b) in bytes.iter().enumerate() {
            buf.extend_from_slice(&[b]);
            let before = buf.clone();
            let r = decode(&mut buf, Some(v), MAX);
            if i + 1 < bytes.len() {
                prop_assert_eq!(r, Ok(None), "byte {} of {}", i, bytes.len());
                prop_assert_eq!(&buf, &before);
            } else {
                prop_assert_eq!(r, Ok(Some(for_version(p.clone(), v))));
                prop_assert!(buf.is_empty());
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in vec(any::<u8>(), 0..300),
        v in any_version(),
        max in prop_oneof![Just(8usize), Just(MAX)],
    ) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(p)) = decode(&mut buf, v, max) {
            reencodes(p, v)?;
        }
        let _ = decode_fixed_header(&bytes, max);
    }

    #[test]
    fn mutated_encodings_never_panic(
        (p, v) in case(),
        as_version in any_version(),
        flips in vec((any::<Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encoded(&p, v);
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        while let Ok(Some(p)) = decode(&mut bytes, as_version, MAX) {
            reencodes(p, as_version)?;
        }
    }

    #[test]
    fn packet_too_large_matches_the_encoded_size((p, v) in case()) {
        let bytes = encoded(&p, v);
        let mut buf = bytes.clone();
        let r = decode(&mut buf, Some(v), bytes.len() - 1);
        prop_assert_eq!(r, Err(DecodeError::PacketTooLarge { size: bytes.len(), max: bytes.len() - 1 }));
        let mut buf = bytes.clone();
        prop_assert!(decode(&mut buf, Some(v), bytes.len()).is_ok());
    }
}
