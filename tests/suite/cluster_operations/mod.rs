//! Cluster operations (issue 34) with a real `nats-server -js` and real `postbox` nodes on
//! their own data directories: what an operator does to a running cluster — a graceful
//! restart (SIGTERM, then the binary again on the same data directory, as a rolling upgrade
//! does it), a crash (`kill -9`), a node frozen past the heartbeat (SIGSTOP / SIGCONT) —
//! must not lose a session or a message that was acknowledged (MQTT-3.1.2-4/-5: the
//! session's state lasts while the session does; MQTT-4.3.2: QoS 1 at least once).
//!
//! Every wait is bounded and awaits an event (a packet, a log line, a record in the
//! cluster's `pb_sessions` bucket); each test stops by itself, on 127.0.0.1 only.
//!
//! Here: a session that moved and its node's stale copy. `load`: the operations under load
//! (rolling restarts at QoS 1 and 2, a node added, nats-server restarted, a node paused),
//! each checked message by message by `checker`.

use crate::common;

mod checker;
mod load;

use std::time::Duration;

use common::cluster::{start_cluster, Node};
use common::{v5, RawClient, WAIT};
use postbox::codec::{ConnAck, Packet, QoS, ReasonCode};

/// The record of `client_id` in the cluster's `pb_sessions` bucket (JSON), if there is one.
pub(crate) async fn session_record(nats: &str, client_id: &str) -> Option<serde_json::Value> {
    let client = async_nats::connect(nats).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let bucket = js
        .get_key_value(postbox::test_support::cluster::SESSIONS_BUCKET)
        .await
        .expect("the session bucket");
    let key = postbox::test_support::cluster::subject::key(client_id);
    let entry = bucket.get(key.as_str()).await.expect("read the record")?;
    serde_json::from_slice(&entry).ok()
}

/// Waits (bounded by `WAIT`, reading the bucket every 50 ms) until the record of
/// `client_id` satisfies `ok`; returns it.
async fn wait_record(
    nats: &str,
    client_id: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let record = session_record(nats, client_id).await;
        if let Some(record) = record.as_ref().filter(|r| ok(r)) {
            return record.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the record of {client_id} never became as expected: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a record (JSON) is owned by `node` and lists the subscription `filter`.
fn owned_with(record: &serde_json::Value, node: &str, filter: &str) -> bool {
    record["owner"] == node
        && record["subs"]
            .as_array()
            .is_some_and(|subs| subs.iter().any(|s| s["f"] == filter))
}

/// Receives (and acknowledges) PUBLISHes until one with `payload` arrives; returns every
/// payload received on the way. Bounded by `WAIT`.
async fn receive_until(c: &mut RawClient, payload: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                v5::ack(c, &p).await;
                let text = String::from_utf8_lossy(&p.payload).into_owned();
                let done = text == payload;
                seen.push(text);
                if done {
                    return seen;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("closed before {payload:?} arrived (got {seen:?})"),
            Err(()) => panic!("{payload:?} never arrived within {WAIT:?} (got {seen:?})"),
        }
    }
}

/// Issue 34, finding 2 (a rolling upgrade drops data): session W lives on node a; a is
/// stopped gracefully (SIGTERM); W resumes on node b (session present); a starts again on
/// its data directory, which still holds its copy of W as it was; a QoS 1 message for W is
/// published and acknowledged on b while W is offline; W reconnects to a. The session moved
/// to b and back: a must resume the cluster's session, not take its stale local copy for it
/// nor lose it (MQTT-3.1.2-4/-5, MQTT-3.2.2-2: Session Present 1), and the acknowledged
/// message must arrive (MQTT-4.3.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_its_session_moved_resumes_it_with_what_was_acknowledged() {
    let (nats, mut nodes) = start_cluster(2, "").await;
    let url = nats.url();
    let (a, b) = (0, 1);

    // W resumes on b, with its subscription.
    let w = moved_from_a_to_b(&mut nodes, &url, "W", "ops/w/#").await;
    wait_record(&url, "W", |r| owned_with(r, "b", "ops/w/#")).await;
    v5::disconnect(w).await;

    // a comes back on its data directory (its store still holds W as it was on a) and takes
    // part again: it receives what b's clients publish.
    tokio::task::block_in_place(|| nodes[a].restart());
    linked_both_ways(&nodes[a], &nodes[b]).await;

    // A QoS 1 message for W, acknowledged on b while W is offline.
    let mut publisher = v5::connect_id(nodes[b].mqtt(), "W-publisher").await;
    assert_eq!(
        v5::publish_qos1(&mut publisher, "ops/w/1", b"acknowledged", 1).await,
        ReasonCode::SUCCESS,
        "the message was acknowledged on b"
    );
    v5::disconnect(publisher).await;

    // W comes back to a.
    let (mut w, ack) = v5::connect(nodes[a].mqtt(), v5::persistent_connect("W", 3600)).await;
    assert!(
        ack.session_present,
        "W's session (on b since a's restart) resumed on node a: session present 1 \
         (MQTT-3.1.2-4/-5, MQTT-3.2.2-2)"
    );
    let received = receive_until(&mut w, "acknowledged").await;
    assert_eq!(
        received,
        ["acknowledged"],
        "the message acknowledged on b, once"
    );
    v5::disconnect(w).await;
}

/// Client `client_id` connected to node `a` as a persistent session (expiry 3600 s) and
/// subscribed to `filter` at QoS 1, once the cluster's record of it holds that subscription
/// with `a` as its owner; with its CONNACK.
async fn subscribed_on_a(
    a: &Node,
    nats: &str,
    client_id: &str,
    filter: &str,
) -> (RawClient, ConnAck) {
    let (mut w, ack) = v5::connect(a.mqtt(), v5::persistent_connect(client_id, 3600)).await;
    v5::subscribe(&mut w, filter, QoS::AtLeastOnce).await;
    wait_record(nats, client_id, |r| owned_with(r, "a", filter)).await;
    (w, ack)
}

/// A new session `client_id` subscribed to `filter` on node a (0) as [`subscribed_on_a`]
/// (the cluster knows the subscription before a goes), a stopped gracefully (the connection
/// told v5 0x8B Server shutting down), and the session resumed on node b (1): Session
/// Present 1 (MQTT-3.2.2-2). Returns the connection to b.
async fn moved_from_a_to_b(
    nodes: &mut [Node],
    nats: &str,
    client_id: &str,
    filter: &str,
) -> RawClient {
    let (a, b) = (0, 1);
    let (mut w, ack) = subscribed_on_a(&nodes[a], nats, client_id, filter).await;
    assert!(!ack.session_present, "{client_id} is a new session");
    tokio::task::block_in_place(|| nodes[a].terminate());
    v5::expect_disconnect(&mut w, ReasonCode::SERVER_SHUTTING_DOWN).await;
    let (w, ack) = v5::connect(nodes[b].mqtt(), v5::persistent_connect(client_id, 3600)).await;
    assert!(
        ack.session_present,
        "{client_id} resumed on node b (MQTT-3.2.2-2)"
    );
    w
}

/// Waits until `a` and `b` each see the other's traffic again (after one of them restarted).
async fn linked_both_ways(a: &Node, b: &Node) {
    common::cluster::wait_linked(b, a).await;
    common::cluster::wait_linked(a, b).await;
}

/// Unsubscribes `filter` and waits for the UNSUBACK.
async fn unsubscribe(c: &mut RawClient, filter: &str) {
    c.send(&Packet::Unsubscribe(postbox::codec::Unsubscribe {
        packet_id: 78,
        filters: vec![filter.into()],
        ..Default::default()
    }))
    .await;
    loop {
        match c.recv().await {
            Some(Packet::UnsubAck(ack)) if ack.packet_id == 78 => return,
            Some(_) => {}
            None => panic!("closed before UNSUBACK"),
        }
    }
}

/// Issue 34, finding 2, the record's side: a node that comes back on its data directory
/// after its session moved must not act for that session. Its store brings back W as it was
/// on a (subscribed to `ops/old/#`); on b, W has since subscribed to `ops/new/#` and dropped
/// `ops/old/#`. The record in `pb_sessions` is the authority: a drops its copy (and says so)
/// and leaves b's record as b wrote it — before, a took b's first rewrite of the record for
/// a claim and "handed over" its stale copy over it (owner b, `ops/old/#`), so the node
/// that adopted or resumed the session next brought the old subscription back and lost the
/// new one. Then b dies (`kill -9`) and W resumes on a from b's record: what is published to
/// `ops/new/` arrives, nothing of `ops/old/` does (MQTT-3.1.2-4/-5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_drops_its_stale_copy_of_a_moved_session_and_leaves_its_record() {
    let (nats, mut nodes) = start_cluster(2, "").await;
    let url = nats.url();
    let (a, b) = (0, 1);

    let mut w = moved_from_a_to_b(&mut nodes, &url, "W2", "ops/old/#").await;
    v5::subscribe(&mut w, "ops/new/#", QoS::AtLeastOnce).await;
    unsubscribe(&mut w, "ops/old/#").await;
    let only_new =
        |r: &serde_json::Value| owned_with(r, "b", "ops/new/#") && !owned_with(r, "b", "ops/old/#");
    wait_record(&url, "W2", only_new).await;
    v5::disconnect(w).await;

    // a comes back with its copy of W2 (ops/old/#) and drops it: the record names b.
    tokio::task::block_in_place(|| nodes[a].restart());
    nodes[a]
        .wait_log_async(|l| l.contains("dropped a stale local copy") && l.contains("W2"))
        .await;
    // Traffic both ways: b rewrites W2's record as its stream position moves (what a took
    // for a claim before).
    linked_both_ways(&nodes[a], &nodes[b]).await;
    let record = wait_record(&url, "W2", |_| true).await;
    assert!(
        only_new(&record) && record.get("handed").is_none(),
        "b's record of W2 was written over by node a's stale copy: {record}"
    );
    assert!(
        !nodes[a]
            .log()
            .iter()
            .any(|l| l.contains("session taken over by another node") && l.contains("W2")),
        "node a handed over a session it did not hold"
    );

    // b dies; W2 resumes on a from b's record.
    tokio::task::block_in_place(|| nodes[b].kill9());
    let (mut w, ack) = v5::connect(nodes[a].mqtt(), v5::persistent_connect("W2", 3600)).await;
    assert!(ack.session_present, "W2 resumed on node a from b's record");
    let mut publisher = v5::connect_id(nodes[a].mqtt(), "W2-publisher").await;
    for (topic, payload) in [("ops/old/1", "old"), ("ops/new/1", "new")] {
        let code = v5::publish(
            &mut publisher,
            v5::publish_packet(topic, QoS::AtLeastOnce, payload.as_bytes(), 1),
        )
        .await;
        assert!(!code.is_error(), "{topic} refused: {code:?}");
    }
    let received = receive_until(&mut w, "new").await;
    assert_eq!(received, ["new"], "only ops/new/# is W2's subscription");
    v5::disconnect(w).await;
}

/// A SUBACK is a promise (MQTT-3.8.4-3/-4: the Server has the subscription): clustered, the
/// session's record must hold the subscription before the SUBACK goes out, or a `kill -9`
/// right after it loses the subscription when the session moves (the next owner resumes from
/// the record, which used to be rewritten up to a second later). Ten persistent sessions
/// subscribe on node a at once; a is killed as soon as the last SUBACK arrives; each session
/// resumes on node b and must receive what is published to its filter there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_acknowledged_right_before_a_crash_survive_the_move() {
    let (_nats, mut nodes) = start_cluster(2, "").await;
    let (a, b) = (0, 1);
    const CLIENTS: usize = 10;
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let (c, _) = v5::connect(
            nodes[a].mqtt(),
            v5::persistent_connect(&format!("promise-{i}"), 3600),
        )
        .await;
        clients.push(c);
    }
    // Every SUBSCRIBE out before any SUBACK is read: the records are all due at once.
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&Packet::Subscribe(v5::subscribe_packet(
            7,
            &format!("promise/{i}/#"),
            QoS::AtLeastOnce,
        )))
        .await;
    }
    for c in &mut clients {
        match c.recv().await {
            Some(Packet::SubAck(ack)) => assert_eq!(ack.reason_codes, [ReasonCode(1)]),
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
    tokio::task::block_in_place(|| nodes[a].kill9());
    drop(clients);

    // All resume on b at once (each claim waits for a hand-over from a, which cannot come).
    let addr = nodes[b].mqtt();
    let resumed: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(async move {
                v5::connect(addr, v5::persistent_connect(&format!("promise-{i}"), 3600)).await
            })
        })
        .collect();
    let mut clients = Vec::new();
    for (i, r) in resumed.into_iter().enumerate() {
        let (c, ack) = r.await.expect("connect task");
        assert!(ack.session_present, "promise-{i} resumed on b");
        clients.push(c);
    }
    let mut publisher = v5::connect_id(addr, "promise-publisher").await;
    for i in 0..CLIENTS {
        let code = v5::publish(
            &mut publisher,
            v5::publish_packet(
                &format!("promise/{i}/x"),
                QoS::AtLeastOnce,
                format!("m{i}").as_bytes(),
                1,
            ),
        )
        .await;
        assert!(!code.is_error(), "refused: {code:?}");
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let received = receive_until(c, &format!("m{i}")).await;
        assert_eq!(
            received,
            [format!("m{i}")],
            "promise-{i}: its acknowledged subscription"
        );
    }
}

/// Known risk (issue 34): a message a node's store brings back at a restart has no known
/// stream sequence (the store does not keep it), so the session's cursor skipped it: W's
/// message is queued on node a, a restarts, W resumes on a and takes the message without
/// acknowledging it, then W moves to node b. a's hand-over (and every record it wrote since
/// W resumed) named the node's floor as the cursor, past the message: b's replay did not
/// find it and it was lost, though acknowledged to its publisher (MQTT-4.3.2: a QoS 1
/// message not acknowledged by the subscriber is sent again). The cursor must not pass the
/// last recorded one while the session holds a message of unknown sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_brought_back_by_a_restart_survives_the_sessions_next_move() {
    let (nats, mut nodes) = start_cluster(2, "").await;
    let url = nats.url();
    let (a, b) = (0, 1);
    let (w, _) = subscribed_on_a(&nodes[a], &url, "R1", "restored/#").await;
    v5::disconnect(w).await;

    // A message for W, acknowledged on b; a's consumer takes it and queues it for W.
    let taken = r#"postbox_cluster_messages_total{direction="in"}"#;
    let before = tokio::task::block_in_place(|| nodes[a].metric(taken));
    let mut publisher = v5::connect_id(nodes[b].mqtt(), "R1-publisher").await;
    assert_eq!(
        v5::publish_qos1(&mut publisher, "restored/1", b"kept", 1).await,
        ReasonCode::SUCCESS
    );
    v5::disconnect(publisher).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::task::block_in_place(|| nodes[a].metric(taken)) <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node a never took the message"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // a restarts: its store brings W back with the message, of unknown stream sequence.
    tokio::task::block_in_place(|| nodes[a].terminate());
    tokio::task::block_in_place(|| nodes[a].restart());
    linked_both_ways(&nodes[a], &nodes[b]).await;
    // W resumes on a, takes the message and goes without acknowledging it.
    let (mut w, ack) = v5::connect(nodes[a].mqtt(), v5::persistent_connect("R1", 3600)).await;
    assert!(ack.session_present, "R1 resumed on a after its restart");
    let p = v5::expect_publish(&mut w).await;
    assert_eq!(&p.payload[..], b"kept");
    drop(w);
    // a's record of the disconnected session is written.
    wait_record(&url, "R1", |r| r["owner"] == "a" && r.get("gone").is_some()).await;

    // W moves to b: the message comes again (not acknowledged), from b's replay.
    let (mut w, ack) = v5::connect(nodes[b].mqtt(), v5::persistent_connect("R1", 3600)).await;
    assert!(ack.session_present, "R1 moved to b");
    let received = receive_until(&mut w, "kept").await;
    assert_eq!(received, ["kept"]);
    v5::disconnect(w).await;
}
