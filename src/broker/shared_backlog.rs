//! The backlog of shared-subscription groups (issue 16, backlog watch): per group, its members
//! (connected / all) and what is queued for the group across them (the deliveries whose
//! `shared` names it: count, payload bytes, oldest age). Read when metrics are scraped and by
//! `GET /api/v1/shared`, never on the publish path.
//!
//! One walk serves both: the shared index's read lock is held only to copy the groups' keys
//! and member `Arc`s out ([`SharedSubscriptions::group_members`]); then each member session
//! is locked once, briefly, and its queue (bounded by `mqtt.max_queued_messages`) walked once
//! whatever the number of groups it belongs to, each delivery attributed to its group by key.
//! The lock order (shared index before any session) is kept by never holding both.
//!
//! [`SharedSubscriptions::group_members`]: super::shared::SharedSubscriptions::group_members
//!
//! Must not: label a metric by client id or group (clients choose them); hold the shared index's
//! lock while a session is locked.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::message::SessionId;
use super::session::Session;
use super::shared::GroupMembers;
use super::Broker;

/// One shared-subscription group as operators see it (`GET /api/v1/shared`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SharedGroupView {
    /// The group's topic filter (the part after `$share/{group}/`).
    pub filter: String,
    /// The group's name (`{group}` in `$share/{group}/{filter}`).
    pub group: String,
    /// Sessions subscribed to it, connected or not.
    pub members: usize,
    /// Those with a connection attached now.
    pub connected_members: usize,
    /// Messages queued for the group across its members, not yet sent.
    pub backlog: usize,
    /// Their payload bytes.
    pub backlog_bytes: usize,
    /// Age of the oldest of them, in seconds (`null`: nothing queued).
    pub oldest_queued_secs: Option<f64>,
}

/// The shared groups' backlog in aggregate, for the metrics (no per-group labels: a group name
/// is chosen by clients, so a label per group would let them grow the series without bound).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SharedBacklog {
    /// Groups existing.
    pub groups: u64,
    /// Memberships over all groups.
    pub members: u64,
    /// Memberships whose session is connected now.
    pub connected_members: u64,
    /// Messages queued for groups, all groups together.
    pub queued: u64,
    /// The largest group backlog, in messages.
    pub max: u64,
    /// Age of the oldest message queued for any group.
    pub oldest: Duration,
    /// Groups with a backlog and no connected member: nobody takes their messages now.
    pub unserved: u64,
}

/// What one walk found for one group.
#[derive(Clone, Copy, Debug, Default)]
struct GroupFigures {
    members: usize,
    connected: usize,
    queued: usize,
    bytes: usize,
    oldest: Option<Instant>,
}

/// Walks the members of `groups`: each session once, its queue once.
fn walk(groups: &[GroupMembers]) -> Vec<GroupFigures> {
    let index: HashMap<&str, usize> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (&*g.key, i))
        .collect();
    let mut sessions: HashMap<SessionId, (&Arc<Session>, Vec<usize>)> = HashMap::new();
    for (i, group) in groups.iter().enumerate() {
        for session in &group.sessions {
            sessions
                .entry(session.id)
                .or_insert_with(|| (session, Vec::new()))
                .1
                .push(i);
        }
    }
    let mut figures = vec![GroupFigures::default(); groups.len()];
    for (session, member_of) in sessions.into_values() {
        let st = session.lock();
        let connected = st.connection.is_some() && !st.ended;
        // The last key matched: a member's queue usually holds one group's deliveries, which
        // share one `Arc<str>`, so a pointer compare spares most lookups.
        let mut last: Option<(&Arc<str>, Option<usize>)> = None;
        for delivery in &st.queue {
            let Some(key) = &delivery.shared else {
                continue;
            };
            let slot = match last {
                Some((k, slot)) if Arc::ptr_eq(k, key) => slot,
                _ => {
                    let slot = index.get(&**key).copied();
                    last = Some((key, slot));
                    slot
                }
            };
            let Some(i) = slot else {
                continue;
            };
            let f = &mut figures[i];
            f.queued += 1;
            f.bytes += delivery.message.size();
            let at = delivery.message.received_at;
            f.oldest = Some(f.oldest.map_or(at, |o| o.min(at)));
        }
        drop(st);
        for i in member_of {
            figures[i].members += 1;
            figures[i].connected += usize::from(connected);
        }
    }
    figures
}

impl Broker {
    /// Copies at most `limit` groups out of the shared index (none, without taking its lock,
    /// when no group exists).
    fn shared_group_members(&self, limit: usize) -> (Vec<GroupMembers>, bool) {
        if !self.has_shared.load(Ordering::Acquire) {
            return (Vec::new(), false);
        }
        self.shared.read().group_members(limit)
    }

    /// The shared-subscription groups, sorted by `$share/{group}/{filter}`, at most `limit`;
    /// true when more exist.
    pub fn shared_groups(&self, limit: usize) -> (Vec<SharedGroupView>, bool) {
        let (groups, more) = self.shared_group_members(limit);
        let now = Instant::now();
        let figures = walk(&groups);
        let views = groups
            .iter()
            .zip(figures)
            .map(|(g, f)| {
                let (group, filter) = match crate::codec::topic::split_shared(&g.key) {
                    Some(Ok((group, filter))) => (group, filter),
                    _ => ("", &*g.key),
                };
                SharedGroupView {
                    filter: filter.to_owned(),
                    group: group.to_owned(),
                    members: f.members,
                    connected_members: f.connected,
                    backlog: f.queued,
                    backlog_bytes: f.bytes,
                    oldest_queued_secs: f
                        .oldest
                        .map(|at| now.saturating_duration_since(at).as_secs_f64()),
                }
            })
            .collect();
        (views, more)
    }

    /// Every group's backlog and members, in aggregate (for the scrape-time metrics).
    pub fn shared_backlog(&self) -> SharedBacklog {
        let (groups, _) = self.shared_group_members(usize::MAX);
        let now = Instant::now();
        let mut total = SharedBacklog {
            groups: groups.len() as u64,
            ..SharedBacklog::default()
        };
        for f in walk(&groups) {
            total.members += f.members as u64;
            total.connected_members += f.connected as u64;
            total.queued += f.queued as u64;
            total.max = total.max.max(f.queued as u64);
            if let Some(at) = f.oldest {
                total.oldest = total.oldest.max(now.saturating_duration_since(at));
            }
            if f.queued > 0 && f.connected == 0 {
                total.unserved += 1;
            }
        }
        total
    }
}
