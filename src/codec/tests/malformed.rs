//! Every way a packet can be refused, each with the error variant (and so the reason code)
//! the spec prescribes. Ids name the normative statement checked.

use bytes::BytesMut;

use super::super::*;
use super::{dec, MAX, V3, V4, V5};

/// Decodes a complete packet and returns its error.
fn err(bytes: &[u8], version: Option<ProtocolVersion>) -> DecodeError {
    match dec(bytes, version) {
        Ok(p) => panic!("accepted {bytes:02X?} as {p:?}"),
        Err(e) => e,
    }
}

macro_rules! refuses {
    ($bytes:expr, $version:expr, $pat:pat) => {{
        let e = err(&$bytes, $version);
        assert!(matches!(e, $pat), "{:02X?}: got {e:?}", $bytes);
    }};
}

use DecodeError::{Malformed, PacketTooLarge, Protocol, TopicNameInvalid, UnsupportedProtocol};

pub(super) const ALL: [Option<ProtocolVersion>; 3] = [Some(V3), Some(V4), Some(V5)];

/// A v3.1.1/v5 CONNECT variable header with the given flags, keep alive 0.
pub(super) fn connect(level: u8, flags: u8, rest: &[u8]) -> Vec<u8> {
    let mut body = vec![0x00, 0x04, b'M', b'Q', b'T', b'T', level, flags, 0x00, 0x00];
    if level == 5 {
        body.push(0x00);
    }
    body.extend_from_slice(rest);
    let mut out = vec![0x10, body.len() as u8];
    out.extend(body);
    out
}

#[test]
fn reserved_fixed_header_flags_mqtt_2_1_3_1() {
    for v in ALL {
        refuses!([0x60, 0x02, 0x00, 0x01], v, Malformed(_)); // PUBREL needs 0b0010 (MQTT-3.6.1-1)
        refuses!(
            [0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00],
            v,
            Malformed(_)
        ); // MQTT-3.8.1-1
        refuses!([0xA0, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'], v, Malformed(_)); // MQTT-3.10.1-1
        refuses!([0x41, 0x02, 0x00, 0x01], v, Malformed(_));
        refuses!([0xC8, 0x00], v, Malformed(_));
        refuses!([0xE2, 0x00], v, Malformed(_)); // MQTT-3.14.1-1
        refuses!([0x00, 0x00], v, Malformed(_)); // packet type 0 is reserved
    }
    refuses!([0xF1, 0x00], Some(V5), Malformed(_)); // MQTT-3.15.1-1
    refuses!(
        connect(4, 0x02, &[0x00, 0x00])
            .iter()
            .enumerate()
            .map(|(i, &b)| if i == 0 { 0x12 } else { b })
            .collect::<Vec<_>>(),
        None,
        Malformed(_)
    );
}

#[test]
fn flags_are_checked_before_the_body_arrives() {
    let mut buf = BytesMut::from(&[0x62u8 & 0xF0][..]);
    assert!(matches!(decode(&mut buf, Some(V4), MAX), Err(Malformed(_))));
    let mut buf = BytesMut::from(&[0x36u8][..]);
    assert!(matches!(decode(&mut buf, Some(V4), MAX), Err(Malformed(_))));
}

#[test]
fn variable_byte_integer_longer_than_four_bytes() {
    for v in ALL {
        refuses!([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], v, Malformed(_));
    }
    assert!(matches!(
        decode_fixed_header(&[0xC0, 0x80, 0x80, 0x80, 0x80], MAX),
        Err(Malformed(_))
    ));
}

#[test]
fn non_minimal_remaining_length_is_accepted() {
    // PINGREQ with remaining length 0 written as 0x80 0x00.
    assert_eq!(dec(&[0xC0, 0x80, 0x00], Some(V5)), Ok(Packet::PingReq));
}

#[test]
fn packet_too_large_is_detected_from_the_fixed_header_alone() {
    // Remaining length 16,383: only the 3 header bytes have arrived.
    let mut buf = BytesMut::from(&[0x30u8, 0xFF, 0x7F][..]);
    assert_eq!(
        decode(&mut buf, Some(V5), 1000),
        Err(PacketTooLarge {
            size: 16_386,
            max: 1000
        })
    );
    assert_eq!(
        decode_fixed_header(&[0x30, 0xFF, 0x7F], 1000),
        Err(PacketTooLarge {
            size: 16_386,
            max: 1000
        })
    );
    // The limit is on the whole packet, header included: 2 + 8 = 10.
    assert!(decode_fixed_header(&[0x30, 0x08], 10).is_ok());
    assert!(decode_fixed_header(&[0x30, 0x09], 10).is_err());
    assert_eq!(
        PacketTooLarge { size: 1, max: 0 }.reason_code(),
        ReasonCode::PACKET_TOO_LARGE
    );
}

#[test]
fn incomplete_leaves_the_buffer_untouched() {
    let full = [0x30, 0x07, 0x00, 0x03, b'a', b'/', b'b', b'h', b'i'];
    for n in 0..full.len() {
        let mut buf = BytesMut::from(&full[..n]);
        assert_eq!(decode(&mut buf, Some(V4), MAX), Ok(None), "prefix {n}");
        assert_eq!(&buf[..], &full[..n]);
    }
    assert_eq!(decode_fixed_header(&[0x30, 0x80], MAX), Ok(None));
}

#[test]
fn invalid_utf8_mqtt_1_5_4_1() {
    for v in ALL {
        let pid = if v == Some(V5) { &[0x00][..] } else { &[][..] };
        // Bad continuation byte.
        refuses!(
            [
                &[0x30, 0x04 + pid.len() as u8, 0x00, 0x02, 0xC3, 0x28][..],
                pid
            ]
            .concat(),
            v,
            Malformed(_)
        );
        // U+D800 encoded as UTF-8 (a surrogate).
        refuses!(
            [
                &[0x30, 0x05 + pid.len() as u8, 0x00, 0x03, 0xED, 0xA0, 0x80][..],
                pid
            ]
            .concat(),
            v,
            Malformed(_)
        );
        // Overlong encoding of '/'.
        refuses!(
            [
                &[0x30, 0x04 + pid.len() as u8, 0x00, 0x02, 0xC0, 0xAF][..],
                pid
            ]
            .concat(),
            v,
            Malformed(_)
        );
    }
    // In a client identifier, and in a SUBSCRIBE filter.
    refuses!(connect(4, 0x02, &[0x00, 0x01, 0xFF]), None, Malformed(_));
    refuses!(
        [0x82, 0x06, 0x00, 0x01, 0x00, 0x01, 0xFE, 0x00],
        Some(V4),
        Malformed(_)
    );
}

#[test]
fn null_character_mqtt_1_5_4_2() {
    for v in ALL {
        let pid = if v == Some(V5) { &[0x00][..] } else { &[][..] };
        refuses!(
            [
                &[0x30, 0x05 + pid.len() as u8, 0x00, 0x03, b'a', 0x00, b'b'][..],
                pid
            ]
            .concat(),
            v,
            Malformed(_)
        );
    }
    refuses!(connect(4, 0x02, &[0x00, 0x01, 0x00]), None, Malformed(_));
    // In a User Property value.
    #[rustfmt::skip]
    let bytes = [0x40, 0x0B, 0x00, 0x01, 0x80, 0x07, 0x26, 0x00, 0x01, b'k', 0x00, 0x01, 0x00];
    refuses!(bytes, Some(V5), Malformed(_));
}

#[test]
fn bom_is_kept_mqtt_1_5_4_3() {
    let Ok(Packet::Publish(p)) = dec(&[0x30, 0x06, 0x00, 0x04, 0xEF, 0xBB, 0xBF, b'a'], Some(V4))
    else {
        panic!("BOM refused");
    };
    assert_eq!(&p.topic[..], "\u{FEFF}a");
}

#[test]
fn publish_topic_rules() {
    for v in [Some(V3), Some(V4)] {
        refuses!([0x30, 0x03, 0x00, 0x01, b'+'], v, TopicNameInvalid(_)); // MQTT-3.3.2-2
        refuses!(
            [0x30, 0x05, 0x00, 0x03, b'a', b'/', b'#'],
            v,
            TopicNameInvalid(_)
        );
        refuses!([0x30, 0x02, 0x00, 0x00], v, TopicNameInvalid(_)); // MQTT-4.7.3-1
    }
    refuses!(
        [0x30, 0x04, 0x00, 0x01, b'#', 0x00],
        Some(V5),
        TopicNameInvalid(_)
    );
    // v5: empty topic name without a Topic Alias.
    refuses!(
        [0x30, 0x03, 0x00, 0x00, 0x00],
        Some(V5),
        TopicNameInvalid(_)
    );
    assert_eq!(
        TopicNameInvalid("x").reason_code(),
        ReasonCode::TOPIC_NAME_INVALID
    );
}

#[test]
fn publish_qos_and_dup_rules() {
    for v in ALL {
        refuses!([0x36, 0x05, 0x00, 0x01, b'a', 0x00, 0x01], v, Malformed(_)); // QoS 3, MQTT-3.3.1-4
        refuses!([0x38, 0x03, 0x00, 0x01, b'a'], v, Malformed(_)); // DUP on QoS 0, MQTT-3.3.1-2
                                                                   // Packet identifier 0 on QoS > 0 (MQTT-2.2.1-3).
        let props = if v == Some(V5) { &[0x00][..] } else { &[][..] };
        refuses!(
            [
                &[0x32, 0x05 + props.len() as u8, 0x00, 0x01, b'a', 0x00, 0x00][..],
                props
            ]
            .concat(),
            v,
            Protocol(_)
        );
        // QoS 1 truncated inside the packet identifier.
        refuses!([0x32, 0x04, 0x00, 0x01, b'a', 0x00], v, Malformed(_));
    }
}

#[test]
fn duplicate_properties_are_protocol_errors() {
    // Two Payload Format Indicators.
    refuses!(
        [0x30, 0x08, 0x00, 0x01, b'a', 0x04, 0x01, 0x00, 0x01, 0x01],
        Some(V5),
        Protocol(_)
    );
    // Two Reason Strings in PUBACK.
    #[rustfmt::skip]
    let bytes = [0x40, 0x0C, 0x00, 0x01, 0x80, 0x08, 0x1F, 0x00, 0x01, b'a', 0x1F, 0x00, 0x01, b'b'];
    refuses!(bytes, Some(V5), Protocol(_));
    // Two Subscription Identifiers in SUBSCRIBE (5.0 §3.8.2.1.2).
    refuses!(
        [0x82, 0x0A, 0x00, 0x01, 0x04, 0x0B, 0x01, 0x0B, 0x02, 0x00, 0x01, b'a', 0x00],
        Some(V5),
        Protocol(_)
    );
    // Two Session Expiry Intervals in CONNECT.
    let mut c = connect(5, 0x02, &[0x00, 0x00]);
    c[1] += 10;
    c[12] = 10;
    c.splice(13..13, [0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2]);
    refuses!(c, None, Protocol(_));
}

#[test]
fn repeatable_properties_may_repeat() {
    // User Property twice, in order (MQTT-3.3.2-18).
    #[rustfmt::skip]
    let bytes = [
        0x30, 0x12, 0x00, 0x01, b'a',
        0x0E,
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'1',
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'2',
    ];
    let Ok(Packet::Publish(p)) = dec(&bytes, Some(V5)) else {
        panic!("refused");
    };
    let values: Vec<&str> = p
        .properties
        .user_properties
        .iter()
        .map(|(_, v)| &v[..])
        .collect();
    assert_eq!(values, ["1", "2"]);
}

#[test]
fn properties_outside_the_packets_set_are_malformed() {
    // Session Expiry Interval in PUBLISH.
    refuses!(
        [0x30, 0x09, 0x00, 0x01, b'a', 0x05, 0x11, 0, 0, 0, 1],
        Some(V5),
        Malformed(_)
    );
    // Topic Alias in a will.
    let c = connect(
        5,
        0x06,
        &[
            0x00, 0x00, 0x03, 0x23, 0x00, 0x01, 0x00, 0x01, b't', 0x00, 0x00,
        ],
    );
    refuses!(c, None, Malformed(_));
    // Unknown identifier 0x7F in DISCONNECT.
    refuses!([0xE0, 0x04, 0x00, 0x02, 0x7F, 0x00], Some(V5), Malformed(_));
    // Subscription Identifier in UNSUBSCRIBE.
    refuses!(
        [0xA2, 0x08, 0x00, 0x01, 0x02, 0x0B, 0x01, 0x00, 0x01, b'a'],
        Some(V5),
        Malformed(_)
    );
}

#[test]
fn property_values_out_of_range() {
    // Subscription Identifier 0 (5.0 §3.3.2.3.8, §3.8.2.1.2).
    refuses!(
        [0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x0B, 0x00],
        Some(V5),
        Protocol(_)
    );
    refuses!(
        [0x82, 0x08, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, b'a', 0x00],
        Some(V5),
        Protocol(_)
    );
    // Payload Format Indicator 2.
    refuses!(
        [0x30, 0x06, 0x00, 0x01, b'a', 0x02, 0x01, 0x02],
        Some(V5),
        Protocol(_)
    );
    // Response Topic with a wildcard (MQTT-3.3.2-14).
    refuses!(
        [0x30, 0x08, 0x00, 0x01, b'a', 0x04, 0x08, 0x00, 0x01, b'+'],
        Some(V5),
        Protocol(_)
    );
    // CONNECT: Receive Maximum 0, Maximum Packet Size 0, Request Problem Information 2,
    // Authentication Data without Authentication Method.
    for props in [
        &[0x21, 0x00, 0x00][..],
        &[0x27, 0x00, 0x00, 0x00, 0x00][..],
        &[0x17, 0x02][..],
        &[0x16, 0x00, 0x01, 0xAA][..],
    ] {
        let mut c = connect(5, 0x02, &[0x00, 0x00]);
        c[1] += props.len() as u8;
        c[12] = props.len() as u8;
        c.splice(13..13, props.iter().copied());
        refuses!(c, None, Protocol(_));
    }
    // CONNACK: Maximum QoS 2 (5.0 §3.2.2.3.4), Retain Available 2.
    refuses!(
        [0x20, 0x05, 0x00, 0x00, 0x02, 0x24, 0x02],
        Some(V5),
        Protocol(_)
    );
    refuses!(
        [0x20, 0x05, 0x00, 0x00, 0x02, 0x25, 0x02],
        Some(V5),
        Protocol(_)
    );
}

#[test]
fn property_length_overruns() {
    // Property length 5 but only 2 bytes remain.
    refuses!(
        [0x30, 0x06, 0x00, 0x01, b'a', 0x05, 0x01, 0x01],
        Some(V5),
        Malformed(_)
    );
    // A string property cut short inside the section.
    refuses!(
        [0x40, 0x08, 0x00, 0x01, 0x80, 0x04, 0x1F, 0x00, 0x05, b'a'],
        Some(V5),
        Malformed(_)
    );
}

#[test]
fn packet_id_zero_mqtt_2_2_1_3() {
    for v in ALL {
        refuses!([0x40, 0x02, 0x00, 0x00], v, Protocol(_));
        refuses!([0x62, 0x02, 0x00, 0x00], v, Protocol(_));
        refuses!(
            [0xA2, 0x05, 0x00, 0x00, 0x00, 0x01, b'a'],
            Some(V4),
            Protocol(_)
        );
    }
    refuses!(
        [0x82, 0x06, 0x00, 0x00, 0x00, 0x01, b'a', 0x00],
        Some(V4),
        Protocol(_)
    );
}

#[test]
fn remaining_length_must_match_content() {
    for v in [Some(V3), Some(V4)] {
        refuses!([0x40, 0x03, 0x00, 0x01, 0x00], v, Malformed(_)); // extra byte in PUBACK
        refuses!([0xE0, 0x01, 0x00], v, Malformed(_)); // 3.x DISCONNECT carries nothing
        refuses!([0xB0, 0x03, 0x00, 0x01, 0x00], v, Malformed(_));
        refuses!([0x20, 0x03, 0x00, 0x00, 0x00], v, Malformed(_));
    }
    for v in ALL {
        refuses!([0xC0, 0x01, 0x00], v, Malformed(_));
        refuses!([0x40, 0x01, 0x00], v, Malformed(_)); // truncated packet id
    }
    refuses!([0xE0, 0x03, 0x00, 0x00, 0x00], Some(V5), Malformed(_)); // byte after properties
    refuses!(connect(4, 0x02, &[0x00, 0x00, 0xFF]), None, Malformed(_)); // trailing byte
    refuses!(connect(4, 0x02, &[0x00, 0x05, b'a']), None, Malformed(_)); // client id overruns
    refuses!(connect(4, 0x82, &[0x00, 0x00]), None, Malformed(_)); // user name flag, no user name
    refuses!(
        [0x82, 0x05, 0x00, 0x01, 0x00, 0x01, b'a'],
        Some(V4),
        Malformed(_)
    ); // no options byte
}

#[test]
fn connect_protocol_name_and_level_mqtt_3_1_2_1() {
    refuses!(
        connect(3, 0x02, &[0x00, 0x00]),
        None,
        UnsupportedProtocol(3)
    );
    refuses!(
        connect(6, 0x02, &[0x00, 0x00]),
        None,
        UnsupportedProtocol(6)
    );
    let mut bad_name = connect(4, 0x02, &[0x00, 0x00]);
    bad_name[7] = b'X';
    refuses!(bad_name, None, UnsupportedProtocol(4));
    #[rustfmt::skip]
    let mqisdp_level_4 = [
        0x10, 0x0E, 0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x04, 0x02, 0x00, 0x00, 0x00, 0x00,
    ];
    refuses!(mqisdp_level_4, None, UnsupportedProtocol(4));
    // The bridge bit (Mosquitto's `try_private`) is a 3.x thing: 0x85 is no protocol we know,
    // nor is a bridge level under the other level's name.
    refuses!(
        connect(0x85, 0x02, &[0x00, 0x00]),
        None,
        UnsupportedProtocol(0x85)
    );
    refuses!(
        connect(0x83, 0x02, &[0x00, 0x00]),
        None,
        UnsupportedProtocol(0x83)
    );
    let mut mqisdp_bridge_4 = mqisdp_level_4;
    mqisdp_bridge_4[10] = 0x84;
    refuses!(mqisdp_bridge_4, None, UnsupportedProtocol(0x84));
    assert_eq!(
        UnsupportedProtocol(4).reason_code(),
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
    );
    assert_eq!(UnsupportedProtocol(4).reason_code().to_v3_connack(), 1);
}

#[test]
fn connect_flag_rules() {
    for level in [4, 5] {
        // Reserved flag (MQTT-3.1.2-3).
        refuses!(connect(level, 0x03, &[0x00, 0x00]), None, Malformed(_));
        // Will QoS / Will Retain without the will flag (MQTT-3.1.2-11, -13).
        refuses!(connect(level, 0x0A, &[0x00, 0x00]), None, Malformed(_));
        refuses!(connect(level, 0x22, &[0x00, 0x00]), None, Malformed(_));
        // Will QoS 3 (MQTT-3.1.2-12).
        let will = if level == 5 {
            &[0x00, 0x00, 0x00, 0x00, 0x01, b't', 0x00, 0x00][..]
        } else {
            &[0x00, 0x00, 0x00, 0x01, b't', 0x00, 0x00][..]
        };
        refuses!(connect(level, 0x1E, will), None, Malformed(_));
        // Will topic with a wildcard.
        let will = if level == 5 {
            &[0x00, 0x00, 0x00, 0x00, 0x01, b'#', 0x00, 0x00][..]
        } else {
            &[0x00, 0x00, 0x00, 0x01, b'#', 0x00, 0x00][..]
        };
        refuses!(connect(level, 0x06, will), None, TopicNameInvalid(_));
    }
    // Password without user name is malformed in 3.1.1 (MQTT-3.1.2-22), fine in 5.0.
    refuses!(
        connect(4, 0x42, &[0x00, 0x00, 0x00, 0x00]),
        None,
        Malformed(_)
    );
    assert!(dec(&connect(5, 0x42, &[0x00, 0x00, 0x00, 0x00]), None).is_ok());
    // MQTT 3.1 ("MQIsdp", level 3) does not reserve bit 0: accepted, and it means nothing.
    let mqisdp = [
        0x10, 0x0F, 0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03, 0x03, 0x00, 0x0A, 0x00,
        0x01, b'x',
    ];
    match dec(&mqisdp, None) {
        Ok(Packet::Connect(c)) => {
            assert_eq!(c.protocol, V3);
            assert!(c.clean_start);
            assert_eq!(&c.client_id[..], "x");
        }
        other => panic!("3.1 CONNECT with bit 0 set: {other:?}"),
    }
}

#[test]
fn first_packet_must_be_connect_mqtt_3_1_0_1() {
    refuses!([0x30, 0x03, 0x00, 0x01, b'a'], None, Protocol(_));
    refuses!([0xC0, 0x00], None, Protocol(_));
    refuses!([0xF0, 0x00], None, Protocol(_));
    // Refused from the first byte, before the rest arrives.
    let mut buf = BytesMut::from(&[0x82u8][..]);
    assert!(matches!(decode(&mut buf, None, MAX), Err(Protocol(_))));
}

#[test]
fn second_connect_is_left_to_the_connection() {
    // MQTT-3.1.0-2 is enforced by the connection, which needs to see the packet.
    assert!(dec(&connect(4, 0x02, &[0x00, 0x00]), Some(V4)).is_ok());
}

#[test]
fn auth_before_v5_is_malformed() {
    refuses!([0xF0, 0x00], Some(V3), Malformed(_));
    refuses!([0xF0, 0x00], Some(V4), Malformed(_));
}

#[test]
fn subscribe_rules() {
    for v in ALL {
        let props = if v == Some(V5) { &[0x00][..] } else { &[][..] };
        // No filters (MQTT-3.8.3-3).
        refuses!(
            [&[0x82, 0x02 + props.len() as u8, 0x00, 0x01][..], props].concat(),
            v,
            Protocol(_)
        );
        // Options with QoS 3.
        refuses!(
            [
                &[0x82, 0x06 + props.len() as u8, 0x00, 0x01][..],
                props,
                &[0x00, 0x01, b'a', 0x03]
            ]
            .concat(),
            v,
            Malformed(_)
        );
        // Reserved bits 6-7 (MQTT-3.8.3-5).
        refuses!(
            [
                &[0x82, 0x06 + props.len() as u8, 0x00, 0x01][..],
                props,
                &[0x00, 0x01, b'a', 0x40]
            ]
            .concat(),
            v,
            Malformed(_)
        );
    }
    // 3.x reserves bits 2-7 (3.1.1 MQTT-3-8.3-4).
    refuses!(
        [0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x04],
        Some(V4),
        Malformed(_)
    );
    // Retain Handling 3 (5.0 §3.8.3.1).
    refuses!(
        [0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x30],
        Some(V5),
        Protocol(_)
    );
}

#[test]
fn unsubscribe_without_filters_mqtt_3_10_3_2() {
    refuses!([0xA2, 0x02, 0x00, 0x01], Some(V4), Protocol(_));
    refuses!([0xA2, 0x03, 0x00, 0x01, 0x00], Some(V5), Protocol(_));
}

#[test]
fn reason_codes_outside_the_packets_table() {
    refuses!([0x40, 0x03, 0x00, 0x01, 0x04], Some(V5), Protocol(_)); // MQTT-3.4.2-1
    refuses!([0x62, 0x03, 0x00, 0x01, 0x10], Some(V5), Protocol(_)); // MQTT-3.6.2-1
    refuses!([0x90, 0x04, 0x00, 0x01, 0x00, 0x03], Some(V5), Protocol(_)); // MQTT-3.9.3-2
    refuses!([0x90, 0x03, 0x00, 0x01, 0x03], Some(V4), Protocol(_));
    refuses!([0xB0, 0x04, 0x00, 0x01, 0x00, 0x10], Some(V5), Protocol(_)); // MQTT-3.11.3-2
    refuses!([0xE0, 0x01, 0x01], Some(V5), Protocol(_)); // MQTT-3.14.2-1
    refuses!([0xF0, 0x01, 0x01], Some(V5), Protocol(_)); // MQTT-3.15.2-1
    refuses!([0x20, 0x03, 0x00, 0x01, 0x00], Some(V5), Protocol(_)); // MQTT-3.2.2-8
    refuses!([0x20, 0x02, 0x00, 0x06], Some(V4), Protocol(_));
    // Acknowledgements that answer nothing.
    refuses!([0x90, 0x03, 0x00, 0x01, 0x00], Some(V5), Protocol(_));
    refuses!([0xB0, 0x03, 0x00, 0x01, 0x00], Some(V5), Protocol(_));
}

#[test]
fn connack_flag_rules() {
    refuses!([0x20, 0x02, 0x02, 0x00], Some(V4), Malformed(_)); // MQTT-3.2.2-1
    refuses!([0x20, 0x03, 0x80, 0x00, 0x00], Some(V5), Malformed(_));
    refuses!([0x20, 0x02, 0x01, 0x05], Some(V4), Protocol(_)); // session present + refusal
    refuses!([0x20, 0x03, 0x01, 0x87, 0x00], Some(V5), Protocol(_)); // MQTT-3.2.2-6
}

#[test]
fn short_v5_acknowledgements_are_valid() {
    assert_eq!(
        dec(&[0xE0, 0x00], Some(V5)),
        Ok(Packet::Disconnect(Disconnect::default()))
    );
    assert_eq!(
        dec(&[0x50, 0x02, 0x00, 0x05], Some(V5)),
        Ok(Packet::PubRec(PubResponse::new(5)))
    );
    assert!(matches!(
        dec(&[0x50, 0x03, 0x00, 0x05, 0x80], Some(V5)),
        Ok(Packet::PubRec(PubResponse {
            reason_code: ReasonCode::UNSPECIFIED_ERROR,
            ..
        }))
    ));
    assert_eq!(
        dec(&[0xF0, 0x01, 0x19], Some(V5)),
        Ok(Packet::Auth(Auth {
            reason_code: ReasonCode::RE_AUTHENTICATE,
            ..Default::default()
        }))
    );
}

#[test]
fn every_error_maps_to_its_reason_code() {
    assert_eq!(Malformed("x").reason_code(), ReasonCode::MALFORMED_PACKET);
    assert_eq!(Protocol("x").reason_code(), ReasonCode::PROTOCOL_ERROR);
    let _ = V3;
}

/// A SUBSCRIBE (QoS 0 for each filter) or UNSUBSCRIBE at `v`, packet id 1.
pub(super) fn filters_packet(
    v: Option<ProtocolVersion>,
    subscribe: bool,
    filters: &[&str],
) -> Vec<u8> {
    let mut body = vec![0x00, 0x01];
    if v == Some(V5) {
        body.push(0x00);
    }
    for f in filters {
        body.extend_from_slice(&(f.len() as u16).to_be_bytes());
        body.extend_from_slice(f.as_bytes());
        if subscribe {
            body.push(0x00);
        }
    }
    let mut out = vec![if subscribe { 0x82 } else { 0xA2 }, body.len() as u8];
    out.extend(body);
    out
}

#[test]
fn empty_topic_filters_mqtt_4_7_3_1_and_4_8_2_2() {
    for v in ALL {
        for subscribe in [true, false] {
            for empty in ["", "$share/g/", "$share/g", "$share/"] {
                refuses!(filters_packet(v, subscribe, &[empty]), v, Malformed(_));
                refuses!(filters_packet(v, subscribe, &["a", empty]), v, Malformed(_));
            }
            // Invalid but not empty: the broker fails only that entry (SUBACK 0x8F / 0x80).
            for other in ["a/#/b", "$share//a", "$share/g+/a", "$share/g//"] {
                assert!(
                    dec(&filters_packet(v, subscribe, &[other]), v).is_ok(),
                    "{other:?}"
                );
            }
        }
    }
}
