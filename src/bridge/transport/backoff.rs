//! [`Backoff`]: how long a bridge waits before its next connect cycle.
//!
//! Mosquitto 2.1's `restart_timeout base cap`, which is AWS's "Decorrelated Jitter"
//! (mosquitto.conf(5); `bridge__backoff_step` in Mosquitto's `src/bridge.c`):
//! `delay = min(cap, random_between(base, previous * 3))`, starting from `previous = base`,
//! back to `base` once a connection worked. Chosen over "full jitter" (`random(0, base·2ⁿ)`)
//! because it is what Mosquitto users configure today (the numbers mean the same here), it
//! never waits less than `base` (full jitter can retry at once, which a fleet of gateways
//! reconnecting to a cloud broker after its outage should not), and it still spreads those
//! gateways apart.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The shortest delay, whatever `base` says: a bridge never retries in a busy loop.
pub(super) const MIN_DELAY: Duration = Duration::from_millis(100);

/// The reconnect delay of one bridge: grows with jitter from `base` to `cap` while connects
/// fail, [`Backoff::reset`] once one worked.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    /// The last delay handed out (`base` after a reset).
    previous: Duration,
    rng: StdRng,
}

impl Backoff {
    /// A backoff from `base` to `cap` (Mosquitto's `restart_timeout base cap`), seeded from
    /// the OS so bridges of many gateways do not move in step. A `base` under 100 ms is
    /// taken as 100 ms, a `cap` under `base` as `base` (a constant delay, like Mosquitto's
    /// one-number `restart_timeout`).
    pub(crate) fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff::with_seed(base, cap, rand::random())
    }

    /// [`Backoff::new`] with a fixed seed: the same seed gives the same delays (tests).
    pub(crate) fn with_seed(base: Duration, cap: Duration, seed: u64) -> Backoff {
        let base = base.max(MIN_DELAY);
        let cap = cap.max(base);
        Backoff {
            base,
            cap,
            previous: base,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The wait before the next connect cycle: random in `[base, 3 × previous)`, at most
    /// `cap`; never below `base` (so never 0).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let low = self.base.as_nanos();
        let high = self.previous.saturating_mul(3).as_nanos();
        let drawn = if high > low {
            // Nanoseconds of any delay a config can express fit in u64 (584 years).
            let low = u64::try_from(low).unwrap_or(u64::MAX);
            let high = u64::try_from(high).unwrap_or(u64::MAX);
            Duration::from_nanos(self.rng.random_range(low..high))
        } else {
            self.base
        };
        let delay = drawn.clamp(self.base, self.cap);
        self.previous = delay;
        delay
    }

    /// Back to `base`: call once a connection worked (Mosquitto resets at CONNACK), so the
    /// next outage starts with short waits again.
    pub(crate) fn reset(&mut self) {
        self.previous = self.base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(5);
    const CAP: Duration = Duration::from_secs(30);

    #[test]
    fn delays_stay_between_base_and_cap() {
        for seed in 0..50 {
            let mut backoff = Backoff::with_seed(BASE, CAP, seed);
            for _ in 0..200 {
                let delay = backoff.next_delay();
                assert!((BASE..=CAP).contains(&delay), "seed {seed}: {delay:?}");
            }
        }
    }

    #[test]
    fn never_zero_and_cap_below_base_is_a_constant() {
        let mut zero = Backoff::with_seed(Duration::ZERO, Duration::ZERO, 1);
        let mut inverted = Backoff::with_seed(Duration::from_secs(3), Duration::from_secs(1), 1);
        for _ in 0..100 {
            assert_eq!(zero.next_delay(), MIN_DELAY);
            assert_eq!(inverted.next_delay(), Duration::from_secs(3));
        }
    }

    #[test]
    fn delays_grow_to_the_cap() {
        // Decorrelated jitter triples the upper bound per step: from 5 s the cap of 30 s is
        // within reach after two steps, and reached (clamped) with probability ~1/2 per step
        // from there. Early delays are short on average, late ones near the cap.
        let (mut early, mut late) = (Duration::ZERO, Duration::ZERO);
        for seed in 0..100 {
            let mut backoff = Backoff::with_seed(BASE, CAP, seed);
            let delays: Vec<Duration> = (0..30).map(|_| backoff.next_delay()).collect();
            assert!(
                delays[0] < BASE * 3,
                "seed {seed}: first delay {:?}",
                delays[0]
            );
            assert!(
                delays.contains(&CAP),
                "seed {seed}: never reached the cap: {delays:?}"
            );
            early += delays[0];
            late += delays[20..].iter().sum::<Duration>() / 10;
        }
        assert!(
            early * 2 < late,
            "no growth: first {early:?}, late {late:?} (sums of 100)"
        );
    }

    #[test]
    fn reset_starts_over_from_base() {
        let mut backoff = Backoff::with_seed(BASE, CAP, 7);
        for _ in 0..30 {
            backoff.next_delay();
        }
        backoff.reset();
        let delay = backoff.next_delay();
        assert!(delay >= BASE && delay < BASE * 3, "{delay:?}");
    }

    #[test]
    fn same_seed_same_delays_and_jitter_between_seeds() {
        let run = |seed| {
            let mut backoff = Backoff::with_seed(BASE, CAP, seed);
            (0..10).map(|_| backoff.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43), "no jitter between seeds");
        let firsts: std::collections::HashSet<Duration> =
            (0..20).map(|seed| run(seed)[0]).collect();
        assert!(firsts.len() > 10, "first delays not spread: {firsts:?}");
    }
}
