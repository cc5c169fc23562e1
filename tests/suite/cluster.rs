//! The cluster over NATS JetStream (issue 17) with a real `nats-server -js` and real `postbox`
//! nodes: cross-node delivery at each QoS with properties and order, once per subscriber,
//! retained messages cluster-wide, refusal while NATS is down and recovery, nothing
//! acknowledged lost when NATS restarts under load or when a node is killed, and the
//! `[cluster]` config rule on the node id. Sessions moving between nodes, takeover and shared
//! groups across nodes are not covered here.
//!
//! Every test starts its own `nats-server` and only the nodes it needs, on free loopback ports.

use crate::common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::cluster::{write_node_config, Node};
use common::nats::NatsServer;
use common::rumq::V5;
use common::{v5, RawClient, WAIT};
use postbox::codec::{Packet, ProtocolVersion, PubResponse, QoS, ReasonCode};
use rumqttc::v5::mqttbytes::v5::{PublishProperties, SubscribeReasonCode};

/// NATS and `count` linked nodes (`a`, `b`, `c`, ...) with `extra` `[cluster]` keys.
async fn cluster(count: usize, extra: &str) -> (NatsServer, Vec<Node>) {
    common::cluster::start_cluster(count, extra).await
}

fn rqos(q: u8) -> rumqttc::v5::mqttbytes::QoS {
    match q {
        0 => rumqttc::v5::mqttbytes::QoS::AtMostOnce,
        1 => rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        _ => rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
    }
}

/// Issue 17, Behaviour: "A message published on any node reaches every matching subscriber on
/// every node, once, at the granted QoS, with MQTT ordering per publisher and topic" — here
/// with a subscriber on node B and the publisher on node A: QoS 0/1/2 published onto
/// subscriptions granted 0/1/2 arrive at min(published, granted) (MQTT-3.8.4-8) with their
/// payload, user property and content type (MQTT-3.3.2-17, -20); 200 QoS 1 messages arrive in
/// publish order (MQTT 4.6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_node_delivery_at_each_qos_keeps_properties_and_order() {
    let (_nats, nodes) = cluster(2, "").await;
    let (a, b) = (&nodes[0], &nodes[1]);

    let mut sub = V5::connect(b.mqtt(), "qos-sub").await;
    for granted in 0..3u8 {
        sub.client
            .subscribe(format!("x/g{granted}"), rqos(granted))
            .await
            .expect("subscribe queued");
        let ack = sub.suback().await;
        assert_eq!(
            ack.return_codes,
            [SubscribeReasonCode::Success(rqos(granted))]
        );
    }
    sub.client
        .subscribe("x/order", rqos(1))
        .await
        .expect("subscribe queued");
    sub.suback().await;

    let publisher = V5::connect(a.mqtt(), "qos-pub").await;
    let properties = PublishProperties {
        user_properties: vec![("origin".into(), "node-a".into())],
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    for granted in 0..3u8 {
        for published in 0..3u8 {
            publisher
                .client
                .publish_with_properties(
                    format!("x/g{granted}"),
                    rqos(published),
                    false,
                    format!("g{granted}p{published}"),
                    properties.clone(),
                )
                .await
                .expect("publish queued");
        }
    }
    let mut seen = HashMap::new();
    while seen.len() < 9 {
        let p = sub.next_publish().await;
        let payload = String::from_utf8_lossy(&p.payload).into_owned();
        assert!(
            seen.insert(payload.clone(), p.clone()).is_none(),
            "{payload} delivered twice"
        );
    }
    for granted in 0..3u8 {
        for published in 0..3u8 {
            let p = &seen[&format!("g{granted}p{published}")];
            assert_eq!(
                p.qos,
                rqos(granted.min(published)),
                "g{granted}p{published}"
            );
            assert_eq!(&p.topic[..], format!("x/g{granted}").as_bytes());
            let props = p.properties.as_ref().expect("properties");
            assert_eq!(props.user_properties, properties.user_properties);
            assert_eq!(props.content_type.as_deref(), Some("text/plain"));
        }
    }

    const RUN: u32 = 200;
    for i in 0..RUN {
        publisher
            .client
            .publish("x/order", rqos(1), false, i.to_string())
            .await
            .expect("publish queued");
    }
    for i in 0..RUN {
        let p = sub.next_publish().await;
        assert_eq!(
            String::from_utf8_lossy(&p.payload),
            i.to_string(),
            "MQTT order per publisher and topic across nodes"
        );
    }
}

/// Collects the payloads a rumqttc subscriber gets until `last` arrives (excluded).
async fn collect_until(sub: &mut V5, last: &str) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        let p = sub.next_publish().await;
        let payload = String::from_utf8_lossy(&p.payload).into_owned();
        if payload == last {
            return got;
        }
        got.push(payload);
    }
}

/// Issue 17: "reaches every matching subscriber on every node, once" and "loop-free (origin
/// node id)": with subscribers on A and B and publishers on both, each subscriber gets each
/// message exactly once — the publishing node does not get its own messages back from the
/// stream. The check ends on a sync message from the other node published after everything
/// else: a node's consumer takes the stream in order, so a looped-back copy would come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscriber_gets_each_message_once() {
    let (_nats, nodes) = cluster(2, "").await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut sub_a = V5::connect(a.mqtt(), "once-sub-a").await;
    let mut sub_b = V5::connect(b.mqtt(), "once-sub-b").await;
    for sub in [&mut sub_a, &mut sub_b] {
        sub.client
            .subscribe("once/t", rqos(1))
            .await
            .expect("subscribe queued");
        sub.suback().await;
    }
    let mut pub_a = v5::connect_id(a.mqtt(), "once-pub-a").await;
    let mut pub_b = v5::connect_id(b.mqtt(), "once-pub-b").await;
    let mut expected: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    for (i, m) in expected.iter().enumerate() {
        let id = u16::try_from(i + 1).expect("small");
        assert_eq!(
            v5::publish_qos1(&mut pub_a, "once/t", m.as_bytes(), id).await,
            ReasonCode::SUCCESS
        );
    }
    for (on_b, payload) in [
        (true, "markB"),
        (false, "markA"),
        (false, "syncA"),
        (true, "syncB"),
    ] {
        let client = if on_b { &mut pub_b } else { &mut pub_a };
        let code = v5::publish(
            client,
            v5::publish_packet("once/t", QoS::AtLeastOnce, payload.as_bytes(), 100),
        )
        .await;
        assert_eq!(code, ReasonCode::SUCCESS, "{payload}");
    }
    expected.extend(["markB".to_owned(), "markA".to_owned()]);
    expected.sort();
    for (sub, sync) in [(&mut sub_a, "syncB"), (&mut sub_b, "syncA")] {
        let mut got = collect_until(sub, sync).await;
        got.retain(|p| !p.starts_with("sync"));
        got.sort();
        assert_eq!(
            got, expected,
            "each message once at the subscriber (ends at {sync})"
        );
    }
}

/// The retained messages a fresh client gets when it subscribes to `prefix/#` on `node`
/// (topic, payload): it then publishes `prefix/end` itself (QoS 0, not retained), which its
/// own subscription delivers after every retained message.
async fn retained_on(node: &Node, prefix: &str, client: &str) -> Vec<(String, Vec<u8>)> {
    let mut c = v5::connect_id(node.mqtt(), client).await;
    v5::subscribe(&mut c, &format!("{prefix}/#"), QoS::AtLeastOnce).await;
    let end = format!("{prefix}/end");
    v5::publish(&mut c, v5::publish_packet(&end, QoS::AtMostOnce, b"", 0)).await;
    let mut retained = Vec::new();
    loop {
        let p = v5::receive(&mut c).await;
        if p.topic == end.as_str() {
            break;
        }
        if p.retain {
            retained.push((p.topic.to_string(), p.payload.to_vec()));
        }
    }
    v5::disconnect(c).await;
    retained
}

/// Waits (bounded) until a new subscriber on `node` gets exactly `want` as retained messages
/// under `prefix`: another node's retained change reaches this node's index through the
/// retained bucket's watch, asynchronously, with no event a client could await.
async fn wait_retained(node: &Node, prefix: &str, want: &[(String, Vec<u8>)]) {
    let deadline = tokio::time::Instant::now() + WAIT;
    for attempt in 0.. {
        let got = retained_on(node, prefix, &format!("ret-{}-{attempt}", node.id)).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node {}: retained under {prefix} is {got:?}, want {want:?}",
            node.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 17: "Retained messages are cluster-wide (and their deletion); a new subscriber on
/// any node gets them": set on A, a new subscriber on B gets it (retain flag set,
/// MQTT-3.3.1-9); a node C started afterwards serves it too (from the bucket's history); an
/// empty retained PUBLISH on A (MQTT-3.3.1-10) removes it on B and C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_and_their_deletion_are_cluster_wide() {
    let (nats, nodes) = cluster(2, "").await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut publisher = v5::connect_id(a.mqtt(), "ret-pub").await;
    let mut set = v5::publish_packet("keep/r", QoS::AtLeastOnce, b"kept", 1);
    set.retain = true;
    let code = v5::publish(&mut publisher, set).await;
    assert!(!code.is_error(), "retained set: {code:?}");
    let kept = [("keep/r".to_owned(), b"kept".to_vec())];
    wait_retained(b, "keep", &kept).await;

    let c = Node::start_async("c", &nats.url(), "").await;
    wait_retained(&c, "keep", &kept).await;

    let mut delete = v5::publish_packet("keep/r", QoS::AtLeastOnce, b"", 2);
    delete.retain = true;
    let code = v5::publish(&mut publisher, delete).await;
    assert!(!code.is_error(), "retained delete: {code:?}");
    wait_retained(b, "keep", &[]).await;
    wait_retained(&c, "keep", &[]).await;
    wait_retained(a, "keep", &[]).await;
}

/// Issue 17, Design constraints: "a node that loses NATS stops accepting QoS ≥ 1 publishes it
/// cannot make durable cluster-wide (0x97 / disconnect) rather than acknowledging what it
/// could lose; it recovers when NATS returns", and docs/cluster-design.md "Losing NATS": QoS 0
/// and local-only traffic carry on. The refused message is delivered nowhere;
/// `postbox_cluster_refused_total` counts both refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_down_refuses_qos1_keeps_qos0_local_and_recovers() {
    let (mut nats, nodes) = cluster(2, "").await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut sub_a = v5::connect_id(a.mqtt(), "down-sub-a").await;
    v5::subscribe(&mut sub_a, "down/#", QoS::AtLeastOnce).await;
    let mut sub_b = v5::connect_id(b.mqtt(), "down-sub-b").await;
    v5::subscribe(&mut sub_b, "down/#", QoS::AtLeastOnce).await;
    let mut publisher = v5::connect_id(a.mqtt(), "down-pub").await;

    tokio::task::block_in_place(|| nats.stop());
    a.wait_up_async(false).await;

    assert_eq!(
        v5::publish_qos1(&mut publisher, "down/q1", b"refused", 1).await,
        ReasonCode::QUOTA_EXCEEDED,
        "v5 QoS 1 while NATS is down"
    );
    v5::publish(
        &mut publisher,
        v5::publish_packet("down/q0", QoS::AtMostOnce, b"local", 0),
    )
    .await;
    let p = v5::receive(&mut sub_a).await;
    assert_eq!(
        &p.payload[..],
        b"local",
        "QoS 0 reaches the local subscriber, the refused QoS 1 nowhere"
    );

    common::expect_v311_publish_refused(
        a.mqtt(),
        "down-v311",
        "down/q1",
        b"refused-311",
        7,
        "3.1.1 QoS 1 while NATS is down: disconnected, not acknowledged",
    )
    .await;
    assert_eq!(
        tokio::task::block_in_place(|| a.metric("postbox_cluster_refused_total")),
        2.0,
        "both refusals counted"
    );

    tokio::task::block_in_place(|| nats.start_again());
    a.wait_up_async(true).await;
    b.wait_up_async(true).await;
    assert_eq!(
        v5::publish_qos1(&mut publisher, "down/q1", b"after", 2).await,
        ReasonCode::SUCCESS,
        "QoS 1 accepted once NATS is back"
    );
    let p = v5::receive(&mut sub_a).await;
    assert_eq!(&p.payload[..], b"after");
    let p = v5::receive(&mut sub_b).await;
    assert_eq!(
        &p.payload[..],
        b"after",
        "delivered cross-node, and nothing refused before it"
    );
}

/// A publisher of `count` numbered QoS 1 messages on `topic` that re-sends what was refused
/// (0x97) or not acknowledged before its connection closed, one every `pace` at most, until every one got a successful
/// PUBACK (returned: the numbers acknowledged, in order of their PUBACK). `acked` counts them
/// as they come and `refusals` the refusals, for the test to act on.
#[allow(clippy::too_many_arguments)]
async fn publish_all(
    node: std::net::SocketAddr,
    client: &str,
    topic: &str,
    count: u32,
    acked: Arc<AtomicUsize>,
    refusals: Arc<AtomicUsize>,
    pace: Duration,
    limit: Duration,
) -> Vec<u32> {
    const WINDOW: usize = 20;
    let deadline = tokio::time::Instant::now() + limit;
    let mut to_send: VecDeque<u32> = (0..count).collect();
    let mut inflight: HashMap<u16, u32> = HashMap::new();
    let mut done = Vec::new();
    let mut next_id = 0u16;
    let mut c = v5::connect_id(node, client).await;
    while done.len() < count as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "publisher: {} of {count} acknowledged within {limit:?}",
            done.len()
        );
        while inflight.len() < WINDOW {
            let Some(n) = to_send.pop_front() else { break };
            next_id = loop {
                next_id = next_id % u16::MAX + 1;
                if !inflight.contains_key(&next_id) {
                    break next_id;
                }
            };
            inflight.insert(next_id, n);
            // Spread the run over a few seconds, so that the test's event lands mid-run.
            tokio::time::sleep(pace).await;
            c.send(&Packet::Publish(v5::publish_packet(
                topic,
                QoS::AtLeastOnce,
                n.to_string().as_bytes(),
                next_id,
            )))
            .await;
        }
        match c.recv_within(Duration::from_secs(1)).await {
            Ok(Some(Packet::PubAck(ack))) => {
                let Some(n) = inflight.remove(&ack.packet_id) else {
                    continue;
                };
                if ack.reason_code.is_error() {
                    to_send.push_back(n);
                    refusals.fetch_add(1, Ordering::SeqCst);
                    // Refused while NATS is away: do not spin on the two cores.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                } else {
                    done.push(n);
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(Some(_)) | Err(()) => {}
            Ok(None) => {
                // Closed unacknowledged (no JetStream ack within publish_timeout): re-send.
                to_send.extend(inflight.drain().map(|(_, n)| n));
                c = v5::connect_id(node, client).await;
            }
        }
    }
    v5::disconnect(c).await;
    done
}

/// A persistent QoS 1 subscriber that acknowledges everything and records the numbers it
/// gets, until its connection closes.
fn collect_numbers(mut c: RawClient, got: Arc<Mutex<HashSet<u32>>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let p = match c.recv_within(Duration::from_secs(120)).await {
                Ok(Some(Packet::Publish(p))) => p,
                Ok(Some(_)) => continue,
                Ok(None) | Err(()) => return,
            };
            // Recorded before it is acknowledged: it arrived. The PUBACK's write may fail
            // (the node was just killed): then the node sends it again, which is allowed.
            if let Some(n) = std::str::from_utf8(&p.payload)
                .ok()
                .and_then(|s| s.parse().ok())
            {
                got.lock().expect("lock").insert(n);
            }
            if p.qos == QoS::AtLeastOnce {
                let mut out = bytes::BytesMut::new();
                let ack = Packet::PubAck(PubResponse::new(p.packet_id));
                postbox::codec::encode(&ack, ProtocolVersion::V5, &mut out).expect("encode");
                c.send_raw(&out).await;
            }
        }
    })
}

/// Waits (bounded by `limit`) until `got` holds every number in `want`.
async fn wait_all(got: &Mutex<HashSet<u32>>, want: &[u32], limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let missing: Vec<u32> = {
            let got = got.lock().expect("lock");
            want.iter().copied().filter(|n| !got.contains(n)).collect()
        };
        if missing.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} acknowledged messages never arrived within {limit:?}: {:?}",
            missing.len(),
            &missing[..missing.len().min(20)]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until `counter` reaches `at_least`.
async fn wait_count(counter: &AtomicUsize, at_least: usize, what: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while counter.load(Ordering::SeqCst) < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never reached {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 17, Tests: "NATS restarted under load loses nothing acknowledged". A publisher on A
/// sends 500 numbered QoS 1 messages (re-sending what is refused or unacknowledged) to a
/// persistent subscriber on B; NATS is stopped and started again in the middle. Every message
/// A acknowledged arrives at B (duplicates allowed, MQTT 4.3.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restarted_under_load_loses_nothing_acknowledged() {
    const COUNT: u32 = 500;
    let (mut nats, nodes) = cluster(2, "publish_timeout = 2").await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let (mut sub, _) = v5::connect(b.mqtt(), v5::persistent_connect("load-sub", 3600)).await;
    v5::subscribe(&mut sub, "load/t", QoS::AtLeastOnce).await;
    let got = Arc::new(Mutex::new(HashSet::new()));
    let collector = collect_numbers(sub, Arc::clone(&got));

    let (acked, refusals) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let publisher = tokio::spawn(publish_all(
        a.mqtt(),
        "load-pub",
        "load/t",
        COUNT,
        Arc::clone(&acked),
        Arc::clone(&refusals),
        Duration::from_millis(5),
        Duration::from_secs(25),
    ));
    wait_count(&acked, COUNT as usize / 4, "acknowledged before the stop").await;
    tokio::task::block_in_place(|| nats.stop());
    wait_count(&refusals, 1, "refusals while NATS is down").await;
    tokio::task::block_in_place(|| nats.start_again());
    let done = publisher.await.expect("publisher");
    assert_eq!(done.len(), COUNT as usize);
    wait_all(&got, &done, WAIT).await;
    collector.abort();
}

/// Issue 17, Tests: "`kill -9` of a node under QoS 1 load" — the node-local half (the session
/// stays on its node; sessions moving to another node are not tested here). A persistent
/// QoS 1 subscriber on B, a publisher on A that keeps publishing while B is killed; B started
/// again on the same data directory resumes its durable consumer, and the subscriber,
/// reconnecting with Clean Start 0, gets every message A acknowledged.
///
/// Bound: what B had pulled but not acknowledged to JetStream when it died comes again only
/// after the consumer's `ack_wait` (30 s), so the final wait allows 45 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_under_load_resumes_its_consumer() {
    const COUNT: u32 = 400;
    let (_nats, mut nodes) = cluster(2, "").await;
    let a_addr = nodes[0].mqtt();
    let connect = v5::persistent_connect("crash-sub", 3600);
    let (mut sub, _) = v5::connect(nodes[1].mqtt(), connect.clone()).await;
    v5::subscribe(&mut sub, "crash/t", QoS::AtLeastOnce).await;
    let got = Arc::new(Mutex::new(HashSet::new()));
    let collector = collect_numbers(sub, Arc::clone(&got));

    let (acked, refusals) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let publisher = tokio::spawn(publish_all(
        a_addr,
        "crash-pub",
        "crash/t",
        COUNT,
        Arc::clone(&acked),
        refusals,
        Duration::from_millis(5),
        Duration::from_secs(25),
    ));
    let deadline = tokio::time::Instant::now() + WAIT;
    while got.lock().expect("lock").len() < 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's subscriber got too little"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::task::block_in_place(|| nodes[1].kill9());
    let done = publisher.await.expect("publisher");
    let _ = collector.await;
    tokio::task::block_in_place(|| nodes[1].restart());
    let (sub, ack) = v5::connect(nodes[1].mqtt(), connect).await;
    assert!(ack.session_present, "B kept the session across kill -9");
    let collector = collect_numbers(sub, Arc::clone(&got));
    wait_all(&got, &done, Duration::from_secs(45)).await;
    collector.abort();
}

/// `[cluster]` without `node` (config/cluster.rs: every node needs its own id): the binary
/// refuses to start, exits non-zero, and its error names `cluster.node`.
#[test]
fn cluster_without_node_id_fails_to_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_node_config(dir.path(), "x", "nats://127.0.0.1:4222", "");
    let text = std::fs::read_to_string(&config.path).expect("read config");
    std::fs::write(&config.path, text.replace("node = \"x\"\n", "")).expect("write config");
    let Err(exited) = common::process::Broker::try_start(&config) else {
        panic!("started with [cluster] and no node id")
    };
    assert!(!exited.status.success());
    assert!(
        exited.output.contains("cluster.node"),
        "cluster.node in {}",
        exited.output
    );
}
