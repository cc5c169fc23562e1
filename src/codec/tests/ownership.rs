//! Issue 35, eleventh adversarial pass (T1, T2): every field a caller may keep of a decoded
//! packet holds an allocation of its own, alone. A copy of the whole packet was not enough: a
//! small filter kept its padded SUBSCRIBE alive, and a small delayed will its padded CONNECT,
//! while the bounds counted the filter's and the will's few bytes.

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;

use super::{enc, MAX, V5};
use crate::codec::{
    decode, Connect, ConnectProperties, LastWill, Packet, Publish, PublishProperties, QoS,
    Subscribe, SubscriptionOptions, WillProperties,
};

/// Ten kilobytes of padding in a user property: what a kept field must not keep alive.
fn padding() -> Vec<(ByteString, ByteString)> {
    vec![("pad".into(), "x".repeat(10_000).into())]
}

/// Decodes `packet` read in one buffer and checks that each of the fields `kept` picks holds
/// its allocation alone (`Bytes::is_unique`: no other slice of it alive while the whole
/// decoded packet still is).
fn assert_fields_own_their_bytes(packet: &Packet, kept: impl Fn(&Packet) -> Vec<(&str, &Bytes)>) {
    let mut buf = BytesMut::from(&enc(packet, V5)[..]);
    let decoded = decode(&mut buf, Some(V5), MAX)
        .expect("decodes")
        .expect("complete");
    for (what, field) in kept(&decoded) {
        assert!(
            field.is_unique(),
            "the {what} shares its allocation with the rest of the packet"
        );
    }
}

#[test]
fn a_subscribe_filter_holds_only_itself() {
    let subscribe = Packet::Subscribe(Subscribe {
        packet_id: 1,
        user_properties: padding(),
        filters: vec![
            ("fleet/a/#".into(), SubscriptionOptions::default()),
            ("fleet/b/#".into(), SubscriptionOptions::default()),
        ],
        ..Subscribe::default()
    });
    assert_fields_own_their_bytes(&subscribe, |p| {
        let Packet::Subscribe(s) = p else {
            panic!("a SUBSCRIBE")
        };
        vec![
            ("first filter", s.filters[0].0.as_bytes()),
            ("second filter", s.filters[1].0.as_bytes()),
        ]
    });
}

#[test]
fn a_connect_will_and_client_id_hold_only_themselves() {
    let connect = Packet::Connect(Box::new(Connect {
        protocol: V5,
        clean_start: false,
        keep_alive: 60,
        bridge: false,
        client_id: "sensor-1".into(),
        username: Some("sensor".into()),
        password: Some(Bytes::from_static(b"secret")),
        properties: ConnectProperties {
            user_properties: padding(),
            ..ConnectProperties::default()
        },
        will: Some(LastWill {
            topic: "fleet/sensor-1/gone".into(),
            payload: Bytes::from_static(b"1"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: WillProperties {
                will_delay_interval: Some(3600),
                correlation_data: Some(Bytes::from_static(b"c")),
                ..WillProperties::default()
            },
        }),
    }));
    assert_fields_own_their_bytes(&connect, |p| {
        let Packet::Connect(c) = p else {
            panic!("a CONNECT")
        };
        let will = c.will.as_ref().expect("a will");
        vec![
            ("client id", c.client_id.as_bytes()),
            ("will topic", will.topic.as_bytes()),
            ("will payload", &will.payload),
            (
                "will correlation data",
                will.properties.correlation_data.as_ref().expect("kept"),
            ),
        ]
    });
}

#[test]
fn a_publish_payload_and_properties_hold_only_themselves() {
    let publish = Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        packet_id: 7,
        topic: "fleet/a/temp".into(),
        payload: Bytes::from_static(b"21.5"),
        properties: PublishProperties {
            correlation_data: Some(Bytes::from_static(b"c")),
            user_properties: padding(),
            ..PublishProperties::default()
        },
        ..Publish::default()
    });
    assert_fields_own_their_bytes(&publish, |p| {
        let Packet::Publish(p) = p else {
            panic!("a PUBLISH")
        };
        vec![
            ("payload", &p.payload),
            (
                "correlation data",
                p.properties.correlation_data.as_ref().expect("kept"),
            ),
            (
                "user property",
                p.properties.user_properties[0].1.as_bytes(),
            ),
        ]
    });
}
