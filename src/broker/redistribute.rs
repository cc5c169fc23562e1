//! Moving the shared-group deliveries a leaving session holds to other members of their groups
//! (MQTT 5 §4.8.2): on disconnect its queued and unacknowledged QoS 1 messages, for groups with
//! another connected member; on session end everything still held. A member that outlives
//! its connection stores what it is given before the leaving session's copies are forgotten.
//!
//! Must not: hold an index lock while taking a session lock.

use std::sync::Arc;

use bytestring::ByteString;

use super::guarantees::QueueLosses;
use super::session::Victims;
use super::{persist, Admission, Broker, Delivery, Session};
use crate::auth::acl::Action;
use crate::codec::QoS;
use crate::storage::Op;

impl Broker {
    /// Hands the shared-subscription deliveries `session` holds to other members of their
    /// groups. On disconnect (`connected_only`): its queued messages and its sent but
    /// unacknowledged QoS 1 messages, for groups with another connected member (QoS 2
    /// messages already sent stay, MQTT-4.8.2-4). On session end: everything still held,
    /// to any remaining member (clustered, with none here: to the group on other nodes);
    /// QoS 2 messages already sent are dropped (MQTT-4.8.2-5).
    pub(super) fn redistribute_shared(&self, session: &Arc<Session>, connected_only: bool) {
        let taken = if connected_only {
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
            // Clustered, a group's message its engine still holds goes back to it when no
            // member here is connected (a connected member on another node takes it).
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
        } else {
            session.lock().take_shared(|_| true, true)
        };
        if taken.is_empty() {
            return;
        }
        let mut removed: Vec<Op> = Vec::new();
        let mut moves: Vec<(Arc<Session>, Delivery)> = Vec::with_capacity(taken.len());
        // An ending session's messages with no other member here: to the group's members on
        // other nodes when clustered, otherwise dropped (counted).
        let mut homeless: Vec<Delivery> = Vec::new();
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
                match index.pick_other(
                    key,
                    &d.message.topic,
                    session.id,
                    connected_only || settles,
                    may_read,
                    self.shared_judge(&d.message),
                ) {
                    Some(m) => {
                        // The leaving session no longer holds it: forget its stored entry, or a
                        // restart would deliver it there again. A persistent new member stores
                        // it first (below).
                        if let Some(seq) = d.seq {
                            removed.push(Op::RemoveEntry {
                                client_id: session.client_id.clone(),
                                seq,
                            });
                        }
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
                    None if connected_only && !settles => moves.push((Arc::clone(session), d)),
                    None => homeless.push(d),
                }
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
            let qos = delivery.qos;
            let message = Arc::clone(&delivery.message);
            let limits = self.limits.of(&target.client_id);
            let admission = target.admit(delivery, &limits, self.store.is_some(), now_ms);
            let (outcome, mut victims) = match admission {
                Admission::Pushed(outcome, victims) | Admission::Refused(outcome, victims) => {
                    persist::remove_victims(&mut removed, &target.client_id, &victims);
                    (outcome, victims)
                }
                Admission::Reserved {
                    delivery,
                    outcome,
                    victims,
                } => {
                    self.store_moved(&mut added, &target.client_id, &delivery, &victims);
                    reserved.push((Arc::clone(&target), delivery));
                    (outcome, victims)
                }
            };
            self.count_enqueue(outcome, qos, &victims);
            losses.note(self, &target, outcome, &message, &mut victims);
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
    /// references), and its entry, after the removals of the victims it pushed out.
    fn store_moved(
        &self,
        ops: &mut Vec<Op>,
        client_id: &ByteString,
        delivery: &Delivery,
        victims: &Victims,
    ) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let mut entry = Vec::with_capacity(2);
        persist::enqueue(&mut entry, client_id, delivery, victims);
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
