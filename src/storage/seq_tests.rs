//! Tests of the cluster stream sequences stored with message bodies (`Op::SequenceMessage`,
//! issue 34): the record round trip, old stores without them, and what the store's own
//! model does with them (replay, snapshots, bodies that go).

use std::time::Duration;

use bytes::Bytes;
use bytestring::ByteString;

use super::log_store::test_support::{assert_ops_round_trip, ops_body};
use super::state::State;
use super::*;
use crate::codec::{PublishProperties, QoS};

fn body(topic: &str) -> StoredMessage {
    StoredMessage {
        topic: ByteString::from(topic),
        payload: Bytes::from_static(b"p"),
        qos: QoS::ExactlyOnce,
        retain: false,
        properties: PublishProperties::default(),
        received_at_unix_ms: 1_700_000_000_000,
        expires_at_unix_ms: None,
        from_anonymous: false,
    }
}

fn session(client: &str) -> Op {
    Op::PutSession(SessionMeta {
        client_id: ByteString::from(client),
        protocol: crate::codec::ProtocolVersion::V5,
        expiry_interval: 3600,
        disconnected_at_unix_ms: Some(1_700_000_000_000),
        owner: SessionOwner::Unbound,
    })
}

fn enqueue(client: &str, seq: u64, id: MessageId) -> Op {
    Op::Enqueue {
        client_id: ByteString::from(client),
        seq,
        entry: QueueEntry::queued(id, QoS::ExactlyOnce),
    }
}

fn put(id: MessageId) -> Op {
    Op::PutMessage {
        id,
        message: body("t"),
    }
}

fn sequence(id: MessageId, stream_seq: u64) -> Op {
    Op::SequenceMessage { id, stream_seq }
}

fn applied(ops: Vec<Op>) -> State {
    let mut state = State::default();
    for op in ops {
        state.apply(op);
    }
    state.end_batch();
    state
}

/// The record comes back field for field, extremes included; cut anywhere it is an error,
/// never a panic nor another op (`Enc` and `Dec` mirror each other).
#[test]
fn a_sequence_record_round_trips() {
    let ops = vec![
        sequence(0, 1),
        sequence(u64::MAX, u64::MAX),
        sequence(7, 97),
    ];
    assert_ops_round_trip(&ops);
}

/// A message body is written as before: the same bytes whether or not the node is
/// clustered (the sequence is a record of its own), so a single node writes nothing more
/// per message, and bytes written by a build without sequences (here written out by hand,
/// field by field as `record::write` has them) decode to a body of unknown sequence.
#[test]
fn an_old_put_message_record_still_decodes_and_is_what_is_written() {
    let mut old = vec![5u8]; // PUT_MESSAGE
    old.extend_from_slice(&9u64.to_le_bytes()); // id
    old.extend_from_slice(&1u32.to_le_bytes()); // topic
    old.push(b't');
    old.extend_from_slice(&1u32.to_le_bytes()); // payload
    old.push(b'p');
    old.extend_from_slice(&[2, 0]); // QoS 2, not retained
    old.extend_from_slice(&[0, 0, 0, 0]); // format, expiry, response topic, correlation
    old.extend_from_slice(&0u32.to_le_bytes()); // user properties
    old.push(0); // content type
    old.extend_from_slice(&1_700_000_000_000u64.to_le_bytes()); // received
    old.push(0); // expires
    let mut dec = record::Dec::new(&old);
    assert_eq!(dec.op().expect("decode"), put(9));
    assert!(dec.is_empty());
    assert_eq!(
        ops_body(&[put(9)])[5..],
        old[..],
        "PutMessage's bytes changed"
    );
}

/// A store of a build without sequences (no `SequenceMessage` record) loads as it did: its
/// bodies come back, none with a sequence. Sequences written later are kept with their
/// bodies across a reopen (log replay) and a snapshot.
#[test]
fn a_store_without_sequences_loads_and_sequences_survive_reopen_and_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = LogStore::open(dir.path(), LogOptions::default()).expect("open");
    commit(&store, vec![session("c"), put(1), enqueue("c", 0, 1)]);
    let old = store.load().expect("load");
    assert_eq!(old.messages.len(), 1);
    assert!(old.stream_seqs.is_empty(), "{:?}", old.stream_seqs);
    // Another node's message (its sequence with it), then this node's own one's later.
    commit(&store, vec![put(2), sequence(2, 40), enqueue("c", 1, 2)]);
    commit(&store, vec![put(3), enqueue("c", 2, 3)]);
    commit(&store, vec![sequence(3, 41)]);
    store.close().expect("close");

    let reopened = LogStore::open(dir.path(), LogOptions::default()).expect("reopen");
    let snap = reopened.load().expect("load after reopen");
    let mut seqs: Vec<_> = snap.stream_seqs.iter().map(|(i, s)| (*i, *s)).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![(2, 40), (3, 41)], "message 1 stays unsequenced");
    reopened.close().expect("close");

    // What a snapshot file holds (`for_each_op`) rebuilds the same sequences.
    let state = applied(vec![
        session("c"),
        put(1),
        enqueue("c", 0, 1),
        put(2),
        sequence(2, 40),
        enqueue("c", 1, 2),
    ]);
    let mut ops = Vec::new();
    state.for_each_op(|op| ops.push(op.clone()));
    assert_eq!(applied(ops).to_snapshot(), state.to_snapshot());
}

/// A sequence goes with its body: one for a body already gone (acknowledged before
/// JetStream's acknowledgement came) is ignored, not an orphan, and a body's last
/// reference removed takes its sequence along.
#[test]
fn a_sequence_goes_with_its_body() {
    let mut state = applied(vec![session("c"), put(1), enqueue("c", 0, 1)]);
    state.apply(sequence(5, 50));
    state.apply(sequence(1, 10));
    assert_eq!(state.orphans, 0);
    assert_eq!(state.to_snapshot().stream_seqs.get(&1), Some(&10));
    assert_eq!(state.to_snapshot().stream_seqs.len(), 1);
    state.apply(Op::RemoveEntry {
        client_id: ByteString::from("c"),
        seq: 0,
    });
    let snap = state.to_snapshot();
    assert!(snap.messages.is_empty() && snap.stream_seqs.is_empty());
    // Put and left unreferenced in its batch: gone at the batch's end, sequence too.
    let mut state = State::default();
    state.apply(put(2));
    state.apply(sequence(2, 20));
    state.end_batch();
    assert!(state.to_snapshot().stream_seqs.is_empty());
}

/// Submits and waits until durable (also for `anonymous_tests`).
pub(super) fn commit(store: &dyn Store, ops: Vec<Op>) {
    let submitted = store.submit(ops).expect("submit");
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                store.wait_durable(submitted.ticket),
            )
            .await
        })
        .expect("timed out waiting for durability")
        .expect("durable");
}
