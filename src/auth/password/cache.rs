//! Recent successful logins, so reconnecting devices skip key derivation.
//!
//! An entry is HMAC-SHA256 under a random per-process key of (file generation, user name,
//! password): never the password, and useless outside this process. A new file generation
//! (SIGHUP) makes every old entry unreachable, and the store clears them. Bounded: the oldest
//! entry goes when it is full.

use std::collections::{HashSet, VecDeque};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A cache key: the MAC of one (generation, user, password).
pub(crate) type Key = [u8; 32];

/// A bounded set of keys of recent successes, oldest out first.
#[derive(Debug)]
pub(crate) struct SuccessCache {
    secret: [u8; 32],
    capacity: usize,
    keys: HashSet<Key>,
    order: VecDeque<Key>,
}

impl SuccessCache {
    /// A cache of at most `capacity` entries (0: remembers nothing).
    pub(crate) fn new(capacity: usize) -> SuccessCache {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret);
        SuccessCache {
            secret,
            capacity,
            keys: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// The key of a login. Lengths are included so that (`ab`, `c`) and (`a`, `bc`) differ.
    pub(crate) fn key(&self, generation: u64, user: &str, password: &[u8]) -> Key {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(&generation.to_le_bytes());
        mac.update(&(user.len() as u64).to_le_bytes());
        mac.update(user.as_bytes());
        mac.update(password);
        mac.finalize().into_bytes().into()
    }

    /// Whether `key` succeeded recently.
    pub(crate) fn contains(&self, key: &Key) -> bool {
        self.keys.contains(key)
    }

    /// Remembers a success, forgetting the oldest if full.
    pub(crate) fn insert(&mut self, key: Key) {
        if self.capacity == 0 || !self.keys.insert(key) {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }

    /// Forgets everything (a new file is in force).
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.order.clear();
    }

    /// How many entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when empty.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_every_part_and_the_cache_is_bounded() {
        let mut c = SuccessCache::new(2);
        let k = c.key(1, "ab", b"c");
        assert_ne!(k, c.key(1, "a", b"bc"));
        assert_ne!(k, c.key(2, "ab", b"c"), "a new file generation misses");
        assert_ne!(k, c.key(1, "ab", b"d"));
        c.insert(k);
        assert!(c.contains(&k));
        c.insert(c.key(1, "x", b"1"));
        c.insert(c.key(1, "y", b"1"));
        assert_eq!(c.len(), 2);
        assert!(!c.contains(&k), "oldest evicted");
        c.clear();
        assert!(c.is_empty());
        let mut off = SuccessCache::new(0);
        off.insert(k);
        assert!(!off.contains(&k));
    }
}
