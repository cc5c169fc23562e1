//! Group commit for dedup keys stored without a message of their own (`[dedup]` with no
//! persistent subscriber: nothing else of the PUBLISH goes to the store).
//!
//! Each such key must be durable before its PUBACK (a publisher that re-sends after its
//! acknowledgement, e.g. an application replaying its outbox, is deduplicated even across a
//! `kill -9`). One store submit per key would cost the store a channel send and its writer a
//! wake-up per PUBLISH; instead keys arriving while a batch is being committed wait for the
//! next batch, so a lone publisher's key is submitted at once and a busy broker's keys are
//! submitted in batches as large as one commit's duration allows (as the store's own group
//! commit does for fsyncs).
//!
//! A batch the store refuses (disk budget, full filesystem, full writer queue) tells each of
//! its keys' publishers with the store's own error (so a v5 publisher gets 0x97 and keeps its
//! connection, as for any refused message) and forgets the keys in the window, so the re-send
//! is routed; the barriers in it (duplicates waiting for earlier commits) are submitted
//! again alone, which the store never refuses.
//!
//! Must not: spool a key that came with its message (both go in one submit, durable together or not
//! at all); acknowledge before the batch is durable.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::guarantees::Dedup;
use crate::storage::{Durable, Op, StorageError, Store};

/// Keys (and barriers) waiting for the batch in flight to commit.
#[derive(Debug)]
pub(super) struct DedupSpool {
    state: Mutex<Pending>,
    /// The window whose keys a refused batch forgets (when the guarantees have a dedup window).
    window: Option<Arc<Dedup>>,
}

type Waiter = oneshot::Sender<Result<(), StorageError>>;

#[derive(Debug, Default)]
struct Pending {
    ops: Vec<Op>,
    /// The keys' waiters.
    keys: Vec<Waiter>,
    /// Barriers: waiters with no key of their own.
    barriers: Vec<Waiter>,
    /// A batch was submitted and its commit is awaited; what arrives meanwhile waits here.
    in_flight: bool,
}

/// One submit's worth.
#[derive(Default)]
struct Batch {
    ops: Vec<Op>,
    keys: Vec<Waiter>,
    barriers: Vec<Waiter>,
}

impl DedupSpool {
    /// A spool that forgets refused keys in `window` (none: no dedup window configured).
    pub(super) fn new(window: Option<Arc<Dedup>>) -> DedupSpool {
        DedupSpool {
            state: Mutex::default(),
            window,
        }
    }

    /// Stores `op` (an `Op::PutDedup`); the future resolves once it is durable.
    ///
    /// # Errors
    ///
    /// The store's refusal when the key was submitted at once (nothing in flight) and the
    /// store refused it: the caller refuses the PUBLISH (v5 0x97, the connection kept) and
    /// forgets the key. A key refused later, in a batch, fails its future instead (and is
    /// forgotten here).
    pub(super) fn submit(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        op: Op,
    ) -> Result<Durable, StorageError> {
        self.enqueue(store, Some(op))
    }

    /// Resolves once every key submitted so far, and everything submitted to the store
    /// before this call, is durable (a duplicate's PUBACK waits for it: its first copy's key
    /// may still be waiting here).
    pub(super) fn barrier(self: &Arc<Self>, store: &Arc<dyn Store>) -> Durable {
        self.enqueue(store, None).unwrap_or_else(Durable::refused)
    }

    fn enqueue(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        op: Option<Op>,
    ) -> Result<Durable, StorageError> {
        if tokio::runtime::Handle::try_current().is_err() {
            // Outside a runtime (a broker driven by hand) nothing could await a batch: a
            // submit of its own.
            let ops: Vec<Op> = op.into_iter().collect();
            return match store.submit(ops) {
                Ok(submitted) => Ok(submitted.durable),
                Err(rejected) => Err(rejected.error),
            };
        }
        let (tx, durable) = Durable::channel();
        let batch = {
            let mut pending = self.state.lock();
            match op {
                Some(op) => {
                    pending.ops.push(op);
                    pending.keys.push(tx);
                }
                None => pending.barriers.push(tx),
            }
            if pending.in_flight {
                return Ok(durable);
            }
            pending.in_flight = true;
            take(&mut pending)
        };
        // Nothing was in flight: the batch is this call's own op (or barrier) alone, so a
        // refusal is this caller's to answer.
        let Batch {
            ops,
            keys,
            barriers,
        } = batch;
        match store.submit(ops) {
            Ok(submitted) => {
                let mut waiters = keys;
                waiters.extend(barriers);
                self.await_commit(store, submitted, waiters);
                Ok(durable)
            }
            Err(rejected) => {
                drop((keys, barriers));
                if let Some(next) = self.next() {
                    self.commit(store, next); // what others parked meanwhile
                }
                Err(rejected.error)
            }
        }
    }

    /// Submits `batch` and, once it is durable, the next one gathered meanwhile; until none
    /// is left (then the next key is submitted at once again). Called with `in_flight` set.
    fn commit(self: &Arc<Self>, store: &Arc<dyn Store>, mut batch: Batch) {
        loop {
            let Batch {
                ops,
                keys,
                barriers,
            } = batch;
            let (submitted, waiters) = match store.submit(ops) {
                Ok(submitted) => {
                    let mut waiters = keys;
                    waiters.extend(barriers);
                    (submitted, waiters)
                }
                Err(rejected) => {
                    self.forget(&rejected.ops);
                    finish(keys, Err(same_kind(&rejected.error)));
                    // Barriers carry no data of their own: alone, the store takes them.
                    match store.submit(Vec::new()) {
                        Ok(submitted) => (submitted, barriers),
                        Err(rejected) => {
                            finish(barriers, Err(same_kind(&rejected.error)));
                            match self.next() {
                                Some(next) => {
                                    batch = next;
                                    continue;
                                }
                                None => return,
                            }
                        }
                    }
                }
            };
            self.await_commit(store, submitted, waiters);
            return;
        }
    }

    /// Resolves `waiters` once `submitted` is durable, then commits what gathered meanwhile;
    /// on a task of its own.
    fn await_commit(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        submitted: crate::storage::Submitted,
        waiters: Vec<Waiter>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // `enqueue` checked for a runtime; the spawned task runs on one.
            finish(waiters, Err(StorageError::Closed));
            drop(submitted);
            self.abandon();
            return;
        };
        let guard = InFlight {
            spool: Arc::clone(self),
            armed: true,
        };
        let store = Arc::clone(store);
        runtime.spawn(async move {
            let mut guard = guard;
            finish(waiters, submitted.durable.await);
            guard.armed = false;
            if let Some(next) = guard.spool.next() {
                guard.spool.commit(&store, next);
            }
        });
    }

    /// The batch gathered while one was in flight, or `None` (and nothing in flight now).
    fn next(&self) -> Option<Batch> {
        let mut pending = self.state.lock();
        if pending.keys.is_empty() && pending.barriers.is_empty() {
            pending.in_flight = false;
            return None;
        }
        Some(take(&mut pending))
    }

    /// The batch's task is gone without finishing (its runtime shut down): what waits is told
    /// the store closed, and the next key starts a batch again.
    fn abandon(&self) {
        let Batch { keys, barriers, .. } = {
            let mut pending = self.state.lock();
            pending.in_flight = false;
            take(&mut pending)
        };
        finish(keys, Err(StorageError::Closed));
        finish(barriers, Err(StorageError::Closed));
    }

    /// Forgets the refused keys in the window: nothing was stored for them, so their
    /// publishers' re-sends must be routed.
    fn forget(&self, ops: &[Op]) {
        let Some(window) = &self.window else {
            return;
        };
        for op in ops {
            if let Op::PutDedup { topic, key, .. } = op {
                window.forget(topic, key);
            }
        }
    }
}

/// Clears `in_flight` if the batch's task is dropped before it finished.
struct InFlight {
    spool: Arc<DedupSpool>,
    armed: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.armed {
            self.spool.abandon();
        }
    }
}

fn take(pending: &mut Pending) -> Batch {
    Batch {
        ops: std::mem::take(&mut pending.ops),
        keys: std::mem::take(&mut pending.keys),
        barriers: std::mem::take(&mut pending.barriers),
    }
}

fn finish(waiters: Vec<Waiter>, result: Result<(), StorageError>) {
    match result {
        Ok(()) => {
            for waiter in waiters {
                let _ = waiter.send(Ok(()));
            }
        }
        Err(error) => {
            for waiter in waiters {
                let _ = waiter.send(Err(same_kind(&error)));
            }
        }
    }
}

/// `error` again for another waiter (`StorageError` holds an `io::Error`, so it is not
/// `Clone`): the refusals a publisher is told about keep their kind (`is_quota`: v5 0x97
/// and the connection kept); the rest become `Failed` with the same text.
fn same_kind(error: &StorageError) -> StorageError {
    match error {
        StorageError::QueueFull { queued } => StorageError::QueueFull { queued: *queued },
        StorageError::DiskBudgetExceeded {
            live,
            incoming,
            max,
        } => StorageError::DiskBudgetExceeded {
            live: *live,
            incoming: *incoming,
            max: *max,
        },
        StorageError::NoSpace(why) => StorageError::NoSpace(why.clone()),
        StorageError::Closed => StorageError::Closed,
        other => StorageError::Failed(other.to_string()),
    }
}
