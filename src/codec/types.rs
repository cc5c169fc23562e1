//! The packet model: one Rust type per MQTT control packet, shared by all protocol levels.
//!
//! Version differences live in the decoder/encoder, not here: a v3.1.1 packet is simply a v5
//! packet whose properties are empty and whose reason codes follow the v3 return-code rules.
//! Strings are `ByteString` (UTF-8 validated `Bytes`) and payloads are `Bytes`, so decoding
//! never copies them out of the read buffer.

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;

use super::reason::ReasonCode;

/// Delivery guarantee of a message, as carried on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum QoS {
    /// Fire and forget.
    #[default]
    AtMostOnce = 0,
    /// Acknowledged with PUBACK; may be duplicated.
    AtLeastOnce = 1,
    /// Four-step handshake; delivered exactly once.
    ExactlyOnce = 2,
}

impl QoS {
    /// Parses the two QoS bits; 3 is reserved and therefore `None`.
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

/// The protocol level a client speaks; chosen by its CONNECT and fixed for the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum ProtocolVersion {
    /// MQTT 3.1 ("MQIsdp", level 3).
    V3_1 = 3,
    /// MQTT 3.1.1 ("MQTT", level 4).
    V3_1_1 = 4,
    /// MQTT 5.0 ("MQTT", level 5).
    V5 = 5,
}

impl ProtocolVersion {
    /// True for 5.0, the only level with properties and reason codes everywhere.
    #[inline]
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }
}

/// A user property pair; order and duplicates are significant (MQTT-3.3.2-18), hence a Vec.
pub type UserProperties = Vec<(ByteString, ByteString)>;

/// Every MQTT control packet. Large variants are boxed to keep the enum small on the hot path.
#[derive(Clone, Debug, PartialEq)]
pub enum Packet {
    /// Client → server: open a session (boxed: large and rare).
    Connect(Box<Connect>),
    /// Server → client: answer to CONNECT.
    ConnAck(ConnAck),
    /// Either direction: an application message.
    Publish(Publish),
    /// QoS 1 acknowledgement.
    PubAck(PubResponse),
    /// QoS 2, step 2: publish received.
    PubRec(PubResponse),
    /// QoS 2, step 3: publish release.
    PubRel(PubResponse),
    /// QoS 2, step 4: publish complete.
    PubComp(PubResponse),
    /// Client → server: add subscriptions.
    Subscribe(Subscribe),
    /// Server → client: one result per requested filter.
    SubAck(SubAck),
    /// Client → server: remove subscriptions.
    Unsubscribe(Unsubscribe),
    /// Server → client: answer to UNSUBSCRIBE.
    UnsubAck(UnsubAck),
    /// Client → server: keep-alive probe.
    PingReq,
    /// Server → client: keep-alive answer.
    PingResp,
    /// Orderly close (either direction in v5).
    Disconnect(Disconnect),
    /// v5 enhanced authentication step.
    Auth(Auth),
}

impl Packet {
    /// Human-readable packet name, for logs and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}

/// CONNECT: opens a session.
#[derive(Clone, Debug, PartialEq)]
pub struct Connect {
    pub protocol: ProtocolVersion,
    /// "Clean Session" in 3.x, "Clean Start" in 5.0.
    pub clean_start: bool,
    pub keep_alive: u16,
    pub client_id: ByteString,
    pub will: Option<LastWill>,
    pub username: Option<ByteString>,
    pub password: Option<Bytes>,
    pub properties: ConnectProperties,
}

/// The will message carried in CONNECT.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LastWill {
    pub topic: ByteString,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: WillProperties,
}

/// CONNECT properties (v5 only; empty for 3.x).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

/// Will properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<ByteString>,
    pub response_topic: Option<ByteString>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
}

/// CONNACK: the broker's answer to CONNECT.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnAck {
    pub session_present: bool,
    /// v5 reason code; for 3.x the encoder maps it to the v3 return code (0..=5).
    pub reason_code: ReasonCode,
    pub properties: ConnAckProperties,
}

/// CONNACK properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_qos: Option<QoS>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<ByteString>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<ByteString>,
    pub server_reference: Option<ByteString>,
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
}

/// PUBLISH: an application message in flight.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// May be empty in v5 when a topic alias stands in for it.
    pub topic: ByteString,
    /// 0 for QoS 0 (absent on the wire); non-zero otherwise (MQTT-2.2.1-3).
    pub packet_id: u16,
    pub payload: Bytes,
    pub properties: PublishProperties,
}

/// PUBLISH properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PublishProperties {
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub response_topic: Option<ByteString>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: UserProperties,
    /// Present only on broker→client PUBLISH; one per matching subscription (MQTT-3.3.4-4).
    pub subscription_identifiers: SmallVec<[u32; 1]>,
    pub content_type: Option<ByteString>,
}

impl PublishProperties {
    /// True when nothing would be written, so v5 encoders can emit a zero property length.
    pub fn is_empty(&self) -> bool {
        self.payload_format_indicator.is_none()
            && self.message_expiry_interval.is_none()
            && self.topic_alias.is_none()
            && self.response_topic.is_none()
            && self.correlation_data.is_none()
            && self.user_properties.is_empty()
            && self.subscription_identifiers.is_empty()
            && self.content_type.is_none()
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape: a packet id plus an optional reason.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PubResponse {
    pub packet_id: u16,
    /// Success (0x00) unless stated; omitted on the wire when 0 and there are no properties.
    pub reason_code: ReasonCode,
    pub properties: AckProperties,
}

impl PubResponse {
    /// The common case: a plain success acknowledgement.
    pub fn new(packet_id: u16) -> Self {
        PubResponse {
            packet_id,
            ..Default::default()
        }
    }
}

/// Properties shared by the acknowledgement packets (PUBACK..PUBCOMP, SUBACK, UNSUBACK).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AckProperties {
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}

impl AckProperties {
    /// True when there is nothing to encode.
    pub fn is_empty(&self) -> bool {
        self.reason_string.is_none() && self.user_properties.is_empty()
    }
}

/// Per-filter subscription options (the v5 options byte; 3.x uses only `qos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    /// 0: send retained on subscribe; 1: only if the subscription is new; 2: never.
    pub retain_handling: u8,
}

/// SUBSCRIBE. Topic filters are decoded as UTF-8 but validated by the broker, so that a v5
/// client gets a per-filter 0x8F instead of losing the connection.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Subscribe {
    pub packet_id: u16,
    pub subscription_identifier: Option<u32>,
    pub user_properties: UserProperties,
    pub filters: Vec<(ByteString, SubscriptionOptions)>,
}

/// SUBACK: one reason code per requested filter, in order (MQTT-3.8.4-6).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SubAck {
    pub packet_id: u16,
    pub properties: AckProperties,
    /// v5 reason codes; 3.x encoders map granted QoS 0..2 as is and failures to 0x80.
    pub reason_codes: Vec<ReasonCode>,
}

/// UNSUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub user_properties: UserProperties,
    pub filters: Vec<ByteString>,
}

/// UNSUBACK: reason codes exist only in v5; 3.x carries just the packet id.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct UnsubAck {
    pub packet_id: u16,
    pub properties: AckProperties,
    pub reason_codes: Vec<ReasonCode>,
}

/// DISCONNECT, sent by either side in v5; client-only and empty in 3.x.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Disconnect {
    pub reason_code: ReasonCode,
    pub properties: DisconnectProperties,
}

/// DISCONNECT properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DisconnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
    pub server_reference: Option<ByteString>,
}

/// AUTH (v5 only): enhanced authentication exchange.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Auth {
    pub reason_code: ReasonCode,
    pub properties: AuthProperties,
}

/// AUTH properties.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AuthProperties {
    pub authentication_method: Option<ByteString>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<ByteString>,
    pub user_properties: UserProperties,
}
