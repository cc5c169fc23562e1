//! Model-based tests: both indexes against a plainly written reference matcher.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::retained::RetainedIndex;
use super::topic_tree::TopicTree;
use crate::codec::topic::{is_valid_filter, topic_name_error};

/// Reference matcher, written for obviousness rather than speed (MQTT §4.7).
fn matches(filter: &str, topic: &str) -> bool {
    // MQTT-4.7.2-1: wildcard-first filters never match '$' topics.
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let filter: Vec<&str> = filter.split('/').collect();
    let topic: Vec<&str> = topic.split('/').collect();
    for (i, f) in filter.iter().enumerate() {
        if *f == "#" {
            return true; // matches the parent level and any number of children
        }
        match topic.get(i) {
            Some(t) if *f == "+" || f == t => {}
            _ => return false,
        }
    }
    filter.len() == topic.len()
}

#[test]
fn reference_matcher_agrees_with_the_spec() {
    assert!(matches("sport/#", "sport"));
    assert!(matches("sport/+", "sport/"));
    assert!(!matches("sport/+", "sport"));
    assert!(!matches("+", "/finance"));
    assert!(!matches("#", "$SYS/x"));
    assert!(matches("$SYS/#", "$SYS"));
}

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
            prop_assert_eq!(tree_matches(&tree, topic), model_matches(&model, topic), "topic {:?}", topic);
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
            let expected: Vec<(String, u32)> =
                model.iter().filter(|(t, _)| matches(filter, t)).map(|(t, v)| (t.clone(), *v)).collect();
            prop_assert_eq!(found, expected, "filter {:?}", filter);
        }
        for t in model.keys() {
            prop_assert!(index.remove(t).is_some());
        }
        prop_assert!(index.is_empty());
        prop_assert_eq!(index.node_count(), 0);
    }
}
