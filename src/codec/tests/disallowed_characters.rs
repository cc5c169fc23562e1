//! The characters the spec says SHOULD NOT appear (control characters, non-characters) in
//! topic names, filters and the strings a PUBLISH forwards: refused by the broker's default
//! rules (`DecodeRules::allow_control_characters` off), passed by `decode` alone. Split from
//! `malformed` (the MUSTs) to keep each file to one job.

use bytes::BytesMut;

use super::super::*;
use super::malformed::{connect, filters_packet, ALL};
use super::{dec, MAX, V5};
use DecodeError::Malformed;

/// Decodes `bytes` as one packet with control characters refused (the broker's default).
fn strict(bytes: &[u8], version: Option<ProtocolVersion>) -> Result<Packet, DecodeError> {
    let rules = DecodeRules {
        max_packet_size: MAX,
        allow_control_characters: false,
    };
    let mut buf = BytesMut::from(bytes);
    let packet = decode_with(&mut buf, version, rules)?.expect("complete");
    assert!(buf.is_empty());
    Ok(packet)
}

/// 5.0 §1.5.4 / 3.1.1 §1.5.3: U+0001..U+001F, U+007F..U+009F and the non-characters SHOULD
/// NOT appear; with `allow_control_characters: false` a topic name (PUBLISH, will) or filter
/// carrying one is Malformed, with `decode` (only the MUSTs) it passes. Their neighbours
/// always pass.
#[test]
fn control_characters_follow_the_rules() {
    for v in ALL {
        let props = if v == Some(V5) { &[0x00][..] } else { &[][..] };
        let publish = |topic: &str| {
            let mut body = (topic.len() as u16).to_be_bytes().to_vec();
            body.extend_from_slice(topic.as_bytes());
            body.extend_from_slice(props);
            let mut out = vec![0x30, body.len() as u8];
            out.extend(body);
            out
        };
        for c in [
            "\u{1}",
            "\u{1F}",
            "\u{7F}",
            "\u{80}",
            "\u{9F}",
            "\u{FDD0}",
            "\u{FDEF}",
            "\u{FFFE}",
            "\u{FFFF}",
            "\u{1FFFE}",
            "\u{10FFFF}",
        ] {
            let topic = format!("a/{c}");
            for bytes in [
                publish(&topic),
                filters_packet(v, true, &[&topic]),
                filters_packet(v, false, &["ok", &topic]),
                filters_packet(v, true, &[&format!("$share/g/{topic}")]),
            ] {
                assert!(
                    matches!(strict(&bytes, v), Err(Malformed(_))),
                    "{bytes:02X?}"
                );
                assert!(dec(&bytes, v).is_ok(), "{bytes:02X?}");
            }
        }
        for ok in [
            " ",
            "~",
            "\u{A0}",
            "\u{FF}",
            "\u{100}",
            "\u{2028}",
            "\u{FDCF}",
            "\u{FDF0}",
            "\u{FFFD}",
            "\u{1F600}",
            "\u{10FFFD}",
        ] {
            let topic = format!("a/{ok}");
            assert!(strict(&publish(&topic), v).is_ok(), "{topic:?}");
            assert!(strict(&filters_packet(v, true, &[&topic]), v).is_ok());
        }
    }
    // The will topic, at both CONNECT layouts (client id "", will payload empty).
    for level in [4, 5] {
        let will = |topic: &[u8]| {
            let mut rest = vec![0x00, 0x00];
            if level == 5 {
                rest.push(0x00);
            }
            rest.extend_from_slice(&(topic.len() as u16).to_be_bytes());
            rest.extend_from_slice(topic);
            rest.extend_from_slice(&[0x00, 0x00]);
            connect(level, 0x06, &rest)
        };
        assert!(matches!(strict(&will(b"w\x1B"), None), Err(Malformed(_))));
        assert!(matches!(
            strict(&will(&[b'w', 0xC2, 0x8A]), None),
            Err(Malformed(_))
        ));
        assert!(dec(&will(b"w\x1B"), None).is_ok());
        assert!(strict(&will(&[b'w', 0xC2, 0xA0]), None).is_ok());
        // Client id and user name are left to the broker (their own CONNACK codes).
        let rest = [0x00, 0x01, 0x07, 0x00, 0x01, 0x07];
        assert!(strict(&connect(level, 0x82, &rest), None).is_ok());
    }
}

/// The strings a PUBLISH or a will carries on to subscribers (Content Type, Response Topic,
/// User Properties) follow the topic name's rule (5.0 §1.5.4): with
/// `allow_control_characters: false` a control character or non-character in one is
/// Malformed, with `decode` it passes; the same strings without it pass (issue 35,
/// thirteenth adversarial pass, F3: forwarded, they reached subscribers whose clients may
/// treat the packet as malformed).
#[test]
fn forwarded_property_strings_follow_the_topic_rule() {
    let encoded = |publish: Publish| {
        let mut out = BytesMut::new();
        encode(&Packet::Publish(publish), V5, &mut out).expect("encodes");
        out.to_vec()
    };
    let with = |text: &str, which: usize| {
        let mut p = Publish {
            topic: "a/b".into(),
            ..Default::default()
        };
        match which {
            0 => p.properties.content_type = Some(text.into()),
            1 => p.properties.response_topic = Some(text.into()),
            2 => p.properties.user_properties = vec![(text.into(), "v".into())],
            _ => p.properties.user_properties = vec![("k".into(), text.into())],
        }
        encoded(p)
    };
    for which in 0..4 {
        for bad in [
            "x\u{7}",
            "\u{1B}[31m",
            "x\u{85}",
            "\u{FFFF}",
            "x\u{FDD0}y",
            "\u{10FFFE}",
        ] {
            let bytes = with(bad, which);
            assert!(
                matches!(strict(&bytes, Some(V5)), Err(Malformed(_))),
                "{which} {bad:?}"
            );
            assert!(dec(&bytes, Some(V5)).is_ok(), "{which} {bad:?}");
        }
        for ok in ["text/plain", "r\u{A0}\u{FFFD}", "\u{1F600}"] {
            assert!(strict(&with(ok, which), Some(V5)).is_ok(), "{which} {ok:?}");
        }
    }
    // A will's properties: CONNECT v5, will flag, will properties with a user property.
    let will = |value: &[u8]| {
        let mut props = vec![0x26, 0x00, 0x01, b'k'];
        props.extend_from_slice(&(value.len() as u16).to_be_bytes());
        props.extend_from_slice(value);
        let mut rest = vec![0x00, 0x00]; // empty client id
        rest.push(props.len() as u8);
        rest.extend_from_slice(&props);
        rest.extend_from_slice(&[0x00, 0x01, b'w', 0x00, 0x00]); // will topic, payload
        connect(5, 0x06, &rest)
    };
    assert!(matches!(strict(&will(b"v\x07"), None), Err(Malformed(_))));
    assert!(matches!(
        strict(&will("\u{FFFE}".as_bytes()), None),
        Err(Malformed(_))
    ));
    assert!(dec(&will(b"v\x07"), None).is_ok());
    assert!(strict(&will(b"v"), None).is_ok());
}
