//! Node liveness: each node writes a heartbeat into the `pb_nodes` bucket every
//! [`HEARTBEAT`]; each node watches the bucket and judges the others by its own clock (a
//! 2.9 server sends no event when a key's `max_age` passes, so the bucket's age limit only
//! cleans up). A node unheard of for [`DEAD_AFTER`] is taken for dead: a claim of one of its
//! sessions does not wait for a hand-over it cannot send.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;

use super::Cluster;
use crate::broker::Broker;

/// How often a node writes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a node may stay unheard of before it is taken for dead.
pub const DEAD_AFTER: Duration = Duration::from_secs(7);

/// What this node has heard of the others.
#[derive(Debug)]
pub struct Liveness {
    /// When this node started watching (before [`DEAD_AFTER`] has passed, a node not heard of
    /// yet may just not have been heard of yet).
    since: Instant,
    /// Each node's last heartbeat, as received here.
    last_heard: parking_lot::Mutex<HashMap<String, Instant>>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            since: Instant::now(),
            last_heard: parking_lot::Mutex::default(),
        }
    }
}

impl Liveness {
    /// Whether `node` may be alive: heard of within [`DEAD_AFTER`], or not heard of but this
    /// node has not listened that long yet.
    pub fn may_be_alive(&self, node: &str) -> bool {
        match self.last_heard.lock().get(node) {
            Some(at) => at.elapsed() < DEAD_AFTER,
            None => self.since.elapsed() < DEAD_AFTER,
        }
    }

    /// Nodes heard of within [`DEAD_AFTER`] (this one included once its heartbeat is back).
    pub fn alive(&self) -> usize {
        self.last_heard
            .lock()
            .values()
            .filter(|at| at.elapsed() < DEAD_AFTER)
            .count()
    }
}

/// Writes this node's heartbeat and watches everyone's, for as long as the broker lives.
pub(super) async fn run(cluster: Arc<Cluster>, bucket: kv::Store, broker: Weak<Broker>) {
    let watcher = tokio::spawn(watch(Arc::clone(&cluster), bucket.clone()));
    let mut tick = tokio::time::interval(HEARTBEAT);
    while broker.strong_count() > 0 {
        tick.tick().await;
        let now = crate::storage::now_unix_ms().to_string();
        if let Err(error) = bucket.put(cluster.node.as_str(), Bytes::from(now)).await {
            tracing::debug!(%error, "cluster: heartbeat not written");
        }
        cluster.metrics.nodes.set(cluster.liveness.alive() as f64);
    }
    watcher.abort();
}

async fn watch(cluster: Arc<Cluster>, bucket: kv::Store) {
    loop {
        let mut entries = match bucket.watch_with_history(">").await {
            Ok(entries) => entries,
            Err(error) => {
                tracing::debug!(%error, "cluster: cannot watch heartbeats; trying again");
                tokio::time::sleep(HEARTBEAT).await;
                continue;
            }
        };
        while let Some(Ok(entry)) = entries.next().await {
            if entry.operation != kv::Operation::Put {
                continue;
            }
            // A history entry older than DEAD_AFTER says nothing of now.
            let written = std::str::from_utf8(&entry.value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let age = crate::storage::now_unix_ms().saturating_sub(written);
            if Duration::from_millis(age) >= DEAD_AFTER {
                continue;
            }
            cluster
                .liveness
                .last_heard
                .lock()
                .insert(entry.key, Instant::now());
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}
