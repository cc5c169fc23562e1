//! What this node sends to the others: messages in the order their publishers' PUBLISHes
//! were routed, acknowledgements awaited in that order.
//!
//! One task publishes (QoS 1/2 into `PB_MSGS`, retained ones into the retained bucket too,
//! QoS 0 on core subjects); a second awaits the JetStream acknowledgements and resolves each
//! publisher's wait. A message not acknowledged within `publish_timeout` fails its wait: the
//! publisher's connection closes unacknowledged and its client re-sends.
//!
//! A message the local store holds (queued for a persistent session here) gets its stream
//! sequence stored too when the acknowledgement brings it (`Op::SequenceMessage`, issue 34),
//! and its publisher's wait resolves only once that is durable ([`settle`]): a restart,
//! even `kill -9` after the acknowledgement, brings the message back with its sequence.
//!
//! Must not: ack a publisher before JetStream did.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{
    self,
    context::{PublishAckFuture, PublishError},
};
use bytes::Bytes;
use bytestring::ByteString;
use tokio::sync::{mpsc, oneshot};

use super::{subject, Cluster, QOS0_SUBJECTS, RETAINED_BUCKET, STREAM_SUBJECTS};
use crate::broker::flow::InTransit;
use crate::codec::QoS;
use crate::storage::StorageError;

/// What the outbound queue carries.
#[derive(Debug)]
pub(crate) enum Queued {
    /// A message to send.
    Message(Outgoing),
    /// Answered once every message queued before it is acknowledged or failed: a restore's
    /// replay waits for it, so this node's own messages routed before the session
    /// subscribed here are in the stream when the replay reads it.
    Barrier(oneshot::Sender<()>),
}

/// One message for the other nodes.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The message itself (QoS 1/2), to record its stream sequence when acknowledged.
    pub message: Option<Arc<crate::broker::Message>>,
    /// Its topic (for the subject and the retained key).
    pub topic: ByteString,
    /// Its QoS: 0 goes on a core subject (unless `subject` says where), 1/2 into the stream.
    pub qos: QoS,
    /// Retained: also the topic's entry in the retained bucket.
    pub retain: bool,
    /// The frame ([`super::wire`]).
    pub frame: Bytes,
    /// The frame's bytes, counted in the memory budget until NATS has taken it (QoS 0) or
    /// acknowledged it (QoS 1/2).
    pub(crate) in_transit: InTransit,
    /// The publisher's wait (QoS 1/2).
    pub done: Option<oneshot::Sender<Result<(), StorageError>>>,
    /// The stream subject when it is not the topic's (a shared group's given-back message,
    /// [`super::shared::regroup_subject`]).
    pub subject: Option<String>,
}

/// The acknowledgements one message waits for: the stream's first, then the retained
/// bucket's.
struct Awaiting {
    message: Option<Arc<crate::broker::Message>>,
    acks: [Option<PublishAckFuture>; 2],
    done: Option<oneshot::Sender<Result<(), StorageError>>>,
    /// A [`Queued::Barrier`] (no message).
    barrier: Option<oneshot::Sender<()>>,
    /// Its first acknowledgement is a `PB_MSGS` sequence (not a given-back message's, in
    /// `PB_REGROUP`).
    sequenced: bool,
    /// Its frame's count in the budget, until acknowledged.
    in_transit: Option<InTransit>,
}

/// A publisher's wait, resolved with `result` once the commit that stores its message's
/// stream sequence is durable.
type Settling = (
    crate::storage::Durable,
    oneshot::Sender<Result<(), StorageError>>,
    Result<(), StorageError>,
);

/// Starts the publishing and acknowledging tasks.
pub(super) fn spawn(
    client: async_nats::Client,
    js: jetstream::Context,
    cluster: Arc<Cluster>,
    broker: Weak<crate::broker::Broker>,
    timeout: Duration,
    mut outgoing: mpsc::UnboundedReceiver<Queued>,
) {
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let (settle_tx, settle_rx) = mpsc::unbounded_channel();
    tokio::spawn(settle(settle_rx));
    tokio::spawn(acknowledge(
        Arc::clone(&cluster),
        broker.clone(),
        timeout,
        acks_rx,
        settle_tx,
    ));
    tokio::spawn(async move {
        let mut puts = RetainedPuts::new(timeout);
        // A message NATS took goes to the acknowledgement waiter, in publish order, with
        // the acknowledgements it waits for; one it did not take fails.
        let hand_on = |sent: Result<[Option<PublishAckFuture>; 2], PublishError>,
                       out: Outgoing,
                       sequenced: bool,
                       bytes: u64,
                       streamed: bool| match sent {
            Ok(acks) => {
                let _ = acks_tx.send(Awaiting {
                    message: out.message,
                    acks,
                    done: out.done,
                    barrier: None,
                    sequenced,
                    in_transit: Some(out.in_transit),
                });
                count_out(&cluster, bytes);
            }
            Err(error) => fail(
                &cluster,
                &broker,
                streamed,
                out.done,
                out.in_transit,
                &error,
            ),
        };
        loop {
            let queued = tokio::select! {
                biased;
                Some((topic, outcome)) = puts.answers.recv() => {
                    puts.answered(&js, &cluster, topic, outcome).await;
                    drained(&broker);
                    continue;
                }
                queued = outgoing.recv() => match queued {
                    Some(queued) => queued,
                    None => break,
                },
            };
            let mut out = match queued {
                Queued::Message(out) => out,
                Queued::Barrier(barrier) => {
                    let _ = acks_tx.send(Awaiting {
                        message: None,
                        acks: [None, None],
                        done: None,
                        barrier: Some(barrier),
                        sequenced: false,
                        in_transit: None,
                    });
                    continue;
                }
            };
            let bytes = out.frame.len() as u64;
            // Into a stream: QoS 1/2, and a shared group's message offered to its other
            // nodes whatever its QoS (`PB_REGROUP`).
            let streamed = out.qos != QoS::AtMostOnce || out.subject.is_some();
            if streamed {
                // Its sequence will be above everything seen so far: a floor for the
                // cursors until its acknowledgement says exactly.
                cluster.push_floor();
            }
            let tail = subject::escape(&out.topic);
            if out.retain && out.qos == QoS::AtMostOnce {
                // Retained at QoS 0: the bucket's entry, one put per topic at a time, the
                // newest waiting behind it (below).
                puts.put(&js, &cluster, out.topic.clone(), out.frame.clone())
                    .await;
            } else if out.retain {
                // Retained: the bucket holds it for nodes and subscribers to come. Newer
                // than any QoS 0 value of the topic still waiting to be put.
                puts.supersede(&out.topic);
                let retained = js
                    .publish(
                        format!("$KV.{RETAINED_BUCKET}.{}", subject::key(&out.topic)),
                        out.frame.clone(),
                    )
                    .await;
                let sent = match retained {
                    Ok(ack) => js
                        .publish(format!("{STREAM_SUBJECTS}.{tail}"), out.frame.clone())
                        .await
                        .map(|stream| [Some(stream), Some(ack)]),
                    Err(error) => Err(error),
                };
                hand_on(sent, out, true, bytes, streamed);
                continue;
            }
            if !streamed {
                let published = tokio::time::timeout(
                    timeout,
                    client.publish(format!("{QOS0_SUBJECTS}.{tail}"), out.frame),
                )
                .await;
                if !matches!(published, Ok(Ok(()))) {
                    cluster.metrics.dropped[0].increment(1);
                } else {
                    count_out(&cluster, bytes);
                }
                cluster.settled();
                drop(out.in_transit);
                drained(&broker);
                continue;
            }
            let sequenced = out.subject.is_none();
            let subject = out
                .subject
                .take()
                .unwrap_or_else(|| format!("{STREAM_SUBJECTS}.{tail}"));
            let sent = js.publish(subject, out.frame.clone()).await;
            hand_on(
                sent.map(|ack| [Some(ack), None]),
                out,
                sequenced,
                bytes,
                streamed,
            );
        }
    });
}

/// Wakes publishers paused for memory once what this node held for NATS is gone.
fn drained(broker: &Weak<crate::broker::Broker>) {
    if let Some(broker) = broker.upgrade() {
        broker.flow().on_drained();
    }
}

/// The retained bucket's puts of QoS 0 retained messages: at most one in flight per topic,
/// the newest of those published meanwhile waiting behind it (the bucket keeps one value
/// per topic, so the ones in between would only be overwritten), each counted in the
/// memory budget until acknowledged.
///
/// Why: a QoS 0 publisher waits for nothing, so its puts were sent unawaited, as fast as it
/// published; JetStream stores a large entry slower than that, and the frames piled up in
/// the NATS client's buffers of the publishing node, counted nowhere: one client rewriting
/// one retained topic with 500 KB took 16 MiB nodes past 1.7 GB (issue 35, eighteenth
/// pass, E0).
struct RetainedPuts {
    /// Topic -> the newest frame waiting for the put in flight.
    in_flight: std::collections::HashMap<ByteString, Option<(Bytes, InTransit)>>,
    /// The put in flight of each topic answered (or timed out: `false`).
    answers: mpsc::UnboundedReceiver<(ByteString, bool)>,
    answer: mpsc::UnboundedSender<(ByteString, bool)>,
    timeout: Duration,
}

impl RetainedPuts {
    fn new(timeout: Duration) -> RetainedPuts {
        let (answer, answers) = mpsc::unbounded_channel();
        RetainedPuts {
            in_flight: std::collections::HashMap::new(),
            answers,
            answer,
            timeout,
        }
    }

    /// Puts `frame` as `topic`'s entry, or keeps it to put once the topic's put in flight
    /// is answered (replacing one kept before).
    async fn put(
        &mut self,
        js: &jetstream::Context,
        cluster: &Cluster,
        topic: ByteString,
        frame: Bytes,
    ) {
        let counted = InTransit::new(frame.len());
        if let Some(next) = self.in_flight.get_mut(&topic) {
            *next = Some((frame, counted));
            return;
        }
        self.send(js, cluster, topic, frame, counted).await;
    }

    /// A QoS 1/2 value of `topic` goes to the bucket now: the QoS 0 one kept is older.
    fn supersede(&mut self, topic: &str) {
        if let Some(next) = self.in_flight.get_mut(topic) {
            *next = None;
        }
    }

    /// `topic`'s put was answered: the one kept behind it, if any, goes now.
    async fn answered(
        &mut self,
        js: &jetstream::Context,
        cluster: &Cluster,
        topic: ByteString,
        ok: bool,
    ) {
        if !ok {
            cluster.metrics.dropped[0].increment(1);
        }
        if let Some(Some((frame, counted))) = self.in_flight.remove(&topic) {
            self.send(js, cluster, topic, frame, counted).await;
        }
    }

    async fn send(
        &mut self,
        js: &jetstream::Context,
        cluster: &Cluster,
        topic: ByteString,
        frame: Bytes,
        counted: InTransit,
    ) {
        let put = js
            .publish(
                format!("$KV.{RETAINED_BUCKET}.{}", subject::key(&topic)),
                frame,
            )
            .await;
        match put {
            Ok(ack) => {
                self.in_flight.insert(topic.clone(), None);
                let answer = self.answer.clone();
                let timeout = self.timeout;
                tokio::spawn(async move {
                    let ok = matches!(tokio::time::timeout(timeout, ack).await, Ok(Ok(_)));
                    drop(counted);
                    let _ = answer.send((topic, ok));
                });
            }
            Err(error) => {
                tracing::debug!(%error, topic = %topic, "cluster: a retained QoS 0 message not put into the bucket");
                cluster.metrics.dropped[0].increment(1);
            }
        }
    }
}

fn count_out(cluster: &Cluster, bytes: u64) {
    cluster.metrics.messages[0].increment(1);
    cluster.metrics.bytes[0].increment(bytes);
}

/// A message NATS did not take: its publisher is told (no acknowledgement), and the floor
/// it pushed (`streamed`: for a stream, whether or not a publisher waits: a given-back
/// message has none) is taken off again; its frame leaves the budget.
fn fail(
    cluster: &Arc<Cluster>,
    broker: &Weak<crate::broker::Broker>,
    streamed: bool,
    done: Option<oneshot::Sender<Result<(), StorageError>>>,
    in_transit: InTransit,
    error: &PublishError,
) {
    tracing::debug!(%error, "cluster: message not taken by NATS");
    cluster.note_refusal(error);
    if let Some(done) = done {
        let _ = done.send(Err(StorageError::Cluster(error.to_string())));
    }
    if streamed {
        cluster.pop_floor();
    }
    cluster.settled();
    drop(in_transit);
    drained(broker);
}

/// Awaits acknowledgements in publish order; each message's wait resolves when all of its
/// acknowledgements are in (and its stored sequence is durable, through `settling`), or
/// fails at the first error or after `timeout`.
async fn acknowledge(
    cluster: Arc<Cluster>,
    broker: Weak<crate::broker::Broker>,
    timeout: Duration,
    mut acks: mpsc::UnboundedReceiver<Awaiting>,
    settling: mpsc::UnboundedSender<Settling>,
) {
    while let Some(awaiting) = acks.recv().await {
        if let Some(barrier) = awaiting.barrier {
            let _ = barrier.send(());
            continue;
        }
        let mut result = Ok(());
        for (i, ack) in awaiting.acks.into_iter().enumerate() {
            let Some(ack) = ack else {
                continue;
            };
            match tokio::time::timeout(timeout, ack).await {
                Ok(Ok(ack)) => {
                    if i == 0 && awaiting.sequenced {
                        cluster.saw(ack.sequence);
                        if let Some(message) = &awaiting.message {
                            message.set_cluster_seq(ack.sequence);
                        }
                    }
                }
                Ok(Err(error)) => {
                    cluster.note_refusal(&error);
                    result = Err(StorageError::Cluster(error.to_string()));
                    break;
                }
                Err(_) => {
                    result = Err(StorageError::Cluster(format!(
                        "no acknowledgement from JetStream within {timeout:?}"
                    )));
                    break;
                }
            }
        }
        if let Err(error) = &result {
            tracing::warn!(%error, "cluster: a message was not acknowledged by JetStream; its publisher is not acknowledged either");
            if let Some(message) = awaiting.message.as_ref().filter(|m| m.awaits_cluster_seq()) {
                // Its sequence will not come: nothing waits for it any more.
                message.set_cluster_seq(0);
            }
        }
        // Stored here (queued for a persistent session): its sequence is stored with it.
        let stored = match (&result, &awaiting.message) {
            (Ok(()), Some(message)) if awaiting.sequenced => broker
                .upgrade()
                .and_then(|broker| broker.store_cluster_seq(message)),
            _ => None,
        };
        match (awaiting.done, stored) {
            (Some(done), Some(stored)) => {
                if let Err(mpsc::error::SendError((_, done, result))) =
                    settling.send((stored, done, result))
                {
                    let _ = done.send(result);
                }
            }
            (Some(done), None) => {
                let _ = done.send(result);
            }
            (None, _) => {}
        }
        cluster.pop_floor();
        cluster.settled();
        if awaiting.in_transit.is_some() {
            drop(awaiting.in_transit);
            drained(&broker);
        }
    }
}

/// Resolves publishers' waits in acknowledgement order, each once the commit storing its
/// message's sequence is durable (one group commit: the store batches them). A failed
/// commit does not fail the wait: the message itself was stored by its own commit, which
/// the publisher awaits as well; without its sequence it is only replayed from an older
/// cursor after a move (at least once), as before sequences were stored.
async fn settle(mut settling: mpsc::UnboundedReceiver<Settling>) {
    while let Some((stored, done, result)) = settling.recv().await {
        if let Err(error) = stored.await {
            tracing::debug!(%error, "cluster: a stored message's stream sequence was not stored");
        }
        let _ = done.send(result);
    }
}
