//! Byte-exact vectors of the acknowledgements, SUBSCRIBE / UNSUBSCRIBE and their acks, the
//! pings, DISCONNECT and AUTH, and the encoder's edges (one buffer of two packets, the packet
//! id's offset, overlong strings).

use super::*;

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
