//! Operating the real `postbox` binary (issue 14, the ops part): what its log says and never
//! says, a graceful shutdown on SIGTERM under QoS 1 traffic, and SIGHUP reloading the config
//! file. Every test runs the binary as a process (`BrokerProcess`) and reads its stdout.

use std::collections::BTreeSet;
use std::time::Duration;

use postbox::codec::{Packet, Publish, QoS, ReasonCode};

use crate::common;
use crate::jwt::{jwt_dir, now, rs256};
use common::async_process::BrokerProcess;
use common::{v5, RawClient};

/// A bound on the whole shutdown, well above the broker's own (20 s, `SHUTDOWN_BOUND` in
/// main.rs) so a broker that overruns it shows up as a non-zero status, not as this timeout.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// A v5 CONNECT with a session that outlives the connection (Session Expiry Interval 1 h).
fn persistent(client_id: &str, clean: bool) -> postbox::codec::Connect {
    let mut connect = v5::connect_packet(client_id);
    connect.clean_start = clean;
    connect.properties.session_expiry_interval = Some(3600);
    connect
}

/// The broker from the config file `config`, with `NO_COLOR` set but empty (as if unset): its
/// stdout is a pipe, so its log must carry no colour codes either way.
async fn spawn_piped(config: &str) -> BrokerProcess {
    BrokerProcess::spawn_file(config, &[("NO_COLOR", "")]).await
}

/// Asserts that no line `broker` logged so far carries a terminal colour code (ESC): its
/// output is a pipe.
fn assert_no_colour_codes(broker: &BrokerProcess) {
    for line in broker.logs() {
        assert!(
            !line.contains('\u{1b}'),
            "colour codes in a piped log: {line:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_has_lifecycle_fields_and_no_secret() {
    // A password file (alice / the password below), JWT keys, JSON lines, every level, and
    // NO_COLOR unset: the output is a pipe, so no colour codes either way.
    let dir = tempfile::tempdir().expect("tempdir");
    let passwords = dir.path().join("passwd");
    let password = "correct-horse-battery-staple-7731";
    let status = std::process::Command::new(common::process::BIN)
        .args(["passwd", "-c", "-b"])
        .arg(&passwords)
        .args(["alice", password])
        .status()
        .expect("postbox passwd");
    assert!(status.success());
    let key = jwt_dir().join("rsa.pub");
    let broker = spawn_piped(&format!(
        "[storage]\npersistence = false\n[log]\nlevel = \"trace\"\nformat = \"json\"\n\
         [auth]\nallow_anonymous = false\npassword_file = {passwords:?}\n\
         [auth.jwt]\npublic_key = {key:?}\nleeway = 0\n"
    ))
    .await;
    let token = rs256(
        &jwt_dir().join("rsa.key"),
        &format!(r#"{{"sub":"sensor9","exp":{}}}"#, now() + 300),
    );
    let wrong = "wrong-password-0451";
    for (id, user, secret, accepted) in [
        ("pw-ok", Some("alice"), password, true),
        ("pw-bad", Some("alice"), wrong, false),
        ("jwt-ok", None, token.as_str(), true),
    ] {
        let mut connect = v5::connect_packet(id);
        connect.username = user.map(Into::into);
        connect.password = Some(secret.as_bytes().to_vec().into());
        let (c, answer) = v5::open(broker.addr, connect).await;
        match answer {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code.is_error(), !accepted),
            other => panic!("{id}: {other:?}"),
        }
        if accepted {
            v5::disconnect(c).await;
            broker
                .wait_log(|l| l.contains("client disconnected") && l.contains(id))
                .await;
        }
    }
    broker
        .wait_log(|l| l.contains("authentication failed") && l.contains("pw-bad"))
        .await;
    // The lifecycle lines carry their facts as JSON keys, not only in the message.
    let connected = broker
        .wait_log(|l| l.contains("client connected") && l.contains("pw-ok"))
        .await;
    let json: serde_json::Value = serde_json::from_str(&connected).expect("a JSON line");
    assert_eq!(json["client"], "pw-ok", "{json}");
    assert_eq!(json["protocol"], "5.0", "{json}");
    assert_eq!(json["username"], "alice", "{json}");
    assert_eq!(json["clean"], true, "{json}");
    assert_eq!(json["keep_alive"], 60, "{json}");
    assert!(json["peer"]
        .as_str()
        .is_some_and(|p| p.starts_with("127.0.0.1:")));
    let gone = broker
        .wait_log(|l| l.contains("client disconnected") && l.contains("jwt-ok"))
        .await;
    let json: serde_json::Value = serde_json::from_str(&gone).expect("a JSON line");
    assert_eq!(json["reason"], "client disconnect", "{json}");
    let logs = broker.logs();
    let (_, signature) = token.rsplit_once('.').expect("a JWT");
    for line in &logs {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "{line}"
        );
        for secret in [password, wrong, token.as_str(), signature] {
            assert!(!line.contains(secret), "secret in the log: {line}");
        }
        assert!(
            !line.contains('\u{1b}'),
            "colour codes in a piped log: {line:?}"
        );
    }
}

/// A QoS 1 publisher until it is told to stop: the payloads the broker acknowledged, and the
/// DISCONNECT reason it was given (`None`: closed without one).
async fn publish_until_closed(
    mut c: RawClient,
    name: &str,
    started: &tokio::sync::Semaphore,
) -> (Vec<String>, Option<ReasonCode>) {
    let mut acked = Vec::new();
    for n in 0u32..20_000 {
        let payload = format!("{name}-{n}");
        let id = u16::try_from(n % 60_000 + 1).expect("id");
        let publish = v5::publish_packet("load/t", QoS::AtLeastOnce, payload.as_bytes(), id);
        c.send(&Packet::Publish(publish)).await;
        // One PUBLISH in flight: the next packet is its PUBACK, or the end.
        match c.recv().await {
            Some(Packet::PubAck(a)) if a.packet_id == id => {
                assert_eq!(a.reason_code, ReasonCode::SUCCESS);
                acked.push(payload);
                started.add_permits(1);
            }
            Some(Packet::Disconnect(d)) => return (acked, Some(d.reason_code)),
            Some(other) => panic!("{name}: {other:?}"),
            None => return (acked, None),
        }
    }
    panic!("{name}: the broker never stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_qos1_traffic_exits_0_and_keeps_every_acknowledged_message() {
    let data = tempfile::tempdir().expect("data dir");
    let rest = format!(
        "[storage]\npersistence = true\ndir = {:?}\n\
         [mqtt]\nmax_queued_messages = 100000\nmax_queued_bytes = 0\nwills_on_shutdown = true\n",
        data.path()
    );
    let mut broker = BrokerProcess::spawn_file(&rest, &[]).await;
    // The persistent subscriber, offline during the traffic.
    let (mut sub, _) = v5::connect(broker.addr, persistent("keeper", true)).await;
    v5::subscribe(&mut sub, "load/#", QoS::AtLeastOnce).await;
    v5::subscribe(&mut sub, "wills/#", QoS::AtLeastOnce).await;
    v5::disconnect(sub).await;
    // A connected v5 client with a will and no delay: published at shutdown (MQTT-3.1.2-8).
    let mut mortal = connect_mortal(broker.addr).await;
    let started = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let mut publishers = Vec::new();
    for p in 0..3 {
        let c = v5::connect_id(broker.addr, &format!("pub{p}")).await;
        let started = std::sync::Arc::clone(&started);
        publishers.push(tokio::spawn(async move {
            publish_until_closed(c, &format!("pub{p}"), &started).await
        }));
    }
    // Stop in the middle of the traffic: after 300 acknowledgements.
    let _ = tokio::time::timeout(common::WAIT, started.acquire_many(300))
        .await
        .expect("300 PUBACKs in time");
    broker.signal(libc::SIGTERM);
    let (status, took) = broker.wait_exit(EXIT_LIMIT).await;
    eprintln!("shutdown took {took:?}");
    assert!(status.success(), "exit status {status:?}");
    let mut acked = BTreeSet::new();
    for publisher in publishers {
        let (payloads, reason) = publisher.await.expect("publisher");
        // MQTT 5 §3.14.2.1: 0x8B Server shutting down.
        assert_eq!(reason, Some(ReasonCode::SERVER_SHUTTING_DOWN));
        acked.extend(payloads);
    }
    v5::expect_disconnect(&mut mortal, ReasonCode::SERVER_SHUTTING_DOWN).await;
    drop(broker);

    // Restarted on the same data: every acknowledged message is delivered (QoS 1 may repeat
    // one), and the will.
    let broker = BrokerProcess::spawn_file(&rest, &[]).await;
    let (mut sub, ack) = v5::connect(broker.addr, persistent("keeper", false)).await;
    assert!(ack.session_present);
    let mut missing = acked.clone();
    let mut will = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !missing.is_empty() || !will {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} acknowledged messages missing (will: {will})",
            missing.len()
        );
        let p = v5::receive(&mut sub).await;
        if &*p.topic == "wills/mortal" {
            will = true;
        } else {
            missing.remove(std::str::from_utf8(&p.payload).expect("utf8"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wills_on_shutdown_false_no_will_is_published() {
    let data = tempfile::tempdir().expect("data dir");
    let rest = format!(
        "[storage]\npersistence = true\ndir = {:?}\n[mqtt]\nwills_on_shutdown = false\n",
        data.path()
    );
    let mut broker = BrokerProcess::spawn_file(&rest, &[]).await;
    let (mut sub, _) = v5::connect(broker.addr, persistent("keeper", true)).await;
    v5::subscribe(&mut sub, "wills/#", QoS::AtLeastOnce).await;
    v5::disconnect(sub).await;
    let mut mortal = connect_mortal(broker.addr).await;
    broker.signal(libc::SIGTERM);
    v5::expect_disconnect(&mut mortal, ReasonCode::SERVER_SHUTTING_DOWN).await;
    let (status, _) = broker.wait_exit(EXIT_LIMIT).await;
    assert!(status.success(), "exit status {status:?}");
    drop(broker);
    let broker = BrokerProcess::spawn_file(&rest, &[]).await;
    let (mut sub, _) = v5::connect(broker.addr, persistent("keeper", false)).await;
    // Anything queued before the restart comes before this marker: the will would be first.
    let mut marker = v5::connect_id(broker.addr, "marker").await;
    let publish = v5::publish_packet("wills/marker", QoS::AtLeastOnce, b"m", 1);
    assert_eq!(v5::publish(&mut marker, publish).await, ReasonCode::SUCCESS);
    let first = v5::receive(&mut sub).await;
    assert_eq!(
        &*first.topic, "wills/marker",
        "a will was published at shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_shutdown_exits_at_once_and_not_0() {
    let mut broker = BrokerProcess::spawn_file("[storage]\npersistence = false\n", &[]).await;
    // A client that keeps writing (PINGREQ every 50 ms) and never closes: after its
    // DISCONNECT the broker lingers on its socket (up to 2 s, `connection::io`), so the
    // shutdown is still waiting for it when the second signal comes.
    let mut chatty = v5::connect_id(broker.addr, "chatty").await;
    let pings = tokio::spawn(async move {
        for _ in 0..200 {
            chatty.send_raw(&[0xC0, 0x00]).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    broker.signal(libc::SIGTERM);
    broker.wait_log(|l| l.contains("shutting down")).await;
    broker.signal(libc::SIGTERM);
    let (status, took) = broker.wait_exit(EXIT_LIMIT).await;
    eprintln!("exited {took:?} after the second signal");
    assert_eq!(status.code(), Some(2), "{status:?}");
    broker
        .wait_log(|l| l.contains("second stop signal during shutdown"))
        .await;
    pings.abort();
}

/// Rewrites the broker's config file with `text` after its `[listener]` and `[metrics]`
/// tables (which stay as they were), and returns the line number `text` starts at.
fn rewrite(broker: &BrokerProcess, text: &str) -> usize {
    let old = std::fs::read_to_string(&broker.config_path).expect("read config");
    let head: String = old
        .lines()
        .take_while(|l| !l.starts_with("[storage]"))
        .map(|l| format!("{l}\n"))
        .collect();
    let first = head.lines().count() + 1;
    std::fs::write(&broker.config_path, format!("{head}{text}")).expect("write config");
    first
}

/// Rewrites `broker`'s config file to `text` ([`rewrite`]), sends SIGHUP and waits until the
/// reload says it applied `key`.
async fn reload_applying(broker: &BrokerProcess, text: &str, key: &str) {
    rewrite(broker, text);
    broker.signal(libc::SIGHUP);
    let applied = format!("reload: applied {key}");
    broker.wait_log(|l| l.contains(&applied)).await;
}

/// Connects `id`, sends a PUBLISH to a wildcard topic (a protocol violation, MQTT-3.3.2-2,
/// logged at debug) and waits for the broker's `client disconnected` line about it.
async fn violate(broker: &BrokerProcess, id: &str) {
    let mut c = v5::connect_id(broker.addr, id).await;
    c.send(&Packet::Publish(Publish {
        topic: "bad/+".into(),
        payload: "x".into(),
        ..Default::default()
    }))
    .await;
    let _ = c.expect_close().await;
    broker
        .wait_log(|l| l.contains("client disconnected") && l.contains(id))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_the_log_level_and_keeps_the_config_when_the_file_is_bad() {
    // Text lines, NO_COLOR unset: stdout is a pipe, so no colour codes.
    let broker = spawn_piped("[storage]\npersistence = false\n[log]\nlevel = \"info\"\n").await;
    let debug_line = |id: &'static str| {
        move |l: &str| l.contains("protocol violation") && l.contains(id) && l.contains("DEBUG")
    };
    violate(&broker, "before").await;
    assert!(
        !broker.logs().iter().any(|l| debug_line("before")(l)),
        "debug line at info level"
    );
    reload_applying(
        &broker,
        "[storage]\npersistence = false\n[log]\nlevel = \"debug\"\n",
        "log.level",
    )
    .await;
    violate(&broker, "after").await;
    broker.wait_log(debug_line("after")).await;

    // A value out of range, on a line the error must name: rejected, the running config kept
    // (still at debug, still serving).
    let line = rewrite(
        &broker,
        "[storage]\npersistence = false\n[log]\nlevel = \"info\"\n[mqtt]\nmax_qos = 7\n",
    ) + 5;
    broker.signal(libc::SIGHUP);
    let rejected = broker
        .wait_log(|l| l.contains("config file rejected"))
        .await;
    assert!(
        rejected.contains(&format!("postbox.toml:{line}:")) && rejected.contains("mqtt.max_qos"),
        "{rejected}"
    );
    violate(&broker, "still").await;
    broker.wait_log(debug_line("still")).await;

    // Not TOML at all: the same.
    let line = rewrite(&broker, "[storage]\npersistence = false\n[log\n") + 2;
    broker.signal(libc::SIGHUP);
    let rejected = broker
        .wait_log(|l| l.contains("config file rejected") && l.contains(&format!(":{line}:")))
        .await;
    assert!(rejected.contains("postbox.toml"), "{rejected}");
    violate(&broker, "again").await;
    broker.wait_log(debug_line("again")).await;
    assert_no_colour_codes(&broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_a_limit_for_new_connections_and_names_keys_that_need_a_restart() {
    // NO_COLOR unset: stdout is a pipe, so no colour codes either.
    let broker = spawn_piped("[storage]\npersistence = false\n[mqtt]\nmax_connections = 1\n").await;
    let first = v5::connect_id(broker.addr, "first").await;
    // The broker's bound: 0x89 Server busy (MQTT 5 §3.2.2.2).
    let (_, answer) = v5::open(broker.addr, v5::connect_packet("second")).await;
    match answer {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SERVER_BUSY),
        other => panic!("{other:?}"),
    }
    reload_applying(
        &broker,
        "[storage]\npersistence = false\n[mqtt]\nmax_connections = 2\nmax_qos = 1\n",
        "mqtt.max_connections",
    )
    .await;
    broker
        .wait_log(|l| l.contains("needs a restart: mqtt.max_qos"))
        .await;
    let (second, ack) = v5::connect(broker.addr, v5::connect_packet("second")).await;
    // max_qos was not applied: CONNACK announces no Maximum QoS (2 is the default).
    assert_eq!(ack.properties.maximum_qos, None);
    v5::disconnect(second).await;
    v5::disconnect(first).await;
    assert_no_colour_codes(&broker);
}

/// A v5 client `mortal` with a will on `wills/mortal` and no delay.
async fn connect_mortal(addr: std::net::SocketAddr) -> RawClient {
    let mut mortal = v5::connect_packet("mortal");
    mortal.will = Some(v5::will("wills/mortal", b"gone", QoS::AtLeastOnce, false));
    v5::connect(addr, mortal).await.0
}
