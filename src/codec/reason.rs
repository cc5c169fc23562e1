//! MQTT 5.0 reason codes (spec §2.4) and their 3.x equivalents.
//!
//! A newtype rather than an enum: peers may send codes we do not name, and the decoder decides
//! which codes are legal in which packet.

/// A v5 reason code byte. `ReasonCode::SUCCESS` (0) is also "granted QoS 0" and "normal disconnect".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[repr(transparent)]
pub struct ReasonCode(pub u8);

#[allow(missing_docs)]
impl ReasonCode {
    pub const SUCCESS: ReasonCode = ReasonCode(0x00);
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode(0x00);
    pub const GRANTED_QOS_1: ReasonCode = ReasonCode(0x01);
    pub const GRANTED_QOS_2: ReasonCode = ReasonCode(0x02);
    pub const DISCONNECT_WITH_WILL: ReasonCode = ReasonCode(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: ReasonCode = ReasonCode(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: ReasonCode = ReasonCode(0x11);
    pub const CONTINUE_AUTHENTICATION: ReasonCode = ReasonCode(0x18);
    pub const RE_AUTHENTICATE: ReasonCode = ReasonCode(0x19);
    pub const UNSPECIFIED_ERROR: ReasonCode = ReasonCode(0x80);
    pub const MALFORMED_PACKET: ReasonCode = ReasonCode(0x81);
    pub const PROTOCOL_ERROR: ReasonCode = ReasonCode(0x82);
    pub const IMPLEMENTATION_SPECIFIC_ERROR: ReasonCode = ReasonCode(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: ReasonCode = ReasonCode(0x84);
    pub const CLIENT_IDENTIFIER_NOT_VALID: ReasonCode = ReasonCode(0x85);
    pub const BAD_USER_NAME_OR_PASSWORD: ReasonCode = ReasonCode(0x86);
    pub const NOT_AUTHORIZED: ReasonCode = ReasonCode(0x87);
    pub const SERVER_UNAVAILABLE: ReasonCode = ReasonCode(0x88);
    pub const SERVER_BUSY: ReasonCode = ReasonCode(0x89);
    pub const BANNED: ReasonCode = ReasonCode(0x8A);
    pub const SERVER_SHUTTING_DOWN: ReasonCode = ReasonCode(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: ReasonCode = ReasonCode(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: ReasonCode = ReasonCode(0x8D);
    pub const SESSION_TAKEN_OVER: ReasonCode = ReasonCode(0x8E);
    pub const TOPIC_FILTER_INVALID: ReasonCode = ReasonCode(0x8F);
    pub const TOPIC_NAME_INVALID: ReasonCode = ReasonCode(0x90);
    pub const PACKET_IDENTIFIER_IN_USE: ReasonCode = ReasonCode(0x91);
    pub const PACKET_IDENTIFIER_NOT_FOUND: ReasonCode = ReasonCode(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: ReasonCode = ReasonCode(0x93);
    pub const TOPIC_ALIAS_INVALID: ReasonCode = ReasonCode(0x94);
    pub const PACKET_TOO_LARGE: ReasonCode = ReasonCode(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: ReasonCode = ReasonCode(0x96);
    pub const QUOTA_EXCEEDED: ReasonCode = ReasonCode(0x97);
    pub const ADMINISTRATIVE_ACTION: ReasonCode = ReasonCode(0x98);
    pub const PAYLOAD_FORMAT_INVALID: ReasonCode = ReasonCode(0x99);
    pub const RETAIN_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9A);
    pub const QOS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9B);
    pub const USE_ANOTHER_SERVER: ReasonCode = ReasonCode(0x9C);
    pub const SERVER_MOVED: ReasonCode = ReasonCode(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: ReasonCode = ReasonCode(0x9F);
    pub const MAXIMUM_CONNECT_TIME: ReasonCode = ReasonCode(0xA0);
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: ReasonCode = ReasonCode(0xA2);

    /// The code's name in the spec's words (v5 §2.4), for logs a person reads; 0x00 is
    /// "success" whatever the packet (also "normal disconnection", "granted QoS 0").
    pub fn label(self) -> &'static str {
        match self.0 {
            0x00 => "success",
            0x01 => "granted QoS 1",
            0x02 => "granted QoS 2",
            0x04 => "disconnect with will message",
            0x10 => "no matching subscribers",
            0x11 => "no subscription existed",
            0x18 => "continue authentication",
            0x19 => "re-authenticate",
            0x80 => "unspecified error",
            0x81 => "malformed packet",
            0x82 => "protocol error",
            0x83 => "implementation specific error",
            0x84 => "unsupported protocol version",
            0x85 => "client identifier not valid",
            0x86 => "bad user name or password",
            0x87 => "not authorized",
            0x88 => "server unavailable",
            0x89 => "server busy",
            0x8A => "banned",
            0x8B => "server shutting down",
            0x8C => "bad authentication method",
            0x8D => "keep alive timeout",
            0x8E => "session taken over",
            0x8F => "topic filter invalid",
            0x90 => "topic name invalid",
            0x91 => "packet identifier in use",
            0x92 => "packet identifier not found",
            0x93 => "receive maximum exceeded",
            0x94 => "topic alias invalid",
            0x95 => "packet too large",
            0x96 => "message rate too high",
            0x97 => "quota exceeded",
            0x98 => "administrative action",
            0x99 => "payload format invalid",
            0x9A => "retain not supported",
            0x9B => "QoS not supported",
            0x9C => "use another server",
            0x9D => "server moved",
            0x9E => "shared subscriptions not supported",
            0x9F => "connection rate exceeded",
            0xA0 => "maximum connect time",
            0xA1 => "subscription identifiers not supported",
            0xA2 => "wildcard subscriptions not supported",
            _ => "unknown reason code",
        }
    }

    /// Codes >= 0x80 are failures (spec §2.4).
    #[inline]
    pub fn is_error(self) -> bool {
        self.0 >= 0x80
    }

    /// The 3.1/3.1.1 CONNACK return code closest to this v5 CONNACK reason (spec 3.1.1 §3.2.2.3).
    pub fn to_v3_connack(self) -> u8 {
        match self {
            ReasonCode::SUCCESS => 0,
            ReasonCode::UNSUPPORTED_PROTOCOL_VERSION => 1,
            ReasonCode::CLIENT_IDENTIFIER_NOT_VALID => 2,
            ReasonCode::SERVER_UNAVAILABLE
            | ReasonCode::SERVER_BUSY
            | ReasonCode::SERVER_SHUTTING_DOWN
            | ReasonCode::USE_ANOTHER_SERVER
            | ReasonCode::SERVER_MOVED
            // A limit on connections (per address, rate): "the MQTT service is unavailable"
            // to this client, rather than 5, which would call its credentials wrong.
            | ReasonCode::QUOTA_EXCEEDED
            | ReasonCode::CONNECTION_RATE_EXCEEDED => 3,
            ReasonCode::BAD_USER_NAME_OR_PASSWORD | ReasonCode::BAD_AUTHENTICATION_METHOD => 4,
            _ => 5,
        }
    }

    /// The 3.x SUBACK return code: granted QoS as is, any failure as 0x80.
    pub fn to_v3_suback(self) -> u8 {
        if self.0 <= 2 {
            self.0
        } else {
            0x80
        }
    }
}

/// "not authorized (0x87)": the spec's name and the byte, as logs print it (issue 37: logs
/// printed `ReasonCode(134)`).
impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (0x{:02X})", self.label(), self.0)
    }
}

#[cfg(test)]
mod display_tests {
    use super::ReasonCode;
    use crate::codec::ProtocolVersion;

    /// Logs name a code and a protocol level in words (issue 37: `ReasonCode(134)`, `V3_1_1`).
    #[test]
    fn codes_and_levels_read_as_words() {
        assert_eq!(
            ReasonCode::NOT_AUTHORIZED.to_string(),
            "not authorized (0x87)"
        );
        assert_eq!(
            ReasonCode(0x86).to_string(),
            "bad user name or password (0x86)"
        );
        assert_eq!(ReasonCode(0x42).to_string(), "unknown reason code (0x42)");
        assert_eq!(ProtocolVersion::V3_1_1.to_string(), "3.1.1");
        assert_eq!(ProtocolVersion::V5.to_string(), "5.0");
    }
}
