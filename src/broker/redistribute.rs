//! Moving the shared-group deliveries a session holds to other members of their groups
//! (MQTT 5 §4.8.2): on disconnect its queued and unacknowledged QoS 1 messages, for groups with
//! another connected member; on session end everything still held; when its client comes back
//! taking smaller packets, what no longer fits. A member that outlives its connection stores
//! what it is given before the leaving session's copies are forgotten.
//!
//! Must not: hold an index lock while taking a session lock.

use std::sync::Arc;

use bytestring::ByteString;

use super::guarantees::QueueLosses;
use super::{persist, Broker, Delivery, Session};
use crate::auth::acl::Action;
use crate::codec::QoS;
use crate::storage::Op;

/// Why a session's shared deliveries move, which decides what moves and where it may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Handover {
    /// Its connection closed and the session lives on: its queued messages and its sent but
    /// unacknowledged QoS 1 messages, for groups with another connected member, to a
    /// connected member (QoS 2 messages already sent stay, MQTT-4.8.2-4).
    Disconnected,
    /// The session ended: everything still held, to any remaining member (clustered, with
    /// none here: to the group on other nodes); QoS 2 messages already sent are dropped
    /// (MQTT-4.8.2-5).
    Ended,
    /// Its client came back announcing a smaller Maximum Packet Size than the one it was
    /// chosen by: what no longer fits (MQTT-3.1.2-24: it must not be sent), to any other
    /// member that would keep it; failing that it stays, to be dropped as too large and
    /// dead-lettered when its turn comes, as before (issue 35, fifteenth pass, B2).
    Shrunk,
}

impl Broker {
    /// Hands the shared-subscription deliveries `session` holds to other members of their
    /// groups, as `why` says ([`Handover`]).
    pub(super) fn redistribute_shared(&self, session: &Arc<Session>, why: Handover) {
        let connected_only = why == Handover::Disconnected;
        let taken = match why {
            Handover::Disconnected => {
                let keys: Vec<ByteString> = {
                    let st = session.lock();
                    st.subscriptions
                        .keys()
                        .filter(|f| f.starts_with("$share/"))
                        .cloned()
                        .collect()
                };
                let eligible: Vec<ByteString> = {
                    let index = self.shared.read();
                    keys.into_iter()
                        .filter(|k| index.has_other_connected(k, session.id))
                        .collect()
                };
                // Clustered, a group's message its engine still holds goes back to it when
                // no member here is connected (a connected member on another node takes it).
                let clustered = self.cluster().is_some();
                if eligible.is_empty() && !clustered {
                    return;
                }
                session.lock().take_shared(
                    |d| {
                        d.message.awaits_settlement()
                            || d.shared
                                .as_deref()
                                .is_some_and(|g| eligible.iter().any(|k| k == g))
                    },
                    true,
                )
            }
            Handover::Ended => session.lock().take_shared(|_| true, true),
            Handover::Shrunk => {
                let mut st = session.lock();
                let max = st.client_max_packet;
                st.take_shared(
                    |d| !super::session::fits_client(d.message.size(), max),
                    true,
                )
            }
        };
        if taken.is_empty() {
            return;
        }
        let mut removed: Vec<Op> = Vec::new();
        let mut moves: Vec<(Arc<Session>, Delivery)> = Vec::with_capacity(taken.len());
        // An ending session's messages with no other member here: to the group's members on
        // other nodes when clustered, otherwise dropped (counted).
        let mut homeless: Vec<Delivery> = Vec::new();
        // What a returning member keeps because no other member would take it.
        let mut unmoved: Vec<Delivery> = Vec::new();
        {
            let index = self.shared.read();
            let authz = self.authz();
            for d in taken {
                let Some(key) = d.shared.as_deref() else {
                    continue;
                };
                let may_read = |s: &Session| {
                    authz.is_none_or(|a| s.authorized(a.acl, Action::Read, &d.message.topic))
                };
                // One its engine holds goes to a connected member here, else back to it.
                let settles = d.message.awaits_settlement();
                let picked = {
                    let judge = self.shared_judge(&d.message);
                    index
                        .pick_other(
                            key,
                            &d.message.topic,
                            session.id,
                            connected_only || settles,
                            may_read,
                            &judge,
                        )
                        // What no longer fits its member goes only where it would be kept.
                        .filter(|m| why != Handover::Shrunk || judge(&m.session).1)
                };
                // A returning member nobody else would take it from keeps it as it was: in
                // its queue, under its stored entry (to be dropped as too large, dead-lettered,
                // when its turn comes).
                if picked.is_none() && why == Handover::Shrunk && !settles {
                    unmoved.push(d);
                    continue;
                }
                // Wherever else it goes, its stored entry here is forgotten, or a restart
                // would deliver it here again: a persistent new member stores it first
                // (below), as does this session when it keeps it (under a new `seq`: before,
                // the old entry stayed beside the new one, and a restart delivered it twice).
                if let Some(seq) = d.seq {
                    removed.push(Op::RemoveEntry {
                        client_id: session.client_id.clone(),
                        seq,
                    });
                }
                match picked {
                    Some(m) => {
                        moves.push((
                            m.session,
                            Delivery {
                                qos: d.message.qos.min(m.options.qos),
                                retain: m.options.retain_as_published && d.message.retain,
                                subscription_ids: m.identifier.into_iter().collect(),
                                message: d.message,
                                seq: None,
                                shared: d.shared,
                            },
                        ));
                    }
                    // The other members left meanwhile: a disconnecting member keeps it; an
                    // ending session's messages have no other member here.
                    None if why == Handover::Disconnected && !settles => {
                        moves.push((Arc::clone(session), Delivery { seq: None, ..d }));
                    }
                    None => homeless.push(d),
                }
            }
        }
        if !unmoved.is_empty() {
            let mut st = session.lock();
            for d in unmoved {
                st.restore_queued(d);
            }
        }
        for d in homeless {
            let given_back = match (self.cluster(), d.shared.as_deref()) {
                (Some(cluster), Some(key)) => cluster.regroup(key, &d.message),
                _ => false,
            };
            if !given_back && d.qos != QoS::AtMostOnce {
                self.metrics.messages_dropped_no_subscribers[d.qos as usize].increment(1);
            }
        }
        tracing::debug!(client = %session.client_id, moved = moves.len(), "shared subscription messages redistributed");
        let now_ms = self.coarse_ms();
        let mut losses = QueueLosses::default();
        // A member that outlives its connection stores what it is given, as a routed
        // delivery is stored: in memory only, every job moved off a leaving member was lost
        // at the next restart, after its publisher's PUBACK (issue 35, fifteenth adversarial
        // pass, B5). Its ops go before `removed`, one log in submit order, so no crash keeps
        // the removal without the new entry; the delivery is visible only once they are
        // submitted (`Session::push_reserved`).
        let mut added: Vec<Op> = Vec::new();
        let mut reserved: Vec<(Arc<Session>, Delivery)> = Vec::new();
        for (target, delivery) in moves {
            let message = Arc::clone(&delivery.message);
            let persistence = self.store.is_some();
            let (_, _, stored) = self.admit_counted(
                &target,
                delivery,
                &message,
                persistence,
                now_ms,
                &mut removed,
                &mut losses,
            );
            if let Some(delivery) = stored {
                self.store_moved(&mut added, &target.client_id, &delivery);
                reserved.push((target, delivery));
            }
        }
        // No session lock held. Before `removed`, which forgets the leaving session's stored
        // entries of the moved messages and the victims' (one log, in submit order).
        losses.publish_all(self);
        added.extend(removed);
        self.persist(added);
        for (target, delivery) in reserved {
            target.push_reserved(delivery, now_ms);
        }
    }

    /// The ops that store a moved shared delivery at its new member `client_id` (reserved
    /// with a stored `seq`): its message (again if stored already: a re-put keeps the
    /// references), and its entry.
    fn store_moved(&self, ops: &mut Vec<Op>, client_id: &ByteString, delivery: &Delivery) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let mut entry = Vec::with_capacity(2);
        persist::enqueue(&mut entry, client_id, delivery);
        let message = &delivery.message;
        let id = message.store_id.get_or_init(|| store.next_message_id());
        persist::fix_message_ids(&mut entry, id);
        ops.push(persist::put_message(id, message));
        if let Some(stream_seq) = message.cluster_seq() {
            ops.push(persist::sequenced(id, stream_seq));
        }
        ops.extend(entry);
    }
}
