//! Codec tests: byte-exact vectors, every malformed case, and property-based round trips.
//! Spec statement ids (e.g. `MQTT-3.3.1-2`) name the rule a test checks.

#[cfg(not(debug_assertions))]
mod bench;
mod malformed;
mod roundtrip;
mod strategies;
mod vectors;

use bytes::BytesMut;

use super::{decode, encode, DecodeError, Packet, ProtocolVersion};

/// Generous limit used where the size limit is not under test.
const MAX: usize = 1 << 20;

pub(super) const V3: ProtocolVersion = ProtocolVersion::V3_1;
pub(super) const V4: ProtocolVersion = ProtocolVersion::V3_1_1;
pub(super) const V5: ProtocolVersion = ProtocolVersion::V5;

/// Decodes `bytes` as exactly one packet at `version` (which must consume everything).
fn dec(bytes: &[u8], version: Option<ProtocolVersion>) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    match decode(&mut buf, version, MAX)? {
        Some(p) => {
            assert!(buf.is_empty(), "{} bytes left after one packet", buf.len());
            Ok(p)
        }
        None => panic!("incomplete: {bytes:02X?}"),
    }
}

/// Encodes `packet` at `version` into a fresh buffer.
fn enc(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode(packet, version, &mut buf).expect("encodable");
    buf.to_vec()
}
