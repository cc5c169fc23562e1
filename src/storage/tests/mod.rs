//! Store tests on real files in temporary directories (no mocked disk), including a crash test
//! that SIGKILLs a child process mid-write.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::smallvec;

use super::log_store::test_support::{
    file_of, log_name, ops_body, snapshot_name, HEADER_LEN, KIND_TRAILER,
};
use super::log_store::STORE_DIR;
use super::*;
use crate::codec::{
    LastWill, ProtocolVersion, PublishProperties, QoS, SubscriptionOptions, WillProperties,
};

fn bs(s: &str) -> ByteString {
    ByteString::from(s)
}

fn message(topic: &str, payload: &[u8]) -> StoredMessage {
    StoredMessage {
        topic: bs(topic),
        payload: Bytes::copy_from_slice(payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: PublishProperties::default(),
        received_at_unix_ms: 1_700_000_000_000,
        expires_at_unix_ms: None,
        from_anonymous: false,
    }
}

fn rich_message() -> StoredMessage {
    StoredMessage {
        topic: bs("a/b/ü"),
        payload: Bytes::from_static(b"\x00\x01payload\xff"),
        qos: QoS::ExactlyOnce,
        retain: true,
        properties: PublishProperties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(3600),
            response_topic: Some(bs("reply/here")),
            correlation_data: Some(Bytes::from_static(b"corr")),
            user_properties: vec![(bs("k"), bs("v")), (bs("k"), bs("v2"))],
            content_type: Some(bs("text/plain")),
            ..Default::default()
        },
        received_at_unix_ms: now_unix_ms(),
        expires_at_unix_ms: Some(now_unix_ms() + 3_600_000),
        from_anonymous: false,
    }
}

fn will() -> LastWill {
    LastWill {
        topic: bs("wills/c1"),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: WillProperties {
            will_delay_interval: Some(30),
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(60),
            content_type: Some(bs("text/plain")),
            response_topic: Some(bs("r")),
            correlation_data: Some(Bytes::from_static(b"c")),
            user_properties: vec![(bs("a"), bs("b"))],
        },
    }
}

fn session(client: &str) -> Op {
    Op::PutSession(SessionMeta {
        client_id: bs(client),
        protocol: ProtocolVersion::V5,
        expiry_interval: 3600,
        disconnected_at_unix_ms: None,
        owner: SessionOwner::Unbound,
    })
}

fn entry(id: MessageId) -> QueueEntry {
    QueueEntry::queued(id, QoS::AtLeastOnce)
}

fn enqueue(client: &str, seq: u64, id: MessageId) -> Op {
    Op::Enqueue {
        client_id: bs(client),
        seq,
        entry: entry(id),
    }
}

/// The removal of `client`'s queue entry `seq` (acknowledged or dropped).
fn remove_entry(client: &str, seq: u64) -> Op {
    Op::RemoveEntry {
        client_id: bs(client),
        seq,
    }
}

fn opts() -> LogOptions {
    LogOptions::default()
}

/// Opens the store in `dir`. A reopen right after a close may find the lock still held by
/// this very process: a child process another test spawns at that moment holds a copy of the
/// lock file's descriptor until its exec closes it (a `flock` belongs to the open file).
/// Nothing signals that exec, so the open is tried again, at most 50 times 20 ms apart (as
/// the suite's `common::start_with` does); a lock held by another process fails at once.
fn open_at(dir: &Path, opts: LogOptions) -> LogStore {
    let ours = format!("pid {},", std::process::id());
    for _ in 0..50 {
        match LogStore::open(dir, opts.clone()) {
            Err(StorageError::Locked { holder, .. }) if holder.contains(&ours) => {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result.expect("open store"),
        }
    }
    LogStore::open(dir, opts).expect("open store")
}

/// A store opened with `opts` in a fresh directory, returned with it: keep the directory for
/// as long as the store (tests that never reopen it need nothing else from it).
fn fresh_store(opts: LogOptions) -> (tempfile::TempDir, LogStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts);
    (dir, store)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), f).await })
        .expect("timed out waiting for durability")
}

/// Submits and waits until durable.
fn commit(store: &dyn Store, ops: Vec<Op>) -> Ticket {
    let submitted = store.submit(ops).expect("submit");
    block_on(store.wait_durable(submitted.ticket)).expect("durable");
    submitted.ticket
}

/// Runs `step` until `store` reports a compaction, failing with its stats after `within`:
/// the compaction tests' wait (their step either commits more, which starts one, or only
/// polls the counter the compaction thread publishes).
fn until_compacted(store: &LogStore, within: Duration, mut step: impl FnMut()) {
    let deadline = Instant::now() + within;
    while store.stats().compactions == 0 {
        assert!(
            Instant::now() < deadline,
            "no compaction: {:?}",
            store.stats()
        );
        step();
    }
}

fn session_of<'a>(snap: &'a Snapshot, client: &str) -> &'a SessionSnapshot {
    snap.sessions
        .iter()
        .find(|s| s.meta.as_ref().is_some_and(|m| m.client_id == client))
        .unwrap_or_else(|| panic!("session {client} missing"))
}

fn corrupt_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("store.corrupt-"))
        })
        .collect()
}

fn store_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(STORE_DIR))
        .expect("read store dir")
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join(STORE_DIR))
        .expect("read store dir")
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// One op of every kind that leaves something behind, and the snapshot it must produce.
fn every_put_op() -> Vec<Op> {
    vec![
        Op::PutSession(SessionMeta {
            client_id: bs("c1"),
            protocol: ProtocolVersion::V3_1_1,
            expiry_interval: u32::MAX,
            disconnected_at_unix_ms: Some(1_700_000_000_123),
            // The owned tag (issue 35) round-trips too.
            owner: SessionOwner::User("sensor-1".into()),
        }),
        Op::PutSubscription {
            client_id: bs("c1"),
            filter: bs("a/+/#"),
            subscription: SubscriptionRecord {
                options: SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: 2,
                },
                identifier: Some(268_435_455),
            },
        },
        Op::PutSubscription {
            client_id: bs("c1"),
            filter: bs("x"),
            subscription: SubscriptionRecord {
                options: SubscriptionOptions::default(),
                identifier: None,
            },
        },
        Op::PutMessage {
            id: 7,
            message: rich_message(),
        },
        Op::Enqueue {
            client_id: bs("c1"),
            seq: 1,
            entry: QueueEntry {
                message: 7,
                qos: QoS::ExactlyOnce,
                retain: true,
                subscription_ids: smallvec![1, 99],
                stage: EntryStage::AwaitPubRec { packet_id: 65535 },
                deliveries: 0,
                // A shared group's delivery keeps its group (tag `ENQUEUE_SHARED`).
                shared: Some(Arc::from("$share/g/a/b")),
            },
        },
        Op::Enqueue {
            client_id: bs("c1"),
            seq: 2,
            entry: QueueEntry {
                stage: EntryStage::AwaitPubAck { packet_id: 1 },
                deliveries: 0,
                ..entry(7)
            },
        },
        Op::Enqueue {
            client_id: bs("c1"),
            seq: 3,
            entry: QueueEntry {
                stage: EntryStage::AwaitPubComp { packet_id: 2 },
                deliveries: 0,
                ..entry(7)
            },
        },
        Op::Enqueue {
            client_id: bs("c1"),
            seq: 4,
            entry: entry(7),
        },
        Op::PutInboundQos2 {
            client_id: bs("c1"),
            packet_id: 42,
        },
        Op::PutInboundQos2 {
            client_id: bs("c1"),
            packet_id: 1,
        },
        Op::PutRetained {
            topic: bs("r/1"),
            message: rich_message(),
        },
        Op::PutWill {
            client_id: bs("c1"),
            will: will(),
            publish_at_unix_ms: 1_800_000_000_000,
        },
    ]
}

#[test]
fn every_op_round_trips_through_commit_reopen_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(&store, every_put_op());
    let before = store.load().expect("load");
    store.close().expect("close");

    let s = &before.sessions[0];
    let meta = s.meta.as_ref().expect("meta");
    assert_eq!(meta.protocol, ProtocolVersion::V3_1_1);
    assert_eq!(meta.expiry_interval, u32::MAX);
    assert_eq!(meta.disconnected_at_unix_ms, Some(1_700_000_000_123));
    assert_eq!(s.subscriptions.len(), 2);
    assert_eq!(s.subscriptions[0].0, "a/+/#");
    assert_eq!(s.subscriptions[0].1.identifier, Some(268_435_455));
    assert!(s.subscriptions[0].1.options.no_local);
    assert_eq!(s.subscriptions[0].1.options.retain_handling, 2);
    let seqs: Vec<u64> = s.queue.iter().map(|(q, _)| *q).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(
        s.queue[0].1.stage,
        EntryStage::AwaitPubRec { packet_id: 65535 }
    );
    assert_eq!(s.queue[0].1.subscription_ids.as_slice(), &[1, 99]);
    assert_eq!(
        s.queue[2].1.stage,
        EntryStage::AwaitPubComp { packet_id: 2 }
    );
    assert_eq!(s.inbound_qos2, vec![1, 42]);
    assert_eq!(before.messages.get(&7), Some(&rich_message_like(&before)));
    assert_eq!(before.retained.len(), 1);
    assert_eq!(before.wills.len(), 1);
    assert_eq!(before.wills[0].will, will());
    assert_eq!(before.wills[0].publish_at_unix_ms, 1_800_000_000_000);

    let reopened = open_at(dir.path(), opts());
    let after = reopened.load().expect("load after reopen");
    assert_eq!(after, before, "state after reopen differs");
    assert!(
        reopened.next_message_id() > 7,
        "message ids must not be reused"
    );
    assert!(corrupt_dirs(dir.path()).is_empty());
}

/// The stored message 7 must equal what was put, field by field (times included).
fn rich_message_like(snap: &Snapshot) -> StoredMessage {
    let m = snap.messages.get(&7).expect("message 7").clone();
    let want = rich_message();
    assert_eq!(m.topic, want.topic);
    assert_eq!(m.payload, want.payload);
    assert_eq!(m.qos, want.qos);
    assert_eq!(m.retain, want.retain);
    assert_eq!(m.properties, want.properties);
    assert!(m.expires_at_unix_ms.is_some());
    m
}

#[test]
fn removals_and_updates_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(&store, every_put_op());
    commit(
        &store,
        vec![
            Op::UpdateEntry {
                client_id: bs("c1"),
                seq: 4,
                stage: EntryStage::AwaitPubRec { packet_id: 9 },
            },
            remove_entry("c1", 1),
            Op::DeleteSubscription {
                client_id: bs("c1"),
                filter: bs("x"),
            },
            Op::RemoveInboundQos2 {
                client_id: bs("c1"),
                packet_id: 42,
            },
            Op::DeleteRetained { topic: bs("r/1") },
            Op::DeleteWill {
                client_id: bs("c1"),
            },
            session("c2"),
            Op::PutMessage {
                id: 8,
                message: message("t", b"only c2"),
            },
            enqueue("c2", 0, 8),
        ],
    );
    store.close().expect("close");
    let store = open_at(dir.path(), opts());
    let snap = store.load().expect("load");
    let c1 = session_of(&snap, "c1");
    assert_eq!(
        c1.queue.iter().map(|(q, _)| *q).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    assert_eq!(
        c1.queue[2].1.stage,
        EntryStage::AwaitPubRec { packet_id: 9 }
    );
    assert_eq!(c1.subscriptions.len(), 1);
    assert_eq!(c1.inbound_qos2, vec![1]);
    assert!(snap.retained.is_empty());
    assert!(snap.wills.is_empty());
    assert_eq!(snap.messages.len(), 2);

    // Deleting c1 drops its entries and so message 7; c2 still holds message 8.
    commit(
        &store,
        vec![Op::DeleteSession {
            client_id: bs("c1"),
        }],
    );
    store.close().expect("close");
    let store = open_at(dir.path(), opts());
    let snap = store.load().expect("load");
    assert_eq!(snap.sessions.len(), 1);
    assert_eq!(snap.messages.keys().copied().collect::<Vec<_>>(), vec![8]);
    assert!(store.stats().live_bytes > 0);
}

#[test]
fn messages_are_garbage_collected_with_their_last_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(
        &store,
        vec![
            session("a"),
            session("b"),
            Op::PutMessage {
                id: 1,
                message: message("t", b"shared"),
            },
            enqueue("a", 0, 1),
            enqueue("b", 0, 1),
            // Put but never referenced: dropped at the end of the commit.
            Op::PutMessage {
                id: 2,
                message: message("t", b"orphan"),
            },
        ],
    );
    assert_eq!(store.load().expect("load").messages.len(), 1);
    commit(&store, vec![remove_entry("a", 0)]);
    assert_eq!(store.load().expect("load").messages.len(), 1);
    commit(&store, vec![remove_entry("b", 0)]);
    let snap = store.load().expect("load");
    assert!(snap.messages.is_empty());
    // Only the two session records remain live.
    let empty_sessions = store.stats().live_bytes;
    assert!(empty_sessions < 200, "live bytes {empty_sessions}");
    // Ops naming a missing session are counted, not applied.
    commit(&store, vec![enqueue("nobody", 0, 1)]);
    assert_eq!(store.stats().orphan_ops, 1);
}

#[test]
fn queue_entries_come_back_ordered_by_seq() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    let mut ops = vec![
        session("c"),
        Op::PutMessage {
            id: 1,
            message: message("t", b"x"),
        },
    ];
    for seq in [5u64, 1, 300, 3, 2, u64::MAX, 0] {
        ops.push(enqueue("c", seq, 1));
    }
    commit(&store, ops);
    store.close().expect("close");
    let snap = open_at(dir.path(), opts()).load().expect("load");
    let seqs: Vec<u64> = session_of(&snap, "c")
        .queue
        .iter()
        .map(|(q, _)| *q)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 5, 300, u64::MAX]);
}

#[test]
fn expiry_is_stored_as_absolute_wall_clock_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    let now = now_unix_ms();
    let soon = StoredMessage {
        expires_at_unix_ms: Some(now + 300),
        received_at_unix_ms: now,
        properties: PublishProperties {
            message_expiry_interval: Some(1),
            ..Default::default()
        },
        ..message("t", b"short-lived")
    };
    let later = StoredMessage {
        expires_at_unix_ms: Some(now + 3_600_000),
        ..soon.clone()
    };
    commit(
        &store,
        vec![
            session("c"),
            Op::PutMessage {
                id: 1,
                message: soon.clone(),
            },
            Op::PutMessage {
                id: 2,
                message: later.clone(),
            },
            enqueue("c", 0, 1),
            // In flight: must survive its expiry, the handshake has to finish.
            Op::Enqueue {
                client_id: bs("c"),
                seq: 1,
                entry: QueueEntry {
                    stage: EntryStage::AwaitPubAck { packet_id: 5 },
                    deliveries: 0,
                    ..entry(1)
                },
            },
            enqueue("c", 2, 2),
            Op::PutRetained {
                topic: bs("r"),
                message: soon.clone(),
            },
        ],
    );
    let snap = store.load().expect("load");
    assert_eq!(
        snap.messages.get(&1),
        Some(&soon),
        "absolute time kept as is"
    );
    assert_eq!(session_of(&snap, "c").queue.len(), 3);
    store.close().expect("close");

    // "Downtime": the expiry passes while the store is closed.
    std::thread::sleep(Duration::from_millis(350));
    let store = open_at(dir.path(), opts());
    let snap = store.load().expect("load");
    let seqs: Vec<u64> = session_of(&snap, "c")
        .queue
        .iter()
        .map(|(q, _)| *q)
        .collect();
    assert_eq!(
        seqs,
        vec![0, 1, 2],
        "the expired queued entry is kept for the broker to dead-letter (issue 16), in-flight kept"
    );
    assert!(snap.retained.is_empty(), "expired retained message dropped");
    assert_eq!(snap.messages.get(&2), Some(&later));
}

mod commits;
mod damage;
mod dedup;
mod engines;
