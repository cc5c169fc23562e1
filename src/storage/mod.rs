//! Persisted broker state: sessions, queued and in-flight messages, retained messages and
//! delayed wills, so that a QoS 1/2 message acknowledged to its publisher survives `kill -9`.
//!
//! The broker keeps its working state in memory; this module only *records* changes to it
//! as [`Op`]s and hands everything back at restart as a [`Snapshot`]. It never reads on the
//! hot path. It imports only the codec's types, its config and the metrics registry, never
//! the broker or the connections (the broker converts its types in `broker::persist` and
//! `broker::restore`); the layering test (`src/layering.rs`) checks it.
//! `docs/durability.md` ("Durability protocol") describes the protocol: which ops exist,
//! group commit, when an ack may be sent, snapshots, recovery, corruption, fsync modes and the
//! disk budget.
//!
//! # Model (`model`)
//! * A message body is stored once ([`Op::PutMessage`]) and referenced by any number of
//!   queue entries ([`Op::Enqueue`]). The store counts references: a message disappears with
//!   the last entry that references it, or at the end of the commit that put it if no entry
//!   did, so submit a `PutMessage` together with its `Enqueue`s. Retained messages and wills
//!   embed their own copy (they outlive queues).
//! * Every op names its session by client id; ops for a session that does not exist are
//!   ignored and counted in [`StoreStats::orphan_ops`] (an integration bug, never data loss of
//!   something that was stored).
//! * Times are wall-clock unix milliseconds, so expiry keeps counting while the broker is down.
//!
//! # Durability (`store`)
//! [`Store::submit`] never blocks: it enqueues the ops for a single writer thread and returns a
//! ticket. The writer batches whatever has arrived (group commit), writes one checksummed
//! frame, and syncs per [`FsyncPolicy`]; then the ticket is *durable*: the watch from
//! [`Store::durable`] moves past it and its [`Submitted::durable`] future resolves. A caller
//! that must not acknowledge before the data is safe awaits one of those.
//!
//! # Engines
//! [`open`] picks the in-memory engine ([`MemoryStore`]) when persistence is off
//! (`storage.persistence`): nothing survives a restart, tickets are durable at once. With
//! persistence on it picks the log engine ([`LogStore`], module [`log_store`]).

#[cfg(test)]
mod anonymous_tests;
mod in_order;
pub mod log_store;
mod memory;
mod metrics;
mod model;
mod record;
#[cfg(test)]
mod seq_tests;
mod state;
mod store;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub(crate) use crate::config::DiskFullPolicy;
pub use crate::config::{FsyncPolicy, StorageConfig};
pub(crate) use in_order::InOrder;
pub(crate) use log_store::backlog_bytes;
pub use log_store::{LogOptions, LogStore};
pub(crate) use memory::MemoryStore;
pub(crate) use metrics::StoreMetrics;
pub(crate) use model::{DedupRecord, MessageId, SessionSnapshot, StoredWill, SubscriptionRecord};
pub use model::{EntryStage, Op, QueueEntry, SessionMeta, SessionOwner, Snapshot, StoredMessage};
#[cfg(test)]
pub(crate) use store::{wait_durable, Ticket};
pub(crate) use store::{
    Durable, DurableState, RecoveryLoss, Rejected, StoreHealth, StoreStats, Submitted,
};
pub use store::{StorageError, Store};

/// Opens the store `config` asks for: in memory without `dir`, the log engine with it.
///
/// A damaged on-disk store does not fail this call: every frame that passes its checksums is
/// kept, a copy of the damaged files goes to `<dir>/store.corrupt-<unix-secs>`, and what was
/// lost is logged with `tracing::error!` and counted ([`StoreStats::recovery`]). Does blocking
/// file I/O: call it before serving.
///
/// # Errors
///
/// When the store cannot be read or written (permissions, a read-only file system, a disk
/// error): [`StorageError::Unusable`] names the path and the fix, and the store is left as it
/// was. Such errors are never taken for corruption.
pub fn open(config: &StorageConfig) -> Result<Arc<dyn Store>, StorageError> {
    match config.persistence_dir() {
        None => Ok(Arc::new(MemoryStore::new())),
        Some(dir) => Ok(Arc::new(LogStore::open(
            dir,
            LogOptions::from_config(config),
        )?)),
    }
}

/// Current wall-clock time in unix milliseconds (0 if the clock is before 1970).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
