//! Figures computed when they are read: the durable store's counters (kept by the store on
//! its own thread), the session backlog (a walk over the sessions) and the peak of connected
//! clients. One [`prometheus::core::Collector`] holds their metrics and, on every gather (a
//! scrape) or [`super::Metrics::snapshot`], first runs the hooks that refresh them, so a
//! reading shows them as they are at that moment (issue 11: a periodic copy showed a full
//! disk late) and nothing is computed between readings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::handles::{Counter, Gauge};
use super::names;

/// A refresh run before every reading.
type Hook = Box<dyn Fn(&ScrapeFigures) + Send + Sync>;

/// Durable-store metrics, copied from [`crate::storage::StoreStats`] at each reading.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// Live data in the store, bytes.
    pub live_bytes: Gauge,
    /// The store's files on disk, bytes.
    pub disk_bytes: Gauge,
    commits: Counter,
    fsyncs: Counter,
    compactions: Counter,
    rejected: prometheus::IntCounterVec,
    out_of_space: Gauge,
    recovery_lost_frames: Counter,
    recovery_lost_records: prometheus::IntCounterVec,
}

impl StoreMetrics {
    /// The store's metrics, not registered (the [`ScrapeTime`] collector reports them).
    fn new() -> StoreMetrics {
        use names::*;
        let rejected = counter_vec(
            STORE_REJECTED_TOTAL,
            "Store updates refused (queue_full, disk_full, no_space) or dropped (disk_full_dropped).",
            &["reason"],
        );
        for reason in ["queue_full", "disk_full", "disk_full_dropped", "no_space"] {
            rejected.with_label_values(&[reason]);
        }
        let recovery_lost_records = counter_vec(
            STORE_RECOVERY_LOST_RECORDS_TOTAL,
            "Records in the store frames skipped at start, by kind.",
            &["kind"],
        );
        for kind in crate::storage::Op::KIND_NAMES.iter().chain(&["unknown"]) {
            recovery_lost_records.with_label_values(&[kind]);
        }
        StoreMetrics {
            live_bytes: gauge(STORE_LIVE_BYTES, "Live data in the durable store, bytes."),
            disk_bytes: gauge(
                STORE_DISK_BYTES,
                "Bytes of the durable store's files on disk right now (logs and snapshots).",
            ),
            commits: counter(
                STORE_COMMITS_TOTAL,
                "Group commits written by the durable store.",
            ),
            fsyncs: counter(STORE_FSYNCS_TOTAL, "fsyncs done by the durable store."),
            compactions: counter(STORE_COMPACTIONS_TOTAL, "Durable store log compactions."),
            rejected,
            out_of_space: gauge(
                STORE_OUT_OF_SPACE,
                "1 while the store's filesystem is full: new persistent messages are refused.",
            ),
            recovery_lost_frames: counter(
                STORE_RECOVERY_LOST_FRAMES_TOTAL,
                "Store frames skipped at start because they failed their checksums.",
            ),
            recovery_lost_records,
        }
    }

    /// Copies a stats reading in.
    pub fn update(&self, stats: &crate::storage::StoreStats) {
        self.live_bytes.set(stats.live_bytes as f64);
        self.disk_bytes.set(stats.disk_bytes as f64);
        self.commits.absolute(stats.commits);
        self.fsyncs.absolute(stats.fsyncs);
        self.compactions.absolute(stats.compactions);
        for (reason, n) in [
            ("queue_full", stats.rejected_queue_full),
            ("disk_full", stats.rejected_disk_full),
            ("disk_full_dropped", stats.dropped_disk_full),
            ("no_space", stats.rejected_no_space),
        ] {
            Counter(self.rejected.with_label_values(&[reason])).absolute(n);
        }
        self.out_of_space
            .set(if stats.no_space { 1.0 } else { 0.0 });
        let loss = &stats.recovery;
        self.recovery_lost_frames.absolute(loss.frames);
        let kinds = crate::storage::Op::KIND_NAMES.iter().chain(&["unknown"]);
        let records = loss.records.iter().copied().chain([loss.unknown_records]);
        for (kind, n) in kinds.zip(records) {
            Counter(self.recovery_lost_records.with_label_values(&[kind])).absolute(n);
        }
    }

    /// Every metric, for the collector.
    fn collectors(&self) -> [&dyn Collector; 9] {
        [
            &self.live_bytes.0,
            &self.disk_bytes.0,
            &self.commits.0,
            &self.fsyncs.0,
            &self.compactions.0,
            &self.rejected,
            &self.out_of_space.0,
            &self.recovery_lost_frames.0,
            &self.recovery_lost_records,
        ]
    }
}

/// Connected clients now and at most, counted at CONNECT and disconnect (two atomics, no
/// lock); the peak gauge is refreshed from it at each reading.
#[derive(Debug, Default)]
pub(super) struct ClientCount {
    pub(super) now: AtomicU64,
    pub(super) peak: AtomicU64,
}

impl ClientCount {
    /// One more client connected.
    pub(super) fn connected(&self) {
        let now = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// One client fewer.
    pub(super) fn disconnected(&self) {
        self.now.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The shared-subscription groups in aggregate (no per-group labels: group names are chosen
/// by clients), refreshed at each reading by the broker's backlog hook.
#[derive(Clone, Debug)]
pub struct SharedGroupFigures {
    /// Groups existing now.
    pub groups: Gauge,
    /// Memberships, all groups.
    pub members: Gauge,
    /// Memberships whose session is connected.
    pub members_connected: Gauge,
    /// Messages queued for groups, all groups.
    pub messages_queued: Gauge,
    /// The largest group backlog, in messages.
    pub backlog_max: Gauge,
    /// Age of the oldest message queued for any group, seconds.
    pub backlog_oldest_seconds: Gauge,
    /// Groups with a backlog and no connected member.
    pub unserved: Gauge,
}

impl SharedGroupFigures {
    fn new() -> SharedGroupFigures {
        use names::*;
        SharedGroupFigures {
            groups: gauge(
                SHARED_GROUPS,
                "Shared-subscription groups ($share/{group}/{filter}) existing now.",
            ),
            members: gauge(
                SHARED_GROUP_MEMBERS,
                "Memberships of shared groups, all groups, connected or not.",
            ),
            members_connected: gauge(
                SHARED_GROUP_MEMBERS_CONNECTED,
                "Memberships of shared groups whose session is connected now.",
            ),
            messages_queued: gauge(
                SHARED_MESSAGES_QUEUED,
                "Messages queued for shared groups across their members, all groups.",
            ),
            backlog_max: gauge(
                SHARED_GROUP_BACKLOG_MAX,
                "The largest backlog of any shared group, in messages.",
            ),
            backlog_oldest_seconds: gauge(
                SHARED_GROUP_BACKLOG_OLDEST_SECONDS,
                "Age of the oldest message queued for any shared group, seconds.",
            ),
            unserved: gauge(
                SHARED_GROUPS_UNSERVED,
                "Shared groups holding a backlog with no member connected.",
            ),
        }
    }

    fn collectors(&self) -> [&dyn Collector; 7] {
        [
            &self.groups.0,
            &self.members.0,
            &self.members_connected.0,
            &self.messages_queued.0,
            &self.backlog_max.0,
            &self.backlog_oldest_seconds.0,
            &self.unserved.0,
        ]
    }
}

/// The figures refreshed at each reading, handed to the hooks.
#[derive(Clone, Debug)]
pub struct ScrapeFigures {
    /// The durable store's figures.
    pub store: StoreMetrics,
    /// Messages waiting in session queues, all sessions.
    pub messages_queued: Gauge,
    /// Payload bytes of the messages waiting in session queues, all sessions.
    pub messages_queued_bytes: Gauge,
    /// Sessions with at least one queued message not yet sent.
    pub sessions_backlogged: Gauge,
    /// The largest queue of any session, in messages.
    pub session_backlog_max: Gauge,
    /// Age of the oldest queued message of any session, seconds.
    pub session_backlog_oldest_seconds: Gauge,
    /// Most clients connected at once since start.
    pub clients_peak: Gauge,
    /// The shared-subscription groups' members and backlog.
    pub shared_groups: SharedGroupFigures,
    pub(super) clients: Arc<ClientCount>,
    /// `postbox_bridge_queued_*`, `postbox_bridge_oldest_queued_seconds`: one child per
    /// bridge, set by that bridge's hook.
    pub(super) bridge_queues: super::bridge::BridgeQueueFamilies,
}

/// The collector of the scrape-time figures and the hooks that refresh them.
pub(super) struct ScrapeTime {
    pub(super) figures: ScrapeFigures,
    hooks: RwLock<Vec<Hook>>,
}

impl std::fmt::Debug for ScrapeTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTime")
            .field("hooks", &self.hooks.read().len())
            .finish_non_exhaustive()
    }
}

impl ScrapeTime {
    /// The figures, not registered yet; `clients` is the count the connections update.
    pub(super) fn new(clients: Arc<ClientCount>) -> ScrapeTime {
        use names::*;
        ScrapeTime {
            figures: ScrapeFigures {
                store: StoreMetrics::new(),
                messages_queued: gauge(
                    MESSAGES_QUEUED,
                    "Messages waiting in session queues, all sessions (Mosquitto's $SYS/broker/messages/stored).",
                ),
                messages_queued_bytes: gauge(
                    MESSAGES_QUEUED_BYTES,
                    "Payload bytes of the messages waiting in session queues, all sessions.",
                ),
                sessions_backlogged: gauge(
                    SESSIONS_BACKLOGGED,
                    "Sessions with at least one queued message not yet sent.",
                ),
                session_backlog_max: gauge(
                    SESSION_BACKLOG_MAX,
                    "The largest queue of any session, in messages.",
                ),
                session_backlog_oldest_seconds: gauge(
                    SESSION_BACKLOG_OLDEST_SECONDS,
                    "Age of the oldest queued message of any session, seconds.",
                ),
                clients_peak: gauge(
                    CLIENTS_PEAK,
                    "Most clients connected at once since start (Mosquitto's $SYS/broker/clients/maximum).",
                ),
                shared_groups: SharedGroupFigures::new(),
                clients,
                bridge_queues: super::bridge::BridgeQueueFamilies::new(),
            },
            hooks: RwLock::default(),
        }
    }

    /// Adds a hook run before every reading.
    pub(super) fn add_hook(&self, hook: Hook) {
        self.hooks.write().push(hook);
    }

    /// Brings every figure up to date.
    pub(super) fn refresh(&self) {
        let figures = &self.figures;
        let peak = figures.clients.peak.load(Ordering::Relaxed);
        figures.clients_peak.set(peak as f64);
        for hook in self.hooks.read().iter() {
            hook(figures);
        }
    }

    /// Every metric the collector reports.
    fn collectors(&self) -> impl Iterator<Item = &dyn Collector> {
        let f = &self.figures;
        let gauges: [&dyn Collector; 6] = [
            &f.messages_queued.0,
            &f.messages_queued_bytes.0,
            &f.sessions_backlogged.0,
            &f.session_backlog_max.0,
            &f.session_backlog_oldest_seconds.0,
            &f.clients_peak.0,
        ];
        gauges
            .into_iter()
            .chain(f.store.collectors())
            .chain(f.shared_groups.collectors())
            .chain(f.bridge_queues.collectors())
    }
}

/// Registered as `Arc<ScrapeTime>`: the metrics keep a handle to run the hooks for
/// snapshots.
#[derive(Debug)]
pub(super) struct Shared(pub(super) Arc<ScrapeTime>);

impl Collector for Shared {
    fn desc(&self) -> Vec<&Desc> {
        self.0.collectors().flat_map(Collector::desc).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.refresh();
        self.0.collectors().flat_map(Collector::collect).collect()
    }
}

/// An unregistered gauge (reported by the collector).
fn gauge(name: &str, help: &str) -> Gauge {
    Gauge(prometheus::Gauge::new(name, help).expect("valid metric name"))
}

/// An unregistered counter.
fn counter(name: &str, help: &str) -> Counter {
    Counter(prometheus::IntCounter::new(name, help).expect("valid metric name"))
}

/// An unregistered labelled counter family.
fn counter_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::IntCounterVec {
    prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), labels)
        .expect("valid metric name")
}
