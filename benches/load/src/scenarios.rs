//! The named workloads. Each is bounded in message count and in time, targets one loopback
//! broker, and returns a [`Report`].

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use postbox::codec::{ProtocolVersion, QoS};

use crate::client::{ensure_loopback, Conn, ConnectOptions};
use crate::pubsub::{self, PubSubPlan, PublisherPlan, SubscriberPlan};
use crate::report::Report;
use crate::transport::TlsClient;
use crate::{connections, handshakes, procfs, retained};

/// The workloads the generator knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// N publishers → 1 wildcard subscriber.
    FanIn,
    /// 1 publisher → M subscribers of one topic.
    FanOut,
    /// K publisher/subscriber pairs, each on its own topic.
    P2p,
    /// K pairs at a fixed total offered rate: latency percentiles rather than throughput.
    Latency,
    /// C idle clients: connect rate and broker memory per connection.
    Connections,
    /// R retained topics stored, then one `#` subscriber receives them all.
    Retained,
    /// N publishers → M persistent-session subscribers (clean session off), QoS 1.
    Durable,
    /// C short-lived clients, a fixed number at a time: connect (TLS handshake with
    /// `--tls-ca`), CONNECT/CONNACK, DISCONNECT, until the broker has closed. Handshakes/s.
    Handshakes,
    /// N publishers → one shared group (`$share/bench/...`) of M members: each message
    /// once, to any member (a work queue).
    Shared,
}

impl Scenario {
    /// Every scenario, in the order a comparison runs them.
    pub const ALL: [Scenario; 9] = [
        Scenario::FanIn,
        Scenario::FanOut,
        Scenario::P2p,
        Scenario::Latency,
        Scenario::Connections,
        Scenario::Retained,
        Scenario::Durable,
        Scenario::Handshakes,
        Scenario::Shared,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::FanIn => "fan-in",
            Scenario::FanOut => "fan-out",
            Scenario::P2p => "p2p",
            Scenario::Latency => "latency",
            Scenario::Connections => "connections",
            Scenario::Retained => "retained",
            Scenario::Durable => "durable",
            Scenario::Handshakes => "handshakes",
            Scenario::Shared => "shared",
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Scenario::ALL.iter().map(|s| s.name()).collect();
                format!("unknown scenario `{s}` (one of: {})", names.join(", "))
            })
    }
}

/// Which settings the measured broker runs with. The generator drives both the same way; the
/// label goes into the report, and decides whether loss fails the run (see `postbox-bench
/// run --settings`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BrokerSettings {
    /// Equal, generous limits for every broker (compare.sh's main set): any loss at QoS >= 1
    /// is a failure.
    #[default]
    Tuned,
    /// Each broker on its own defaults: its queue limits may drop messages, and how many is
    /// the figure measured.
    Defaults,
}

impl BrokerSettings {
    /// The name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            BrokerSettings::Tuned => "tuned",
            BrokerSettings::Defaults => "defaults",
        }
    }
}

impl FromStr for BrokerSettings {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tuned" => Ok(BrokerSettings::Tuned),
            "defaults" => Ok(BrokerSettings::Defaults),
            other => Err(format!(
                "unknown settings `{other}` (one of: tuned, defaults)"
            )),
        }
    }
}

/// Whether a finished run counts as failed (`postbox-bench run` exits 1): tuned, when
/// messages that must arrive did not (QoS >= 1, every retained message, every idle
/// connection); on a broker's defaults loss is the figure measured, so only a run that
/// delivered nothing of what it expected fails.
pub fn run_failed(scenario: Scenario, settings: BrokerSettings, report: &Report) -> bool {
    match settings {
        BrokerSettings::Tuned => {
            let must_arrive = report.qos > 0
                || matches!(
                    scenario,
                    Scenario::Connections | Scenario::Retained | Scenario::Handshakes
                );
            must_arrive && (report.lost > 0 || !report.completed)
        }
        BrokerSettings::Defaults => report.expected > 0 && report.delivered == 0,
    }
}

/// Everything a scenario needs; [`Params::defaults`] gives each scenario sensible sizes.
#[derive(Clone, Debug)]
pub struct Params {
    /// Broker address (loopback only).
    pub addr: SocketAddr,
    /// Where subscribers connect, when not `addr` (another cluster node).
    pub subscribe_addr: Option<SocketAddr>,
    /// Broker label for the report.
    pub broker: String,
    /// Which settings the broker runs with (a label in the report).
    pub settings: BrokerSettings,
    /// Case label for comparisons; defaults to `<scenario>-q<qos>`.
    pub case: Option<String>,
    /// Protocol level of every client.
    pub version: ProtocolVersion,
    /// QoS of publishes and subscriptions.
    pub qos: QoS,
    /// Publishers (fan-in, durable).
    pub publishers: usize,
    /// Subscribers (fan-out, durable).
    pub subscribers: usize,
    /// Publisher/subscriber pairs (p2p, latency).
    pub pairs: usize,
    /// Messages per publisher.
    pub messages: u64,
    /// Payload bytes.
    pub payload: usize,
    /// Total offered rate in messages/s (`None` = unthrottled).
    pub rate: Option<f64>,
    /// Outstanding QoS 1/2 messages per publisher.
    pub inflight: usize,
    /// Hard bound on a run's message phase.
    pub timeout: Duration,
    /// Stop waiting for missing messages after this long without any.
    pub idle: Duration,
    /// Broker process to measure (CPU, RSS).
    pub broker_pid: Option<u32>,
    /// Idle clients (connections).
    pub connections: usize,
    /// Handshakes in progress at once (connections).
    pub connect_concurrency: usize,
    /// Each idle client also subscribes to its own topic (connections).
    pub subscribe_each: bool,
    /// Retained topics (retained).
    pub retained: usize,
    /// TLS for every client (`--tls-ca`); plain TCP when `None`.
    pub tls: Option<Arc<TlsClient>>,
    /// A v5 user property with a value unique per PUBLISH (`--message-id-property`).
    pub message_id_property: Option<String>,
    /// A fixed payload read from `--payload-file` (message-flow scenarios), replacing
    /// `payload` zeros.
    pub payload_template: Option<Arc<[u8]>>,
    /// The v5 Content Type of every PUBLISH (`--content-type`).
    pub content_type: Option<String>,
}

impl Params {
    /// Sizes that take a few seconds per run on a 2-core machine.
    pub fn defaults(scenario: Scenario, addr: SocketAddr) -> Params {
        let mut p = Params {
            addr,
            subscribe_addr: None,
            broker: "broker".into(),
            settings: BrokerSettings::Tuned,
            case: None,
            version: ProtocolVersion::V3_1_1,
            qos: QoS::AtMostOnce,
            publishers: 1,
            subscribers: 1,
            pairs: 1,
            messages: 10_000,
            payload: 64,
            rate: None,
            inflight: 100,
            timeout: Duration::from_secs(60),
            idle: Duration::from_secs(2),
            broker_pid: None,
            connections: 10_000,
            connect_concurrency: 64,
            subscribe_each: false,
            retained: 100_000,
            tls: None,
            message_id_property: None,
            payload_template: None,
            content_type: None,
        };
        match scenario {
            Scenario::FanIn => {
                p.publishers = 8;
                p.messages = 25_000;
            }
            Scenario::FanOut => {
                p.subscribers = 50;
                p.messages = 4_000;
            }
            Scenario::P2p => {
                p.qos = QoS::AtLeastOnce;
                p.pairs = 50;
                p.messages = 2_000;
            }
            Scenario::Latency => {
                p.qos = QoS::AtLeastOnce;
                p.pairs = 10;
                p.messages = 3_000;
                p.rate = Some(10_000.0);
            }
            Scenario::Durable | Scenario::Shared => {
                p.qos = QoS::AtLeastOnce;
                p.publishers = 4;
                p.subscribers = 4;
                p.messages = 5_000;
            }
            Scenario::Handshakes => p.connections = 5_000,
            Scenario::Connections | Scenario::Retained => {}
        }
        p
    }
}

/// Runs one scenario and returns its report (broker CPU and memory included when
/// `broker_pid` is given).
///
/// # Errors
///
/// A non-loopback broker address, or the scenario's own error (broker CPU and memory are
/// best effort).
pub async fn run(scenario: Scenario, p: &Params) -> Result<Report> {
    ensure_loopback(p.addr)?;
    let run_id = run_id();
    let mut report = Report {
        scenario: scenario.name().into(),
        case: p
            .case
            .clone()
            .unwrap_or_else(|| format!("{}-q{}", scenario.name(), p.qos as u8)),
        broker: p.broker.clone(),
        settings: p.settings.name().into(),
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        qos: p.qos as u8,
        protocol: p.version as u8,
        payload: p.payload,
        ..Default::default()
    };
    match scenario {
        Scenario::Connections => connections::run(p, &mut report).await?,
        Scenario::Retained => retained::run(p, run_id, &mut report).await?,
        Scenario::Handshakes => handshakes::run(p, &mut report).await?,
        _ => {
            let plan = pubsub_plan(scenario, p, run_id);
            report.publishers = plan.publishers.len();
            report.subscribers = plan.subscribers.len();
            let cleanup: Vec<ConnectOptions> = plan
                .subscribers
                .iter()
                .filter(|s| !s.connect.clean)
                .map(|s| s.connect.clone())
                .collect();
            let outcome = pubsub::run(plan).await?;
            report.absorb(&outcome);
            end_sessions(p.addr, cleanup).await;
        }
    }
    if let Some(pid) = p.broker_pid {
        // Scenarios that measure memory at a better moment (connections) have set these.
        if report.broker_peak_rss_kib.is_none() {
            report.broker_peak_rss_kib = procfs::status_kib(pid, "VmHWM").ok();
        }
        if report.broker_rss_kib.is_none() {
            report.broker_rss_kib = procfs::status_kib(pid, "VmRSS").ok();
        }
    }
    Ok(report)
}

/// A run identifier that differs between runs (clock-derived; uniqueness, not secrecy).
pub(super) fn run_id() -> u32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u32) ^ ((nanos >> 32) as u32) ^ std::process::id().rotate_left(16)
}

/// Builds the publishers and subscribers of a message-flow scenario.
pub fn pubsub_plan(scenario: Scenario, p: &Params, run: u32) -> PubSubPlan {
    let base = format!("bench/{run:08x}");
    let id = |role: &str, i: usize| format!("pb-{run:08x}-{role}{i}");
    let publisher = |i: usize, topic: String, n_pubs: usize| PublisherPlan {
        client_id: id("p", i),
        topic,
        qos: p.qos,
        count: p.messages,
        rate: p.rate.map(|r| r / n_pubs.max(1) as f64),
        retain: false,
    };
    let subscriber = |i: usize, filter: String, expected: u64, clean: bool| {
        let mut connect = ConnectOptions::new(id("s", i), p.version);
        connect.clean = clean;
        connect.tls.clone_from(&p.tls);
        if !clean {
            connect.session_expiry = Some(u32::MAX);
        }
        SubscriberPlan {
            connect,
            filters: vec![(filter, p.qos)],
            expected,
        }
    };
    // `n` publishers, the i-th to `{base}/{prefix}/{i}`, sharing the rate.
    let numbered_publishers = |prefix: &str, n: usize| -> Vec<PublisherPlan> {
        (0..n)
            .map(|i| publisher(i, format!("{base}/{prefix}/{i}"), n))
            .collect()
    };
    // `n` subscribers, the i-th to `filter(i)`.
    let subscribers = |n: usize, filter: &dyn Fn(usize) -> String, expected: u64, clean: bool| {
        (0..n)
            .map(|i| subscriber(i, filter(i), expected, clean))
            .collect::<Vec<_>>()
    };
    let (publishers, subscribers) = match scenario {
        Scenario::FanIn => {
            let n = p.publishers;
            let pubs = numbered_publishers("in", n);
            let subs = subscribers(1, &|_| format!("{base}/in/#"), n as u64 * p.messages, true);
            (pubs, subs)
        }
        Scenario::FanOut => {
            let pubs = vec![publisher(0, format!("{base}/out"), 1)];
            let subs = subscribers(p.subscribers, &|_| format!("{base}/out"), p.messages, true);
            (pubs, subs)
        }
        Scenario::P2p | Scenario::Latency => {
            let pubs = numbered_publishers("p2p", p.pairs);
            let subs = subscribers(p.pairs, &|i| format!("{base}/p2p/{i}"), p.messages, true);
            (pubs, subs)
        }
        Scenario::Durable => {
            let n = p.publishers;
            let pubs = numbered_publishers("durable", n);
            let filter = |_| format!("{base}/durable/#");
            let subs = subscribers(p.subscribers, &filter, n as u64 * p.messages, false);
            (pubs, subs)
        }
        Scenario::Shared => {
            let pubs = numbered_publishers("jobs", p.publishers);
            // The group as a whole must receive every message (`group_expected`).
            let filter = |_| format!("$share/bench/{base}/jobs/#");
            let subs = subscribers(p.subscribers, &filter, 0, true);
            (pubs, subs)
        }
        Scenario::Connections | Scenario::Retained | Scenario::Handshakes => {
            (Vec::new(), Vec::new())
        }
    };
    let group_expected = match scenario {
        Scenario::Shared => p.publishers as u64 * p.messages,
        _ => 0,
    };
    PubSubPlan {
        addr: p.addr,
        subscribe_addr: p.subscribe_addr,
        version: p.version,
        run,
        publishers,
        subscribers,
        payload_len: p.payload,
        payload_template: p.payload_template.clone(),
        content_type: p.content_type.clone(),
        inflight: p.inflight,
        timeout: p.timeout,
        idle: p.idle,
        broker_pid: p.broker_pid,
        tls: p.tls.clone(),
        message_id_property: p.message_id_property.clone(),
        group_expected,
    }
}

/// Discards persistent sessions left by a run (connect with clean session, disconnect), so
/// a broker that keeps running does not queue for them forever. Best effort.
async fn end_sessions(addr: SocketAddr, sessions: Vec<ConnectOptions>) {
    for mut opts in sessions {
        opts.clean = true;
        opts.session_expiry = None;
        if let Ok(conn) = Conn::connect(addr, &opts).await {
            conn.disconnect().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(qos: u8, expected: u64, delivered: u64) -> Report {
        Report {
            qos,
            expected,
            delivered,
            lost: expected - delivered,
            completed: delivered == expected,
            ..Default::default()
        }
    }

    #[test]
    fn loss_fails_tuned_runs_only() {
        let lossy = report(1, 100, 60);
        assert!(run_failed(Scenario::FanIn, BrokerSettings::Tuned, &lossy));
        assert!(!run_failed(
            Scenario::FanIn,
            BrokerSettings::Defaults,
            &lossy
        ));
        // QoS 0 may lose on tuned settings too.
        assert!(!run_failed(
            Scenario::FanIn,
            BrokerSettings::Tuned,
            &report(0, 100, 60)
        ));
        // Nothing delivered is a broken run, even on defaults.
        let none = report(0, 100, 0);
        assert!(run_failed(Scenario::FanIn, BrokerSettings::Defaults, &none));
        assert!(!run_failed(
            Scenario::FanIn,
            BrokerSettings::Tuned,
            &report(1, 100, 100)
        ));
        assert_eq!("defaults".parse(), Ok(BrokerSettings::Defaults));
        assert!("default".parse::<BrokerSettings>().is_err());
    }
}
