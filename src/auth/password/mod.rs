//! Password-file authentication (`auth.password_file`), in the `mosquitto_passwd` format so
//! existing files work unchanged.
//!
//! [`PasswordStore`] holds the parsed file and checks a CONNECT's user name and password:
//! hashing runs on tokio's blocking pool, at most one hash per CPU at a time (a semaphore:
//! an argon2id hash may take tens of MiB), so it never stalls the runtime or other clients'
//! traffic. Recent successes are remembered ([`cache`]), so a reconnect storm of a fleet whose
//! passwords were just checked does not queue behind key derivation. SIGHUP re-reads the file
//! ([`crate::reload::Reload`]); a bad file keeps the old one.
//!
//! Under a flood (issue 35, finding 4): an address or user name that keeps failing is refused
//! unhashed for a growing delay (`auth::throttle`), one address holds at most its share of
//! the hash workers ([`share`]), and a verification whose client left while it waited is
//! dropped before its hash (the handshake drops the future; counted as skipped).
//!
//! Layout: `hash` reads, verifies and creates one hash; `file` reads and edits the file's
//! lines; `cache` is the success cache; `share` each address's share of the workers; this
//! file ties them together.
//!
//! Must not: hash on the async runtime; log or keep a password; echo a hash in an error.

pub(crate) mod cache;
pub mod file;
pub(crate) mod hash;
mod queue;
mod share;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Semaphore;

pub(crate) use file::Users;
pub use hash::{PasswordHash, DEFAULT_PBKDF2_ITERATIONS};

use crate::auth::credential_file::CredentialFileError;
use crate::auth::throttle::{LoginLimits, LoginThrottle, Throttled};
use crate::metrics::Counter;
use cache::SuccessCache;
use share::HashShares;

/// The `reason` of `postbox_auth_failures_total` for a wrong password and an unknown user
/// alike (the same word as `postbox_connack_refusals_total`'s).
pub(crate) const BAD_CREDENTIALS: &str = "bad_credentials";

/// The outcome of a password check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// User known, password right.
    Ok,
    /// User known, password wrong.
    BadPassword,
    /// No such user in the file.
    UnknownUser,
    /// Not checked: the handshake's deadline would pass before a hash could finish.
    NoTime,
    /// Not checked: the source address or the user name failed too often lately
    /// (`auth::throttle`); answered CONNACK 0x9F Connection rate exceeded (3.x: 3).
    Throttled,
    /// Not checked: more checks wait for a hash than the workers can start before their
    /// deadlines ([`queue`]); answered CONNACK 0x89 Server busy (3.x: 3).
    Busy,
}

impl Verdict {
    /// The `reason` of the log line (the metric joins `bad_password` and `unknown_user` into
    /// [`BAD_CREDENTIALS`]).
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::BadPassword => "bad_password",
            Verdict::UnknownUser => "unknown_user",
            Verdict::NoTime => "no_time",
            Verdict::Throttled => "throttled",
            Verdict::Busy => "busy",
        }
    }
}

/// The file as loaded, with the generation that keys the cache.
#[derive(Debug)]
struct Loaded {
    users: Users,
    generation: u64,
}

/// Metric handles, registered once.
#[derive(Debug, Clone)]
pub struct AuthMetrics {
    /// Refused: wrong password or unknown user, one series for both. `/metrics` is open to
    /// any peer, so two series would tell real user names from unknown ones (issue 35, sixth
    /// adversarial pass, finding 10); the log line still names the [`Verdict::reason`].
    pub bad_credentials: Counter,
    /// Refused: no user name where anonymous access is off.
    pub anonymous: Counter,
    /// Refused: a password shaped like a JWT that did not verify (`[auth.jwt]`).
    pub jwt_refused: Counter,
    /// Accepted after hashing.
    pub success_hashed: Counter,
    /// Accepted from the success cache.
    pub success_cached: Counter,
    /// Refused unhashed: the source address failed too often lately.
    pub throttled_address: Counter,
    /// Refused unhashed: the user name failed too often lately.
    pub throttled_user: Counter,
    /// Hashes run (a cached success runs none).
    pub hashes: Counter,
    /// Verifications that ended before their hash: the client left, or the deadline came,
    /// while they waited for a worker.
    pub hashes_skipped: Counter,
}

impl AuthMetrics {
    /// The handles in the broker's registry (`metrics`); taking them again gives the same
    /// counters.
    pub fn register(metrics: &crate::metrics::Metrics) -> AuthMetrics {
        AuthMetrics {
            bad_credentials: metrics.auth_failures(BAD_CREDENTIALS),
            anonymous: metrics.auth_failures("anonymous"),
            jwt_refused: metrics.auth_failures("jwt"),
            success_hashed: metrics.auth_successes(false),
            success_cached: metrics.auth_successes(true),
            throttled_address: metrics.auth_throttled(Throttled::Address.label()),
            throttled_user: metrics.auth_throttled(Throttled::User.label()),
            hashes: metrics.auth_hashes.clone(),
            hashes_skipped: metrics.auth_hashes_skipped.clone(),
        }
    }
}

/// The password file in force, and the machinery to check passwords against it.
#[derive(Debug)]
pub struct PasswordStore {
    path: PathBuf,
    current: RwLock<Arc<Loaded>>,
    /// One permit per hash that may run at once.
    permits: Arc<Semaphore>,
    /// Each source address's share of those permits, taken first.
    shares: HashShares,
    /// Places for the verifications of sources that failed lately
    /// ([`LoginThrottle::failed_lately`]), taken before a permit: one fewer than the permits
    /// (at least one), so a source that has not failed finds at most that many of theirs
    /// ahead of it. Per-address shares alone left 254 addresses with one wrong password each
    /// a 254-deep queue ahead of every first login, which waited 6-10 s of its 10 s
    /// `connect_timeout` (issue 35, twenty-fifth adversarial pass, K5). A fresh address is
    /// not suspect until its first failure, so an attacker gets one verification per
    /// address at full priority per `FORGET_AFTER` (15 minutes).
    suspects: Arc<Semaphore>,
    /// How many of those places there are.
    suspect_places: usize,
    /// The checks waiting for a worker, bounded by what the workers can check in time.
    queue: queue::HashQueue,
    /// Hash workers (the permits).
    workers: usize,
    /// Failed-login limits (off until [`PasswordStore::with_throttle`]), shared with the
    /// other methods that check a secret (SCRAM): one limit whatever the method guessed.
    throttle: Arc<LoginThrottle>,
    cache: Mutex<SuccessCache>,
    metrics: AuthMetrics,
    /// How long the last hash took, in nanoseconds (see [`PasswordStore::verify`]).
    last_hash_ns: AtomicU64,
    /// The slowest recent hash, in nanoseconds (each hash takes 1/64 off it, and raises it
    /// to its own duration): every failure is answered no sooner than this after its hash
    /// began, so users whose hashes cost less than most (device secrets made with fewer
    /// iterations) cannot be told from unknown names by timing (issue 35, fifth pass).
    slowest_hash_ns: AtomicU64,
    /// What one hash of the slowest cost class in the file took when it was loaded, in
    /// nanoseconds: the padding never goes below it. The recent value alone started at 0
    /// after a restart and decayed under cheap hashes, and then the minority of users with
    /// slow hashes (people's accounts next to cheap device secrets) stood out from unknown
    /// names, which are hashed at the majority's cost (issue 35, sixth pass, finding 4).
    /// Measured on a thread of its own (the slowest class may take seconds: a start or a
    /// SIGHUP is not held up by it); until then the previous floor stays, and before the
    /// first one is known a failure waits for it ([`PasswordStore::floor_known`]).
    floor_ns: Arc<AtomicU64>,
    /// The thread measuring [`PasswordStore::floor_ns`] now, if any.
    measuring: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// True once the first floor is known: a failure before that waits for it (within its
    /// deadline), so the first probes after a start are padded too.
    floor_known: Arc<tokio::sync::watch::Sender<bool>>,
}

/// A wrong password to time each cost class with (a right one costs the same).
const FLOOR_PASSWORD: &[u8] = b"\0postbox: measuring the hash cost";

/// The padding floor for `classes` (one hash per cost class): the longest `cost` of one.
fn floor_of(classes: &[PasswordHash], cost: impl Fn(&PasswordHash) -> Duration) -> Duration {
    classes.iter().map(cost).max().unwrap_or(Duration::ZERO)
}

/// Hashes once per cost class of `users` and returns what the slowest took.
fn measure_floor(users: &Users) -> Duration {
    floor_of(users.cost_classes(), |hash| {
        let started = std::time::Instant::now();
        let _ = hash.verify(FLOOR_PASSWORD);
        started.elapsed()
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl PasswordStore {
    /// Loads the file at `path`. `cache_size` successes are remembered (0: none);
    /// `max_hashes` hashes run at once (0: one per CPU).
    ///
    /// # Errors
    ///
    /// [`CredentialFileError`] when the file cannot be read or a line is bad.
    pub fn open(
        path: &Path,
        cache_size: usize,
        max_hashes: usize,
        metrics: AuthMetrics,
    ) -> Result<PasswordStore, CredentialFileError> {
        let users = file::load(path)?;
        let max_hashes = if max_hashes == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        } else {
            max_hashes
        };
        let loaded = Arc::new(Loaded {
            users,
            generation: 1,
        });
        let store = PasswordStore {
            path: path.to_owned(),
            current: RwLock::new(Arc::clone(&loaded)),
            permits: Arc::new(Semaphore::new(max_hashes)),
            shares: HashShares::new(max_hashes),
            suspects: Arc::new(Semaphore::new(max_hashes.saturating_sub(1).max(1))),
            suspect_places: max_hashes.saturating_sub(1).max(1),
            queue: queue::HashQueue::default(),
            workers: max_hashes,
            throttle: Arc::new(LoginThrottle::new(LoginLimits::OFF)),
            cache: Mutex::new(SuccessCache::new(cache_size)),
            metrics,
            last_hash_ns: AtomicU64::new(0),
            slowest_hash_ns: AtomicU64::new(0),
            floor_ns: Arc::new(AtomicU64::new(0)),
            measuring: Mutex::new(None),
            floor_known: Arc::new(tokio::sync::watch::channel(false).0),
        };
        // Started before the listeners are: normally done before the first client, right
        // after a start being when the padding mattered most.
        store.measure_floor_of(loaded);
        Ok(store)
    }

    /// The store with the failed-login records `throttle` (`[auth] login_*`, shared with
    /// SCRAM by `auth::login::Logins`).
    pub(crate) fn with_throttle(mut self, throttle: Arc<LoginThrottle>) -> PasswordStore {
        self.throttle = throttle;
        self
    }

    /// The metric handles (the handshake counts anonymous refusals with them).
    pub fn metrics(&self) -> &AuthMetrics {
        &self.metrics
    }

    /// Whether the file in force has a line for `user`.
    pub fn has_user(&self, user: &str) -> bool {
        self.current.read().users.get(user).is_some()
    }

    /// How many users the file in force has.
    pub fn users(&self) -> usize {
        self.current.read().users.len()
    }

    /// Checks `user` and `password`, counting the outcome. Hashing waits for a permit and
    /// runs on the blocking pool; the caller bounds the whole with its own deadline (dropping
    /// the future leaves a running hash to finish and free its permit).
    ///
    /// A hash is not started when the last one took longer than what is left until
    /// `deadline` ([`Verdict::NoTime`]): under a storm the permits go to the clients that
    /// waited longest, and without this check most hashes would finish after their client's
    /// handshake timed out, wasting the CPU the queue needs (measured: 4 instead of ~35
    /// logins/s on 2 cores with a 10,000-iteration `$7$` file).
    ///
    /// `source` is the client's `connection::slots::source_key`: the failed-login limits
    /// and the share of the workers are kept per source. The limits are asked first, before
    /// the cache: a throttled attempt is refused whatever its password, so a refusal tells a
    /// guesser nothing (issue 35, third adversarial pass; the pair that proved the password
    /// before passes, `auth::throttle::trust`). A success from the cache is not hashed.
    pub fn verify<'a>(
        &'a self,
        user: &'a str,
        password: &'a [u8],
        source: IpAddr,
        deadline: tokio::time::Instant,
    ) -> impl std::future::Future<Output = Verdict> + 'a {
        // Armed now, not at the first poll: a check dropped before it ever ran (its client
        // had closed already) counts as skipped too.
        let unhashed = Unhashed(Some(&self.metrics.hashes_skipped));
        self.check(user, password, source, deadline, unhashed)
    }

    /// Measures the padding floor of `loaded` on a thread of its own, which stores it when
    /// done (one at a time: a reload meanwhile waits for the previous measurement's thread
    /// there, not here).
    fn measure_floor_of(&self, loaded: Arc<Loaded>) {
        let floor = Arc::clone(&self.floor_ns);
        let known = Arc::clone(&self.floor_known);
        let previous = self.measuring.lock().take();
        let spawned = std::thread::Builder::new()
            .name("postbox-hash-floor".into())
            .spawn(move || {
                if let Some(previous) = previous {
                    let _ = previous.join();
                }
                floor.store(nanos(measure_floor(&loaded.users)), Ordering::Relaxed);
                known.send_replace(true);
            });
        match spawned {
            Ok(thread) => *self.measuring.lock() = Some(thread),
            Err(error) => {
                // Nothing to wait for: the recent value pads.
                self.floor_known.send_replace(true);
                tracing::warn!(%error, "the padding floor of the password file is not measured; the previous one stays");
            }
        }
    }

    /// Waits for the measurement of the floor in progress, if any (tests).
    #[cfg(test)]
    fn floor_measured(&self) {
        if let Some(thread) = self.measuring.lock().take() {
            let _ = thread.join();
        }
    }

    /// How long a failure takes at least, counted from when its hash began: the floor
    /// measured at load, or the slowest recent hash if longer.
    fn pad_target(&self) -> Duration {
        let floor = self.floor_ns.load(Ordering::Relaxed);
        let recent = self.slowest_hash_ns.load(Ordering::Relaxed);
        Duration::from_nanos(floor.max(recent))
    }

    /// [`PasswordStore::verify`]'s work; `unhashed` is disarmed where no hash is needed.
    async fn check(
        &self,
        user: &str,
        password: &[u8],
        source: IpAddr,
        deadline: tokio::time::Instant,
        mut unhashed: Unhashed<'_>,
    ) -> Verdict {
        // The throttle first (issue 35, third adversarial pass): when the cache answered
        // before it, a throttled guesser got a fast yes or no at line rate.
        // It reserves (fourth pass): this attempt counts as a possible failure until its
        // verdict, so parallel guesses see each other; dropped (the client left, no time for
        // a hash) it is released uncounted.
        let reservation = match self.throttle.check(source, user, std::time::Instant::now()) {
            Ok(reservation) => reservation,
            Err(throttled) => {
                unhashed.0 = None;
                match throttled {
                    Throttled::Address => self.metrics.throttled_address.increment(1),
                    Throttled::User => self.metrics.throttled_user.increment(1),
                }
                return Verdict::Throttled;
            }
        };
        let loaded = Arc::clone(&self.current.read());
        let key = {
            let cache = self.cache.lock();
            let key = cache.key(loaded.generation, user, password);
            if !cache.contains(&key) {
                key
            } else {
                drop(cache);
                unhashed.0 = None;
                self.metrics.success_cached.increment(1);
                // The right password, as surely as a hash would say.
                reservation.succeeded(std::time::Instant::now());
                return Verdict::Ok;
            }
        };
        let (hash, known) = match loaded.users.get(user) {
            Some(hash) => (hash.clone(), true),
            // Same work as a wrong password: no user enumeration by timing.
            None => match loaded.users.dummy() {
                Some(hash) => (hash.clone(), false),
                None => {
                    unhashed.0 = None;
                    self.metrics.bad_credentials.increment(1);
                    return Verdict::UnknownUser;
                }
            },
        };
        // At most `queue::MAX_WAITING` checks wait in all (twenty-fifth pass, K1): each is a
        // handshake holding its CONNECT.
        let Some(arrived) = self.queue.arrive() else {
            self.throttle.suspect(source, std::time::Instant::now());
            return Verdict::Busy;
        };
        // What a check holds a worker for: its hash, and a failure's padding.
        let per_check = || {
            let last = Duration::from_nanos(self.last_hash_ns.load(Ordering::Relaxed));
            last.max(self.pad_target())
        };
        let time_left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        // First a place in its address's share (finding 4): one address's checks wait there,
        // as many as its places can get to in time, and not in the classes below, where
        // they would take the places of other addresses' logins (a flood that arrived before
        // any hash was timed had filled them, and a fresh address's login was answered busy).
        let source_places = self.shares.per_source();
        let source_bound = queue::in_time(source_places, per_check(), time_left()).max(1);
        let Some(share) = self.shares.acquire(source, source_bound).await else {
            self.throttle.suspect(source, std::time::Instant::now());
            return Verdict::Busy;
        };
        // Then a worker, where the workers can get to it in time (twenty-sixth pass, L1), and
        // behind the sources that have not failed lately (twenty-fifth pass, K5): asked now,
        // since its address may have failed while this check waited for its share.
        let suspect = self
            .throttle
            .failed_lately(source, std::time::Instant::now());
        let places = if suspect {
            self.suspect_places
        } else {
            self.workers
        };
        let (per_check, time_left) = (per_check(), time_left());
        if queue::in_time(places, per_check, time_left) == 0 {
            return Verdict::NoTime;
        }
        let Some(waiting) = self.queue.enter(suspect, places, per_check, time_left) else {
            self.throttle.suspect(source, std::time::Instant::now());
            return Verdict::Busy;
        };
        let suspect = if suspect {
            Arc::clone(&self.suspects).acquire_owned().await.ok()
        } else {
            None
        };
        let mut hashed_for = Duration::ZERO;
        // The source's place, its suspect's place if any, and the worker, held past the hash
        // by a failure (below).
        let mut held: Option<Places> = None;
        let permit = Arc::clone(&self.permits).acquire_owned().await;
        drop((waiting, arrived));
        let matched = match permit {
            Ok(permit) => {
                let last = Duration::from_nanos(self.last_hash_ns.load(Ordering::Relaxed));
                if tokio::time::Instant::now() + last > deadline {
                    return Verdict::NoTime;
                }
                unhashed.0 = None;
                self.metrics.hashes.increment(1);
                let password = password.to_vec();
                let started = std::time::Instant::now();
                // Place and permit go into the blocking task and come back with the verdict:
                // a check dropped meanwhile (its client left) frees them when the hash is done,
                // not before, so at most `workers` hashes run.
                let outcome = tokio::task::spawn_blocking(move || {
                    let matched = hash.verify(&password);
                    (matched, (permit, share, suspect))
                })
                .await;
                hashed_for = started.elapsed();
                let took = nanos(hashed_for);
                self.last_hash_ns.store(took, Ordering::Relaxed);
                let slowest = self.slowest_hash_ns.load(Ordering::Relaxed);
                self.slowest_hash_ns
                    .store(took.max(slowest - slowest / 64), Ordering::Relaxed);
                match outcome {
                    Ok((matched, places)) => {
                        held = Some(places);
                        matched
                    }
                    Err(_) => false, // the hash panicked: its place and permit went with it
                }
            }
            Err(_) => false, // the semaphore is never closed
        };
        let verdict = match (known, matched) {
            (true, true) => Verdict::Ok,
            (true, false) => Verdict::BadPassword,
            (false, _) => Verdict::UnknownUser,
        };
        match verdict {
            Verdict::Ok => {
                drop(held);
                reservation.succeeded(std::time::Instant::now());
            }
            _ => {
                reservation.failed(std::time::Instant::now());
                // When the hash began (the verdict is in now).
                let now = tokio::time::Instant::now();
                let began = now.checked_sub(hashed_for).unwrap_or(now);
                // Right after a start the floor may still be being measured: wait for it
                // (bounded by the deadline) rather than answer unpadded.
                let mut known = self.floor_known.subscribe();
                let _ = tokio::time::timeout_at(deadline, known.wait_for(|known| *known)).await;
                // A failure takes as long as the slowest class's hash, or the slowest recent
                // hash if longer (a loaded machine), from when its hash began, within the
                // deadline.
                let until = (began + self.pad_target()).min(deadline);
                tokio::time::sleep_until(until).await;
                // The source's place and the worker are given back at the padded answer, not
                // when the hash ended (issue 35, pass 7, P4): released at the real end, the
                // next verification waiting for them (the same address's next probe, or any
                // address's once all workers are busy) began at the candidate's true hash
                // time and its own padded answer told a slow-class user from an unknown name.
                // Held, a failure occupies them for the padded time whatever its class, so
                // every wait for them is the same after any failure. The cost: a failure of a
                // cheap class keeps a worker as long as one of the slowest class (nothing when
                // all hashes cost the same).
                drop(held);
            }
        }
        match verdict {
            Verdict::Ok => {
                self.metrics.success_hashed.increment(1);
                // Only for the file still in force: a reload meanwhile cleared the cache.
                if self.current.read().generation == loaded.generation {
                    self.cache.lock().insert(key);
                }
            }
            Verdict::BadPassword | Verdict::UnknownUser => {
                self.metrics.bad_credentials.increment(1);
            }
            Verdict::NoTime | Verdict::Throttled | Verdict::Busy => {}
        }
        verdict
    }
}

/// What a verification holds while its hash runs and, after a failure, until its padded
/// answer: the worker's permit, its source's place ([`share`]) and, for a source that failed
/// lately, a suspect's place.
type Places = (
    tokio::sync::OwnedSemaphorePermit,
    share::Share,
    Option<tokio::sync::OwnedSemaphorePermit>,
);

/// Counts a verification that ended without its hash into `postbox_auth_hashes_skipped_total`
/// when dropped armed (`Some`).
struct Unhashed<'a>(Option<&'a Counter>);

impl Drop for Unhashed<'_> {
    fn drop(&mut self) {
        if let Some(skipped) = self.0 {
            skipped.increment(1);
        }
    }
}

impl crate::reload::Reload for PasswordStore {
    fn what(&self) -> String {
        format!("password file {}", self.path.display())
    }

    fn reload(&self) -> Result<(), String> {
        let users = file::load(&self.path).map_err(|e| e.to_string())?;
        let count = users.len();
        let loaded = {
            let mut current = self.current.write();
            let generation = current.generation + 1;
            *current = Arc::new(Loaded { users, generation });
            Arc::clone(&current)
        };
        self.measure_floor_of(loaded);
        self.cache.lock().clear();
        tracing::info!(path = %self.path.display(), users = count, "password file loaded");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
