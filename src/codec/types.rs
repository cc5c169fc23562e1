//! The packet model: one Rust type per MQTT control packet, shared by all protocol levels.
//!
//! Version differences live in the decoder/encoder, not here: a v3.1.1 packet is simply a v5
//! packet whose properties are empty and whose reason codes follow the v3 return-code rules.
//! Strings are `ByteString` (UTF-8 validated `Bytes`) and payloads are `Bytes`: cheap to
//! share between the queues, the store and the encodings that hold one message.

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

/// "3.1", "3.1.1" or "5.0", as logs print it (issue 37: logs printed `V3_1_1`).
impl std::fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProtocolVersion::V3_1 => "3.1",
            ProtocolVersion::V3_1_1 => "3.1.1",
            ProtocolVersion::V5 => "5.0",
        })
    }
}

impl ProtocolVersion {
    /// True for 5.0, the only level with properties and reason codes everywhere.
    #[inline]
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }

    /// The version as operators write it (`"3.1"`, `"3.1.1"`, `"5.0"`): logs and metric labels
    /// name the protocol, not its level byte.
    pub fn label(self) -> &'static str {
        match self {
            ProtocolVersion::V3_1 => "3.1",
            ProtocolVersion::V3_1_1 => "3.1.1",
            ProtocolVersion::V5 => "5.0",
        }
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
    /// Protocol level (MQTT 3.1.2.2); fixes the wire format for the whole connection.
    pub protocol: ProtocolVersion,
    /// "Clean Session" in 3.x, "Clean Start" in 5.0.
    pub clean_start: bool,
    /// Keep Alive in seconds (MQTT 3.1.2.10); 0 disables the broker's idle timeout.
    pub keep_alive: u16,
    /// Client Identifier (MQTT 3.1.3.1); may be empty, asking the broker to assign one.
    pub client_id: ByteString,
    /// The Will Message, present when the Will Flag is set (MQTT 3.1.2.5).
    pub will: Option<LastWill>,
    /// User Name (MQTT 3.1.3.5), present when its flag is set.
    pub username: Option<ByteString>,
    /// Password (MQTT 3.1.3.6): binary data, present when its flag is set.
    pub password: Option<Bytes>,
    /// CONNECT properties (MQTT 3.1.2.11); empty for 3.x.
    pub properties: ConnectProperties,
    /// The client is a bridge (Mosquitto's `try_private true`): on the wire, the protocol level
    /// with its high bit set, 0x83 (3.1) or 0x84 (3.1.1). Why: a 3.x subscription has no No
    /// Local, so a broker that knows its peer is a bridge can still keep the bridge's own
    /// messages from echoing back to it and pass RETAIN on as published (what Mosquitto does
    /// for such a client). 3.x only: 5.0 has No Local and Retain As Published per subscription,
    /// so Mosquitto never sets the bit on level 5; 0x85 is not decoded, and the encoder leaves
    /// the bit off when encoding at 5.0.
    pub bridge: bool,
}

/// The will message carried in CONNECT.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LastWill {
    /// Will Topic (MQTT 3.1.3.3) the will is published to.
    pub topic: ByteString,
    /// Will Payload (MQTT 3.1.3.4).
    pub payload: Bytes,
    /// Will QoS (MQTT 3.1.2.6) the will is published with.
    pub qos: QoS,
    /// Will Retain (MQTT 3.1.2.7): publish the will as a retained message.
    pub retain: bool,
    /// Will Properties (MQTT 3.1.3.2); empty for 3.x.
    pub properties: WillProperties,
}

/// What one User Property holds in memory besides its name's and value's bytes: the pair of
/// `ByteString` handles (32 B each) in its vector. Counted per property, so many empty
/// properties cannot hide behind their 4 wire bytes each (issue 35, ninth pass, R3).
pub const USER_PROPERTY_HELD: usize = 64;

/// What `properties` hold: each name's and value's bytes and [`USER_PROPERTY_HELD`].
fn user_properties_held(properties: &UserProperties) -> usize {
    properties
        .iter()
        .map(|(name, value)| name.len() + value.len() + USER_PROPERTY_HELD)
        .sum()
}

impl Connect {
    /// What a refusing CONNACK needs of this CONNECT (its protocol, Maximum Packet Size and
    /// Request Problem Information), without what it holds: a CONNECT refused for holding
    /// too much is let go before the refusal is written and the close lingers, which a client
    /// reading slowly can stretch (issue 35, twenty-fifth adversarial pass, K2: 32 addresses
    /// kept 1.7 GB of refused CONNECTs alive that way).
    #[must_use]
    pub fn brief(&self) -> Connect {
        Connect {
            protocol: self.protocol,
            clean_start: self.clean_start,
            keep_alive: self.keep_alive,
            client_id: ByteString::new(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties {
                maximum_packet_size: self.properties.maximum_packet_size,
                request_problem_information: self.properties.request_problem_information,
                ..ConnectProperties::default()
            },
            bridge: self.bridge,
        }
    }

    /// The bytes this decoded CONNECT holds: its strings, password, properties (each User
    /// Property with [`USER_PROPERTY_HELD`]) and will. Its wire size understates it: a User
    /// Property of 6 wire bytes holds 64 or more decoded, so a CONNECT of `max_connect_size`
    /// could hold ten times that while it waits for a login verdict (issue 35, twenty-fourth
    /// adversarial pass, J1).
    pub fn held_bytes(&self) -> usize {
        let p = &self.properties;
        let user = user_properties_held(&p.user_properties);
        self.client_id.len()
            + self.username.as_ref().map_or(0, |u| u.len())
            + self.password.as_ref().map_or(0, Bytes::len)
            + user
            + p.authentication_method.as_ref().map_or(0, |m| m.len())
            + p.authentication_data.as_ref().map_or(0, Bytes::len)
            + self.will.as_ref().map_or(0, LastWill::held_bytes)
    }
}

impl LastWill {
    /// The bytes this will makes a broker hold while it waits (topic, payload, properties'
    /// variable-length fields): counted like a message's (issue 35, eighth pass, Q1).
    pub fn held_bytes(&self) -> usize {
        let p = &self.properties;
        let user = user_properties_held(&p.user_properties);
        16 + self.topic.len()
            + self.payload.len()
            + user
            + p.response_topic.as_ref().map_or(0, |t| t.len())
            + p.correlation_data.as_ref().map_or(0, Bytes::len)
            + p.content_type.as_ref().map_or(0, |t| t.len())
    }
}

/// CONNECT properties (v5 only; empty for 3.x).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnectProperties {
    /// Session Expiry Interval in seconds (MQTT 3.1.2.11.2); absent means 0 (ends with the link).
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (MQTT 3.1.2.11.3): QoS 1 and 2 PUBLISHes the client accepts unacknowledged.
    pub receive_maximum: Option<u16>,
    /// Maximum Packet Size (MQTT 3.1.2.11.4) the client accepts; the broker must not send larger.
    pub maximum_packet_size: Option<u32>,
    /// Topic Alias Maximum (MQTT 3.1.2.11.5): aliases the broker may use towards the client.
    pub topic_alias_maximum: Option<u16>,
    /// Request Response Information (MQTT 3.1.2.11.6): ask for Response Information in CONNACK.
    pub request_response_information: Option<bool>,
    /// Request Problem Information (MQTT 3.1.2.11.7): false withholds Reason Strings etc.
    pub request_problem_information: Option<bool>,
    /// Authentication Method (MQTT 3.1.2.11.9): names the enhanced authentication exchange.
    pub authentication_method: Option<ByteString>,
    /// Authentication Data (MQTT 3.1.2.11.10): the method's first step.
    pub authentication_data: Option<Bytes>,
    /// User Properties (MQTT 3.1.2.11.8).
    pub user_properties: UserProperties,
}

/// Will properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct WillProperties {
    /// Will Delay Interval in seconds (MQTT 3.1.3.2.2) before the will is published.
    pub will_delay_interval: Option<u32>,
    /// Payload Format Indicator (MQTT 3.1.3.2.3): 1 declares a UTF-8 payload.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds (MQTT 3.1.3.2.4) of the will message.
    pub message_expiry_interval: Option<u32>,
    /// Content Type (MQTT 3.1.3.2.5) of the will payload.
    pub content_type: Option<ByteString>,
    /// Response Topic (MQTT 3.1.3.2.6) for request/response.
    pub response_topic: Option<ByteString>,
    /// Correlation Data (MQTT 3.1.3.2.7) for request/response.
    pub correlation_data: Option<Bytes>,
    /// User Properties (MQTT 3.1.3.2.8), forwarded with the will.
    pub user_properties: UserProperties,
}

/// CONNACK: the broker's answer to CONNECT.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnAck {
    /// Session Present (MQTT 3.2.2.1.1): the broker resumed a stored session.
    pub session_present: bool,
    /// v5 reason code; for 3.x the encoder maps it to the v3 return code (0..=5).
    pub reason_code: ReasonCode,
    /// CONNACK properties (MQTT 3.2.2.3); not encoded for 3.x.
    pub properties: ConnAckProperties,
}

/// CONNACK properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ConnAckProperties {
    /// Session Expiry Interval (MQTT 3.2.2.3.2) the broker uses, if it differs from the request.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum (MQTT 3.2.2.3.3): QoS 1 and 2 PUBLISHes the broker accepts unacknowledged.
    pub receive_maximum: Option<u16>,
    /// Maximum QoS (MQTT 3.2.2.3.4) the broker accepts; absent means 2.
    pub maximum_qos: Option<QoS>,
    /// Retain Available (MQTT 3.2.2.3.5); absent means true.
    pub retain_available: Option<bool>,
    /// Maximum Packet Size (MQTT 3.2.2.3.6) the broker accepts.
    pub maximum_packet_size: Option<u32>,
    /// Assigned Client Identifier (MQTT 3.2.2.3.7), when the client sent an empty one.
    pub assigned_client_identifier: Option<ByteString>,
    /// Topic Alias Maximum (MQTT 3.2.2.3.8): aliases the client may use towards the broker.
    pub topic_alias_maximum: Option<u16>,
    /// Reason String (MQTT 3.2.2.3.9): human-readable diagnostics.
    pub reason_string: Option<ByteString>,
    /// User Properties (MQTT 3.2.2.3.10).
    pub user_properties: UserProperties,
    /// Wildcard Subscription Available (MQTT 3.2.2.3.11); absent means true.
    pub wildcard_subscription_available: Option<bool>,
    /// Subscription Identifiers Available (MQTT 3.2.2.3.12); absent means true.
    pub subscription_identifiers_available: Option<bool>,
    /// Shared Subscription Available (MQTT 3.2.2.3.13); absent means true.
    pub shared_subscription_available: Option<bool>,
    /// Server Keep Alive (MQTT 3.2.2.3.14): overrides the client's Keep Alive.
    pub server_keep_alive: Option<u16>,
    /// Response Information (MQTT 3.2.2.3.15): basis for response topics, if requested.
    pub response_information: Option<ByteString>,
    /// Server Reference (MQTT 3.2.2.3.16): another server to use.
    pub server_reference: Option<ByteString>,
    /// Authentication Method (MQTT 3.2.2.3.17) of the enhanced authentication exchange.
    pub authentication_method: Option<ByteString>,
    /// Authentication Data (MQTT 3.2.2.3.18): the method's last step.
    pub authentication_data: Option<Bytes>,
}

/// PUBLISH: an application message in flight.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Publish {
    /// DUP flag (MQTT 3.3.1.1): a redelivery of an earlier attempt; always 0 for QoS 0.
    pub dup: bool,
    /// QoS level (MQTT 3.3.1.2) of this delivery.
    pub qos: QoS,
    /// RETAIN flag (MQTT 3.3.1.3): store as the topic's retained message, or mark one as retained.
    pub retain: bool,
    /// May be empty in v5 when a topic alias stands in for it.
    pub topic: ByteString,
    /// 0 for QoS 0 (absent on the wire); non-zero otherwise (MQTT-2.2.1-3).
    pub packet_id: u16,
    /// Application Message payload (MQTT 3.3.3); opaque bytes.
    pub payload: Bytes,
    /// PUBLISH properties (MQTT 3.3.2.3); empty for 3.x.
    pub properties: PublishProperties,
}

/// PUBLISH properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PublishProperties {
    /// Payload Format Indicator (MQTT 3.3.2.3.2): 1 declares a UTF-8 payload.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds (MQTT 3.3.2.3.3); on delivery, the time left.
    pub message_expiry_interval: Option<u32>,
    /// Topic Alias (MQTT 3.3.2.3.4) standing in for, or being set to, the topic name.
    pub topic_alias: Option<u16>,
    /// Response Topic (MQTT 3.3.2.3.5) for request/response.
    pub response_topic: Option<ByteString>,
    /// Correlation Data (MQTT 3.3.2.3.6) for request/response.
    pub correlation_data: Option<Bytes>,
    /// User Properties (MQTT 3.3.2.3.7), forwarded unchanged (MQTT-3.3.2-17).
    pub user_properties: UserProperties,
    /// Present only on broker→client PUBLISH; one per matching subscription (MQTT-3.3.4-4).
    pub subscription_identifiers: SmallVec<[u32; 1]>,
    /// Content Type (MQTT 3.3.2.3.9) of the payload, forwarded unchanged.
    pub content_type: Option<ByteString>,
}

impl Publish {
    /// The bytes this PUBLISH makes a broker hold as a message: topic, payload and
    /// [`PublishProperties::held_bytes`]. Every bound on what a client's messages hold
    /// counts this, not the payload alone: a v5 client can carry its bytes in properties
    /// (issue 35, seventeenth adversarial pass, D1, D4).
    pub fn held_bytes(&self) -> usize {
        self.topic.len() + self.payload.len() + self.properties.held_bytes()
    }
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

    /// The bytes these properties make a broker hold: the variable-length fields (Response
    /// Topic, Correlation Data, Content Type, every User Property's name and value with
    /// their two length prefixes) and a few for the fixed ones. A PUBLISH may carry up to
    /// its maximum packet size of them, so every bound on what a message holds counts this
    /// with its topic and payload (issue 35, eighth adversarial pass, Q1).
    pub fn held_bytes(&self) -> usize {
        const FIXED: usize = 16;
        if self.is_empty() {
            return 0;
        }
        let user = user_properties_held(&self.user_properties);
        FIXED
            + user
            + self.response_topic.as_ref().map_or(0, |t| t.len())
            + self.correlation_data.as_ref().map_or(0, Bytes::len)
            + self.content_type.as_ref().map_or(0, |t| t.len())
            + 4 * self.subscription_identifiers.len()
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape: a packet id plus an optional reason.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PubResponse {
    /// Packet Identifier (MQTT 2.2.1) of the PUBLISH or PUBREL being answered.
    pub packet_id: u16,
    /// Success (0x00) unless stated; omitted on the wire when 0 and there are no properties.
    pub reason_code: ReasonCode,
    /// Properties (v5 only); empty for 3.x.
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
    /// Reason String: human-readable diagnostics, not to be parsed.
    pub reason_string: Option<ByteString>,
    /// User Properties.
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
    /// Maximum QoS (MQTT 3.8.3.1, bits 0-1) for messages sent on this subscription.
    pub qos: QoS,
    /// No Local (bit 2): do not deliver the subscriber's own messages (v5 only).
    pub no_local: bool,
    /// Retain As Published (bit 3): keep the RETAIN flag on forwarded messages (v5 only).
    pub retain_as_published: bool,
    /// 0: send retained on subscribe; 1: only if the subscription is new; 2: never.
    pub retain_handling: u8,
}

/// SUBSCRIBE. Topic filters are decoded as UTF-8 but validated by the broker, so that a v5
/// client gets a per-filter 0x8F instead of losing the connection.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Subscribe {
    /// Packet Identifier (MQTT 2.2.1), echoed by the SUBACK.
    pub packet_id: u16,
    /// Subscription Identifier (MQTT 3.8.2.1.2), returned on matching PUBLISHes (v5 only).
    pub subscription_identifier: Option<u32>,
    /// User Properties (MQTT 3.8.2.1.3).
    pub user_properties: UserProperties,
    /// Topic Filters with their options (MQTT 3.8.3), in request order.
    pub filters: Vec<(ByteString, SubscriptionOptions)>,
}

/// SUBACK: one reason code per requested filter, in order (MQTT-3.8.4-6).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SubAck {
    /// Packet Identifier (MQTT 2.2.1) of the SUBSCRIBE being answered.
    pub packet_id: u16,
    /// Properties (v5 only): Reason String and User Properties.
    pub properties: AckProperties,
    /// v5 reason codes; 3.x encoders map granted QoS 0..2 as is and failures to 0x80.
    pub reason_codes: Vec<ReasonCode>,
}

/// UNSUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Unsubscribe {
    /// Packet Identifier (MQTT 2.2.1), echoed by the UNSUBACK.
    pub packet_id: u16,
    /// User Properties (MQTT 3.10.2.1.2).
    pub user_properties: UserProperties,
    /// Topic Filters to remove (MQTT 3.10.3), in request order.
    pub filters: Vec<ByteString>,
}

/// UNSUBACK: reason codes exist only in v5; 3.x carries just the packet id.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct UnsubAck {
    /// Packet Identifier (MQTT 2.2.1) of the UNSUBSCRIBE being answered.
    pub packet_id: u16,
    /// Properties (v5 only): Reason String and User Properties.
    pub properties: AckProperties,
    /// One reason code per filter, in order (MQTT 3.11.3); v5 only.
    pub reason_codes: Vec<ReasonCode>,
}

/// DISCONNECT, sent by either side in v5; client-only and empty in 3.x.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Disconnect {
    /// Disconnect Reason Code (MQTT 3.14.2.1); 0x00 is a normal disconnection.
    pub reason_code: ReasonCode,
    /// DISCONNECT properties (MQTT 3.14.2.2); empty for 3.x.
    pub properties: DisconnectProperties,
}

/// DISCONNECT properties (v5 only).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DisconnectProperties {
    /// Session Expiry Interval (MQTT 3.14.2.2.2): a client may change it here, unless it was 0.
    pub session_expiry_interval: Option<u32>,
    /// Reason String (MQTT 3.14.2.2.3): human-readable diagnostics.
    pub reason_string: Option<ByteString>,
    /// User Properties (MQTT 3.14.2.2.4).
    pub user_properties: UserProperties,
    /// Server Reference (MQTT 3.14.2.2.5): another server to use (broker to client).
    pub server_reference: Option<ByteString>,
}

/// AUTH (v5 only): enhanced authentication exchange.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Auth {
    /// Authenticate Reason Code (MQTT 3.15.2.1): success, continue, or re-authenticate.
    pub reason_code: ReasonCode,
    /// AUTH properties (MQTT 3.15.2.2).
    pub properties: AuthProperties,
}

/// AUTH properties.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct AuthProperties {
    /// Authentication Method (MQTT 3.15.2.2.2); must match the one in CONNECT.
    pub authentication_method: Option<ByteString>,
    /// Authentication Data (MQTT 3.15.2.2.3): this step of the exchange.
    pub authentication_data: Option<Bytes>,
    /// Reason String (MQTT 3.15.2.2.4): human-readable diagnostics.
    pub reason_string: Option<ByteString>,
    /// User Properties (MQTT 3.15.2.2.5).
    pub user_properties: UserProperties,
}
