//! Durable state across broker restarts (in-process stop/start on the same data directory):
//! persistent sessions with their queues and in-flight messages, inbound QoS 2 ids, retained
//! messages, session expiry, and a corrupt store.

use crate::common;

use std::path::Path;

use common::rumq::V4;
use common::RawClient;
use postbox::codec::{Packet, ProtocolVersion, PubResponse, Publish, QoS as Q};
use postbox::config::Config;
use postbox::server::RunningServer;
use rumqttc::QoS;

const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

fn durable_config(dir: &Path) -> Config {
    let mut config = common::test_config();
    config.storage.persistence = true;
    config.storage.dir = Some(dir.to_path_buf());
    config
}

/// An in-process broker with its durable state in `dir` (a start, or a restart on what an
/// earlier one left there).
async fn start_on(dir: &Path) -> RunningServer {
    common::start_with(durable_config(dir)).await
}

/// Stops `server` (its store closed cleanly) and starts a broker again on `dir`.
async fn restart(server: RunningServer, dir: &Path) -> RunningServer {
    server.shutdown().await;
    start_on(dir).await
}

/// A new 3.1.1 client `publisher` publishes a marker (`m`, QoS 1) on `topic`, and it must be
/// the next thing `sub` receives: nothing else was queued for it (`why` says what).
async fn marker_comes_next(
    server: &RunningServer,
    sub: &mut V4,
    [publisher, topic]: [&str; 2],
    why: &str,
) {
    let mut publ = V4::connect(server.mqtt_addr, publisher, true).await;
    publ.publish(topic, QoS::AtLeastOnce, false, b"m").await;
    assert_eq!(sub.next_publish().await.topic, topic, "{why}");
}

/// A 3.1.1 persistent session (clean session 0) `id` subscribed to `filter` at `qos`, then
/// disconnected: what is published next is queued for it.
async fn leave_subscribed(server: &RunningServer, id: &str, filter: &str, qos: QoS) {
    let mut sub = V4::connect(server.mqtt_addr, id, false).await;
    sub.subscribe(filter, qos).await;
    sub.disconnect().await;
}

fn subscribe_packet(filter: &str, qos: Q) -> Packet {
    Packet::Subscribe(common::v5::subscribe_packet(1, filter, qos))
}

#[tokio::test]
async fn queued_messages_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    leave_subscribed(&server, "dash", "sensors/#", QoS::ExactlyOnce).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    for i in 0..10 {
        let qos = if i % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        publ.publish(
            &format!("sensors/{i}"),
            qos,
            false,
            format!("{i}").as_bytes(),
        )
        .await;
    }
    publ.disconnect().await;
    let server = restart(server, dir.path()).await;
    let mut sub = V4::connect(server.mqtt_addr, "dash", false).await;
    assert!(sub.session_present, "the session came back (MQTT-3.2.2-2)");
    for i in 0..10 {
        let p = sub.next_publish().await;
        assert_eq!(p.topic, format!("sensors/{i}"), "in order");
    }
    // The subscription itself survived too.
    let mut publ = V4::connect(server.mqtt_addr, "pub2", true).await;
    publ.publish("sensors/after", QoS::AtLeastOnce, false, b"live")
        .await;
    assert_eq!(sub.next_publish().await.topic, "sensors/after");
}

#[tokio::test]
async fn in_flight_message_is_resent_with_dup_after_restart() {
    // 5.0 MQTT-4.4.0-1 across a restart: same packet id, DUP = 1.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    let mut sub = RawClient::connect(server.mqtt_addr, V311, "raw", false).await;
    sub.send(&subscribe_packet("t", Q::ExactlyOnce)).await;
    assert!(matches!(sub.recv().await, Some(Packet::SubAck(_))));
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("t", QoS::ExactlyOnce, false, b"once").await;
    let first = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("{other:?}"),
    };
    drop(sub); // no PUBREC
    publ.disconnect().await;
    let server = restart(server, dir.path()).await;
    let mut sub = RawClient::connect(server.mqtt_addr, V311, "raw", false).await;
    match sub.recv().await {
        Some(Packet::Publish(p)) => {
            assert!(p.dup);
            assert_eq!(p.packet_id, first.packet_id);
            assert_eq!(p.payload, first.payload);
        }
        other => panic!("expected the PUBLISH again, got {other:?}"),
    }
    // Finish the handshake: PUBREC → PUBREL → PUBCOMP.
    sub.send(&Packet::PubRec(PubResponse::new(first.packet_id)))
        .await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == first.packet_id));
    sub.send(&Packet::PubComp(PubResponse::new(first.packet_id)))
        .await;
    sub.send(&Packet::PingReq).await; // answered after the PUBCOMP was handled
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    drop(sub);
    // Completed: not delivered a third time.
    let server = restart(server, dir.path()).await;
    let mut sub = RawClient::connect(server.mqtt_addr, V311, "raw", false).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("t", QoS::AtMostOnce, false, b"marker").await;
    match sub.recv().await {
        Some(Packet::Publish(p)) => assert_eq!(&p.payload[..], b"marker"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn inbound_qos2_is_deduplicated_across_a_restart() {
    // Exactly once: a PUBLISH re-sent after a restart, before PUBREL, is not forwarded again
    // (5.0 MQTT-4.3.3-10 held across the restart by the stored packet id).
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    leave_subscribed(&server, "sub", "x", QoS::ExactlyOnce).await;
    let mut publ = RawClient::connect(server.mqtt_addr, V311, "qos2-pub", false).await;
    let publish = common::v5::publish_packet("x", Q::ExactlyOnce, b"one", 5);
    publ.send(&Packet::Publish(publish.clone())).await;
    assert!(matches!(publ.recv().await, Some(Packet::PubRec(_))));
    drop(publ);
    let server = restart(server, dir.path()).await;
    let mut publ = RawClient::connect(server.mqtt_addr, V311, "qos2-pub", false).await;
    publ.send(&Packet::Publish(Publish {
        dup: true,
        ..publish
    }))
    .await;
    assert!(matches!(publ.recv().await, Some(Packet::PubRec(_))));
    publ.send(&Packet::PubRel(PubResponse::new(5))).await;
    match publ.recv().await {
        Some(Packet::PubComp(c)) => assert_eq!(c.reason_code.0, 0, "the id was known"),
        other => panic!("{other:?}"),
    }
    let mut sub = V4::connect(server.mqtt_addr, "sub", false).await;
    assert_eq!(&sub.next_publish().await.payload[..], b"one");
    let mut marker = V4::connect(server.mqtt_addr, "m", true).await;
    marker
        .publish("x", QoS::AtLeastOnce, false, b"marker")
        .await;
    assert_eq!(
        &sub.next_publish().await.payload[..],
        b"marker",
        "delivered exactly once"
    );
}

#[tokio::test]
async fn retained_messages_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("status/a", QoS::AtLeastOnce, true, b"up")
        .await;
    publ.publish("status/b", QoS::AtMostOnce, true, b"down")
        .await;
    publ.publish("status/b", QoS::AtLeastOnce, true, b"").await; // cleared
    publ.disconnect().await;
    let server = restart(server, dir.path()).await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    sub.subscribe("status/#", QoS::AtLeastOnce).await;
    let p = sub.next_publish().await;
    assert_eq!(
        (p.topic.as_str(), &p.payload[..], p.retain),
        ("status/a", &b"up"[..], true)
    );
    marker_comes_next(
        &server,
        &mut sub,
        ["pub", "status/marker"],
        "cleared retained stayed cleared",
    )
    .await;
}

#[tokio::test]
async fn expired_session_is_gone_after_restart() {
    // 5.0 MQTT-3.1.2-23 with downtime counted: the session ends once its expiry has passed.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    let mut opts = rumqttc::v5::MqttOptions::new("short", "127.0.0.1", server.mqtt_addr.port());
    opts.set_clean_start(false);
    opts.set_session_expiry_interval(Some(1));
    let c = common::rumq::V5::connect_with(opts).await;
    c.client
        .subscribe("a", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .expect("queued");
    let mut c = c;
    c.suback().await;
    c.client.disconnect().await.expect("queued");
    let mut keep = common::rumq::V5::connect_with({
        let mut o = rumqttc::v5::MqttOptions::new("long", "127.0.0.1", server.mqtt_addr.port());
        o.set_clean_start(false);
        o.set_session_expiry_interval(Some(3600));
        o
    })
    .await;
    keep.client
        .subscribe("a", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .expect("queued");
    keep.suback().await;
    keep.client.disconnect().await.expect("queued");
    server.shutdown().await;
    // Let the 1 s expiry lapse while the broker is down (the thing under test is elapsed time).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;

    let server = start_on(dir.path()).await;
    let mut short_opts =
        rumqttc::v5::MqttOptions::new("short", "127.0.0.1", server.mqtt_addr.port());
    short_opts.set_clean_start(false);
    short_opts.set_session_expiry_interval(Some(1));
    let short = common::rumq::V5::connect_with(short_opts).await;
    assert!(
        !short.connack.session_present,
        "expired while the broker was down"
    );
    let mut long_opts = rumqttc::v5::MqttOptions::new("long", "127.0.0.1", server.mqtt_addr.port());
    long_opts.set_clean_start(false);
    long_opts.set_session_expiry_interval(Some(3600));
    let long = common::rumq::V5::connect_with(long_opts).await;
    assert!(long.connack.session_present, "an unexpired session is kept");
}

#[tokio::test]
async fn corrupt_store_is_set_aside_and_the_broker_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    leave_subscribed(&server, "s", "t", QoS::AtLeastOnce).await;
    server.shutdown().await;

    // Flip bytes in every store file.
    let store_dir = dir.path().join("store");
    for entry in std::fs::read_dir(&store_dir).expect("store dir") {
        let path = entry.expect("entry").path();
        let mut bytes = std::fs::read(&path).expect("read");
        for b in bytes.iter_mut().step_by(7) {
            *b ^= 0x5A;
        }
        std::fs::write(&path, bytes).expect("write");
    }
    let server = start_on(dir.path()).await;
    let set_aside = std::fs::read_dir(dir.path())
        .expect("data dir")
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("store.corrupt-")
        });
    assert!(set_aside, "a copy of the damaged store was kept");
    // And it serves.
    let mut a = V4::connect(server.mqtt_addr, "a", true).await;
    let mut b = V4::connect(server.mqtt_addr, "b", true).await;
    a.subscribe("ok", QoS::AtLeastOnce).await;
    b.publish("ok", QoS::AtLeastOnce, false, b"yes").await;
    assert_eq!(&a.next_publish().await.payload[..], b"yes");
}

#[tokio::test]
async fn delayed_will_survives_a_restart() {
    // 5.0 MQTT-3.1.2-8: the will is published after the Will Delay Interval, even when the
    // broker restarts in between (the pending will is stored).
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_on(dir.path()).await;
    let mut connect = common::v5::connect_packet("dying");
    connect.clean_start = false;
    connect.properties.session_expiry_interval = Some(3600);
    connect.will = Some(postbox::codec::LastWill {
        topic: "wills/dying".into(),
        payload: "gone".into(),
        qos: Q::AtLeastOnce,
        retain: false,
        properties: postbox::codec::WillProperties {
            will_delay_interval: Some(2),
            ..Default::default()
        },
    });
    let (dying, _) = common::v5::connect(server.mqtt_addr, connect).await;
    drop(dying); // abnormal close: the will waits for its delay
                 // Stop the broker only once it has seen the close (bounded wait on observable state).
    let deadline = std::time::Instant::now() + common::WAIT;
    while server.broker.is_connected("dying") {
        assert!(std::time::Instant::now() < deadline, "close never noticed");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let server = restart(server, dir.path()).await;
    let mut watcher = V4::connect(server.mqtt_addr, "watcher", true).await;
    watcher.subscribe("wills/#", QoS::AtLeastOnce).await;
    let will = watcher.next_publish().await;
    assert_eq!(
        (will.topic.as_str(), &will.payload[..]),
        ("wills/dying", &b"gone"[..])
    );
}

#[tokio::test]
async fn messages_dropped_for_room_stay_dropped_after_a_restart() {
    // drop-oldest with a byte bound: one 9-byte message pushes out three 3-byte ones. Every
    // one of them leaves the store too, or a restart would bring them back ahead of it.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = durable_config(dir.path());
    config.mqtt.max_queued_bytes = 10;
    config.mqtt.queue_overflow = postbox::config::OverflowPolicy::DropOldest;
    let server = common::start_with(config.clone()).await;
    leave_subscribed(&server, "slow", "q/#", QoS::AtLeastOnce).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    for payload in [&b"aaa"[..], b"bbb", b"ccc", b"ddddddddd"] {
        publ.publish("q/m", QoS::AtLeastOnce, false, payload).await;
    }
    publ.disconnect().await;
    server.shutdown().await;

    let server = common::start_with(config).await;
    let mut sub = V4::connect(server.mqtt_addr, "slow", false).await;
    assert!(sub.session_present);
    assert_eq!(&sub.next_publish().await.payload[..], b"ddddddddd");
    marker_comes_next(
        &server,
        &mut sub,
        ["pub2", "q/marker"],
        "nothing else was queued",
    )
    .await;
}
