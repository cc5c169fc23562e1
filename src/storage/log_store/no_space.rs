//! A full filesystem (ENOSPC, or EDQUOT: the quota is used up) is not the end of the store.
//!
//! The write that found no space was undone by [`Writer::append`] (the log is cut back to its
//! last whole frame), so nothing of that batch is on disk and nobody was told it is durable.
//! The writer keeps the batch, frame and waiters included, and writes the same frame again
//! every `storage.write_retry_ms` until it fits; everything submitted meanwhile waits behind it
//! in order (`Writer::backlog`, still counted against the queue bound). While stalled, the
//! `no_space` flag makes submits that add data fail at once with [`StorageError::NoSpace`],
//! so the broker refuses new persistent messages (MQTT 5: 0x97 Quota exceeded) instead of
//! queueing them behind a disk that may never come back; removals and stage updates queue.
//! Once a write succeeds the batch completes as any other and the flag clears: no restart.
//!
//! Must not retry an fsync: a failed fsync may have dropped the dirty pages, so only a failed
//! `write` is retried, and any other error is final (`Writer::fail`). At close, a stall that a
//! last attempt cannot write is given up: its waiters are told, none is acknowledged.

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;

use super::writer::{Append, Batch, Writer};
use super::Cmd;
use crate::storage::{FsyncPolicy, StorageError};

/// The batch a full filesystem did not take.
pub(super) struct Stalled {
    batch: Batch,
    /// When the first write failed.
    since: Instant,
    /// When to write again.
    next_try: Instant,
    attempts: u64,
}

/// True for the errors that mean "no room left" rather than "broken": the write may succeed
/// later, once something frees space.
pub(super) fn is_no_space(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl Writer {
    /// Keeps `batch` (its frame is in `buf`) to write again later, and makes submits that add
    /// data fail until then.
    pub(super) fn stall(&mut self, batch: Batch, error: &std::io::Error) {
        let retry = self.shared.opts.write_retry;
        *self.shared.no_space_reason.lock() = format!(
            "{error} (writing log {} in {}); retrying every {} ms",
            self.log_gen,
            self.dir.display(),
            retry.as_millis()
        );
        self.shared.no_space.store(true, Ordering::Release);
        tracing::error!(%error, dir = %self.dir.display(), ops = batch.ops.len(),
            retry_ms = retry.as_millis() as u64,
            "store filesystem full: new persistent messages are refused until a write succeeds; \
             this commit is kept and written again");
        let now = Instant::now();
        self.stalled = Some(Stalled {
            batch,
            since: now,
            next_try: now + retry,
            attempts: 1,
        });
    }

    /// One turn of the stalled writer: waits for the retry time (or the `interval` fsync, or a
    /// command, which joins the backlog), then writes again if due. A `Close`, or every sender
    /// gone, gets one last attempt; if that fails too the stall is given up.
    pub(super) fn wait_for_space(&mut self) {
        let Some(stalled) = self.stalled.as_ref() else {
            return;
        };
        let mut due = stalled.next_try;
        let fsync_due = (self.shared.opts.fsync == FsyncPolicy::Interval && self.dirty)
            .then(|| self.last_fsync + self.shared.opts.fsync_interval);
        if let Some(at) = fsync_due {
            due = due.min(at);
        }
        let wait = due.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(wait) {
            Ok(Cmd::Close(reply)) => {
                if !self.write_stalled() {
                    self.give_up();
                }
                // Behind whatever was submitted before it, as always.
                self.backlog.push_back(Cmd::Close(reply));
            }
            Ok(cmd) => self.backlog.push_back(cmd),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if fsync_due.is_some_and(|at| Instant::now() >= at) {
                    // Frames before the stall were reported durable as written to the OS.
                    if let Err(error) = self.sync() {
                        self.fail(&error);
                        self.give_up();
                        return;
                    }
                }
                if self
                    .stalled
                    .as_ref()
                    .is_some_and(|s| Instant::now() >= s.next_try)
                {
                    self.write_stalled();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                if !self.write_stalled() {
                    self.give_up();
                }
            }
        }
    }

    /// Writes the stalled frame again. True when the stall is over (written, or failed for
    /// good); false while the filesystem is still full.
    fn write_stalled(&mut self) -> bool {
        let Some(mut stalled) = self.stalled.take() else {
            return true;
        };
        match self.append() {
            Ok(()) => {
                self.shared.no_space.store(false, Ordering::Release);
                tracing::info!(dir = %self.dir.display(), attempts = stalled.attempts,
                    stalled_ms = stalled.since.elapsed().as_millis() as u64,
                    "store filesystem has room again: writing resumed");
                self.complete(stalled.batch);
                true
            }
            Err(Append::NoSpace(error)) => {
                stalled.attempts += 1;
                stalled.next_try = Instant::now() + self.shared.opts.write_retry;
                tracing::debug!(%error, attempts = stalled.attempts, "store filesystem still full");
                self.stalled = Some(stalled);
                false
            }
            Err(Append::Failed(error)) => {
                self.fail(&error);
                self.drop_batch(stalled.batch);
                true
            }
        }
    }

    /// Gives the stall up (closing with the disk still full, or a failed fsync): its waiters
    /// and everything behind it are told the writer failed; nothing of it is acknowledged.
    fn give_up(&mut self) {
        if !self.failed {
            let reason = self.shared.no_space_reason.lock().clone();
            self.fail(&StorageError::NoSpace(reason));
        }
        if let Some(stalled) = self.stalled.take() {
            self.drop_batch(stalled.batch);
        }
    }
}
