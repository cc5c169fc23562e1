//! Whose share of the memory budget an unverified publisher's message is charged to: the
//! anonymous clients' (with their sessions, subscriptions and connections), or one bridge's
//! remote, each its own eighth of the budget.
//!
//! A bridge's remote publishers were never verified here, so their messages are strangers'
//! (issue 35, sixteenth adversarial pass, C2). Charged to the anonymous clients' share, one
//! local stranger's retained messages held a bridge's inbound messages for good, and a
//! bridge's remote starved local strangers (seventeenth pass, D5): now each bridge has a
//! share of its own, so neither can spend what the other needs.

use std::sync::atomic::{AtomicI64, Ordering};

use super::flow::{anonymous_bytes, anonymous_retained_counted, anonymous_share, MemoryBudget};

/// Bridges with a share of their own; later ones share the last.
const BRIDGE_SHARES: usize = 63;

/// What each bridge's remote makes the broker hold now (its messages wherever they are held).
static BRIDGE_BYTES: [AtomicI64; BRIDGE_SHARES] = [const { AtomicI64::new(0) }; BRIDGE_SHARES];

/// A stranger's share: 0 the anonymous clients', `1..=63` a bridge's. Six bits, so that a
/// message keeps it in its marks byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct StrangerShare(u8);

impl StrangerShare {
    /// Anonymous clients'.
    pub const ANONYMOUS: StrangerShare = StrangerShare(0);

    /// The share of the bridge at `index` in the config (from 0).
    pub fn of_bridge(index: usize) -> StrangerShare {
        let slot = index.min(BRIDGE_SHARES - 1) + 1;
        StrangerShare(u8::try_from(slot).unwrap_or(u8::MAX))
    }

    /// Its number, `0..=63` (a message's marks; the cluster's window per share).
    pub fn slot(self) -> u8 {
        self.0
    }

    /// The share numbered `slot` ([`StrangerShare::slot`]).
    pub(crate) fn from_slot(slot: u8) -> StrangerShare {
        StrangerShare(slot.min(u8::try_from(BRIDGE_SHARES).unwrap_or(u8::MAX)))
    }

    /// `bytes` more (`up`) or fewer held in this share.
    pub(crate) fn counted(self, bytes: usize, up: bool) {
        match self.bridge() {
            None => anonymous_retained_counted(bytes, up),
            Some(counter) => {
                let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
                counter.fetch_add(if up { bytes } else { -bytes }, Ordering::Relaxed);
            }
        }
    }

    /// What this share holds now.
    pub fn bytes(self) -> u64 {
        match self.bridge() {
            None => anonymous_bytes(),
            Some(counter) => u64::try_from(counter.load(Ordering::Relaxed)).unwrap_or(0),
        }
    }

    /// Whether it may grow by `cost` bytes within an eighth of `budget`.
    pub(crate) fn has_room(self, cost: u64, budget: &MemoryBudget) -> bool {
        self.bytes().saturating_add(cost) <= anonymous_share(budget)
    }

    /// [`StrangerShare::has_room`] against the share of the budget the broker was made with
    /// ([`super::flow::share_limit`]): for a message deciding whether to keep another copy
    /// of itself, which cannot reach the broker's flow control.
    pub(crate) fn has_room_for_copy(self, cost: u64) -> bool {
        self.bytes().saturating_add(cost) <= super::flow::share_limit()
    }

    /// Whether a message of `cost` bytes fits when it replaces one of `replaced` bytes
    /// charged to this share: when the replaced one leaves memory with it (`freed_now`),
    /// within the share once it is gone, and a clear (`clear`) no larger than what it
    /// removes always; else (a copy of it is queued somewhere, and stays charged) only
    /// where there is room (nineteenth adversarial pass, F1: clears of messages queued at a
    /// verified client's offline session took the budget past 100%).
    pub(crate) fn fits_replacing(
        self,
        cost: u64,
        replaced: u64,
        freed_now: bool,
        clear: bool,
        budget: &MemoryBudget,
    ) -> bool {
        if !freed_now {
            return self.has_room(cost, budget);
        }
        if clear && cost <= replaced {
            return true;
        }
        let freed = replaced;
        self.bytes().saturating_add(cost) <= anonymous_share(budget).saturating_add(freed)
    }

    fn bridge(self) -> Option<&'static AtomicI64> {
        usize::from(self.0)
            .checked_sub(1)
            .and_then(|i| BRIDGE_BYTES.get(i))
    }
}

/// Whether a stranger's PUBLISH fits its share ([`crate::broker::Broker::stranger_fits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShareFit {
    /// It does not: held or refused until the share has room.
    No,
    /// There is room for it.
    Room,
    /// It is retained and replaces (or clears) its topic's retained message charged to the
    /// same share, within the share once that one makes way: it frees what it needs, so it
    /// need not wait behind what waits for room (issue 35, eighteenth adversarial pass, E3).
    Replacing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bridges_share_is_apart_from_anonymous_clients_and_other_bridges() {
        let (first, second) = (StrangerShare::of_bridge(40), StrangerShare::of_bridge(41));
        assert_ne!(first, StrangerShare::ANONYMOUS);
        assert_eq!(StrangerShare::from_slot(first.slot()), first);
        let (before_first, before_second) = (first.bytes(), second.bytes());
        first.counted(1000, true);
        assert_eq!(first.bytes(), before_first + 1000);
        assert_eq!(second.bytes(), before_second);
        first.counted(1000, false);
        assert_eq!(first.bytes(), before_first);
        assert_eq!(StrangerShare::of_bridge(500), StrangerShare::of_bridge(62));
    }
}
