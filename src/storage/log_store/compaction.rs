//! Compaction: when the logs since the last snapshot exceed `max(compact_min_bytes, live
//! bytes)`, the writer (1) syncs the current log, (2) starts log `G+1`, (3) encodes its
//! state, and hands the bytes to a background thread that writes `snapshot-(G+1)` (see
//! [`super::snapshot::write_snapshot`]) and then deletes older logs and snapshots. A crash at
//! any step leaves a recoverable set of files. Should the log reach twice the threshold
//! before that snapshot is done, commits wait for it. Disk use is therefore bounded by the
//! live data plus about three times `max(compact_min_bytes, live data)`.
//!
//! Must not delete anything itself (only a completed snapshot write supersedes files), and
//! must not start a new log before the current one is synced (no earlier log may be torn).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use super::format::{create_log, log_name, HEADER_LEN};
use super::snapshot::{encode_snapshot, write_snapshot};
use super::writer::Writer;
use crate::storage::{now_unix_ms, StorageError};

impl Writer {
    /// Called after each commit: starts a snapshot once the logs outgrow the threshold,
    /// and makes commits wait for a running one past twice the threshold.
    pub(super) fn maybe_compact(&mut self) {
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
            collect_compaction(handle);
        }
        if self.log_bytes <= threshold {
            return;
        }
        if self
            .next_compaction_try
            .is_some_and(|at| Instant::now() < at)
        {
            return;
        }
        // No earlier log may be torn once a later one holds frames. A failed fsync is final
        // (its pages may be gone), here as after a commit.
        if let Err(error) = self.sync() {
            self.fail(&error);
            return;
        }
        match self.start_compaction() {
            Ok(()) => self.next_compaction_try = None,
            Err(error) => {
                // Typically no room for the new log: not once per commit, but on the retry
                // interval. The current log goes on.
                tracing::error!(%error, "cannot start store compaction; trying again later");
                self.next_compaction_try = Some(Instant::now() + self.shared.opts.write_retry);
            }
        }
    }

    fn start_compaction(&mut self) -> Result<(), StorageError> {
        let gen = self.log_gen + 1;
        let log = create_log(&self.dir, gen)?;
        // The old log stays on disk until the snapshot supersedes it.
        self.shared
            .other_file_bytes
            .fetch_add(self.log_len, Ordering::Relaxed);
        self.log = log;
        self.log_gen = gen;
        self.log_len = HEADER_LEN as u64;
        self.log_bytes = HEADER_LEN as u64;
        self.state.purge_expired(now_unix_ms());
        self.publish_sizes();
        let bytes = encode_snapshot(&self.state, gen);
        let dir = self.dir.clone();
        let shared = std::sync::Arc::clone(&self.shared);
        let handle = std::thread::Builder::new()
            .name("postbox-compact".to_owned())
            .spawn(move || {
                let result = write_snapshot(&dir, gen, &bytes).map(|()| (gen, bytes.len() as u64));
                // Whatever happened (old files deleted, a temp file left or not), count what
                // is there: the metric shows the disk, not what should be on it. Before the
                // counter below, so whoever sees the compaction counted sees its sizes.
                shared
                    .other_file_bytes
                    .store(other_file_bytes(&dir, gen), Ordering::Relaxed);
                if let Ok((_, len)) = result {
                    shared.snapshot_bytes.store(len, Ordering::Relaxed);
                    shared.compactions.fetch_add(1, Ordering::Release);
                }
                result
            })
            .map_err(|e| StorageError::io("spawning the compaction thread", e))?;
        self.compactor = Some(handle);
        Ok(())
    }
}

/// Joins a finished (or running) snapshot thread and logs how it ended (the thread itself
/// published its sizes and counted itself, see `start_compaction`).
pub(super) fn collect_compaction(handle: JoinHandle<Result<(u64, u64), StorageError>>) {
    match handle.join() {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            // The logs are still all there, so nothing is lost; the next compaction retries.
            tracing::error!(%error, "store compaction failed; the log keeps growing until one succeeds");
        }
        Err(_) => tracing::error!("store compaction thread panicked"),
    }
}

/// Bytes of the files in the store directory other than log `current` (which the writer
/// counts itself). Only the compaction thread calls it, while the writer creates no file.
fn other_file_bytes(dir: &Path, current: u64) -> u64 {
    let current = log_name(current);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str() != Some(current.as_str()))
        .filter_map(|e| e.metadata().ok())
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
        .sum()
}
