//! The store's own model of what is persisted: replaying the log into it rebuilds the state
//! at the last commit, and writing it out as ops is a snapshot (compaction).
//!
//! Applying an op never fails: ops that name a missing session are ignored and counted
//! (`orphans`), ops on missing entries are no-ops. That keeps replay deterministic, which is
//! what makes "snapshot + log" equal to the state the writer had.
//!
//! Must not: fail on apply (replay is deterministic).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytestring::ByteString;

use super::{
    DedupRecord, EntryStage, MessageId, Op, QueueEntry, SessionMeta, SessionSnapshot, Snapshot,
    StoredMessage, StoredWill, SubscriptionRecord,
};
use crate::codec::LastWill;

/// One persisted session.
#[derive(Debug)]
struct SessionState {
    meta: SessionMeta,
    subscriptions: BTreeMap<ByteString, SubscriptionRecord>,
    queue: BTreeMap<u64, QueueEntry>,
    inbound: BTreeSet<u16>,
}

/// A stored message body and how many queue entries reference it.
#[derive(Debug)]
struct MessageSlot {
    message: StoredMessage,
    refs: u32,
}

/// Everything persisted, in memory.
#[derive(Debug, Default)]
pub(super) struct State {
    sessions: BTreeMap<ByteString, SessionState>,
    messages: HashMap<MessageId, MessageSlot>,
    /// The cluster stream sequence of bodies in `messages` ([`Op::SequenceMessage`]): a map
    /// of its own (not a field of every slot), so a store that never was clustered holds
    /// nothing more per message.
    stream_seqs: HashMap<MessageId, u64>,
    /// Messages put during the current batch; dropped at its end if still unreferenced.
    unreferenced: Vec<MessageId>,
    retained: BTreeMap<ByteString, StoredMessage>,
    wills: BTreeMap<ByteString, (LastWill, u64)>,
    /// Deduplication keys (topic, key) → when their window closes, unix ms.
    dedup: HashMap<(ByteString, ByteString), u64, foldhash::fast::RandomState>,
    /// At most about this many `dedup` keys are kept, the newest (`Store::bound_dedup`);
    /// `None`: unbounded (recovery, before the broker says).
    dedup_cap: Option<usize>,
    /// Approximate bytes of live data (`Op::size_estimate` of what is held).
    pub live_bytes: u64,
    /// Highest message id ever put (ids are never reused).
    pub max_message_id: MessageId,
    /// Ops ignored because their session does not exist.
    pub orphans: u64,
}

fn entry_size(client_id: &ByteString, entry: &QueueEntry) -> u64 {
    Op::Enqueue {
        client_id: client_id.clone(),
        seq: 0,
        entry: entry.clone(),
    }
    .size_estimate()
}

fn subscription_size(client_id: &ByteString, filter: &ByteString) -> u64 {
    32 + (client_id.len() + filter.len()) as u64
}

fn meta_size(meta: &SessionMeta) -> u64 {
    32 + meta.client_id.len() as u64
}

fn message_size(message: &StoredMessage) -> u64 {
    32 + message.size_estimate()
}

fn dedup_size(topic: &ByteString, key: &ByteString) -> u64 {
    32 + (topic.len() + key.len()) as u64
}

fn will_size(client_id: &ByteString, will: &LastWill) -> u64 {
    32 + (client_id.len() + will.topic.len() + will.payload.len()) as u64
}

impl State {
    /// Applies one op (see the module doc for what is ignored).
    pub(super) fn apply(&mut self, op: Op) {
        match op {
            Op::PutSession(meta) => match self.sessions.get_mut(&meta.client_id) {
                Some(s) => s.meta = meta,
                None => {
                    self.live_bytes += meta_size(&meta);
                    self.sessions.insert(
                        meta.client_id.clone(),
                        SessionState {
                            meta,
                            subscriptions: BTreeMap::new(),
                            queue: BTreeMap::new(),
                            inbound: BTreeSet::new(),
                        },
                    );
                }
            },
            Op::DeleteSession { client_id } => {
                if let Some(s) = self.sessions.remove(&client_id) {
                    self.live_bytes = self.live_bytes.saturating_sub(meta_size(&s.meta));
                    for filter in s.subscriptions.keys() {
                        let size = subscription_size(&client_id, filter);
                        self.live_bytes = self.live_bytes.saturating_sub(size);
                    }
                    for entry in s.queue.values() {
                        self.live_bytes = self
                            .live_bytes
                            .saturating_sub(entry_size(&client_id, entry));
                        self.release(entry.message);
                    }
                }
            }
            Op::PutSubscription {
                client_id,
                filter,
                subscription,
            } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    if s.subscriptions
                        .insert(filter.clone(), subscription)
                        .is_none()
                    {
                        self.live_bytes += subscription_size(&client_id, &filter);
                    }
                }
                None => self.orphans += 1,
            },
            Op::DeleteSubscription { client_id, filter } => match self.sessions.get_mut(&client_id)
            {
                Some(s) => {
                    if s.subscriptions.remove(&filter).is_some() {
                        let size = subscription_size(&client_id, &filter);
                        self.live_bytes = self.live_bytes.saturating_sub(size);
                    }
                }
                None => self.orphans += 1,
            },
            Op::PutMessage { id, message } => {
                self.max_message_id = self.max_message_id.max(id);
                let size = message_size(&message);
                match self.messages.get_mut(&id) {
                    // Re-put of a live id: keep its references, replace the body.
                    Some(slot) => {
                        self.live_bytes =
                            self.live_bytes.saturating_sub(message_size(&slot.message)) + size;
                        slot.message = message;
                    }
                    None => {
                        self.live_bytes += size;
                        self.messages.insert(id, MessageSlot { message, refs: 0 });
                        self.unreferenced.push(id);
                    }
                }
            }
            Op::Enqueue {
                client_id,
                seq,
                entry,
            } => {
                let Some(s) = self.sessions.get_mut(&client_id) else {
                    self.orphans += 1;
                    return;
                };
                let Some(slot) = self.messages.get_mut(&entry.message) else {
                    self.orphans += 1; // dangling reference: the body was never stored
                    return;
                };
                slot.refs += 1;
                self.live_bytes += entry_size(&client_id, &entry);
                if let Some(old) = s.queue.insert(seq, entry) {
                    self.live_bytes = self.live_bytes.saturating_sub(entry_size(&client_id, &old));
                    self.release(old.message);
                }
            }
            Op::UpdateEntry {
                client_id,
                seq,
                stage,
            } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    if let Some(e) = s.queue.get_mut(&seq) {
                        e.stage = stage;
                        if stage != EntryStage::Queued && e.deliveries == 0 {
                            e.deliveries = 1; // the first send
                        }
                    }
                }
                None => self.orphans += 1,
            },
            Op::CountDelivery {
                client_id,
                seq,
                deliveries,
            } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    if let Some(e) = s.queue.get_mut(&seq) {
                        e.deliveries = deliveries;
                    }
                }
                None => self.orphans += 1,
            },
            Op::PutDedup {
                topic,
                key,
                expires_at_unix_ms,
            } => {
                let size = dedup_size(&topic, &key);
                if self
                    .dedup
                    .insert((topic, key), expires_at_unix_ms)
                    .is_none()
                {
                    self.live_bytes += size;
                }
                if let Some(cap) = self.dedup_cap {
                    // A quarter of slack: one sort per cap/4 inserts, not one per insert.
                    if self.dedup.len() > cap.saturating_add(cap / 4).saturating_add(16) {
                        self.trim_dedup(cap);
                    }
                }
            }
            Op::RemoveEntry { client_id, seq } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    if let Some(old) = s.queue.remove(&seq) {
                        self.live_bytes =
                            self.live_bytes.saturating_sub(entry_size(&client_id, &old));
                        self.release(old.message);
                    }
                }
                None => self.orphans += 1,
            },
            Op::PutInboundQos2 {
                client_id,
                packet_id,
            } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    s.inbound.insert(packet_id);
                }
                None => self.orphans += 1,
            },
            Op::RemoveInboundQos2 {
                client_id,
                packet_id,
            } => match self.sessions.get_mut(&client_id) {
                Some(s) => {
                    s.inbound.remove(&packet_id);
                }
                None => self.orphans += 1,
            },
            Op::PutRetained { topic, message } => {
                self.live_bytes += message_size(&message);
                if let Some(old) = self.retained.insert(topic, message) {
                    self.live_bytes = self.live_bytes.saturating_sub(message_size(&old));
                }
            }
            Op::DeleteRetained { topic } => {
                if let Some(old) = self.retained.remove(&topic) {
                    self.live_bytes = self.live_bytes.saturating_sub(message_size(&old));
                }
            }
            Op::PutWill {
                client_id,
                will,
                publish_at_unix_ms,
            } => {
                self.live_bytes += will_size(&client_id, &will);
                if let Some((old, _)) = self
                    .wills
                    .insert(client_id.clone(), (will, publish_at_unix_ms))
                {
                    let size = will_size(&client_id, &old);
                    self.live_bytes = self.live_bytes.saturating_sub(size);
                }
            }
            Op::DeleteWill { client_id } => {
                if let Some((old, _)) = self.wills.remove(&client_id) {
                    let size = will_size(&client_id, &old);
                    self.live_bytes = self.live_bytes.saturating_sub(size);
                }
            }
            Op::SequenceMessage { id, stream_seq } => {
                // A body already gone (every delivery of it acknowledged before JetStream's
                // acknowledgement came) needs no sequence: not an orphan.
                if stream_seq != 0 && self.messages.contains_key(&id) {
                    self.stream_seqs.insert(id, stream_seq);
                }
            }
        }
    }

    /// A body left the store: its sequence goes with it.
    fn forget_seq(&mut self, id: MessageId) {
        if !self.stream_seqs.is_empty() {
            self.stream_seqs.remove(&id);
        }
    }

    /// Drops one reference to a message; the body goes with the last one.
    fn release(&mut self, id: MessageId) {
        if let Some(slot) = self.messages.get_mut(&id) {
            slot.refs = slot.refs.saturating_sub(1);
            if slot.refs == 0 {
                if let Some(slot) = self.messages.remove(&id) {
                    self.live_bytes = self.live_bytes.saturating_sub(message_size(&slot.message));
                    self.forget_seq(id);
                }
            }
        }
    }

    /// Sets the bound on deduplication keys (`Store::bound_dedup`).
    pub(super) fn bound_dedup(&mut self, max_entries: usize) {
        self.dedup_cap = (max_entries != usize::MAX).then_some(max_entries);
    }

    /// Keeps the newest `cap` deduplication keys (by window end, i.e. insertion order;
    /// keys tied at the cut all go).
    fn trim_dedup(&mut self, cap: usize) {
        let excess = self.dedup.len().saturating_sub(cap);
        if excess == 0 {
            return;
        }
        let mut ends: Vec<u64> = self.dedup.values().copied().collect();
        let (_, cut, _) = ends.select_nth_unstable(excess - 1);
        self.drop_dedup_through(*cut);
    }

    /// Drops the dedup keys whose window ends at or before `end`; returns how many went.
    fn drop_dedup_through(&mut self, end: u64) -> usize {
        let before = self.dedup.len();
        let mut freed = 0;
        self.dedup.retain(|(topic, key), expires| {
            let keep = *expires > end;
            if !keep {
                freed += dedup_size(topic, key);
            }
            keep
        });
        self.live_bytes = self.live_bytes.saturating_sub(freed);
        before - self.dedup.len()
    }

    /// Ends a batch: messages put in it that no entry references are dropped.
    pub(super) fn end_batch(&mut self) {
        for id in std::mem::take(&mut self.unreferenced) {
            if self.messages.get(&id).is_some_and(|slot| slot.refs == 0) {
                if let Some(slot) = self.messages.remove(&id) {
                    self.live_bytes = self.live_bytes.saturating_sub(message_size(&slot.message));
                    self.forget_seq(id);
                }
            }
        }
    }

    /// Drops expired retained messages and dedup keys whose window closed. Returns how many
    /// records went. Queue entries whose message expired stay: the broker dead-letters each
    /// (issue 16, reason `expired`) when it meets it in the session's queue, after a restart
    /// too, and removes it then (`RemoveEntry`); purged here they would vanish uncounted.
    pub(super) fn purge_expired(&mut self, now_unix_ms: u64) -> usize {
        let mut purged = 0;
        let topics: Vec<ByteString> = self
            .retained
            .iter()
            .filter(|(_, m)| m.is_expired(now_unix_ms))
            .map(|(t, _)| t.clone())
            .collect();
        purged += topics.len();
        for topic in topics {
            self.apply(Op::DeleteRetained { topic });
        }
        purged += self.drop_dedup_through(now_unix_ms);
        purged
    }

    /// Forgets every inbound QoS 2 id held now; recovery calls it where it skips a damaged log
    /// frame. That frame may have held the `RemoveInboundQos2` of an id the publisher has since
    /// reused: kept, the id would make the broker take the publisher's next message under it
    /// for a duplicate, acknowledge it and drop it. Forgotten, a PUBLISH re-sent under a still
    /// open id is routed again: a duplicate instead of a loss. Ids put by later frames come
    /// back as those are replayed. Returns how many were forgotten.
    pub(super) fn forget_inbound_qos2(&mut self) -> usize {
        self.sessions
            .values_mut()
            .map(|s| std::mem::take(&mut s.inbound).len())
            .sum()
    }

    /// After damaged log frames were skipped, an entry whose removal was lost can be in flight
    /// under the same packet id as a later one. Keeps the newest of each id in flight and puts
    /// the older ones back to `Queued` (sent again under a new packet id: a possible duplicate,
    /// never a loss). Returns how many were put back.
    pub(super) fn requeue_colliding_inflight(&mut self) -> usize {
        let mut requeued = 0;
        for s in self.sessions.values_mut() {
            let mut seen = BTreeSet::new();
            for entry in s.queue.values_mut().rev() {
                let id = match entry.stage {
                    EntryStage::Queued => continue,
                    EntryStage::AwaitPubAck { packet_id }
                    | EntryStage::AwaitPubRec { packet_id }
                    | EntryStage::AwaitPubComp { packet_id } => packet_id,
                };
                if !seen.insert(id) {
                    entry.stage = EntryStage::Queued;
                    requeued += 1;
                }
            }
        }
        requeued
    }

    /// Sessions, queue entries and retained messages held: what recovery reports as kept.
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        let entries = self.sessions.values().map(|s| s.queue.len()).sum();
        (self.sessions.len(), entries, self.retained.len())
    }

    /// A copy of everything, for [`super::Store::load`].
    pub(super) fn to_snapshot(&self) -> Snapshot {
        let sessions = self
            .sessions
            .values()
            .map(|s| SessionSnapshot {
                meta: Some(s.meta.clone()),
                subscriptions: s
                    .subscriptions
                    .iter()
                    .map(|(f, r)| (f.clone(), *r))
                    .collect(),
                queue: s.queue.iter().map(|(q, e)| (*q, e.clone())).collect(),
                inbound_qos2: s.inbound.iter().copied().collect(),
            })
            .collect();
        Snapshot {
            sessions,
            messages: self
                .messages
                .iter()
                .map(|(id, slot)| (*id, slot.message.clone()))
                .collect(),
            retained: self
                .retained
                .iter()
                .map(|(t, m)| (t.clone(), m.clone()))
                .collect(),
            wills: self
                .wills
                .iter()
                .map(|(c, (w, at))| StoredWill {
                    client_id: c.clone(),
                    will: w.clone(),
                    publish_at_unix_ms: *at,
                })
                .collect(),
            dedup: {
                let mut dedup: Vec<DedupRecord> = self
                    .dedup
                    .iter()
                    .map(|((topic, key), at)| DedupRecord {
                        topic: topic.clone(),
                        key: key.clone(),
                        expires_at_unix_ms: *at,
                    })
                    .collect();
                dedup.sort_by(|a, b| {
                    (a.expires_at_unix_ms, &a.topic, &a.key).cmp(&(
                        b.expires_at_unix_ms,
                        &b.topic,
                        &b.key,
                    ))
                });
                dedup
            },
            stream_seqs: self.stream_seqs.clone(),
        }
    }

    /// Calls `f` with ops that rebuild this state from empty (bodies before the entries that
    /// reference them). This is what a snapshot file holds.
    pub(super) fn for_each_op(&self, mut f: impl FnMut(&Op)) {
        for s in self.sessions.values() {
            let client_id = &s.meta.client_id;
            f(&Op::PutSession(s.meta.clone()));
            for (filter, subscription) in &s.subscriptions {
                f(&Op::PutSubscription {
                    client_id: client_id.clone(),
                    filter: filter.clone(),
                    subscription: *subscription,
                });
            }
            for packet_id in &s.inbound {
                f(&Op::PutInboundQos2 {
                    client_id: client_id.clone(),
                    packet_id: *packet_id,
                });
            }
        }
        for (id, slot) in &self.messages {
            f(&Op::PutMessage {
                id: *id,
                message: slot.message.clone(),
            });
        }
        for (id, stream_seq) in &self.stream_seqs {
            f(&Op::SequenceMessage {
                id: *id,
                stream_seq: *stream_seq,
            });
        }
        for s in self.sessions.values() {
            for (seq, entry) in &s.queue {
                f(&Op::Enqueue {
                    client_id: s.meta.client_id.clone(),
                    seq: *seq,
                    entry: entry.clone(),
                });
                // The Enqueue record has no count: sent more than the stage implies.
                if entry.deliveries > 1 {
                    f(&Op::CountDelivery {
                        client_id: s.meta.client_id.clone(),
                        seq: *seq,
                        deliveries: entry.deliveries,
                    });
                }
            }
        }
        for (topic, message) in &self.retained {
            f(&Op::PutRetained {
                topic: topic.clone(),
                message: message.clone(),
            });
        }
        for (client_id, (will, at)) in &self.wills {
            f(&Op::PutWill {
                client_id: client_id.clone(),
                will: will.clone(),
                publish_at_unix_ms: *at,
            });
        }
        for ((topic, key), at) in &self.dedup {
            f(&Op::PutDedup {
                topic: topic.clone(),
                key: key.clone(),
                expires_at_unix_ms: *at,
            });
        }
    }
}
