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

/// A share's clears of retained messages may put this fraction of the share more into the
/// stream (a 16th): a stranger that used its share up within the retention (an hour by
/// default) can still clear what it retained, which frees the memory its share holds
/// (issue 35, eighteenth adversarial pass, E3).
pub(super) const CLEARS_ALLOWANCE: u64 = 16;

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

/// How many slices one identity's window is counted in ([`IdentityWindows`]): coarser than
/// strangers' ([`SLICES`]), as there may be an entry per verified user.
const IDENTITY_SLICES: usize = 8;

/// What one identity put into the stream: bytes per slice, in a ring, and the index of the
/// newest slice written.
#[derive(Debug, Clone, Copy)]
struct IdentityEntry {
    newest: u64,
    bytes: [u64; IDENTITY_SLICES + 1],
}

/// Each verified identity's bytes put into the stream over its retention, bounded apart:
/// one password user filled the stream alone, and every QoS 1/2 PUBLISH on every node was
/// refused until its messages aged out (issue 35, seventeenth adversarial pass, D6). Keyed
/// by the session's share key (`broker::owner::share_key`: a verified user's name, or the
/// source address where nobody is verified). The window counts between `retention` and a
/// slice (an eighth) more; an identity nothing counted for over a window leaves the map.
#[derive(Debug)]
pub(super) struct IdentityWindows {
    /// The most one identity may put in within the window.
    bound: u64,
    /// One slice's length.
    slice: Duration,
    /// Where slice 0 starts.
    epoch: Instant,
    /// The entries, and the length past which stale ones are swept.
    entries: Mutex<(std::collections::HashMap<u64, IdentityEntry>, usize)>,
}

impl IdentityWindows {
    /// At most `bound` bytes per identity over `window` (`[cluster] retention`).
    pub(super) fn new(window: Duration, bound: u64) -> IdentityWindows {
        IdentityWindows {
            bound,
            slice: (window / IDENTITY_SLICES as u32).max(Duration::from_millis(1)),
            epoch: Instant::now(),
            entries: Mutex::new((std::collections::HashMap::new(), 1024)),
        }
    }

    /// Charges `bytes` to `identity` if it stays within the bound over the window; false
    /// (nothing charged) past it.
    pub(super) fn charge(&self, identity: u64, bytes: u64, now: Instant) -> bool {
        let index = u64::try_from(
            now.saturating_duration_since(self.epoch).as_nanos() / self.slice.as_nanos(),
        )
        .unwrap_or(u64::MAX);
        let ring = IDENTITY_SLICES as u64 + 1;
        let mut guard = self.entries.lock();
        let (entries, sweep_at) = &mut *guard;
        if entries.len() >= *sweep_at {
            entries.retain(|_, e| index.saturating_sub(e.newest) < ring);
            *sweep_at = (entries.len() * 2).max(1024);
        }
        let entry = entries.entry(identity).or_insert(IdentityEntry {
            newest: index,
            bytes: [0; IDENTITY_SLICES + 1],
        });
        // Slices that left the window are emptied before they are written again.
        let gone = index.saturating_sub(entry.newest).min(ring);
        for step in 1..=gone {
            entry.bytes[((entry.newest + step) % ring) as usize] = 0;
        }
        entry.newest = entry.newest.max(index);
        let total: u64 = entry.bytes.iter().sum();
        if total.saturating_add(bytes) > self.bound {
            return false;
        }
        entry.bytes[(index % ring) as usize] += bytes;
        true
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
    fn each_identity_is_bounded_apart_over_the_window() {
        let window = Duration::from_secs(80);
        let windows = IdentityWindows::new(window, 1_000);
        let start = Instant::now();
        assert!(windows.charge(7, 900, start));
        assert!(!windows.charge(7, 101, start), "past one identity's bound");
        assert!(windows.charge(9, 1_000, start), "another identity's own");
        assert!(windows.charge(7, 100, start + Duration::from_secs(70)));
        assert!(!windows.charge(7, 1, start + Duration::from_secs(79)));
        // The first 900 left the window (a slice of 10 s more went by).
        assert!(windows.charge(7, 900, start + window + Duration::from_secs(11)));
        assert!(!windows.charge(7, 1, start + window + Duration::from_secs(11)));
    }

    #[test]
    fn a_refusal_nothing_explains_is_not_a_full_stream() {
        let timed_out = async_nats::jetstream::context::PublishError::new(
            async_nats::jetstream::context::PublishErrorKind::TimedOut,
        );
        assert!(!is_full(&timed_out));
    }
}
