//! Attempts that passed the check and whose verdict is not in yet (issue 35, fourth
//! adversarial pass: the limits could be beaten by sending guesses in parallel).
//!
//! Why: a failure is recorded only once its hash or SCRAM proof is judged, so a check that
//! read the failure count alone let every attempt already in flight through: 60 CONNECTs sent
//! at once with wrong passwords got 59 checked guesses plus the right one, where 20 per
//! address and 10 per user were allowed; at the 60 s cap a burst got 42 guesses checked where
//! one per delay is promised. Now the check reserves: each attempt it lets through counts as a
//! possible failure ([`InFlight`]) until its [`Reservation`] is settled (failed, succeeded) or
//! dropped (the client left mid-hash or abandoned its SCRAM exchange: it learnt nothing).
//!
//! Bounded: each key's count is forgotten when it drops to zero, and a table holds at most
//! `login_limit_entries` keys in flight; past that an attempt is refused unchecked (fail
//! closed), which takes more handshakes at once than the connection limits let one host open.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::Instant;

use super::LoginThrottle;

/// How many attempts per key are past the check without a verdict.
#[derive(Debug)]
pub(super) struct InFlight<K> {
    counts: HashMap<K, u32>,
}

impl<K> Default for InFlight<K> {
    fn default() -> InFlight<K> {
        InFlight {
            counts: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash> InFlight<K> {
    /// Attempts of `key` in flight.
    pub(super) fn count<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.counts.get(key).copied().unwrap_or(0)
    }

    /// Whether one more attempt of `key` fits within `capacity` keys.
    pub(super) fn has_room<Q>(&self, key: &Q, capacity: usize) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.counts.len() < capacity || self.counts.contains_key(key)
    }

    /// One more attempt of `key` (the caller asked [`InFlight::has_room`]).
    pub(super) fn reserve<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.counts.get_mut(key) {
            Some(count) => *count = count.saturating_add(1),
            None => {
                self.counts.insert(key.to_owned(), 1);
            }
        }
    }

    /// One attempt of `key` settled; the key is forgotten at zero.
    pub(super) fn release<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(count) = self.counts.get_mut(key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.counts.remove(key);
            }
        }
    }

    /// Keys held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.counts.len()
    }
}

/// How an attempt ended, for [`LoginThrottle::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Judged wrong: counted as a failure.
    Failed,
    /// Judged right: the pair is trusted.
    Succeeded,
    /// Never judged (the client left, no time for a hash, a method that named no user):
    /// only released.
    Abandoned,
}

/// An attempt the failed-login limits let through, counted as in flight until it is settled:
/// [`Reservation::failed`], [`Reservation::succeeded`], or dropped (released uncounted, so a
/// client that leaves mid-hash or mid-exchange frees its place at once).
#[must_use = "a reservation dropped at once releases the attempt it let through"]
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    /// `None` when the limits are off: nothing was reserved.
    held: Option<Held<'a>>,
}

/// What a reservation holds in the throttle's tables.
#[derive(Debug)]
pub(super) struct Held<'a> {
    pub(super) throttle: &'a LoginThrottle,
    pub(super) source: IpAddr,
    pub(super) user: String,
    /// Whether it passed a throttled key as a trusted pair (one such attempt per pair at once).
    pub(super) trusted_pass: bool,
}

impl<'a> Reservation<'a> {
    /// Nothing reserved: the limits are off.
    pub(super) fn none() -> Reservation<'a> {
        Reservation { held: None }
    }

    /// An attempt counted in `held`'s tables.
    pub(super) fn held(held: Held<'a>) -> Reservation<'a> {
        Reservation { held: Some(held) }
    }

    /// The attempt was judged wrong: counted as a failure of its address and user (and the
    /// pair is no longer trusted), as it leaves the in-flight count in the same step.
    pub(crate) fn failed(mut self, now: Instant) {
        if let Some(held) = self.held.take() {
            held.throttle.settle(&held, Outcome::Failed, now);
        }
    }

    /// The attempt was judged right: the pair is trusted from now on.
    pub(crate) fn succeeded(mut self, now: Instant) {
        if let Some(held) = self.held.take() {
            held.throttle.settle(&held, Outcome::Succeeded, now);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.throttle
                .settle(&held, Outcome::Abandoned, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_forgotten_at_zero_and_bounded_by_the_caller() {
        let mut flight = InFlight::<String>::default();
        assert!(flight.has_room("a", 1));
        flight.reserve("a");
        flight.reserve("a");
        assert_eq!(flight.count("a"), 2);
        assert!(flight.has_room("a", 1), "a key already held always fits");
        assert!(!flight.has_room("b", 1), "a new key does not when full");
        flight.release("a");
        flight.release("a");
        flight.release("a");
        assert_eq!(flight.count("a"), 0);
        assert_eq!(flight.len(), 0);
        assert!(flight.has_room("b", 1));
    }
}
