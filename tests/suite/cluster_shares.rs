//! Anonymous clients' shares on a cluster whose nodes differ (issue 35, seventeenth
//! adversarial pass): with a real `nats-server -js` and real `postbox` nodes, what strangers
//! make one node keep stays within the share of every other node, however small it is.

use std::time::Duration;

use crate::cluster_orphans::as_user;
use crate::cluster_security::example_auth_fast;
use crate::common;

use common::cluster::{wait_linked, Node};
use common::nats::NatsServer;
use common::{v5, WAIT};
use postbox::codec::{Packet, QoS, ReasonCode};

/// Node b's budget: 4 MiB, an anonymous share of 512 KiB.
const SMALL: u64 = 4 << 20;

/// Issue 35, seventeenth adversarial pass, D3: a stranger on node a (32 MiB, a 4 MiB share)
/// keeps 40 retained messages of 60 KB there (2.4 MB, within a's share); node b (4 MiB, a
/// 512 KiB share) gets them through the cluster's retained bucket and keeps only what fits
/// its own share (counted as dropped for memory), so its verified clients keep their
/// budget. The bucket delivers in publish order, so once sensor1's retained message
/// published after them is on node b, node b has weighed all 40. Before, node b applied
/// every entry unchecked: the stranger's 2.4 MB sat in b's share of 512 KiB, and with more
/// of them b's verified publishers got 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_stranger_keeps_no_more_retained_here_than_this_nodes_share() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = example_auth_fast(dir.path());
    let nats = tokio::task::block_in_place(NatsServer::start);
    let a = Node::start_async(
        "a",
        &nats.url(),
        &format!("{auth}[mqtt]\nmax_memory = {}\n", 8 * SMALL),
    )
    .await;
    let b = Node::start_async(
        "b",
        &nats.url(),
        &format!("{auth}[mqtt]\nmax_memory = {SMALL}\n"),
    )
    .await;
    wait_linked(&a, &b).await;
    wait_linked(&b, &a).await;

    let payload = vec![b'r'; 60_000];
    let mut stranger = v5::connect_id(a.mqtt(), "retainer-a").await;
    for i in 0..40u16 {
        let code =
            v5::publish_retained(&mut stranger, &format!("probe/ret/{i}"), &payload, i + 1).await;
        assert_eq!(
            code,
            ReasonCode::SUCCESS,
            "node a's share holds message {i}"
        );
    }
    v5::disconnect(stranger).await;
    let (mut sensor1, _) =
        v5::connect(a.mqtt(), as_user(v5::connect_packet("sensor1"), "sensor1")).await;
    let code = v5::publish_retained(&mut sensor1, "sensors/sensor1/last", b"after", 1).await;
    assert!(!code.is_error(), "sensor1 on node a: {code:?}");

    // Node b has applied the bucket up to sensor1's message.
    let (mut dashboard, _) = v5::connect(
        b.mqtt(),
        as_user(v5::connect_packet("dashboard"), "dashboard"),
    )
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        v5::subscribe(&mut dashboard, "sensors/sensor1/last", QoS::AtMostOnce).await;
        if let Ok(Some(Packet::Publish(_))) =
            dashboard.recv_within(Duration::from_millis(300)).await
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node b never got sensor1's retained message"
        );
    }
    let kept = b.metric(r#"postbox_anonymous_bytes{part="kept"}"#);
    let share = (SMALL / 8) as f64;
    assert!(
        kept <= share,
        "node b keeps {kept} bytes of a stranger's on node a, past its share of {share}"
    );
    let dropped = b.metric(r#"postbox_messages_dropped_total{qos="1",reason="memory"}"#);
    assert!(
        dropped >= 30.0,
        "node b counts {dropped} of what it did not keep (keeps {kept} bytes)"
    );
    let (mut sensor2, _) =
        v5::connect(b.mqtt(), as_user(v5::connect_packet("sensor2"), "sensor2")).await;
    let code = v5::publish_retained(&mut sensor2, "sensors/sensor2/state", &payload, 1).await;
    assert!(!code.is_error(), "sensor2 on node b: {code:?}");
}

/// Issue 35, seventeenth adversarial pass, D5, on a cluster: what a bridge's remote puts
/// into the cluster's stream counts in a window of its own, apart from local strangers'.
/// An anonymous client on node a spends strangers' share of the stream (QoS 1 messages
/// nobody reads, refused 0x97 past it), then an application on the bridge's remote (a real
/// Mosquitto) sends five QoS 1 commands of 30 KB for sensor1 on node b: all five arrive, in
/// order (with their encodings, within node b's share for the bridge however slowly sensor1
/// reads).
/// Before, the bridge's messages were refused at the same window and answered 0x97, so the
/// remote dropped every one of them for `retention`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_stranger_does_not_spend_a_bridges_share_of_the_stream() {
    use crate::common::mosquitto_broker::MosquittoBroker;
    let remote = MosquittoBroker::start("").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = format!(
        "{}[mqtt]\nmax_memory = {SMALL}\n",
        example_auth_fast(dir.path())
    );
    let nats = tokio::task::block_in_place(NatsServer::start);
    let bridge = format!(
        "[[bridge]]\nname = \"cloud\"\naddresses = [\"127.0.0.1:{}\"]\nprotocol = \"5\"\n\
         restart_timeout = [1, 1]\n[[bridge.topic]]\npattern = \"sensors/sensor1/cmd\"\n\
         direction = \"in\"\nqos = 1\n",
        remote.port
    );
    let a = Node::start_async("a", &nats.url(), &format!("{auth}{bridge}")).await;
    let b = Node::start_async("b", &nats.url(), &auth).await;
    wait_linked(&a, &b).await;
    wait_linked(&b, &a).await;
    a.wait_log_async(|l| l.contains("bridge: subscribed on the remote"))
        .await;
    let (mut sensor1, _) =
        v5::connect(b.mqtt(), as_user(v5::connect_packet("sensor1"), "sensor1")).await;
    v5::subscribe(&mut sensor1, "sensors/sensor1/cmd", QoS::AtLeastOnce).await;

    let mut stranger = v5::connect_id(a.mqtt(), "stream-filler").await;
    let payload = vec![b's'; 60_000];
    let mut refused = false;
    for i in 0..40u16 {
        let p = v5::publish_packet("probe/fill", QoS::AtLeastOnce, &payload, i + 1);
        if v5::publish(&mut stranger, p).await == ReasonCode::QUOTA_EXCEEDED {
            refused = true;
            break;
        }
    }
    assert!(refused, "the stranger's share of the stream never ran out");

    let mut app = v5::connect_id(
        std::net::SocketAddr::from(([127, 0, 0, 1], remote.port)),
        "remote-app",
    )
    .await;
    for i in 0..5u16 {
        let mut command = format!("{i}").into_bytes();
        command.resize(30_000, b'.');
        let code = v5::publish_qos1(&mut app, "sensors/sensor1/cmd", &command, i + 1).await;
        assert_eq!(code, ReasonCode::SUCCESS, "Mosquitto took command {i}");
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        let command = v5::receive(&mut sensor1).await;
        got.push(String::from_utf8_lossy(&command.payload[..1]).into_owned());
    }
    assert_eq!(
        got,
        ["0", "1", "2", "3", "4"],
        "the remote's commands on node b"
    );
}

/// Issue 35, seventeenth adversarial pass, D6: with `max_stream_bytes` of 4 MiB, sensor1
/// (a password user) on node a publishes QoS 1 messages of 100 KB until refused: its
/// window, a quarter of the stream by default, takes about 10 of them (0x97 past it); then
/// sensor2 publishes on node a and on node b and each PUBLISH is acknowledged, and the
/// dashboard gets sensor1's accepted messages. Before, sensor1 filled the stream alone
/// (about 40 messages) and every QoS 1 PUBLISH on either node got 0x97 until its messages
/// aged out (`retention`, an hour by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_cannot_fill_the_stream_for_everyone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auth = example_auth_fast(dir.path());
    let nats = tokio::task::block_in_place(NatsServer::start);
    let keys = format!("max_stream_bytes = {}\n{auth}", 4 << 20);
    let a = Node::start_async("a", &nats.url(), &keys).await;
    let b = Node::start_async("b", &nats.url(), &keys).await;
    wait_linked(&a, &b).await;
    wait_linked(&b, &a).await;
    let (mut dashboard, _) =
        v5::connect(b.mqtt(), as_user(v5::connect_packet("dash"), "dashboard")).await;
    v5::subscribe(&mut dashboard, "sensors/#", QoS::AtLeastOnce).await;

    let (mut sensor1, _) =
        v5::connect(a.mqtt(), as_user(v5::connect_packet("sensor1"), "sensor1")).await;
    let payload = vec![b'p'; 100_000];
    let mut accepted = 0u16;
    for id in 1..=60u16 {
        match v5::publish_qos1(&mut sensor1, "sensors/sensor1/bulk", &payload, id).await {
            ReasonCode::SUCCESS => accepted += 1,
            code => {
                assert_eq!(code, ReasonCode::QUOTA_EXCEEDED, "sensor1's PUBLISH {id}");
                break;
            }
        }
    }
    assert!(
        (5..=11).contains(&accepted),
        "sensor1 put {accepted} of 100 KB into a quarter of a 4 MiB stream"
    );
    for (node, name) in [(&a, "a"), (&b, "b")] {
        let (mut sensor2, _) = v5::connect(
            node.mqtt(),
            as_user(v5::connect_packet(&format!("sensor2-{name}")), "sensor2"),
        )
        .await;
        for id in 1..=3u16 {
            assert_eq!(
                v5::publish_qos1(&mut sensor2, "sensors/sensor2/t", b"reading", id).await,
                ReasonCode::SUCCESS,
                "sensor2's PUBLISH {id} on node {name} after sensor1 used its window"
            );
        }
        v5::disconnect(sensor2).await;
    }
    let mut from_sensor1 = 0u16;
    for _ in 0..accepted + 6 {
        let p = v5::receive(&mut dashboard).await;
        if &*p.topic == "sensors/sensor1/bulk" {
            from_sensor1 += 1;
        }
    }
    assert_eq!(
        from_sensor1, accepted,
        "sensor1's accepted messages on node b"
    );
}

/// Issue 35, eighteenth adversarial pass, E0: one client on node a rewrites one retained
/// topic with 500 KB messages at QoS 0 as fast as its socket goes (a PINGREQ every 50 to
/// stay in step). Each rewrite is a put into the cluster's retained bucket and, on every
/// node, a write for its durable store. Before, the puts were sent unawaited and counted
/// nowhere: node a reached 1.15 GB here (16 MiB budget). Now a topic has one put in flight
/// and the newest waiting, and what waits for NATS or the disk pauses the publisher: node a
/// stays under 512 MiB (about 100 MB held, the rest freed buffers the allocator keeps), and node b ends with the last value (MQTT-3.3.1-5). Node b's RSS
/// is bounded loosely (1 GiB) and not by this test's fix: at 2,000 rewrites what it holds
/// is mostly freed 500 KB buffers jemalloc keeps for reuse (it stays near 40 MB with them
/// returned at once, `dirty_decay_ms:0`), before and after; its store queue's bound is
/// `flow_control::retained_rewrites_faster_than_the_disk_pause_their_publisher`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_retained_rewrites_grow_no_node() {
    const BUDGET: u64 = 16 << 20;
    const RSS_BOUND: u64 = 512 << 20;
    const MESSAGES: usize = 2_000;
    const SIZE: usize = 500_000;
    let nats = tokio::task::block_in_place(NatsServer::start);
    let extra = format!("[auth]\nallow_anonymous = true\n[mqtt]\nmax_memory = {BUDGET}\n");
    let a = Node::start_async("a", &nats.url(), &extra).await;
    let b = Node::start_async("b", &nats.url(), &extra).await;
    wait_linked(&a, &b).await;
    wait_linked(&b, &a).await;

    let mut c = v5::connect_id(a.mqtt(), "rewriter").await;
    let mut peak = (0u64, 0u64);
    v5::rewrite_retained(&mut c, "status/one", SIZE, MESSAGES, || {
        peak.0 = peak.0.max(common::process::rss_bytes(a.pid()));
        peak.1 = peak.1.max(common::process::rss_bytes(b.pid()));
    })
    .await;
    // Node b ends with the last value; meanwhile its RSS is watched too.
    let last = format!("{:08}", MESSAGES - 1);
    let mut reader = v5::connect_id(b.mqtt(), "reader").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        v5::subscribe(&mut reader, "status/one", QoS::AtMostOnce).await;
        peak.1 = peak.1.max(common::process::rss_bytes(b.pid()));
        if let Ok(Some(Packet::Publish(p))) = reader.recv_within(Duration::from_millis(300)).await {
            if p.payload[..8] == *last.as_bytes() {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node b never got the last retained value"
        );
    }
    println!(
        "RSS peaks: a {} MiB, b {} MiB (budget {} MiB)",
        peak.0 >> 20,
        peak.1 >> 20,
        BUDGET >> 20
    );
    assert!(peak.0 < RSS_BOUND, "node a's RSS reached {} B", peak.0);
    assert!(peak.1 < 1 << 30, "node b's RSS reached {} B", peak.1);
}
