//! The log engine: the [`Store`] that keeps its data on disk, as an append-only log of
//! checksummed group commits compacted into snapshots. Chosen over `redb` by measurement (see
//! `benches/storage-bench`): a group commit here is one sequential `write` plus one
//! `fdatasync`, where a B-tree commit rewrites pages. `docs/durability.md` ("Durability
//! protocol") describes the protocol as a whole.
//!
//! This file holds the submit side (what runs on the caller's thread: ticket allocation,
//! queue bound, disk budget) and the handle's lifetime. It must not touch the files: only
//! the writer thread does, so no tokio worker ever blocks on the disk.
//!
//! # Files (in `<storage.dir>/store/`, see `format`)
//! * `log-<gen>.pbl`: a 24-byte header (magic, format version, generation, CRC), then frames.
//!   One frame = one group commit = the ops of every submit in the batch.
//! * `snapshot-<gen>.pbs`: same header, frames of ops that rebuild the state, and a trailer
//!   frame (op count, highest message id). Snapshot `S` holds the state at the end of log
//!   `S - 1`; recovery loads the newest snapshot and replays logs `S, S+1, …` in order.
//!
//! # Modules
//! * `budget`: the disk budget applied at submit.
//! * `writer`: the writer thread: group commit, fsync policy, failure.
//! * `no_space`: a full filesystem: the commit kept and written again, refusals meanwhile.
//! * `compaction`: when and how the writer starts a snapshot.
//! * `snapshot`: encoding, atomically writing and reading a snapshot file.
//! * `format`: file headers, frames (and finding the next intact one), file names, the log file.
//! * `recovery`: opening the files at start, torn tails, reading on past damage.
//! * `damage`: what damage cost, the copy kept for analysis, rewriting what was kept.
//! * `unusable`: I/O errors at start, which stop the broker and name the fix.
//! * `lock`: the exclusive lock on the data directory (one broker per directory).
//!
//! # Threads
//! `submit` pushes onto a channel bounded by op count; one `std::thread` (the writer) owns
//! the files and the `State`; a snapshot is written by a short-lived
//! second thread.
//!
//! Must not: report a ticket durable before write and sync; retry a failed fsync; take an I/O error
//! for corruption; delete or move damaged data before its replacement is complete.

mod budget;
mod compaction;
mod damage;
mod format;
mod lock;
mod no_space;
mod private;
mod recovery;
mod snapshot;
mod unusable;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use super::{
    DiskFullPolicy, Durable, DurableState, FsyncPolicy, MessageId, Op, RecoveryLoss, Rejected,
    Snapshot, StorageConfig, StorageError, Store, StoreHealth, StoreStats, Submitted,
};
use recovery::recover;
use writer::Writer;

/// Name of the store directory inside `storage.dir`.
pub const STORE_DIR: &str = "store";

pub use lock::LOCK_FILE;

/// Submits that add no data (acks, handshake stages, sessions) may queue up to this many
/// times `queue_capacity_ops`: publishers hitting the bound must not crowd out the updates
/// that free space and finish handshakes, and while the disk is full those are what waits.
const NON_GROWING_HEADROOM: usize = 4;

/// Tuning of the log engine; built from [`StorageConfig`], adjustable in tests.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// When the log is forced to disk.
    pub fsync: FsyncPolicy,
    /// Period of fdatasync under [`FsyncPolicy::Interval`].
    pub fsync_interval: Duration,
    /// Most ops per group commit.
    pub max_batch_ops: usize,
    /// How long the writer waits for more ops before committing.
    pub commit_window: Duration,
    /// Ops that may wait for the writer before submits are refused.
    pub queue_capacity_ops: usize,
    /// Budget on live bytes; 0 = unlimited.
    pub max_disk_bytes: u64,
    /// What happens to growing ops over budget.
    pub disk_full: DiskFullPolicy,
    /// Compaction starts once the log holds more than `max(this, live bytes)`.
    pub compact_min_bytes: u64,
    /// How long the writer waits before writing again after the filesystem was full.
    pub write_retry: Duration,
}

impl LogOptions {
    /// The options `config` describes (compaction threshold: 64 MiB).
    pub fn from_config(config: &StorageConfig) -> LogOptions {
        LogOptions {
            fsync: config.fsync,
            fsync_interval: Duration::from_millis(config.fsync_interval_ms.max(1)),
            max_batch_ops: config.max_batch_ops.max(1),
            commit_window: Duration::from_micros(config.commit_window_us),
            queue_capacity_ops: config.queue_capacity_ops.max(1),
            max_disk_bytes: config.max_disk_bytes,
            disk_full: config.disk_full,
            compact_min_bytes: 64 << 20,
            write_retry: Duration::from_millis(config.write_retry_ms.max(1)),
        }
    }
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions::from_config(&StorageConfig::default())
    }
}

/// State shared by the submitters and the writer thread.
#[derive(Debug)]
struct Shared {
    opts: LogOptions,
    /// `Store::bound_dedup`'s bound, read by the writer before each batch.
    dedup_cap: AtomicUsize,
    durable: watch::Sender<DurableState>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The writer holds a commit the full filesystem did not take, and retries it.
    no_space: AtomicBool,
    /// Why, for the refusals handed out meanwhile.
    no_space_reason: Mutex<String>,
    next_message_id: AtomicU64,
    queued_ops: AtomicUsize,
    pending_growth: AtomicU64,
    live_bytes: AtomicU64,
    submits: AtomicU64,
    ops: AtomicU64,
    commits: AtomicU64,
    fsyncs: AtomicU64,
    log_bytes: AtomicU64,
    snapshot_bytes: AtomicU64,
    /// Bytes in the current log file (the writer's `log_len`).
    log_len: AtomicU64,
    /// Bytes in every other file of the store directory: set by the compaction thread from the
    /// directory itself once it is done, grown by the writer when it starts a new log.
    other_file_bytes: AtomicU64,
    compactions: AtomicU64,
    rejected_queue_full: AtomicU64,
    rejected_disk_full: AtomicU64,
    dropped_disk_full: AtomicU64,
    rejected_no_space: AtomicU64,
    orphan_ops: AtomicU64,
    recovery: RecoveryLoss,
    /// `postbox_store_commit_seconds`, once the broker's metrics are attached
    /// ([`Store::observe_commits`]); the writer times each group commit into it.
    commit_seconds: std::sync::OnceLock<crate::metrics::Histogram>,
    /// Called on the writer thread after each commit ([`Store::after_commits`]).
    after_commits: std::sync::OnceLock<CommitHook>,
}

/// [`Store::after_commits`]'s callback, shown by name only.
struct CommitHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for CommitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitHook")
    }
}

/// Bytes submitted to every log store of the process and not yet committed (their
/// [`Op::size_estimate`]s): what the writers' queues hold, each op keeping its payload alive
/// until it is written. Process-wide, as the broker's memory count is (`broker::flow`), so
/// the publish path reads it with one load: a publisher faster than the disk is paused on
/// it rather than piling gigabytes into the queue (issue 35, eighteenth pass, E0: one client
/// rewriting one retained topic at QoS 0 took a 16 MiB broker to 1.8 GB).
static BACKLOG_BYTES: AtomicU64 = AtomicU64::new(0);

/// See [`BACKLOG_BYTES`].
pub(crate) fn backlog_bytes() -> u64 {
    BACKLOG_BYTES.load(Ordering::Relaxed)
}

impl Shared {
    /// `growth` bytes submitted: counted until their commit (or failure).
    fn add_pending_growth(&self, growth: u64) {
        self.pending_growth.fetch_add(growth, Ordering::Relaxed);
        BACKLOG_BYTES.fetch_add(growth, Ordering::Relaxed);
    }

    /// `growth` bytes committed, or given up.
    fn sub_pending_growth(&self, growth: u64) {
        self.pending_growth.fetch_sub(growth, Ordering::Relaxed);
        BACKLOG_BYTES.fetch_sub(growth, Ordering::Relaxed);
    }

    /// Why the writer stopped, for errors handed to callers after a failure.
    fn failure_text(&self) -> String {
        self.failure
            .lock()
            .clone()
            .unwrap_or_else(|| "unknown error".to_owned())
    }

    /// The refusal for a submit that adds data while the filesystem is full (counted).
    fn refuse_no_space(&self) -> StorageError {
        self.rejected_no_space.fetch_add(1, Ordering::Relaxed);
        StorageError::NoSpace(self.no_space_reason.lock().clone())
    }
}

/// Completes one submit's [`Durable`].
type Waiter = oneshot::Sender<Result<(), StorageError>>;

/// What the writer thread is asked to do, in submit order.
enum Cmd {
    Ops {
        ticket: u64,
        ops: Vec<Op>,
        growth: u64,
        waiter: Waiter,
    },
    Load(mpsc::SyncSender<Result<Snapshot, StorageError>>),
    Close(mpsc::SyncSender<Result<(), StorageError>>),
}

/// Ticket allocation and the channel, under one lock so channel order = ticket order.
#[derive(Debug)]
struct Submitter {
    next_ticket: u64,
    tx: Option<mpsc::Sender<Cmd>>,
}

/// The [`Store`] that keeps its data on disk (see the module doc); [`super::open`] picks it
/// when persistence is on.
#[derive(Debug)]
pub struct LogStore {
    shared: Arc<Shared>,
    submitter: Mutex<Submitter>,
    writer: Mutex<Option<JoinHandle<()>>>,
    dir: PathBuf,
    /// Held until [`Store::close`] (or drop): no other broker opens this directory meanwhile.
    lock: Mutex<Option<lock::DirLock>>,
}

impl LogStore {
    /// Opens (recovering, keeping every intact frame of a damaged one) the store in
    /// `<dir>/store`.
    ///
    /// # Errors
    ///
    /// A `StorageError` when the directory cannot be created, read or written
    /// ([`StorageError::Unusable`] names the path and the fix; the store is left as it was),
    /// [`StorageError::Locked`] when another process uses it, or [`StorageError::Corrupt`] for
    /// a store holding message id `u64::MAX` (no id would be left to allocate; the files are
    /// left as they are). Other damaged data does not fail the call.
    pub fn open(dir: &Path, opts: LogOptions) -> Result<LogStore, StorageError> {
        // 0700 when created here; an existing directory is the operator's: warned, not
        // changed (`private`).
        if dir.is_dir() {
            private::warn_if_open(&[dir]);
        } else {
            private::create_dir_all(dir)
                .map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        }
        // Before recovery reads anything: another broker may be writing these files.
        let store_dir = dir.join(STORE_DIR);
        let dir_lock = lock::lock_dir(dir).map_err(|e| unusable::explain(e, &store_dir))?;
        // The store's own files, written 0644 by an older version under the usual umask: made
        // private before recovery copies any of them (a damaged store's copy keeps the mode).
        let narrowed = private::narrow_files(&store_dir);
        if narrowed > 0 {
            tracing::info!(dir = %store_dir.display(), files = narrowed, "store files made private (group and other access removed)");
        }
        let opened = recover(dir, &store_dir)?;
        // Ids are never reused (`Store::next_message_id`): a store already holding the last
        // one (only damage can put it there, with valid checksums) cannot allocate another, and
        // wrapping to 0 would hand out ids it still holds. Refuse to open it; the files stay.
        let next_message_id = opened.state.max_message_id.checked_add(1).ok_or_else(|| {
            StorageError::Corrupt(format!(
                "{}: message id {} is stored, no id is left to allocate",
                store_dir.display(),
                u64::MAX
            ))
        })?;
        let shared = Arc::new(Shared {
            durable: watch::Sender::new(DurableState::default()),
            dedup_cap: AtomicUsize::new(usize::MAX),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            no_space: AtomicBool::new(false),
            no_space_reason: Mutex::new(String::new()),
            next_message_id: AtomicU64::new(next_message_id),
            queued_ops: AtomicUsize::new(0),
            pending_growth: AtomicU64::new(0),
            live_bytes: AtomicU64::new(opened.state.live_bytes),
            submits: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            log_bytes: AtomicU64::new(opened.log_bytes),
            snapshot_bytes: AtomicU64::new(opened.snapshot_bytes),
            log_len: AtomicU64::new(opened.log_len),
            // Recovery leaves the snapshot and the logs since it (all valid bytes).
            other_file_bytes: AtomicU64::new(
                (opened.snapshot_bytes + opened.log_bytes).saturating_sub(opened.log_len),
            ),
            compactions: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            rejected_disk_full: AtomicU64::new(0),
            dropped_disk_full: AtomicU64::new(0),
            rejected_no_space: AtomicU64::new(0),
            orphan_ops: AtomicU64::new(opened.state.orphans),
            recovery: opened.loss,
            commit_seconds: std::sync::OnceLock::new(),
            after_commits: std::sync::OnceLock::new(),
            opts,
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            dir: store_dir,
            shared: Arc::clone(&shared),
            rx,
            state: opened.state,
            log: opened.log,
            log_gen: opened.log_gen,
            log_len: opened.log_len,
            log_bytes: opened.log_bytes,
            dirty: false,
            last_fsync: Instant::now(),
            compactor: None,
            buf: Vec::new(),
            failed: false,
            stalled: None,
            backlog: std::collections::VecDeque::new(),
            next_compaction_try: None,
        };
        let handle = std::thread::Builder::new()
            .name("postbox-store".to_owned())
            .spawn(move || writer.run())
            .map_err(|e| StorageError::io("spawning the store writer thread", e))?;
        Ok(LogStore {
            shared,
            submitter: Mutex::new(Submitter {
                next_ticket: 0,
                tx: Some(tx),
            }),
            writer: Mutex::new(Some(handle)),
            dir: dir.to_owned(),
            lock: Mutex::new(Some(dir_lock)),
        })
    }

    /// The directory given to [`LogStore::open`].
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn failure(&self) -> StorageError {
        StorageError::Failed(self.shared.failure_text())
    }
}

impl LogStore {
    /// [`Store::submit`] and [`Store::submit_awaited`]: `bounded` applies the queue bound.
    fn submit_ops(&self, mut ops: Vec<Op>, bounded: bool) -> Result<Submitted, Rejected> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(Rejected {
                error: self.failure(),
                ops,
            });
        }
        let mut growth: u64 = ops
            .iter()
            .filter(|op| op.grows_store())
            .map(Op::size_estimate)
            .sum();
        if growth > 0 && self.shared.no_space.load(Ordering::Acquire) {
            return Err(Rejected {
                error: self.shared.refuse_no_space(),
                ops,
            });
        }
        let capacity = if growth > 0 {
            self.shared.opts.queue_capacity_ops
        } else {
            self.shared.opts.queue_capacity_ops * NON_GROWING_HEADROOM
        };
        let queued = self.shared.queued_ops.load(Ordering::Relaxed);
        if bounded && queued > 0 && !ops.is_empty() && queued + ops.len() > capacity {
            self.shared
                .rejected_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return Err(Rejected {
                error: StorageError::QueueFull { queued },
                ops,
            });
        }
        let dropped_ops = match self.check_budget(&mut ops, &mut growth) {
            Ok(dropped) => dropped,
            Err(error) => return Err(Rejected { error, ops }),
        };
        let n = ops.len();
        let mut sub = self.submitter.lock();
        let Some(tx) = sub.tx.as_ref() else {
            return Err(Rejected {
                error: StorageError::Closed,
                ops,
            });
        };
        let ticket = sub.next_ticket + 1;
        self.shared.queued_ops.fetch_add(n, Ordering::Relaxed);
        self.shared.add_pending_growth(growth);
        let (waiter, durable) = Durable::channel();
        if let Err(mpsc::SendError(cmd)) = tx.send(Cmd::Ops {
            ticket,
            ops,
            growth,
            waiter,
        }) {
            self.shared.queued_ops.fetch_sub(n, Ordering::Relaxed);
            self.shared.sub_pending_growth(growth);
            let ops = match cmd {
                Cmd::Ops { ops, .. } => ops,
                _ => Vec::new(),
            };
            return Err(Rejected {
                error: self.failure(),
                ops,
            });
        }
        sub.next_ticket = ticket;
        drop(sub);
        self.shared.submits.fetch_add(1, Ordering::Relaxed);
        self.shared.ops.fetch_add(n as u64, Ordering::Relaxed);
        Ok(Submitted {
            ticket,
            dropped_ops,
            durable,
        })
    }
}

impl Store for LogStore {
    fn submit(&self, ops: Vec<Op>) -> Result<Submitted, Rejected> {
        self.submit_ops(ops, true)
    }

    fn submit_awaited(&self, ops: Vec<Op>) -> Result<Submitted, Rejected> {
        self.submit_ops(ops, false)
    }

    fn durable(&self) -> watch::Receiver<DurableState> {
        self.shared.durable.subscribe()
    }

    fn load(&self) -> Result<Snapshot, StorageError> {
        let (reply, answer) = mpsc::sync_channel(1);
        {
            let sub = self.submitter.lock();
            let tx = sub.tx.as_ref().ok_or(StorageError::Closed)?;
            tx.send(Cmd::Load(reply)).map_err(|_| self.failure())?;
        }
        answer.recv().map_err(|_| self.failure())?
    }

    fn next_message_id(&self) -> MessageId {
        self.shared.next_message_id.fetch_add(1, Ordering::Relaxed)
    }

    fn survives_restart(&self) -> bool {
        true
    }

    fn bound_dedup(&self, max_entries: usize) {
        self.shared.dedup_cap.store(max_entries, Ordering::Relaxed);
    }

    fn observe_commits(&self, histogram: crate::metrics::Histogram) {
        let _ = self.shared.commit_seconds.set(histogram);
    }

    fn after_commits(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.shared.after_commits.set(CommitHook(hook));
    }

    fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            submits: r(&s.submits),
            ops: r(&s.ops),
            commits: r(&s.commits),
            fsyncs: r(&s.fsyncs),
            durable_ticket: s.durable.borrow().ticket,
            live_bytes: r(&s.live_bytes),
            log_bytes: r(&s.log_bytes),
            snapshot_bytes: r(&s.snapshot_bytes),
            disk_bytes: r(&s.other_file_bytes) + r(&s.log_len),
            compactions: r(&s.compactions),
            rejected_queue_full: r(&s.rejected_queue_full),
            rejected_disk_full: r(&s.rejected_disk_full),
            dropped_disk_full: r(&s.dropped_disk_full),
            rejected_no_space: r(&s.rejected_no_space),
            no_space: s.no_space.load(Ordering::Acquire),
            orphan_ops: r(&s.orphan_ops),
            recovery: s.recovery,
        }
    }

    fn health(&self) -> StoreHealth {
        if self.shared.failed.load(Ordering::Acquire) {
            StoreHealth::Failed
        } else if self.shared.no_space.load(Ordering::Acquire) {
            StoreHealth::NoSpace
        } else {
            StoreHealth::Ok
        }
    }

    fn refuse_growth(&self) -> Option<StorageError> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Some(self.failure());
        }
        self.shared
            .no_space
            .load(Ordering::Acquire)
            .then(|| self.shared.refuse_no_space())
    }

    fn close(&self) -> Result<(), StorageError> {
        let tx = self.submitter.lock().tx.take();
        let mut result = Ok(());
        if let Some(tx) = tx {
            let (reply, answer) = mpsc::sync_channel(1);
            if tx.send(Cmd::Close(reply)).is_ok() {
                result = answer.recv().unwrap_or(Ok(()));
            }
        }
        if let Some(handle) = self.writer.lock().take() {
            let _ = handle.join();
        }
        // The writer is gone: nothing of this store is written any more, so another broker
        // (or a restart in this process) may take the directory.
        self.lock.lock().take();
        result
    }
}

impl Drop for LogStore {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "closing the store");
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! File-level helpers for the tests in `storage::tests`.
    pub(crate) use super::format::test_files::file_of;
    pub(crate) use super::format::{log_name, snapshot_name, HEADER_LEN, KIND_OPS, KIND_TRAILER};
    use crate::storage::{record, Op};

    /// A frame body holding `ops`, as the writer encodes one.
    pub(crate) fn ops_body(ops: &[Op]) -> Vec<u8> {
        let mut body = vec![KIND_OPS];
        let mut enc = record::Enc(&mut body);
        enc.u32(ops.len() as u32);
        for op in ops {
            enc.op(op);
        }
        body
    }

    /// Checks that `ops` come back from their frame body field for field, and that the body
    /// cut anywhere is an error, never a panic nor another op (`Enc` and `Dec` must mirror
    /// each other): the round trip every new op's test makes.
    pub(crate) fn assert_ops_round_trip(ops: &[Op]) {
        let body = ops_body(ops);
        assert_eq!(body[0], KIND_OPS);
        let mut dec = record::Dec::new(&body[1..]);
        assert_eq!(dec.ops().expect("decode"), ops);
        assert!(dec.is_empty(), "trailing bytes after the ops");
        for cut in 1..body.len() - 1 {
            let mut dec = record::Dec::new(&body[1..cut]);
            assert!(dec.ops().is_err(), "a record cut at {cut} decoded");
        }
    }
}
