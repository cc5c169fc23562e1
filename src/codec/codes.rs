//! Which reason codes each v5 packet may carry (spec 5.0 §3.x.2.1 tables), and the 3.x
//! return codes. A code outside its packet's table breaks a sender MUST (e.g. MQTT-3.4.2-1),
//! so the decoder reports it as a Protocol Error.

use super::ReasonCode;

/// CONNACK (spec 5.0 §3.2.2.2).
#[inline]
pub(super) fn connack(c: u8) -> bool {
    matches!(
        c,
        0x00 | 0x80..=0x8A | 0x8C | 0x90 | 0x95 | 0x97 | 0x99..=0x9D | 0x9F
    )
}

/// PUBACK and PUBREC (spec 5.0 §3.4.2.1, §3.5.2.1).
#[inline]
pub(super) fn puback(c: u8) -> bool {
    matches!(
        c,
        0x00 | 0x10 | 0x80 | 0x83 | 0x87 | 0x90 | 0x91 | 0x97 | 0x99
    )
}

/// PUBREL and PUBCOMP (spec 5.0 §3.6.2.1, §3.7.2.1).
#[inline]
pub(super) fn pubrel(c: u8) -> bool {
    matches!(c, 0x00 | 0x92)
}

/// SUBACK (spec 5.0 §3.9.3).
#[inline]
pub(super) fn suback(c: u8) -> bool {
    matches!(
        c,
        0x00 | 0x01 | 0x02 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91 | 0x97 | 0x9E | 0xA1 | 0xA2
    )
}

/// SUBACK return codes in 3.1/3.1.1: granted QoS or 0x80 failure (3.1.1 §3.9.3).
#[inline]
pub(super) fn suback_v3(c: u8) -> bool {
    matches!(c, 0x00 | 0x01 | 0x02 | 0x80)
}

/// UNSUBACK (spec 5.0 §3.11.3).
#[inline]
pub(super) fn unsuback(c: u8) -> bool {
    matches!(c, 0x00 | 0x11 | 0x80 | 0x83 | 0x87 | 0x8F | 0x91)
}

/// DISCONNECT (spec 5.0 §3.14.2.1).
#[inline]
pub(super) fn disconnect(c: u8) -> bool {
    matches!(
        c,
        0x00 | 0x04 | 0x80..=0x83 | 0x87 | 0x89 | 0x8B | 0x8D..=0x90 | 0x93..=0xA2
    )
}

/// AUTH (spec 5.0 §3.15.2.1).
#[inline]
pub(super) fn auth(c: u8) -> bool {
    matches!(c, 0x00 | 0x18 | 0x19)
}

/// The v5 reason code equivalent to a 3.x CONNACK return code (3.1.1 §3.2.2.3), the inverse
/// of `ReasonCode::to_v3_connack`. `None` for the reserved values 6..=255.
#[inline]
pub(super) fn connack_from_v3(c: u8) -> Option<ReasonCode> {
    Some(match c {
        0 => ReasonCode::SUCCESS,
        1 => ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
        2 => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        3 => ReasonCode::SERVER_UNAVAILABLE,
        4 => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        5 => ReasonCode::NOT_AUTHORIZED,
        _ => return None,
    })
}

/// A packet that carries reason codes, for asking which codes it may carry
/// ([`ReasonCode::allowed_in`]). Senders outside the connection's decoder (authenticators,
/// the violation table) ask here instead of keeping lists of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasonContext {
    /// CONNACK (v5 §3.2.2.2).
    ConnAck,
    /// PUBACK and PUBREC (v5 §3.4.2.1, §3.5.2.1).
    PubAck,
    /// PUBREL and PUBCOMP (v5 §3.6.2.1, §3.7.2.1).
    PubRel,
    /// SUBACK (v5 §3.9.3).
    SubAck,
    /// UNSUBACK (v5 §3.11.3).
    UnsubAck,
    /// DISCONNECT (v5 §3.14.2.1).
    Disconnect,
    /// AUTH (v5 §3.15.2.1).
    Auth,
}

impl ReasonCode {
    /// True if a v5 packet of kind `context` may carry this code (the spec's per-packet
    /// tables; MQTT-3.15.2-1 and its siblings for the other packets).
    pub fn allowed_in(self, context: ReasonContext) -> bool {
        let c = self.0;
        match context {
            ReasonContext::ConnAck => connack(c),
            ReasonContext::PubAck => puback(c),
            ReasonContext::PubRel => pubrel(c),
            ReasonContext::SubAck => suback(c),
            ReasonContext::UnsubAck => unsuback(c),
            ReasonContext::Disconnect => disconnect(c),
            ReasonContext::Auth => auth(c),
        }
    }

    /// This failure if `context` may carry it, else `fallback`: for codes chosen by code
    /// outside the codec (an authenticator's verdict), which must not put an illegal code on
    /// the wire.
    pub fn or_if_not_allowed(self, context: ReasonContext, fallback: ReasonCode) -> ReasonCode {
        if self.is_error() && self.allowed_in(context) {
            self
        } else {
            fallback
        }
    }
}
