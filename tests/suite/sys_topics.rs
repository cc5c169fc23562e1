//! `$SYS` topics (`mqtt.sys_interval`): the broker's figures under Mosquitto's names, read
//! with a real `mosquitto_sub`, after real traffic.
//!
//! Normative statements: MQTT-4.7.2-1 (`#` and `+` never match topics starting with `$`),
//! v5 §3.4.2.1 (PUBACK 0x87 Not authorized for a topic the client may not publish to).

use std::time::Duration;

use postbox::codec::{ProtocolVersion, QoS, ReasonCode};
use postbox::server::RunningServer;
use rumqttc::QoS as RQoS;

use crate::common::mosquitto::MosquittoSub;
use crate::common::rumq::V4;
use crate::common::{self, v5, RawClient};

/// Short: only for "must not arrive" checks, after a later message proved the path works.
const QUIET: Duration = Duration::from_millis(300);

async fn start(sys_interval: u32) -> RunningServer {
    let mut config = common::test_config();
    config.mqtt.sys_interval = sys_interval;
    common::start_with(config).await
}

/// What a `$SYS` value must be, checked on its payload.
type Accept = fn(&str) -> bool;

fn is(expected: u64) -> impl Fn(&str) -> bool {
    move |payload| payload.parse::<u64>().ok() == Some(expected)
}

/// Publishes a QoS 1 message on `topic` from a new client `p` and asserts that it is what
/// `reader` receives first: nothing else was routed to it before.
async fn first_received_is(addr: std::net::SocketAddr, reader: &mut RawClient, topic: &str) {
    let mut publ = RawClient::connect(addr, ProtocolVersion::V5, "p", true).await;
    v5::publish(
        &mut publ,
        v5::publish_packet(topic, QoS::AtLeastOnce, b"x", 1),
    )
    .await;
    assert_eq!(&*v5::receive(reader).await.topic, topic);
}

#[tokio::test]
async fn sys_values_read_with_mosquitto_sub_match_the_traffic() {
    let server = start(1).await;
    let addr = server.mqtt_addr;
    let mut sub = V4::connect(addr, "sys-sub", true).await;
    sub.subscribe("t/#", RQoS::AtLeastOnce).await;
    let mut publ = V4::connect(addr, "sys-pub", true).await;
    for i in 0..7 {
        publ.publish("t/x", RQoS::AtLeastOnce, i == 6, format!("m{i}").as_bytes())
            .await;
    }
    for _ in 0..7 {
        sub.next_publish().await;
    }

    let mut watcher = MosquittoSub::spawn(addr.port(), &["-v", "-t", "$SYS/broker/#"]);
    let version = watcher
        .wait_for_value("$SYS/broker/version", |_| true)
        .await;
    assert!(version.starts_with("postbox version "), "{version}");
    for (topic, count) in [
        ("$SYS/broker/publish/messages/received", 7),
        ("$SYS/broker/messages/received", 7),
        // sys-sub, sys-pub and mosquitto_sub itself.
        ("$SYS/broker/clients/connected", 3),
        ("$SYS/broker/clients/total", 3),
        ("$SYS/broker/clients/maximum", 3),
        // t/# and $SYS/broker/#.
        ("$SYS/broker/subscriptions/count", 2),
    ] {
        watcher.wait_for_value(topic, is(count)).await;
    }
    let lower_bounds: [(&str, Accept); 3] = [
        // The 7 deliveries to sys-sub, and the $SYS values mosquitto_sub got since.
        ("$SYS/broker/publish/messages/sent", |p| {
            p.parse::<u64>().is_ok_and(|n| n >= 7)
        }),
        ("$SYS/broker/bytes/received", |p| {
            p.parse::<u64>().is_ok_and(|n| n > 7 * 6)
        }),
        ("$SYS/broker/load/publish/received/1min", |p| {
            p.parse::<f64>().is_ok_and(|n| n > 0.0)
        }),
    ];
    for (topic, accept) in lower_bounds {
        watcher.wait_for_value(topic, accept).await;
    }
    let uptime = watcher
        .wait_for_value("$SYS/broker/uptime", |p| p.ends_with(" seconds"))
        .await;
    assert!(uptime.trim_end_matches(" seconds").parse::<u64>().is_ok());

    // A client leaves: the figures follow.
    publ.disconnect().await;
    watcher
        .wait_for_value("$SYS/broker/clients/connected", is(2))
        .await;
}

#[tokio::test]
async fn clients_cannot_publish_under_sys() {
    let server = start(1).await;
    let mut client =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V5, "forger", true).await;
    // v5 §3.4.2.1: refused with 0x87, and nothing is stored.
    let mut forged = v5::publish_packet("$SYS/broker/forged", QoS::AtLeastOnce, b"1", 3);
    forged.retain = true;
    assert_eq!(
        v5::publish(&mut client, forged).await,
        ReasonCode::NOT_AUTHORIZED
    );
    // 3.1.1 cannot be told: acknowledged and dropped, also at QoS 0.
    let mut old =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "forger-3", true).await;
    let mut q1 = v5::publish_packet("$SYS/broker/forged", QoS::AtLeastOnce, b"2", 4);
    q1.retain = true;
    assert_eq!(v5::publish(&mut old, q1).await, ReasonCode::SUCCESS);
    let mut q0 = v5::publish_packet("$SYS/broker/forged", QoS::AtMostOnce, b"3", 0);
    q0.retain = true;
    v5::publish(&mut old, q0).await;

    // A subscriber to the topic and to a marker: the marker is the first thing it gets, so no
    // forged value was retained or routed.
    let mut reader =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V5, "reader", true).await;
    v5::subscribe(&mut reader, "$SYS/broker/forged", QoS::AtLeastOnce).await;
    v5::subscribe(&mut reader, "marker", QoS::AtLeastOnce).await;
    let marker = v5::publish_packet("marker", QoS::AtLeastOnce, b"end", 5);
    v5::publish(&mut client, marker).await;
    let first = v5::receive(&mut reader).await;
    assert_eq!(&*first.topic, "marker");
    v5::expect_silence(&mut reader, QUIET).await;
}

#[tokio::test]
async fn wildcards_do_not_match_sys_and_zero_turns_it_off() {
    // MQTT-4.7.2-1: a `#` subscriber never gets the $SYS values.
    let server = start(1).await;
    let mut all = RawClient::connect(server.mqtt_addr, ProtocolVersion::V5, "all", true).await;
    v5::subscribe(&mut all, "#", QoS::AtMostOnce).await;
    let mut watcher =
        MosquittoSub::spawn(server.mqtt_addr.port(), &["-v", "-t", "$SYS/broker/uptime"]);
    let first = watcher.wait_for_value("$SYS/broker/uptime", |_| true).await;
    // A later round (the uptime changes every round) went by too.
    watcher
        .wait_for_value("$SYS/broker/uptime", |p| p != first)
        .await;
    first_received_is(server.mqtt_addr, &mut all, "after").await;

    // sys_interval = 0: no $SYS values at all.
    let quiet = start(0).await;
    let mut reader = RawClient::connect(quiet.mqtt_addr, ProtocolVersion::V5, "r", true).await;
    v5::subscribe(&mut reader, "$SYS/#", QoS::AtMostOnce).await;
    v5::subscribe(&mut reader, "marker", QoS::AtMostOnce).await;
    first_received_is(quiet.mqtt_addr, &mut reader, "marker").await;
}

#[tokio::test]
async fn the_acl_decides_who_reads_sys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::test_config();
    config.mqtt.sys_interval = 1;
    common::set_acl(
        &mut config,
        dir.path(),
        "user ops\ntopic read $SYS/broker/clients/#\ntopic readwrite marker\n",
    );
    let server = common::start_with(config).await;
    // `ops` may read part of $SYS: the subscription is granted and filtered per delivery.
    let mut ops = MosquittoSub::spawn(
        server.mqtt_addr.port(),
        &["-v", "-u", "ops", "-t", "$SYS/#", "-t", "marker"],
    );
    ops.wait_for_value("$SYS/broker/clients/connected", |_| true)
        .await;
    // After the next round (a new client connects), the uptime it was never given.
    let _other = RawClient::connect(server.mqtt_addr, ProtocolVersion::V5, "other", true).await;
    ops.wait_for_value("$SYS/broker/clients/connected", is(2))
        .await;
    common::mosquitto::mosquitto_pub(
        server.mqtt_addr.port(),
        &["-u", "ops", "-t", "marker", "-m", "end", "-q", "1"],
    )
    .await;
    ops.wait_for("marker end").await;
    // Every $SYS value it was given is under clients/ (the uptime, say, changed every round).
    let outside: Vec<&String> = ops
        .consumed()
        .iter()
        .filter(|l| l.starts_with("$SYS/") && !l.starts_with("$SYS/broker/clients/"))
        .collect();
    assert!(
        outside.is_empty(),
        "ops may read only $SYS/broker/clients/#: {outside:?}"
    );

    // Anonymous may read nothing: SUBACK 0x87.
    let mut anon = RawClient::connect(server.mqtt_addr, ProtocolVersion::V5, "anon", true).await;
    let ack = v5::subscribe_with(
        &mut anon,
        "$SYS/#",
        postbox::codec::SubscriptionOptions::default(),
        None,
    )
    .await;
    assert_eq!(ack.reason_codes[0], ReasonCode::NOT_AUTHORIZED);
}
