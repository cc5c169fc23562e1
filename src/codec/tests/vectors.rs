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

#[test]
fn connect_v3_1_minimal() {
    #[rustfmt::skip]
    let bytes = [
        0x10, 0x10,
        0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03,
        0x02, 0x00, 0x3C,
        0x00, 0x02, b'c', b'1',
    ];
    let c = Connect {
        protocol: V3,
        clean_start: true,
        keep_alive: 60,
        client_id: s("c1"),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: false,
    };
    both(&bytes, V3, Packet::Connect(Box::new(c.clone())));
    // Before the handshake the CONNECT's own level decides (MQTT-3.1.0-1).
    assert_eq!(dec(&bytes, None), Ok(Packet::Connect(Box::new(c))));
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
        protocol: V4,
        clean_start: true,
        keep_alive: 10,
        client_id: s("c"),
        will: Some(LastWill {
            topic: s("w"),
            payload: b(b"x"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: WillProperties::default(),
        }),
        username: Some(s("u")),
        password: Some(b(b"p")),
        properties: ConnectProperties::default(),
        bridge: false,
    };
    both(&bytes, V4, Packet::Connect(Box::new(c.clone())));
    assert_eq!(dec(&bytes, None), Ok(Packet::Connect(Box::new(c))));
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
        protocol: V5,
        clean_start: true,
        keep_alive: 10,
        client_id: s("c1"),
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
        bridge: false,
    };
    both(&bytes, V5, Packet::Connect(Box::new(c.clone())));
    assert_eq!(dec(&bytes, None), Ok(Packet::Connect(Box::new(c))));
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
        protocol: V5,
        clean_start: false,
        keep_alive: 0,
        client_id: s(""),
        will: None,
        username: None,
        password: Some(Bytes::new()),
        properties: ConnectProperties::default(),
        bridge: false,
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
        protocol: V4,
        clean_start: false,
        keep_alive: 60,
        client_id: s("br1"),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: true,
    };
    both(&v311, V4, Packet::Connect(Box::new(c.clone())));
    assert_eq!(dec(&v311, None), Ok(Packet::Connect(Box::new(c))));
    #[rustfmt::skip]
    let v31 = [
        0x10, 0x11,
        0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x83,
        0x02, 0x00, 0x3C,
        0x00, 0x03, b'b', b'r', b'1',
    ];
    let c = Connect {
        protocol: V3,
        clean_start: true,
        keep_alive: 60,
        client_id: s("br1"),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: true,
    };
    both(&v31, V3, Packet::Connect(Box::new(c.clone())));
    assert_eq!(dec(&v31, None), Ok(Packet::Connect(Box::new(c.clone()))));
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
        protocol: V5,
        clean_start: true,
        keep_alive: 0,
        client_id: s("b"),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
        bridge: true,
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

#[test]
fn pub_responses_v3() {
    for v in [V3, V4] {
        both(
            &[0x40, 0x02, 0x00, 0x01],
            v,
            Packet::PubAck(PubResponse::new(1)),
        );
        both(
            &[0x50, 0x02, 0x00, 0x02],
            v,
            Packet::PubRec(PubResponse::new(2)),
        );
        both(
            &[0x62, 0x02, 0x00, 0x03],
            v,
            Packet::PubRel(PubResponse::new(3)),
        );
        both(
            &[0x70, 0x02, 0x00, 0x04],
            v,
            Packet::PubComp(PubResponse::new(4)),
        );
    }
    // 3.x has no reason codes or properties: they are dropped.
    let p = Packet::PubAck(PubResponse {
        packet_id: 1,
        reason_code: ReasonCode::NOT_AUTHORIZED,
        properties: AckProperties {
            reason_string: Some(s("no")),
            ..Default::default()
        },
    });
    assert_eq!(enc(&p, V4), [0x40, 0x02, 0x00, 0x01]);
}

#[test]
fn pub_responses_v5() {
    // Success without properties: the 2-byte form (5.0 §3.4.2.1).
    both(
        &[0x40, 0x02, 0x00, 0x01],
        V5,
        Packet::PubAck(PubResponse::new(1)),
    );
    both(
        &[0x70, 0x02, 0x00, 0x04],
        V5,
        Packet::PubComp(PubResponse::new(4)),
    );
    // A reason code without properties: the 3-byte form.
    let with_code = |id, rc| PubResponse {
        packet_id: id,
        reason_code: rc,
        properties: AckProperties::default(),
    };
    both(
        &[0x40, 0x03, 0x00, 0x01, 0x10],
        V5,
        Packet::PubAck(with_code(1, ReasonCode::NO_MATCHING_SUBSCRIBERS)),
    );
    both(
        &[0x62, 0x03, 0x00, 0x03, 0x92],
        V5,
        Packet::PubRel(with_code(3, ReasonCode::PACKET_IDENTIFIER_NOT_FOUND)),
    );
    both(
        &[
            0x50, 0x09, 0x00, 0x01, 0x87, 0x05, 0x1F, 0x00, 0x02, b'n', b'o',
        ],
        V5,
        Packet::PubRec(PubResponse {
            packet_id: 1,
            reason_code: ReasonCode::NOT_AUTHORIZED,
            properties: AckProperties {
                reason_string: Some(s("no")),
                ..Default::default()
            },
        }),
    );
    // Success with an explicit zero property length also decodes.
    assert_eq!(
        dec(&[0x40, 0x04, 0x00, 0x01, 0x00, 0x00], Some(V5)),
        Ok(Packet::PubAck(PubResponse::new(1)))
    );
}

#[test]
fn subscribe_v3() {
    #[rustfmt::skip]
    let bytes = [
        0x82, 0x0C, 0x00, 0x0A,
        0x00, 0x03, b'a', b'/', b'b', 0x01,
        0x00, 0x01, b'#', 0x02,
    ];
    let opts = |qos| SubscriptionOptions {
        qos,
        ..Default::default()
    };
    for v in [V3, V4] {
        both(
            &bytes,
            v,
            Packet::Subscribe(Subscribe {
                packet_id: 10,
                subscription_identifier: None,
                user_properties: vec![],
                filters: vec![
                    (s("a/b"), opts(QoS::AtLeastOnce)),
                    (s("#"), opts(QoS::ExactlyOnce)),
                ],
            }),
        );
    }
}

#[test]
fn subscribe_v5() {
    #[rustfmt::skip]
    let bytes = [
        0x82, 0x12, 0x00, 0x0A,
        0x09,
        0x0B, 0x05,                                   // Subscription Identifier 5
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v',    // User Property
        0x00, 0x03, b'a', b'/', b'b', 0x2D,          // QoS 1, NL, RAP, RH 2
    ];
    both(
        &bytes,
        V5,
        Packet::Subscribe(Subscribe {
            packet_id: 10,
            subscription_identifier: Some(5),
            user_properties: user("k", "v"),
            filters: vec![(
                s("a/b"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: 2,
                },
            )],
        }),
    );
}

#[test]
fn subscribe_filters_are_not_validated_by_the_codec() {
    // The broker answers 0x8F per filter (5.0 §3.9.3), so "a/#/b" must reach it.
    let bytes = [
        0x82, 0x0A, 0x00, 0x01, 0x00, 0x05, b'a', b'/', b'#', b'/', b'b', 0x00,
    ];
    let Ok(Packet::Subscribe(sub)) = dec(&bytes, Some(V4)) else {
        panic!("filter rejected");
    };
    assert_eq!(&sub.filters[0].0[..], "a/#/b");
}

#[test]
fn suback() {
    let p = Packet::SubAck(SubAck {
        packet_id: 10,
        properties: AckProperties::default(),
        reason_codes: vec![
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::GRANTED_QOS_1,
            ReasonCode::UNSPECIFIED_ERROR,
        ],
    });
    for v in [V3, V4] {
        both(&[0x90, 0x05, 0x00, 0x0A, 0x00, 0x01, 0x80], v, p.clone());
    }
    // v5 failure codes become 0x80 in 3.x (3.1.1 §3.9.3).
    let v5_only = Packet::SubAck(SubAck {
        packet_id: 10,
        properties: AckProperties::default(),
        reason_codes: vec![ReasonCode::GRANTED_QOS_2, ReasonCode::TOPIC_FILTER_INVALID],
    });
    assert_eq!(enc(&v5_only, V4), [0x90, 0x04, 0x00, 0x0A, 0x02, 0x80]);
    both(&[0x90, 0x05, 0x00, 0x0A, 0x00, 0x02, 0x8F], V5, v5_only);
}

#[test]
fn unsubscribe() {
    let p = |user_properties| {
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 11,
            user_properties,
            filters: vec![s("a/b")],
        })
    };
    for v in [V3, V4] {
        both(
            &[0xA2, 0x07, 0x00, 0x0B, 0x00, 0x03, b'a', b'/', b'b'],
            v,
            p(vec![]),
        );
    }
    both(
        &[0xA2, 0x08, 0x00, 0x0B, 0x00, 0x00, 0x03, b'a', b'/', b'b'],
        V5,
        p(vec![]),
    );
    #[rustfmt::skip]
    let bytes = [
        0xA2, 0x0F, 0x00, 0x0B,
        0x07, 0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v',
        0x00, 0x03, b'a', b'/', b'b',
    ];
    both(&bytes, V5, p(user("k", "v")));
}

#[test]
fn unsuback() {
    for v in [V3, V4] {
        both(
            &[0xB0, 0x02, 0x00, 0x0B],
            v,
            Packet::UnsubAck(UnsubAck {
                packet_id: 11,
                ..Default::default()
            }),
        );
    }
    let p = Packet::UnsubAck(UnsubAck {
        packet_id: 11,
        properties: AckProperties::default(),
        reason_codes: vec![ReasonCode::NO_SUBSCRIPTION_EXISTED],
    });
    both(&[0xB0, 0x04, 0x00, 0x0B, 0x00, 0x11], V5, p.clone());
    // 3.x UNSUBACK has no payload (3.1.1 §3.11.3).
    assert_eq!(enc(&p, V4), [0xB0, 0x02, 0x00, 0x0B]);
}

#[test]
fn pings() {
    for v in [V3, V4, V5] {
        both(&[0xC0, 0x00], v, Packet::PingReq);
        both(&[0xD0, 0x00], v, Packet::PingResp);
    }
}

#[test]
fn disconnect() {
    for v in [V3, V4] {
        both(&[0xE0, 0x00], v, Packet::Disconnect(Disconnect::default()));
    }
    // 5.0 §3.14.2.1: remaining length 0 is a normal disconnection without properties.
    both(&[0xE0, 0x00], V5, Packet::Disconnect(Disconnect::default()));
    both(
        &[0xE0, 0x01, 0x04],
        V5,
        Packet::Disconnect(Disconnect {
            reason_code: ReasonCode::DISCONNECT_WITH_WILL,
            ..Default::default()
        }),
    );
    both(
        &[0xE0, 0x07, 0x8E, 0x05, 0x11, 0x00, 0x00, 0x00, 0x00],
        V5,
        Packet::Disconnect(Disconnect {
            reason_code: ReasonCode::SESSION_TAKEN_OVER,
            properties: DisconnectProperties {
                session_expiry_interval: Some(0),
                ..Default::default()
            },
        }),
    );
    // 3.x DISCONNECT is always the 2-byte packet.
    let p = Packet::Disconnect(Disconnect {
        reason_code: ReasonCode::SERVER_SHUTTING_DOWN,
        ..Default::default()
    });
    assert_eq!(enc(&p, V4), [0xE0, 0x00]);
}

#[test]
fn auth() {
    both(&[0xF0, 0x00], V5, Packet::Auth(Auth::default()));
    both(
        &[0xF0, 0x02, 0x19, 0x00],
        V5,
        Packet::Auth(Auth {
            reason_code: ReasonCode::RE_AUTHENTICATE,
            ..Default::default()
        }),
    );
    #[rustfmt::skip]
    let bytes = [
        0xF0, 0x0A, 0x18,
        0x08, 0x15, 0x00, 0x05, b'S', b'C', b'R', b'A', b'M',
    ];
    both(
        &bytes,
        V5,
        Packet::Auth(Auth {
            reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
            properties: AuthProperties {
                authentication_method: Some(s("SCRAM")),
                ..Default::default()
            },
        }),
    );
    let mut buf = bytes::BytesMut::new();
    assert_eq!(
        encode(&Packet::Auth(Auth::default()), V4, &mut buf),
        Err(EncodeError::NotInVersion("AUTH"))
    );
    assert!(buf.is_empty(), "nothing written on error");
}

#[test]
fn two_packets_in_one_buffer_decode_in_order() {
    let mut buf = bytes::BytesMut::from(&[0xC0, 0x00, 0x40, 0x02, 0x00, 0x07, 0xD0][..]);
    assert_eq!(decode(&mut buf, Some(V4), 100), Ok(Some(Packet::PingReq)));
    assert_eq!(
        decode(&mut buf, Some(V4), 100),
        Ok(Some(Packet::PubAck(PubResponse::new(7))))
    );
    assert_eq!(decode(&mut buf, Some(V4), 100), Ok(None));
    assert_eq!(&buf[..], &[0xD0]);
}

#[test]
fn encode_publish_reports_packet_id_offset() {
    let props = PublishProperties {
        message_expiry_interval: Some(9),
        ..Default::default()
    };
    for (version, properties) in [(V4, None), (V5, None), (V5, Some(&props))] {
        let header = PublishHeader {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "t/1",
            packet_id: 1,
            properties,
        };
        let mut buf = bytes::BytesMut::from(&b"earlier bytes"[..]);
        let start = buf.len();
        let offset = encode_publish(&header, &[7; 200], version, &mut buf)
            .expect("fits")
            .expect("QoS 1 has an id");
        // Patch the id in place, as the broker does per subscriber.
        buf[start + offset..start + offset + 2].copy_from_slice(&0xBEEFu16.to_be_bytes());
        let _ = buf.split_to(start);
        let Some(Packet::Publish(p)) = decode(&mut buf, Some(version), 1000).expect("valid") else {
            panic!("not a PUBLISH");
        };
        assert_eq!(p.packet_id, 0xBEEF);
        assert_eq!(p.payload.len(), 200);
        assert_eq!(
            p.properties.message_expiry_interval.is_some(),
            properties.is_some()
        );
    }
    let header = PublishHeader {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: "t",
        packet_id: 0,
        properties: None,
    };
    let mut buf = bytes::BytesMut::new();
    assert_eq!(encode_publish(&header, b"", V5, &mut buf), Ok(None));
    assert_eq!(&buf[..], &[0x30, 0x04, 0x00, 0x01, b't', 0x00]);
}

#[test]
fn encode_rejects_overlong_strings() {
    let long = "x".repeat(65_536);
    let header = PublishHeader {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: &long,
        packet_id: 0,
        properties: None,
    };
    let mut buf = bytes::BytesMut::new();
    assert_eq!(
        encode_publish(&header, b"", V4, &mut buf),
        Err(EncodeError::StringTooLong)
    );
    let p = Packet::Unsubscribe(Unsubscribe {
        packet_id: 1,
        user_properties: vec![],
        filters: vec![ByteString::from(long)],
    });
    assert_eq!(encode(&p, V4, &mut buf), Err(EncodeError::StringTooLong));
    assert!(buf.is_empty());
}
