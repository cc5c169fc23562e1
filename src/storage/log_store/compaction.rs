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

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use super::format::{create_log, HEADER_LEN};
use super::snapshot::{encode_snapshot, write_snapshot};
use super::writer::Writer;
use crate::storage::{now_unix_ms, StorageError};

impl Writer {
    /// Takes the result of a finished (or joined) snapshot thread into the stats.
    pub(super) fn collect_compaction(
        &mut self,
        handle: JoinHandle<Result<(u64, u64), StorageError>>,
    ) {
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
