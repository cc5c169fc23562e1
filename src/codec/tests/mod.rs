//! Codec tests: byte-exact vectors, every malformed case, and property-based round trips.
//! Spec statement ids (e.g. `MQTT-3.3.1-2`) name the rule a test checks.

#[cfg(not(debug_assertions))]
mod bench;
mod disallowed_characters;
mod malformed;
mod ownership;
mod roundtrip;
mod strategies;
mod vectors;

use bytes::BytesMut;

use super::{decode, encode, DecodeError, Packet, ProtocolVersion};

/// Generous limit used where the size limit is not under test.
const MAX: usize = 1 << 20;

pub(super) const V3: ProtocolVersion = ProtocolVersion::V3_1;
pub(super) const V4: ProtocolVersion = ProtocolVersion::V3_1_1;
pub(super) const V5: ProtocolVersion = ProtocolVersion::V5;

/// Decodes `bytes` as exactly one packet at `version` (which must consume everything).
fn dec(bytes: &[u8], version: Option<ProtocolVersion>) -> Result<Packet, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    match decode(&mut buf, version, MAX)? {
        Some(p) => {
            assert!(buf.is_empty(), "{} bytes left after one packet", buf.len());
            Ok(p)
        }
        None => panic!("incomplete: {bytes:02X?}"),
    }
}

/// Encodes `packet` at `version` into a fresh buffer.
fn enc(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode(packet, version, &mut buf).expect("encodable");
    buf.to_vec()
}

/// Issue 35, ninth adversarial pass, R5, and tenth, S1: what a decoded packet's parts keep
/// alive is their own allocation, not the read buffer they arrived in. Neither a 1-byte
/// PUBLISH read right behind a 100 KB one (one buffer, as one `read` delivers them) nor a
/// 5 KB one behind that, nor the large one, nor a PUBLISH whose properties hold bytes, nor a
/// SUBSCRIBE's filter, points into that buffer.
#[test]
fn a_small_packet_does_not_keep_the_read_buffer_alive() {
    use crate::codec::{Publish, PublishProperties, QoS, Subscribe, SubscriptionOptions};
    let publish = |topic: &str, payload: Vec<u8>| {
        Packet::Publish(Publish {
            qos: QoS::AtMostOnce,
            topic: topic.into(),
            payload: payload.into(),
            ..Publish::default()
        })
    };
    let mut wire = enc(&publish("junk", vec![0; 100_000]), V5);
    wire.extend(enc(&publish("kept", vec![1]), V5));
    wire.extend(enc(&publish("kept/5k", vec![2; 5_000]), V5));
    let with_properties = Packet::Publish(Publish {
        qos: QoS::AtMostOnce,
        topic: "kept/props".into(),
        payload: vec![3].into(),
        properties: PublishProperties {
            correlation_data: Some(vec![4; 8].into()),
            user_properties: vec![("name".into(), "value".into())],
            ..PublishProperties::default()
        },
        ..Publish::default()
    });
    wire.extend(enc(&with_properties, V5));
    let subscribe = Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![("kept/filter".into(), SubscriptionOptions::default())],
        ..Subscribe::default()
    });
    wire.extend(enc(&subscribe, V5));
    let mut buf = BytesMut::from(&wire[..]);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let Some(Packet::Publish(big)) = decode(&mut buf, Some(V5), MAX).expect("decodes") else {
        panic!("the large PUBLISH");
    };
    let Some(Packet::Publish(small)) = decode(&mut buf, Some(V5), MAX).expect("decodes") else {
        panic!("the small PUBLISH");
    };
    let Some(Packet::Publish(mid)) = decode(&mut buf, Some(V5), MAX).expect("decodes") else {
        panic!("the 5 KB PUBLISH");
    };
    let Some(Packet::Publish(props)) = decode(&mut buf, Some(V5), MAX).expect("decodes") else {
        panic!("the PUBLISH with properties");
    };
    let Some(Packet::Subscribe(sub)) = decode(&mut buf, Some(V5), MAX).expect("decodes") else {
        panic!("the SUBSCRIBE");
    };
    assert!(buf.is_empty());
    assert_eq!(&small.payload[..], [1]);
    let correlation = props.properties.correlation_data.as_ref().expect("kept");
    let (name, value) = &props.properties.user_properties[0];
    assert_eq!(mid.payload.len(), 5_000);
    for (what, at) in [
        ("small payload", small.payload.as_ptr() as usize),
        ("small topic", small.topic.as_bytes().as_ptr() as usize),
        ("5 KB payload", mid.payload.as_ptr() as usize),
        ("large payload", big.payload.as_ptr() as usize),
        (
            "properties' topic",
            props.topic.as_bytes().as_ptr() as usize,
        ),
        ("properties' payload", props.payload.as_ptr() as usize),
        ("correlation data", correlation.as_ptr() as usize),
        ("user property name", name.as_bytes().as_ptr() as usize),
        ("user property value", value.as_bytes().as_ptr() as usize),
        ("filter", sub.filters[0].0.as_bytes().as_ptr() as usize),
    ] {
        assert!(
            !range.contains(&at),
            "the {what} is a slice of the read buffer"
        );
    }
}
