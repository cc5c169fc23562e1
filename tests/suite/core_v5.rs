//! MQTT 5.0 behaviour of the core broker over real sockets: rumqttc v5 and a raw v5 client,
//! plus 3.1.1 ↔ 5.0 interop.

use crate::common;

use common::rumq::{P5, V4, V5};
use common::v5;
use common::RawClient;
use postbox::codec::{
    Packet, ProtocolVersion, Publish, PublishProperties, QoS, ReasonCode, Subscribe,
    SubscriptionOptions,
};

const V: ProtocolVersion = ProtocolVersion::V5;

fn sub(filter: &str, qos: QoS, id: Option<u32>, packet_id: u16) -> Packet {
    Packet::Subscribe(Subscribe {
        subscription_identifier: id,
        ..v5::subscribe_packet(packet_id, filter, qos)
    })
}

async fn expect_publish(c: &mut RawClient) -> Publish {
    match c.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

#[tokio::test]
async fn takeover_sends_disconnect_0x8e_to_the_old_connection() {
    // 5.0 MQTT-3.1.4-3
    let server = common::start().await;
    let mut first = RawClient::connect(server.mqtt_addr, V, "same", false).await;
    let _second = RawClient::connect(server.mqtt_addr, V, "same", false).await;
    v5::expect_only_disconnect(&mut first, ReasonCode::SESSION_TAKEN_OVER).await;
}

#[tokio::test]
async fn empty_client_id_gets_an_assigned_identifier() {
    // 5.0 MQTT-3.1.3-7, MQTT-3.2.2-16
    let server = common::start().await;
    let c = V5::connect(server.mqtt_addr, "").await;
    let props = c.connack.properties.clone().expect("CONNACK properties");
    let assigned = props.assigned_client_identifier.expect("assigned id");
    assert!(!assigned.is_empty());
}

#[tokio::test]
async fn one_copy_carries_every_matching_subscription_identifier() {
    // 5.0 MQTT-3.3.4-4 (one copy, all identifiers), MQTT-3.3.4-3 (identifier of the subscription)
    let server = common::start().await;
    let mut s = RawClient::connect(server.mqtt_addr, V, "ids", true).await;
    s.send(&sub("a/+", QoS::AtLeastOnce, Some(1), 1)).await;
    assert!(matches!(s.recv().await, Some(Packet::SubAck(_))));
    s.send(&sub("a/#", QoS::AtMostOnce, Some(2), 2)).await;
    assert!(matches!(s.recv().await, Some(Packet::SubAck(_))));
    s.send(&sub("a/b", QoS::AtMostOnce, None, 3)).await;
    assert!(matches!(s.recv().await, Some(Packet::SubAck(_))));

    let mut p = V4::connect(server.mqtt_addr, "pub", true).await;
    p.publish("a/b", rumqttc::QoS::AtLeastOnce, false, b"x")
        .await;
    let got = expect_publish(&mut s).await;
    assert_eq!(got.qos, QoS::AtLeastOnce, "highest granted QoS");
    let mut ids = got.properties.subscription_identifiers.to_vec();
    ids.sort();
    assert_eq!(ids, [1, 2]);
    p.publish("a/c", rumqttc::QoS::AtLeastOnce, false, b"marker")
        .await;
    let next = expect_publish(&mut s).await;
    assert_eq!(
        &next.payload[..],
        b"marker",
        "only one copy of a/b was sent"
    );
}

#[tokio::test]
async fn properties_pass_through_and_are_dropped_for_311_subscribers() {
    // 5.0 MQTT-3.3.2-20 (content type unaltered), user properties kept in order (MQTT-3.3.2-18)
    let server = common::start().await;
    let mut v5sub = RawClient::connect(server.mqtt_addr, V, "v5sub", true).await;
    v5sub.send(&sub("props", QoS::AtLeastOnce, None, 1)).await;
    assert!(matches!(v5sub.recv().await, Some(Packet::SubAck(_))));
    let mut v3sub = V4::connect(server.mqtt_addr, "v3sub", true).await;
    v3sub.subscribe("props", rumqttc::QoS::AtLeastOnce).await;

    let mut publ = RawClient::connect(server.mqtt_addr, V, "v5pub", true).await;
    let properties = PublishProperties {
        content_type: Some("text/plain".into()),
        response_topic: Some("reply/here".into()),
        correlation_data: Some("corr".into()),
        payload_format_indicator: Some(1),
        user_properties: vec![
            ("k".into(), "1".into()),
            ("k".into(), "2".into()),
            ("a".into(), "z".into()),
        ],
        ..Default::default()
    };
    publ.send(&Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        topic: "props".into(),
        packet_id: 9,
        payload: "hello".into(),
        properties: properties.clone(),
        ..Default::default()
    }))
    .await;
    assert!(matches!(publ.recv().await, Some(Packet::PubAck(_))));

    let got = expect_publish(&mut v5sub).await;
    assert_eq!(got.properties, properties);
    let got3 = v3sub.next_publish().await;
    assert_eq!(&got3.payload[..], b"hello");
}

#[tokio::test]
async fn v311_publisher_reaches_v5_subscriber() {
    let server = common::start().await;
    let mut s = V5::connect(server.mqtt_addr, "v5").await;
    s.subscribe("mix/#", rumqttc::v5::mqttbytes::QoS::ExactlyOnce)
        .await;
    let mut p = V4::connect(server.mqtt_addr, "v3", true).await;
    p.publish("mix/1", rumqttc::QoS::ExactlyOnce, false, b"from-311")
        .await;
    let got = s.next_publish().await;
    assert_eq!(&got.topic[..], b"mix/1");
    assert_eq!(&got.payload[..], b"from-311");
    assert_eq!(got.qos, rumqttc::v5::mqttbytes::QoS::ExactlyOnce);
}

#[tokio::test]
async fn keep_alive_timeout_sends_disconnect_0x8d() {
    // 5.0 MQTT-3.1.2-24, reason 0x8D
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, V).await;
    c.send(&Packet::Connect(Box::new(postbox::codec::Connect {
        protocol: V,
        clean_start: true,
        keep_alive: 1,
        client_id: "sleepy5".into(),
        will: None,
        username: None,
        password: None,
        properties: Default::default(),
        bridge: false,
    })))
    .await;
    assert!(matches!(c.recv().await, Some(Packet::ConnAck(_))));
    v5::expect_only_disconnect(&mut c, ReasonCode::KEEP_ALIVE_TIMEOUT).await;
}

#[tokio::test]
async fn no_local_and_retain_as_published() {
    // 5.0 MQTT-3.8.3-3 (No Local), MQTT-3.3.1-12 / -13 (Retain As Published)
    let server = common::start().await;
    let mut c = RawClient::connect(server.mqtt_addr, V, "self", true).await;
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![
            (
                "loop".into(),
                SubscriptionOptions {
                    qos: QoS::AtMostOnce,
                    no_local: true,
                    ..Default::default()
                },
            ),
            (
                "rap".into(),
                SubscriptionOptions {
                    qos: QoS::AtMostOnce,
                    retain_as_published: true,
                    ..Default::default()
                },
            ),
        ],
        ..Default::default()
    }))
    .await;
    assert!(matches!(c.recv().await, Some(Packet::SubAck(_))));
    for topic in ["loop", "rap"] {
        c.send(&Packet::Publish(Publish {
            topic: topic.into(),
            retain: true,
            payload: "p".into(),
            ..Default::default()
        }))
        .await;
    }
    let got = expect_publish(&mut c).await;
    assert_eq!(
        &got.topic[..],
        "rap",
        "own message on a No Local subscription was not echoed"
    );
    assert!(got.retain, "Retain As Published keeps RETAIN=1");
}

#[tokio::test]
async fn server_shutdown_sends_disconnect_0x8b() {
    let server = common::start().await;
    let mut c = RawClient::connect(server.mqtt_addr, V, "bye", true).await;
    c.connected().await; // the shutdown tells connected clients
    server.shutdown().await;
    v5::expect_only_disconnect(&mut c, ReasonCode::SERVER_SHUTTING_DOWN).await;
    let _: Option<P5> = None;
}
