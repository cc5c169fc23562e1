//! Child-level map shared by the topic tree and the retained index.
//!
//! Most trie nodes have a handful of children, a few (device-id levels) have many. Small maps
//! are a `Vec` scanned linearly (one cache line or two, exact capacity); above [`SMALL_MAX`]
//! children they become a foldhash map. Level names up to 16 bytes are stored inline in the
//! entry, so comparing a key does not chase a pointer. Lookups take `&str` and never allocate.
//!
//! Must not: allocate per match.

use std::collections::hash_map;
use std::collections::HashMap;
use std::mem;
use std::slice;

use foldhash::fast::RandomState;
use smallvec::SmallVec;

/// A level name; hashes like `[u8]`, so maps can be queried with `level.as_bytes()`.
pub(super) type Level = SmallVec<[u8; 16]>;

/// A small map turns into a hash map when a child beyond this count is added.
const SMALL_MAX: usize = 8;
/// A hash map turns back into a small one at this size (hysteresis against churn).
const LARGE_MIN: usize = 4;
/// Hash maps with at least this capacity are shrunk once they are less than a quarter full.
const SHRINK_ABOVE: usize = 32;

/// Children of a trie node, keyed by level name (never `+` or `#`).
pub(super) enum LevelMap<N> {
    Small(Vec<(Level, N)>),
    /// Boxed to keep the enum (and so every node) at the size of a `Vec`.
    #[allow(clippy::box_collection)]
    Large(Box<HashMap<Level, N, RandomState>>),
}

impl<N> LevelMap<N> {
    /// An empty map; does not allocate.
    pub(super) const fn new() -> Self {
        Self::Small(Vec::new())
    }

    /// Number of children.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Small(v) => v.len(),
            Self::Large(m) => m.len(),
        }
    }

    /// True if there are no children.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The child named `level`.
    #[inline]
    pub(super) fn get(&self, level: &str) -> Option<&N> {
        let level = level.as_bytes();
        match self {
            Self::Small(v) => v
                .iter()
                .find(|(l, _)| l.as_slice() == level)
                .map(|(_, n)| n),
            Self::Large(m) => m.get(level),
        }
    }

    /// The child named `level`, mutably.
    pub(super) fn get_mut(&mut self, level: &str) -> Option<&mut N> {
        let level = level.as_bytes();
        match self {
            Self::Small(v) => v
                .iter_mut()
                .find(|(l, _)| l.as_slice() == level)
                .map(|(_, n)| n),
            Self::Large(m) => m.get_mut(level),
        }
    }

    /// The child named `level`, created with `new` if absent.
    pub(super) fn get_or_insert_with(&mut self, level: &str, new: impl FnOnce() -> N) -> &mut N {
        let key = level.as_bytes();
        if let Self::Small(v) = self {
            if v.len() >= SMALL_MAX && !v.iter().any(|(l, _)| l.as_slice() == key) {
                let map = mem::take(v).into_iter().collect();
                *self = Self::Large(Box::new(map));
            }
        }
        match self {
            Self::Small(v) => {
                let i = match v.iter().position(|(l, _)| l.as_slice() == key) {
                    Some(i) => i,
                    None => {
                        // Exact capacity: most nodes have one or two children.
                        v.reserve_exact(1);
                        v.push((Level::from_slice(key), new()));
                        v.len() - 1
                    }
                };
                &mut v[i].1
            }
            // The key only allocates for levels longer than 16 bytes.
            Self::Large(m) => m.entry(Level::from_slice(key)).or_insert_with(new),
        }
    }

    /// Removes and returns the child named `level`, releasing spare capacity.
    pub(super) fn remove(&mut self, level: &str) -> Option<N> {
        let key = level.as_bytes();
        match self {
            Self::Small(v) => {
                let i = v.iter().position(|(l, _)| l.as_slice() == key)?;
                let (_, node) = v.swap_remove(i);
                if v.capacity() >= 2 * v.len() {
                    v.shrink_to_fit();
                }
                Some(node)
            }
            Self::Large(m) => {
                let node = m.remove(key)?;
                if m.len() <= LARGE_MIN {
                    *self = Self::Small(m.drain().collect());
                } else if m.capacity() >= SHRINK_ABOVE && m.len() < m.capacity() / 4 {
                    m.shrink_to(m.len() * 2);
                }
                Some(node)
            }
        }
    }

    /// Iterates over `(level, child)` in no particular order.
    pub(super) fn iter(&self) -> Iter<'_, N> {
        match self {
            Self::Small(v) => Iter::Small(v.iter()),
            Self::Large(m) => Iter::Large(m.iter()),
        }
    }

    /// Moves every child into `out`, leaving the map empty (for non-recursive teardown).
    pub(super) fn drain_into(&mut self, out: &mut Vec<N>) {
        match mem::replace(self, Self::new()) {
            Self::Small(v) => out.extend(v.into_iter().map(|(_, n)| n)),
            Self::Large(m) => out.extend(m.into_values()),
        }
    }
}

/// Iterator over a [`LevelMap`]; a concrete type so walks can keep it on their stack.
pub(super) enum Iter<'a, N> {
    Small(slice::Iter<'a, (Level, N)>),
    Large(hash_map::Iter<'a, Level, N>),
}

impl<'a, N> Iterator for Iter<'a, N> {
    type Item = (&'a [u8], &'a N);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Small(it) => it.next().map(|(l, n)| (l.as_slice(), n)),
            Self::Large(it) => it.next().map(|(l, n)| (l.as_slice(), n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Random inserts/removes over 24 names (short and long) cross both size thresholds.
        #[test]
        fn behaves_like_a_map(
            ops in prop::collection::vec((0usize..24, any::<bool>(), any::<u8>()), 1..200),
        ) {
            let name = |i: usize| match i % 2 {
                0 => format!("l{i}"),
                _ => format!("a-level-name-longer-than-16-{i}"),
            };
            let mut map = LevelMap::new();
            let mut model = BTreeMap::new();
            for (i, insert, value) in ops {
                let name = name(i);
                if insert {
                    *map.get_or_insert_with(&name, || value) = value;
                    model.insert(name, value);
                } else {
                    prop_assert_eq!(map.remove(&name), model.remove(&name));
                }
                prop_assert_eq!(map.len(), model.len());
                let mut seen: Vec<(String, u8)> = map
                    .iter()
                    .map(|(l, v)| (String::from_utf8_lossy(l).into_owned(), *v))
                    .collect();
                seen.sort();
                prop_assert_eq!(seen, model.clone().into_iter().collect::<Vec<_>>());
            }
            for (name, value) in &model {
                prop_assert_eq!(map.get(name), Some(value));
            }
        }
    }

    #[test]
    fn grows_into_a_hash_map_and_back() {
        let mut map = LevelMap::new();
        let names: Vec<String> = (0..40)
            .map(|i| format!("level-{i}-with-a-long-name"))
            .collect();
        for (i, name) in names.iter().enumerate() {
            *map.get_or_insert_with(name, || 0) += i;
            assert_eq!(*map.get_or_insert_with(name, || 99), i);
        }
        assert!(matches!(map, LevelMap::Large(_)));
        assert_eq!(map.len(), 40);
        assert_eq!(map.iter().count(), 40);
        for (i, name) in names.iter().enumerate().skip(3) {
            assert_eq!(map.remove(name), Some(i));
            assert_eq!(map.get(name), None);
        }
        assert!(matches!(map, LevelMap::Small(_)));
        assert_eq!(map.get(&names[1]), Some(&1));
        assert_eq!(map.get_mut(""), None);
        let mut out = Vec::new();
        map.drain_into(&mut out);
        assert_eq!(out.len(), 3);
        assert!(map.is_empty());
    }
}
