//! Payload Format Indicator validation (`mqtt.validate_utf8_payload`): v5 §3.3.2.3.2 lets the
//! server check that a payload marked as UTF-8 is UTF-8 and refuse it with 0x99.
//!
//! Statement ids follow the OASIS MQTT 5.0 text.

use crate::common;

use std::time::Duration;

use common::v5;
use postbox::codec::{LastWill, Packet, PublishProperties, QoS, ReasonCode, WillProperties};

const NOT_UTF8: &[u8] = &[0x66, 0x6f, 0xff, 0xfe];

fn utf8_marked() -> PublishProperties {
    PublishProperties {
        payload_format_indicator: Some(1),
        ..Default::default()
    }
}

async fn validating() -> postbox::server::RunningServer {
    let mut config = common::test_config();
    config.mqtt.validate_utf8_payload = true;
    common::start_with(config).await
}

#[tokio::test]
async fn invalid_utf8_is_refused_with_0x99_and_not_routed() {
    let server = validating().await;
    let mut sub = v5::subscriber(server.mqtt_addr, "pf-sub", "pf", QoS::ExactlyOnce).await;
    let mut c = v5::connect_id(server.mqtt_addr, "pf-pub").await;
    for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let mut p = v5::publish_packet("pf", qos, NOT_UTF8, 7);
        p.properties = utf8_marked();
        c.send(&Packet::Publish(p)).await;
        let ack = match (qos, c.recv().await) {
            (QoS::AtLeastOnce, Some(Packet::PubAck(a))) => a,
            (QoS::ExactlyOnce, Some(Packet::PubRec(r))) => r,
            (_, other) => panic!("{qos:?}: {other:?}"),
        };
        assert_eq!(ack.reason_code, ReasonCode::PAYLOAD_FORMAT_INVALID);
        assert!(ack.properties.reason_string.is_some());
    }
    // MQTT-4.3.3-9: after PUBREC >= 0x80 the same packet id is a new publication.
    let mut p = v5::publish_packet("pf", QoS::ExactlyOnce, "ünïcödé".as_bytes(), 7);
    p.properties = utf8_marked();
    assert_eq!(v5::publish(&mut c, p).await, ReasonCode::SUCCESS);
    let got = v5::receive(&mut sub).await;
    assert_eq!(
        &got.payload[..],
        "ünïcödé".as_bytes(),
        "only the valid one was routed"
    );
    assert_eq!(
        got.properties.payload_format_indicator,
        Some(1),
        "MQTT-3.3.2-4"
    );
    v5::expect_silence(&mut sub, Duration::from_millis(200)).await;
    // Binary payloads marked as such (PFI 0) or unmarked are not checked.
    for pfi in [Some(0), None] {
        let props = PublishProperties {
            payload_format_indicator: pfi,
            ..Default::default()
        };
        assert_eq!(
            v5::publish_props(&mut c, "pf", QoS::AtLeastOnce, NOT_UTF8, props).await,
            ReasonCode::SUCCESS
        );
        assert_eq!(&v5::receive(&mut sub).await.payload[..], NOT_UTF8);
    }
    // QoS 0 has no acknowledgement to carry the reason: DISCONNECT 0x99.
    let mut p = v5::publish_packet("pf", QoS::AtMostOnce, NOT_UTF8, 0);
    p.properties = utf8_marked();
    c.send(&Packet::Publish(p)).await;
    v5::expect_disconnect(&mut c, ReasonCode::PAYLOAD_FORMAT_INVALID).await;
}

#[tokio::test]
async fn a_will_with_an_invalid_payload_is_refused_in_connack() {
    // v5 §3.1.3.2.3: the server may validate the will payload; CONNACK 0x99.
    let server = validating().await;
    let mut connect = v5::connect_packet("pf-will");
    connect.will = Some(LastWill {
        topic: "w".into(),
        payload: NOT_UTF8.to_vec().into(),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: WillProperties {
            payload_format_indicator: Some(1),
            ..Default::default()
        },
    });
    match v5::open(server.mqtt_addr, connect).await.1 {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason_code, ReasonCode::PAYLOAD_FORMAT_INVALID);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn validation_is_off_by_default() {
    let server = common::start().await;
    let mut sub = v5::subscriber(server.mqtt_addr, "pf-off-sub", "pf", QoS::AtLeastOnce).await;
    let mut c = v5::connect_id(server.mqtt_addr, "pf-off").await;
    let code = v5::publish_props(&mut c, "pf", QoS::AtLeastOnce, NOT_UTF8, utf8_marked()).await;
    assert_eq!(code, ReasonCode::SUCCESS);
    let got = v5::receive(&mut sub).await;
    assert_eq!(&got.payload[..], NOT_UTF8, "forwarded unaltered");
    assert_eq!(got.properties.payload_format_indicator, Some(1));
}
