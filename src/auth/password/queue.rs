//! How many password checks may wait for a hash worker: as many as the workers can start
//! before the checks' deadlines (`mqtt.connect_timeout`), at most [`MAX_WAITING`]; a check
//! past that is answered at once (`Verdict::Busy`, CONNACK 0x89 Server busy), not queued to
//! time out.
//!
//! Why: each waiting check is a handshake holding its decoded CONNECT, a task and a socket.
//! Nothing bounded their number but file descriptors: 5,080 from 254 addresses held 446 MB
//! (issue 35, twenty-fifth adversarial pass, K1). Holding a listener's pending slot instead
//! bounded them, but strangers fill those with silent sockets, and then every login whose
//! password was not remembered was refused (twenty-sixth pass, L1). This bound is reached
//! only by checks that do reach the password store, each costing its sender a CONNECT, and
//! those of addresses that failed lately ([`HashQueue::enter`]'s `suspect`) count apart, so
//! they cannot fill the place of those that have not. Only checks that hold their address's
//! place count in a class: one address's flood waits in its own share, not in the places of
//! every other address's logins.
//!
//! Must not: hold a lock; be touched by a check answered without a hash (the success cache,
//! the throttle).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Checks waiting for a worker at most, whatever the workers' pace: about 10 KiB of
/// handshake each (its CONNECT within `partial::CONNECT_ALLOWANCE`, the task, the socket).
pub(super) const MAX_WAITING: usize = 1024;

/// What a check is assumed to take at least when none has been timed yet.
const LEAST_HASH: Duration = Duration::from_millis(1);

/// The checks waiting for a hash worker: all of them, and those that hold their address's
/// place ([`super::share`]) by class.
#[derive(Debug, Default)]
pub(super) struct HashQueue {
    /// Every check waiting, for its address's place or for a worker.
    all: AtomicUsize,
    /// Checks of addresses that have not failed lately, holding their address's place.
    clean: AtomicUsize,
    /// Checks of addresses that have, holding their address's place.
    suspect: AtomicUsize,
}

/// A check's place in the [`HashQueue`], given back when dropped (it got its worker, or it
/// ended).
#[derive(Debug)]
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many checks `places` workers start within `time_left` at `per_check` each.
pub(super) fn in_time(places: usize, per_check: Duration, time_left: Duration) -> usize {
    let per_check = per_check.max(LEAST_HASH).as_nanos();
    let rounds = usize::try_from(time_left.as_nanos() / per_check).unwrap_or(usize::MAX);
    rounds.saturating_mul(places)
}

impl HashQueue {
    /// A place among all the checks waiting, fewer than [`MAX_WAITING`]; `None` otherwise.
    pub(super) fn arrive(&self) -> Option<Waiting<'_>> {
        self.all
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_WAITING).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(&self.all))
    }

    /// A place for a check that holds its address's place and that `places` workers serve
    /// (all of them for a check of an address that has not failed lately; the suspects'
    /// places for one that has), when fewer of its class wait than those workers can start
    /// within `time_left` at `per_check` each; `None` otherwise.
    pub(super) fn enter(
        &self,
        suspect: bool,
        places: usize,
        per_check: Duration,
        time_left: Duration,
    ) -> Option<Waiting<'_>> {
        let counter = if suspect { &self.suspect } else { &self.clean };
        let bound = in_time(places, per_check, time_left).min(MAX_WAITING);
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < bound).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(counter))
    }

    /// Checks waiting now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.all.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// Two workers at 100 ms a check start 40 checks in 2 s: a 41st waiting of its class is
    /// not let in, a suspect's is (its class counts apart), and a place given back lets
    /// the next in. At most [`MAX_WAITING`] wait in all, however fast the hashes.
    #[test]
    fn a_class_waits_only_as_many_as_can_be_checked_in_time() {
        let queue = HashQueue::default();
        let tenth = Duration::from_millis(100);
        assert_eq!(in_time(2, tenth, 2 * SECOND), 40);
        let mut clean: Vec<_> = (0..40)
            .map(|_| queue.enter(false, 2, tenth, 2 * SECOND).expect("in time"))
            .collect();
        assert!(queue.enter(false, 2, tenth, 2 * SECOND).is_none());
        let suspect = queue
            .enter(true, 1, tenth, 2 * SECOND)
            .expect("its own class");
        drop(clean.pop());
        assert!(queue.enter(false, 2, tenth, 2 * SECOND).is_some());
        drop(suspect);
        assert!(
            HashQueue::default()
                .enter(false, 2, SECOND, Duration::from_millis(999))
                .is_none(),
            "no check can start in time"
        );

        let all = HashQueue::default();
        let held: Vec<_> = (0..MAX_WAITING)
            .map(|_| all.arrive().expect("room"))
            .collect();
        assert!(all.arrive().is_none(), "at most MAX_WAITING in all");
        assert_eq!(all.waiting(), MAX_WAITING);
        drop(held);
        assert_eq!(all.waiting(), 0, "places given back when dropped");
    }
}
