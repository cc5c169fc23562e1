//! Decoding of each packet's v5 property section, enforcing the allowed set, "at most once"
//! (only User Property and PUBLISH's Subscription Identifier may repeat) and value ranges.

use bytestring::ByteString;

use super::super::reader::Reader;
use super::super::topic::has_wildcards;
use super::super::types::*;
use super::super::DecodeError;
use super::id::*;

type Result<T> = std::result::Result<T, DecodeError>;

/// Stores `value` in an empty slot; a second occurrence of the property is a Protocol Error
/// (spec 5.0 §3.x.2.2: "It is a Protocol Error to include the X more than once").
#[inline]
fn set<T>(slot: &mut Option<T>, value: T) -> Result<()> {
    if slot.is_some() {
        return Err(DecodeError::Protocol("property included more than once"));
    }
    *slot = Some(value);
    Ok(())
}

/// The error for an identifier outside the packet's allowed set: Malformed (spec 5.0 §2.2.2.2).
#[cold]
fn not_allowed(id: usize) -> DecodeError {
    if is_known(id) {
        DecodeError::Malformed("property not allowed in this packet")
    } else {
        DecodeError::Malformed("unknown property identifier")
    }
}

/// Reads the property section at `$r`: each property's identifier goes through the `match`
/// arms given, which read its value from `$s`; an identifier without an arm is refused
/// ([`not_allowed`]). A macro, not a function taking a closure, so every reader below
/// (PUBLISH's and the acks' on the per-message path included) stays the plain loop and
/// `match` it was.
macro_rules! each_property {
    ($r:expr, $s:ident, { $($arms:tt)* }) => {
        let mut $s = $r.section()?;
        while !$s.is_empty() {
            match $s.varint()? {
                $($arms)*
                other => return Err(not_allowed(other)),
            }
        }
    };
}

/// A Byte property whose only legal values are 0 and 1.
#[inline]
fn flag(r: &mut Reader) -> Result<bool> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::Protocol("property value other than 0 or 1")),
    }
}

/// Payload Format Indicator: 0 (bytes) or 1 (UTF-8).
#[inline]
fn format_indicator(r: &mut Reader) -> Result<u8> {
    flag(r).map(u8::from)
}

/// Receive Maximum: 0 is a Protocol Error (spec 5.0 §3.1.2.11.3, §3.2.2.3.3).
fn receive_maximum(r: &mut Reader) -> Result<u16> {
    match r.u16()? {
        0 => Err(DecodeError::Protocol("Receive Maximum of 0")),
        v => Ok(v),
    }
}

/// Maximum Packet Size: 0 is a Protocol Error (spec 5.0 §3.1.2.11.4, §3.2.2.3.6).
fn maximum_packet_size(r: &mut Reader) -> Result<u32> {
    match r.u32()? {
        0 => Err(DecodeError::Protocol("Maximum Packet Size of 0")),
        v => Ok(v),
    }
}

/// Subscription Identifier: a Variable Byte Integer 1..=268,435,455; 0 is a Protocol Error
/// (spec 5.0 §3.3.2.3.8, §3.8.2.1.2).
fn subscription_identifier(r: &mut Reader) -> Result<u32> {
    match r.varint()? {
        0 => Err(DecodeError::Protocol("Subscription Identifier of 0")),
        v => Ok(v as u32),
    }
}

/// Response Topic: a topic name, so no wildcards (MQTT-3.3.2-14).
fn response_topic(r: &mut Reader) -> Result<ByteString> {
    let topic = r.string()?;
    if has_wildcards(&topic) {
        return Err(DecodeError::Protocol("wildcard in Response Topic"));
    }
    Ok(topic)
}

/// CONNECT properties (spec 5.0 §3.1.2.11).
pub(in super::super) fn connect(r: &mut Reader) -> Result<ConnectProperties> {
    let mut p = ConnectProperties::default();
    each_property!(r, s, {
        SESSION_EXPIRY_INTERVAL => set(&mut p.session_expiry_interval, s.u32()?)?,
        RECEIVE_MAXIMUM => set(&mut p.receive_maximum, receive_maximum(&mut s)?)?,
        MAXIMUM_PACKET_SIZE => set(&mut p.maximum_packet_size, maximum_packet_size(&mut s)?)?,
        TOPIC_ALIAS_MAXIMUM => set(&mut p.topic_alias_maximum, s.u16()?)?,
        REQUEST_RESPONSE_INFORMATION => {
            set(&mut p.request_response_information, flag(&mut s)?)?;
        }
        REQUEST_PROBLEM_INFORMATION => set(&mut p.request_problem_information, flag(&mut s)?)?,
        AUTHENTICATION_METHOD => set(&mut p.authentication_method, s.string()?)?,
        AUTHENTICATION_DATA => set(&mut p.authentication_data, s.binary()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
    });
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        // Spec 5.0 §3.1.2.11.10.
        return Err(DecodeError::Protocol(
            "Authentication Data without Authentication Method",
        ));
    }
    Ok(p)
}

/// Will properties, in the CONNECT payload (spec 5.0 §3.1.3.2).
pub(in super::super) fn will(r: &mut Reader) -> Result<WillProperties> {
    let mut p = WillProperties::default();
    each_property!(r, s, {
        WILL_DELAY_INTERVAL => set(&mut p.will_delay_interval, s.u32()?)?,
        PAYLOAD_FORMAT_INDICATOR => {
            set(&mut p.payload_format_indicator, format_indicator(&mut s)?)?;
        }
        MESSAGE_EXPIRY_INTERVAL => set(&mut p.message_expiry_interval, s.u32()?)?,
        CONTENT_TYPE => set(&mut p.content_type, s.string()?)?,
        RESPONSE_TOPIC => set(&mut p.response_topic, response_topic(&mut s)?)?,
        CORRELATION_DATA => set(&mut p.correlation_data, s.binary()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
    });
    Ok(p)
}

/// CONNACK properties (spec 5.0 §3.2.2.3).
pub(in super::super) fn connack(r: &mut Reader) -> Result<ConnAckProperties> {
    let mut p = ConnAckProperties::default();
    each_property!(r, s, {
        SESSION_EXPIRY_INTERVAL => set(&mut p.session_expiry_interval, s.u32()?)?,
        RECEIVE_MAXIMUM => set(&mut p.receive_maximum, receive_maximum(&mut s)?)?,
        MAXIMUM_QOS => {
            let qos = match s.u8()? {
                0 => QoS::AtMostOnce,
                1 => QoS::AtLeastOnce,
                _ => return Err(DecodeError::Protocol("Maximum QoS other than 0 or 1")),
            };
            set(&mut p.maximum_qos, qos)?;
        }
        RETAIN_AVAILABLE => set(&mut p.retain_available, flag(&mut s)?)?,
        MAXIMUM_PACKET_SIZE => set(&mut p.maximum_packet_size, maximum_packet_size(&mut s)?)?,
        ASSIGNED_CLIENT_IDENTIFIER => set(&mut p.assigned_client_identifier, s.string()?)?,
        TOPIC_ALIAS_MAXIMUM => set(&mut p.topic_alias_maximum, s.u16()?)?,
        REASON_STRING => set(&mut p.reason_string, s.string()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
        WILDCARD_SUBSCRIPTION_AVAILABLE => {
            set(&mut p.wildcard_subscription_available, flag(&mut s)?)?;
        }
        SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
            set(&mut p.subscription_identifiers_available, flag(&mut s)?)?;
        }
        SHARED_SUBSCRIPTION_AVAILABLE => {
            set(&mut p.shared_subscription_available, flag(&mut s)?)?;
        }
        SERVER_KEEP_ALIVE => set(&mut p.server_keep_alive, s.u16()?)?,
        RESPONSE_INFORMATION => set(&mut p.response_information, s.string()?)?,
        SERVER_REFERENCE => set(&mut p.server_reference, s.string()?)?,
        AUTHENTICATION_METHOD => set(&mut p.authentication_method, s.string()?)?,
        AUTHENTICATION_DATA => set(&mut p.authentication_data, s.binary()?)?,
    });
    Ok(p)
}

/// PUBLISH properties (spec 5.0 §3.3.2.3). Subscription Identifier may repeat: the codec does
/// not know who sent the packet, so rejecting one from a client (MQTT-3.3.4-6) is the
/// connection's job (`Violation::SubscriptionIdentifierFromClient`), for one or several. Topic Alias 0 and aliases above the maximum are likewise checked by the
/// broker, which owns the maximum and answers with 0x94.
#[inline]
pub(in super::super) fn publish(r: &mut Reader) -> Result<PublishProperties> {
    let mut p = PublishProperties::default();
    each_property!(r, s, {
        PAYLOAD_FORMAT_INDICATOR => {
            set(&mut p.payload_format_indicator, format_indicator(&mut s)?)?;
        }
        MESSAGE_EXPIRY_INTERVAL => set(&mut p.message_expiry_interval, s.u32()?)?,
        TOPIC_ALIAS => set(&mut p.topic_alias, s.u16()?)?,
        RESPONSE_TOPIC => set(&mut p.response_topic, response_topic(&mut s)?)?,
        CORRELATION_DATA => set(&mut p.correlation_data, s.binary()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
        SUBSCRIPTION_IDENTIFIER => p
            .subscription_identifiers
            .push(subscription_identifier(&mut s)?),
        CONTENT_TYPE => set(&mut p.content_type, s.string()?)?,
    });
    Ok(p)
}

/// PUBACK/PUBREC/PUBREL/PUBCOMP/SUBACK/UNSUBACK properties: Reason String and User Property.
pub(in super::super) fn ack(r: &mut Reader) -> Result<AckProperties> {
    let mut p = AckProperties::default();
    each_property!(r, s, {
        REASON_STRING => set(&mut p.reason_string, s.string()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
    });
    Ok(p)
}

/// SUBSCRIBE properties (spec 5.0 §3.8.2.1): one optional Subscription Identifier.
pub(in super::super) fn subscribe(r: &mut Reader) -> Result<(Option<u32>, UserProperties)> {
    let mut sub_id = None;
    let mut user = UserProperties::new();
    each_property!(r, s, {
        SUBSCRIPTION_IDENTIFIER => set(&mut sub_id, subscription_identifier(&mut s)?)?,
        USER_PROPERTY => user.push(s.pair()?),
    });
    Ok((sub_id, user))
}

/// UNSUBSCRIBE properties (spec 5.0 §3.10.2.1): User Property only.
pub(in super::super) fn unsubscribe(r: &mut Reader) -> Result<UserProperties> {
    let mut user = UserProperties::new();
    each_property!(r, s, {
        USER_PROPERTY => user.push(s.pair()?),
    });
    Ok(user)
}

/// DISCONNECT properties (spec 5.0 §3.14.2.2).
pub(in super::super) fn disconnect(r: &mut Reader) -> Result<DisconnectProperties> {
    let mut p = DisconnectProperties::default();
    each_property!(r, s, {
        SESSION_EXPIRY_INTERVAL => set(&mut p.session_expiry_interval, s.u32()?)?,
        REASON_STRING => set(&mut p.reason_string, s.string()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
        SERVER_REFERENCE => set(&mut p.server_reference, s.string()?)?,
    });
    Ok(p)
}

/// AUTH properties (spec 5.0 §3.15.2.2).
pub(in super::super) fn auth(r: &mut Reader) -> Result<AuthProperties> {
    let mut p = AuthProperties::default();
    each_property!(r, s, {
        AUTHENTICATION_METHOD => set(&mut p.authentication_method, s.string()?)?,
        AUTHENTICATION_DATA => set(&mut p.authentication_data, s.binary()?)?,
        REASON_STRING => set(&mut p.reason_string, s.string()?)?,
        USER_PROPERTY => p.user_properties.push(s.pair()?),
    });
    Ok(p)
}
