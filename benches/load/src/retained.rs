//! The `retained` scenario: store many retained messages, then time one `#` subscriber
//! receiving them all.

use std::time::Instant;

use anyhow::{bail, Result};
use postbox::codec::{Packet, PubResponse, QoS};

use crate::client::{Conn, ConnectOptions, HANDSHAKE_TIMEOUT};
use crate::payload::Stamp;
use crate::procfs::CpuMeter;
use crate::report::{rate, Report};
use crate::scenarios::Params;
use crate::tracker::SeqTracker;

/// R retained messages stored (QoS 1, pipelined), then one subscriber to `#` receives them:
/// `duration_s` is the time from SUBSCRIBE to the last one.
///
/// # Errors
///
/// When a client cannot connect, a PUBACK is refused or late, or not every retained message
/// arrives in time.
pub async fn run(p: &Params, run: u32, report: &mut Report) -> Result<()> {
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
            conn.queue_publish(&topic, QoS::AtLeastOnce, packet_id, true, &payload, None)?;
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
        conn.queue_publish(&store_topic(base, i), QoS::AtMostOnce, 0, true, &[], None)?;
        if conn.wbuf.len() > 64 * 1024 {
            conn.flush().await?;
        }
    }
    conn.queue_publish(
        &format!("{base}/fence"),
        QoS::AtLeastOnce,
        1,
        false,
        &[],
        None,
    )?;
    conn.flush().await?;
    loop {
        if let Packet::PubAck(_) = conn.recv_within(HANDSHAKE_TIMEOUT).await? {
            break;
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
