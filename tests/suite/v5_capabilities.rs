//! MQTT 5 capabilities from config, announced in CONNACK and honoured: Maximum QoS, Retain
//! Available, Maximum Packet Size (both ways), Topic Alias Maximum, Wildcard / Subscription
//! Identifier / Shared Subscription Available, Server Keep Alive, Response Information, and
//! Reason Strings only when the client's Request Problem Information allows.
//!
//! Statement ids follow the OASIS MQTT 5.0 text; where `/work/shared/spec`'s list numbers one
//! differently, its number is given as "list: …".

use crate::common;

use std::time::Duration;

use common::rumq::V4;
use common::{v5, RawClient};
use postbox::codec::{
    Connect, Packet, ProtocolVersion, QoS, ReasonCode, SubAck, Subscribe, SubscriptionOptions,
};
use postbox::config::Config;

fn restricted() -> Config {
    let mut config = common::test_config();
    let m = &mut config.mqtt;
    m.max_qos = 1;
    m.retain_available = false;
    m.max_packet_size = 2048;
    m.topic_alias_maximum = 5;
    m.wildcard_subscription_available = false;
    m.subscription_identifier_available = false;
    m.shared_subscription_available = false;
    m.max_keepalive = 30;
    config
}

fn no_problem_info(id: &str) -> Connect {
    let mut c = v5::connect_packet(id);
    c.properties.request_problem_information = Some(false);
    c
}

async fn subscribe_many(c: &mut RawClient, filters: &[&str], id: Option<u32>) -> SubAck {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: 3,
        subscription_identifier: id,
        filters: filters
            .iter()
            .map(|f| {
                let opts = SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                };
                ((*f).into(), opts)
            })
            .collect(),
        ..Default::default()
    }))
    .await;
    match c.recv().await {
        Some(Packet::SubAck(ack)) => ack,
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

#[tokio::test]
async fn connack_announces_the_configured_capabilities() {
    // MQTT-3.2.2-9 (Maximum QoS), v5 §3.2.2.3 (each property), MQTT-3.2.2-21 (Server Keep Alive)
    let server = common::start_with(restricted()).await;
    let (_c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("caps")).await;
    let p = ack.properties;
    assert_eq!(p.maximum_qos, Some(QoS::AtLeastOnce));
    assert_eq!(p.retain_available, Some(false));
    assert_eq!(p.maximum_packet_size, Some(2048));
    assert_eq!(p.topic_alias_maximum, Some(5));
    assert_eq!(p.wildcard_subscription_available, Some(false));
    assert_eq!(p.subscription_identifiers_available, Some(false));
    assert_eq!(p.shared_subscription_available, Some(false));
    assert_eq!(p.server_keep_alive, Some(30), "client asked for 60");

    // Defaults: everything available, so those properties are absent (absent = available).
    let server = common::start().await;
    let (_c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("caps-default")).await;
    let p = ack.properties;
    assert_eq!(p.maximum_qos, None);
    assert_eq!(p.retain_available, None);
    assert_eq!(p.wildcard_subscription_available, None);
    assert_eq!(p.subscription_identifiers_available, None);
    assert_eq!(p.shared_subscription_available, None);
    assert_eq!(p.server_keep_alive, None);
    assert_eq!(p.response_information, None);
}

#[tokio::test]
async fn keep_alive_zero_is_answered_with_the_maximum_even_at_the_default() {
    // MQTT-3.2.2-21 (list: -22): the client must use the Server Keep Alive it is given; v5
    // §3.1.2.10: 0 means no keep-alive, which `mqtt.max_keepalive` (default 65535) caps, so a
    // v5 client asking for none is told the maximum, as `config/postbox.toml` documents.
    let server = common::start().await;
    let mut connect = v5::connect_packet("keepalive-zero");
    connect.keep_alive = 0;
    let (_c, ack) = v5::connect(server.mqtt_addr, connect).await;
    assert_eq!(ack.properties.server_keep_alive, Some(u16::MAX));
    // A client within the maximum keeps its own value, and is not told one.
    let (_c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("keepalive-60")).await;
    assert_eq!(ack.properties.server_keep_alive, None);
    // 3.1.1 cannot be told: at the default maximum, keep-alive 0 is accepted as it is.
    let mut c = RawClient::open(server.mqtt_addr, ProtocolVersion::V3_1_1).await;
    let mut connect = v5::connect_packet("keepalive-zero-v3");
    connect.protocol = ProtocolVersion::V3_1_1;
    connect.keep_alive = 0;
    c.send(&Packet::Connect(Box::new(connect))).await;
    assert!(matches!(c.recv().await, Some(Packet::ConnAck(a)) if a.reason_code.0 == 0));
}

#[tokio::test]
async fn unavailable_features_are_refused_per_filter_in_suback() {
    // SUBACK 0xA2 (wildcards), 0xA1 (subscription identifiers), 0x9E (shared); MQTT-3.9.3-1
    // (order), MQTT-3.2.2-10 (QoS 2 requested, granted the maximum)
    let server = common::start_with(restricted()).await;
    let mut c = v5::connect_id(server.mqtt_addr, "refused").await;
    let ack = subscribe_many(
        &mut c,
        &["a/+", "a/b", "$share/g/a", "a/#", "$share/g/#"],
        None,
    )
    .await;
    assert_eq!(
        ack.reason_codes,
        [
            ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            ReasonCode::GRANTED_QOS_1,
            ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
            ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
        ]
    );
    assert!(
        ack.properties.reason_string.is_some(),
        "explained by default"
    );
    let ack = subscribe_many(&mut c, &["x", "y"], Some(5)).await;
    assert_eq!(
        ack.reason_codes,
        [ReasonCode::SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED; 2]
    );
    // 3.1.1 clients get the generic failure 0x80.
    let mut v3 = V4::connect(server.mqtt_addr, "refused-v3", true).await;
    let codes = v3.subscribe("a/#", rumqttc::QoS::AtLeastOnce).await;
    assert_eq!(codes, [rumqttc::SubscribeReasonCode::Failure]);
}

/// Sends a QoS 2 PUBLISH to a broker whose maximum QoS is 1 ([`restricted`]): it must answer
/// DISCONNECT 0x9B QoS not supported, returned for its properties.
async fn publish_above_the_maximum_qos(c: &mut RawClient) -> postbox::codec::Disconnect {
    c.send(&Packet::Publish(v5::publish_packet(
        "t",
        QoS::ExactlyOnce,
        b"x",
        1,
    )))
    .await;
    v5::expect_disconnect(c, ReasonCode::QOS_NOT_SUPPORTED).await
}

#[tokio::test]
async fn reason_strings_only_when_problem_information_is_requested() {
    // MQTT-3.1.2-29 (list: -32): with Request Problem Information 0, no Reason String on
    // SUBACK (and none on CONNACK / DISCONNECT either: Postbox takes the strict reading).
    let server = common::start_with(restricted()).await;
    let (mut quiet, _) = v5::connect(server.mqtt_addr, no_problem_info("quiet")).await;
    let ack = subscribe_many(&mut quiet, &["a/+"], None).await;
    assert_eq!(
        ack.reason_codes,
        [ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED]
    );
    assert_eq!(ack.properties.reason_string, None);
    let d = publish_above_the_maximum_qos(&mut quiet).await;
    assert_eq!(d.properties.reason_string, None);

    let mut chatty = v5::connect_id(server.mqtt_addr, "chatty").await;
    let d = publish_above_the_maximum_qos(&mut chatty).await;
    assert!(d.properties.reason_string.is_some());

    let mut config = common::test_config();
    config.auth.allow_anonymous = false;
    let server = common::start_with(config).await;
    for (connect, explained) in [
        (v5::connect_packet("anon"), true),
        (no_problem_info("anon"), false),
    ] {
        match v5::open(server.mqtt_addr, connect).await.1 {
            Some(Packet::ConnAck(ack)) => {
                assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED);
                assert!(!ack.session_present, "MQTT-3.2.2-6");
                assert_eq!(ack.properties.reason_string.is_some(), explained);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn response_information_only_when_requested_and_configured() {
    // MQTT-3.1.2-28 (list: -31): none unless the client asks (Request Response Information 1).
    let mut config = common::test_config();
    config.mqtt.response_information = Some("responses/".to_owned());
    let server = common::start_with(config).await;
    for (request, want) in [
        (Some(true), Some("responses/")),
        (Some(false), None),
        (None, None),
    ] {
        let mut connect = v5::connect_packet("ri");
        connect.properties.request_response_information = request;
        let (_c, ack) = v5::connect(server.mqtt_addr, connect).await;
        assert_eq!(
            ack.properties.response_information.as_deref(),
            want,
            "{request:?}"
        );
    }
    let server = common::start().await;
    let mut connect = v5::connect_packet("ri-none");
    connect.properties.request_response_information = Some(true);
    let (_c, ack) = v5::connect(server.mqtt_addr, connect).await;
    assert_eq!(ack.properties.response_information, None, "not configured");
}

#[tokio::test]
async fn maximum_qos_and_retain_available_are_enforced() {
    // MQTT-3.2.2-11 / -14 (client duties, enforced with 0x9B / 0x9A), MQTT-3.2.2-12 / -13
    // (a will beyond the capabilities is refused in CONNACK)
    let server = common::start_with(restricted()).await;
    let mut c = v5::connect_id(server.mqtt_addr, "ret").await;
    let mut p = v5::publish_packet("r", QoS::AtLeastOnce, b"x", 1);
    p.retain = true;
    c.send(&Packet::Publish(p)).await;
    v5::expect_disconnect(&mut c, ReasonCode::RETAIN_NOT_SUPPORTED).await;
    for (qos, retain, code) in [
        (QoS::ExactlyOnce, false, ReasonCode::QOS_NOT_SUPPORTED),
        (QoS::AtMostOnce, true, ReasonCode::RETAIN_NOT_SUPPORTED),
    ] {
        let mut connect = v5::connect_packet("bad-will");
        connect.will = Some(v5::will("w", b"x", qos, retain));
        match v5::open(server.mqtt_addr, connect).await.1 {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, code),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn packets_above_the_clients_maximum_packet_size_are_dropped() {
    // MQTT-3.1.2-24 / -25 (list: -27 / -28): never sent; the delivery counts as completed, so a
    // QoS 1 window of 1 is not blocked by it.
    let server = common::start().await;
    let mut connect = v5::connect_packet("small");
    connect.properties.maximum_packet_size = Some(64);
    connect.properties.receive_maximum = Some(1);
    let (mut sub, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut sub, "mp", QoS::AtLeastOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "mp-pub").await;
    v5::publish(
        &mut p,
        v5::publish_packet("mp", QoS::AtLeastOnce, &[b'x'; 100], 1),
    )
    .await;
    v5::publish(
        &mut p,
        v5::publish_packet("mp", QoS::AtLeastOnce, b"small", 1),
    )
    .await;
    let got = v5::receive(&mut sub).await;
    assert_eq!(&got.payload[..], b"small");
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn packets_above_our_maximum_packet_size_are_refused() {
    // v5 §3.2.2.3.6: the client must respect our Maximum Packet Size; DISCONNECT 0x95.
    let server = common::start_with(restricted()).await;
    let mut c = v5::connect_id(server.mqtt_addr, "big").await;
    c.send(&Packet::Publish(v5::publish_packet(
        "b",
        QoS::AtMostOnce,
        &[0; 4096],
        0,
    )))
    .await;
    v5::expect_disconnect(&mut c, ReasonCode::PACKET_TOO_LARGE).await;
}
