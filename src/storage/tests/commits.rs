//! Group commit (batching, the commit window, the interval policy, a full queue), the disk
//! budget and compaction under churn.

use super::*;

/// The `i`th of a run of small, distinct updates (one retained topic deleted): what the
/// batching tests submit many of.
fn numbered_op(i: u64) -> Vec<Op> {
    vec![Op::DeleteRetained {
        topic: bs(&i.to_string()),
    }]
}

#[test]
fn group_commit_batches_many_submits_into_few_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(open_at(dir.path(), opts()));
    commit(&*store, vec![session("c")]);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut last = 0;
                for i in 0..250u64 {
                    let id = store.next_message_id();
                    let seq = t * 1000 + i;
                    let ops = vec![
                        Op::PutMessage {
                            id,
                            message: message("t", &seq.to_le_bytes()),
                        },
                        enqueue("c", seq, id),
                    ];
                    last = last.max(store.submit(ops).expect("submit").ticket);
                }
                last
            })
        })
        .collect();
    let last = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .max()
        .unwrap_or(0);
    block_on((&*store as &dyn Store).wait_durable(last)).expect("durable");
    let stats = store.stats();
    assert_eq!(stats.submits, 1001);
    assert!(
        stats.commits * 4 < stats.submits,
        "expected group commit, got {stats:?}"
    );
    assert_eq!(stats.fsyncs, stats.commits, "every-batch syncs each commit");
    let snap = store.load().expect("load");
    assert_eq!(session_of(&snap, "c").queue.len(), 1000);
}

#[test]
fn batches_respect_max_batch_ops() {
    let (_dir, store) = fresh_store(LogOptions {
        max_batch_ops: 10,
        fsync: FsyncPolicy::Never,
        ..opts()
    });
    let mut last = 0;
    for i in 0..300u64 {
        last = store.submit(numbered_op(i)).expect("submit").ticket;
    }
    block_on((&store as &dyn Store).wait_durable(last)).expect("durable");
    let stats = store.stats();
    assert!(stats.commits >= 30, "{stats:?}");
    assert_eq!(stats.fsyncs, 0, "never policy does not sync before close");
}

#[test]
fn commit_window_collects_more_per_batch() {
    let (_dir, store) = fresh_store(LogOptions {
        commit_window: Duration::from_millis(50),
        ..opts()
    });
    let start = Instant::now();
    let mut last = 0;
    for i in 0..20u64 {
        last = store.submit(numbered_op(i)).expect("submit").ticket;
        std::thread::sleep(Duration::from_millis(1));
    }
    block_on((&store as &dyn Store).wait_durable(last)).expect("durable");
    let commits = store.stats().commits;
    assert!(
        commits <= 3 || start.elapsed() > Duration::from_millis(100),
        "a 50 ms window should hold ~20 submits 1 ms apart, got {commits} commits"
    );
}

#[test]
fn interval_policy_syncs_on_a_timer() {
    let (_dir, store) = fresh_store(LogOptions {
        fsync: FsyncPolicy::Interval,
        fsync_interval: Duration::from_millis(30),
        ..opts()
    });
    let mut last = 0;
    for i in 0..50u64 {
        last = commit(&store, numbered_op(i));
    }
    assert_eq!(store.stats().durable_ticket, last);
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.stats().fsyncs == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = store.stats();
    assert!(stats.fsyncs >= 1, "timer fsync never ran: {stats:?}");
    assert!(stats.fsyncs < stats.commits, "{stats:?}");
}

#[test]
fn queue_full_is_reported_with_the_ops_handed_back() {
    let (_dir, store) = fresh_store(LogOptions {
        queue_capacity_ops: 4,
        max_batch_ops: 4,
        ..opts()
    });
    let op = Op::DeleteRetained { topic: bs("t") };
    let deadline = Instant::now() + Duration::from_secs(10);
    let rejected = loop {
        match store.submit(vec![op.clone(), op.clone()]) {
            Ok(_) => {}
            Err(rejected) => break rejected,
        }
        assert!(Instant::now() < deadline, "queue never filled up");
    };
    assert!(matches!(rejected.error, StorageError::QueueFull { .. }));
    assert_eq!(rejected.ops, vec![op.clone(), op]);
    assert!(store.stats().rejected_queue_full >= 1);
}

fn budget_store(dir: &Path, policy: DiskFullPolicy) -> LogStore {
    open_at(
        dir,
        LogOptions {
            max_disk_bytes: 4096,
            disk_full: policy,
            ..opts()
        },
    )
}

#[test]
fn disk_budget_rejects_growth_but_not_removals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = budget_store(dir.path(), DiskFullPolicy::Reject);
    commit(&store, vec![session("c")]);
    let mut accepted = 0u64;
    let rejected = loop {
        let id = store.next_message_id();
        let ops = vec![
            Op::PutMessage {
                id,
                message: message("t", &[0u8; 500]),
            },
            enqueue("c", id, id),
        ];
        match store.submit(ops) {
            Ok(s) => {
                accepted += 1;
                block_on((&store as &dyn Store).wait_durable(s.ticket)).expect("durable");
            }
            Err(rejected) => break rejected,
        }
        assert!(accepted < 100, "budget never enforced");
    };
    assert!(matches!(
        rejected.error,
        StorageError::DiskBudgetExceeded { max: 4096, .. }
    ));
    assert_eq!(rejected.ops.len(), 2);
    assert!(accepted >= 5, "only {accepted} accepted");
    assert_eq!(store.stats().rejected_disk_full, 1);
    // Removing frees the budget again.
    let first_seq = session_of(&store.load().expect("load"), "c").queue[0].0;
    commit(&store, vec![remove_entry("c", first_seq)]);
    let id = store.next_message_id();
    commit(
        &store,
        vec![
            Op::PutMessage {
                id,
                message: message("t", &[0u8; 100]),
            },
            enqueue("c", id, id),
        ],
    );
}

#[test]
fn disk_budget_keep_in_memory_drops_growth_and_clears_stale_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = budget_store(dir.path(), DiskFullPolicy::KeepInMemory);
    commit(
        &store,
        vec![
            session("c"),
            Op::PutRetained {
                topic: bs("r"),
                message: message("r", b"old"),
            },
        ],
    );
    let submitted = store
        .submit(vec![
            Op::PutMessage {
                id: 1,
                message: message("t", &[0u8; 8000]),
            },
            enqueue("c", 0, 1),
            Op::PutRetained {
                topic: bs("r"),
                message: message("r", &[0u8; 8000]),
            },
            Op::PutSubscription {
                client_id: bs("c"),
                filter: bs("f"),
                subscription: SubscriptionRecord {
                    options: SubscriptionOptions::default(),
                    identifier: None,
                },
            },
        ])
        .expect("accepted");
    assert_eq!(submitted.dropped_ops, 3);
    block_on((&store as &dyn Store).wait_durable(submitted.ticket)).expect("durable");
    let snap = store.load().expect("load");
    let c = session_of(&snap, "c");
    assert!(c.queue.is_empty());
    assert_eq!(c.subscriptions.len(), 1, "non-growing ops still stored");
    assert!(
        snap.retained.is_empty(),
        "old retained value must not come back"
    );
    assert_eq!(store.stats().dropped_disk_full, 3);
}

#[test]
fn compaction_keeps_disk_bounded_under_churn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LogOptions {
        compact_min_bytes: 64 << 10,
        fsync: FsyncPolicy::Never,
        ..opts()
    };
    let store = open_at(dir.path(), options.clone());
    commit(&store, vec![session("c"), session("d")]);
    let mut max_bytes = 0;
    let mut last_id = 0;
    for round in 0..400u64 {
        let mut ops = Vec::new();
        for k in 0..10u64 {
            let id = store.next_message_id();
            last_id = id;
            ops.push(Op::PutMessage {
                id,
                message: message("t", &[round as u8; 300]),
            });
            ops.push(enqueue("c", round * 10 + k, id));
            if round > 0 {
                ops.push(remove_entry("c", (round - 1) * 10 + k));
            }
        }
        // A few long-lived entries on "d".
        if round % 100 == 0 {
            let id = store.next_message_id();
            ops.push(Op::PutMessage {
                id,
                message: message("keep", &round.to_le_bytes()),
            });
            ops.push(enqueue("d", round, id));
        }
        commit(&store, ops);
        max_bytes = max_bytes.max(dir_bytes(dir.path()));
    }
    let stats = store.stats();
    assert!(stats.compactions >= 3, "{stats:?}");
    // ~1.3 MB were written; live data stays ~4 KB.
    assert!(max_bytes < 400 << 10, "disk grew to {max_bytes} bytes");
    let before = store.load().expect("load");
    store.close().expect("close");
    let store = open_at(dir.path(), options);
    let after = store.load().expect("load after reopen");
    assert_eq!(after, before);
    assert_eq!(session_of(&after, "c").queue.len(), 10);
    assert_eq!(session_of(&after, "d").queue.len(), 4);
    assert!(
        store.next_message_id() > last_id,
        "ids survive compaction even when their messages were deleted"
    );
    let files = store_files(dir.path());
    assert_eq!(
        files.iter().filter(|f| f.starts_with("snapshot-")).count(),
        1,
        "{files:?}"
    );
}
