//! Shared subscriptions across nodes: each message of a group goes to one member
//! cluster-wide.
//!
//! Clustered, no node routes shared groups itself (`Broker::publish` leaves them out).
//! Instead, for each group with a member here, this node pulls from the group's durable
//! consumer of `PB_MSGS` (`share-<hash of the group's key>[-parent]`, the group's filter
//! mapped onto subjects), which every node with a member pulls from too: JetStream hands each
//! message to one puller, which queues it for one of its local members (the group's
//! strategy) and acknowledges it once queued; a puller whose members left meanwhile gives it
//! back (nak) for another node. QoS 0 messages of a group come through a NATS queue group on
//! the core subjects, which likewise gives each to one subscriber.
//!
//! A member's session that ends on a node with no other member of its group gives what it
//! still held back to the group (`pb.g.<group hash>` in `PB_REGROUP`, one more consumer per
//! group), so a member on another node gets it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use bytestring::ByteString;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::{
    subject, wire, Cluster, QOS0_SUBJECTS, REGROUP_STREAM, REGROUP_SUBJECTS, STREAM,
    STREAM_SUBJECTS,
};
use crate::broker::{Broker, Message};

/// How often the set of local groups is compared with the running pullers.
const SCAN: Duration = Duration::from_millis(200);
/// Pause before a puller tries again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// A group's key as a subject token: the hex of its hash's first 10 bytes (a group's key
/// holds characters subjects and consumer names may not).
fn group_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut hash = String::with_capacity(20);
    for byte in &digest[..10] {
        hash.push_str(&format!("{byte:02x}"));
    }
    hash
}

/// The consumer name of group `key`'s `i`-th subject filter.
fn consumer_name(key: &str, i: usize) -> String {
    let mut name = format!("share-{}", group_hash(key));
    if i > 0 {
        name.push_str(&format!("-{i}"));
    }
    name
}

/// The stream subject of group `key`'s given-back messages: those a member's session still
/// held when it ended on a node with no other member ([`crate::broker::ClusterSeam::regroup`]).
/// Each node with a member pulls them through one more consumer of the group
/// (`share-<hash>-r`), so one member elsewhere gets each.
pub(super) fn regroup_subject(key: &str) -> String {
    format!("{REGROUP_SUBJECTS}.{}", group_hash(key))
}

/// Keeps one set of pullers per local group: started when a group gets its first member
/// here, stopped when its last one leaves.
pub(super) async fn run(
    js: jetstream::Context,
    client: async_nats::Client,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    retention: Duration,
) {
    let mut running: HashMap<Arc<str>, Vec<tokio::task::JoinHandle<()>>> = HashMap::new();
    let mut scan = tokio::time::interval(SCAN);
    loop {
        scan.tick().await;
        let Some(strong) = broker.upgrade() else {
            break;
        };
        let groups = strong.shared_group_keys();
        drop(strong);
        running.retain(|key, tasks| {
            let kept = groups.iter().any(|(k, _)| k == key);
            if !kept {
                tasks.iter().for_each(tokio::task::JoinHandle::abort);
            }
            kept
        });
        for (key, inner) in groups {
            if running.contains_key(&key) {
                continue;
            }
            let start = cluster.seen_seq.load(std::sync::atomic::Ordering::Acquire) + 1;
            let from_now = consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            };
            let mut consumers: Vec<(&'static str, String, String, consumer::DeliverPolicy)> =
                subject::filter_subjects(&inner)
                    .into_iter()
                    .enumerate()
                    .map(|(i, filter)| {
                        let subject = format!("{STREAM_SUBJECTS}.{filter}");
                        (STREAM, consumer_name(&key, i), subject, from_now)
                    })
                    .collect();
            // Given-back messages: all still in the stream. One that was taken is older than
            // the consumer that took it, which outlives it (`inactive_threshold` = the
            // stream's `max_age`); one that was not went to no member yet.
            consumers.push((
                REGROUP_STREAM,
                format!("share-{}-r", group_hash(&key)),
                regroup_subject(&key),
                consumer::DeliverPolicy::All,
            ));
            let mut tasks = Vec::new();
            for (stream, name, filter, deliver_policy) in consumers {
                tasks.push(tokio::spawn(pull(
                    js.clone(),
                    stream,
                    Arc::clone(&cluster),
                    broker.clone(),
                    Arc::clone(&key),
                    inner.clone(),
                    name,
                    filter,
                    deliver_policy,
                    retention,
                )));
            }
            tasks.push(tokio::spawn(pull_qos0(
                client.clone(),
                Arc::clone(&cluster),
                broker.clone(),
                Arc::clone(&key),
                inner.clone(),
                subject::filter_subjects(&inner)
                    .into_iter()
                    .map(|f| format!("{QOS0_SUBJECTS}.{f}"))
                    .collect(),
            )));
            running.insert(key, tasks);
        }
    }
    for tasks in running.values() {
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// Decodes a frame of a group's subjects into a message, if it matches the group's filter
/// (the subject filter is coarser at the first level: `$` topics).
fn matching(cluster: &Cluster, frame: &[u8], inner: &str) -> Option<Arc<Message>> {
    match wire::decode(frame) {
        Ok((_, _, publish)) => {
            if !crate::broker::admin::filter_matches(inner, &publish.topic) {
                return None;
            }
            Some(Arc::new(Message::from_publish(publish, None)))
        }
        Err(_) => {
            cluster.metrics.bad_frames.increment(1);
            None
        }
    }
}

/// Pulls one of a group's consumers for as long as the group has members here.
#[allow(clippy::too_many_arguments)]
async fn pull(
    js: jetstream::Context,
    stream: &'static str,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    key: Arc<str>,
    inner: ByteString,
    name: String,
    filter: String,
    deliver_policy: consumer::DeliverPolicy,
    retention: Duration,
) {
    loop {
        let messages = async {
            let stream = js.get_stream(stream).await?;
            let consumer: consumer::PullConsumer = stream
                .get_or_create_consumer(
                    &name,
                    consumer::pull::Config {
                        durable_name: Some(name.clone()),
                        // The first member anywhere makes it: from what was published when
                        // it subscribed on.
                        deliver_policy,
                        ack_policy: consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(30),
                        filter_subject: filter.clone(),
                        max_ack_pending: 1000,
                        inactive_threshold: retention,
                        ..Default::default()
                    },
                )
                .await?;
            Ok::<_, async_nats::Error>(consumer.messages().await?)
        }
        .await;
        let mut messages = match messages {
            Ok(messages) => messages,
            Err(error) => {
                tracing::warn!(%error, group = %key, "cluster: cannot pull a shared group's consumer; trying again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        while let Some(message) = messages.next().await {
            let message = match message {
                Ok(message) => message,
                Err(error) if !super::inbound::is_terminal(&error) => continue,
                Err(_) => break,
            };
            let Some(broker) = broker.upgrade() else {
                return;
            };
            let Some(routed) = matching(&cluster, &message.payload, &inner) else {
                let _ = message.ack().await;
                continue;
            };
            // A `PB_MSGS` sequence is where a replay finds it again (a session's cursor);
            // a given-back message has none there.
            if stream == STREAM {
                if let Some(seq) = message.info().ok().map(|i| i.stream_sequence) {
                    routed.set_cluster_seq(seq);
                }
            }
            let delivered = broker.deliver_shared(&key, routed);
            drop(broker);
            match delivered {
                Ok(Some(routed)) => {
                    let stored = match routed.durable {
                        Some(durable) => durable.await.is_ok(),
                        None => true,
                    };
                    if stored {
                        let _ = message.ack().await;
                    } else {
                        let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
                    }
                }
                // No member here any more, or not stored now: another puller gets it.
                Ok(None) | Err(_) => {
                    let _ = message.ack_with(jetstream::AckKind::Nak(Some(RETRY))).await;
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// A group's QoS 0 messages: a NATS queue group, so one subscriber cluster-wide gets each.
async fn pull_qos0(
    client: async_nats::Client,
    cluster: Arc<Cluster>,
    broker: Weak<Broker>,
    key: Arc<str>,
    inner: ByteString,
    subjects: Vec<String>,
) {
    let queue = consumer_name(&key, 0);
    let mut subscriptions = Vec::new();
    for subject in subjects {
        match client.queue_subscribe(subject, queue.clone()).await {
            Ok(subscription) => subscriptions.push(subscription),
            Err(error) => {
                tracing::warn!(%error, group = %key, "cluster: cannot subscribe a shared group's QoS 0 messages");
                return;
            }
        }
    }
    let mut all = futures_util::stream::select_all(subscriptions);
    while let Some(message) = all.next().await {
        let Some(broker) = broker.upgrade() else {
            return;
        };
        if let Some(routed) = matching(&cluster, &message.payload, &inner) {
            let _ = broker.deliver_shared(&key, routed);
        }
    }
}
