//! The sessions of a node that died (issue 17: "Wills, will delay and session expiry fire
//! once, cluster-wide"), with a real `nats-server -js` and real `postbox` nodes killed with
//! `kill -9`: a live node adopts their records, publishes the wills of the connections that
//! died with the node (after their Will Delay Interval, or when the session ends if that is
//! sooner), once across the cluster, and expires the sessions; a client that comes back
//! within the delay cancels its will.

use crate::common;

use std::time::Duration;

use bytestring::ByteString;
use common::cluster::{start_cluster, Node};
use common::nats::NatsServer;
use common::{v5, RawClient};
use postbox::codec::{Connect, LastWill, Packet, QoS};

/// How long a dead node's will may take to show: the node is taken for dead 7 s after its
/// last heartbeat (every 2 s), then its records are read and adopted.
const DEATH: Duration = Duration::from_secs(30);

/// `connect` with a QoS 1 will on `topic` (payload: the client id) delayed by `delay` s.
fn with_will(mut connect: Connect, topic: &str, delay: Option<u32>) -> Connect {
    let payload = connect.client_id.to_string();
    let mut will = LastWill {
        topic: ByteString::from(topic),
        payload: payload.into_bytes().into(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    };
    will.properties.will_delay_interval = delay;
    connect.will = Some(will);
    connect
}

/// Two linked nodes; on b a watcher of `wills/#`; on a the persistent session `id` (expiry
/// `expiry` s) with its will on `wills/<id>` delayed `delay` s, subscribed to `<id>/#`: the
/// start of the tests of what becomes of a killed node's session on another node. Returns
/// NATS, the nodes, the watcher and the session's client (keep them alive).
async fn session_on_a_watched_on_b(
    id: &str,
    expiry: u32,
    delay: u32,
) -> (NatsServer, Vec<Node>, RawClient, RawClient) {
    let (nats, nodes) = start_cluster(2, "").await;
    let mut on_b = v5::connect_id(nodes[1].mqtt(), "watch-b").await;
    v5::subscribe(&mut on_b, "wills/#", QoS::AtLeastOnce).await;
    let (mut client, _) = v5::connect(
        nodes[0].mqtt(),
        with_will(
            v5::persistent_connect(id, expiry),
            &format!("wills/{id}"),
            Some(delay),
        ),
    )
    .await;
    v5::subscribe(&mut client, &format!("{id}/#"), QoS::AtLeastOnce).await;
    (nats, nodes, on_b, client)
}

/// Receives PUBLISHes (acknowledged) for up to `within`; their payloads.
async fn collect(c: &mut RawClient, within: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return got;
        }
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                v5::ack(c, &p).await;
                got.push(String::from_utf8_lossy(&p.payload).into_owned());
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("subscriber closed"),
            Err(()) => return got,
        }
    }
}

/// Waits (bounded by [`DEATH`]) until `c` received a PUBLISH with `payload`; everything it
/// received meanwhile.
async fn wait_for(c: &mut RawClient, payload: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + DEATH;
    let mut got = Vec::new();
    while !got.iter().any(|p| p == payload) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{payload} never arrived within {DEATH:?}; got {got:?}"
        );
        got.extend(collect(c, left.min(Duration::from_millis(500))).await);
    }
    got
}

/// MQTT-3.1.2-8 (the will is published when the network connection is closed without a
/// DISCONNECT) and issue 17 ("wills ... fire once, cluster-wide"): clients connected to a
/// node that is killed lose their connections; their wills are published by one of the
/// surviving nodes, each once, to subscribers on every surviving node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wills_of_a_dead_nodes_clients_are_published_once_by_another_node() {
    let (_nats, mut nodes) = start_cluster(3, "").await;
    let mut on_b = v5::connect_id(nodes[1].mqtt(), "watch-b").await;
    let mut on_c = v5::connect_id(nodes[2].mqtt(), "watch-c").await;
    v5::subscribe(&mut on_b, "wills/#", QoS::AtLeastOnce).await;
    v5::subscribe(&mut on_c, "wills/#", QoS::AtLeastOnce).await;

    // A clean session and a persistent one, both with wills, both on node a.
    let (_clean, _) = v5::connect(
        nodes[0].mqtt(),
        with_will(v5::connect_packet("will-clean"), "wills/clean", None),
    )
    .await;
    let (_kept, _) = v5::connect(
        nodes[0].mqtt(),
        with_will(v5::persistent_connect("will-kept", 600), "wills/kept", None),
    )
    .await;
    tokio::task::block_in_place(|| nodes[0].kill9());

    for subscriber in [&mut on_b, &mut on_c] {
        let mut got = wait_for(subscriber, "will-clean").await;
        if !got.iter().any(|p| p == "will-kept") {
            got.extend(wait_for(subscriber, "will-kept").await);
        }
        // Both surviving nodes searched for the dead node's sessions; one adopted each.
        got.extend(collect(subscriber, Duration::from_secs(3)).await);
        for will in ["will-clean", "will-kept"] {
            assert_eq!(
                got.iter().filter(|p| *p == will).count(),
                1,
                "{will} published once: {got:?}"
            );
        }
    }
    // One adopter per session (compare-and-set on the record), though both surviving nodes
    // found it: the will's own compare-and-set would hide a double adoption from the
    // subscribers, not from the record.
    for client in ["will-clean", "will-kept"] {
        let field = format!("client={client} ");
        let adoptions: usize = nodes[1..]
            .iter()
            .map(|node| {
                node.log()
                    .iter()
                    .filter(|line| {
                        line.contains("adopted the session of a dead node")
                            && format!("{line} ").contains(&field)
                    })
                    .count()
            })
            .sum();
        assert_eq!(adoptions, 1, "{client} adopted by one node");
    }
}

/// MQTT-3.1.2-8 / MQTT-3.1.3-9 (a will waits for its Will Delay Interval, or for the session
/// to end if that is sooner) and MQTT-3.1.2-23 (a session ends when its expiry interval has
/// passed since the connection ended), across nodes: a session on a killed node, with a
/// 4 s expiry and a 60 s will delay, has its will published when it ends, and a client that
/// connects afterwards to another node finds no session (session-present 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_session_expires_on_another_node_and_its_will_goes_out_then() {
    let (_nats, mut nodes, mut on_b, _short) = session_on_a_watched_on_b("short", 4, 60).await;
    let expired_before = nodes[1].metric("postbox_sessions_expired_total");
    tokio::task::block_in_place(|| nodes[0].kill9());

    // Not before the session's 4 s (from its adoption), but then.
    let got = wait_for(&mut on_b, "short").await;
    assert_eq!(got.iter().filter(|p| *p == "short").count(), 1, "{got:?}");
    let deadline = tokio::time::Instant::now() + common::WAIT;
    while nodes[1].metric("postbox_sessions_expired_total") <= expired_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the adopted session never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_back, ack) = v5::connect(nodes[1].mqtt(), v5::persistent_connect("short", 60)).await;
    assert!(
        !ack.session_present,
        "the session expired cluster-wide (MQTT-3.1.2-23)"
    );
}

/// MQTT-3.1.3-9 ("the Server MUST NOT send the Will Message if ... a new Network Connection
/// for that Session is made before the Will Delay Interval has passed"), across nodes: the
/// client of a killed node reconnects to another node within its will delay, resumes its
/// session there, and its will is never published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_back_on_another_node_within_its_will_delay_cancels_the_will() {
    let (_nats, mut nodes, mut on_b, _late) = session_on_a_watched_on_b("late", 600, 12).await;
    // A control client whose will has no delay: its will shows when node a's sessions were
    // adopted, so the cancelled one had its chance to go out wrongly.
    let (_control, _) = v5::connect(
        nodes[0].mqtt(),
        with_will(v5::connect_packet("control"), "wills/control", None),
    )
    .await;
    tokio::task::block_in_place(|| nodes[0].kill9());
    let got = wait_for(&mut on_b, "control").await;

    // Back within the 12 s delay (counted from the adoption), on node b.
    let (_back, ack) = v5::connect(nodes[1].mqtt(), v5::persistent_connect("late", 600)).await;
    assert!(ack.session_present, "the session lives on (MQTT-3.2.2-2)");
    // Past the delay: the will must not come.
    let mut got = got;
    got.extend(collect(&mut on_b, Duration::from_secs(14)).await);
    assert!(
        !got.iter().any(|p| p == "late"),
        "the will was published though its client came back: {got:?}"
    );
}

/// `connect` as `user` of the example password file (password `<user>-secret`).
pub(crate) fn as_user(mut connect: Connect, user: &str) -> Connect {
    connect.username = Some(user.into());
    connect.password = Some(format!("{user}-secret").into_bytes().into());
    connect
}

/// Issue 35, sixth adversarial pass (F1b, high): the will of a session whose node died is
/// published by the adopting node only where the session's owner may write, as its own node
/// would have published it. Before, the adopter published every will unchecked, so any
/// client could write anywhere (retained, too) by connecting with a will to a node that
/// then died. sensor2 (example ACL: it writes `sensors/sensor2/#` only) has two sessions on
/// node a: a will on its own topic (the control: it must arrive) and a retained will on
/// sensor1's commands (denied: it must arrive neither live nor as a retained message).
/// MQTT-3.1.2-8 (the will is published when the connection is lost); the ACL applies to a
/// will as to its client's PUBLISH (MQTT 5 §5.4.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_will_is_published_only_where_its_owner_may_write() {
    // The example ACL, and anonymous clients let in to write and read `probe/#` only: the
    // probes that tell the nodes are linked (`wait_linked`) are anonymous.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let acl = dir.path().join("acl");
    let example = std::fs::read_to_string(root.join("config/acl.example")).expect("example ACL");
    std::fs::write(&acl, format!("topic readwrite probe/#\n{example}")).expect("write ACL");
    let extra = format!(
        "[auth]\nallow_anonymous = true\npassword_file = {:?}\nacl_file = {acl:?}\n",
        root.join("config/passwd.example")
    );
    let (_nats, mut nodes) = start_cluster(2, &extra).await;
    let (mut dash, _) = v5::connect(
        nodes[1].mqtt(),
        as_user(v5::connect_packet("dash"), "dashboard"),
    )
    .await;
    v5::subscribe(&mut dash, "sensors/#", QoS::AtLeastOnce).await;
    let (mut sensor1, _) = v5::connect(
        nodes[1].mqtt(),
        as_user(v5::connect_packet("sensor1"), "sensor1"),
    )
    .await;
    v5::subscribe(&mut sensor1, "commands/sensor1/#", QoS::AtLeastOnce).await;

    let (_own, _) = v5::connect(
        nodes[0].mqtt(),
        as_user(
            with_will(
                v5::persistent_connect("s2-own", 600),
                "sensors/sensor2/status",
                None,
            ),
            "sensor2",
        ),
    )
    .await;
    let mut forged = with_will(
        v5::persistent_connect("s2-forged", 600),
        "commands/sensor1/reboot",
        None,
    );
    if let Some(will) = forged.will.as_mut() {
        will.retain = true;
    }
    let (_forged, _) = v5::connect(nodes[0].mqtt(), as_user(forged, "sensor2")).await;
    tokio::task::block_in_place(|| nodes[0].kill9());

    // The allowed will shows node a's sessions were adopted and their wills came due.
    wait_for(&mut dash, "s2-own").await;
    nodes[1]
        .wait_log_within(DEATH, |line| {
            line.contains("will not published") && format!("{line} ").contains("client=s2-forged ")
        })
        .await;
    let got = collect(&mut sensor1, Duration::from_millis(500)).await;
    assert!(got.is_empty(), "the denied will arrived: {got:?}");
    // Nor is it kept as a retained message for later subscribers.
    let (mut later, _) = v5::connect(
        nodes[1].mqtt(),
        as_user(v5::connect_packet("sensor1-later"), "sensor1"),
    )
    .await;
    v5::subscribe(&mut later, "commands/sensor1/#", QoS::AtLeastOnce).await;
    let got = collect(&mut later, Duration::from_millis(500)).await;
    assert!(got.is_empty(), "the denied will was retained: {got:?}");
}
