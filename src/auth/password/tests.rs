use super::*;
use crate::reload::Reload;

fn store(dir: &Path, lines: &str) -> (PathBuf, PasswordStore) {
    let path = dir.join("passwd");
    std::fs::write(&path, lines).expect("write");
    let store = PasswordStore::open(
        &path,
        16,
        1,
        AuthMetrics::register(&crate::metrics::Metrics::register()),
    )
    .expect("open");
    (path, store)
}

const SRC: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn later() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(60)
}

fn line(user: &str, password: &str) -> String {
    format!(
        "{user}:{}\n",
        PasswordHash::new_pbkdf2(password.as_bytes(), 10).encode()
    )
}

#[tokio::test]
async fn verdicts_cache_and_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, store) = store(dir.path(), &line("a", "pa"));
    assert_eq!(store.verify("a", b"pa", SRC, later()).await, Verdict::Ok);
    assert_eq!(store.cache.lock().len(), 1, "success remembered");
    assert_eq!(store.verify("a", b"pa", SRC, later()).await, Verdict::Ok);
    assert_eq!(
        store.verify("a", b"pb", SRC, later()).await,
        Verdict::BadPassword
    );
    assert_eq!(store.cache.lock().len(), 1, "failures are not remembered");
    assert_eq!(
        store.verify("b", b"pa", SRC, later()).await,
        Verdict::UnknownUser
    );

    // A new file: the cached success of the old password no longer counts.
    std::fs::write(&path, line("a", "new") + &line("b", "pb")).expect("write");
    store.reload().expect("reload");
    assert!(store.cache.lock().is_empty());
    assert_eq!(
        store.verify("a", b"pa", SRC, later()).await,
        Verdict::BadPassword
    );
    assert_eq!(store.verify("b", b"pb", SRC, later()).await, Verdict::Ok);

    // A broken file keeps the one in force, and the error names file and line.
    std::fs::write(&path, line("a", "x") + "b:$7$oops\n").expect("write");
    let error = store.reload().expect_err("broken");
    assert!(error.contains("passwd:2:"), "{error}");
    assert_eq!(store.verify("b", b"pb", SRC, later()).await, Verdict::Ok);

    // No time left for a hash: not started.
    let now = tokio::time::Instant::now();
    store.last_hash_ns.store(1_000_000_000, Ordering::Relaxed);
    assert_eq!(store.verify("a", b"new", SRC, now).await, Verdict::NoTime);
    assert_eq!(
        store.verify("b", b"pb", SRC, now).await,
        Verdict::Ok,
        "cached: no hash needed"
    );
}

#[tokio::test]
async fn limits_refuse_unhashed_and_only_a_known_device_passes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, store) = store(dir.path(), &line("a", "pa"));
    let store = store.with_throttle(Arc::new(LoginThrottle::new(LoginLimits {
        per_address: 2,
        per_user: 0,
        delay: Duration::from_secs(60),
        max_delay: Duration::from_secs(60),
        entries: 16,
    })));
    let device = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 9));
    assert_eq!(store.verify("a", b"pa", device, later()).await, Verdict::Ok);
    assert_eq!(store.verify("a", b"pa", SRC, later()).await, Verdict::Ok);
    for _ in 0..2 {
        let verdict = store.verify("a", b"x", SRC, later()).await;
        assert_eq!(verdict, Verdict::BadPassword);
    }
    let verdict = store.verify("a", b"x", SRC, later()).await;
    assert_eq!(verdict, Verdict::Throttled);
    let other = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    let verdict = store.verify("a", b"x", other, later()).await;
    assert_eq!(verdict, Verdict::BadPassword, "another address is checked");
    // The remembered password is no oracle from the throttled address, even though it
    // succeeded there once (its failures since revoked that)…
    let verdict = store.verify("a", b"pa", SRC, later()).await;
    assert_eq!(verdict, Verdict::Throttled, "no answer past the throttle");
    // … and the device whose address proved it is not throttled.
    for _ in 0..2 {
        let verdict = store.verify("a", b"y", device, later()).await;
        assert_eq!(verdict, Verdict::BadPassword);
    }
    let device2 = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 10));
    assert_eq!(
        store.verify("a", b"pa", device2, later()).await,
        Verdict::Ok
    );
    assert_eq!(store.metrics.hashes.get(), 6);
    assert_eq!(store.metrics.throttled_address.get(), 2);
    assert_eq!(store.metrics.hashes_skipped.get(), 0);

    // A verification dropped while it waits for a worker is skipped, not hashed.
    let permits = Arc::clone(&store.permits);
    let all = permits.acquire_many(1).await.expect("the only permit");
    let waiting = store.verify("a", b"y", other, later());
    assert!(
        tokio::time::timeout(Duration::from_millis(10), waiting)
            .await
            .is_err(),
        "waits for the worker"
    );
    drop(all);
    assert_eq!(store.metrics.hashes.get(), 6);
    assert_eq!(store.metrics.hashes_skipped.get(), 1);
    // One dropped before it ever ran (its client had closed already) too.
    drop(store.verify("a", b"z", other, later()));
    assert_eq!(store.metrics.hashes_skipped.get(), 2);
}

/// One address's checks wait in its own share, not in the places every address's logins
/// share: 100 from one address, with the worker busy and time for 60 checks, leave a
/// login from another address waiting for the worker, not answered busy (before, the
/// flood's 60 filled the class, and the login got CONNACK 0x89).
#[tokio::test]
async fn a_flood_waits_in_its_addresses_share_not_in_everyones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, store) = store(dir.path(), &line("a", "pa"));
    let store = Arc::new(store);
    // Just under 1 s a check: 60 of them start within the 60 s left.
    store.last_hash_ns.store(990_000_000, Ordering::Relaxed);
    let busy = Arc::clone(&store.permits).acquire_owned().await;
    let flood: Vec<_> = (0..100)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.verify("a", b"x", SRC, later()).await })
        })
        .collect();
    for _ in 0..1_000 {
        if store.queue.waiting() == 60 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.queue.waiting(),
        60,
        "as many as its place can check in time"
    );
    let other = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    let login = store.verify("a", b"pa", other, later());
    tokio::pin!(login);
    let early = tokio::time::timeout(Duration::from_millis(20), &mut login).await;
    assert!(early.is_err(), "waits for the worker: {early:?}");
    store.last_hash_ns.store(0, Ordering::Relaxed);
    drop(busy);
    assert_eq!(login.await, Verdict::Ok);
    for check in flood {
        check.abort();
    }
}

/// The floor is the slowest class's cost whatever the order, 0 for no class.
#[test]
fn the_floor_is_the_slowest_class() {
    let classes = [
        PasswordHash::new_pbkdf2(b"x", 10),
        PasswordHash::new_pbkdf2(b"x", 300),
        PasswordHash::new_pbkdf2(b"x", 20),
    ];
    let by_iterations = |h: &PasswordHash| {
        let class = h.cost_class();
        let n: u64 = class
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Duration::from_millis(n)
    };
    assert_eq!(
        floor_of(&classes, by_iterations),
        Duration::from_millis(300)
    );
    assert_eq!(floor_of(&[], by_iterations), Duration::ZERO);
}

/// The padding does not start at 0 after a load and does not decay below the floor with
/// cheap hashes (issue 35, sixth pass, finding 4): many failures on the cheap user leave
/// the pad at the floor measured for the slow class.
#[tokio::test]
async fn the_padding_does_not_decay_below_the_slowest_class() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slow = format!("slow:{}\n", PasswordHash::new_pbkdf2(b"ps", 5_000).encode());
    let (path, store) = store(dir.path(), &(line("cheap", "pc") + &slow));
    store.floor_measured();
    let floor = store.floor_ns.load(Ordering::Relaxed);
    assert!(floor > 0, "measured at load");
    assert!(
        store.pad_target() >= Duration::from_nanos(floor),
        "from the start"
    );
    for _ in 0..100 {
        let verdict = store.verify("cheap", b"wrong", SRC, later()).await;
        assert_eq!(verdict, Verdict::BadPassword);
    }
    assert!(
        store.pad_target() >= Duration::from_nanos(floor),
        "no decay below the floor"
    );
    // A reload measures the new file (on its own thread); the old floor stays meanwhile.
    std::fs::write(&path, line("cheap", "pc")).expect("write");
    store.reload().expect("reload");
    assert!(store.pad_target() > Duration::ZERO);
}

#[tokio::test]
async fn an_empty_file_knows_nobody() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, store) = store(dir.path(), "# nobody yet\n");
    assert_eq!(
        store.verify("a", b"", SRC, later()).await,
        Verdict::UnknownUser
    );
}
