//! The `handshakes` scenario: how many clients per second a broker takes from connect to
//! goodbye. Each client opens a socket (plus a full TLS handshake with `--tls-ca`), sends
//! CONNECT, waits for CONNACK, sends DISCONNECT and waits until the broker has closed; a fixed
//! number run at once, a fixed number in all. The reconnect storm after a broker restart, or a
//! fleet of devices that connect, publish once and leave.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::ConnectOptions;
use crate::connections::connect_from;
use crate::procfs::{self, CpuMeter};
use crate::report::{rate, Report};
use crate::scenarios::{run_id, Params};

/// How long a broker may take to close after DISCONNECT before the run is called broken.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// `p.connections` clients, `p.connect_concurrency` at a time: handshakes/s
/// (`connect_per_s`), broker CPU per handshake (`broker_cpu_us_per_msg`, a "message" being
/// one whole client here) and the generator's CPU (the TLS client side costs about as much
/// as the server side, so watch it).
///
/// # Errors
///
/// The open-file limit cannot be raised, a client failed (connect, TLS, CONNACK, close), or
/// the run's timeout passed.
pub async fn run(p: &Params, report: &mut Report) -> Result<()> {
    let n = p.connections;
    let concurrency = p.connect_concurrency.max(1);
    procfs::raise_nofile(concurrency as u64 * 2 + 1024)?;
    report.subscribers = concurrency;
    report.expected = n as u64;
    let run = run_id();
    let tuples = Arc::new(AtomicU64::new(u64::from(run) * 7919));
    let meter = p.broker_pid.and_then(CpuMeter::start);
    let generator = CpuMeter::start(std::process::id());
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + p.timeout);
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    let mut done = 0u64;
    let mut spawned = 0usize;
    while spawned < n || !tasks.is_empty() {
        tokio::select! {
            biased;
            joined = tasks.join_next(), if !tasks.is_empty() => {
                if let Some(joined) = joined {
                    joined.context("handshake task panicked")??;
                    done += 1;
                }
            }
            permit = Arc::clone(&sem).acquire_owned(), if spawned < n => {
                let permit = permit.context("semaphore closed")?;
                let mut opts = ConnectOptions::new(format!("pb-{run:08x}-h{spawned}"), p.version);
                opts.reuse_source = false;
                opts.tls.clone_from(&p.tls);
                let (addr, tuples) = (p.addr, Arc::clone(&tuples));
                tasks.spawn(async move {
                    let _permit = permit;
                    let conn = connect_from(addr, &mut opts, &tuples).await?;
                    conn.disconnect_and_wait(CLOSE_TIMEOUT).await
                });
                spawned += 1;
            }
            () = tokio::time::sleep_until(deadline) => {
                tasks.abort_all();
                bail!("handshakes: timed out after {done} of {n} clients");
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    report.duration_s = elapsed;
    report.connect_per_s = Some(rate(done, elapsed));
    report.delivered = done;
    report.lost = report.expected - done;
    report.completed = done == n as u64;
    if let Some(cpu) = meter.and_then(|m| m.stop()) {
        report.broker_cpu_pct = Some(cpu.pct);
        report.broker_cpu_us_per_msg = Some(cpu.cpu_s * 1e6 / done.max(1) as f64);
    }
    report.generator_cpu_pct = generator.and_then(|m| m.stop()).map(|c| c.pct);
    Ok(())
}
