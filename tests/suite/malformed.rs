//! Bad input: every malformed or illegal packet gets the spec's reason code (v5 DISCONNECT or
//! CONNACK) and closes only that connection; the broker keeps serving everyone else.

use crate::common;

use common::rumq::V4;
use common::v5;
use common::RawClient;
use postbox::codec::{Packet, ProtocolVersion, ReasonCode};
use rumqttc::QoS;

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

/// Sends `bytes` on a fresh v5 session and expects DISCONNECT with `code`, then a close.
async fn expect_v5_disconnect(addr: std::net::SocketAddr, bytes: &[u8], code: ReasonCode) {
    let mut c = RawClient::connect(addr, V5, "bad5", true).await;
    c.send_raw(bytes).await;
    let seen = c.expect_close().await;
    match seen.as_slice() {
        [Packet::Disconnect(d)] => assert_eq!(d.reason_code, code, "for {bytes:02x?}"),
        other => panic!("expected one DISCONNECT {code:?} for {bytes:02x?}, got {other:?}"),
    }
}

/// Sends `bytes` on a fresh 3.1.1 session and expects the connection to close, with nothing sent.
async fn expect_v311_close(addr: std::net::SocketAddr, bytes: &[u8]) {
    let mut c = RawClient::connect(addr, V311, "bad311", true).await;
    c.send_raw(bytes).await;
    let seen = c.expect_close().await;
    assert!(
        seen.is_empty(),
        "3.1.1 closes without a reply, got {seen:?}"
    );
}

/// The broker still routes messages for well-behaved clients.
async fn assert_still_serving(addr: std::net::SocketAddr) {
    let mut sub = V4::connect(addr, "healthy-sub", true).await;
    let mut publ = V4::connect(addr, "healthy-pub", true).await;
    sub.subscribe("health", QoS::AtLeastOnce).await;
    publ.publish("health", QoS::AtLeastOnce, false, b"ok").await;
    assert_eq!(&sub.next_publish().await.payload[..], b"ok");
}

#[tokio::test]
async fn reserved_fixed_header_flags_are_malformed() {
    // 5.0 MQTT-2.1.3-1 (reserved flag bits) → 0x81
    let server = common::start().await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0xC1, 0x00],
        ReasonCode::MALFORMED_PACKET,
    )
    .await; // PINGREQ flags 1
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00],
        ReasonCode::MALFORMED_PACKET,
    )
    .await; // SUBSCRIBE flags 0
    expect_v311_close(server.mqtt_addr, &[0xC1, 0x00]).await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn bad_remaining_length_is_malformed() {
    // A variable byte integer longer than 4 bytes (5.0 §1.5.5) → 0x81
    let server = common::start().await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
        ReasonCode::MALFORMED_PACKET,
    )
    .await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn packet_above_maximum_size_is_rejected() {
    // 5.0 MQTT-3.2.2-? : a packet larger than the advertised Maximum Packet Size → 0x95
    let mut config = common::test_config();
    config.mqtt.max_packet_size = 1024;
    let server = common::start_with(config).await;
    // Header announcing 4000 bytes: rejected from the header alone, before the body arrives.
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0xA0, 0x1F],
        ReasonCode::PACKET_TOO_LARGE,
    )
    .await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn invalid_utf8_and_null_in_topic_are_malformed() {
    // 5.0 MQTT-1.5.4-1 (ill-formed UTF-8), MQTT-1.5.4-2 (U+0000) → 0x81
    let server = common::start().await;
    // PUBLISH QoS 0, topic length 2, bytes C3 28 (invalid UTF-8), property length 0
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, 0x00],
        ReasonCode::MALFORMED_PACKET,
    )
    .await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0x05, 0x00, 0x02, b'a', 0x00, 0x00],
        ReasonCode::MALFORMED_PACKET,
    )
    .await;
    expect_v311_close(server.mqtt_addr, &[0x30, 0x04, 0x00, 0x02, 0xC3, 0x28]).await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn wildcard_in_publish_topic_is_invalid() {
    // 5.0 MQTT-3.3.2-2 → 0x90 Topic Name invalid
    let server = common::start().await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'#', 0x00],
        ReasonCode::TOPIC_NAME_INVALID,
    )
    .await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'+', 0x00],
        ReasonCode::TOPIC_NAME_INVALID,
    )
    .await;
    expect_v311_close(
        server.mqtt_addr,
        &[0x30, 0x05, 0x00, 0x03, b'a', b'/', b'#'],
    )
    .await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn qos_3_is_malformed() {
    // 5.0 MQTT-3.3.1-4 → 0x81
    let server = common::start().await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x36, 0x06, 0x00, 0x01, b'a', 0x00, 0x01, 0x00],
        ReasonCode::MALFORMED_PACKET,
    )
    .await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn packet_id_zero_is_rejected() {
    // 5.0 MQTT-2.2.1-3: QoS > 0 needs a non-zero packet identifier.
    let server = common::start().await;
    let mut c = RawClient::connect(server.mqtt_addr, V5, "pid0", true).await;
    c.send_raw(&[0x32, 0x06, 0x00, 0x01, b'a', 0x00, 0x00, 0x00])
        .await;
    match c.expect_close().await.as_slice() {
        [Packet::Disconnect(d)] => assert!(
            d.reason_code == ReasonCode::PROTOCOL_ERROR
                || d.reason_code == ReasonCode::MALFORMED_PACKET,
            "{:?}",
            d.reason_code
        ),
        other => panic!("{other:?}"),
    }
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn duplicate_property_is_a_protocol_error() {
    // 5.0 §2.2.2.2: a property other than User Property / Subscription Identifier twice → 0x82
    let server = common::start().await;
    // PUBLISH QoS 0 topic "a", properties: 0x01 0x00 (payload format) twice
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x30, 0x08, 0x00, 0x01, b'a', 0x04, 0x01, 0x00, 0x01, 0x00],
        ReasonCode::PROTOCOL_ERROR,
    )
    .await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn subscribe_without_filters_is_a_protocol_error() {
    // 5.0 MQTT-3.8.3-2: SUBSCRIBE must contain at least one filter → 0x82 (3.1.1 MQTT-3.8.3-3)
    let server = common::start().await;
    expect_v5_disconnect(
        server.mqtt_addr,
        &[0x82, 0x03, 0x00, 0x01, 0x00],
        ReasonCode::PROTOCOL_ERROR,
    )
    .await;
    expect_v311_close(server.mqtt_addr, &[0x82, 0x02, 0x00, 0x01]).await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn second_connect_is_a_protocol_error() {
    // 5.0 MQTT-3.1.0-2 → 0x82
    let server = common::start().await;
    let connect = [
        0x10, 0x0E, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x0A, 0x00, 0x00, 0x01,
        b'x',
    ];
    // (remaining length 14 = 2+4 name, level, flags, 2 keepalive, props len 0, 2+1 id)
    expect_v5_disconnect(server.mqtt_addr, &connect[..], ReasonCode::PROTOCOL_ERROR).await;
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn first_packet_must_be_connect() {
    // 5.0 MQTT-3.1.0-1
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, V311).await;
    c.send_raw(&[0xC0, 0x00]).await; // PINGREQ before CONNECT
    let seen = c.expect_close().await;
    assert!(seen.is_empty(), "{seen:?}");
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn unsupported_protocol_level_gets_connack_0x01() {
    // 3.1.1 MQTT-3.1.2-2: unacceptable protocol level → CONNACK return code 0x01, then close.
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, V311).await;
    c.send_raw(&[
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x07, 0x02, 0x00, 0x0A, 0x00, 0x01, b'x',
    ])
    .await;
    assert_eq!(c.recv_bytes(4).await, [0x20, 0x02, 0x00, 0x01]);
    assert!(c.expect_close().await.is_empty());
    assert_still_serving(server.mqtt_addr).await;
}

#[tokio::test]
async fn reserved_connect_flag_closes_connection() {
    // 3.1.1 MQTT-3.1.2-3: the reserved flag must be 0, otherwise disconnect.
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, V311).await;
    c.send_raw(&[
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x03, 0x00, 0x0A, 0x00, 0x01, b'x',
    ])
    .await;
    let seen = c.expect_close().await;
    assert!(seen.is_empty(), "{seen:?}");
}

#[tokio::test]
async fn malformed_v5_connect_gets_connack_reason() {
    // 5.0 §4.13: a malformed CONNECT may be answered with CONNACK 0x81 before closing.
    let server = common::start().await;
    let mut c = RawClient::open(server.mqtt_addr, V5).await;
    // v5 CONNECT with reserved flag set (0x03)
    c.send_raw(&[
        0x10, 0x0E, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x03, 0x00, 0x0A, 0x00, 0x00, 0x01,
        b'x',
    ])
    .await;
    v5::expect_only_connack(&mut c, ReasonCode::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn invalid_topic_filter_fails_only_that_filter() {
    // 5.0 SUBACK 0x8F per filter; 3.1.1 SUBACK 0x80 (MQTT-3.9.3-2 failure code)
    let server = common::start().await;
    for (version, fail) in [(V5, 0x8Fu8), (V311, 0x80)] {
        let mut c = RawClient::connect(server.mqtt_addr, version, "filters", true).await;
        let filters = vec![
            (
                "ok/+".into(),
                postbox::codec::SubscriptionOptions {
                    qos: postbox::codec::QoS::AtLeastOnce,
                    ..Default::default()
                },
            ),
            ("bad#".into(), Default::default()),
        ];
        c.send(&Packet::Subscribe(postbox::codec::Subscribe {
            packet_id: 3,
            filters,
            ..Default::default()
        }))
        .await;
        match c.recv().await {
            Some(Packet::SubAck(ack)) => {
                let codes: Vec<u8> = ack
                    .reason_codes
                    .iter()
                    .map(|r| if version == V5 { r.0 } else { r.to_v3_suback() })
                    .collect();
                assert_eq!(codes, [1, fail]);
            }
            other => panic!("{other:?}"),
        }
    }
}
