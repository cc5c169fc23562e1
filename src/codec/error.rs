//! Codec errors, each mapped to the reason code the spec prescribes for it, in one place.

use thiserror::Error;

use super::reason::ReasonCode;

/// Why a byte sequence is not a valid packet. The connection turns this into a DISCONNECT
/// (v5) or CONNACK (during the handshake) with `reason_code()` and closes the connection.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Bytes that cannot be a packet: bad lengths, reserved bits, bad UTF-8, truncated fields.
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// A well-formed packet that breaks a protocol rule (duplicate property, packet id 0, …).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The remaining length exceeds what this side accepts (`max_packet_size`).
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    PacketTooLarge {
        /// Whole packet size announced by the fixed header.
        size: usize,
        /// The limit it broke.
        max: usize,
    },
    /// CONNECT named a protocol name/level we do not speak.
    #[error("unsupported protocol name or level {0}")]
    UnsupportedProtocol(u8),
    /// CONNECT carried a client identifier the broker rejects.
    #[error("client identifier not valid")]
    ClientIdNotValid,
    /// PUBLISH topic name is empty without an alias, or contains wildcards.
    #[error("invalid topic name: {0}")]
    TopicNameInvalid(&'static str),
}

impl DecodeError {
    /// The v5 reason code the spec assigns to this failure.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            DecodeError::Malformed(_) => ReasonCode::MALFORMED_PACKET,
            DecodeError::Protocol(_) => ReasonCode::PROTOCOL_ERROR,
            DecodeError::PacketTooLarge { .. } => ReasonCode::PACKET_TOO_LARGE,
            DecodeError::UnsupportedProtocol(_) => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
            DecodeError::ClientIdNotValid => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            DecodeError::TopicNameInvalid(_) => ReasonCode::TOPIC_NAME_INVALID,
        }
    }
}

/// Why a packet cannot be written (values that do not fit the wire format).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The remaining length (or a property section) would exceed 268,435,455 bytes.
    #[error("packet too large to encode ({0} bytes)")]
    TooLarge(usize),
    /// The packet type does not exist at the target protocol level (AUTH before 5.0).
    #[error("{0} cannot be sent at this protocol level")]
    NotInVersion(&'static str),
    /// A string or binary field is longer than its two-byte length prefix can say.
    #[error("string field longer than 65535 bytes")]
    StringTooLong,
    /// A numeric field exceeds its wire range (e.g. a Subscription Identifier > 268,435,455).
    #[error("{0} out of range")]
    OutOfRange(&'static str),
}
