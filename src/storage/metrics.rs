//! The durable store's metric group (`postbox_store_*`), declared by storage against the
//! broker's registry so `metrics` stays a leaf that knows neither [`StoreStats`] nor the op
//! kinds (issue 36). Most series are copies of the store's own counters (kept on its writer
//! thread), taken at each reading by a scrape hook; the commit histogram is written by the
//! writer itself; the budget gauge is set once at start.

use crate::metrics::{names, Counter, Gauge, Histogram, Metrics};

use super::{Op, StoreStats};

/// The `reason` labels of `postbox_store_rejected_total`, in [`StoreMetrics::update`]'s
/// order.
const REJECTED_REASONS: [&str; 4] = ["queue_full", "disk_full", "disk_full_dropped", "no_space"];

/// The `kind` labels of `postbox_store_recovery_lost_records_total`: every op kind, then
/// `unknown` (a lost record whose kind could not be read).
const LOST_KINDS: usize = Op::KIND_NAMES.len() + 1;

/// Handles to the store's series. Registered once per broker by the server, which feeds
/// them: a scrape hook copies [`StoreStats`] in, the writer times its commits into
/// [`StoreMetrics::commit_seconds`]. Every child is taken at registration, so a reading
/// does no label lookup.
#[derive(Clone, Debug)]
pub(crate) struct StoreMetrics {
    /// Live data in the store, bytes.
    live_bytes: Gauge,
    /// The store's files on disk, bytes.
    disk_bytes: Gauge,
    /// Group commits written.
    commits: Counter,
    /// fsyncs done.
    fsyncs: Counter,
    /// Log compactions.
    compactions: Counter,
    /// Updates refused or dropped, in [`REJECTED_REASONS`] order.
    rejected: [Counter; REJECTED_REASONS.len()],
    /// 1 while the filesystem is full.
    out_of_space: Gauge,
    /// Frames skipped at start.
    recovery_lost_frames: Counter,
    /// Records in the skipped frames, by kind ([`Op::KIND_NAMES`] order, then `unknown`).
    recovery_lost_records: [Counter; LOST_KINDS],
    /// `postbox_store_commit_seconds`: seconds per group commit (write and fsync), observed
    /// on the writer thread (`Store::observe_commits`).
    pub(crate) commit_seconds: Histogram,
    /// `postbox_store_budget_bytes`: `storage.max_disk_bytes` (0 = unlimited).
    pub(crate) budget_bytes: Gauge,
}

impl StoreMetrics {
    /// Declares the store's series in `metrics`' registry (once per broker: a second call
    /// panics on the duplicate names). The copied series are scrape-time ones, so a reading
    /// reports them after the hook that copies them ran.
    pub(crate) fn register(metrics: &Metrics) -> StoreMetrics {
        use names::*;
        let s = metrics.scrape_registrar();
        let lost_kinds: [&str; LOST_KINDS] =
            std::array::from_fn(|kind| Op::KIND_NAMES.get(kind).copied().unwrap_or("unknown"));
        let r = metrics.registrar();
        let commit_buckets = vec![
            0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5,
        ];
        StoreMetrics {
            live_bytes: s.gauge(STORE_LIVE_BYTES, "Live data in the durable store, bytes."),
            disk_bytes: s.gauge(
                STORE_DISK_BYTES,
                "Bytes of the durable store's files on disk right now (logs and snapshots).",
            ),
            commits: s.counter(
                STORE_COMMITS_TOTAL,
                "Group commits written by the durable store.",
            ),
            fsyncs: s.counter(STORE_FSYNCS_TOTAL, "fsyncs done by the durable store."),
            compactions: s.counter(STORE_COMPACTIONS_TOTAL, "Durable store log compactions."),
            rejected: s.counter_family(
                STORE_REJECTED_TOTAL,
                "Store updates refused (queue_full, disk_full, no_space) or dropped (disk_full_dropped).",
                "reason",
            )
            .counters(REJECTED_REASONS),
            out_of_space: s.gauge(
                STORE_OUT_OF_SPACE,
                "1 while the store's filesystem is full: new persistent messages are refused.",
            ),
            recovery_lost_frames: s.counter(
                STORE_RECOVERY_LOST_FRAMES_TOTAL,
                "Store frames skipped at start because they failed their checksums.",
            ),
            recovery_lost_records: s.counter_family(
                STORE_RECOVERY_LOST_RECORDS_TOTAL,
                "Records in the store frames skipped at start, by kind.",
                "kind",
            )
            .counters(lost_kinds),
            commit_seconds: r.histogram(
                STORE_COMMIT_SECONDS,
                "Seconds per durable-store group commit (write and fsync).",
                commit_buckets,
            ),
            budget_bytes: r.gauge(
                STORE_BUDGET_BYTES,
                "storage.max_disk_bytes: the durable store's disk budget (0 = unlimited).",
            ),
        }
    }

    /// Copies a stats reading in (from the scrape hook).
    pub(crate) fn update(&self, stats: &StoreStats) {
        self.live_bytes.set(stats.live_bytes as f64);
        self.disk_bytes.set(stats.disk_bytes as f64);
        self.commits.absolute(stats.commits);
        self.fsyncs.absolute(stats.fsyncs);
        self.compactions.absolute(stats.compactions);
        let rejected = [
            stats.rejected_queue_full,
            stats.rejected_disk_full,
            stats.dropped_disk_full,
            stats.rejected_no_space,
        ];
        for (counter, n) in self.rejected.iter().zip(rejected) {
            counter.absolute(n);
        }
        self.out_of_space
            .set(if stats.no_space { 1.0 } else { 0.0 });
        let loss = &stats.recovery;
        self.recovery_lost_frames.absolute(loss.frames);
        let records = loss.records.iter().copied().chain([loss.unknown_records]);
        for (counter, n) in self.recovery_lost_records.iter().zip(records) {
            counter.absolute(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every store series is exported once the group is registered (at 0, with HELP), and a
    /// scrape shows the stats as the hook copies them at that reading.
    #[test]
    fn the_store_group_is_exported_and_copied_at_each_reading() {
        let m = Metrics::register();
        let store = StoreMetrics::register(&m);
        store.budget_bytes.set(1024.0);
        let hook = store.clone();
        m.on_scrape(move |_| {
            let mut stats = StoreStats {
                commits: 9,
                rejected_no_space: 2,
                no_space: true,
                ..Default::default()
            };
            stats.recovery.records[1] = 3;
            stats.recovery.unknown_records = 4;
            hook.update(&stats);
        });
        let out = m.render();
        crate::metrics::assert_described(&out, names::STORE.iter().copied());
        let second = Op::KIND_NAMES[1];
        crate::metrics::assert_has_lines(
            &out,
            [
                "postbox_store_commits_total 9".to_owned(),
                "postbox_store_rejected_total{reason=\"no_space\"} 2".to_owned(),
                "postbox_store_rejected_total{reason=\"queue_full\"} 0".to_owned(),
                "postbox_store_out_of_space 1".to_owned(),
                "postbox_store_budget_bytes 1024".to_owned(),
                format!("postbox_store_recovery_lost_records_total{{kind=\"{second}\"}} 3"),
                "postbox_store_recovery_lost_records_total{kind=\"unknown\"} 4".to_owned(),
            ],
        );
        assert_eq!(
            out.matches("postbox_store_recovery_lost_records_total{")
                .count(),
            LOST_KINDS
        );
    }
}
