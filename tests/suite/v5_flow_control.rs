//! MQTT 5 flow control over real sockets: the broker's Receive Maximum (announced, enforced
//! with DISCONNECT 0x93) and the client's Receive Maximum (the outbound window).
//!
//! Statement ids follow the OASIS MQTT 5.0 text.

use crate::common;

use std::time::Duration;

use common::v5;
use common::RawClient;
use postbox::codec::{Packet, ProtocolVersion, PubResponse, QoS, ReasonCode};

async fn server_with_receive_maximum(max: u16) -> postbox::server::RunningServer {
    let mut config = common::test_config();
    config.mqtt.receive_maximum = max;
    common::start_with(config).await
}

/// Sends a QoS 2 PUBLISH and expects a PUBREC accepting it (without releasing it). Nobody
/// subscribes to "fc", so a v5 PUBREC may say 0x10 No matching subscribers (v5 §3.5.2.1; a
/// re-send and 3.1.1 get 0x00): below 0x80 either way, the id held until PUBREL, which is
/// what Receive Maximum counts.
async fn qos2_unreleased(c: &mut RawClient, id: u16) {
    c.send(&Packet::Publish(v5::publish_packet(
        "fc",
        QoS::ExactlyOnce,
        b"x",
        id,
    )))
    .await;
    match c.recv().await {
        Some(Packet::PubRec(r)) => {
            assert_eq!(r.packet_id, id);
            assert!(!r.reason_code.is_error(), "accepted: {:?}", r.reason_code);
        }
        other => panic!("expected PUBREC {id}, got {other:?}"),
    }
}

#[tokio::test]
async fn receive_maximum_is_announced() {
    // v5 §3.2.2.3.3: absent means 65535, so it is sent whenever it is lower.
    let server = common::start().await;
    let (_c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("rm-default")).await;
    assert_eq!(
        ack.properties.receive_maximum,
        Some(1024),
        "documented default"
    );
    let server = server_with_receive_maximum(u16::MAX).await;
    let (_c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("rm-max")).await;
    assert_eq!(ack.properties.receive_maximum, None);
}

#[tokio::test]
async fn exceeding_receive_maximum_is_disconnected_with_0x93() {
    // MQTT-3.3.4-7 (the client must not exceed it); reason 0x93 Receive Maximum exceeded.
    let server = server_with_receive_maximum(2).await;
    let (mut c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("rm-over")).await;
    assert_eq!(ack.properties.receive_maximum, Some(2));
    qos2_unreleased(&mut c, 1).await;
    qos2_unreleased(&mut c, 2).await;
    // A third unacknowledged QoS 1/2 PUBLISH (QoS 2 awaiting PUBREL count until PUBCOMP).
    c.send(&Packet::Publish(v5::publish_packet(
        "fc",
        QoS::AtLeastOnce,
        b"y",
        3,
    )))
    .await;
    let d = v5::expect_disconnect(&mut c, ReasonCode::RECEIVE_MAXIMUM_EXCEEDED).await;
    assert!(
        d.properties.reason_string.is_some(),
        "reason string by default"
    );
}

#[tokio::test]
async fn retransmissions_and_released_ids_do_not_use_up_the_quota() {
    // MQTT-4.3.3-10 (a duplicate before PUBREL is acknowledged again), quota freed by PUBCOMP.
    let server = server_with_receive_maximum(2).await;
    let mut sub = v5::connect_id(server.mqtt_addr, "rm-sub").await;
    v5::subscribe(&mut sub, "fc", QoS::AtLeastOnce).await;
    let mut c = v5::connect_id(server.mqtt_addr, "rm-quota").await;
    qos2_unreleased(&mut c, 1).await;
    qos2_unreleased(&mut c, 2).await;
    let mut dup = v5::publish_packet("fc", QoS::ExactlyOnce, b"x", 1);
    dup.dup = true;
    c.send(&Packet::Publish(dup)).await;
    assert!(matches!(c.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 1));
    c.send(&Packet::PubRel(PubResponse::new(1))).await;
    assert!(matches!(c.recv().await, Some(Packet::PubComp(p)) if p.packet_id == 1));
    qos2_unreleased(&mut c, 3).await; // the released slot is free again
    c.send(&Packet::Publish(v5::publish_packet(
        "fc",
        QoS::ExactlyOnce,
        b"z",
        4,
    )))
    .await;
    v5::expect_disconnect(&mut c, ReasonCode::RECEIVE_MAXIMUM_EXCEEDED).await;
    // Exactly-once: ids 1, 2 and 3 each reached the subscriber once.
    for _ in 0..3 {
        v5::receive(&mut sub).await;
    }
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
}

#[tokio::test]
async fn mqtt_311_clients_are_not_held_to_it() {
    // 3.1.1 has no Receive Maximum to announce, so none is enforced.
    let server = server_with_receive_maximum(2).await;
    let mut c = RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "rm-v3", true).await;
    for id in 1..=5 {
        qos2_unreleased(&mut c, id).await;
    }
}

#[tokio::test]
async fn outbound_window_follows_the_clients_receive_maximum() {
    // MQTT-3.3.4-9: no more than the client's Receive Maximum unacknowledged QoS 1/2 PUBLISHes.
    let server = common::start().await;
    let mut connect = v5::connect_packet("win-sub");
    connect.properties.receive_maximum = Some(2);
    let (mut sub, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut sub, "win", QoS::AtLeastOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "win-pub").await;
    for i in 0..5u8 {
        v5::publish(
            &mut p,
            v5::publish_packet("win", QoS::AtLeastOnce, &[b'0' + i], 1),
        )
        .await;
    }
    let first = v5::expect_publish(&mut sub).await;
    let _second = v5::expect_publish(&mut sub).await;
    v5::expect_silence(&mut sub, Duration::from_millis(300)).await;
    // MQTT-3.3.4-10: other packets still flow while the window is full.
    sub.send(&Packet::PingReq).await;
    assert!(matches!(sub.recv().await, Some(Packet::PingResp)));
    v5::ack(&mut sub, &first).await;
    let third = v5::expect_publish(&mut sub).await;
    assert_eq!(&third.payload[..], b"2", "in order");
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
}
