//! Shared subscriptions across nodes: each message of a group goes to one member
//! cluster-wide.
//!
//! Clustered, no node routes shared groups itself (`Broker::publish` leaves them out).
//! Instead, for each group with a member here, this node pulls from the group's durable
//! consumer of `PB_MSGS` (`share-<hash of the group's key>[-parent]`, the group's filter
//! mapped onto subjects), which every node with a member pulls from too: JetStream hands each
//! message to one puller, which queues it for one of its connected local members (the
//! group's strategy) with a ticket ([`super::unsettled`]): it is acknowledged to JetStream
//! only when that member is done with it, so a node that dies with it has it delivered
//! elsewhere. A node pulls only while a member there is connected; a puller whose members
//! left meanwhile gives it back (nak) for another node. QoS 0 messages of a group come
//! through a NATS queue group on the core subjects, which likewise gives each to one
//! subscriber.
//!
//! A node whose members here may not read a message (an ACL that grants a member only part
//! of the group's filter, issue 37, seventh pass N1) does not take it away from the group: a
//! pulled one goes back (nak), and that puller then steps aside ([`STEP_ASIDE`]) so that
//! JetStream's re-offer finds another node's pull, not this one's again (JetStream hands a
//! message to whichever pull waits, and would otherwise hand it to this node time after
//! time while another node's member waits for it); a QoS 0 one from the queue group is
//! offered to the group's other nodes through `PB_REGROUP`. Only a QoS 0 message nobody took
//! after [`QOS0_OFFERS`] offers is dropped, and counted (`reason="denied"`); a QoS 1/2 one
//! waits in JetStream for a member that may read it, as it does while no member is
//! connected.
//!
//! A member's session that ends (or disconnects) on a node with no other connected member
//! of its group gives what it still held back to the group: a nak, or, for a message with no
//! ticket, a copy to `pb.g.<group hash>` in `PB_REGROUP` (one more consumer per group), so a
//! member on another node gets it.
//!
//! Must not: route a group's message from the node fan-in.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use bytestring::ByteString;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::unsettled::Unsettled;
use super::{
    subject, wire, Cluster, QOS0_SUBJECTS, REGROUP_STREAM, REGROUP_SUBJECTS, STREAM,
    STREAM_SUBJECTS,
};
use crate::broker::flow::MemoryLevel;
use crate::broker::{Broker, Message};
use crate::codec::QoS;

/// How often the set of local groups is compared with the running pullers.
const SCAN: Duration = Duration::from_millis(200);
/// Pause before a puller tries again after a failure.
const RETRY: Duration = Duration::from_secs(1);
/// Messages asked for in one pull.
const BATCH: usize = 200;
/// How long one pull waits for messages (then the puller checks its members again); below
/// [`super::unsettled::REOFFER`].
pub(super) const PULL_WAIT: Duration = Duration::from_secs(1);
/// How often a puller with no connected member here still pulls (one message, given back):
/// a consumer nobody pulls is deleted after `inactive_threshold` (`retention`, at least 60 s).
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// A group consumer's `max_ack_pending`: its messages held unacknowledged cluster-wide.
const MAX_UNSETTLED: i64 = 1000;
/// How long a puller that gave a message back because no member here may read it (or
/// take it) pulls nothing: past the message's re-offer ([`super::unsettled::REOFFER`])
/// plus one pull that was waiting already ([`PULL_WAIT`]), so the re-offer goes to a pull
/// of another node.
const STEP_ASIDE: Duration = Duration::from_millis(
    super::unsettled::REOFFER.as_millis() as u64 + PULL_WAIT.as_millis() as u64 + 500,
);
/// How many times a QoS 0 message offered to the group's other nodes (no member of the
/// node it reached first may read it) is offered before it is dropped and counted: at most
/// once, but not dropped while another node's member may read it.
const QOS0_OFFERS: i64 = 6;

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
    let unsettled = Unsettled::start(client.clone(), Arc::clone(&cluster), broker.clone());
    let mut scan = tokio::time::interval(SCAN);
    loop {
        scan.tick().await;
        let Some(strong) = broker.upgrade() else {
            break;
        };
        let groups = strong.shared_group_keys();
        drop(strong);
        // Starts of groups that went before their pullers started (one joined since the
        // snapshot above is younger than a few scans).
        cluster.group_starts.lock().retain(|key, (_, joined)| {
            joined.elapsed() < SCAN * 10 || groups.iter().any(|(k, _)| **k == **key)
        });
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
            // From when the group was joined here (a message published after its SUBACK
            // is the group's), else from now.
            let joined = cluster.group_starts.lock().remove(&*key).map(|(s, _)| s);
            let start = joined
                .unwrap_or_else(|| cluster.seen_seq.load(std::sync::atomic::Ordering::Acquire) + 1);
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
                    Arc::clone(&unsettled),
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
fn matching(cluster: &Cluster, frame: &[u8], inner: &str) -> Option<Message> {
    match wire::decode(frame) {
        Ok((_, _, publish, stranger)) => {
            if !crate::codec::topic::matching::matches(inner, &publish.topic) {
                return None;
            }
            Some(wire::message_of(publish, stranger))
        }
        Err(_) => {
            cluster.metrics.bad_frames.increment(1);
            None
        }
    }
}

/// Makes sure of a group's durable consumer (the first member anywhere makes it).
async fn group_consumer(
    js: &jetstream::Context,
    stream: &'static str,
    name: &str,
    filter: &str,
    deliver_policy: consumer::DeliverPolicy,
    retention: Duration,
) -> Result<consumer::PullConsumer, async_nats::Error> {
    let stream = js.get_stream(stream).await?;
    Ok(stream
        .get_or_create_consumer(
            name,
            consumer::pull::Config {
                durable_name: Some(name.to_owned()),
                deliver_policy,
                ack_policy: consumer::AckPolicy::Explicit,
                // A message waits this long for its member's acknowledgement (extended
                // while a member holds it): then another node gets it.
                ack_wait: super::unsettled::ACK_WAIT,
                filter_subject: filter.to_owned(),
                // The group's messages held by members and not acknowledged, cluster-wide:
                // beyond it JetStream hands out no more (back-pressure on slow members).
                max_ack_pending: MAX_UNSETTLED,
                inactive_threshold: retention,
                ..Default::default()
            },
        )
        .await?)
}

/// Pulls one of a group's consumers for as long as the group has members here, and only
/// while one of them is connected: a group's messages wait in JetStream, not in an offline
/// member's queue, while no member here can take them (a member on another node may).
#[allow(clippy::too_many_arguments)]
async fn pull(
    js: jetstream::Context,
    stream: &'static str,
    cluster: Arc<Cluster>,
    unsettled: Arc<Unsettled>,
    broker: Weak<Broker>,
    key: Arc<str>,
    inner: ByteString,
    name: String,
    filter: String,
    deliver_policy: consumer::DeliverPolicy,
    retention: Duration,
) {
    loop {
        let consumer = match group_consumer(&js, stream, &name, &filter, deliver_policy, retention)
            .await
        {
            Ok(consumer) => consumer,
            Err(error) => {
                tracing::warn!(%error, group = %key, "cluster: cannot pull a shared group's consumer; trying again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let mut last_pull = tokio::time::Instant::now();
        // Until when this puller leaves the group's messages to other nodes' pulls.
        let mut aside_until: Option<tokio::time::Instant> = None;
        'pulling: loop {
            if let Some(until) = aside_until.take() {
                tokio::time::sleep_until(until).await;
            }
            let connected = match broker.upgrade() {
                None => return,
                Some(broker) => broker.shared_group_has_connected(&key),
            };
            // With no member here connected, one small pull now and then keeps the
            // consumer from being deleted as inactive (what it gets goes back at once).
            if !connected && last_pull.elapsed() < KEEP_ALIVE {
                tokio::time::sleep(SCAN).await;
                continue;
            }
            last_pull = tokio::time::Instant::now();
            let batch = consumer
                .batch()
                .max_messages(if connected { BATCH } else { 1 })
                .expires(PULL_WAIT)
                .messages()
                .await;
            let mut batch = match batch {
                Ok(batch) => batch,
                Err(error) => {
                    tracing::debug!(%error, group = %key, "cluster: a shared group's pull failed; trying again");
                    break 'pulling;
                }
            };
            while let Some(message) = batch.next().await {
                let message = match message {
                    Ok(message) => message,
                    // A status that ends the pull (the consumer deleted, a leader change, no
                    // responders): the consumer is made sure of again.
                    Err(error) => {
                        tracing::debug!(%error, group = %key, "cluster: a shared group's pull ended");
                        break 'pulling;
                    }
                };
                // Each one no member here can take goes back at once: the rest of this
                // pull too, then pulls wait for a connected member, and for its re-offer
                // to have gone elsewhere.
                match take(
                    &cluster, &unsettled, &broker, stream, &key, &inner, &message,
                ) {
                    Took::Taken => {}
                    Took::GivenBack => {
                        aside_until = Some(tokio::time::Instant::now() + STEP_ASIDE);
                    }
                    Took::BrokerGone => return,
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// What became of one pulled message.
enum Took {
    /// Queued for a member here (or not the group's, or dropped and counted): settled.
    Taken,
    /// No member here may read it or can take it: given back for another node.
    GivenBack,
    /// The broker is gone: the puller ends.
    BrokerGone,
}

/// Hands one pulled message to a connected member here that may read it, holding its
/// [`super::unsettled::Ticket`] (acknowledged once the member is done with it), or gives it
/// back for another node if no member here can take it (a QoS 0 one offered
/// [`QOS0_OFFERS`] times already is dropped and counted instead).
fn take(
    cluster: &Cluster,
    unsettled: &Arc<Unsettled>,
    broker: &Weak<Broker>,
    stream: &'static str,
    key: &str,
    inner: &str,
    message: &jetstream::Message,
) -> Took {
    let Some(broker) = broker.upgrade() else {
        return Took::BrokerGone;
    };
    let Some(reply) = message.reply.clone() else {
        return Took::Taken; // not a JetStream delivery
    };
    let info = message.info().ok();
    let seq = info.as_ref().map(|i| i.stream_sequence);
    let offers = info.as_ref().map_or(1, |i| i.delivered);
    let ticket = unsettled.ticket(reply);
    let Some(routed) = matching(cluster, &message.payload, inner) else {
        drop(ticket); // not the group's: acknowledged
        return Took::Taken;
    };
    let routed = Arc::new(routed.with_settlement(Box::new(ticket)));
    // A `PB_MSGS` sequence is where a replay finds it again (a session's cursor); a
    // given-back message has none there.
    if let (STREAM, Some(seq)) = (stream, seq) {
        routed.set_cluster_seq(seq);
    }
    // Held here only while there is room: otherwise it waits in JetStream, for this node's
    // members to catch up or another node's to take it (issue 35, sixteenth adversarial pass,
    // C1: one slow member took 900 messages, 537% of the budget, and others got 0x97).
    if !broker.has_room_for(&routed, MemoryLevel::Near) {
        routed.give_back();
        return Took::GivenBack;
    }
    match broker.deliver_shared(key, Arc::clone(&routed), true) {
        Ok(Some(_)) => Took::Taken,
        // A QoS 0 message no member took after its offers: dropped (its last handle
        // acknowledges it), and counted.
        Ok(None) if routed.qos == QoS::AtMostOnce && offers >= QOS0_OFFERS => {
            broker.metrics.messages_dropped_denied[0].increment(1);
            tracing::debug!(group = %key, topic = %routed.topic, "cluster: a shared group's QoS 0 message no member may read was dropped");
            Took::Taken
        }
        // No connected member here (any more) that may read it: given back before its
        // last handle goes, which would acknowledge it.
        Ok(None) | Err(_) => {
            routed.give_back();
            Took::GivenBack
        }
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
        let Some(routed) = matching(&cluster, &message.payload, &inner) else {
            continue;
        };
        let routed = Arc::new(routed);
        // No member here may read it (or the store refused it): one on another node may,
        // so it is offered to the group's nodes through `PB_REGROUP` rather than dropped
        // (at most once still: one member gets it, or nobody).
        if matches!(
            broker.deliver_shared(&key, Arc::clone(&routed), false),
            Ok(None) | Err(_)
        ) && !cluster.offer_to_group(&key, &routed)
        {
            broker.metrics.messages_dropped_denied[0].increment(1);
        }
    }
}
