//! What this node may still put into the cluster's message stream (`PB_MSGS`): strangers'
//! bytes within their share over the stream's retention, and nothing for a while after
//! JetStream said the stream or its store is full.
//!
//! A QoS 1/2 message goes into the stream whether or not anyone subscribes, and stays there
//! for `retention`; it holds no memory on any node, so the memory budget's anonymous share
//! never saw it: one anonymous connection filled JetStream's store in a second, and until
//! its messages aged out every QoS 1/2 PUBLISH on every node failed and every persistent
//! CONNECT got 0x88 (issue 35, sixteenth adversarial pass, C5). Here strangers' stream bytes
//! are bounded per node, and a full stream is answered at admission (v5 0x97) rather than by
//! closing each publisher's connection when JetStream refuses its message.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How many slices the retention window is counted in: a stranger's bytes leave the count
/// at most a 64th of the window after they left the stream.
const SLICES: u32 = 64;

/// How long QoS 1/2 PUBLISHes are refused at admission after JetStream refused a message for
/// lack of room, at least; then they are tried again (a refused one closes its publisher's
/// connection unacknowledged, as any message JetStream did not take).
pub(super) const FULL_HOLD: Duration = Duration::from_secs(1);

/// Strangers' bytes put into the stream over its retention, counted in time slices.
#[derive(Debug)]
pub(super) struct StrangerBytes {
    /// The stream's retention: how long a message stays (and counts).
    window: Duration,
    /// One slice's length.
    slice: Duration,
    /// (slice start, bytes put in during it), oldest first; at most `SLICES + 1`.
    slices: Mutex<(VecDeque<(Instant, u64)>, u64)>,
}

impl StrangerBytes {
    /// Counts over `window` (`[cluster] retention`).
    pub(super) fn new(window: Duration) -> StrangerBytes {
        StrangerBytes {
            window,
            slice: (window / SLICES).max(Duration::from_millis(1)),
            slices: Mutex::new((VecDeque::new(), 0)),
        }
    }

    /// Charges `bytes` if, with what strangers put into the stream within the window, they
    /// stay within `share`; false (nothing charged) past it.
    pub(super) fn charge(&self, bytes: u64, share: u64, now: Instant) -> bool {
        let mut guard = self.slices.lock();
        let (slices, total) = &mut *guard;
        while let Some(&(start, old)) = slices.front() {
            if now.saturating_duration_since(start) < self.window + self.slice {
                break;
            }
            slices.pop_front();
            *total -= old;
        }
        if total.saturating_add(bytes) > share {
            return false;
        }
        *total += bytes;
        match slices.back_mut() {
            Some((start, sum)) if now.saturating_duration_since(*start) < self.slice => {
                *sum += bytes;
            }
            _ => slices.push_back((now, bytes)),
        }
        true
    }
}

/// [`StrangerBytes`] per stranger's share: anonymous clients' and each bridge's remote's
/// apart, so one cannot spend what the other may put into the stream (issue 35,
/// seventeenth adversarial pass, D5).
#[derive(Debug)]
pub(super) struct StrangerWindows(Vec<StrangerBytes>);

impl StrangerWindows {
    /// One window of `window` per share.
    pub(super) fn new(window: Duration) -> StrangerWindows {
        StrangerWindows((0..64).map(|_| StrangerBytes::new(window)).collect())
    }

    /// [`StrangerBytes::charge`] in the window of the share numbered `slot`.
    pub(super) fn charge(&self, slot: u8, bytes: u64, share: u64, now: Instant) -> bool {
        self.0
            .get(usize::from(slot))
            .is_some_and(|window| window.charge(bytes, share, now))
    }
}

/// Whether JetStream refused a message for lack of room (the stream's byte bound, or its
/// store or account limits): then the stream is full for everyone, not for this message.
pub(super) fn is_full(error: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::ErrorCode;
    let Some(source) = std::error::Error::source(error) else {
        return false;
    };
    let Some(refusal) = source.downcast_ref::<async_nats::jetstream::Error>() else {
        return false;
    };
    matches!(
        refusal.error_code(),
        ErrorCode::INSUFFICIENT_RESOURCES
            | ErrorCode::STORAGE_RESOURCES_EXCEEDED
            | ErrorCode::ACCOUNT_RESOURCES_EXCEEDED
            | ErrorCode::STREAM_STORE_FAILED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_bytes_are_bounded_over_the_window_and_leave_with_it() {
        let window = Duration::from_secs(64);
        let bytes = StrangerBytes::new(window);
        let start = Instant::now();
        assert!(bytes.charge(600, 1_000, start));
        assert!(!bytes.charge(401, 1_000, start), "past the share");
        assert!(bytes.charge(400, 1_000, start + Duration::from_secs(10)));
        assert!(!bytes.charge(1, 1_000, start + Duration::from_secs(63)));
        // The first 600 left the stream (and a slice more went by): room for them again.
        assert!(bytes.charge(600, 1_000, start + window + Duration::from_secs(2)));
        assert!(!bytes.charge(1, 1_000, start + window + Duration::from_secs(2)));
    }

    #[test]
    fn a_refusal_nothing_explains_is_not_a_full_stream() {
        let timed_out = async_nats::jetstream::context::PublishError::new(
            async_nats::jetstream::context::PublishErrorKind::TimedOut,
        );
        assert!(!is_full(&timed_out));
    }
}
