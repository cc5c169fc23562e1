//! Damage and recovery: every frame that passes its checksums is kept, a torn tail is a
//! crash, not damage (docs/durability.md, "Recovery" and "Damage").

use super::*;

/// A store with three commits (sessions a, b, c) and no snapshot; returns the log path.
fn three_commit_store(dir: &Path) -> PathBuf {
    commits_store(dir, &["a", "b", "c"])
}

/// One commit per client (its session, a message, its queue entry); returns the log path.
fn commits_store(dir: &Path, names: &[&str]) -> PathBuf {
    let store = open_at(dir, opts());
    for client in names {
        let id = store.next_message_id();
        commit(
            &store,
            vec![
                session(client),
                Op::PutMessage {
                    id,
                    message: message("t", &[7u8; 100]),
                },
                enqueue(client, 0, id),
            ],
        );
    }
    store.close().expect("close");
    dir.join(STORE_DIR).join(log_name(1))
}

fn clients(snap: &Snapshot) -> Vec<String> {
    snap.sessions
        .iter()
        .filter_map(|s| s.meta.as_ref().map(|m| m.client_id.to_string()))
        .collect()
}

/// `(start, length)` of every frame in a store file, following the length fields.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = HEADER_LEN;
    while pos + 12 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        out.push((pos, 12 + len));
        pos += 12 + len;
    }
    out
}

/// The loss record of `kind` (an `Op::KIND_NAMES` entry).
fn lost(loss: &RecoveryLoss, kind: &str) -> u64 {
    let i = Op::KIND_NAMES
        .iter()
        .position(|k| *k == kind)
        .expect("op kind");
    loss.records[i]
}

fn flip(path: &Path, at: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(path).expect("read");
    bytes[at] ^= 0x40;
    std::fs::write(path, &bytes).expect("write");
    bytes
}

#[test]
fn truncated_log_tail_is_a_crash_not_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = three_commit_store(dir.path());
    let len = std::fs::metadata(&log).expect("meta").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .expect("open log");
    f.set_len(len - 5).expect("truncate");
    drop(f);
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "b"]);
    assert!(corrupt_dirs(dir.path()).is_empty(), "a torn tail is normal");
    assert!(
        store.stats().recovery.is_empty(),
        "nothing acknowledged was lost"
    );
    // The store keeps working and the next commit is readable after the repaired tail.
    commit(&store, vec![session("d")]);
    store.close().expect("close");
    let snap = open_at(dir.path(), opts()).load().expect("load");
    assert_eq!(clients(&snap), vec!["a", "b", "d"]);
}

#[test]
fn flipped_byte_in_a_frame_body_loses_only_that_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = three_commit_store(dir.path());
    let (second, second_len) = frames(&std::fs::read(&log).expect("read"))[1];
    let damaged = flip(&log, second + 12 + 20);

    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "c"]);
    let loss = store.stats().recovery;
    assert_eq!((loss.frames, loss.bytes), (1, second_len as u64));
    assert_eq!(lost(&loss, "put_session"), 1);
    assert_eq!(lost(&loss, "put_message"), 1);
    assert_eq!(lost(&loss, "enqueue"), 1);
    assert_eq!((loss.total_records(), loss.partial), (3, false), "{loss:?}");
    let copies = corrupt_dirs(dir.path());
    assert_eq!(copies.len(), 1, "a copy of the damaged files is kept");
    assert_eq!(
        std::fs::read(copies[0].join(log_name(1))).expect("copied log"),
        damaged,
        "the copy is the damaged file as it was"
    );
    // The rewritten store works, and the next start finds nothing damaged.
    commit(&store, vec![session("z")]);
    store.close().expect("close");
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "c", "z"]);
    assert!(store.stats().recovery.is_empty());
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
}

#[test]
fn flipped_length_in_a_frame_header_resynchronises_on_the_next_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = three_commit_store(dir.path());
    let (first, first_len) = frames(&std::fs::read(&log).expect("read"))[0];
    flip(&log, first + 1); // the length field: the header CRC fails, the length is unknown
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["b", "c"]);
    let loss = store.stats().recovery;
    assert_eq!((loss.frames, loss.bytes), (1, first_len as u64));
    assert_eq!((loss.total_records(), loss.partial), (3, false), "{loss:?}");
}

#[test]
fn several_damaged_frames_and_a_torn_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = commits_store(dir.path(), &["a", "b", "c", "d", "e", "f"]);
    let f = frames(&std::fs::read(&log).expect("read"));
    flip(&log, f[1].0 + 12 + 30); // b: body
    flip(&log, f[3].0 + 6); // d: header (body CRC field)
    let len = std::fs::metadata(&log).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(len - 3))
        .expect("truncate"); // f: torn, as a crash leaves it
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "c", "e"]);
    let loss = store.stats().recovery;
    assert_eq!(
        loss.frames, 2,
        "the torn tail is not counted as lost: {loss:?}"
    );
    assert_eq!(lost(&loss, "enqueue"), 2);
}

/// A frame copied into a message payload (say, a log file published as a payload) is valid
/// only at the offset it was written at, so scanning past damage does not apply it.
#[test]
fn frames_inside_a_payload_are_not_taken_for_commits() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let scratch_log = {
        let store = open_at(scratch.path(), opts());
        commit(&store, vec![Op::DeleteSession { client_id: bs("a") }]);
        store.close().expect("close");
        scratch.path().join(STORE_DIR).join(log_name(1))
    };
    let forged = std::fs::read(&scratch_log).expect("read")[HEADER_LEN..].to_vec();

    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(&store, vec![session("a")]);
    let id = store.next_message_id();
    commit(
        &store,
        vec![
            session("b"),
            Op::PutMessage {
                id,
                message: message("files", &forged),
            },
            enqueue("b", 0, id),
        ],
    );
    commit(&store, vec![session("c")]);
    store.close().expect("close");
    let log = dir.path().join(STORE_DIR).join(log_name(1));
    let second = frames(&std::fs::read(&log).expect("read"))[1].0;
    flip(&log, second); // b's header: the reader scans through the payload
    let snap = open_at(dir.path(), opts()).load().expect("load");
    assert_eq!(
        clients(&snap),
        vec!["a", "c"],
        "the forged DeleteSession was not applied"
    );
}

/// The price of the offset seal (docs/durability.md, "Damage"): a byte deleted in the middle
/// moves every later frame of the file off its place. They are counted lost, none is applied
/// in a wrong place, and the earlier frames are kept.
#[test]
fn a_deleted_byte_costs_the_rest_of_its_file_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = commits_store(dir.path(), &["a", "b", "c", "d"]);
    let mut bytes = std::fs::read(&log).expect("read");
    let second = frames(&bytes)[1].0;
    bytes.remove(second + 40);
    std::fs::write(&log, &bytes).expect("write");
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a"]);
    let loss = store.stats().recovery;
    assert_eq!(loss.bytes, (bytes.len() - second) as u64, "{loss:?}");
    assert!(
        loss.partial,
        "the stretch holds several frames: a lower bound"
    );
}

#[test]
fn a_lost_frame_forgets_inbound_qos2_ids_and_requeues_colliding_inflight() {
    let await_ack = |seq: u64, id: MessageId| Op::Enqueue {
        client_id: bs("a"),
        seq,
        entry: QueueEntry {
            stage: EntryStage::AwaitPubAck { packet_id: 5 },
            deliveries: 0,
            ..entry(id)
        },
    };
    let inbound = |packet_id| Op::PutInboundQos2 {
        client_id: bs("a"),
        packet_id,
    };
    let bodies = vec![
        ops_body(&[
            session("a"),
            inbound(7),
            Op::PutMessage {
                id: 1,
                message: message("t", b"one"),
            },
            await_ack(0, 1),
        ]),
        // Lost: the publisher's PUBREL of id 7 and the subscriber's PUBACK of seq 0.
        ops_body(&[
            Op::RemoveInboundQos2 {
                client_id: bs("a"),
                packet_id: 7,
            },
            remove_entry("a", 0),
        ]),
        ops_body(&[
            Op::PutMessage {
                id: 2,
                message: message("t", b"two"),
            },
            await_ack(1, 2),
            inbound(9),
        ]),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("mkdir");
    let mut bytes = file_of(false, 1, 2, &bodies);
    let second = frames(&bytes)[1].0;
    bytes[second + 14] ^= 1;
    std::fs::write(store_dir.join(log_name(1)), &bytes).expect("write");

    let store = open_at(dir.path(), opts());
    let snap = store.load().expect("load");
    let a = session_of(&snap, "a");
    // Id 7 might have been released and reused: forgotten, so a new PUBLISH under it is not
    // swallowed as a duplicate. Id 9 was put after the damage: kept.
    assert_eq!(a.inbound_qos2, vec![9]);
    // Seq 0's PUBACK was lost: it comes back, but not under the packet id seq 1 holds.
    let stages: Vec<_> = a.queue.iter().map(|(q, e)| (*q, e.stage)).collect();
    assert_eq!(
        stages,
        vec![
            (0, EntryStage::Queued),
            (1, EntryStage::AwaitPubAck { packet_id: 5 })
        ]
    );
    assert_eq!(store.stats().recovery.total_records(), 2);
}

#[test]
fn a_missing_log_loses_its_commits_and_keeps_the_later_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("mkdir");
    for (gen, client) in [(1, "a"), (3, "c")] {
        let bytes = file_of(false, gen, 2, &[ops_body(&[session(client)])]);
        std::fs::write(store_dir.join(log_name(gen)), bytes).expect("write");
    }
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "c"]);
    let loss = store.stats().recovery;
    assert_eq!((loss.frames, loss.partial), (1, true));
}

#[test]
fn format_version_1_files_still_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("mkdir");
    let snapshot = file_of(
        true,
        2,
        1,
        &[ops_body(&[session("a")]), {
            let mut t = vec![KIND_TRAILER];
            record::Enc(&mut t).u64(1);
            record::Enc(&mut t).u64(41);
            t
        }],
    );
    std::fs::write(store_dir.join(snapshot_name(2)), snapshot).expect("write");
    let log = file_of(false, 2, 1, &[ops_body(&[session("b")])]);
    std::fs::write(store_dir.join(log_name(2)), log).expect("write");

    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "b"]);
    assert!(store.stats().recovery.is_empty());
    assert!(
        store.next_message_id() > 41,
        "the trailer's highest id is kept"
    );
    // New commits go to a new log of the current version; the old one is only read.
    commit(&store, vec![session("c")]);
    store.close().expect("close");
    assert_eq!(
        store_files(dir.path()),
        vec![log_name(2), log_name(3), snapshot_name(2)]
    );
    let store = open_at(dir.path(), opts());
    assert_eq!(clients(&store.load().expect("load")), vec!["a", "b", "c"]);
    assert!(store.stats().recovery.is_empty());
}

#[test]
fn a_log_cut_inside_its_header_is_recreated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = three_commit_store(dir.path());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .and_then(|f| f.set_len(5))
        .expect("truncate");
    // The start of a header is what a crash while creating the log leaves: a warning (checked
    // on the binary, tests/suite/recovery.rs), a new empty log, and a working store.
    let store = open_at(dir.path(), opts());
    assert!(store.load().expect("load").sessions.is_empty());
    commit(&store, vec![session("x")]);
    store.close().expect("close");
    assert_eq!(
        clients(&open_at(dir.path(), opts()).load().expect("load")),
        vec!["x"]
    );
    // Five bytes that are not a header's start are damage.
    std::fs::write(&log, b"xxxxx").expect("write");
    let store = open_at(dir.path(), opts());
    assert_eq!(store.stats().recovery.bytes, 5);
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
}

/// A store whose newest snapshot holds 30 retained messages of 100 KiB in several frames
/// (cut at ~1 MiB); returns the snapshot's path.
fn retained_snapshot_store(dir: &Path) -> PathBuf {
    let store = open_at(
        dir,
        LogOptions {
            compact_min_bytes: 1,
            ..opts()
        },
    );
    for i in 0..30u8 {
        commit(
            &store,
            vec![Op::PutRetained {
                topic: bs(&format!("r/{i}")),
                message: message(&format!("r/{i}"), &[i; 100 << 10]),
            }],
        );
    }
    // Churn (a retained message set and cleared) until the log is well past the 3 MB of live
    // data, so a compaction starts after all 30 are in.
    for _ in 0..40 {
        commit(
            &store,
            vec![
                Op::PutRetained {
                    topic: bs("junk"),
                    message: message("junk", &[0u8; 100 << 10]),
                },
                Op::DeleteRetained { topic: bs("junk") },
            ],
        );
    }
    commit(&store, vec![session("s")]);
    store.close().expect("close");
    assert!(store.stats().compactions >= 1);
    let snapshot = std::fs::read_dir(dir.join(STORE_DIR))
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pbs"))
        .max()
        .expect("a snapshot was written");
    let snap = open_at(dir, opts()).load().expect("load");
    assert_eq!(snap.retained.len(), 30);
    snapshot
}

#[test]
fn flipped_byte_in_a_snapshot_loses_only_that_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = retained_snapshot_store(dir.path());
    let f = frames(&std::fs::read(&snapshot).expect("read"));
    assert!(f.len() >= 4, "several frames and a trailer: {f:?}");
    flip(&snapshot, f[1].0 + f[1].1 / 2);
    let store = open_at(dir.path(), opts());
    let kept = store.load().expect("load").retained.len() as u64;
    let loss = store.stats().recovery;
    assert!(kept >= 15, "the other frames are kept: {kept} of 30");
    assert_eq!(lost(&loss, "put_retained"), 30 - kept, "{loss:?}");
    assert_eq!((loss.frames, loss.unknown_records), (1, 0));
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
    // Rewritten: the next start reads it clean.
    store.close().expect("close");
    let store = open_at(dir.path(), opts());
    assert_eq!(store.load().expect("load").retained.len() as u64, kept);
    assert!(store.stats().recovery.is_empty());
}

#[test]
fn truncated_snapshot_keeps_its_intact_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = retained_snapshot_store(dir.path());
    let f = frames(&std::fs::read(&snapshot).expect("read"));
    let cut = f[2].0 + 100; // inside the third frame
    std::fs::OpenOptions::new()
        .write(true)
        .open(&snapshot)
        .and_then(|file| file.set_len(cut as u64))
        .expect("truncate");
    let store = open_at(dir.path(), opts());
    let snap = store.load().expect("load");
    let loss = store.stats().recovery;
    assert!(snap.retained.len() >= 15, "{}", snap.retained.len());
    assert_eq!(
        clients(&snap),
        vec!["s"],
        "the log after the snapshot is replayed"
    );
    assert!(
        loss.partial,
        "without the trailer the count is a lower bound"
    );
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
}

#[test]
fn garbage_files_are_damage_and_the_store_keeps_working() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("mkdir");
    std::fs::write(
        store_dir.join(log_name(1)),
        b"this is not a postbox log at all",
    )
    .expect("write");
    let store = open_at(dir.path(), opts());
    assert!(store.load().expect("load").sessions.is_empty());
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
    commit(&store, vec![session("x")]);
    drop(store);

    // A snapshot whose generation has no log, garbage after its magic.
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    std::fs::create_dir_all(&store_dir).expect("mkdir");
    std::fs::write(store_dir.join(snapshot_name(3)), b"PBXSNAP\x01garbage").expect("write");
    let store = open_at(dir.path(), opts());
    assert!(store.load().expect("load").sessions.is_empty());
    assert_eq!(corrupt_dirs(dir.path()).len(), 1);
    commit(&store, vec![session("x")]);
    store.close().expect("close");
    assert_eq!(
        clients(&open_at(dir.path(), opts()).load().expect("load")),
        vec!["x"]
    );
}

#[test]
fn a_file_where_the_store_directory_should_be_stops_the_open() {
    // Not corruption: nothing is moved or deleted, and the error names the path and the fix.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(STORE_DIR), b"oops").expect("write");
    let error = LogStore::open(dir.path(), opts()).expect_err("must not open");
    let text = error.to_string();
    assert!(matches!(error, StorageError::Unusable { .. }), "{error:?}");
    assert!(
        text.contains(&dir.path().join(STORE_DIR).display().to_string()),
        "{text}"
    );
    assert!(text.contains("not a directory"), "{text}");
    assert_eq!(
        std::fs::read(dir.path().join(STORE_DIR)).expect("read"),
        b"oops"
    );
    assert!(corrupt_dirs(dir.path()).is_empty());
}

#[test]
fn random_bytes_never_panic_the_decoder() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut valid = Vec::new();
    let mut enc = record::Enc(&mut valid);
    // Built once: it stamps the current time, which may tick between two calls.
    let ops = every_put_op();
    enc.u32(ops.len() as u32);
    for op in &ops {
        enc.op(op);
    }
    let decoded = record::Dec::new(&valid).ops().expect("valid decodes");
    assert_eq!(decoded, ops);
    for _ in 0..2000 {
        let mut bytes = valid.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        }
        bytes.truncate(rng.random_range(0..=bytes.len()));
        let _ = record::Dec::new(&bytes).ops();
    }
}
