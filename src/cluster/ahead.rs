//! Deliveries a session here holds already, ahead of this node's consumer.
//!
//! A session's QoS 2 delivery in flight on its old node (sent, no PUBREC) is sent again on
//! its new node under the same packet id with DUP (MQTT-4.4.0-1): met by the replay, or
//! fetched from the stream by its sequence ([`super::sessions`]). The new node's consumer
//! may still route that message to the session, live, under a new packet id, and the client
//! would take it twice (MQTT-4.3.3): when it has not reached the message yet (it lags), and
//! when JetStream offers it again (a redelivery after a refusal here, a lost
//! acknowledgement, a restart). So the restore notes the sequence with the session here,
//! under the consumer's gate, and the consumer leaves the session out whenever it routes
//! that sequence. An entry goes once the consumer's acknowledgement floor passes it
//! (JetStream never offers it again), or when the message is gone from the stream or the
//! restore that noted it failed.
//!
//! The same holds after a restart of this node for what its own store brought back: a
//! message the consumer routed and committed here, whose JetStream acknowledgement a crash
//! kept from leaving, is offered again after `ack_wait`, and the sessions holding it must
//! not queue it a second time. The consumer notes those above its acknowledgement floor
//! before it routes anything. And while this process runs, an acknowledgement lost with a
//! dropped connection to NATS has the same effect on every session the message reached,
//! connected ones too: the consumer keeps the sequences it routed and committed until the
//! floor passes them, and acknowledges one offered again without routing it.
//!
//! Must not: outlive the ack floor (pruned on the 2 s lag tick; forgotten when the message is gone
//! or the restore fails).

use std::collections::{BTreeMap, BTreeSet};

use smallvec::SmallVec;

use crate::broker::SessionId;

/// Stream sequence → the sessions that must not get it from the consumer's routing.
#[derive(Debug, Default)]
pub(super) struct ResentAhead {
    entries: parking_lot::Mutex<BTreeMap<u64, SmallVec<[SessionId; 1]>>>,
    /// Sequences this process's consumer routed and committed, until the acknowledgement
    /// floor passes them: one whose acknowledgement was lost (the connection to NATS dropped
    /// with it unsent) is offered again and acknowledged again, not routed a second time.
    committed: parking_lot::Mutex<BTreeSet<u64>>,
}

impl ResentAhead {
    /// `session` was (or is about to be) sent the message of stream sequence `seq` again
    /// under its old packet id: the consumer must not route it there too.
    pub(super) fn note(&self, seq: u64, session: SessionId) {
        let mut entries = self.entries.lock();
        let sessions = entries.entry(seq).or_default();
        if !sessions.contains(&session) {
            sessions.push(session);
        }
    }

    /// The sessions the consumer leaves out when it routes `seq` (almost always none).
    pub(super) fn skipped_at(&self, seq: u64) -> SmallVec<[SessionId; 1]> {
        let entries = self.entries.lock();
        if entries.is_empty() {
            return SmallVec::new();
        }
        entries.get(&seq).cloned().unwrap_or_default()
    }

    /// The consumer routed `seq` here and its commit is durable: about to be acknowledged.
    pub(super) fn committed(&self, seq: u64) {
        self.committed.lock().insert(seq);
    }

    /// Whether `seq`, offered again, was routed and committed here already.
    pub(super) fn was_committed(&self, seq: u64) -> bool {
        self.committed.lock().contains(&seq)
    }

    /// The node consumer's acknowledgement floor is `ack_floor`: every sequence up to it is
    /// acknowledged and never offered again, so no routing of it is left to skip.
    pub(super) fn acknowledged_to(&self, ack_floor: u64) {
        let above = ack_floor.saturating_add(1);
        let mut entries = self.entries.lock();
        if !entries.is_empty() {
            *entries = entries.split_off(&above);
        }
        drop(entries);
        let mut committed = self.committed.lock();
        if !committed.is_empty() {
            *committed = committed.split_off(&above);
        }
    }

    /// `seq` will not reach `session` from the consumer after all (the message is gone from
    /// the stream, or the restore that noted it failed).
    pub(super) fn forget(&self, seq: u64, session: SessionId) {
        let mut entries = self.entries.lock();
        if let Some(sessions) = entries.get_mut(&seq) {
            sessions.retain(|s| *s != session);
            if sessions.is_empty() {
                entries.remove(&seq);
            }
        }
    }

    /// How many sequences are noted (for tests and the log).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_sequence_skips_its_sessions_until_acknowledged() {
        let ahead = ResentAhead::default();
        assert!(ahead.skipped_at(7).is_empty());
        ahead.note(7, 1);
        ahead.note(7, 2);
        ahead.note(7, 1);
        ahead.note(9, 1);
        assert_eq!(ahead.skipped_at(7).as_slice(), &[1, 2]);
        assert!(ahead.skipped_at(8).is_empty());
        ahead.acknowledged_to(6);
        assert_eq!(ahead.skipped_at(7).as_slice(), &[1, 2], "offered again");
        ahead.acknowledged_to(8);
        assert!(ahead.skipped_at(7).is_empty());
        assert_eq!(ahead.skipped_at(9).as_slice(), &[1]);
        ahead.acknowledged_to(u64::MAX);
        assert_eq!(ahead.len(), 0);
    }

    #[test]
    fn a_committed_sequence_is_known_until_acknowledged() {
        let ahead = ResentAhead::default();
        ahead.committed(5);
        ahead.committed(8);
        assert!(ahead.was_committed(5) && ahead.was_committed(8));
        assert!(!ahead.was_committed(6));
        ahead.acknowledged_to(5);
        assert!(!ahead.was_committed(5), "never offered again");
        assert!(ahead.was_committed(8));
    }

    #[test]
    fn a_forgotten_session_is_routed_to_again() {
        let ahead = ResentAhead::default();
        ahead.note(9, 1);
        ahead.note(9, 2);
        ahead.forget(9, 1);
        assert_eq!(ahead.skipped_at(9).as_slice(), &[2]);
        ahead.forget(9, 2);
        assert_eq!(ahead.len(), 0);
    }
}
