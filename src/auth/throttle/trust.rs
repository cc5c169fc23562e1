//! The (user name, source address) pairs that proved a user's credentials and have not failed
//! for that user since: the one way past a throttled user name or address (issue 35, the
//! third adversarial pass).
//!
//! Why pairs, and why a failure revokes one: before, the password cache was asked before the
//! throttle, so a throttled guesser got a fast yes (a remembered password) or no (0x9F) at
//! line rate, about 120 guesses/s. The throttle must answer first, and say nothing about the
//! password. But a device whose user name is attacked from elsewhere must still get in, and
//! devices behind a NAT address an attacker shares must not all be locked out. So the
//! throttle lets through only a pair that has succeeded before: an attacker elsewhere never
//! holds one (it would need the password), and one sharing the device's address gets one
//! checked guess, whose failure revokes the pair. A right guess gets in, as it would without
//! any throttle; a wrong one tells only what one checked guess tells.
//!
//! What it costs: behind one address, an attacker guessing one particular user's password
//! keeps that user's devices at that address waiting for the throttle's delay (as any
//! throttled address does); devices of other users there keep their pairs.
//!
//! Bounded: at most `capacity` pairs (`login_limit_entries`); when full the oldest eighth goes
//! at once, so a full table costs one scan per `capacity / 8` new pairs, not one per login.
//! Only successes insert, so insertions are bounded by the rate of right passwords.
//!
//! One attempt at a time (issue 35, fourth adversarial pass): a failure revokes the pair only
//! once it is judged, so guesses sent in parallel from the pair would all pass before the
//! first revoked it. A pair passes a throttled key with one attempt in flight at most
//! ([`Pair::passing`]); a device's remembered password is answered at once and frees the
//! pass in the same step, so only an attempt still being hashed holds it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// One trusted pair.
#[derive(Debug, Clone, Copy)]
struct Pair {
    /// When it last succeeded (the oldest go first when the table is full).
    last: Instant,
    /// Whether an attempt of the pair is past a throttled key now, not judged yet: a second
    /// one waits for its verdict (a failure revokes the pair).
    passing: bool,
}

/// The pairs, by user name, with when each last succeeded.
#[derive(Debug, Default)]
pub(super) struct Trusted {
    users: HashMap<String, HashMap<IpAddr, Pair>>,
    /// Pairs held, over all users.
    pairs: usize,
}

impl Trusted {
    /// Whether `source` proved `user`'s credentials and has not failed for it since.
    #[cfg(test)]
    pub(super) fn contains(&self, user: &str, source: IpAddr) -> bool {
        self.users
            .get(user)
            .is_some_and(|sources| sources.contains_key(&source))
    }

    /// Whether an attempt of `user` from `source` may pass a throttled key now: the pair is
    /// trusted and no other attempt of it is passing.
    pub(super) fn may_pass(&self, user: &str, source: IpAddr) -> bool {
        self.users
            .get(user)
            .and_then(|sources| sources.get(&source))
            .is_some_and(|pair| !pair.passing)
    }

    /// Marks an attempt of the pair as passing a throttled key (`true`), or its end (`false`;
    /// nothing when the pair was revoked or evicted meanwhile).
    pub(super) fn set_passing(&mut self, user: &str, source: IpAddr, passing: bool) {
        if let Some(pair) = self
            .users
            .get_mut(user)
            .and_then(|sources| sources.get_mut(&source))
        {
            pair.passing = passing;
        }
    }

    /// A success of `user` from `source` at `now`; at most `capacity` pairs are kept.
    pub(super) fn insert(&mut self, user: &str, source: IpAddr, now: Instant, capacity: usize) {
        if capacity == 0 {
            return;
        }
        if let Some(pair) = self
            .users
            .get_mut(user)
            .and_then(|sources| sources.get_mut(&source))
        {
            pair.last = now;
            return;
        }
        if self.pairs >= capacity {
            self.evict_oldest(capacity);
        }
        self.users.entry(user.to_owned()).or_default().insert(
            source,
            Pair {
                last: now,
                passing: false,
            },
        );
        self.pairs += 1;
    }

    /// A failure of `user` from `source`: the pair is no longer trusted.
    pub(super) fn revoke(&mut self, user: &str, source: IpAddr) {
        let Some(sources) = self.users.get_mut(user) else {
            return;
        };
        if sources.remove(&source).is_some() {
            self.pairs -= 1;
        }
        if sources.is_empty() {
            self.users.remove(user);
        }
    }

    /// Pairs held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pairs
    }

    /// Drops the oldest eighth of `capacity` (at least one pair).
    fn evict_oldest(&mut self, capacity: usize) {
        let drop = (capacity / 8).max(1);
        let mut ages: Vec<Instant> = self
            .users
            .values()
            .flat_map(|s| s.values())
            .map(|pair| pair.last)
            .collect();
        if ages.is_empty() {
            return;
        }
        let nth = drop.min(ages.len()) - 1;
        let (_, cutoff, _) = ages.select_nth_unstable(nth);
        let cutoff = *cutoff;
        let mut left = drop;
        self.users.retain(|_, sources| {
            sources.retain(|_, pair| {
                // Ties at the cutoff: only as many as needed go.
                if pair.last <= cutoff && left > 0 {
                    left -= 1;
                    return false;
                }
                true
            });
            !sources.is_empty()
        });
        self.pairs = self.users.values().map(HashMap::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    fn ip(i: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(i))
    }

    #[test]
    fn pairs_are_trusted_until_revoked() {
        let mut t = Trusted::default();
        let now = Instant::now();
        t.insert("alice", ip(1), now, 16);
        assert!(t.contains("alice", ip(1)));
        assert!(!t.contains("alice", ip(2)), "another address");
        assert!(!t.contains("bob", ip(1)), "another user");
        t.insert("alice", ip(1), now, 16);
        assert_eq!(t.len(), 1, "a refresh is not a new pair");
        t.revoke("alice", ip(1));
        assert!(!t.contains("alice", ip(1)));
        assert_eq!(t.len(), 0);
        t.revoke("alice", ip(1));
        assert_eq!(t.len(), 0, "revoking twice is harmless");
    }

    #[test]
    fn a_pair_passes_one_attempt_at_a_time() {
        let mut t = Trusted::default();
        let now = Instant::now();
        assert!(!t.may_pass("alice", ip(1)), "not trusted");
        t.insert("alice", ip(1), now, 16);
        assert!(t.may_pass("alice", ip(1)));
        t.set_passing("alice", ip(1), true);
        assert!(!t.may_pass("alice", ip(1)), "one attempt in flight");
        t.insert("alice", ip(1), now, 16);
        assert!(
            !t.may_pass("alice", ip(1)),
            "a refresh keeps the pass taken"
        );
        t.set_passing("alice", ip(1), false);
        assert!(t.may_pass("alice", ip(1)));
        t.revoke("alice", ip(1));
        t.set_passing("alice", ip(1), false);
        assert!(
            !t.may_pass("alice", ip(1)),
            "a revoked pair is not brought back"
        );
    }

    #[test]
    fn the_table_stays_within_its_bound_and_keeps_the_newest() {
        let mut t = Trusted::default();
        let start = Instant::now();
        for i in 0..10_000u32 {
            let now = start + Duration::from_millis(u64::from(i));
            // One shared user name from many addresses, and many user names.
            t.insert("fleet", ip(i), now, 64);
            t.insert(&format!("device{i}"), ip(i), now, 64);
            assert!(t.len() <= 64);
        }
        assert!(t.contains("fleet", ip(9_999)));
        assert!(t.contains("device9999", ip(9_999)));
        assert!(!t.contains("fleet", ip(0)));
        t.insert("x", ip(1), start, 0);
        assert!(!t.contains("x", ip(1)), "capacity 0 keeps nothing");
    }
}
