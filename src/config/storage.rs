//! `[storage]`: where durable state lives and how hard the broker works to keep it.
//!
//! Read by `storage::open`; the rules here keep the writer's knobs within what it can honour
//! (an fsync interval it can schedule, a queue that holds at least one batch).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{invalid, millis, ConfigError};

/// When the durable store forces its log to stable storage (see `config/postbox.toml` for what
/// each policy can lose).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsyncPolicy {
    /// fdatasync after every group commit, before acknowledging: survives power loss.
    #[default]
    EveryBatch,
    /// Write every commit to the OS at once, fdatasync every `fsync_interval_ms`.
    Interval,
    /// Write every commit to the OS, never fdatasync (the OS flushes when it likes).
    Never,
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsyncPolicy::EveryBatch => "every-batch",
            FsyncPolicy::Interval => "interval",
            FsyncPolicy::Never => "never",
        })
    }
}

/// What the durable store does with new data once `storage.max_disk_bytes` is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFullPolicy {
    /// Refuse the whole submit; the broker refuses the PUBLISH (v5: Quota exceeded).
    #[default]
    Reject,
    /// Store everything but the new data; the broker still delivers it from memory, but it
    /// does not survive a restart.
    KeepInMemory,
}

/// Durable state: where it lives and how hard the broker works to keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Keep durable state on disk (Mosquitto's `persistence`). Off: everything in memory,
    /// lost on restart.
    pub persistence: bool,
    /// Directory for durable state (relative to the working directory, unlike the files a
    /// config names, which are read from its own directory: state goes where the broker runs).
    pub dir: Option<PathBuf>,
    /// When the log is forced to disk.
    pub fsync: FsyncPolicy,
    /// Milliseconds between fdatasyncs with `fsync = "interval"`; 1..=60000.
    pub fsync_interval_ms: u64,
    /// Most ops in one group commit; at least 1.
    pub max_batch_ops: usize,
    /// Microseconds the writer waits for more ops before committing a batch; 0 = commit at
    /// once (ops arriving during an fsync still share the next one). At most 100000.
    pub commit_window_us: u64,
    /// Ops that may wait for the writer before submits are refused (backpressure); at least
    /// `max_batch_ops`.
    pub queue_capacity_ops: usize,
    /// Budget for stored data in bytes; 0 = unlimited. Otherwise at least 1048576.
    pub max_disk_bytes: u64,
    /// What happens to new data when the budget is reached.
    pub disk_full: DiskFullPolicy,
    /// Milliseconds between attempts to write the log again after the filesystem ran out of
    /// space (ENOSPC, EDQUOT); 10..=60000. Until one succeeds, new persistent messages are
    /// refused; then the broker carries on by itself.
    pub write_retry_ms: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            persistence: true,
            dir: Some(PathBuf::from(DEFAULT_DATA_DIR)),
            fsync: FsyncPolicy::EveryBatch,
            fsync_interval_ms: 100,
            max_batch_ops: 4096,
            commit_window_us: 0,
            queue_capacity_ops: 65_536,
            max_disk_bytes: 0,
            disk_full: DiskFullPolicy::Reject,
            write_retry_ms: 1000,
        }
    }
}

/// Where durable state lives unless `storage.dir` says otherwise: next to where the broker
/// runs, like Mosquitto's default `persistence_location`. Packaged deployments set an
/// absolute path (`/var/lib/postbox`).
pub const DEFAULT_DATA_DIR: &str = "postbox-data";

impl StorageConfig {
    /// The directory to keep durable state in, or `None` to keep everything in memory.
    pub fn persistence_dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref().filter(|_| self.persistence)
    }
}

/// Smallest non-zero `storage.max_disk_bytes`: below this not even session metadata fits.
pub const MIN_DISK_BYTES: u64 = 1_048_576;

impl StorageConfig {
    /// The ranges and cross-field rules; errors name the `storage.*` key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(dir) = &self.dir {
            if dir.as_os_str().is_empty() {
                return Err(invalid(
                    "storage.dir",
                    "must not be empty; set storage.persistence = false to keep state in memory"
                        .to_owned(),
                ));
            }
        }
        let st = self;
        millis(
            "storage.fsync_interval_ms",
            st.fsync_interval_ms,
            1..=60_000,
        )?;
        if st.max_batch_ops == 0 {
            return Err(invalid(
                "storage.max_batch_ops",
                "must be at least 1, got 0".to_owned(),
            ));
        }
        if st.commit_window_us > 100_000 {
            return Err(invalid(
                "storage.commit_window_us",
                format!(
                    "must be at most 100000 microseconds, got {}",
                    st.commit_window_us
                ),
            ));
        }
        if st.queue_capacity_ops < st.max_batch_ops {
            return Err(invalid(
                "storage.queue_capacity_ops",
                format!(
                    "must be at least storage.max_batch_ops ({}), got {}",
                    st.max_batch_ops, st.queue_capacity_ops
                ),
            ));
        }
        millis("storage.write_retry_ms", st.write_retry_ms, 10..=60_000)?;
        if st.max_disk_bytes != 0 && st.max_disk_bytes < MIN_DISK_BYTES {
            return Err(invalid(
                "storage.max_disk_bytes",
                format!(
                    "must be 0 (unlimited) or at least {MIN_DISK_BYTES}, got {}",
                    st.max_disk_bytes
                ),
            ));
        }
        Ok(())
    }
}
