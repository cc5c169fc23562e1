//! Order across connections: a SUBSCRIBE the broker has read is in the trie before a PUBLISH
//! read after it is routed.
//!
//! Connections run on several worker threads, and a worker can be preempted between reading a
//! SUBSCRIBE and inserting it. Without a fence, a PUBLISH read a moment later on another
//! worker is routed first and misses the new subscription (the subscribe-then-trigger race).
//! A driver that reads a SUBSCRIBE holds a [`SubscribeEntry`] until it has handled the packets
//! before its first PUBLISH; a driver about to route a PUBLISH first waits, holding no entry of
//! its own, until no entry is held (or [`MAX_WAITS`] SUBSCRIBEs have finished).
//!
//! Cheap by construction: the publish side is one atomic load when no SUBSCRIBE is being
//! handled (the usual case); SUBSCRIBEs are rare next to PUBLISHes.
//!
//! Must not: block without bound (8 finishes at most).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// How many times a publisher re-checks after a SUBSCRIBE finished before it routes anyway:
/// under a storm of SUBSCRIBEs the count may never reach zero, and the fence is there to
/// order one SUBSCRIBE before one PUBLISH, not to starve publishers.
const MAX_WAITS: usize = 8;

/// The count of SUBSCRIBEs read but not yet handled, and a wake-up for publishers waiting on
/// it.
#[derive(Debug, Default)]
pub struct SubscribeFence {
    in_flight: AtomicUsize,
    finished: Notify,
}

/// Held by a driver from reading a SUBSCRIBE until it has handled that read; dropping it
/// lets waiting publishers go.
#[derive(Debug)]
#[must_use = "the SUBSCRIBE is fenced only while the entry is held"]
pub struct SubscribeEntry<'a> {
    fence: &'a SubscribeFence,
}

impl SubscribeFence {
    /// Marks a SUBSCRIBE as read: publishers wait for it from now on.
    pub fn enter(&self) -> SubscribeEntry<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        SubscribeEntry { fence: self }
    }

    /// True while a SUBSCRIBE is being handled. A caller must not hold an entry of its own
    /// when it waits: two drivers each waiting for the other's entry would never wake.
    #[inline]
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Waits until no SUBSCRIBE is being handled, or until [`MAX_WAITS`] of them have
    /// finished.
    pub async fn wait_open(&self) {
        for _ in 0..MAX_WAITS {
            // Registered before the check, so a finish between the check and the await wakes it.
            let mut finished = std::pin::pin!(self.finished.notified());
            finished.as_mut().enable();
            if !self.is_closed() {
                return;
            }
            finished.await;
        }
    }
}

impl Drop for SubscribeEntry<'_> {
    fn drop(&mut self) {
        self.fence.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.fence.finished.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_publisher_waits_until_every_subscribe_being_handled_is_done() {
        let fence = SubscribeFence::default();
        assert!(!fence.is_closed());
        let first = fence.enter();
        let second = fence.enter();
        assert!(fence.is_closed());
        let mut waiting = std::pin::pin!(fence.wait_open());
        assert!(futures_poll_once(waiting.as_mut()).is_pending());
        drop(first);
        assert!(
            futures_poll_once(waiting.as_mut()).is_pending(),
            "one still held"
        );
        drop(second);
        assert!(futures_poll_once(waiting.as_mut()).is_ready());
        assert!(!fence.is_closed());
    }

    fn futures_poll_once<F: std::future::Future>(
        f: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.poll(&mut cx)
    }
}
