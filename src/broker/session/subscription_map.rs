//! A session's own record of its subscriptions, which counts what it holds against the memory
//! budget (`mqtt.max_memory`, issue 35 finding 6).
//!
//! Why a type of its own: subscriptions leave a session by many paths (UNSUBSCRIBE, a clean
//! start, the session's end, its drop); counting in the map itself, on insert, remove and
//! drain, and in the session state's drop, keeps the count right on all of them without each
//! path remembering to. Each mutator is told whether the session is anonymous (its filters
//! also count in the anonymous sessions' share, `flow::ANONYMOUS_SHARE`): the
//! session state knows from its owner, and passes it (`SessionState::add_subscription` and
//! the rest), so the map stays as large as the map it wraps. Nothing here is touched per
//! PUBLISH.

use std::collections::HashMap;

use bytestring::ByteString;

use super::SessionSubscription;
use crate::broker::flow;

type Map = HashMap<ByteString, SessionSubscription, foldhash::fast::RandomState>;

/// The filters a session holds, by filter; reads go through `Deref` to the map, changes
/// through `SessionState`, which knows whether the session is anonymous.
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
    pub(super) fn insert(
        &mut self,
        filter: ByteString,
        record: SessionSubscription,
        anonymous: bool,
    ) -> Option<SessionSubscription> {
        let len = filter.len();
        let old = self.0.insert(filter, record);
        if old.is_none() {
            flow::subscription_counted(len, anonymous, true);
        }
        old
    }

    /// Removes the record of `filter`, uncounting it.
    pub(super) fn remove(&mut self, filter: &str, anonymous: bool) -> Option<SessionSubscription> {
        let old = self.0.remove(filter);
        if old.is_some() {
            flow::subscription_counted(filter.len(), anonymous, false);
        }
        old
    }

    /// Takes every record out (uncounted).
    pub(super) fn drain(
        &mut self,
        anonymous: bool,
    ) -> impl Iterator<Item = (ByteString, SessionSubscription)> + '_ {
        self.uncount_all(anonymous);
        self.0.drain()
    }

    /// Moves what the map holds into (`anonymous`) or out of the anonymous sessions' count:
    /// its session changed owner.
    pub(super) fn owner_changed(&self, anonymous: bool) {
        for filter in self.0.keys() {
            flow::subscription_owner_changed(filter.len(), anonymous);
        }
    }

    /// The bytes of all filters held (their lengths summed): for
    /// `mqtt.max_subscription_bytes_per_client`, at SUBSCRIBE only.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.0.keys().map(|f| f.len()).sum()
    }

    /// Uncounts everything held (the records stay): for `drain` and the session state's drop.
    pub(super) fn uncount_all(&self, anonymous: bool) {
        for filter in self.0.keys() {
            flow::subscription_counted(filter.len(), anonymous, false);
        }
    }
}
