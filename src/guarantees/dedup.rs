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
//!
//! Must not: keep a PUBLISH's buffers alive (the topic may be a slice of its packet); hold the lock
//! beyond one check; cost anything while `dedup.property` is empty (the window does not exist).

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use parking_lot::Mutex;

use super::DedupMetrics;
use crate::config::DedupConfig;
use crate::storage::DedupRecord;

/// Longest id kept as it is; a longer one is kept as its SHA-256 ([`key_of`]).
pub(crate) const MAX_KEY_LEN: usize = 64;

/// The key the window keeps for the id `raw`: the id itself up to [`MAX_KEY_LEN`] bytes,
/// else `sha256:` and its digest in hex (71 bytes). An id's length was bounded only by the
/// packet size, so one client's ~280 publishes with 60 KB ids filled the 16 MiB window
/// (issue 35, seventh pass, N4); a digest keeps a pair's cost bounded, and unlike a fast hash
/// no two ids share one in practice (a collision would take a new message for a duplicate).
pub(crate) fn key_of(raw: &str) -> Cow<'_, str> {
    if raw.len() <= MAX_KEY_LEN {
        return Cow::Borrowed(raw);
    }
    Cow::Owned(digest("sha256:", raw))
}

/// The topic the window (and the store's `Op::PutDedup`) keeps for `topic`: the topic itself
/// up to [`MAX_KEY_LEN`] bytes, else a NUL, `sha256:` and its digest in hex (72 bytes). A
/// pair's topic counted in full (up to 64 KiB) while only the id was digested, so 12 clean
/// sessions of 30 long-topic publishes filled the window again (issue 35, pass 7b, P2). No
/// topic name contains U+0000 (MQTT-1.5.4-2), so a digest is never taken for a real topic,
/// and one given again (a stored record, a refused key forgotten) is kept as it is.
pub(crate) fn topic_key(topic: &str) -> Cow<'_, str> {
    if topic.len() <= MAX_KEY_LEN || topic.starts_with('\0') {
        return Cow::Borrowed(topic);
    }
    Cow::Owned(digest("\0sha256:", topic))
}

/// `prefix` and the SHA-256 of `raw` in hex.
fn digest(prefix: &str, raw: &str) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    let digest = sha2::Sha256::digest(raw.as_bytes());
    let mut key = String::with_capacity(prefix.len() + 64);
    key.push_str(prefix);
    for byte in digest {
        let _ = write!(key, "{byte:02x}");
    }
    key
}

/// What [`Dedup::check`] says about one PUBLISH.
#[derive(Debug, PartialEq, Eq)]
pub enum DedupCheck {
    /// Not seen within the window (now remembered until `expires_at_unix_ms`): route it, and
    /// with persistence on store the key (`Op::PutDedup`) in the message's submit.
    Fresh {
        /// When the pair's window closes, unix ms.
        expires_at_unix_ms: u64,
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

    /// Counts into the broker's `postbox_dedup_*` series from now on (`Broker::new`, before
    /// the restore); a window built alone counts nowhere.
    pub fn attach_metrics(&mut self, metrics: DedupMetrics) {
        self.metrics = metrics;
    }

    /// How many pairs the window keeps at most (the store keeps no more: `Store::bound_dedup`).
    pub fn max_entries(&self) -> usize {
        self.config.max_entries
    }

    /// The user property this window keys on.
    pub fn property(&self) -> &str {
        &self.config.property
    }

    /// Looks `key` up for `topic` and remembers it if new. Atomic: of two PUBLISHes racing
    /// with the same pair, exactly one is `Fresh`. A fresh pair costs one allocation (its
    /// bytes, copied: the PUBLISH's topic may be a slice of its whole packet, which the
    /// window must not keep alive); a duplicate none.
    pub fn check(&self, topic: &str, key: &str, now_unix_ms: u64) -> DedupCheck {
        self.check_from(topic, key, NO_PUBLISHER, now_unix_ms)
    }

    /// [`Dedup::check`] for a PUBLISH of `publisher` (its identity's share key,
    /// `broker::owner::share_key`: the user's, else the client's address; 0: none): a fresh
    /// pair beyond the publisher's share (`publisher_share` percent of either bound) pushes
    /// out that publisher's own oldest pairs, so one client cannot push out everyone else's
    /// (issue 35, seventh pass, N4); keyed by identity, not by session, so reconnecting does
    /// not bring a fresh share (pass 7b, P2). At the window's bounds the largest share loses
    /// its oldest pair, not the window its oldest: a flood pushes out its own keys first.
    /// `topic` is kept as [`topic_key`] makes it.
    pub fn check_from(
        &self,
        topic: &str,
        key: &str,
        publisher: u64,
        now_unix_ms: u64,
    ) -> DedupCheck {
        let topic = topic_key(topic);
        let topic = &*topic;
        let (check, entries, evicted) = {
            let mut w = self.pairs.lock();
            w.drop_expired(now_unix_ms);
            let hash = w.hash(topic, key);
            match w.find(hash, topic, key) {
                Some(pair) if pair.expires_at > now_unix_ms => {
                    drop(w);
                    self.metrics.duplicates.increment(1);
                    return DedupCheck::Duplicate;
                }
                Some(_) => w.remove(hash, topic, key), // closed, not yet passed by the front
                None => {}
            }
            let expires_at = now_unix_ms.saturating_add(self.window_ms);
            let seq = w.insert(hash, topic, key, expires_at, publisher);
            let evicted = w.enforce_share(publisher, &self.config) + w.enforce(&self.config, seq);
            (
                DedupCheck::Fresh {
                    expires_at_unix_ms: expires_at,
                },
                w.table.len(),
                evicted,
            )
        };
        self.count(entries, evicted);
        check
    }

    /// Forgets `key` again: the message it came with was refused (nothing was routed, so a
    /// re-send must not be taken for a duplicate).
    pub fn forget(&self, topic: &str, key: &str) {
        let topic = topic_key(topic);
        let topic = &*topic;
        let entries = {
            let mut w = self.pairs.lock();
            let hash = w.hash(topic, key);
            w.remove(hash, topic, key);
            w.table.len()
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
                // A record stored before topics were digested holds the whole topic.
                let topic = topic_key(&r.topic);
                let hash = w.hash(&topic, &r.key);
                w.remove(hash, &topic, &r.key);
                w.insert(hash, &topic, &r.key, r.expires_at_unix_ms, NO_PUBLISHER);
            }
            let evicted = w.enforce(&self.config, KEEP_NONE);
            (w.table.len(), evicted)
        };
        self.count(entries, evicted);
    }

    /// Pairs remembered now (expired ones not yet passed by the front included).
    pub fn len(&self) -> usize {
        self.pairs.lock().table.len()
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

/// One remembered pair: its topic and key in one allocation (never a hash alone: a
/// collision would take a new message for a duplicate and lose it), its window and which
/// queue entry is its own. 40 bytes in the table plus the bytes.
#[derive(Debug)]
struct Pair {
    /// The topic's bytes, then the key's.
    bytes: Box<[u8]>,
    topic_len: usize,
    expires_at: u64,
    seq: u64,
    /// The identity whose share the pair counts in ([`NO_PUBLISHER`]: nobody's).
    publisher: u64,
}

/// The publisher of pairs that are nobody's: restored ones (the store does not keep who
/// published them). They share one share, never bounded on its own (`enforce_share`), but,
/// as any share, where the window's bounds evict when it is the largest.
const NO_PUBLISHER: u64 = 0;

/// A `seq` no pair has: [`Window::enforce`] with nothing to keep.
const KEEP_NONE: u64 = u64::MAX;

/// What one publishing identity holds of the window, and its pairs oldest first (may hold
/// stale entries, compacted like the window's queue).
#[derive(Debug, Default)]
struct Share {
    entries: usize,
    bytes: usize,
    queue: VecDeque<Queued>,
}

impl Pair {
    fn is(&self, topic: &str, key: &str) -> bool {
        let (t, k) = self.bytes.split_at(self.topic_len);
        t == topic.as_bytes() && k == key.as_bytes()
    }

    /// What the pair counts against `max_bytes`.
    fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// A queue entry: the pair's hash (to find it) and `seq` (stale once the pair is forgotten
/// or remembered anew). 16 bytes, no copy of the key.
#[derive(Clone, Copy, Debug)]
struct Queued {
    hash: u64,
    seq: u64,
}

/// What the lock guards.
#[derive(Debug, Default)]
struct Window {
    table: HashTable<Pair>,
    hasher: RandomState,
    /// Insertion (= expiry: the window is one length for all) order; may hold stale entries,
    /// at most about as many as live ones.
    queue: VecDeque<Queued>,
    /// Bytes of the live pairs.
    bytes: usize,
    next_seq: u64,
    /// Each publishing identity's share, while it holds pairs.
    shares: HashMap<u64, Share>,
    /// The shares by (entries, publisher) and by (bytes, publisher), largest last: where the
    /// window's bounds evict from (`enforce`).
    by_entries: BTreeSet<(usize, u64)>,
    by_bytes: BTreeSet<(usize, u64)>,
}

impl Window {
    fn hash(&self, topic: &str, key: &str) -> u64 {
        // A pair, not a concatenation: (ab, c) and (a, bc) hash apart (and compare apart).
        self.hasher.hash_one((topic, key))
    }

    fn find(&self, hash: u64, topic: &str, key: &str) -> Option<&Pair> {
        self.table.find(hash, |p| p.is(topic, key))
    }

    /// Remembers a pair (not there yet); returns its `seq`.
    fn insert(
        &mut self,
        hash: u64,
        topic: &str,
        key: &str,
        expires_at: u64,
        publisher: u64,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut bytes = Vec::with_capacity(topic.len() + key.len());
        bytes.extend_from_slice(topic.as_bytes());
        bytes.extend_from_slice(key.as_bytes());
        let pair = Pair {
            bytes: bytes.into_boxed_slice(),
            topic_len: topic.len(),
            expires_at,
            seq,
            publisher,
        };
        self.bytes += pair.size();
        self.queue.push_back(Queued { hash, seq });
        let share = self.shares.entry(publisher).or_default();
        let before = (share.entries, share.bytes);
        share.entries += 1;
        share.bytes += pair.size();
        share.queue.push_back(Queued { hash, seq });
        let after = (share.entries, share.bytes);
        self.reindex(publisher, before, after);
        let hasher = &self.hasher;
        self.table.insert_unique(hash, pair, |p| {
            let (t, k) = p.bytes.split_at(p.topic_len);
            hasher.hash_one((bytes_str(t), bytes_str(k)))
        });
        seq
    }

    /// Moves `publisher` in the size indexes from `before` to `after` (entries, bytes; no
    /// entries: not indexed).
    fn reindex(&mut self, publisher: u64, before: (usize, usize), after: (usize, usize)) {
        if before.0 > 0 {
            self.by_entries.remove(&(before.0, publisher));
            self.by_bytes.remove(&(before.1, publisher));
        }
        if after.0 > 0 {
            self.by_entries.insert((after.0, publisher));
            self.by_bytes.insert((after.1, publisher));
        }
    }

    /// Removes a live pair (its queue entry goes stale; dropped when the front passes it or
    /// by a compaction, so the queue stays within about twice the live pairs).
    fn remove(&mut self, hash: u64, topic: &str, key: &str) {
        let Ok(entry) = self.table.find_entry(hash, |p| p.is(topic, key)) else {
            return;
        };
        let (pair, _) = entry.remove();
        self.gone(&pair);
        if self.queue.back().is_some_and(|q| q.seq == pair.seq) {
            self.queue.pop_back(); // the usual refusal: forgotten right after it was added
        } else if self.queue.len() > 2 * self.table.len() + 64 {
            let table = &self.table;
            self.queue
                .retain(|q| table.find(q.hash, |p| p.seq == q.seq).is_some());
        }
    }

    /// The front entry's pair, if it is live.
    fn front_live(&self) -> Option<&Pair> {
        let front = self.queue.front()?;
        self.table.find(front.hash, |p| p.seq == front.seq)
    }

    /// Pops the front entry, removing its pair when live; true if a live pair went.
    fn pop_front(&mut self) -> bool {
        let Some(front) = self.queue.pop_front() else {
            return false;
        };
        match self.table.find_entry(front.hash, |p| p.seq == front.seq) {
            Ok(entry) => {
                let (pair, _) = entry.remove();
                self.gone(&pair);
                true
            }
            Err(_) => false,
        }
    }

    /// Drops expired (and stale) entries from the front.
    fn drop_expired(&mut self, now_unix_ms: u64) {
        while !self.queue.is_empty()
            && self
                .front_live()
                .is_none_or(|pair| pair.expires_at <= now_unix_ms)
        {
            self.pop_front();
        }
    }

    /// Takes a removed pair out of the byte count and its publisher's share.
    fn gone(&mut self, pair: &Pair) {
        self.bytes -= pair.size();
        let Some(share) = self.shares.get_mut(&pair.publisher) else {
            return;
        };
        let before = (share.entries, share.bytes);
        share.entries -= 1;
        share.bytes -= pair.size();
        let after = (share.entries, share.bytes);
        if share.entries == 0 {
            self.shares.remove(&pair.publisher);
        } else if share.queue.len() > 2 * share.entries + 64 {
            let table = &self.table;
            share
                .queue
                .retain(|q| table.find(q.hash, |p| p.seq == q.seq).is_some());
        }
        self.reindex(pair.publisher, before, after);
    }

    /// Pushes out `publisher`'s oldest live pair unless it is `keep` (the pair just
    /// remembered: the message it came with is routed); true if one went.
    fn evict_oldest_of(&mut self, publisher: u64, keep: u64) -> bool {
        loop {
            let Some(share) = self.shares.get_mut(&publisher) else {
                return false;
            };
            let Some(&oldest) = share.queue.front() else {
                return false;
            };
            match self.table.find_entry(oldest.hash, |p| p.seq == oldest.seq) {
                Ok(_) if oldest.seq == keep => return false,
                Ok(entry) => {
                    share.queue.pop_front();
                    let (pair, _) = entry.remove();
                    self.gone(&pair);
                    return true;
                }
                Err(_) => {
                    share.queue.pop_front(); // stale
                }
            }
        }
    }

    /// Pushes out the window's oldest live pair unless it is `keep`; true if one went.
    fn evict_oldest(&mut self, keep: u64) -> bool {
        loop {
            let Some(&front) = self.queue.front() else {
                return false;
            };
            if front.seq == keep && self.front_live().is_some() {
                return false;
            }
            if self.pop_front() {
                return true;
            }
        }
    }

    /// Drops the queue's stale entries once they outnumber the live pairs (evictions from a
    /// share leave them anywhere in it).
    fn compact_queue(&mut self) {
        if self.queue.len() > 2 * self.table.len() + 64 {
            let table = &self.table;
            self.queue
                .retain(|q| table.find(q.hash, |p| p.seq == q.seq).is_some());
        }
    }

    /// Pushes out `publisher`'s own oldest pairs until it holds no more than its share of
    /// either bound; returns how many went.
    fn enforce_share(&mut self, publisher: u64, config: &DedupConfig) -> u64 {
        if publisher == NO_PUBLISHER {
            return 0;
        }
        let percent = usize::from(config.publisher_share.clamp(1, 100));
        let max_entries = (config.max_entries.saturating_mul(percent) / 100).max(1);
        let max_bytes = (config.max_bytes.saturating_mul(percent) / 100).max(1);
        let mut evicted = 0;
        loop {
            let Some(share) = self.shares.get_mut(&publisher) else {
                return evicted;
            };
            // The newest pair stays, whatever its size: the message it came with is routed.
            if share.entries <= 1 || (share.entries <= max_entries && share.bytes <= max_bytes) {
                return evicted;
            }
            if !self.evict_oldest_of(publisher, KEEP_NONE) {
                return evicted;
            }
            evicted += 1;
        }
    }

    /// Until both bounds hold, pushes out the oldest pair of the largest share (by entries
    /// while over `max_entries`, else by bytes), so a flood spread over several identities
    /// pushes out its own pairs before anyone else's (issue 35, pass 7b, P2: the window's
    /// oldest went, whoever's). The pair `keep` stays; when the largest share holds only
    /// it, the window's oldest goes. Returns how many live pairs went.
    fn enforce(&mut self, config: &DedupConfig, keep: u64) -> u64 {
        let mut evicted = 0;
        while self.table.len() > config.max_entries || self.bytes > config.max_bytes {
            let largest = if self.table.len() > config.max_entries {
                self.by_entries.last()
            } else {
                self.by_bytes.last()
            };
            let went = match largest.map(|&(_, publisher)| publisher) {
                Some(publisher) => self.evict_oldest_of(publisher, keep),
                None => false,
            };
            if !went && !self.evict_oldest(keep) {
                break;
            }
            evicted += 1;
        }
        if evicted > 0 {
            self.compact_queue();
        }
        evicted
    }
}

/// A pair's stored half as the `&str` it was made from (it was copied from one, so this
/// never fails; an empty string would only mis-hash, never mis-compare).
fn bytes_str(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests;
