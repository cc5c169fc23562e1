//! The `connections` scenario: many idle clients, their connect rate and what each costs the
//! broker in memory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use postbox::codec::Packet;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{connect_packet, Conn, ConnectOptions};
use crate::procfs::{self, CpuMeter};
use crate::report::{rate, Report};
use crate::scenarios::{run_id, Params};

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
/// another program, or in `TIME_WAIT` towards the same broker).
pub(crate) async fn connect_from(
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

/// What the timed part produced: clients, or sockets past CONNACK still to be handed to tokio.
enum Connected {
    Clients(Vec<Conn>),
    Sockets(Vec<std::net::TcpStream>),
}

/// The handshakes as one tokio task each: for IPv6 brokers, for TLS, and when every client
/// also subscribes (the burst only does plain-TCP CONNECT / CONNACK).
async fn connect_with_tasks(
    p: &Params,
    run: u32,
    tuples: &Arc<AtomicU64>,
    deadline: tokio::time::Instant,
) -> Result<Vec<Conn>> {
    let n = p.connections;
    let sem = Arc::new(Semaphore::new(p.connect_concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut conns: Vec<Conn> = Vec::with_capacity(n);
    for i in 0..n {
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&sem).acquire_owned())
            .await
            .context("connections: timed out")??;
        let mut opts = ConnectOptions::new(format!("pb-{run:08x}-c{i}"), p.version);
        // Idle clients send nothing timed after CONNECT, so Nagle cannot delay anything
        // measured; the system call is saved (the generator's core is the bottleneck here).
        opts.nodelay = p.subscribe_each;
        opts.reuse_source = false;
        opts.tls.clone_from(&p.tls);
        let (addr, subscribe, qos) = (p.addr, p.subscribe_each, p.qos);
        let tuples = Arc::clone(tuples);
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
    Ok(conns)
}

/// C idle clients: connect rate, broker RSS per connection, and a PINGREQ round to prove
/// every one of them is still served.
///
/// # Errors
///
/// When the open-file limit cannot be raised, or connecting or pinging a client fails.
pub async fn run(p: &Params, report: &mut Report) -> Result<()> {
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
    // Start each run at a different place in the tuple space, away from the last run's.
    let tuples = Arc::new(AtomicU64::new(u64::from(run) * 7919));
    let connected = match p.addr {
        // The timed part without the runtime (see `burst`). It never yields: on the
        // generator's own single-threaded runtime it simply runs on this thread (a hop to the
        // blocking pool cost a third of the rate); on a multi-threaded runtime (the harness
        // test, with the broker in-process) `block_in_place` moves the other tasks away first.
        SocketAddr::V4(broker) if !p.subscribe_each && p.tls.is_none() => {
            let (version, concurrency, until) =
                (p.version, p.connect_concurrency, start + p.timeout);
            let burst = || {
                crate::burst::connect_all(
                    broker,
                    n,
                    concurrency,
                    version,
                    || match source_tuple(tuples.fetch_add(1, Ordering::Relaxed)) {
                        SocketAddr::V4(v4) => v4,
                        SocketAddr::V6(_) => unreachable!("source tuples are IPv4"),
                    },
                    |i| {
                        let opts = ConnectOptions::new(format!("pb-{run:08x}-c{i}"), version);
                        let mut buf = BytesMut::new();
                        postbox::codec::encode(&connect_packet(&opts), version, &mut buf)
                            .map_err(|e| anyhow::anyhow!("encode CONNECT: {e}"))?;
                        Ok(buf)
                    },
                    until,
                )
            };
            let streams = match tokio::runtime::Handle::current().runtime_flavor() {
                tokio::runtime::RuntimeFlavor::CurrentThread => burst()?,
                _ => tokio::task::block_in_place(burst)?,
            };
            Connected::Sockets(streams)
        }
        _ => Connected::Clients(connect_with_tasks(p, run, &tuples, deadline).await?),
    };
    let connect_s = start.elapsed().as_secs_f64();
    report.connect_per_s = Some(rate(n as u64, connect_s));
    report.duration_s = connect_s;
    if let Some(cpu) = meter.and_then(|m| m.stop()) {
        report.broker_cpu_pct = Some(cpu.pct);
    }
    report.generator_cpu_pct = generator.and_then(|m| m.stop()).map(|c| c.pct);
    let mut conns = match connected {
        Connected::Clients(conns) => conns,
        Connected::Sockets(streams) => streams
            .into_iter()
            .map(|s| Conn::from_connected(s, p.version))
            .collect::<Result<Vec<_>>>()?,
    };
    // Let the broker settle (lazy allocations, freed handshake buffers) before measuring.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let (Some(pid), Some(base)) = (p.broker_pid, baseline_kib) {
        if let Ok(now) = procfs::status_kib(pid, "VmRSS") {
            report.rss_per_connection_b =
                Some(now.saturating_sub(base) as f64 * 1024.0 / n.max(1) as f64);
        }
    }
    // Every connection must still be alive: one PINGREQ each, all answered.
    for conn in &mut conns {
        conn.queue(&Packet::PingReq)?;
        conn.flush().await?;
    }
    let mut alive = 0u64;
    for conn in &mut conns {
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
