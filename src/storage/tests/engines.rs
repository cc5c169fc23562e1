//! The engines and their config, the crash test (a child process killed by `SIGKILL` mid-write), the
//! directory lock and the message id bound.

use super::*;

// ---- engines and config -----------------------------------------------------------------

#[test]
fn memory_store_acknowledges_at_once_and_persists_nothing() {
    let config = StorageConfig {
        persistence: false,
        ..StorageConfig::default()
    };
    let store = open(&config).expect("open");
    assert!(!store.survives_restart());
    let t = store.submit(every_put_op()).expect("submit").ticket;
    assert_eq!(store.durable().borrow().ticket, t);
    block_on(store.wait_durable(t)).expect("durable");
    assert_eq!(store.load().expect("load"), Snapshot::default());
    assert_ne!(store.next_message_id(), store.next_message_id());
    store.close().expect("close");
    assert!(matches!(
        store.submit(vec![]).map_err(|r| r.error),
        Err(StorageError::Closed)
    ));
}

#[test]
fn open_with_dir_survives_restart_and_closed_store_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StorageConfig {
        dir: Some(dir.path().join("nested/state")),
        ..StorageConfig::default()
    };
    let store = open(&config).expect("open");
    assert!(store.survives_restart());
    let t = store.submit(vec![session("c")]).expect("submit").ticket;
    block_on(store.wait_durable(t)).expect("durable");
    store.close().expect("close");
    assert!(matches!(
        store.submit(vec![]).map_err(|r| r.error),
        Err(StorageError::Closed)
    ));
    let store = open(&config).expect("reopen");
    assert_eq!(store.load().expect("load").sessions.len(), 1);
}

// ---- crash test -------------------------------------------------------------------------

const CRASH_DIR_ENV: &str = "POSTBOX_STORAGE_CRASH_DIR";
const CRASH_START_ENV: &str = "POSTBOX_STORAGE_CRASH_START";
const CRASH_FSYNC_ENV: &str = "POSTBOX_STORAGE_CRASH_FSYNC";

fn crash_payload(n: u64) -> Vec<u8> {
    let mut p = n.to_le_bytes().to_vec();
    p.resize(200, (n % 251) as u8);
    p
}

/// Child half of `kill_9_loses_no_acknowledged_op`: publishes numbered messages from several
/// tasks and prints `ACK n` only once `n` is durable. Does nothing unless run by the parent.
#[test]
#[ignore = "child process of kill_9_loses_no_acknowledged_op"]
fn crash_child() {
    let (Ok(dir), Ok(start)) = (std::env::var(CRASH_DIR_ENV), std::env::var(CRASH_START_ENV))
    else {
        return;
    };
    let start: u64 = start.parse().expect("start");
    let fsync = match std::env::var(CRASH_FSYNC_ENV).as_deref() {
        Ok("interval") => FsyncPolicy::Interval,
        Ok("never") => FsyncPolicy::Never,
        _ => FsyncPolicy::EveryBatch,
    };
    let store: Arc<dyn Store> = Arc::new(open_at(
        Path::new(&dir),
        LogOptions {
            fsync,
            compact_min_bytes: 128 << 10,
            ..opts()
        },
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let t = store
            .submit(vec![session("crash"), session("churn")])
            .expect("submit");
        store.wait_durable(t.ticket).await.expect("durable");
        let tasks: Vec<_> = (0..4u64)
            .map(|k| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let mut rx = store.durable();
                    let deadline = Instant::now() + Duration::from_secs(20);
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let n = start + i * 4 + k;
                        i += 1;
                        let id = store.next_message_id();
                        let churn = store.next_message_id();
                        let ops = vec![
                            Op::PutMessage {
                                id,
                                message: message("crash", &crash_payload(n)),
                            },
                            enqueue("crash", n, id),
                            // Garbage so that compaction runs while we may be killed.
                            Op::PutMessage {
                                id: churn,
                                message: message("churn", &[1u8; 600]),
                            },
                            enqueue("churn", n, churn),
                            remove_entry("churn", n.wrapping_sub(4)),
                        ];
                        let Ok(s) = store.submit(ops) else {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        };
                        // Alternate the two ways of waiting; both must be exact.
                        if n.is_multiple_of(2) {
                            s.durable.await.expect("durable");
                        } else {
                            wait_durable(&mut rx, s.ticket).await.expect("durable");
                        }
                        use std::io::Write;
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "ACK {n}");
                        let _ = out.flush();
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
}

#[test]
fn kill_9_loses_no_acknowledged_op() {
    use rand::Rng;
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current exe");
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut rng = rand::rng();
    for (round, fsync) in ["every-batch", "interval", "never", "every-batch"]
        .into_iter()
        .enumerate()
    {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "storage::tests::engines::crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_DIR_ENV, dir.path())
            .env(CRASH_START_ENV, (round as u64 * 10_000_000).to_string())
            .env(CRASH_FSYNC_ENV, fsync)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("ACK ").and_then(|n| n.parse().ok()) {
                    let _ = tx.send(n);
                }
            }
        });
        // Wait for the first acknowledgement, then kill at a random moment.
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("child acknowledged nothing within 30 s");
        acked.insert(first);
        std::thread::sleep(Duration::from_millis(rng.random_range(50..400)));
        child.kill().expect("SIGKILL child");
        let _ = child.wait();
        reader.join().expect("reader");
        // Everything printed before the kill was acknowledged.
        let before = acked.len();
        acked.extend(rx.try_iter());
        assert!(acked.len() > before, "round {round}: too few acks to test");

        let files = store_files(dir.path());
        let store = open_at(dir.path(), opts());
        let snap = store.load().expect("load");
        eprintln!(
            "round {round} ({fsync}): {} acknowledged so far, files at kill: {files:?}",
            acked.len()
        );
        assert!(
            corrupt_dirs(dir.path()).is_empty(),
            "a crash must not look like corruption"
        );
        let crash = session_of(&snap, "crash");
        let present: std::collections::HashMap<u64, MessageId> = crash
            .queue
            .iter()
            .map(|(seq, e)| (*seq, e.message))
            .collect();
        for n in &acked {
            let id = present
                .get(n)
                .unwrap_or_else(|| panic!("round {round} ({fsync}): acknowledged op {n} lost"));
            let m = snap.messages.get(id).expect("message body present");
            assert_eq!(m.payload.as_ref(), crash_payload(*n).as_slice());
        }
        store.close().expect("close");
    }
}

/// `postbox_store_disk_bytes` is what the store's files take on disk, also right after a
/// compaction with no commit after it (issue 11: it read 24 bytes, one empty log, for a
/// 5 MB snapshot, until some later commit happened to collect the compaction).
#[test]
fn disk_bytes_are_the_files_on_disk_after_a_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join(STORE_DIR);
    let files = || -> u64 {
        std::fs::read_dir(&store_dir)
            .expect("read store dir")
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    };
    let store = open_at(
        dir.path(),
        LogOptions {
            compact_min_bytes: 16 << 10,
            fsync: FsyncPolicy::Never,
            ..opts()
        },
    );
    assert_eq!(store.stats().disk_bytes, files(), "a fresh store");
    // Ten retained messages, each rewritten once: the log outgrows 16 KiB and the live data
    // once, so one compaction starts, and the snapshot holds the ten.
    for i in 0..20u32 {
        commit(
            &store,
            vec![Op::PutRetained {
                topic: bs(&format!("r/{}", i % 10)),
                message: message("r", &[7u8; 1000]),
            }],
        );
    }
    // No commit from here on: the compaction thread itself must publish what it did.
    until_compacted(&store, Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(5)); // polling a counter, bounded
    });
    let stats = store.stats();
    assert!(stats.snapshot_bytes > 10_000, "{stats:?}");
    assert_eq!(stats.disk_bytes, files(), "after the compaction: {stats:?}");
}

/// One broker per directory: a second store on the same directory is refused, naming the
/// holder, and the directory can be opened again once the first is closed.
#[test]
fn a_second_store_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = open_at(dir.path(), opts());
    match LogStore::open(dir.path(), opts()) {
        Err(StorageError::Locked { holder, .. }) => {
            assert!(
                holder.contains(&format!("pid {}", std::process::id())),
                "{holder}"
            );
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    first.close().expect("close");
    let again = open_at(dir.path(), opts());
    again.close().expect("close");
}

/// Found by the `recovery` fuzz target: a store holding message id `u64::MAX` (valid
/// checksums, so only damage or a bug could write it) made `LogStore::open` overflow computing
/// the next id (a panic with overflow checks, ids wrapping to 0 and being reused without).
/// "Message ids are never reused, also across restarts" (docs/durability.md, "Files"): open
/// refuses such a store with `Corrupt` and leaves its files.
#[test]
fn store_holding_the_last_message_id_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open_at(dir.path(), opts());
    commit(
        &store,
        vec![Op::PutMessage {
            id: u64::MAX,
            message: message("t", b"last"),
        }],
    );
    store.close().expect("close");
    drop(store);
    let files = store_files(dir.path());
    match LogStore::open(dir.path(), opts()) {
        Err(StorageError::Corrupt(why)) => assert!(why.contains("no id is left"), "{why}"),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("opened a store whose next message id would wrap"),
    }
    assert_eq!(
        store_files(dir.path()),
        files,
        "the files must be left as they are"
    );
    assert!(corrupt_dirs(dir.path()).is_empty());
}
