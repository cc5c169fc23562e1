//! `postbox-bench`: load generator for measuring MQTT brokers side by side.
//!
//! Runs one bounded scenario against one loopback broker and prints delivered msgs/s, loss,
//! latency percentiles and the broker's CPU and memory; `--json FILE` appends the same as a
//! JSON line, which `summarize` folds into Postbox/other-broker ratios (see benches/README.md).
//! The engine is this package's library, `loadgen` (src/lib.rs).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use loadgen::client::ensure_loopback;
use loadgen::scenarios::{self, BrokerSettings, Params, Scenario};
use loadgen::transport::TlsClient;
use postbox::codec::{ProtocolVersion, QoS};

#[derive(Parser)]
#[command(
    name = "postbox-bench",
    version,
    about = "Bounded MQTT load generator (loopback only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario: fan-in, fan-out, p2p, latency, connections, retained, durable,
    /// handshakes.
    Run(Box<RunArgs>),
    /// Print the median/ratio table of JSON-lines results files (read as one).
    Summarize {
        /// Files written by `run --json`; several are read as one, e.g. a `--only defaults`
        /// run with an earlier tuned run for the defaults/tuned ratios.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a TCP port that is free on 127.0.0.1 right now.
    FreePort,
    /// Wait until something accepts TCP connections at ADDR (exit 1 after the timeout).
    WaitPort {
        /// Loopback address, e.g. 127.0.0.1:1883.
        addr: SocketAddr,
        /// Seconds to wait.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
}

/// Scenario options; any left out take the scenario's default (shown by `--help` of each
/// field as "scenario default").
#[derive(Args)]
struct RunArgs {
    /// Scenario name.
    scenario: Scenario,
    /// Broker address; only loopback addresses are accepted.
    #[arg(long, default_value = "127.0.0.1:1883")]
    host: SocketAddr,
    /// Subscribers connect here instead of `--host` (another node of a cluster: cross-node
    /// delivery); loopback only.
    #[arg(long)]
    subscribe_host: Option<SocketAddr>,
    /// Name of the broker in the report (postbox, mosquitto, ...).
    #[arg(long, default_value = "broker")]
    broker: String,
    /// Settings the broker runs with, recorded in the report: `tuned` (equal limits for every
    /// broker) or `defaults` (each broker on its own defaults). With `defaults`, loss is the
    /// figure measured and does not fail the run (exit 0); a run that delivers nothing at all
    /// still does.
    #[arg(long, default_value = "tuned")]
    settings: BrokerSettings,
    /// Case name in comparisons [default: <scenario>-q<qos>].
    #[arg(long)]
    case: Option<String>,
    /// MQTT protocol level: 4 (3.1.1) or 5 (5.0).
    #[arg(long, default_value_t = 4)]
    protocol: u8,
    /// QoS of publishes and subscriptions [scenario default].
    #[arg(long)]
    qos: Option<u8>,
    /// Publishers (fan-in, durable) [scenario default].
    #[arg(long)]
    publishers: Option<usize>,
    /// Subscribers (fan-out, durable) [scenario default].
    #[arg(long)]
    subscribers: Option<usize>,
    /// Publisher/subscriber pairs (p2p, latency) [scenario default].
    #[arg(long)]
    pairs: Option<usize>,
    /// Messages per publisher [scenario default].
    #[arg(long)]
    messages: Option<u64>,
    /// Payload bytes (at least 24, the stamp) [default: 64].
    #[arg(long)]
    payload: Option<usize>,
    /// Send this file's bytes as every payload (fan-in, fan-out, p2p, latency, durable),
    /// e.g. a JSON document a `[[schema]]` checks; the stamp goes in hex in place of its first
    /// run of 48 ASCII `0`s, which it must have. Overrides --payload.
    #[arg(long)]
    payload_file: Option<PathBuf>,
    /// v5 Content Type of every PUBLISH (e.g. a `[[schema]]` id); needs --protocol 5.
    #[arg(long)]
    content_type: Option<String>,
    /// Total offered rate, messages/s; 0 = unthrottled [scenario default].
    #[arg(long)]
    rate: Option<f64>,
    /// Unacknowledged QoS 1/2 messages per publisher [default: 100].
    #[arg(long)]
    inflight: Option<usize>,
    /// Hard bound on the run, seconds [default: 60].
    #[arg(long)]
    timeout: Option<f64>,
    /// Give up on missing messages after this many seconds without any [default: 2].
    #[arg(long)]
    idle: Option<f64>,
    /// Broker process id, for its CPU and memory from /proc.
    #[arg(long)]
    broker_pid: Option<u32>,
    /// Idle clients (connections), or clients in all (handshakes) [default: 10000; handshakes
    /// 5000].
    #[arg(long)]
    connections: Option<usize>,
    /// Handshakes in progress at once (connections, handshakes) [default: 64; above the
    /// broker's listen backlog, SYNs are dropped and retried after 1 s].
    #[arg(long)]
    connect_concurrency: Option<usize>,
    /// Each idle client also subscribes to its own topic (connections).
    #[arg(long)]
    subscribe_each: bool,
    /// Retained topics (retained) [default: 100000].
    #[arg(long)]
    retained: Option<usize>,
    /// Append the report as a JSON line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runtime worker threads [default: CPUs this process may use; 1 = single-threaded].
    #[arg(long)]
    threads: Option<usize>,
    /// Speak TLS, trusting the CA certificates in this PEM file (e.g. certs/ca.pem); every
    /// handshake is a full one (no resumption).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) to present over TLS; needs --tls-key.
    #[arg(long, requires = "tls_key", requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Name the broker's certificate must carry.
    #[arg(long, default_value = "localhost")]
    tls_server_name: String,
    /// Give every PUBLISH a user property NAME with a value unique to that message (run,
    /// publisher, sequence number), as a producer keyed for `[dedup]` does; needs --protocol 5.
    #[arg(long, value_name = "NAME")]
    message_id_property: Option<String>,
}

impl RunArgs {
    fn params(&self) -> Result<Params> {
        ensure_loopback(self.host)?;
        let mut p = Params::defaults(self.scenario, self.host);
        if let Some(addr) = self.subscribe_host {
            ensure_loopback(addr)?;
            p.subscribe_addr = Some(addr);
        }
        p.broker = self.broker.clone();
        p.settings = self.settings;
        p.case = self.case.clone();
        p.version = match self.protocol {
            4 => ProtocolVersion::V3_1_1,
            5 => ProtocolVersion::V5,
            other => bail!("--protocol must be 4 or 5, got {other}"),
        };
        if let Some(q) = self.qos {
            p.qos = QoS::from_u8(q).with_context(|| format!("--qos must be 0, 1 or 2, got {q}"))?;
        }
        let set = |dst: &mut usize, v: Option<usize>| {
            if let Some(v) = v {
                *dst = v;
            }
        };
        set(&mut p.publishers, self.publishers);
        set(&mut p.subscribers, self.subscribers);
        set(&mut p.pairs, self.pairs);
        set(&mut p.payload, self.payload);
        set(&mut p.inflight, self.inflight);
        set(&mut p.connections, self.connections);
        set(&mut p.connect_concurrency, self.connect_concurrency);
        set(&mut p.retained, self.retained);
        if let Some(m) = self.messages {
            p.messages = m;
        }
        if let Some(r) = self.rate {
            p.rate = (r > 0.0).then_some(r);
        }
        if let Some(t) = self.timeout {
            p.timeout = secs(t, "--timeout")?;
        }
        if let Some(t) = self.idle {
            p.idle = secs(t, "--idle")?;
        }
        if let Some(path) = &self.payload_file {
            let bytes = std::fs::read(path)
                .with_context(|| format!("--payload-file {}", path.display()))?;
            p.payload = bytes.len();
            p.payload_template = Some(bytes.into());
        }
        if self.content_type.is_some() && p.version != ProtocolVersion::V5 {
            bail!("--content-type needs --protocol 5 (3.x has no properties)");
        }
        p.content_type.clone_from(&self.content_type);
        p.broker_pid = self.broker_pid;
        p.subscribe_each = self.subscribe_each;
        if let Some(name) = &self.message_id_property {
            if p.version != ProtocolVersion::V5 {
                bail!("--message-id-property needs --protocol 5 (3.x has no user properties)");
            }
            p.message_id_property = Some(name.clone());
        }
        if let Some(ca) = &self.tls_ca {
            let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
            p.tls = Some(Arc::new(TlsClient::new(
                ca,
                identity,
                &self.tls_server_name,
            )?));
        }
        Ok(p)
    }
}

fn secs(v: f64, flag: &str) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0 && v <= 3600.0) {
        bail!("{flag} must be between 0 and 3600 seconds, got {v}");
    }
    Ok(Duration::from_secs_f64(v))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("postbox-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn execute(command: Command) -> Result<ExitCode> {
    match command {
        Command::Run(args) => run(&args),
        Command::Summarize { files } => {
            let mut rows = Vec::new();
            for file in &files {
                rows.extend(loadgen::summary::load(file)?);
            }
            print!("{}", loadgen::summary::render(&rows));
            Ok(ExitCode::SUCCESS)
        }
        Command::FreePort => {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", listener.local_addr()?.port());
            Ok(ExitCode::SUCCESS)
        }
        Command::WaitPort { addr, timeout } => {
            ensure_loopback(addr)?;
            let until = Instant::now() + secs(timeout, "--timeout")?;
            while Instant::now() < until {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(ExitCode::SUCCESS);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("postbox-bench: nothing listening at {addr}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Runs one scenario; exit status 1 when [`scenarios::run_failed`] says so (messages that
/// must arrive did not; on `--settings defaults` only when nothing arrived), so scripts
/// notice without parsing the output.
fn run(args: &RunArgs) -> Result<ExitCode> {
    let params = args.params()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    let report = runtime.block_on(scenarios::run(args.scenario, &params))?;
    report.print();
    if let Some(path) = &args.json {
        report.append_json(path)?;
    }
    let failed = scenarios::run_failed(args.scenario, args.settings, &report);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
