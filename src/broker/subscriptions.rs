//! Subscribing and unsubscribing: the subscription tree or the shared index, the session's
//! own record, the store, and the subscriptions gauge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytestring::ByteString;

use super::shared::Member;
use super::{persist, Broker, Session, SessionSubscription, Subscriber};
use crate::auth::principal::Principal;
use crate::codec::{topic, SubscriptionOptions};
use crate::storage::Op;

impl Broker {
    /// Sets the session's identity for authorisation (user name, JWT claims). A session
    /// resumed under another identity keeps its subscriptions, but their grants were made for
    /// the old one: they are stamped "check every delivery" (generation 0) so the new user's
    /// rules and claims apply.
    pub fn set_identity(&self, session: &Arc<Session>, principal: Principal) {
        if principal.claims().is_some() {
            self.claims_seen.store(true, Ordering::Relaxed);
        }
        if !session.set_principal(principal) {
            return;
        }
        // What is queued was routed for the identity before: checked again as it goes out.
        session.lock().acl_checked = super::session::UNCHECKED;
        let filters: Vec<(ByteString, SessionSubscription)> = session
            .lock()
            .subscriptions
            .iter()
            .filter(|(f, _)| topic::split_shared(f).is_none())
            .map(|(f, r)| (f.clone(), *r))
            .collect();
        if filters.is_empty() {
            return;
        }
        let mut tree = self.subscriptions.write();
        for (filter, record) in filters {
            let subscriber = Subscriber {
                session: Arc::clone(session),
                options: record.options,
                identifier: record.identifier,
                acl_generation: 0,
            };
            tree.insert(&filter, session.id, subscriber);
        }
    }

    /// Adds or replaces a subscription (MQTT-3.8.4-3). Returns whether one existed already.
    /// A valid `$share/{group}/{filter}` joins that shared subscription group. Stored with a
    /// stored session either way: a shared one was not, so after a restart the session was
    /// no member of its group (its publishers got 0x10) and held jobs of no group.
    pub fn subscribe(
        &self,
        session: &Arc<Session>,
        filter: &ByteString,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) -> bool {
        self.cluster_session_changed(&session.client_id);
        let record = SessionSubscription {
            options,
            identifier,
        };
        let existed = match topic::split_shared(filter) {
            Some(Ok((_, inner))) => self.join_group(session, filter, inner, record),
            _ => self.subscribe_plain(session, filter, record),
        };
        let stored = {
            let mut st = session.lock();
            st.add_subscription(filter.clone(), record);
            st.stored
        };
        if stored {
            self.persist(vec![persist::put_subscription(
                &session.client_id,
                filter,
                options,
                identifier,
            )]);
        }
        existed
    }

    /// Puts `session`'s subscription to `filter` (not shared) in the topic tree; returns
    /// whether it held one already.
    fn subscribe_plain(
        &self,
        session: &Arc<Session>,
        filter: &ByteString,
        record: SessionSubscription,
    ) -> bool {
        let acl_generation = match self.authz() {
            Some(authz) => match session.filter_access(authz.acl, filter) {
                (crate::auth::acl::FilterAccess::Full, generation) => generation,
                _ => 0,
            },
            None => 1,
        };
        let subscriber = Subscriber {
            session: Arc::clone(session),
            options: record.options,
            identifier: record.identifier,
            acl_generation,
        };
        let mut tree = self.subscriptions.write();
        let existed = tree.insert(filter, session.id, subscriber).is_some();
        self.set_subscription_gauge(tree.len());
        existed
    }

    /// Makes `session` a member of the shared group `filter` (`$share/{group}/{inner}`);
    /// returns whether it was one already. The session's own record of the subscription is
    /// the caller's.
    pub(super) fn join_group(
        &self,
        session: &Arc<Session>,
        filter: &ByteString,
        inner: &str,
        record: SessionSubscription,
    ) -> bool {
        let member = Member {
            session: Arc::clone(session),
            options: record.options,
            identifier: record.identifier,
        };
        let (existed, new_group) = {
            let mut index = self.shared.write();
            let new_group = !index.has_group(filter);
            let existed = index.subscribe(filter, inner, member);
            self.has_shared.store(true, Ordering::Release);
            (existed, new_group)
        };
        if let (true, Some(cluster)) = (new_group, self.cluster()) {
            cluster.shared_group_joined(filter);
        }
        self.update_subscription_gauge();
        existed
    }

    /// Removes a subscription; returns whether it existed (v5 reason 0x11 otherwise).
    pub fn unsubscribe(&self, session: &Arc<Session>, filter: &str) -> bool {
        self.cluster_session_changed(&session.client_id);
        let removed = if topic::split_shared(filter).is_some() {
            let removed = {
                let mut index = self.shared.write();
                let removed = index.unsubscribe(filter, session.id);
                self.has_shared.store(!index.is_empty(), Ordering::Release);
                removed
            };
            self.update_subscription_gauge();
            removed
        } else {
            let mut tree = self.subscriptions.write();
            let removed = tree.remove(filter, session.id).is_some();
            self.set_subscription_gauge(tree.len());
            removed
        };
        let stored = {
            let mut st = session.lock();
            st.remove_subscription(filter);
            st.stored
        };
        if stored && removed {
            self.persist(vec![Op::DeleteSubscription {
                client_id: session.client_id.clone(),
                filter: ByteString::from(filter),
            }]);
        }
        removed
    }

    /// Call with the shared index updated and no index lock held.
    pub(super) fn update_subscription_gauge(&self) {
        let shared = self.shared.read().len();
        self.shared_members.store(shared, Ordering::Relaxed);
        self.set_subscription_gauge(self.subscriptions.read().len());
    }

    /// The subscriptions gauge, given the topic tree's count (`plain`: taken under the tree's
    /// lock by a caller that holds it) and the shared members counted last.
    fn set_subscription_gauge(&self, plain: usize) {
        let shared = self.shared_members.load(Ordering::Relaxed);
        self.metrics
            .subscriptions_current
            .set((plain + shared) as f64);
    }
}
