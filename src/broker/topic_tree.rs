//! Subscription index: topic filter -> subscribers, matched against a topic name on every PUBLISH.
//!
//! A trie over filter levels. Each node keeps its literal children in a `LevelMap` (a short
//! vector, or a foldhash map for wide levels; looked up by `&str`, no allocation), its `+` child
//! in a dedicated field, the subscribers of `<this node>/#` in a dedicated field (a `#` level can
//! have no children), and the subscribers whose filter ends exactly here. Matching walks the
//! topic's levels as `&str` slices with a small inline stack, so it neither allocates nor recurses.
//!
//! Subscriber sets are a contiguous vector of `(K, V)` holding one entry inline (the common case
//! needs no allocation), fast to iterate for fan-out, plus, once a set grows past `INDEX_ABOVE`
//! (8) entries, a key -> position map so that insert and remove stay O(1) for nodes with 10k+
//! subscribers. Removal is `swap_remove`.
//!
//! Must not: allocate per match.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::mem;

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::level_map::LevelMap;
use super::trie::{self, split_level, TrieNode};

/// Above this many subscribers a node keeps a key -> position index.
const INDEX_ABOVE: usize = 8;
/// The index is dropped again at this size (hysteresis, so churn around the threshold is cheap).
const UNINDEX_AT: usize = 4;
/// Subscriber sets with at least this capacity are shrunk once they are less than a quarter full.
const SHRINK_ABOVE: usize = 32;

/// Subscription index: filter -> subscribers. Generic so the router decides what a subscriber is.
///
/// `K` identifies a subscriber (a session id in practice); `V` is the per-subscription data
/// (granted QoS, options, subscription identifier...). Filters must already be valid
/// (see [`crate::codec::topic::is_valid_filter`]); `$share/` prefixes are the router's business.
pub struct TopicTree<K, V> {
    root: Node<K, V>,
    len: usize,
}

/// One filter level.
struct Node<K, V> {
    /// Literal child levels (never `+` or `#`).
    children: LevelMap<Node<K, V>>,
    /// The `+` child.
    plus: Option<Box<Node<K, V>>>,
    /// Subscribers of `<this level>/#` (at the root: of `#`).
    multi: Option<Box<Subscribers<K, V>>>,
    /// Subscribers whose filter ends exactly at this level.
    subs: Subscribers<K, V>,
}

/// The subscribers of one filter: contiguous for iteration, indexed when large.
struct Subscribers<K, V> {
    entries: SmallVec<[(K, V); 1]>,
    /// Key -> position in `entries`; present only above [`INDEX_ABOVE`] entries. Boxed: one
    /// pointer instead of a 40-byte inline map in every (usually small) subscriber set.
    #[allow(clippy::box_collection)]
    index: Option<Box<HashMap<K, usize, RandomState>>>,
}

impl<K: Copy + Eq + Hash, V> Subscribers<K, V> {
    const fn new() -> Self {
        Self {
            entries: SmallVec::new_const(),
            index: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &K) -> Option<usize> {
        match &self.index {
            Some(index) => index.get(key).copied(),
            None => self.entries.iter().position(|(k, _)| k == key),
        }
    }

    fn get(&self, key: &K) -> Option<&V> {
        let i = self.position(key)?;
        self.entries.get(i).map(|(_, v)| v)
    }

    fn insert(&mut self, key: K, value: V) -> Option<V> {
        if let Some(i) = self.position(&key) {
            return Some(mem::replace(&mut self.entries[i].1, value));
        }
        self.entries.push((key, value));
        let last = self.entries.len() - 1;
        match &mut self.index {
            Some(index) => {
                index.insert(key, last);
            }
            None if self.entries.len() > INDEX_ABOVE => {
                let index = self
                    .entries
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (*k, i))
                    .collect();
                self.index = Some(Box::new(index));
            }
            None => {}
        }
        None
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.position(key)?;
        let (_, value) = self.entries.swap_remove(i);
        if let Some(index) = &mut self.index {
            index.remove(key);
            if let Some((moved, _)) = self.entries.get(i) {
                index.insert(*moved, i);
            }
            if self.entries.len() <= UNINDEX_AT {
                self.index = None;
            } else if index.capacity() >= SHRINK_ABOVE && index.len() < index.capacity() / 4 {
                index.shrink_to(index.len() * 2);
            }
        }
        let cap = self.entries.capacity();
        if cap >= SHRINK_ABOVE && self.entries.len() < cap / 4 {
            self.entries.shrink_to_fit();
        }
        Some(value)
    }

    #[inline]
    fn report<F: FnMut(&K, &V)>(&self, f: &mut F) {
        for (k, v) in &self.entries {
            f(k, v);
        }
    }
}

impl<K: Copy + Eq + Hash, V> Node<K, V> {
    const fn new() -> Self {
        Self {
            children: LevelMap::new(),
            plus: None,
            multi: None,
            subs: Subscribers::new(),
        }
    }

    fn child_or_insert(&mut self, level: &str) -> &mut Node<K, V> {
        if level == "+" {
            return self.plus.get_or_insert_with(|| Box::new(Node::new()));
        }
        self.children.get_or_insert_with(level, Node::new)
    }

    /// Pushes the children that match topic level `level`; `rest` is what follows it.
    #[inline]
    fn push_matching_children<'a>(
        &'a self,
        level: &str,
        rest: Option<&'a str>,
        allow_plus: bool,
        stack: &mut Stack<'a, K, V>,
    ) {
        if let Some(child) = self.children.get(level) {
            stack.push((child, rest));
        }
        if allow_plus {
            if let Some(plus) = &self.plus {
                stack.push((plus, rest));
            }
        }
    }
}

impl<K: Copy + Eq + Hash, V> TrieNode for Node<K, V> {
    /// True if the node holds nothing and can be pruned.
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.multi.is_none()
            && self.subs.is_empty()
    }

    /// True if the node's only content is a single child (the next node on some path).
    fn holds_only_one_child(&self) -> bool {
        let plus = usize::from(self.plus.is_some());
        self.multi.is_none() && self.subs.is_empty() && self.children.len() + plus == 1
    }

    fn child(&self, level: &str) -> Option<&Node<K, V>> {
        if level == "+" {
            self.plus.as_deref()
        } else {
            self.children.get(level)
        }
    }

    fn child_mut(&mut self, level: &str) -> Option<&mut Node<K, V>> {
        if level == "+" {
            self.plus.as_deref_mut()
        } else {
            self.children.get_mut(level)
        }
    }

    fn remove_child(&mut self, level: &str) {
        if level == "+" {
            if let Some(mut plus) = self.plus.take() {
                teardown(&mut plus);
            }
            return;
        }
        if let Some(mut child) = self.children.remove(level) {
            teardown(&mut child);
        }
    }
}

/// Walk stack: a node and the topic levels still to match below it (`None`: topic exhausted).
type Stack<'a, K, V> = SmallVec<[(&'a Node<K, V>, Option<&'a str>); 16]>;

/// Splits a valid filter into the levels before a trailing `#` and whether there is one.
fn parse_filter(filter: &str) -> (impl Iterator<Item = &str> + Clone, bool) {
    let (path, multi) = if filter == "#" {
        (None, true)
    } else if let Some(path) = filter.strip_suffix("/#") {
        (Some(path), true)
    } else {
        (Some(filter), false)
    };
    (path.into_iter().flat_map(|p| p.split('/')), multi)
}

impl<K: Copy + Eq + Hash, V> TopicTree<K, V> {
    /// An empty index.
    pub const fn new() -> Self {
        Self {
            root: Node::new(),
            len: 0,
        }
    }

    /// Adds or replaces key's subscription to `filter`; returns the replaced value.
    pub fn insert(&mut self, filter: &str, key: K, value: V) -> Option<V> {
        let (levels, multi) = parse_filter(filter);
        let mut node = &mut self.root;
        for level in levels {
            node = node.child_or_insert(level);
        }
        let subs = if multi {
            node.multi
                .get_or_insert_with(|| Box::new(Subscribers::new()))
        } else {
            &mut node.subs
        };
        let old = subs.insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes key's subscription to `filter`; returns it. Prunes empty nodes (memory stays
    /// bounded under churn).
    pub fn remove(&mut self, filter: &str, key: K) -> Option<V> {
        let (levels, multi) = parse_filter(filter);
        let mut node = &mut self.root;
        for level in levels.clone() {
            node = node.child_mut(level)?;
        }
        let removed = if multi {
            let subs = node.multi.as_mut()?;
            let removed = subs.remove(&key)?;
            if subs.is_empty() {
                node.multi = None;
            }
            removed
        } else {
            node.subs.remove(&key)?
        };
        self.len -= 1;
        if node.is_empty() {
            self.prune(levels);
        }
        Some(removed)
    }

    /// Removes the nodes at the end of `levels` that hold nothing but that path.
    fn prune<'f>(&mut self, levels: impl Iterator<Item = &'f str> + Clone) {
        trie::prune(&mut self.root, levels);
    }

    /// Calls `f(key, value)` for every subscription whose filter matches `topic`.
    ///
    /// A key may be reported several times (overlapping filters); the router merges them.
    /// Topics starting with `$` are not matched by filters starting with `+` or `#`
    /// (MQTT-4.7.2-1). Does not allocate unless the walk is deeper than 16 pending branches.
    pub fn for_each_match<F: FnMut(&K, &V)>(&self, topic: &str, mut f: F) {
        let root = &self.root;
        let system = topic.starts_with('$');
        if !system {
            if let Some(multi) = &root.multi {
                multi.report(&mut f);
            }
        }
        let mut stack = Stack::new();
        let (level, rest) = split_level(topic);
        root.push_matching_children(level, rest, !system, &mut stack);
        while let Some((node, rest)) = stack.pop() {
            // `x/#` matches `x` itself and everything below it (MQTT 4.7.1.2).
            if let Some(multi) = &node.multi {
                multi.report(&mut f);
            }
            match rest {
                None => node.subs.report(&mut f),
                Some(levels) => {
                    let (level, rest) = split_level(levels);
                    node.push_matching_children(level, rest, true, &mut stack);
                }
            }
        }
    }

    /// The value of key's subscription to exactly `filter` (no wildcard matching).
    pub fn get(&self, filter: &str, key: K) -> Option<&V> {
        let (levels, multi) = parse_filter(filter);
        let mut node = &self.root;
        for level in levels {
            node = node.child(level)?;
        }
        if multi {
            node.multi.as_ref()?.get(&key)
        } else {
            node.subs.get(&key)
        }
    }

    /// Number of (filter, key) subscriptions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of nodes below the root; lets tests check that removal prunes everything.
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        trie::count_below(&self.root, |node| {
            let literal = node.children.iter().map(|(_, child)| child);
            literal.chain(node.plus.as_deref())
        })
    }
}

impl<K: Copy + Eq + Hash, V> Default for TopicTree<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> Drop for TopicTree<K, V> {
    fn drop(&mut self) {
        teardown(&mut self.root);
    }
}

/// Drops everything below `node` without recursion: a filter may have ~32k levels, and a pruned
/// branch can be that deep too.
fn teardown<K, V>(node: &mut Node<K, V>) {
    let mut pending = Vec::new();
    detach(node, &mut pending);
    while let Some(mut node) = pending.pop() {
        detach(&mut node, &mut pending);
    }
}

/// Moves a node's children into `out`.
fn detach<K, V>(node: &mut Node<K, V>, out: &mut Vec<Node<K, V>>) {
    node.children.drain_into(out);
    if let Some(plus) = node.plus.take() {
        out.push(*plus);
    }
}

impl<K, V> fmt::Debug for TopicTree<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopicTree")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sorted `(key, value)` pairs reported for `topic`.
    fn matches(tree: &TopicTree<u64, &'static str>, topic: &str) -> Vec<(u64, &'static str)> {
        let mut out = Vec::new();
        tree.for_each_match(topic, |k, v| out.push((*k, *v)));
        out.sort_unstable();
        out
    }

    /// Tree with one subscriber (key 1) on `filter`.
    fn single(filter: &'static str) -> TopicTree<u64, &'static str> {
        let mut tree = TopicTree::new();
        tree.insert(filter, 1, filter);
        tree
    }

    fn assert_matches(filter: &'static str, topic: &str, expected: bool) {
        let found = !matches(&single(filter), topic).is_empty();
        assert_eq!(found, expected, "filter {filter:?} vs topic {topic:?}");
    }

    #[test]
    fn multi_level_wildcard_spec_examples() {
        // 3.1.1 §4.7.1.2 / 5.0 §4.7.1.2.
        for topic in [
            "sport/tennis/player1",
            "sport/tennis/player1/ranking",
            "sport/tennis/player1/score/wimbledon",
        ] {
            assert_matches("sport/tennis/player1/#", topic, true);
        }
        // "sport/#" also matches the parent level "sport".
        assert_matches("sport/#", "sport", true);
        assert_matches("sport/#", "sports", false);
        assert_matches("sport/tennis/#", "sport", false);
        // "#" matches every topic (not starting with '$').
        for topic in ["a", "/", "a/b/c", "//"] {
            assert_matches("#", topic, true);
        }
    }

    #[test]
    fn single_level_wildcard_spec_examples_mqtt_4_7_1_2() {
        // 3.1.1 §4.7.1.3 / 5.0 §4.7.1.3; MQTT-4.7.1-2: '+' occupies exactly one level.
        assert_matches("sport/tennis/+", "sport/tennis/player1", true);
        assert_matches("sport/tennis/+", "sport/tennis/player2", true);
        assert_matches("sport/tennis/+", "sport/tennis/player1/ranking", false);
        assert_matches("sport/+", "sport", false);
        assert_matches("sport/+", "sport/", true); // '+' matches an empty level
        assert_matches("+/+", "/finance", true);
        assert_matches("/+", "/finance", true);
        assert_matches("+", "/finance", false);
        assert_matches("+", "finance", true);
        assert_matches("+/tennis/#", "sport/tennis/player1", true);
        assert_matches("+/tennis/#", "sport/tennis", true);
        assert_matches("+/tennis/#", "sport/golf", false);
    }

    #[test]
    fn dollar_topics_mqtt_4_7_2_1() {
        // MQTT-4.7.2-1: filters starting with a wildcard don't match topics starting with '$'.
        assert_matches("#", "$SYS/monitor/Clients", false);
        assert_matches("+/monitor/Clients", "$SYS/monitor/Clients", false);
        assert_matches("+", "$SYS", false);
        assert_matches("#", "$", false);
        assert_matches("$SYS/#", "$SYS/monitor/Clients", true);
        assert_matches("$SYS/#", "$SYS", true);
        assert_matches("$SYS/monitor/+", "$SYS/monitor/Clients", true);
        // Only the first character of the topic matters.
        assert_matches("a/+", "a/$b", true);
        assert_matches("a/#", "a/$b/c", true);
    }

    #[test]
    fn topic_semantics_mqtt_4_7_3_4() {
        // §4.7.3: case-sensitive, spaces allowed, a leading '/' makes a distinct empty level.
        assert_matches("ACCOUNTS", "Accounts", false);
        assert_matches("Accounts payable", "Accounts payable", true);
        assert_matches("/finance", "finance", false);
        assert_matches("finance", "/finance", false);
        assert_matches("a//b", "a//b", true);
        assert_matches("a//b", "a/b", false);
        assert_matches("a/+/b", "a//b", true);
        // MQTT-4.7.3-4: no normalization ("é" precomposed vs decomposed are different levels).
        assert_matches("caf\u{e9}", "cafe\u{301}", false);
    }

    #[test]
    fn overlapping_filters_report_each_subscription() {
        let mut tree = TopicTree::new();
        tree.insert("a/b", 1, "exact");
        tree.insert("a/+", 1, "plus");
        tree.insert("#", 1, "hash");
        tree.insert("a/#", 2, "a-hash");
        tree.insert("+/+", 3, "plus-plus");
        tree.insert("a/c", 4, "other");
        assert_eq!(
            matches(&tree, "a/b"),
            vec![
                (1, "exact"),
                (1, "hash"),
                (1, "plus"),
                (2, "a-hash"),
                (3, "plus-plus")
            ]
        );
        assert_eq!(tree.len(), 6);
    }

    #[test]
    fn insert_replaces_and_remove_returns() {
        let mut tree = TopicTree::new();
        assert_eq!(tree.insert("a/#", 7, "v1"), None);
        assert_eq!(tree.insert("a/#", 7, "v2"), Some("v1"));
        assert_eq!(tree.len(), 1);
        assert_eq!(tree.get("a/#", 7), Some(&"v2"));
        assert_eq!(tree.get("a", 7), None);
        assert_eq!(tree.get("a/+", 7), None);
        assert_eq!(tree.remove("a", 7), None);
        assert_eq!(tree.remove("a/#", 8), None);
        assert_eq!(tree.remove("a/#", 7), Some("v2"));
        assert_eq!(tree.remove("a/#", 7), None);
        assert!(tree.is_empty());
        assert_eq!(tree.node_count(), 0);
    }

    #[test]
    fn removal_prunes_only_empty_branches() {
        let mut tree = TopicTree::new();
        tree.insert("a/b/c/d", 1, "deep");
        tree.insert("a/b", 1, "mid");
        tree.insert("a/+/c", 2, "plus");
        assert_eq!(tree.node_count(), 6); // a, b, c, d, +, c
        tree.remove("a/b/c/d", 1);
        assert_eq!(tree.node_count(), 4); // "a/b" keeps a, b
        tree.remove("a/b", 1);
        assert_eq!(tree.node_count(), 3);
        assert_eq!(matches(&tree, "a/x/c"), vec![(2, "plus")]);
        tree.remove("a/+/c", 2);
        assert_eq!(tree.node_count(), 0);
        assert!(tree.is_empty());
    }

    #[test]
    fn large_fan_out_node_indexes_and_shrinks() {
        let mut tree = TopicTree::new();
        let n = 20_000u64;
        for key in 0..n {
            assert_eq!(tree.insert("fleet/+/state", key, key), None);
        }
        assert_eq!(tree.insert("fleet/+/state", 5, 50), Some(5));
        let mut count = 0;
        tree.for_each_match("fleet/x/state", |_, _| count += 1);
        assert_eq!(count, n);
        // Remove in a scrambled order so swap_remove moves entries around.
        for key in (0..n).map(|i| (i * 7919) % n) {
            let expected = if key == 5 { 50 } else { key };
            assert_eq!(
                tree.remove("fleet/+/state", key),
                Some(expected),
                "key {key}"
            );
            if key % 1000 == 0 {
                assert_eq!(tree.get("fleet/+/state", key), None);
            }
        }
        assert!(tree.is_empty());
        assert_eq!(tree.node_count(), 0);
    }

    #[test]
    fn deep_filters_do_not_overflow_the_stack() {
        // The longest valid filter is ~32k levels; matching, pruning and dropping are iterative.
        let filter = vec!["+"; 30_000].join("/");
        let topic = vec!["x"; 30_000].join("/");
        let mut tree = TopicTree::new();
        tree.insert(&filter, 1u64, ());
        tree.insert("#", 2, ());
        let mut count = 0;
        tree.for_each_match(&topic, |_, ()| count += 1);
        assert_eq!(count, 2);
        assert_eq!(tree.node_count(), 30_000);
        tree.insert(&format!("{filter}/#"), 3, ());
        drop(tree);

        let mut tree = TopicTree::new();
        tree.insert(&filter, 1u64, ());
        assert_eq!(tree.remove(&filter, 1), Some(()));
        assert_eq!(tree.node_count(), 0);
    }
}
