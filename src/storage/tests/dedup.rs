//! Delivery counts and dedup keys (issue 16): a restart must not reset a poison message's
//! count, and still knows a dedup key inside its window.

use super::*;
use crate::storage::log_store::test_support::assert_ops_round_trip;

// ---- delivery counts and dedup keys (issue 16) --------------------------------------------
// `Op::CountDelivery` (`mqtt.max_deliveries`: a restart must not reset a poison message's
// count) and `Op::PutDedup` (`[dedup]`: a restart inside the window still knows the key).

fn count_delivery(client: &str, seq: u64, deliveries: u16) -> Op {
    Op::CountDelivery {
        client_id: bs(client),
        seq,
        deliveries,
    }
}

fn put_dedup(topic: &str, key: &str, expires_at_unix_ms: u64) -> Op {
    Op::PutDedup {
        topic: bs(topic),
        key: bs(key),
        expires_at_unix_ms,
    }
}

/// A session "c" holding message 1 at seq 0, sent once (QoS 1, awaiting PUBACK).
fn sent_entry_ops() -> Vec<Op> {
    vec![
        session("c"),
        Op::PutMessage {
            id: 1,
            message: message("t", b"poison"),
        },
        enqueue("c", 0, 1),
        Op::UpdateEntry {
            client_id: bs("c"),
            seq: 0,
            stage: EntryStage::AwaitPubAck { packet_id: 1 },
        },
    ]
}

fn deliveries_of(snap: &Snapshot, client: &str, seq: u64) -> u16 {
    session_of(snap, client)
        .queue
        .iter()
        .find(|(s, _)| *s == seq)
        .map_or_else(
            || panic!("entry {seq} of {client} missing"),
            |(_, e)| e.deliveries,
        )
}

/// Both new ops come back from the record format field for field, extremes included
/// (`Enc` and `Dec` must mirror each other, record/mod.rs).
#[test]
fn count_delivery_and_put_dedup_records_round_trip() {
    let ops = vec![
        count_delivery("ü/c", u64::MAX, u16::MAX),
        count_delivery("", 0, 1),
        put_dedup("a/b/ü", "order-42", 1_800_000_000_000),
        put_dedup("t", "", u64::MAX),
    ];
    // Cut anywhere, the record is an error, never a panic nor a different op.
    assert_ops_round_trip(&ops);
}

/// Replaying the log: the first send (`UpdateEntry` out of `Queued`) implies 1, each
/// `CountDelivery` sets the count, a later stage change (PUBREC → awaiting PUBCOMP) keeps it,
/// and it all survives a reopen; dedup keys come back; a count for a missing session is an
/// orphan, not a failure.
#[test]
fn delivery_counts_and_dedup_keys_replay_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(&store, sent_entry_ops());
    assert_eq!(deliveries_of(&store.load().expect("load"), "c", 0), 1);
    commit(
        &store,
        vec![
            enqueue("c", 1, 1),
            count_delivery("c", 0, 2),
            count_delivery("c", 0, 3),
            put_dedup("t", "k1", now_unix_ms() + 3_600_000),
        ],
    );
    // A QoS 2 entry: its count is kept across the PUBREL stage.
    commit(
        &store,
        vec![
            Op::UpdateEntry {
                client_id: bs("c"),
                seq: 1,
                stage: EntryStage::AwaitPubRec { packet_id: 2 },
            },
            count_delivery("c", 1, 2),
            Op::UpdateEntry {
                client_id: bs("c"),
                seq: 1,
                stage: EntryStage::AwaitPubComp { packet_id: 2 },
            },
            count_delivery("nobody", 0, 2),
        ],
    );
    assert_eq!(store.stats().orphan_ops, 1);
    let before = store.load().expect("load");
    store.close().expect("close");

    let store = open_at(dir.path(), opts());
    let after = store.load().expect("load after reopen");
    assert_eq!(after, before);
    assert_eq!(deliveries_of(&after, "c", 0), 3);
    assert_eq!(deliveries_of(&after, "c", 1), 2);
    assert_eq!(after.dedup.len(), 1);
    assert_eq!((&*after.dedup[0].topic, &*after.dedup[0].key), ("t", "k1"));
}

/// `Store::bound_dedup`: the store keeps about as many dedup keys as the window (the newest),
/// not every key of the window's length (issue 16: "bounded memory (entries and bytes),
/// persisted with the store"), in its state and so in what a restart restores.
#[test]
fn a_bounded_store_keeps_the_newest_dedup_keys_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    store.bound_dedup(10);
    let base = now_unix_ms() + 3_600_000;
    for i in 0..100u64 {
        commit(&store, vec![put_dedup("t", &format!("k{i}"), base + i)]);
    }
    let held = store.load().expect("load").dedup;
    assert!(
        (10..=10 + 10 / 4 + 16).contains(&held.len()),
        "{} keys held for a bound of 10",
        held.len()
    );
    assert!(held.iter().any(|r| &*r.key == "k99"), "the newest is kept");
    assert!(!held.iter().any(|r| &*r.key == "k0"), "the oldest went");
    store.close().expect("close");
    let store = open_at(dir.path(), opts());
    assert!(store.load().expect("load after reopen").dedup.len() <= 100);
}

/// Compaction writes the state back as ops (`State::for_each_op`): a count above what the
/// stage implies must follow its `Enqueue` (the `Enqueue` record carries none), and dedup keys
/// must be written too, or a compaction would reset poison counts and forget keys. Checked on
/// the state itself, then through a real snapshot and reopen.
#[test]
fn compaction_keeps_delivery_counts_and_dedup_keys() {
    let mut ops = sent_entry_ops();
    ops.push(count_delivery("c", 0, 4));
    ops.push(put_dedup("t", "k1", now_unix_ms() + 3_600_000));
    let mut state = state::State::default();
    for op in ops.clone() {
        state.apply(op);
    }
    state.end_batch();
    let mut rewritten = Vec::new();
    state.for_each_op(|op| rewritten.push(op.clone()));
    let enqueue_at = rewritten
        .iter()
        .position(|op| matches!(op, Op::Enqueue { seq: 0, .. }))
        .expect("enqueue written");
    assert!(
        matches!(
            rewritten.get(enqueue_at + 1),
            Some(Op::CountDelivery {
                seq: 0,
                deliveries: 4,
                ..
            })
        ),
        "{rewritten:?}"
    );
    let mut copy = state::State::default();
    for op in rewritten {
        copy.apply(op);
    }
    copy.end_batch();
    assert_eq!(copy.to_snapshot(), state.to_snapshot());
    assert_eq!(copy.live_bytes, state.live_bytes);

    // The same through a snapshot on disk: compact on every commit, then reopen.
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LogOptions {
        compact_min_bytes: 1,
        ..opts()
    };
    let store = open_at(dir.path(), options.clone());
    commit(&store, ops);
    // Each commit past the threshold starts one (or collects the running one).
    until_compacted(&store, Duration::from_secs(20), || {
        commit(&store, vec![session("churn")]);
    });
    let before = store.load().expect("load");
    store.close().expect("close");
    assert!(
        store_files(dir.path())
            .iter()
            .any(|f| f.starts_with("snapshot-")),
        "{:?}",
        store_files(dir.path())
    );
    let store = open_at(dir.path(), options);
    let after = store.load().expect("load after reopen");
    assert_eq!(after, before);
    assert_eq!(deliveries_of(&after, "c", 0), 4);
    assert_eq!(after.dedup.len(), 1);
}

/// The store's purge (run by the writer and by compaction) drops dedup keys whose window has
/// closed, gives their bytes back, and keeps the open ones.
#[test]
fn purge_drops_expired_dedup_keys_only() {
    let mut state = state::State::default();
    let empty = state.live_bytes;
    state.apply(put_dedup("t", "kept", 5_000));
    let with_kept = state.live_bytes;
    state.apply(put_dedup("t", "gone", 1_000));
    state.apply(put_dedup("u", "gone", 2_000));
    // The same key again only moves its expiry.
    state.apply(put_dedup("t", "kept", 6_000));
    assert_eq!(state.to_snapshot().dedup.len(), 3);
    assert!(state.live_bytes > with_kept);

    assert_eq!(state.purge_expired(2_000), 2);
    let snap = state.to_snapshot();
    assert_eq!(snap.dedup.len(), 1);
    assert_eq!(
        (&*snap.dedup[0].key, snap.dedup[0].expires_at_unix_ms),
        ("kept", 6_000)
    );
    assert_eq!(state.live_bytes, with_kept);
    assert_eq!(state.purge_expired(6_000), 1);
    assert!(state.to_snapshot().dedup.is_empty());
    assert_eq!(state.live_bytes, empty);
}
