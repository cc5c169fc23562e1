//! The session backlog, computed when metrics are read (a scrape or a `$SYS` snapshot), not
//! on the hot path: how many messages wait in session queues and their payload bytes, how many
//! sessions have some, the largest queue and the age of the oldest queued message; and, with
//! them, the shared groups' backlog (`shared_backlog`).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::Broker;

/// The session backlog at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages waiting in session queues (not yet sent), all sessions.
    pub queued: u64,
    /// Their payload bytes (each session keeps its running sum: no queue walk).
    pub bytes: u64,
    /// Sessions with at least one queued message.
    pub sessions: u64,
    /// The largest queue, in messages.
    pub max: u64,
    /// Age of the oldest queued message (the front of each queue is its oldest).
    pub oldest: Duration,
}

impl Broker {
    /// Walks every session's queue. The session map is locked only to copy its handles (one
    /// allocation per reading), then each session only for its queue's length and front:
    /// connections are never held up for the whole walk.
    pub fn backlog(&self) -> Backlog {
        let sessions: Vec<_> = self.sessions.lock().iter().cloned().collect();
        let now = Instant::now();
        let mut backlog = Backlog::default();
        for session in &sessions {
            let st = session.lock();
            let Some(front) = st.queue.front() else {
                continue;
            };
            let len = st.queue.len() as u64;
            let bytes = st.queued_bytes() as u64;
            let age = now.saturating_duration_since(front.message.received_at);
            drop(st);
            backlog.queued += len;
            backlog.bytes += bytes;
            backlog.sessions += 1;
            backlog.max = backlog.max.max(len);
            backlog.oldest = backlog.oldest.max(age);
        }
        backlog
    }

    /// Registers the backlog as a scrape-time figure of this broker's metrics. Holds the
    /// broker weakly: the metrics live inside it.
    pub(super) fn watch_backlog(self: &Arc<Self>) {
        let broker: Weak<Broker> = Arc::downgrade(self);
        self.metrics.on_scrape(move |figures| {
            let Some(broker) = broker.upgrade() else {
                return;
            };
            let backlog = broker.backlog();
            figures.messages_queued.set(backlog.queued as f64);
            figures.messages_queued_bytes.set(backlog.bytes as f64);
            figures.sessions_backlogged.set(backlog.sessions as f64);
            figures.session_backlog_max.set(backlog.max as f64);
            figures
                .session_backlog_oldest_seconds
                .set(backlog.oldest.as_secs_f64());
            let shared = broker.shared_backlog();
            let groups = &figures.shared_groups;
            groups.groups.set(shared.groups as f64);
            groups.members.set(shared.members as f64);
            groups
                .members_connected
                .set(shared.connected_members as f64);
            groups.messages_queued.set(shared.queued as f64);
            groups.backlog_max.set(shared.max as f64);
            groups
                .backlog_oldest_seconds
                .set(shared.oldest.as_secs_f64());
            groups.unserved.set(shared.unserved as f64);
        });
    }
}
