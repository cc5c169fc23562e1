//! What other nodes sent, routed through this node's topic tree like a local PUBLISH (queues,
//! flow control and dead letters all apply):
//!
//! - QoS 1/2: the node's durable pull consumer of `PB_MSGS` (`node-<id>`, explicit ack). A
//!   message is acknowledged to JetStream only once it is queued, durably where its sessions
//!   are; until then JetStream keeps it and redelivers it after `ack_wait` (so a crash of
//!   this node loses none of it). The node's own messages are skipped (routed when
//!   published: loop-free).
//! - QoS 0: a core subscription on `pb.q0.>`, at most once.
//! - Retained: a watch of the retained bucket, with history, into the local retained index.
//!
//! Must not: acknowledge a message before its local commit.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{wire, Cluster, QOS0_SUBJECTS, RETAINED_BUCKET, STREAM, STREAM_SUBJECTS};
use crate::broker::{Broker, Message};
use crate::config::ClusterConfig;
use crate::storage::Durable;

/// Messages routed and waiting for their local commit before their JetStream ack.
const ACK_QUEUE: usize = 4096;
/// Pause before trying again after the consumer, subscription or watch failed.
const RETRY: Duration = Duration::from_secs(1);

/// Starts the three inbound tasks.
pub(super) fn spawn(
    client: async_nats::Client,
    js: jetstream::Context,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    config: ClusterConfig,
) {
    tokio::spawn(consume_stream(
        js.clone(),
        Arc::clone(&cluster),
        broker.clone(),
        config,
    ));
    tokio::spawn(consume_qos0(client, Arc::clone(&cluster), broker.clone()));
    tokio::spawn(watch_retained(js, cluster, broker));
}

/// Decodes a frame from another node into a message (origin `None`: no session of this node
/// published it, so No Local never applies). `None` for this node's own frames, for frames
/// that are not Postbox messages (counted), and for an anonymous client's message while the
/// anonymous share here has no room for it: it would be charged to the share for as long as
/// it is held here, and past it would fill the budget verified clients share, as a local
/// stranger's PUBLISH past the share would, which is refused (issue 35, fifteenth pass, B3;
/// fourteenth, A1). Dropped and counted as dropped for memory, as that PUBLISH is.
fn from_other_node(cluster: &Cluster, broker: &Broker, frame: &[u8]) -> Option<Arc<Message>> {
    if wire::origin(frame) == Some(cluster.node.as_bytes()) {
        return None;
    }
    match wire::decode(frame) {
        Ok((_, _, publish, stranger)) => {
            cluster.metrics.messages[1].increment(1);
            cluster.metrics.bytes[1].increment(frame.len() as u64);
            // Charged to the share as it is made: the check below counts it.
            let message = wire::message_of(publish, stranger);
            if stranger.is_some_and(|share| !share.has_room(0, &broker.flow().memory)) {
                // Counted only where a subscriber here would have got it: every node takes
                // every message, most of them for nobody here.
                if broker.has_subscribers(&message.topic) {
                    broker.metrics.messages_dropped_memory[message.qos as usize].increment(1);
                    tracing::debug!(topic = %message.topic, "cluster: an anonymous client's message from another node dropped: anonymous clients are at their share of the memory budget here");
                }
                return None;
            }
            Some(Arc::new(message))
        }
        Err(error) => {
            cluster.metrics.bad_frames.increment(1);
            tracing::debug!(%error, "cluster: skipped a frame that is not a Postbox message");
            None
        }
    }
}

/// `attempt` until it succeeds, [`RETRY`] after each failure (logged: the cluster cannot
/// `what`, NATS being away, say); `None` once the broker is gone.
async fn retrying<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    broker: &Weak<Broker>,
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    while broker.strong_count() > 0 {
        match attempt().await {
            Ok(value) => return Some(value),
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot {what}; trying again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    None
}

/// The node's consumer of `PB_MSGS`, made once and resumed where it stopped after every
/// failure or restart.
async fn consume_stream(
    js: jetstream::Context,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    config: ClusterConfig,
) {
    let name = format!("node-{}", config.node);
    let (acks_tx, acks_rx) = mpsc::channel(ACK_QUEUE);
    tokio::spawn(acknowledge(acks_rx, Arc::clone(&cluster)));
    let what = format!("consume the message stream as {name}");
    loop {
        let consumer = retrying(&broker, &what, || async {
            let consumer = node_consumer(&js, &config).await?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(1000)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await?;
            Ok::<_, async_nats::Error>((consumer, messages))
        })
        .await;
        let (mut consumer, mut messages) = match consumer {
            None => return,
            Some((mut consumer, messages)) => {
                let info = consumer.info().await.ok();
                if let Some(info) = &info {
                    // Where it resumes: what it had delivered (a new consumer: the stream's
                    // end when it was made).
                    cluster.consumer_floor.fetch_max(
                        info.delivered.stream_sequence + 1,
                        std::sync::atomic::Ordering::AcqRel,
                    );
                }
                // Before anything is routed: what the store brought back and JetStream may
                // offer again (above the floor, the acknowledgement may have been lost).
                let floor = info.map_or(0, |info| info.ack_floor.stream_sequence);
                for (seq, session) in std::mem::take(&mut *cluster.restored_ahead.lock()) {
                    if seq > floor {
                        cluster.resent_ahead.note(seq, session);
                    }
                }
                (consumer, messages)
            }
        };
        let mut lag_check = tokio::time::interval(Duration::from_secs(2));
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                _ = lag_check.tick() => {
                    if let Ok(info) = consumer.info().await {
                        cluster.metrics.lag.set(info.num_pending as f64);
                        cluster.resent_ahead.acknowledged_to(info.ack_floor.stream_sequence);
                    }
                    continue;
                }
            };
            let message = match next {
                Some(Ok(message)) => message,
                // A missed heartbeat or a failed pull request leaves the stream usable (it
                // pulls again); starting over would strand what the old pull was given until
                // `ack_wait` passes.
                Some(Err(error)) if !is_terminal(&error) => {
                    tracing::debug!(%error, "cluster: the message stream's pull had a hiccup");
                    continue;
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "cluster: the message stream's pull failed; resuming");
                    break;
                }
                None => break,
            };
            let Some(broker) = broker.upgrade() else {
                return;
            };
            let (seq, delivered) = message
                .info()
                .map_or((0, 1), |info| (info.stream_sequence, info.delivered));
            cluster.saw(seq);
            if delivered > 1 && cluster.resent_ahead.was_committed(seq) {
                // Routed and stored here before; its acknowledgement was lost.
                if acks_tx.send((None, message)).await.is_err() {
                    return;
                }
                continue;
            }
            let routed = {
                // Routed and the floor moved as one step for a restoring session.
                let _gate = cluster.gate.lock();
                let routed = match from_other_node(&cluster, &broker, &message.payload) {
                    None => Ok(None),
                    Some(routed) => {
                        routed.set_cluster_seq(seq);
                        route(&broker, routed, &cluster.resent_ahead.skipped_at(seq))
                    }
                };
                if routed.is_ok() {
                    cluster
                        .consumer_floor
                        .fetch_max(seq + 1, std::sync::atomic::Ordering::AcqRel);
                }
                routed
            };
            let Ok(durable) = routed else {
                // Not taken here now (the store refused it): JetStream delivers it again
                // after a pause; nothing is acknowledged.
                let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
                continue;
            };
            if acks_tx.send((durable, message)).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a pull consumer's stream ended with `error` (it must be made again).
pub(super) fn is_terminal(error: &consumer::pull::MessagesError) -> bool {
    use consumer::pull::MessagesErrorKind as Kind;
    matches!(
        error.kind(),
        Kind::ConsumerDeleted
            | Kind::NoResponders
            | Kind::PushBasedConsumer
            | Kind::RequestLimitExceeded
    )
}

/// The node's durable consumer of `PB_MSGS`, made if it does not exist. Made by the link
/// before the node counts as up, so nothing published once a client here could have
/// subscribed is missed by a new node.
///
/// # Errors
///
/// JetStream did not answer or refused.
pub(super) async fn node_consumer(
    js: &jetstream::Context,
    config: &ClusterConfig,
) -> Result<consumer::PullConsumer, async_nats::Error> {
    let name = format!("node-{}", config.node);
    let stream = js.get_stream(STREAM).await?;
    Ok(stream
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                // A new node starts with what is published from now on; a known one resumes
                // where it stopped.
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                // A message pulled by a node that then crashed comes again after this.
                ack_wait: Duration::from_secs(30),
                filter_subject: format!("{STREAM_SUBJECTS}.>"),
                max_ack_pending: 20_000,
                // A node gone for longer than messages are kept has nothing left to resume:
                // its consumer goes too.
                inactive_threshold: Duration::from_secs(config.retention),
                num_replicas: config.replicas,
                ..Default::default()
            },
        )
        .await?)
}

/// Routes a message from another node (the sessions in `skip` have it in flight already:
/// [`super::ahead`]); the commit its JetStream ack must wait for.
fn route(
    broker: &Broker,
    message: Arc<Message>,
    skip: &[crate::broker::SessionId],
) -> Result<Option<Durable>, ()> {
    match broker.publish_skipping(message, skip) {
        Ok(routed) => Ok(routed.durable),
        Err(error) => {
            tracing::warn!(%error, "cluster: a message from another node was refused here; it will be delivered again");
            Err(())
        }
    }
}

/// Acknowledges stream messages in order, each once its local commit is durable (a failed
/// commit: not acknowledged, JetStream redelivers), noting it committed first ([`super::ahead`]).
async fn acknowledge(
    mut acks: mpsc::Receiver<(Option<Durable>, jetstream::Message)>,
    cluster: Arc<Cluster>,
) {
    while let Some((durable, message)) = acks.recv().await {
        if let Some(durable) = durable {
            if let Err(error) = durable.await {
                tracing::warn!(%error, "cluster: a message from another node was not stored here; it will be delivered again");
                let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
                continue;
            }
        }
        if let Ok(info) = message.info() {
            cluster.resent_ahead.committed(info.stream_sequence);
        }
        if let Err(error) = message.ack().await {
            tracing::debug!(%error, "cluster: acknowledgement to JetStream failed; the message may come again");
        }
    }
}

/// QoS 0 messages of other nodes.
async fn consume_qos0(client: async_nats::Client, cluster: Arc<Cluster>, broker: Weak<Broker>) {
    loop {
        let subscribe = || client.subscribe(format!("{QOS0_SUBJECTS}.>"));
        let Some(mut subscription) =
            retrying(&broker, "subscribe to QoS 0 messages", subscribe).await
        else {
            return;
        };
        while let Some(message) = subscription.next().await {
            let Some(broker) = broker.upgrade() else {
                return;
            };
            if let Some(routed) = from_other_node(&cluster, &broker, &message.payload) {
                let _ = broker.publish(routed, None);
            }
        }
        if broker.strong_count() == 0 {
            return;
        }
    }
}

/// The retained bucket into the local retained index: its current content first, then each
/// change. Entries this node wrote are applied too (a restarted node without persistence
/// gets its own back); the bucket's order per key is the publish order.
async fn watch_retained(js: jetstream::Context, cluster: Arc<Cluster>, broker: Weak<Broker>) {
    loop {
        let watch = retrying(&broker, "watch the retained bucket", || async {
            let store = js.get_key_value(RETAINED_BUCKET).await?;
            Ok::<_, async_nats::Error>(store.watch_with_history(">").await?)
        })
        .await;
        let Some(mut watch) = watch else {
            return;
        };
        while let Some(entry) = watch.next().await {
            let Ok(entry) = entry else {
                break;
            };
            if entry.operation != kv::Operation::Put {
                continue; // deletions are written as empty retained messages
            }
            let Some(broker) = broker.upgrade() else {
                return;
            };
            match wire::decode(&entry.value) {
                Ok((_, _, publish, stranger)) => {
                    let own = wire::origin(&entry.value) == Some(cluster.node.as_bytes());
                    let behind = broker.apply_cluster_retained(
                        &Arc::new(wire::message_of(publish, stranger)),
                        own,
                    );
                    drop(broker);
                    if let Some(commit) = behind {
                        // The store's queue is long: the next update waits for this one's
                        // commit (NATS holds the rest meanwhile).
                        let _ = commit.await;
                    }
                }
                Err(error) => {
                    cluster.metrics.bad_frames.increment(1);
                    tracing::debug!(%error, key = %entry.key, "cluster: skipped a retained entry that is not a Postbox message");
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}
