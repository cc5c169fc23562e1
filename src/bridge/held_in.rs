//! The remote's QoS 1/2 PUBLISHes a bridge holds unacknowledged while the broker has no room
//! for them: memory near its budget, or the anonymous share full of what the remote sent.
//!
//! The remote sends no more than the Receive Maximum the bridge announced (`inflight`) before
//! its acknowledgements, so holding them back is MQTT's own back-pressure: the remote keeps
//! the rest (MQTT-4.3.2-2). The pump keeps reading meanwhile (acknowledgements of what it
//! forwards out, PINGRESP), so the `out` direction keeps flowing: it waited inside the
//! handler of the one PUBLISH that found no room, and nothing was forwarded either way until
//! memory fell (issue 35, sixteenth adversarial pass, C2).
//!
//! Past [`MOST_HELD_BYTES`] (or `inflight`) held, a further PUBLISH is *skipped*: read,
//! dropped unacknowledged, so the remote still owns it and sends it again when the bridge
//! reconnects (MQTT-4.4.0-1, its session being kept); the pump reconnects once the held ones
//! are routed. Before, the pump stopped reading there, and the remote's acknowledgements of
//! what goes out were never read: `out` stopped for good (seventeenth pass, D7). A bridge with
//! `clean_start = true` cannot have anything sent again, so it still stops reading there.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::time::Instant;

use crate::broker::flow::{message_bytes, FlowControl, MemoryLevel};
use crate::broker::stranger_share::{ShareFit, StrangerShare};
use crate::broker::Broker;
use crate::codec::Publish;

/// What a remote's messages are charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Charge {
    /// The budget only: `trusted = true`, or no method tells identities apart here.
    Budget,
    /// A stranger's share too, as an anonymous client's (the remote's publishers were
    /// never verified here): the bridge's own, apart from anonymous clients' (seventeenth
    /// adversarial pass, D5: a local stranger's retained messages held the bridge's for
    /// good, and its burst had the remote's messages refused on a cluster).
    Stranger(StrangerShare),
}

/// How long a PUBLISH refused for now waits before it is tried again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Most bytes (topics, payloads and properties) held, counted nowhere else: past them a
/// further PUBLISH is skipped (or, with `clean_start = true`, nothing more is read), so a
/// remote sending large messages cannot make the bridge hold up to `inflight` of them.
pub(super) const MOST_HELD_BYTES: usize = 1 << 20;

/// Most topics of skipped PUBLISHes remembered; past them nothing passes the held ones.
const MOST_SKIPPED_TOPICS: usize = 4096;

/// The held PUBLISHes, oldest first, their bytes, since when the bridge has been held
/// (counted as a paused publisher), and how many were skipped (left with the remote, to be
/// sent again at the next connection).
#[derive(Debug)]
pub(super) struct HeldIn {
    queue: VecDeque<Publish>,
    bytes: usize,
    since: Option<Instant>,
    skipped: usize,
    /// Not before then is the oldest tried again: it was refused for now (the cluster or
    /// the store had no room).
    retry_at: Option<Instant>,
    /// Most held at once: the Receive Maximum the bridge announced (`inflight`).
    most: usize,
    /// Whether the remote sends again what was skipped: its session outlives the
    /// connection (`clean_start = false`).
    may_skip: bool,
    /// The skipped PUBLISHes' topics (hashed with `hasher`): a retained one that frees its
    /// share's room may pass the held ones only on a topic none of them has, so the
    /// remote's order holds per topic (MQTT-4.6.0-6). `None` past [`MOST_SKIPPED_TOPICS`].
    skipped_topics: Option<HashSet<u64>>,
    hasher: RandomState,
}

/// How a PUBLISH of the remote may go now ([`HeldIn::may_pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Passage {
    /// Routed and acknowledged: nothing waits before it.
    InOrder,
    /// Routed now, past what waits on other topics, but left unacknowledged
    /// ([`HeldIn::passed_ahead`]): acknowledged now it would be before those, and the bridge,
    /// the remote's client, acknowledges in the order it received (MQTT-4.6.0-2, -3). The
    /// remote sends it again at the next connection: a duplicate QoS 1 allows, and at QoS 2
    /// the bridge's session knows the id and routes it no second time (MQTT-4.3.3-10).
    Ahead,
    /// Not now: held, skipped, or (QoS 0) dropped.
    Wait,
}

/// What [`HeldIn::hold`] did with a PUBLISH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Kept, to be routed once there is room.
    Kept,
    /// Dropped unacknowledged: the remote sends it again at the next connection.
    Skipped,
}

impl HeldIn {
    /// Nothing held; at most `most` at once (the Receive Maximum announced), skipping past
    /// that when `may_skip`.
    pub(super) fn new(most: usize, may_skip: bool) -> HeldIn {
        HeldIn {
            queue: VecDeque::new(),
            bytes: 0,
            since: None,
            skipped: 0,
            retry_at: None,
            most: most.max(1),
            may_skip,
            skipped_topics: Some(HashSet::new()),
            hasher: RandomState::new(),
        }
    }

    /// How a PUBLISH of the remote may go now: not while memory is past the pause mark or
    /// its share has no room for it ([`fit`]); in order when nothing is held or skipped
    /// before it (the remote's order); else, a retained one replacing or clearing one of its
    /// share's, [`Passage::Ahead`] when nothing held or skipped has its topic (order is kept
    /// per topic, MQTT-4.6.0-6) and the remote sends again what is left unacknowledged: it
    /// frees the room the held ones wait for, and behind them it would wait for good (issue
    /// 35, eighteenth adversarial pass, E3).
    pub(super) fn may_pass(&self, broker: &Broker, charge: Charge, publish: &Publish) -> Passage {
        if broker.flow().memory_level(message_bytes()) != MemoryLevel::Normal {
            return Passage::Wait;
        }
        let in_order = self.queue.is_empty() && self.skipped == 0;
        match fit(broker, charge, publish) {
            ShareFit::Room | ShareFit::Replacing if in_order => Passage::InOrder,
            ShareFit::Replacing if self.may_skip && self.nothing_before_on(&publish.topic) => {
                Passage::Ahead
            }
            _ => Passage::Wait,
        }
    }

    /// A QoS 1/2 PUBLISH routed [`Passage::Ahead`]: counted as skipped (left with the remote,
    /// sent again at the next connection), its topic with the others'.
    pub(super) fn passed_ahead(&mut self, topic: &str) {
        self.skipped += 1;
        self.remember_skipped(topic);
    }

    fn remember_skipped(&mut self, topic: &str) {
        let hash = self.hasher.hash_one(topic);
        if let Some(topics) = self.skipped_topics.as_mut() {
            if topics.len() < MOST_SKIPPED_TOPICS {
                topics.insert(hash);
            } else if !topics.contains(&hash) {
                self.skipped_topics = None;
            }
        }
    }

    /// Whether nothing held or skipped has `topic`.
    fn nothing_before_on(&self, topic: &str) -> bool {
        self.skipped_topics
            .as_ref()
            .is_some_and(|skipped| !skipped.contains(&self.hasher.hash_one(topic)))
            && !self.queue.iter().any(|held| held.topic == topic)
    }

    /// Holds `publish` (unacknowledged) behind the others, or skips it past the bounds (and
    /// behind any skipped before it, to keep the remote's order).
    pub(super) fn hold(&mut self, flow: &FlowControl, publish: Publish) -> Held {
        if self.since.is_none() {
            flow.pause_started();
            self.since = Some(Instant::now());
        }
        if self.may_skip && (self.skipped > 0 || !self.within_bounds()) {
            self.skipped += 1;
            self.remember_skipped(&publish.topic);
            return Held::Skipped;
        }
        self.bytes += size(&publish);
        self.queue.push_back(publish);
        Held::Kept
    }

    /// Holds `publish` again, first, to be tried in a second: it was refused for now
    /// ([`crate::broker::PublishRefused::is_for_now`]). Held whatever the bounds: it is one
    /// message, read already.
    pub(super) fn retry_later(&mut self, flow: &FlowControl, publish: Publish) {
        if self.since.is_none() {
            flow.pause_started();
            self.since = Some(Instant::now());
        }
        self.bytes += size(&publish);
        self.queue.push_front(publish);
        self.retry_at = Some(Instant::now() + RETRY_AFTER);
    }

    fn within_bounds(&self) -> bool {
        self.queue.len() < self.most && self.bytes < MOST_HELD_BYTES
    }

    /// Whether the held ones are all routed and some were skipped: the remote must be asked
    /// to send those again (by reconnecting).
    pub(super) fn wants_resend(&self) -> bool {
        self.queue.is_empty() && self.skipped > 0
    }

    /// How many were skipped on this connection.
    pub(super) fn skipped(&self) -> usize {
        self.skipped
    }

    /// The oldest held PUBLISH, if memory is back under the resume mark and there is room
    /// for it; when that leaves none held, the pause ends.
    pub(super) fn release(&mut self, broker: &Broker, charge: Charge) -> Option<Publish> {
        let flow = broker.flow();
        let front = self.queue.front()?;
        if self.retry_at.is_some_and(|at| Instant::now() < at)
            || !flow.memory_resumes(message_bytes())
            || fit(broker, charge, front) == ShareFit::No
        {
            return None;
        }
        self.retry_at = None;
        let publish = self.queue.pop_front()?;
        self.bytes -= size(&publish);
        if self.queue.is_empty() && self.skipped == 0 {
            self.end_pause(flow);
        }
        Some(publish)
    }

    /// Whether the pump may read more from the remote: always where it may skip; else
    /// (`clean_start = true`) within the bounds.
    pub(super) fn may_read(&self) -> bool {
        self.may_skip || self.within_bounds()
    }

    /// Whether none is held.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The connection ended: what is held is the remote's again (it re-sends it, never
    /// acknowledged); the pause ends.
    pub(super) fn end(&mut self, flow: &FlowControl) {
        self.queue.clear();
        self.bytes = 0;
        self.skipped = 0;
        self.skipped_topics = Some(HashSet::new());
        self.retry_at = None;
        self.end_pause(flow);
    }

    fn end_pause(&mut self, flow: &FlowControl) {
        if let Some(since) = self.since.take() {
            flow.pause_ended(u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
    }
}

/// Whether `publish`, charged as `charge` says, fits its share.
fn fit(broker: &Broker, charge: Charge, publish: &Publish) -> ShareFit {
    match charge {
        Charge::Budget => ShareFit::Room,
        Charge::Stranger(share) => broker.stranger_fits(publish, share),
    }
}

/// What a PUBLISH is counted as: what it holds as a message, properties included (counted
/// as topic and payload alone, a remote's 1-byte payloads with 3 MB of user properties made
/// the bridge hold 320 MB: issue 35, seventeenth adversarial pass, D4).
fn size(publish: &Publish) -> usize {
    publish.held_bytes()
}
