//! Sessions across nodes: one record per client id in the `pb_sessions` bucket, written by
//! the node that owns the session.
//!
//! - **Claim** (every CONNECT, before it attaches): the record's owner becomes this node by
//!   compare-and-set on the record's revision, so of two nodes racing for one client id one
//!   writes first and the other writes over it; the last writer owns the session and every
//!   other node, watching the bucket, closes its connection (v5 DISCONNECT 0x8E).
//! - **Hand-over**: the node that loses a session it holds writes what the session held
//!   (subscriptions, and the replay cursor: the lowest stream sequence among the messages it
//!   had not had acknowledged) into the new owner's record, and forgets it. The new owner
//!   waits for that (at most [`HANDOVER_WAIT`]: a dead owner cannot answer, and its last
//!   periodic record stands in).
//! - **Restore**: the new owner subscribes the session here and replays the message stream
//!   from the cursor through the session's own filters, so it receives what was queued for it
//!   elsewhere, including what a dead node had acknowledged to publishers.
//! - **Records kept current**: every [`RECORD_INTERVAL`], each persistent local session's
//!   record is rewritten if its subscriptions or cursor moved; a session that ended here has
//!   its record deleted (not one claimed here whose CONNECT has not attached yet: while it
//!   waits for the hand-over, the record is all there is of the session).
//! - **Stale copies**: the record is the authority on who holds a session. A node's store
//!   brings its sessions back at a restart, including those that moved while it was down:
//!   such a copy is dropped (once the claims watch is in place, and whenever the record is
//!   seen naming another node), never handed over nor written into the record; a claim
//!   notes whose record it replaced, and only that node answers it with a hand-over.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv};
use bytes::Bytes;
use bytestring::ByteString;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::{subject, wire, Cluster, STREAM, STREAM_SUBJECTS};
use crate::broker::owner::{self, OwnerCheck};
use crate::broker::{Broker, ClaimRefused, Claimed, HeldSession, Message, Restore, Session};
use crate::codec::{LastWill, QoS, SubscriptionOptions};
use crate::storage::SessionOwner;

/// How long a claim waits for the previous owner's hand-over.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(3);
/// How often the records of local sessions are brought up to date.
pub const RECORD_INTERVAL: Duration = Duration::from_secs(1);
/// Most attempts of a compare-and-set that keeps losing races.
const CAS_ATTEMPTS: usize = 8;
/// Longest a replay may take; longer, the CONNECT is refused (0x88) and the session kept
/// whole in its record for the next attempt.
const REPLAY_LIMIT: Duration = Duration::from_secs(30);

/// One subscription in a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SubRecord {
    /// Topic filter.
    f: String,
    /// Granted QoS.
    q: u8,
    /// No Local.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    nl: bool,
    /// Retain As Published.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    rap: bool,
    /// Retain Handling.
    #[serde(default, skip_serializing_if = "is_zero")]
    rh: u8,
    /// Subscription Identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<u32>,
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// A session's record (JSON in the bucket).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// The owning node.
    pub(super) owner: String,
    /// Seconds the session outlives its connection (0: it ends with it).
    pub(super) expiry: u32,
    /// Its subscriptions.
    #[serde(default)]
    pub(super) subs: Vec<SubRecord>,
    /// Replay from this stream sequence to find every message it has not acknowledged.
    #[serde(default)]
    pub(super) cursor: u64,
    /// Written by the previous owner: it gave the session up, `subs` and `cursor` are final.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) handed: bool,
    /// The owner's incarnation ([`Records::life`]): a record of this node's id from an
    /// earlier run is an orphan like a dead node's.
    #[serde(default)]
    pub(super) life: u64,
    /// The will while it may still be published: an MQTT 5 PUBLISH frame ([`wire`]),
    /// base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) will: Option<String>,
    /// Its Will Delay Interval (seconds), while a connection holds the session.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub(super) wd: u32,
    /// When the will is due (unix ms), once the connection ended with it pending.
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub(super) wat: u64,
    /// When the session's connection ended (unix ms); 0 while one holds it.
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub(super) gone: u64,
    /// Held by a node that took it over from a dead one, with no connection: its will and
    /// expiry run there ([`super::orphans`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) adopted: bool,
    /// Claimed with Clean Start: the previous owner hands nothing over (MQTT-3.1.2-4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) fresh: bool,
    /// QoS 2 deliveries in flight: packet id and stream sequence (0: PUBREL sent, awaiting
    /// PUBCOMP). The next owner sends them again with their packet ids ([`Restore::qos2`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) q2: Vec<(u16, u64)>,
    /// The packet ids among `q2` of shared groups' deliveries ([`Restore::qos2_shared`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) q2s: Vec<u16>,
    /// Written by a claim: the owner of the record it replaced (empty: none, or not a claim).
    /// Only that node may answer with a hand-over ([`hand_over`]): another node's local copy
    /// of the session (one its store brought back after the session moved away while it
    /// was down) is stale, and written over the claim it would replace the live session's
    /// state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) from: String,
    /// The life of that owner ([`Record::life`]).
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub(super) from_life: u64,
    /// Whose session it is (issue 35, [`Who`]): a claim by another identity is refused (or
    /// starts clean, as `auth.session_binding` says). Absent in records of older nodes:
    /// unbound, the next claim binds it.
    #[serde(default, skip_serializing_if = "Who::is_unbound")]
    pub(super) who: Who,
    /// Sequences at or above `cursor` of QoS 2 messages the client has taken already
    /// ([`super::taken`]): the next owner leaves them out. Absent in records of older
    /// nodes: none known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) tk: Vec<u64>,
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero32(v: &u32) -> bool {
    *v == 0
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero64(v: &u64) -> bool {
    *v == 0
}

/// A will as it goes into a record: the message as a frame, base64.
pub(super) fn encode_will(node: &str, will: &LastWill) -> Option<String> {
    use base64::Engine as _;
    let message = Message::from_will(will.clone());
    let frame = wire::encode(node, 0, &message).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(frame))
}

/// The message of a record's will.
pub(super) fn decode_will(will: &str) -> Option<Message> {
    use base64::Engine as _;
    let frame = base64::engine::general_purpose::STANDARD
        .decode(will)
        .ok()?;
    let (_, _, publish) = wire::decode(&frame).ok()?;
    Some(Message::from_publish(publish, None))
}

/// [`SessionOwner`] as a record holds it: absent (unbound), `"anonymous"`, or
/// `{"user": "<name>"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Who {
    /// [`SessionOwner::Unbound`].
    #[default]
    Unbound,
    /// [`SessionOwner::Anonymous`].
    Anonymous,
    /// [`SessionOwner::User`].
    User(String),
}

impl Who {
    fn is_unbound(&self) -> bool {
        *self == Who::Unbound
    }

    fn of(owner: &SessionOwner) -> Who {
        match owner {
            SessionOwner::Unbound => Who::Unbound,
            SessionOwner::Anonymous => Who::Anonymous,
            SessionOwner::User(user) => Who::User(user.to_string()),
        }
    }

    fn owner(&self) -> SessionOwner {
        match self {
            Who::Unbound => SessionOwner::Unbound,
            Who::Anonymous => SessionOwner::Anonymous,
            Who::User(user) => SessionOwner::User(user.as_str().into()),
        }
    }
}

impl Record {
    pub(super) fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub(super) fn decode(value: &[u8]) -> Option<Record> {
        serde_json::from_slice(value).ok()
    }

    /// The record of a session held here: `will` is its connection's (from the claim),
    /// `written` the record last written (when its connection ended stays what it was).
    fn from_view(
        owner: &str,
        life: u64,
        view: &HeldSession,
        cursor: u64,
        will: Option<&(String, u32)>,
        written: Option<&Record>,
    ) -> Record {
        let (will, wd, wat, gone) = if view.connected {
            (
                will.map(|(w, _)| w.clone()),
                will.map_or(0, |(_, d)| *d),
                0,
                0,
            )
        } else {
            let gone = written
                .map(|w| w.gone)
                .filter(|g| *g != 0)
                .unwrap_or_else(crate::storage::now_unix_ms);
            match &view.pending_will {
                Some((pending, at)) => (encode_will(owner, pending), 0, *at, gone),
                None => (None, 0, 0, gone),
            }
        };
        Record {
            life,
            will,
            wd,
            wat,
            gone,
            adopted: false,
            fresh: false,
            owner: owner.to_owned(),
            expiry: view.expiry_interval,
            subs: view
                .subscriptions
                .iter()
                .map(|(filter, options, id)| SubRecord {
                    f: filter.to_string(),
                    q: options.qos as u8,
                    nl: options.no_local,
                    rap: options.retain_as_published,
                    rh: options.retain_handling,
                    id: *id,
                })
                .collect(),
            cursor,
            handed: false,
            q2: view.qos2.clone(),
            q2s: view.qos2_shared.clone(),
            from: String::new(),
            from_life: 0,
            who: Who::of(&view.owner),
            tk: Vec::new(),
        }
    }

    pub(super) fn restore(&self) -> Restore {
        Restore {
            subscriptions: self
                .subs
                .iter()
                .map(|s| {
                    (
                        ByteString::from(s.f.as_str()),
                        SubscriptionOptions {
                            qos: QoS::from_u8(s.q).unwrap_or(QoS::AtMostOnce),
                            no_local: s.nl,
                            retain_as_published: s.rap,
                            retain_handling: s.rh,
                        },
                        s.id,
                    )
                })
                .collect(),
            cursor: self.cursor,
            qos2: self.q2.clone(),
            qos2_shared: self.q2s.clone(),
            taken: {
                let mut taken = self.tk.clone();
                taken.sort_unstable();
                taken.dedup();
                taken
            },
        }
    }
}

/// The records this node owns: the bucket, and per client id the revision and content it
/// last wrote (to write only what changed, by compare-and-set).
#[derive(Debug, Default)]
pub struct Records {
    /// This run's incarnation (unix ms at start), written into every record it owns.
    pub(super) life: u64,
    pub(super) bucket: std::sync::OnceLock<kv::Store>,
    /// The will of each local connection that has one (frame, delay), from its claim.
    wills: parking_lot::Mutex<HashMap<String, (String, u32)>>,
    /// Sessions this node adopted from a dead node ([`super::orphans`]): revision written.
    pub(super) adopted: parking_lot::Mutex<HashMap<String, u64>>,
    owned: parking_lot::Mutex<HashMap<String, (u64, Record)>>,
    /// The latest claim by another node of each client id, seen by the watch (revision and
    /// claim; kept [`CLAIM_MEMORY`]): a claim of ours that attaches after a later one of
    /// another node lost, though the watch found nothing here to give up at the time.
    claimed_elsewhere: parking_lot::Mutex<HashMap<String, (u64, Record, std::time::Instant)>>,
    /// Sessions being rebuilt here from another node's record ([`restore`]), with the cursor
    /// their replay starts from: their records are not rewritten meanwhile (a cursor taken
    /// from what the half-restored session holds would skip what the replay has not reached),
    /// and a hand-over during the replay records no cursor past it.
    restoring: parking_lot::Mutex<HashMap<String, Restoring>>,
    /// Client ids claimed here whose CONNECT has not attached (and restored) its session
    /// yet ([`confirm`] takes them out): no local session, yet not ended. A claim that waits
    /// for the previous owner's hand-over ([`HANDOVER_WAIT`]) or replays the session holds
    /// the only record of it; [`keep_records`] must not take it for a session that ended
    /// here and delete it.
    unattached: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Sessions whose subscriptions or connection changed since their record was written.
    dirty: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Wakes [`keep_records`] for them.
    wake: tokio::sync::Notify,
    /// Writes to clients waiting for their session's record ([`super::barriers`]).
    barriers: super::barriers::Barriers,
    /// QoS 2 messages local sessions' clients took ahead of their cursors ([`super::taken`]).
    pub(super) taken: super::taken::TakenLog,
}

/// A restore under way here ([`restore`]).
#[derive(Debug, Clone)]
pub(super) struct Restoring {
    /// Where its replay starts.
    cursor: u64,
    /// The revision of the session's record this node held when its claim ended: a later
    /// claim (a newer CONNECT) is not undone by this restore failing.
    revision: u64,
    /// The QoS 2 deliveries in flight it brings ([`Restore::qos2`]), for a hand-over while
    /// the replay has not reached them.
    qos2: Vec<(u16, u64)>,
    /// Which of them are shared groups' ([`Restore::qos2_shared`]).
    qos2_shared: Vec<u16>,
    /// What the client had taken above the cursor ([`Restore::taken`]).
    taken: Vec<u64>,
}

/// How long a claim by another node is remembered for [`confirm`].
const CLAIM_MEMORY: Duration = Duration::from_secs(30);

impl Records {
    /// The records of a node that started at `life` (unix ms).
    pub(super) fn new(life: u64) -> Records {
        Records {
            life,
            ..Records::default()
        }
    }

    /// Marks a session's record for a prompt rewrite (a SUBSCRIBE, an UNSUBSCRIBE, a
    /// disconnect): a crash right after must not lose a subscription the client was told of.
    pub(super) fn changed(&self, client_id: &str) {
        if self.owned.lock().contains_key(client_id) {
            self.dirty.lock().insert(client_id.to_owned());
            self.wake.notify_one();
        }
    }

    /// A commit completed once the record of `client_id` holds the session as it is now
    /// ([`super::barriers`]); `None` when this node keeps no record of it.
    pub(super) fn barrier(&self, client_id: &str) -> Option<crate::storage::Durable> {
        if !self.owned.lock().contains_key(client_id) {
            return None;
        }
        let durable = self.barriers.add(client_id);
        self.dirty.lock().insert(client_id.to_owned());
        self.wake.notify_one();
        Some(durable)
    }

    /// Sets the bucket once the link made sure of it.
    pub(super) fn set_bucket(&self, bucket: kv::Store) {
        let _ = self.bucket.set(bucket);
    }
}

/// The cursor a session holding `view` may record now.
fn cursor_of(cluster: &Cluster, view: &HeldSession) -> u64 {
    cursor_at(cluster.node_floor(), view)
}

/// The cursor to record for a session holding `view`: `computed`, unless it holds a message
/// of unknown stream sequence (brought back by this node's store at a restart,
/// [`HeldSession::unsequenced_pending`]): then no further than `written`, the cursor its
/// record had, which still finds that message. Replaying more is at least once; passing it
/// would lose an acknowledged message.
fn kept_cursor(view: &HeldSession, computed: u64, written: Option<u64>) -> u64 {
    match written.filter(|w| *w != 0) {
        Some(written) if view.unsequenced_pending => computed.min(written),
        _ => computed,
    }
}

/// The cursor of a session holding `view` with the node's floor at `floor`.
fn cursor_at(floor: u64, view: &HeldSession) -> u64 {
    view.lowest_pending_seq.map_or(floor, |seq| seq.min(floor))
}

/// Gives up the local session of `client_id` ([`Broker::release_to_cluster_holding`]) and
/// reads the node's floor in the same step against the consumer's routing (the gate): a
/// message the consumer routes after the release never reaches the session, so the cursor
/// handed over must not pass it (read after the gate's release, the floor could). Returns
/// what the session held, the cursor it hands over, and its shared QoS 2 jobs in flight
/// ([`Handed`]).
fn release(
    cluster: &Cluster,
    broker: &Broker,
    client_id: &str,
) -> Option<(HeldSession, u64, Handed)> {
    let _gate = cluster.gate.lock();
    let (view, jobs) = broker.release_to_cluster_holding(client_id)?;
    let cursor = cursor_at(cluster.node_floor(), &view);
    Some((view, cursor, Handed(jobs)))
}

/// A released session's shared QoS 2 jobs in flight, which its hand-over record lists for
/// the next owner to send again: settled with their groups (acknowledged, as the member
/// has them) when this is dropped, once the record is written; given back to their groups
/// if it could not be ([`Handed::not_written`]), so none is lost between the two.
struct Handed(Vec<Arc<Message>>);

impl Handed {
    /// The record listing them was not written: the next owner may not know of them.
    fn not_written(self) {
        for job in &self.0 {
            let _ = job.give_back();
        }
    }
}

/// Claims `client_id` for this node (see the module's doc).
pub(super) async fn claim(
    cluster: &Cluster,
    broker: &Arc<Broker>,
    client_id: &str,
    (clean_start, expiry_interval): (bool, u32),
    will: Option<&LastWill>,
    owner: &SessionOwner,
) -> Result<Claimed, ClaimRefused> {
    let will = will.and_then(|w| {
        let delay = w.properties.will_delay_interval.unwrap_or(0);
        encode_will(&cluster.node, w).map(|frame| (frame, delay))
    });
    let Some(bucket) = cluster.sessions.bucket.get() else {
        return Err(ClaimRefused::Unavailable(
            "NATS has not been reached yet".to_owned(),
        ));
    };
    if !cluster.is_up() {
        return Err(ClaimRefused::Unavailable("NATS is unreachable".to_owned()));
    }
    let key = subject::key(client_id);
    let mut attempts = 0;
    let (previous, revision, mine) = loop {
        attempts += 1;
        let entry = bucket
            .entry(key.as_str())
            .await
            .map_err(|e| ClaimRefused::Unavailable(e.to_string()))?;
        let (previous, last) = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                (Record::decode(&entry.value), Some(entry.revision))
            }
            Some(entry) => (None, Some(entry.revision)),
            None => (None, None),
        };
        // Whose it is (issue 35): another identity never resumes it nor closes its owner's
        // connection; it is refused, or starts clean, as `auth.session_binding` says.
        let verdict = previous.as_ref().map_or(OwnerCheck::Resume, |p| {
            owner::check(&p.who.owner(), p.gone == 0, owner, broker.session_binding())
        });
        if verdict == OwnerCheck::Refuse {
            return Err(ClaimRefused::NotOwner);
        }
        let clean_start = clean_start || verdict == OwnerCheck::Fresh;
        let mut mine = Record {
            owner: cluster.node.clone(),
            life: cluster.sessions.life,
            expiry: expiry_interval,
            will: will.as_ref().map(|(frame, _)| frame.clone()),
            wd: will.as_ref().map_or(0, |(_, delay)| *delay),
            fresh: clean_start,
            who: Who::of(owner),
            ..Record::default()
        };
        if let Some(previous) = &previous {
            // Whose it was: the one node that may hand it over.
            mine.from.clone_from(&previous.owner);
            mine.from_life = previous.life;
        }
        // A new session wants what is published from now on.
        mine.cursor = cluster.node_floor();
        if let Some(previous) = previous.as_ref().filter(|p| !clean_start && p.expiry > 0) {
            // Until the previous owner hands over, its last record stands in.
            mine.subs.clone_from(&previous.subs);
            mine.cursor = previous.cursor;
            mine.q2.clone_from(&previous.q2);
            mine.tk.clone_from(&previous.tk);
        }
        let written = match last {
            Some(last) => bucket
                .update(key.as_str(), mine.encode(), last)
                .await
                .map_err(|e| {
                    (
                        e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                        e.to_string(),
                    )
                }),
            None => bucket
                .create(key.as_str(), mine.encode())
                .await
                .map_err(|e| {
                    (
                        e.kind() == kv::CreateErrorKind::AlreadyExists,
                        e.to_string(),
                    )
                }),
        };
        match written {
            Ok(revision) => break (previous, revision, mine),
            Err((true, _)) if attempts < CAS_ATTEMPTS => {} // lost a race: read again
            Err((_, error)) => return Err(ClaimRefused::Unavailable(error)),
        }
    };
    // Clean Start, or another identity's session started over (`session_binding`).
    let clean_start = mine.fresh;
    if clean_start || previous.as_ref().is_none_or(|p| p.owner != cluster.node) {
        // What a session held here before took is not this session's (or it is in the
        // record now).
        cluster.sessions.taken.forget(client_id);
    }
    cluster
        .sessions
        .owned
        .lock()
        .insert(client_id.to_owned(), (revision, mine.clone()));
    cluster
        .sessions
        .unattached
        .lock()
        .insert(client_id.to_owned());
    cluster.sessions.adopted.lock().remove(client_id);
    {
        let mut wills = cluster.sessions.wills.lock();
        match will {
            Some(will) => wills.insert(client_id.to_owned(), will),
            None => wills.remove(client_id),
        };
    }
    let Some(previous) = previous else {
        // No record: the session ended cluster-wide (expired, or cleaned elsewhere), so a
        // copy this node kept from an earlier run is stale.
        drop(broker.release_to_cluster(client_id));
        return Ok(Claimed {
            restore: None,
            revision,
        });
    };
    if previous.owner == cluster.node {
        // Ours already: the local session (if any) is the session.
        let restore = (!clean_start && previous.expiry > 0 && !broker.has_session(client_id))
            .then(|| previous.restore());
        return Ok(claimed(cluster, client_id, restore, revision));
    }
    // Another node's: whatever this node still holds of it is stale.
    if broker.release_to_cluster(client_id).is_some() {
        tracing::debug!(
            client = client_id,
            "cluster: dropped a stale local copy of a session another node owned"
        );
    }
    if clean_start || previous.expiry == 0 {
        return Ok(Claimed {
            restore: None,
            revision,
        });
    }
    // A dead node cannot hand over, nor can one that only adopted it from a dead node: the
    // last record stands in at once.
    let handed = if !previous.adopted && cluster.liveness.may_be_alive(&previous.owner) {
        wait_for_handover(bucket, &key, revision).await
    } else {
        None
    };
    let record = match handed {
        Some((revision, record)) => {
            cluster
                .sessions
                .owned
                .lock()
                .insert(client_id.to_owned(), (revision, record.clone()));
            record
        }
        None => {
            tracing::info!(client = client_id, previous = %previous.owner, "cluster: no hand-over from the session's previous node; resuming from its last record");
            mine
        }
    };
    Ok(claimed(
        cluster,
        client_id,
        Some(record.restore()),
        revision,
    ))
}

/// A claim's answer; a session to restore is marked as being restored until [`restore`]
/// ends (the caller always calls it when there is one).
fn claimed(cluster: &Cluster, client_id: &str, restore: Option<Restore>, revision: u64) -> Claimed {
    if let Some(restore) = &restore {
        let held = cluster
            .sessions
            .owned
            .lock()
            .get(client_id)
            .map_or(revision, |(r, _)| *r);
        cluster.sessions.restoring.lock().insert(
            client_id.to_owned(),
            Restoring {
                cursor: restore.cursor,
                revision: held,
                qos2: restore.qos2.clone(),
                qos2_shared: restore.qos2_shared.clone(),
                taken: restore.taken.clone(),
            },
        );
    }
    Claimed { restore, revision }
}

/// Polls the record until the previous owner has written its hand-over over our claim
/// (bounded by [`HANDOVER_WAIT`]).
async fn wait_for_handover(bucket: &kv::Store, key: &str, claimed: u64) -> Option<(u64, Record)> {
    let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(entry)) = bucket.entry(key).await {
            if entry.revision > claimed && entry.operation == kv::Operation::Put {
                match Record::decode(&entry.value) {
                    Some(record) if record.handed => return Some((entry.revision, record)),
                    _ => return None, // someone else claimed it since
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Rebuilds a session that lived elsewhere: subscriptions, then the replay. All or nothing:
/// false when the replay failed or took longer than [`REPLAY_LIMIT`] (or this future was
/// dropped, its CONNECT gone): the half-restored session is discarded here and its record
/// keeps the cursor it had, so the next claim, here or on another node, replays it whole.
pub(super) async fn restore(
    cluster: &Cluster,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    generation: u64,
    restore: Restore,
) -> bool {
    let mut unrestored = Unrestored {
        cluster,
        broker,
        session,
        generation,
        ahead: Vec::new(),
        taken_ahead: Vec::new(),
        done: false,
    };
    let replays = !restore.subscriptions.is_empty() && restore.cursor > 0;
    let (floor, local_floor, sent) = {
        // Subscribed and the floors read as one step against the consumer's routing (the
        // gate) and this node's own publishers (the fence: each of their messages was
        // routed before, below `local_floor`, or will be after).
        let _gate = cluster.gate.lock();
        let _fence = cluster.fence.write();
        for (filter, options, id) in &restore.subscriptions {
            broker.subscribe(session, filter, *options, *id);
        }
        // PUBRELs to send again (MQTT-4.4.0-1): the client has those messages.
        for &(packet_id, _) in restore.qos2.iter().filter(|(_, seq)| *seq == 0) {
            drop(broker.restore_cluster_inflight(session, packet_id, None));
        }
        // Answered when this node's messages routed before are all in the stream.
        let sent = replays.then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = cluster.outbound.send(super::outbound::Queued::Barrier(tx));
            rx
        });
        // Other nodes' messages below it were routed here before the subscriptions (this
        // node's own are told apart by their local id: the consumer skips them).
        let floor = cluster.consumer_floor.load(Ordering::Acquire);
        // Plain QoS 2 deliveries in flight: sent again below under their packet ids (by
        // the replay, or fetched), so the consumer's routing must leave this session out of
        // them: when it has not reached one yet, and when it brings one again (a redelivery
        // after a refusal here, a lost acknowledgement, a restart).
        if !restore.subscriptions.is_empty() {
            for &(packet_id, seq) in &restore.qos2 {
                if seq != 0 && !restore.qos2_shared.contains(&packet_id) {
                    cluster.resent_ahead.note(seq, session.id);
                    unrestored.ahead.push((packet_id, seq));
                }
            }
            // Messages the client took already: the replay skips those below the floor,
            // and the consumer must leave the session out of those it has not routed yet.
            for &seq in restore.taken.iter().filter(|&&seq| seq >= floor) {
                cluster.resent_ahead.note(seq, session.id);
                unrestored.taken_ahead.push(seq);
            }
        }
        (floor, cluster.next_local_id.load(Ordering::Acquire), sent)
    };
    if !replays {
        // Nothing to replay (no subscription left, or no cursor), but a QoS 2 delivery in
        // flight is sent again all the same (MQTT-4.4.0-1).
        if restore.qos2.iter().any(|q| q.1 != 0) {
            let Some(js) = cluster.js.get() else {
                tracing::warn!(client = %session.client_id, "cluster: a resumed session's QoS 2 messages in flight cannot be fetched before NATS is reached; refusing its CONNECT");
                return false;
            };
            let resent = tokio::time::timeout(
                REPLAY_LIMIT,
                resend_unmet(cluster, js, broker, session, &restore),
            )
            .await;
            if !matches!(resent, Ok(Ok(()))) {
                tracing::warn!(client = %session.client_id, "cluster: a resumed session's QoS 2 messages in flight could not be fetched; refusing its CONNECT (the session's record is kept for the next attempt)");
                return false;
            }
        }
        release_unmatched(broker, session, &restore);
        cluster
            .sessions
            .taken
            .seed(&session.client_id, &restore.taken);
        unrestored.done = true;
        return true;
    }
    let Some(js) = cluster.js.get() else {
        tracing::warn!(client = %session.client_id, "cluster: a resumed session cannot be replayed before NATS is reached; refusing its CONNECT");
        return false;
    };
    match tokio::time::timeout(REPLAY_LIMIT, async {
        if let Some(sent) = sent {
            sent.await
                .map_err(|_| "the queue to NATS is gone (shutting down)")?;
        }
        let replayed = replay(cluster, js, broker, session, &restore, floor, local_floor).await?;
        resend_unmet(cluster, js, broker, session, &restore).await?;
        Ok::<_, async_nats::Error>(replayed)
    })
    .await
    {
        Ok(Ok(n)) => {
            tracing::info!(client = %session.client_id, from = restore.cursor, messages = n, "cluster: session resumed from another node");
            release_unmatched(broker, session, &restore);
            cluster
                .sessions
                .taken
                .seed(&session.client_id, &restore.taken);
            unrestored.done = true;
            true
        }
        Ok(Err(error)) => {
            tracing::warn!(client = %session.client_id, %error, "cluster: the replay of a resumed session failed; refusing its CONNECT (the session's record is kept for the next attempt)");
            false
        }
        Err(_) => {
            tracing::warn!(client = %session.client_id, limit = ?REPLAY_LIMIT, "cluster: the replay of a resumed session took too long; refusing its CONNECT (the session's record is kept for the next attempt)");
            false
        }
    }
}

/// QoS 2 deliveries awaiting PUBREC that the replay did not meet, sent again with their
/// packet ids (MQTT-4.4.0-1), fetched from the stream by their sequence:
///
/// - a shared group's (the replay skips them: they reach the group through its consumer):
///   so a shared group's QoS 2 job in flight to a member that moved reaches it again, on its
///   new node, and no other member (MQTT-4.8.2-4/5): the old node settled it with the group
///   when it handed the session over;
/// - another node's that this node's consumer had not routed when the session subscribed
///   (beyond the replay): the consumer leaves the session out when it gets there
///   ([`super::ahead`]), so it is not taken a second time under a new packet id.
///
/// One no longer in the stream (older than `retention`) is released below
/// ([`release_unmatched`]).
async fn resend_unmet(
    cluster: &Cluster,
    js: &jetstream::Context,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
) -> Result<(), async_nats::Error> {
    let unmet: Vec<(u16, u64)> = restore
        .qos2
        .iter()
        .copied()
        .filter(|&(packet_id, seq)| seq != 0 && !broker.has_inflight(session, packet_id, seq))
        .collect();
    if unmet.is_empty() {
        return Ok(());
    }
    let stream = js.get_stream(STREAM).await?;
    for (packet_id, seq) in unmet {
        let raw = match stream.get_raw_message(seq).await {
            Ok(raw) => raw,
            Err(error)
                if error.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound =>
            {
                tracing::warn!(client = %session.client_id, packet_id, seq, "cluster: a QoS 2 message in flight to a resumed session is no longer in the stream; its packet id is released");
                cluster.resent_ahead.forget(seq, session.id);
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let Ok((_, _, mut publish)) = wire::decode(&raw.payload) else {
            continue;
        };
        let retained = publish.retain;
        publish.retain = false;
        let message = Arc::new(Message::from_publish(publish, None));
        message.set_cluster_seq(seq);
        let delivery = resent_delivery(
            restore,
            message,
            retained,
            restore.qos2_shared.contains(&packet_id),
        );
        if let Some(delivery) = broker.restore_cluster_inflight(session, packet_id, Some(delivery))
        {
            // Its packet id taken here meanwhile (a newer connection of the client took the
            // session during the fetch and sent something under it; a delivery the replay
            // queued cannot hold it: those get ids only when sent): queued as a new delivery
            // rather than lost (the client may take it twice).
            tracing::debug!(client = %session.client_id, packet_id, seq, "cluster: a QoS 2 message in flight to a resumed session found its packet id taken; queued again");
            if let Err(error) = broker.enqueue_for(
                session,
                delivery.message,
                QoS::ExactlyOnce,
                delivery.retain,
                delivery.subscription_ids,
            ) {
                tracing::warn!(client = %session.client_id, %error, "cluster: a QoS 2 message in flight to a resumed session was refused here");
            }
        }
    }
    Ok(())
}

/// A QoS 2 delivery in flight sent again as the subscription that sent it: a shared
/// group's (`shared`) under the session's first shared filter matching it (a session in two
/// groups matching one topic cannot tell which one sent it; either is right for the
/// client), a plain one with the session's plain filters matching it (their identifiers,
/// MQTT-3.3.4-3). No such filter (the subscription went since): sent again all the same.
fn resent_delivery(
    restore: &Restore,
    message: Arc<Message>,
    retained: bool,
    shared: bool,
) -> crate::broker::Delivery {
    let mut retain = false;
    let mut subscription_ids: SmallVec<[u32; 1]> = SmallVec::new();
    let mut group = None;
    for (filter, options, id) in &restore.subscriptions {
        let inner = match crate::codec::topic::split_shared(filter) {
            Some(Ok((_, inner))) if shared => inner,
            None if !shared => filter,
            _ => continue,
        };
        if crate::broker::admin::filter_matches(inner, &message.topic) {
            retain |= options.retain_as_published && retained;
            subscription_ids.extend(*id);
            if shared {
                group = Some(Arc::from(&**filter));
                break;
            }
        }
    }
    crate::broker::Delivery {
        qos: QoS::ExactlyOnce,
        retain,
        subscription_ids,
        seq: None,
        shared: group,
        message,
    }
}

/// QoS 2 deliveries the session had in flight that were not sent again (no longer in the
/// stream): their packet ids stay taken until a PUBREL sent again completes them, since the
/// client may hold them (MQTT-4.3.3-9).
fn release_unmatched(broker: &Broker, session: &Arc<Session>, restore: &Restore) {
    for &(packet_id, _) in &restore.qos2 {
        drop(broker.restore_cluster_inflight(session, packet_id, None));
    }
}

/// A restore in progress. Dropped before it is `done` (failed, or its future dropped), it
/// undoes it: the local session is discarded, and the record this node claimed is given
/// back as the claim wrote it (less the refused CONNECT's will, its connection gone now) and
/// no longer kept current from here. Unless a newer CONNECT of the client has the session
/// by then: it is that connection's, and so is the record.
struct Unrestored<'a> {
    cluster: &'a Cluster,
    broker: &'a Arc<Broker>,
    session: &'a Arc<Session>,
    /// The restoring connection's generation.
    generation: u64,
    /// QoS 2 deliveries (packet id, sequence) noted in [`Cluster::resent_ahead`] for this
    /// session.
    ahead: Vec<(u16, u64)>,
    /// Sequences the client had taken ([`Restore::taken`]) noted there for it.
    taken_ahead: Vec<u64>,
    done: bool,
}

impl Drop for Unrestored<'_> {
    fn drop(&mut self) {
        let client_id = &*self.session.client_id;
        let records = &self.cluster.sessions;
        let mine = records.restoring.lock().remove(client_id);
        if self.done {
            return;
        }
        let held_elsewhere = !self.broker.is_held_by(self.session, self.generation);
        for &(packet_id, seq) in &self.ahead {
            // Kept while the session lives on with that message in flight (a newer
            // connection took it): the consumer must still leave it out.
            if !held_elsewhere || !self.broker.has_inflight(self.session, packet_id, seq) {
                self.cluster.resent_ahead.forget(seq, self.session.id);
            }
        }
        if !held_elsewhere {
            // Kept for a newer connection that has the session: the client has them.
            for &seq in &self.taken_ahead {
                self.cluster.resent_ahead.forget(seq, self.session.id);
            }
        }
        if held_elsewhere {
            tracing::warn!(client = %client_id, "cluster: a resumed session's replay failed after a newer connection took it; that connection keeps what was replayed");
            return;
        }
        let claimed = {
            let mut owned = records.owned.lock();
            let ours = matches!((owned.get(client_id), &mine), (Some((r, _)), Some(m)) if *r == m.revision);
            if ours {
                owned.remove(client_id)
            } else {
                None
            }
        };
        if claimed.is_some() {
            records.wills.lock().remove(client_id);
            records.unattached.lock().remove(client_id);
        }
        self.broker.discard_unrestored(self.session);
        let (Some((revision, mut record)), Some(bucket)) = (claimed, records.bucket.get()) else {
            return;
        };
        record.will = None;
        record.wd = 0;
        if record.gone == 0 {
            record.gone = crate::storage::now_unix_ms();
        }
        let bucket = bucket.clone();
        let key = subject::key(client_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = bucket.update(key.as_str(), record.encode(), revision).await;
            });
        }
    }
}

async fn replay(
    cluster: &Cluster,
    js: &jetstream::Context,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
    floor: u64,
    local_floor: u64,
) -> Result<usize, async_nats::Error> {
    let mut stream = js.get_stream(STREAM).await?;
    let last = stream.info().await?.state.last_sequence;
    if restore.cursor > last {
        return Ok(0);
    }
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{STREAM_SUBJECTS}.>"),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: restore.cursor,
            },
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut replayed = 0;
    while let Some(message) = messages.next().await {
        let message = message?;
        let seq = message.info().map_or(0, |info| info.stream_sequence);
        if let Ok((origin, local_id, mut publish)) = wire::decode(&message.payload) {
            let own = origin == cluster.node;
            let taken = restore.taken.binary_search(&seq).is_ok();
            if !taken && ((!own && seq < floor) || (own && local_id < local_floor)) {
                let retained = publish.retain;
                publish.retain = false; // the retained index is not this replay's business
                let routed = Arc::new(Message::from_publish(publish, None));
                routed.set_cluster_seq(seq);
                if enqueue_matching(broker, session, restore, routed, retained) {
                    replayed += 1;
                }
            }
        }
        if seq >= last {
            break;
        }
    }
    Ok(replayed)
}

/// Queues a replayed message to the session if one of its (non-shared) filters matches:
/// the highest granted QoS among them, every identifier (MQTT-3.3.4-3/4).
fn enqueue_matching(
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
    message: Arc<Message>,
    retained: bool,
) -> bool {
    let mut qos: Option<QoS> = None;
    let mut retain = false;
    let mut ids: SmallVec<[u32; 1]> = SmallVec::new();
    for (filter, options, id) in &restore.subscriptions {
        if crate::codec::topic::split_shared(filter).is_some()
            || !crate::broker::admin::filter_matches(filter, &message.topic)
        {
            continue;
        }
        qos = Some(qos.map_or(options.qos, |q| q.max(options.qos)));
        retain |= options.retain_as_published && retained;
        ids.extend(*id);
    }
    let Some(granted) = qos else {
        return false;
    };
    let qos = message.qos.min(granted);
    if qos == QoS::AtMostOnce {
        return false;
    }
    if qos == QoS::ExactlyOnce {
        let seq = message.cluster_seq();
        if let Some(&(packet_id, _)) = restore.qos2.iter().find(|(packet_id, s)| {
            *s != 0 && Some(*s) == seq && !restore.qos2_shared.contains(packet_id)
        }) {
            // Sent before with this packet id and not yet received: sent again with it
            // (DUP), so the client takes it once (MQTT-4.3.3).
            let delivery = crate::broker::Delivery {
                message,
                qos,
                retain,
                subscription_ids: ids,
                seq: None,
                shared: None,
            };
            match broker.restore_cluster_inflight(session, packet_id, Some(delivery)) {
                None => return true,
                // Its packet id is taken here already: sent as a new delivery instead.
                Some(delivery) => {
                    return broker
                        .enqueue_for(
                            session,
                            delivery.message,
                            qos,
                            delivery.retain,
                            delivery.subscription_ids,
                        )
                        .is_ok();
                }
            }
        }
    }
    match broker.enqueue_for(session, message, qos, retain, ids) {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(client = %session.client_id, %error, "cluster: a replayed message was refused");
            false
        }
    }
}

/// Gives up this node's local copy of `client_id`, which `owner` holds: kept from an earlier
/// run of this node, it is not the session any more (no will, no hand-over, no trace in the
/// store).
fn drop_stale_copy(broker: &Broker, client_id: &str, owner: &str) {
    if broker.release_to_cluster(client_id).is_some() {
        tracing::info!(
            client = client_id,
            owner,
            "cluster: dropped a stale local copy of a session that moved to another node"
        );
    }
}

/// Drops the local copies of sessions that moved to another node while this node was down:
/// every local session this node has not claimed, adopted or restored in this run (those
/// its store brought back) whose record names another owner. Run once the watch of claims
/// is in place (so a claim after the read is handed over, not missed): a stale copy must
/// not collect messages, nor be taken for the session by anything that looks at this node.
/// A record naming this node's earlier run leaves the copy to the claims and the search for
/// orphans ([`super::orphans`]); no record leaves it to the next CONNECT's claim.
async fn drop_moved_copies(cluster: Arc<Cluster>, broker: Weak<Broker>, bucket: kv::Store) {
    let candidates: Vec<String> = {
        let Some(broker) = broker.upgrade() else {
            return;
        };
        let views = broker.held_sessions();
        let owned = cluster.sessions.owned.lock();
        let adopted = cluster.sessions.adopted.lock();
        let restoring = cluster.sessions.restoring.lock();
        views
            .iter()
            .filter(|v| v.expiry_interval > 0)
            .map(|v| v.client_id.to_string())
            .filter(|id| {
                !owned.contains_key(id) && !adopted.contains_key(id) && !restoring.contains_key(id)
            })
            .collect()
    };
    for client_id in candidates {
        let key = subject::key(&client_id);
        let Ok(Some(entry)) = bucket.entry(key.as_str()).await else {
            continue;
        };
        if entry.operation != kv::Operation::Put {
            continue;
        }
        let Some(record) = Record::decode(&entry.value) else {
            continue;
        };
        if record.owner == cluster.node {
            continue;
        }
        let Some(broker) = broker.upgrade() else {
            return;
        };
        // Claimed here since the list was made: this node's now.
        if cluster.sessions.owned.lock().contains_key(&client_id) {
            continue;
        }
        drop_stale_copy(&broker, &client_id, &record.owner);
    }
}

/// Watches the bucket for claims of sessions this node holds, and hands them over.
pub(super) async fn watch_claims(cluster: Arc<Cluster>, broker: Weak<Broker>) {
    loop {
        let Some(bucket) = cluster.sessions.bucket.get() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut watch = match bucket.watch_all().await {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot watch the session records; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tokio::spawn(drop_moved_copies(
            Arc::clone(&cluster),
            broker.clone(),
            bucket.clone(),
        ));
        while let Some(entry) = watch.next().await {
            let Ok(entry) = entry else {
                break;
            };
            if entry.operation != kv::Operation::Put {
                continue;
            }
            let Some(record) = Record::decode(&entry.value) else {
                continue;
            };
            if record.owner == cluster.node || record.handed {
                continue;
            }
            let Some(broker) = broker.upgrade() else {
                return;
            };
            hand_over(&cluster, bucket, &broker, &entry, record).await;
        }
        if broker.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// After a CONNECT claimed and attached its session: if another node claimed the client id
/// after this node did (seen by the watch meanwhile), this node lost the race: the session is
/// given up here at once (its connection gets DISCONNECT 0x8E) and handed over.
pub(super) fn confirm(cluster: &Cluster, broker: &Arc<Broker>, client_id: &str, mine: u64) {
    // Attached: from now on, no local session means it ended here.
    cluster.sessions.unattached.lock().remove(client_id);
    let later = {
        let claimed = cluster.sessions.claimed_elsewhere.lock();
        claimed
            .get(client_id)
            .filter(|(revision, _, _)| *revision > mine)
            .map(|(revision, claim, _)| (*revision, claim.clone()))
    };
    let Some((revision, claim)) = later else {
        return;
    };
    let written = cluster
        .sessions
        .owned
        .lock()
        .remove(client_id)
        .map(|(_, r)| r.cursor);
    let Some((view, cursor, jobs)) = release(cluster, broker, client_id) else {
        return;
    };
    let cursor = kept_cursor(&view, cursor, written);
    tracing::info!(client = client_id, to = %claim.owner, "cluster: session claimed by another node while connecting here");
    let Some(bucket) = cluster.sessions.bucket.get().cloned() else {
        return;
    };
    let mut handed = Record::from_view(&claim.owner, claim.life, &view, cursor, None, None);
    handed.tk = cluster.sessions.taken.above(client_id, cursor).seqs;
    cluster.sessions.taken.forget(client_id);
    handed.handed = true;
    handed.expiry = claim.expiry;
    handed.will = claim.will;
    handed.wd = claim.wd;
    let key = subject::key(client_id);
    tokio::spawn(async move {
        if bucket
            .update(key.as_str(), handed.encode(), revision)
            .await
            .is_err()
        {
            jobs.not_written();
        }
    });
}

/// Another node claimed a session: give it up here and write what it held into the claim.
async fn hand_over(
    cluster: &Cluster,
    bucket: &kv::Store,
    broker: &Arc<Broker>,
    entry: &kv::Entry,
    claim: Record,
) {
    let client_id = subject::unescape(&entry.key.replace('=', "~"));
    let Some(client_id) = client_id else {
        return;
    };
    let (owned_here, written_cursor) = {
        // The watch may lag: a record older than our own claim says nothing of now.
        let mut owned = cluster.sessions.owned.lock();
        if owned
            .get(&client_id)
            .is_some_and(|(mine, _)| *mine > entry.revision)
        {
            return;
        }
        let removed = owned.remove(&client_id);
        (removed.is_some(), removed.map(|(_, r)| r.cursor))
    };
    cluster.sessions.unattached.lock().remove(&client_id);
    cluster.sessions.wills.lock().remove(&client_id);
    if cluster.sessions.adopted.lock().remove(&client_id).is_some() {
        // Adopted here from a dead node: the claimer took the record as it stood, without
        // waiting. A copy kept from this node's earlier run is stale.
        drop(broker.release_to_cluster(&client_id));
        return;
    }
    if !owned_here
        && claim.from != cluster.node
        && !cluster.sessions.restoring.lock().contains_key(&client_id)
    {
        // Held here without a claim of this run (brought back from this node's store at a
        // restart), and the record this one replaced was not this node's: the session moved
        // while this node was down, or this is the owner's own rewrite, not a claim. The
        // copy here is stale and the record is the session (the authority on who holds it):
        // the copy goes, and nothing of it is written.
        drop_stale_copy(broker, &client_id, &claim.owner);
        return;
    }
    {
        let mut claimed = cluster.sessions.claimed_elsewhere.lock();
        if claimed.len() > 10_000 {
            claimed.retain(|_, (_, _, at)| at.elapsed() < CLAIM_MEMORY);
        }
        claimed.insert(
            client_id.clone(),
            (entry.revision, claim.clone(), std::time::Instant::now()),
        );
    }
    let Some((view, released_cursor, jobs)) = release(cluster, broker, &client_id) else {
        return;
    };
    tracing::info!(client = %client_id, to = %claim.owner, "cluster: session taken over by another node");
    if claim.fresh || view.expiry_interval == 0 {
        // The claimer does not wait for a hand-over of a session that ends here (Clean
        // Start, or one that ends with its connection): written over its claim, the old
        // subscriptions and cursor would come back with the new session.
        cluster.sessions.taken.forget(&client_id);
        return;
    }
    // A session not claimed in this run came back from the store at a restart: the
    // sequences of what it holds are not known, its last record's cursor (the claim's copy)
    // finds them.
    let mut cursor = if owned_here || claim.cursor == 0 {
        kept_cursor(&view, released_cursor, written_cursor)
    } else {
        claim.cursor
    };
    let restoring = cluster.sessions.restoring.lock().get(&client_id).cloned();
    if let Some(restoring) = &restoring {
        // Taken while its replay here is still under way: what the replay has not reached
        // is not in the session yet.
        cursor = cursor.min(restoring.cursor);
    }
    let mut handed = Record::from_view(&claim.owner, claim.life, &view, cursor, None, None);
    handed.tk = taken_when_settled(cluster, &client_id, cursor).await;
    cluster.sessions.taken.forget(&client_id);
    if let Some(restoring) = &restoring {
        handed
            .tk
            .extend(restoring.taken.iter().filter(|&&seq| seq >= cursor));
        handed.tk.sort_unstable();
        handed.tk.dedup();
        for &(packet_id, seq) in &restoring.qos2 {
            if !handed.q2.iter().any(|(p, _)| *p == packet_id) {
                handed.q2.push((packet_id, seq));
                if restoring.qos2_shared.contains(&packet_id) {
                    handed.q2s.push(packet_id);
                }
            }
        }
    }
    handed.handed = true;
    handed.will = claim.will;
    handed.wd = claim.wd;
    if view.expiry_interval == 0 || claim.expiry == 0 {
        handed.expiry = claim.expiry;
    }
    if let Err(error) = bucket
        .update(entry.key.as_str(), handed.encode(), entry.revision)
        .await
    {
        tracing::debug!(client = %client_id, %error, "cluster: hand-over not written (claimed again since)");
        jobs.not_written();
    }
}

/// Longest a hand-over waits for the sequences of messages its client took before
/// JetStream acknowledged them (normally milliseconds): listed, the next owner does not send
/// them again.
const TAKEN_WAIT: Duration = Duration::from_secs(1);

/// The taken messages of a released session its hand-over lists ([`super::taken`]), once
/// their sequences are known (bounded by [`TAKEN_WAIT`]; past it, one still to come is not
/// listed and may reach the client twice).
async fn taken_when_settled(cluster: &Cluster, client_id: &str, cursor: u64) -> Vec<u64> {
    let deadline = tokio::time::Instant::now() + TAKEN_WAIT;
    loop {
        let listed = cluster.sessions.taken.above(client_id, cursor);
        if !listed.awaiting || tokio::time::Instant::now() >= deadline {
            if listed.awaiting {
                tracing::warn!(client = client_id, "cluster: a message the client took has no stream sequence yet; the session's next node may send it again");
            }
            return listed.seqs;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Keeps the records of local sessions current, and deletes those of sessions that ended.
pub(super) async fn keep_records(cluster: Arc<Cluster>, broker: Weak<Broker>) {
    let mut tick = tokio::time::interval(RECORD_INTERVAL);
    // Barriers wait on (a sequence still to come, a write to retry): soon another pass.
    let mut retry = false;
    loop {
        let full = tokio::select! {
            _ = tick.tick() => true,
            () = cluster.sessions.wake.notified() => false,
            () = tokio::time::sleep(BARRIER_RETRY), if retry => false,
        };
        let Some(broker) = broker.upgrade() else {
            return;
        };
        let Some(bucket) = cluster.sessions.bucket.get() else {
            continue;
        };
        if !cluster.is_up() {
            continue;
        }
        // The barriers before the views: each was added after the change it waits for, so
        // the views taken below hold it.
        let barriers = cluster.sessions.barriers.take();
        let mut dirty = std::mem::take(&mut *cluster.sessions.dirty.lock());
        dirty.extend(barriers.keys().cloned());
        // A full pass every period; otherwise only the changed ones (no pass over every
        // session per SUBSCRIBE or disconnect).
        let views: Vec<HeldSession> = if full {
            broker.held_sessions()
        } else {
            dirty
                .iter()
                .filter_map(|client_id| broker.held_session(client_id))
                .collect()
        };
        drop(broker);
        if full {
            let held: std::collections::HashSet<&str> = views
                .iter()
                .filter(|v| v.expiry_interval > 0)
                .map(|v| &*v.client_id)
                .collect();
            cluster
                .sessions
                .taken
                .retain(|client_id| held.contains(client_id));
        }
        let writes = changed_records(&cluster, &views);
        // Records of sessions that ended here (a clean session's at its disconnect: its
        // will must not outlive it in the record).
        let mut deletes = Vec::new();
        {
            let owned = cluster.sessions.owned.lock();
            // Claimed and not attached yet (waiting for a hand-over, or being replayed
            // before it is in the sessions map): its record is the session, not a leftover.
            let unattached = cluster.sessions.unattached.lock();
            let live: HashMap<&str, &HeldSession> =
                views.iter().map(|v| (&*v.client_id, v)).collect();
            let mut ended = |client_id: &String, revision: u64| {
                if !live.contains_key(client_id.as_str()) && !unattached.contains(client_id) {
                    deletes.push((client_id.clone(), revision));
                }
            };
            if full {
                for (client_id, (revision, _)) in owned.iter() {
                    ended(client_id, *revision);
                }
            } else {
                for client_id in &dirty {
                    if let Some((revision, _)) = owned.get(client_id) {
                        ended(client_id, *revision);
                    }
                }
            }
        }
        let failed = write(&cluster, bucket, writes).await;
        retry = false;
        for (client_id, waiters) in barriers {
            let view = views.iter().find(|v| *v.client_id == *client_id);
            let verdict = barrier_verdict(&cluster, view, failed.contains(&client_id), &client_id);
            retry |= cluster
                .sessions
                .barriers
                .settle(client_id, waiters, verdict);
        }
        for (client_id, revision) in deletes {
            // A session that connected again meanwhile has a newer revision: kept.
            let gone = {
                let mut owned = cluster.sessions.owned.lock();
                let gone = owned.get(&client_id).map(|(r, _)| *r) == Some(revision);
                if gone {
                    owned.remove(&client_id);
                }
                gone
            };
            if !gone {
                continue;
            }
            cluster.sessions.wills.lock().remove(&client_id);
            let key = subject::key(&client_id);
            let _ = bucket
                .delete_expect_revision(key.as_str(), Some(revision))
                .await;
        }
    }
}

/// How long barriers that wait on are left before the next pass.
const BARRIER_RETRY: Duration = Duration::from_millis(5);

/// Whether the pass that took `view` (after a barrier of `client_id` was added) wrote what
/// it waits for; `failed`: its record's write failed in that pass.
fn barrier_verdict(
    cluster: &Cluster,
    view: Option<&HeldSession>,
    failed: bool,
    client_id: &str,
) -> super::barriers::Verdict {
    use super::barriers::Verdict;
    let Some(view) = view else {
        return Verdict::Lost("the session is no longer held here");
    };
    if view.expiry_interval == 0 {
        return Verdict::Written; // it ends with its connection: no record to keep
    }
    if cluster.sessions.restoring.lock().contains_key(client_id) {
        return Verdict::Later {
            awaiting_sequence: false,
        };
    }
    if !cluster.sessions.owned.lock().contains_key(client_id) {
        return Verdict::Lost("the session was taken over by another node");
    }
    if failed {
        return Verdict::Later {
            awaiting_sequence: false,
        };
    }
    if view.unsequenced_qos2 || cluster.sessions.taken.awaiting(client_id) {
        return Verdict::Later {
            awaiting_sequence: true,
        };
    }
    Verdict::Written
}

/// The records of `views` (persistent sessions owned here) that differ from what was last
/// written: client id, revision to replace, new record.
fn changed_records(cluster: &Cluster, views: &[HeldSession]) -> Vec<(String, u64, Record)> {
    let wills = cluster.sessions.wills.lock();
    let owned = cluster.sessions.owned.lock();
    let restoring = cluster.sessions.restoring.lock();
    views
        .iter()
        .filter(|v| v.expiry_interval > 0 && !restoring.contains_key(&*v.client_id))
        .filter_map(|view| {
            let written = owned.get(&*view.client_id).map(|(_, r)| r);
            let cursor = kept_cursor(view, cursor_of(cluster, view), written.map(|w| w.cursor));
            let mut record = Record::from_view(
                &cluster.node,
                cluster.sessions.life,
                view,
                cursor,
                wills.get(&*view.client_id),
                written,
            );
            record.tk = cluster.sessions.taken.above(&view.client_id, cursor).seqs;
            match owned.get(&*view.client_id) {
                Some((revision, written)) if *written != record => {
                    Some((view.client_id.to_string(), *revision, record))
                }
                _ => None,
            }
        })
        .collect()
}

/// Writes records by compare-and-set; one that lost (claimed elsewhere since) is left to the
/// watch. Returns the client ids whose record was not written.
async fn write(
    cluster: &Cluster,
    bucket: &kv::Store,
    writes: Vec<(String, u64, Record)>,
) -> std::collections::HashSet<String> {
    let mut failed = std::collections::HashSet::new();
    for (client_id, revision, record) in writes {
        let key = subject::key(&client_id);
        let mut expected = revision;
        let mut written = false;
        for _ in 0..2 {
            match bucket.update(key.as_str(), record.encode(), expected).await {
                Ok(revision) => {
                    cluster
                        .sessions
                        .owned
                        .lock()
                        .insert(client_id.clone(), (revision, record.clone()));
                    written = true;
                    break;
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // A hand-over written after its claim stopped waiting for it still
                    // names this node (and run) as the owner: write over it.
                    let current = bucket.entry(key.as_str()).await.ok().flatten();
                    let ours = current.as_ref().and_then(|entry| {
                        (entry.operation == kv::Operation::Put)
                            .then(|| Record::decode(&entry.value))
                            .flatten()
                            .filter(|r| r.owner == cluster.node && r.life == cluster.sessions.life)
                            .map(|_| entry.revision)
                    });
                    let still_mine = cluster
                        .sessions
                        .owned
                        .lock()
                        .get(&client_id)
                        .is_some_and(|(r, _)| *r == revision);
                    match ours {
                        Some(current) if still_mine => expected = current,
                        _ => break, // claimed elsewhere since: left to the watch
                    }
                }
                Err(_) => break,
            }
        }
        if !written {
            failed.insert(client_id);
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Publish;

    fn options(qos: QoS, retain_as_published: bool) -> SubscriptionOptions {
        SubscriptionOptions {
            qos,
            no_local: false,
            retain_as_published,
            retain_handling: 0,
        }
    }

    fn message(topic: &str) -> Arc<Message> {
        Arc::new(Message::from_publish(
            Publish {
                qos: QoS::ExactlyOnce,
                topic: topic.into(),
                packet_id: 1,
                payload: Bytes::from_static(b"x"),
                ..Default::default()
            },
            None,
        ))
    }

    /// A record written before `q2s` existed (a node of the previous version, during a
    /// rolling upgrade) still decodes: its QoS 2 deliveries count as plain ones.
    #[test]
    fn a_record_without_the_shared_marks_decodes_as_plain() {
        let json = br#"{"owner":"a","expiry":60,"subs":[{"f":"t/#","q":2}],"cursor":5,"life":1,"q2":[[3,7],[4,0]]}"#;
        let record = Record::decode(json).expect("decodes");
        let restore = record.restore();
        assert_eq!(restore.qos2, vec![(3, 7), (4, 0)]);
        assert!(restore.qos2_shared.is_empty());
        assert_eq!(restore.cursor, 5);
    }

    /// A claim notes whose record it replaced (the one node that may hand over); a record
    /// written without it (a node of the previous version) decodes as naming nobody, and a
    /// record that is not a claim carries none.
    #[test]
    fn a_claims_previous_owner_survives_a_round_trip_and_defaults_to_none() {
        let claim = Record {
            owner: "b".into(),
            from: "a".into(),
            from_life: 7,
            ..Record::default()
        };
        let decoded = Record::decode(&claim.encode()).expect("decodes");
        assert_eq!((decoded.from.as_str(), decoded.from_life), ("a", 7));
        let old =
            Record::decode(br#"{"owner":"b","expiry":60,"cursor":5,"life":1}"#).expect("decodes");
        assert!(old.from.is_empty() && old.from_life == 0);
        let plain = Record {
            owner: "b".into(),
            ..Record::default()
        };
        assert!(!String::from_utf8_lossy(&plain.encode()).contains("from"));
    }

    /// What the client took above the cursor travels with the record, ascending for the
    /// replay's search; a record of an older node has none.
    #[test]
    fn the_taken_sequences_survive_a_round_trip_sorted() {
        let record = Record {
            owner: "b".into(),
            cursor: 5,
            tk: vec![9, 7, 9],
            ..Record::default()
        };
        let decoded = Record::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded.restore().taken, vec![7, 9]);
        let old = Record::decode(br#"{"owner":"b","expiry":60,"cursor":5}"#).expect("decodes");
        assert!(old.restore().taken.is_empty());
        assert!(!String::from_utf8_lossy(&old.encode()).contains("tk"));
    }

    #[test]
    fn the_shared_marks_survive_a_round_trip() {
        let record = Record {
            owner: "b".into(),
            q2: vec![(3, 7), (9, 8)],
            q2s: vec![9],
            ..Record::default()
        };
        let decoded = Record::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded, record);
        assert_eq!(decoded.restore().qos2_shared, vec![9]);
        // Nothing shared: nothing written for it.
        let plain = Record {
            q2s: Vec::new(),
            ..record
        };
        assert!(!String::from_utf8_lossy(&plain.encode()).contains("q2s"));
    }

    /// A delivery sent again goes out as the subscription that sent it: a plain one with
    /// every matching plain filter's identifier (MQTT-3.3.4-3), a shared one under its
    /// group (so its settlement and a later hand-over treat it as the group's).
    #[test]
    fn a_resent_delivery_is_its_own_subscriptions() {
        let restore = Restore {
            subscriptions: vec![
                (
                    "$share/g/t/#".into(),
                    options(QoS::ExactlyOnce, false),
                    Some(1),
                ),
                ("t/+".into(), options(QoS::ExactlyOnce, true), Some(2)),
                ("t/#".into(), options(QoS::AtLeastOnce, false), Some(3)),
                ("other".into(), options(QoS::ExactlyOnce, false), Some(4)),
            ],
            ..Restore::default()
        };
        let plain = resent_delivery(&restore, message("t/x"), true, false);
        assert!(plain.shared.is_none());
        assert_eq!(plain.subscription_ids.as_slice(), &[2, 3]);
        assert!(plain.retain, "retain as published on t/+");
        assert_eq!(plain.qos, QoS::ExactlyOnce);

        let shared = resent_delivery(&restore, message("t/x"), true, true);
        assert_eq!(shared.shared.as_deref(), Some("$share/g/t/#"));
        assert_eq!(shared.subscription_ids.as_slice(), &[1]);
        assert!(!shared.retain);

        // Its subscription went since: sent again all the same, with nothing to name.
        let orphan = resent_delivery(&restore, message("u/x"), false, true);
        assert!(orphan.shared.is_none());
        assert!(orphan.subscription_ids.is_empty());
    }

    fn view(unsequenced_pending: bool, lowest: Option<u64>) -> HeldSession {
        HeldSession {
            client_id: "w".into(),
            expiry_interval: 60,
            subscriptions: Vec::new(),
            lowest_pending_seq: lowest,
            qos2: Vec::new(),
            unsequenced_qos2: false,
            unsequenced_pending,
            qos2_shared: Vec::new(),
            connected: false,
            pending_will: None,
            owner: SessionOwner::Unbound,
        }
    }

    #[test]
    fn a_message_of_unknown_sequence_holds_the_cursor_at_the_recorded_one() {
        // Nothing of unknown sequence: the cursor follows what the session holds.
        let plain = view(false, Some(40));
        assert_eq!(kept_cursor(&plain, cursor_at(100, &plain), Some(10)), 40);
        // A message the store brought back: no further than the record's cursor.
        let restored = view(true, None);
        assert_eq!(
            kept_cursor(&restored, cursor_at(100, &restored), Some(10)),
            10
        );
        assert_eq!(kept_cursor(&view(true, Some(5)), 5, Some(10)), 5);
        // No recorded cursor (0: none): nothing to hold it at.
        assert_eq!(kept_cursor(&restored, 100, Some(0)), 100);
        assert_eq!(kept_cursor(&restored, 100, None), 100);
    }
}
