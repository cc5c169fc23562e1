//! The data model: the [`Op`]s that record a change to the broker's persisted state, the
//! records they carry, and the [`Snapshot`] that hands everything back at restart.
//!
//! Plain data only. Must not know about files, threads or the broker's own types (the
//! broker converts in `broker::persist` / `broker::restore`); the only outside types are
//! MQTT value types from `crate::codec` (QoS, properties, will, subscription options).
//!
//! Must not: know files, threads or broker types.

use std::collections::HashMap;

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;

use crate::codec::{LastWill, ProtocolVersion, PublishProperties, QoS, SubscriptionOptions};

/// Identifies a stored message body. Allocated by [`Store::next_message_id`](super::Store::next_message_id), increasing and
/// never reused, also across restarts, so ids in the log can never be confused.
pub(crate) type MessageId = u64;

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
        /// From [`Store::next_message_id`](super::Store::next_message_id).
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
    /// Records how many times an in-flight entry was sent (`mqtt.max_deliveries`): written
    /// when it is sent again after a reconnect, so a restart does not reset the count. The
    /// first send is implied by the `UpdateEntry` that moved it out of `Queued`.
    CountDelivery {
        /// The session's client id.
        client_id: ByteString,
        /// Which entry.
        seq: u64,
        /// Times sent so far.
        deliveries: u16,
    },
    /// Remembers a deduplication key (`[dedup]`) until `expires_at_unix_ms`, in the submit of
    /// the message that carried it, so a restart inside the window still knows it.
    PutDedup {
        /// The message's topic.
        topic: ByteString,
        /// The value of the configured user property.
        key: ByteString,
        /// When the window closes, unix ms.
        expires_at_unix_ms: u64,
    },
    /// Records the cluster stream sequence (`[cluster]`, `PB_MSGS`) of a stored message body,
    /// so a session the store brings back at a restart still knows where each of its
    /// messages lies in the stream (its replay cursor, the QoS 2 messages its client took:
    /// issue 34). Written only on a clustered node: with the message for one that came from
    /// another node, after JetStream's acknowledgement for one published here. Ignored when
    /// the body is gone already.
    SequenceMessage {
        /// The stored body ([`Op::PutMessage`]).
        id: MessageId,
        /// Its sequence in the cluster's message stream (never 0).
        stream_seq: u64,
    },
}

impl Op {
    /// Name of every kind of op, in [`Op::kind`] order: how a metric label or a log line
    /// names records (`postbox_store_recovery_lost_records_total{kind}`).
    pub const KIND_NAMES: [&'static str; 17] = [
        "put_session",
        "delete_session",
        "put_subscription",
        "delete_subscription",
        "put_message",
        "enqueue",
        "update_entry",
        "remove_entry",
        "put_inbound_qos2",
        "remove_inbound_qos2",
        "put_retained",
        "delete_retained",
        "put_will",
        "delete_will",
        "count_delivery",
        "put_dedup",
        "sequence_message",
    ];

    /// This op's index in [`Op::KIND_NAMES`], so records can be counted by kind.
    pub fn kind(&self) -> usize {
        match self {
            Op::PutSession(_) => 0,
            Op::DeleteSession { .. } => 1,
            Op::PutSubscription { .. } => 2,
            Op::DeleteSubscription { .. } => 3,
            Op::PutMessage { .. } => 4,
            Op::Enqueue { .. } => 5,
            Op::UpdateEntry { .. } => 6,
            Op::RemoveEntry { .. } => 7,
            Op::PutInboundQos2 { .. } => 8,
            Op::RemoveInboundQos2 { .. } => 9,
            Op::PutRetained { .. } => 10,
            Op::DeleteRetained { .. } => 11,
            Op::PutWill { .. } => 12,
            Op::DeleteWill { .. } => 13,
            Op::CountDelivery { .. } => 14,
            Op::PutDedup { .. } => 15,
            Op::SequenceMessage { .. } => 16,
        }
    }

    /// True for ops that add data and so are subject to `storage.max_disk_bytes`.
    /// Removals and small metadata updates are always accepted, so space can be freed.
    pub fn grows_store(&self) -> bool {
        matches!(
            self,
            Op::PutMessage { .. }
                | Op::Enqueue { .. }
                | Op::PutRetained { .. }
                | Op::PutWill { .. }
                | Op::PutDedup { .. }
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
                } => {
                    let group = entry.shared.as_ref().map_or(0, |g| g.len());
                    (client_id.len() + group) as u64 + 4 * entry.subscription_ids.len() as u64
                }
                Op::PutWill {
                    client_id, will, ..
                } => (client_id.len() + will.topic.len() + will.payload.len()) as u64,
                Op::PutSession(meta) => meta.client_id.len() as u64,
                Op::PutDedup { topic, key, .. } => (topic.len() + key.len()) as u64,
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
    /// Whose session it is (issue 35): only that identity may resume it.
    pub owner: SessionOwner,
}

/// Who a session belongs to: the identity that created it, the only one that may resume it
/// or take over its connection (issue 35, finding 2). Plain data, stored with the session so
/// the binding survives a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SessionOwner {
    /// Not bound: no authentication method is configured (nobody can be told apart), or a
    /// session stored before sessions had owners. The next identity to attach binds it.
    #[default]
    Unbound,
    /// A client that authenticated with nothing (anonymous access). Anonymous clients cannot
    /// be told apart, so any of them resumes it; an authenticated client gets a fresh
    /// session in its place, never its queue.
    Anonymous,
    /// The user name a configured method verified (password file, JWT, SCRAM, certificate).
    User(Box<str>),
}

impl SessionOwner {
    /// The user name, if the session is bound to one.
    pub fn user(&self) -> Option<&str> {
        match self {
            SessionOwner::User(user) => Some(user),
            _ => None,
        }
    }
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
    /// Published by an anonymous client: it counts in the anonymous share of the memory
    /// budget again when a restart brings it back (`broker::flow`), as a retained message
    /// (pass 7B, P1: restored uncounted, each restart gave strangers a fresh share; record
    /// tag `PUT_RETAINED_ANONYMOUS`) and as a queued body, charged for its life (fifteenth
    /// pass, B3; tag `PUT_MESSAGE_ANONYMOUS`).
    pub from_anonymous: bool,
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
            + p.correlation_data.as_ref().map_or(0, Bytes::len)
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
    /// Times sent to the client (0 while `Queued`; at least 1 once in flight): what
    /// `mqtt.max_deliveries` counts. Set by `UpdateEntry` (the first send) and
    /// `CountDelivery` (every send after a reconnect).
    pub deliveries: u16,
    /// The key of the shared group (`$share/{group}/{filter}`) a shared subscription's
    /// delivery was made for: after a restart it is still the group's, handed to another
    /// member when its session leaves the group (issue 35, sixteenth adversarial pass, C3).
    pub shared: Option<std::sync::Arc<str>>,
}

impl QueueEntry {
    /// A plain delivery of `message` at `qos`, not sent yet: not retained, no subscription
    /// identifiers, no shared group (what a store's tests and benchmarks enqueue).
    #[must_use]
    pub fn queued(message: MessageId, qos: QoS) -> QueueEntry {
        QueueEntry {
            message,
            qos,
            retain: false,
            subscription_ids: SmallVec::new(),
            stage: EntryStage::Queued,
            deliveries: 0,
            shared: None,
        }
    }
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
pub struct StoredWill {
    /// Owner session.
    pub client_id: ByteString,
    /// The will.
    pub will: LastWill,
    /// When to publish it, unix ms (may be in the past after a long outage: publish at once).
    pub publish_at_unix_ms: u64,
}

/// Everything persisted, as handed back by [`Store::load`](super::Store::load) at restart.
///
/// Expired `Queued` entries and expired retained messages are left out (they must not be
/// delivered); entries already in flight are kept even if expired, since the handshake has
/// to finish.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Sessions sorted by client id.
    pub sessions: Vec<SessionSnapshot>,
    /// Message bodies referenced by the queues.
    pub messages: HashMap<MessageId, StoredMessage>,
    /// Retained messages sorted by topic.
    pub retained: Vec<(ByteString, StoredMessage)>,
    /// Pending wills sorted by client id.
    pub wills: Vec<StoredWill>,
    /// Deduplication keys whose window is still open at load, oldest first.
    pub dedup: Vec<DedupRecord>,
    /// The cluster stream sequences of bodies in `messages` ([`Op::SequenceMessage`]);
    /// empty on a node that never was clustered (and for bodies stored before sequences
    /// were: those stay of unknown sequence).
    pub stream_seqs: HashMap<MessageId, u64>,
}

/// One remembered deduplication key (see [`Op::PutDedup`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupRecord {
    /// The message's topic.
    pub topic: ByteString,
    /// The value of the configured user property.
    pub key: ByteString,
    /// When the window closes, unix ms.
    pub expires_at_unix_ms: u64,
}
