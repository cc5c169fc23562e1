//! Deduplication (`[dedup]`): a second PUBLISH with the same (topic, user property value)
//! inside the window is acknowledged and not routed again. Bounded by entries and bytes,
//! oldest out first; stored with the message that carried the key (`Op::PutDedup`, in the
//! same submit), restored at start.
//!
//! The window is a hash map of exact (topic, key) pairs (never a hash alone: a collision would
//! take a new message for a duplicate and lose it) plus a queue in insertion order, both under
//! one short lock. Insertion order is expiry order (the window is one length for all), so
//! expired pairs are dropped from the front as it passes, and the bounds push out the front.
//! A duplicate is found by borrowing the PUBLISH's own topic and key: no allocation. Times
//! are wall-clock unix ms, as stored, so a restart keeps the windows that are still open.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use bytestring::ByteString;
use foldhash::fast::RandomState;
use hashbrown::{Equivalent, HashMap};
use parking_lot::Mutex;

use crate::config::DedupConfig;
use crate::metrics::DedupMetrics;
use crate::storage::{DedupRecord, Op};

/// What [`Dedup::check`] says about one PUBLISH.
#[derive(Debug)]
pub enum DedupCheck {
    /// Not seen within the window (now remembered): route it, and store `op` in the
    /// message's submit (with persistence on).
    Fresh {
        /// `Op::PutDedup` for the key.
        op: Box<Op>,
    },
    /// Seen within the window: acknowledge it (once what the first one's commit holds is
    /// durable) and route nothing.
    Duplicate,
}

/// The window of remembered keys.
#[derive(Debug)]
pub struct Dedup {
    config: DedupConfig,
    /// `config.window` in ms.
    window_ms: u64,
    pairs: Mutex<Window>,
    metrics: DedupMetrics,
}

impl Dedup {
    /// An empty window.
    pub fn new(config: &DedupConfig) -> Dedup {
        Dedup {
            config: config.clone(),
            window_ms: u64::from(config.window) * 1000,
            pairs: Mutex::new(Window::default()),
            metrics: DedupMetrics::detached(),
        }
    }

    /// Counts into the broker's `postbox_dedup_*` series from now on (`Broker::
    /// install_guarantees`, before the restore); a window built alone counts nowhere.
    pub fn attach_metrics(&mut self, metrics: DedupMetrics) {
        self.metrics = metrics;
    }

    /// The user property this window keys on.
    pub fn property(&self) -> &str {
        &self.config.property
    }

    /// Looks `key` up for `topic` and remembers it if new. Atomic: of two PUBLISHes racing
    /// with the same pair, exactly one is `Fresh`.
    pub fn check(&self, topic: &ByteString, key: &str, now_unix_ms: u64) -> DedupCheck {
        let (check, entries, evicted) = {
            let mut w = self.pairs.lock();
            w.drop_expired(now_unix_ms);
            let probe = KeyRef { topic, key };
            match w.map.get(&probe) {
                Some(slot) if slot.expires_at > now_unix_ms => {
                    drop(w);
                    self.metrics.duplicates.increment(1);
                    return DedupCheck::Duplicate;
                }
                Some(_) => w.remove(&probe), // closed, not yet passed by the front
                None => {}
            }
            // Copies: the PUBLISH's topic may be a slice of its whole packet, which the
            // window must not keep alive.
            let pair = Key {
                topic: ByteString::from(&**topic),
                key: ByteString::from(key),
            };
            let expires_at = now_unix_ms.saturating_add(self.window_ms);
            let op = Op::PutDedup {
                topic: pair.topic.clone(),
                key: pair.key.clone(),
                expires_at_unix_ms: expires_at,
            };
            w.insert(pair, expires_at);
            let evicted = w.enforce(&self.config);
            (DedupCheck::Fresh { op: Box::new(op) }, w.map.len(), evicted)
        };
        self.count(entries, evicted);
        check
    }

    /// Forgets `key` again: the message it came with was refused (nothing was routed, so a
    /// re-send must not be taken for a duplicate).
    pub fn forget(&self, topic: &str, key: &str) {
        let entries = {
            let mut w = self.pairs.lock();
            w.remove(&KeyRef { topic, key });
            w.map.len()
        };
        self.count(entries, 0);
    }

    /// Remembers the keys the store held at start (their windows still open), oldest first,
    /// within the bounds (the newest kept).
    pub fn restore(&self, records: Vec<DedupRecord>) {
        self.restore_at(records, crate::storage::now_unix_ms());
    }

    /// [`Dedup::restore`] at a given time.
    fn restore_at(&self, mut records: Vec<DedupRecord>, now_unix_ms: u64) {
        records.retain(|r| r.expires_at_unix_ms > now_unix_ms);
        // Oldest first, as the store hands them; sorted again so the queue's order holds
        // whatever produced them.
        records.sort_by_key(|r| r.expires_at_unix_ms);
        let (entries, evicted) = {
            let mut w = self.pairs.lock();
            for r in records {
                let probe = KeyRef {
                    topic: &r.topic,
                    key: &r.key,
                };
                w.remove(&probe);
                let pair = Key {
                    topic: ByteString::from(&*r.topic),
                    key: ByteString::from(&*r.key),
                };
                w.insert(pair, r.expires_at_unix_ms);
            }
            let evicted = w.enforce(&self.config);
            (w.map.len(), evicted)
        };
        self.count(entries, evicted);
    }

    /// Pairs remembered now (expired ones not yet passed by the front included).
    pub fn len(&self) -> usize {
        self.pairs.lock().map.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn count(&self, entries: usize, evicted: u64) {
        self.metrics.entries.set(entries as f64);
        if evicted > 0 {
            self.metrics.evicted.increment(evicted);
        }
    }
}

/// One remembered pair, owned (copies of the PUBLISH's topic and property value).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    topic: ByteString,
    key: ByteString,
}

impl Key {
    fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            topic: &self.topic,
            key: &self.key,
        }
    }

    /// What the pair counts against `max_bytes`.
    fn size(&self) -> usize {
        self.topic.len() + self.key.len()
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_ref().hash(state);
    }
}

/// A pair borrowed from a PUBLISH, to look it up without copying.
#[derive(Clone, Copy, Debug, Hash)]
struct KeyRef<'a> {
    topic: &'a str,
    key: &'a str,
}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        self.topic == &*key.topic && self.key == &*key.key
    }
}

/// A pair's window and which queue entry is its own.
#[derive(Debug)]
struct Slot {
    expires_at: u64,
    seq: u64,
}

/// A queue entry; stale once its pair is forgotten or remembered anew (another `seq`).
#[derive(Debug)]
struct Queued {
    key: Key,
    seq: u64,
}

/// What the lock guards.
#[derive(Debug, Default)]
struct Window {
    map: HashMap<Key, Slot, RandomState>,
    /// Insertion (= expiry) order; may hold stale entries, at most about as many as live ones.
    queue: VecDeque<Queued>,
    /// Bytes of the live pairs.
    bytes: usize,
    next_seq: u64,
}

impl Window {
    fn insert(&mut self, key: Key, expires_at: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += key.size();
        self.queue.push_back(Queued {
            key: key.clone(),
            seq,
        });
        self.map.insert(key, Slot { expires_at, seq });
    }

    /// Removes a live pair (its queue entry goes stale; dropped when the front passes it or
    /// by a compaction, so the queue stays within about twice the live pairs).
    fn remove(&mut self, probe: &KeyRef<'_>) {
        let Some((key, slot)) = self.map.remove_entry(probe) else {
            return;
        };
        self.bytes -= key.size();
        if self.queue.back().is_some_and(|q| q.seq == slot.seq) {
            self.queue.pop_back(); // the usual refusal: forgotten right after it was added
        } else if self.queue.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.queue
                .retain(|q| map.get(&q.key.as_ref()).is_some_and(|s| s.seq == q.seq));
        }
    }

    /// The front entry's slot, if it is live.
    fn front_live(&self) -> Option<(&Queued, &Slot)> {
        let front = self.queue.front()?;
        self.map
            .get(&front.key.as_ref())
            .filter(|s| s.seq == front.seq)
            .map(|s| (front, s))
    }

    /// Pops the front entry, removing its pair when live; true if a live pair went.
    fn pop_front(&mut self) -> bool {
        let Some(front) = self.queue.pop_front() else {
            return false;
        };
        match self.map.get(&front.key.as_ref()) {
            Some(slot) if slot.seq == front.seq => {
                self.map.remove(&front.key.as_ref());
                self.bytes -= front.key.size();
                true
            }
            _ => false,
        }
    }

    /// Drops expired (and stale) entries from the front.
    fn drop_expired(&mut self, now_unix_ms: u64) {
        while !self.queue.is_empty()
            && self
                .front_live()
                .is_none_or(|(_, slot)| slot.expires_at <= now_unix_ms)
        {
            self.pop_front();
        }
    }

    /// Pushes out the oldest pairs until both bounds hold; returns how many live pairs went.
    fn enforce(&mut self, config: &DedupConfig) -> u64 {
        let mut evicted = 0;
        while (self.map.len() > config.max_entries || self.bytes > config.max_bytes)
            && !self.queue.is_empty()
        {
            if self.pop_front() {
                evicted += 1;
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests;
