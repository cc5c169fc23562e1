//! The broker's own limits on what one client may ask for (issue 13, "Limits"): topic length
//! and levels (`mqtt.max_topic_length`, `max_topic_levels`) and subscriptions per client
//! (`mqtt.max_subscriptions_per_client`). Each refusal uses the code MQTT 5 has for "correctly
//! formed, but not accepted" and closes nothing it need not.

use postbox::codec::{Packet, ProtocolVersion, QoS, ReasonCode};

use crate::common;
use common::async_process::BrokerProcess;
use common::{v5, RawClient};

/// A topic of `levels` levels.
fn deep(levels: usize) -> String {
    vec!["l"; levels].join("/")
}

/// PUBLISH over `max_topic_levels` / `max_topic_length`: v5 QoS 1 gets PUBACK 0x90 Topic Name
/// invalid ("correctly formed, but not accepted", v5 §3.4.2.1) and stays connected; v5 QoS 0
/// has no ack and gets DISCONNECT 0x90; 3.1.1 has no negative ack and is closed without a
/// PUBACK. Nothing refused reaches a subscriber. One level under the limit passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_over_the_topic_limits_is_refused_with_0x90() {
    let broker = BrokerProcess::spawn("", "max_topic_levels = 8\nmax_topic_length = 40").await;
    let mut sub = v5::subscriber(broker.addr, "watcher", "#", QoS::AtLeastOnce).await;
    let mut c = v5::connect_id(broker.addr, "deep-publisher").await;
    assert_eq!(
        v5::publish_qos1(&mut c, &deep(9), b"x", 1).await,
        ReasonCode::TOPIC_NAME_INVALID,
        "9 levels over 8"
    );
    let long = "a".repeat(41);
    assert_eq!(
        v5::publish_qos1(&mut c, &long, b"x", 2).await,
        ReasonCode::TOPIC_NAME_INVALID,
        "41 bytes over 40"
    );
    assert_eq!(
        v5::publish_qos1(&mut c, &deep(8), b"ok", 3).await,
        ReasonCode::SUCCESS,
        "8 levels are allowed"
    );
    let got = v5::receive(&mut sub).await;
    assert_eq!(&got.payload[..], b"ok", "only the accepted message arrives");

    c.send(&Packet::Publish(v5::publish_packet(
        &deep(9),
        QoS::AtMostOnce,
        b"x",
        0,
    )))
    .await;
    v5::expect_disconnect(&mut c, ReasonCode::TOPIC_NAME_INVALID).await;

    common::expect_v311_publish_refused(
        broker.addr,
        "old",
        &deep(9),
        b"x",
        9,
        "no PUBACK for a refused 3.1.1 PUBLISH",
    )
    .await;
}

/// A SUBSCRIBE filter over the limits gets 0x8F Topic Filter invalid for that filter only
/// (v5 §3.9.3; 3.1.1 0x80 Failure, MQTT-3.9.3-2), and the connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_over_the_topic_limits_gets_0x8f_and_3x_0x80() {
    let broker = BrokerProcess::spawn("", "max_topic_levels = 4").await;
    let mut c = v5::connect_id(broker.addr, "deep-subscriber").await;
    let ack = v5::subscribe_with(&mut c, "a/b/c/d/#", v5::options(QoS::AtLeastOnce), None).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::TOPIC_FILTER_INVALID]);
    let ack = v5::subscribe_with(&mut c, "a/b/c/#", v5::options(QoS::AtLeastOnce), None).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::GRANTED_QOS_1]);

    let mut old = RawClient::connect(broker.addr, ProtocolVersion::V3_1_1, "old-sub", true).await;
    old.send(&Packet::Subscribe(postbox::codec::Subscribe {
        packet_id: 5,
        filters: vec![("a/b/c/d/e".into(), v5::options(QoS::AtMostOnce))],
        ..Default::default()
    }))
    .await;
    match old.recv().await {
        Some(Packet::SubAck(ack)) => assert_eq!(ack.reason_codes, vec![ReasonCode(0x80)]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// `max_subscriptions_per_client = 2`: a third filter gets 0x97 Quota exceeded; subscribing
/// again to a filter held replaces it (MQTT-3.8.4-3) and is granted; after an UNSUBSCRIBE
/// there is room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_beyond_the_per_client_limit_get_quota_exceeded() {
    let broker = BrokerProcess::spawn("", "max_subscriptions_per_client = 2").await;
    let mut c = v5::subscriber(broker.addr, "collector", "one", QoS::AtLeastOnce).await;
    v5::subscribe(&mut c, "two", QoS::AtLeastOnce).await;
    let ack = v5::subscribe_with(&mut c, "three", v5::options(QoS::AtLeastOnce), None).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::QUOTA_EXCEEDED]);
    let ack = v5::subscribe_with(&mut c, "two", v5::options(QoS::AtMostOnce), None).await;
    assert_eq!(
        ack.reason_codes,
        vec![ReasonCode::GRANTED_QOS_0],
        "a replacement fits"
    );
    c.send(&Packet::Unsubscribe(postbox::codec::Unsubscribe {
        packet_id: 9,
        filters: vec!["one".into()],
        ..Default::default()
    }))
    .await;
    loop {
        match c.recv().await {
            Some(Packet::UnsubAck(_)) => break,
            Some(_) => {}
            None => panic!("closed before UNSUBACK"),
        }
    }
    let ack = v5::subscribe_with(&mut c, "three", v5::options(QoS::AtLeastOnce), None).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::GRANTED_QOS_1]);
}

/// A will whose topic is over the limits is refused at CONNECT with 0x90 (v5 §3.2.2.2: "The
/// Will Topic is correctly formed, but is not accepted").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_over_the_topic_limits_is_refused_at_connect() {
    let broker = BrokerProcess::spawn("", "max_topic_levels = 3").await;
    let mut connect = v5::connect_packet("deep-will");
    connect.will = Some(v5::will(&deep(4), b"bye", QoS::AtMostOnce, false));
    let (_c, first) = v5::open(broker.addr, connect).await;
    match first {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::TOPIC_NAME_INVALID),
        other => panic!("expected CONNACK 0x90, got {other:?}"),
    }
}

/// Issue 37, item 6: the default largest packet is an eighth of `max_memory` ("auto"; 80 MiB
/// here: 10 MiB, announced as Maximum Packet Size in CONNACK, v5 §3.2.2.3.6), at most the
/// protocol's maximum, so a 5 MB message (refused by the old fixed 1 MiB, which paho and
/// MQTT.js then sent again after every reconnect, forever) is accepted. A packet over it
/// gets DISCONNECT 0x95 Packet too large (MQTT-3.2.2-15 for the client side; v5 §3.14.2.1),
/// each time counted in `postbox_packets_too_large_total`, but logged once per client id,
/// not once per retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_packet_bound_is_an_eighth_of_the_budget_and_a_refusal_is_logged_once() {
    const TOLD: &str = "over mqtt.max_packet_size; many client libraries";
    let broker = BrokerProcess::spawn("", "max_memory = 83886080").await;
    let (mut c, ack) = v5::connect(broker.addr, v5::connect_packet("big-sender")).await;
    assert_eq!(
        ack.properties.maximum_packet_size,
        Some(10_485_760),
        "{ack:?}"
    );
    let code = v5::publish_qos1(&mut c, "big/t", &vec![b'x'; 5_000_000], 1).await;
    assert!(!code.is_error(), "a 5 MB message: {code:?}");
    let too_large = vec![b'y'; 11_000_000];
    for attempt in 0..2u8 {
        if attempt > 0 {
            (c, _) = v5::connect(broker.addr, v5::connect_packet("big-sender")).await;
        }
        let publish = v5::publish_packet("big/t", QoS::AtLeastOnce, &too_large, 2);
        c.send(&Packet::Publish(publish)).await;
        let seen = c.expect_close().await;
        assert!(
            matches!(seen.last(), Some(Packet::Disconnect(d)) if d.reason_code == ReasonCode::PACKET_TOO_LARGE),
            "attempt {attempt}: {seen:?}"
        );
    }
    broker
        .wait_metric("postbox_packets_too_large_total", |n| n >= 2.0)
        .await;
    broker.wait_log(|l| l.contains(TOLD)).await;
    let told = broker.logs().iter().filter(|l| l.contains(TOLD)).count();
    assert_eq!(told, 1, "logged once for the client id");
}
