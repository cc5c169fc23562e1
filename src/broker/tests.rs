//! Model-based tests: both indexes against the string matcher
//! ([`crate::codec::topic::matching`]), and that matcher, `covers` and `intersects` against the
//! topic tree and their definitions.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::retained::RetainedIndex;
use super::topic_tree::TopicTree;
use crate::codec::topic::matching::{covers, intersects, matches};
use crate::codec::topic::{is_valid_filter, topic_name_error};

const LEVELS: [&str; 6] = ["", "$SYS", "a", "b", "+", "#"];

/// Valid filters of 1..=4 levels over [`LEVELS`].
fn filter() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&LEVELS[..]), 1..=4)
        .prop_map(|levels| {
            let last = levels.len() - 1;
            let levels: Vec<&str> = levels
                .iter()
                .enumerate()
                .map(|(i, l)| if *l == "#" && i < last { "+" } else { l })
                .collect();
            levels.join("/")
        })
        .prop_filter("valid filter", |f| is_valid_filter(f))
}

/// Valid topic names of 1..=5 levels over the non-wildcard [`LEVELS`].
fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&LEVELS[..4]), 1..=5)
        .prop_map(|levels| levels.join("/"))
        .prop_filter("valid topic", |t| topic_name_error(t).is_none())
}

#[derive(Debug, Clone)]
enum SubOp {
    Insert(String, u64, u32),
    /// Remove a random (filter, key), usually absent.
    Remove(String, u64),
    /// Replace the value of the n-th existing subscription (modulo count).
    Replace(usize, u32),
    /// Remove the n-th existing subscription (modulo count).
    RemoveExisting(usize),
}

/// A random filter, or often one of a few hot ones so that nodes collect many subscribers.
fn hot_filter() -> impl Strategy<Value = String> {
    let hot = prop::sample::select(&["a/+", "#", "+/b/#", "a"][..]).prop_map(String::from);
    prop_oneof![filter(), hot]
}

fn sub_op() -> impl Strategy<Value = SubOp> {
    // Keys 0..20 so that hot nodes cross the indexing threshold of 8 subscribers.
    prop_oneof![
        6 => (hot_filter(), 0u64..20, any::<u32>()).prop_map(|(f, k, v)| SubOp::Insert(f, k, v)),
        1 => (filter(), 0u64..20).prop_map(|(f, k)| SubOp::Remove(f, k)),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(i, v)| SubOp::Replace(i, v)),
        3 => any::<usize>().prop_map(SubOp::RemoveExisting),
    ]
}

/// Sorted (key, value) pairs the tree reports for `topic`.
fn tree_matches(tree: &TopicTree<u64, u32>, topic: &str) -> Vec<(u64, u32)> {
    let mut found = Vec::new();
    tree.for_each_match(topic, |k, v| found.push((*k, *v)));
    found.sort_unstable();
    found
}

/// Sorted (key, value) pairs the model says match `topic`.
fn model_matches(model: &BTreeMap<(String, u64), u32>, topic: &str) -> Vec<(u64, u32)> {
    let mut expected: Vec<(u64, u32)> = model
        .iter()
        .filter(|((f, _), _)| matches(f, topic))
        .map(|((_, k), v)| (*k, *v))
        .collect();
    expected.sort_unstable();
    expected
}

proptest! {
    #[test]
    fn topic_tree_matches_reference(
        ops in prop::collection::vec(sub_op(), 1..120),
        topics in prop::collection::vec(topic(), 1..12),
    ) {
        let mut tree = TopicTree::new();
        let mut model: BTreeMap<(String, u64), u32> = BTreeMap::new();
        for op in ops {
            match op {
                SubOp::Insert(f, k, v) => {
                    prop_assert_eq!(tree.insert(&f, k, v), model.insert((f, k), v));
                }
                SubOp::Remove(f, k) => {
                    prop_assert_eq!(tree.remove(&f, k), model.remove(&(f, k)));
                }
                SubOp::Replace(i, v) => {
                    let n = i % model.len().max(1);
                    if let Some(((f, k), old)) = model.iter_mut().nth(n) {
                        prop_assert_eq!(tree.insert(f, *k, v), Some(*old));
                        *old = v;
                    }
                }
                SubOp::RemoveExisting(i) => {
                    if let Some((f, k)) = model.keys().nth(i % model.len().max(1)).cloned() {
                        prop_assert_eq!(tree.remove(&f, k), model.remove(&(f, k)));
                    }
                }
            }
            prop_assert_eq!(tree.len(), model.len());
        }
        for ((f, k), v) in &model {
            prop_assert_eq!(tree.get(f, *k), Some(v));
        }
        for topic in &topics {
            let expected = model_matches(&model, topic);
            prop_assert_eq!(tree_matches(&tree, topic), expected, "topic {:?}", topic);
        }
        for (f, k) in model.keys() {
            prop_assert!(tree.remove(f, *k).is_some());
        }
        prop_assert!(tree.is_empty());
        prop_assert_eq!(tree.node_count(), 0);
    }
}

#[derive(Debug, Clone)]
enum RetainOp {
    Insert(String, u32),
    Remove(String),
    RemoveExisting(usize),
}

fn retain_op() -> impl Strategy<Value = RetainOp> {
    prop_oneof![
        4 => (topic(), any::<u32>()).prop_map(|(t, v)| RetainOp::Insert(t, v)),
        1 => topic().prop_map(RetainOp::Remove),
        2 => any::<usize>().prop_map(RetainOp::RemoveExisting),
    ]
}

proptest! {
    #[test]
    fn retained_index_matches_reference(
        ops in prop::collection::vec(retain_op(), 1..80),
        filters in prop::collection::vec(filter(), 1..12),
    ) {
        let mut index = RetainedIndex::new();
        let mut model: BTreeMap<String, u32> = BTreeMap::new();
        for op in ops {
            match op {
                RetainOp::Insert(t, v) => {
                    prop_assert_eq!(index.insert(&t, v), model.insert(t, v));
                }
                RetainOp::Remove(t) => {
                    prop_assert_eq!(index.remove(&t), model.remove(&t));
                }
                RetainOp::RemoveExisting(i) => {
                    if let Some(t) = model.keys().nth(i % model.len().max(1)).cloned() {
                        prop_assert_eq!(index.remove(&t), model.remove(&t));
                    }
                }
            }
            prop_assert_eq!(index.len(), model.len());
        }
        for (t, v) in &model {
            prop_assert_eq!(index.get(t), Some(v));
        }
        for filter in &filters {
            let mut found = Vec::new();
            index.for_each_match(filter, |t, v| found.push((t.to_owned(), *v)));
            found.sort_unstable();
            let expected =
                model.iter().filter(|(t, _)| matches(filter, t)).map(|(t, v)| (t.clone(), *v));
            let expected: Vec<(String, u32)> = expected.collect();
            prop_assert_eq!(found, expected, "filter {:?}", filter);
        }
        for t in model.keys() {
            prop_assert!(index.remove(t).is_some());
        }
        prop_assert!(index.is_empty());
        prop_assert_eq!(index.node_count(), 0);
    }
}

/// Counts this thread's allocations, so tests can assert that matching allocates nothing.
struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialized thread-local
// without destructor, so touching it never allocates.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Allocations made by `f` on this thread.
fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(std::cell::Cell::get);
    f();
    ALLOCATIONS.with(std::cell::Cell::get) - before
}

#[test]
fn matching_does_not_allocate() {
    let mut tree = TopicTree::new();
    let mut retained = RetainedIndex::new();
    for i in 0..2000u64 {
        let device = format!("device-with-a-long-identifier-{i}");
        tree.insert(&format!("fleet/{device}/cmd/+"), i, 0u32);
        tree.insert(&format!("fleet/+/{device}/#"), i, 1);
        tree.insert("fleet/#", i, 2);
        retained.insert(&format!("fleet/{device}/state/a/b/c/d/e/f"), i);
    }
    for topic in [
        "fleet/device-with-a-long-identifier-7/cmd/x",
        "fleet/x/y/z",
        "$SYS/x",
        "a/b/c/d/e",
    ] {
        let mut seen = 0;
        assert_eq!(
            allocations_during(|| tree.for_each_match(topic, |_, _| seen += 1)),
            0,
            "{topic}"
        );
    }
    for filter in [
        "#",
        "fleet/+/state/#",
        "fleet/+/+/+/+/+/+/+/f",
        "fleet/device-with-a-long-identifier-9/#",
    ] {
        let mut seen = 0;
        assert_eq!(
            allocations_during(|| retained.for_each_match(filter, |_, _| seen += 1)),
            0,
            "{filter}"
        );
    }
}

/// Resident set size in bytes, for rough memory figures (Linux only; 0 elsewhere).
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok());
    kib.unwrap_or(0) * 1024
}

/// Tiny deterministic generator, so the sanity check needs no RNG setup.
fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// Median and 99th percentile of per-call durations, in nanoseconds.
fn percentiles(mut samples: Vec<u128>) -> (u128, u128) {
    samples.sort_unstable();
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    )
}

/// Quick sanity figures, not a benchmark:
/// `cargo test --release --lib broker -- --ignored --nocapture`.
#[test]
#[ignore = "timing sanity check; run in release with --nocapture"]
fn perf_sanity_one_million_subscriptions() {
    use std::hint::black_box;
    use std::time::Instant;

    const DEVICES: u64 = 249_750;
    let rss_before = rss_bytes();
    let start = Instant::now();
    let mut tree: TopicTree<u64, u32> = TopicTree::new();
    for d in 0..DEVICES {
        let r = d % 32;
        tree.insert(&format!("fleet/r{r}/d{d}/cmd/+"), d, 1);
        tree.insert(&format!("fleet/r{r}/d{d}/config"), d, 1);
        tree.insert(&format!("fleet/r{r}/d{d}/+/alarm"), d, 1);
        tree.insert(&format!("fleet/r{r}/d{d}/ota/#"), d, 1);
    }
    // 1000 analytics sessions, each watching one region's telemetry.
    for k in 0..1000u64 {
        tree.insert(&format!("fleet/r{}/+/telemetry/#", k % 32), DEVICES + k, 0);
    }
    let built = start.elapsed();
    let bytes = rss_bytes().saturating_sub(rss_before);
    println!(
        "topic tree: {} subscriptions built in {built:?}, ~{} bytes/subscription (RSS delta)",
        tree.len(),
        bytes / tree.len()
    );

    let mut seed = 42;
    for (label, suffix) in [("1 match", "cmd/reboot"), ("~32 matches", "telemetry/temp")] {
        let topics: Vec<String> = (0..100_000)
            .map(|_| {
                let d = lcg(&mut seed) % DEVICES;
                format!("fleet/r{}/d{d}/{suffix}", d % 32)
            })
            .collect();
        let mut samples = Vec::with_capacity(topics.len());
        let mut reported = 0usize;
        for topic in &topics {
            let t = Instant::now();
            tree.for_each_match(black_box(topic), |k, v| {
                black_box((k, v));
                reported += 1;
            });
            samples.push(t.elapsed().as_nanos());
        }
        let (median, p99) = percentiles(samples);
        let t = Instant::now();
        for topic in &topics {
            tree.for_each_match(black_box(topic), |k, v| {
                black_box((k, v));
            });
        }
        let mean = t.elapsed().as_nanos() / topics.len() as u128;
        let t = Instant::now();
        for _ in 0..topics.len() {
            tree.for_each_match(black_box(&topics[0]), |k, v| {
                black_box((k, v));
            });
        }
        let hot = t.elapsed().as_nanos() / topics.len() as u128;
        let avg = reported as f64 / topics.len() as f64;
        println!(
            "  match 5-level topic ({label}, {avg:.1} avg reported): median {median} ns, \
             p99 {p99} ns, mean {mean} ns (untimed loop), {hot} ns in cache"
        );
    }

    let mut retained: RetainedIndex<u64> = RetainedIndex::new();
    for d in 0..100_000u64 {
        retained.insert(&format!("fleet/r{}/d{d}/state", d % 32), d);
    }
    for filter in ["#", "fleet/+/+/state", "fleet/r7/#", "fleet/r7/d39/state"] {
        let t = Instant::now();
        let mut n = 0usize;
        retained.for_each_match(filter, |topic, msg| {
            black_box((topic, msg));
            n += 1;
        });
        println!(
            "retained: {filter:?} over {} topics -> {n} in {:?}",
            retained.len(),
            t.elapsed()
        );
    }
}

#[test]
fn a_schema_check_on_a_topic_no_schema_covers_does_not_allocate() {
    // `[[schema]]` costs a PUBLISH nothing but a walk over the filters when none matches.
    use crate::config::SchemaConfig;
    use crate::guarantees::schema::SchemaRegistry;
    use crate::guarantees::Verdict;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("order.json");
    std::fs::write(&path, r#"{"type":"object","required":["id"]}"#).expect("write");
    let entry = |id: &str, filter: &str| SchemaConfig::new(id, filter, &path);
    let registry = SchemaRegistry::load(&[
        entry("order/v1", "orders/#"),
        entry("order/v2", "orders/#"),
        entry("reading", "sensors/+/reading"),
        entry("all", "+/+/+/+/+/deep"),
    ])
    .expect("compiles");
    for (topic, content_type) in [
        ("fleet/device-7/telemetry", None),
        ("sensors/x/state", Some("order/v1")),
        ("$SYS/broker/uptime", None),
        ("a/b/c/d/e/f", Some("reading")),
    ] {
        let mut verdict = None;
        let payload = br#"not json at all"#;
        let n = allocations_during(|| verdict = Some(registry.check(topic, content_type, payload)));
        assert_eq!(n, 0, "{topic}");
        assert!(matches!(verdict, Some(Verdict::Pass)));
    }
    // A covered topic does parse (and so allocate): the check is really made.
    let n = allocations_during(|| {
        let _ = registry.check("orders/1", None, br#"{"id":"a"}"#);
    });
    assert!(n > 0);
}

/// Every valid topic name of 1..=5 levels over the non-wildcard [`LEVELS`] (1,363 of them).
/// Why all of them: a filter of at most 4 levels over [`LEVELS`] that matches a topic the
/// other does not, or shares one with it, has such a witness among these (at most one level
/// longer than the filters, each level one of theirs or another literal), so `covers` and
/// `intersects` can be checked against their definitions exactly, not on luck.
static ALL_TOPICS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    let mut all: Vec<String> = Vec::new();
    let mut last: Vec<String> = vec![String::new()];
    for depth in 1..=5 {
        let mut next = Vec::with_capacity(last.len() * 4);
        for prefix in &last {
            for level in &LEVELS[..4] {
                next.push(if depth == 1 {
                    (*level).to_owned()
                } else {
                    format!("{prefix}/{level}")
                });
            }
        }
        all.extend(next.iter().cloned());
        last = next;
    }
    all.retain(|t| topic_name_error(t).is_none());
    all
});

/// Checks `matches` of both filters against the topic tree on every topic of `topics`,
/// `covers` / `intersects` of a topic name against `matches`, and `covers(outer, inner)` /
/// `intersects(outer, inner)` against their definitions over `topics` (which must hold the
/// witnesses, see [`ALL_TOPICS`]). Why a function: the proptest and the exhaustive test of
/// short filters share it.
fn agree(outer: &str, inner: &str, topics: &[String]) -> Result<(), TestCaseError> {
    let mut tree = TopicTree::new();
    tree.insert(outer, 0, 0);
    tree.insert(inner, 1, 1);
    let mut inner_not_outer = None;
    let mut both = None;
    for topic in topics {
        let found = tree_matches(&tree, topic);
        let (o, i) = (matches(outer, topic), matches(inner, topic));
        prop_assert_eq!(found.contains(&(0, 0)), o, "{} on {:?}", outer, topic);
        prop_assert_eq!(found.contains(&(1, 1)), i, "{} on {:?}", inner, topic);
        prop_assert_eq!(covers(outer, topic), o, "covers({}, {:?})", outer, topic);
        prop_assert_eq!(intersects(outer, topic), o, "{} ∩ {:?}", outer, topic);
        prop_assert_eq!(intersects(topic, outer), o, "{:?} ∩ {}", topic, outer);
        if i && !o {
            inner_not_outer.get_or_insert(topic.as_str());
        }
        if i && o {
            both.get_or_insert(topic.as_str());
        }
    }
    // The functions read the empty name as a topic of one empty level. MQTT-4.7.3-1 forbids
    // it as a topic name (the tree never sees one), but it is the witness of `+` ∩ `/#`.
    let (o, i) = (matches(outer, ""), matches(inner, ""));
    if i && !o {
        inner_not_outer.get_or_insert("");
    }
    if i && o {
        both.get_or_insert("");
    }
    prop_assert_eq!(
        covers(outer, inner),
        inner_not_outer.is_none(),
        "covers({}, {}); witness {:?}",
        outer,
        inner,
        inner_not_outer
    );
    prop_assert_eq!(
        intersects(outer, inner),
        both.is_some(),
        "{} ∩ {}; {:?}",
        outer,
        inner,
        both
    );
    prop_assert_eq!(
        intersects(inner, outer),
        both.is_some(),
        "{} ∩ {}",
        inner,
        outer
    );
    Ok(())
}

proptest! {
    // 1,363 topics per case, each looked up in the tree: 64 cases keep this well under a
    // second in a debug build on a 2-core CI runner.
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `matches` agrees with the topic tree (the routing path: insert the filter, look the topic
    /// up) on every topic; `covers` and `intersects` agree with their definitions ("every
    /// topic `inner` matches, `outer` matches"; "some topic matches both") over the same
    /// topics; and with a topic name for a filter both are `matches`.
    #[test]
    fn matching_agrees_with_topic_tree_and_definitions(outer in filter(), inner in filter()) {
        agree(&outer, &inner, &ALL_TOPICS)?;
    }
}

/// The same checks on every pair of valid filters of one or two levels over [`LEVELS`] (the
/// corner cases, such as `+/#` covering `#`, every time rather than by chance), over the
/// topics of up to three levels (where their witnesses are).
#[test]
fn matching_agrees_on_every_pair_of_short_filters() {
    let mut filters: Vec<String> = LEVELS.iter().map(|l| (*l).to_owned()).collect();
    for a in LEVELS {
        for b in LEVELS {
            filters.push(format!("{a}/{b}"));
        }
    }
    filters.retain(|f| is_valid_filter(f));
    let topics: Vec<String> = ALL_TOPICS
        .iter()
        .filter(|t| t.split('/').count() <= 3)
        .cloned()
        .collect();
    for outer in &filters {
        for inner in &filters {
            if let Err(e) = agree(outer, inner, &topics) {
                panic!("{e}");
            }
        }
    }
}
