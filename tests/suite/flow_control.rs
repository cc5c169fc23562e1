//! Flow control (`broker::flow`): a burst pauses the publishers that cause it instead of
//! dropping what they were told is accepted; a stalled subscriber pauses nobody for longer
//! than `mqtt.stalled_after`; the memory budget bounds what the broker holds.
//!
//! MQTT leaves flow control beyond Receive Maximum to the server. What is checked is the
//! promise of an acknowledgement (MQTT-4.3.2-2 / MQTT-4.3.3-8: the receiver takes ownership
//! of a QoS 1 / QoS 2 message when it sends PUBACK / PUBREC, so a message acknowledged to its
//! publisher must reach every subscriber that was taking messages), and that the refusal of a
//! PUBLISH over the budget carries 0x97 Quota exceeded (v5 §3.4.2.1).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use postbox::codec::{Packet, ProtocolVersion, Publish, QoS, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;

use crate::common;
use common::async_process::BrokerProcess;
use common::{v5, RawClient, WAIT};

/// How many sessions count as stalled now (a gauge the sweep refreshes).
const STALLED: &str = "postbox_sessions_stalled";

/// Encodes `packets` into one buffer, as a client pipelining them writes them.
fn encoded(packets: &[Packet], version: ProtocolVersion) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    for p in packets {
        postbox::codec::encode(p, version, &mut out).expect("encode");
    }
    out.to_vec()
}

/// `n` QoS 1 PUBLISHes to `topic`, payload `"<tag>/<i>"`, packet ids 1..=n.
fn publishes(topic: &str, tag: &str, n: u16) -> Vec<Packet> {
    (1..=n)
        .map(|i| {
            Packet::Publish(v5::publish_packet(
                topic,
                QoS::AtLeastOnce,
                format!("{tag}/{i}").as_bytes(),
                i,
            ))
        })
        .collect()
}

/// Reads packets from `read` until `want` PUBACKs arrived (their reason codes, in order) or
/// `limit` passed.
async fn pubacks(
    read: &mut OwnedReadHalf,
    version: ProtocolVersion,
    want: usize,
    limit: Duration,
) -> Vec<ReasonCode> {
    let mut buf = bytes::BytesMut::new();
    let mut codes = Vec::with_capacity(want);
    let deadline = tokio::time::Instant::now() + limit;
    while codes.len() < want {
        match postbox::codec::decode(&mut buf, Some(version), 1 << 28) {
            Ok(Some(Packet::PubAck(ack))) => {
                codes.push(ack.reason_code);
                continue;
            }
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(e) => panic!("undecodable packet from the broker: {e}"),
        }
        match tokio::time::timeout_at(deadline, read.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
    codes
}

/// A 3.1.1 publisher (no Receive Maximum to respect) that writes `n` QoS 1 PUBLISHes to
/// `topic` at once and returns how many PUBACKs it got back within `limit`.
async fn pipelined_publisher(
    addr: SocketAddr,
    id: String,
    topic: String,
    n: u16,
    limit: Duration,
) -> usize {
    let c = RawClient::connect(addr, ProtocolVersion::V3_1_1, &id, true).await;
    let (mut read, mut write) = c.stream.into_split();
    let bytes = encoded(&publishes(&topic, &id, n), ProtocolVersion::V3_1_1);
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&bytes).await;
        write // kept open until the acks are in
    });
    let acks = pubacks(&mut read, ProtocolVersion::V3_1_1, usize::from(n), limit).await;
    drop(writer.await);
    acks.len()
}

/// A v5 subscriber that reads and acknowledges every message, collecting the payloads.
async fn draining_subscriber(c: &mut RawClient, want: usize, limit: Duration) -> HashSet<Vec<u8>> {
    let mut seen = HashSet::new();
    let deadline = Instant::now() + limit;
    while seen.len() < want && Instant::now() < deadline {
        let Ok(Some(packet)) = c.recv_within(deadline - Instant::now()).await else {
            break;
        };
        if let Packet::Publish(p) = packet {
            if p.qos != QoS::AtMostOnce {
                v5::ack(c, &p).await;
            }
            seen.insert(p.payload.to_vec());
        }
    }
    seen
}

/// The burst of the issue, on default settings: 100 publishers write 200 QoS 1 messages
/// each as fast as they go to one subscriber. Every message acknowledged must arrive
/// (MQTT-4.3.2-2): the subscriber's queue (1,000 by default) overflows many times over
/// unless its publishers are paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_publishers_to_one_subscriber_loses_nothing_on_defaults() {
    const PUBLISHERS: u16 = 100;
    const EACH: u16 = 200;
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let mut sub = v5::subscriber(addr, "burst-sub", "burst/t", QoS::AtLeastOnce).await;
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|p| {
            tokio::spawn(pipelined_publisher(
                addr,
                format!("burst-pub-{p}"),
                "burst/t".into(),
                EACH,
                WAIT * 3,
            ))
        })
        .collect();
    let total = usize::from(PUBLISHERS) * usize::from(EACH);
    let seen = draining_subscriber(&mut sub, total, WAIT * 4).await;
    let mut acked = 0;
    for p in publishers {
        acked += p.await.expect("publisher task");
    }
    assert_eq!(acked, total, "every PUBLISH acknowledged");
    assert_eq!(seen.len(), total, "every acknowledged message delivered");
}

/// A broker with the `[mqtt]` keys `mqtt` and two QoS 1 subscribers, each `(client id,
/// filter)`: the first on the topic that gets held up, the second on another topic, which
/// must not be.
async fn two_subscribers(
    mqtt: &str,
    [(held_id, held_filter), (other_id, other_filter)]: [(&str, &str); 2],
) -> (BrokerProcess, RawClient, RawClient) {
    let broker = BrokerProcess::spawn("", mqtt).await;
    let held = v5::subscriber(broker.addr, held_id, held_filter, QoS::AtLeastOnce).await;
    let other = v5::subscriber(broker.addr, other_id, other_filter, QoS::AtLeastOnce).await;
    (broker, held, other)
}

/// A subscriber that stops reading (its socket full, its QoS 1 window unacknowledged) pauses
/// its publisher only until it counts as stalled (`mqtt.stalled_after`); then its overflow is
/// dropped by policy and counted, and that publisher goes on. Publishers to other topics are
/// never held up: the other topic's subscriber gets all 3,000 of its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_holds_up_nobody_beyond_the_stall_time() {
    let pair = [("stalled-sub", "slow/t"), ("other-sub", "fast/t")];
    let (broker, stalled, mut other) = two_subscribers("stalled_after = 2", pair).await;
    let addr = broker.addr;
    // From here on `stalled` reads nothing.
    let started = Instant::now();
    let to_slow = tokio::spawn(pipelined_publisher(
        addr,
        "to-slow".into(),
        "slow/t".into(),
        3000,
        WAIT * 2,
    ));
    let to_fast = tokio::spawn(pipelined_publisher(
        addr,
        "to-fast".into(),
        "fast/t".into(),
        3000,
        WAIT * 2,
    ));
    let seen = draining_subscriber(&mut other, 3000, WAIT * 2).await;
    assert_eq!(
        seen.len(),
        3000,
        "the other topic's subscriber got every message"
    );
    assert_eq!(to_fast.await.expect("task"), 3000);
    assert_eq!(
        to_slow.await.expect("task"),
        3000,
        "the stalled subscriber's publisher was let go"
    );
    // It was paused for a while, but not much longer than the stall time.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2) + WAIT, "took {took:?}");
    // Counted as stalled now (the gauge is refreshed by the sweep), and no more once it
    // has gone: an offline session is not a stalled one.
    assert_eq!(broker.metric_settles_at(STALLED, 1.0).await, Some(1.0));
    assert_eq!(
        broker.metric("postbox_session_stalls_total").await,
        Some(1.0)
    );
    drop(stalled);
    assert_eq!(broker.metric_settles_at(STALLED, 0.0).await, Some(0.0));
}

/// Two clients that each subscribe to what the other publishes, then both publish and stop
/// reading: each fills the other's queue and would wait for the other forever. Both sessions
/// count as stalled after `mqtt.stalled_after`, so both publishers are let go and every
/// PUBLISH is acknowledged once they read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_publishing_to_each_other_without_reading_recover_after_the_stall_time() {
    let mut config = common::test_config();
    config.mqtt.stalled_after = 2;
    let server = common::start_with(config).await;
    let addr = server.mqtt_addr;
    let mut clients = Vec::new();
    for (me, mine) in [("a", "to/a"), ("b", "to/b")] {
        let mut c = RawClient::connect(addr, ProtocolVersion::V3_1_1, me, true).await;
        v5::subscribe(&mut c, mine, QoS::AtLeastOnce).await;
        clients.push((me, c));
    }
    // Both subscribed; now each writes 3,000 QoS 1 PUBLISHes for the other and acknowledges
    // none of what it receives (it reads only to collect its own PUBACKs).
    let mut readers = Vec::new();
    for (me, c) in clients {
        let theirs = if me == "a" { "to/b" } else { "to/a" };
        let (mut read, mut write) = c.stream.into_split();
        let bytes = encoded(&publishes(theirs, me, 3000), ProtocolVersion::V3_1_1);
        readers.push(tokio::spawn(async move {
            let writer = tokio::spawn(async move {
                let _ = write.write_all(&bytes).await;
                write
            });
            let acks = pubacks(&mut read, ProtocolVersion::V3_1_1, 3000, WAIT).await;
            drop(writer.await);
            acks.len()
        }));
    }
    // Each is paused for the other after 1,100 messages (window 100 + queue 1,000); the rest
    // is acknowledged once the broker counts both sessions as stalled (2 s), within the bound.
    for reader in readers {
        assert_eq!(
            reader.await.expect("task"),
            3000,
            "every PUBLISH acknowledged"
        );
    }
}

/// 300 messages of 1 MB for a subscriber that stopped reading: the broker keeps at most its
/// queue's byte bound (`mqtt.max_queued_bytes`, 16 MiB by default) of them once it counts as
/// stalled, so its RSS stays under the memory budget (128 MiB here) instead of growing by
/// 300 MB; the rest is dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_for_a_stalled_subscriber_keep_memory_under_the_budget() {
    const BUDGET: u64 = 128 << 20;
    let broker =
        BrokerProcess::spawn("", &format!("max_memory = {BUDGET}\nstalled_after = 1")).await;
    let stalled = v5::subscriber(broker.addr, "big-sub", "big/t", QoS::AtLeastOnce).await;
    let c = RawClient::connect(broker.addr, ProtocolVersion::V3_1_1, "big-pub", true).await;
    let (mut read, mut write) = c.stream.into_split();
    let payload = vec![0x5a; 1_000_000];
    let writer = tokio::spawn(async move {
        for i in 1..=300u16 {
            let p = Packet::Publish(v5::publish_packet("big/t", QoS::AtLeastOnce, &payload, i));
            if write
                .write_all(&encoded(&[p], ProtocolVersion::V3_1_1))
                .await
                .is_err()
            {
                break;
            }
        }
        write
    });
    let acks = pubacks(&mut read, ProtocolVersion::V3_1_1, 300, WAIT * 3).await;
    assert_eq!(acks.len(), 300, "every PUBLISH acknowledged");
    drop(writer.await);
    let rss = common::process::rss_bytes(broker.pid());
    println!("broker RSS {} MiB (budget {} MiB)", rss >> 20, BUDGET >> 20);
    assert!(
        rss < BUDGET,
        "broker RSS {rss} B over the {BUDGET} B budget"
    );
    let dropped = broker
        .metric("postbox_messages_dropped_total{qos=\"1\",reason=\"queue_full\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        dropped > 0.0,
        "the overflow of the stalled session is counted"
    );
    let stalls = broker
        .metric("postbox_session_stalls_total")
        .await
        .unwrap_or(0.0);
    assert_eq!(stalls, 1.0, "one stall episode");
    drop(stalled);
}

/// Over the memory budget a QoS 1 PUBLISH is refused with 0x97 Quota exceeded (v5 §3.4.2.1)
/// and counted; a 3.1.1 client, which has no negative acknowledgement, is disconnected
/// instead. Retained messages fill the budget here: they are held until replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_memory_budget_publishes_are_refused_with_quota_exceeded() {
    let broker =
        BrokerProcess::spawn("", &format!("max_memory = {}\nstalled_after = 1", 8 << 20)).await;
    let mut c = v5::connect_id(broker.addr, "filler").await;
    let payload = vec![0x33; 1_000_000];
    let mut refused = None;
    for i in 0..20u16 {
        let mut p: Publish =
            v5::publish_packet(&format!("fill/{i}"), QoS::AtLeastOnce, &payload, i + 1);
        p.retain = true;
        let code = v5::publish(&mut c, p).await;
        if code != ReasonCode::SUCCESS && code != ReasonCode::NO_MATCHING_SUBSCRIBERS {
            refused = Some((i, code));
            break;
        }
    }
    let (at, code) = refused.expect("a PUBLISH over the budget is refused");
    let used = broker.metric("postbox_memory_used_bytes").await;
    println!("refused at {at}: {code:?}, memory used {used:?}");
    assert_eq!(code, ReasonCode::QUOTA_EXCEEDED);
    assert!(
        at >= 7,
        "refused at message {at}, before the budget was reached"
    );
    let counted = broker
        .metric("postbox_messages_dropped_total{qos=\"1\",reason=\"memory\"}")
        .await
        .unwrap_or(0.0);
    assert!(counted >= 1.0, "the refusal is counted");
    // 3.1.1 cannot be told: the connection closes, and nothing is acknowledged. (Its 1 MB,
    // partly received, counts too: usage is over the budget whatever the last message did.)
    common::expect_v311_publish_refused(
        broker.addr,
        "old",
        "fill/x",
        &payload,
        1,
        "no PUBACK over the budget",
    )
    .await;
}

/// A paused publisher whose connection ends while it waits (here: taken over by a new
/// connection with its client id, MQTT-3.1.4-3) is no longer counted as paused:
/// `postbox_publishers_paused` goes back to 0 instead of keeping it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_publisher_that_is_taken_over_is_no_longer_counted() {
    let broker = BrokerProcess::spawn("", "stalled_after = 60").await;
    let slow = v5::subscriber(broker.addr, "slow-sub", "held/t", QoS::AtLeastOnce).await;
    // From here on `slow` reads nothing: its queue fills, and the publisher pauses for it.
    let publisher =
        RawClient::connect(broker.addr, ProtocolVersion::V3_1_1, "held-pub", true).await;
    let (_read, mut write) = publisher.stream.into_split();
    let bytes = encoded(
        &publishes("held/t", "held-pub", 3000),
        ProtocolVersion::V3_1_1,
    );
    write.write_all(&bytes).await.expect("write");
    broker
        .wait_metric("postbox_publishers_paused", |v| v == 1.0)
        .await;
    let _new = RawClient::connect(broker.addr, ProtocolVersion::V3_1_1, "held-pub", true).await;
    broker
        .wait_metric("postbox_publishers_paused", |v| v == 0.0)
        .await;
    drop(slow);
}

/// `queue_overflow = "refuse"`: a QoS 1/2 PUBLISH that would overflow an offline subscriber's
/// full queue is refused for everyone, with PUBACK / PUBREC 0x97 Quota exceeded (v5
/// §3.4.2.1, §3.5.2.1), so the publisher keeps it; a 3.1.1 publisher, which has no negative
/// ack, is disconnected without a PUBACK (its client re-sends after reconnecting, MQTT-4.4.0-1).
/// No other subscriber got the refused message either: a re-send is then no duplicate
/// (exactly-once, MQTT-4.3.3). Once the full session drains, publishes are accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_offline_queue_refuses_publishes_under_the_refuse_policy() {
    let refuse_past_3 = "max_queued_messages = 3\nqueue_overflow = \"refuse\"\nstalled_after = 60";
    let broker = BrokerProcess::spawn("", refuse_past_3).await;
    let mut offline = v5::connect_packet("away");
    offline.clean_start = false;
    offline.properties.session_expiry_interval = Some(600);
    let (mut away, _) = v5::connect(broker.addr, offline.clone()).await;
    v5::subscribe(&mut away, "refuse/t", QoS::AtLeastOnce).await;
    v5::disconnect(away).await;
    // Offline once its connection is gone from the broker's side too (the socket closes
    // first): a message routed before would go to it in flight, not into its queue.
    broker
        .wait_metric("postbox_connections_current", |v| v == 0.0)
        .await;

    let mut live = v5::subscriber(broker.addr, "live", "refuse/t", QoS::ExactlyOnce).await;
    let mut publisher = v5::connect_id(broker.addr, "producer").await;
    let whose = "the offline session's queue of 3";
    v5::fill_a_queue_of_3_then_refused(&mut publisher, "refuse/t", whose).await;
    // QoS 0 is not refused (it has no ack): dropped for the full session, delivered to `live`.
    let p = v5::publish_packet("refuse/t", QoS::AtMostOnce, b"six", 0);
    v5::publish(&mut publisher, p).await;

    let mut seen = Vec::new();
    for _ in 0..4 {
        let p = v5::receive(&mut live).await;
        v5::ack(&mut live, &p).await;
        seen.push(p.payload.to_vec());
    }
    assert_eq!(
        seen,
        vec![vec![1], vec![2], vec![3], b"six".to_vec()],
        "the live subscriber got the accepted messages and not the refused ones"
    );
    let refused = broker
        .metric("postbox_messages_refused_total{qos=\"1\",reason=\"queue_full\"}")
        .await;
    assert_eq!(refused, Some(1.0), "the QoS 1 refusal is counted");

    // 3.1.1: no negative ack exists, so the connection closes and nothing is acknowledged.
    common::expect_v311_publish_refused(
        broker.addr,
        "old",
        "refuse/t",
        b"seven",
        7,
        "no PUBACK for a refused 3.1.1 PUBLISH",
    )
    .await;

    // The full session comes back and drains: its queue has room again.
    offline.clean_start = false;
    let (mut away, ack) = v5::connect(broker.addr, offline).await;
    assert!(ack.session_present);
    for i in 1..=3u8 {
        let p = v5::receive(&mut away).await;
        assert_eq!(p.payload.to_vec(), vec![i]);
        v5::ack(&mut away, &p).await;
    }
    let p = v5::publish_packet("refuse/t", QoS::AtLeastOnce, b"eight", 8);
    assert_eq!(v5::publish(&mut publisher, p).await, ReasonCode::SUCCESS);
}

/// `mqtt.max_publish_rate`: a client that floods (1,000 QoS 1 PUBLISHes written at once) is
/// read no faster than its limit (200/s, after a burst of one second's worth) instead of being
/// cut off or losing anything: within the first second it gets far fewer than 1,000 PUBACKs,
/// yet in the end every message is acknowledged and delivered (MQTT-4.3.2-2). Meanwhile another
/// client's round trips on another topic are not held up: all 20 finish while the flooder is
/// still being throttled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_client_is_throttled_to_its_rate_while_others_keep_going() {
    let pair = [("flood-sink", "flood/t"), ("calm-sub", "calm/t")];
    let (broker, mut sink, mut calm_sub) = two_subscribers("max_publish_rate = 200", pair).await;
    let addr = broker.addr;

    let flooder = RawClient::connect(addr, ProtocolVersion::V3_1_1, "flooder", true).await;
    let (mut read, mut write) = flooder.stream.into_split();
    let bytes = encoded(&publishes("flood/t", "f", 1000), ProtocolVersion::V3_1_1);
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&bytes).await;
        write
    });
    let sink_task =
        tokio::spawn(async move { draining_subscriber(&mut sink, 1000, WAIT * 3).await.len() });
    let early = pubacks(
        &mut read,
        ProtocolVersion::V3_1_1,
        1000,
        Duration::from_secs(1),
    )
    .await;
    println!("PUBACKs in the first second: {}", early.len());
    assert!(
        early.len() < 600,
        "a client limited to 200 PUBLISHes/s (plus a second's burst) got {} acks in 1 s",
        early.len()
    );

    // Another client is served as usual while the flooder waits.
    let mut calm = v5::connect_id(addr, "calm-pub").await;
    for i in 1..=20u16 {
        let p = v5::publish_packet("calm/t", QoS::AtLeastOnce, &i.to_be_bytes(), i);
        assert_eq!(v5::publish(&mut calm, p).await, ReasonCode::SUCCESS);
        let got = v5::receive(&mut calm_sub).await;
        v5::ack(&mut calm_sub, &got).await;
        assert_eq!(got.payload.to_vec(), i.to_be_bytes().to_vec());
    }
    let mid = pubacks(
        &mut read,
        ProtocolVersion::V3_1_1,
        1000 - early.len(),
        Duration::from_millis(50),
    )
    .await;
    let so_far = early.len() + mid.len();
    assert!(
        so_far < 1000,
        "the flooder was still being throttled when the calm client had finished"
    );
    let rest = pubacks(&mut read, ProtocolVersion::V3_1_1, 1000 - so_far, WAIT * 3).await;
    assert_eq!(so_far + rest.len(), 1000, "every PUBLISH acknowledged");
    assert_eq!(sink_task.await.expect("task"), 1000, "and delivered");
    let pauses = broker
        .metric("postbox_publish_rate_pauses_total")
        .await
        .unwrap_or(0.0);
    assert!(pauses >= 1.0, "rate pauses are counted: {pauses}");
    drop(writer.await);
}

/// One client rewriting one retained topic with 500 KB messages at QoS 0, as fast as its
/// socket goes (a PINGREQ every 50 to stay in step): each rewrite is a write for the durable
/// store (on by default), and the disk takes them slower than loopback brings them. The
/// writer's queue is counted in the memory budget and bounded on its own, so the publisher
/// is paused (TCP back-pressure) instead of the queue growing: RSS stays under 256 MiB
/// (budget 16 MiB) where it reached 1.4 GB, counted nowhere (issue 35, eighteenth
/// adversarial pass, E0). Nothing of the topic is lost: its retained message (MQTT-3.3.1-5)
/// is the last one written, and it is the one stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_rewrites_faster_than_the_disk_pause_their_publisher() {
    const BUDGET: u64 = 16 << 20;
    const RSS_BOUND: u64 = 256 << 20;
    const MESSAGES: usize = 2_000;
    let data = tempfile::tempdir().expect("tempdir");
    let broker = BrokerProcess::spawn_file(
        &format!(
            "[mqtt]\nmax_memory = {BUDGET}\n[storage]\ndir = {:?}\n",
            data.path()
        ),
        &[],
    )
    .await;
    let mut c = v5::connect_id(broker.addr, "rewriter").await;
    let mut peak = 0u64;
    v5::rewrite_retained(&mut c, "status/one", 500_000, MESSAGES, || {
        peak = peak.max(common::process::rss_bytes(broker.pid()));
    })
    .await;
    println!(
        "broker RSS peak {} MiB (budget {} MiB)",
        peak >> 20,
        BUDGET >> 20
    );
    assert!(
        peak < RSS_BOUND,
        "broker RSS {peak} B past {RSS_BOUND} B while one client rewrote one retained topic"
    );
    let mut reader = v5::subscriber(broker.addr, "reader", "status/one", QoS::AtMostOnce).await;
    match reader.recv().await {
        Some(Packet::Publish(p)) => assert_eq!(
            &p.payload[..8],
            format!("{:08}", MESSAGES - 1).as_bytes(),
            "the retained message is the last one written"
        ),
        other => panic!("expected the retained message, got {other:?}"),
    }
}
