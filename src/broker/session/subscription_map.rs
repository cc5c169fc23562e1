//! A session's own record of its subscriptions, which counts what it holds against the memory
//! budget (`mqtt.max_memory`, issue 35 finding 6).
//!
//! Why a type of its own: subscriptions leave a session by many paths (UNSUBSCRIBE, a clean
//! start, the session's end, its drop); counting in the map itself, on insert, remove, drain
//! and drop, keeps the count right on all of them without each path remembering to. Nothing
//! here is touched per PUBLISH, and the type is as large as the map it wraps.

use std::collections::HashMap;

use bytestring::ByteString;

use super::SessionSubscription;
use crate::broker::flow;

type Map = HashMap<ByteString, SessionSubscription, foldhash::fast::RandomState>;

/// The filters a session holds, by filter; reads go through `Deref` to the map.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionMap(Map);

impl std::ops::Deref for SubscriptionMap {
    type Target = Map;

    fn deref(&self) -> &Map {
        &self.0
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
        let old = self.0.insert(filter, record);
        if old.is_none() {
            flow::subscription_added(len);
        }
        old
    }

    /// Removes the record of `filter`, uncounting it.
    pub(crate) fn remove(&mut self, filter: &str) -> Option<SessionSubscription> {
        let old = self.0.remove(filter);
        if old.is_some() {
            flow::subscription_removed(filter.len());
        }
        old
    }

    /// Takes every record out (uncounted).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (ByteString, SessionSubscription)> + '_ {
        self.uncount_all();
        self.0.drain()
    }

    /// The bytes of all filters held (their lengths summed): for
    /// `mqtt.max_subscription_bytes_per_client`, at SUBSCRIBE only.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.0.keys().map(|f| f.len()).sum()
    }

    fn uncount_all(&self) {
        for filter in self.0.keys() {
            flow::subscription_removed(filter.len());
        }
    }
}

impl Drop for SubscriptionMap {
    fn drop(&mut self) {
        self.uncount_all();
    }
}
