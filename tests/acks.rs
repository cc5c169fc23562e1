//! Acknowledgements over real sockets: an ack of the wrong kind for an in-flight delivery
//! (PUBREC / PUBCOMP for QoS 1, PUBACK for QoS 2, PUBCOMP before any PUBREL) is a Protocol
//! Error: v5 DISCONNECT 0x82 (v5 §4.13.1, MQTT-4.13.1-1), 3.1.1 close (3.1.1 MQTT-4.8.0-1: "If
//! the Client or Server encounters a protocol violation it MUST close the Network
//! Connection"); acks for ids with nothing in flight stay ignored.

mod common;

use common::v5::{self, V};
use common::RawClient;
use postbox::codec::{Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode};

const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

/// Connects a subscriber of `version` to "acks/t" at `qos`, publishes one message at `qos`
/// from another client, and returns the subscriber with the delivery it received (not yet
/// acknowledged).
async fn in_flight(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    qos: QoS,
) -> (RawClient, Publish) {
    let mut sub = RawClient::connect(addr, version, "acks-sub", true).await;
    v5::subscribe(&mut sub, "acks/t", qos).await;
    let mut publ = RawClient::connect(addr, version, "acks-pub", true).await;
    v5::publish(&mut publ, v5::publish_packet("acks/t", qos, b"m", 1)).await;
    let delivery = v5::expect_publish(&mut sub).await;
    assert_eq!(delivery.qos, qos);
    (sub, delivery)
}

/// Answers a delivery with `wrong` and expects the Protocol Error close: DISCONNECT 0x82 for
/// v5, a close without any packet for 3.1.1.
async fn wrong_ack_closes(version: ProtocolVersion, qos: QoS, wrong: fn(PubResponse) -> Packet) {
    let server = common::start().await;
    let (mut sub, delivery) = in_flight(server.mqtt_addr, version, qos).await;
    sub.send(&wrong(PubResponse::new(delivery.packet_id))).await;
    if version.is_v5() {
        v5::expect_disconnect(&mut sub, ReasonCode::PROTOCOL_ERROR).await;
    } else {
        let seen = sub.expect_close().await;
        assert!(
            seen.is_empty(),
            "3.1.1 closes without a packet, got {seen:?}"
        );
    }
}

// ----- acks of the wrong kind -----

#[tokio::test]
async fn v5_pubrec_for_a_qos1_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.2-4 (QoS 1 is answered with PUBACK), §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::AtLeastOnce, Packet::PubRec).await;
}

#[tokio::test]
async fn v5_pubcomp_for_a_qos1_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.2-4, §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::AtLeastOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v5_puback_for_a_qos2_delivery_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-8 (QoS 2 is answered with PUBREC), §4.13.1 / MQTT-4.13.1-1 → 0x82
    wrong_ack_closes(V, QoS::ExactlyOnce, Packet::PubAck).await;
}

#[tokio::test]
async fn v5_pubcomp_before_pubrel_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-11: PUBCOMP answers a PUBREL, and none was sent yet → 0x82
    wrong_ack_closes(V, QoS::ExactlyOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v5_puback_in_the_pubrel_stage_is_a_protocol_error() {
    // 5.0 MQTT-4.3.3-11: our PUBREL is answered with PUBCOMP, not PUBACK → 0x82
    let server = common::start().await;
    let (mut sub, delivery) = in_flight(server.mqtt_addr, V, QoS::ExactlyOnce).await;
    let id = delivery.packet_id;
    sub.send(&Packet::PubRec(PubResponse::new(id))).await;
    assert!(matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == id));
    sub.send(&Packet::PubAck(PubResponse::new(id))).await;
    v5::expect_disconnect(&mut sub, ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn v311_pubrec_for_a_qos1_delivery_closes() {
    // 3.1.1 MQTT-4.3.2-2 (QoS 1 is answered with PUBACK), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::AtLeastOnce, Packet::PubRec).await;
}

#[tokio::test]
async fn v311_pubcomp_for_a_qos1_delivery_closes() {
    // 3.1.1 MQTT-4.3.2-2, MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::AtLeastOnce, Packet::PubComp).await;
}

#[tokio::test]
async fn v311_puback_for_a_qos2_delivery_closes() {
    // 3.1.1 MQTT-4.3.3-2 (QoS 2 is answered with PUBREC), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::ExactlyOnce, Packet::PubAck).await;
}

#[tokio::test]
async fn v311_pubcomp_before_pubrel_closes() {
    // 3.1.1 MQTT-4.3.3-2 (PUBCOMP answers a PUBREL), MQTT-4.8.0-1 → close
    wrong_ack_closes(V311, QoS::ExactlyOnce, Packet::PubComp).await;
}

/// Acks for ids with nothing in flight are not errors (a client may repeat acks after a
/// reconnect), and a PUBREC repeated while the PUBREL stage runs gets PUBREL again
/// (MQTT-4.3.3-4); the connection stays up (PINGREQ answered, MQTT-3.12.4-1).
#[tokio::test]
async fn acks_for_unknown_ids_and_a_repeated_pubrec_are_not_errors() {
    for version in [V, V311] {
        let server = common::start().await;
        let (mut sub, delivery) = in_flight(server.mqtt_addr, version, QoS::ExactlyOnce).await;
        let id = delivery.packet_id;
        let unknown = id.wrapping_add(100);
        sub.send(&Packet::PubAck(PubResponse::new(unknown))).await;
        sub.send(&Packet::PubComp(PubResponse::new(unknown))).await;
        for _ in 0..2 {
            sub.send(&Packet::PubRec(PubResponse::new(id))).await;
            assert!(
                matches!(sub.recv().await, Some(Packet::PubRel(r)) if r.packet_id == id),
                "{version:?}: PUBREL (again)"
            );
        }
        sub.send(&Packet::PubComp(PubResponse::new(id))).await;
        // A PUBCOMP repeated after the delivery finished: unknown id, ignored.
        sub.send(&Packet::PubComp(PubResponse::new(id))).await;
        sub.send(&Packet::PingReq).await;
        assert!(
            matches!(sub.recv().await, Some(Packet::PingResp)),
            "{version:?}: still connected"
        );
    }
}
