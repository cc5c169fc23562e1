//! What this node sends to the others: messages in the order their publishers' PUBLISHes
//! were routed, acknowledgements awaited in that order.
//!
//! One task publishes (QoS 1/2 into `PB_MSGS`, retained ones into the retained bucket too,
//! QoS 0 on core subjects); a second awaits the JetStream acknowledgements and resolves each
//! publisher's wait. A message not acknowledged within `publish_timeout` fails its wait: the
//! publisher's connection closes unacknowledged and its client re-sends.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;
use bytestring::ByteString;
use tokio::sync::{mpsc, oneshot};

use super::{subject, Cluster, QOS0_SUBJECTS, RETAINED_BUCKET, STREAM_SUBJECTS};
use crate::codec::QoS;
use crate::storage::StorageError;

/// What the outbound queue carries.
#[derive(Debug)]
pub enum Queued {
    /// A message to send.
    Message(Outgoing),
    /// Answered once every message queued before it is acknowledged or failed: a restore's
    /// replay waits for it, so this node's own messages routed before the session
    /// subscribed here are in the stream when the replay reads it.
    Barrier(oneshot::Sender<()>),
}

/// One message for the other nodes.
#[derive(Debug)]
pub struct Outgoing {
    /// The message itself (QoS 1/2), to record its stream sequence when acknowledged.
    pub message: Option<Arc<crate::broker::Message>>,
    /// Its topic (for the subject and the retained key).
    pub topic: ByteString,
    /// Its QoS: 0 goes on a core subject, 1/2 into the stream.
    pub qos: QoS,
    /// Retained: also the topic's entry in the retained bucket.
    pub retain: bool,
    /// The frame ([`super::wire`]).
    pub frame: Bytes,
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
}

/// Starts the publishing and acknowledging tasks.
pub(super) fn spawn(
    client: async_nats::Client,
    js: jetstream::Context,
    cluster: Arc<Cluster>,
    timeout: Duration,
    mut outgoing: mpsc::UnboundedReceiver<Queued>,
) {
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    tokio::spawn(acknowledge(Arc::clone(&cluster), timeout, acks_rx));
    tokio::spawn(async move {
        while let Some(queued) = outgoing.recv().await {
            let out = match queued {
                Queued::Message(out) => out,
                Queued::Barrier(barrier) => {
                    let _ = acks_tx.send(Awaiting {
                        message: None,
                        acks: [None, None],
                        done: None,
                        barrier: Some(barrier),
                        sequenced: false,
                    });
                    continue;
                }
            };
            let bytes = out.frame.len() as u64;
            if out.qos != QoS::AtMostOnce {
                // Its sequence will be above everything seen so far: a floor for the
                // cursors until its acknowledgement says exactly.
                cluster.push_floor();
            }
            let tail = subject::escape(&out.topic);
            if out.retain {
                // Retained: the bucket holds it for nodes and subscribers to come.
                let retained = js
                    .publish(
                        format!("$KV.{RETAINED_BUCKET}.{}", subject::key(&out.topic)),
                        out.frame.clone(),
                    )
                    .await;
                match (retained, out.qos) {
                    (Ok(ack), QoS::AtMostOnce) => {
                        drop(ack); // a QoS 0 publisher waits for nothing
                    }
                    (Ok(ack), _) => {
                        let stream = js
                            .publish(format!("{STREAM_SUBJECTS}.{tail}"), out.frame)
                            .await;
                        let awaiting = match stream {
                            Ok(stream) => Awaiting {
                                message: out.message,
                                acks: [Some(stream), Some(ack)],
                                done: out.done,
                                barrier: None,
                                sequenced: true,
                            },
                            Err(error) => {
                                fail(&cluster, out.qos, out.done, &error);
                                continue;
                            }
                        };
                        let _ = acks_tx.send(awaiting);
                        count_out(&cluster, bytes);
                        continue;
                    }
                    (Err(error), _) => {
                        fail(&cluster, out.qos, out.done, &error);
                        continue;
                    }
                }
            }
            if out.qos == QoS::AtMostOnce {
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
                continue;
            }
            let sequenced = out.subject.is_none();
            let subject = out
                .subject
                .unwrap_or_else(|| format!("{STREAM_SUBJECTS}.{tail}"));
            match js.publish(subject, out.frame).await {
                Ok(ack) => {
                    let _ = acks_tx.send(Awaiting {
                        message: out.message,
                        acks: [Some(ack), None],
                        done: out.done,
                        barrier: None,
                        sequenced,
                    });
                    count_out(&cluster, bytes);
                }
                Err(error) => fail(&cluster, out.qos, out.done, &error),
            }
        }
    });
}

fn count_out(cluster: &Cluster, bytes: u64) {
    cluster.metrics.messages[0].increment(1);
    cluster.metrics.bytes[0].increment(bytes);
}

/// A message NATS did not take: its publisher is told (no acknowledgement), and the floor
/// it pushed (QoS 1/2, whether or not a publisher waits: a given-back message has none) is
/// taken off again.
fn fail(
    cluster: &Cluster,
    qos: QoS,
    done: Option<oneshot::Sender<Result<(), StorageError>>>,
    error: &dyn std::fmt::Display,
) {
    tracing::debug!(%error, "cluster: message not taken by NATS");
    if let Some(done) = done {
        let _ = done.send(Err(StorageError::Cluster(error.to_string())));
    }
    if qos != QoS::AtMostOnce {
        cluster.pop_floor();
    }
    cluster.settled();
}

/// Awaits acknowledgements in publish order; each message's wait resolves when all of its
/// acknowledgements are in, or fails at the first error or after `timeout`.
async fn acknowledge(
    cluster: Arc<Cluster>,
    timeout: Duration,
    mut acks: mpsc::UnboundedReceiver<Awaiting>,
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
        if let Some(done) = awaiting.done {
            let _ = done.send(result);
        }
        cluster.pop_floor();
        cluster.settled();
    }
}
