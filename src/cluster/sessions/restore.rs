//! Restores: a session that lived on another node is rebuilt here from its record: its
//! subscriptions, the replay of the stream from its cursor (less what its client took), and
//! its QoS 2 deliveries in flight sent again under their packet ids.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_nats::jetstream::{self, consumer};
use futures_util::StreamExt;
use smallvec::SmallVec;

use super::*;
use crate::broker::flow::MemoryLevel;
use crate::broker::{Broker, Message, Restore, Session};
use crate::cluster::{subject, wire, Cluster, STREAM, STREAM_SUBJECTS};
use crate::codec::QoS;

/// Rebuilds a session that lived elsewhere: subscriptions, then the replay. All or nothing:
/// false when the replay failed or took longer than [`REPLAY_LIMIT`] (or this future was
/// dropped, its CONNECT gone): the half-restored session is discarded here and its record
/// keeps the cursor it had, so the next claim, here or on another node, replays it whole.
pub(in crate::cluster) async fn restore(
    cluster: &Cluster,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    generation: u64,
    restore: Restore,
) -> bool {
    let mut unrestored = Unrestored {
        cluster,
        broker,
        session,
        generation,
        ahead: Vec::new(),
        taken_ahead: Vec::new(),
        done: false,
    };
    let replays = !restore.subscriptions.is_empty() && restore.cursor > 0;
    let (floor, local_floor, sent) = {
        // Subscribed and the floors read as one step against the consumer's routing (the
        // gate) and this node's own publishers (the fence: each of their messages was
        // routed before, below `local_floor`, or will be after).
        let _gate = cluster.gate.lock();
        let _fence = cluster.fence.write();
        for (filter, options, id) in &restore.subscriptions {
            broker.subscribe(session, filter, *options, *id);
        }
        // PUBRELs to send again (MQTT-4.4.0-1): the client has those messages.
        for &(packet_id, _) in restore.qos2.iter().filter(|(_, seq)| *seq == 0) {
            drop(broker.restore_cluster_inflight(session, packet_id, None));
        }
        // Answered when this node's messages routed before are all in the stream.
        let sent = replays.then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = cluster
                .outbound
                .send(crate::cluster::outbound::Queued::Barrier(tx));
            rx
        });
        // Other nodes' messages below it were routed here before the subscriptions (this
        // node's own are told apart by their local id: the consumer skips them).
        let floor = cluster.consumer_floor.load(Ordering::Acquire);
        // Plain QoS 2 deliveries in flight: sent again below under their packet ids (by
        // the replay, or fetched), so the consumer's routing must leave this session out of
        // them: when it has not reached one yet, and when it brings one again (a redelivery
        // after a refusal here, a lost acknowledgement, a restart).
        if !restore.subscriptions.is_empty() {
            for &(packet_id, seq) in &restore.qos2 {
                if seq != 0 && !restore.qos2_shared.contains(&packet_id) {
                    cluster.resent_ahead.note(seq, session.id);
                    unrestored.ahead.push((packet_id, seq));
                }
            }
            // Messages the client took already: the replay skips those below the floor,
            // and the consumer must leave the session out of those it has not routed yet.
            for &seq in restore.taken.iter().filter(|&&seq| seq >= floor) {
                cluster.resent_ahead.note(seq, session.id);
                unrestored.taken_ahead.push(seq);
            }
        }
        (floor, cluster.next_local_id.load(Ordering::Acquire), sent)
    };
    if !replays {
        // Nothing to replay (no subscription left, or no cursor), but a QoS 2 delivery in
        // flight is sent again all the same (MQTT-4.4.0-1).
        if restore.qos2.iter().any(|q| q.1 != 0) {
            let Some(js) = cluster.js.get() else {
                tracing::warn!(client = %session.client_id, "cluster: a resumed session's QoS 2 messages in flight cannot be fetched before NATS is reached; refusing its CONNECT");
                return false;
            };
            let resent = tokio::time::timeout(
                REPLAY_LIMIT,
                resend_unmet(cluster, js, broker, session, &restore),
            )
            .await;
            if !matches!(resent, Ok(Ok(()))) {
                tracing::warn!(client = %session.client_id, "cluster: a resumed session's QoS 2 messages in flight could not be fetched; refusing its CONNECT (the session's record is kept for the next attempt)");
                return false;
            }
        }
        unrestored.restored(&restore);
        return true;
    }
    let Some(js) = cluster.js.get() else {
        tracing::warn!(client = %session.client_id, "cluster: a resumed session cannot be replayed before NATS is reached; refusing its CONNECT");
        return false;
    };
    match tokio::time::timeout(REPLAY_LIMIT, async {
        if let Some(sent) = sent {
            sent.await
                .map_err(|_| "the queue to NATS is gone (shutting down)")?;
        }
        let replayed = replay(cluster, js, broker, session, &restore, floor, local_floor).await?;
        resend_unmet(cluster, js, broker, session, &restore).await?;
        Ok::<_, async_nats::Error>(replayed)
    })
    .await
    {
        Ok(Ok(n)) => {
            tracing::info!(client = %session.client_id, from = restore.cursor, messages = n, "cluster: session resumed from another node");
            unrestored.restored(&restore);
            true
        }
        Ok(Err(error)) => {
            tracing::warn!(client = %session.client_id, %error, "cluster: the replay of a resumed session failed; refusing its CONNECT (the session's record is kept for the next attempt)");
            false
        }
        Err(_) => {
            tracing::warn!(client = %session.client_id, limit_secs = REPLAY_LIMIT.as_secs(), "cluster: the replay of a resumed session took too long; refusing its CONNECT (the session's record is kept for the next attempt)");
            false
        }
    }
}

/// QoS 2 deliveries awaiting PUBREC that the replay did not meet, sent again with their
/// packet ids (MQTT-4.4.0-1), fetched from the stream by their sequence:
///
/// - a shared group's (the replay skips them: they reach the group through its consumer):
///   so a shared group's QoS 2 job in flight to a member that moved reaches it again, on its
///   new node, and no other member (MQTT-4.8.2-4/5): the old node settled it with the group
///   when it handed the session over;
/// - another node's that this node's consumer had not routed when the session subscribed
///   (beyond the replay): the consumer leaves the session out when it gets there
///   ([`crate::cluster::ahead`]), so it is not taken a second time under a new packet id.
///
/// One no longer in the stream (older than `retention`) is released below
/// ([`release_unmatched`]).
async fn resend_unmet(
    cluster: &Cluster,
    js: &jetstream::Context,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
) -> Result<(), async_nats::Error> {
    let unmet: Vec<(u16, u64)> = restore
        .qos2
        .iter()
        .copied()
        .filter(|&(packet_id, seq)| seq != 0 && !broker.has_inflight(session, packet_id, seq))
        .collect();
    if unmet.is_empty() {
        return Ok(());
    }
    let stream = js.get_stream(STREAM).await?;
    for (packet_id, seq) in unmet {
        let raw = match stream.get_raw_message(seq).await {
            Ok(raw) => raw,
            Err(error)
                if error.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound =>
            {
                tracing::warn!(client = %session.client_id, packet_id, seq, "cluster: a QoS 2 message in flight to a resumed session is no longer in the stream; its packet id is released");
                cluster.resent_ahead.forget(seq, session.id);
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let Ok((_, _, mut publish, stranger)) = wire::decode(&raw.payload) else {
            continue;
        };
        let retained = publish.retain;
        publish.retain = false;
        let message = Arc::new(wire::message_of(publish, stranger));
        message.set_cluster_seq(seq);
        let delivery = resent_delivery(
            restore,
            message,
            retained,
            restore.qos2_shared.contains(&packet_id),
        );
        if let Some(delivery) = broker.restore_cluster_inflight(session, packet_id, Some(delivery))
        {
            // Its packet id taken here meanwhile (a newer connection of the client took the
            // session during the fetch and sent something under it; a delivery the replay
            // queued cannot hold it: those get ids only when sent): queued as a new delivery
            // rather than lost (the client may take it twice).
            tracing::debug!(client = %session.client_id, packet_id, seq, "cluster: a QoS 2 message in flight to a resumed session found its packet id taken; queued again");
            if let Err(error) = broker.enqueue_for(
                session,
                delivery.message,
                QoS::ExactlyOnce,
                delivery.retain,
                delivery.subscription_ids,
            ) {
                tracing::warn!(client = %session.client_id, %error, "cluster: a QoS 2 message in flight to a resumed session was refused here");
            }
        }
    }
    Ok(())
}

/// A QoS 2 delivery in flight sent again as the subscription that sent it: a shared
/// group's (`shared`) under the session's first shared filter matching it (a session in two
/// groups matching one topic cannot tell which one sent it; either is right for the
/// client), a plain one with the session's plain filters matching it (their identifiers,
/// MQTT-3.3.4-3). No such filter (the subscription went since): sent again all the same.
fn resent_delivery(
    restore: &Restore,
    message: Arc<Message>,
    retained: bool,
    shared: bool,
) -> crate::broker::Delivery {
    let mut retain = false;
    let mut subscription_ids: SmallVec<[u32; 1]> = SmallVec::new();
    let mut group = None;
    for (filter, options, id) in &restore.subscriptions {
        let inner = match crate::codec::topic::split_shared(filter) {
            Some(Ok((_, inner))) if shared => inner,
            None if !shared => filter,
            _ => continue,
        };
        if crate::codec::topic::matching::matches(inner, &message.topic) {
            retain |= options.retain_as_published && retained;
            subscription_ids.extend(*id);
            if shared {
                group = Some(Arc::from(&**filter));
                break;
            }
        }
    }
    crate::broker::Delivery {
        qos: QoS::ExactlyOnce,
        retain,
        subscription_ids,
        seq: None,
        shared: group,
        message,
    }
}

/// QoS 2 deliveries the session had in flight that were not sent again (no longer in the
/// stream): their packet ids stay taken until a PUBREL sent again completes them, since the
/// client may hold them (MQTT-4.3.3-9).
fn release_unmatched(broker: &Broker, session: &Arc<Session>, restore: &Restore) {
    for &(packet_id, _) in &restore.qos2 {
        drop(broker.restore_cluster_inflight(session, packet_id, None));
    }
}

/// A restore in progress. Dropped before it is `done` (failed, or its future dropped), it
/// undoes it: the local session is discarded, and the record this node claimed is given
/// back as the claim wrote it (less the refused CONNECT's will, its connection gone now) and
/// no longer kept current from here. Unless a newer CONNECT of the client has the session
/// by then: it is that connection's, and so is the record.
struct Unrestored<'a> {
    cluster: &'a Cluster,
    broker: &'a Arc<Broker>,
    session: &'a Arc<Session>,
    /// The restoring connection's generation.
    generation: u64,
    /// QoS 2 deliveries (packet id, sequence) noted in [`Cluster::resent_ahead`] for this
    /// session.
    ahead: Vec<(u16, u64)>,
    /// Sequences the client had taken ([`Restore::taken`]) noted there for it.
    taken_ahead: Vec<u64>,
    done: bool,
}

impl Unrestored<'_> {
    /// The restore succeeded: the QoS 2 packet ids it did not send again stay taken, what
    /// the client had taken stays noted for its next move, and nothing is undone.
    fn restored(&mut self, restore: &Restore) {
        release_unmatched(self.broker, self.session, restore);
        self.cluster
            .sessions
            .taken
            .seed(&self.session.client_id, &restore.taken);
        self.done = true;
    }
}

impl Drop for Unrestored<'_> {
    fn drop(&mut self) {
        let client_id = &*self.session.client_id;
        let records = &self.cluster.sessions;
        let mine = records.restoring.lock().remove(client_id);
        if self.done {
            return;
        }
        let held_elsewhere = !self.broker.is_held_by(self.session, self.generation);
        for &(packet_id, seq) in &self.ahead {
            // Kept while the session lives on with that message in flight (a newer
            // connection took it): the consumer must still leave it out.
            if !held_elsewhere || !self.broker.has_inflight(self.session, packet_id, seq) {
                self.cluster.resent_ahead.forget(seq, self.session.id);
            }
        }
        if !held_elsewhere {
            // Kept for a newer connection that has the session: the client has them.
            for &seq in &self.taken_ahead {
                self.cluster.resent_ahead.forget(seq, self.session.id);
            }
        }
        if held_elsewhere {
            tracing::warn!(client = %client_id, "cluster: a resumed session's replay failed after a newer connection took it; that connection keeps what was replayed");
            return;
        }
        let claimed = {
            let mut owned = records.owned.lock();
            let ours = matches!((owned.get(client_id), &mine), (Some((r, _)), Some(m)) if *r == m.revision);
            if ours {
                owned.remove(client_id)
            } else {
                None
            }
        };
        if claimed.is_some() {
            records.wills.lock().remove(client_id);
            records.unattached.lock().remove(client_id);
        }
        self.broker.discard_unrestored(self.session);
        let (Some((revision, mut record)), Some(bucket)) = (claimed, records.bucket.get()) else {
            return;
        };
        record.will = None;
        record.will_delay = 0;
        if record.ended_at == 0 {
            record.ended_at = crate::storage::now_unix_ms();
        }
        let bucket = bucket.clone();
        let key = subject::key(client_id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = bucket.update(key.as_str(), record.encode(), revision).await;
            });
        }
    }
}

async fn replay(
    cluster: &Cluster,
    js: &jetstream::Context,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
    floor: u64,
    local_floor: u64,
) -> Result<usize, async_nats::Error> {
    let mut stream = js.get_stream(STREAM).await?;
    let last = stream.info().await?.state.last_sequence;
    if restore.cursor > last {
        return Ok(0);
    }
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{STREAM_SUBJECTS}.>"),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: restore.cursor,
            },
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut replayed = 0;
    while let Some(message) = messages.next().await {
        let message = message?;
        let seq = message.info().map_or(0, |info| info.stream_sequence);
        if let Ok((origin, local_id, mut publish, stranger)) = wire::decode(&message.payload) {
            let own = origin == cluster.node;
            let taken = restore.taken.binary_search(&seq).is_ok();
            if !taken && ((!own && seq < floor) || (own && local_id < local_floor)) {
                let retained = publish.retain;
                publish.retain = false; // the retained index is not this replay's business
                let routed = Arc::new(wire::message_of(publish, stranger));
                routed.set_cluster_seq(seq);
                if enqueue_matching(broker, session, restore, routed, retained) {
                    replayed += 1;
                }
            }
        }
        if seq >= last {
            break;
        }
    }
    Ok(replayed)
}

/// Queues a replayed message to the session if one of its (non-shared) filters matches:
/// the highest granted QoS among them, every identifier (MQTT-3.3.4-3/4).
fn enqueue_matching(
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    restore: &Restore,
    message: Arc<Message>,
    retained: bool,
) -> bool {
    let mut qos: Option<QoS> = None;
    let mut retain = false;
    let mut ids: SmallVec<[u32; 1]> = SmallVec::new();
    for (filter, options, id) in &restore.subscriptions {
        if crate::codec::topic::split_shared(filter).is_some()
            || !crate::codec::topic::matching::matches(filter, &message.topic)
        {
            continue;
        }
        qos = Some(qos.map_or(options.qos, |q| q.max(options.qos)));
        retain |= options.retain_as_published && retained;
        ids.extend(*id);
    }
    let Some(granted) = qos else {
        return false;
    };
    let qos = message.qos.min(granted);
    if qos == QoS::AtMostOnce {
        return false;
    }
    if qos == QoS::ExactlyOnce {
        let seq = message.cluster_seq();
        if let Some(&(packet_id, _)) = restore.qos2.iter().find(|(packet_id, s)| {
            *s != 0 && Some(*s) == seq && !restore.qos2_shared.contains(packet_id)
        }) {
            // Sent before with this packet id and not yet received: sent again with it
            // (DUP), so the client takes it once (MQTT-4.3.3).
            let delivery = crate::broker::Delivery {
                message,
                qos,
                retain,
                subscription_ids: ids,
                seq: None,
                shared: None,
            };
            match broker.restore_cluster_inflight(session, packet_id, Some(delivery)) {
                None => return true,
                // Its packet id is taken here already: sent as a new delivery instead.
                Some(delivery) => {
                    return broker
                        .enqueue_for(
                            session,
                            delivery.message,
                            qos,
                            delivery.retain,
                            delivery.subscription_ids,
                        )
                        .is_ok();
                }
            }
        }
    }
    // A catch-up with no publisher to pause or refuse: with the memory budget over, or a
    // stranger's message past the anonymous share, dropped and counted as dropped for memory,
    // as its PUBLISH would have been refused here (issue 35, sixteenth adversarial pass, C1: a
    // replay queued 600 of a stranger's 100 KB messages, 357% of the budget, and password
    // users got 0x97). A QoS 2 delivery in flight, above, is sent again regardless.
    if !broker.has_room_for(&message, MemoryLevel::Over) {
        broker.metrics.messages_dropped_memory[qos as usize].increment(1);
        return false;
    }
    match broker.enqueue_for(session, message, qos, retain, ids) {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(client = %session.client_id, %error, "cluster: a replayed message was refused");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Publish;
    use crate::codec::SubscriptionOptions;
    use bytes::Bytes;
    use std::sync::Arc;

    fn options(qos: QoS, retain_as_published: bool) -> SubscriptionOptions {
        SubscriptionOptions {
            qos,
            no_local: false,
            retain_as_published,
            retain_handling: 0,
        }
    }

    fn message(topic: &str) -> Arc<Message> {
        Arc::new(Message::from_publish(
            Publish {
                qos: QoS::ExactlyOnce,
                topic: topic.into(),
                packet_id: 1,
                payload: Bytes::from_static(b"x"),
                ..Default::default()
            },
            None,
        ))
    }

    /// A delivery sent again goes out as the subscription that sent it: a plain one with
    /// every matching plain filter's identifier (MQTT-3.3.4-3), a shared one under its
    /// group (so its settlement and a later hand-over treat it as the group's).
    #[test]
    fn a_resent_delivery_is_its_own_subscriptions() {
        let restore = Restore {
            subscriptions: vec![
                (
                    "$share/g/t/#".into(),
                    options(QoS::ExactlyOnce, false),
                    Some(1),
                ),
                ("t/+".into(), options(QoS::ExactlyOnce, true), Some(2)),
                ("t/#".into(), options(QoS::AtLeastOnce, false), Some(3)),
                ("other".into(), options(QoS::ExactlyOnce, false), Some(4)),
            ],
            ..Restore::default()
        };
        let plain = resent_delivery(&restore, message("t/x"), true, false);
        assert!(plain.shared.is_none());
        assert_eq!(plain.subscription_ids.as_slice(), &[2, 3]);
        assert!(plain.retain, "retain as published on t/+");
        assert_eq!(plain.qos, QoS::ExactlyOnce);

        let shared = resent_delivery(&restore, message("t/x"), true, true);
        assert_eq!(shared.shared.as_deref(), Some("$share/g/t/#"));
        assert_eq!(shared.subscription_ids.as_slice(), &[1]);
        assert!(!shared.retain);

        // Its subscription went since: sent again all the same, with nothing to name.
        let orphan = resent_delivery(&restore, message("u/x"), false, true);
        assert!(orphan.shared.is_none());
        assert!(orphan.subscription_ids.is_empty());
    }
}
