//! Tests of the mark an anonymous client's message keeps in the store, retained (record tag
//! `PUT_RETAINED_ANONYMOUS`, pass 7B P1) or queued (`PUT_MESSAGE_ANONYMOUS`, issue 35,
//! fifteenth pass, B3): the record round trip, the bytes of every other record unchanged, and
//! the mark kept across a reopen and a snapshot.

use bytes::Bytes;
use bytestring::ByteString;

use super::seq_tests::commit;
use super::state::State;
use super::*;
use crate::codec::{PublishProperties, QoS};

fn retained(topic: &str, from_anonymous: bool) -> Op {
    Op::PutRetained {
        topic: ByteString::from(topic),
        message: StoredMessage {
            topic: ByteString::from(topic),
            payload: Bytes::from_static(b"p"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: PublishProperties::default(),
            received_at_unix_ms: 1_700_000_000_000,
            expires_at_unix_ms: None,
            from_anonymous,
        },
    }
}

/// One op encoded as the writer encodes it.
fn encoded(op: &Op) -> Vec<u8> {
    let mut out = Vec::new();
    record::Enc(&mut out).op(op);
    out
}

/// An anonymous client's retained message comes back marked; cut anywhere its record is an
/// error, never a panic nor another op. Every other retained message is written with the
/// older tag (11) and the very bytes it had before the mark existed (here written out by
/// hand, field by field as `record::write` has them), so a store without anonymous retained
/// messages is unchanged and an older store loads as it did, unmarked.
#[test]
fn an_anonymous_retained_record_round_trips_and_others_keep_their_bytes() {
    let anonymous = encoded(&retained("t", true));
    assert_eq!(anonymous[0], 19, "PUT_RETAINED_ANONYMOUS");
    let mut dec = record::Dec::new(&anonymous);
    assert_eq!(dec.op().expect("decode"), retained("t", true));
    assert!(dec.is_empty());
    for cut in 1..anonymous.len() {
        assert!(
            record::Dec::new(&anonymous[..cut]).op().is_err(),
            "a record cut at {cut} decoded"
        );
    }

    let mut old = vec![11u8]; // PUT_RETAINED
    old.extend_from_slice(&1u32.to_le_bytes()); // topic (the key)
    old.push(b't');
    old.extend_from_slice(&1u32.to_le_bytes()); // the message's topic
    old.push(b't');
    old.extend_from_slice(&1u32.to_le_bytes()); // payload
    old.push(b'p');
    old.extend_from_slice(&[1, 1]); // QoS 1, retained
    old.extend_from_slice(&[0, 0, 0, 0]); // format, expiry, response topic, correlation
    old.extend_from_slice(&0u32.to_le_bytes()); // user properties
    old.push(0); // content type
    old.extend_from_slice(&1_700_000_000_000u64.to_le_bytes()); // received
    old.push(0); // expires
    assert_eq!(
        encoded(&retained("t", false)),
        old,
        "PutRetained's bytes changed"
    );
    let mut dec = record::Dec::new(&old);
    assert_eq!(dec.op().expect("decode"), retained("t", false));
    assert!(dec.is_empty());
    // The same fields behind either tag.
    assert_eq!(anonymous[1..], old[1..]);
}

/// The mark is kept by the log (a reopen replays it), by a replacement (the newer record's
/// mark wins) and by what a snapshot or a compaction writes out (`for_each_op`).
#[test]
fn the_mark_survives_reopen_replacement_and_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LogStore::open(dir.path(), LogOptions::default()).expect("open");
    commit(
        &store,
        vec![
            retained("anon", true),
            retained("user", false),
            retained("was-anon", true),
        ],
    );
    commit(&store, vec![retained("was-anon", false)]);
    store.close().expect("close");

    let reopened = LogStore::open(dir.path(), LogOptions::default()).expect("reopen");
    let snap = reopened.load().expect("load after reopen");
    reopened.close().expect("close");
    let marks: Vec<(&str, bool)> = snap
        .retained
        .iter()
        .map(|(topic, m)| (&**topic, m.from_anonymous))
        .collect();
    assert_eq!(
        marks,
        vec![("anon", true), ("user", false), ("was-anon", false)]
    );

    let mut state = State::default();
    for op in [retained("anon", true), retained("user", false)] {
        state.apply(op);
    }
    state.end_batch();
    let mut ops = Vec::new();
    state.for_each_op(|op| ops.push(encoded(op)));
    let mut again = State::default();
    for bytes in &ops {
        again.apply(record::Dec::new(bytes).op().expect("decode"));
    }
    again.end_batch();
    assert_eq!(again.to_snapshot(), state.to_snapshot());
    assert!(again.to_snapshot().retained[0].1.from_anonymous);
}

fn body(id: u64, from_anonymous: bool) -> Op {
    match retained("q", from_anonymous) {
        Op::PutRetained { message, .. } => Op::PutMessage {
            id,
            message: StoredMessage {
                retain: false,
                ..message
            },
        },
        _ => unreachable!("retained() makes a PutRetained"),
    }
}

/// A stranger's queued body comes back marked (tag 20), cut anywhere its record is an error;
/// every other body keeps the tag (5) and bytes it always had, the same fields as the marked
/// one's, so an older store loads as it did.
#[test]
fn an_anonymous_body_round_trips_and_others_keep_their_bytes() {
    let anonymous = encoded(&body(7, true));
    assert_eq!(anonymous[0], 20, "PUT_MESSAGE_ANONYMOUS");
    let mut dec = record::Dec::new(&anonymous);
    assert_eq!(dec.op().expect("decode"), body(7, true));
    assert!(dec.is_empty());
    for cut in 1..anonymous.len() {
        assert!(
            record::Dec::new(&anonymous[..cut]).op().is_err(),
            "a record cut at {cut} decoded"
        );
    }
    let plain = encoded(&body(7, false));
    assert_eq!(plain[0], 5, "PUT_MESSAGE");
    assert_eq!(anonymous[1..], plain[1..]);
    let mut dec = record::Dec::new(&plain);
    assert_eq!(dec.op().expect("decode"), body(7, false));

    // What a snapshot or compaction writes out keeps it.
    let mut state = State::default();
    state.apply(Op::PutSession(SessionMeta {
        client_id: ByteString::from("reader"),
        protocol: crate::codec::ProtocolVersion::V5,
        expiry_interval: 3600,
        disconnected_at_unix_ms: None,
        owner: SessionOwner::Unbound,
    }));
    state.apply(body(7, true));
    state.apply(Op::Enqueue {
        client_id: ByteString::from("reader"),
        seq: 1,
        entry: QueueEntry::queued(7, QoS::AtLeastOnce),
    });
    state.end_batch();
    let mut ops = Vec::new();
    state.for_each_op(|op| ops.push(encoded(op)));
    assert!(ops.contains(&anonymous), "the snapshot lost the mark");
}
