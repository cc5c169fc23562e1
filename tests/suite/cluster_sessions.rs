//! Sessions and shared groups across cluster nodes (issue 17), with a real `nats-server -js`
//! and real `postbox` nodes: a persistent session moves to another node with its queue, a
//! node killed with `kill -9` loses none of what it acknowledged for its offline sessions,
//! takeover across nodes has one winner and closes the other connection with 0x8E, and a
//! shared group with members on two nodes gets each message once, and what a member's ended
//! session held goes to a member on another node; a session a node cannot replay is refused
//! there and kept whole.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::cluster::Node;
use common::nats::NatsServer;
use common::{v5, RawClient, WAIT};
use postbox::codec::{Packet, Publish, QoS, ReasonCode};
use postbox::test_support::cluster::sessions::RECORD_INTERVAL;

/// NATS and `count` linked nodes (`a`, `b`, ...).
async fn cluster(count: usize) -> (NatsServer, Vec<Node>) {
    common::cluster::start_cluster(count, "").await
}

/// Two nodes (`a`, `b`) and a member of the shared group `workers` on each ([`group_across`]).
async fn two_nodes_with_a_group() -> (NatsServer, Vec<Node>, [RawClient; 2]) {
    let (nats, nodes) = cluster(2).await;
    let (member_a, member_b) = group_across(&nodes[0], &nodes[1]).await;
    (nats, nodes, [member_a, member_b])
}

/// Publishes `count` numbered QoS 1 messages `<prefix><n>` on `topic`; every one must be
/// acknowledged with success.
async fn publish_numbered(c: &mut RawClient, topic: &str, prefix: &str, count: u16) {
    publish_numbered_at(c, topic, prefix, count, QoS::AtLeastOnce).await;
}

/// [`publish_numbered`] at `qos` (packet id `n`).
async fn publish_numbered_at(c: &mut RawClient, topic: &str, prefix: &str, count: u16, qos: QoS) {
    for n in 1..=count {
        let payload = format!("{prefix}{n}");
        let code = v5::publish(c, v5::publish_packet(topic, qos, payload.as_bytes(), n)).await;
        assert!(!code.is_error(), "{payload} refused: {code:?}");
    }
}

/// Receives (and acknowledges) PUBLISHes until `want` distinct payloads arrived; returns them
/// in arrival order (duplicates kept). Bounded by `WAIT` overall.
async fn receive_distinct(c: &mut RawClient, want: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = HashSet::new();
    let mut all = Vec::new();
    while seen.len() < want {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                v5::ack(c, &p).await;
                let text = String::from_utf8_lossy(&p.payload).into_owned();
                seen.insert(text.clone());
                all.push(text);
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("closed after {} of {want} messages", seen.len()),
            Err(()) => panic!("only {} of {want} messages arrived: {all:?}", seen.len()),
        }
    }
    all
}

/// The subsequence of `received` that starts with `prefix`, as numbers: one publisher's
/// messages, which must keep their order (MQTT 4.6), a re-delivered one allowed.
fn numbers(received: &[String], prefix: &str) -> Vec<u32> {
    received
        .iter()
        .filter_map(|m| m.strip_prefix(prefix)?.parse().ok())
        .collect()
}

/// Asserts `ns` is `1..=count` in order, where a number may repeat right after a lower one
/// only as a re-delivery of something seen before.
fn assert_ordered(ns: &[u32], count: u32) {
    let mut next = 1;
    for &n in ns {
        if n == next {
            next += 1;
        } else {
            assert!(n < next, "{n} arrived before {next}: {ns:?}");
        }
    }
    assert_eq!(next, count + 1, "not all of 1..={count}: {ns:?}");
}

/// Issue 17: "a persistent session's subscriptions and its queue of QoS ≥ 1 messages survive
/// its node: a client that reconnects to another node resumes the session there with
/// session-present = 1 (MQTT-3.2.2-2) and receives what was queued while it was away" —
/// published on both nodes, in order per publisher (MQTT 4.6); then live messages too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_moves_to_another_node_with_its_queue() {
    let (_nats, nodes) = cluster(2).await;
    let (a, b) = (&nodes[0], &nodes[1]);

    let (mut mover, ack) = v5::connect(a.mqtt(), v5::persistent_connect("mover", 3600)).await;
    assert!(!ack.session_present);
    v5::subscribe(&mut mover, "move/#", QoS::AtLeastOnce).await;
    v5::disconnect(mover).await;

    let mut on_a = v5::connect_id(a.mqtt(), "pub-a").await;
    let mut on_b = v5::connect_id(b.mqtt(), "pub-b").await;
    publish_numbered(&mut on_a, "move/a", "a", 30).await;
    publish_numbered(&mut on_b, "move/b", "b", 30).await;

    let mut mover = resumed_on(b, "mover", "the session moved to node b (MQTT-3.2.2-2)").await;
    let received = receive_distinct(&mut mover, 60).await;
    assert_ordered(&numbers(&received, "a"), 30);
    assert_ordered(&numbers(&received, "b"), 30);

    // Its subscription came along: live messages from either node keep arriving.
    publish_numbered(&mut on_a, "move/a", "live-a", 3).await;
    let live = receive_distinct(&mut mover, 3).await;
    assert_ordered(&numbers(&live, "live-a"), 3);

    // And back to node a while still connected to b (a takeover, MQTT-3.1.4-3): node b hands
    // over what the session holds now, so what the client acknowledged on b is not sent
    // again ("reaches every matching subscriber ..., once"), and its subscription still
    // works on a.
    acknowledged(&mut mover).await;
    let (mut back, ack) = v5::connect(a.mqtt(), v5::persistent_connect("mover", 3600)).await;
    assert!(ack.session_present, "the session moved back to node a");
    v5::expect_disconnect(&mut mover, ReasonCode::SESSION_TAKEN_OVER).await;
    if let Ok(Some(again)) = back.recv_within(Duration::from_millis(1500)).await {
        panic!("sent again after the move back, though acknowledged on node b: {again:?}");
    }
    publish_numbered(&mut on_b, "move/b", "back-b", 3).await;
    let live = receive_distinct(&mut back, 3).await;
    assert_ordered(&numbers(&live, "back-b"), 3);
    v5::disconnect(back).await;
}

/// Issue 17: a session resumed on another node "receives what was queued while it was away"
/// — so a node that cannot replay it must not answer the CONNECT with a session missing it
/// (brief: never acknowledge what you might lose). Node b's NATS user may not create the
/// replay's consumer (a real permission, set in nats-server's config): its CONNACK is 0x88
/// Server unavailable (MQTT-3.2.2-6: a refusing CONNACK has Session Present 0), not a
/// session without its messages; the session's record keeps its cursor, so the client
/// resumes it on node a afterwards with every message. Before the fix node b answered
/// Session Present with no messages and recorded a cursor past them: they were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_cannot_be_replayed_is_refused_and_kept_whole() {
    let nats = tokio::task::block_in_place(|| {
        NatsServer::start_with_config(Some(
            r#"authorization {
  users = [
    { user: "a", password: "pa" }
    { user: "b", password: "pb", permissions: { publish: { deny: ["$JS.API.CONSUMER.CREATE.PB_MSGS"] } } }
  ]
}
"#,
        ))
    });
    let url = |user: &str| format!("nats://{user}:p{user}@127.0.0.1:{}", nats.port);
    let a = Node::start_async("a", &url("a"), "").await;
    let b = Node::start_async("b", &url("b"), "").await;
    common::cluster::wait_linked(&a, &b).await;
    common::cluster::wait_linked(&b, &a).await;
    assert!(
        !a.log().iter().any(|line| line.contains("pa@")),
        "node a logged its NATS password"
    );

    let (mut kept, _) = v5::connect(a.mqtt(), v5::persistent_connect("kept", 3600)).await;
    v5::subscribe(&mut kept, "kept/#", QoS::AtLeastOnce).await;
    v5::disconnect(kept).await;
    let mut publisher = v5::connect_id(b.mqtt(), "kept-publisher").await;
    publish_numbered(&mut publisher, "kept/x", "k", 10).await;

    let (_refused, answer) = v5::open(b.mqtt(), v5::persistent_connect("kept", 3600)).await;
    match answer {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(
                ack.reason_code,
                ReasonCode::SERVER_UNAVAILABLE,
                "node b cannot replay the session, yet answered {ack:?}"
            );
            assert!(!ack.session_present, "MQTT-3.2.2-6");
        }
        other => panic!("expected a CONNACK from node b, got {other:?}"),
    }
    // Node b's periodic record pass (every RECORD_INTERVAL) must not have moved the cursor.
    tokio::time::sleep(RECORD_INTERVAL * 2).await;

    let mut kept = resumed_on(&a, "kept", "the session is still whole (MQTT-3.2.2-2)").await;
    let received = receive_distinct(&mut kept, 10).await;
    assert_ordered(&numbers(&received, "k"), 10);
    v5::disconnect(kept).await;
}

/// Issue 17 ("reaches every matching subscriber on every node, once, at the granted QoS")
/// and MQTT-4.3.3 (QoS 2: exactly once) across a move: a QoS 2 session moves to the node
/// where its publisher keeps publishing, and back, six times, while the messages flow;
/// every message arrives, none twice. The node's own messages routed just before the
/// session subscribes there are replayed, those routed after are delivered live: a message
/// on the edge must be one or the other (the publish fence), and must be in the stream
/// before the replay reads it (the outbound barrier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_session_moving_to_its_publishers_node_gets_each_message_exactly_once() {
    let (_nats, nodes) = cluster(2).await;
    left_subscribed(&nodes[0], "mover2", "m2/#", QoS::ExactlyOnce).await;

    const EACH: u16 = 150;
    let mut got: HashMap<String, usize> = HashMap::new();
    // The client's QoS 2 state, kept across its connections as a persistent client keeps it.
    let mut awaiting_release: HashSet<u16> = HashSet::new();
    for round in 0..6u16 {
        // The publisher on the node the session moves to, publishing as it moves.
        let to = &nodes[usize::from(round % 2 == 0)];
        let (publishing, mut progress) = publish_in_background(
            to.mqtt(),
            format!("m2-pub-{round}"),
            "m2/x".into(),
            QoS::ExactlyOnce,
            format!("r{round}-"),
            EACH,
        )
        .await;
        // Moves while about a third has been published.
        reached(&mut progress, EACH / 3, round).await;
        let (mut mover, ack) = v5::connect(to.mqtt(), v5::persistent_connect("mover2", 3600)).await;
        assert!(ack.session_present, "round {round}: MQTT-3.2.2-2");
        publishing.await.expect("publisher");
        // Everything of this round (and anything left of earlier ones).
        let want: usize = usize::from(EACH) * usize::from(round + 1);
        receive_exactly_once(&mut mover, &mut awaiting_release, &mut got, want).await;
        v5::disconnect(mover).await;
    }
    assert_none_twice(&got);
}

/// Issue 17: a session that moves "receives what was queued while it was away" and every
/// message published after, with publishers on both nodes publishing as it moves. The
/// destination node routes the other node's messages while its own publishers' messages
/// await JetStream: those it routed before the session subscribed there must be replayed
/// (they were not delivered live). Before, the replay's bound was the node's lowest
/// unacknowledged own message, and the other node's messages between it and what the
/// consumer had routed were neither replayed nor delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moving_while_both_nodes_publish_gets_every_message() {
    let (_nats, nodes) = cluster(2).await;
    left_subscribed(&nodes[0], "mover3", "m3/#", QoS::AtLeastOnce).await;

    const EACH: u16 = 300;
    let mut seen: HashSet<String> = HashSet::new();
    for round in 0..4u16 {
        let to = usize::from(round % 2 == 0);
        let mut publishing = Vec::new();
        let mut progress = None;
        for (i, node) in nodes.iter().enumerate() {
            let (task, of_node) = publish_in_background(
                node.mqtt(),
                format!("m3-pub-{round}-{i}"),
                format!("m3/{i}"),
                QoS::AtLeastOnce,
                format!("r{round}-{i}-"),
                EACH,
            )
            .await;
            publishing.push(task);
            if i == to {
                progress = Some(of_node);
            }
        }
        // Moves while the destination's publisher is about a third through.
        if let Some(progress) = progress.as_mut() {
            reached(progress, EACH / 3, round).await;
        }
        let (mut mover, ack) =
            v5::connect(nodes[to].mqtt(), v5::persistent_connect("mover3", 3600)).await;
        assert!(ack.session_present, "round {round}: MQTT-3.2.2-2");
        for publisher in publishing {
            publisher.await.expect("publisher");
        }
        // Everything of this round and of the earlier ones, each at least once.
        let want = 2 * usize::from(EACH) * usize::from(round + 1);
        let deadline = tokio::time::Instant::now() + WAIT;
        while seen.len() < want {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match mover.recv_within(left).await {
                Ok(Some(Packet::Publish(p))) => {
                    v5::ack(&mut mover, &p).await;
                    seen.insert(String::from_utf8_lossy(&p.payload).into_owned());
                }
                Ok(Some(_)) => {}
                other => {
                    let missing: Vec<String> = (0..=round)
                        .flat_map(|r| {
                            (0..2)
                                .flat_map(move |i| (1..=EACH).map(move |n| format!("r{r}-{i}-{n}")))
                        })
                        .filter(|m| !seen.contains(m))
                        .take(20)
                        .collect();
                    panic!(
                        "round {round}: {} of {want} arrived ({other:?}); missing: {missing:?}",
                        seen.len()
                    );
                }
            }
        }
        acknowledged(&mut mover).await;
        v5::disconnect(mover).await;
    }
}

/// "Never acknowledge what you might lose", on the receiving node: a message from another
/// node that this node's store refuses (its disk budget, `storage.max_disk_bytes`, is
/// reached) is given back to JetStream and comes again, though later ones were stored and
/// acknowledged (an acknowledgement must never cover it). Node b holds an
/// offline persistent session's queue on a 1 MiB budget; node a's publisher sends large and
/// small messages alternately, so near the budget the large ones are refused while the
/// small ones are stored; once the session drains its queue, every message arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_nodes_store_refused_come_again_despite_later_ones_stored() {
    let (_nats, nodes) =
        common::cluster::start_cluster(2, "[storage]\nmax_disk_bytes = 1048576\n").await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let session = || v5::persistent_connect("budgeted", 3600);
    let (mut c, _) = v5::connect(b.mqtt(), session()).await;
    v5::subscribe(&mut c, "fill/#", QoS::AtLeastOnce).await;
    v5::disconnect(c).await;

    let mut publisher = v5::connect_id(a.mqtt(), "fill-publisher").await;
    const COUNT: u16 = 40;
    for n in 1..=COUNT {
        let size = if n % 2 == 0 { 1024 } else { 96 * 1024 };
        let mut payload = format!("m{n}-").into_bytes();
        payload.resize(size, b'x');
        let code = v5::publish(
            &mut publisher,
            v5::publish_packet("fill/x", QoS::AtLeastOnce, &payload, n),
        )
        .await;
        assert!(!code.is_error(), "m{n} refused by node a: {code:?}");
    }
    let (mut c, ack) = v5::connect(b.mqtt(), session()).await;
    assert!(ack.session_present);
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < usize::from(COUNT) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                v5::ack(&mut c, &p).await;
                let name = p
                    .payload
                    .split(|b| *b == b'-')
                    .next()
                    .unwrap_or_default()
                    .to_vec();
                seen.insert(String::from_utf8_lossy(&name).into_owned());
            }
            Ok(Some(_)) => {}
            other => {
                let missing: Vec<String> = (1..=COUNT)
                    .map(|n| format!("m{n}"))
                    .filter(|m| !seen.contains(m))
                    .collect();
                panic!(
                    "{} of {COUNT} arrived ({other:?}); missing: {missing:?}",
                    seen.len()
                );
            }
        }
    }
}

/// Issue 17, "once, at the granted QoS", and MQTT-4.3.3 (QoS 2: exactly once) across a move:
/// a QoS 2 delivery in flight (sent, no PUBREC) when the session moves to a node whose
/// consumer has not routed that message yet is sent again there under its packet id with
/// DUP (MQTT-4.4.0-1), and not a second time under a new packet id when that node's consumer
/// reaches it. Node b is down while node a takes a backlog of other messages and then the
/// session's, so node b's consumer, restarted, is still working through the backlog when
/// the client resumes there. Before, the client took each in-flight message twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_delivery_in_flight_moving_to_a_lagging_node_arrives_once() {
    let (_nats, mut nodes) = cluster(2).await;
    let (mut mover, _) = v5::connect(nodes[0].mqtt(), v5::persistent_connect("mover4", 3600)).await;
    v5::subscribe(&mut mover, "m4/#", QoS::ExactlyOnce).await;
    tokio::task::block_in_place(|| nodes[1].kill9());

    let mut publisher = v5::connect_id(nodes[0].mqtt(), "m4-publisher").await;
    publish_pipelined(&mut publisher, "m4-backlog/x", 40_000).await;
    const IN_FLIGHT: u16 = 5;
    publish_numbered_at(&mut publisher, "m4/x", "m4-", IN_FLIGHT, QoS::ExactlyOnce).await;
    // The client's QoS 2 state: taken, not yet answered (the connection ends first).
    let mut awaiting_release: HashSet<u16> = HashSet::new();
    let mut got: HashMap<String, usize> = HashMap::new();
    while got.len() < usize::from(IN_FLIGHT) {
        match mover.recv_within(WAIT).await {
            Ok(Some(Packet::Publish(p))) => {
                assert_eq!(p.qos, QoS::ExactlyOnce, "granted QoS 2");
                awaiting_release.insert(p.packet_id);
                *got.entry(String::from_utf8_lossy(&p.payload).into_owned())
                    .or_default() += 1;
            }
            Ok(Some(_)) => {}
            other => panic!("only {} in flight: {other:?}", got.len()),
        }
    }
    v5::disconnect(mover).await;

    tokio::task::block_in_place(|| nodes[1].restart());
    let mut moved = resumed_on(&nodes[1], "mover4", "the session moved (MQTT-3.2.2-2)").await;
    // Published after the in-flight ones: node b's consumer routes it after them, so a
    // second copy of any of them would come before it.
    publish_qos2_accepted(&mut publisher, "m4/x", b"m4-last", IN_FLIGHT + 1).await;
    receive_exactly_once(
        &mut moved,
        &mut awaiting_release,
        &mut got,
        usize::from(IN_FLIGHT) + 1,
    )
    .await;
    assert_none_twice(&got);
    // What this test is about: node b's consumer had not reached them when the session
    // subscribed there, so its replay found none of them (a machine fast enough to drain
    // the backlog first makes this a plain move, which other tests cover).
    let resumed = nodes[1]
        .log()
        .into_iter()
        .find(|line| line.contains("session resumed from another node"));
    if !resumed
        .as_deref()
        .is_some_and(|line| line.contains("messages=0"))
    {
        eprintln!("note: node b's consumer did not lag behind the moved messages: {resumed:?}");
    }
}

/// MQTT-4.3.3 (QoS 2: exactly once) across a move, where the client took messages out of
/// stream order. A session on node a holds a message from node b in flight (sent, no PUBREC
/// yet) while it takes and completes a later one published on node a itself (a node's own
/// messages reach its sessions at once; other nodes' come through its consumer). The
/// session's cursor is the in-flight message's sequence, below the completed one's. Moved
/// to node b, the session gets the in-flight message again under its packet id with DUP
/// (MQTT-4.4.0-1), and the completed one not at all. Before, node b's replay from the
/// cursor sent the completed one a second time under a new packet id (found by
/// the cluster operations suite's node-added test, issue 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_message_taken_above_the_cursor_is_not_sent_again_after_a_move() {
    let (_nats, nodes) = cluster(2).await;
    let (mut mover, _) = v5::connect(nodes[0].mqtt(), v5::persistent_connect("mover5", 3600)).await;
    v5::subscribe(&mut mover, "m5/#", QoS::ExactlyOnce).await;
    // From node b, through node a's consumer: held in flight (no PUBREC).
    let mut remote = v5::connect_id(nodes[1].mqtt(), "m5-remote").await;
    publish_qos2_accepted(&mut remote, "m5/x", b"m5-remote", 1).await;
    let held = next_delivery(&mut mover, "m5-remote").await;
    // From node a: delivered at once, taken (PUBREC) and completed (PUBCOMP).
    let mut local = v5::connect_id(nodes[0].mqtt(), "m5-local").await;
    publish_qos2_accepted(&mut local, "m5/x", b"m5-local", 1).await;
    let taken = next_delivery(&mut mover, "m5-local").await;
    mover
        .send(&Packet::PubRec(postbox::codec::PubResponse::new(
            taken.packet_id,
        )))
        .await;
    match mover.recv_within(WAIT).await {
        Ok(Some(Packet::PubRel(r))) if r.packet_id == taken.packet_id => {}
        other => panic!("expected the PUBREL of m5-local, got {other:?}"),
    }
    mover
        .send(&Packet::PubComp(postbox::codec::PubResponse::new(
            taken.packet_id,
        )))
        .await;
    acknowledged(&mut mover).await;
    v5::disconnect(mover).await;

    let mut moved = resumed_on(&nodes[1], "mover5", "the session moved (MQTT-3.2.2-2)").await;
    // Published after both: a second copy of either would come before it.
    publish_qos2_accepted(&mut remote, "m5/x", b"m5-last", 2).await;
    let mut awaiting_release = HashSet::from([held.packet_id]);
    let mut got: HashMap<String, usize> = HashMap::from([("m5-remote".to_owned(), 1)]);
    got.insert("m5-local".to_owned(), 1);
    receive_exactly_once(&mut moved, &mut awaiting_release, &mut got, 3).await;
    assert_none_twice(&got);
}

/// The persistent session `client_id` (1 h) subscribed to `filter` at `qos` on `node`, then
/// disconnected: offline, its messages kept for it.
async fn left_subscribed(node: &Node, client_id: &str, filter: &str, qos: QoS) {
    let (mut c, _) = v5::connect(node.mqtt(), v5::persistent_connect(client_id, 3600)).await;
    v5::subscribe(&mut c, filter, qos).await;
    v5::disconnect(c).await;
}

/// Publishes `payload` on `topic` at QoS 2 (packet id `id`), which must be accepted.
async fn publish_qos2_accepted(c: &mut RawClient, topic: &str, payload: &[u8], id: u16) {
    let code = v5::publish(c, v5::publish_packet(topic, QoS::ExactlyOnce, payload, id)).await;
    let what = String::from_utf8_lossy(payload);
    assert!(!code.is_error(), "{what} refused: {code:?}");
}

/// The next packet `c` receives (within `WAIT`), which must be a PUBLISH of `payload`; not
/// answered.
async fn next_delivery(c: &mut RawClient, payload: &str) -> Publish {
    let p = match c.recv_within(WAIT).await {
        Ok(Some(Packet::Publish(p))) => p,
        other => panic!("expected {payload}, got {other:?}"),
    };
    assert_eq!(&p.payload[..], payload.as_bytes());
    p
}

/// The persistent session `client_id` (1 h) resumed on `node`: Session Present 1
/// (MQTT-3.2.2-2), else the test fails with `why`.
async fn resumed_on(node: &Node, client_id: &str, why: &str) -> RawClient {
    let (moved, ack) = v5::connect(node.mqtt(), v5::persistent_connect(client_id, 3600)).await;
    assert!(ack.session_present, "{why}");
    moved
}

/// Asserts that no payload in `got` (payload → times received) came more than once
/// (MQTT-4.3.3: QoS 2 exactly once).
fn assert_none_twice(got: &HashMap<String, usize>) {
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "QoS 2 delivered more than once (MQTT-4.3.3): {twice:?}"
    );
}

/// Publishes `count` QoS 1 messages on `topic`, up to 500 unacknowledged at a time (each
/// must be accepted).
async fn publish_pipelined(c: &mut RawClient, topic: &str, count: u32) {
    const WINDOW: u32 = 500;
    let mut sent = 0u32;
    while sent < count {
        let batch = WINDOW.min(count - sent);
        for i in 0..batch {
            let id = u16::try_from((sent + i) % 60_000 + 1).unwrap_or(1);
            c.send(&Packet::Publish(v5::publish_packet(
                topic,
                QoS::AtLeastOnce,
                b"backlog",
                id,
            )))
            .await;
        }
        let mut acked = 0;
        while acked < batch {
            match c.recv_within(WAIT).await {
                Ok(Some(Packet::PubAck(a))) => {
                    assert!(!a.reason_code.is_error(), "backlog refused: {a:?}");
                    acked += 1;
                }
                Ok(Some(_)) => {}
                other => panic!("backlog not acknowledged ({acked} of {batch}): {other:?}"),
            }
        }
        sent += batch;
    }
}

/// Publishes `<prefix>1..=count` on `topic` at `qos` from a new connection `client_id` to
/// `node`, in a task (each one must be accepted); the receiver follows how many are done.
async fn publish_in_background(
    node: std::net::SocketAddr,
    client_id: String,
    topic: String,
    qos: QoS,
    prefix: String,
    count: u16,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<u16>,
) {
    let mut publisher = v5::connect_id(node, &client_id).await;
    let (done, progress) = tokio::sync::watch::channel(0u16);
    let task = tokio::spawn(async move {
        for n in 1..=count {
            let payload = format!("{prefix}{n}");
            let code = v5::publish(
                &mut publisher,
                v5::publish_packet(&topic, qos, payload.as_bytes(), n),
            )
            .await;
            assert!(!code.is_error(), "{payload} refused: {code:?}");
            done.send_replace(n);
        }
        v5::disconnect(publisher).await;
    });
    (task, progress)
}

/// Waits (bounded by `WAIT`) until a background publisher has `at` messages done.
async fn reached(progress: &mut tokio::sync::watch::Receiver<u16>, at: u16, round: u16) {
    let done = tokio::time::timeout(WAIT, progress.wait_for(|n| *n >= at)).await;
    assert!(matches!(done, Ok(Ok(_))), "round {round}: publisher stuck");
}

/// A QoS 2 receiver as MQTT-4.3.3 describes it, until `want` distinct payloads arrived
/// (bounded by `WAIT`): a PUBLISH is taken (counted in `got`) unless its packet id awaits a
/// PUBREL (then it is the same message again, MQTT-4.3.3-9), and answered with PUBREC; a
/// PUBREL frees its id and is answered with PUBCOMP (MQTT-4.3.3-11). `awaiting` is the
/// client's state, kept by the caller across connections.
pub(crate) async fn receive_exactly_once(
    c: &mut RawClient,
    awaiting: &mut HashSet<u16>,
    got: &mut HashMap<String, usize>,
    want: usize,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while got.len() < want {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                assert_eq!(p.qos, QoS::ExactlyOnce, "granted QoS 2");
                if awaiting.insert(p.packet_id) {
                    *got.entry(String::from_utf8_lossy(&p.payload).into_owned())
                        .or_default() += 1;
                }
                c.send(&Packet::PubRec(postbox::codec::PubResponse::new(
                    p.packet_id,
                )))
                .await;
            }
            Ok(Some(Packet::PubRel(r))) => {
                awaiting.remove(&r.packet_id);
                c.send(&Packet::PubComp(postbox::codec::PubResponse::new(
                    r.packet_id,
                )))
                .await;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("closed with {} of {want} messages: {got:?}", got.len()),
            Err(()) => panic!("only {} of {want} messages arrived: {got:?}", got.len()),
        }
    }
}

/// Waits (bounded) for a PINGRESP: the node has read every PUBACK the client sent before
/// (one connection's packets are handled in order).
async fn acknowledged(c: &mut RawClient) {
    c.send(&Packet::PingReq).await;
    match c.recv_within(WAIT).await {
        Ok(Some(Packet::PingResp)) => {}
        other => panic!("expected PINGRESP, got {other:?}"),
    }
}

/// Issue 17, Tests: "`kill -9` of a node under QoS 1 load and every acknowledged message for
/// its offline persistent sessions still arrives via another node" (the cluster version of
/// `crash.rs`): what node a acknowledged to its own publisher and what node b acknowledged,
/// all queued for a session offline on a, reach the client on node b after a dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_node_loses_nothing_it_acknowledged_for_offline_sessions() {
    let (_nats, mut nodes) = cluster(2).await;
    left_subscribed(&nodes[0], "survivor", "crash/#", QoS::AtLeastOnce).await;

    let mut on_a = v5::connect_id(nodes[0].mqtt(), "crash-pub-a").await;
    let mut on_b = v5::connect_id(nodes[1].mqtt(), "crash-pub-b").await;
    publish_numbered(&mut on_a, "crash/a", "a", 100).await;
    publish_numbered(&mut on_b, "crash/b", "b", 100).await;
    drop(on_a);
    kill_after_a_record_period(&mut nodes[0]).await;

    let (mut reader, ack) =
        v5::connect(nodes[1].mqtt(), v5::persistent_connect("survivor", 3600)).await;
    assert!(ack.session_present);
    let received = receive_distinct(&mut reader, 200).await;
    assert_ordered(&numbers(&received, "a"), 100);
    assert_ordered(&numbers(&received, "b"), 100);
}

/// MQTT 5, 3.1.2.4: "If a CONNECT packet is received with Clean Start is set to 1, the Client
/// and Server MUST discard any existing Session and start a new Session" [MQTT-3.1.2-4], and
/// "If the Server accepts a connection with Clean Start set to 1, the Server MUST set Session
/// Present to 0 in the CONNACK packet" [MQTT-3.2.2-2]. Sessions are cluster-wide (issue 17),
/// so a Clean Start on node b discards the session that lived on node a: none of its queue,
/// none of its subscriptions, and node a keeps no copy to resume later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_start_on_another_node_discards_the_session_cluster_wide() {
    let (_nats, nodes) = cluster(2).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let (mut old, _) = v5::connect(a.mqtt(), v5::persistent_connect("cleaner", 3600)).await;
    v5::subscribe(&mut old, "old/#", QoS::AtLeastOnce).await;
    v5::disconnect(old).await;
    let mut on_a = v5::connect_id(a.mqtt(), "old-pub").await;
    publish_numbered(&mut on_a, "old/t", "queued", 5).await;

    // Clean Start 1, Session Expiry 0: a new session that ends with this connection.
    let (mut fresh, ack) = v5::connect(b.mqtt(), v5::connect_packet("cleaner")).await;
    assert!(!ack.session_present, "Clean Start 1 (MQTT-3.2.2-2)");
    publish_numbered(&mut on_a, "old/t", "after", 1).await;
    if let Ok(Some(p)) = fresh.recv_within(Duration::from_millis(1500)).await {
        panic!("the discarded session's queue or subscription reached the new one: {p:?}");
    }
    v5::disconnect(fresh).await;

    // Node a kept nothing of the old session: resuming there finds none.
    let (mut again, ack) = v5::connect(a.mqtt(), v5::persistent_connect("cleaner", 3600)).await;
    assert!(
        !ack.session_present,
        "the session discarded on node b was resumed on node a"
    );
    publish_numbered(&mut on_a, "old/t", "later", 1).await;
    if let Ok(Some(p)) = again.recv_within(Duration::from_millis(1500)).await {
        panic!("the discarded session came back on node a: {p:?}");
    }
    v5::disconnect(again).await;
}

/// The same Clean Start (MQTT-3.1.2-4) with a session that outlives its connection, then its
/// node dies (issue 17: "a persistent session's subscriptions and its queue of QoS ≥ 1
/// messages survive its node"): resumed on node a it is the new session, with the
/// subscription made on node b and what was queued for it, and nothing of the discarded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_started_session_survives_its_node_without_the_discarded_one() {
    let (_nats, mut nodes) = cluster(2).await;
    left_subscribed(&nodes[0], "phoenix", "old/#", QoS::AtLeastOnce).await;
    let mut on_a = v5::connect_id(nodes[0].mqtt(), "phoenix-pub-a").await;
    publish_numbered(&mut on_a, "old/t", "queued", 5).await;

    let mut clean = v5::persistent_connect("phoenix", 3600);
    clean.clean_start = true;
    let (mut fresh, ack) = v5::connect(nodes[1].mqtt(), clean).await;
    assert!(!ack.session_present, "Clean Start 1 (MQTT-3.2.2-2)");
    v5::subscribe(&mut fresh, "new/#", QoS::AtLeastOnce).await;
    v5::disconnect(fresh).await;
    let mut on_b = v5::connect_id(nodes[1].mqtt(), "phoenix-pub-b").await;
    publish_numbered(&mut on_b, "new/t", "new", 5).await;
    drop(on_b);
    kill_after_a_record_period(&mut nodes[1]).await;

    let (mut resumed, ack) =
        v5::connect(nodes[0].mqtt(), v5::persistent_connect("phoenix", 3600)).await;
    assert!(
        ack.session_present,
        "the session started on node b survives it"
    );
    let received = receive_distinct(&mut resumed, 5).await;
    assert_ordered(&numbers(&received, "new"), 5);
    assert!(
        numbers(&received, "queued").is_empty(),
        "the discarded session's queue came back: {received:?}"
    );
    if let Ok(Some(p)) = resumed.recv_within(Duration::from_millis(1500)).await {
        panic!("more than the new session's queue: {p:?}");
    }
}

/// `kill -9` of `node` after at least two record periods: the scenario, not a
/// synchronisation. What another node resumes from is then a record the dead node rewrote
/// while it held the queued messages (their replay cursor), not the one a disconnect wrote.
async fn kill_after_a_record_period(node: &mut Node) {
    tokio::time::sleep(RECORD_INTERVAL * 2).await;
    tokio::task::block_in_place(|| node.kill9());
}

/// Issue 17: "Takeover works across nodes: the same client id connecting elsewhere closes the
/// old connection (v5: DISCONNECT 0x8E), with one winner under races" (MQTT-3.1.4-3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_across_nodes_closes_the_old_connection_with_0x8e() {
    let (_nats, nodes) = cluster(2).await;
    let (a, b) = (&nodes[0], &nodes[1]);

    let (mut first, _) = v5::connect(a.mqtt(), v5::persistent_connect("twin", 600)).await;
    let (mut second, _) = v5::connect(b.mqtt(), v5::persistent_connect("twin", 600)).await;
    v5::expect_disconnect(&mut first, ReasonCode::SESSION_TAKEN_OVER).await;
    // The winner stays connected and usable.
    v5::subscribe(&mut second, "twin/t", QoS::AtLeastOnce).await;

    // A race: both nodes at once, several rounds; each round ends with exactly one
    // connection left, the other closed with 0x8E.
    for round in 0..3 {
        let id = format!("racer-{round}");
        let (x, y) = tokio::join!(
            v5::open(a.mqtt(), v5::persistent_connect(&id, 600)),
            v5::open(b.mqtt(), v5::persistent_connect(&id, 600)),
        );
        let mut alive = Vec::new();
        for (client, first) in [x, y] {
            match first {
                Some(Packet::ConnAck(ack)) if ack.reason_code == ReasonCode::SUCCESS => {
                    alive.push(client);
                }
                other => panic!("round {round}: CONNECT not accepted: {other:?}"),
            }
        }
        // Within a bounded time one of them is closed with 0x8E, and only one.
        let mut closed = 0;
        let mut open = 0;
        for client in &mut alive {
            match client.recv_within(Duration::from_secs(5)).await {
                Ok(Some(Packet::Disconnect(d))) => {
                    assert_eq!(d.reason_code, ReasonCode::SESSION_TAKEN_OVER);
                    closed += 1;
                }
                Ok(None) => closed += 1,
                Ok(Some(other)) => panic!("round {round}: unexpected {other:?}"),
                Err(()) => open += 1,
            }
        }
        assert_eq!(
            (open, closed),
            (1, 1),
            "round {round}: one winner, one taken over"
        );
    }
}

/// Issue 17: "Shared subscriptions span nodes: each message goes to exactly one member of the
/// group cluster-wide" (MQTT 4.8.2) — members on two nodes, QoS 1 published on both nodes:
/// every message arrives once across the group, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_group_across_two_nodes_gets_each_message_once() {
    let (_nats, nodes, [mut member_a, mut member_b]) = two_nodes_with_a_group().await;
    let (a, b) = (&nodes[0], &nodes[1]);

    let mut on_a = v5::connect_id(a.mqtt(), "jobs-a").await;
    let mut on_b = v5::connect_id(b.mqtt(), "jobs-b").await;
    publish_numbered(&mut on_a, "jobs/a", "a", 50).await;
    publish_numbered(&mut on_b, "jobs", "b", 50).await;

    let mut counts = receive_across(&mut member_a, &mut member_b, 100).await;
    // Nothing more comes: no second copy to the other member.
    for member in [&mut member_a, &mut member_b] {
        while let Ok(Some(Packet::Publish(p))) =
            member.recv_within(Duration::from_millis(300)).await
        {
            let text = String::from_utf8_lossy(&p.payload).into_owned();
            *counts.entry(text).or_default() += 1;
        }
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "delivered to more than one member: {twice:?}"
    );
}

/// Issue 17: "Shared subscriptions span nodes: ... QoS ≥ 1: exactly one until acknowledged,
/// redelivered to another member if that member's session ends" (MQTT-4.8.2: a shared
/// group's message goes to one member; the server "SHOULD" give the unacknowledged ones of
/// a member's ended session to another). Member A (a session that ends with its
/// connection) on node a takes jobs and acknowledges none; its connection drops; member B on
/// node b then gets every job, A's unacknowledged ones included. Before the fix they were
/// dropped on node a, which had no other member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_members_unacknowledged_jobs_go_to_a_member_on_another_node_when_its_session_ends()
{
    let (_nats, nodes, [mut member_a, mut member_b]) = two_nodes_with_a_group().await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut publisher = v5::connect_id(b.mqtt(), "jobs-publisher").await;
    let (held_by_a, mut at_b, published) =
        jobs_until_a_holds_some(&mut publisher, &mut member_a, &mut member_b).await;
    // Member A's session ends with its connection (expiry 0).
    drop(member_a);
    every_job_reaches(&mut member_b, &mut at_b, &held_by_a, published, WAIT).await;
    assert_eq!(
        a.metric(r#"postbox_messages_dropped_total{qos="1",reason="no_subscribers"}"#),
        0.0,
        "node a counted a job as dropped"
    );
}

/// Issue 17: "QoS ≥ 1: exactly one until acknowledged" across nodes, and "Never acknowledge
/// what you might lose": member A on node a holds jobs it has not acknowledged when node a
/// is killed (`kill -9`); member B on node b then gets every job, A's included, once the
/// group's wait for them has passed. Before, node a acknowledged each job to JetStream as
/// soon as it was queued for A, and the jobs died with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_members_unacknowledged_jobs_go_to_a_member_on_another_node_when_its_node_dies() {
    let (_nats, mut nodes) = cluster(2).await;
    let (mut member_a, mut member_b) = group_across(&nodes[0], &nodes[1]).await;
    let mut publisher = v5::connect_id(nodes[1].mqtt(), "jobs-publisher").await;
    let (held_by_a, mut at_b, published) =
        jobs_until_a_holds_some(&mut publisher, &mut member_a, &mut member_b).await;
    tokio::task::block_in_place(|| nodes[0].kill9());
    drop(member_a);
    // The jobs come again once the group's acknowledgement wait (10 s) has passed.
    every_job_reaches(
        &mut member_b,
        &mut at_b,
        &held_by_a,
        published,
        WAIT + Duration::from_secs(10),
    )
    .await;
}

/// Issue 17: "QoS ≥ 1: exactly one until acknowledged" (MQTT-4.8.2: each message of a
/// shared group goes to one member). Member A on node a holds jobs unacknowledged for longer
/// than the group's acknowledgement wait in JetStream (10 s): node a keeps extending it, so
/// member B on node b never gets a copy; once A acknowledges them, node a settles them all
/// (`postbox_cluster_shared_unsettled` back to 0). Without the extension JetStream would
/// hand A's jobs to B after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_members_held_jobs_stay_with_it_past_the_groups_acknowledgement_wait() {
    let (_nats, nodes, [mut member_a, mut member_b]) = two_nodes_with_a_group().await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut publisher = v5::connect_id(b.mqtt(), "jobs-publisher").await;
    let (held_by_a, _, _) =
        jobs_until_a_holds_some(&mut publisher, &mut member_a, &mut member_b).await;
    let mut held: Vec<Publish> = Vec::new();
    // The scenario: longer than the group's wait (10 s) with A holding its jobs.
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < until {
        if let Ok(Some(Packet::Publish(p))) = member_b.recv_within(Duration::from_millis(500)).await
        {
            let job = String::from_utf8_lossy(&p.payload).into_owned();
            assert!(
                !held_by_a.contains_key(&job),
                "{job}, held unacknowledged by member A, was also delivered to member B"
            );
            v5::ack(&mut member_b, &p).await;
        }
        while let Ok(Some(Packet::Publish(p))) =
            member_a.recv_within(Duration::from_millis(10)).await
        {
            held.push(p); // late ones of the same batch; acknowledged below
        }
    }
    assert!(
        a.metric("postbox_cluster_shared_unsettled") >= held_by_a.len() as f64,
        "node a does not count A's held jobs as unsettled"
    );
    // Member A acknowledges what it held: node a settles every one.
    for p in held_by_a.values().chain(&held) {
        v5::ack(&mut member_a, p).await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while a.metric("postbox_cluster_shared_unsettled") > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node a still holds {} unsettled jobs after member A acknowledged them",
            a.metric("postbox_cluster_shared_unsettled")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// MQTT 5, 4.8.2: a shared group's message goes to one member, and Postbox prefers a
/// connected member to an offline one (as on one node). Across nodes: member A's session on
/// node a outlives its connection; while A is offline, every job goes to member B on node b,
/// none waits in A's queue (node a pulls the group only while a member there is connected),
/// and A, back, gets none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_groups_jobs_go_to_a_connected_member_on_another_node_not_to_an_offline_one() {
    let (_nats, nodes) = cluster(2).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let member = || v5::persistent_connect("member-a", 3600);
    let (mut member_a, _) = v5::connect(a.mqtt(), member()).await;
    let mut member_b = v5::connect_id(b.mqtt(), "member-b").await;
    v5::subscribe(&mut member_a, "$share/workers/jobs/#", QoS::AtLeastOnce).await;
    v5::subscribe(&mut member_b, "$share/workers/jobs/#", QoS::AtLeastOnce).await;
    settle_group(&mut member_a, &mut member_b, a, b).await;
    v5::disconnect(member_a).await;

    let mut publisher = v5::connect_id(a.mqtt(), "jobs-publisher").await;
    publish_numbered(&mut publisher, "jobs/x", "job", 40).await;
    let mut at_b = HashSet::new();
    every_job_reaches(&mut member_b, &mut at_b, &HashMap::new(), 40, WAIT).await;

    let (mut member_a, ack) = v5::connect(a.mqtt(), member()).await;
    assert!(ack.session_present);
    if let Ok(Some(Packet::Publish(p))) = member_a.recv_within(Duration::from_millis(500)).await {
        panic!(
            "offline member A was also given {:?}",
            String::from_utf8_lossy(&p.payload)
        );
    }
}

/// MQTT 5, 4.8.2 / 3.3: a message published after the SUBACK of a shared subscription
/// matches it. Clustered, a group's messages come through its JetStream consumer, which a
/// node makes when it first sees the group: jobs published on the member's node right after
/// its SUBACK all arrive. Before, the consumer started from when the puller was started
/// (up to a scan later), and the first jobs were never delivered to the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_shared_groups_first_member_gets_the_jobs_published_right_after_its_suback() {
    let (_nats, nodes) = cluster(2).await;
    let a = &nodes[0];
    let mut member = v5::connect_id(a.mqtt(), "fresh-member").await;
    let mut publisher = v5::connect_id(a.mqtt(), "fresh-publisher").await;
    v5::subscribe(&mut member, "$share/fresh/jobs/#", QoS::AtLeastOnce).await;
    publish_numbered(&mut publisher, "jobs/x", "job", 20).await;
    every_job_reaches(&mut member, &mut HashSet::new(), &HashMap::new(), 20, WAIT).await;
}

/// MQTT-4.8.2-4/5 (a shared group's QoS 2 message sent to a member whose session goes on is
/// completed with that member, not sent to another) and MQTT-4.4.0-1 (a resumed session has
/// its unacknowledged PUBLISHes sent again with their packet ids), across nodes: member M on
/// node a has QoS 2 jobs in flight (no PUBREC) when its session moves to node b; node b
/// sends each again with its packet id and DUP, and member B, connected on node b, gets none
/// of them. Before, node b released the packet ids with a PUBREL and the jobs were gone (the
/// replay of a moved session leaves shared groups' messages out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_qos2_job_in_flight_to_a_member_follows_its_session_to_another_node() {
    let (_nats, nodes) = cluster(2).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let member = || v5::persistent_connect("q2-member", 3600);
    let (mut moving, _) = v5::connect(a.mqtt(), member()).await;
    v5::subscribe(&mut moving, "$share/q2/jobs2/#", QoS::ExactlyOnce).await;
    let mut publisher = v5::connect_id(a.mqtt(), "q2-publisher").await;
    let mut in_flight: HashMap<String, u16> = HashMap::new();
    publish_numbered_at(&mut publisher, "jobs2/x", "q2job", 3, QoS::ExactlyOnce).await;
    while in_flight.len() < 3 {
        match moving.recv_within(WAIT).await {
            Ok(Some(Packet::Publish(p))) => {
                assert_eq!(p.qos, QoS::ExactlyOnce, "granted QoS 2");
                // No PUBREC: in flight.
                in_flight.insert(
                    String::from_utf8_lossy(&p.payload).into_owned(),
                    p.packet_id,
                );
            }
            Ok(Some(_)) => {}
            other => panic!("only {} of 3 jobs arrived: {other:?}", in_flight.len()),
        }
    }
    let mut member_b = v5::connect_id(b.mqtt(), "q2-member-b").await;
    v5::subscribe(&mut member_b, "$share/q2/jobs2/#", QoS::ExactlyOnce).await;
    v5::disconnect(moving).await;

    let (mut moved, ack) = v5::connect(b.mqtt(), member()).await;
    assert!(
        ack.session_present,
        "the session moved to node b (MQTT-3.2.2-2)"
    );
    let mut again: HashMap<String, u16> = HashMap::new();
    while again.len() < in_flight.len() {
        match moved.recv_within(WAIT).await {
            Ok(Some(Packet::Publish(p))) => {
                let job = String::from_utf8_lossy(&p.payload).into_owned();
                assert_eq!(
                    in_flight.get(&job),
                    Some(&p.packet_id),
                    "{job} sent again under another packet id (MQTT-4.4.0-1)"
                );
                assert!(p.dup, "{job} sent again without DUP (MQTT-3.3.1-1)");
                again.insert(job, p.packet_id);
                moved
                    .send(&Packet::PubRec(postbox::codec::PubResponse::new(
                        p.packet_id,
                    )))
                    .await;
            }
            Ok(Some(Packet::PubRel(r))) => {
                assert!(
                    again.values().any(|id| *id == r.packet_id),
                    "node b released packet id {} instead of sending its job again (sent again: {again:?})",
                    r.packet_id
                );
                moved
                    .send(&Packet::PubComp(postbox::codec::PubResponse::new(
                        r.packet_id,
                    )))
                    .await;
            }
            Ok(Some(_)) => {}
            other => {
                panic!("jobs in flight never sent again: {again:?} of {in_flight:?}: {other:?}")
            }
        }
    }
    // Longer than the group's acknowledgement wait (10 s): node a settled the jobs with the
    // group at the hand-over, so JetStream does not offer them again.
    if let Ok(Some(Packet::Publish(p))) = member_b.recv_within(Duration::from_secs(12)).await {
        panic!(
            "member B also got {:?}, in flight to the moved member (MQTT-4.8.2-5)",
            String::from_utf8_lossy(&p.payload)
        );
    }
}

/// Publishes numbered jobs on `jobs/x` until member A holds a few unacknowledged
/// (JetStream splits them between the nodes' pullers as it likes); member B acknowledges
/// what it gets. Returns A's jobs (by payload), B's, and how many were published.
async fn jobs_until_a_holds_some(
    publisher: &mut RawClient,
    member_a: &mut RawClient,
    member_b: &mut RawClient,
) -> (HashMap<String, Publish>, HashSet<String>, u16) {
    let (mut held_by_a, mut at_b) = (HashMap::new(), HashSet::new());
    let mut published = 0u16;
    while held_by_a.len() < 3 {
        assert!(published < 400, "member A never got a job (of {published})");
        for _ in 0..10 {
            published += 1;
            let payload = format!("job{published}");
            let code = v5::publish(
                publisher,
                v5::publish_packet("jobs/x", QoS::AtLeastOnce, payload.as_bytes(), published),
            )
            .await;
            assert!(!code.is_error(), "{payload} refused: {code:?}");
        }
        while let Ok(Some(Packet::Publish(p))) =
            member_a.recv_within(Duration::from_millis(200)).await
        {
            held_by_a.insert(String::from_utf8_lossy(&p.payload).into_owned(), p);
            // not acked
        }
        while let Ok(Some(Packet::Publish(p))) =
            member_b.recv_within(Duration::from_millis(50)).await
        {
            v5::ack(member_b, &p).await;
            at_b.insert(String::from_utf8_lossy(&p.payload).into_owned());
        }
    }
    (held_by_a, at_b, published)
}

/// Member B acknowledges what comes until it has had every one of jobs 1..=`published`
/// (`at_b`: those it had already), within `limit`; the failure names the missing ones and
/// how many of them member A held.
async fn every_job_reaches(
    member_b: &mut RawClient,
    at_b: &mut HashSet<String>,
    held_by_a: &HashMap<String, Publish>,
    published: u16,
    limit: Duration,
) {
    let all: HashSet<String> = (1..=published).map(|n| format!("job{n}")).collect();
    let deadline = tokio::time::Instant::now() + limit;
    while !all.is_subset(at_b) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match member_b
            .recv_within(left.min(Duration::from_millis(500)))
            .await
        {
            Ok(Some(Packet::Publish(p))) => {
                v5::ack(member_b, &p).await;
                at_b.insert(String::from_utf8_lossy(&p.payload).into_owned());
            }
            _ if tokio::time::Instant::now() >= deadline => {
                let missing: Vec<_> = all.difference(at_b).collect();
                let lost_of_a: Vec<_> = missing
                    .iter()
                    .filter(|m| held_by_a.contains_key(**m))
                    .collect();
                panic!(
                    "member B never got {} jobs ({} of them held by member A): {missing:?}",
                    missing.len(),
                    lost_of_a.len()
                );
            }
            _ => {}
        }
    }
}

/// Takes (and acknowledges) what reaches the two members until `count` distinct payloads
/// have arrived, within `WAIT`: how many times each arrived.
async fn receive_across(
    member_a: &mut RawClient,
    member_b: &mut RawClient,
    count: usize,
) -> HashMap<String, usize> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while counts.len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {count} jobs arrived: {counts:?}",
            counts.len()
        );
        for member in [&mut *member_a, &mut *member_b] {
            while let Ok(Some(Packet::Publish(p))) =
                member.recv_within(Duration::from_millis(50)).await
            {
                v5::ack(member, &p).await;
                *counts
                    .entry(String::from_utf8_lossy(&p.payload).into_owned())
                    .or_default() += 1;
            }
        }
    }
    counts
}

/// Members `member-a` on node `a` and `member-b` on node `b` of `$share/workers/jobs/#`
/// (QoS 1, sessions that end with their connections), once the group's consumers deliver
/// from both nodes: a group's consumer is made when a node first sees a member, so a job
/// published on each node is probed for until it arrives somewhere.
async fn group_across(a: &Node, b: &Node) -> (RawClient, RawClient) {
    let mut member_a = v5::connect_id(a.mqtt(), "member-a").await;
    let mut member_b = v5::connect_id(b.mqtt(), "member-b").await;
    v5::subscribe(&mut member_a, "$share/workers/jobs/#", QoS::AtLeastOnce).await;
    v5::subscribe(&mut member_b, "$share/workers/jobs/#", QoS::AtLeastOnce).await;
    settle_group(&mut member_a, &mut member_b, a, b).await;
    (member_a, member_b)
}

/// Publishes a probe on each node until one of each has arrived at some member (the group's
/// consumers exist from then on); the probes are acknowledged and left out.
async fn settle_group(member_a: &mut RawClient, member_b: &mut RawClient, a: &Node, b: &Node) {
    let mut probe_a = v5::connect_id(a.mqtt(), "probe-jobs-a").await;
    let mut probe_b = v5::connect_id(b.mqtt(), "probe-jobs-b").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let (mut from_a, mut from_b) = (false, false);
    let mut id = 0u16;
    while !(from_a && from_b) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the shared group never received from both nodes"
        );
        id += 1;
        let _ = v5::publish(
            &mut probe_a,
            v5::publish_packet("jobs/probe", QoS::AtLeastOnce, b"probe-a", id),
        )
        .await;
        let _ = v5::publish(
            &mut probe_b,
            v5::publish_packet("jobs/probe", QoS::AtLeastOnce, b"probe-b", id),
        )
        .await;
        for member in [&mut *member_a, &mut *member_b] {
            while let Ok(Some(Packet::Publish(p))) =
                member.recv_within(Duration::from_millis(100)).await
            {
                v5::ack(member, &p).await;
                from_a |= &p.payload[..] == b"probe-a";
                from_b |= &p.payload[..] == b"probe-b";
            }
        }
    }
    // Late probes still on their way are drained by the caller's loop as non-job payloads.
    drain_probes(member_a).await;
    drain_probes(member_b).await;
}

/// Takes what arrives within a short quiet period (late probes).
async fn drain_probes(member: &mut RawClient) {
    while let Ok(Some(Packet::Publish(p))) = member.recv_within(Duration::from_millis(300)).await {
        let p: Publish = p;
        v5::ack(member, &p).await;
        assert!(
            p.payload.starts_with(b"probe"),
            "a job arrived before any was published"
        );
    }
}

/// Pass 7, P5: clustered, a node's routing sees only its own subscribers, and a QoS 1/2
/// message no local subscription matched was counted as dropped for `no_subscribers` on
/// every node without one, though another node's subscriber or a shared group (served
/// through JetStream, never by a node's routing) got it: 50 jobs a shared group received
/// were 50 drops on each node, and an alert on drops fired on healthy traffic. Now that count
/// is left to single nodes, like the v5 PUBACK's 0x10 No matching subscribers, which a node
/// of a cluster never sends (MQTT 5 §3.4.2.1: "The receiver does not know if there are any
/// matching subscribers" is the case 0x00 covers). A group with members on both nodes and
/// a plain subscriber on node b; QoS 1 published on node a: every PUBACK 0x00, everything
/// delivered, and the count stays 0 on both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_delivered_elsewhere_in_the_cluster_are_not_counted_as_dropped() {
    const NO_SUBSCRIBERS: &str =
        "postbox_messages_dropped_total{qos=\"1\",reason=\"no_subscribers\"}";
    const JOBS: u16 = 20;
    let (_nats, nodes, [mut member_a, mut member_b]) = two_nodes_with_a_group().await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut plain = v5::connect_id(b.mqtt(), "plain-b").await;
    v5::subscribe(&mut plain, "plain/#", QoS::AtLeastOnce).await;

    let mut publisher = v5::connect_id(a.mqtt(), "publisher-a").await;
    for n in 1..=JOBS {
        let job = format!("job{n}");
        let packet = v5::publish_packet("jobs/x", QoS::AtLeastOnce, job.as_bytes(), n);
        let code = v5::publish(&mut publisher, packet).await;
        assert_eq!(code, ReasonCode::SUCCESS, "PUBACK for {job}");
    }
    // After the jobs in node a's stream: when node b routed it, it had routed the jobs.
    let packet = v5::publish_packet("plain/x", QoS::AtLeastOnce, b"plain", JOBS + 1);
    let code = v5::publish(&mut publisher, packet).await;
    assert_eq!(
        code,
        ReasonCode::SUCCESS,
        "PUBACK for the plain subscriber's message"
    );
    assert_eq!(receive_distinct(&mut plain, 1).await, ["plain"]);

    receive_across(&mut member_a, &mut member_b, usize::from(JOBS)).await;
    for node in [a, b] {
        let dropped = tokio::task::block_in_place(|| node.metric(NO_SUBSCRIBERS));
        assert_eq!(dropped, 0.0, "node {}: {NO_SUBSCRIBERS}", node.id);
    }
}
