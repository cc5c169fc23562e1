//! Translating broker state changes into store ops (`docs/durability.md`, "Model: ops",
//! says which event records which op). Only the broker builds store ops: connections
//! and links reach them through the session API. The store never sees broker types (it is a
//! leaf), so conversions from them live here.

use std::time::Instant;

use bytestring::ByteString;

use super::message::{Delivery, Message};
use super::session::{OutboundStage, SessionState, Victims};
use crate::codec::SubscriptionOptions;
use crate::storage::{
    self, EntryStage, Op, QueueEntry, SessionMeta, StoredMessage, SubscriptionRecord,
};

impl From<&Message> for StoredMessage {
    /// The persisted form of a routed message: its monotonic times become wall-clock unix ms
    /// (relative to now), so expiry keeps counting across restarts. Payload not copied.
    fn from(message: &Message) -> StoredMessage {
        let now = Instant::now();
        let now_ms = storage::now_unix_ms();
        let age_ms = now
            .saturating_duration_since(message.received_at)
            .as_millis() as u64;
        StoredMessage {
            topic: message.topic.clone(),
            payload: message.payload.clone(),
            qos: message.qos,
            retain: message.retain,
            properties: message.properties().clone(),
            received_at_unix_ms: now_ms.saturating_sub(age_ms),
            expires_at_unix_ms: message.expires_at.map(|t| {
                let left = t.saturating_duration_since(now).as_millis() as u64;
                now_ms + left
            }),
            // Set by [`retained`] and [`put_message`], the records that keep it.
            from_anonymous: false,
        }
    }
}

/// A session's persisted settings.
pub(super) fn session_meta(
    client_id: &ByteString,
    st: &SessionState,
    disconnected_at_unix_ms: Option<u64>,
) -> SessionMeta {
    SessionMeta {
        client_id: client_id.clone(),
        protocol: st.protocol,
        expiry_interval: st.expiry_interval,
        disconnected_at_unix_ms,
        owner: st.owner.clone(),
    }
}

/// Ops for a session a connection just attached to (new or resumed), with `persistence` on:
/// store it while it is persistent (with the subscriptions it already has, if it was not
/// stored before), forget it when it no longer is.
pub(super) fn session_resumed(
    client_id: &ByteString,
    st: &mut SessionState,
    persistence: bool,
) -> Vec<Op> {
    if !persistence {
        return Vec::new();
    }
    if !st.is_persistent() {
        if std::mem::take(&mut st.stored) {
            return vec![Op::DeleteSession {
                client_id: client_id.clone(),
            }];
        }
        return Vec::new();
    }
    let mut ops = vec![Op::PutSession(session_meta(client_id, st, None))];
    if !st.stored {
        ops.extend(
            st.subscriptions.iter().map(|(filter, sub)| {
                put_subscription(client_id, filter, sub.options, sub.identifier)
            }),
        );
        st.stored = true;
    }
    ops
}

/// One subscription as stored.
pub(super) fn put_subscription(
    client_id: &ByteString,
    filter: &ByteString,
    options: SubscriptionOptions,
    identifier: Option<u32>,
) -> Op {
    Op::PutSubscription {
        client_id: client_id.clone(),
        filter: filter.clone(),
        subscription: SubscriptionRecord {
            options,
            identifier,
        },
    }
}

/// The body of a message, stored once under `id`.
/// A body charged to the anonymous share (a stranger's message, or a dead letter one
/// caused) says so, so a restart charges it again (issue 35, fifteenth adversarial pass, B3:
/// restored uncharged, each restart freed the share).
pub(super) fn put_message(id: u64, message: &Message) -> Op {
    Op::PutMessage {
        id,
        message: StoredMessage {
            from_anonymous: message.charged_anonymous(),
            ..StoredMessage::from(message)
        },
    }
}

/// The cluster stream sequence of body `id` (issue 34): right after its `put_message` when
/// it is known at routing (another node's message, a replayed one), so a restart brings the
/// message back with its place in the stream. Never written on a single node.
#[cold]
pub(super) fn sequenced(id: u64, stream_seq: u64) -> Op {
    Op::SequenceMessage { id, stream_seq }
}

/// The cluster stream sequence of a body stored earlier, known now (this node's own
/// message, at JetStream's acknowledgement); `None` when the message was not stored.
pub(super) fn sequence(message: &Message) -> Option<Op> {
    Some(sequenced(message.store_id.get()?, message.cluster_seq()?))
}

/// The retained-store update a RETAIN=1 PUBLISH implies (empty payload clears).
pub(super) fn retained(message: &Message) -> Op {
    if message.payload.is_empty() {
        Op::DeleteRetained {
            topic: message.topic.clone(),
        }
    } else {
        // An anonymous client's retained message keeps that in its record, so a restart
        // charges it to their share again (pass 7B, P1).
        Op::PutRetained {
            topic: message.topic.clone(),
            message: StoredMessage {
                from_anonymous: message.from_anonymous,
                ..StoredMessage::from(message)
            },
        }
    }
}

/// Removes the stored entries of deliveries a drop-oldest admission pushed out.
pub(super) fn remove_victims(ops: &mut Vec<Op>, client_id: &ByteString, victims: &Victims) {
    ops.extend(
        victims
            .stored()
            .iter()
            .map(|&seq| remove_entry(client_id, seq)),
    );
}

/// Appends the `Enqueue` of a reserved delivery (the removals of the drop-oldest victims it
/// pushed out are written by `Broker::admit_counted`). The message id is filled in by the
/// caller's `PutMessage`, which precedes these ops.
pub(super) fn enqueue(ops: &mut Vec<Op>, client_id: &ByteString, delivery: &Delivery) {
    if let Some(seq) = delivery.seq {
        ops.push(Op::Enqueue {
            client_id: client_id.clone(),
            seq,
            entry: QueueEntry {
                message: 0, // patched by `fix_message_ids`
                qos: delivery.qos,
                retain: delivery.retain,
                subscription_ids: delivery.subscription_ids.clone(),
                stage: EntryStage::Queued,
                deliveries: 0,
                shared: delivery.shared.clone(),
            },
        });
    }
}

/// Points every `Enqueue` in `ops` at the stored message `id`.
pub(super) fn fix_message_ids(ops: &mut [Op], id: u64) {
    for op in ops {
        if let Op::Enqueue { entry, .. } = op {
            entry.message = id;
        }
    }
}

/// A queued or inflight entry is gone (acknowledged, expired, refused or moved).
pub(super) fn remove_entry(client_id: &ByteString, seq: u64) -> Op {
    Op::RemoveEntry {
        client_id: client_id.clone(),
        seq,
    }
}

/// A persisted delivery moved to a new handshake stage under `packet_id`.
pub(super) fn update_entry(
    client_id: &ByteString,
    seq: u64,
    stage: OutboundStage,
    packet_id: u16,
) -> Op {
    Op::UpdateEntry {
        client_id: client_id.clone(),
        seq,
        stage: entry_stage(stage, packet_id),
    }
}

/// An inbound QoS 2 id was released by PUBREL.
pub(super) fn remove_inbound_qos2(client_id: &ByteString, packet_id: u16) -> Op {
    Op::RemoveInboundQos2 {
        client_id: client_id.clone(),
        packet_id,
    }
}

/// The store's stage for an outbound handshake step.
fn entry_stage(stage: OutboundStage, packet_id: u16) -> EntryStage {
    match stage {
        OutboundStage::AwaitPubAck => EntryStage::AwaitPubAck { packet_id },
        OutboundStage::AwaitPubRec => EntryStage::AwaitPubRec { packet_id },
        OutboundStage::AwaitPubComp => EntryStage::AwaitPubComp { packet_id },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Publish;

    /// Whatever is charged to the anonymous share for its life is stored marked, so a restart
    /// charges it again: a stranger's message, and a dead letter a stranger caused, which is
    /// charged without being one they published (issue 35, fifteenth pass, B3; the review of
    /// the sixteenth: the letter was stored unmarked and came back uncharged).
    #[test]
    fn a_body_charged_to_the_anonymous_share_is_stored_marked() {
        let make = || Message::from_publish(Publish::default(), None);
        let mut published = make();
        published.set_published_anonymously(true);
        let mut letter = make();
        letter.charge_anonymous();
        for (what, message, marked) in [
            ("a stranger's message", published, true),
            ("a dead letter a stranger caused", letter, true),
            ("a password user's message", make(), false),
        ] {
            let Op::PutMessage {
                message: stored, ..
            } = put_message(1, &message)
            else {
                panic!("{what}: not a PutMessage");
            };
            assert_eq!(stored.from_anonymous, marked, "{what}");
        }
    }
}
