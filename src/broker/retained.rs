//! Retained messages indexed by topic name, matched against a topic filter on every SUBSCRIBE.
//!
//! A trie over topic levels (children in a `LevelMap`: a short vector, or a foldhash map for
//! wide levels); each node may hold the retained message for exactly its topic, stored with the
//! full topic string so matches are reported without rebuilding names. A wildcard subscribe walks
//! only the branches its filter can match; `#` walks a whole subtree with a stack of child
//! iterators (depth-bounded, so no per-node allocation).
//!
//! Must not: allocate per match.

use std::fmt;
use std::mem;
use std::ptr;

use smallvec::SmallVec;

use super::level_map::{self, LevelMap};
use super::trie::{self, split_level, TrieNode};

/// Retained messages indexed by topic, so a wildcard subscribe walks only matching branches.
///
/// Topics must already be valid topic names (no wildcards; see
/// [`crate::codec::topic::topic_name_error`]).
pub(crate) struct RetainedIndex<M> {
    root: Node<M>,
    len: usize,
}

/// One topic level.
struct Node<M> {
    /// Child levels.
    children: LevelMap<Node<M>>,
    /// The retained message whose topic ends exactly here, with that topic.
    retained: Option<(Box<str>, M)>,
}

impl<M> Node<M> {
    const fn new() -> Self {
        Self {
            children: LevelMap::new(),
            retained: None,
        }
    }

    fn child_or_insert(&mut self, level: &str) -> &mut Node<M> {
        self.children.get_or_insert_with(level, Node::new)
    }

    #[inline]
    fn report<F: FnMut(&str, &M)>(&self, f: &mut F) {
        if let Some((topic, msg)) = &self.retained {
            f(topic, msg);
        }
    }
}

impl<M> TrieNode for Node<M> {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.retained.is_none()
    }

    /// True if the node's only content is a single child (the next node on some path).
    fn holds_only_one_child(&self) -> bool {
        self.retained.is_none() && self.children.len() == 1
    }

    fn child(&self, level: &str) -> Option<&Node<M>> {
        self.children.get(level)
    }

    fn child_mut(&mut self, level: &str) -> Option<&mut Node<M>> {
        self.children.get_mut(level)
    }

    fn remove_child(&mut self, level: &str) {
        if let Some(mut child) = self.children.remove(level) {
            teardown(&mut child);
        }
    }
}

/// A pending piece of a filter walk.
enum Frame<'a, M> {
    /// Match a node against the filter levels still to match (`None`: filter exhausted).
    Visit(&'a Node<M>, Option<&'a str>),
    /// A `+` level: visit each remaining child with the levels after the `+`.
    /// The flag skips `$` children (MQTT-4.7.2-1, only at the root).
    EachChild(level_map::Iter<'a, Node<M>>, Option<&'a str>, bool),
    /// A `#` level: report every message in the remaining children's subtrees. Same flag.
    Subtrees(level_map::Iter<'a, Node<M>>, bool),
}

/// Next child of `iter`, skipping `$`-prefixed levels if `skip_system`.
#[inline]
fn next_child<'a, M>(
    iter: &mut level_map::Iter<'a, Node<M>>,
    skip_system: bool,
) -> Option<&'a Node<M>> {
    iter.find(|(level, _)| !(skip_system && level.first() == Some(&b'$')))
        .map(|(_, node)| node)
}

impl<M> RetainedIndex<M> {
    /// An empty index.
    pub(crate) const fn new() -> Self {
        Self {
            root: Node::new(),
            len: 0,
        }
    }

    /// Stores/replaces the message for `topic`; returns the old one.
    pub(crate) fn insert(&mut self, topic: &str, msg: M) -> Option<M> {
        let mut node = &mut self.root;
        for level in topic.split('/') {
            node = node.child_or_insert(level);
        }
        match &mut node.retained {
            Some((_, old)) => Some(mem::replace(old, msg)),
            None => {
                node.retained = Some((topic.into(), msg));
                self.len += 1;
                None
            }
        }
    }

    /// Clears `topic` (a retained PUBLISH with an empty payload); prunes empty nodes.
    pub(crate) fn remove(&mut self, topic: &str) -> Option<M> {
        let mut node = &mut self.root;
        for level in topic.split('/') {
            node = node.child_mut(level)?;
        }
        let (_, msg) = node.retained.take()?;
        self.len -= 1;
        if node.is_empty() {
            self.prune(topic);
        }
        Some(msg)
    }

    /// Removes the nodes at the end of `topic`'s path that hold nothing else.
    fn prune(&mut self, topic: &str) {
        trie::prune(&mut self.root, topic.split('/'));
    }

    /// The retained message for exactly `topic`.
    pub(crate) fn get(&self, topic: &str) -> Option<&M> {
        let mut node = &self.root;
        for level in topic.split('/') {
            node = node.child(level)?;
        }
        node.retained.as_ref().map(|(_, msg)| msg)
    }

    /// Calls `f(topic, msg)` for every retained message whose topic matches `filter`.
    ///
    /// Same rules as subscription matching, including MQTT-4.7.2-1: `#` and `+/...` do not
    /// return `$SYS/x`. `filter` must be valid. Allocates only for walks more than 16 levels deep.
    pub(crate) fn for_each_match<F: FnMut(&str, &M)>(&self, filter: &str, mut f: F) {
        let mut stack: SmallVec<[Frame<'_, M>; 16]> = SmallVec::new();
        stack.push(Frame::Visit(&self.root, Some(filter)));
        while let Some(frame) = stack.last_mut() {
            match frame {
                Frame::Visit(node, rest) => {
                    let (node, rest) = (*node, *rest);
                    stack.pop();
                    let Some(levels) = rest else {
                        node.report(&mut f);
                        continue;
                    };
                    let at_root = ptr::eq(node, &raw const self.root);
                    let (level, rest) = split_level(levels);
                    if level == "#" {
                        // `x/#` matches `x` itself too (MQTT 4.7.1.2).
                        node.report(&mut f);
                    }
                    let children = &node.children;
                    match level {
                        "#" => stack.push(Frame::Subtrees(children.iter(), at_root)),
                        "+" => stack.push(Frame::EachChild(children.iter(), rest, at_root)),
                        _ => {
                            if let Some(child) = children.get(level) {
                                stack.push(Frame::Visit(child, rest));
                            }
                        }
                    }
                }
                Frame::EachChild(iter, rest, skip_system) => {
                    let rest = *rest;
                    match next_child(iter, *skip_system) {
                        Some(child) => stack.push(Frame::Visit(child, rest)),
                        None => {
                            stack.pop();
                        }
                    }
                }
                Frame::Subtrees(iter, skip_system) => match next_child(iter, *skip_system) {
                    Some(child) => {
                        child.report(&mut f);
                        if !child.children.is_empty() {
                            stack.push(Frame::Subtrees(child.children.iter(), false));
                        }
                    }
                    None => {
                        stack.pop();
                    }
                },
            }
        }
    }

    /// Number of retained messages.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Retained messages under a `$` first level (`$SYS/...`, `$dlq/...`): what `#` does not
    /// match (MQTT-4.7.2-1), so operators can be told which share of [`Self::len`] the
    /// admin API's unprefixed listing leaves out (issue 37, item 5: the status page counted
    /// 49 retained where the API listed 1). Walks only those subtrees, at request time; the
    /// publish path keeps no count for it.
    pub(crate) fn system_len(&self) -> usize {
        let mut count = 0;
        let mut pending: Vec<&Node<M>> = self
            .root
            .children
            .iter()
            .filter(|(level, _)| level.first() == Some(&b'$'))
            .map(|(_, node)| node)
            .collect();
        while let Some(node) = pending.pop() {
            count += usize::from(node.retained.is_some());
            pending.extend(node.children.iter().map(|(_, child)| child));
        }
        count
    }

    /// True if no message is retained.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of nodes below the root; lets tests check that removal prunes everything.
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        trie::count_below(&self.root, |node| {
            node.children.iter().map(|(_, child)| child)
        })
    }
}

impl<M> Default for RetainedIndex<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> Drop for RetainedIndex<M> {
    fn drop(&mut self) {
        teardown(&mut self.root);
    }
}

/// Drops everything below `node` without recursion: a topic may have ~64k levels, and a pruned
/// branch can be that deep too.
fn teardown<M>(node: &mut Node<M>) {
    let mut pending: Vec<Node<M>> = Vec::new();
    node.children.drain_into(&mut pending);
    while let Some(mut node) = pending.pop() {
        node.children.drain_into(&mut pending);
    }
}

impl<M> fmt::Debug for RetainedIndex<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetainedIndex")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPICS: [&str; 12] = [
        "sport",
        "sport/tennis",
        "sport/tennis/player1",
        "sport/tennis/player1/ranking",
        "sport/tennis/player2",
        "sport/",
        "/finance",
        "finance",
        "a//b",
        "$SYS",
        "$SYS/monitor/Clients",
        "Accounts payable",
    ];

    fn index() -> RetainedIndex<usize> {
        let mut index = RetainedIndex::new();
        for (i, topic) in TOPICS.iter().enumerate() {
            assert_eq!(index.insert(topic, i), None);
        }
        index
    }

    /// Sorted topics whose retained message `filter` returns; checks the message too.
    fn matching(index: &RetainedIndex<usize>, filter: &str) -> Vec<String> {
        let mut out = Vec::new();
        index.for_each_match(filter, |topic, msg| {
            assert_eq!(TOPICS.get(*msg), Some(&topic));
            out.push(topic.to_owned());
        });
        out.sort_unstable();
        out
    }

    fn sorted(topics: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = topics.iter().map(ToString::to_string).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn multi_level_wildcard_spec_examples() {
        // 3.1.1 / 5.0 §4.7.1.2: "x/#" returns x itself and everything below it.
        let index = index();
        assert_eq!(
            matching(&index, "sport/tennis/player1/#"),
            sorted(&["sport/tennis/player1", "sport/tennis/player1/ranking"])
        );
        assert_eq!(
            matching(&index, "sport/#"),
            sorted(&[
                "sport",
                "sport/",
                "sport/tennis",
                "sport/tennis/player1",
                "sport/tennis/player1/ranking",
                "sport/tennis/player2"
            ])
        );
        // MQTT-4.7.2-1: "#" returns everything except '$' topics.
        let all: Vec<&str> = TOPICS
            .iter()
            .copied()
            .filter(|t| !t.starts_with('$'))
            .collect();
        assert_eq!(matching(&index, "#"), sorted(&all));
    }

    #[test]
    fn single_level_wildcard_spec_examples_mqtt_4_7_1_2() {
        let index = index();
        assert_eq!(
            matching(&index, "sport/tennis/+"),
            sorted(&["sport/tennis/player1", "sport/tennis/player2"])
        );
        assert_eq!(
            matching(&index, "sport/+"),
            sorted(&["sport/", "sport/tennis"])
        );
        assert_eq!(
            matching(&index, "+/+"),
            sorted(&["/finance", "sport/", "sport/tennis"])
        );
        assert_eq!(matching(&index, "/+"), sorted(&["/finance"]));
        assert_eq!(
            matching(&index, "+"),
            sorted(&["Accounts payable", "finance", "sport"])
        );
        assert_eq!(matching(&index, "a/+/b"), sorted(&["a//b"]));
        assert_eq!(
            matching(&index, "+/tennis/#"),
            sorted(&[
                "sport/tennis",
                "sport/tennis/player1",
                "sport/tennis/player1/ranking",
                "sport/tennis/player2"
            ])
        );
    }

    #[test]
    fn dollar_topics_mqtt_4_7_2_1() {
        let index = index();
        assert_eq!(matching(&index, "+/monitor/Clients"), Vec::<String>::new());
        assert_eq!(
            matching(&index, "$SYS/#"),
            sorted(&["$SYS", "$SYS/monitor/Clients"])
        );
        assert_eq!(
            matching(&index, "$SYS/monitor/+"),
            sorted(&["$SYS/monitor/Clients"])
        );
        assert_eq!(matching(&index, "$SYS"), sorted(&["$SYS"]));
    }

    /// `system_len` counts exactly what `#` leaves out (MQTT-4.7.2-1): the overview's
    /// retained count and the API's unprefixed listing agree (issue 37, item 5).
    #[test]
    fn system_len_is_what_hash_does_not_match() {
        let mut index = index();
        let listed = |index: &RetainedIndex<usize>| {
            let mut n = 0;
            index.for_each_match("#", |_, _| n += 1);
            n
        };
        assert_eq!(index.system_len(), 2, "$SYS and $SYS/monitor/Clients");
        index.insert("$dlq/a/b", 0);
        assert_eq!(index.system_len(), 3);
        assert_eq!(listed(&index) + index.system_len(), index.len());
        index.remove("$SYS");
        assert_eq!(listed(&index) + index.system_len(), index.len());
    }

    #[test]
    fn exact_filters_and_no_normalization_mqtt_4_7_3_4() {
        let index = index();
        assert_eq!(matching(&index, "finance"), sorted(&["finance"]));
        assert_eq!(matching(&index, "Finance"), Vec::<String>::new());
        assert_eq!(matching(&index, "sport/tennis"), sorted(&["sport/tennis"]));
        assert_eq!(
            matching(&index, "sport/tennis/player3"),
            Vec::<String>::new()
        );
        assert_eq!(
            matching(&index, "Accounts payable"),
            sorted(&["Accounts payable"])
        );
    }

    #[test]
    fn insert_replaces_remove_prunes() {
        let mut index = index();
        assert_eq!(index.len(), TOPICS.len());
        assert_eq!(index.insert("sport", 0), Some(0));
        assert_eq!(index.get("sport/tennis"), Some(&1));
        assert_eq!(index.get("sport/tennis/player3"), None);
        assert_eq!(index.remove("sport/tennis/player3"), None);
        assert_eq!(index.remove("sport/tennis/player1"), Some(2));
        assert_eq!(index.remove("sport/tennis/player1"), None);
        // The node stays: "sport/tennis/player1/ranking" lives below it.
        assert_eq!(
            matching(&index, "sport/tennis/+/ranking"),
            sorted(&["sport/tennis/player1/ranking"])
        );
        for topic in TOPICS {
            index.remove(topic);
        }
        assert!(index.is_empty());
        assert_eq!(index.node_count(), 0);
    }

    #[test]
    fn deep_topics_do_not_overflow_the_stack() {
        // A topic name may have ~64k levels; matching, pruning and dropping are iterative.
        let topic = vec![""; 60_000].join("/");
        let mut index = RetainedIndex::new();
        index.insert(&topic, 1);
        index.insert("a", 2);
        let mut count = 0;
        index.for_each_match("#", |_, _| count += 1);
        assert_eq!(count, 2);
        assert_eq!(index.remove(&topic), Some(1));
        assert_eq!(index.node_count(), 1);
        index.insert(&topic, 1);
        drop(index);
    }

    #[test]
    fn many_topics_under_one_wildcard() {
        let mut index = RetainedIndex::new();
        for i in 0..10_000 {
            index.insert(&format!("fleet/d{i}/state"), i);
        }
        let mut count = 0;
        index.for_each_match("fleet/+/state", |_, _| count += 1);
        assert_eq!(count, 10_000);
        for i in 0..10_000 {
            assert_eq!(index.remove(&format!("fleet/d{i}/state")), Some(i));
        }
        assert_eq!(index.node_count(), 0);
    }
}
