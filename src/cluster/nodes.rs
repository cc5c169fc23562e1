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
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a node may stay unheard of before it is taken for dead.
pub(crate) const DEAD_AFTER: Duration = Duration::from_secs(7);

/// What this node has heard of the others.
#[derive(Debug)]
pub(crate) struct Liveness {
    /// When this node last started listening: at start and whenever its link to NATS came
    /// back (before [`DEAD_AFTER`] has passed since, a node not heard of may just not have
    /// been heard of yet).
    since: parking_lot::Mutex<Instant>,
    /// Each node's last heartbeat, as received here.
    last_heard: parking_lot::Mutex<HashMap<String, Instant>>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            since: parking_lot::Mutex::new(Instant::now()),
            last_heard: parking_lot::Mutex::default(),
        }
    }
}

impl Liveness {
    /// Whether `node` may be alive: heard of within [`DEAD_AFTER`], or not heard of but this
    /// node has not listened that long yet.
    pub(crate) fn may_be_alive(&self, node: &str) -> bool {
        self.since.lock().elapsed() < DEAD_AFTER
            || self
                .last_heard
                .lock()
                .get(node)
                .is_some_and(|at| at.elapsed() < DEAD_AFTER)
    }

    /// Listening (again) from now: what was not heard while the link was down says nothing.
    /// Called at every (re)connect, however short the outage was.
    pub(super) fn listening(&self) {
        *self.since.lock() = Instant::now();
    }

    /// Nodes heard of before that are dead now.
    fn dead(&self) -> std::collections::HashSet<String> {
        if self.since.lock().elapsed() < DEAD_AFTER {
            return std::collections::HashSet::new();
        }
        self.last_heard
            .lock()
            .iter()
            .filter(|(_, at)| at.elapsed() >= DEAD_AFTER)
            .map(|(node, _)| node.clone())
            .collect()
    }

    /// Nodes heard of within [`DEAD_AFTER`] (this one included once its heartbeat is back).
    pub(crate) fn alive(&self) -> usize {
        self.last_heard
            .lock()
            .values()
            .filter(|at| at.elapsed() < DEAD_AFTER)
            .count()
    }
}

/// Writes this node's heartbeat and watches everyone's, for as long as the broker lives.
///
/// Each beat also looks for what calls for a search of orphaned sessions
/// ([`super::orphans`]): a node heard of before and silent now, and [`DEAD_AFTER`] after this
/// node (re)joined (nodes that died while it was away, and its own earlier run).
pub(super) async fn run(cluster: Arc<Cluster>, bucket: kv::Store, broker: Weak<Broker>) {
    let watcher = tokio::spawn(watch(Arc::clone(&cluster), bucket.clone()));
    let orphans = tokio::spawn(super::orphans::run(Arc::clone(&cluster), broker.clone()));
    let mut tick = tokio::time::interval(HEARTBEAT);
    let mut was_up = false;
    let mut search_at: Option<Instant> = None;
    let mut known_dead = std::collections::HashSet::new();
    while broker.strong_count() > 0 {
        tick.tick().await;
        let up = cluster.is_up();
        if up && !was_up {
            cluster.liveness.listening();
            search_at = Some(Instant::now() + DEAD_AFTER);
        }
        was_up = up;
        let dead = cluster.liveness.dead();
        let newly_dead = dead.iter().any(|node| !known_dead.contains(node));
        known_dead = dead;
        if up && (newly_dead || search_at.is_some_and(|at| at <= Instant::now())) {
            search_at = None;
            cluster.orphans.notify_one();
        }
        let now = crate::storage::now_unix_ms().to_string();
        if let Err(error) = bucket.put(cluster.node.as_str(), Bytes::from(now)).await {
            tracing::debug!(%error, "cluster: heartbeat not written");
        }
        cluster.metrics.nodes.set(cluster.liveness.alive() as f64);
    }
    watcher.abort();
    orphans.abort();
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
