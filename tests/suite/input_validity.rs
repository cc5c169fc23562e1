//! What a client may put in its strings and properties, over real sockets: empty topic filters
//! (MQTT-4.7.3-1, MQTT-4.8.2-2), Subscription Identifiers on a client PUBLISH (MQTT-3.3.4-6),
//! the CONNECT reserved flag per protocol level (MQTT-3.1.2-3), and control characters in topic
//! names, topic filters, client ids and user names (5.0 §1.5.4, 3.1.1 §1.5.3), refused by
//! default and accepted with `mqtt.allow_control_characters = true`.
//!
//! Statement ids are those of `mqtt-5.0-normative-statements.txt` (the OASIS numbering).

use crate::common;

use std::net::SocketAddr;

use common::v5::{self, expect_disconnect};
use common::RawClient;
use postbox::codec::{
    Connect, LastWill, Packet, ProtocolVersion, PubResponse, PublishProperties, QoS, ReasonCode,
    Subscribe, SubscriptionOptions, Unsubscribe,
};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

/// A SUBSCRIBE for `filters`, each at QoS 1.
fn subscribe(filters: &[&str]) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 9,
        filters: filters
            .iter()
            .map(|f| {
                (
                    (*f).into(),
                    SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        ..Default::default()
                    },
                )
            })
            .collect(),
        ..Default::default()
    })
}

/// An UNSUBSCRIBE for `filters`.
fn unsubscribe(filters: &[&str]) -> Packet {
    Packet::Unsubscribe(Unsubscribe {
        packet_id: 10,
        filters: filters.iter().map(|f| (*f).into()).collect(),
        ..Default::default()
    })
}

/// A QoS 1 PUBLISH to `topic` with `payload`.
fn publish(topic: &str, payload: &[u8]) -> Packet {
    Packet::Publish(v5::publish_packet(topic, QoS::AtLeastOnce, payload, 1))
}

/// Sends `packet` on a fresh session at `version` and expects what the spec asks of a packet
/// the broker treats as malformed or a protocol error: v5 DISCONNECT with `code`, then the
/// close; 3.x the close with nothing sent (3.1.1 has no server DISCONNECT).
async fn expect_refused(
    addr: SocketAddr,
    version: ProtocolVersion,
    packet: &Packet,
    code: ReasonCode,
) {
    let mut c = RawClient::connect(addr, version, "refused", true).await;
    c.send(packet).await;
    if version.is_v5() {
        expect_disconnect(&mut c, code).await;
    } else {
        let seen = c.expect_close().await;
        assert!(
            seen.is_empty(),
            "3.x closes without a reply to {packet:?}, got {seen:?}"
        );
    }
}

/// Sends `packet` on a fresh session at `version` and returns the broker's answer.
async fn answer(addr: SocketAddr, version: ProtocolVersion, packet: &Packet) -> Packet {
    let mut c = RawClient::connect(addr, version, "answered", true).await;
    c.send(packet).await;
    c.recv().await.expect("an answer, not a close")
}

/// The broker still serves a well-behaved v5 client after the refusals.
async fn assert_still_serving(addr: SocketAddr) {
    let mut c = v5::connect_id(addr, "healthy").await;
    v5::subscribe(&mut c, "health", QoS::AtLeastOnce).await;
    assert_eq!(
        v5::publish(
            &mut c,
            v5::publish_packet("health", QoS::AtLeastOnce, b"ok", 3)
        )
        .await,
        ReasonCode::SUCCESS
    );
    assert_eq!(&v5::receive(&mut c).await.payload[..], b"ok");
}

// ---- (a) empty topic filters -------------------------------------------------------------

/// MQTT-4.7.3-1 "All Topic Names and Topic Filters MUST be at least one character long", and
/// MQTT-4.8.2-2 "The `ShareName` ... MUST be followed by a "/" character. This "/" character MUST
/// be followed by a Topic Filter": a SUBSCRIBE or UNSUBSCRIBE with an empty filter, also after
/// `$share/{group}/`, is a Malformed Packet (v5 DISCONNECT 0x81, 3.x close), not a failed
/// subscription.
#[tokio::test]
async fn empty_topic_filters_are_malformed() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    for version in [V5, V311] {
        for filter in ["", "$share/g/", "$share/g"] {
            let code = ReasonCode::MALFORMED_PACKET;
            expect_refused(addr, version, &subscribe(&[filter]), code).await;
            // Behind a valid filter too: the whole packet is refused, not one entry.
            expect_refused(addr, version, &subscribe(&["ok/+", filter]), code).await;
            expect_refused(addr, version, &unsubscribe(&[filter]), code).await;
        }
    }
    assert_still_serving(addr).await;
}

/// Other invalid filters keep their per-filter failure: SUBACK 0x8F (v5), 0x80 (3.1.1,
/// MQTT-3.9.3-2 of 3.1.1), and the connection stays open.
#[tokio::test]
async fn other_invalid_filters_fail_only_their_entry() {
    let server = common::start().await;
    for (version, fail) in [(V5, 0x8Fu8), (V311, 0x80)] {
        let filters = ["ok/+", "a/#/b", "$share//a", "$share/g+/a"];
        match answer(server.mqtt_addr, version, &subscribe(&filters)).await {
            Packet::SubAck(ack) => {
                let codes: Vec<u8> = ack
                    .reason_codes
                    .iter()
                    .map(|r| {
                        if version.is_v5() {
                            r.0
                        } else {
                            r.to_v3_suback()
                        }
                    })
                    .collect();
                assert_eq!(codes, [1, fail, fail, fail], "{version:?}");
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
}

// ---- (b) Subscription Identifier on a client PUBLISH ---------------------------------------

/// MQTT-3.3.4-6 "A PUBLISH packet sent from a Client to a Server MUST NOT contain a
/// Subscription Identifier": a PUBLISH at `qos` carrying `ids` is a Protocol Error (DISCONNECT
/// 0x82), and the message is not routed.
async fn publish_with_subscription_identifiers(qos: QoS, ids: &[u32]) {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let mut sub = v5::connect_id(addr, "sid-sub").await;
    v5::subscribe(&mut sub, "sid", QoS::AtLeastOnce).await;
    let mut publisher = v5::connect_id(addr, "sid-pub").await;
    let mut p = v5::publish_packet("sid", qos, b"bad", 1);
    p.properties = PublishProperties {
        subscription_identifiers: ids.iter().copied().collect(),
        ..Default::default()
    };
    publisher.send(&Packet::Publish(p)).await;
    expect_disconnect(&mut publisher, ReasonCode::PROTOCOL_ERROR).await;
    // Had it been routed, it would have been queued for `sid-sub` before this one.
    let mut marker = v5::connect_id(addr, "sid-marker").await;
    let good = v5::publish_packet("sid", QoS::AtLeastOnce, b"good", 2);
    assert_eq!(v5::publish(&mut marker, good).await, ReasonCode::SUCCESS);
    assert_eq!(&v5::receive(&mut sub).await.payload[..], b"good");
}

/// MQTT-3.3.4-6 with one Subscription Identifier (QoS 1: refused, not acknowledged).
#[tokio::test]
async fn one_subscription_identifier_on_client_publish_is_a_protocol_error() {
    publish_with_subscription_identifiers(QoS::AtLeastOnce, &[5]).await;
}

/// MQTT-3.3.4-6 with two: PUBLISH is the one packet where the property may repeat, and the
/// codec collects every occurrence; the count does not matter.
#[tokio::test]
async fn two_subscription_identifiers_on_client_publish_are_a_protocol_error() {
    publish_with_subscription_identifiers(QoS::AtMostOnce, &[2, 129]).await;
}

// ---- (c) the CONNECT reserved flag -------------------------------------------------------

/// A CONNECT with the reserved flag (bit 0) set, at protocol `name` / `level`, client id "x".
fn connect_with_reserved_flag(name: &[u8], level: u8) -> Vec<u8> {
    let mut body = vec![0x00, name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(&[level, 0x03, 0x00, 0x0A]); // clean + reserved, keep-alive 10
    if level == 5 {
        body.push(0x00); // no properties
    }
    body.extend_from_slice(&[0x00, 0x01, b'x']);
    let mut out = vec![0x10, body.len() as u8];
    out.extend(body);
    out
}

/// MQTT-3.1.2-3 "The Server MUST validate that the reserved flag in the CONNECT packet is set
/// to 0" holds for 3.1.1 (close, MQTT-3.1.2-3 of 3.1.1) and 5.0 (CONNACK 0x81); MQTT 3.1
/// ("MQIsdp", level 3) does not reserve the bit, so its CONNECT is accepted, as Mosquitto does.
#[tokio::test]
async fn reserved_connect_flag_is_checked_from_3_1_1_on() {
    let server = common::start().await;
    let addr = server.mqtt_addr;

    let mut c = RawClient::open(addr, ProtocolVersion::V3_1).await;
    c.send_raw(&connect_with_reserved_flag(b"MQIsdp", 3)).await;
    assert_eq!(
        c.recv_bytes(4).await,
        [0x20, 0x02, 0x00, 0x00],
        "3.1 CONNACK accepted"
    );
    c.send(&Packet::PingReq).await;
    assert_eq!(c.recv().await, Some(Packet::PingResp));

    let mut c = RawClient::open(addr, V311).await;
    c.send_raw(&connect_with_reserved_flag(b"MQTT", 4)).await;
    let seen = c.expect_close().await;
    assert!(
        seen.is_empty(),
        "3.1.1: close without CONNACK, got {seen:?}"
    );

    let mut c = RawClient::open(addr, V5).await;
    c.send_raw(&connect_with_reserved_flag(b"MQTT", 5)).await;
    match c.expect_close().await.as_slice() {
        [Packet::ConnAck(ack)] => assert_eq!(ack.reason_code, ReasonCode::MALFORMED_PACKET),
        other => panic!("5.0: expected CONNACK 0x81, got {other:?}"),
    }
}

// ---- (d) control characters --------------------------------------------------------------

/// One of each kind of control character the spec names (U+0001..U+001F, U+007F..U+009F),
/// at the edges of both ranges; the last two are two-byte UTF-8 sequences (0xC2 0x80..0x9F).
const CONTROLS: [&str; 6] = ["\u{1}", "\u{1F}", "\u{7F}", "\u{80}", "\u{85}", "\u{9F}"];

/// 5.0 §1.5.4: "The data SHOULD NOT include encodings of the Unicode code points listed below.
/// If a receiver (Server or Client) receives an MQTT Control Packet containing any of them it
/// MAY treat it as a Malformed Packet" (U+0001..U+001F, U+007F..U+009F; 3.1.1 §1.5.3 lets it
/// close the connection). By default a topic name in PUBLISH, a filter in SUBSCRIBE or
/// UNSUBSCRIBE with one is Malformed: v5 DISCONNECT 0x81, 3.x close.
#[tokio::test]
async fn control_characters_in_topics_are_malformed_by_default() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let code = ReasonCode::MALFORMED_PACKET;
    for version in [V5, V311] {
        for control in CONTROLS {
            let topic = format!("a/{control}b");
            expect_refused(addr, version, &publish(&topic, b"x"), code).await;
            expect_refused(addr, version, &subscribe(&[&topic]), code).await;
            expect_refused(addr, version, &unsubscribe(&[&topic]), code).await;
            let shared = format!("$share/g/{topic}");
            expect_refused(addr, version, &subscribe(&[&shared]), code).await;
        }
    }
    // QoS 0 has no ack to refuse with: the same close.
    let qos0 = Packet::Publish(v5::publish_packet("a/\u{7}", QoS::AtMostOnce, b"x", 0));
    expect_refused(addr, V5, &qos0, code).await;
    assert_still_serving(addr).await;
}

/// Characters next to the control ranges are ordinary: U+0020, U+007E, U+00A0 (0xC2 0xA0, the
/// first two-byte character after U+009F), U+00B0 and U+0100 are routed as usual.
#[tokio::test]
async fn characters_beside_the_control_ranges_are_accepted() {
    let server = common::start().await;
    let mut c = v5::connect_id(server.mqtt_addr, "neighbours").await;
    for topic in ["a b", "a~", "a\u{A0}", "20\u{B0}C", "\u{100}"] {
        v5::subscribe(&mut c, topic, QoS::AtLeastOnce).await;
        let p = v5::publish_packet(topic, QoS::AtLeastOnce, b"x", 4);
        assert_eq!(
            v5::publish(&mut c, p).await,
            ReasonCode::SUCCESS,
            "{topic:?}"
        );
        assert_eq!(v5::receive(&mut c).await.topic, topic);
    }
}

/// Non-characters (5.0 §1.5.4 names them beside the controls): U+FDD0..U+FDEF and the last
/// two code points of a plane, at the edges.
const NON_CHARACTERS: [&str; 4] = ["\u{FDD0}", "\u{FDEF}", "\u{FFFF}", "\u{10FFFE}"];

/// 5.0 §1.5.4 (as [`control_characters_in_topics_are_malformed_by_default`]) also for the
/// strings a PUBLISH carries on to subscribers: a control character or non-character in its
/// Content Type, Response Topic or a User Property, and a non-character in its topic, make it
/// Malformed by default (DISCONNECT 0x81), and the subscriber gets nothing of it. Before, they
/// were forwarded as they came (issue 35, thirteenth adversarial pass, F3), to subscribers
/// whose clients may treat the packet as malformed and drop their own connection.
#[tokio::test]
async fn disallowed_code_points_in_forwarded_properties_are_malformed_by_default() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let mut subscriber = v5::connect_id(addr, "listener").await;
    v5::subscribe(&mut subscriber, "p/#", QoS::AtLeastOnce).await;
    let code = ReasonCode::MALFORMED_PACKET;
    for bad in CONTROLS.into_iter().chain(NON_CHARACTERS) {
        let text = format!("x{bad}y");
        let with = |set: fn(&mut PublishProperties, String)| {
            let mut p = v5::publish_packet("p/x", QoS::AtLeastOnce, b"x", 1);
            set(&mut p.properties, text.clone());
            Packet::Publish(p)
        };
        // In the Content Type, the Response Topic, a User Property's value, and its name.
        let carriers: [fn(&mut PublishProperties, String); 4] = [
            |p, t| p.content_type = Some(t.into()),
            |p, t| p.response_topic = Some(t.into()),
            |p, t| p.user_properties = vec![("k".into(), t.into())],
            |p, t| p.user_properties = vec![(t.into(), "v".into())],
        ];
        for carrier in carriers {
            expect_refused(addr, V5, &with(carrier), code).await;
        }
    }
    for bad in NON_CHARACTERS {
        expect_refused(addr, V5, &publish(&format!("p/{bad}"), b"x"), code).await;
        expect_refused(addr, V311, &publish(&format!("p/{bad}"), b"x"), code).await;
    }
    // Nothing of them reached the subscriber: the first message it gets is this one.
    let mut c = v5::connect_id(addr, "clean").await;
    let mut p = v5::publish_packet("p/clean", QoS::AtLeastOnce, b"ok", 2);
    p.properties.user_properties = vec![("unit".into(), "\u{B0}C \u{FFFD}".into())];
    assert_eq!(v5::publish(&mut c, p).await, ReasonCode::SUCCESS);
    let got = v5::receive(&mut subscriber).await;
    assert_eq!(got.topic, "p/clean");
    assert_eq!(got.properties.user_properties.len(), 1);
}

/// For each of [`CONTROLS`], sends the CONNECT `with_control` makes of it as a v5 client,
/// which must get CONNACK `v5_code` and be closed, then as a 3.1.1 client, which must get
/// CONNACK return code `v311_code` and be closed: the one check for a CONNECT field the broker
/// refuses by default in both versions when it holds a control character.
async fn control_characters_refused_in_v5_and_v311(
    with_control: impl Fn(&str) -> Connect,
    v5_code: ReasonCode,
    v311_code: u8,
) {
    let server = common::start().await;
    for control in CONTROLS {
        let mut connect = with_control(control);
        match v5::open(server.mqtt_addr, connect.clone()).await {
            (mut c, Some(Packet::ConnAck(ack))) => {
                assert_eq!(ack.reason_code, v5_code, "{control:?}");
                assert!(c.expect_close().await.is_empty(), "{control:?}");
            }
            (_, other) => panic!("expected CONNACK {v5_code:?} for {control:?}, got {other:?}"),
        }
        let mut c = RawClient::open(server.mqtt_addr, V311).await;
        connect.protocol = V311;
        c.send(&Packet::Connect(Box::new(connect))).await;
        assert_eq!(
            c.recv_bytes(4).await,
            [0x20, 0x02, 0x00, v311_code],
            "{control:?}"
        );
        assert!(c.expect_close().await.is_empty(), "{control:?}");
    }
}

/// By default a client id with a control character is refused like any client id the broker
/// rejects (MQTT-3.1.3-8): CONNACK 0x85 Client Identifier not valid (v5), return code 0x02
/// identifier rejected (3.x).
#[tokio::test]
async fn control_characters_in_client_ids_are_refused_by_default() {
    control_characters_refused_in_v5_and_v311(
        |control| common::connect_packet(V5, &format!("id{control}")),
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        0x02,
    )
    .await;
}

/// By default a user name with a control character is refused as "bad user name or password"
/// (v5 CONNACK 0x86, whose meaning in Table 3-1 is "The data in the user name or password is
/// malformed"; 3.1.1 return code 0x04, same wording in Table 3.1).
#[tokio::test]
async fn control_characters_in_user_names_are_refused_by_default() {
    control_characters_refused_in_v5_and_v311(
        |control| {
            let mut connect = common::connect_packet(V5, "named");
            connect.username = Some(format!("user{control}").into());
            connect
        },
        ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        0x04,
    )
    .await;
}

/// A will topic is a topic name: by default one with a control character makes the CONNECT
/// malformed (v5 CONNACK 0x81, 5.0 §1.5.4), and a 3.x client is closed without CONNACK, as for
/// any malformed CONNECT.
#[tokio::test]
async fn control_characters_in_will_topics_are_malformed_by_default() {
    let server = common::start().await;
    for control in CONTROLS {
        let mut connect = common::connect_packet(V5, "willing");
        connect.will = Some(LastWill {
            topic: format!("will/{control}").into(),
            payload: "gone".into(),
            ..Default::default()
        });
        match v5::open(server.mqtt_addr, connect.clone()).await {
            (_, Some(Packet::ConnAck(ack))) => {
                assert_eq!(ack.reason_code, ReasonCode::MALFORMED_PACKET, "{control:?}");
            }
            (_, other) => panic!("expected CONNACK 0x81, got {other:?}"),
        }
        let mut c = RawClient::open(server.mqtt_addr, V311).await;
        connect.protocol = V311;
        c.send(&Packet::Connect(Box::new(connect))).await;
        let seen = c.expect_close().await;
        assert!(
            seen.is_empty(),
            "3.1.1: close without CONNACK, got {seen:?}"
        );
    }
    assert_still_serving(server.mqtt_addr).await;
}

/// With `mqtt.allow_control_characters = true` the SHOULD NOT is not enforced: client ids, user
/// names, will topics, filters and topic names with control characters all work end to end.
#[tokio::test]
async fn control_characters_are_accepted_when_allowed() {
    let mut config = common::test_config();
    config.mqtt.allow_control_characters = true;
    let server = common::start_with(config).await;
    let addr = server.mqtt_addr;
    for (n, control) in CONTROLS.into_iter().enumerate() {
        let topic = format!("t{n}/{control}");
        let mut connect = common::connect_packet(V5, &format!("id{n}{control}"));
        connect.username = Some(format!("user{control}").into());
        connect.will = Some(LastWill {
            topic: topic.as_str().into(),
            payload: "gone".into(),
            ..Default::default()
        });
        let (mut c, _) = v5::connect(addr, connect).await;
        v5::subscribe(&mut c, &topic, QoS::AtLeastOnce).await;
        let shared = format!("$share/g/{topic}");
        v5::subscribe(&mut c, &shared, QoS::AtLeastOnce).await;
        let p = v5::publish_packet(&topic, QoS::AtLeastOnce, b"x", 5);
        assert_eq!(v5::publish(&mut c, p).await, ReasonCode::SUCCESS);
        assert_eq!(v5::receive(&mut c).await.topic, topic.as_str());
        assert_eq!(v5::receive(&mut c).await.topic, topic.as_str());
        c.send(&unsubscribe(&[&topic])).await;
        match c.recv().await {
            Some(Packet::UnsubAck(ack)) => assert_eq!(ack.reason_codes, [ReasonCode::SUCCESS]),
            other => panic!("expected UNSUBACK, got {other:?}"),
        }
        v5::disconnect(c).await;

        // 3.1.1 too, with a control character in the client id and the topic.
        let mut c = RawClient::connect(addr, V311, &format!("old{n}{control}"), true).await;
        c.send(&subscribe(&[&topic])).await;
        assert!(matches!(c.recv().await, Some(Packet::SubAck(_))));
        c.send(&publish(&topic, b"y")).await;
        let mut got = (false, false);
        while got != (true, true) {
            match c.recv().await {
                Some(Packet::PubAck(_)) => got.0 = true,
                Some(Packet::Publish(p)) => {
                    assert_eq!(p.topic, topic.as_str());
                    c.send(&Packet::PubAck(PubResponse::new(p.packet_id))).await;
                    got.1 = true;
                }
                other => panic!("expected PUBACK and PUBLISH, got {other:?}"),
            }
        }
    }
}
