//! One run's results: printed as a table for people and appended as a JSON line for scripts.
//!
//! Every field that a scenario does not measure is `None` (`null` in the JSON), so the
//! comparison summary never mistakes "not measured" for zero.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::pubsub::PubSubOutcome;

/// One scenario run against one broker.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name (`fan-in`, `fan-out`, `p2p`, `latency`, `connections`, `retained`, `durable`).
    pub scenario: String,
    /// Name of the case in a comparison (scenario plus its variant, e.g. `fan-in-q1`).
    pub case: String,
    /// Which broker was measured (`postbox`, `mosquitto`, ...).
    pub broker: String,
    /// The broker's settings: `tuned` (equal, generous limits for every broker) or `defaults`
    /// (each broker on its own defaults, where loss is a figure measured, not a failure).
    /// Results written before this field existed read as tuned.
    #[serde(default = "tuned")]
    pub settings: String,
    /// Unix time of the run, seconds.
    pub unix_time: u64,
    /// QoS used by publishers and subscriptions.
    pub qos: u8,
    /// MQTT protocol level (4 = 3.1.1, 5 = 5.0).
    pub protocol: u8,
    /// Publishing clients.
    pub publishers: usize,
    /// Subscribing clients (or idle clients in the connections scenario).
    pub subscribers: usize,
    /// Payload bytes per message.
    pub payload: usize,
    /// PUBLISH packets sent.
    pub sent: u64,
    /// Distinct deliveries that should have happened.
    pub expected: u64,
    /// Distinct deliveries that happened.
    pub delivered: u64,
    /// `expected - delivered`: must be 0 for QoS >= 1.
    pub lost: u64,
    /// `lost` as a percentage of `expected` (message-flow scenarios; `None` when nothing was
    /// expected), so runs of different sizes compare.
    pub lost_pct: Option<f64>,
    /// Extra copies received.
    pub duplicates: u64,
    /// Deliveries out of per-publisher order.
    pub reordered: u64,
    /// Messages received that this run did not send (left over from another run).
    pub foreign: u64,
    /// Whether everything expected arrived within the bounds.
    pub completed: bool,
    /// Seconds from release to the last delivery.
    pub duration_s: f64,
    /// Delivered messages per second.
    pub delivered_per_s: f64,
    /// Published messages per second (until the last acknowledgement).
    pub sent_per_s: f64,
    /// End-to-end latency percentiles, microseconds.
    pub p50_us: Option<f64>,
    /// 99th percentile latency, microseconds.
    pub p99_us: Option<f64>,
    /// 99.9th percentile latency, microseconds.
    pub p999_us: Option<f64>,
    /// Highest latency, microseconds.
    pub max_us: Option<f64>,
    /// Broker CPU over the measured phase, percent of one core.
    pub broker_cpu_pct: Option<f64>,
    /// Broker CPU microseconds per delivered message (lower is better; throughput-neutral).
    pub broker_cpu_us_per_msg: Option<f64>,
    /// Broker peak resident memory since it started (`VmHWM`), KiB.
    pub broker_peak_rss_kib: Option<u64>,
    /// Broker resident memory at the end of the run (`VmRSS`), KiB.
    pub broker_rss_kib: Option<u64>,
    /// Generator CPU, percent of one core: near 100 means the client may be the bottleneck.
    pub generator_cpu_pct: Option<f64>,
    /// Connections scenario: clients connected per second.
    pub connect_per_s: Option<f64>,
    /// Connections scenario: broker RSS growth per connection, bytes.
    pub rss_per_connection_b: Option<f64>,
    /// Retained scenario: seconds for the broker to take all retained messages.
    pub store_s: Option<f64>,
    /// Why the run did not complete, if it did not.
    pub note: Option<String>,
}

/// Serde default of [`Report::settings`]: lines written before the field existed are tuned.
fn tuned() -> String {
    "tuned".into()
}

/// Microsecond percentiles of a nanosecond histogram: (p50, p99, p999, max).
pub fn percentiles_us(h: &Histogram<u64>) -> Option<(f64, f64, f64, f64)> {
    if h.is_empty() {
        return None;
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    Some((
        us(h.value_at_quantile(0.50)),
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.max()),
    ))
}

impl Report {
    /// Fills the message-flow fields from a pub/sub outcome.
    pub fn absorb(&mut self, o: &PubSubOutcome) {
        self.sent = o.sent;
        self.expected = o.expected;
        self.delivered = o.delivered;
        self.lost = o.expected.saturating_sub(o.delivered);
        self.lost_pct = (o.expected > 0).then(|| self.lost as f64 * 100.0 / o.expected as f64);
        self.duplicates = o.duplicates;
        self.reordered = o.reordered;
        self.foreign = o.foreign;
        self.completed = o.completed;
        self.duration_s = o.deliver_s;
        self.delivered_per_s = rate(o.delivered, o.deliver_s);
        self.sent_per_s = rate(o.sent, o.publish_s);
        if let Some((p50, p99, p999, max)) = percentiles_us(&o.latency) {
            self.p50_us = Some(p50);
            self.p99_us = Some(p99);
            self.p999_us = Some(p999);
            self.max_us = Some(max);
        }
        if let Some(cpu) = o.broker_cpu {
            self.broker_cpu_pct = Some(cpu.pct);
            if o.delivered > 0 {
                self.broker_cpu_us_per_msg = Some(cpu.cpu_s * 1e6 / o.delivered as f64);
            }
        }
        self.generator_cpu_pct = o.generator_cpu.map(|c| c.pct);
        if !o.completed {
            self.note = Some(format!(
                "incomplete: {} of {} delivered before the bounds ran out",
                o.delivered, o.expected
            ));
        }
    }

    /// Prints the report as an aligned two-column table.
    pub fn print(&self) {
        let mut rows: Vec<(&str, String)> = vec![
            ("scenario", format!("{} ({})", self.scenario, self.case)),
            (
                "broker",
                format!("{} ({} settings)", self.broker, self.settings),
            ),
            (
                "clients",
                format!(
                    "{} pub / {} sub, QoS {}, MQTT level {}, {} B payload",
                    self.publishers, self.subscribers, self.qos, self.protocol, self.payload
                ),
            ),
        ];
        if self.expected > 0 || self.sent > 0 {
            rows.push((
                "sent",
                format!("{} ({:.0} msg/s)", self.sent, self.sent_per_s),
            ));
            rows.push((
                "delivered",
                format!(
                    "{} of {} in {:.3} s = {:.0} msg/s",
                    self.delivered, self.expected, self.duration_s, self.delivered_per_s
                ),
            ));
            rows.push((
                "loss",
                format!(
                    "{} lost ({:.3}%), {} duplicates, {} reordered",
                    self.lost,
                    self.lost_pct.unwrap_or(0.0),
                    self.duplicates,
                    self.reordered
                ),
            ));
        }
        if let (Some(p50), Some(p99), Some(p999), Some(max)) =
            (self.p50_us, self.p99_us, self.p999_us, self.max_us)
        {
            rows.push((
                "latency",
                format!("p50 {p50:.0} us, p99 {p99:.0} us, p999 {p999:.0} us, max {max:.0} us"),
            ));
        }
        if let Some(c) = self.connect_per_s {
            rows.push(("connect rate", format!("{c:.0} connections/s")));
        }
        if let Some(b) = self.rss_per_connection_b {
            rows.push(("RSS/connection", format!("{b:.0} B")));
        }
        if let Some(s) = self.store_s {
            rows.push(("retained store", format!("{s:.3} s")));
        }
        if let Some(pct) = self.broker_cpu_pct {
            let per = self
                .broker_cpu_us_per_msg
                .map_or(String::new(), |u| format!(", {u:.2} us CPU/msg"));
            rows.push(("broker CPU", format!("{pct:.0}% of a core{per}")));
        }
        if let Some(kib) = self.broker_peak_rss_kib {
            let now = self.broker_rss_kib.map_or(String::new(), |r| {
                format!(", now {:.1} MiB", r as f64 / 1024.0)
            });
            rows.push((
                "broker memory",
                format!("peak {:.1} MiB{now}", kib as f64 / 1024.0),
            ));
        }
        if let Some(pct) = self.generator_cpu_pct {
            rows.push(("generator CPU", format!("{pct:.0}% of a core")));
        }
        if let Some(note) = &self.note {
            rows.push(("note", note.clone()));
        }
        println!("{}", "-".repeat(72));
        for (k, v) in rows {
            println!("{k:>15} | {v}");
        }
    }

    /// Appends the report as one JSON line to `path`.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or written.
    pub fn append_json(&self, path: &Path) -> Result<()> {
        let line = serde_json::to_string(self)?;
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        writeln!(f, "{line}").with_context(|| format!("write {}", path.display()))
    }
}

/// `n / secs`, 0 when no time passed.
pub fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}
