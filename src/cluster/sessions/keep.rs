//! Records kept current: local sessions' records rewritten when they changed (and at once
//! for a client waiting on a barrier), records of sessions that ended here deleted.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::kv;

use super::handover::{cursor_of, kept_cursor};
use super::*;
use crate::broker::{Broker, HeldSession};
use crate::cluster::{subject, Cluster};

/// Keeps the records of local sessions current, and deletes those of sessions that ended.
pub(in crate::cluster) async fn keep_records(cluster: Arc<Cluster>, broker: Weak<Broker>) {
    let mut tick = tokio::time::interval(RECORD_INTERVAL);
    // Barriers wait on (a sequence still to come, a write to retry): soon another pass.
    let mut retry = false;
    loop {
        let full = tokio::select! {
            _ = tick.tick() => true,
            () = cluster.sessions.wake.notified() => false,
            () = tokio::time::sleep(BARRIER_RETRY), if retry => false,
        };
        let Some(broker) = broker.upgrade() else {
            return;
        };
        let Some(bucket) = cluster.sessions.bucket.get() else {
            continue;
        };
        if !cluster.is_up() {
            continue;
        }
        // The barriers before the views: each was added after the change it waits for, so
        // the views taken below hold it.
        let barriers = cluster.sessions.barriers.take();
        let mut dirty = std::mem::take(&mut *cluster.sessions.dirty.lock());
        dirty.extend(barriers.keys().cloned());
        // A full pass every period; otherwise only the changed ones (no pass over every
        // session per SUBSCRIBE or disconnect).
        let views: Vec<HeldSession> = if full {
            broker.held_sessions()
        } else {
            dirty
                .iter()
                .filter_map(|client_id| broker.held_session(client_id))
                .collect()
        };
        drop(broker);
        if full {
            let held: std::collections::HashSet<&str> = views
                .iter()
                .filter(|v| v.expiry_interval > 0)
                .map(|v| &*v.client_id)
                .collect();
            cluster
                .sessions
                .taken
                .retain(|client_id| held.contains(client_id));
        }
        let writes = changed_records(&cluster, &views);
        // Records of sessions that ended here (a clean session's at its disconnect: its
        // will must not outlive it in the record).
        let mut deletes = Vec::new();
        {
            let owned = cluster.sessions.owned.lock();
            // Claimed and not attached yet (waiting for a hand-over, or being replayed
            // before it is in the sessions map): its record is the session, not a leftover.
            let unattached = cluster.sessions.unattached.lock();
            let live: HashMap<&str, &HeldSession> =
                views.iter().map(|v| (&*v.client_id, v)).collect();
            let mut ended = |client_id: &String, revision: u64| {
                if !live.contains_key(client_id.as_str()) && !unattached.contains(client_id) {
                    deletes.push((client_id.clone(), revision));
                }
            };
            if full {
                for (client_id, (revision, _)) in owned.iter() {
                    ended(client_id, *revision);
                }
            } else {
                for client_id in &dirty {
                    if let Some((revision, _)) = owned.get(client_id) {
                        ended(client_id, *revision);
                    }
                }
            }
        }
        let failed = write(&cluster, bucket, writes).await;
        retry = false;
        for (client_id, waiters) in barriers {
            let view = views.iter().find(|v| *v.client_id == *client_id);
            let verdict = barrier_verdict(&cluster, view, failed.contains(&client_id), &client_id);
            retry |= cluster
                .sessions
                .barriers
                .settle(client_id, waiters, verdict);
        }
        for (client_id, revision) in deletes {
            // A session that connected again meanwhile has a newer revision: kept.
            let gone = {
                let mut owned = cluster.sessions.owned.lock();
                let gone = owned.get(&client_id).map(|(r, _)| *r) == Some(revision);
                if gone {
                    owned.remove(&client_id);
                }
                gone
            };
            if !gone {
                continue;
            }
            cluster.sessions.wills.lock().remove(&client_id);
            let key = subject::key(&client_id);
            let _ = bucket
                .delete_expect_revision(key.as_str(), Some(revision))
                .await;
        }
    }
}

/// How long barriers that wait on are left before the next pass.
const BARRIER_RETRY: Duration = Duration::from_millis(5);

/// Whether the pass that took `view` (after a barrier of `client_id` was added) wrote what
/// it waits for; `failed`: its record's write failed in that pass.
fn barrier_verdict(
    cluster: &Cluster,
    view: Option<&HeldSession>,
    failed: bool,
    client_id: &str,
) -> crate::cluster::barriers::Verdict {
    use crate::cluster::barriers::Verdict;
    let Some(view) = view else {
        return Verdict::Lost("the session is no longer held here");
    };
    if view.expiry_interval == 0 {
        return Verdict::Written; // it ends with its connection: no record to keep
    }
    if cluster.sessions.restoring.lock().contains_key(client_id) {
        return Verdict::Later {
            awaiting_sequence: false,
        };
    }
    if !cluster.sessions.owned.lock().contains_key(client_id) {
        return Verdict::Lost("the session was taken over by another node");
    }
    if failed {
        return Verdict::Later {
            awaiting_sequence: false,
        };
    }
    if view.unsequenced_qos2 || cluster.sessions.taken.awaiting(client_id) {
        return Verdict::Later {
            awaiting_sequence: true,
        };
    }
    Verdict::Written
}

/// The records of `views` (persistent sessions owned here) that differ from what was last
/// written: client id, revision to replace, new record.
fn changed_records(cluster: &Cluster, views: &[HeldSession]) -> Vec<(String, u64, Record)> {
    let wills = cluster.sessions.wills.lock();
    let owned = cluster.sessions.owned.lock();
    let restoring = cluster.sessions.restoring.lock();
    views
        .iter()
        .filter(|v| v.expiry_interval > 0 && !restoring.contains_key(&*v.client_id))
        .filter_map(|view| {
            let written = owned.get(&*view.client_id).map(|(_, r)| r);
            let cursor = kept_cursor(view, cursor_of(cluster, view), written.map(|w| w.cursor));
            let mut record = Record::from_view(
                &cluster.node,
                cluster.sessions.life,
                view,
                cursor,
                wills.get(&*view.client_id),
                written,
            );
            record.taken = cluster.sessions.taken.above(&view.client_id, cursor).seqs;
            match owned.get(&*view.client_id) {
                Some((revision, written)) if *written != record => {
                    Some((view.client_id.to_string(), *revision, record))
                }
                _ => None,
            }
        })
        .collect()
}

/// Writes records by compare-and-set; one that lost (claimed elsewhere since) is left to the
/// watch. Returns the client ids whose record was not written.
async fn write(
    cluster: &Cluster,
    bucket: &kv::Store,
    writes: Vec<(String, u64, Record)>,
) -> std::collections::HashSet<String> {
    let mut failed = std::collections::HashSet::new();
    for (client_id, revision, record) in writes {
        let key = subject::key(&client_id);
        let mut expected = revision;
        let mut written = false;
        for _ in 0..2 {
            match bucket.update(key.as_str(), record.encode(), expected).await {
                Ok(revision) => {
                    cluster
                        .sessions
                        .owned
                        .lock()
                        .insert(client_id.clone(), (revision, record.clone()));
                    written = true;
                    break;
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // A hand-over written after its claim stopped waiting for it still
                    // names this node (and run) as the owner: write over it.
                    let current = bucket.entry(key.as_str()).await.ok().flatten();
                    let ours = current.as_ref().and_then(|entry| {
                        (entry.operation == kv::Operation::Put)
                            .then(|| Record::decode(&entry.value))
                            .flatten()
                            .filter(|r| r.owner == cluster.node && r.life == cluster.sessions.life)
                            .map(|_| entry.revision)
                    });
                    let still_mine = cluster
                        .sessions
                        .owned
                        .lock()
                        .get(&client_id)
                        .is_some_and(|(r, _)| *r == revision);
                    match ours {
                        Some(current) if still_mine => expected = current,
                        _ => break, // claimed elsewhere since: left to the watch
                    }
                }
                Err(_) => break,
            }
        }
        if !written {
            failed.insert(client_id);
        }
    }
    failed
}
