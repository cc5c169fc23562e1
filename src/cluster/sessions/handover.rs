//! Hand-overs: the node that loses a session to another node's claim gives it up and writes
//! what it held (subscriptions, cursor, QoS 2 in flight, what its client took) into the
//! claim; local copies the record says moved away are dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;

use super::*;
use crate::broker::{Broker, HeldSession, Message};
use crate::cluster::{subject, Cluster};

/// The cursor a session holding `view` may record now.
pub(super) fn cursor_of(cluster: &Cluster, view: &HeldSession) -> u64 {
    cursor_at(cluster.node_floor(), view)
}

/// The cursor to record for a session holding `view`: `computed`, unless it holds a message
/// of unknown stream sequence (brought back by this node's store at a restart without one,
/// [`HeldSession::unsequenced_pending`]; the store keeps sequences since issue 34, so that is
/// an older store's message, or one whose sequence a crash lost): then no further than
/// `written`, the cursor its record had, which still finds that message. Replaying more is at least once; passing it
/// would lose an acknowledged message.
pub(super) fn kept_cursor(view: &HeldSession, computed: u64, written: Option<u64>) -> u64 {
    match written.filter(|w| *w != 0) {
        Some(written) if view.unsequenced_pending => computed.min(written),
        _ => computed,
    }
}

/// The cursor of a session holding `view` with the node's floor at `floor`.
pub(super) fn cursor_at(floor: u64, view: &HeldSession) -> u64 {
    view.lowest_pending_seq.map_or(floor, |seq| seq.min(floor))
}

/// Gives up the local session of `client_id` ([`Broker::release_to_cluster_holding`]) and
/// reads the node's floor in the same step against the consumer's routing (the gate): a
/// message the consumer routes after the release never reaches the session, so the cursor
/// handed over must not pass it (read after the gate's release, the floor could). Returns
/// what the session held, the cursor it hands over, and its shared QoS 2 jobs in flight
/// ([`Handed`]).
pub(super) fn release(
    cluster: &Cluster,
    broker: &Broker,
    client_id: &str,
) -> Option<(HeldSession, u64, Handed)> {
    let _gate = cluster.gate.lock();
    let (view, jobs) = broker.release_to_cluster_holding(client_id)?;
    let cursor = cursor_at(cluster.node_floor(), &view);
    Some((view, cursor, Handed(jobs)))
}

/// A released session's shared QoS 2 jobs in flight, which its hand-over record lists for
/// the next owner to send again: settled with their groups (acknowledged, as the member
/// has them) when this is dropped, once the record is written; given back to their groups
/// if it could not be ([`Handed::not_written`]), so none is lost between the two.
pub(super) struct Handed(Vec<Arc<Message>>);

impl Handed {
    /// The record listing them was not written: the next owner may not know of them.
    pub(super) fn not_written(self) {
        for job in &self.0 {
            let _ = job.give_back();
        }
    }
}

/// Gives up this node's local copy of `client_id`, which `owner` holds: kept from an earlier
/// run of this node, it is not the session any more (no will, no hand-over, no trace in the
/// store).
fn drop_stale_copy(broker: &Broker, client_id: &str, owner: &str) {
    if broker.release_to_cluster(client_id).is_some() {
        tracing::info!(
            client = client_id,
            owner,
            "cluster: dropped a stale local copy of a session that moved to another node"
        );
    }
}

/// Drops the local copies of sessions that moved to another node while this node was down:
/// every local session this node has not claimed, adopted or restored in this run (those
/// its store brought back) whose record names another owner. Run once the watch of claims
/// is in place (so a claim after the read is handed over, not missed): a stale copy must
/// not collect messages, nor be taken for the session by anything that looks at this node.
/// A record naming this node's earlier run leaves the copy to the claims and the search for
/// orphans ([`crate::cluster::orphans`]); no record leaves it to the next CONNECT's claim.
async fn drop_moved_copies(cluster: Arc<Cluster>, broker: Weak<Broker>, bucket: kv::Store) {
    let candidates: Vec<String> = {
        let Some(broker) = broker.upgrade() else {
            return;
        };
        let views = broker.held_sessions();
        let owned = cluster.sessions.owned.lock();
        let adopted = cluster.sessions.adopted.lock();
        let restoring = cluster.sessions.restoring.lock();
        views
            .iter()
            .filter(|v| v.expiry_interval > 0)
            .map(|v| v.client_id.to_string())
            .filter(|id| {
                !owned.contains_key(id) && !adopted.contains_key(id) && !restoring.contains_key(id)
            })
            .collect()
    };
    for client_id in candidates {
        let key = subject::key(&client_id);
        let Ok(Some(entry)) = bucket.entry(key.as_str()).await else {
            continue;
        };
        if entry.operation != kv::Operation::Put {
            continue;
        }
        let Some(record) = Record::decode(&entry.value) else {
            continue;
        };
        if record.owner == cluster.node {
            continue;
        }
        let Some(broker) = broker.upgrade() else {
            return;
        };
        // Claimed here since the list was made: this node's now.
        if cluster.sessions.owned.lock().contains_key(&client_id) {
            continue;
        }
        drop_stale_copy(&broker, &client_id, &record.owner);
    }
}

/// Watches the bucket for claims of sessions this node holds, and hands them over.
pub(in crate::cluster) async fn watch_claims(cluster: Arc<Cluster>, broker: Weak<Broker>) {
    loop {
        let Some(bucket) = cluster.sessions.bucket.get() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut watch = match bucket.watch_all().await {
            Ok(watch) => watch,
            Err(error) => {
                tracing::warn!(%error, "cluster: cannot watch the session records; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tokio::spawn(drop_moved_copies(
            Arc::clone(&cluster),
            broker.clone(),
            bucket.clone(),
        ));
        while let Some(entry) = watch.next().await {
            let Ok(entry) = entry else {
                break;
            };
            if entry.operation != kv::Operation::Put {
                continue;
            }
            let Some(record) = Record::decode(&entry.value) else {
                continue;
            };
            if record.owner == cluster.node || record.handed {
                continue;
            }
            let Some(broker) = broker.upgrade() else {
                return;
            };
            hand_over(&cluster, bucket, &broker, &entry, record).await;
        }
        if broker.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Another node claimed a session: give it up here and write what it held into the claim.
async fn hand_over(
    cluster: &Cluster,
    bucket: &kv::Store,
    broker: &Arc<Broker>,
    entry: &kv::Entry,
    claim: Record,
) {
    let client_id = subject::unescape(&entry.key.replace('=', "~"));
    let Some(client_id) = client_id else {
        return;
    };
    let (owned_here, written_cursor) = {
        // The watch may lag: a record older than our own claim says nothing of now.
        let mut owned = cluster.sessions.owned.lock();
        if owned
            .get(&client_id)
            .is_some_and(|(mine, _)| *mine > entry.revision)
        {
            return;
        }
        let removed = owned.remove(&client_id);
        (removed.is_some(), removed.map(|(_, r)| r.cursor))
    };
    cluster.sessions.unattached.lock().remove(&client_id);
    cluster.sessions.wills.lock().remove(&client_id);
    if cluster.sessions.adopted.lock().remove(&client_id).is_some() {
        // Adopted here from a dead node: the claimer took the record as it stood, without
        // waiting. A copy kept from this node's earlier run is stale.
        drop(broker.release_to_cluster(&client_id));
        return;
    }
    if !owned_here
        && claim.claimed_from != cluster.node
        && !cluster.sessions.restoring.lock().contains_key(&client_id)
    {
        // Held here without a claim of this run (brought back from this node's store at a
        // restart), and the record this one replaced was not this node's: the session moved
        // while this node was down, or this is the owner's own rewrite, not a claim. The
        // copy here is stale and the record is the session (the authority on who holds it):
        // the copy goes, and nothing of it is written.
        drop_stale_copy(broker, &client_id, &claim.owner);
        return;
    }
    {
        let mut claimed = cluster.sessions.claimed_elsewhere.lock();
        if claimed.len() > 10_000 {
            claimed.retain(|_, (_, _, at)| at.elapsed() < CLAIM_MEMORY);
        }
        claimed.insert(
            client_id.clone(),
            (entry.revision, claim.clone(), std::time::Instant::now()),
        );
    }
    let Some((view, released_cursor, jobs)) = release(cluster, broker, &client_id) else {
        return;
    };
    tracing::info!(client = %client_id, to = %claim.owner, "cluster: session taken over by another node");
    if claim.fresh || view.expiry_interval == 0 {
        // The claimer does not wait for a hand-over of a session that ends here (Clean
        // Start, or one that ends with its connection): written over its claim, the old
        // subscriptions and cursor would come back with the new session.
        cluster.sessions.taken.forget(&client_id);
        return;
    }
    // A session not claimed in this run came back from the store at a restart: the
    // sequences of what it holds are not known, its last record's cursor (the claim's copy)
    // finds them.
    let mut cursor = if owned_here || claim.cursor == 0 {
        kept_cursor(&view, released_cursor, written_cursor)
    } else {
        claim.cursor
    };
    let restoring = cluster.sessions.restoring.lock().get(&client_id).cloned();
    if let Some(restoring) = &restoring {
        // Taken while its replay here is still under way: what the replay has not reached
        // is not in the session yet.
        cursor = cursor.min(restoring.cursor);
    }
    let mut handed = Record::from_view(&claim.owner, claim.life, &view, cursor, None, None);
    handed.taken = taken_when_settled(cluster, &client_id, cursor).await;
    cluster.sessions.taken.forget(&client_id);
    // The claim's copy of the last record lists what was taken before this node's restart
    // (if it restarted), and a restore under way here what it brought.
    let brought = restoring
        .as_ref()
        .map(|r| r.taken.as_slice())
        .unwrap_or_default();
    handed.taken.extend(
        claim
            .taken
            .iter()
            .chain(brought)
            .filter(|&&seq| seq >= cursor),
    );
    handed.taken.sort_unstable();
    handed.taken.dedup();
    if let Some(restoring) = &restoring {
        for &(packet_id, seq) in &restoring.qos2 {
            if !handed.qos2.iter().any(|(p, _)| *p == packet_id) {
                handed.qos2.push((packet_id, seq));
                if restoring.qos2_shared.contains(&packet_id) {
                    handed.qos2_shared.push(packet_id);
                }
            }
        }
    }
    handed.handed = true;
    handed.will = claim.will;
    handed.will_delay = claim.will_delay;
    if view.expiry_interval == 0 || claim.expiry == 0 {
        handed.expiry = claim.expiry;
    }
    if let Err(error) = bucket
        .update(entry.key.as_str(), handed.encode(), entry.revision)
        .await
    {
        tracing::debug!(client = %client_id, %error, "cluster: hand-over not written (claimed again since)");
        jobs.not_written();
    }
}

/// Longest a hand-over waits for the sequences of messages its client took before
/// JetStream acknowledged them (normally milliseconds): listed, the next owner does not send
/// them again.
const TAKEN_WAIT: Duration = Duration::from_secs(1);

/// The taken messages of a released session its hand-over lists ([`crate::cluster::taken`]), once
/// their sequences are known (bounded by [`TAKEN_WAIT`]; past it, one still to come is not
/// listed and may reach the client twice).
async fn taken_when_settled(cluster: &Cluster, client_id: &str, cursor: u64) -> Vec<u64> {
    let deadline = tokio::time::Instant::now() + TAKEN_WAIT;
    loop {
        let listed = cluster.sessions.taken.above(client_id, cursor);
        if !listed.awaiting || tokio::time::Instant::now() >= deadline {
            if listed.awaiting {
                tracing::warn!(client = client_id, "cluster: a message the client took has no stream sequence yet; the session's next node may send it again");
            }
            return listed.seqs;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SessionOwner;

    fn view(unsequenced_pending: bool, lowest: Option<u64>) -> HeldSession {
        HeldSession {
            client_id: "w".into(),
            expiry_interval: 60,
            subscriptions: Vec::new(),
            lowest_pending_seq: lowest,
            qos2: Vec::new(),
            unsequenced_qos2: false,
            unsequenced_pending,
            qos2_shared: Vec::new(),
            connected: false,
            pending_will: None,
            owner: SessionOwner::Unbound,
        }
    }

    #[test]
    fn a_message_of_unknown_sequence_holds_the_cursor_at_the_recorded_one() {
        // Nothing of unknown sequence: the cursor follows what the session holds.
        let plain = view(false, Some(40));
        assert_eq!(kept_cursor(&plain, cursor_at(100, &plain), Some(10)), 40);
        // A message the store brought back: no further than the record's cursor.
        let restored = view(true, None);
        assert_eq!(
            kept_cursor(&restored, cursor_at(100, &restored), Some(10)),
            10
        );
        assert_eq!(kept_cursor(&view(true, Some(5)), 5, Some(10)), 5);
        // No recorded cursor (0: none): nothing to hold it at.
        assert_eq!(kept_cursor(&restored, 100, Some(0)), 100);
        assert_eq!(kept_cursor(&restored, 100, None), 100);
    }
}
