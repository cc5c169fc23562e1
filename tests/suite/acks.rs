//! Acknowledgements over real sockets, both directions:
//!
//! * an ack of the wrong kind for an in-flight delivery (PUBREC / PUBCOMP for QoS 1, PUBACK for
//!   QoS 2, PUBCOMP before any PUBREL) is a Protocol Error: v5 DISCONNECT 0x82 (v5 §4.13.1,
//!   MQTT-4.13.1-1), 3.1.1 close (3.1.1 MQTT-4.8.0-1: "If the Client or Server encounters a
//!   protocol violation it MUST close the Network Connection"); acks for ids with nothing in
//!   flight stay ignored;
//! * a v5 publisher whose QoS 1/2 PUBLISH matched no subscription is told so: PUBACK / PUBREC
//!   0x10 No matching subscribers (v5 §3.4.2.1, §3.5.2.1); 3.1.1 acks are unchanged.

use crate::common;

use common::v5::{self, V};
use common::RawClient;
use postbox::codec::{
    Connect, Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode, SubscriptionOptions,
};

const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

/// Connects a subscriber of `version` to "acks/t" at `qos`, publishes one message at `qos`
/// from another client, and returns the subscriber with the delivery it received (not yet
/// acknowledged).
async fn in_flight(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    qos: QoS,
) -> (RawClient, Publish) {
    let mut sub = RawClient::connect(addr, version, "acks-sub", true).await;
    v5::subscribe(&mut sub, "acks/t", qos).await;
    let mut publ = RawClient::connect(addr, version, "acks-pub", true).await;
    v5::publish(&mut publ, v5::publish_packet("acks/t", qos, b"m", 1)).await;
    let delivery = v5::expect_publish(&mut sub).await;
    assert_eq!(delivery.qos, qos);
    (sub, delivery)
}

/// Answers a delivery with `wrong` and expects the Protocol Error close: DISCONNECT 0x82 for
/// v5, a close without any packet for 3.1.1.
async fn wrong_ack_closes(version: ProtocolVersion, qos: QoS, wrong: fn(PubResponse) -> Packet) {
    let server = common::start().await;
    let (mut sub, delivery) = in_flight(server.mqtt_addr, version, qos).await;
    sub.send(&wrong(PubResponse::new(delivery.packet_id))).await;
    if version.is_v5() {
        v5::expect_disconnect(&mut sub, ReasonCode::PROTOCOL_ERROR).await;
    } else {
        sub.expect_silent_close("3.1.1 closes without a packet")
            .await;
    }
}

// ----- acks of the wrong kind -----

#[tokio::test]
async fn v5_pubrec_for_a_qos1_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.2-4 (QoS 1 is answered with PUBACK), §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::AtLeastOnce, Packet::PubRec).await;
}

#[tokio::test]
async fn v5_pubcomp_for_a_qos1_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.2-4, §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::AtLeastOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v5_puback_for_a_qos2_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-8 (QoS 2 is answered with PUBREC), §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::ExactlyOnce, Packet::PubAck).await;
}

#[tokio::test]
async fn v5_pubcomp_before_pubrel_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-11: PUBCOMP answers a PUBREL, and none was sent yet → 0x82
    wrong_ack_closes(V, QoS::ExactlyOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v5_puback_in_the_pubrel_stage_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-11: our PUBREL is answered with PUBCOMP, not PUBACK → 0x82
    let server = common::start().await;
    let (mut sub, delivery) = in_flight(server.mqtt_addr, V, QoS::ExactlyOnce).await;
    let id = delivery.packet_id;
    sub.send(&Packet::PubRec(PubResponse::new(id))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == id));
    sub.send(&Packet::PubAck(PubResponse::new(id))).await;
    v5::expect_disconnect(&mut sub, ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn v311_pubrec_for_a_qos1_delivery_closes() {
    // 3.1.1 MQTT-4.3.2-2 (QoS 1 is answered with PUBACK), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::AtLeastOnce, Packet::PubRec).await;
}

#[tokio::test]
async fn v311_pubcomp_for_a_qos1_delivery_closes() {
    // 3.1.1 MQTT-4.3.2-2, MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::AtLeastOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v311_puback_for_a_qos2_delivery_closes() {
    // 3.1.1 MQTT-4.3.3-2 (QoS 2 is answered with PUBREC), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::ExactlyOnce, Packet::PubAck).await;
}

#[tokio::test]
async fn v311_pubcomp_before_pubrel_closes() {
    // 3.1.1 MQTT-4.3.3-2 (PUBCOMP answers a PUBREL), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::ExactlyOnce, Packet::PubComp).await;
}

/// Acks for ids with nothing in flight are not errors (a client may repeat acks after a
/// reconnect), and a PUBREC repeated while the PUBREL stage runs gets PUBREL again
/// (MQTT-4.3.3-4); the connection stays up (PINGREQ answered, MQTT-3.12.4-1).
#[tokio::test]
async fn acks_for_unknown_ids_and_a_repeated_pubrec_are_not_errors() {
    for version in [V, V311] {
        let server = common::start().await;
        let (mut sub, delivery) = in_flight(server.mqtt_addr, version, QoS::ExactlyOnce).await;
        let id = delivery.packet_id;
        let unknown = id.wrapping_add(100);
        sub.send(&Packet::PubAck(PubResponse::new(unknown))).await;
        sub.send(&Packet::PubComp(PubResponse::new(unknown))).await;
        for _ in 0..2 {
            sub.send(&Packet::PubRec(PubResponse::new(id))).await;
            assert!(
                matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == id),
                "{version:?}: PUBREL (again)"
            );
        }
        sub.send(&Packet::PubComp(PubResponse::new(id))).await;
        // A PUBCOMP repeated after the delivery finished: unknown id, ignored.
        sub.send(&Packet::PubComp(PubResponse::new(id))).await;
        assert!(sub.answers_ping().await, "{version:?}: still connected");
    }
}

// ----- 0x10 No matching subscribers -----

#[tokio::test]
async fn v5_qos1_publish_nobody_subscribes_to_gets_puback_0x10() {
    // 5.0 §3.4.2.1: 0x10 "The message is accepted but there are no subscribers"
    let server = common::start().await;
    let mut publ = v5::connect_id(server.mqtt_addr, "lonely").await;
    assert_eq!(
        v5::publish_qos1(&mut publ, "nobody/here", b"x", 1).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
}

#[tokio::test]
async fn v5_qos1_publish_with_a_subscriber_gets_puback_0x00() {
    // 5.0 §3.4.2.1: 0x00 Success once a subscription matches
    let server = common::start().await;
    let mut sub = v5::connect_id(server.mqtt_addr, "there").await;
    v5::subscribe(&mut sub, "somebody/+", QoS::AtLeastOnce).await;
    let mut publ = v5::connect_id(server.mqtt_addr, "talker").await;
    assert_eq!(
        v5::publish_qos1(&mut publ, "somebody/here", b"x", 1).await,
        ReasonCode::SUCCESS
    );
    assert_eq!(&v5::receive(&mut sub).await.payload[..], b"x");
}

#[tokio::test]
async fn v5_qos2_publish_nobody_subscribes_to_gets_pubrec_0x10_then_pubcomp_0x00() {
    // 5.0 §3.5.2.1: PUBREC 0x10; it is below 0x80, so the flow goes on (MQTT-4.3.3-4 on the
    // client's side) and PUBREL is answered with PUBCOMP 0x00 (MQTT-4.3.3-11, §3.7.2.1)
    let server = common::start().await;
    let mut publ = v5::connect_id(server.mqtt_addr, "lonely2").await;
    publ.send(&Packet::Publish(v5::publish_packet(
        "nobody/q2",
        QoS::ExactlyOnce,
        b"x",
        9,
    )))
    .await;
    match publ.recv().await {
        Some(Packet::PubRec(r)) => {
            assert_eq!(r.packet_id, 9);
            assert_eq!(r.reason_code, ReasonCode::NO_MATCHING_SUBSCRIBERS);
        }
        other => panic!("expected PUBREC, got {other:?}"),
    }
    publ.send(&Packet::PubRel(PubResponse::new(9))).await;
    match publ.recv().await {
        Some(Packet::PubComp(c)) => {
            assert_eq!(c.packet_id, 9);
            assert_eq!(c.reason_code, ReasonCode::SUCCESS);
        }
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

/// A retained message nobody subscribes to is still stored (MQTT-3.3.1-5) and its publisher
/// still told 0x10: no subscriber matched when it was published (v5 §3.4.2.1); a later
/// subscriber gets it (MQTT-3.3.1-9).
#[tokio::test]
async fn v5_retained_publish_nobody_subscribes_to_is_0x10_and_kept() {
    let server = common::start().await;
    let mut publ = v5::connect_id(server.mqtt_addr, "keeper").await;
    assert_eq!(
        v5::publish_retained(&mut publ, "kept/t", b"r", 1).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    let mut sub = v5::connect_id(server.mqtt_addr, "late").await;
    v5::subscribe(&mut sub, "kept/t", QoS::AtLeastOnce).await;
    let got = v5::receive(&mut sub).await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"r");
}

/// Subscribers that exist but will not get this copy still count: a shared subscription
/// (one member chosen, v5 §4.8.2) and an offline session subscribed at QoS 0 (the QoS 0 copy
/// is dropped: keeping QoS 0 for it is optional, v5 §4.1) both make it 0x00, not 0x10.
#[tokio::test]
async fn v5_shared_and_offline_subscribers_count_as_matching() {
    let server = common::start().await;
    let mut member = v5::connect_id(server.mqtt_addr, "member").await;
    v5::subscribe(&mut member, "$share/g/shared/t", QoS::AtLeastOnce).await;

    let mut connect = v5::connect_packet("away");
    connect.properties.session_expiry_interval = Some(300);
    let (mut away, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut away, "offline/t", QoS::AtMostOnce).await;
    v5::disconnect(away).await;

    let mut publ = v5::connect_id(server.mqtt_addr, "asker").await;
    assert_eq!(
        v5::publish_qos1(&mut publ, "shared/t", b"s", 1).await,
        ReasonCode::SUCCESS,
        "a shared subscription matches"
    );
    assert_eq!(&v5::receive(&mut member).await.payload[..], b"s");
    assert_eq!(
        v5::publish_qos1(&mut publ, "offline/t", b"o", 2).await,
        ReasonCode::SUCCESS,
        "an offline subscriber matches"
    );
}

/// The publisher's own No Local subscription does not receive its message (MQTT-3.8.3-3), so
/// nobody does: 0x10.
#[tokio::test]
async fn v5_only_the_publishers_own_no_local_subscription_is_0x10() {
    let server = common::start().await;
    let mut me = v5::connect_id(server.mqtt_addr, "self").await;
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        no_local: true,
        ..Default::default()
    };
    v5::subscribe_with(&mut me, "mine/t", options, None).await;
    assert_eq!(
        v5::publish_qos1(&mut me, "mine/t", b"x", 1).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
}

/// 3.1.1 acks have no reason code: PUBACK and PUBREC for a PUBLISH nobody subscribes to are
/// the plain 2-byte-body packets (3.1.1 §3.4, §3.5).
#[tokio::test]
async fn v311_acks_without_subscribers_are_unchanged() {
    let server = common::start().await;
    let mut publ = RawClient::connect(server.mqtt_addr, V311, "plain", true).await;
    publ.send(&Packet::Publish(v5::publish_packet(
        "nobody/v3",
        QoS::AtLeastOnce,
        b"x",
        1,
    )))
    .await;
    assert_eq!(publ.recv_bytes(4).await, [0x40, 0x02, 0x00, 0x01], "PUBACK");
    publ.send(&Packet::Publish(v5::publish_packet(
        "nobody/v3",
        QoS::ExactlyOnce,
        b"x",
        2,
    )))
    .await;
    assert_eq!(publ.recv_bytes(4).await, [0x50, 0x02, 0x00, 0x02], "PUBREC");
}

/// The wire layout of the v5 PUBACK carrying 0x10: packet id, then the reason code, no
/// properties (v5 §3.4.2).
#[tokio::test]
async fn v5_puback_0x10_wire_layout() {
    let server = common::start().await;
    let connect: Connect = v5::connect_packet("wire");
    let (mut publ, _) = v5::connect(server.mqtt_addr, connect).await;
    publ.send(&Packet::Publish(v5::publish_packet(
        "nobody/wire",
        QoS::AtLeastOnce,
        b"x",
        3,
    )))
    .await;
    assert_eq!(publ.recv_bytes(5).await, [0x40, 0x03, 0x00, 0x03, 0x10]);
}
