//! The cluster operated under load (issue 34): rolling restarts (QoS 1 and QoS 2), a node
//! added, nats-server restarted, a node paused past the heartbeat. A numbering publisher
//! and a persistent subscriber ([`super::checker`]) run through each operation; at the end
//! every message acknowledged to the publisher must have reached the subscriber (MQTT-4.3.2
//! / 4.3.3: at least once, exactly once), no QoS 2 message twice (MQTT-4.3.3), and the
//! session must have been found at every reconnect (MQTT-3.1.2-4/-5, MQTT-3.2.2-2).

use crate::common;

use std::time::Duration;

use common::cluster::{start_cluster, wait_linked, Node};
use common::WAIT;
use postbox::codec::QoS;

use super::checker::{assert_exact, Publisher, Subscriber};

/// Acknowledgements awaited at each step, so messages flow through every operation.
const STEP: usize = 50;

/// Every node restarted in turn under load at `qos` — SIGTERM each, then `kill -9` each —
/// while the persistent subscriber follows its session onto the node going down and from it
/// to the one that stays, and the publisher loses its node in turn too.
async fn rolling_restart(qos: QoS, name: &str) {
    let (_nats, mut nodes) = start_cluster(2, "").await;
    let (a, b) = (nodes[0].mqtt(), nodes[1].mqtt());
    let mut sub = Subscriber::start(
        &format!("{name}-sub"),
        &format!("{name}/#"),
        qos,
        vec![a, b],
    )
    .await;
    let mut publisher = Publisher::start(
        &format!("{name}-pub"),
        &format!("{name}/t"),
        qos,
        1,
        vec![b, a],
    );
    publisher.wait_acked(STEP, WAIT).await;
    for (down, kill) in [(0, false), (1, false), (0, true), (1, true)] {
        let up = 1 - down;
        let (down_addr, up_addr) = (nodes[down].mqtt(), nodes[up].mqtt());
        // The subscriber's session moves onto the node going down (a live hand-over); the
        // publisher prefers the other one from its next connection on.
        sub.move_to(vec![down_addr, up_addr]).await;
        publisher.set_nodes(vec![up_addr, down_addr]);
        publisher.wait_acked(STEP, WAIT).await;
        let before = sub.connections();
        tokio::task::block_in_place(|| {
            if kill {
                nodes[down].kill9();
            } else {
                nodes[down].terminate();
            }
        });
        // Its connection ended with the node: it resumes on the other one.
        sub.wait_connected(up_addr, before).await;
        publisher.wait_acked(STEP, WAIT).await;
        tokio::task::block_in_place(|| nodes[down].restart());
        wait_linked(&nodes[up], &nodes[down]).await;
        wait_linked(&nodes[down], &nodes[up]).await;
        publisher.wait_acked(STEP, WAIT).await;
    }
    let published = publisher.stop().await;
    let received = sub.finish(&published.acked, WAIT * 3).await;
    assert_exact(name, &published, &received, qos == QoS::ExactlyOnce);
}

/// Issue 34 (a rolling upgrade drops data), at QoS 1: 0 acknowledged messages lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_qos1_load_loses_no_acknowledged_message() {
    rolling_restart(QoS::AtLeastOnce, "roll1").await;
}

/// The same at QoS 2: 0 lost, and 0 taken twice (MQTT-4.3.3, across every move of the
/// session, graceful or not: the record lists the QoS 2 deliveries in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_qos2_load_loses_and_duplicates_nothing() {
    rolling_restart(QoS::ExactlyOnce, "roll2").await;
}

/// A third node joins a running cluster under QoS 2 load: the subscriber's session resumes
/// on it at once (before anything was published on it), a publisher on it reaches the
/// subscriber there and after the session moved on again; nothing acknowledged is lost,
/// nothing taken twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_under_load_takes_sessions_over_and_loses_nothing() {
    let (nats, mut nodes) = start_cluster(2, "").await;
    let (a, b) = (nodes[0].mqtt(), nodes[1].mqtt());
    let mut sub = Subscriber::start("join-sub", "join/#", QoS::ExactlyOnce, vec![b, a]).await;
    let mut publisher = Publisher::start("join-pub", "join/a", QoS::ExactlyOnce, 1, vec![a, b]);
    publisher.wait_acked(STEP, WAIT).await;

    nodes.push(Node::start_async("c", &nats.url(), "").await);
    let c = nodes[2].mqtt();
    // The session moves to the new node as soon as it runs.
    sub.move_to(vec![c, b]).await;
    publisher.wait_acked(STEP, WAIT).await;
    for other in [0, 1] {
        wait_linked(&nodes[2], &nodes[other]).await;
        wait_linked(&nodes[other], &nodes[2]).await;
    }
    let mut second = Publisher::start("join-pub-c", "join/c", QoS::ExactlyOnce, 1_000_000, vec![c]);
    second.wait_acked(STEP, WAIT).await;
    publisher.wait_acked(STEP, WAIT).await;
    // And on to an old node, while both publish.
    sub.move_to(vec![a, b]).await;
    second.wait_acked(STEP, WAIT).await;
    publisher.wait_acked(STEP, WAIT).await;

    let mut published = publisher.stop().await;
    let from_c = second.stop().await;
    assert!(
        !from_c.acked.is_empty(),
        "nothing acknowledged on the new node"
    );
    published.acked.extend(from_c.acked);
    published.refused += from_c.refused;
    published.failed += from_c.failed;
    let received = sub.finish(&published.acked, WAIT * 3).await;
    assert_exact("node added", &published, &received, true);
}

/// nats-server stopped under QoS 2 load and started again on its store: meanwhile the nodes
/// refuse QoS 1/2 (0x97, or close the publisher's connection: it reconnects); once it is
/// back, everything acknowledged before and after arrives once, and the session moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restarted_under_load_loses_and_duplicates_nothing() {
    let (mut nats, nodes) = start_cluster(2, "").await;
    let (a, b) = (nodes[0].mqtt(), nodes[1].mqtt());
    let mut sub = Subscriber::start("nats-sub", "natsr/#", QoS::ExactlyOnce, vec![b, a]).await;
    let mut publisher = Publisher::start("nats-pub", "natsr/t", QoS::ExactlyOnce, 1, vec![a, b]);
    publisher.wait_acked(STEP, WAIT).await;

    tokio::task::block_in_place(|| nats.stop());
    for node in &nodes {
        node.wait_up_async(false).await;
    }
    publisher.wait_refused(WAIT).await;
    let acked_while_down = publisher.acked();
    // Refused, not acknowledged: nothing the nodes cannot hand to JetStream is promised.
    publisher.wait_refused(WAIT).await;
    assert_eq!(
        publisher.acked(),
        acked_while_down,
        "a message was acknowledged while NATS was down"
    );

    tokio::task::block_in_place(|| nats.start_again());
    for node in &nodes {
        node.wait_up_async(true).await;
    }
    wait_linked(&nodes[0], &nodes[1]).await;
    wait_linked(&nodes[1], &nodes[0]).await;
    publisher.wait_acked(STEP, WAIT * 3).await;
    sub.move_to(vec![a, b]).await;
    publisher.wait_acked(STEP, WAIT).await;

    let published = publisher.stop().await;
    assert!(
        published.refused + published.failed > 0,
        "nothing was refused while NATS was down"
    );
    let received = sub.finish(&published.acked, WAIT * 3).await;
    assert_exact("nats restarted", &published, &received, true);
}

/// A node frozen (SIGSTOP) past the time after which the others take it for dead, under
/// QoS 2 load, with the subscriber's connection open on it: the other node adopts the
/// session and queues for it what is published meanwhile. Then the node goes on (SIGCONT)
/// with that connection still open. One of the two holds the session from then on (no
/// split brain: the same message is not delivered by both); the subscriber ends up on the
/// other node with its session; nothing acknowledged is lost, nothing taken twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_the_heartbeat_and_resumed_splits_no_session() {
    let (_nats, nodes) = start_cluster(2, "").await;
    let (a, b) = (nodes[0].mqtt(), nodes[1].mqtt());
    let mut sub = Subscriber::start("pause-sub", "pause/#", QoS::ExactlyOnce, vec![a, b]).await;
    let mut publisher = Publisher::start("pause-pub", "pause/t", QoS::ExactlyOnce, 1, vec![b]);
    publisher.wait_acked(STEP, WAIT).await;

    nodes[0].signal(libc::SIGSTOP);
    // b takes a for dead (no heartbeat for 7 s) and adopts its session.
    nodes[1]
        .wait_log_within(WAIT * 3, |l| {
            l.contains("adopted the session of a dead node") && l.contains("pause-sub")
        })
        .await;
    publisher.wait_acked(STEP, WAIT).await;
    nodes[0].signal(libc::SIGCONT);
    // a is heard again.
    let deadline = tokio::time::Instant::now() + WAIT * 2;
    while tokio::task::block_in_place(|| nodes[1].metric("postbox_cluster_nodes")) < 2.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node b never heard node a again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    publisher.wait_acked(STEP, WAIT).await;
    // The session moves to b, then back to a.
    sub.move_to(vec![b, a]).await;
    publisher.wait_acked(STEP, WAIT).await;
    sub.move_to(vec![a, b]).await;
    publisher.wait_acked(STEP, WAIT).await;

    let published = publisher.stop().await;
    let received = sub.finish(&published.acked, WAIT * 3).await;
    assert_exact("node paused", &published, &received, true);
}
