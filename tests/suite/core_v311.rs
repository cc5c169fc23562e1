//! Core broker behaviour over real sockets with rumqttc (MQTT 3.1.1) and a raw byte client.
//! Normative statements are cited as "3.1.1 MQTT-x" or "5.0 MQTT-x" (their numbering differs).

use crate::common;

use common::rumq::V4;
use common::{RawClient, WAIT};
use postbox::codec::{Packet, ProtocolVersion, PubResponse, Publish, QoS as Q};
use rumqttc::QoS;

/// Publishes a marker and returns once it arrives: every earlier message on the same path has
/// then been delivered (ordered topics, 5.0 MQTT-4.6.0-6), so "nothing else arrived" is checkable.
async fn drain_until_marker(sub: &mut V4, publ: &mut V4, topic: &str) -> Vec<rumqttc::Publish> {
    publ.publish(topic, QoS::AtLeastOnce, false, b"__marker__")
        .await;
    let mut seen = Vec::new();
    loop {
        let p = sub.next_publish().await;
        if &p.payload[..] == b"__marker__" {
            return seen;
        }
        seen.push(p);
    }
}

#[tokio::test]
async fn qos_0_1_2_round_trip() {
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("t/#", QoS::ExactlyOnce).await;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        publ.publish(&format!("t/{i}"), qos, false, format!("m{i}").as_bytes())
            .await;
        let p = sub.next_publish().await;
        assert_eq!(p.topic, format!("t/{i}"));
        assert_eq!(&p.payload[..], format!("m{i}").as_bytes());
        assert_eq!(p.qos, qos);
    }
}

#[tokio::test]
async fn delivery_qos_is_min_of_publish_and_granted() {
    // 5.0 MQTT-3.8.4-8 / 3.1.1 MQTT-3.8.4-6
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("a", QoS::AtLeastOnce).await;
    publ.publish("a", QoS::ExactlyOnce, false, b"x").await;
    assert_eq!(sub.next_publish().await.qos, QoS::AtLeastOnce);
    publ.publish("a", QoS::AtMostOnce, false, b"y").await;
    assert_eq!(sub.next_publish().await.qos, QoS::AtMostOnce);
}

#[tokio::test]
async fn overlapping_subscriptions_deliver_once_at_highest_qos() {
    // 3.1.1 MQTT-3.3.5-1
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("a/+", QoS::AtMostOnce).await;
    sub.subscribe("a/#", QoS::AtLeastOnce).await;
    sub.subscribe("a/b", QoS::AtMostOnce).await;
    publ.publish("a/b", QoS::ExactlyOnce, false, b"once").await;
    let first = sub.next_publish().await;
    assert_eq!(first.qos, QoS::AtLeastOnce);
    let rest = drain_until_marker(&mut sub, &mut publ, "a/b").await;
    assert!(rest.is_empty(), "duplicate deliveries: {rest:?}");
}

#[tokio::test]
async fn dollar_topics_are_not_matched_by_leading_wildcards() {
    // 5.0 MQTT-4.7.2-1
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut sys = V4::connect(server.mqtt_addr, "sys", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("#", QoS::AtLeastOnce).await;
    sub.subscribe("+/x", QoS::AtLeastOnce).await;
    // A `$` topic clients may use (`$SYS` is the broker's own, `sys_topics.rs`).
    sys.subscribe("$internal/#", QoS::AtLeastOnce).await;
    publ.publish("$internal/x", QoS::AtLeastOnce, false, b"sys")
        .await;
    assert_eq!(sys.next_publish().await.topic, "$internal/x");
    let leaked = drain_until_marker(&mut sub, &mut publ, "m/x").await;
    assert!(leaked.is_empty(), "wildcard matched a $ topic: {leaked:?}");
}

#[tokio::test]
async fn retained_set_replace_clear() {
    // 5.0 MQTT-3.3.1-5 (replace), MQTT-3.3.1-6 (empty payload clears), 3.1.1 MQTT-3.3.1-8 (RETAIN=1 on subscribe)
    let server = common::start().await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("r/1", QoS::AtLeastOnce, true, b"first").await;
    publ.publish("r/1", QoS::AtLeastOnce, true, b"second").await;
    publ.publish("r/2", QoS::AtMostOnce, true, b"other").await;

    let mut sub = V4::connect(server.mqtt_addr, "sub1", true).await;
    sub.subscribe("r/+", QoS::AtLeastOnce).await;
    let mut got = [sub.next_publish().await, sub.next_publish().await];
    got.sort_by(|a, b| a.topic.cmp(&b.topic));
    assert_eq!(&got[0].payload[..], b"second");
    assert!(got[0].retain && got[1].retain);
    assert_eq!(
        got[1].qos,
        QoS::AtMostOnce,
        "stored QoS is kept (min with granted)"
    );

    publ.publish("r/1", QoS::AtLeastOnce, true, b"").await;
    let mut late = V4::connect(server.mqtt_addr, "sub2", true).await;
    late.subscribe("r/1", QoS::AtLeastOnce).await;
    let rest = drain_until_marker(&mut late, &mut publ, "r/1").await;
    assert!(
        rest.is_empty(),
        "cleared retained message was delivered: {rest:?}"
    );
}

#[tokio::test]
async fn live_delivery_clears_retain_flag() {
    // 3.1.1 MQTT-3.3.1-9: RETAIN is 0 when forwarding to an existing subscription.
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("live", QoS::AtLeastOnce).await;
    publ.publish("live", QoS::AtLeastOnce, true, b"v").await;
    let p = sub.next_publish().await;
    assert!(!p.retain);
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("u/1", QoS::AtLeastOnce).await;
    sub.subscribe("marker", QoS::AtLeastOnce).await;
    sub.client.unsubscribe("u/1").await.expect("queued");
    loop {
        match sub.next_event().await {
            Some(rumqttc::Packet::UnsubAck(_)) => break,
            Some(_) => {}
            None => panic!("closed"),
        }
    }
    publ.publish("u/1", QoS::AtLeastOnce, false, b"gone").await;
    let leaked = drain_until_marker(&mut sub, &mut publ, "marker").await;
    assert!(leaked.is_empty());
}

#[tokio::test]
async fn will_is_published_on_abnormal_close_only() {
    // 5.0 MQTT-3.1.2-8 (published on abnormal close), MQTT-3.1.2-10 (removed on DISCONNECT)
    let server = common::start().await;
    let mut watcher = V4::connect(server.mqtt_addr, "watcher", true).await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    watcher.subscribe("wills/#", QoS::AtLeastOnce).await;

    let mut opts = rumqttc::MqttOptions::new(
        "dies",
        server.mqtt_addr.ip().to_string(),
        server.mqtt_addr.port(),
    );
    opts.set_last_will(rumqttc::LastWill::new(
        "wills/dies",
        "gone",
        QoS::AtLeastOnce,
        true,
    ));
    let dies = V4::connect_with(opts).await;
    dies.kill();
    let will = watcher.next_publish().await;
    assert_eq!(will.topic, "wills/dies");
    assert_eq!(&will.payload[..], b"gone");
    assert_eq!(will.qos, QoS::AtLeastOnce);

    // Will retain: a later subscriber sees it retained.
    let mut late = V4::connect(server.mqtt_addr, "late", true).await;
    late.subscribe("wills/dies", QoS::AtLeastOnce).await;
    assert!(late.next_publish().await.retain);

    let mut opts = rumqttc::MqttOptions::new(
        "polite",
        server.mqtt_addr.ip().to_string(),
        server.mqtt_addr.port(),
    );
    opts.set_last_will(rumqttc::LastWill::new(
        "wills/polite",
        "gone",
        QoS::AtLeastOnce,
        false,
    ));
    let polite = V4::connect_with(opts).await;
    polite.disconnect().await;
    let leaked = drain_until_marker(&mut watcher, &mut publ, "wills/marker").await;
    assert!(
        leaked.is_empty(),
        "will sent after normal DISCONNECT: {leaked:?}"
    );
}

#[tokio::test]
async fn second_connection_with_same_id_takes_over() {
    // 3.1.1 MQTT-3.1.4-2: the existing client is disconnected.
    let server = common::start().await;
    let mut first =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "dup", true).await;
    let _second = RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "dup", true).await;
    first
        .expect_silent_close("3.1.1 has no server DISCONNECT")
        .await;
}

#[tokio::test]
async fn persistent_session_queues_while_offline_and_resumes() {
    // 5.0 MQTT-3.1.2-5 (resume), MQTT-3.2.2-2 / 3.1.1 MQTT-3.2.2-2 (session present)
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "dash", false).await;
    assert!(!sub.session_present);
    sub.subscribe("sensors/#", QoS::ExactlyOnce).await;
    sub.disconnect().await;

    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    for i in 0..5 {
        publ.publish(
            &format!("sensors/t{i}"),
            QoS::AtLeastOnce,
            false,
            format!("{i}").as_bytes(),
        )
        .await;
    }
    publ.publish("sensors/q0", QoS::AtMostOnce, false, b"not queued")
        .await;
    publ.publish("sensors/q2", QoS::ExactlyOnce, false, b"q2")
        .await;

    let mut sub = V4::connect(server.mqtt_addr, "dash", false).await;
    assert!(sub.session_present);
    for i in 0..5 {
        let p = sub.next_publish().await;
        assert_eq!(p.topic, format!("sensors/t{i}"), "queued in order");
    }
    let p = sub.next_publish().await;
    assert_eq!(
        (p.topic.as_str(), p.qos),
        ("sensors/q2", QoS::ExactlyOnce),
        "QoS 0 not queued offline by default"
    );
}

#[tokio::test]
async fn clean_session_discards_previous_state() {
    // 5.0 MQTT-3.1.2-4
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "c1", false).await;
    sub.subscribe("x", QoS::AtLeastOnce).await;
    sub.disconnect().await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("x", QoS::AtLeastOnce, false, b"queued").await;
    let mut sub = V4::connect(server.mqtt_addr, "c1", true).await;
    assert!(!sub.session_present);
    sub.subscribe("marker", QoS::AtLeastOnce).await;
    let leaked = drain_until_marker(&mut sub, &mut publ, "marker").await;
    assert!(
        leaked.is_empty(),
        "old session's queue survived a clean start"
    );
}

#[tokio::test]
async fn offline_queue_is_bounded() {
    let mut config = common::test_config();
    config.mqtt.max_queued_messages = 3;
    let server = common::start_with(config).await;
    let mut sub = V4::connect(server.mqtt_addr, "bounded", false).await;
    sub.subscribe("q", QoS::AtLeastOnce).await;
    sub.disconnect().await;
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    for i in 0..6 {
        publ.publish("q", QoS::AtLeastOnce, false, format!("{i}").as_bytes())
            .await;
    }
    let mut sub = V4::connect(server.mqtt_addr, "bounded", false).await;
    let got: Vec<_> = [
        sub.next_publish().await,
        sub.next_publish().await,
        sub.next_publish().await,
    ]
    .iter()
    .map(|p| String::from_utf8_lossy(&p.payload).to_string())
    .collect();
    assert_eq!(got, ["0", "1", "2"], "drop-new keeps the oldest messages");
    let rest = drain_until_marker(&mut sub, &mut publ, "q").await;
    assert!(
        rest.is_empty(),
        "more than max_queued_messages were kept: {rest:?}"
    );
}

#[tokio::test]
async fn unacknowledged_messages_are_resent_with_dup_on_reconnect() {
    // 5.0 MQTT-4.4.0-1
    let server = common::start().await;
    let v = ProtocolVersion::V3_1_1;
    let mut sub = RawClient::connect(server.mqtt_addr, v, "raw-sub", false).await;
    let subscribe = common::v5::subscribe_packet(1, "r", Q::ExactlyOnce);
    sub.send(&Packet::Subscribe(subscribe)).await;
    assert!(matches!(sub.recv().await, Some(Packet::SubAck(_))));
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    publ.publish("r", QoS::AtLeastOnce, false, b"one").await;
    publ.publish("r", QoS::ExactlyOnce, false, b"two").await;
    let first = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("{other:?}"),
    };
    let second = match sub.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("{other:?}"),
    };
    assert!(!first.dup && !second.dup);
    drop(sub); // no acks

    let mut sub = RawClient::connect(server.mqtt_addr, v, "raw-sub", false).await;
    for original in [&first, &second] {
        match sub.recv().await {
            Some(Packet::Publish(p)) => {
                assert!(p.dup, "resent PUBLISH carries DUP=1");
                assert_eq!(p.packet_id, original.packet_id, "same packet id");
                assert_eq!(p.payload, original.payload);
            }
            other => panic!("expected resent PUBLISH, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn inbound_qos2_duplicate_is_not_forwarded_twice() {
    // 5.0 MQTT-4.3.3-10 (acknowledge duplicates until PUBREL), exactly-once delivery.
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    sub.subscribe("once", QoS::ExactlyOnce).await;
    let mut raw =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "raw-pub", true).await;
    let publish = common::v5::publish_packet("once", Q::ExactlyOnce, b"x", 7);
    raw.send(&Packet::Publish(publish.clone())).await;
    assert!(matches!(raw.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 7));
    raw.send(&Packet::Publish(Publish {
        dup: true,
        ..publish.clone()
    }))
    .await;
    assert!(matches!(raw.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 7));
    raw.send(&Packet::PubRel(PubResponse::new(7))).await;
    assert!(matches!(raw.recv().await, Some(Packet::PubComp(r)) if r.packet_id == 7));
    // After PUBCOMP the same id is a new message (5.0 MQTT-4.3.3-12).
    raw.send(&Packet::Publish(Publish {
        payload: "y".into(),
        ..publish
    }))
    .await;
    assert!(matches!(raw.recv().await, Some(Packet::PubRec(_))));
    raw.send(&Packet::PubRel(PubResponse::new(7))).await;
    assert!(matches!(raw.recv().await, Some(Packet::PubComp(_))));

    assert_eq!(&sub.next_publish().await.payload[..], b"x");
    assert_eq!(&sub.next_publish().await.payload[..], b"y");
    let mut publ = V4::connect(server.mqtt_addr, "pub", true).await;
    let rest = drain_until_marker(&mut sub, &mut publ, "once").await;
    assert!(rest.is_empty(), "duplicate forwarded: {rest:?}");
}

#[tokio::test]
async fn messages_arrive_in_publish_order() {
    // 5.0 MQTT-4.6.0-6: every topic is an ordered topic.
    let server = common::start().await;
    let mut sub = V4::connect(server.mqtt_addr, "sub", true).await;
    let publ = V4::connect(server.mqtt_addr, "pub", true).await;
    sub.subscribe("ord", QoS::AtLeastOnce).await;
    for i in 0..200u32 {
        publ.client
            .publish("ord", QoS::AtLeastOnce, false, i.to_be_bytes().to_vec())
            .await
            .expect("queued");
    }
    for i in 0..200u32 {
        let p = sub.next_publish().await;
        assert_eq!(&p.payload[..], &i.to_be_bytes());
    }
}

/// A raw 3.1.1 client, clean session, connected with `keep_alive` seconds (CONNACK taken).
async fn connect_with_keep_alive(
    addr: std::net::SocketAddr,
    client_id: &str,
    keep_alive: u16,
) -> RawClient {
    let mut raw = RawClient::open(addr, ProtocolVersion::V3_1_1).await;
    let connect = postbox::codec::Connect {
        keep_alive,
        ..common::connect_packet(ProtocolVersion::V3_1_1, client_id)
    };
    raw.send(&Packet::Connect(Box::new(connect))).await;
    assert!(matches!(raw.recv().await, Some(Packet::ConnAck(_))));
    raw
}

#[tokio::test]
async fn keep_alive_is_enforced_at_one_and_a_half_times() {
    // 3.1.1 MQTT-3.1.2-24: no packet within 1.5 × keep-alive closes the connection.
    let server = common::start().await;
    let started = std::time::Instant::now();
    let mut raw = connect_with_keep_alive(server.mqtt_addr, "sleepy", 1).await;
    raw.expect_close().await;
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1400),
        "closed before 1.5 × keep-alive"
    );
}

#[tokio::test]
async fn a_client_that_keeps_pinging_outlives_its_keep_alive() {
    // 3.1.1 MQTT-3.1.2-24 read the other way: traffic within each 1.5 × keep-alive keeps the
    // connection. The broker enforces keep-alive with a periodic sweep that wakes connections
    // at the deadline they last reported, so a client that reported once and then kept
    // pinging must be woken, found alive and left alone, period after period.
    let server = common::start().await;
    let mut raw = connect_with_keep_alive(server.mqtt_addr, "pinger", 1).await;
    // Four seconds: well past the 1.5 s limit and several sweeps. The pause paces the
    // client, as a device's timer would; every PINGREQ must get its PINGRESP.
    for round in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert!(
            raw.answers_ping().await,
            "no PINGRESP in round {round}: the connection was closed"
        );
    }
}

#[tokio::test]
async fn a_silent_tcp_connection_does_not_hold_up_other_clients() {
    // A socket that never sends CONNECT (a scanner, a stuck device) must not keep the broker
    // from serving anyone else; the listener only hands over connections whose CONNECT
    // arrived (TCP_DEFER_ACCEPT), and the CONNECT timeout closes the rest.
    let server = common::start().await;
    let _silent = tokio::net::TcpStream::connect(server.mqtt_addr)
        .await
        .expect("tcp connect");
    let mut raw = RawClient::connect(
        server.mqtt_addr,
        ProtocolVersion::V3_1_1,
        "after-silent",
        true,
    )
    .await;
    assert!(raw.answers_ping().await);
}

#[tokio::test]
async fn empty_client_id_needs_clean_session_in_311() {
    // 3.1.1 MQTT-3.1.3-8 (rejected with 0x02 when Clean Session = 0), MQTT-3.1.3-6 (assigned otherwise)
    let server = common::start().await;
    for (clean, expected) in [(false, 0x85u8), (true, 0)] {
        let mut raw = RawClient::open(server.mqtt_addr, ProtocolVersion::V3_1_1).await;
        let connect = postbox::codec::Connect {
            protocol: ProtocolVersion::V3_1_1,
            clean_start: clean,
            keep_alive: 10,
            client_id: "".into(),
            will: None,
            username: None,
            password: None,
            properties: Default::default(),
            bridge: false,
        };
        raw.send(&Packet::Connect(Box::new(connect))).await;
        // CONNACK in the 3.1.1 layout: 0x20 0x02 flags return-code (0x02 = identifier rejected).
        let bytes = raw.recv_bytes(4).await;
        assert_eq!(
            bytes,
            [0x20, 0x02, 0x00, if expected == 0 { 0 } else { 0x02 }]
        );
    }
}

#[tokio::test]
async fn mqtt_3_1_clients_are_served() {
    let server = common::start().await;
    let v = ProtocolVersion::V3_1;
    let mut sub = RawClient::connect(server.mqtt_addr, v, "old-sub", true).await;
    let subscribe = common::v5::subscribe_packet(1, "legacy/#", Q::AtLeastOnce);
    sub.send(&Packet::Subscribe(subscribe)).await;
    assert!(matches!(sub.recv().await, Some(Packet::SubAck(_))));
    let mut publ = RawClient::connect(server.mqtt_addr, v, "old-pub", true).await;
    let publish = common::v5::publish_packet("legacy/a", Q::AtLeastOnce, b"hi", 1);
    publ.send(&Packet::Publish(publish)).await;
    assert!(matches!(publ.recv().await, Some(Packet::PubAck(_))));
    match sub.recv().await {
        Some(Packet::Publish(p)) => assert_eq!(&p.payload[..], b"hi"),
        other => panic!("{other:?}"),
    }
    let _ = WAIT;
}
