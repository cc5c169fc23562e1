//! The broker's sessions, found by client id.
//!
//! A set of `Arc<Session>` hashed by each session's own `client_id`, rather than a map from a
//! second copy of the id: one pointer per slot instead of a 32-byte key plus the pointer, and no
//! extra reference keeping the CONNECT packet's buffer alive. At 20k idle clients that is
//! most of a kilobyte of the per-connection budget saved per 20 connections.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use super::session::Session;

/// Sessions by client id; lives under the broker's sessions mutex.
#[derive(Default)]
pub(super) struct SessionMap {
    table: HashTable<Arc<Session>>,
    hasher: foldhash::fast::RandomState,
}

impl SessionMap {
    fn hash(&self, client_id: &str) -> u64 {
        self.hasher.hash_one(client_id)
    }

    /// The session of `client_id`, if there is one.
    pub(super) fn get(&self, client_id: &str) -> Option<&Arc<Session>> {
        self.table
            .find(self.hash(client_id), |s| &*s.client_id == client_id)
    }

    /// Adds `session`, replacing (and returning) any session with the same client id.
    pub(super) fn insert(&mut self, session: Arc<Session>) -> Option<Arc<Session>> {
        let hash = self.hash(&session.client_id);
        let hasher = &self.hasher;
        match self.table.entry(
            hash,
            |s| s.client_id == session.client_id,
            |s| hasher.hash_one(&*s.client_id),
        ) {
            hashbrown::hash_table::Entry::Occupied(mut entry) => {
                Some(std::mem::replace(entry.get_mut(), session))
            }
            hashbrown::hash_table::Entry::Vacant(entry) => {
                entry.insert(session);
                None
            }
        }
    }

    /// Removes the session of `client_id`.
    pub(super) fn remove(&mut self, client_id: &str) -> Option<Arc<Session>> {
        match self
            .table
            .find_entry(self.hash(client_id), |s| &*s.client_id == client_id)
        {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }

    /// Number of sessions.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every session, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.table.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ProtocolVersion;

    fn session(id: u64, client_id: &str) -> Arc<Session> {
        Arc::new(Session::new(id, client_id.into(), ProtocolVersion::V5, 0))
    }

    #[test]
    fn finds_replaces_and_removes_by_client_id() {
        let mut map = SessionMap::default();
        assert!(map.insert(session(1, "a")).is_none());
        assert!(map.insert(session(2, "b")).is_none());
        assert_eq!(map.get("a").map(|s| s.id), Some(1));
        let old = map.insert(session(3, "a")).map(|s| s.id);
        assert_eq!(old, Some(1), "same client id replaces");
        assert_eq!(map.get("a").map(|s| s.id), Some(3));
        assert_eq!(map.len(), 2);
        assert_eq!(map.remove("a").map(|s| s.id), Some(3));
        assert!(map.get("a").is_none());
        assert!(map.remove("a").is_none());
        assert_eq!(map.iter().map(|s| s.id).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn holds_many_sessions() {
        let mut map = SessionMap::default();
        for i in 0..10_000u64 {
            map.insert(session(i, &format!("client-{i}")));
        }
        assert_eq!(map.len(), 10_000);
        for i in (0..10_000u64).step_by(997) {
            assert_eq!(map.get(&format!("client-{i}")).map(|s| s.id), Some(i));
        }
    }
}
