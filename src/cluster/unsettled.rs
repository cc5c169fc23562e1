//! Shared groups' messages this node pulled from JetStream and has not settled yet.
//!
//! A group's message is acknowledged to JetStream only when its member is done with it (its
//! PUBACK / PUBREC, or a drop that was counted), not when it is queued here: until then
//! JetStream holds it, so a node that dies with it queued has it delivered to a member on
//! another node once `ACK_WAIT` has passed. Each pulled message carries a [`Ticket`] (the
//! broker's [`Settlement`]); dropping the message's last handle acknowledges it, giving it
//! back (a session ending here with no other member) naks it. While a member holds it, its
//! wait is extended every `PROGRESS` ("work in progress"), so a slow or offline member does
//! not have it redelivered to another. The replies go out in order through one task. A
//! ticket dropped with the broker itself (embedded, the runtime going on) sends nothing.
//!
//! Must not: acknowledge a message a member still holds; send anything after a message's
//! settlement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::Subject;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::Cluster;
use crate::broker::{Broker, Settlement};

/// The group consumers' `ack_wait`: how long a message a node pulled waits for its
/// settlement (or a progress reply) before JetStream hands it to another node, which is how
/// long a dead node's held messages take to reach another member.
pub(super) const ACK_WAIT: Duration = Duration::from_secs(10);
/// How long a message given back (or not taken) waits before JetStream offers it again:
/// longer than a pull lasts ([`super::shared::PULL_WAIT`]), so that the pulls this node made while
/// it still had a connected member have ended and the message goes to another node's
/// (JetStream cannot tell that a pull's puller stopped listening; one that got it would
/// hold it for a whole [`ACK_WAIT`]).
pub(super) const REOFFER: Duration = Duration::from_secs(2);
/// How often each held message's wait is extended: a third of [`ACK_WAIT`], so one lost
/// reply does not cost it.
const PROGRESS: Duration = Duration::from_secs(3);

/// The messages pulled and not settled: their reply subjects, by ticket.
#[derive(Debug)]
pub(super) struct Unsettled {
    held: parking_lot::Mutex<HashMap<u64, Subject>>,
    next: AtomicU64,
    /// Replies to send, in order (the sending task publishes them).
    replies: mpsc::UnboundedSender<(Subject, Bytes)>,
    cluster: Arc<Cluster>,
    /// The broker whose sessions hold the tickets: once it is gone (dropped while the
    /// runtime goes on, as when Postbox is embedded), a ticket dropped with it is not an
    /// acknowledgement, its member never had the message.
    broker: Weak<Broker>,
}

impl Unsettled {
    /// Starts the reply and progress tasks; they end when the last handle is dropped.
    pub(super) fn start(
        client: async_nats::Client,
        cluster: Arc<Cluster>,
        broker: Weak<Broker>,
    ) -> Arc<Unsettled> {
        let (replies, rx) = mpsc::unbounded_channel();
        let unsettled = Arc::new(Unsettled {
            held: parking_lot::Mutex::default(),
            next: AtomicU64::new(1),
            replies,
            cluster,
            broker,
        });
        tokio::spawn(send_replies(client, rx));
        tokio::spawn(keep_waiting(Arc::downgrade(&unsettled)));
        unsettled
    }

    /// A ticket for a message pulled with reply subject `reply`: it settles the message.
    pub(super) fn ticket(self: &Arc<Self>, reply: Subject) -> Ticket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.held.lock().insert(id, reply);
        self.cluster.metrics.shared_unsettled.increment(1.0);
        Ticket {
            id,
            unsettled: Arc::clone(self),
        }
    }

    /// Stops holding ticket `id` without a reply.
    fn forget(&self, id: u64) {
        if self.held.lock().remove(&id).is_some() {
            self.cluster.metrics.shared_unsettled.decrement(1.0);
        }
    }

    /// Sends `kind` for ticket `id`, once: false if it was settled already.
    fn settle(&self, id: u64, kind: AckKind) -> bool {
        // Sent under the lock, as the progress replies are: none for this message can
        // follow its settlement (a late "in progress" would stretch a nak's re-offer).
        let mut held = self.held.lock();
        let Some(reply) = held.remove(&id) else {
            return false;
        };
        // No task any more (shutdown): JetStream delivers it again after its wait.
        let _ = self.replies.send((reply, kind.into()));
        drop(held);
        self.cluster.metrics.shared_unsettled.decrement(1.0);
        true
    }
}

/// One pulled message's settlement (see the module): acknowledged on drop.
#[derive(Debug)]
pub(super) struct Ticket {
    id: u64,
    unsettled: Arc<Unsettled>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // The broker being dropped drops its sessions' queues: not settled, just forgotten
        // here (JetStream offers the message again after its wait). Its last strong handle
        // is gone from the moment its drop began.
        if self.unsettled.broker.strong_count() == 0 {
            self.unsettled.forget(self.id);
            return;
        }
        self.unsettled.settle(self.id, AckKind::Ack);
    }
}

impl Settlement for Ticket {
    fn give_back(&self) -> bool {
        self.unsettled.settle(self.id, AckKind::Nak(Some(REOFFER)))
    }
}

/// Publishes the replies in order.
async fn send_replies(
    client: async_nats::Client,
    mut rx: mpsc::UnboundedReceiver<(Subject, Bytes)>,
) {
    while let Some((subject, body)) = rx.recv().await {
        if let Err(error) = client.publish(subject, body).await {
            tracing::debug!(%error, "cluster: a shared message's reply was not sent (it comes again)");
        }
    }
}

/// Every `PROGRESS`, extends the wait of every held message (while the link is up: replies
/// queued meanwhile would only pile up).
async fn keep_waiting(unsettled: Weak<Unsettled>) {
    let mut tick = tokio::time::interval(PROGRESS);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(unsettled) = unsettled.upgrade() else {
            break;
        };
        if !unsettled.cluster.is_up() {
            continue;
        }
        let held = unsettled.held.lock();
        for reply in held.values() {
            let _ = unsettled
                .replies
                .send((reply.clone(), AckKind::Progress.into()));
        }
    }
}
