//! Subscription matching with 100k and 1M subscriptions, in three mixes: all exact filters;
//! half exact, half `+`; and exact with `+` and `#`. Each iteration matches one topic from a
//! fixed pseudo-random set, the way a publish is routed.
//!
//! Sizes come from `TOPIC_TREE_SIZES` (default `100000,1000000`). Filling the tree is not
//! timed; with a naive stand-in tree (linear insert) use small sizes, e.g.
//! `TOPIC_TREE_SIZES=10000 cargo bench --bench topic_tree`.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use postbox::test_support::broker::topic_tree::TopicTree;

#[macro_use]
mod common;

const SITES: u64 = 100;
const METRICS: [&str; 4] = ["temp", "humidity", "pressure", "status"];
const QUERIES: usize = 1024;

/// Deterministic xorshift, so every run and every tree sees the same filters and topics.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Device topics are `site/<s>/dev/<d>/<metric>`; `devices` devices per site.
fn topic(site: u64, device: u64, metric: &str) -> String {
    format!("site/{site}/dev/{device}/{metric}")
}

#[derive(Clone, Copy)]
enum Mix {
    Exact,
    Plus,
    Hash,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Exact => "exact",
            Mix::Plus => "exact50-plus50",
            Mix::Hash => "exact80-plus10-hash10",
        }
    }

    /// The `i`-th filter of a tree of `n` subscriptions.
    fn filter(self, rng: &mut Rng, devices: u64) -> String {
        let (s, d) = (rng.below(SITES), rng.below(devices));
        let m = METRICS[rng.below(METRICS.len() as u64) as usize];
        let roll = rng.below(100);
        match (self, roll) {
            (Mix::Exact, _) => topic(s, d, m),
            (Mix::Plus, r) if r < 50 => topic(s, d, m),
            (Mix::Plus, r) if r < 75 => format!("site/{s}/dev/+/{m}"),
            (Mix::Plus, _) => format!("site/+/dev/{d}/{m}"),
            (Mix::Hash, r) if r < 80 => topic(s, d, m),
            (Mix::Hash, r) if r < 90 => format!("site/{s}/dev/+/{m}"),
            (Mix::Hash, r) if r < 95 => format!("site/{s}/dev/{d}/#"),
            (Mix::Hash, _) => format!("site/{s}/#"),
        }
    }
}

fn sizes() -> Vec<usize> {
    std::env::var("TOPIC_TREE_SIZES")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn build(mix: Mix, n: usize) -> TopicTree<u64, u32> {
    // About 10 subscriptions per device topic, like several apps per device.
    let devices = (n as u64 / SITES / 10).max(1);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tree = TopicTree::new();
    let started = Instant::now();
    for i in 0..n {
        tree.insert(&mix.filter(&mut rng, devices), i as u64, i as u32);
    }
    eprintln!(
        "topic_tree: built {} with {n} subscriptions in {:.2?}",
        mix.name(),
        started.elapsed()
    );
    tree
}

fn queries(n: usize) -> Vec<String> {
    let devices = (n as u64 / SITES / 10).max(1);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    (0..QUERIES)
        .map(|_| {
            let m = METRICS[rng.below(METRICS.len() as u64) as usize];
            topic(rng.below(SITES), rng.below(devices), m)
        })
        .collect()
}

fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("topic_tree_match");
    group.throughput(Throughput::Elements(1));
    for n in sizes() {
        for mix in [Mix::Exact, Mix::Plus, Mix::Hash] {
            let tree = build(mix, n);
            let topics = queries(n);
            let mut i = 0;
            group.bench_with_input(BenchmarkId::new(mix.name(), n), &tree, |b, tree| {
                b.iter(|| {
                    i = (i + 1) % topics.len();
                    let mut matched = 0u32;
                    tree.for_each_match(black_box(&topics[i]), |_, v| {
                        matched = matched.wrapping_add(*v);
                    });
                    black_box(matched)
                });
            });
        }
    }
    group.finish();
}

short_benches!(20; matching);
