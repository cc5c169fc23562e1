//! MQTT 5 subscription options over real sockets: Retain Handling 0/1/2, replacing a
//! subscription, and subscription identifiers on retained messages.
//!
//! Statement ids follow the OASIS MQTT 5.0 text.

use crate::common;

use std::time::Duration;

use common::v5;
use common::RawClient;
use postbox::codec::{QoS, ReasonCode, SubscriptionOptions};
use postbox::server::RunningServer;

async fn with_retained(topic: &str) -> RunningServer {
    let server = common::start().await;
    let mut p = v5::connect_id(server.mqtt_addr, "rh-pub").await;
    let mut retained = v5::publish_packet(topic, QoS::AtLeastOnce, b"kept", 1);
    retained.retain = true;
    v5::publish(&mut p, retained).await;
    server
}

async fn sub_rh(c: &mut RawClient, filter: &str, retain_handling: u8, id: Option<u32>) {
    let opts = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        retain_handling,
        ..Default::default()
    };
    let ack = v5::subscribe_with(c, filter, opts, id).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_1]);
}

async fn expect_retained(c: &mut RawClient) {
    let got = v5::receive(c).await;
    assert!(
        got.retain,
        "RETAIN=1 on a retained message sent on subscribe"
    );
    assert_eq!(&got.payload[..], b"kept");
}

#[tokio::test]
async fn retain_handling_0_sends_on_every_subscribe() {
    // MQTT-3.3.1-9, MQTT-3.8.4-4 (re-sent when the subscription is replaced)
    let server = with_retained("rh/0").await;
    let mut c = v5::connect_id(server.mqtt_addr, "rh0").await;
    sub_rh(&mut c, "rh/0", 0, None).await;
    expect_retained(&mut c).await;
    sub_rh(&mut c, "rh/0", 0, None).await;
    expect_retained(&mut c).await;
}

#[tokio::test]
async fn retain_handling_1_sends_only_for_a_new_subscription() {
    // MQTT-3.3.1-10
    let server = with_retained("rh/1").await;
    let mut c = v5::connect_id(server.mqtt_addr, "rh1").await;
    sub_rh(&mut c, "rh/1", 1, None).await;
    expect_retained(&mut c).await;
    sub_rh(&mut c, "rh/1", 1, None).await;
    v5::expect_silence(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn retain_handling_2_never_sends() {
    // MQTT-3.3.1-11
    let server = with_retained("rh/2").await;
    let mut c = v5::connect_id(server.mqtt_addr, "rh2").await;
    sub_rh(&mut c, "rh/2", 2, None).await;
    v5::expect_silence(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn retained_messages_carry_the_subscription_identifier() {
    // MQTT-3.3.4-3: sent as a result of the subscription, so with its identifier.
    let server = with_retained("rh/id").await;
    let mut c = v5::connect_id(server.mqtt_addr, "rhid").await;
    sub_rh(&mut c, "rh/+", 0, Some(17)).await;
    let got = v5::receive(&mut c).await;
    assert!(got.retain);
    assert_eq!(got.properties.subscription_identifiers.to_vec(), [17]);
}

#[tokio::test]
async fn a_repeated_subscribe_replaces_options_and_identifier() {
    // MQTT-3.8.4-3: the new subscription completely replaces the old one.
    let server = common::start().await;
    let mut c = v5::connect_id(server.mqtt_addr, "replace").await;
    sub_rh(&mut c, "rp", 2, Some(1)).await;
    let opts = SubscriptionOptions {
        qos: QoS::AtMostOnce,
        retain_handling: 2,
        ..Default::default()
    };
    let ack = v5::subscribe_with(&mut c, "rp", opts, Some(2)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_0]);
    let mut p = v5::connect_id(server.mqtt_addr, "replace-pub").await;
    v5::publish(&mut p, v5::publish_packet("rp", QoS::AtLeastOnce, b"x", 1)).await;
    let got = v5::expect_publish(&mut c).await;
    assert_eq!(got.qos, QoS::AtMostOnce, "new granted QoS");
    assert_eq!(
        got.properties.subscription_identifiers.to_vec(),
        [2],
        "new identifier only"
    );
    v5::expect_silence(&mut c, Duration::from_millis(200)).await;
}
