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

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::storage::{Durable, Op, StorageError, Store};

/// Keys (and barriers) waiting for the batch in flight to commit.
#[derive(Debug, Default)]
pub(super) struct DedupSpool {
    state: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    ops: Vec<Op>,
    waiters: Vec<oneshot::Sender<Result<(), StorageError>>>,
    /// A batch was submitted and its commit is awaited; what arrives meanwhile waits here.
    in_flight: bool,
}

type Batch = (Vec<Op>, Vec<oneshot::Sender<Result<(), StorageError>>>);

impl DedupSpool {
    /// Stores `op` (an `Op::PutDedup`); the future resolves once it is durable.
    pub(super) fn submit(self: &Arc<Self>, store: &Arc<dyn Store>, op: Op) -> Durable {
        self.enqueue(store, Some(op))
    }

    /// Resolves once every key submitted so far, and everything submitted to the store
    /// before this call, is durable (a duplicate's PUBACK waits for it: its first copy's key
    /// may still be waiting here).
    pub(super) fn barrier(self: &Arc<Self>, store: &Arc<dyn Store>) -> Durable {
        self.enqueue(store, None)
    }

    fn enqueue(self: &Arc<Self>, store: &Arc<dyn Store>, op: Option<Op>) -> Durable {
        if tokio::runtime::Handle::try_current().is_err() {
            // Outside a runtime (a broker driven by hand) nothing could await the batch:
            // a submit of its own.
            return match store.submit(op.into_iter().collect()) {
                Ok(submitted) => submitted.durable,
                Err(rejected) => Durable::refused(rejected.error),
            };
        }
        let (tx, durable) = Durable::channel();
        let batch = {
            let mut pending = self.state.lock();
            pending.ops.extend(op);
            pending.waiters.push(tx);
            if pending.in_flight {
                return durable;
            }
            pending.in_flight = true;
            take(&mut pending)
        };
        self.commit(store, batch);
        durable
    }

    /// Submits `batch` and, once it is durable, the next one gathered meanwhile; until none
    /// is left (then the next key is submitted at once again).
    fn commit(self: &Arc<Self>, store: &Arc<dyn Store>, mut batch: Batch) {
        loop {
            let (ops, waiters) = batch;
            let submitted = match store.submit(ops) {
                Ok(submitted) => submitted,
                Err(rejected) => {
                    let why = rejected.error.to_string();
                    for waiter in waiters {
                        let _ = waiter.send(Err(StorageError::Failed(why.clone())));
                    }
                    match self.next() {
                        Some(next) => {
                            batch = next;
                            continue;
                        }
                        None => return,
                    }
                }
            };
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                // `enqueue` checked for a runtime; a batch is never left without one.
                finish(waiters, Err(StorageError::Closed));
                drop(submitted);
                return;
            };
            let (spool, store) = (Arc::clone(self), Arc::clone(store));
            runtime.spawn(async move {
                finish(waiters, submitted.durable.await);
                if let Some(next) = spool.next() {
                    spool.commit(&store, next);
                }
            });
            return;
        }
    }

    /// The batch gathered while one was in flight, or `None` (and nothing in flight now).
    fn next(&self) -> Option<Batch> {
        let mut pending = self.state.lock();
        if pending.waiters.is_empty() {
            pending.in_flight = false;
            return None;
        }
        Some(take(&mut pending))
    }
}

fn take(pending: &mut Pending) -> Batch {
    (
        std::mem::take(&mut pending.ops),
        std::mem::take(&mut pending.waiters),
    )
}

fn finish(
    waiters: Vec<oneshot::Sender<Result<(), StorageError>>>,
    result: Result<(), StorageError>,
) {
    match result {
        Ok(()) => {
            for waiter in waiters {
                let _ = waiter.send(Ok(()));
            }
        }
        Err(error) => {
            let why = error.to_string();
            for waiter in waiters {
                let _ = waiter.send(Err(StorageError::Failed(why.clone())));
            }
        }
    }
}
