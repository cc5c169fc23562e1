//! Byte-exact vectors: each packet type at each protocol level, checked in both directions.
//! Layouts follow the figures of 3.1.1 §3 and 5.0 §3 (e.g. 3.1.1 Figure 3.6's CONNECT
//! variable header `00 04 'M' 'Q' 'T' 'T' 04 CE 00 0A`).

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::smallvec;

use super::super::*;
use super::{dec, enc, V3, V4, V5};

/// Asserts `bytes` decodes to `packet` at `version` and `packet` encodes back to `bytes`.
// Every vector builds its packet inline at the call.
#[allow(clippy::needless_pass_by_value)]
fn both(bytes: &[u8], version: ProtocolVersion, packet: Packet) {
    assert_eq!(
        dec(bytes, Some(version)).as_ref(),
        Ok(&packet),
        "decode {version:?}"
    );
    assert_eq!(enc(&packet, version), bytes, "encode {version:?}");
}

fn s(v: &'static str) -> ByteString {
    ByteString::from_static(v)
}

fn b(v: &'static [u8]) -> Bytes {
    Bytes::from_static(v)
}

fn user(k: &'static str, v: &'static str) -> UserProperties {
    vec![(s(k), s(v))]
}

/// A CONNECT with no will, no credentials, default properties and no bridge flag: the base
/// every CONNECT vector starts from, so each vector shows only the fields it sets.
fn connect(
    protocol: ProtocolVersion,
    clean_start: bool,
    keep_alive: u16,
    client_id: &'static str,
) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive,
        client_id: s(client_id),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: false,
    }
}

/// [`both`] for a CONNECT, plus the decode before the handshake, where the CONNECT's own
/// protocol level decides (MQTT-3.1.0-1) and must give the same packet.
fn both_connect(bytes: &[u8], version: ProtocolVersion, c: Connect) {
    both(bytes, version, Packet::Connect(Box::new(c.clone())));
    assert_eq!(dec(bytes, None), Ok(Packet::Connect(Box::new(c))));
}

#[test]
fn connect_v3_1_minimal() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 0x10,
        0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03,
        0x02, 0x00, 0x3C,
        0x00, 0x02, b'c', b'1',
    ];
    let c = connect(V3, true, 60, "c1");
    both_connect(&bytes, V3, c);
}

#[test]
fn connect_v3_1_1_all_flags() {
    // Flags 0xCE: user name, password, will QoS 1, will flag, clean session.
    #[rustfmt::skip]
    let bytes = [
        0x10, 0x19,
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0xCE, 0x00, 0x0A,
        0x00, 0x01, b'c',
        0x00, 0x01, b'w',
        0x00, 0x01, b'x',
        0x00, 0x01, b'u',
        0x00, 0x01, b'p',
    ];
    let c = Connect {
        will: Some(LastWill {
            topic: s("w"),
            payload: b(b"x"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: WillProperties::default(),
        }),
        username: Some(s("u")),
        password: Some(b(b"p")),
        ..connect(V4, true, 10, "c")
    };
    both_connect(&bytes, V4, c);
}

#[test]
fn connect_v5_with_properties_and_will() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 0x2E,
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0xEE, 0x00, 0x0A,
        0x0F, // properties
        0x11, 0x00, 0x00, 0x00, 0x78, // Session Expiry Interval 120
        0x21, 0x00, 0x14,             // Receive Maximum 20
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v',
        0x00, 0x02, b'c', b'1',
        0x02, 0x01, 0x01, // will properties: Payload Format Indicator 1
        0x00, 0x01, b't',
        0x00, 0x02, b'h', b'i',
        0x00, 0x01, b'u',
        0x00, 0x01, b'p',
    ];
    let c = Connect {
        will: Some(LastWill {
            topic: s("t"),
            payload: b(b"hi"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: WillProperties {
                payload_format_indicator: Some(1),
                ..Default::default()
            },
        }),
        username: Some(s("u")),
        password: Some(b(b"p")),
        properties: ConnectProperties {
            session_expiry_interval: Some(120),
            receive_maximum: Some(20),
            user_properties: user("k", "v"),
            ..Default::default()
        },
        ..connect(V5, true, 10, "c1")
    };
    both_connect(&bytes, V5, c);
}

#[test]
fn connect_v5_password_without_user_name_is_allowed() {
    // 5.0 §3.1.2.9 drops the 3.1.1 rule MQTT-3.1.2-22.
    #[rustfmt::skip]
    let bytes = [
        0x10, 0x0F,
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x40, 0x00, 0x00, 0x00,
        0x00, 0x00,
        0x00, 0x00,
    ];
    let c = Connect {
        password: Some(Bytes::new()),
        ..connect(V5, false, 0, "")
    };
    both(&bytes, V5, Packet::Connect(Box::new(c)));
}

/// Mosquitto's bridge flag (`try_private true`): the protocol level with its high bit set,
/// 0x84 for 3.1.1 and 0x83 for 3.1 ([`Connect::bridge`]).
#[test]
fn connect_bridge_flag_3_x() {
    #[rustfmt::skip]
    let v311 = [
        0x10, 0x0F,
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x84,
        0x00, 0x00, 0x3C,
        0x00, 0x03, b'b', b'r', b'1',
    ];
    let c = Connect {
        bridge: true,
        ..connect(V4, false, 60, "br1")
    };
    both_connect(&v311, V4, c);
    #[rustfmt::skip]
    let v31 = [
        0x10, 0x11,
        0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x83,
        0x02, 0x00, 0x3C,
        0x00, 0x03, b'b', b'r', b'1',
    ];
    let c = Connect {
        bridge: true,
        ..connect(V3, true, 60, "br1")
    };
    both_connect(&v31, V3, c.clone());
    assert_eq!(peek_connect_version(&v31), Some(V3));
    assert_eq!(peek_connect_version(&v311), Some(V4));
    // Without the flag, the same CONNECT is an ordinary client's.
    let mut plain = v31;
    plain[10] = 0x03;
    let c = Connect { bridge: false, ..c };
    both(&plain, V3, Packet::Connect(Box::new(c)));
}

/// The bridge bit does not exist at 5.0 (Mosquitto never sends 0x85; a v5 bridge uses No Local
/// per subscription): encoding a bridge CONNECT at 5.0 leaves it off.
#[test]
fn connect_bridge_flag_is_not_encoded_at_5() {
    let c = Connect {
        bridge: true,
        ..connect(V5, true, 0, "b")
    };
    let bytes = enc(&Packet::Connect(Box::new(c)), V5);
    assert_eq!(bytes[8], 0x05);
    match dec(&bytes, None) {
        Ok(Packet::Connect(c)) => assert!(!c.bridge),
        other => panic!("{other:?}"),
    }
}

#[test]
fn connack_v3() {
    for v in [V3, V4] {
        both(
            &[0x20, 0x02, 0x00, 0x00],
            v,
            Packet::ConnAck(ConnAck::default()),
        );
        both(
            &[0x20, 0x02, 0x01, 0x00],
            v,
            Packet::ConnAck(ConnAck {
                session_present: true,
                ..Default::default()
            }),
        );
        // Return codes 1..=5 map to and from their v5 equivalents (3.1.1 Table 3.1).
        for (rc, reason) in [
            (1, ReasonCode::UNSUPPORTED_PROTOCOL_VERSION),
            (2, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID),
            (3, ReasonCode::SERVER_UNAVAILABLE),
            (4, ReasonCode::BAD_USER_NAME_OR_PASSWORD),
            (5, ReasonCode::NOT_AUTHORIZED),
        ] {
            let p = Packet::ConnAck(ConnAck {
                reason_code: reason,
                ..Default::default()
            });
            both(&[0x20, 0x02, 0x00, rc], v, p);
        }
    }
}

#[test]
fn connack_v3_maps_v5_only_reasons() {
    let p = |r| {
        Packet::ConnAck(ConnAck {
            reason_code: r,
            properties: ConnAckProperties {
                reason_string: Some(s("dropped in 3.x")),
                ..Default::default()
            },
            ..Default::default()
        })
    };
    assert_eq!(enc(&p(ReasonCode::BANNED), V4), [0x20, 0x02, 0x00, 0x05]);
    assert_eq!(
        enc(&p(ReasonCode::SERVER_BUSY), V4),
        [0x20, 0x02, 0x00, 0x03]
    );
    assert_eq!(
        enc(&p(ReasonCode::BAD_AUTHENTICATION_METHOD), V4),
        [0x20, 0x02, 0x00, 0x04]
    );
}

#[test]
fn connack_v5() {
    both(
        &[0x20, 0x03, 0x00, 0x00, 0x00],
        V5,
        Packet::ConnAck(ConnAck::default()),
    );
    both(
        &[0x20, 0x03, 0x00, 0x8A, 0x00],
        V5,
        Packet::ConnAck(ConnAck {
            reason_code: ReasonCode::BANNED,
            ..Default::default()
        }),
    );
    #[rustfmt::skip]
    let bytes = [
        0x20, 0x0F, 0x01, 0x00,
        0x0C,
        0x24, 0x01,                         // Maximum QoS 1
        0x25, 0x00,                         // Retain Available 0
        0x12, 0x00, 0x02, b'i', b'd',       // Assigned Client Identifier
        0x13, 0x00, 0x1E,                   // Server Keep Alive 30
    ];
    both(
        &bytes,
        V5,
        Packet::ConnAck(ConnAck {
            session_present: true,
            reason_code: ReasonCode::SUCCESS,
            properties: ConnAckProperties {
                maximum_qos: Some(QoS::AtLeastOnce),
                retain_available: Some(false),
                assigned_client_identifier: Some(s("id")),
                server_keep_alive: Some(30),
                ..Default::default()
            },
        }),
    );
}

#[test]
fn connack_v5_maximum_qos_2_is_omitted() {
    // Absence means 2, and 2 may not be sent (5.0 §3.2.2.3.4).
    let p = Packet::ConnAck(ConnAck {
        properties: ConnAckProperties {
            maximum_qos: Some(QoS::ExactlyOnce),
            ..Default::default()
        },
        ..Default::default()
    });
    assert_eq!(enc(&p, V5), [0x20, 0x03, 0x00, 0x00, 0x00]);
}

fn publish(topic: &'static str, qos: QoS, packet_id: u16, payload: &'static [u8]) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: s(topic),
        packet_id,
        payload: b(payload),
        properties: PublishProperties::default(),
    }
}

#[test]
fn publish_v3() {
    for v in [V3, V4] {
        both(
            &[0x30, 0x07, 0x00, 0x03, b'a', b'/', b'b', b'h', b'i'],
            v,
            Packet::Publish(publish("a/b", QoS::AtMostOnce, 0, b"hi")),
        );
        let mut p = publish("a/b", QoS::AtLeastOnce, 10, b"hi");
        p.dup = true;
        p.retain = true;
        both(
            &[
                0x3B, 0x09, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i',
            ],
            v,
            Packet::Publish(p),
        );
        both(
            &[0x34, 0x05, 0x00, 0x01, b'x', 0xFF, 0xFF],
            v,
            Packet::Publish(publish("x", QoS::ExactlyOnce, 0xFFFF, b"")),
        );
    }
}

#[test]
fn publish_v5() {
    both(
        &[0x30, 0x08, 0x00, 0x03, b'a', b'/', b'b', 0x00, b'h', b'i'],
        V5,
        Packet::Publish(publish("a/b", QoS::AtMostOnce, 0, b"hi")),
    );
    #[rustfmt::skip]
    let bytes = [
        0x34, 0x18, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0B,
        0x0E,
        0x01, 0x01,                 // Payload Format Indicator
        0x23, 0x00, 0x05,           // Topic Alias 5
        0x0B, 0x02,                 // Subscription Identifier 2
        0x0B, 0x81, 0x01,           // Subscription Identifier 129 (may repeat, MQTT-3.3.4-4)
        0x03, 0x00, 0x01, b'j',     // Content Type
        b'h', b'i',
    ];
    let mut p = publish("a/b", QoS::ExactlyOnce, 11, b"hi");
    p.properties = PublishProperties {
        payload_format_indicator: Some(1),
        topic_alias: Some(5),
        subscription_identifiers: smallvec![2, 129],
        content_type: Some(s("j")),
        ..Default::default()
    };
    both(&bytes, V5, Packet::Publish(p));
}

#[test]
fn publish_v5_empty_topic_with_alias() {
    // 5.0 §3.3.2.3.4: a zero-length topic name is fine when a Topic Alias stands in.
    let mut p = publish("", QoS::AtMostOnce, 0, b"x");
    p.properties.topic_alias = Some(1);
    both(
        &[0x30, 0x07, 0x00, 0x00, 0x03, 0x23, 0x00, 0x01, b'x'],
        V5,
        Packet::Publish(p),
    );
}

mod control;
