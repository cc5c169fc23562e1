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
//! - **Taken ahead of the cursor**: QoS 2 messages the client took above the cursor (a
//!   node's own messages reach its sessions before older ones from other nodes) are listed
//!   in the record, and the next owner leaves them out ([`super::taken`]).
//!
//! One submodule per step: [`record`] (the JSON), [`claim`], [`handover`], [`restore`],
//! [`keep`] (records kept current).
//!
//! Must not: wait more than `HANDOVER_WAIT` (3 s) for a dead owner; write a record for a session
//! this node does not hold by right (the record is the authority on ownership).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::kv;

/// How long a claim waits for the previous owner's hand-over.
pub(crate) const HANDOVER_WAIT: Duration = Duration::from_secs(3);
/// How often the records of local sessions are brought up to date.
pub const RECORD_INTERVAL: Duration = Duration::from_secs(1);
/// Most attempts of a compare-and-set that keeps losing races.
const CAS_ATTEMPTS: usize = 8;
/// The largest will ([`crate::codec::LastWill::held_bytes`]) an anonymous session's record
/// carries. Every CONNECT writes its record, and NATS keeps a replaced value's bytes on disk
/// until it compacts the block, a minute or two later, outside JetStream's `max_file_store`:
/// strangers reconnecting with 250 KB wills wrote 1.28 GB past a 150 MB limit in 18 s
/// (issue 35, eighteenth adversarial pass, E1). A larger one is still held and published by
/// the session's node; only another node adopting the session after a crash has none.
pub(in crate::cluster) const ANONYMOUS_RECORD_WILL: usize = 1024;
/// Longest a replay may take; longer, the CONNECT is refused (0x88) and the session kept
/// whole in its record for the next attempt.
const REPLAY_LIMIT: Duration = Duration::from_secs(30);

mod claim;
mod handover;
mod keep;
mod record;
mod restore;

pub(in crate::cluster) use claim::{claim, confirm};
pub(in crate::cluster) use handover::watch_claims;
pub(in crate::cluster) use keep::keep_records;
pub(in crate::cluster) use record::{decode_will, Record};
pub(in crate::cluster) use restore::restore;

/// The records this node owns: the bucket, and per client id the revision and content it
/// last wrote (to write only what changed, by compare-and-set).
#[derive(Debug, Default)]
pub(crate) struct Records {
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
