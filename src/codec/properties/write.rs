//! Encoding of each packet's v5 property section. Only properties that are set are written;
//! values that cannot be represented fail instead of being truncated.

use bytes::Bytes;
use bytestring::ByteString;

use super::super::sink::Sink;
use super::super::types::*;
use super::super::varint::MAX_VARINT;
use super::super::EncodeError;
use super::id::*;

type Result = std::result::Result<(), EncodeError>;

/// A property set that can be written to a `Sink`.
pub(in super::super) trait WriteProperties {
    /// Writes every present property (identifier + value), no length prefix.
    fn write<S: Sink>(&self, s: &mut S) -> Result;
}

#[inline]
fn byte<S: Sink>(s: &mut S, id: usize, v: Option<u8>) {
    if let Some(v) = v {
        s.u8(id as u8);
        s.u8(v);
    }
}

#[inline]
fn flag<S: Sink>(s: &mut S, id: usize, v: Option<bool>) {
    byte(s, id, v.map(u8::from));
}

#[inline]
fn two<S: Sink>(s: &mut S, id: usize, v: Option<u16>) {
    if let Some(v) = v {
        s.u8(id as u8);
        s.u16(v);
    }
}

#[inline]
fn four<S: Sink>(s: &mut S, id: usize, v: Option<u32>) {
    if let Some(v) = v {
        s.u8(id as u8);
        s.u32(v);
    }
}

#[inline]
fn string<S: Sink>(s: &mut S, id: usize, v: Option<&ByteString>) -> Result {
    if let Some(v) = v {
        s.u8(id as u8);
        s.string(v)?;
    }
    Ok(())
}

#[inline]
fn binary<S: Sink>(s: &mut S, id: usize, v: Option<&Bytes>) -> Result {
    if let Some(v) = v {
        s.u8(id as u8);
        s.binary(v)?;
    }
    Ok(())
}

#[inline]
fn user<S: Sink>(s: &mut S, props: &UserProperties) -> Result {
    for (k, v) in props {
        s.u8(USER_PROPERTY as u8);
        s.string(k)?;
        s.string(v)?;
    }
    Ok(())
}

#[inline]
fn subscription_identifier<S: Sink>(s: &mut S, v: u32) -> Result {
    if v as usize > MAX_VARINT {
        return Err(EncodeError::OutOfRange("Subscription Identifier"));
    }
    s.u8(SUBSCRIPTION_IDENTIFIER as u8);
    s.varint(v as usize);
    Ok(())
}

impl WriteProperties for ConnectProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        two(s, RECEIVE_MAXIMUM, self.receive_maximum);
        four(s, MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        two(s, TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        flag(
            s,
            REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
        );
        flag(
            s,
            REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
        );
        string(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        binary(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())?;
        user(s, &self.user_properties)
    }
}

impl WriteProperties for WillProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        four(s, WILL_DELAY_INTERVAL, self.will_delay_interval);
        byte(s, PAYLOAD_FORMAT_INDICATOR, self.payload_format_indicator);
        four(s, MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        string(s, CONTENT_TYPE, self.content_type.as_ref())?;
        string(s, RESPONSE_TOPIC, self.response_topic.as_ref())?;
        binary(s, CORRELATION_DATA, self.correlation_data.as_ref())?;
        user(s, &self.user_properties)
    }
}

impl WriteProperties for ConnAckProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        two(s, RECEIVE_MAXIMUM, self.receive_maximum);
        // Absent means QoS 2 and 2 may not be sent (spec 5.0 §3.2.2.3.4), so only 0/1 appear.
        byte(
            s,
            MAXIMUM_QOS,
            self.maximum_qos
                .filter(|q| *q != QoS::ExactlyOnce)
                .map(|q| q as u8),
        );
        flag(s, RETAIN_AVAILABLE, self.retain_available);
        four(s, MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        string(
            s,
            ASSIGNED_CLIENT_IDENTIFIER,
            self.assigned_client_identifier.as_ref(),
        )?;
        two(s, TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        string(s, REASON_STRING, self.reason_string.as_ref())?;
        user(s, &self.user_properties)?;
        flag(
            s,
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
        );
        flag(
            s,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifiers_available,
        );
        flag(
            s,
            SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
        );
        two(s, SERVER_KEEP_ALIVE, self.server_keep_alive);
        string(s, RESPONSE_INFORMATION, self.response_information.as_ref())?;
        string(s, SERVER_REFERENCE, self.server_reference.as_ref())?;
        string(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        binary(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())
    }
}

impl WriteProperties for PublishProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        byte(s, PAYLOAD_FORMAT_INDICATOR, self.payload_format_indicator);
        four(s, MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        two(s, TOPIC_ALIAS, self.topic_alias);
        string(s, RESPONSE_TOPIC, self.response_topic.as_ref())?;
        binary(s, CORRELATION_DATA, self.correlation_data.as_ref())?;
        user(s, &self.user_properties)?;
        for &id in &self.subscription_identifiers {
            subscription_identifier(s, id)?;
        }
        string(s, CONTENT_TYPE, self.content_type.as_ref())
    }
}

impl WriteProperties for AckProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        string(s, REASON_STRING, self.reason_string.as_ref())?;
        user(s, &self.user_properties)
    }
}

impl WriteProperties for DisconnectProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        string(s, REASON_STRING, self.reason_string.as_ref())?;
        user(s, &self.user_properties)?;
        string(s, SERVER_REFERENCE, self.server_reference.as_ref())
    }
}

impl WriteProperties for AuthProperties {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        string(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        binary(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())?;
        string(s, REASON_STRING, self.reason_string.as_ref())?;
        user(s, &self.user_properties)
    }
}

/// SUBSCRIBE's properties, which live inline in `Subscribe`.
pub(in super::super) struct SubscribeProperties<'a> {
    pub subscription_identifier: Option<u32>,
    pub user_properties: &'a UserProperties,
}

impl WriteProperties for SubscribeProperties<'_> {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        if let Some(id) = self.subscription_identifier {
            subscription_identifier(s, id)?;
        }
        user(s, self.user_properties)
    }
}

/// UNSUBSCRIBE's properties: User Property only.
pub(in super::super) struct UserOnly<'a>(pub &'a UserProperties);

impl WriteProperties for UserOnly<'_> {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        user(s, self.0)
    }
}

/// The properties of a PUBLISH a broker forwards as they came (v5 §3.3.2.3): every one but
/// Message Expiry Interval, Topic Alias and Subscription Identifiers, which are each
/// delivery's own. In the order `codec::apart::share_forwarded` reads them back; User
/// Properties keep theirs (MQTT-3.3.2-18).
pub(in super::super) struct Forwarded<'a>(pub &'a PublishProperties);

impl WriteProperties for Forwarded<'_> {
    fn write<S: Sink>(&self, s: &mut S) -> Result {
        let p = self.0;
        byte(s, PAYLOAD_FORMAT_INDICATOR, p.payload_format_indicator);
        string(s, RESPONSE_TOPIC, p.response_topic.as_ref())?;
        binary(s, CORRELATION_DATA, p.correlation_data.as_ref())?;
        user(s, &p.user_properties)?;
        string(s, CONTENT_TYPE, p.content_type.as_ref())
    }
}
