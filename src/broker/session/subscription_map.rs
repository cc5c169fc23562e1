//! A session's own record of its subscriptions, which counts what it holds against the memory
//! budget (`mqtt.max_memory`, issue 35 finding 6).
//!
//! Why a type of its own: subscriptions leave a session by many paths (UNSUBSCRIBE, a clean
//! start, the session's end, its drop); counting in the map itself, on insert, remove, drain
//! and drop, keeps the count right on all of them without each path remembering to. Nothing
//! here is touched per PUBLISH; beside the map, one flag: whether the session is anonymous
//! (its filters also count in the anonymous sessions' share, `flow::ANONYMOUS_SUBSCRIPTION_SHARE`).

use std::collections::HashMap;

use bytestring::ByteString;

use super::SessionSubscription;
use crate::broker::flow;

type Map = HashMap<ByteString, SessionSubscription, foldhash::fast::RandomState>;

/// The filters a session holds, by filter; reads go through `Deref` to the map.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionMap {
    map: Map,
    /// The session is anonymous where a method tells identities apart: its filters also
    /// count in `flow::anonymous_subscription_bytes` (their own share of the budget).
    anonymous: bool,
}

impl std::ops::Deref for SubscriptionMap {
    type Target = Map;

    fn deref(&self) -> &Map {
        &self.map
    }
}

impl SubscriptionMap {
    /// Adds or replaces the record of `filter`; a new filter is counted.
    pub(crate) fn insert(
        &mut self,
        filter: ByteString,
        record: SessionSubscription,
    ) -> Option<SessionSubscription> {
        let len = filter.len();
        let old = self.map.insert(filter, record);
        if old.is_none() {
            flow::subscription_added(len, self.anonymous);
        }
        old
    }

    /// Removes the record of `filter`, uncounting it.
    pub(crate) fn remove(&mut self, filter: &str) -> Option<SessionSubscription> {
        let old = self.map.remove(filter);
        if old.is_some() {
            flow::subscription_removed(filter.len(), self.anonymous);
        }
        old
    }

    /// Takes every record out (uncounted).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (ByteString, SessionSubscription)> + '_ {
        self.uncount_all();
        self.map.drain()
    }

    /// Whether the session's filters count as an anonymous session's: set with its owner
    /// (`SessionState::set_owner`); what it holds already moves with it.
    pub(crate) fn set_anonymous(&mut self, anonymous: bool) {
        if self.anonymous != anonymous {
            self.anonymous = anonymous;
            for filter in self.map.keys() {
                flow::subscription_owner_changed(filter.len(), anonymous);
            }
        }
    }

    /// The bytes of all filters held (their lengths summed): for
    /// `mqtt.max_subscription_bytes_per_client`, at SUBSCRIBE only.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.map.keys().map(|f| f.len()).sum()
    }

    fn uncount_all(&self) {
        for filter in self.map.keys() {
            flow::subscription_removed(filter.len(), self.anonymous);
        }
    }
}

impl Drop for SubscriptionMap {
    fn drop(&mut self) {
        self.uncount_all();
    }
}
