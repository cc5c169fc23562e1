//! Queue bounds per session: the broker-wide `[mqtt]` bound, and the few sessions that have
//! their own (a bridge's local session `$bridge/<name>` gets its bridge's
//! `max_queued_messages` / `max_queued_bytes` / `queue_overflow`).
//!
//! Why a side table and not a field of [`Session`](super::Session): the session stays within
//! its size bound (320 B, a test holds it), and a bound can be set before its session exists
//! (the bridge sets it at start, before its link connects) and outlives it (a discarded
//! session that comes back keeps it). Every reader goes through [`QueueLimitsTable::of`], which
//! costs one relaxed atomic load while no session has bounds of its own; only then is the
//! table (an `ArcSwap`, no lock) searched by client id.
//!
//! Must not: grow `Session` (it stays within 328 B); lock on the publish path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytestring::ByteString;
use parking_lot::Mutex;

use super::session::QueueLimits;
use crate::config::OverflowPolicy;

/// The queue bounds one session gets instead of the broker-wide `mqtt.max_queued_messages`,
/// `max_queued_bytes` and `queue_overflow` (see [`super::Broker::set_queue_limits`]). Why:
/// a bridge's session buffers for a whole remote broker across outages, so its bound and what
/// happens when it is full are the bridge's to choose, not every client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionQueueLimits {
    /// Most deliveries the session may queue beyond its inflight window (at least 1).
    pub max_messages: usize,
    /// Most payload bytes it may queue; 0 = no byte bound.
    pub max_bytes: usize,
    /// What a full queue does while the session is offline or stalled: `refuse` (a QoS 1/2
    /// publisher is told 0x97 / a 3.x one is disconnected), `drop-oldest` or `drop-new`.
    pub overflow: OverflowPolicy,
}

/// Bounds by client id, for the sessions that have their own.
type Overrides = HashMap<ByteString, QueueLimits, foldhash::fast::RandomState>;

/// The broker-wide queue bounds and the sessions' own.
#[derive(Debug)]
pub(super) struct QueueLimitsTable {
    /// `[mqtt]`'s bounds: every session without its own.
    global: QueueLimits,
    /// Set once any session has bounds of its own: until then no lookup is made.
    any: AtomicBool,
    /// A bit per first byte of the client ids with bounds of their own (`$` for the bridges'
    /// `$bridge/...`): a session whose id starts otherwise — every client, in practice — is
    /// answered without hashing its id, also once a bridge is configured.
    first_bytes: [AtomicU64; 4],
    /// Set once any session's own policy is `refuse`: `Broker::refused_for_full_queue` then
    /// looks at every QoS 1/2 publish even when the broker-wide policy is another.
    any_refuse: AtomicBool,
    /// The sessions' own bounds, replaced whole on a change (rare: once per bridge at start).
    overrides: ArcSwap<Overrides>,
    /// Serialises changes (copy, insert, swap).
    writer: Mutex<()>,
}

impl QueueLimitsTable {
    /// A table where every session has `global`.
    pub(super) fn new(global: QueueLimits) -> QueueLimitsTable {
        QueueLimitsTable {
            global,
            any: AtomicBool::new(false),
            first_bytes: Default::default(),
            any_refuse: AtomicBool::new(false),
            overrides: ArcSwap::from_pointee(Overrides::default()),
            writer: Mutex::new(()),
        }
    }

    /// The broker-wide bounds.
    pub(super) fn global(&self) -> &QueueLimits {
        &self.global
    }

    /// The bounds of the session of `client_id`: its own, else the broker-wide ones.
    #[inline]
    pub(super) fn of(&self, client_id: &str) -> QueueLimits {
        if !self.any.load(Ordering::Relaxed) {
            return self.global;
        }
        let first = client_id.as_bytes().first().copied().unwrap_or(0);
        if self.first_bytes[usize::from(first >> 6)].load(Ordering::Relaxed) & (1 << (first & 63))
            == 0
        {
            return self.global;
        }
        self.own(client_id)
    }

    #[cold]
    fn own(&self, client_id: &str) -> QueueLimits {
        self.overrides
            .load()
            .get(client_id)
            .copied()
            .unwrap_or(self.global)
    }

    /// Whether some session's queue may be under `refuse` (the broker-wide policy, or a
    /// session's own).
    #[inline]
    pub(super) fn may_refuse(&self) -> bool {
        self.global.overflow == OverflowPolicy::Refuse || self.any_refuse.load(Ordering::Relaxed)
    }

    /// Gives the session of `client_id` its own bounds (the other settings — QoS 0 queueing,
    /// the stall clock, back-pressure — stay the broker's).
    pub(super) fn set(&self, client_id: &str, limits: SessionQueueLimits) {
        let own = QueueLimits {
            max_messages: limits.max_messages.max(1),
            max_bytes: limits.max_bytes,
            overflow: limits.overflow,
            ..self.global
        };
        let _writer = self.writer.lock();
        let mut next = Overrides::clone(&self.overrides.load());
        next.insert(ByteString::from(client_id), own);
        let refuse = next.values().any(|l| l.overflow == OverflowPolicy::Refuse);
        self.overrides.store(Arc::new(next));
        let first = client_id.as_bytes().first().copied().unwrap_or(0);
        self.first_bytes[usize::from(first >> 6)].fetch_or(1 << (first & 63), Ordering::Relaxed);
        self.any_refuse.store(refuse, Ordering::Relaxed);
        self.any.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global() -> QueueLimits {
        QueueLimits {
            max_messages: 1000,
            max_bytes: 0,
            queue_qos0_offline: false,
            overflow: OverflowPolicy::DropNew,
            stalled_after_ms: 30_000,
            backpressure_qos0: false,
            anonymous_share: u64::MAX,
        }
    }

    #[test]
    fn a_session_without_its_own_gets_the_broker_wide_bounds() {
        let table = QueueLimitsTable::new(global());
        assert_eq!(table.of("a").max_messages, 1000);
        assert!(!table.may_refuse());
        table.set(
            "$bridge/b",
            SessionQueueLimits {
                max_messages: 0,
                max_bytes: 64,
                overflow: OverflowPolicy::Refuse,
            },
        );
        let own = table.of("$bridge/b");
        assert_eq!((own.max_messages, own.max_bytes), (1, 64));
        assert_eq!(own.overflow, OverflowPolicy::Refuse);
        assert_eq!(own.stalled_after_ms, 30_000);
        assert_eq!(table.of("a").max_messages, 1000);
        assert_eq!(table.of("a").overflow, OverflowPolicy::DropNew);
        assert!(table.may_refuse());
        table.set(
            "$bridge/b",
            SessionQueueLimits {
                max_messages: 5,
                max_bytes: 0,
                overflow: OverflowPolicy::DropOldest,
            },
        );
        assert!(!table.may_refuse());
        assert_eq!(table.of("$bridge/b").max_messages, 5);
        // Same first byte, no bounds of its own (the hashed lookup); no first byte at all.
        assert_eq!(table.of("$other").max_messages, 1000);
        assert_eq!(table.of("").max_messages, 1000);
        table.set(
            "",
            SessionQueueLimits {
                max_messages: 7,
                max_bytes: 0,
                overflow: OverflowPolicy::DropNew,
            },
        );
        assert_eq!(table.of("").max_messages, 7);
    }
}
