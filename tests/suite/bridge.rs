//! Bridges against a real remote (issue 15): the `postbox` binary with `[[bridge]]` sections,
//! a real Mosquitto (or a second Postbox) as the remote, real clients on both sides.
//!
//! The guarantee under test: a QoS 1 message Postbox acknowledged for an `out` rule reaches
//! the remote, in order, across remote outages and a SIGKILL of Postbox itself.

use std::net::SocketAddr;

use postbox::codec::{Packet, Publish, PublishProperties, QoS, SubscriptionOptions};

use crate::common::async_process::{free_port, BrokerProcess};
use crate::common::mosquitto_broker::{closed_port, MosquittoBroker};
use crate::common::v5;
use crate::common::RawClient;

/// A `[[bridge]]` section named `name` to the remote ports `ports` (tried in order) speaking
/// `protocol`, reconnecting within a second, with `rules` (`[[bridge.topic]]` tables) and any
/// `extra` keys.
fn bridge(name: &str, ports: &[u16], protocol: &str, extra: &str, rules: &str) -> String {
    let addresses: Vec<String> = ports.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    format!(
        "[[bridge]]\nname = \"{name}\"\naddresses = [{}]\nprotocol = \"{protocol}\"\n\
         restart_timeout = [1, 1]\n{extra}\n{rules}\n",
        addresses.join(", ")
    )
}

/// The example rules: `sensors/#` out under `site1/` on the remote, `commands/#` in.
const SITE_RULES: &str = "[[bridge.topic]]\npattern = \"sensors/#\"\ndirection = \"out\"\n\
     qos = 1\nremote_prefix = \"site1/\"\n\
     [[bridge.topic]]\npattern = \"commands/#\"\ndirection = \"in\"\nqos = 1\n";

/// A durable store in `dir` (kept across restarts of the process).
fn storage(dir: &std::path::Path) -> String {
    format!("[storage]\ndir = \"{}\"\n", dir.display())
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A v5 client with a persistent session subscribed to `filter` at QoS 1.
async fn persistent_subscriber(port: u16, id: &str, filter: &str) -> RawClient {
    let (mut c, _) = v5::connect(addr(port), v5::persistent_connect(id, 3600)).await;
    v5::subscribe(&mut c, filter, QoS::AtLeastOnce).await;
    c
}

/// The same client resuming its session (Mosquitto kept its subscription): what was queued
/// for it arrives right after CONNACK, so nothing may be skipped waiting for a SUBACK.
async fn resume_subscriber(port: u16, id: &str) -> RawClient {
    let (c, ack) = v5::connect(addr(port), v5::persistent_connect(id, 3600)).await;
    assert!(
        ack.session_present,
        "the remote kept the subscriber's session"
    );
    c
}

/// Publishes `count` QoS 1 messages `topic` with payloads `prefix0`, `prefix1`, ... and
/// asserts each was acknowledged as accepted.
async fn publish_numbered(port: u16, topic: &str, prefix: &str, count: usize) {
    let mut c = v5::connect_id(addr(port), &format!("pub-{prefix}")).await;
    for i in 0..count {
        let payload = format!("{prefix}{i}");
        let code = v5::publish(
            &mut c,
            v5::publish_packet(
                topic,
                QoS::AtLeastOnce,
                payload.as_bytes(),
                (i % 60000 + 1) as u16,
            ),
        )
        .await;
        assert!(!code.is_error(), "PUBACK {code:?} for {payload}");
    }
    v5::disconnect(c).await;
}

/// Receives `count` PUBLISHes (acknowledging each) and returns their payloads in order.
async fn receive_payloads(c: &mut RawClient, count: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let p = v5::receive(c).await;
        out.push(String::from_utf8_lossy(&p.payload).into_owned());
    }
    out
}

fn numbered(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

async fn wait_bridge_up(postbox: &BrokerProcess) {
    postbox
        .wait_log(|l| l.contains("bridge: connected to the remote"))
        .await;
}

/// Messages flow both ways with Mosquitto's prefix rules: `sensors/x` out as `site1/sensors/x`,
/// `commands/x` in, for MQTT 5 and 3.1.1 bridges.
#[tokio::test]
async fn messages_flow_both_ways_with_prefixes() {
    for protocol in ["5", "3.1.1"] {
        let remote = MosquittoBroker::start("").await;
        let postbox = BrokerProcess::spawn_file(
            &format!(
                "[storage]\npersistence = false\n{}",
                bridge("cloud", &[remote.port], protocol, "", SITE_RULES)
            ),
            &[],
        )
        .await;
        wait_bridge_up(&postbox).await;
        let mut remote_sub = v5::connect_id(addr(remote.port), "remote-sub").await;
        v5::subscribe(&mut remote_sub, "site1/#", QoS::AtLeastOnce).await;
        let mut local_sub = v5::connect_id(postbox.addr, "local-sub").await;
        v5::subscribe(&mut local_sub, "commands/#", QoS::AtLeastOnce).await;

        publish_numbered(postbox.addr.port(), "sensors/a/temp", "out", 3).await;
        let mut got = Vec::new();
        for _ in 0..3 {
            let p = v5::receive(&mut remote_sub).await;
            assert_eq!(&*p.topic, "site1/sensors/a/temp", "{protocol}");
            got.push(String::from_utf8_lossy(&p.payload).into_owned());
        }
        assert_eq!(got, numbered("out", 3), "{protocol}: in order");

        publish_numbered(remote.port, "commands/door", "in", 2).await;
        for expected in numbered("in", 2) {
            let p = v5::receive(&mut local_sub).await;
            assert_eq!(&*p.topic, "commands/door", "{protocol}");
            assert_eq!(String::from_utf8_lossy(&p.payload), expected, "{protocol}");
        }
    }
}

/// The remote is stopped while messages are published locally and started again: every QoS 1
/// message acknowledged meanwhile reaches the remote subscriber, in order (Postbox keeps them
/// in the bridge's durable session until the remote's PUBACK).
#[tokio::test]
async fn a_remote_outage_loses_nothing_and_keeps_order() {
    let mut remote = MosquittoBroker::start("").await;
    let sub = persistent_subscriber(remote.port, "site-archive", "site1/#").await;
    v5::disconnect(sub).await;
    let data = tempfile::tempdir().expect("tempdir");
    let postbox = BrokerProcess::spawn_file(
        &format!(
            "{}{}",
            storage(data.path()),
            bridge("cloud", &[remote.port], "5", "", SITE_RULES)
        ),
        &[],
    )
    .await;
    wait_bridge_up(&postbox).await;
    remote.stop().await;
    const N: usize = 200;
    publish_numbered(postbox.addr.port(), "sensors/line1", "m", N).await;
    remote.restart().await;
    let mut sub = resume_subscriber(remote.port, "site-archive").await;
    assert_eq!(receive_payloads(&mut sub, N).await, numbered("m", N));
}

/// Postbox is killed with SIGKILL holding a backlog for an unreachable remote; after a restart
/// on the same store it delivers all of it, in order, once the remote is up.
#[tokio::test]
async fn a_sigkill_with_a_backlog_loses_nothing() {
    let remote_port = free_port();
    // The remote's subscriber session exists before the outage, so Mosquitto keeps what the
    // bridge forwards for it.
    let mut remote = MosquittoBroker::start_on(remote_port, "").await;
    let sub = persistent_subscriber(remote_port, "site-archive-kill", "site1/#").await;
    v5::disconnect(sub).await;
    remote.stop().await;

    let data = tempfile::tempdir().expect("tempdir");
    let rest = format!(
        "{}{}",
        storage(data.path()),
        bridge("cloud", &[remote_port], "5", "", SITE_RULES)
    );
    let postbox = BrokerProcess::spawn_file(&rest, &[]).await;
    const N: usize = 100;
    publish_numbered(postbox.addr.port(), "sensors/line2", "k", N).await;
    postbox.kill().await; // SIGKILL: no shutdown, no final commit

    let postbox = BrokerProcess::spawn_file(&rest, &[]).await;
    remote.restart().await;
    wait_bridge_up(&postbox).await;
    let mut sub = resume_subscriber(remote_port, "site-archive-kill").await;
    assert_eq!(receive_payloads(&mut sub, N).await, numbered("k", N));
}

/// The first address is down: the bridge fails over to the second.
#[tokio::test]
async fn the_failover_address_is_used_when_the_first_is_down() {
    let remote = MosquittoBroker::start("").await;
    let (_held, closed) = closed_port();
    let postbox = BrokerProcess::spawn_file(
        &format!(
            "[storage]\npersistence = false\n{}",
            bridge("cloud", &[closed, remote.port], "5", "", SITE_RULES)
        ),
        &[],
    )
    .await;
    let line = postbox
        .wait_log(|l| l.contains("bridge: connected to the remote"))
        .await;
    assert!(
        line.contains(&format!("127.0.0.1:{}", remote.port)),
        "connected to the second address: {line}"
    );
    let mut remote_sub = v5::connect_id(addr(remote.port), "remote-sub").await;
    v5::subscribe(&mut remote_sub, "site1/#", QoS::AtLeastOnce).await;
    publish_numbered(postbox.addr.port(), "sensors/f", "f", 1).await;
    assert_eq!(receive_payloads(&mut remote_sub, 1).await, ["f0"]);
}

/// Two Postbox brokers, A bridged to B with `#` both ways: a message published on either side
/// reaches the other once and never comes back (No Local on both subscriptions of the
/// bridge, MQTT-3.8.3-3).
#[tokio::test]
async fn a_bridge_between_two_postbox_brokers_does_not_echo() {
    let b = BrokerProcess::spawn_file("[storage]\npersistence = false\n", &[]).await;
    let rules = "[[bridge.topic]]\npattern = \"#\"\ndirection = \"both\"\nqos = 1\n";
    let a = BrokerProcess::spawn_file(
        &format!(
            "[storage]\npersistence = false\n{}",
            bridge("peer", &[b.addr.port()], "5", "", rules)
        ),
        &[],
    )
    .await;
    wait_bridge_up(&a).await;
    let mut on_a = v5::connect_id(a.addr, "sub-a").await;
    v5::subscribe(&mut on_a, "t/#", QoS::AtLeastOnce).await;
    let mut on_b = v5::connect_id(b.addr, "sub-b").await;
    v5::subscribe(&mut on_b, "t/#", QoS::AtLeastOnce).await;
    // The bridge's remote subscription is made after CONNACK: a message from B before it is
    // in place would not cross. Wait until B routes to A: retry a probe until A sees one.
    let mut probe = v5::connect_id(b.addr, "probe").await;
    let mut crossed = false;
    for i in 0..50u16 {
        v5::publish(
            &mut probe,
            v5::publish_packet("t/probe", QoS::AtMostOnce, b"p", 0),
        )
        .await;
        let _ = v5::receive(&mut on_b).await;
        if let Ok(Some(Packet::Publish(_))) = on_a
            .recv_within(std::time::Duration::from_millis(100))
            .await
        {
            crossed = true;
            break;
        }
        let _ = i;
    }
    assert!(crossed, "the bridge never subscribed on B");
    drain(&mut on_a).await;
    drain(&mut on_b).await;

    // A → B: B gets it once; A gets only its own copy. The fence published on B afterwards
    // crosses the same link back, so an echo of "x" would reach A before it.
    publish_numbered(a.addr.port(), "t/x", "x", 1).await;
    assert_eq!(receive_payloads(&mut on_b, 1).await, ["x0"]);
    publish_numbered(b.addr.port(), "t/fence", "fence", 1).await;
    assert_eq!(receive_payloads(&mut on_b, 1).await, ["fence0"]);
    assert_eq!(receive_payloads(&mut on_a, 2).await, ["x0", "fence0"]);

    // B → A: A gets it once; a fence from A shows B did not get an echo.
    publish_numbered(b.addr.port(), "t/y", "y", 1).await;
    assert_eq!(receive_payloads(&mut on_a, 1).await, ["y0"]);
    publish_numbered(a.addr.port(), "t/fence2", "g", 1).await;
    assert_eq!(receive_payloads(&mut on_a, 1).await, ["g0"]);
    assert_eq!(receive_payloads(&mut on_b, 2).await, ["y0", "g0"]);
}

/// Reads whatever is already queued for a client (bounded), acknowledging it.
async fn drain(c: &mut RawClient) {
    for _ in 0..1000 {
        match c.recv_within(std::time::Duration::from_millis(200)).await {
            Ok(Some(Packet::Publish(p))) => v5::ack(c, &p).await,
            _ => return,
        }
    }
}

/// MQTT 5 fidelity: user properties, content type, response topic, correlation data, payload
/// format and the remaining message expiry cross the bridge (MQTT-3.3.2-6 for the expiry;
/// MQTT-3.3.2-17/18 for user properties kept in order); RETAIN travels as published.
#[tokio::test]
async fn v5_properties_and_retain_cross_the_bridge() {
    let remote = MosquittoBroker::start("").await;
    let postbox = BrokerProcess::spawn_file(
        &format!(
            "[storage]\npersistence = false\n{}",
            bridge("cloud", &[remote.port], "5", "", SITE_RULES)
        ),
        &[],
    )
    .await;
    wait_bridge_up(&postbox).await;
    let mut remote_sub = v5::connect_id(addr(remote.port), "remote-sub").await;
    v5::subscribe_with(
        &mut remote_sub,
        "site1/#",
        SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            retain_as_published: true,
            ..Default::default()
        },
        None,
    )
    .await;
    let mut publisher = v5::connect_id(postbox.addr, "props-pub").await;
    let properties = PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(3600),
        content_type: Some("application/json".into()),
        response_topic: Some("replies/1".into()),
        correlation_data: Some(b"corr-7".to_vec().into()),
        user_properties: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
        ..Default::default()
    };
    let mut p: Publish = v5::publish_packet("sensors/p", QoS::AtLeastOnce, b"{}", 5);
    p.properties = properties;
    p.retain = true;
    v5::publish(&mut publisher, p).await;
    let got = v5::receive(&mut remote_sub).await;
    assert_eq!(&*got.topic, "site1/sensors/p");
    assert!(got.retain, "RETAIN as published");
    let props = &got.properties;
    assert_eq!(props.payload_format_indicator, Some(1));
    assert_eq!(props.content_type.as_deref(), Some("application/json"));
    assert_eq!(props.response_topic.as_deref(), Some("replies/1"));
    assert_eq!(props.correlation_data.as_deref(), Some(&b"corr-7"[..]));
    let expiry = props.message_expiry_interval.expect("expiry forwarded");
    assert!((3590..=3600).contains(&expiry), "remaining expiry {expiry}");
    let users: Vec<(String, String)> = props
        .user_properties
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(
        users,
        [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
            ("postbox-hops".to_owned(), "1".to_owned())
        ]
    );
}

/// `start = "lazy"` (Mosquitto's `start_type lazy`): no connection until `threshold` messages
/// are queued for the remote, then all of them in order, and a disconnect after
/// `idle_timeout` seconds with nothing to send.
#[tokio::test]
async fn a_lazy_bridge_connects_at_its_threshold_and_leaves_when_idle() {
    let remote = MosquittoBroker::start("").await;
    let mut remote_sub = persistent_subscriber(remote.port, "lazy-sub", "site1/#").await;
    let postbox = BrokerProcess::spawn_file(
        &format!(
            "[storage]\npersistence = false\n{}",
            bridge(
                "cloud",
                &[remote.port],
                "5",
                "start = \"lazy\"\nthreshold = 3\nidle_timeout = 1\n",
                SITE_RULES
            )
        ),
        &[],
    )
    .await;
    publish_numbered(postbox.addr.port(), "sensors/l", "l", 2).await;
    assert!(
        !postbox
            .logs()
            .iter()
            .any(|l| l.contains("bridge: connected to the remote")),
        "a lazy bridge under its threshold stays down"
    );
    publish_numbered(postbox.addr.port(), "sensors/l", "m", 1).await;
    wait_bridge_up(&postbox).await;
    assert_eq!(
        receive_payloads(&mut remote_sub, 3).await,
        ["l0", "l1", "m0"]
    );
    postbox
        .wait_log(|l| l.contains("bridge: idle, disconnected"))
        .await;
}

/// A certificate of the repository's dev PKI (`certs/`).
fn dev_cert(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("certs")
        .join(name)
        .display()
        .to_string()
}

/// A bridge over TLS (the remote's certificate checked against the dev CA) and over mTLS (the
/// remote requires a client certificate): messages cross both ways. `[bridge.tls]` end to end,
/// through the same engine as plain TCP.
#[tokio::test]
async fn tls_and_mtls_bridges_carry_messages() {
    let (tls_port, mtls_port) = (free_port(), free_port());
    let (server, key, ca) = (
        dev_cert("server.pem"),
        dev_cert("server.key"),
        dev_cert("ca.pem"),
    );
    let remote = MosquittoBroker::start(&format!(
        "listener {tls_port} 127.0.0.1\ncertfile {server}\nkeyfile {key}\n\
         listener {mtls_port} 127.0.0.1\ncertfile {server}\nkeyfile {key}\ncafile {ca}\n\
         require_certificate true\n"
    ))
    .await;
    let tls = format!("[bridge.tls]\nca = \"{ca}\"\nserver_name = \"localhost\"\n");
    let mtls = format!(
        "[bridge.tls]\nca = \"{ca}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        dev_cert("client.pem"),
        dev_cert("client.key")
    );
    for (name, port, tls) in [("tls", tls_port, tls), ("mtls", mtls_port, mtls)] {
        let postbox = BrokerProcess::spawn_file(
            &format!(
                "[storage]\npersistence = false\n{}",
                bridge(name, &[port], "5", &tls, SITE_RULES)
            ),
            &[],
        )
        .await;
        wait_bridge_up(&postbox).await;
        // The remote's plain listener sees what crossed the TLS link.
        let mut remote_sub = v5::connect_id(addr(remote.port), &format!("{name}-sub")).await;
        v5::subscribe(&mut remote_sub, "site1/#", QoS::AtLeastOnce).await;
        let mut local_sub = v5::connect_id(postbox.addr, &format!("{name}-local")).await;
        v5::subscribe(&mut local_sub, "commands/#", QoS::AtLeastOnce).await;
        publish_numbered(postbox.addr.port(), "sensors/s", name, 2).await;
        assert_eq!(
            receive_payloads(&mut remote_sub, 2).await,
            numbered(name, 2),
            "{name}"
        );
        publish_numbered(remote.port, "commands/c", &format!("{name}-in"), 1).await;
        assert_eq!(
            receive_payloads(&mut local_sub, 1).await,
            [format!("{name}-in0")],
            "{name}"
        );
    }
}
