//! Packet encoding. (Skeleton: being implemented.)

use bytes::BytesMut;

use super::{EncodeError, Packet, ProtocolVersion, PublishProperties, QoS};

/// The parts of a PUBLISH other than its payload, borrowed so the broker can encode a shared
/// message without building a `Publish` per subscriber.
#[derive(Clone, Copy, Debug)]
pub struct PublishHeader<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    pub topic: &'a str,
    /// Written only when `qos > 0`.
    pub packet_id: u16,
    /// Written only for v5; `None` means an empty property section.
    pub properties: Option<&'a PublishProperties>,
}

/// Appends `packet` encoded for `version` to `buf`.
pub fn encode(
    packet: &Packet,
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<(), EncodeError> {
    let _ = (packet, version, buf);
    todo!()
}

/// Appends a PUBLISH to `buf`. Returns the offset (from the start of this packet) of the
/// two packet-id bytes when `qos > 0`, so a cached encoding can be copied and patched per
/// subscriber instead of re-encoded.
pub fn encode_publish(
    header: &PublishHeader<'_>,
    payload: &[u8],
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<Option<usize>, EncodeError> {
    let _ = (header, payload, version, buf);
    todo!()
}
