//! Figures computed when they are read: the session backlog (a walk over the sessions), the
//! peak of connected clients, and any owner's scrape-time group ([`ScrapeReg`]: the durable
//! store's counters, kept by the store on its own thread, are `storage::StoreMetrics`). One
//! [`prometheus::core::Collector`] holds their metrics and, on every gather (a scrape) or
//! [`super::Metrics::snapshot`], first runs the hooks that refresh them, so a reading shows
//! them as they are at that moment (issue 11: a periodic copy showed a full disk late) and
//! nothing is computed between readings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::handles::{Counter, CounterFamily, Gauge};
use super::names;

/// A refresh run before every reading.
type Hook = Box<dyn Fn(&ScrapeFigures) + Send + Sync>;

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
    /// Messages waiting in session queues, all sessions.
    pub messages_queued: Gauge,
    /// Bytes (topic, payload, properties) of the messages waiting in session queues, all sessions.
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
    /// The metrics owners declared through [`ScrapeReg`] (the store's group): reported
    /// after the hooks ran, like the figures above, so one reading is one moment.
    owned: RwLock<Vec<Box<dyn Collector>>>,
}

impl std::fmt::Debug for ScrapeTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTime")
            .field("hooks", &self.hooks.read().len())
            .field("owned", &self.owned.read().len())
            .finish_non_exhaustive()
    }
}

impl ScrapeTime {
    /// The figures, not registered yet; `clients` is the count the connections update.
    pub(super) fn new(clients: Arc<ClientCount>) -> ScrapeTime {
        use names::*;
        ScrapeTime {
            figures: ScrapeFigures {
                messages_queued: gauge(
                    MESSAGES_QUEUED,
                    "Messages waiting in session queues, all sessions (Mosquitto's $SYS/broker/messages/stored).",
                ),
                messages_queued_bytes: gauge(
                    MESSAGES_QUEUED_BYTES,
                    "Bytes (topic, payload, properties) of the messages waiting in session queues, all sessions.",
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
            owned: RwLock::default(),
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
            .chain(f.shared_groups.collectors())
            .chain(f.bridge_queues.collectors())
    }
}

/// Registered as `Arc<ScrapeTime>`: the metrics keep a handle to run the hooks for
/// snapshots.
#[derive(Debug)]
pub(super) struct Shared(pub(super) Arc<ScrapeTime>);

impl Collector for Shared {
    /// The fixed figures' descriptions only: the registry asks once, at registration, before
    /// any owner declared a group (owners' names are constants of [`names`], unique by test).
    fn desc(&self) -> Vec<&Desc> {
        self.0.collectors().flat_map(Collector::desc).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.refresh();
        let mut families: Vec<MetricFamily> =
            self.0.collectors().flat_map(Collector::collect).collect();
        for owned in self.0.owned.read().iter() {
            families.extend(owned.collect());
        }
        families
    }
}

/// Declares an owner's metrics whose values are copied in at each reading (by a hook added
/// with [`super::Metrics::on_scrape`]): they are reported after the hooks run, so a scrape
/// never shows the previous reading's copy. From [`super::Metrics::scrape_registrar`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScrapeReg<'a>(pub(super) &'a ScrapeTime);

impl ScrapeReg<'_> {
    /// Adds `collector` to the scrape-time collector.
    fn add(self, collector: impl Collector + 'static) {
        self.0.owned.write().push(Box::new(collector));
    }

    /// An unlabelled gauge, reported at each reading.
    pub(crate) fn gauge(self, name: &str, help: &str) -> Gauge {
        let g = gauge(name, help);
        self.add(g.0.clone());
        g
    }

    /// An unlabelled counter, reported at each reading.
    pub(crate) fn counter(self, name: &str, help: &str) -> Counter {
        let c = counter(name, help);
        self.add(c.0.clone());
        c
    }

    /// A counter family with one `label`, reported at each reading; take its children at
    /// once ([`CounterFamily::counters`]).
    pub(crate) fn counter_family(self, name: &str, help: &str, label: &str) -> CounterFamily {
        let v = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), &[label])
            .expect("valid metric name");
        self.add(v.clone());
        CounterFamily(v)
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
