//! Claims: a CONNECT makes this node the session's owner by compare-and-set on its
//! record, waits for the previous owner's hand-over, and after it attached checks no later
//! claim beat it ([`confirm`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;

use super::handover::{kept_cursor, release};
use super::record::{encode_will, Who};
use super::*;
use crate::broker::owner::{self, OwnerCheck};
use crate::broker::{Broker, ClaimRefused, ClaimRequest, Claimed, Restore};
use crate::cluster::{subject, Cluster};

/// Claims `client_id` for this node (see the module's doc).
pub(in crate::cluster) async fn claim(
    cluster: &Cluster,
    broker: &Arc<Broker>,
    ClaimRequest {
        client_id,
        clean_start,
        expiry_interval,
        will,
        owner,
    }: ClaimRequest<'_>,
) -> Result<Claimed, ClaimRefused> {
    let anonymous = matches!(owner, crate::storage::SessionOwner::Anonymous);
    let will = will
        .filter(|w| !anonymous || w.held_bytes() <= ANONYMOUS_RECORD_WILL)
        .and_then(|w| {
            let delay = w.properties.will_delay_interval.unwrap_or(0);
            encode_will(&cluster.node, w).map(|frame| (frame, delay))
        });
    let Some(bucket) = cluster.sessions.bucket.get() else {
        return Err(ClaimRefused::Unavailable(
            "NATS has not been reached yet".to_owned(),
        ));
    };
    if !cluster.is_up() {
        return Err(ClaimRefused::Unavailable("NATS is unreachable".to_owned()));
    }
    let key = subject::key(client_id);
    let mut attempts = 0;
    let (previous, revision, mine) = loop {
        attempts += 1;
        let entry = bucket
            .entry(key.as_str())
            .await
            .map_err(|e| ClaimRefused::Unavailable(e.to_string()))?;
        let (previous, last) = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                (Record::decode(&entry.value), Some(entry.revision))
            }
            Some(entry) => (None, Some(entry.revision)),
            None => (None, None),
        };
        // Whose it is (issue 35): another identity never resumes it nor closes its owner's
        // connection; it is refused, or starts clean, as `auth.session_binding` says.
        let verdict = previous.as_ref().map_or(OwnerCheck::Resume, |p| {
            owner::check(
                &p.who.owner(),
                p.ended_at == 0,
                owner,
                client_id,
                broker.session_binding(),
            )
        });
        if verdict == OwnerCheck::Refuse {
            return Err(ClaimRefused::NotOwner);
        }
        let clean_start = clean_start || verdict == OwnerCheck::Fresh;
        let mut mine = Record {
            owner: cluster.node.clone(),
            life: cluster.sessions.life,
            expiry: expiry_interval,
            will: will.as_ref().map(|(frame, _)| frame.clone()),
            will_delay: will.as_ref().map_or(0, |(_, delay)| *delay),
            fresh: clean_start,
            who: Who::of(owner),
            ..Record::default()
        };
        if let Some(previous) = &previous {
            // Whose it was: the one node that may hand it over.
            mine.claimed_from.clone_from(&previous.owner);
            mine.claimed_from_life = previous.life;
        }
        // A new session wants what is published from now on.
        mine.cursor = cluster.node_floor();
        if let Some(previous) = previous.as_ref().filter(|p| !clean_start && p.expiry > 0) {
            // Until the previous owner hands over, its last record stands in.
            mine.subscriptions.clone_from(&previous.subscriptions);
            mine.cursor = previous.cursor;
            mine.qos2.clone_from(&previous.qos2);
            mine.taken.clone_from(&previous.taken);
        }
        let written = match last {
            Some(last) => bucket
                .update(key.as_str(), mine.encode(), last)
                .await
                .map_err(|e| {
                    (
                        e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                        e.to_string(),
                    )
                }),
            None => bucket
                .create(key.as_str(), mine.encode())
                .await
                .map_err(|e| {
                    (
                        e.kind() == kv::CreateErrorKind::AlreadyExists,
                        e.to_string(),
                    )
                }),
        };
        match written {
            Ok(revision) => break (previous, revision, mine),
            Err((true, _)) if attempts < CAS_ATTEMPTS => {} // lost a race: read again
            Err((_, error)) => return Err(ClaimRefused::Unavailable(error)),
        }
    };
    // Clean Start, or another identity's session started over (`session_binding`).
    let clean_start = mine.fresh;
    if clean_start || previous.as_ref().is_none_or(|p| p.owner != cluster.node) {
        // What a session held here before took is not this session's (or it is in the
        // record now).
        cluster.sessions.taken.forget(client_id);
    }
    cluster
        .sessions
        .owned
        .lock()
        .insert(client_id.to_owned(), (revision, mine.clone()));
    cluster
        .sessions
        .unattached
        .lock()
        .insert(client_id.to_owned());
    cluster.sessions.adopted.lock().remove(client_id);
    {
        let mut wills = cluster.sessions.wills.lock();
        match will {
            Some(will) => wills.insert(client_id.to_owned(), will),
            None => wills.remove(client_id),
        };
    }
    let Some(previous) = previous else {
        // No record: the session ended cluster-wide (expired, or cleaned elsewhere), so a
        // copy this node kept from an earlier run is stale.
        drop(broker.release_to_cluster(client_id));
        return Ok(Claimed {
            restore: None,
            revision,
        });
    };
    if previous.owner == cluster.node {
        // What it took above its cursor, as this node's earlier run recorded it (a restart
        // forgot it).
        cluster.sessions.taken.seed(client_id, &previous.taken);
        // Ours already: the local session (if any) is the session.
        let restore = (!clean_start && previous.expiry > 0 && !broker.has_session(client_id))
            .then(|| previous.restore());
        return Ok(claimed(cluster, client_id, restore, revision));
    }
    // Another node's: whatever this node still holds of it is stale.
    if broker.release_to_cluster(client_id).is_some() {
        tracing::debug!(
            client = client_id,
            "cluster: dropped a stale local copy of a session another node owned"
        );
    }
    if clean_start || previous.expiry == 0 {
        return Ok(Claimed {
            restore: None,
            revision,
        });
    }
    // A dead node cannot hand over, nor can one that only adopted it from a dead node: the
    // last record stands in at once.
    let handed = if !previous.adopted && cluster.liveness.may_be_alive(&previous.owner) {
        wait_for_handover(bucket, &key, revision).await
    } else {
        None
    };
    let record = match handed {
        Some((revision, record)) => {
            cluster
                .sessions
                .owned
                .lock()
                .insert(client_id.to_owned(), (revision, record.clone()));
            record
        }
        None => {
            tracing::info!(client = client_id, previous = %previous.owner, "cluster: no hand-over from the session's previous node; resuming from its last record");
            mine
        }
    };
    Ok(claimed(
        cluster,
        client_id,
        Some(record.restore()),
        revision,
    ))
}

/// A claim's answer; a session to restore is marked as being restored until [`restore`]
/// ends (the caller always calls it when there is one).
fn claimed(cluster: &Cluster, client_id: &str, restore: Option<Restore>, revision: u64) -> Claimed {
    if let Some(restore) = &restore {
        let held = cluster
            .sessions
            .owned
            .lock()
            .get(client_id)
            .map_or(revision, |(r, _)| *r);
        cluster.sessions.restoring.lock().insert(
            client_id.to_owned(),
            Restoring {
                cursor: restore.cursor,
                revision: held,
                qos2: restore.qos2.clone(),
                qos2_shared: restore.qos2_shared.clone(),
                taken: restore.taken.clone(),
            },
        );
    }
    Claimed { restore, revision }
}

/// Polls the record until the previous owner has written its hand-over over our claim
/// (bounded by [`HANDOVER_WAIT`]).
async fn wait_for_handover(bucket: &kv::Store, key: &str, claimed: u64) -> Option<(u64, Record)> {
    let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(entry)) = bucket.entry(key).await {
            if entry.revision > claimed && entry.operation == kv::Operation::Put {
                match Record::decode(&entry.value) {
                    Some(record) if record.handed => return Some((entry.revision, record)),
                    _ => return None, // someone else claimed it since
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// After a CONNECT claimed and attached its session: if another node claimed the client id
/// after this node did (seen by the watch meanwhile), this node lost the race: the session is
/// given up here at once (its connection gets DISCONNECT 0x8E) and handed over.
pub(in crate::cluster) fn confirm(
    cluster: &Cluster,
    broker: &Arc<Broker>,
    client_id: &str,
    mine: u64,
) {
    // Attached: from now on, no local session means it ended here.
    cluster.sessions.unattached.lock().remove(client_id);
    let later = {
        let claimed = cluster.sessions.claimed_elsewhere.lock();
        claimed
            .get(client_id)
            .filter(|(revision, _, _)| *revision > mine)
            .map(|(revision, claim, _)| (*revision, claim.clone()))
    };
    let Some((revision, claim)) = later else {
        return;
    };
    let written = cluster
        .sessions
        .owned
        .lock()
        .remove(client_id)
        .map(|(_, r)| r.cursor);
    let Some((view, cursor, jobs)) = release(cluster, broker, client_id) else {
        return;
    };
    let cursor = kept_cursor(&view, cursor, written);
    tracing::info!(client = client_id, to = %claim.owner, "cluster: session claimed by another node while connecting here");
    let Some(bucket) = cluster.sessions.bucket.get().cloned() else {
        return;
    };
    let mut handed = Record::from_view(&claim.owner, claim.life, &view, cursor, None, None);
    handed.taken = cluster.sessions.taken.above(client_id, cursor).seqs;
    cluster.sessions.taken.forget(client_id);
    handed.handed = true;
    handed.expiry = claim.expiry;
    handed.will = claim.will;
    handed.will_delay = claim.will_delay;
    let key = subject::key(client_id);
    tokio::spawn(async move {
        if bucket
            .update(key.as_str(), handed.encode(), revision)
            .await
            .is_err()
        {
            jobs.not_written();
        }
    });
}
