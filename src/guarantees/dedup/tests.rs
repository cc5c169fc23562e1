//! The window alone: exact keys, expiry, bounds (the largest share's oldest out, counted),
//! forget, restore, and one `Fresh` among racing checks (issue 16, `[dedup]`).

use std::sync::{Arc, Barrier};

use super::{Dedup, DedupCheck};
use crate::config::DedupConfig;
use crate::guarantees::DedupMetrics;
use crate::storage::DedupRecord;

const T0: u64 = 1_700_000_000_000;

fn config(window: u32, max_entries: usize, max_bytes: usize) -> DedupConfig {
    DedupConfig {
        property: "message-id".to_owned(),
        window,
        max_entries,
        max_bytes,
        ..DedupConfig::default()
    }
}

fn window(window: u32, max_entries: usize, max_bytes: usize) -> (Dedup, DedupMetrics) {
    let mut dedup = Dedup::new(&config(window, max_entries, max_bytes));
    let metrics = DedupMetrics::detached();
    dedup.attach_metrics(metrics.clone());
    (dedup, metrics)
}

fn fresh(d: &Dedup, topic: &str, key: &str, now: u64) -> bool {
    matches!(d.check(topic, key, now), DedupCheck::Fresh { .. })
}

#[test]
fn second_check_inside_the_window_is_a_duplicate() {
    let (d, m) = window(60, 100, 1 << 20);
    assert!(fresh(&d, "a/b", "m1", T0));
    assert!(!fresh(&d, "a/b", "m1", T0 + 59_999), "inside the window");
    assert!(fresh(&d, "a/c", "m1", T0), "another topic is another pair");
    assert!(fresh(&d, "a/b", "m2", T0), "another id is another pair");
    assert_eq!(m.duplicates.get(), 1);
    assert_eq!(m.entries.get(), 3.0);
}

#[test]
fn keys_are_compared_exactly_not_by_concatenation() {
    let (d, _) = window(60, 100, 1 << 20);
    assert!(fresh(&d, "ab", "c", T0));
    assert!(fresh(&d, "a", "bc", T0), "(a, bc) is not (ab, c)");
    assert!(!fresh(&d, "ab", "c", T0));
}

#[test]
fn fresh_carries_the_window_end() {
    let (d, _) = window(30, 100, 1 << 20);
    assert_eq!(
        d.check("t", "k", T0),
        DedupCheck::Fresh {
            expires_at_unix_ms: T0 + 30_000
        }
    );
}

#[test]
fn the_window_closes_and_expired_pairs_leave_from_the_front() {
    let (d, m) = window(1, 100, 1 << 20);
    assert!(fresh(&d, "t", "1", T0));
    assert!(fresh(&d, "t", "2", T0 + 500));
    assert!(
        fresh(&d, "t", "1", T0 + 1000),
        "its window closed at T0 + 1 s"
    );
    // The front passed "1" (re-added) and "2" is still open.
    assert!(!fresh(&d, "t", "2", T0 + 1499));
    assert!(fresh(&d, "t", "3", T0 + 5000));
    assert_eq!(d.len(), 1, "everything older than the window dropped");
    assert_eq!(m.entries.get(), 1.0);
    assert_eq!(m.evicted.get(), 0, "expiry is not eviction");
}

#[test]
fn max_entries_evicts_the_oldest_and_counts_it() {
    let (d, m) = window(60, 3, 1 << 20);
    for k in ["1", "2", "3", "4"] {
        assert!(fresh(&d, "t", k, T0));
    }
    assert_eq!(d.len(), 3);
    assert_eq!(m.evicted.get(), 1);
    assert!(!fresh(&d, "t", "4", T0), "the newest is kept");
    assert!(!fresh(&d, "t", "2", T0));
    assert!(fresh(&d, "t", "1", T0), "the oldest went first");
    assert_eq!(
        m.evicted.get(),
        2,
        "and adding it back pushed out the next oldest"
    );
    assert!(fresh(&d, "t", "2", T0));
}

#[test]
fn max_bytes_evicts_the_oldest() {
    // Each pair: 10-byte topic + 502-byte key = 512 bytes; 1024 bytes hold two.
    let (d, m) = window(60, 100, 1024);
    let topic = "0123456789";
    let keys: Vec<String> = (0..3).map(|i| format!("{i}{}", "x".repeat(501))).collect();
    for k in &keys {
        assert!(fresh(&d, topic, k, T0));
    }
    assert_eq!(d.len(), 2);
    assert_eq!(m.evicted.get(), 1);
    assert!(!fresh(&d, topic, &keys[2], T0));
    assert!(!fresh(&d, topic, &keys[1], T0));
    assert!(fresh(&d, topic, &keys[0], T0), "the oldest went");
}

#[test]
fn forget_lets_a_resend_through_and_keeps_the_queue_bounded() {
    let (d, m) = window(60, 100, 1 << 20);
    assert!(fresh(&d, "t", "k", T0));
    d.forget("t", "k");
    assert_eq!(m.entries.get(), 0.0);
    assert!(
        fresh(&d, "t", "k", T0),
        "the refused message's re-send is new"
    );
    // Forgetting pairs that are not at the back leaves stale entries; they stay bounded.
    assert!(fresh(&d, "t", "keep", T0));
    for i in 0..10_000 {
        let k = i.to_string();
        assert!(fresh(&d, "u", &k, T0));
        assert!(fresh(&d, "u", "tail", T0));
        d.forget("u", &k);
        d.forget("u", "tail");
    }
    let queued = d.pairs.lock().queue.len();
    assert!(
        queued <= 2 * d.len() + 65,
        "queue {queued} for {} pairs",
        d.len()
    );
    assert!(
        !fresh(&d, "t", "keep", T0),
        "live pairs survive the compactions"
    );
    assert!(!fresh(&d, "t", "k", T0));
}

#[test]
fn restore_keeps_open_windows_within_the_bounds() {
    let (d, m) = window(60, 2, 1 << 20);
    let record = |key: &str, at: u64| DedupRecord {
        topic: "t".into(),
        key: key.into(),
        expires_at_unix_ms: at,
    };
    d.restore_at(
        vec![
            record("closed", T0),
            record("old", T0 + 1),
            record("mid", T0 + 2),
            record("new", T0 + 3),
        ],
        T0,
    );
    assert_eq!(d.len(), 2);
    assert_eq!(m.evicted.get(), 1, "the oldest open one did not fit");
    assert!(!fresh(&d, "t", "new", T0));
    assert!(!fresh(&d, "t", "mid", T0));
    assert!(fresh(&d, "t", "closed", T0), "its window had closed");
}

#[test]
fn racing_checks_of_one_pair_give_exactly_one_fresh() {
    const THREADS: usize = 8;
    const KEYS: usize = 500;
    let (d, m) = window(60, 100_000, 1 << 24);
    let d = Arc::new(d);
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (d, start) = (Arc::clone(&d), Arc::clone(&start));
            std::thread::spawn(move || {
                let topic = "race";
                start.wait();
                (0..KEYS)
                    .filter(|k| {
                        matches!(d.check(topic, &k.to_string(), T0), DedupCheck::Fresh { .. })
                    })
                    .count()
            })
        })
        .collect();
    let fresh: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    assert_eq!(fresh, KEYS, "one Fresh per key, whichever thread got it");
    assert_eq!(m.duplicates.get(), (KEYS * (THREADS - 1)) as u64);
}

/// Issue 35, seventh pass, N4: one publisher's pairs beyond its share (10% of either bound by
/// default) push out its own oldest, never another publisher's; before, 280 publishes with
/// 60 KB ids from one client pushed every other client's key out of the 16 MiB window.
#[test]
fn one_publisher_cannot_push_out_anothers_keys() {
    let (d, m) = window(600, 1_000, 64 * 1024);
    const VICTIM: u64 = 1;
    const FLOODER: u64 = 2;
    assert!(matches!(
        d.check_from("commands/s1", "cmd-1", VICTIM, T0),
        DedupCheck::Fresh { .. }
    ));
    // Short ids past the entries share (100), then ids past the bytes share (6.5 KB).
    for n in 0..500 {
        let _ = d.check_from("junk", &format!("j{n}"), FLOODER, T0 + 1);
    }
    let long = "x".repeat(2_000);
    for n in 0..50 {
        let _ = d.check_from(&format!("junk/{n}"), &long, FLOODER, T0 + 2);
    }
    assert_eq!(
        d.check_from("commands/s1", "cmd-1", VICTIM, T0 + 3),
        DedupCheck::Duplicate,
        "the other publisher's key is still there"
    );
    assert!(
        d.len() <= 100 + 1,
        "the flooder holds its share: {}",
        d.len()
    );
    assert!(m.evicted.get() > 0, "its own pairs went, counted");
    // Its most recent pair is still remembered.
    assert_eq!(
        d.check_from("junk/49", &long, FLOODER, T0 + 4),
        DedupCheck::Duplicate
    );
}

/// A long id is kept as its digest: bounded bytes, and still exact for the same id.
#[test]
fn long_ids_are_kept_as_their_digest() {
    use super::{key_of, MAX_KEY_LEN};
    let short = "k".repeat(MAX_KEY_LEN);
    assert_eq!(key_of(&short), short.as_str());
    let long = "k".repeat(60_000);
    let key = key_of(&long);
    assert_eq!(key.len(), 7 + 64);
    assert!(key.starts_with("sha256:"));
    assert_eq!(key, key_of(&long));
    assert_ne!(key, key_of(&"k".repeat(60_001)));
}

/// Issue 35, pass 7b, P2: a long topic is kept as its digest too (it was counted in full, up
/// to 64 KiB a pair, so a dozen sessions of long-topic publishes filled the window): bounded
/// bytes, still exact, never taken for a real topic, and the same when given again (a
/// stored record, a refused key forgotten).
#[test]
fn long_topics_are_kept_as_their_digest() {
    use super::{topic_key, MAX_KEY_LEN};
    let short = "t".repeat(MAX_KEY_LEN);
    assert_eq!(topic_key(&short), short.as_str());
    let long = format!("mallory/{}/1", "T".repeat(60_000));
    let digest = topic_key(&long);
    assert_eq!(digest.len(), 8 + 64);
    assert!(digest.starts_with("\0sha256:"));
    assert_eq!(topic_key(&digest), digest, "kept as it is when given again");
    assert_ne!(
        digest,
        topic_key(&format!("mallory/{}/2", "T".repeat(60_000)))
    );
    // The `sha256:` form a client could name is no digest: it is a topic, kept as one.
    let named = digest.trim_start_matches('\0');
    assert_ne!(topic_key(named), digest);

    let (d, m) = window(600, 1_000, 1 << 20);
    assert!(matches!(
        d.check_from(&long, "id1", 7, T0),
        DedupCheck::Fresh { .. }
    ));
    assert_eq!(d.check_from(&long, "id1", 7, T0), DedupCheck::Duplicate);
    assert_eq!(d.check_from(&digest, "id1", 7, T0), DedupCheck::Duplicate);
    assert_eq!(
        d.pairs.lock().bytes,
        72 + 3,
        "the digest's bytes, not the topic's"
    );
    d.forget(&digest, "id1");
    assert_eq!(m.entries.get(), 0.0, "forgotten by its stored form");
    // A record stored before topics were digested holds the whole topic; one stored since,
    // the digest: either is found by the topic.
    d.restore_at(
        vec![
            DedupRecord {
                topic: long.as_str().into(),
                key: "old".into(),
                expires_at_unix_ms: T0 + 1_000,
            },
            DedupRecord {
                topic: (*digest).into(),
                key: "new".into(),
                expires_at_unix_ms: T0 + 1_000,
            },
        ],
        T0,
    );
    assert_eq!(d.check_from(&long, "old", 7, T0), DedupCheck::Duplicate);
    assert_eq!(d.check_from(&long, "new", 7, T0), DedupCheck::Duplicate);
}

/// Issue 35, pass 7b, P2: at the window's bounds the largest share loses its oldest pair,
/// not the window its oldest: identities flooding within their shares push out their own
/// keys, never the quiet publisher's older one (before, the window's oldest went, whoever's).
#[test]
fn the_bounds_evict_from_the_largest_share_first() {
    let mut c = config(600, 10, 1 << 20);
    c.publisher_share = 50; // 5 pairs each
    let mut d = Dedup::new(&c);
    let m = DedupMetrics::detached();
    d.attach_metrics(m.clone());
    const VICTIM: u64 = 1;
    assert!(matches!(
        d.check_from("commands/s1", "cmd-1", VICTIM, T0),
        DedupCheck::Fresh { .. }
    ));
    // Three identities, each within its share: 15 pairs for 9 places.
    for flooder in [2u64, 3, 4] {
        for n in 0..5 {
            let _ = d.check_from("junk", &format!("{flooder}-{n}"), flooder, T0 + 1);
        }
    }
    assert_eq!(d.len(), 10);
    assert_eq!(m.evicted.get(), 6);
    assert_eq!(
        d.check_from("commands/s1", "cmd-1", VICTIM, T0 + 2),
        DedupCheck::Duplicate,
        "the oldest pair, but of the smallest share: kept"
    );
    // Each flooder's newest pair is still there; the evictions took their oldest.
    for flooder in [2u64, 3, 4] {
        let newest = format!("{flooder}-4");
        assert_eq!(
            d.check_from("junk", &newest, flooder, T0 + 2),
            DedupCheck::Duplicate
        );
    }
    // By bytes the same: the largest share by bytes pays.
    let mut c = config(600, 1_000, 2_048);
    c.publisher_share = 60;
    let d = Dedup::new(&c);
    let _ = d.check_from("t", "victim", VICTIM, T0);
    let big = "b".repeat(500);
    for n in 0..4 {
        let _ = d.check_from(&format!("t/{n}"), &big, 2, T0 + 1);
    }
    assert_eq!(
        d.check_from("t", "victim", VICTIM, T0 + 2),
        DedupCheck::Duplicate
    );
    // When every share holds one pair, the new one stays and the window's oldest goes.
    let d = Dedup::new(&config(600, 2, 1 << 20));
    for publisher in 1..=3u64 {
        assert!(matches!(
            d.check_from("t", &publisher.to_string(), publisher, T0),
            DedupCheck::Fresh { .. }
        ));
    }
    assert_eq!(d.check_from("t", "3", 3, T0), DedupCheck::Duplicate);
    assert_eq!(d.check_from("t", "2", 2, T0), DedupCheck::Duplicate);
    assert!(matches!(
        d.check_from("t", "1", 1, T0),
        DedupCheck::Fresh { .. }
    ));
}

/// The size indexes follow every change (insert, forget, expiry, eviction): they hold each
/// share once, with its counts, and nothing else.
#[test]
fn the_share_indexes_match_the_shares() {
    let (d, _) = window(1, 50, 1 << 20);
    for n in 0..200u64 {
        let publisher = n % 7 + 1;
        let _ = d.check_from("t", &n.to_string(), publisher, T0 + n * 10);
        if n % 5 == 0 {
            d.forget("t", &(n / 2).to_string());
        }
    }
    let w = d.pairs.lock();
    assert_eq!(w.by_entries.len(), w.shares.len());
    assert_eq!(w.by_bytes.len(), w.shares.len());
    for (publisher, share) in &w.shares {
        assert!(w.by_entries.contains(&(share.entries, *publisher)));
        assert!(w.by_bytes.contains(&(share.bytes, *publisher)));
    }
    let entries: usize = w.shares.values().map(|s| s.entries).sum();
    assert_eq!(entries, w.table.len());
}
