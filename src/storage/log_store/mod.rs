//! The log engine: the [`Store`] that keeps its data on disk, as an append-only log of
//! checksummed group commits compacted into snapshots. Chosen over `redb` by measurement (see
//! `benches/storage-bench`): a group commit here is one sequential `write` plus one
//! `fdatasync`, where a B-tree commit rewrites pages. `docs/ARCHITECTURE.md` ("Durability
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
//! * `compaction`: when and how the writer starts a snapshot.
//! * `snapshot`: encoding, atomically writing and reading a snapshot file.
//! * `format`: file headers, frames, file names, the log file.
//! * `recovery`: opening the files at start, torn tails, moving a corrupt store aside.
//!
//! # Threads
//! `submit` pushes onto a channel bounded by op count; one `std::thread` (the writer) owns
//! the files and the `State`; a snapshot is written by a short-lived
//! second thread.

mod budget;
mod compaction;
mod format;
mod recovery;
mod snapshot;
mod writer;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use super::{
    DiskFullPolicy, Durable, DurableState, FsyncPolicy, MessageId, Op, Rejected, Snapshot,
    StorageConfig, StorageError, Store, StoreStats, Submitted,
};
use recovery::{rebuild, recover, Opened};
use writer::Writer;

/// Name of the store directory inside `storage.dir`.
pub const STORE_DIR: &str = "store";

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
    durable: watch::Sender<DurableState>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
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
    compactions: AtomicU64,
    rejected_queue_full: AtomicU64,
    rejected_disk_full: AtomicU64,
    dropped_disk_full: AtomicU64,
    orphan_ops: AtomicU64,
}

impl Shared {
    /// Why the writer stopped, for errors handed to callers after a failure.
    fn failure_text(&self) -> String {
        self.failure
            .lock()
            .clone()
            .unwrap_or_else(|| "unknown error".to_owned())
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
}

impl LogStore {
    /// Opens (recovering, or moving a corrupt store aside) the store in `<dir>/store`.
    ///
    /// # Errors
    ///
    /// A `StorageError` when the directory cannot be created or written. A corrupt store is
    /// moved aside rather than failing the call, except one holding message id `u64::MAX`
    /// (`StorageError::Corrupt`: no id would be left to allocate; the files are left as they are).
    pub fn open(dir: &Path, opts: LogOptions) -> Result<LogStore, StorageError> {
        fs::create_dir_all(dir)
            .map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        let store_dir = dir.join(STORE_DIR);
        let opened = match recover(&store_dir) {
            Ok(opened) => opened,
            Err(broken) => rebuild(dir, &store_dir, *broken)?,
        };
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
        let Opened {
            state,
            log,
            log_gen,
            log_len,
            log_bytes,
            snapshot_bytes,
        } = opened;
        let shared = Arc::new(Shared {
            durable: watch::Sender::new(DurableState::default()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            next_message_id: AtomicU64::new(next_message_id),
            queued_ops: AtomicUsize::new(0),
            pending_growth: AtomicU64::new(0),
            live_bytes: AtomicU64::new(state.live_bytes),
            submits: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            log_bytes: AtomicU64::new(log_bytes),
            snapshot_bytes: AtomicU64::new(snapshot_bytes),
            compactions: AtomicU64::new(0),
            rejected_queue_full: AtomicU64::new(0),
            rejected_disk_full: AtomicU64::new(0),
            dropped_disk_full: AtomicU64::new(0),
            orphan_ops: AtomicU64::new(state.orphans),
            opts,
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            dir: store_dir,
            shared: Arc::clone(&shared),
            rx,
            state,
            log,
            log_gen,
            log_len,
            log_bytes,
            dirty: false,
            last_fsync: Instant::now(),
            compactor: None,
            buf: Vec::new(),
            failed: false,
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

impl Store for LogStore {
    fn submit(&self, mut ops: Vec<Op>) -> Result<Submitted, Rejected> {
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(Rejected {
                error: self.failure(),
                ops,
            });
        }
        let queued = self.shared.queued_ops.load(Ordering::Relaxed);
        if queued > 0 && queued + ops.len() > self.shared.opts.queue_capacity_ops {
            self.shared
                .rejected_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return Err(Rejected {
                error: StorageError::QueueFull { queued },
                ops,
            });
        }
        let mut growth: u64 = ops
            .iter()
            .filter(|op| op.grows_store())
            .map(Op::size_estimate)
            .sum();
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
        self.shared
            .pending_growth
            .fetch_add(growth, Ordering::Relaxed);
        let (waiter, durable) = Durable::channel();
        if let Err(mpsc::SendError(cmd)) = tx.send(Cmd::Ops {
            ticket,
            ops,
            growth,
            waiter,
        }) {
            self.shared.queued_ops.fetch_sub(n, Ordering::Relaxed);
            self.shared
                .pending_growth
                .fetch_sub(growth, Ordering::Relaxed);
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
            compactions: r(&s.compactions),
            rejected_queue_full: r(&s.rejected_queue_full),
            rejected_disk_full: r(&s.rejected_disk_full),
            dropped_disk_full: r(&s.dropped_disk_full),
            orphan_ops: r(&s.orphan_ops),
        }
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
    pub(crate) use super::format::{log_name, snapshot_name, HEADER_LEN};
}
