//! Packet encoding. Every body is measured, then written once into a single reservation.
//! PUBLISH, the hot path, has its own straight-line encoder.
//!
//! Must not: allocate per field; read the config (the caller fills in
//! the rules).

use bytes::{BufMut, BytesMut};

use super::properties::write::{SubscribeProperties, UserOnly};
use super::sink::{properties_len, Counter, Sink, Writer};
use super::varint::{put_varint, varint_len, MAX_VARINT};
use super::{
    Auth, ConnAck, Connect, Disconnect, EncodeError, Packet, ProtocolVersion, PubResponse,
    PublishProperties, QoS, ReasonCode, SubAck, Subscribe, UnsubAck, Unsubscribe,
};

type Result<T = ()> = std::result::Result<T, EncodeError>;

/// The parts of a PUBLISH other than its payload, borrowed so the broker can encode a shared
/// message without building a `Publish` per subscriber.
#[derive(Clone, Copy, Debug)]
pub struct PublishHeader<'a> {
    /// DUP flag: this is a re-delivery.
    pub dup: bool,
    /// Delivery QoS for this recipient.
    pub qos: QoS,
    /// RETAIN flag as sent to this recipient.
    pub retain: bool,
    /// Topic name (may be empty in v5 when `properties` carries a Topic Alias).
    pub topic: &'a str,
    /// Written only when `qos > 0`.
    pub packet_id: u16,
    /// Written only for v5; `None` means an empty property section.
    pub properties: Option<&'a PublishProperties>,
}

/// How one PUBLISH lays out (one reckoning for the whole-packet writer and the one in
/// pieces, `codec::apart`).
pub(super) struct PublishLayout<'a> {
    pub topic_len: usize,
    /// A packet id is written (QoS 1 or 2).
    pub has_id: bool,
    /// The properties written from the header: none for 3.x, or when there are none.
    pub properties: Option<&'a PublishProperties>,
    /// Their encoded length.
    pub own_len: usize,
    /// The property section's length: theirs and the ones encoded elsewhere.
    pub props_len: usize,
    /// The fixed header's Remaining Length.
    pub remaining: usize,
}

impl<'a> PublishHeader<'a> {
    /// The layout of this PUBLISH for `version` with a payload of `payload_len` bytes and
    /// `more_properties` bytes of properties encoded elsewhere (v5 only).
    ///
    /// # Errors
    ///
    /// `StringTooLong`, `OutOfRange` or `TooLarge` when a field or the packet exceeds its
    /// wire limit.
    #[inline(always)]
    pub(super) fn layout(
        &self,
        version: ProtocolVersion,
        more_properties: usize,
        payload_len: usize,
    ) -> Result<PublishLayout<'a>> {
        let topic_len = self.topic.len();
        if topic_len > u16::MAX as usize {
            return Err(EncodeError::StringTooLong);
        }
        let has_id = self.qos != QoS::AtMostOnce;
        let properties = match self.properties {
            Some(p) if version.is_v5() && !p.is_empty() => Some(p),
            _ => None,
        };
        let own_len = match properties {
            Some(p) => properties_len(p)?,
            None => 0,
        };
        let props_len = own_len + more_properties;
        let mut remaining = 2 + topic_len + 2 * usize::from(has_id) + payload_len;
        if version.is_v5() {
            remaining += varint_len(props_len) + props_len;
        }
        if remaining > MAX_VARINT {
            return Err(EncodeError::TooLarge(remaining));
        }
        Ok(PublishLayout {
            topic_len,
            has_id,
            properties,
            own_len,
            props_len,
            remaining,
        })
    }

    /// The fixed header's first byte: PUBLISH, DUP, QoS and RETAIN.
    #[inline(always)]
    pub(super) fn first_byte(&self) -> u8 {
        0x30 | (u8::from(self.dup) << 3) | ((self.qos as u8) << 1) | u8::from(self.retain)
    }
}

/// Appends `packet` encoded for `version` to `buf`.
///
/// `version` alone picks the layout, including for CONNECT (protocol name and level are
/// written from it). For 3.x, properties and v5-only fields are dropped (as is a CONNECT
/// password without a user name, which 3.1.1 cannot carry), CONNACK and SUBACK
/// codes are mapped to 3.x return codes, and AUTH fails with `NotInVersion`. On error nothing
/// is written.
///
/// # Errors
///
/// `NotInVersion` for AUTH below 5.0; `StringTooLong`, `OutOfRange` or `TooLarge` when a field
/// or the packet exceeds its wire limit.
pub fn encode(packet: &Packet, version: ProtocolVersion, buf: &mut BytesMut) -> Result {
    match packet {
        Packet::Publish(p) => {
            let header = PublishHeader {
                dup: p.dup,
                qos: p.qos,
                retain: p.retain,
                topic: &p.topic,
                packet_id: p.packet_id,
                properties: Some(&p.properties),
            };
            encode_publish(&header, &p.payload, version, buf).map(|_| ())
        }
        Packet::PingReq => {
            buf.put_slice(&[0xC0, 0x00]);
            Ok(())
        }
        Packet::PingResp => {
            buf.put_slice(&[0xD0, 0x00]);
            Ok(())
        }
        _ => {
            let mut counter = Counter(0);
            body(packet, version, &mut counter)?;
            let remaining = counter.0;
            if remaining > MAX_VARINT {
                return Err(EncodeError::TooLarge(remaining));
            }
            buf.reserve(1 + varint_len(remaining) + remaining);
            buf.put_u8(byte1(packet));
            put_varint(buf, remaining);
            #[cfg(debug_assertions)]
            let start = buf.len();
            body(packet, version, &mut Writer(buf))?;
            #[cfg(debug_assertions)]
            debug_assert_eq!(buf.len() - start, remaining);
            Ok(())
        }
    }
}

/// Appends `packet` if its encoding fits `max` bytes (the peer's Maximum Packet Size). If it
/// does not, its Reason String and User Properties are left out (the only optional parts the
/// spec lets a sender drop, MQTT-3.2.2-19/20 and alike); if it still does not fit, nothing is
/// written and the answer is `false`.
///
/// # Errors
///
/// As [`encode`], for a packet that cannot be encoded at all (too large is not an error here).
pub fn encode_within(
    packet: &Packet,
    version: ProtocolVersion,
    max: usize,
    buf: &mut BytesMut,
) -> Result<bool> {
    let start = buf.len();
    encode(packet, version, buf)?;
    if buf.len() - start <= max {
        return Ok(true);
    }
    buf.truncate(start);
    let mut slim = packet.clone();
    strip_problem_info(&mut slim);
    encode(&slim, version, buf)?;
    if buf.len() - start > max {
        buf.truncate(start);
        return Ok(false);
    }
    Ok(true)
}

/// Removes the Reason String and User Properties of a packet.
fn strip_problem_info(packet: &mut Packet) {
    let (reason, users) = match packet {
        Packet::ConnAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::SubAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::UnsubAck(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::Disconnect(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        Packet::Auth(p) => (
            &mut p.properties.reason_string,
            &mut p.properties.user_properties,
        ),
        _ => return,
    };
    *reason = None;
    users.clear();
}

/// Appends a PUBLISH to `buf`. Returns the offset (from the start of this packet) of the
/// two packet-id bytes when `qos > 0`, so a cached encoding can be copied and patched per
/// subscriber instead of re-encoded.
///
/// # Errors
///
/// `StringTooLong`, `OutOfRange` or `TooLarge` when a field or the packet exceeds its wire
/// limit.
#[inline]
pub fn encode_publish(
    header: &PublishHeader<'_>,
    payload: &[u8],
    version: ProtocolVersion,
    buf: &mut BytesMut,
) -> Result<Option<usize>> {
    let PublishLayout {
        topic_len,
        has_id,
        properties,
        props_len,
        remaining,
        ..
    } = header.layout(version, 0, payload.len())?;
    let header_len = 1 + varint_len(remaining);
    buf.reserve(header_len + remaining);
    buf.put_u8(header.first_byte());
    put_varint(buf, remaining);
    buf.put_u16(topic_len as u16);
    buf.put_slice(header.topic.as_bytes());
    let id_offset = if has_id {
        buf.put_u16(header.packet_id);
        Some(header_len + 2 + topic_len)
    } else {
        None
    };
    if version.is_v5() {
        put_varint(buf, props_len);
        if let Some(p) = properties {
            use super::properties::write::WriteProperties;
            p.write(&mut Writer(buf))?;
        }
    }
    buf.put_slice(payload);
    Ok(id_offset)
}

/// Byte 1 of the fixed header: type and the fixed flags (0b0010 where the spec reserves it).
fn byte1(packet: &Packet) -> u8 {
    match packet {
        Packet::Connect(_) => 0x10,
        Packet::ConnAck(_) => 0x20,
        Packet::Publish(_) => 0x30,
        Packet::PubAck(_) => 0x40,
        Packet::PubRec(_) => 0x50,
        Packet::PubRel(_) => 0x62,
        Packet::PubComp(_) => 0x70,
        Packet::Subscribe(_) => 0x82,
        Packet::SubAck(_) => 0x90,
        Packet::Unsubscribe(_) => 0xA2,
        Packet::UnsubAck(_) => 0xB0,
        Packet::PingReq => 0xC0,
        Packet::PingResp => 0xD0,
        Packet::Disconnect(_) => 0xE0,
        Packet::Auth(_) => 0xF0,
    }
}

/// Writes everything after the fixed header.
#[inline]
fn body<S: Sink>(packet: &Packet, version: ProtocolVersion, s: &mut S) -> Result {
    let v5 = version.is_v5();
    match packet {
        Packet::Connect(c) => connect(c, version, s),
        Packet::ConnAck(c) => connack(c, v5, s),
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => {
            pub_response(p, v5, s)
        }
        Packet::Subscribe(p) => subscribe(p, v5, s),
        Packet::SubAck(p) => suback(p, v5, s),
        Packet::Unsubscribe(p) => unsubscribe(p, v5, s),
        Packet::UnsubAck(p) => unsuback(p, v5, s),
        Packet::Disconnect(p) => disconnect(p, v5, s),
        Packet::Auth(p) => auth(p, v5, s),
        // Handled by `encode` directly; nothing after the fixed header.
        Packet::Publish(_) | Packet::PingReq | Packet::PingResp => Ok(()),
    }
}

fn connect<S: Sink>(c: &Connect, version: ProtocolVersion, s: &mut S) -> Result {
    let v5 = version.is_v5();
    s.string(if version == ProtocolVersion::V3_1 {
        "MQIsdp"
    } else {
        "MQTT"
    })?;
    // The bridge bit (Mosquitto's `try_private`) exists at 3.1 and 3.1.1 only: at 5.0 it is left
    // off, as Mosquitto does (a v5 bridge says the same per subscription: No Local, Retain As
    // Published), rather than failing the CONNECT (see `Connect::bridge`).
    let bridge = if c.bridge && !v5 { 0x80 } else { 0 };
    s.u8(version as u8 | bridge);
    // 3.x cannot carry a password without a user name (MQTT-3.1.2-22): drop it.
    let password = c.password.as_ref().filter(|_| v5 || c.username.is_some());
    let mut flags = u8::from(c.clean_start) << 1;
    if let Some(w) = &c.will {
        flags |= 0x04 | ((w.qos as u8) << 3) | (u8::from(w.retain) << 5);
    }
    if password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    s.u8(flags);
    s.u16(c.keep_alive);
    if v5 {
        s.properties(&c.properties)?;
    }
    s.string(&c.client_id)?;
    if let Some(w) = &c.will {
        if v5 {
            s.properties(&w.properties)?;
        }
        s.string(&w.topic)?;
        s.binary(&w.payload)?;
    }
    if let Some(u) = &c.username {
        s.string(u)?;
    }
    if let Some(p) = password {
        s.binary(p)?;
    }
    Ok(())
}

fn connack<S: Sink>(c: &ConnAck, v5: bool, s: &mut S) -> Result {
    s.u8(u8::from(c.session_present));
    if v5 {
        s.u8(c.reason_code.0);
        s.properties(&c.properties)
    } else {
        s.u8(c.reason_code.to_v3_connack());
        Ok(())
    }
}

/// PUBACK..PUBCOMP; v5 drops the reason code when it is success with no properties, and the
/// property length when there are no properties (§3.4.2.1).
fn pub_response<S: Sink>(p: &PubResponse, v5: bool, s: &mut S) -> Result {
    s.u16(p.packet_id);
    if v5 {
        reason_and_properties(p.reason_code, &p.properties, p.properties.is_empty(), s)?;
    }
    Ok(())
}

/// The optional tail of v5 PUBACK..PUBCOMP, DISCONNECT and AUTH.
#[inline]
fn reason_and_properties<S: Sink, P: super::properties::write::WriteProperties>(
    code: ReasonCode,
    properties: &P,
    empty: bool,
    s: &mut S,
) -> Result {
    if empty {
        if code != ReasonCode::SUCCESS {
            s.u8(code.0);
        }
        return Ok(());
    }
    s.u8(code.0);
    s.properties(properties)
}

fn subscribe<S: Sink>(p: &Subscribe, v5: bool, s: &mut S) -> Result {
    s.u16(p.packet_id);
    if v5 {
        s.properties(&SubscribeProperties {
            subscription_identifier: p.subscription_identifier,
            user_properties: &p.user_properties,
        })?;
    }
    for (filter, o) in &p.filters {
        s.string(filter)?;
        let mut options = o.qos as u8;
        if v5 {
            options |= (u8::from(o.no_local) << 2)
                | (u8::from(o.retain_as_published) << 3)
                | ((o.retain_handling & 0x03) << 4);
        }
        s.u8(options);
    }
    Ok(())
}

fn suback<S: Sink>(p: &SubAck, v5: bool, s: &mut S) -> Result {
    s.u16(p.packet_id);
    if v5 {
        s.properties(&p.properties)?;
        for c in &p.reason_codes {
            s.u8(c.0);
        }
    } else {
        for c in &p.reason_codes {
            s.u8(c.to_v3_suback());
        }
    }
    Ok(())
}

fn unsubscribe<S: Sink>(p: &Unsubscribe, v5: bool, s: &mut S) -> Result {
    s.u16(p.packet_id);
    if v5 {
        s.properties(&UserOnly(&p.user_properties))?;
    }
    for filter in &p.filters {
        s.string(filter)?;
    }
    Ok(())
}

/// UNSUBACK carries no payload before 5.0 (3.1.1 §3.11.3).
fn unsuback<S: Sink>(p: &UnsubAck, v5: bool, s: &mut S) -> Result {
    s.u16(p.packet_id);
    if v5 {
        s.properties(&p.properties)?;
        for c in &p.reason_codes {
            s.u8(c.0);
        }
    }
    Ok(())
}

/// DISCONNECT is the bare 2-byte packet before 5.0.
fn disconnect<S: Sink>(p: &Disconnect, v5: bool, s: &mut S) -> Result {
    if v5 {
        let empty = p.properties.session_expiry_interval.is_none()
            && p.properties.reason_string.is_none()
            && p.properties.user_properties.is_empty()
            && p.properties.server_reference.is_none();
        reason_and_properties(p.reason_code, &p.properties, empty, s)?;
    }
    Ok(())
}

fn auth<S: Sink>(p: &Auth, v5: bool, s: &mut S) -> Result {
    if !v5 {
        return Err(EncodeError::NotInVersion("AUTH"));
    }
    let empty = p.properties.authentication_method.is_none()
        && p.properties.authentication_data.is_none()
        && p.properties.reason_string.is_none()
        && p.properties.user_properties.is_empty();
    if empty && p.reason_code == ReasonCode::SUCCESS {
        return Ok(()); // the only short form AUTH has (5.0 §3.15.2.1)
    }
    // Unlike DISCONNECT, AUTH has no "length < 2 means no properties" rule, so the property
    // length is always written after a reason code (the decoder accepts both).
    s.u8(p.reason_code.0);
    s.properties(&p.properties)
}
