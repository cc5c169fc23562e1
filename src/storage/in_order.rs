//! Writes that wait for their commit, in order: the one rule a connection and a bridge both
//! keep before they answer a peer. An acknowledgement is a promise that the store holds what
//! it acknowledges, so it is written only once its commit is durable; and a write with
//! nothing to wait for still queues behind earlier gated ones, so answers go out in the order
//! their requests came (PUBACKs in PUBLISH order, MQTT-4.6.0-2). With the in-memory store
//! nothing is ever gated and the queue stays empty.
//!
//! Must not: reorder writes.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::{Durable, StorageError};

/// A FIFO of writes, each held back until its commit (if any) is durable.
#[derive(Debug)]
pub(crate) struct InOrder<T> {
    queue: VecDeque<(Option<Durable>, T)>,
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        InOrder {
            queue: VecDeque::new(),
        }
    }
}

impl<T> InOrder<T> {
    /// True when nothing waits: a new ungated write may go straight out.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Writes waiting; bounds how much a peer may have unacknowledged.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when the front write waits for a commit (a driver's select arm).
    pub(crate) fn waiting(&self) -> bool {
        matches!(self.queue.front(), Some((Some(_), _)))
    }

    /// Queues a write behind everything already waiting, to go once `durable` (if any) is.
    pub(crate) fn push(&mut self, durable: Option<Durable>, item: T) {
        self.queue.push_back((durable, item));
    }

    /// Ready when the front write's commit is durable (or failed). The commit stays in place
    /// until [`Self::release_front`], so polling it again is harmless.
    pub(crate) fn poll_front_durable(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), StorageError>> {
        match self.queue.front_mut() {
            Some((Some(durable), _)) => Pin::new(durable).poll(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Marks the front write as no longer waiting (its commit is durable).
    pub(crate) fn release_front(&mut self) {
        if let Some(front) = self.queue.front_mut() {
            front.0 = None;
        }
    }

    /// Waits for the front write's commit and releases it. Cancel-safe: a `select!` that
    /// picks another branch first loses nothing; the front is released only once its commit
    /// is done.
    ///
    /// # Errors
    ///
    /// The commit failed: what the write promises is not stored.
    pub(crate) async fn wait_front(&mut self) -> Result<(), StorageError> {
        std::future::poll_fn(|cx| self.poll_front_durable(cx)).await?;
        self.release_front();
        Ok(())
    }

    /// Takes the front write if nothing holds it back any more.
    pub(crate) fn pop_ready(&mut self) -> Option<T> {
        match self.queue.front() {
            Some((None, _)) => self.queue.pop_front().map(|(_, item)| item),
            _ => None,
        }
    }
}
