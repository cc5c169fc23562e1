//! The disk budget (`storage.max_disk_bytes`), applied on the submitting thread before ops
//! are queued: refuse the submit (`reject`) or drop its growing ops (`keep-in-memory`).
//!
//! Must not block or touch the files; it only reads the live-byte counters the writer
//! publishes (plus bytes still queued), so it is an estimate, never a filesystem query.

use std::sync::atomic::Ordering;

use super::LogStore;
use crate::storage::{DiskFullPolicy, Op, StorageError};

impl LogStore {
    /// Applies the disk budget: `Ok(dropped ops)` or the error to reject with.
    pub(super) fn check_budget(
        &self,
        ops: &mut Vec<Op>,
        growth: &mut u64,
    ) -> Result<u32, StorageError> {
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
