//! Cluster operations (issue 34) with a real `nats-server -js` and real `postbox` nodes on
//! their own data directories: what an operator does to a running cluster — a graceful
//! restart (SIGTERM, then the binary again on the same data directory, as a rolling upgrade
//! does it), a crash (`kill -9`), a node frozen past the heartbeat (SIGSTOP / SIGCONT) —
//! must not lose a session or a message that was acknowledged (MQTT-3.1.2-4/-5: the
//! session's state lasts while the session does; MQTT-4.3.2: QoS 1 at least once).
//!
//! Every wait is bounded and awaits an event (a packet, a log line, a record in the
//! cluster's `pb_sessions` bucket); each test stops by itself, on 127.0.0.1 only.

use crate::common;

use std::time::Duration;

use common::cluster::start_cluster;
use common::{v5, RawClient, WAIT};
use postbox::codec::{Packet, QoS, ReasonCode};

/// The record of `client_id` in the cluster's `pb_sessions` bucket (JSON), if there is one.
async fn session_record(nats: &str, client_id: &str) -> Option<serde_json::Value> {
    let client = async_nats::connect(nats).await.expect("connect to NATS");
    let js = async_nats::jetstream::new(client);
    let bucket = js
        .get_key_value(postbox::cluster::SESSIONS_BUCKET)
        .await
        .expect("the session bucket");
    let key = postbox::cluster::subject::key(client_id);
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

    let (mut w, ack) = v5::connect(nodes[a].mqtt(), v5::persistent_connect("W", 3600)).await;
    assert!(!ack.session_present);
    v5::subscribe(&mut w, "ops/w/#", QoS::AtLeastOnce).await;
    // The cluster knows the subscription before a goes (not what this test is about).
    wait_record(&url, "W", |r| owned_with(r, "a", "ops/w/#")).await;

    // A graceful stop; the connection was told (v5 0x8B Server shutting down).
    tokio::task::block_in_place(|| nodes[a].terminate());
    v5::expect_disconnect(&mut w, ReasonCode::SERVER_SHUTTING_DOWN).await;

    // W resumes on b, with its subscription.
    let (w, ack) = v5::connect(nodes[b].mqtt(), v5::persistent_connect("W", 3600)).await;
    assert!(ack.session_present, "W resumed on node b (MQTT-3.2.2-2)");
    wait_record(&url, "W", |r| owned_with(r, "b", "ops/w/#")).await;
    v5::disconnect(w).await;

    // a comes back on its data directory (its store still holds W as it was on a) and takes
    // part again: it receives what b's clients publish.
    tokio::task::block_in_place(|| nodes[a].restart());
    common::cluster::wait_linked(&nodes[b], &nodes[a]).await;
    common::cluster::wait_linked(&nodes[a], &nodes[b]).await;

    // A QoS 1 message for W, acknowledged on b while W is offline.
    let mut publisher = v5::connect_id(nodes[b].mqtt(), "W-publisher").await;
    let code = v5::publish(
        &mut publisher,
        v5::publish_packet("ops/w/1", QoS::AtLeastOnce, b"acknowledged", 1),
    )
    .await;
    assert_eq!(
        code,
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
