//! The one table of protocol violations a client can commit after CONNACK.
//!
//! Each variant names the normative statement (or spec section) it breaks, and maps to the
//! reason code of the DISCONNECT a v5 client gets before the close (MQTT-4.13.1-1: a Server
//! that detects a Malformed Packet or Protocol Error MUST close the Network Connection; v5
//! §4.13.1 lets it say why first with a DISCONNECT, MQTT-4.13.2-1) and to what a 3.x client gets: 3.1.1
//! has no DISCONNECT from the server, so the connection is simply closed (MQTT-4.8.0-1 of
//! 3.1.1). Handlers return a variant; nothing else in the connection invents close reasons.

use crate::broker::{AckMismatch, OutboundStage};
use crate::codec::{DecodeError, ReasonCode, ReasonContext};

/// A protocol violation by the client; the connection closes because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Violation {
    /// The packet could not be decoded (the codec's error says which rule it broke and so
    /// which of 0x81 Malformed / 0x82 Protocol Error / 0x95 Packet Too Large applies).
    Undecodable(DecodeError),
    /// A second CONNECT (MQTT-3.1.0-2).
    SecondConnect,
    /// A packet only a server sends (CONNACK, SUBACK, UNSUBACK, PINGRESP): a Protocol Error
    /// (MQTT-4.13.1-1).
    ServerPacket(&'static str),
    /// PUBLISH above the Maximum QoS we announced (MQTT-3.2.2-11).
    QosNotSupported,
    /// PUBLISH with RETAIN while Retain Available is 0 (MQTT-3.2.2-14).
    RetainNotSupported,
    /// A client PUBLISH with one or more Subscription Identifiers (MQTT-3.3.4-6: "A PUBLISH
    /// packet sent from a Client to a Server MUST NOT contain a Subscription Identifier").
    /// The codec decodes them in either direction (it does not know who sent the packet), so
    /// the connection refuses them; a Protocol Error, not Malformed: the packet parses and the
    /// property belongs to PUBLISH, only not in this direction (§4.13: "data that is not
    /// allowed by the protocol").
    SubscriptionIdentifierFromClient,
    /// Topic Alias 0 or above the Topic Alias Maximum we announced (MQTT-3.3.2-8, -9).
    TopicAliasOutOfRange,
    /// An empty topic with an alias that was never set (v5 §3.3.2.3.4: Protocol Error).
    TopicAliasUnknown,
    /// More unacknowledged QoS 1/2 PUBLISHes than our Receive Maximum (MQTT-3.3.4-7).
    ReceiveMaximumExceeded,
    /// A QoS 0 PUBLISH whose payload is not the UTF-8 its Payload Format Indicator says;
    /// QoS 1/2 get a negative ack instead (v5 §3.3.2.3.2, 0x99).
    PayloadFormatInvalid,
    /// A PUBLISH topic over the broker's `mqtt.max_topic_length` / `max_topic_levels`: "The
    /// Topic Name is correctly formed, but is not accepted by this Client or Server" (v5
    /// §3.4.2.1, 0x90). QoS 1/2 v5 publishers get it in PUBACK / PUBREC; QoS 0 and 3.x close.
    TopicOverLimit,
    /// No Local on a shared subscription (MQTT-3.8.3-4).
    NoLocalOnSharedSubscription,
    /// DISCONNECT raising a Session Expiry Interval that was 0 at CONNECT (v5 §3.14.2.2.2).
    SessionExpiryRaisedFromZero,
    /// AUTH from a client that gave no Authentication Method in CONNECT (MQTT-4.12.0-7).
    AuthWithoutMethod,
    /// AUTH with another Authentication Method than CONNECT's (MQTT-4.12.0-5).
    AuthMethodChanged,
    /// AUTH with a reason code that does not fit the exchange: 0x19 while one is running,
    /// 0x18 with none running (MQTT-4.12.1-1, MQTT-4.12.0-3).
    AuthOutOfSequence,
    /// PUBACK / PUBREC / PUBCOMP for an in-flight packet id whose delivery waits for another
    /// acknowledgement (a QoS 1 delivery answered with PUBREC or PUBCOMP, a QoS 2 one with
    /// PUBACK, PUBCOMP before any PUBREL): data inconsistent with our state, a Protocol Error
    /// (v5 §4.13.1; 3.1.1 MQTT-4.8.0-1). The statement is the one naming the ack that was due.
    AckMismatch(AckMismatch),
}

impl Violation {
    /// The normative statement (or section) this violation breaks, for logs.
    pub(crate) fn statement(&self) -> &'static str {
        match self {
            Violation::Undecodable(_) | Violation::ServerPacket(_) => "MQTT-4.13.1-1",
            Violation::SecondConnect => "MQTT-3.1.0-2",
            Violation::QosNotSupported => "MQTT-3.2.2-11",
            Violation::RetainNotSupported => "MQTT-3.2.2-14",
            Violation::SubscriptionIdentifierFromClient => "MQTT-3.3.4-6",
            Violation::TopicAliasOutOfRange => "MQTT-3.3.2-8/9",
            Violation::TopicAliasUnknown => "v5 §3.3.2.3.4",
            Violation::ReceiveMaximumExceeded => "MQTT-3.3.4-7",
            Violation::PayloadFormatInvalid => "v5 §3.3.2.3.2",
            Violation::TopicOverLimit => "v5 §3.4.2.1 (0x90)",
            Violation::NoLocalOnSharedSubscription => "MQTT-3.8.3-4",
            Violation::SessionExpiryRaisedFromZero => "v5 §3.14.2.2.2",
            Violation::AuthWithoutMethod => "MQTT-4.12.0-7",
            Violation::AuthMethodChanged => "MQTT-4.12.0-5",
            Violation::AuthOutOfSequence => "MQTT-4.12.1-1",
            Violation::AckMismatch(mismatch) => match mismatch.stage {
                OutboundStage::AwaitPubAck => "MQTT-4.3.2-4",
                OutboundStage::AwaitPubRec => "MQTT-4.3.3-8",
                OutboundStage::AwaitPubComp => "MQTT-4.3.3-11",
            },
        }
    }

    /// The reason code of the DISCONNECT a v5 client gets (always one DISCONNECT may carry).
    pub(crate) fn reason_code(&self) -> ReasonCode {
        match self {
            // The codec's code, unless DISCONNECT may not carry it (0x84 Unsupported Protocol
            // Version from a second CONNECT, 0x85): then it is a Protocol Error.
            Violation::Undecodable(error) => error
                .reason_code()
                .or_if_not_allowed(ReasonContext::Disconnect, ReasonCode::PROTOCOL_ERROR),
            Violation::QosNotSupported => ReasonCode::QOS_NOT_SUPPORTED,
            Violation::RetainNotSupported => ReasonCode::RETAIN_NOT_SUPPORTED,
            Violation::TopicAliasOutOfRange => ReasonCode::TOPIC_ALIAS_INVALID,
            Violation::ReceiveMaximumExceeded => ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
            Violation::PayloadFormatInvalid => ReasonCode::PAYLOAD_FORMAT_INVALID,
            Violation::TopicOverLimit => ReasonCode::TOPIC_NAME_INVALID,
            Violation::SecondConnect
            | Violation::ServerPacket(_)
            | Violation::TopicAliasUnknown
            | Violation::SubscriptionIdentifierFromClient
            | Violation::NoLocalOnSharedSubscription
            | Violation::SessionExpiryRaisedFromZero
            | Violation::AuthWithoutMethod
            | Violation::AuthMethodChanged
            | Violation::AuthOutOfSequence
            | Violation::AckMismatch(_) => ReasonCode::PROTOCOL_ERROR,
        }
    }

    /// What went wrong, for the log and the v5 Reason String.
    pub(crate) fn describe(&self) -> String {
        match self {
            Violation::Undecodable(error) => error.to_string(),
            Violation::SecondConnect => "second CONNECT".to_owned(),
            Violation::ServerPacket(name) => format!("{name} is not sent by clients"),
            Violation::QosNotSupported => "QoS above maximum".to_owned(),
            Violation::RetainNotSupported => "retain not available".to_owned(),
            Violation::SubscriptionIdentifierFromClient => {
                "Subscription Identifier in a PUBLISH from a client".to_owned()
            }
            Violation::TopicAliasOutOfRange => "topic alias out of range".to_owned(),
            Violation::TopicAliasUnknown => "unknown topic alias".to_owned(),
            Violation::ReceiveMaximumExceeded => {
                "more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum".to_owned()
            }
            Violation::PayloadFormatInvalid => {
                "payload is not valid UTF-8 (Payload Format Indicator 1)".to_owned()
            }
            Violation::TopicOverLimit => {
                "topic name over mqtt.max_topic_length or max_topic_levels".to_owned()
            }
            Violation::NoLocalOnSharedSubscription => {
                "No Local on a shared subscription".to_owned()
            }
            Violation::SessionExpiryRaisedFromZero => "session expiry raised from 0".to_owned(),
            Violation::AuthWithoutMethod => "AUTH without an authentication method".to_owned(),
            Violation::AuthMethodChanged => "AUTH with another authentication method".to_owned(),
            Violation::AuthOutOfSequence => "AUTH reason code out of sequence".to_owned(),
            Violation::AckMismatch(mismatch) => mismatch.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::session::outbound::OutboundAck;

    /// Every violation closes with a code DISCONNECT may carry (v5 §3.14.2.1), so the table can
    /// never make the server itself break MQTT-3.14.2-1 (its own reason code table).
    #[test]
    fn every_violation_maps_to_a_disconnect_reason_code() {
        let all = [
            Violation::Undecodable(DecodeError::Malformed("x")),
            Violation::Undecodable(DecodeError::Protocol("x")),
            Violation::Undecodable(DecodeError::PacketTooLarge { size: 2, max: 1 }),
            Violation::Undecodable(DecodeError::UnsupportedProtocol(9)),
            Violation::Undecodable(DecodeError::ClientIdNotValid),
            Violation::Undecodable(DecodeError::TopicNameInvalid("x")),
            Violation::SecondConnect,
            Violation::ServerPacket("CONNACK"),
            Violation::QosNotSupported,
            Violation::RetainNotSupported,
            Violation::SubscriptionIdentifierFromClient,
            Violation::TopicAliasOutOfRange,
            Violation::TopicAliasUnknown,
            Violation::ReceiveMaximumExceeded,
            Violation::PayloadFormatInvalid,
            Violation::NoLocalOnSharedSubscription,
            Violation::SessionExpiryRaisedFromZero,
            Violation::AuthWithoutMethod,
            Violation::AuthMethodChanged,
            Violation::AuthOutOfSequence,
            Violation::AckMismatch(AckMismatch {
                packet_id: 1,
                ack: OutboundAck::PubRec,
                stage: OutboundStage::AwaitPubAck,
            }),
        ];
        for v in all {
            let code = v.reason_code();
            assert!(code.is_error(), "{v:?}");
            assert!(
                code.allowed_in(ReasonContext::Disconnect),
                "{v:?} -> {code:?}"
            );
            assert!(!v.statement().is_empty());
        }
    }
}
