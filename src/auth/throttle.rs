//! Failed-login limits (issue 35, finding 4): a source address (IPv4 address, IPv6 /64, the
//! keys of `connection::slots`) or a user name that keeps failing the password check is
//! refused without a hash for a delay that doubles with each further failure, up to a cap.
//!
//! An attempt inside the delay is answered at once (CONNACK 0x9F Connection rate exceeded,
//! 3.x 3 Server unavailable), not held until the delay ends: holding it would keep a socket,
//! a task and the handshake's deadline busy for the attacker, while an answer costs nothing
//! and tells nothing about the password (it was not checked). Refused attempts do not count
//! as failures, so the delay grows only with guesses actually checked: at the cap, one guess
//! per `login_delay_max_ms` per address and per user. fail2ban bans the same way (failures
//! within a window, then a ban); EMQX's flapping detection bans a client id; Mosquitto has
//! none.
//!
//! The throttle answers before anything looks at the password, the success cache included
//! (issue 35, third adversarial pass): when the cache was asked first, a throttled guesser
//! got a fast yes (remembered) or no (0x9F) at line rate, about 120 guesses/s, and a
//! remembered success cleared the user's record. Devices are not locked out by that order:
//! a (user name, address) pair that proved the credentials before and has not failed since
//! ([`trust`]) passes a throttled user name or address, so a device whose user is attacked
//! from elsewhere, or whose NAT address an attacker shares, still gets in; an attacker at
//! such an address gets one checked guess, whose failure revokes the pair.
//!
//! A success forgets the user's failures only when the last of them came from the same
//! address (a device's own typos), never the address's: otherwise an attacker holding one
//! account could wipe its address's record between guesses at others, and a device
//! reconnecting every few seconds would hand an attacker elsewhere a fresh allowance of
//! guesses at its user each time.
//!
//! The same records count failed SCRAM exchanges (`connection::handshake`): one limit per
//! address and per user, whatever the method guessed through.
//!
//! The check reserves (issue 35, fourth adversarial pass): an attempt it lets through counts
//! as a possible failure until its verdict is in ([`flight`]), so guesses sent in parallel
//! get no more checks than guesses sent one by one: at most the allowance at once, and at the
//! delay, one at a time. A trusted pair passes a throttled key one attempt at a time.
//!
//! Memory is bounded: each table holds at most `login_limit_entries` keys; an entry is
//! forgotten `FORGET_AFTER` (or the cap, if longer) after its last failure, and when a table
//! is full the expired entries go first, then the one whose last failure is oldest. Only
//! checked failures insert, so insertions are bounded by the hash rate. The trusted pairs are
//! bounded by the same number.
//!
//! Must not: answer a throttled attempt from the cache (a yes/no oracle at line rate); hold its
//! lock across an await.

mod flight;
mod trust;

pub(crate) use flight::Reservation;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a key's failures are remembered without a new one, at least (fail2ban's
/// `findtime` is 10 minutes).
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// The limits, from `[auth]` (`login_*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoginLimits {
    /// Failures allowed from one source address before its delays start; 0: no limit.
    pub(crate) per_address: u32,
    /// Failures allowed for one user name before its delays start; 0: no limit.
    pub(crate) per_user: u32,
    /// The first delay; each further failure doubles it.
    pub(crate) delay: Duration,
    /// The longest delay.
    pub(crate) max_delay: Duration,
    /// Keys each table holds at most.
    pub(crate) entries: usize,
}

impl LoginLimits {
    /// No limits (the password store's default until the config's are set).
    pub(crate) const OFF: LoginLimits = LoginLimits {
        per_address: 0,
        per_user: 0,
        delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        entries: 0,
    };

    /// How long after its last failure a key with `failures` stays refused, given `allowed`.
    fn delay_after(&self, failures: u32, allowed: u32) -> Duration {
        if allowed == 0 || failures < allowed {
            return Duration::ZERO;
        }
        let doublings = (failures - allowed).min(31);
        self.delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }

    fn forget_after(&self) -> Duration {
        self.max_delay.max(FORGET_AFTER)
    }
}

/// Which record refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Throttled {
    /// The source address's.
    Address,
    /// The user name's.
    User,
}

impl Throttled {
    /// The `key` label of `postbox_auth_throttled_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Throttled::Address => "address",
            Throttled::User => "user",
        }
    }
}

/// What a key has done lately.
#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    last: Instant,
    /// Where the last failure came from: a success from there may forget a user's failures
    /// (they were its own device's), one from elsewhere may not.
    source: IpAddr,
}

/// One kind of key's records.
#[derive(Debug)]
struct Table<K> {
    map: HashMap<K, Entry>,
    /// Attempts let through and not judged yet: each may be a failure.
    flight: flight::InFlight<K>,
    allowed: u32,
}

impl<K: Eq + Hash + Clone> Table<K> {
    fn new(allowed: u32) -> Table<K> {
        Table {
            map: HashMap::new(),
            flight: flight::InFlight::default(),
            allowed,
        }
    }

    /// Whether `key` must wait: its delay runs, or, with attempts in flight, they would start
    /// it if they all failed now (`failures + in flight >= allowed`).
    fn blocked<Q>(&self, key: &Q, now: Instant, limits: &LoginLimits) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.allowed == 0 {
            return false;
        }
        let entry = self.map.get(key);
        let in_flight = self.flight.count(key);
        if in_flight > 0 {
            let failures = entry
                .filter(|e| now.saturating_duration_since(e.last) < limits.forget_after())
                .map_or(0, |e| e.failures);
            return failures.saturating_add(in_flight) >= self.allowed;
        }
        entry.is_some_and(|e| {
            now.saturating_duration_since(e.last) < limits.delay_after(e.failures, self.allowed)
        })
    }

    /// Whether an attempt of `key` can be counted in flight (always, for an unlimited table:
    /// it counts nothing).
    fn has_room<Q>(&self, key: &Q, limits: &LoginLimits) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.allowed == 0 || self.flight.has_room(key, limits.entries)
    }

    /// Counts an attempt of `key` in flight (nothing for an unlimited table).
    fn reserve<Q>(&mut self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.allowed > 0 {
            self.flight.reserve(key);
        }
    }

    /// Counts a failure from `source`; true when it is the one that starts the key's delays.
    /// Counted also where the table has no limit (`allowed` 0): whether an address failed
    /// lately still orders the password checks ([`LoginThrottle::failed_lately`]; with the
    /// address limit off it had never been known: twenty-sixth adversarial pass, L5).
    fn fail<Q>(&mut self, key: &Q, source: IpAddr, now: Instant, limits: &LoginLimits) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if limits.entries == 0 {
            return false;
        }
        let forget = limits.forget_after();
        if let Some(entry) = self.map.get_mut(key) {
            if now.saturating_duration_since(entry.last) >= forget {
                entry.failures = 0;
            }
            entry.failures = entry.failures.saturating_add(1);
            entry.last = now;
            entry.source = source;
            return entry.failures == self.allowed;
        }
        if self.map.len() >= limits.entries {
            self.map
                .retain(|_, e| now.saturating_duration_since(e.last) < forget);
        }
        if self.map.len() >= limits.entries {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.last)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.map.remove::<K>(&oldest);
            }
        }
        self.map.insert(
            key.to_owned(),
            Entry {
                failures: 1,
                last: now,
                source,
            },
        );
        self.allowed == 1
    }
}

/// The failure records of addresses and user names, and the pairs that may pass them
/// ([`trust`]); asked before every password check (cache and hash) and every SCRAM proof.
#[derive(Debug)]
pub(crate) struct LoginThrottle {
    limits: LoginLimits,
    tables: Mutex<Tables>,
}

/// All records, under one lock: a check reads the three together.
#[derive(Debug)]
struct Tables {
    addresses: Table<IpAddr>,
    users: Table<String>,
    trusted: trust::Trusted,
    /// Addresses whose check was refused unchecked for want of time in the hash queue, and
    /// when last ([`LoginThrottle::suspect`]); at most `entries`, the oldest go first.
    queued_too_many: HashMap<IpAddr, Instant>,
}

impl LoginThrottle {
    /// Records under `limits` (`LoginLimits::OFF`: every check passes, nothing is kept).
    pub(crate) fn new(limits: LoginLimits) -> LoginThrottle {
        LoginThrottle {
            limits,
            tables: Mutex::new(Tables {
                addresses: Table::new(limits.per_address),
                users: Table::new(limits.per_user),
                trusted: trust::Trusted::default(),
                queued_too_many: HashMap::new(),
            }),
        }
    }

    /// Whether an attempt from `source` (a `connection::slots::source_key`) for `user`
    /// may be checked now, or which record refuses it. Asked before anything looks at the
    /// credentials (the success cache included): a refusal must tell nothing about them. A
    /// pair that proved `user`'s credentials from `source` and has not failed since passes,
    /// one attempt at a time.
    ///
    /// The attempt let through is counted in flight until its [`Reservation`] is settled or
    /// dropped: attempts sent in parallel see each other, so no more are checked at once than
    /// the allowance left, and past it one at a time per delay (issue 35, fourth pass).
    pub(crate) fn check(
        &self,
        source: IpAddr,
        user: &str,
        now: Instant,
    ) -> Result<Reservation<'_>, Throttled> {
        if self.off() {
            return Ok(Reservation::none());
        }
        let mut tables = self.tables.lock();
        let refused = if tables.addresses.blocked(&source, now, &self.limits) {
            Some(Throttled::Address)
        } else if tables.users.blocked(user, now, &self.limits) {
            Some(Throttled::User)
        } else {
            None
        };
        if let Some(refused) = refused {
            if !tables.trusted.may_pass(user, source) {
                return Err(refused);
            }
        }
        // More keys in flight than the tables hold: refused unchecked, never uncounted.
        if !tables.addresses.has_room(&source, &self.limits) {
            return Err(Throttled::Address);
        }
        if !tables.users.has_room(user, &self.limits) {
            return Err(Throttled::User);
        }
        let trusted_pass = refused.is_some();
        if trusted_pass {
            tables.trusted.set_passing(user, source, true);
        }
        tables.addresses.reserve(&source);
        tables.users.reserve(user);
        Ok(Reservation::held(flight::Held {
            throttle: self,
            source,
            user: user.to_owned(),
            trusted_pass,
        }))
    }

    /// Whether a check from `source` failed lately (its failures are still remembered):
    /// its next verifications wait behind those of sources that have not
    /// (`auth::password::PasswordStore`'s suspects' places). Known also where the address
    /// limit is off, unless both limits are (nothing is recorded then).
    pub(crate) fn failed_lately(&self, source: IpAddr, now: Instant) -> bool {
        if self.off() {
            return false;
        }
        let forget = self.limits.forget_after();
        let tables = self.tables.lock();
        let failed = tables
            .addresses
            .map
            .get(&source)
            .is_some_and(|e| e.failures > 0 && now.saturating_duration_since(e.last) < forget);
        failed
            || tables
                .queued_too_many
                .get(&source)
                .is_some_and(|last| now.saturating_duration_since(*last) < forget)
    }

    /// `source`'s check found no room in the hash queue (answered busy, unhashed): its next
    /// ones wait behind those of addresses that have not failed either, as a failure's would
    /// ([`LoginThrottle::failed_lately`]). A busy answer cost a flood from fresh addresses
    /// nothing, and kept every first login out for as long as fresh addresses lasted
    /// (twenty-seventh adversarial pass, M2); now each address gets one such answer per
    /// forget time before it queues with the suspects. Not a failure: it starts no delay.
    pub(crate) fn suspect(&self, source: IpAddr, now: Instant) {
        if self.off() {
            return;
        }
        let forget = self.limits.forget_after();
        let mut tables = self.tables.lock();
        let marks = &mut tables.queued_too_many;
        if marks.len() >= self.limits.entries && !marks.contains_key(&source) {
            marks.retain(|_, last| now.saturating_duration_since(*last) < forget);
            if marks.len() >= self.limits.entries {
                let oldest = marks.iter().min_by_key(|(_, last)| **last).map(|(a, _)| *a);
                if let Some(oldest) = oldest {
                    marks.remove(&oldest);
                }
            }
        }
        marks.insert(source, now);
    }

    /// Settles a reservation: its attempt leaves the in-flight counts and, in the same step,
    /// is counted as a failure or a success (`outcome`), so no check sees it twice or not at
    /// all. A failure logs (WARN) each record whose delays it starts: once per address or
    /// user, not per refused attempt.
    fn settle(&self, held: &flight::Held<'_>, outcome: flight::Outcome, now: Instant) {
        let (source, user) = (held.source, held.user.as_str());
        let (address_starts, user_starts) = {
            let mut tables = self.tables.lock();
            tables.addresses.flight.release(&source);
            tables.users.flight.release(user);
            if held.trusted_pass {
                tables.trusted.set_passing(user, source, false);
            }
            match outcome {
                flight::Outcome::Failed => self.count_failure(&mut tables, source, user, now),
                flight::Outcome::Succeeded => {
                    self.count_success(&mut tables, source, user, now);
                    (false, false)
                }
                flight::Outcome::Abandoned => (false, false),
            }
        };
        let delay_ms = u64::try_from(self.limits.delay.as_millis()).unwrap_or(u64::MAX);
        if address_starts {
            let failures = self.limits.per_address;
            tracing::warn!(%source, failures, delay_ms, "failed logins: address throttled, its next attempts refused unchecked until a delay passes");
        }
        if user_starts {
            let failures = self.limits.per_user;
            tracing::warn!(username = user, failures, delay_ms, "failed logins: user throttled, its next attempts refused unchecked until a delay passes");
        }
    }

    /// Counts a checked failure and revokes the pair's trust; which records it starts the
    /// delays of (address, user).
    fn count_failure(
        &self,
        tables: &mut Tables,
        source: IpAddr,
        user: &str,
        now: Instant,
    ) -> (bool, bool) {
        tables.trusted.revoke(user, source);
        let address = tables.addresses.fail(&source, source, now, &self.limits);
        let user = tables.users.fail(user, source, now, &self.limits);
        (address, user)
    }

    /// A checked success: the pair is trusted from now on; the user's failures are forgotten
    /// only when the last one came from `source` (its own device's typos), its address's never.
    fn count_success(&self, tables: &mut Tables, source: IpAddr, user: &str, now: Instant) {
        tables
            .trusted
            .insert(user, source, now, self.limits.entries);
        if tables
            .users
            .map
            .get(user)
            .is_some_and(|entry| entry.source == source)
        {
            tables.users.map.remove(user);
        }
    }

    /// A checked success (hashed, remembered, or a SCRAM proof) for `user` from `source` that
    /// holds no reservation: an enhanced-authentication method that names its user only when
    /// it succeeds (`Authenticator::claimed_user` is `None`).
    pub(crate) fn succeeded(&self, source: IpAddr, user: &str, now: Instant) {
        if self.off() {
            return;
        }
        let mut tables = self.tables.lock();
        self.count_success(&mut tables, source, user, now);
    }

    /// A checked failure without a reservation (the tests' shorthand for check + fail).
    #[cfg(test)]
    fn failed(&self, source: IpAddr, user: &str, now: Instant) {
        if self.off() {
            return;
        }
        let held = flight::Held {
            throttle: self,
            source,
            user: user.to_owned(),
            trusted_pass: false,
        };
        self.settle(&held, flight::Outcome::Failed, now);
    }

    /// Keys held, addresses and users.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let tables = self.tables.lock();
        (tables.addresses.map.len(), tables.users.map.len())
    }

    fn off(&self) -> bool {
        (self.limits.per_address == 0 && self.limits.per_user == 0) || self.limits.entries == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_address: u32, per_user: u32, entries: usize) -> LoginLimits {
        LoginLimits {
            per_address,
            per_user,
            delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(8),
            entries,
        }
    }

    /// A check whose attempt is released at once (never judged).
    fn ask(t: &LoginThrottle, source: IpAddr, user: &str, now: Instant) -> Result<(), Throttled> {
        t.check(source, user, now).map(drop)
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn delays_start_after_the_allowed_failures_double_and_stop_at_the_cap() {
        let t = LoginThrottle::new(limits(3, 0, 100));
        let start = Instant::now();
        for _ in 0..2 {
            t.failed(A, "u", start);
            assert_eq!(ask(&t, A, "u", start), Ok(()));
        }
        t.failed(A, "u", start);
        assert_eq!(ask(&t, A, "u", start), Err(Throttled::Address));
        assert_eq!(ask(&t, B, "u", start), Ok(()), "other addresses go on");
        let s = Duration::from_secs;
        assert_eq!(ask(&t, A, "u", start + s(1)), Ok(()), "first delay: 1 s");
        // Each further checked failure doubles the delay: 2, 4, 8, then the 8 s cap.
        let mut now = start + s(1);
        for delay in [2, 4, 8, 8, 8] {
            t.failed(A, "u", now);
            assert_eq!(
                ask(&t, A, "u", now + s(delay) - Duration::from_millis(1)),
                Err(Throttled::Address)
            );
            assert_eq!(ask(&t, A, "u", now + s(delay)), Ok(()));
            now += s(delay);
        }
        // Forgotten after FORGET_AFTER without a failure: the allowance is back.
        let later = now + FORGET_AFTER;
        t.failed(A, "u", later);
        assert_eq!(ask(&t, A, "u", later), Ok(()));
    }

    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 3));

    #[test]
    fn a_user_is_throttled_from_every_address_and_its_own_success_clears_it() {
        let t = LoginThrottle::new(limits(0, 2, 100));
        let now = Instant::now();
        t.failed(A, "alice", now);
        t.failed(B, "alice", now);
        assert_eq!(ask(&t, B, "alice", now), Err(Throttled::User));
        assert_eq!(ask(&t, B, "bob", now), Ok(()));
        // The last failure came from B: a success from B (its typos) clears the user.
        t.succeeded(B, "alice", now);
        assert_eq!(ask(&t, A, "alice", now), Ok(()));
    }

    #[test]
    fn a_success_does_not_clear_its_address() {
        let t = LoginThrottle::new(limits(1, 0, 100));
        let now = Instant::now();
        t.failed(A, "alice", now);
        t.succeeded(A, "mallory", now);
        assert_eq!(ask(&t, A, "alice", now), Err(Throttled::Address));
    }

    /// Twenty-sixth adversarial pass, L5: whether an address failed lately orders the
    /// password checks (suspects wait behind the others), also where the address limit is
    /// off; it never refuses there. Both limits off: nothing is recorded.
    #[test]
    fn an_address_that_failed_is_known_with_its_limit_off() {
        let t = LoginThrottle::new(limits(0, 5, 100));
        let now = Instant::now();
        assert!(!t.failed_lately(A, now));
        t.failed(A, "alice", now);
        assert!(t.failed_lately(A, now), "known");
        assert!(!t.failed_lately(B, now));
        assert_eq!(ask(&t, A, "bob", now), Ok(()), "and not refused");
        let later = now + FORGET_AFTER + Duration::from_secs(9);
        assert!(!t.failed_lately(A, later), "forgotten");
        let off = LoginThrottle::new(limits(0, 0, 100));
        off.failed(A, "alice", now);
        assert!(!off.failed_lately(A, now));
    }

    /// Twenty-seventh adversarial pass, M2: an address whose check found no room in the hash
    /// queue counts with those that failed lately (for the order of checks only: it is not
    /// refused), and the marks stay within `entries`.
    #[test]
    fn an_address_answered_busy_is_a_suspect_not_a_failure() {
        let t = LoginThrottle::new(limits(1, 5, 2));
        let now = Instant::now();
        t.suspect(A, now);
        assert!(t.failed_lately(A, now));
        assert_eq!(ask(&t, A, "alice", now), Ok(()), "not refused");
        for last in 10..20u8 {
            t.suspect(IpAddr::from([192, 0, 2, last]), now);
        }
        assert_eq!(t.tables.lock().queued_too_many.len(), 2, "bounded");
    }

    /// Third adversarial pass: a device's success must not hand an attacker elsewhere a fresh
    /// allowance of guesses at its user.
    #[test]
    fn a_success_elsewhere_does_not_clear_the_attackers_failures() {
        let t = LoginThrottle::new(limits(0, 2, 100));
        let now = Instant::now();
        t.failed(A, "alice", now);
        t.failed(A, "alice", now);
        t.succeeded(B, "alice", now);
        assert_eq!(ask(&t, C, "alice", now), Err(Throttled::User));
        assert_eq!(ask(&t, A, "alice", now), Err(Throttled::User));
    }

    /// Third adversarial pass: the pair that proved the credentials passes a throttled user
    /// or address; nobody else does, and a failure revokes the pair.
    #[test]
    fn a_trusted_pair_passes_until_it_fails() {
        let t = LoginThrottle::new(limits(2, 2, 100));
        let now = Instant::now();
        t.succeeded(B, "alice", now);
        // Attacked from A: the user and A are throttled.
        t.failed(A, "alice", now);
        t.failed(A, "alice", now);
        assert_eq!(ask(&t, A, "alice", now), Err(Throttled::Address));
        assert_eq!(ask(&t, C, "alice", now), Err(Throttled::User));
        assert_eq!(ask(&t, B, "alice", now), Ok(()), "the device's own pair");
        // Behind A, a device of bob that succeeded there passes A's throttle.
        t.succeeded(A, "bob", now);
        assert_eq!(ask(&t, A, "bob", now), Ok(()));
        assert_eq!(ask(&t, A, "carol", now), Err(Throttled::Address));
        // A guess from a trusted pair is checked once; its failure revokes the pair.
        t.failed(A, "bob", now);
        assert_eq!(ask(&t, A, "bob", now), Err(Throttled::Address));
        t.failed(B, "alice", now);
        assert_eq!(ask(&t, B, "alice", now), Err(Throttled::User));
    }

    #[test]
    fn tables_stay_within_their_bound() {
        let t = LoginThrottle::new(limits(5, 5, 64));
        let now = Instant::now();
        for i in 0..10_000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(i));
            t.failed(
                ip,
                &format!("user{i}"),
                now + Duration::from_millis(u64::from(i)),
            );
        }
        assert_eq!(t.len(), (64, 64));
        // The newest keys are the ones kept.
        let newest = IpAddr::V4(std::net::Ipv4Addr::from(9_999u32));
        assert!(t.tables.lock().addresses.map.contains_key(&newest));
    }

    #[test]
    fn off_keeps_nothing() {
        let t = LoginThrottle::new(LoginLimits::OFF);
        let now = Instant::now();
        for _ in 0..100 {
            t.failed(A, "u", now);
        }
        assert_eq!(ask(&t, A, "u", now), Ok(()));
        assert_eq!(t.len(), (0, 0));
    }

    /// Issue 35, fourth adversarial pass: attempts in flight count as possible failures, so
    /// a burst gets no more checks than the allowance, and the rest are refused unchecked.
    #[test]
    fn attempts_in_flight_count_against_the_allowance() {
        let t = LoginThrottle::new(limits(3, 0, 100));
        let now = Instant::now();
        // The burst's attempts name other users than the later asks (`v`): the success
        // below trusts its pair (`u0`, A), which would pass a throttled address once.
        let held: Vec<_> = (0..3)
            .map(|i| {
                t.check(A, &format!("u{i}"), now)
                    .expect("within the allowance")
            })
            .collect();
        assert_eq!(ask(&t, A, "v", now), Err(Throttled::Address), "a burst");
        assert_eq!(ask(&t, B, "v", now), Ok(()), "other addresses go on");
        // One settled as a success (not counted): its place is free again.
        let mut held = held.into_iter();
        held.next().expect("three").succeeded(now);
        let fourth = t.check(A, "v", now).expect("a place was freed");
        assert_eq!(ask(&t, A, "v", now), Err(Throttled::Address));
        // Failures take the places of their attempts; dropped ones free theirs uncounted.
        for reservation in held {
            reservation.failed(now);
        }
        assert_eq!(
            ask(&t, A, "v", now),
            Err(Throttled::Address),
            "two failures and one in flight"
        );
        drop(fourth);
        assert_eq!(ask(&t, A, "v", now), Ok(()));
        let last = t.check(A, "v", now).expect("third attempt");
        last.failed(now);
        assert_eq!(ask(&t, A, "v", now), Err(Throttled::Address));
        // Past the delay, one attempt at a time: the next waits for its verdict.
        let later = now + Duration::from_secs(1);
        let one = t.check(A, "v", later).expect("the delay passed");
        assert_eq!(ask(&t, A, "v", later), Err(Throttled::Address));
        one.failed(later);
        assert_eq!(
            ask(&t, A, "v", later + Duration::from_millis(1999)),
            Err(Throttled::Address),
            "its failure doubled the delay"
        );
        assert_eq!(
            t.tables.lock().addresses.flight.len(),
            0,
            "nothing left held"
        );
    }

    /// A user's in-flight attempts count from every address; a trusted pair passes one at a
    /// time, and a remembered success frees its pass at once.
    #[test]
    fn a_trusted_pair_passes_a_busy_key_one_attempt_at_a_time() {
        let t = LoginThrottle::new(limits(0, 2, 100));
        let now = Instant::now();
        t.succeeded(B, "alice", now);
        let held = [
            t.check(A, "alice", now).expect("first"),
            t.check(C, "alice", now).expect("second"),
        ];
        assert_eq!(ask(&t, C, "alice", now), Err(Throttled::User));
        // The device's pair: a remembered password settles at once, again and again.
        for _ in 0..3 {
            t.check(B, "alice", now).expect("trusted").succeeded(now);
        }
        // A pair's attempt still being judged holds its pass.
        let hashing = t.check(B, "alice", now).expect("trusted");
        assert_eq!(ask(&t, B, "alice", now), Err(Throttled::User));
        hashing.failed(now);
        assert_eq!(ask(&t, B, "alice", now), Err(Throttled::User), "revoked");
        drop(held);
        assert_eq!(t.tables.lock().users.flight.len(), 0);
    }

    /// In-flight keys are bounded by `login_limit_entries`; past it attempts are refused
    /// unchecked (fail closed), and released keys make room again.
    #[test]
    fn keys_in_flight_are_bounded() {
        let t = LoginThrottle::new(limits(5, 5, 4));
        let now = Instant::now();
        let ip = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(i));
        let held: Vec<_> = (0..4)
            .map(|i| t.check(ip(i), &format!("u{i}"), now).expect("room"))
            .collect();
        assert_eq!(ask(&t, ip(9), "u0", now), Err(Throttled::Address));
        assert_eq!(ask(&t, ip(0), "u9", now), Err(Throttled::User));
        assert_eq!(ask(&t, ip(0), "u0", now), Ok(()), "keys held fit");
        drop(held);
        assert_eq!(ask(&t, ip(9), "u9", now), Ok(()));
        let tables = t.tables.lock();
        assert_eq!(
            (tables.addresses.flight.len(), tables.users.flight.len()),
            (0, 0)
        );
    }
}
