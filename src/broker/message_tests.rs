//! Unit tests of `broker::message` (kept apart so the module stays a readable size).

use super::*;

/// Collects a PUBLISH written in pieces into one buffer, counting the pieces.
#[derive(Default)]
struct Pieces {
    batch: BytesMut,
    out: BytesMut,
    pieces: usize,
}

impl codec::PieceSink for Pieces {
    fn batch(&mut self) -> &mut BytesMut {
        &mut self.batch
    }
    fn piece(&mut self, bytes: Bytes) {
        let batch = self.batch.split();
        self.out.extend_from_slice(&batch);
        self.out.extend_from_slice(&bytes);
        self.pieces += 1;
    }
}

/// Issue 35, twenty-first adversarial pass, G1: a message with large properties keeps
/// them encoded once, and a delivery written in pieces ([`Message::write_apart`]) is the
/// packet [`Message::write_to`] writes whole, for every kind of subscriber (3.1.1; v5
/// with subscription identifiers, a Topic Alias, an expiry that has counted down),
/// property order aside (User Properties keep theirs, MQTT-3.3.2-18).
#[test]
fn a_delivery_in_pieces_is_the_packet_written_whole() {
    let mut publish = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "big/props".into(),
        packet_id: 1,
        payload: Bytes::from_static(b"1"),
        properties: PublishProperties {
            message_expiry_interval: Some(600),
            content_type: Some("application/json".into()),
            ..PublishProperties::default()
        },
    };
    publish.properties.user_properties = (0..30)
        .map(|i| (format!("k{i}").into(), "v".repeat(1000).into()))
        .collect();
    let mut message = Message::from_publish(publish, None);
    assert!(message
        .properties
        .as_ref()
        .is_some_and(|p| p.forwarded.is_some()));
    message.received_at -= std::time::Duration::from_secs(5);
    let alias = |with_topic| codec::PublishAlias {
        alias: 3,
        with_topic,
    };
    let cases = [
        (ProtocolVersion::V3_1_1, &[][..], None),
        (ProtocolVersion::V5, &[][..], None),
        (
            ProtocolVersion::V5,
            &[4, 268_435_455][..],
            Some(alias(true)),
        ),
        (ProtocolVersion::V5, &[][..], Some(alias(false))),
    ];
    for (version, ids, topic_alias) in cases {
        let flags = PublishFlags {
            qos: QoS::AtLeastOnce,
            retain: false,
            dup: true,
            packet_id: 9,
            subscription_ids: ids,
            topic_alias,
        };
        let mut whole = BytesMut::new();
        let len = message.write_to(&mut whole, version, flags).expect("whole");
        let mut pieces = Pieces::default();
        let apart_len = message
            .write_apart(&mut pieces, version, flags, usize::MAX)
            .expect("apart");
        let mut apart = pieces.out;
        apart.extend_from_slice(&pieces.batch);
        assert_eq!((apart_len, apart.len()), (len, len), "{version:?}");
        assert_eq!(pieces.pieces, usize::from(version.is_v5()), "{version:?}");
        let decoded = |mut bytes: BytesMut| codec::decode(&mut bytes, Some(version), usize::MAX);
        assert_eq!(
            decoded(apart).expect("decodes"),
            decoded(whole).expect("decodes"),
            "{version:?} {ids:?} {topic_alias:?}"
        );
    }
}

/// Every queued message costs its `Message`, so its size is a per-message cost of every
/// backlog: 376 B with `PublishProperties` inline, 224 B with them boxed only when present.
#[test]
fn message_stays_small() {
    let size = size_of::<Message>();
    assert!(size <= 224, "Message is {size} B");
}

/// What a shared group's fit check assumes (`session::fits_client`): no PUBLISH of a
/// message is larger than its size and `PUBLISH_OVERHEAD`, with the largest packet id,
/// Subscription Identifier (4-byte varint), Topic Alias and remaining length there are,
/// so a member the check finds room in is never sent more than its Maximum Packet Size
/// (MQTT-3.1.2-24; issue 35, sixteenth adversarial pass, C4: 16 was one byte short for a
/// message over 2 MiB with 16 KiB of properties).
#[test]
fn no_publish_is_larger_than_the_fit_check_assumes() {
    let large = PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        content_type: Some("c".repeat(20_000).into()),
        response_topic: Some("r".into()),
        correlation_data: Some(Bytes::from_static(b"id")),
        ..PublishProperties::default()
    };
    let users = PublishProperties {
        user_properties: vec![("k".into(), "v".into()); 50],
        ..PublishProperties::default()
    };
    for (payload, properties) in [
        (1, PublishProperties::default()),
        (3 << 20, large),
        (100, users),
    ] {
        let message = Message::from_publish(
            Publish {
                topic: "a/b".into(),
                payload: Bytes::from(vec![0; payload]),
                qos: QoS::AtLeastOnce,
                properties,
                ..Publish::default()
            },
            None,
        );
        let mut out = BytesMut::new();
        let flags = PublishFlags {
            qos: QoS::AtLeastOnce,
            retain: false,
            dup: false,
            packet_id: u16::MAX,
            subscription_ids: &[268_435_455],
            topic_alias: Some(codec::PublishAlias {
                alias: u16::MAX,
                with_topic: true,
            }),
        };
        let len = message
            .write_to(&mut out, ProtocolVersion::V5, flags)
            .expect("encodes");
        let size = message.size();
        // A client whose Maximum Packet Size is one byte short is never found room in.
        let short = u32::try_from(len - 1).expect("small");
        assert!(
            !crate::broker::session::fits_client(size, short),
            "a PUBLISH of {len} bytes from a message of {size}"
        );
    }
}

/// Issue 35, eighth pass, Q1: what a message holds counts its properties, not only its
/// topic and payload, so no bound can be passed by carrying bytes in them.
#[test]
fn a_messages_size_counts_its_properties() {
    let mut publish = Publish {
        topic: "a/b".into(),
        payload: Bytes::from_static(b"x"),
        ..Publish::default()
    };
    assert_eq!(Message::from_publish(publish.clone(), None).size(), 4);
    publish.properties.user_properties = vec![("k".into(), "v".repeat(1000).into())];
    publish.properties.correlation_data = Some(Bytes::from(vec![0; 500]));
    let size = Message::from_publish(publish, None).size();
    assert!(size >= 4 + 1000 + 500, "{size}");
}

/// Issue 35, ninth pass, R4: each cached encoding of a message (v3 / v5 × with or without
/// a packet id) is counted in the memory budget as it is made, once, and uncounted with
/// the message. Before, only the message's own size was: four more copies went uncounted.
#[test]
fn cached_encodings_count_while_the_message_lives() {
    let counted = crate::broker::flow::unflushed_message_bytes;
    let start = counted();
    let message = Message::from_publish(
        Publish {
            topic: "a/b".into(),
            payload: Bytes::from(vec![b'p'; 1000]),
            ..Publish::default()
        },
        None,
    );
    assert_eq!(counted() - start, 1003);
    let mut written = 0;
    for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
        for (qos, packet_id) in [(QoS::AtMostOnce, 0), (QoS::AtLeastOnce, 7)] {
            let flags = PublishFlags {
                qos,
                retain: false,
                dup: false,
                packet_id,
                subscription_ids: &[],
                topic_alias: None,
            };
            let mut out = BytesMut::new();
            let n = message.write_to(&mut out, version, flags).unwrap();
            written += i64::try_from(n).unwrap();
            assert_eq!(counted() - start, 1003 + written, "{version:?} {qos:?}");
            // Again: the copy comes from the cache and adds nothing.
            message.write_to(&mut out, version, flags).unwrap();
            assert_eq!(
                counted() - start,
                1003 + written,
                "{version:?} {qos:?} again"
            );
        }
    }
    assert!(written > 4 * 1000, "four encodings counted: {written}");
    drop(message);
    assert_eq!(counted(), start);
}

#[test]
fn properties_are_boxed_only_when_present() {
    let plain = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "a/b".into(),
        packet_id: 1,
        payload: Bytes::from_static(b"x"),
        properties: PublishProperties::default(),
    };
    let mut with_props = plain.clone();
    with_props.properties.content_type = Some("text/plain".into());
    with_props.properties.topic_alias = Some(3); // stripped: not forwarded
    let plain = Message::from_publish(plain, None);
    let with_props = Message::from_publish(with_props, None);
    assert!(plain.properties.is_none());
    assert!(plain.properties().is_empty());
    assert_eq!(
        with_props.properties().content_type.as_deref(),
        Some("text/plain")
    );
    assert_eq!(with_props.properties().topic_alias, None);
}
