//! Back-pressure on a publishing connection (`broker::flow`): after a PUBLISH that filled a
//! connected, draining subscriber's queue past its bound, or while the broker is near its
//! memory budget, the connection reads nothing more from its socket until there is room. Its
//! acknowledgements are only later; nothing it was told is accepted gets dropped.
//!
//! A pause ends when the session it waits for has drained to half its bounds, stalled
//! (`mqtt.stalled_after`), gone offline or ended; a memory pause when usage is under the resume
//! mark or `stalled_after` has passed; a rate pause (the client's own `mqtt.max_publish_rate`,
//! see `rate`) when its bucket is back to zero, on a timer of its own. The connection waits on the broker's one flow-control
//! notification and re-checks under the target's lock only when woken, by a draining session
//! or by the keep-alive sweep at the deadline it reported.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::futures::OwnedNotified;

use super::Client;
use crate::broker::{flow, MemoryLevel, Session};
use crate::connection::io::Socket;
use crate::connection::partial::budgeted_partial_bytes;

/// The Reason String of refusals over the memory budget.
pub(super) const OVER_BUDGET: &str = "the broker is over its memory budget (mqtt.max_memory)";

/// What a pause waits for.
enum PauseFor {
    /// A session filled past its bound to drain (or stall, or go).
    Session(Arc<Session>),
    /// The broker's memory use to fall under the resume mark.
    Memory,
    /// The client's own publish rate bucket to refill (`rate`).
    Rate,
}

/// How a paused connection is woken to re-check.
enum PauseWake {
    /// The broker's next flow-control wake-up (see `FlowControl::room`).
    Room(Pin<Box<OwnedNotified>>),
    /// The moment its rate bucket is back to zero.
    Timer(Pin<Box<tokio::time::Sleep>>),
}

/// A paused publisher's state; boxed in the client, which holds it only while paused.
pub(super) struct Pause {
    target: PauseFor,
    since: Instant,
    wake: PauseWake,
    /// When to re-check without a wake-up, in broker clock milliseconds: the target's stall
    /// deadline, or the end of a memory pause. Reported to the keep-alive sweep.
    pub(super) deadline_ms: u64,
}

impl Pause {
    /// True once the wake-up it waits for fired.
    pub(super) fn poll_room(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        match &mut self.wake {
            PauseWake::Room(room) => room.as_mut().poll(cx).is_ready(),
            PauseWake::Timer(timer) => timer.as_mut().poll(cx).is_ready(),
        }
    }
}

/// What counts against the memory budget: messages alive, subscriptions, anonymous sessions
/// and partly received packets of connected clients (not CONNECTs still arriving:
/// `partial::budgeted_partial_bytes`).
pub(super) fn memory_used() -> u64 {
    flow::message_bytes() + budgeted_partial_bytes()
}

impl<S: Socket> Client<S> {
    /// Where the broker's memory stands (see [`memory_used`]).
    pub(super) fn memory_level(&self) -> MemoryLevel {
        self.broker().flow().memory_level(memory_used())
    }

    /// Stops reading: for `target` (a session filled past its bound) or, with `None`, for the
    /// memory budget. The input already read stays in the buffer, unhandled, until the pause
    /// ends ([`Client::pause_over`]).
    pub(super) fn begin_pause(&mut self, target: Option<Arc<Session>>) {
        let room = Box::pin(Arc::clone(self.broker().flow().room()).notified_owned());
        let target = match target {
            Some(session) => PauseFor::Session(session),
            None => PauseFor::Memory,
        };
        self.start_pause(target, PauseWake::Room(room), Instant::now());
    }

    /// Stops reading for `wait`: the client published faster than `mqtt.max_publish_rate` /
    /// `mqtt.max_publish_bytes_rate` allow (see `rate`).
    pub(super) fn begin_rate_pause(&mut self, wait: std::time::Duration, now: Instant) {
        self.broker().metrics.publish_rate_pauses.increment(1);
        let timer = Box::pin(tokio::time::sleep_until((now + wait).into()));
        self.start_pause(PauseFor::Rate, PauseWake::Timer(timer), now);
    }

    fn start_pause(&mut self, target: PauseFor, wake: PauseWake, now: Instant) {
        self.broker().flow().pause_started();
        self.pause = Some(Box::new(Pause {
            target,
            since: now,
            wake,
            deadline_ms: u64::MAX,
        }));
        // Checked at once: the target may have drained meanwhile; this also sets the deadline.
        if self.pause_over(now) {
            tracing::trace!(client = %self.session.client_id(), "pause ended at once");
        }
    }

    /// Ends a pause without resuming (the connection is closing): counted as ended.
    pub(super) fn abandon_pause(&mut self) {
        if let Some(pause) = self.pause.take() {
            let paused = pause.since.elapsed();
            self.broker()
                .flow()
                .pause_ended(u64::try_from(paused.as_micros()).unwrap_or(u64::MAX));
        }
    }

    /// Whether the pause is over (true also when there is none). Re-arms the wake-up before
    /// checking, so one that comes in between is not lost; on the way out counts the time
    /// paused, and treats it as the client's activity for keep-alive (its PINGREQs were in
    /// the socket, unread, meanwhile).
    pub(super) fn pause_over(&mut self, now: Instant) -> bool {
        let broker = Arc::clone(self.broker());
        let Some(pause) = self.pause.as_deref_mut() else {
            return true;
        };
        let flow = broker.flow();
        if let PauseWake::Room(room) = &mut pause.wake {
            *room = Box::pin(Arc::clone(flow.room()).notified_owned());
        }
        let verdict = match &pause.target {
            PauseFor::Session(target) => self.session.may_resume(target, now),
            PauseFor::Rate => match self.rate.as_deref_mut().and_then(|r| r.wait_at(now)) {
                None => Ok(()),
                Some(wait) => {
                    if let PauseWake::Timer(timer) = &mut pause.wake {
                        timer.as_mut().reset((now + wait).into());
                    }
                    // The timer wakes it; the sweep need not.
                    Err(u64::MAX)
                }
            },
            PauseFor::Memory => {
                let used = memory_used();
                let until = broker.clock_ms(pause.since) + flow.stalled_after_ms;
                if flow.memory_resumes(used) || broker.clock_ms(now) >= until {
                    Ok(())
                } else {
                    Err(until)
                }
            }
        };
        match verdict {
            Ok(()) => {
                let paused = now.saturating_duration_since(pause.since);
                flow.pause_ended(u64::try_from(paused.as_micros()).unwrap_or(u64::MAX));
                self.pause = None;
                self.last_read = self.last_read.max(now);
                true
            }
            Err(deadline_ms) => {
                pause.deadline_ms = deadline_ms;
                self.report_keep_alive_deadline();
                false
            }
        }
    }
}
