//! MQTT 5 session expiry and message expiry over real sockets.
//!
//! Statement ids follow the OASIS MQTT 5.0 text; where `/work/shared/spec`'s list numbers one
//! differently, its number is given as "list: …".

use crate::common;

use std::time::{Duration, Instant};

use common::v5;
use common::WAIT;
use postbox::codec::{
    Connect, Disconnect, DisconnectProperties, PublishProperties, QoS, ReasonCode,
};
use postbox::server::RunningServer;

fn resume(id: &str, expiry: u32) -> Connect {
    let mut c = v5::connect_packet(id);
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(expiry);
    c
}

/// Polls `cond` every 20 ms until it holds; panics after `WAIT`.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connects with `connect` (a session that outlives its connection), subscribes to `filter`
/// at QoS 1 and disconnects normally: a subscriber left offline, for what is published next
/// to queue for it.
async fn subscribe_and_leave(server: &RunningServer, connect: Connect, filter: &str) {
    let (mut sub, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut sub, filter, QoS::AtLeastOnce).await;
    v5::disconnect(sub).await;
}

/// Publishes one QoS 1 message from a throwaway client (whose session ends at once).
async fn publish(server: &RunningServer, topic: &str, payload: &[u8], props: PublishProperties) {
    let mut p = v5::connect_id(server.mqtt_addr, "expiry-pub").await;
    v5::publish_props(&mut p, topic, QoS::AtLeastOnce, payload, props).await;
    v5::disconnect(p).await;
}

#[tokio::test]
async fn an_expired_session_is_discarded_with_its_queue() {
    // MQTT-4.1.0-2 (discarded once the interval has passed), MQTT-3.2.2-3 (Session Present 0)
    let server = common::start().await;
    subscribe_and_leave(&server, resume("se-short", 1), "se/short").await;
    let closed = Instant::now();
    publish(&server, "se/short", b"queued", PublishProperties::default()).await;
    wait_until("the session expired", || server.broker.session_count() == 0).await;
    assert!(
        closed.elapsed() >= Duration::from_millis(950),
        "{:?}",
        closed.elapsed()
    );
    let (mut sub, ack) = v5::connect(server.mqtt_addr, resume("se-short", 1)).await;
    assert!(!ack.session_present);
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_session_within_its_expiry_keeps_its_queue() {
    // MQTT-3.1.2-23 (list: -25): session state is kept after the connection closes.
    let server = common::start().await;
    subscribe_and_leave(&server, resume("se-long", 30), "se/long").await;
    publish(&server, "se/long", b"queued", PublishProperties::default()).await;
    let (mut sub, ack) = v5::connect(server.mqtt_addr, resume("se-long", 30)).await;
    assert!(ack.session_present, "MQTT-3.2.2-3");
    assert_eq!(&v5::receive(&mut sub).await.payload[..], b"queued");
}

#[tokio::test]
async fn expiry_0xffffffff_never_expires_and_the_cap_applies() {
    // v5 §3.1.2.11.2: 0xFFFFFFFF = the session does not expire; the broker's cap
    // (mqtt.session_expiry_interval_max) is announced in CONNACK when it lowers the request.
    // These clients are anonymous: their own cap (mqtt.max_session_expiry_anonymous, one day
    // by default, see `client_bounds`) is lifted here.
    let mut config = common::test_config();
    config.mqtt.max_session_expiry_anonymous = u32::MAX;
    let server = common::start_with(config).await;
    let (sub, ack) = v5::connect(server.mqtt_addr, resume("se-never", u32::MAX)).await;
    assert_eq!(
        ack.properties.session_expiry_interval, None,
        "granted as asked"
    );
    v5::disconnect(sub).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(server.broker.session_count(), 1);
    let (_sub, ack) = v5::connect(server.mqtt_addr, resume("se-never", u32::MAX)).await;
    assert!(ack.session_present);

    let mut config = common::test_config();
    config.mqtt.session_expiry_interval_max = 1;
    let server = common::start_with(config).await;
    let (sub, ack) = v5::connect(server.mqtt_addr, resume("se-capped", u32::MAX)).await;
    assert_eq!(ack.properties.session_expiry_interval, Some(1));
    v5::disconnect(sub).await;
    wait_until("the capped session expired", || {
        server.broker.session_count() == 0
    })
    .await;
}

#[tokio::test]
async fn disconnect_can_shorten_but_not_extend_a_zero_expiry() {
    // v5 §3.14.2.2.2: DISCONNECT may change the interval, except from 0 (Protocol Error).
    let server = common::start().await;
    let (sub, _) = v5::connect(server.mqtt_addr, resume("se-end", 60)).await;
    v5::disconnect_with(
        sub,
        Disconnect {
            reason_code: ReasonCode::NORMAL_DISCONNECTION,
            properties: DisconnectProperties {
                session_expiry_interval: Some(0),
                ..Default::default()
            },
        },
    )
    .await;
    wait_until("the session ended at once", || {
        server.broker.session_count() == 0
    })
    .await;

    let (mut c, _) = v5::connect(server.mqtt_addr, v5::connect_packet("se-zero")).await;
    c.send(&postbox::codec::Packet::Disconnect(Disconnect {
        reason_code: ReasonCode::NORMAL_DISCONNECTION,
        properties: DisconnectProperties {
            session_expiry_interval: Some(30),
            ..Default::default()
        },
    }))
    .await;
    v5::expect_disconnect(&mut c, ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn message_expiry_drops_while_queued_and_forwards_the_remaining_interval() {
    // MQTT-3.3.2-5 (expired while queued: not delivered), MQTT-3.3.2-6 (remaining interval)
    let server = common::start().await;
    subscribe_and_leave(&server, resume("me-sub", 60), "me/#").await;
    let expiring = |secs| PublishProperties {
        message_expiry_interval: Some(secs),
        ..Default::default()
    };
    publish(&server, "me/short", b"short", expiring(1)).await;
    publish(&server, "me/long", b"long", expiring(30)).await;
    publish(&server, "me/none", b"none", PublishProperties::default()).await;
    // A retained message that expires is not sent to later subscribers either.
    let mut p = v5::connect_id(server.mqtt_addr, "me-ret").await;
    let mut retained = v5::publish_packet("me-retained", QoS::AtLeastOnce, b"r", 1);
    retained.retain = true;
    retained.properties = expiring(1);
    v5::publish(&mut p, retained).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (mut sub, ack) = v5::connect(server.mqtt_addr, resume("me-sub", 60)).await;
    assert!(ack.session_present);
    let long = v5::receive(&mut sub).await;
    assert_eq!(&long.payload[..], b"long", "the expired one was dropped");
    let left = long
        .properties
        .message_expiry_interval
        .expect("interval forwarded");
    assert!(
        (1..=29).contains(&left),
        "30 s minus the time queued, got {left}"
    );
    let none = v5::receive(&mut sub).await;
    assert_eq!(&none.payload[..], b"none");
    assert_eq!(none.properties.message_expiry_interval, None);
    v5::subscribe(&mut sub, "me-retained", QoS::AtLeastOnce).await;
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
}
