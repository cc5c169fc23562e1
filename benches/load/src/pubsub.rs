//! The publish/subscribe engine every message-flow scenario runs on.
//!
//! A run connects its subscribers (and waits for their SUBACKs), connects its publishers,
//! then releases every publisher at once. It ends when every subscriber holds every message
//! it should, or when nothing new has arrived for `idle` after the publishers finished (QoS 0
//! loss), or at the hard `timeout`; it never runs unbounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use postbox::codec::{Packet, ProtocolVersion, PubResponse, PublishProperties, QoS};
use tokio::io::Interest;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::client::{Conn, ConnectOptions, HANDSHAKE_TIMEOUT};
use crate::payload::{hex_slot, Stamp, STAMP_HEX_LEN, STAMP_LEN};
use crate::procfs::{CpuMeter, CpuUse};
use crate::tracker::{Seen, SeqTracker};
use crate::transport::TlsClient;

/// Stop appending to a publisher's write buffer beyond this: one write per ~64 KiB.
const WRITE_BATCH: usize = 64 * 1024;
/// Highest latency the histograms hold (10 minutes, in nanoseconds); larger values saturate.
const MAX_LATENCY_NS: u64 = 600_000_000_000;

/// One publishing client.
#[derive(Clone, Debug)]
pub struct PublisherPlan {
    /// Client identifier.
    pub client_id: String,
    /// Topic every message goes to.
    pub topic: String,
    /// QoS of every PUBLISH.
    pub qos: QoS,
    /// Messages to send (sequence numbers 0..count).
    pub count: u64,
    /// Messages per second for this publisher; `None` = as fast as the broker takes them.
    pub rate: Option<f64>,
    /// Set the RETAIN flag.
    pub retain: bool,
}

/// One subscribing client.
#[derive(Clone, Debug)]
pub struct SubscriberPlan {
    /// Connection settings (client id, clean session, ...).
    pub connect: ConnectOptions,
    /// Filters and the QoS asked for each.
    pub filters: Vec<(String, QoS)>,
    /// Distinct messages this subscriber must receive for the run to be complete.
    pub expected: u64,
}

/// A whole run: who publishes, who subscribes, and the bounds.
#[derive(Clone, Debug)]
pub struct PubSubPlan {
    /// Broker address (loopback only).
    pub addr: SocketAddr,
    /// Where subscribers connect, when not `addr` (another cluster node).
    pub subscribe_addr: Option<SocketAddr>,
    /// Protocol level of every client.
    pub version: ProtocolVersion,
    /// Run identifier stamped into every payload.
    pub run: u32,
    /// Publishers; index = publisher id in the stamps.
    pub publishers: Vec<PublisherPlan>,
    /// Subscribers.
    pub subscribers: Vec<SubscriberPlan>,
    /// Payload size in bytes (at least the stamp).
    pub payload_len: usize,
    /// A fixed payload (`--payload-file`) sent instead of `payload_len` zeros, its stamp in
    /// hex in place of its first run of 48 `0`s ([`hex_slot`]).
    pub payload_template: Option<Arc<[u8]>>,
    /// The v5 Content Type of every PUBLISH (`--content-type`).
    pub content_type: Option<String>,
    /// Unacknowledged QoS 1/2 messages a publisher may have outstanding.
    pub inflight: usize,
    /// Hard bound on the message phase.
    pub timeout: Duration,
    /// After the publishers finish, give up on missing messages after this long without news.
    pub idle: Duration,
    /// Broker process to measure, if known.
    pub broker_pid: Option<u32>,
    /// TLS for the publishers (subscribers carry theirs in their `connect` options).
    pub tls: Option<Arc<TlsClient>>,
    /// A v5 user property every PUBLISH carries with a value unique to it (run, publisher,
    /// sequence number): the key `[dedup]` looks up, so its cost can be measured.
    pub message_id_property: Option<String>,
    /// Distinct messages the subscribers must receive between them, whoever gets each (a
    /// shared group's members); 0 when each subscriber has its own `expected`.
    pub group_expected: u64,
}

/// What a run measured.
#[derive(Debug)]
pub struct PubSubOutcome {
    /// PUBLISH packets sent by all publishers.
    pub sent: u64,
    /// Distinct messages all subscribers should have received.
    pub expected: u64,
    /// Distinct messages received (summed over subscribers).
    pub delivered: u64,
    /// Extra copies received.
    pub duplicates: u64,
    /// Messages that overtook a later one of the same publisher.
    pub reordered: u64,
    /// Messages not from this run.
    pub foreign: u64,
    /// End-to-end latency of every first copy, in nanoseconds.
    pub latency: Histogram<u64>,
    /// From release to the last publisher's last acknowledgement (or write, QoS 0).
    pub publish_s: f64,
    /// From release to the last new message received.
    pub deliver_s: f64,
    /// Whether every expected message arrived before the bounds ran out.
    pub completed: bool,
    /// Broker CPU over the message phase.
    pub broker_cpu: Option<CpuUse>,
    /// Generator CPU over the message phase (shows whether the client could keep up).
    pub generator_cpu: Option<CpuUse>,
}

/// Shared between subscribers and the coordinator.
struct Progress {
    /// New messages received so far, all subscribers (one add per read batch).
    delivered: AtomicU64,
    /// Subscribers that hold everything they expect.
    subs_done: AtomicUsize,
    /// Signalled when a subscriber completes.
    notify: Notify,
}

struct SubscriberResult {
    tracker: SeqTracker,
    latency: Histogram<u64>,
    last_new: Option<Instant>,
}

struct PublisherResult {
    sent: u64,
    finished: Instant,
}

/// Everything a client task needs to know about the run.
#[derive(Clone)]
struct RunCtx {
    addr: SocketAddr,
    subscribe_addr: SocketAddr,
    version: ProtocolVersion,
    run: u32,
    counts: Arc<Vec<u64>>,
    payload_len: usize,
    /// The fixed payload and where its hex stamp goes.
    template: Option<(Arc<[u8]>, usize)>,
    /// Properties of every PUBLISH (v5 Content Type).
    properties: Option<Arc<PublishProperties>>,
    inflight: usize,
    epoch: Instant,
    stop: CancellationToken,
    tls: Option<Arc<TlsClient>>,
    message_id_property: Option<Arc<str>>,
    /// Bounds the handshakes in progress at once: a broker may close a burst of TLS or
    /// WebSocket handshakes from one address past its pending limit (Postbox's
    /// `max_pending_connections_per_ip`, 64), and the connect phase is not what is measured.
    connecting: Arc<tokio::sync::Semaphore>,
}

/// Handshakes in progress at once (see [`RunCtx::connecting`]).
const CONNECTING_AT_ONCE: usize = 32;

/// A latency histogram with the bounds every run uses.
pub fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 10 min at 3 significant digits; the bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// Runs `plan` to completion or to its bounds.
///
/// # Errors
///
/// A payload too small for the stamp, or a publisher or subscriber failed (connect,
/// subscribe, or the broker misbehaving).
pub async fn run(plan: PubSubPlan) -> Result<PubSubOutcome> {
    let template = match &plan.payload_template {
        Some(t) => match hex_slot(t) {
            Some(at) => Some((Arc::clone(t), at)),
            None => bail!(
                "the payload file needs a run of {STAMP_HEX_LEN} ASCII `0`s to carry the stamp"
            ),
        },
        None if plan.payload_len < STAMP_LEN => {
            bail!("payload must be at least {STAMP_LEN} bytes to carry the stamp")
        }
        None => None,
    };
    let properties = plan.content_type.as_ref().map(|ct| {
        Arc::new(PublishProperties {
            content_type: Some(ct.as_str().into()),
            ..Default::default()
        })
    });
    let ctx = RunCtx {
        addr: plan.addr,
        subscribe_addr: plan.subscribe_addr.unwrap_or(plan.addr),
        version: plan.version,
        run: plan.run,
        counts: Arc::new(plan.publishers.iter().map(|p| p.count).collect()),
        payload_len: plan.payload_len,
        template,
        properties,
        inflight: plan.inflight.clamp(1, 65_000),
        epoch: Instant::now(),
        stop: CancellationToken::new(),
        tls: plan.tls.clone(),
        message_id_property: plan.message_id_property.as_deref().map(Arc::from),
        connecting: Arc::new(tokio::sync::Semaphore::new(CONNECTING_AT_ONCE)),
    };
    let guard = ctx.stop.clone().drop_guard();
    let progress = Arc::new(Progress {
        delivered: AtomicU64::new(0),
        subs_done: AtomicUsize::new(0),
        notify: Notify::new(),
    });

    // Subscribers first, each fully subscribed before any message is sent.
    let mut subs = JoinSet::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(plan.subscribers.len().max(1));
    for sub in plan.subscribers.iter().cloned() {
        let (ctx, progress, ready) = (ctx.clone(), Arc::clone(&progress), ready_tx.clone());
        subs.spawn(async move { subscriber(ctx, sub, ready, progress).await });
    }
    drop(ready_tx);
    for _ in 0..plan.subscribers.len() {
        if tokio::time::timeout(HANDSHAKE_TIMEOUT, ready_rx.recv())
            .await
            .ok()
            .flatten()
            .is_none()
        {
            return Err(first_error(&mut subs)
                .await
                .context("a subscriber failed to connect"));
        }
    }

    // Publishers connect, then wait for the start signal together.
    let (start_tx, start_rx) = watch::channel(false);
    let connected = Arc::new(AtomicU64::new(0));
    let mut pubs = JoinSet::new();
    for (id, p) in plan.publishers.iter().cloned().enumerate() {
        let (ctx, start, connected) = (ctx.clone(), start_rx.clone(), Arc::clone(&connected));
        pubs.spawn(async move { publisher(ctx, id as u32, p, start, connected).await });
    }
    let n_pubs = plan.publishers.len() as u64;
    let connect_deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    while connected.load(Ordering::Acquire) < n_pubs {
        if Instant::now() > connect_deadline || pubs.len() < plan.publishers.len() {
            return Err(first_error(&mut pubs)
                .await
                .context("a publisher failed to connect"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let broker_meter = plan.broker_pid.and_then(CpuMeter::start);
    let generator_meter = CpuMeter::start(std::process::id());
    let start = Instant::now();
    let deadline = start + plan.timeout;
    let _ = start_tx.send(true);

    let mut sent = 0;
    let mut publish_done: Option<Instant> = None;
    let mut last_progress = Instant::now();
    let mut last_delivered = 0;
    let n_subs = plan.subscribers.len();
    let completed = loop {
        if progress.subs_done.load(Ordering::Acquire) >= n_subs
            && pubs.is_empty()
            && progress.delivered.load(Ordering::Relaxed) >= plan.group_expected
        {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        if publish_done.is_some() && last_progress.elapsed() >= plan.idle {
            break false;
        }
        tokio::select! {
            joined = pubs.join_next(), if !pubs.is_empty() => {
                let result = joined
                    .context("no publisher left")?
                    .context("publisher task panicked")?
                    .map_err(|e| e.context("publisher failed"))?;
                sent += result.sent;
                last_progress = Instant::now();
                if pubs.is_empty() {
                    publish_done = Some(result.finished);
                }
            }
            () = progress.notify.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        let delivered = progress.delivered.load(Ordering::Relaxed);
        if delivered != last_delivered {
            last_delivered = delivered;
            last_progress = Instant::now();
        }
    };
    let broker_cpu = broker_meter.and_then(|m| m.stop());
    let generator_cpu = generator_meter.and_then(|m| m.stop());
    drop(guard); // stops every client task that is still running
    pubs.abort_all();

    let mut latency = new_histogram();
    let (mut delivered, mut duplicates, mut reordered, mut foreign) = (0, 0, 0, 0);
    let mut last_new: Option<Instant> = None;
    while let Some(joined) = subs.join_next().await {
        let r = joined
            .context("subscriber task panicked")?
            .map_err(|e| e.context("subscriber failed"))?;
        delivered += r.tracker.unique;
        duplicates += r.tracker.duplicates;
        reordered += r.tracker.reordered;
        foreign += r.tracker.foreign;
        latency.add(&r.latency).context("merge histograms")?;
        last_new = last_new.max(r.last_new);
    }
    let expected = plan.group_expected + plan.subscribers.iter().map(|s| s.expected).sum::<u64>();
    let since_start = |t: Option<Instant>| t.map_or(0.0, |t| (t - start).as_secs_f64());
    Ok(PubSubOutcome {
        sent,
        expected,
        delivered,
        duplicates,
        reordered,
        foreign,
        latency,
        publish_s: since_start(publish_done),
        deliver_s: since_start(last_new),
        completed: completed && delivered >= expected,
        broker_cpu,
        generator_cpu,
    })
}

/// The first error among tasks that have finished, for a useful message.
async fn first_error<T: 'static>(set: &mut JoinSet<Result<T>>) -> anyhow::Error {
    set.abort_all();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Err(e)) => return e,
            Err(e) if e.is_panic() => return anyhow::anyhow!("client task panicked: {e}"),
            _ => {}
        }
    }
    anyhow::anyhow!("timed out")
}

async fn subscriber(
    ctx: RunCtx,
    plan: SubscriberPlan,
    ready: tokio::sync::mpsc::Sender<()>,
    progress: Arc<Progress>,
) -> Result<SubscriberResult> {
    let mut conn = {
        let _turn = ctx.connecting.acquire().await?;
        Conn::connect(ctx.subscribe_addr, &plan.connect).await?
    };
    let early = conn.subscribe(&plan.filters, 1).await?;
    let mut result = SubscriberResult {
        tracker: SeqTracker::new(ctx.run, ctx.counts.to_vec()),
        latency: new_histogram(),
        last_new: None,
    };
    let _ = ready.send(()).await;
    let mut done = plan.expected == 0;
    if done {
        progress.subs_done.fetch_add(1, Ordering::AcqRel);
        progress.notify.notify_one();
    }
    let mut pending = early;
    let stamp_at = ctx.template.as_ref().map(|(_, at)| *at);
    loop {
        let now = Instant::now();
        let now_ns = (now - ctx.epoch).as_nanos() as u64;
        let before = result.tracker.unique;
        for packet in pending.drain(..) {
            handle_delivery(&mut conn, &mut result, packet, now_ns, stamp_at)?;
        }
        while let Some(packet) = conn.next_packet()? {
            handle_delivery(&mut conn, &mut result, packet, now_ns, stamp_at)?;
        }
        let fresh = result.tracker.unique - before;
        if fresh > 0 {
            result.last_new = Some(now);
            progress.delivered.fetch_add(fresh, Ordering::Relaxed);
        }
        conn.flush().await?;
        if !done && result.tracker.unique >= plan.expected {
            done = true;
            progress.subs_done.fetch_add(1, Ordering::AcqRel);
            progress.notify.notify_one();
        }
        tokio::select! {
            biased;
            () = ctx.stop.cancelled() => break,
            read = conn.read_more() => { read?; }
        }
    }
    conn.disconnect().await;
    Ok(result)
}

/// Handles one packet on a subscriber: records messages, queues acknowledgements.
#[inline]
fn handle_delivery(
    conn: &mut Conn,
    result: &mut SubscriberResult,
    packet: Packet,
    now_ns: u64,
    stamp_at: Option<usize>,
) -> Result<()> {
    match packet {
        Packet::Publish(p) => {
            let stamp = match stamp_at {
                Some(at) => Stamp::read_hex(&p.payload, at),
                None => Stamp::read(&p.payload),
            };
            if let Some(stamp) = stamp {
                if result.tracker.record(&stamp) == Seen::New {
                    result
                        .latency
                        .saturating_record(now_ns.saturating_sub(stamp.sent_ns).max(1));
                }
            } else {
                result.tracker.foreign += 1;
            }
            match p.qos {
                QoS::AtMostOnce => {}
                QoS::AtLeastOnce => conn.queue(&Packet::PubAck(PubResponse::new(p.packet_id)))?,
                QoS::ExactlyOnce => conn.queue(&Packet::PubRec(PubResponse::new(p.packet_id)))?,
            }
            Ok(())
        }
        Packet::PubRel(rel) => conn.queue(&Packet::PubComp(PubResponse::new(rel.packet_id))),
        Packet::PingResp | Packet::SubAck(_) | Packet::UnsubAck(_) => Ok(()),
        Packet::Disconnect(d) => bail!("broker sent DISCONNECT {:#04x}", d.reason_code.0),
        other => bail!("unexpected {} on a subscriber", other.name()),
    }
}

async fn publisher(
    ctx: RunCtx,
    id: u32,
    plan: PublisherPlan,
    mut start: watch::Receiver<bool>,
    connected: Arc<AtomicU64>,
) -> Result<PublisherResult> {
    let mut opts = ConnectOptions::new(plan.client_id.clone(), ctx.version);
    opts.tls.clone_from(&ctx.tls);
    let mut conn = {
        let _turn = ctx.connecting.acquire().await?;
        Conn::connect(ctx.addr, &opts).await?
    };
    connected.fetch_add(1, Ordering::AcqRel);
    start
        .wait_for(|go| *go)
        .await
        .context("run abandoned before start")?;

    let acked_qos = plan.qos != QoS::AtMostOnce;
    let window = if acked_qos { ctx.inflight } else { usize::MAX };
    let mut payload = match &ctx.template {
        Some((template, _)) => template.to_vec(),
        None => vec![0u8; ctx.payload_len],
    };
    let hex_at = ctx.template.as_ref().map(|(_, at)| *at);
    let properties = ctx.properties.as_deref();
    let mut stamp = Stamp {
        run: ctx.run,
        publisher: id,
        seq: 0,
        sent_ns: 0,
    };
    let mut inflight = 0usize;
    let mut packet_id: u16 = 0;
    // `--message-id-property`: one value (a small allocation) per message.
    let mut id_properties = ctx
        .message_id_property
        .as_deref()
        .map(|name| PublishProperties {
            user_properties: vec![(name.into(), String::new().into())],
            content_type: properties.and_then(|p| p.content_type.clone()),
            ..PublishProperties::default()
        });
    let t0 = Instant::now();
    loop {
        let allowed = match plan.rate {
            // Elapsed time and rate are both non-negative; `as` saturates.
            #[allow(clippy::cast_sign_loss)]
            Some(r) => ((t0.elapsed().as_secs_f64() * r) as u64 + 1).min(plan.count),
            None => plan.count,
        };
        while stamp.seq < allowed && conn.wbuf.len() < WRITE_BATCH && inflight < window {
            stamp.sent_ns = ctx.epoch.elapsed().as_nanos() as u64;
            match hex_at {
                Some(at) => stamp.write_hex(&mut payload[at..]),
                None => stamp.write(&mut payload),
            }
            if acked_qos {
                packet_id = packet_id.checked_add(1).unwrap_or(1);
                inflight += 1;
            }
            let this_properties = match id_properties.as_mut() {
                Some(id_props) => {
                    id_props.user_properties[0].1 =
                        format!("{:08x}-{id}-{}", ctx.run, stamp.seq).into();
                    Some(&*id_props)
                }
                None => properties,
            };
            conn.queue_publish(
                &plan.topic,
                plan.qos,
                packet_id,
                plan.retain,
                &payload,
                this_properties,
            )?;
            stamp.seq += 1;
        }
        if stamp.seq == plan.count && inflight == 0 && conn.wbuf.is_empty() {
            break;
        }
        let mut interest: Option<Interest> = None;
        if !conn.wbuf.is_empty() {
            interest = Some(Interest::WRITABLE);
        }
        if inflight > 0 {
            interest = Some(interest.map_or(Interest::READABLE, |i| i | Interest::READABLE));
        }
        let rate_wait = match plan.rate {
            Some(r) if stamp.seq < plan.count && stamp.seq >= allowed && inflight < window => {
                Some(t0 + Duration::from_secs_f64(stamp.seq as f64 / r))
            }
            _ => None,
        };
        if conn.stream.is_tls() {
            tls_step(&ctx, &mut conn, &mut inflight, rate_wait).await?;
            continue;
        }
        tokio::select! {
            biased;
            () = ctx.stop.cancelled() => bail!("publisher stopped before finishing"),
            ready = async { conn.stream.tcp().ready(interest.unwrap_or(Interest::READABLE)).await }, if interest.is_some() => {
                let ready = ready?;
                if ready.is_writable() {
                    conn.try_write_some()?;
                }
                if ready.is_readable() && conn.try_read_more()? > 0 {
                    handle_acks(&mut conn, &mut inflight)?;
                }
            }
            () = tokio::time::sleep_until(rate_wait.unwrap_or(t0).into()), if rate_wait.is_some() => {}
            else => bail!("publisher stalled"),
        }
    }
    let finished = Instant::now();
    conn.disconnect().await;
    Ok(PublisherResult {
        sent: stamp.seq,
        finished,
    })
}

/// Decodes what a publisher has read: acknowledgements free window slots.
fn handle_acks(conn: &mut Conn, inflight: &mut usize) -> Result<()> {
    while let Some(packet) = conn.next_packet()? {
        match packet {
            Packet::PubAck(_) | Packet::PubComp(_) => *inflight = inflight.saturating_sub(1),
            Packet::PubRec(rec) => conn.queue(&Packet::PubRel(PubResponse::new(rec.packet_id)))?,
            Packet::Disconnect(d) => bail!("broker sent DISCONNECT {:#04x}", d.reason_code.0),
            _ => {}
        }
    }
    Ok(())
}

/// One turn of a TLS publisher, which has no readiness API under rustls: write everything
/// queued (the caller filled the window), then wait for acknowledgements or the rate
/// limiter, whichever comes first. A blocking write cannot deadlock against the broker's
/// acknowledgements: at most `window` messages are unacknowledged, far less than the socket
/// buffers hold.
async fn tls_step(
    ctx: &RunCtx,
    conn: &mut Conn,
    inflight: &mut usize,
    rate_wait: Option<Instant>,
) -> Result<()> {
    tokio::select! {
        biased;
        () = ctx.stop.cancelled() => bail!("publisher stopped before finishing"),
        flushed = conn.flush() => flushed?,
    }
    if *inflight == 0 && rate_wait.is_none() {
        return Ok(()); // nothing to wait for: refill, or done
    }
    tokio::select! {
        biased;
        () = ctx.stop.cancelled() => bail!("publisher stopped before finishing"),
        read = conn.read_more(), if *inflight > 0 => {
            read?;
            handle_acks(conn, inflight)?;
        }
        () = tokio::time::sleep_until(rate_wait.unwrap_or_else(Instant::now).into()), if rate_wait.is_some() => {}
    }
    Ok(())
}
