//! The session backlog, computed when metrics are read (a scrape or a `$SYS` snapshot), not
//! on the hot path: how many messages wait in session queues and their payload bytes, how many
//! sessions have some, the largest queue and the age of the oldest queued message; and, with
//! them, the shared groups' backlog (`shared_backlog`).
//!
//! Must not: count anything on the publish path; hold the sessions map's lock beyond copying `Arc`s
//! out.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::Broker;

/// How much longer than a walk of the sessions took its figures serve the readings that
/// follow. A scrape (`/metrics` is open to anyone) walked every session each time: 8
/// keep-alive scrapers with 20,000 sessions raised a QoS 1 round trip from 1 to 90 ms (issue
/// 35, seventh pass, N3). Now walks take at most a tenth of the time whatever the request
/// rate: a walk of 60 ms serves the next 600 ms, one of 20 us (a small broker) the next 200
/// us, so the figures stay as fresh as a reading can tell while the cost is bounded.
const WALK_SHARE: u32 = 10;
/// ... and never serve longer than this.
const WALK_INTERVAL_MAX: Duration = Duration::from_secs(5);

/// When the backlog figures were last computed and what that cost: a reading too soon after
/// it, or while another reading is walking, keeps the figures as they are.
#[derive(Debug, Default)]
struct WalkClock {
    /// When the last walk ended, and how long it took.
    last: Mutex<Option<(Instant, Duration)>>,
}

impl WalkClock {
    /// The right to walk now, held while walking (the walker records its end and cost);
    /// `None` when the last walk is recent for its cost or one is under way (the reading then
    /// reports the figures it left).
    fn due(&self, now: Instant) -> Option<MutexGuard<'_, Option<(Instant, Duration)>>> {
        let last = self.last.try_lock()?;
        match *last {
            Some((at, cost))
                if now.saturating_duration_since(at)
                    < (cost * WALK_SHARE).min(WALK_INTERVAL_MAX) =>
            {
                None
            }
            _ => Some(last),
        }
    }
}

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
        let clock = WalkClock::default();
        self.metrics.on_scrape(move |figures| {
            let Some(mut walked) = clock.due(Instant::now()) else {
                return;
            };
            let Some(broker) = broker.upgrade() else {
                return;
            };
            let started = Instant::now();
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
            let now = Instant::now();
            *walked = Some((now, now.saturating_duration_since(started)));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings in quick succession do not all walk the sessions: one while another walks,
    /// or within ten times the last walk's cost after it, reports the figures as they are;
    /// the first after that walks again. Instants are given, not measured.
    #[test]
    fn the_sessions_are_walked_for_at_most_a_tenth_of_the_time() {
        let clock = WalkClock::default();
        let start = Instant::now();
        let mut walking = clock.due(start).expect("the first reading walks");
        assert!(clock.due(start).is_none(), "not while another walks");
        let cost = Duration::from_millis(60);
        *walking = Some((start + cost, cost));
        drop(walking);
        let end = start + cost;
        assert!(clock.due(end).is_none(), "not right after it");
        assert!(
            clock.due(end + cost * 9).is_none(),
            "not within 10x its cost"
        );
        assert!(clock.due(end + cost * 10).is_some(), "again after that");
        *clock.last.lock() = Some((end, Duration::from_secs(60)));
        assert!(
            clock.due(end + WALK_INTERVAL_MAX).is_some(),
            "a long walk: capped"
        );
    }
}
