//! The interface between the broker and an engine: the [`Store`] trait, what a submit
//! returns, how durability is awaited, counters and errors.
//!
//! Here "durable" means one thing only: a commit has been written and synced as the fsync
//! policy demands ([`Durable`], [`DurableState`], [`Store::durable`], [`wait_durable`]).
//! Must not hold engine logic: engines implement the trait (`memory`, `log_store`).
//!
//! Must not: know files, threads or broker types.

use std::fmt;

use tokio::sync::{oneshot, watch};

use super::{MessageId, Op, Snapshot};

/// Commit sequence number returned by [`Store::submit`]; durability is reported against it.
pub(crate) type Ticket = u64;

/// Durability progress, published through [`Store::durable`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurableState {
    /// Every ticket `<=` this is durable per the fsync policy.
    pub ticket: Ticket,
    /// The writer hit an I/O error and stopped; tickets above `ticket` will never be durable.
    pub failed: bool,
}

/// Result of an accepted [`Store::submit`].
#[derive(Debug)]
pub struct Submitted {
    /// Commit sequence number: `wait_durable(ticket)` / the [`Store::durable`] watch.
    pub ticket: Ticket,
    /// Ops left out because the disk budget is exhausted and the policy is
    /// `keep-in-memory` (count them in a metric: those messages do not survive a restart).
    pub dropped_ops: u32,
    /// Resolves when this submit is durable. Wakes only its own waiter (the watch wakes every
    /// waiter on every commit), so a connection task awaits this before its PUBACK. Dropping
    /// it is fine.
    pub durable: Durable,
}

/// Completion of one submit: a future resolving to `Ok(())` once it is durable per the fsync
/// policy, or to the writer's failure.
#[derive(Debug)]
pub struct Durable(Waiting);

/// What a [`Durable`] waits for: one commit, or two (the local store's and the cluster's).
#[derive(Debug)]
enum Waiting {
    One(oneshot::Receiver<Result<(), StorageError>>),
    /// Each half is `None` once it resolved `Ok`; boxed, so the common case stays small.
    Both(Box<[Option<Durable>; 2]>),
}

impl Durable {
    /// A pair: the future, and the sender the writer completes.
    pub(crate) fn channel() -> (oneshot::Sender<Result<(), StorageError>>, Durable) {
        let (tx, rx) = oneshot::channel();
        (tx, Durable(Waiting::One(rx)))
    }

    /// Resolves once both `a` and `b` are durable, or to the first failure: a PUBACK that
    /// needs the local store and the cluster (`[cluster]`) both to hold the message.
    pub fn both(a: Option<Durable>, b: Option<Durable>) -> Option<Durable> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Durable(Waiting::Both(Box::new([Some(a), Some(b)])))),
            (a, b) => a.or(b),
        }
    }

    /// A pair for a commit made outside the store (the cluster's JetStream ack): the future,
    /// and the sender to complete with `Ok` or the reason it failed.
    pub fn pending() -> (oneshot::Sender<Result<(), StorageError>>, Durable) {
        Durable::channel()
    }

    /// Already durable (in-memory engine).
    pub(crate) fn ready() -> Durable {
        let (tx, rx) = Durable::channel();
        let _ = tx.send(Ok(()));
        rx
    }

    /// Never durable: resolves at once to `error`. For a submit the store refused, so that a
    /// write gated on it is never sent as if its ops were stored.
    pub(crate) fn refused(error: StorageError) -> Durable {
        let (tx, rx) = Durable::channel();
        let _ = tx.send(Err(error));
        rx
    }
}

impl std::future::Future for Durable {
    type Output = Result<(), StorageError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.0 {
            Waiting::One(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(StorageError::Closed))),
            Waiting::Both(halves) => {
                for half in halves.iter_mut() {
                    if let Some(durable) = half {
                        match std::pin::Pin::new(durable).poll(cx) {
                            std::task::Poll::Ready(Ok(())) => *half = None,
                            std::task::Poll::Ready(Err(e)) => {
                                return std::task::Poll::Ready(Err(e))
                            }
                            std::task::Poll::Pending => {}
                        }
                    }
                }
                if halves.iter().all(Option::is_none) {
                    std::task::Poll::Ready(Ok(()))
                } else {
                    std::task::Poll::Pending
                }
            }
        }
    }
}

/// Counters for metrics and tests; cheap to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Accepted submits.
    pub submits: u64,
    /// Ops in accepted submits.
    pub ops: u64,
    /// Frames written (one per group commit).
    pub commits: u64,
    /// fsync / fdatasync calls on the log.
    pub fsyncs: u64,
    /// Highest durable ticket.
    pub durable_ticket: Ticket,
    /// Approximate bytes of live data (what `max_disk_bytes` limits).
    pub live_bytes: u64,
    /// Bytes in the log files since the last snapshot.
    pub log_bytes: u64,
    /// Size of the newest snapshot file.
    pub snapshot_bytes: u64,
    /// Bytes of every file in the store directory right now: the current log, the snapshot,
    /// and older logs and snapshots until a finished compaction deletes them.
    pub disk_bytes: u64,
    /// Snapshots written to compact the log.
    pub compactions: u64,
    /// Submits refused because the writer queue was full.
    pub rejected_queue_full: u64,
    /// Submits refused by the disk budget (`reject` policy).
    pub rejected_disk_full: u64,
    /// Ops dropped by the disk budget (`keep-in-memory` policy).
    pub dropped_disk_full: u64,
    /// Submits (and PUBLISHes the broker refused before submitting) that would have added
    /// data while the filesystem was out of space.
    pub rejected_no_space: u64,
    /// True while the writer waits for space to write its log again ([`StoreHealth::NoSpace`]).
    pub no_space: bool,
    /// Ops naming a session or entry that does not exist (ignored).
    pub orphan_ops: u64,
    /// What recovery at open could not keep from damaged files (zero after a clean start).
    pub recovery: RecoveryLoss,
}

/// What recovery at open skipped because it failed its checksums (or was missing): every
/// intact frame is kept, so this is exactly what was lost, as far as it can be known. Read by
/// the `postbox_store_recovery_lost_*` metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryLoss {
    /// Frames (log commits, snapshot chunks) skipped. A damaged stretch whose frame count
    /// cannot be read, and a missing log file, count as one.
    pub frames: u64,
    /// Bytes skipped.
    pub bytes: u64,
    /// Records (ops) in the skipped frames by kind, in [`Op::KIND_NAMES`] order, as far as
    /// the damaged bytes still parse.
    pub records: [u64; Op::KIND_NAMES.len()],
    /// Records known to be lost (from a count that survived) whose kind could not be read.
    pub unknown_records: u64,
    /// True when some skipped bytes did not parse completely (or a file was missing), so the
    /// record counts are a lower bound; false: they are exact.
    pub partial: bool,
}

impl RecoveryLoss {
    /// True if recovery lost nothing.
    pub fn is_empty(&self) -> bool {
        self.frames == 0 && self.bytes == 0
    }

    /// Records lost, all kinds together (those whose kind is unknown included).
    pub fn total_records(&self) -> u64 {
        self.records.iter().sum::<u64>() + self.unknown_records
    }
}

/// Why a storage call failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// File system error (open, write, fsync, rename).
    #[error("storage I/O error {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The store cannot be used at start for a reason that is not corruption (permissions, a
    /// read-only file system, a disk error): the broker must not start, and must not move or
    /// delete the store, so `fix` tells the operator what to do.
    #[error("{context}: {source}. {fix}")]
    Unusable {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
        /// What to do about it (and that the store was left in place).
        fix: String,
    },
    /// Data on disk failed its checksum or could not be decoded.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The writer queue holds `storage.queue_capacity_ops` ops: the disk cannot keep up.
    #[error("storage queue full ({queued} ops waiting)")]
    QueueFull {
        /// Ops waiting when the submit was refused.
        queued: usize,
    },
    /// Accepting the ops would exceed `storage.max_disk_bytes` (policy `reject`).
    #[error("storage disk budget exceeded ({live} + {incoming} > {max} bytes)")]
    DiskBudgetExceeded {
        /// Live bytes (plus bytes still queued) at the time.
        live: u64,
        /// Bytes the refused ops would add.
        incoming: u64,
        /// The configured budget.
        max: u64,
    },
    /// The filesystem holding the store is full (ENOSPC, or the quota is used up: EDQUOT):
    /// the writer keeps what it could not write and retries every `storage.write_retry_ms`;
    /// until a write succeeds, submits that add data are refused with this.
    #[error("storage out of disk space: {0}")]
    NoSpace(String),
    /// Another process holds the lock on the data directory (`<storage.dir>/postbox.lock`):
    /// two brokers writing one store would lose each other's acknowledged messages.
    #[error(
        "data directory {} is in use by another postbox ({holder}); only one broker may use a data directory at a time",
        dir.display()
    )]
    Locked {
        /// The data directory (`storage.dir`).
        dir: std::path::PathBuf,
        /// Who holds it, as the lock file says (`pid N`), or why that is unknown.
        holder: String,
    },
    /// The writer stopped after an I/O error; nothing more becomes durable.
    #[error("storage writer failed: {0}")]
    Failed(String),
    /// The store was closed.
    #[error("storage closed")]
    Closed,
    /// The cluster (`[cluster]`, NATS JetStream) did not confirm it holds the message: it
    /// is unreachable, or its acknowledgement did not come in time.
    #[error("cluster: {0}")]
    Cluster(String),
}

impl StorageError {
    /// An [`StorageError::Io`] saying what was being done.
    pub(crate) fn io(context: impl fmt::Display, source: std::io::Error) -> StorageError {
        StorageError::Io {
            context: context.to_string(),
            source,
        }
    }
}

impl StorageError {
    /// True for refusals that say "too much for now" rather than "broken": a full writer queue,
    /// the disk budget, a full filesystem. MQTT 5 tells a client so with 0x97 Quota exceeded.
    pub fn is_quota(&self) -> bool {
        matches!(
            self,
            StorageError::QueueFull { .. }
                | StorageError::DiskBudgetExceeded { .. }
                | StorageError::NoSpace(_)
                | StorageError::Cluster(_)
        )
    }
}

/// Whether the store can take new data now; read on the publish path (one atomic load).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoreHealth {
    /// Writing.
    #[default]
    Ok,
    /// The filesystem is full: the writer retries periodically; submits that add data are
    /// refused until a write succeeds, everything else waits in the queue.
    NoSpace,
    /// The writer stopped for good after an I/O error other than a full disk.
    Failed,
}

/// A refused submit: the error, and the ops back so the caller can retry or shed them.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected {
    /// Why.
    #[source]
    pub error: StorageError,
    /// The ops, untouched.
    pub ops: Vec<Op>,
}

/// The persistence interface the broker talks to. Object-safe so the engine is chosen at
/// startup (`Arc<dyn Store>`); `Send + Sync` so every connection task can hold it.
pub trait Store: Send + Sync + fmt::Debug {
    /// Queues `ops` for the next group commit and returns its ticket. Never blocks on I/O.
    ///
    /// Refused (ops handed back) when the writer queue is full ([`StorageError::QueueFull`]:
    /// back off until the durable watch moves, or refuse the PUBLISH), over the disk budget
    /// with policy `reject`, or after a writer failure. A submit larger than the whole queue
    /// capacity is still taken when the queue is empty. An empty `ops` gets a ticket too
    /// (a barrier: durable once everything before it is).
    ///
    /// # Errors
    ///
    /// A `Rejected` with the ops handed back, as above: writer queue full, over the disk budget
    /// with policy `reject`, or after a writer failure or close.
    fn submit(&self, ops: Vec<Op>) -> Result<Submitted, Rejected>;

    /// Like [`Store::submit`], for ops an answer to the client waits for: a handshake stage
    /// (PUBREL, a held QoS 2 PUBLISH) or an inbound release (PUBCOMP). Not refused for a full
    /// queue: there are never more of them than messages in flight, and a refused one would
    /// leave its answer nothing to wait for but the connection's end (the client's next
    /// attempt would find the session ahead of the store). They add no data, so a full disk
    /// does not refuse them either; they wait for space like everything else.
    ///
    /// # Errors
    ///
    /// A `Rejected` with the ops handed back after a writer failure or close (or, from an
    /// engine without a separate bound, whatever [`Store::submit`] refuses).
    fn submit_awaited(&self, ops: Vec<Op>) -> Result<Submitted, Rejected> {
        self.submit(ops)
    }

    /// Watch of the durable ticket; `wait_durable` is built on it. One receiver per task is
    /// cheap; keep it rather than calling this per message.
    fn durable(&self) -> watch::Receiver<DurableState>;

    /// Everything persisted, reflecting every submit made before this call. Blocks until the
    /// writer has committed those; call it at startup (or from `spawn_blocking`).
    ///
    /// # Errors
    ///
    /// A `StorageError` when the writer failed or closed before committing them, or when reading
    /// the store fails.
    fn load(&self) -> Result<Snapshot, StorageError>;

    /// A fresh message id, never handed out before (also across restarts).
    fn next_message_id(&self) -> MessageId;

    /// True if data survives a restart. When false the broker may skip building ops at all.
    fn survives_restart(&self) -> bool;

    /// Counters for metrics and tests.
    fn stats(&self) -> StoreStats;

    /// Times every group commit (write and fsync) into `histogram`, on the writer thread;
    /// a store without commits ignores it. The first call wins.
    fn observe_commits(&self, histogram: crate::metrics::Histogram) {
        let _ = histogram;
    }

    /// Calls `hook` on the writer thread after each commit, once its bytes left
    /// [`super::backlog_bytes`]: the broker wakes publishers it paused while the queue was
    /// long. A store without a writer ignores it. The first call wins.
    fn after_commits(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = hook;
    }

    /// Keeps at most about `max_entries` deduplication keys, the newest, as the `[dedup]`
    /// window does (`Broker::new`): a key the window has pushed out decides
    /// nothing after a restart either, so the store's state and snapshots stay as bounded
    /// as the window. A store without state ignores it; unbounded until called.
    fn bound_dedup(&self, max_entries: usize) {
        let _ = max_entries;
    }

    /// Whether new data can be stored now. Cheap (an atomic load): the broker reads it before
    /// routing a QoS 1/2 PUBLISH, to refuse one that needs the store before anyone gets it.
    fn health(&self) -> StoreHealth {
        StoreHealth::Ok
    }

    /// The refusal a submit that adds data would get now, counted as one (so a PUBLISH the
    /// broker refuses without submitting shows in [`StoreStats::rejected_no_space`]); `None`
    /// when such a submit would be taken.
    fn refuse_growth(&self) -> Option<StorageError> {
        None
    }

    /// Commits and syncs everything submitted, then stops the writer. Later submits fail with
    /// [`StorageError::Closed`]. Also done on drop; call it at shutdown to see errors.
    ///
    /// # Errors
    ///
    /// The error of the final commit or sync, or the failure that stopped the writer earlier.
    fn close(&self) -> Result<(), StorageError>;
}

impl dyn Store + '_ {
    /// Resolves once `ticket` is durable per the fsync policy; errors if the writer failed or
    /// the store closed first. The PUBACK/PUBREC of a QoS 1/2 PUBLISH awaits this.
    ///
    /// # Errors
    ///
    /// `StorageError::Failed` when the writer stopped before `ticket` became durable;
    /// `StorageError::Closed` when the store closed first.
    pub async fn wait_durable(&self, ticket: Ticket) -> Result<(), StorageError> {
        wait_durable(&mut self.durable(), ticket).await
    }
}

/// Awaits `ticket` on a receiver obtained from [`Store::durable`] (reuse it across calls).
///
/// # Errors
///
/// `StorageError::Failed` when the writer stopped before `ticket` became durable;
/// `StorageError::Closed` when the store closed first.
pub(crate) async fn wait_durable(
    rx: &mut watch::Receiver<DurableState>,
    ticket: Ticket,
) -> Result<(), StorageError> {
    let result = rx
        .wait_for(|s| s.ticket >= ticket || s.failed)
        .await
        .map(|state| *state);
    let Ok(state) = result else {
        // Sender gone: the last value is final.
        let last = *rx.borrow();
        if last.ticket >= ticket {
            return Ok(());
        }
        return Err(StorageError::Closed);
    };
    if state.ticket >= ticket {
        Ok(())
    } else {
        Err(StorageError::Failed(
            "writer stopped before this commit became durable".to_owned(),
        ))
    }
}
