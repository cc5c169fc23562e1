//! Shared subscriptions (`$share/{group}/{filter}`, MQTT 5 §4.8.2): each matching message goes
//! to exactly one member of each group.
//!
//! A group is identified by its whole filter string (`$share/g/a/+` and `$share/g/b` are two
//! groups, as the spec says). The index has its own [`TopicTree`] from the *inner* filter to
//! group ids, so the non-shared index and its hot path are untouched; routing asks this index
//! only when at least one group exists.
//!
//! Member choice prefers connected members; a message is queued for an offline member only
//! when no member is connected. Strategies ([`SharedStrategy`]): round-robin, random, or a
//! hash of the topic name (one topic sticks to one member while membership is unchanged).
//!
//! Locking: the index sits behind the broker's `shared` lock, which ranks like the topic tree
//! (after the sessions map, before any session's state). Choosing a member briefly locks
//! candidate sessions to see whether they are connected, which that order allows; nobody
//! takes this lock while holding a session lock.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytestring::ByteString;
use foldhash::fast::RandomState;

use super::message::SessionId;
use super::session::Session;
use super::topic_tree::TopicTree;
use crate::codec::SubscriptionOptions;
use crate::config::SharedStrategy;

/// Identifies a group inside the index (cheap to store in the topic tree).
type GroupId = u64;

/// One session's membership in a group.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// The subscribing session.
    pub session: Arc<Session>,
    /// Its subscription options (granted QoS, Retain As Published).
    pub options: SubscriptionOptions,
    /// Its Subscription Identifier, if any.
    pub identifier: Option<u32>,
}

/// A shared subscription: its filter and members, in join order.
#[derive(Debug)]
struct Group {
    /// The full `$share/{group}/{filter}` string (how deliveries name their group).
    key: Arc<str>,
    /// The inner filter, for removal from the tree.
    inner: ByteString,
    members: Vec<Member>,
    /// Round-robin position; atomic so routing needs only the read lock.
    cursor: AtomicUsize,
}

/// All shared subscription groups.
#[derive(Debug)]
pub(crate) struct SharedSubscriptions {
    strategy: SharedStrategy,
    tree: TopicTree<GroupId, ()>,
    groups: HashMap<GroupId, Group, RandomState>,
    by_key: HashMap<Arc<str>, GroupId, RandomState>,
    next_id: GroupId,
    /// Hashes topic names for the `hash` strategy (fixed for the life of the process).
    hasher: RandomState,
}

/// One group's key and its members' sessions, copied out of the index (see
/// [`SharedSubscriptions::group_members`]).
#[derive(Debug)]
pub(crate) struct GroupMembers {
    /// The full `$share/{group}/{filter}` string, as deliveries name their group.
    pub key: Arc<str>,
    /// Its members, in join order.
    pub sessions: Vec<Arc<Session>>,
}

/// The member chosen for one message of one group.
#[derive(Debug)]
pub(crate) struct Pick {
    /// The group's full filter.
    pub key: Arc<str>,
    /// Who gets it, with which options.
    pub member: Member,
}

impl SharedSubscriptions {
    /// An empty index using `strategy` to pick members.
    pub(crate) fn new(strategy: SharedStrategy) -> SharedSubscriptions {
        SharedSubscriptions {
            strategy,
            tree: TopicTree::new(),
            groups: HashMap::default(),
            by_key: HashMap::default(),
            next_id: 1,
            hasher: RandomState::default(),
        }
    }

    /// True when no group exists (routing can skip the index).
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Total memberships across groups (for the subscriptions gauge).
    pub(crate) fn len(&self) -> usize {
        self.groups.values().map(|g| g.members.len()).sum()
    }

    /// Every group's key and member sessions, sorted by key, at most `limit` groups (true when
    /// more exist): what the backlog watch (`broker::shared_backlog`) walks after this index's
    /// lock is released. Copies `Arc`s only; locks no session.
    pub(crate) fn group_members(&self, limit: usize) -> (Vec<GroupMembers>, bool) {
        let mut groups: Vec<&Group> = self.groups.values().collect();
        let more = groups.len() > limit;
        if more {
            groups.select_nth_unstable_by(limit, |a, b| a.key.cmp(&b.key));
            groups.truncate(limit);
        }
        groups.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let out = groups
            .into_iter()
            .map(|g| GroupMembers {
                key: Arc::clone(&g.key),
                sessions: g.members.iter().map(|m| Arc::clone(&m.session)).collect(),
            })
            .collect();
        (out, more)
    }

    /// Whether group `key` exists (has a member here).
    pub(crate) fn has_group(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Every group's key and inner filter.
    pub(crate) fn keys(&self) -> Vec<(Arc<str>, ByteString)> {
        self.groups
            .values()
            .map(|g| (Arc::clone(&g.key), g.inner.clone()))
            .collect()
    }

    /// Adds `member` to the group `key` (= `$share/{group}/{inner}`), or replaces its options
    /// if it is a member already. Returns whether it was a member already.
    pub(crate) fn subscribe(&mut self, key: &str, inner: &str, member: Member) -> bool {
        let id = match self.by_key.get(key) {
            Some(&id) => id,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                let key: Arc<str> = Arc::from(key);
                self.tree.insert(inner, id, ());
                self.by_key.insert(Arc::clone(&key), id);
                self.groups.insert(
                    id,
                    Group {
                        key,
                        inner: ByteString::from(inner.to_owned()),
                        members: Vec::new(),
                        cursor: AtomicUsize::new(0),
                    },
                );
                id
            }
        };
        let Some(group) = self.groups.get_mut(&id) else {
            return false;
        };
        match group
            .members
            .iter_mut()
            .find(|m| m.session.id == member.session.id)
        {
            Some(existing) => {
                *existing = member;
                true
            }
            None => {
                group.members.push(member);
                false
            }
        }
    }

    /// Removes `session` from group `key`; the group goes when its last member leaves.
    /// Returns whether it was a member.
    pub(crate) fn unsubscribe(&mut self, key: &str, session: SessionId) -> bool {
        let Some(&id) = self.by_key.get(key) else {
            return false;
        };
        let Some(group) = self.groups.get_mut(&id) else {
            return false;
        };
        let before = group.members.len();
        group.members.retain(|m| m.session.id != session);
        let removed = group.members.len() != before;
        if group.members.is_empty() {
            if let Some(group) = self.groups.remove(&id) {
                self.tree.remove(&group.inner, id);
                self.by_key.remove(&group.key);
            }
        }
        removed
    }

    /// Picks one member of every group whose filter matches `topic`, among those `may_read`
    /// accepts (the ACL: a member that may not read the topic is passed over). `f` gets
    /// `None` for a group none of whose members may read it.
    pub(crate) fn pick_for_topic(
        &self,
        topic: &str,
        may_read: impl Fn(&Session) -> bool,
        judge: impl Fn(&Session) -> (bool, bool),
        mut f: impl FnMut(Option<Pick>),
    ) {
        let mut ids: smallvec::SmallVec<[GroupId; 4]> = smallvec::SmallVec::new();
        self.tree.for_each_match(topic, |id, ()| ids.push(*id));
        for id in ids {
            if let Some(group) = self.groups.get(&id) {
                if group.members.is_empty() {
                    continue;
                }
                f(self
                    .choose(group, topic, None, false, &may_read, &judge)
                    .map(|member| Pick {
                        key: Arc::clone(&group.key),
                        member: member.clone(),
                    }));
            }
        }
    }

    /// Picks a member of group `key` other than `exclude` for a message on `topic`, e.g. to
    /// take over what a leaving member held, among those `may_read` accepts. With
    /// `connected_only`, `None` unless a connected member other than `exclude` exists.
    pub(crate) fn pick_other(
        &self,
        key: &str,
        topic: &str,
        exclude: SessionId,
        connected_only: bool,
        may_read: impl Fn(&Session) -> bool,
        judge: impl Fn(&Session) -> (bool, bool),
    ) -> Option<Member> {
        let group = self.groups.get(self.by_key.get(key)?)?;
        self.choose(
            group,
            topic,
            Some(exclude),
            connected_only,
            &may_read,
            &judge,
        )
        .cloned()
    }

    /// True if group `key` has a connected member other than `exclude`.
    pub(crate) fn has_other_connected(&self, key: &str, exclude: SessionId) -> bool {
        self.by_key
            .get(key)
            .and_then(|id| self.groups.get(id))
            .is_some_and(|g| {
                g.members
                    .iter()
                    .any(|m| m.session.id != exclude && is_connected(&m.session))
            })
    }

    /// The strategy's starting member, then the first from there that is connected and would
    /// keep the message (`judge`: connected, keeps); failing that, the first offline one that
    /// would keep it, then (for a group whose members would all drop it) the first connected
    /// one, then an offline one (unless `connected_only`, which takes connected members only).
    /// Only members `may_read` accepts are candidates (the ACL, checked lazily: in pick order,
    /// so a group whose first candidate may read costs one check).
    ///
    /// A member that would drop the message (its queue full and not taking back-pressure: an
    /// anonymous session at its share, an offline or stalled one at its bound) is passed over
    /// while another would keep it: an anonymous member that never read and filled its share
    /// was chosen again and again, and a password user's acknowledged QoS 1 jobs were dropped
    /// as `queue_full` while the group's other member was idle (issue 35, thirteenth
    /// adversarial pass, F5: 32 of 100 lost).
    fn choose<'g>(
        &self,
        group: &'g Group,
        topic: &str,
        exclude: Option<SessionId>,
        connected_only: bool,
        may_read: &dyn Fn(&Session) -> bool,
        judge: &dyn Fn(&Session) -> (bool, bool),
    ) -> Option<&'g Member> {
        let n = group.members.len();
        if n == 0 {
            return None;
        }
        let start = match self.strategy {
            SharedStrategy::RoundRobin => group.cursor.fetch_add(1, Ordering::Relaxed),
            SharedStrategy::Random => rand::random::<u32>() as usize,
            SharedStrategy::Hash => self.hasher.hash_one(topic) as usize,
        } % n;
        let candidates = (0..n)
            .map(|i| &group.members[(start + i) % n])
            .filter(|m| Some(m.session.id) != exclude);
        // The best fallback of each kind, in the order they are preferred.
        let mut offline_keeps = None;
        let mut connected_drops = None;
        let mut offline_drops = None;
        for m in candidates {
            let (connected, keeps) = judge(&m.session);
            let slot = match (connected, keeps) {
                (true, true) => None,
                (false, true) => Some(&mut offline_keeps),
                (true, false) => Some(&mut connected_drops),
                (false, false) => Some(&mut offline_drops),
            };
            match slot {
                None if may_read(&m.session) => return Some(m),
                Some(slot) if slot.is_none() && may_read(&m.session) => *slot = Some(m),
                _ => {}
            }
        }
        if connected_only {
            connected_drops
        } else {
            offline_keeps.or(connected_drops).or(offline_drops)
        }
    }
}

/// Whether a connection is attached, and that any member would keep what it is given: the
/// judge of the tests, which have no queue limits at hand.
#[cfg(test)]
fn connected_keeps_all(session: &Session) -> (bool, bool) {
    (is_connected(session), true)
}

/// Whether a connection is attached to the session (takes its lock briefly).
fn is_connected(session: &Session) -> bool {
    let st = session.lock();
    st.connection.is_some() && !st.ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ProtocolVersion;

    fn member(id: SessionId) -> Member {
        Member {
            session: Arc::new(Session::new(
                id,
                format!("c{id}").into(),
                ProtocolVersion::V5,
                0,
            )),
            options: SubscriptionOptions::default(),
            identifier: None,
        }
    }

    fn picks(s: &SharedSubscriptions, topic: &str) -> Vec<SessionId> {
        let mut out = Vec::new();
        s.pick_for_topic(
            topic,
            |_| true,
            connected_keeps_all,
            |p| out.extend(p.map(|p| p.member.session.id)),
        );
        out
    }

    #[test]
    fn one_member_per_group_and_groups_are_independent() {
        let mut s = SharedSubscriptions::new(SharedStrategy::RoundRobin);
        let key = ByteString::from("$share/g/a/+");
        assert!(!s.subscribe(&key, "a/+", member(1)));
        assert!(!s.subscribe(&key, "a/+", member(2)));
        assert!(s.subscribe(&key, "a/+", member(2)), "re-subscribe replaces");
        let other = ByteString::from("$share/h/a/#");
        s.subscribe(&other, "a/#", member(3));
        assert_eq!(s.len(), 3);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let p = picks(&s, "a/x");
            assert_eq!(p.len(), 2, "one per group: {p:?}");
            assert!(p.contains(&3));
            seen.extend(p.into_iter().filter(|id| *id != 3));
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 1, 2, 2], "round-robin alternates");
        assert!(picks(&s, "b").is_empty());
    }

    #[test]
    fn hash_strategy_is_sticky_per_topic() {
        let mut s = SharedSubscriptions::new(SharedStrategy::Hash);
        let key = ByteString::from("$share/g/#");
        for id in 1..=5 {
            s.subscribe(&key, "#", member(id));
        }
        for topic in ["a", "b/c", "d/e/f"] {
            let first = picks(&s, topic);
            for _ in 0..10 {
                assert_eq!(picks(&s, topic), first, "{topic}");
            }
        }
    }

    #[test]
    fn last_member_leaving_removes_the_group() {
        let mut s = SharedSubscriptions::new(SharedStrategy::Random);
        let key = ByteString::from("$share/g/t");
        s.subscribe(&key, "t", member(1));
        assert!(!s.unsubscribe(&key, 2));
        assert!(s.unsubscribe(&key, 1));
        assert!(s.is_empty());
        assert!(picks(&s, "t").is_empty());
        assert!(!s.unsubscribe(&key, 1));
    }

    #[test]
    fn pick_other_excludes_and_respects_connected_only() {
        let mut s = SharedSubscriptions::new(SharedStrategy::RoundRobin);
        let key = ByteString::from("$share/g/t");
        s.subscribe(&key, "t", member(1));
        s.subscribe(&key, "t", member(2));
        // Nobody is connected in this unit test.
        assert!(s
            .pick_other(&key, "t", 1, true, |_| true, connected_keeps_all)
            .is_none());
        assert!(!s.has_other_connected(&key, 1));
        let m = s
            .pick_other(&key, "t", 1, false, |_| true, connected_keeps_all)
            .expect("offline fallback");
        assert_eq!(m.session.id, 2);
    }

    /// Issue 35, thirteenth pass, F5: a member that would drop the message is passed over
    /// while another would keep it; when every member would drop it, the strategy's pick
    /// stands (its policy then applies). The judge stands in for connection and queue state.
    #[test]
    fn a_member_that_would_drop_is_passed_over() {
        let mut s = SharedSubscriptions::new(SharedStrategy::RoundRobin);
        let key = ByteString::from("$share/g/t");
        for id in 1..=3 {
            s.subscribe(&key, "t", member(id));
        }
        let keeps_but_1 = |m: &Session| (true, m.id != 1);
        let picked = |s: &SharedSubscriptions, judge: &dyn Fn(&Session) -> (bool, bool)| {
            let mut out = None;
            s.pick_for_topic(
                "t",
                |_| true,
                judge,
                |p| {
                    out = p.map(|p| p.member.session.id);
                },
            );
            out
        };
        // Round robin from member 1, 2, 3, 1, ...: 1 is never picked.
        let got: Vec<_> = (0..6).map(|_| picked(&s, &keeps_but_1)).collect();
        assert!(
            got.iter().all(|id| *id != Some(1) && id.is_some()),
            "{got:?}"
        );
        // An offline member that keeps beats a connected one that drops.
        let offline_2_keeps = |m: &Session| (m.id != 2, m.id == 2);
        assert_eq!(picked(&s, &offline_2_keeps), Some(2));
        // All would drop: a connected one is still picked.
        assert!(picked(&s, &|_: &Session| (true, false)).is_some());
    }
}
