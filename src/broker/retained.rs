//! TEMPORARY naive stand-in (replaced by the real index on merge).
use std::collections::BTreeMap;

/// Retained messages by topic.
pub struct RetainedIndex<M> {
    map: BTreeMap<String, M>,
}
impl<M> Default for RetainedIndex<M> {
    fn default() -> Self {
        Self::new()
    }
}
impl<M> RetainedIndex<M> {
    /// New.
    pub fn new() -> Self {
        RetainedIndex {
            map: BTreeMap::new(),
        }
    }
    /// Insert.
    pub fn insert(&mut self, topic: &str, msg: M) -> Option<M> {
        self.map.insert(topic.to_string(), msg)
    }
    /// Remove.
    pub fn remove(&mut self, topic: &str) -> Option<M> {
        self.map.remove(topic)
    }
    /// Get.
    pub fn get(&self, topic: &str) -> Option<&M> {
        self.map.get(topic)
    }
    /// Match.
    pub fn for_each_match<F: FnMut(&str, &M)>(&self, filter: &str, mut f: F) {
        let mut t = super::topic_tree::TopicTree::new();
        t.insert(filter, 0u8, ());
        for (k, v) in &self.map {
            let mut hit = false;
            t.for_each_match(k, |_, _| hit = true);
            if hit {
                f(k, v)
            }
        }
    }
    /// Len.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// Empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
