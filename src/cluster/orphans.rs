//! Sessions whose node died: adopted by a live node, which fires their wills and expires
//! them, once cluster-wide.
//!
//! A session's record ([`super::sessions`]) carries its will (while it may still be
//! published), its Will Delay Interval or the time the will is due, and when its connection
//! ended. When a node is taken for dead ([`super::nodes`]), and [`nodes::DEAD_AFTER`] after
//! a node (re)joins, each live node reads every record and adopts those whose owner is dead
//! (or is this node in an earlier run): it writes itself in as the owner by compare-and-set
//! on the record's revision, so of several live nodes one adopts each record. The adopter
//! then, with no connection and no local session:
//!
//! - publishes the will when it is due (a connection that was open when its node died
//!   ended then: its delay counts from the adoption), after a compare-and-set that takes it
//!   out of the record, so it goes out once (at most once: an adopter that dies between the
//!   two loses it), and only where the session's owner (the record's `who`; anonymous for
//!   a record without one) may write, as [`Broker::publish_will`] checks every will;
//! - deletes the record when the session's expiry interval has passed since its connection
//!   ended (counted in `postbox_sessions_expired_total`).
//!
//! A client that connects meanwhile claims the record (on any node) and so cancels both (the
//! compare-and-sets fail): it resumes from the record's subscriptions and cursor, and a new
//! connection within the will's delay means the will is not published (MQTT-3.1.3-9).
//!
//! [`nodes::DEAD_AFTER`]: super::nodes::DEAD_AFTER
//!
//! Must not: hold a local session; publish a will twice.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::StreamExt;

use super::sessions::{decode_will, Record};
use super::{nodes, subject, Cluster};
use crate::broker::{Broker, NEVER_EXPIRES};

/// Longest wait for the next record while reading the bucket (an empty bucket sends none).
const READ_WAIT: Duration = Duration::from_secs(2);

/// Searches for orphaned sessions whenever [`nodes`] asks (a search that could not finish is
/// tried again a heartbeat later).
pub(super) async fn run(cluster: Arc<Cluster>, broker: Weak<Broker>) {
    loop {
        cluster.orphans.notified().await;
        loop {
            if broker.strong_count() == 0 {
                return;
            }
            match search(&cluster, &broker).await {
                Ok(adopted) => {
                    if adopted > 0 {
                        tracing::info!(
                            sessions = adopted,
                            "cluster: adopted the sessions of a dead node"
                        );
                    }
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "cluster: the search for a dead node's sessions failed; trying again");
                    tokio::time::sleep(nodes::HEARTBEAT).await;
                }
            }
        }
    }
}

/// Reads every record once and adopts the orphans; how many it adopted.
async fn search(cluster: &Arc<Cluster>, broker: &Weak<Broker>) -> Result<usize, String> {
    let Some(bucket) = cluster.sessions.bucket.get().cloned() else {
        return Err("the session bucket is not open yet".to_owned());
    };
    if !cluster.is_up() {
        return Err("NATS is unreachable".to_owned());
    }
    let mut entries = bucket
        .watch_with_history(">")
        .await
        .map_err(|e| e.to_string())?;
    let mut orphans = Vec::new();
    loop {
        let entry = match tokio::time::timeout(READ_WAIT, entries.next()).await {
            Ok(Some(Ok(entry))) => entry,
            Ok(Some(Err(error))) => return Err(error.to_string()),
            Ok(None) | Err(_) => break, // read to the end (or the bucket is empty)
        };
        let last = entry.delta == 0;
        if entry.operation == kv::Operation::Put {
            if let Some(record) = Record::decode(&entry.value) {
                if is_orphan(cluster, &record) {
                    orphans.push((entry.key.clone(), entry.revision, record));
                }
            }
        }
        if last {
            break;
        }
    }
    drop(entries);
    let mut adopted = 0;
    for (key, revision, record) in orphans {
        if adopt(cluster, &bucket, broker, key, revision, record).await {
            adopted += 1;
        }
    }
    Ok(adopted)
}

/// Whether a record's owner cannot act for it any more: dead, or this node in an earlier run.
fn is_orphan(cluster: &Cluster, record: &Record) -> bool {
    if record.owner == cluster.node {
        return record.life != cluster.sessions.life;
    }
    !cluster.liveness.may_be_alive(&record.owner)
}

/// Adopts one orphaned record by compare-and-set, then runs its will and expiry.
async fn adopt(
    cluster: &Arc<Cluster>,
    bucket: &kv::Store,
    broker: &Weak<Broker>,
    key: String,
    revision: u64,
    orphan: Record,
) -> bool {
    let Some(client_id) = subject::unescape(&key.replace('=', "~")) else {
        return false;
    };
    let now = crate::storage::now_unix_ms();
    let mut mine = orphan.clone();
    mine.owner.clone_from(&cluster.node);
    mine.life = cluster.sessions.life;
    mine.adopted = true;
    mine.handed = false;
    // Not a claim: nobody is to hand it over.
    mine.claimed_from.clear();
    mine.claimed_from_life = 0;
    if mine.ended_at == 0 {
        // Connected when its node died: the connection ended now, as far as anyone can
        // tell, abnormally (the will is due after its delay).
        mine.ended_at = now;
        if mine.will.is_some() {
            mine.will_at = now.saturating_add(u64::from(mine.will_delay).saturating_mul(1000));
        }
    }
    mine.will_delay = 0;
    let ends = ends_at(&mine);
    if mine.will.is_some() {
        // Published when the delay ends or the session does, whichever comes first
        // (MQTT-3.1.2-8).
        mine.will_at = mine.will_at.min(ends);
    }
    let Ok(revision) = bucket.update(key.as_str(), mine.encode(), revision).await else {
        return false; // another node adopted it, or its client came back
    };
    tracing::info!(client = %client_id, from = %orphan.owner, "cluster: adopted the session of a dead node");
    cluster
        .sessions
        .adopted
        .lock()
        .insert(client_id.clone(), revision);
    tokio::spawn(keep(
        Arc::clone(cluster),
        bucket.clone(),
        broker.clone(),
        key,
        client_id,
        revision,
        mine,
    ));
    true
}

/// When the session ends (unix ms): its expiry interval after its connection ended;
/// `u64::MAX` for never.
fn ends_at(record: &Record) -> u64 {
    if record.expiry == NEVER_EXPIRES {
        u64::MAX
    } else {
        record
            .ended_at
            .saturating_add(u64::from(record.expiry).saturating_mul(1000))
    }
}

/// Sleeps until unix ms `at`.
async fn sleep_until_unix_ms(at: u64) {
    let now = crate::storage::now_unix_ms();
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(now))).await;
}

/// Runs an adopted session's will and expiry; a compare-and-set that fails means its client
/// came back (or another node took the record) and ends this.
async fn keep(
    cluster: Arc<Cluster>,
    bucket: kv::Store,
    broker: Weak<Broker>,
    key: String,
    client_id: String,
    mut revision: u64,
    mut record: Record,
) {
    let still_adopted =
        |revision: u64| cluster.sessions.adopted.lock().get(&client_id).copied() == Some(revision);
    if let Some(will) = record.will.take() {
        sleep_until_unix_ms(record.will_at).await;
        if !still_adopted(revision) {
            return;
        }
        record.will_at = 0;
        match bucket.update(key.as_str(), record.encode(), revision).await {
            Ok(written) => revision = written,
            Err(_) => return,
        }
        cluster
            .sessions
            .adopted
            .lock()
            .insert(client_id.clone(), revision);
        match (decode_will(&will), broker.upgrade()) {
            (Some(message), Some(broker)) => {
                tracing::info!(client = %client_id, topic = %message.topic, "cluster: the will of a session whose node died is due");
                // Checked as its node would have: under the session's owner (`who`), a
                // record without one as anonymous (issue 35, sixth adversarial pass, F1b).
                broker.publish_will_of(&client_id, &record.who.owner(), message);
            }
            _ => {
                tracing::warn!(client = %client_id, "cluster: the will of a session whose node died cannot be read; not published");
            }
        }
    }
    let ends = ends_at(&record);
    if ends == u64::MAX {
        return; // never expires: the record waits for its client
    }
    sleep_until_unix_ms(ends).await;
    if !still_adopted(revision) {
        return;
    }
    if bucket
        .delete_expect_revision(key.as_str(), Some(revision))
        .await
        .is_ok()
    {
        cluster.sessions.adopted.lock().remove(&client_id);
        if record.expiry > 0 {
            if let Some(broker) = broker.upgrade() {
                broker.metrics.sessions_expired.increment(1);
            }
        }
        tracing::info!(client = %client_id, "cluster: the session of a dead node expired");
    }
}
