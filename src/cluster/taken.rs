//! QoS 2 messages a local session's client has taken ahead of the session's replay cursor.
//!
//! A moved session is rebuilt by replaying the stream from its record's cursor, the lowest
//! sequence among what it had not had acknowledged ([`super::sessions`]). The client may
//! hold messages above the cursor already: this node's own messages reach local sessions at
//! once, while other nodes' come through the consumer later, so a session here can take a
//! message published here (sequence 97) while one from elsewhere (sequence 90) still waits
//! in its queue. Replayed from 90, the new owner would send 97 again under a new packet id,
//! and the client takes it twice (MQTT-4.3.3: exactly once). So each QoS 2 message a local
//! session's client acknowledged with PUBREC is noted here, its sequence goes into the
//! session's record (`taken`, `tk` in its JSON) while it is at or above the cursor, and the next owner leaves
//! those sequences out of the replay and of its consumer's routing.
//!
//! A message published here may be taken before JetStream gave it its sequence: it is kept
//! until the sequence comes (or the send failed: then no replay can find it), and the
//! record's writes that must cover it (the PUBREL's barrier, a hand-over) wait for it.
//!
//! Must not: keep a sequence below the recorded cursor; grow past 4096 per session.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::broker::Message;

/// Most sequences kept per session. Above the cursor they only pile up while an older
/// message stays unacknowledged (a QoS 1 one the client never answers) as QoS 2 ones keep
/// flowing; past this bound the oldest go (each then at worst sent twice after a move).
const MOST_PER_SESSION: usize = 4096;

/// The taken messages of each local session, by client id.
#[derive(Debug, Default)]
pub(super) struct TakenLog {
    sessions: parking_lot::Mutex<HashMap<String, Taken>>,
}

/// One session's taken messages.
#[derive(Debug, Default)]
struct Taken {
    /// Their stream sequences.
    seqs: BTreeSet<u64>,
    /// Taken before their sequence came back from JetStream.
    awaiting: Vec<Arc<Message>>,
}

impl Taken {
    /// Moves the messages whose sequence came into `seqs`; drops those whose send failed.
    fn settle(&mut self) {
        let seqs = &mut self.seqs;
        self.awaiting.retain(|message| {
            if let Some(seq) = message.cluster_seq() {
                seqs.insert(seq);
                return false;
            }
            message.awaits_cluster_seq()
        });
    }

    fn bound(&mut self) {
        while self.seqs.len() > MOST_PER_SESSION {
            if self.seqs.pop_first().is_none() {
                break;
            }
        }
    }
}

/// What a record lists of a session's taken messages ([`TakenLog::above`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Listed {
    /// The sequences at or above the cursor, ascending.
    pub(super) seqs: Vec<u64>,
    /// A taken message's sequence is still to come: a record written now does not list it.
    pub(super) awaiting: bool,
}

impl TakenLog {
    /// The client of `client_id` acknowledged `message` with PUBREC. Nothing is kept for a
    /// message the stream does not hold (published before the cluster, or whose send failed).
    pub(super) fn note(&self, client_id: &str, message: &Arc<Message>) {
        let seq = message.cluster_seq();
        if seq.is_none() && !message.awaits_cluster_seq() {
            return;
        }
        let mut sessions = self.sessions.lock();
        let taken = sessions.entry(client_id.to_owned()).or_default();
        match seq {
            Some(seq) => {
                taken.seqs.insert(seq);
            }
            None => taken.awaiting.push(Arc::clone(message)),
        }
        taken.bound();
    }

    /// A session restored here from a record listing `seqs`: they stay taken, for the
    /// session's next move.
    pub(super) fn seed(&self, client_id: &str, seqs: &[u64]) {
        if seqs.is_empty() {
            return;
        }
        let mut sessions = self.sessions.lock();
        let taken = sessions.entry(client_id.to_owned()).or_default();
        taken.seqs.extend(seqs.iter().copied());
        taken.bound();
    }

    /// The taken messages of `client_id` a record with `cursor` must list; those below it
    /// are forgotten (the replay starts at the cursor, and it does not go back: what a
    /// session receives later has a higher sequence than what it was routed before).
    pub(super) fn above(&self, client_id: &str, cursor: u64) -> Listed {
        let mut sessions = self.sessions.lock();
        let Some(taken) = sessions.get_mut(client_id) else {
            return Listed::default();
        };
        taken.settle();
        taken.seqs = taken.seqs.split_off(&cursor);
        let listed = Listed {
            seqs: taken.seqs.iter().copied().collect(),
            awaiting: !taken.awaiting.is_empty(),
        };
        if taken.seqs.is_empty() && taken.awaiting.is_empty() {
            sessions.remove(client_id);
        }
        listed
    }

    /// Whether a message `client_id` took still waits for its sequence.
    pub(super) fn awaiting(&self, client_id: &str) -> bool {
        let mut sessions = self.sessions.lock();
        sessions.get_mut(client_id).is_some_and(|taken| {
            taken.settle();
            !taken.awaiting.is_empty()
        })
    }

    /// The session of `client_id` is no longer held here (moved, ended, or started clean).
    pub(super) fn forget(&self, client_id: &str) {
        self.sessions.lock().remove(client_id);
    }

    /// Keeps only the sessions `held` says are still held here.
    pub(super) fn retain(&self, held: impl Fn(&str) -> bool) {
        let mut sessions = self.sessions.lock();
        if !sessions.is_empty() {
            sessions.retain(|client_id, _| held(client_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Publish, QoS};

    fn message() -> Arc<Message> {
        Arc::new(Message::from_publish(
            Publish {
                qos: QoS::ExactlyOnce,
                topic: "t".into(),
                packet_id: 1,
                ..Default::default()
            },
            None,
        ))
    }

    #[test]
    fn sequences_at_or_above_the_cursor_are_listed_and_the_rest_forgotten() {
        let log = TakenLog::default();
        for seq in [5, 9, 12] {
            let m = message();
            m.set_cluster_seq(seq);
            log.note("c", &m);
        }
        assert_eq!(log.above("c", 9).seqs, vec![9, 12]);
        // 5 is gone for good: a lower cursor later does not bring it back.
        assert_eq!(log.above("c", 0).seqs, vec![9, 12]);
        assert_eq!(log.above("other", 0), Listed::default());
    }

    #[test]
    fn a_message_taken_before_its_sequence_is_listed_once_it_comes() {
        let log = TakenLog::default();
        let m = message();
        m.await_cluster_seq();
        log.note("c", &m);
        assert!(log.awaiting("c"));
        let listed = log.above("c", 1);
        assert!(listed.awaiting && listed.seqs.is_empty());
        m.set_cluster_seq(40);
        assert!(!log.awaiting("c"));
        assert_eq!(log.above("c", 1).seqs, vec![40]);
        // A send that failed: nothing to list, nothing to wait for.
        let failed = message();
        failed.await_cluster_seq();
        log.note("c", &failed);
        failed.set_cluster_seq(0);
        assert!(!log.awaiting("c"));
        // Never in the stream: not noted at all.
        log.note("d", &message());
        assert_eq!(log.above("d", 0), Listed::default());
    }

    #[test]
    fn a_session_keeps_a_bounded_number() {
        let log = TakenLog::default();
        let seqs: Vec<u64> = (1..=(MOST_PER_SESSION as u64 + 10)).collect();
        log.seed("c", &seqs);
        let listed = log.above("c", 0).seqs;
        assert_eq!(listed.len(), MOST_PER_SESSION);
        assert_eq!(listed.first(), Some(&11), "the oldest go first");
        log.forget("c");
        assert!(log.above("c", 0).seqs.is_empty());
    }

    #[test]
    fn sessions_no_longer_held_are_dropped() {
        let log = TakenLog::default();
        log.seed("a", &[3]);
        log.seed("b", &[4]);
        log.retain(|id| id == "b");
        assert!(log.above("a", 0).seqs.is_empty());
        assert_eq!(log.above("b", 0).seqs, vec![4]);
    }
}
