//! Packet decoding: fixed header first (so oversized or impossible packets are refused before
//! their body arrives), then the body, read from a slice of the read buffer that lives only
//! while it is decoded: every field a caller may keep is a copy of its own (`owned`).
//!
//! Must not: hand out a slice of the read buffer for anything a caller may keep; read the
//! config (the caller fills in the rules).

use bytes::{Buf, BytesMut};
use bytestring::ByteString;

use super::owned::{keeps_nothing, owned_topic};
use super::properties::read as props;
use super::reader::Reader;
use super::rules::DecodeRules;
use super::topic::{has_disallowed_code_points, is_empty_filter, topic_name_error};
use super::varint::decode_varint;
use super::{codes, types::*, DecodeError, ReasonCode};

type Result<T> = std::result::Result<T, DecodeError>;

const CONNECT: u8 = 1;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
pub(super) const PUBACK: u8 = 4;
pub(super) const PUBREC: u8 = 5;
pub(super) const PUBREL: u8 = 6;
pub(super) const PUBCOMP: u8 = 7;
const SUBSCRIBE: u8 = 8;
const SUBACK: u8 = 9;
const UNSUBSCRIBE: u8 = 10;
const UNSUBACK: u8 = 11;
pub(super) const PINGREQ: u8 = 12;
pub(super) const PINGRESP: u8 = 13;
const DISCONNECT: u8 = 14;
const AUTH: u8 = 15;

/// The first 2..=5 bytes of every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedHeader {
    /// Packet type (high nibble) and flags (low nibble).
    pub byte1: u8,
    /// Length of variable header + payload.
    pub remaining_length: usize,
    /// Bytes taken by the fixed header itself (2..=5).
    pub header_len: usize,
}

/// Reads a fixed header from the front of `buf` without consuming it.
///
/// `Ok(None)` means more bytes are needed. Fails on a malformed variable byte integer or when
/// the whole packet (header + remaining length) would exceed `max_packet_size`.
///
/// # Errors
///
/// `Malformed` for a bad variable byte integer; `PacketTooLarge` beyond `max_packet_size`.
#[inline]
pub fn decode_fixed_header(buf: &[u8], max_packet_size: usize) -> Result<Option<FixedHeader>> {
    let Some((&byte1, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let Some((remaining_length, n)) = decode_varint(rest)? else {
        return Ok(None);
    };
    let header_len = 1 + n;
    let size = header_len + remaining_length;
    if size > max_packet_size {
        return Err(DecodeError::PacketTooLarge {
            size,
            max: max_packet_size,
        });
    }
    Ok(Some(FixedHeader {
        byte1,
        remaining_length,
        header_len,
    }))
}

/// Checks packet type and flags from byte 1 alone, so garbage is refused at its first byte.
#[inline]
fn check_byte1(byte1: u8, version: Option<ProtocolVersion>) -> Result<()> {
    let kind = byte1 >> 4;
    let flags = byte1 & 0x0F;
    let expected = match (kind, version) {
        (CONNECT, _) => 0,
        (_, None) => {
            return Err(DecodeError::Protocol("first packet is not CONNECT")); // MQTT-3.1.0-1
        }
        (PUBLISH, _) => {
            if flags & 0b0110 == 0b0110 {
                return Err(DecodeError::Malformed("PUBLISH with QoS 3")); // MQTT-3.3.1-4
            }
            if flags & 0b1110 == 0b1000 {
                return Err(DecodeError::Malformed("PUBLISH with QoS 0 and DUP set"));
                // MQTT-3.3.1-2
            }
            return Ok(());
        }
        (PUBREL | SUBSCRIBE | UNSUBSCRIBE, _) => 0b0010,
        (AUTH, Some(v)) if !v.is_v5() => {
            return Err(DecodeError::Malformed("AUTH before MQTT 5.0"));
        }
        (0, _) => return Err(DecodeError::Malformed("reserved packet type 0")),
        _ => 0,
    };
    if flags != expected {
        return Err(DecodeError::Malformed("reserved fixed header flags")); // MQTT-2.1.3-1
    }
    Ok(())
}

/// Decodes one packet from the front of `buf` (what may be kept of it owns its bytes, see
/// [`decode_with`]), with only the spec's MUSTs enforced ([`DecodeRules::new`]); see [`decode_with`].
///
/// # Errors
///
/// As [`decode_with`].
#[inline]
pub fn decode(
    buf: &mut BytesMut,
    version: Option<ProtocolVersion>,
    max_packet_size: usize,
) -> Result<Option<Packet>> {
    decode_with(buf, version, DecodeRules::new(max_packet_size))
}

/// Decodes one packet from the front of `buf`. What a caller may keep of it (topic, payload,
/// properties, filters, client id, will) owns its own bytes, never a slice of `buf`, so a
/// small message kept for a day pins nothing but itself (see `codec::owned`).
///
/// `Ok(None)`: incomplete, `buf` untouched. `version` is `None` before the handshake, when only
/// CONNECT is legal (MQTT-3.1.0-1); afterwards it is the connection's protocol level.
///
/// # Errors
///
/// A `DecodeError` for a malformed packet, one not allowed at `version` (or before CONNECT),
/// one larger than `rules.max_packet_size`, or one `rules` refuse; the connection cannot
/// continue after it.
#[inline]
pub fn decode_with(
    buf: &mut BytesMut,
    version: Option<ProtocolVersion>,
    rules: DecodeRules,
) -> Result<Option<Packet>> {
    let max_packet_size = rules.max_packet_size;
    let Some(&byte1) = buf.first() else {
        return Ok(None);
    };
    check_byte1(byte1, version)?;
    let Some(header) = decode_fixed_header(buf, max_packet_size)? else {
        return Ok(None);
    };
    let total = header.header_len + header.remaining_length;
    if buf.len() < total {
        return Ok(None);
    }
    let v5 = version == Some(ProtocolVersion::V5);
    let mut packet = buf.split_to(total).freeze();
    packet.advance(header.header_len);
    let controls = rules.allow_control_characters;
    if byte1 >> 4 == PUBLISH {
        // The hot path, kept apart so its frame stays small and the value is built in place.
        return publish(byte1, &mut Reader::owning(packet), v5, controls)
            .map(|p| Some(Packet::Publish(p)));
    }
    let mut r = if keeps_nothing(byte1 >> 4) {
        Reader::new(packet)
    } else {
        Reader::owning(packet)
    };
    other(byte1, &mut r, v5, controls).map(Some)
}

/// Every packet type but PUBLISH. `controls`: [`DecodeRules::allow_control_characters`].
#[inline(never)]
fn other(byte1: u8, r: &mut Reader, v5: bool, controls: bool) -> Result<Packet> {
    Ok(match byte1 >> 4 {
        PUBACK => Packet::PubAck(pub_response(r, v5, codes::puback)?),
        PUBREC => Packet::PubRec(pub_response(r, v5, codes::puback)?),
        PUBREL => Packet::PubRel(pub_response(r, v5, codes::pubrel)?),
        PUBCOMP => Packet::PubComp(pub_response(r, v5, codes::pubrel)?),
        CONNECT => Packet::Connect(Box::new(connect(r, controls)?)),
        CONNACK => Packet::ConnAck(connack(r, v5)?),
        SUBSCRIBE => Packet::Subscribe(subscribe(r, v5, controls)?),
        SUBACK => Packet::SubAck(suback(r, v5)?),
        UNSUBSCRIBE => Packet::Unsubscribe(unsubscribe(r, v5, controls)?),
        UNSUBACK => Packet::UnsubAck(unsuback(r, v5)?),
        PINGREQ => {
            r.finish()?;
            Packet::PingReq
        }
        PINGRESP => {
            r.finish()?;
            Packet::PingResp
        }
        DISCONNECT => Packet::Disconnect(disconnect(r, v5)?),
        AUTH => Packet::Auth(auth(r)?),
        _ => return Err(DecodeError::Malformed("reserved packet type 0")),
    })
}

/// A Packet Identifier where one is required: non-zero (MQTT-2.2.1-3, -4).
#[inline]
fn packet_id(r: &mut Reader) -> Result<u16> {
    match r.u16()? {
        0 => Err(DecodeError::Protocol("packet identifier 0")),
        id => Ok(id),
    }
}

/// A v5 reason code byte, checked against the packet's table.
#[inline]
fn reason(r: &mut Reader, allowed: fn(u8) -> bool) -> Result<ReasonCode> {
    let code = r.u8()?;
    if !allowed(code) {
        return Err(DecodeError::Protocol(
            "reason code not allowed in this packet",
        ));
    }
    Ok(ReasonCode(code))
}

/// CONNECT (3.1.1 §3.1, 5.0 §3.1). Its own protocol level decides the layout, whatever
/// `version` the connection has; a second CONNECT is rejected by the connection. `controls`:
/// whether the will topic may carry control characters ([`DecodeRules`]).
fn connect(r: &mut Reader, controls: bool) -> Result<Connect> {
    let name = r.binary()?;
    let level = r.u8()?;
    let Some((protocol, bridge)) = protocol_level(&name, level) else {
        return Err(DecodeError::UnsupportedProtocol(level)); // MQTT-3.1.2-1, -2
    };
    let v5 = protocol.is_v5();
    let flags = r.u8()?;
    // MQTT-3.1.2-3 (5.0 and 3.1.1). MQTT 3.1 leaves bit 0 unused without requiring it to be 0;
    // Mosquitto accepts it set at that level, and so do we (the bit means nothing there).
    if flags & 0x01 != 0 && protocol != ProtocolVersion::V3_1 {
        return Err(DecodeError::Malformed("reserved CONNECT flag set"));
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        // MQTT-3.1.2-11, -13 (5.0); MQTT-3.1.2-13, -15 (3.1.1).
        return Err(DecodeError::Malformed(
            "will QoS or retain without will flag",
        ));
    }
    let Some(will_qos) = QoS::from_u8(will_qos) else {
        return Err(DecodeError::Malformed("will QoS 3")); // MQTT-3.1.2-12 (5.0)
    };
    if password_flag && !username_flag && !v5 {
        return Err(DecodeError::Malformed("password without user name")); // MQTT-3.1.2-22 (3.1.1)
    }
    let keep_alive = r.u16()?;
    let properties = if v5 {
        props::connect(r)?
    } else {
        ConnectProperties::default()
    };
    // The payload's fields are read in the order the literal names them, which is their order
    // on the wire (MQTT-3.1.3-1): Client Identifier, Will, User Name, Password.
    let connect = Connect {
        protocol,
        bridge,
        clean_start,
        keep_alive,
        properties,
        client_id: r.string()?,
        will: will_flag
            .then(|| last_will(r, v5, will_qos, will_retain, controls))
            .transpose()?,
        username: username_flag.then(|| r.string()).transpose()?,
        password: password_flag.then(|| r.binary()).transpose()?,
    };
    r.finish()?;
    Ok(connect)
}

/// Whether a string property the broker forwards to subscribers (Content Type, Response
/// Topic, User Properties) carries a code point MQTT says SHOULD NOT appear
/// ([`has_disallowed_code_points`]): refused like one in the topic name unless
/// `mqtt.allow_control_characters`, as Mosquitto does, rather than passed on to subscribers
/// whose clients may treat the packet as malformed (5.0 §1.5.4) and drop their connection
/// (issue 35, thirteenth adversarial pass, F3). Two tests of an absent `Option` and one of
/// an empty list for a message without them.
fn forwarded_strings_disallowed(properties: &impl Forwarded) -> bool {
    let (content_type, response_topic, user_properties) = properties.forwarded();
    content_type.is_some_and(|s| has_disallowed_code_points(s))
        || response_topic.is_some_and(|s| has_disallowed_code_points(s))
        || user_properties
            .iter()
            .any(|(k, v)| has_disallowed_code_points(k) || has_disallowed_code_points(v))
}

/// The strings a message's properties carry on to its subscribers (Content Type, Response
/// Topic, User Properties), of a PUBLISH or a will: what [`forwarded_strings_disallowed`]
/// looks at, whichever of the two property types holds them.
trait Forwarded {
    fn forwarded(&self) -> (Option<&ByteString>, Option<&ByteString>, &UserProperties);
}

/// [`Forwarded`] for the two property types, which name the three fields alike.
macro_rules! forwarded {
    ($($t:ty),*) => {$(
        impl Forwarded for $t {
            fn forwarded(&self) -> (Option<&ByteString>, Option<&ByteString>, &UserProperties) {
                (self.content_type.as_ref(), self.response_topic.as_ref(), &self.user_properties)
            }
        }
    )*};
}
forwarded!(PublishProperties, WillProperties);

/// [`forwarded_strings_disallowed`] as the decoder applies it: Malformed (`what`) unless
/// `controls` (`mqtt.allow_control_characters`) lets them through.
fn refuse_forwarded_strings(
    controls: bool,
    properties: &impl Forwarded,
    what: &'static str,
) -> Result<()> {
    if !controls && forwarded_strings_disallowed(properties) {
        return Err(DecodeError::Malformed(what));
    }
    Ok(())
}

/// Whether a PUBLISH carries, in its topic or the properties forwarded with it, a code point
/// a client's PUBLISH is refused for unless `mqtt.allow_control_characters`: for what comes
/// in by another way than a client's decoder, a bridge's remote (issue 35, fourteenth
/// adversarial pass, A3: an ESC sequence and U+FFFF from a remote reached local
/// subscribers).
pub fn publish_has_disallowed_code_points(publish: &Publish) -> bool {
    has_disallowed_code_points(&publish.topic) || forwarded_strings_disallowed(&publish.properties)
}

/// The Will of a CONNECT whose Will Flag is set: properties (5.0), topic and payload, with the
/// QoS and retain its flags gave. `controls`: as for [`connect`].
fn last_will(r: &mut Reader, v5: bool, qos: QoS, retain: bool, controls: bool) -> Result<LastWill> {
    let properties = if v5 {
        props::will(r)?
    } else {
        WillProperties::default()
    };
    let what = "control character or non-character in a will property";
    refuse_forwarded_strings(controls, &properties, what)?;
    let topic = r.string()?;
    if let Some(why) = topic_name_error(&topic) {
        return Err(DecodeError::TopicNameInvalid(why));
    }
    if !controls && has_disallowed_code_points(&topic) {
        // 5.0 §1.5.4: a receiver MAY treat it as a Malformed Packet.
        return Err(DecodeError::Malformed(
            "control character or non-character in the will topic",
        ));
    }
    let payload = r.binary()?;
    Ok(LastWill {
        topic,
        payload,
        qos,
        retain,
        properties,
    })
}

/// The protocol a CONNECT's name and level byte say, and whether the level carries the bridge
/// bit (0x80: Mosquitto's `try_private`, on 3.1 and 3.1.1 only; see [`Connect::bridge`]).
pub(crate) fn protocol_level(name: &[u8], level: u8) -> Option<(ProtocolVersion, bool)> {
    let bridge = level & 0x80 != 0;
    let protocol = match (name, level & 0x7F) {
        (b"MQTT", 4) => ProtocolVersion::V3_1_1,
        (b"MQTT", 5) if !bridge => ProtocolVersion::V5,
        (b"MQIsdp", 3) => ProtocolVersion::V3_1,
        _ => return None,
    };
    Some((protocol, bridge))
}

/// CONNACK (3.1.1 §3.2, 5.0 §3.2). 3.x return codes come back as their v5 equivalents.
fn connack(r: &mut Reader, v5: bool) -> Result<ConnAck> {
    let flags = r.u8()?;
    if flags & 0xFE != 0 {
        return Err(DecodeError::Malformed("reserved CONNACK flags set")); // MQTT-3.2.2-1
    }
    let session_present = flags & 0x01 != 0;
    let reason_code = if v5 {
        reason(r, codes::connack)?
    } else {
        codes::connack_from_v3(r.u8()?)
            .ok_or(DecodeError::Protocol("reserved CONNACK return code"))?
    };
    if session_present && reason_code != ReasonCode::SUCCESS {
        // MQTT-3.2.2-6 (5.0); MQTT-3.2.2-4 (3.1.1).
        return Err(DecodeError::Protocol(
            "session present on a refused connection",
        ));
    }
    let properties = if v5 {
        props::connack(r)?
    } else {
        ConnAckProperties::default()
    };
    r.finish()?;
    Ok(ConnAck {
        session_present,
        reason_code,
        properties,
    })
}

/// The bytes of a topic name that make it worth a closer look in [`publish`]: a table lookup a
/// byte costs half what the range comparisons did (callgrind, fan-in QoS 1). With `strict`
/// (control characters and non-characters refused, the default) also their bytes: below
/// 0x20, 0x7F, 0xC2 (leads U+0080..U+00BF) and the leads of non-characters (0xEF for
/// U+FDD0..U+FDEF and U+FFFE/U+FFFF, 0xF0..=0xF4 for their kin in every plane); without, a
/// topic of emoji or fullwidth characters is not looked at twice.
const fn suspicious_bytes(strict: bool) -> [bool; 256] {
    let mut table = [false; 256];
    table[0] = true;
    table[b'+' as usize] = true;
    table[b'#' as usize] = true;
    if strict {
        let mut b = 1;
        while b < 0x20 {
            table[b] = true;
            b += 1;
        }
        table[0x7F] = true;
        table[0xC2] = true;
        table[0xEF] = true;
        let mut lead = 0xF0;
        while lead <= 0xF4 {
            table[lead] = true;
            lead += 1;
        }
    }
    table
}

/// [`suspicious_bytes`] when control characters are refused.
static SUSPICIOUS: [bool; 256] = suspicious_bytes(true);
/// [`suspicious_bytes`] when `mqtt.allow_control_characters` lets them through.
static SUSPICIOUS_LAX: [bool; 256] = suspicious_bytes(false);

/// PUBLISH (3.1.1 §3.3, 5.0 §3.3): the hot path. One pass spots every byte that may need a
/// closer look (NUL, wildcards, control characters: bytes below 0x20, 0x7F, and 0xC2, which
/// leads U+0080..U+00BF; non-characters: leads 0xEF and 0xF0..=0xF4), so a clean topic costs
/// that pass and a UTF-8 check, whatever `controls`
/// ([`DecodeRules::allow_control_characters`]) says. The strings of its properties that are
/// forwarded are held to the same rule ([`forwarded_strings_disallowed`]).
#[inline(always)]
fn publish(byte1: u8, r: &mut Reader, v5: bool, controls: bool) -> Result<Publish> {
    let qos = match (byte1 >> 1) & 0x03 {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        2 => QoS::ExactlyOnce,
        _ => return Err(DecodeError::Malformed("PUBLISH with QoS 3")),
    };
    let topic_len = usize::from(r.u16()?);
    let raw = r.take_slice(topic_len)?;
    let table = if controls {
        &SUSPICIOUS_LAX
    } else {
        &SUSPICIOUS
    };
    let suspicious = raw
        .iter()
        .fold(false, |acc, &b| acc | table[usize::from(b)]);
    let topic = ByteString::try_from(raw)
        .map_err(|_| DecodeError::Malformed("invalid UTF-8 in a string"))?;
    let topic = if r.copies() {
        owned_topic(&topic)
    } else {
        topic
    };
    let packet_id = if qos == QoS::AtMostOnce {
        0
    } else {
        packet_id(r)?
    };
    let properties = if !v5 || r.skip_empty_section() {
        PublishProperties::default()
    } else {
        let properties = props::publish(r)?;
        let what = "control character or non-character in a property";
        refuse_forwarded_strings(controls, &properties, what)?;
        properties
    };
    if topic.is_empty() {
        if properties.topic_alias.is_none() {
            // MQTT-4.7.3-1; in 5.0 an alias may stand in (§3.3.2.3.4).
            return Err(DecodeError::TopicNameInvalid("empty topic name"));
        }
    } else if suspicious {
        if topic.contains('\0') {
            return Err(DecodeError::Malformed("U+0000 in a UTF-8 string")); // MQTT-1.5.4-2
        }
        if let Some(why) = topic_name_error(&topic) {
            return Err(DecodeError::TopicNameInvalid(why)); // MQTT-3.3.2-2
        }
        if !controls && has_disallowed_code_points(&topic) {
            // 5.0 §1.5.4: a receiver MAY treat it as a Malformed Packet.
            return Err(DecodeError::Malformed(
                "control character or non-character in the topic name",
            ));
        }
    }
    Ok(Publish {
        dup: byte1 & 0x08 != 0,
        qos,
        retain: byte1 & 0x01 != 0,
        topic,
        packet_id,
        payload: r.rest(),
        properties,
    })
}

/// PUBACK/PUBREC/PUBREL/PUBCOMP. In 5.0 the reason code may be omitted (remaining length 2,
/// meaning success) and so may the property length (remaining length 3) (§3.4.2.1).
#[inline]
fn pub_response(r: &mut Reader, v5: bool, allowed: fn(u8) -> bool) -> Result<PubResponse> {
    let packet_id = packet_id(r)?;
    if !v5 || r.is_empty() {
        r.finish()?;
        return Ok(PubResponse::new(packet_id));
    }
    let reason_code = reason(r, allowed)?;
    let properties = if r.is_empty() {
        AckProperties::default()
    } else {
        props::ack(r)?
    };
    r.finish()?;
    Ok(PubResponse {
        packet_id,
        reason_code,
        properties,
    })
}

/// A topic filter of SUBSCRIBE or UNSUBSCRIBE, refused only where the packet itself cannot
/// stand: an empty filter, also after `$share/{group}/` ([`is_empty_filter`]: MQTT-4.7.3-1,
/// MQTT-4.8.2-2), and control characters unless `controls` allows them (5.0 §1.5.4).
///
/// Malformed (0x81), not a Protocol Error: the spec defines SUBACK's 0x8F for a filter that is
/// "correctly formed but not allowed", so one that is not correctly formed is a packet that
/// "does not conform to this specification" (0x81), like the other malformed strings; it is
/// also what Mosquitto answers. Every other invalid filter (`a/#/b`, `$share//a`) is left to
/// the broker, which fails only its entry (SUBACK 0x8F, 3.x 0x80).
#[inline]
fn filter(r: &mut Reader, controls: bool) -> Result<ByteString> {
    let filter = r.string()?;
    if is_empty_filter(&filter) {
        return Err(DecodeError::Malformed("empty topic filter"));
    }
    if !controls && has_disallowed_code_points(&filter) {
        return Err(DecodeError::Malformed(
            "control character or non-character in a topic filter",
        ));
    }
    Ok(filter)
}

/// SUBSCRIBE (3.1.1 §3.8, 5.0 §3.8). Filters are checked here only for what makes the packet
/// malformed ([`filter`]); the broker validates the rest of each one so that a v5 client gets
/// 0x8F for it in SUBACK.
fn subscribe(r: &mut Reader, v5: bool, controls: bool) -> Result<Subscribe> {
    let packet_id = packet_id(r)?;
    let (subscription_identifier, user_properties) = if v5 {
        props::subscribe(r)?
    } else {
        (None, UserProperties::new())
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = filter(r, controls)?;
        let options = r.u8()?;
        let reserved = if v5 { 0xC0 } else { 0xFC };
        if options & reserved != 0 {
            // MQTT-3.8.3-5 (5.0); MQTT-3-8.3-4 (3.1.1).
            return Err(DecodeError::Malformed(
                "reserved subscription option bits set",
            ));
        }
        let Some(qos) = QoS::from_u8(options & 0x03) else {
            return Err(DecodeError::Malformed("subscription with QoS 3"));
        };
        let retain_handling = (options >> 4) & 0x03;
        if retain_handling == 3 {
            return Err(DecodeError::Protocol("Retain Handling 3")); // 5.0 §3.8.3.1
        }
        filters.push((
            filter,
            SubscriptionOptions {
                qos,
                no_local: options & 0x04 != 0,
                retain_as_published: options & 0x08 != 0,
                retain_handling,
            },
        ));
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("SUBSCRIBE without topic filters")); // MQTT-3.8.3-3
    }
    Ok(Subscribe {
        packet_id,
        subscription_identifier,
        user_properties,
        filters,
    })
}

/// The list of one-byte reason codes that ends SUBACK and UNSUBACK; never empty, since it
/// answers a SUBSCRIBE/UNSUBSCRIBE with at least one filter.
fn reason_list(r: &mut Reader, allowed: fn(u8) -> bool) -> Result<Vec<ReasonCode>> {
    let raw = r.rest();
    if raw.is_empty() {
        return Err(DecodeError::Protocol(
            "acknowledgement without reason codes",
        ));
    }
    if !raw.iter().all(|&c| allowed(c)) {
        return Err(DecodeError::Protocol(
            "reason code not allowed in this packet",
        ));
    }
    Ok(raw.iter().map(|&c| ReasonCode(c)).collect())
}

/// SUBACK (3.1.1 §3.9, 5.0 §3.9).
fn suback(r: &mut Reader, v5: bool) -> Result<SubAck> {
    let packet_id = packet_id(r)?;
    let (properties, allowed): (_, fn(u8) -> bool) = if v5 {
        (props::ack(r)?, codes::suback)
    } else {
        (AckProperties::default(), codes::suback_v3)
    };
    let reason_codes = reason_list(r, allowed)?;
    Ok(SubAck {
        packet_id,
        properties,
        reason_codes,
    })
}

/// UNSUBSCRIBE (3.1.1 §3.10, 5.0 §3.10); its filters follow [`filter`] like SUBSCRIBE's.
fn unsubscribe(r: &mut Reader, v5: bool, controls: bool) -> Result<Unsubscribe> {
    let packet_id = packet_id(r)?;
    let user_properties = if v5 {
        props::unsubscribe(r)?
    } else {
        UserProperties::new()
    };
    let mut filters = Vec::new();
    while !r.is_empty() {
        filters.push(filter(r, controls)?);
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("UNSUBSCRIBE without topic filters")); // MQTT-3.10.3-2
    }
    Ok(Unsubscribe {
        packet_id,
        user_properties,
        filters,
    })
}

/// UNSUBACK (3.1.1 §3.11: packet id only; 5.0 §3.11: plus properties and reason codes).
fn unsuback(r: &mut Reader, v5: bool) -> Result<UnsubAck> {
    let packet_id = packet_id(r)?;
    if !v5 {
        r.finish()?;
        return Ok(UnsubAck {
            packet_id,
            ..UnsubAck::default()
        });
    }
    let properties = props::ack(r)?;
    let reason_codes = reason_list(r, codes::unsuback)?;
    Ok(UnsubAck {
        packet_id,
        properties,
        reason_codes,
    })
}

/// A reason code `allowed` in the packet and the properties `read` takes after it, either
/// of which may be left out at the end of the packet (5.0 §3.14.2.1, §3.15.2.1: the short
/// forms of DISCONNECT and AUTH); nothing may follow them.
fn code_and_properties<P: Default>(
    r: &mut Reader,
    allowed: fn(u8) -> bool,
    read: fn(&mut Reader) -> Result<P>,
) -> Result<(ReasonCode, P)> {
    if r.is_empty() {
        return Ok((ReasonCode::SUCCESS, P::default()));
    }
    let reason_code = reason(r, allowed)?;
    let properties = if r.is_empty() { P::default() } else { read(r)? };
    r.finish()?;
    Ok((reason_code, properties))
}

/// DISCONNECT: empty in 3.x; in 5.0 remaining length 0 means normal disconnection and 1 means
/// a reason code without properties (§3.14.2.1, §3.14.2.2.1).
fn disconnect(r: &mut Reader, v5: bool) -> Result<Disconnect> {
    if !v5 {
        r.finish()?;
        return Ok(Disconnect::default());
    }
    let (reason_code, properties) = code_and_properties(r, codes::disconnect, props::disconnect)?;
    Ok(Disconnect {
        reason_code,
        properties,
    })
}

/// AUTH (5.0 only, §3.15; refused for 3.x in `check_byte1`). Same short forms as DISCONNECT.
fn auth(r: &mut Reader) -> Result<Auth> {
    let (reason_code, properties) = code_and_properties(r, codes::auth, props::auth)?;
    Ok(Auth {
        reason_code,
        properties,
    })
}
