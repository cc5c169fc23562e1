//! TEMPORARY naive stand-in (replaced by the real trie on merge).
use std::hash::Hash;

/// Subscription index: filter -> subscribers.
pub struct TopicTree<K, V> {
    subs: Vec<(String, K, V)>,
}
impl<K: Copy + Eq + Hash, V> Default for TopicTree<K, V> {
    fn default() -> Self {
        Self::new()
    }
}
impl<K: Copy + Eq + Hash, V> TopicTree<K, V> {
    /// New empty tree.
    pub fn new() -> Self {
        TopicTree { subs: Vec::new() }
    }
    /// Insert or replace.
    pub fn insert(&mut self, filter: &str, key: K, value: V) -> Option<V> {
        for s in &mut self.subs {
            if s.0 == filter && s.1 == key {
                return Some(std::mem::replace(&mut s.2, value));
            }
        }
        self.subs.push((filter.to_string(), key, value));
        None
    }
    /// Remove.
    pub fn remove(&mut self, filter: &str, key: K) -> Option<V> {
        let i = self.subs.iter().position(|s| s.0 == filter && s.1 == key)?;
        Some(self.subs.swap_remove(i).2)
    }
    /// Match.
    pub fn for_each_match<F: FnMut(&K, &V)>(&self, topic: &str, mut f: F) {
        for s in &self.subs {
            if matches(&s.0, topic) {
                f(&s.1, &s.2)
            }
        }
    }
    /// Len.
    pub fn len(&self) -> usize {
        self.subs.len()
    }
    /// Empty.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }
}
fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}
