//! Writes to a client that wait for its session's record (`pb_sessions`): a SUBACK or
//! UNSUBACK (the subscription the client was told of), a QoS 2 PUBLISH (its packet id and
//! stream sequence) and a PUBREL (after which the client forgets the packet id). The record
//! is what the next owner resumes from when this node dies (`kill -9`, a machine lost):
//! written up to [`super::sessions::RECORD_INTERVAL`] late, it could give back a
//! subscription the client was told it had, or send a QoS 2 message the client completed
//! again as a new one. So each such write carries a [`Durable`] that
//! [`super::sessions::keep_records`] completes once a record holding the session's state as
//! of that write is in the bucket (as a PUBACK waits for JetStream): a promise kept.
//!
//! Must not: let a crash of this node give back a subscription a SUBACK confirmed, or a QoS 2
//! message the client completed as a new one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::storage::{Durable, StorageError};

/// Longest a barrier waits for a QoS 2 delivery's stream sequence (JetStream's
/// acknowledgement of this node's own message, bounded by `publish_timeout` ≤ 60 s): past
/// it the record is taken as it is rather than stall the connection.
const SEQUENCE_WAIT: Duration = Duration::from_secs(65);

/// One waiting write: when it started waiting, and its completion.
type Waiter = (Instant, oneshot::Sender<Result<(), StorageError>>);

/// The waiting writes per client id.
#[derive(Debug, Default)]
pub(super) struct Barriers {
    waiting: parking_lot::Mutex<HashMap<String, Vec<Waiter>>>,
}

/// What a pass of the records decided for one session's barriers.
#[derive(Debug, Clone, Copy)]
pub(super) enum Verdict {
    /// The record in the bucket holds the state they wait for.
    Written,
    /// Not yet (a write failed, a replay is under way, a sequence is still to come): the
    /// next pass decides.
    Later { awaiting_sequence: bool },
    /// The record will not hold it: the session is no longer this node's.
    Lost(&'static str),
}

impl Barriers {
    /// A new barrier for `client_id`.
    pub(super) fn add(&self, client_id: &str) -> Durable {
        let (tx, durable) = Durable::pending();
        self.waiting
            .lock()
            .entry(client_id.to_owned())
            .or_default()
            .push((Instant::now(), tx));
        durable
    }

    /// Every barrier waiting now (a pass of the records then takes its views).
    pub(super) fn take(&self) -> HashMap<String, Vec<Waiter>> {
        std::mem::take(&mut *self.waiting.lock())
    }

    /// Whether any barrier waits.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.lock().is_empty()
    }

    /// Settles the barriers of `client_id` taken by a pass; true when some wait on.
    pub(super) fn settle(&self, client_id: String, waiters: Vec<Waiter>, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Written => {
                for (_, tx) in waiters {
                    let _ = tx.send(Ok(()));
                }
                false
            }
            Verdict::Lost(why) => {
                for (_, tx) in waiters {
                    let _ = tx.send(Err(StorageError::Cluster(why.to_owned())));
                }
                false
            }
            Verdict::Later { awaiting_sequence } => {
                let (done, wait): (Vec<_>, Vec<_>) = waiters
                    .into_iter()
                    .partition(|(at, _)| awaiting_sequence && at.elapsed() >= SEQUENCE_WAIT);
                for (_, tx) in done {
                    // A sequence that never came: the message is not in the stream, so no
                    // replay can send it again.
                    let _ = tx.send(Ok(()));
                }
                if wait.is_empty() {
                    return false;
                }
                self.waiting
                    .lock()
                    .entry(client_id)
                    .or_default()
                    .extend(wait);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_barrier_completes_when_written_and_fails_when_lost() {
        let barriers = Barriers::default();
        let written = barriers.add("a");
        let lost = barriers.add("b");
        let later = barriers.add("c");
        let taken = barriers.take();
        assert!(barriers.is_empty());
        for (client_id, waiters) in taken {
            let verdict = match client_id.as_str() {
                "a" => Verdict::Written,
                "b" => Verdict::Lost("taken over"),
                _ => Verdict::Later {
                    awaiting_sequence: true,
                },
            };
            let waits = barriers.settle(client_id.clone(), waiters, verdict);
            assert_eq!(waits, client_id == "c");
        }
        assert!(written.await.is_ok());
        assert!(matches!(lost.await, Err(StorageError::Cluster(_))));
        // Still waiting: taken again by the next pass.
        let again = barriers.take();
        assert_eq!(again.keys().collect::<Vec<_>>(), ["c"]);
        for (client_id, waiters) in again {
            barriers.settle(client_id, waiters, Verdict::Written);
        }
        assert!(later.await.is_ok());
    }
}
