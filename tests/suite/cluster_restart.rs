//! A session across a restart of its node and then a move (issue 34, "duplicate QoS 2
//! deliveries"), with a real `nats-server -js` and real `postbox` nodes: the messages a
//! node's store brings back at a restart keep their cluster stream sequence, so what the
//! client completes of them after the restart is not sent again by the node it moves to.

use crate::common;

use std::collections::{HashMap, HashSet};

use crate::cluster_sessions::receive_exactly_once;
use common::cluster::Node;
use common::{v5, RawClient, WAIT};
use postbox::codec::{Packet, PubResponse, QoS};

/// How node a stops before it starts again.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGTERM: a graceful stop (a rolling upgrade).
    Term,
    /// `kill -9`: a crash.
    Kill,
}

/// Messages queued per publishing node while the session is offline.
const PER_NODE: u16 = 4;

/// MQTT 5, 4.3.3: "the sender MUST NOT re-send the PUBLISH once it has sent the
/// corresponding PUBREL packet" [MQTT-4.3.3-6], and a receiver that sent PUBCOMP takes a
/// PUBLISH with that packet id as a new publication [MQTT-4.3.3-12]; a message in flight is
/// sent again with its packet id (MQTT-4.4.0-1), so the client takes each QoS 2 message
/// once. A persistent session on node a holds QoS 2 messages queued while it was offline
/// (published on node b and on node a itself); node a restarts (SIGTERM, or `kill -9`) and its store brings them
/// back; the client resumes on node a, keeps the first in flight (no PUBREC) and completes
/// the rest, which lie above the session's replay cursor (the first one's sequence). Moved
/// to node b, the session must send the first again under its packet id and none of the
/// others: before the fix the store lost the stream sequences, the cursor stayed at the one
/// recorded before the restart and nothing could be listed as taken, so node b's replay
/// sent every one of them again under new packet ids.
async fn restored_qos2_messages_arrive_once_after_a_move(stop: Stop) {
    let (_nats, mut nodes) = common::cluster::start_cluster(2, "").await;
    let client_id = format!("restored-{stop:?}");
    let topic = format!("rs-{stop:?}");
    let (mut client, _) =
        v5::connect(nodes[0].mqtt(), v5::persistent_connect(&client_id, 3600)).await;
    v5::subscribe(&mut client, &format!("{topic}/#"), QoS::ExactlyOnce).await;
    v5::disconnect(client).await;

    // Node b's messages (through node a's consumer, their sequence known when routed),
    // then node a's own (stored before JetStream gives their sequence). Node a's
    // acknowledgement of its own ones waits for their commit, so everything node a stored
    // before them (node b's, queued: its backlog counts them) is durable too by then: what
    // a `kill -9` may not lose.
    let mut on_b = v5::connect_id(nodes[1].mqtt(), &format!("{client_id}-pub-b")).await;
    publish_numbered(&mut on_b, &format!("{topic}/b"), "b", PER_NODE).await;
    wait_backlog(&nodes[0], &client_id, usize::from(PER_NODE)).await;
    let mut on_a = v5::connect_id(nodes[0].mqtt(), &format!("{client_id}-pub-a")).await;
    publish_numbered(&mut on_a, &format!("{topic}/a"), "a", PER_NODE).await;
    v5::disconnect(on_a).await;
    let total = usize::from(2 * PER_NODE);
    wait_backlog(&nodes[0], &client_id, total).await;

    match stop {
        Stop::Term => drop(tokio::task::block_in_place(|| nodes[0].terminate())),
        Stop::Kill => tokio::task::block_in_place(|| nodes[0].kill9()),
    }
    tokio::task::block_in_place(|| nodes[0].restart());

    let (mut client, ack) =
        v5::connect(nodes[0].mqtt(), v5::persistent_connect(&client_id, 3600)).await;
    assert!(ack.session_present, "node a's store kept the session");
    let (held, completed) = take_all_but_the_first(&mut client, total).await;
    v5::disconnect(client).await;

    let (mut moved, ack) =
        v5::connect(nodes[1].mqtt(), v5::persistent_connect(&client_id, 3600)).await;
    assert!(ack.session_present, "the session moved (MQTT-3.2.2-2)");
    // Published after all of them: a second copy of any would come before it.
    let code = v5::publish(
        &mut on_b,
        v5::publish_packet(&format!("{topic}/b"), QoS::ExactlyOnce, b"last", 99),
    )
    .await;
    assert!(!code.is_error(), "last refused: {code:?}");
    let mut awaiting = HashSet::from([held.0]);
    let mut got = completed;
    *got.entry(held.1).or_default() += 1;
    receive_exactly_once(&mut moved, &mut awaiting, &mut got, total + 1).await;
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "QoS 2 delivered more than once after a restart and a move (MQTT-4.3.3-6): {twice:?}"
    );
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_qos2_messages_arrive_once_after_a_sigterm_restart_and_a_move() {
    restored_qos2_messages_arrive_once_after_a_move(Stop::Term).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_qos2_messages_arrive_once_after_a_kill_9_restart_and_a_move() {
    restored_qos2_messages_arrive_once_after_a_move(Stop::Kill).await;
}

/// MQTT-4.3.3 (exactly once), MQTT-4.4.0-1 (a session's messages survive its node's
/// restart) and issue 34's rule "never acknowledge what you might lose", from the other
/// side: node a's consumer routes a message from node b to an offline persistent session and
/// commits it, then node a crashes before its JetStream acknowledgement leaves (the tap
/// swallows it: the window between commit and acknowledgement a `kill -9` may hit).
/// JetStream offers the message again once `ack_wait` (30 s) passes; the store brought it
/// back queued for the session already, so the client must take it once. Before the fix the
/// consumer routed it to the session a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_stored_but_not_acknowledged_to_jetstream_before_a_crash_arrives_once() {
    let (nats, tap, mut a, b) = tapped_pair().await;
    let client_id = "unacknowledged";
    let (mut client, _) = v5::connect(a.mqtt(), v5::persistent_connect(client_id, 3600)).await;
    v5::subscribe(&mut client, "ua/#", QoS::ExactlyOnce).await;
    v5::disconnect(client).await;

    tap.swallow_upstream();
    let mut on_b = v5::connect_id(b.mqtt(), "unacknowledged-pub").await;
    publish_numbered(&mut on_b, "ua/m", "m", 1).await;
    wait_backlog(&a, client_id, 1).await;
    // Sent only once the commit is durable.
    tap.wait_swallowed(b"$JS.ACK").await;
    tokio::task::block_in_place(|| a.kill9());
    tokio::task::block_in_place(|| a.restart());

    // The only message from another node since the restart: "m1" offered again.
    let offered = r#"postbox_cluster_messages_total{direction="in"}"#;
    within_ack_wait(
        "JetStream never offered the unacknowledged message again",
        async || tokio::task::block_in_place(|| a.metric(offered)) >= 1.0,
    )
    .await;
    // Routed after it: a second copy of "m1" would come before it.
    publish_accepted(&mut on_b, "ua/m", "last", 99).await;

    let (mut client, ack) = v5::connect(a.mqtt(), v5::persistent_connect(client_id, 3600)).await;
    assert!(ack.session_present, "node a's store kept the session");
    let mut got = HashMap::new();
    receive_exactly_once(&mut client, &mut HashSet::new(), &mut got, 2).await;
    assert_eq!(
        got.get("m1"),
        Some(&1),
        "taken more than once after the crash (MQTT-4.3.3): {got:?}"
    );
    drop((a, b, tap, nats));
}

/// MQTT-4.3.3 (exactly once) across a dropped connection to NATS: node a's consumer routes
/// a message from node b to a connected session, commits it, and the client completes it;
/// node a's JetStream acknowledgement is lost with its connection (the tap swallows it, then
/// cuts the connection). Node a reconnects, and JetStream offers the message again once
/// `ack_wait` (30 s) passes: node a must acknowledge it without routing it again. Before the
/// fix the client took it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_acknowledgement_a_dropped_nats_connection_lost_arrives_once() {
    let (nats, tap, a, b) = tapped_pair().await;
    // A session without expiry: nothing of it waits for NATS, which hears nothing from node
    // a while the tap swallows.
    let mut client = v5::connect_id(a.mqtt(), "lost-ack").await;
    v5::subscribe(&mut client, "la/#", QoS::ExactlyOnce).await;

    tap.swallow_upstream();
    let mut on_b = v5::connect_id(b.mqtt(), "lost-ack-pub").await;
    publish_numbered(&mut on_b, "la/m", "m", 1).await;
    let (mut awaiting, mut got) = (HashSet::new(), HashMap::new());
    receive_exactly_once(&mut client, &mut awaiting, &mut got, 1).await;
    tap.wait_swallowed(b"$JS.ACK").await;
    let seq = stream_end(&nats.url()).await;
    tap.cut();

    // Acknowledged at last: offered again and taken (or, before the fix, routed again).
    within_ack_wait(
        "node a never acknowledged the message offered again",
        async || ack_floor(&nats.url(), "node-a").await >= seq,
    )
    .await;
    // Routed after it: a second copy of "m1" would come before it.
    publish_accepted(&mut on_b, "la/m", "last", 99).await;
    receive_exactly_once(&mut client, &mut awaiting, &mut got, 2).await;
    assert_eq!(
        got.get("m1"),
        Some(&1),
        "taken more than once after a lost acknowledgement (MQTT-4.3.3): {got:?}"
    );
    drop((a, b, tap, nats));
}

/// NATS, and two linked nodes: `a` reaches NATS through a [`common::tap::Tap`], `b` directly.
async fn tapped_pair() -> (common::nats::NatsServer, common::tap::Tap, Node, Node) {
    let nats = tokio::task::block_in_place(common::nats::NatsServer::start);
    let tap = common::tap::Tap::start(nats.port).await;
    let a = Node::start_async("a", &format!("nats://127.0.0.1:{}", tap.port), "").await;
    let b = Node::start_async("b", &nats.url(), "").await;
    common::cluster::wait_linked(&a, &b).await;
    common::cluster::wait_linked(&b, &a).await;
    (nats, tap, a, b)
}

/// The last sequence of the cluster's message stream.
async fn stream_end(nats: &str) -> u64 {
    let js = async_nats::jetstream::new(async_nats::connect(nats).await.expect("connect to NATS"));
    let mut stream = js
        .get_stream(postbox::test_support::cluster::STREAM)
        .await
        .expect("the message stream");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

/// The acknowledgement floor (stream sequence) of `consumer` on the message stream.
async fn ack_floor(nats: &str, consumer: &str) -> u64 {
    let js = async_nats::jetstream::new(async_nats::connect(nats).await.expect("connect to NATS"));
    let stream = js
        .get_stream(postbox::test_support::cluster::STREAM)
        .await
        .expect("the message stream");
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(consumer).await.expect("the consumer");
    consumer
        .info()
        .await
        .expect("consumer info")
        .ack_floor
        .stream_sequence
}

/// Publishes `<prefix>1..=count` on `topic` at QoS 2; every one must be accepted.
async fn publish_numbered(c: &mut RawClient, topic: &str, prefix: &str, count: u16) {
    for n in 1..=count {
        publish_accepted(c, topic, &format!("{prefix}{n}"), n).await;
    }
}

/// Publishes `payload` on `topic` at QoS 2 (packet id `id`); it must be accepted.
async fn publish_accepted(c: &mut RawClient, topic: &str, payload: &str, id: u16) {
    let code = v5::publish(
        c,
        v5::publish_packet(topic, QoS::ExactlyOnce, payload.as_bytes(), id),
    )
    .await;
    assert!(!code.is_error(), "{payload} refused: {code:?}");
}

/// Polls `done` every 200 ms until it holds, for at most 90 s (JetStream offers an
/// unacknowledged message again after `ack_wait`, 30 s, so WAIT is too short); else fails
/// saying `what`.
async fn within_ack_wait(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Waits (bounded by `WAIT`, polling the admin API) until `node` holds `want` messages
/// queued for `client_id`: every message is in its store before it stops.
async fn wait_backlog(node: &Node, client_id: &str, want: usize) {
    let port = node.config.metrics;
    let path = format!("/api/v1/sessions/{client_id}");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let body = tokio::task::block_in_place(|| common::http::http_get(port, &path));
        let backlog = body
            .split_once("\r\n\r\n")
            .and_then(|(_, json)| serde_json::from_str::<serde_json::Value>(json).ok())
            .and_then(|v| v["backlog"].as_u64());
        if backlog == Some(want as u64) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {} never held {want} messages for {client_id}: {body}",
            node.id
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Receives `total` QoS 2 messages: the first stays in flight (no PUBREC), the others are
/// completed (PUBREC, PUBREL, PUBCOMP). Returns the first's packet id and payload, and how
/// many times each payload was taken.
async fn take_all_but_the_first(
    c: &mut RawClient,
    total: usize,
) -> ((u16, String), HashMap<String, usize>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut held = None;
    let mut got: HashMap<String, usize> = HashMap::new();
    let mut releasing: HashSet<u16> = HashSet::new();
    let mut completed = 0;
    while completed + 1 < total || held.is_none() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                assert_eq!(p.qos, QoS::ExactlyOnce, "granted QoS 2");
                let payload = String::from_utf8_lossy(&p.payload).into_owned();
                if held.is_none() {
                    held = Some((p.packet_id, payload));
                    continue;
                }
                if held.as_ref().is_some_and(|(id, _)| *id == p.packet_id) {
                    continue; // the held one again (DUP): not taken twice
                }
                if releasing.insert(p.packet_id) {
                    *got.entry(payload).or_default() += 1;
                }
                c.send(&Packet::PubRec(PubResponse::new(p.packet_id))).await;
            }
            Ok(Some(Packet::PubRel(r))) => {
                if releasing.remove(&r.packet_id) {
                    completed += 1;
                }
                c.send(&Packet::PubComp(PubResponse::new(r.packet_id)))
                    .await;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("closed after {completed} completed of {total}"),
            Err(()) => panic!("only {completed} of {} completed", total - 1),
        }
    }
    // One connection's packets are handled in order: the PINGRESP says every PUBCOMP was read.
    c.send(&Packet::PingReq).await;
    match c.recv_within(WAIT).await {
        Ok(Some(Packet::PingResp)) => {}
        other => panic!("expected PINGRESP, got {other:?}"),
    }
    (held.expect("a message held in flight"), got)
}
