//! The remote's QoS 1/2 PUBLISHes a bridge holds unacknowledged while the broker has no room
//! for them: memory near its budget, or the anonymous share full of what the remote sent.
//!
//! The remote sends no more than the Receive Maximum the bridge announced (`inflight`) before
//! its acknowledgements, so holding them back is MQTT's own back-pressure: the remote keeps
//! the rest (MQTT-4.3.2-2). The pump keeps reading meanwhile (acknowledgements of what it
//! forwards out, PINGRESP), so the `out` direction keeps flowing: it waited inside the
//! handler of the one PUBLISH that found no room, and nothing was forwarded either way until
//! memory fell (issue 35, sixteenth adversarial pass, C2).

use std::collections::VecDeque;
use std::time::Instant;

use crate::broker::flow::{anonymous_share_has_room, message_bytes, FlowControl, MemoryLevel};
use crate::codec::Publish;

/// What a remote's messages are charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Charge {
    /// The budget only: `trusted = true`, or no method tells identities apart here.
    Budget,
    /// The anonymous share too, as an anonymous client's (the remote's publishers were
    /// never verified here).
    Stranger,
}

/// Most bytes (topics, payloads and properties) held, counted nowhere else: past them the pump reads
/// nothing more from the remote (its acknowledgements of what goes out wait too), so a
/// remote sending large messages cannot make the bridge hold up to `inflight` of them.
pub(super) const MOST_HELD_BYTES: usize = 1 << 20;

/// The held PUBLISHes, oldest first, their bytes, and since when the bridge has been held
/// (counted as a paused publisher).
#[derive(Debug, Default)]
pub(super) struct HeldIn {
    queue: VecDeque<Publish>,
    bytes: usize,
    since: Option<Instant>,
}

impl HeldIn {
    /// Whether a PUBLISH of the remote may be routed now: nothing held before it, and room
    /// for it ([`has_room`] at the pause mark).
    pub(super) fn may_pass(&self, flow: &FlowControl, charge: Charge, publish: &Publish) -> bool {
        self.queue.is_empty()
            && flow.memory_level(message_bytes()) == MemoryLevel::Normal
            && has_room(flow, charge, publish)
    }

    /// Holds `publish` (unacknowledged) behind the others.
    pub(super) fn hold(&mut self, flow: &FlowControl, publish: Publish) {
        if self.since.is_none() {
            flow.pause_started();
            self.since = Some(Instant::now());
        }
        self.bytes += size(&publish);
        self.queue.push_back(publish);
    }

    /// The oldest held PUBLISH, if memory is back under the resume mark and there is room
    /// for it; when that leaves none held, the pause ends.
    pub(super) fn release(&mut self, flow: &FlowControl, charge: Charge) -> Option<Publish> {
        let front = self.queue.front()?;
        if !flow.memory_resumes(message_bytes()) || !has_room(flow, charge, front) {
            return None;
        }
        let publish = self.queue.pop_front()?;
        self.bytes -= size(&publish);
        if self.queue.is_empty() {
            self.end_pause(flow);
        }
        Some(publish)
    }

    /// Whether the pump may read more from the remote: fewer than `most` held (the Receive
    /// Maximum it announced) and fewer than [`MOST_HELD_BYTES`].
    pub(super) fn may_read(&self, most: usize) -> bool {
        self.queue.len() < most && self.bytes < MOST_HELD_BYTES
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
        self.end_pause(flow);
    }

    fn end_pause(&mut self, flow: &FlowControl) {
        if let Some(since) = self.since.take() {
            flow.pause_ended(u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX));
        }
    }
}

/// Whether `publish`, charged as `charge` says, fits the anonymous share.
fn has_room(flow: &FlowControl, charge: Charge, publish: &Publish) -> bool {
    charge == Charge::Budget || anonymous_share_has_room(size(publish) as u64, &flow.memory)
}

/// What a PUBLISH is counted as: what it holds as a message, properties included (counted
/// as topic and payload alone, a remote's 1-byte payloads with 3 MB of user properties made
/// the bridge hold 320 MB: issue 35, seventeenth adversarial pass, D4).
fn size(publish: &Publish) -> usize {
    publish.held_bytes()
}
