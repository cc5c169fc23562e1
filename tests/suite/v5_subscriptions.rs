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

/// A server holding the retained message `kept` on `topic`, and a v5 client `client_id`
/// connected to it that has not subscribed yet: the retained message is what its subscribe
/// may bring.
async fn with_retained(topic: &str, client_id: &str) -> (RunningServer, RawClient) {
    let server = common::start().await;
    let mut p = v5::connect_id(server.mqtt_addr, "rh-pub").await;
    let mut retained = v5::publish_packet(topic, QoS::AtLeastOnce, b"kept", 1);
    retained.retain = true;
    v5::publish(&mut p, retained).await;
    let c = v5::connect_id(server.mqtt_addr, client_id).await;
    (server, c)
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

/// Subscribes `c` to `filter` with `retain_handling`, receives the retained message the new
/// subscription brings (MQTT-3.3.1-9, -10), then subscribes again with the same options: what
/// follows that second subscribe is what the caller checks.
async fn subscribe_again_after_the_retained(c: &mut RawClient, filter: &str, retain_handling: u8) {
    sub_rh(c, filter, retain_handling, None).await;
    expect_retained(c).await;
    sub_rh(c, filter, retain_handling, None).await;
}

#[tokio::test]
async fn retain_handling_0_sends_on_every_subscribe() {
    // MQTT-3.3.1-9, MQTT-3.8.4-4 (re-sent when the subscription is replaced)
    let (_server, mut c) = with_retained("rh/0", "rh0").await;
    subscribe_again_after_the_retained(&mut c, "rh/0", 0).await;
    expect_retained(&mut c).await;
}

#[tokio::test]
async fn retain_handling_1_sends_only_for_a_new_subscription() {
    // MQTT-3.3.1-10
    let (_server, mut c) = with_retained("rh/1", "rh1").await;
    subscribe_again_after_the_retained(&mut c, "rh/1", 1).await;
    v5::expect_silence(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn retain_handling_2_never_sends() {
    // MQTT-3.3.1-11
    let (_server, mut c) = with_retained("rh/2", "rh2").await;
    sub_rh(&mut c, "rh/2", 2, None).await;
    v5::expect_silence(&mut c, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn retained_messages_carry_the_subscription_identifier() {
    // MQTT-3.3.4-3: sent as a result of the subscription, so with its identifier.
    let (_server, mut c) = with_retained("rh/id", "rhid").await;
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
