//! The engine used without `storage.dir`: nothing is written, every ticket is durable at once.
//!
//! It deliberately keeps no copy of the state: the broker's own structures are the only
//! memory there is, and a restart starts empty either way. Callers can check
//! [`Store::survives_restart`] and skip building ops altogether.
//!
//! Must not: keep a copy.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::{
    Durable, DurableState, MessageId, Op, Rejected, Snapshot, StorageError, Store, StoreStats,
    Submitted,
};

/// A store that persists nothing (see the module doc).
#[derive(Debug)]
pub(crate) struct MemoryStore {
    /// Guards ticket allocation and publication together, so the watch never goes backwards.
    ticket: Mutex<u64>,
    durable: watch::Sender<DurableState>,
    next_message_id: AtomicU64,
    submits: AtomicU64,
    ops: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

impl MemoryStore {
    /// An empty store.
    pub(crate) fn new() -> MemoryStore {
        MemoryStore {
            ticket: Mutex::new(0),
            durable: watch::Sender::new(DurableState::default()),
            next_message_id: AtomicU64::new(1),
            submits: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    fn submit(&self, ops: Vec<Op>) -> Result<Submitted, Rejected> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Rejected {
                error: StorageError::Closed,
                ops,
            });
        }
        let mut ticket = self.ticket.lock();
        *ticket += 1;
        let t = *ticket;
        self.durable.send_replace(DurableState {
            ticket: t,
            failed: false,
        });
        drop(ticket);
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
        Ok(Submitted {
            ticket: t,
            dropped_ops: 0,
            durable: Durable::ready(),
        })
    }

    fn durable(&self) -> watch::Receiver<DurableState> {
        self.durable.subscribe()
    }

    fn load(&self) -> Result<Snapshot, StorageError> {
        Ok(Snapshot::default())
    }

    fn next_message_id(&self) -> MessageId {
        self.next_message_id.fetch_add(1, Ordering::Relaxed)
    }

    fn survives_restart(&self) -> bool {
        false
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            submits: self.submits.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            durable_ticket: self.durable.borrow().ticket,
            ..StoreStats::default()
        }
    }

    fn close(&self) -> Result<(), StorageError> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}
