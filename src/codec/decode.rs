//! Packet decoding. (Skeleton: being implemented.)

use bytes::BytesMut;

use super::{DecodeError, Packet, ProtocolVersion};

/// The first 2..=5 bytes of every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedHeader {
    /// Packet type (high nibble) and flags (low nibble).
    pub byte1: u8,
    /// Length of variable header + payload.
    pub remaining_length: usize,
    /// Bytes taken by the fixed header itself (2..=5).
    pub header_len: usize,
}

/// Reads a fixed header from the front of `buf` without consuming it.
///
/// `Ok(None)` means more bytes are needed. Fails on a malformed variable byte integer or when
/// the whole packet (header + remaining length) would exceed `max_packet_size`.
pub fn decode_fixed_header(
    buf: &[u8],
    max_packet_size: usize,
) -> Result<Option<FixedHeader>, DecodeError> {
    let _ = (buf, max_packet_size);
    todo!()
}

/// Decodes one packet from the front of `buf`, splitting its bytes off without copying.
///
/// `Ok(None)`: incomplete, `buf` untouched. `version` is `None` before the handshake, when only
/// CONNECT is legal (MQTT-3.1.0-1); afterwards it is the connection's protocol level.
pub fn decode(
    buf: &mut BytesMut,
    version: Option<ProtocolVersion>,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let _ = (buf, version, max_packet_size);
    todo!()
}
