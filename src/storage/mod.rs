//! Durable broker state: sessions, queued and in-flight messages, retained messages and
//! delayed wills, so that a QoS 1/2 message acknowledged to its publisher survives `kill -9`.
//!
//! The broker keeps its working state in memory; this module only
//! *records* changes to it as [`Op`]s and hands everything back at restart as a [`Snapshot`].
//! It never reads on the hot path.
//!
//! # Model
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
//! # Durability
//! [`Store::submit`] never blocks: it enqueues the ops for a single writer thread and returns a
//! ticket. The writer batches whatever has arrived (group commit), writes one checksummed
//! frame, and syncs per [`FsyncPolicy`]; then the watch from [`Store::durable`] moves past the
//! ticket. A caller that must not acknowledge before the data is safe awaits
//! `store.wait_durable(ticket)` (see `impl dyn Store`).
//!
//! # Integration
//! `src/storage/INTEGRATION.md` lists where the broker must submit each op, which
//! acknowledgements must await durability, and the restart procedure.
//!
//! # Engines
//! [`open`] picks the in-memory engine when persistence is off (`storage.persistence`) (nothing survives a
//! restart; tickets are durable at once) and the durable log engine ([`durable`]) otherwise.

mod codec;
pub mod durable;
mod memory;
mod state;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;
use tokio::sync::{oneshot, watch};

use crate::codec::{LastWill, ProtocolVersion, PublishProperties, QoS, SubscriptionOptions};
pub use crate::config::{DiskFullPolicy, FsyncPolicy, StorageConfig};
pub use durable::{DurableOptions, DurableStore};
pub use memory::MemoryStore;

/// Identifies a stored message body. Allocated by [`Store::next_message_id`], increasing and
/// never reused, also across restarts, so ids in the log can never be confused.
pub type MessageId = u64;

/// Commit sequence number returned by [`Store::submit`]; durability is reported against it.
pub type Ticket = u64;

/// One logical change to the persisted state. Ops of one `submit` are committed atomically
/// (all or none survive a crash) and applied in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Creates a session or updates its metadata; keeps its subscriptions, queue and inbound
    /// ids. A clean start is `DeleteSession` followed by `PutSession` in one submit.
    PutSession(SessionMeta),
    /// Ends a session: drops its subscriptions, queue entries (and so unreferenced messages)
    /// and inbound QoS 2 ids. A pending will is separate: publish it, then `DeleteWill`.
    DeleteSession {
        /// The session's client id.
        client_id: ByteString,
    },
    /// Adds or replaces one subscription (incremental, so SUBSCRIBE costs O(1) on disk).
    PutSubscription {
        /// The session's client id.
        client_id: ByteString,
        /// The topic filter as subscribed.
        filter: ByteString,
        /// Options and identifier granted.
        subscription: SubscriptionRecord,
    },
    /// Removes one subscription.
    DeleteSubscription {
        /// The session's client id.
        client_id: ByteString,
        /// The topic filter to remove.
        filter: ByteString,
    },
    /// Stores a message body once; queue entries refer to it by `id`.
    PutMessage {
        /// From [`Store::next_message_id`].
        id: MessageId,
        /// The message.
        message: StoredMessage,
    },
    /// Appends a delivery to a session's queue. `seq` orders the queue and must increase
    /// per session (the broker keeps a counter; after restart: last loaded seq + 1).
    Enqueue {
        /// The session's client id.
        client_id: ByteString,
        /// Position in the session's queue.
        seq: u64,
        /// What to deliver.
        entry: QueueEntry,
    },
    /// Moves a queue entry through the outbound QoS handshake (sent, PUBREC received).
    UpdateEntry {
        /// The session's client id.
        client_id: ByteString,
        /// Which entry.
        seq: u64,
        /// Its new stage.
        stage: EntryStage,
    },
    /// Removes a queue entry (acknowledged, dropped or expired).
    RemoveEntry {
        /// The session's client id.
        client_id: ByteString,
        /// Which entry.
        seq: u64,
    },
    /// Records an inbound QoS 2 packet id acknowledged with PUBREC (exactly-once dedup).
    PutInboundQos2 {
        /// The session's client id.
        client_id: ByteString,
        /// The publisher's packet id.
        packet_id: u16,
    },
    /// Forgets an inbound QoS 2 packet id after PUBREL.
    RemoveInboundQos2 {
        /// The session's client id.
        client_id: ByteString,
        /// The publisher's packet id.
        packet_id: u16,
    },
    /// Sets the retained message of a topic.
    PutRetained {
        /// The message's topic.
        topic: ByteString,
        /// The message.
        message: StoredMessage,
    },
    /// Clears the retained message of a topic.
    DeleteRetained {
        /// The topic.
        topic: ByteString,
    },
    /// Records a will waiting for its delay (or for the session to end).
    PutWill {
        /// The session's client id.
        client_id: ByteString,
        /// The will as sent in CONNECT.
        will: LastWill,
        /// When to publish it, unix ms.
        publish_at_unix_ms: u64,
    },
    /// Forgets a pending will (published, or cancelled by a reconnect).
    DeleteWill {
        /// The session's client id.
        client_id: ByteString,
    },
}

impl Op {
    /// True for ops that add data and so are subject to `storage.max_disk_bytes`.
    /// Removals and small metadata updates are always accepted, so space can be freed.
    pub fn grows_store(&self) -> bool {
        matches!(
            self,
            Op::PutMessage { .. }
                | Op::Enqueue { .. }
                | Op::PutRetained { .. }
                | Op::PutWill { .. }
        )
    }

    /// Approximate bytes this op adds to the store; the disk budget is counted in these.
    pub fn size_estimate(&self) -> u64 {
        const OVERHEAD: u64 = 32;
        OVERHEAD
            + match self {
                Op::PutMessage { message, .. } | Op::PutRetained { message, .. } => {
                    message.size_estimate()
                }
                Op::Enqueue {
                    client_id, entry, ..
                } => client_id.len() as u64 + 4 * entry.subscription_ids.len() as u64,
                Op::PutWill {
                    client_id, will, ..
                } => (client_id.len() + will.topic.len() + will.payload.len()) as u64,
                Op::PutSession(meta) => meta.client_id.len() as u64,
                Op::PutSubscription {
                    client_id, filter, ..
                } => (client_id.len() + filter.len()) as u64,
                _ => 0,
            }
    }
}

/// A session's own settings (everything but its subscriptions, queue and inbound ids).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionMeta {
    /// The client id that owns the session.
    pub client_id: ByteString,
    /// Protocol of the last connection (decides the PUBLISH encoding on redelivery).
    pub protocol: ProtocolVersion,
    /// Session Expiry Interval in seconds (`u32::MAX` = never).
    pub expiry_interval: u32,
    /// When the client disconnected, unix ms; `None` while connected. A session restored with
    /// `None` was connected when the broker stopped: count its expiry from the restart.
    pub disconnected_at_unix_ms: Option<u64>,
}

/// A subscription as persisted: what SUBACK granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriptionRecord {
    /// Granted options (QoS, No Local, Retain As Published, Retain Handling).
    pub options: SubscriptionOptions,
    /// MQTT 5 Subscription Identifier, if the SUBSCRIBE carried one.
    pub identifier: Option<u32>,
}

/// A message body as persisted. `payload` is `Bytes`, so putting it costs no copy.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredMessage {
    /// Topic name.
    pub topic: ByteString,
    /// Application payload.
    pub payload: Bytes,
    /// QoS the publisher used.
    pub qos: QoS,
    /// RETAIN flag as published.
    pub retain: bool,
    /// v5 properties to forward. Topic alias and subscription identifiers are not stored
    /// (the broker strips them before routing).
    pub properties: PublishProperties,
    /// When the broker received it, unix ms: the base for the remaining Message Expiry
    /// Interval forwarded on delivery.
    pub received_at_unix_ms: u64,
    /// Absolute expiry, unix ms (received + Message Expiry Interval), so expiry counts
    /// wall-clock time across restarts.
    pub expires_at_unix_ms: Option<u64>,
}

impl StoredMessage {
    /// True once the message may no longer be delivered (MQTT-3.3.2-5).
    pub fn is_expired(&self, now_unix_ms: u64) -> bool {
        self.expires_at_unix_ms.is_some_and(|t| now_unix_ms >= t)
    }

    /// Approximate stored size, for the disk budget.
    pub fn size_estimate(&self) -> u64 {
        let p = &self.properties;
        let props = p.response_topic.as_ref().map_or(0, |s| s.len())
            + p.correlation_data.as_ref().map_or(0, |s| s.len())
            + p.content_type.as_ref().map_or(0, |s| s.len())
            + p.user_properties
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        (self.topic.len() + self.payload.len() + props + 32) as u64
    }
}

/// Where a queue entry stands in its outbound handshake. The packet id is persisted so that a
/// resumed session retransmits with the same id (MQTT-4.4.0-1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryStage {
    /// Not sent yet.
    Queued,
    /// QoS 1 PUBLISH sent, awaiting PUBACK.
    AwaitPubAck {
        /// Packet id used.
        packet_id: u16,
    },
    /// QoS 2 PUBLISH sent, awaiting PUBREC.
    AwaitPubRec {
        /// Packet id used.
        packet_id: u16,
    },
    /// PUBREL sent, awaiting PUBCOMP.
    AwaitPubComp {
        /// Packet id used.
        packet_id: u16,
    },
}

/// One delivery waiting in (or in flight from) a session's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    /// The stored message body.
    pub message: MessageId,
    /// Delivery QoS: `min(publish QoS, granted QoS)`.
    pub qos: QoS,
    /// RETAIN flag as this subscriber sees it.
    pub retain: bool,
    /// Identifiers of the matching subscriptions (MQTT-3.3.4-4).
    pub subscription_ids: SmallVec<[u32; 1]>,
    /// Handshake stage.
    pub stage: EntryStage,
}

/// A session as restored: settings, subscriptions, queue (by `seq`) and inbound QoS 2 ids.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionSnapshot {
    /// Settings; `None` never appears in a loaded snapshot (kept `Option` for `Default`).
    pub meta: Option<SessionMeta>,
    /// Subscriptions, sorted by filter.
    pub subscriptions: Vec<(ByteString, SubscriptionRecord)>,
    /// Queue entries in `seq` order: in-flight stages first as sent, then `Queued` ones.
    pub queue: Vec<(u64, QueueEntry)>,
    /// Inbound QoS 2 packet ids awaiting PUBREL, sorted.
    pub inbound_qos2: Vec<u16>,
}

/// A will waiting to be published.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingWill {
    /// Owner session.
    pub client_id: ByteString,
    /// The will.
    pub will: LastWill,
    /// When to publish it, unix ms (may be in the past after a long outage: publish at once).
    pub publish_at_unix_ms: u64,
}

/// Everything persisted, as handed back by [`Store::load`] at restart.
///
/// Expired `Queued` entries and expired retained messages are left out (they must not be
/// delivered); entries already in flight are kept even if expired, since the handshake has
/// to finish.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Sessions sorted by client id.
    pub sessions: Vec<SessionSnapshot>,
    /// Message bodies referenced by the queues.
    pub messages: std::collections::HashMap<MessageId, StoredMessage>,
    /// Retained messages sorted by topic.
    pub retained: Vec<(ByteString, StoredMessage)>,
    /// Pending wills sorted by client id.
    pub wills: Vec<PendingWill>,
}

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
pub struct Durable(oneshot::Receiver<Result<(), StorageError>>);

impl Durable {
    /// A pair: the future, and the sender the writer completes.
    pub(crate) fn channel() -> (oneshot::Sender<Result<(), StorageError>>, Durable) {
        let (tx, rx) = oneshot::channel();
        (tx, Durable(rx))
    }

    /// Already durable (in-memory engine).
    pub(crate) fn ready() -> Durable {
        let (tx, rx) = Durable::channel();
        let _ = tx.send(Ok(()));
        rx
    }
}

impl std::future::Future for Durable {
    type Output = Result<(), StorageError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(StorageError::Closed)))
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
    /// Snapshots written to compact the log.
    pub compactions: u64,
    /// Submits refused because the writer queue was full.
    pub rejected_queue_full: u64,
    /// Submits refused by the disk budget (`reject` policy).
    pub rejected_disk_full: u64,
    /// Ops dropped by the disk budget (`keep-in-memory` policy).
    pub dropped_disk_full: u64,
    /// Ops naming a session or entry that does not exist (ignored).
    pub orphan_ops: u64,
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
    /// The writer stopped after an I/O error; nothing more becomes durable.
    #[error("storage writer failed: {0}")]
    Failed(String),
    /// The store was closed.
    #[error("storage closed")]
    Closed,
}

impl StorageError {
    pub(crate) fn io(context: impl fmt::Display, source: std::io::Error) -> StorageError {
        StorageError::Io {
            context: context.to_string(),
            source,
        }
    }
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
    fn submit(&self, ops: Vec<Op>) -> Result<Submitted, Rejected>;

    /// Watch of the durable ticket; `wait_durable` is built on it. One receiver per task is
    /// cheap; keep it rather than calling this per message.
    fn durable(&self) -> watch::Receiver<DurableState>;

    /// Everything persisted, reflecting every submit made before this call. Blocks until the
    /// writer has committed those; call it at startup (or from `spawn_blocking`).
    fn load(&self) -> Result<Snapshot, StorageError>;

    /// A fresh message id, never handed out before (also across restarts).
    fn next_message_id(&self) -> MessageId;

    /// True if data survives a restart. When false the broker may skip building ops at all.
    fn is_durable(&self) -> bool;

    /// Counters for metrics and tests.
    fn stats(&self) -> StoreStats;

    /// Commits and syncs everything submitted, then stops the writer. Later submits fail with
    /// [`StorageError::Closed`]. Also done on drop; call it at shutdown to see errors.
    fn close(&self) -> Result<(), StorageError>;
}

impl dyn Store + '_ {
    /// Resolves once `ticket` is durable per the fsync policy; errors if the writer failed or
    /// the store closed first. The PUBACK/PUBREC of a QoS 1/2 PUBLISH awaits this.
    pub async fn wait_durable(&self, ticket: Ticket) -> Result<(), StorageError> {
        wait_durable(&mut self.durable(), ticket).await
    }
}

/// Awaits `ticket` on a receiver obtained from [`Store::durable`] (reuse it across calls).
pub async fn wait_durable(
    rx: &mut watch::Receiver<DurableState>,
    ticket: Ticket,
) -> Result<(), StorageError> {
    let result = rx
        .wait_for(|s| s.ticket >= ticket || s.failed)
        .await
        .map(|state| *state);
    let state = match result {
        Ok(state) => state,
        Err(_) => {
            // Sender gone: the last value is final.
            let last = *rx.borrow();
            if last.ticket >= ticket {
                return Ok(());
            }
            return Err(StorageError::Closed);
        }
    };
    if state.ticket >= ticket {
        Ok(())
    } else {
        Err(StorageError::Failed(
            "writer stopped before this commit became durable".to_owned(),
        ))
    }
}

/// Opens the store `config` asks for: in memory without `dir`, the durable log engine with it.
///
/// A corrupt or unreadable durable store does not fail this call: it is moved aside
/// (`<dir>/store.corrupt-<unix-secs>`), whatever could be verified is kept, and the problem is
/// logged with `tracing::error!`. Only errors that leave no store at all (the directory cannot
/// be created or written) are returned. Does blocking file I/O: call it before serving.
pub fn open(config: &StorageConfig) -> Result<Arc<dyn Store>, StorageError> {
    match config.durable_dir() {
        None => Ok(Arc::new(MemoryStore::new())),
        Some(dir) => Ok(Arc::new(DurableStore::open(
            dir,
            DurableOptions::from_config(config),
        )?)),
    }
}

/// Current wall-clock time in unix milliseconds (0 if the clock is before 1970).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
