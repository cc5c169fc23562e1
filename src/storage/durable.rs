//! The durable engine: an append-only log of checksummed group commits, compacted into
//! snapshots. Chosen over `redb` by measurement (see `benches/storage-bench`): a group commit
//! here is one sequential `write` plus one `fdatasync`, where a B-tree commit rewrites pages.
//!
//! # Files (in `<storage.dir>/store/`)
//! * `log-<gen>.pbl`: a 24-byte header (magic, format version, generation, CRC), then frames.
//!   One frame = one group commit = the ops of every submit in the batch.
//! * `snapshot-<gen>.pbs`: same header, frames of ops that rebuild the state, and a trailer
//!   frame (op count, highest message id). Snapshot `S` holds the state at the end of log
//!   `S - 1`; recovery loads the newest snapshot and replays logs `S, S+1, …` in order.
//! * A frame is `len: u32 | crc32(body): u32 | crc32(len, crc): u32 | body`; the header CRC
//!   lets a corrupt length be told apart from a write cut short by a crash.
//!
//! # Crash safety
//! A frame is appended with one `write` and (policy `every-batch`) `fdatasync`ed before its
//! tickets are reported durable. A crash can only leave the *last* frame of the *last* log
//! incomplete (a torn tail): recovery drops it, since nobody was told it was durable. Any
//! other damage is corruption: the store is moved aside to `store.corrupt-<unix-secs>`, the
//! state up to the damage (snapshot plus every intact frame before it) is written to a fresh
//! store, and `tracing::error!` says so. A damaged snapshot leaves nothing to build on, so
//! that case starts empty.
//!
//! # Compaction
//! When the logs since the last snapshot exceed `max(compact_min_bytes, live bytes)`, the
//! writer (1) syncs the current log, (2) starts log `G+1`, (3) encodes its state, and hands
//! the bytes to a background thread that writes `snapshot-(G+1)` (temp file, fsync, rename,
//! directory fsync) and then deletes older logs and snapshots. A crash at any step leaves a
//! recoverable set of files. Should the log reach twice the threshold before that snapshot
//! is done, commits wait for it. Disk use is therefore bounded by the live data plus about
//! three times `max(compact_min_bytes, live data)`.
//!
//! # Threads
//! `submit` pushes onto a channel bounded by op count; one `std::thread` owns the files and
//! the [`State`], so no tokio worker ever blocks on the disk.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use super::codec::{Dec, Enc};
use super::state::State;
use super::{
    now_unix_ms, DiskFullPolicy, Durable, DurableState, FsyncPolicy, MessageId, Op, Rejected,
    Snapshot, StorageConfig, StorageError, Store, StoreStats, Submitted,
};

const LOG_MAGIC: &[u8; 8] = b"PBXLOG\0\x01";
const SNAPSHOT_MAGIC: &[u8; 8] = b"PBXSNAP\x01";
const FORMAT_VERSION: u32 = 1;
pub(crate) const HEADER_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 12;
const KIND_OPS: u8 = 0;
const KIND_TRAILER: u8 = 1;
/// Snapshot frames are cut at about this size, so no single frame gets huge.
const SNAPSHOT_FRAME_BYTES: usize = 1 << 20;
/// A batch stops taking submits once their data reaches this (bounds frame size and memory).
const MAX_BATCH_BYTES: u64 = 32 << 20;
/// The writer's encode buffer is shrunk back if a huge batch grew it beyond this.
const MAX_IDLE_BUFFER: usize = 16 << 20;

/// Name of the store directory inside `storage.dir`.
pub const STORE_DIR: &str = "store";

/// Tuning of the durable engine; built from [`StorageConfig`], adjustable in tests.
#[derive(Clone, Debug)]
pub struct DurableOptions {
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

impl DurableOptions {
    /// The options `config` describes (compaction threshold: 64 MiB).
    pub fn from_config(config: &StorageConfig) -> DurableOptions {
        DurableOptions {
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

impl Default for DurableOptions {
    fn default() -> Self {
        DurableOptions::from_config(&StorageConfig::default())
    }
}

/// State shared by the submitters and the writer thread.
#[derive(Debug)]
struct Shared {
    opts: DurableOptions,
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

type Waiter = oneshot::Sender<Result<(), StorageError>>;

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

/// The durable [`Store`] (see the module doc).
#[derive(Debug)]
pub struct DurableStore {
    shared: Arc<Shared>,
    submitter: Mutex<Submitter>,
    writer: Mutex<Option<JoinHandle<()>>>,
    dir: PathBuf,
}

impl DurableStore {
    /// Opens (recovering, or moving a corrupt store aside) the store in `<dir>/store`.
    pub fn open(dir: &Path, opts: DurableOptions) -> Result<DurableStore, StorageError> {
        fs::create_dir_all(dir)
            .map_err(|e| StorageError::io(format!("creating {}", dir.display()), e))?;
        let store_dir = dir.join(STORE_DIR);
        let opened = match recover(&store_dir) {
            Ok(opened) => opened,
            Err(broken) => rebuild(dir, &store_dir, *broken)?,
        };
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
            next_message_id: AtomicU64::new(state.max_message_id + 1),
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
        Ok(DurableStore {
            shared,
            submitter: Mutex::new(Submitter {
                next_ticket: 0,
                tx: Some(tx),
            }),
            writer: Mutex::new(Some(handle)),
            dir: dir.to_owned(),
        })
    }

    /// The directory given to [`DurableStore::open`].
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn failure(&self) -> StorageError {
        StorageError::Failed(
            self.shared
                .failure
                .lock()
                .clone()
                .unwrap_or_else(|| "unknown error".to_owned()),
        )
    }

    /// Applies the disk budget: `Ok(dropped ops)` or the error to reject with.
    fn check_budget(&self, ops: &mut Vec<Op>, growth: &mut u64) -> Result<u32, StorageError> {
        let max = self.shared.opts.max_disk_bytes;
        if max == 0 || *growth == 0 {
            return Ok(0);
        }
        let live = self.shared.live_bytes.load(Ordering::Relaxed)
            + self.shared.pending_growth.load(Ordering::Relaxed);
        if live + *growth <= max {
            return Ok(0);
        }
        match self.shared.opts.disk_full {
            DiskFullPolicy::Reject => {
                self.shared
                    .rejected_disk_full
                    .fetch_add(1, Ordering::Relaxed);
                Err(StorageError::DiskBudgetExceeded {
                    live,
                    incoming: *growth,
                    max,
                })
            }
            DiskFullPolicy::KeepInMemory => {
                let mut dropped = 0u32;
                let kept: Vec<Op> = std::mem::take(ops)
                    .into_iter()
                    .filter_map(|op| {
                        if !op.grows_store() {
                            return Some(op);
                        }
                        dropped += 1;
                        // An older stored value must not come back after a restart.
                        match op {
                            Op::PutRetained { topic, .. } => Some(Op::DeleteRetained { topic }),
                            Op::PutWill { client_id, .. } => Some(Op::DeleteWill { client_id }),
                            _ => None,
                        }
                    })
                    .collect();
                *ops = kept;
                *growth = 0;
                self.shared
                    .dropped_disk_full
                    .fetch_add(u64::from(dropped), Ordering::Relaxed);
                Ok(dropped)
            }
        }
    }
}

impl Store for DurableStore {
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

    fn is_durable(&self) -> bool {
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

impl Drop for DurableStore {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "closing the store");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Writer thread

struct Writer {
    dir: PathBuf,
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Cmd>,
    state: State,
    log: File,
    log_gen: u64,
    /// Bytes in the current log file (header included).
    log_len: u64,
    /// Bytes in all logs since the last snapshot: what compaction would reclaim.
    log_bytes: u64,
    /// Written but not yet fdatasynced.
    dirty: bool,
    last_fsync: Instant,
    compactor: Option<JoinHandle<Result<(u64, u64), StorageError>>>,
    buf: Vec<u8>,
    failed: bool,
}

/// A batch being assembled: tickets, ops, the budget bytes they reserved, who waits.
#[derive(Default)]
struct Batch {
    last_ticket: u64,
    ops: Vec<Op>,
    growth: u64,
    waiters: Vec<Waiter>,
}

impl Writer {
    fn run(mut self) {
        let mut pending: Option<Cmd> = None;
        loop {
            let cmd = match pending.take() {
                Some(cmd) => cmd,
                None => match self.recv_first() {
                    Some(cmd) => cmd,
                    None => {
                        // Every sender is gone without Close (the store was leaked/dropped
                        // abnormally): still leave the log synced.
                        let _ = self.finish();
                        return;
                    }
                },
            };
            match cmd {
                Cmd::Ops {
                    ticket,
                    ops,
                    growth,
                    waiter,
                } => {
                    let mut batch = Batch::default();
                    self.take(&mut batch, ticket, ops, growth, waiter);
                    pending = self.fill(&mut batch);
                    if self.failed {
                        self.drop_batch(batch);
                    } else {
                        let waiters = std::mem::take(&mut batch.waiters);
                        match self.commit(batch, waiters) {
                            Ok(()) => {}
                            Err((error, waiters)) => {
                                self.fail(error);
                                self.tell_failed(waiters);
                            }
                        }
                    }
                }
                Cmd::Load(reply) => {
                    let result = if self.failed {
                        Err(StorageError::Failed(self.failure_text()))
                    } else {
                        self.state.purge_expired(now_unix_ms());
                        self.publish_sizes();
                        Ok(self.state.to_snapshot())
                    };
                    let _ = reply.send(result);
                }
                Cmd::Close(reply) => {
                    let result = self.finish();
                    let _ = reply.send(result);
                    return;
                }
            }
        }
    }

    /// Waits for the next command; under `interval` also wakes to fsync on time.
    fn recv_first(&mut self) -> Option<Cmd> {
        loop {
            if self.shared.opts.fsync != FsyncPolicy::Interval || !self.dirty || self.failed {
                return self.rx.recv().ok();
            }
            let due = self.last_fsync + self.shared.opts.fsync_interval;
            let wait = due.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(cmd) => return Some(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(error) = self.sync() {
                        self.fail(error);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn take(&mut self, batch: &mut Batch, ticket: u64, mut ops: Vec<Op>, growth: u64, w: Waiter) {
        self.shared
            .queued_ops
            .fetch_sub(ops.len(), Ordering::Relaxed);
        batch.last_ticket = ticket;
        batch.growth += growth;
        batch.waiters.push(w);
        if batch.ops.is_empty() {
            batch.ops = ops;
        } else {
            batch.ops.append(&mut ops);
        }
    }

    /// Group commit: adds whatever is already queued (and, with a window, what arrives in
    /// it) up to `max_batch_ops`. Returns a non-ops command that ended the batch.
    fn fill(&mut self, batch: &mut Batch) -> Option<Cmd> {
        let opts = &self.shared.opts;
        let max_ops = opts.max_batch_ops;
        let deadline = Instant::now() + opts.commit_window;
        while batch.ops.len() < max_ops && batch.growth < MAX_BATCH_BYTES {
            let next = match self.rx.try_recv() {
                Ok(cmd) => cmd,
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return None;
                    }
                    match self.rx.recv_timeout(deadline - now) {
                        Ok(cmd) => cmd,
                        Err(_) => return None,
                    }
                }
            };
            match next {
                Cmd::Ops {
                    ticket,
                    ops,
                    growth,
                    waiter,
                } => self.take(batch, ticket, ops, growth, waiter),
                other => return Some(other),
            }
        }
        None
    }

    /// Writes one frame with the batch, syncs per policy, applies it, reports durability.
    fn commit(
        &mut self,
        batch: Batch,
        waiters: Vec<Waiter>,
    ) -> Result<(), (StorageError, Vec<Waiter>)> {
        match self.write_batch(batch) {
            Ok(last_ticket) => {
                self.shared.durable.send_replace(DurableState {
                    ticket: last_ticket,
                    failed: false,
                });
                for waiter in waiters {
                    let _ = waiter.send(Ok(()));
                }
                self.maybe_compact();
                Ok(())
            }
            Err(error) => Err((error, waiters)),
        }
    }

    /// Writes, syncs and applies a batch; returns its last ticket.
    fn write_batch(&mut self, batch: Batch) -> Result<u64, StorageError> {
        let Batch {
            last_ticket,
            ops,
            growth,
            waiters: _,
        } = batch;
        if ops.is_empty() {
            // A barrier: everything before it is already written; nothing to add.
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(last_ticket);
        }
        self.buf.clear();
        let start = begin_frame(&mut self.buf);
        {
            let mut enc = Enc(&mut self.buf);
            enc.u8(KIND_OPS);
            enc.u32(ops.len() as u32);
            for op in &ops {
                enc.op(op);
            }
        }
        finish_frame(&mut self.buf, start);
        self.log
            .write_all(&self.buf)
            .map_err(|e| StorageError::io(format!("appending to log {}", self.log_gen), e))?;
        let written = self.buf.len() as u64;
        if self.buf.capacity() > MAX_IDLE_BUFFER {
            self.buf = Vec::new();
        }
        self.log_len += written;
        self.log_bytes += written;
        self.dirty = true;
        match self.shared.opts.fsync {
            FsyncPolicy::EveryBatch => self.sync()?,
            FsyncPolicy::Interval => {
                if self.last_fsync.elapsed() >= self.shared.opts.fsync_interval {
                    self.sync()?;
                }
            }
            FsyncPolicy::Never => {}
        }
        for op in ops {
            self.state.apply(op);
        }
        self.state.end_batch();
        self.shared
            .pending_growth
            .fetch_sub(growth, Ordering::Relaxed);
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        self.publish_sizes();
        Ok(last_ticket)
    }

    fn tell_failed(&self, waiters: Vec<Waiter>) {
        let text = self.failure_text();
        for waiter in waiters {
            let _ = waiter.send(Err(StorageError::Failed(text.clone())));
        }
    }

    fn sync(&mut self) -> Result<(), StorageError> {
        if self.dirty {
            self.log
                .sync_data()
                .map_err(|e| StorageError::io(format!("syncing log {}", self.log_gen), e))?;
            self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.dirty = false;
        }
        self.last_fsync = Instant::now();
        Ok(())
    }

    fn publish_sizes(&self) {
        let s = &self.shared;
        s.live_bytes.store(self.state.live_bytes, Ordering::Relaxed);
        s.log_bytes.store(self.log_bytes, Ordering::Relaxed);
        s.orphan_ops.store(self.state.orphans, Ordering::Relaxed);
    }

    fn drop_batch(&mut self, batch: Batch) {
        self.shared
            .pending_growth
            .fetch_sub(batch.growth, Ordering::Relaxed);
        self.tell_failed(batch.waiters);
    }

    fn failure_text(&self) -> String {
        self.shared
            .failure
            .lock()
            .clone()
            .unwrap_or_else(|| "unknown error".to_owned())
    }

    /// Stops making anything durable: an fsync error cannot be retried safely (the kernel may
    /// have dropped the dirty pages), so waiting publishers must be told instead of acked.
    fn fail(&mut self, error: StorageError) {
        tracing::error!(%error, dir = %self.dir.display(),
            "storage writer failed: no further message will be acknowledged as durable");
        *self.shared.failure.lock() = Some(error.to_string());
        self.failed = true;
        self.shared.failed.store(true, Ordering::Release);
        self.shared.durable.send_modify(|s| s.failed = true);
    }

    /// Final sync and wait for a running compaction.
    fn finish(&mut self) -> Result<(), StorageError> {
        let mut result = Ok(());
        if !self.failed {
            result = self.sync();
        }
        if let Some(handle) = self.compactor.take() {
            self.collect_compaction(handle);
        }
        if self.failed && result.is_ok() {
            result = Err(StorageError::Failed(self.failure_text()));
        }
        result
    }

    fn collect_compaction(&mut self, handle: JoinHandle<Result<(u64, u64), StorageError>>) {
        match handle.join() {
            Ok(Ok((_gen, bytes))) => {
                self.shared.snapshot_bytes.store(bytes, Ordering::Relaxed);
                self.shared.compactions.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(error)) => {
                // The logs are still all there, so nothing is lost; the next compaction retries.
                tracing::error!(%error, "store compaction failed; the log keeps growing until one succeeds");
            }
            Err(_) => tracing::error!("store compaction thread panicked"),
        }
    }

    fn maybe_compact(&mut self) {
        let threshold = self
            .shared
            .opts
            .compact_min_bytes
            .max(self.state.live_bytes);
        if let Some(handle) = self.compactor.take() {
            // A writer faster than the snapshot thread would let the log grow without bound:
            // past twice the threshold, commits wait for the snapshot (bounded disk wins).
            if !handle.is_finished() && self.log_bytes <= threshold.saturating_mul(2) {
                self.compactor = Some(handle);
                return;
            }
            self.collect_compaction(handle);
        }
        if self.log_bytes <= threshold {
            return;
        }
        if let Err(error) = self.start_compaction() {
            tracing::error!(%error, "cannot start store compaction");
        }
    }

    fn start_compaction(&mut self) -> Result<(), StorageError> {
        // No earlier log may be torn once a later one holds frames.
        self.sync()?;
        let gen = self.log_gen + 1;
        let log = create_log(&self.dir, gen)?;
        self.log = log;
        self.log_gen = gen;
        self.log_len = HEADER_LEN as u64;
        self.log_bytes = HEADER_LEN as u64;
        self.state.purge_expired(now_unix_ms());
        self.publish_sizes();
        let bytes = encode_snapshot(&self.state, gen);
        let dir = self.dir.clone();
        let handle = std::thread::Builder::new()
            .name("postbox-compact".to_owned())
            .spawn(move || write_snapshot(&dir, gen, &bytes).map(|()| (gen, bytes.len() as u64)))
            .map_err(|e| StorageError::io("spawning the compaction thread", e))?;
        self.compactor = Some(handle);
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// File format

fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    start
}

fn finish_frame(buf: &mut [u8], start: usize) {
    let body = &buf[start + FRAME_HEADER_LEN..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32fast::hash(&buf[start..start + 8]);
    buf[start + 8..start + 12].copy_from_slice(&hcrc.to_le_bytes());
}

fn file_header(magic: &[u8; 8], gen: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(magic);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&gen.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

fn check_header(buf: &[u8], magic: &[u8; 8], gen: u64) -> Result<(), String> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err("file shorter than its header".to_owned());
    };
    if &h[..8] != magic {
        return Err("bad magic".to_owned());
    }
    if file_header(magic, gen) != *h {
        let mut version = [0u8; 4];
        version.copy_from_slice(&h[8..12]);
        let version = u32::from_le_bytes(version);
        if version != FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        return Err("header checksum or generation mismatch".to_owned());
    }
    Ok(())
}

/// What the next bytes of a file hold.
#[derive(Debug, PartialEq, Eq)]
enum Next<'a> {
    Frame(&'a [u8]),
    End,
    /// An incomplete last frame (a write cut short): everything from here is dropped.
    Torn,
    Corrupt(&'static str),
}

fn next_frame<'a>(buf: &'a [u8], pos: &mut usize) -> Next<'a> {
    let rest = buf.get(*pos..).unwrap_or_default();
    if rest.is_empty() {
        return Next::End;
    }
    if rest.len() < FRAME_HEADER_LEN {
        return Next::Torn;
    }
    let word = |i: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&rest[i..i + 4]);
        u32::from_le_bytes(w)
    };
    let (len, crc, hcrc) = (word(0) as usize, word(4), word(8));
    if crc32fast::hash(&rest[..8]) != hcrc {
        if rest.iter().all(|b| *b == 0) {
            return Next::Torn; // zero-filled tail: the size grew but the data never landed
        }
        return Next::Corrupt("frame header checksum mismatch");
    }
    let Some(body) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
        return Next::Torn;
    };
    if crc32fast::hash(body) != crc {
        if FRAME_HEADER_LEN + len == rest.len() {
            return Next::Torn; // the last frame, partly written
        }
        return Next::Corrupt("frame checksum mismatch");
    }
    *pos += FRAME_HEADER_LEN + len;
    Next::Frame(body)
}

fn encode_snapshot(state: &State, gen: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&file_header(SNAPSHOT_MAGIC, gen));
    let mut total: u64 = 0;
    let mut frame: Option<(usize, usize, u32)> = None; // (frame start, count offset, count)
    let close = |out: &mut Vec<u8>, (start, at, count): (usize, usize, u32)| {
        out[at..at + 4].copy_from_slice(&count.to_le_bytes());
        finish_frame(out, start);
    };
    state.for_each_op(|op| {
        let (start, at, count) = match frame.take() {
            Some(f) => f,
            None => {
                let start = begin_frame(&mut out);
                out.push(KIND_OPS);
                let at = out.len();
                out.extend_from_slice(&[0u8; 4]);
                (start, at, 0)
            }
        };
        Enc(&mut out).op(op);
        total += 1;
        let f = (start, at, count + 1);
        if out.len() - start >= SNAPSHOT_FRAME_BYTES {
            close(&mut out, f);
        } else {
            frame = Some(f);
        }
    });
    if let Some(f) = frame {
        close(&mut out, f);
    }
    let start = begin_frame(&mut out);
    let mut enc = Enc(&mut out);
    enc.u8(KIND_TRAILER);
    enc.u64(total);
    enc.u64(state.max_message_id);
    finish_frame(&mut out, start);
    out
}

/// Writes a snapshot atomically, then deletes the files it supersedes.
fn write_snapshot(dir: &Path, gen: u64, bytes: &[u8]) -> Result<(), StorageError> {
    let path = dir.join(snapshot_name(gen));
    let tmp = dir.join(format!("{}.tmp", snapshot_name(gen)));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(StorageError::io(format!("writing {}", path.display()), e));
    }
    remove_older_than(dir, gen);
    Ok(())
}

/// Deletes logs and snapshots of generations below `gen` (superseded by snapshot `gen`).
fn remove_older_than(dir: &Path, gen: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = match parse_name(name) {
            Some(FileKind::Log(g)) | Some(FileKind::Snapshot(g)) => g < gen,
            Some(FileKind::Temp) => false, // a running snapshot write owns it
            None => false,
        };
        if old {
            if let Err(error) = fs::remove_file(entry.path()) {
                tracing::warn!(%error, file = name, "cannot remove superseded store file");
            }
        }
    }
}

pub(crate) fn log_name(gen: u64) -> String {
    format!("log-{gen:020}.pbl")
}

pub(crate) fn snapshot_name(gen: u64) -> String {
    format!("snapshot-{gen:020}.pbs")
}

enum FileKind {
    Log(u64),
    Snapshot(u64),
    Temp,
}

fn parse_name(name: &str) -> Option<FileKind> {
    if name.ends_with(".tmp") {
        return Some(FileKind::Temp);
    }
    if let Some(g) = name
        .strip_prefix("log-")
        .and_then(|s| s.strip_suffix(".pbl"))
    {
        return g.parse().ok().map(FileKind::Log);
    }
    if let Some(g) = name
        .strip_prefix("snapshot-")
        .and_then(|s| s.strip_suffix(".pbs"))
    {
        return g.parse().ok().map(FileKind::Snapshot);
    }
    None
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn create_log(dir: &Path, gen: u64) -> Result<File, StorageError> {
    let path = dir.join(log_name(gen));
    let create = || -> std::io::Result<File> {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        f.write_all(&file_header(LOG_MAGIC, gen))?;
        f.sync_all()?;
        sync_dir(dir)?;
        // Reopen in append mode: every frame goes to the end in one write.
        OpenOptions::new().append(true).open(&path)
    };
    create().map_err(|e| StorageError::io(format!("creating {}", path.display()), e))
}

// ------------------------------------------------------------------------------------------
// Recovery

/// A store ready for the writer.
struct Opened {
    state: State,
    log: File,
    log_gen: u64,
    log_len: u64,
    log_bytes: u64,
    snapshot_bytes: u64,
}

/// Why recovery failed, and the state that could still be verified.
struct Broken {
    reason: String,
    state: State,
    frames_recovered: u64,
}

fn broken(reason: impl Into<String>, state: State, frames_recovered: u64) -> Box<Broken> {
    Box::new(Broken {
        reason: reason.into(),
        state,
        frames_recovered,
    })
}

/// Loads snapshot + logs. Only a torn tail of the last log is repaired in place; anything
/// else is returned as [`Broken`].
fn recover(store_dir: &Path) -> Result<Opened, Box<Broken>> {
    if !store_dir.exists() {
        let create = || -> Result<Opened, StorageError> {
            fs::create_dir_all(store_dir)
                .map_err(|e| StorageError::io(format!("creating {}", store_dir.display()), e))?;
            if let Some(parent) = store_dir.parent() {
                let _ = sync_dir(parent);
            }
            fresh(store_dir, State::default())
        };
        return create().map_err(|e| broken(e.to_string(), State::default(), 0));
    }
    let entries = fs::read_dir(store_dir).map_err(|e| {
        broken(
            format!("cannot list {}: {e}", store_dir.display()),
            State::default(),
            0,
        )
    })?;
    let mut logs = Vec::new();
    let mut snapshots = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| broken(format!("cannot list store: {e}"), State::default(), 0))?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_name) {
            Some(FileKind::Log(g)) => logs.push(g),
            Some(FileKind::Snapshot(g)) => snapshots.push(g),
            Some(FileKind::Temp) => {
                let _ = fs::remove_file(entry.path()); // an interrupted snapshot write
            }
            None => tracing::warn!(file = ?name, "ignoring unknown file in the store directory"),
        }
    }
    logs.sort_unstable();
    let snapshot_gen = snapshots.iter().copied().max().unwrap_or(0);
    let mut state = State::default();
    let mut snapshot_bytes = 0;
    if snapshot_gen > 0 {
        let path = store_dir.join(snapshot_name(snapshot_gen));
        let bytes = fs::read(&path).map_err(|e| {
            broken(
                format!("cannot read {}: {e}", path.display()),
                State::default(),
                0,
            )
        })?;
        snapshot_bytes = bytes.len() as u64;
        state = read_snapshot(&bytes, snapshot_gen).map_err(|why| {
            broken(
                format!("snapshot {}: {why}", path.display()),
                State::default(),
                0,
            )
        })?;
    }
    let first = snapshot_gen.max(1);
    let logs: Vec<u64> = logs.into_iter().filter(|g| *g >= first).collect();
    if logs.is_empty() {
        if snapshot_gen > 0 {
            return Err(broken(format!("log {first} is missing"), state, 0));
        }
        return fresh(store_dir, state).map_err(|e| broken(e.to_string(), State::default(), 0));
    }
    for (i, g) in logs.iter().enumerate() {
        if *g != first + i as u64 {
            return Err(broken(
                format!("log {} is missing", first + i as u64),
                state,
                0,
            ));
        }
    }
    let mut frames: u64 = 0;
    let mut log_bytes: u64 = 0;
    let last = logs.len() - 1;
    let mut tail: Option<(u64, u64, bool)> = None; // (gen, valid length, torn)
    for (i, gen) in logs.iter().copied().enumerate() {
        let path = store_dir.join(log_name(gen));
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                return Err(broken(
                    format!("cannot read {}: {e}", path.display()),
                    state,
                    frames,
                ))
            }
        };
        if i == last && bytes.len() < HEADER_LEN {
            // Created but its header never fully reached the disk: no frame can follow.
            tail = Some((gen, 0, true));
            break;
        }
        if let Err(why) = check_header(&bytes, LOG_MAGIC, gen) {
            return Err(broken(format!("{}: {why}", path.display()), state, frames));
        }
        let mut pos = HEADER_LEN;
        loop {
            match next_frame(&bytes, &mut pos) {
                Next::Frame(body) => {
                    if let Err(why) = apply_log_frame(&mut state, body) {
                        return Err(broken(
                            format!("{} at byte {pos}: {why}", path.display()),
                            state,
                            frames,
                        ));
                    }
                    frames += 1;
                }
                Next::End => break,
                Next::Torn if i == last => {
                    tracing::warn!(file = %path.display(), at = pos, dropped = bytes.len() - pos,
                        "store log ends in an incomplete frame (crash during a write); dropping it");
                    break;
                }
                Next::Torn => {
                    return Err(broken(
                        format!("{} is cut short at byte {pos}", path.display()),
                        state,
                        frames,
                    ))
                }
                Next::Corrupt(why) => {
                    return Err(broken(
                        format!("{} at byte {pos}: {why}", path.display()),
                        state,
                        frames,
                    ))
                }
            }
        }
        log_bytes += pos as u64;
        tail = Some((gen, pos as u64, pos < bytes.len()));
    }
    remove_older_than(store_dir, snapshot_gen);
    let Some((gen, valid, torn)) = tail else {
        return fresh(store_dir, state).map_err(|e| broken(e.to_string(), State::default(), 0));
    };
    let path = store_dir.join(log_name(gen));
    let reopen = || -> Result<File, StorageError> {
        if valid < HEADER_LEN as u64 {
            return create_log(store_dir, gen);
        }
        if torn {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
            f.set_len(valid)
                .and_then(|()| f.sync_all())
                .map_err(|e| StorageError::io(format!("truncating {}", path.display()), e))?;
        }
        OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))
    };
    match reopen() {
        Ok(log) => Ok(Opened {
            state,
            log,
            log_gen: gen,
            log_len: valid.max(HEADER_LEN as u64),
            log_bytes,
            snapshot_bytes,
        }),
        Err(e) => Err(broken(e.to_string(), state, frames)),
    }
}

fn apply_log_frame(state: &mut State, body: &[u8]) -> Result<(), String> {
    let mut dec = Dec::new(body);
    let kind = dec.u8().map_err(|e| e.to_string())?;
    if kind != KIND_OPS {
        return Err(format!("unexpected frame kind {kind}"));
    }
    // Decode the whole frame before applying: a commit is all or nothing.
    let ops = dec.ops().map_err(|e| e.to_string())?;
    if !dec.is_empty() {
        return Err("trailing bytes in frame".to_owned());
    }
    for op in ops {
        state.apply(op);
    }
    state.end_batch();
    Ok(())
}

fn read_snapshot(bytes: &[u8], gen: u64) -> Result<State, String> {
    check_header(bytes, SNAPSHOT_MAGIC, gen)?;
    let mut state = State::default();
    let mut pos = HEADER_LEN;
    let mut total: u64 = 0;
    loop {
        match next_frame(bytes, &mut pos) {
            Next::Frame(body) => {
                let mut dec = Dec::new(body);
                match dec.u8().map_err(|e| e.to_string())? {
                    KIND_OPS => {
                        for op in dec.ops().map_err(|e| e.to_string())? {
                            state.apply(op);
                            total += 1;
                        }
                    }
                    KIND_TRAILER => {
                        let count = dec.u64().map_err(|e| e.to_string())?;
                        let max_id = dec.u64().map_err(|e| e.to_string())?;
                        if count != total {
                            return Err(format!("trailer counts {count} ops, found {total}"));
                        }
                        if pos != bytes.len() {
                            return Err("data after the trailer".to_owned());
                        }
                        state.end_batch();
                        state.max_message_id = state.max_message_id.max(max_id);
                        return Ok(state);
                    }
                    kind => return Err(format!("unexpected frame kind {kind}")),
                }
                if !dec.is_empty() {
                    return Err("trailing bytes in frame".to_owned());
                }
            }
            Next::End | Next::Torn => return Err("cut short (no trailer)".to_owned()),
            Next::Corrupt(why) => return Err(format!("{why} at byte {pos}")),
        }
    }
}

/// Creates the files of a store holding `state`: `snapshot-1` (if not empty) and `log-1`.
fn fresh(store_dir: &Path, state: State) -> Result<Opened, StorageError> {
    let mut snapshot_bytes = 0;
    let empty = state.live_bytes == 0 && state.max_message_id == 0;
    if !empty {
        let bytes = encode_snapshot(&state, 1);
        snapshot_bytes = bytes.len() as u64;
        write_snapshot(store_dir, 1, &bytes)?;
    }
    let log = create_log(store_dir, 1)?;
    Ok(Opened {
        state,
        log,
        log_gen: 1,
        log_len: HEADER_LEN as u64,
        log_bytes: HEADER_LEN as u64,
        snapshot_bytes,
    })
}

/// Moves a broken store aside and starts a new one from what could be verified.
fn rebuild(dir: &Path, store_dir: &Path, broken: Broken) -> Result<Opened, StorageError> {
    let secs = now_unix_ms() / 1000;
    let mut aside = dir.join(format!("{STORE_DIR}.corrupt-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = dir.join(format!("{STORE_DIR}.corrupt-{secs}-{n}"));
        n += 1;
    }
    if store_dir.exists() {
        fs::rename(store_dir, &aside).map_err(|e| {
            StorageError::io(
                format!(
                    "moving the corrupt store {} aside to {}",
                    store_dir.display(),
                    aside.display()
                ),
                e,
            )
        })?;
    }
    let sessions = broken.state.to_snapshot().sessions.len();
    tracing::error!(
        reason = %broken.reason,
        moved_to = %aside.display(),
        frames_recovered = broken.frames_recovered,
        sessions_recovered = sessions,
        "STORE CORRUPT: moved aside; starting from the state before the damage \
         (messages committed after it are lost). Keep the moved directory for analysis."
    );
    // Build the replacement beside it and rename it in, so a crash now cannot leave a
    // half-written store that would itself look corrupt (or empty) at the next start.
    let building = dir.join(format!("{STORE_DIR}.rebuilding"));
    if building.exists() {
        fs::remove_dir_all(&building)
            .map_err(|e| StorageError::io(format!("removing {}", building.display()), e))?;
    }
    fs::create_dir_all(&building)
        .map_err(|e| StorageError::io(format!("creating {}", building.display()), e))?;
    let opened = fresh(&building, broken.state)?;
    fs::rename(&building, store_dir)
        .and_then(|()| sync_dir(dir))
        .map_err(|e| StorageError::io(format!("renaming {}", building.display()), e))?;
    Ok(opened)
}

#[cfg(test)]
pub(crate) mod test_support {
    //! File-level helpers for the tests in `super::super::tests`.
    pub(crate) use super::{log_name, snapshot_name, HEADER_LEN};
}
