//! The writer thread: takes submits off the channel in ticket order, batches them (group
//! commit), appends one frame per batch, syncs per [`FsyncPolicy`], applies the batch to its
//! [`State`] and only then reports the batch's tickets durable.
//!
//! Must not report a ticket durable before its frame is written and (per policy) synced, and
//! must not retry after an I/O error: once failed it stays failed. The one exception is a
//! write the filesystem refused for lack of space (`no_space`): nothing of it was kept, so
//! the same frame is written again later.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use super::format::{begin_frame, finish_frame, Seal, KIND_OPS};
use super::no_space::{is_no_space, Stalled};
use super::{Cmd, Shared, Waiter};
use crate::storage::record::Enc;
use crate::storage::state::State;
use crate::storage::{now_unix_ms, DurableState, FsyncPolicy, Op, StorageError};

/// A batch stops taking submits once their data reaches this (bounds frame size and memory).
const MAX_BATCH_BYTES: u64 = 32 << 20;
/// The writer's encode buffer is shrunk back if a huge batch grew it beyond this.
const MAX_IDLE_BUFFER: usize = 16 << 20;

/// Why a frame did not reach the log.
pub(super) enum Append {
    /// The filesystem is full; nothing of the frame was kept.
    NoSpace(std::io::Error),
    /// Any other error: final.
    Failed(StorageError),
}

/// The writer thread's state: it alone owns the files and the [`State`].
pub(super) struct Writer {
    pub(super) dir: PathBuf,
    pub(super) shared: Arc<Shared>,
    pub(super) rx: mpsc::Receiver<Cmd>,
    pub(super) state: State,
    pub(super) log: File,
    pub(super) log_gen: u64,
    /// Bytes in the current log file (header included).
    pub(super) log_len: u64,
    /// Bytes in all logs since the last snapshot: what compaction would reclaim.
    pub(super) log_bytes: u64,
    /// Written but not yet fdatasynced.
    pub(super) dirty: bool,
    pub(super) last_fsync: Instant,
    pub(super) compactor: Option<JoinHandle<Result<(u64, u64), StorageError>>>,
    pub(super) buf: Vec<u8>,
    pub(super) failed: bool,
    /// The batch the full filesystem did not take (its frame still in `buf`), retried on a
    /// timer; nothing else is written before it.
    pub(super) stalled: Option<Stalled>,
    /// Commands received while stalled, handled in order once the stalled batch is written.
    pub(super) backlog: VecDeque<Cmd>,
    /// After a compaction could not start (no space for the new log), not before this.
    pub(super) next_compaction_try: Option<Instant>,
}

/// A batch being assembled: tickets, ops, the budget bytes they reserved, who waits.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) last_ticket: u64,
    pub(super) ops: Vec<Op>,
    pub(super) growth: u64,
    pub(super) waiters: Vec<Waiter>,
}

impl Writer {
    /// The thread's loop: batches, commits, answers loads, stops on close.
    pub(super) fn run(mut self) {
        let mut pending: Option<Cmd> = None;
        loop {
            let cmd = match pending.take() {
                // A command that ended the batch which stalled waits behind it.
                Some(cmd) if self.stalled.is_some() => {
                    self.backlog.push_back(cmd);
                    continue;
                }
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
                        self.commit(batch);
                    }
                }
                Cmd::Load(reply) => {
                    let result = if self.failed {
                        Err(StorageError::Failed(self.shared.failure_text()))
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

    /// Waits for the next command; under `interval` also wakes to fsync on time, and while
    /// stalled on a full filesystem wakes to write again (`wait_for_space`).
    fn recv_first(&mut self) -> Option<Cmd> {
        loop {
            if self.stalled.is_some() {
                self.wait_for_space();
                continue;
            }
            if let Some(cmd) = self.backlog.pop_front() {
                return Some(cmd);
            }
            if self.shared.opts.fsync != FsyncPolicy::Interval || !self.dirty || self.failed {
                return self.rx.recv().ok();
            }
            let due = self.last_fsync + self.shared.opts.fsync_interval;
            let wait = due.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(cmd) => return Some(cmd),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(error) = self.sync() {
                        self.fail(&error);
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
            // What waited behind a stalled write first, in order; then the channel.
            let next = match self
                .backlog
                .pop_front()
                .map_or_else(|| self.rx.try_recv(), Ok)
            {
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

    /// Writes one frame with the batch, syncs per policy, applies it, reports durability. A
    /// full filesystem stalls the batch instead (retried by `wait_for_space`); any other
    /// error is final.
    fn commit(&mut self, batch: Batch) {
        if batch.ops.is_empty() {
            // A barrier: everything before it is already written; nothing to add.
            self.shared.commits.fetch_add(1, Ordering::Relaxed);
            self.report(batch.last_ticket, batch.waiters);
            return;
        }
        let started = Instant::now();
        self.encode(&batch.ops);
        match self.append() {
            Ok(()) => {
                self.complete(batch);
                if let Some(histogram) = self.shared.commit_seconds.get() {
                    histogram.record(started.elapsed().as_secs_f64());
                }
            }
            Err(Append::NoSpace(error)) => self.stall(batch, &error),
            Err(Append::Failed(error)) => {
                self.fail(&error);
                self.drop_batch(batch);
            }
        }
    }

    /// Encodes the batch as one frame into `buf`.
    fn encode(&mut self, ops: &[Op]) {
        self.buf.clear();
        let start = begin_frame(&mut self.buf);
        {
            let mut enc = Enc(&mut self.buf);
            enc.u8(KIND_OPS);
            enc.u32(ops.len() as u32);
            for op in ops {
                enc.op(op);
            }
        }
        // Sealed for its offset (`format::Seal`): a retry after a full disk writes it at the
        // same offset, the log being cut back to `log_len` first.
        finish_frame(&mut self.buf, start, Seal::log(self.log_gen), self.log_len);
    }

    /// Appends the frame in `buf` to the log. A write the filesystem refused for lack of
    /// space is undone (the log is cut back to its last whole frame, so no torn frame can end
    /// up in the middle of it) and reported as [`Append::NoSpace`]; the frame stays in `buf`.
    pub(super) fn append(&mut self) -> Result<(), Append> {
        match self.log.write_all(&self.buf) {
            Ok(()) => {
                let written = self.buf.len() as u64;
                if self.buf.capacity() > MAX_IDLE_BUFFER {
                    self.buf = Vec::new();
                }
                self.log_len += written;
                self.log_bytes += written;
                self.shared.log_len.store(self.log_len, Ordering::Relaxed);
                self.dirty = true;
                Ok(())
            }
            Err(error) if is_no_space(&error) => match self.log.set_len(self.log_len) {
                Ok(()) => Err(Append::NoSpace(error)),
                Err(cut) => Err(Append::Failed(StorageError::io(
                    format!(
                        "cutting log {} back to {} bytes after a write found no space ({error})",
                        self.log_gen, self.log_len
                    ),
                    cut,
                ))),
            },
            Err(error) => Err(Append::Failed(StorageError::io(
                format!("appending to log {}", self.log_gen),
                error,
            ))),
        }
    }

    /// After the batch's frame is in the log: syncs per policy, applies the ops to the model,
    /// reports the batch durable, considers compaction.
    pub(super) fn complete(&mut self, batch: Batch) {
        let synced = match self.shared.opts.fsync {
            FsyncPolicy::EveryBatch => self.sync(),
            FsyncPolicy::Interval
                if self.last_fsync.elapsed() >= self.shared.opts.fsync_interval =>
            {
                self.sync()
            }
            FsyncPolicy::Interval | FsyncPolicy::Never => Ok(()),
        };
        if let Err(error) = synced {
            self.fail(&error);
            self.drop_batch(batch);
            return;
        }
        let Batch {
            last_ticket,
            ops,
            growth,
            waiters,
        } = batch;
        self.state
            .bound_dedup(self.shared.dedup_cap.load(Ordering::Relaxed));
        for op in ops {
            self.state.apply(op);
        }
        self.state.end_batch();
        self.shared.sub_pending_growth(growth);
        self.shared.commits.fetch_add(1, Ordering::Relaxed);
        self.publish_sizes();
        self.report(last_ticket, waiters);
        if let Some(hook) = self.shared.after_commits.get() {
            (hook.0)();
        }
        self.maybe_compact();
    }

    /// Moves the durable watch to `last_ticket` and completes every waiter.
    fn report(&self, last_ticket: u64, waiters: Vec<Waiter>) {
        self.shared.durable.send_replace(DurableState {
            ticket: last_ticket,
            failed: false,
        });
        for waiter in waiters {
            let _ = waiter.send(Ok(()));
        }
    }

    fn tell_failed(&self, waiters: Vec<Waiter>) {
        let text = self.shared.failure_text();
        for waiter in waiters {
            let _ = waiter.send(Err(StorageError::Failed(text.clone())));
        }
    }

    /// fdatasyncs the log if anything was written since the last sync.
    pub(super) fn sync(&mut self) -> Result<(), StorageError> {
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

    /// Copies the sizes the budget and stats read into [`Shared`].
    pub(super) fn publish_sizes(&self) {
        let s = &self.shared;
        s.live_bytes.store(self.state.live_bytes, Ordering::Relaxed);
        s.log_bytes.store(self.log_bytes, Ordering::Relaxed);
        s.log_len.store(self.log_len, Ordering::Relaxed);
        s.orphan_ops.store(self.state.orphans, Ordering::Relaxed);
    }

    pub(super) fn drop_batch(&mut self, batch: Batch) {
        self.shared.sub_pending_growth(batch.growth);
        self.tell_failed(batch.waiters);
    }

    /// Stops making anything durable: an fsync error cannot be retried safely (the kernel may
    /// have dropped the dirty pages), so waiting publishers must be told instead of acked.
    pub(super) fn fail(&mut self, error: &StorageError) {
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
            super::compaction::collect_compaction(handle);
        }
        if self.failed && result.is_ok() {
            result = Err(StorageError::Failed(self.shared.failure_text()));
        }
        result
    }
}
