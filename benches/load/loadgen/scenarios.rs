//! The named workloads. Each is bounded in message count and in time, targets one loopback
//! broker, and returns a [`Report`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use postbox::codec::{Packet, ProtocolVersion, PubResponse, QoS};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::client::{ensure_loopback, Conn, ConnectOptions, HANDSHAKE_TIMEOUT};
use super::payload::Stamp;
use super::procfs::{self, CpuMeter};
use super::pubsub::{self, PubSubPlan, PublisherPlan, SubscriberPlan};
use super::report::{rate, Report};
use super::tracker::SeqTracker;

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
}

impl Scenario {
    /// Every scenario, in the order a comparison runs them.
    pub const ALL: [Scenario; 7] = [
        Scenario::FanIn,
        Scenario::FanOut,
        Scenario::P2p,
        Scenario::Latency,
        Scenario::Connections,
        Scenario::Retained,
        Scenario::Durable,
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

/// Everything a scenario needs; [`Params::defaults`] gives each scenario sensible sizes.
#[derive(Clone, Debug)]
pub struct Params {
    /// Broker address (loopback only).
    pub addr: SocketAddr,
    /// Broker label for the report.
    pub broker: String,
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
}

impl Params {
    /// Sizes that take a few seconds per run on a 2-core machine.
    pub fn defaults(scenario: Scenario, addr: SocketAddr) -> Params {
        let mut p = Params {
            addr,
            broker: "broker".into(),
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
            Scenario::Durable => {
                p.qos = QoS::AtLeastOnce;
                p.publishers = 4;
                p.subscribers = 4;
                p.messages = 5_000;
            }
            Scenario::Connections | Scenario::Retained => {}
        }
        p
    }
}

/// Runs one scenario and returns its report (broker CPU and memory included when
/// `broker_pid` is given).
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
        unix_time: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        qos: p.qos as u8,
        protocol: p.version as u8,
        payload: p.payload,
        ..Default::default()
    };
    match scenario {
        Scenario::Connections => connections(p, &mut report).await?,
        Scenario::Retained => retained(p, run_id, &mut report).await?,
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
        report.broker_peak_rss_kib = procfs::status_kib(pid, "VmHWM").ok();
        report.broker_rss_kib = procfs::status_kib(pid, "VmRSS").ok();
    }
    Ok(report)
}

/// A run identifier that differs between runs (clock-derived; uniqueness, not secrecy).
fn run_id() -> u32 {
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
        if !clean {
            connect.session_expiry = Some(u32::MAX);
        }
        SubscriberPlan {
            connect,
            filters: vec![(filter, p.qos)],
            expected,
        }
    };
    let (publishers, subscribers) = match scenario {
        Scenario::FanIn => {
            let n = p.publishers;
            let pubs = (0..n)
                .map(|i| publisher(i, format!("{base}/in/{i}"), n))
                .collect();
            let subs = vec![subscriber(
                0,
                format!("{base}/in/#"),
                n as u64 * p.messages,
                true,
            )];
            (pubs, subs)
        }
        Scenario::FanOut => {
            let pubs = vec![publisher(0, format!("{base}/out"), 1)];
            let subs = (0..p.subscribers)
                .map(|i| subscriber(i, format!("{base}/out"), p.messages, true))
                .collect();
            (pubs, subs)
        }
        Scenario::P2p | Scenario::Latency => {
            let k = p.pairs;
            let pubs = (0..k)
                .map(|i| publisher(i, format!("{base}/p2p/{i}"), k))
                .collect();
            let subs = (0..k)
                .map(|i| subscriber(i, format!("{base}/p2p/{i}"), p.messages, true))
                .collect();
            (pubs, subs)
        }
        Scenario::Durable => {
            let n = p.publishers;
            let pubs = (0..n)
                .map(|i| publisher(i, format!("{base}/durable/{i}"), n))
                .collect();
            let subs = (0..p.subscribers)
                .map(|i| subscriber(i, format!("{base}/durable/#"), n as u64 * p.messages, false))
                .collect();
            (pubs, subs)
        }
        Scenario::Connections | Scenario::Retained => (Vec::new(), Vec::new()),
    };
    PubSubPlan {
        addr: p.addr,
        version: p.version,
        run,
        publishers,
        subscribers,
        payload_len: p.payload,
        inflight: p.inflight,
        timeout: p.timeout,
        idle: p.idle,
        broker_pid: p.broker_pid,
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

/// Local ports used for explicitly bound client sockets: below the kernel's ephemeral
/// range, so they rarely collide with sockets of other programs.
const SOURCE_PORTS: std::ops::Range<u32> = 10_000..32_000;
/// Source addresses 127.0.0.2 ..= 127.0.0.251.
const SOURCE_HOSTS: u32 = 250;

/// The `t`-th (source address, port) pair of the space above, wrapping around. Explicit
/// ports: letting the kernel choose made it search the port range on every connect
/// (`__inet_hash_connect` took 40% of the generator's CPU at 5,000 connections).
fn source_tuple(t: u64) -> SocketAddr {
    let ports = u64::from(SOURCE_PORTS.end - SOURCE_PORTS.start);
    let t = t % (ports * u64::from(SOURCE_HOSTS));
    let host = 2 + (t / ports) as u8;
    let port = SOURCE_PORTS.start as u16 + (t % ports) as u16;
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), port)
}

/// Connects from the next free source tuple, skipping tuples that are still in use (by
/// another program, or in TIME_WAIT towards the same broker).
async fn connect_from(
    addr: SocketAddr,
    opts: &mut ConnectOptions,
    tuples: &AtomicU64,
) -> Result<Conn> {
    if !addr.is_ipv4() {
        return Conn::connect(addr, opts).await;
    }
    let mut attempt = 0;
    loop {
        opts.source = Some(source_tuple(tuples.fetch_add(1, Ordering::Relaxed)));
        match Conn::connect(addr, opts).await {
            Ok(conn) => return Ok(conn),
            Err(e) if attempt < 16 && is_addr_in_use(&e) => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

fn is_addr_in_use(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
            )
        })
    })
}

/// C idle clients: connect rate, broker RSS per connection, and a PINGREQ round to prove
/// every one of them is still served.
async fn connections(p: &Params, report: &mut Report) -> Result<()> {
    let n = p.connections;
    let limit = procfs::raise_nofile(n as u64 + 1024)?;
    if limit < n as u64 + 64 {
        bail!("open-file limit is {limit}, too low for {n} connections");
    }
    report.subscribers = n;
    report.expected = n as u64;
    let run = run_id();
    let baseline_kib = p
        .broker_pid
        .and_then(|pid| procfs::status_kib(pid, "VmRSS").ok());
    let meter = p.broker_pid.and_then(CpuMeter::start);
    let generator = CpuMeter::start(std::process::id());
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + p.timeout);
    let sem = Arc::new(Semaphore::new(p.connect_concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut conns: Vec<Conn> = Vec::with_capacity(n);
    // Start each run at a different place in the tuple space, away from the last run's.
    let tuples = Arc::new(AtomicU64::new(u64::from(run) * 7919));
    for i in 0..n {
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&sem).acquire_owned())
            .await
            .context("connections: timed out")??;
        let mut opts = ConnectOptions::new(format!("pb-{run:08x}-c{i}"), p.version);
        let (addr, subscribe, qos) = (p.addr, p.subscribe_each, p.qos);
        let tuples = Arc::clone(&tuples);
        tasks.spawn(async move {
            let _permit = permit;
            let mut conn = connect_from(addr, &mut opts, &tuples).await?;
            if subscribe {
                let filter = format!("bench/{run:08x}/dev/{i}");
                conn.subscribe(&[(filter, qos)], 1).await?;
            }
            anyhow::Ok(conn)
        });
        while let Some(done) = tasks.try_join_next() {
            conns.push(done.context("connect task panicked")??);
        }
    }
    while let Some(done) = tokio::time::timeout_at(deadline, tasks.join_next())
        .await
        .context("connections: timed out")?
    {
        conns.push(done.context("connect task panicked")??);
    }
    let connect_s = start.elapsed().as_secs_f64();
    report.connect_per_s = Some(rate(n as u64, connect_s));
    report.duration_s = connect_s;
    if let Some(cpu) = meter.and_then(|m| m.stop()) {
        report.broker_cpu_pct = Some(cpu.pct);
    }
    report.generator_cpu_pct = generator.and_then(|m| m.stop()).map(|c| c.pct);
    // Let the broker settle (lazy allocations, freed handshake buffers) before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let (Some(pid), Some(base)) = (p.broker_pid, baseline_kib) {
        if let Ok(now) = procfs::status_kib(pid, "VmRSS") {
            report.rss_per_connection_b =
                Some(now.saturating_sub(base) as f64 * 1024.0 / n.max(1) as f64);
        }
    }
    // Every connection must still be alive: one PINGREQ each, all answered.
    for conn in conns.iter_mut() {
        conn.queue(&Packet::PingReq)?;
        conn.flush().await?;
    }
    let mut alive = 0u64;
    for conn in conns.iter_mut() {
        match tokio::time::timeout_at(deadline, conn.recv()).await {
            Ok(Ok(Packet::PingResp)) => alive += 1,
            Ok(_) => {}
            Err(_) => bail!("connections: timed out waiting for PINGRESP"),
        }
    }
    report.delivered = alive;
    report.lost = report.expected - alive;
    report.completed = alive == n as u64;
    if !report.completed {
        report.note = Some(format!(
            "{} of {n} connections did not answer PINGREQ",
            n as u64 - alive
        ));
    }
    // Measure memory while the clients are still connected.
    if let Some(pid) = p.broker_pid {
        report.broker_peak_rss_kib = procfs::status_kib(pid, "VmHWM").ok();
        report.broker_rss_kib = procfs::status_kib(pid, "VmRSS").ok();
    }
    for conn in conns {
        conn.abort();
    }
    Ok(())
}

/// R retained messages stored (QoS 1, pipelined), then one subscriber to `#` receives them:
/// `duration_s` is the time from SUBSCRIBE to the last one.
async fn retained(p: &Params, run: u32, report: &mut Report) -> Result<()> {
    let n = p.retained as u64;
    report.publishers = 1;
    report.subscribers = 1;
    let base = format!("bench/{run:08x}/retained");
    let started = Instant::now();
    store_retained(p, run, &base).await?;
    let store_s = started.elapsed().as_secs_f64();
    report.store_s = Some(store_s);
    report.sent = n;
    report.sent_per_s = rate(n, store_s);

    let meter = p.broker_pid.and_then(CpuMeter::start);
    let generator = CpuMeter::start(std::process::id());
    let mut conn = Conn::connect(
        p.addr,
        &ConnectOptions::new(format!("pb-{run:08x}-rs"), p.version),
    )
    .await?;
    let mut tracker = SeqTracker::new(run, vec![n]);
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + p.timeout);
    let mut pending = conn.subscribe(&[("#".to_string(), p.qos)], 1).await?;
    let mut last_new = start;
    let mut completed = true;
    while tracker.unique < n {
        let before = tracker.unique;
        for packet in pending.drain(..) {
            retained_packet(&mut conn, &mut tracker, packet)?;
        }
        while let Some(packet) = conn.next_packet()? {
            retained_packet(&mut conn, &mut tracker, packet)?;
        }
        if tracker.unique > before {
            last_new = Instant::now();
        }
        conn.flush().await?;
        if tracker.unique >= n {
            break;
        }
        let idle_deadline = tokio::time::Instant::from_std(last_new + p.idle).min(deadline);
        match tokio::time::timeout_at(idle_deadline, conn.read_more()).await {
            Ok(read) => {
                read?;
            }
            Err(_) => {
                completed = false;
                break;
            }
        }
    }
    let duration = (last_new - start).as_secs_f64();
    if let Some(cpu) = meter.and_then(|m| m.stop()) {
        report.broker_cpu_pct = Some(cpu.pct);
        if tracker.unique > 0 {
            report.broker_cpu_us_per_msg = Some(cpu.cpu_s * 1e6 / tracker.unique as f64);
        }
    }
    report.generator_cpu_pct = generator.and_then(|m| m.stop()).map(|c| c.pct);
    conn.disconnect().await;
    report.expected = n;
    report.delivered = tracker.unique;
    report.lost = n - tracker.unique.min(n);
    report.duplicates = tracker.duplicates;
    report.completed = completed;
    report.duration_s = duration;
    report.delivered_per_s = rate(tracker.unique, duration);
    if !completed {
        report.note = Some(format!(
            "incomplete: {} of {n} retained messages",
            tracker.unique
        ));
    }
    // Leave no retained messages behind for a broker that keeps running: clear them.
    clear_retained(p, run, &base).await?;
    Ok(())
}

/// Topic of the `i`-th retained message.
fn store_topic(base: &str, i: u64) -> String {
    format!("{base}/{}/{}", i / 1000, i % 1000)
}

/// Publishes the retained set (topics spread over two levels, 1,000 per branch, as device
/// fleets do) with a window of unacknowledged QoS 1 messages.
async fn store_retained(p: &Params, run: u32, base: &str) -> Result<()> {
    let opts = ConnectOptions::new(format!("pb-{run:08x}-rp"), p.version);
    let mut conn = Conn::connect(p.addr, &opts).await?;
    let mut payload = vec![0u8; p.payload];
    let deadline = tokio::time::Instant::from_std(Instant::now() + p.timeout);
    let window = p.inflight.clamp(1, 65_000);
    let count = p.retained as u64;
    let (mut next, mut inflight, mut packet_id) = (0u64, 0usize, 0u16);
    while next < count || inflight > 0 {
        while next < count && inflight < window {
            let stamp = Stamp {
                run,
                publisher: 0,
                seq: next,
                sent_ns: 0,
            };
            stamp.write(&mut payload);
            packet_id = packet_id.checked_add(1).unwrap_or(1);
            let topic = store_topic(base, next);
            conn.queue_publish(&topic, QoS::AtLeastOnce, packet_id, true, &payload)?;
            next += 1;
            inflight += 1;
        }
        conn.flush().await?;
        match tokio::time::timeout_at(deadline, conn.read_more()).await {
            Ok(read) => {
                read?;
            }
            Err(_) => bail!("retained: timed out storing messages"),
        }
        while let Some(packet) = conn.next_packet()? {
            if let Packet::PubAck(_) = packet {
                inflight = inflight.saturating_sub(1);
            }
        }
    }
    conn.disconnect().await;
    Ok(())
}

/// Deletes the retained set (empty retained PUBLISH per topic, QoS 0, then a QoS 1 fence).
async fn clear_retained(p: &Params, run: u32, base: &str) -> Result<()> {
    let mut conn = Conn::connect(
        p.addr,
        &ConnectOptions::new(format!("pb-{run:08x}-rc"), p.version),
    )
    .await?;
    for i in 0..p.retained as u64 {
        conn.queue_publish(&store_topic(base, i), QoS::AtMostOnce, 0, true, &[])?;
        if conn.wbuf.len() > 64 * 1024 {
            conn.flush().await?;
        }
    }
    conn.queue_publish(&format!("{base}/fence"), QoS::AtLeastOnce, 1, false, &[])?;
    conn.flush().await?;
    loop {
        match conn.recv_within(HANDSHAKE_TIMEOUT).await? {
            Packet::PubAck(_) => break,
            _ => continue,
        }
    }
    conn.disconnect().await;
    Ok(())
}

/// One packet on the retained subscriber.
fn retained_packet(conn: &mut Conn, tracker: &mut SeqTracker, packet: Packet) -> Result<()> {
    match packet {
        Packet::Publish(publish) => {
            match Stamp::read(&publish.payload) {
                Some(stamp) => {
                    tracker.record(&stamp);
                }
                None => tracker.foreign += 1,
            }
            let id = publish.packet_id;
            match publish.qos {
                QoS::AtMostOnce => Ok(()),
                QoS::AtLeastOnce => conn.queue(&Packet::PubAck(PubResponse::new(id))),
                QoS::ExactlyOnce => conn.queue(&Packet::PubRec(PubResponse::new(id))),
            }
        }
        Packet::PubRel(rel) => conn.queue(&Packet::PubComp(PubResponse::new(rel.packet_id))),
        _ => Ok(()),
    }
}
