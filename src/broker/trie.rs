//! Path operations shared by the two level tries (subscriptions and retained messages).
//!
//! Must not: allocate per match.

/// What the shared path operations need from a trie node.
pub(super) trait TrieNode: Sized {
    /// The child for one level name (`+` included where the trie stores it).
    fn child(&self, level: &str) -> Option<&Self>;
    /// Mutable child for one level name.
    fn child_mut(&mut self, level: &str) -> Option<&mut Self>;
    /// Detaches the child for one level name.
    fn remove_child(&mut self, level: &str);
    /// Holds nothing: no value and no children.
    fn is_empty(&self) -> bool;
    /// Holds no value and exactly one child (so it only exists for the path below it).
    fn holds_only_one_child(&self) -> bool;
}

/// Splits off the first level: `"a/b/c"` -> `("a", Some("b/c"))`, `"a"` -> `("a", None)`.
#[inline]
pub(super) fn split_level(levels: &str) -> (&str, Option<&str>) {
    // A byte loop, not `split_once('/')`: levels are a few bytes long, and the general char
    // searcher (set up for `memchr` at each call) cost about 130 instructions a level, 5% of a
    // routed QoS 1 message (callgrind, fan-in). `/` is ASCII, so both slices are on char
    // boundaries.
    match levels.bytes().position(|b| b == b'/') {
        Some(i) => (&levels[..i], Some(&levels[i + 1..])),
        None => (levels, None),
    }
}

/// Removes the longest run of nodes at the end of the path `levels` that hold nothing but that
/// path, so memory stays bounded under subscribe/unsubscribe and retain/clear churn.
pub(super) fn prune<'p, N: TrieNode>(root: &mut N, levels: impl Iterator<Item = &'p str> + Clone) {
    // Depth (root = 0) of the shallowest node from which the rest of the path is removable.
    let mut cut = None;
    let mut node = &*root;
    let mut path = levels.clone().peekable();
    let mut depth = 0;
    while let Some(level) = path.next() {
        let Some(child) = node.child(level) else {
            return;
        };
        depth += 1;
        let removable = if path.peek().is_some() {
            child.holds_only_one_child()
        } else {
            child.is_empty()
        };
        if !removable {
            cut = None;
        } else if cut.is_none() {
            cut = Some(depth);
        }
        node = child;
    }
    let Some(cut) = cut else { return };
    let mut node = root;
    let mut path = levels;
    for _ in 1..cut {
        let Some(child) = path.next().and_then(|level| node.child_mut(level)) else {
            return;
        };
        node = child;
    }
    if let Some(level) = path.next() {
        node.remove_child(level);
    }
}

/// Number of nodes below `root`, `below` giving a node's children: the tries' `node_count`,
/// which their tests use to check that removal prunes everything.
#[cfg(test)]
pub(super) fn count_below<'a, N: 'a, I: Iterator<Item = &'a N>>(
    root: &'a N,
    below: impl Fn(&'a N) -> I,
) -> usize {
    let mut count = 0;
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        for child in below(node) {
            count += 1;
            stack.push(child);
        }
    }
    count
}
