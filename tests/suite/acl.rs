//! `auth.acl_file`: authorisation from a Mosquitto-format ACL, against the real broker over
//! real sockets (raw v5 / 3.1.1 clients, `mosquitto_sub` / `mosquitto_pub` with `-u`).
//!
//! Normative statements: MQTT-3.9.3 / v5 §3.9.3 (SUBACK 0x87 Not authorized; 3.1.1 0x80
//! Failure, MQTT-3.9.3-2 return codes), v5 §3.4.2.1 (PUBACK 0x87), MQTT-4.7.2-1 (`#` / `+`
//! never match `$` topics), MQTT-3.3.1-5/-6 (retained messages on subscribe), MQTT-3.1.2-8
//! (the will).

use std::path::Path;
use std::time::Duration;

use postbox::codec::{Packet, ProtocolVersion, QoS, ReasonCode, SubscriptionOptions};
use postbox::server::RunningServer;

use crate::common::{self, v5, RawClient, WAIT};

const ACL: &str = "\
# anonymous clients
topic read public/#

pattern readwrite sensors/%u/#
pattern read commands/%u/#

user dashboard
topic read sensors/#
topic write commands/#
topic deny sensors/secret/#
topic read $SYS/#

user admin
topic readwrite #
";

/// Short: only for \"must not arrive\" checks, after a later message proved the path works.
const QUIET: Duration = Duration::from_millis(300);

async fn start(dir: &Path, acl: &str) -> RunningServer {
    let mut config = common::test_config();
    common::set_acl(&mut config, dir, acl);
    common::start_with(config).await
}

/// [`start`] with the file's [`ACL`] in a fresh directory (kept alive by the caller, which may
/// rewrite the ACL there for a reload).
async fn start_acl() -> (tempfile::TempDir, RunningServer) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), ACL).await;
    (dir, server)
}

fn connect_packet(
    version: ProtocolVersion,
    client: &str,
    user: Option<&str>,
) -> postbox::codec::Connect {
    postbox::codec::Connect {
        username: user.map(Into::into),
        ..common::connect_packet(version, client)
    }
}

async fn connect(
    server: &RunningServer,
    version: ProtocolVersion,
    client: &str,
    user: Option<&str>,
) -> RawClient {
    connect_to(server.mqtt_addr, version, client, user).await
}

/// [`connect`] to any broker's address (the in-process server's or the binary's); the CONNACK
/// must be a success.
async fn connect_to(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    client: &str,
    user: Option<&str>,
) -> RawClient {
    let mut c = RawClient::open(addr, version).await;
    c.send(&Packet::Connect(Box::new(connect_packet(
        version, client, user,
    ))))
    .await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code.0, 0, "CONNACK"),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    c
}

async fn suback(c: &mut RawClient, filter: &str) -> ReasonCode {
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..Default::default()
    };
    let ack = v5::subscribe_with(c, filter, options, None).await;
    ack.reason_codes[0]
}

async fn publish(c: &mut RawClient, topic: &str, payload: &str, retain: bool) -> ReasonCode {
    let mut p = v5::publish_packet(topic, QoS::AtLeastOnce, payload.as_bytes(), 9);
    p.retain = retain;
    match v5::publish(c, p).await {
        // Accepted; whether anyone subscribes is not what these tests look at.
        ReasonCode::NO_MATCHING_SUBSCRIBERS => ReasonCode::SUCCESS,
        code => code,
    }
}

/// The next PUBLISH's topic and payload (acknowledged).
async fn next(c: &mut RawClient) -> (String, String) {
    let p = tokio::time::timeout(WAIT, v5::receive(c))
        .await
        .expect("a PUBLISH in time");
    (
        p.topic.to_string(),
        String::from_utf8_lossy(&p.payload).into_owned(),
    )
}

/// [`suback`] must be `code` (the granted QoS or a refusal).
async fn expect_suback(c: &mut RawClient, filter: &str, code: ReasonCode) {
    assert_eq!(suback(c, filter).await, code, "SUBSCRIBE {filter}");
}

/// [`publish`] must be answered `code`.
async fn expect_publish(
    c: &mut RawClient,
    topic: &str,
    payload: &str,
    retain: bool,
    code: ReasonCode,
) {
    assert_eq!(
        publish(c, topic, payload, retain).await,
        code,
        "PUBLISH {topic} {payload}"
    );
}

/// A non-retained PUBLISH the ACL lets through: acknowledged with success (also what a 3.1.1
/// client hears for a denied one, which it cannot be told about).
async fn publish_ok(c: &mut RawClient, topic: &str, payload: &str) {
    expect_publish(c, topic, payload, false, ReasonCode::SUCCESS).await;
}

/// A non-retained PUBLISH the ACL refuses: v5 PUBACK 0x87 Not authorized (§3.4.2.1).
async fn publish_denied(c: &mut RawClient, topic: &str, payload: &str) {
    expect_publish(c, topic, payload, false, ReasonCode::NOT_AUTHORIZED).await;
}

/// The next PUBLISH ([`next`]) must be `payload` on `topic`.
async fn expect_next(c: &mut RawClient, topic: &str, payload: &str) {
    assert_eq!(next(c).await, (topic.into(), payload.into()));
}

/// [`expect_next`], and nothing after it within [`QUIET`]: the one message that got through.
async fn expect_only(c: &mut RawClient, topic: &str, payload: &str) {
    expect_next(c, topic, payload).await;
    v5::expect_silence(c, QUIET).await;
}

/// The `dashboard` user (v5, client id `d1`), subscribed to `filter` with QoS 1 granted.
async fn dashboard(server: &RunningServer, filter: &str) -> RawClient {
    let mut dash = connect(server, V5, "d1", Some("dashboard")).await;
    expect_suback(&mut dash, filter, ReasonCode(1)).await;
    dash
}

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

#[tokio::test]
async fn subscribe_allowed_and_denied_per_topic_and_pattern() {
    let (_dir, server) = start_acl().await;
    let mut alice = connect(&server, V5, "a1", Some("alice")).await;
    assert_eq!(
        suback(&mut alice, "sensors/alice/#").await,
        ReasonCode(1),
        "pattern %u"
    );
    assert_eq!(
        suback(&mut alice, "commands/alice/#").await,
        ReasonCode(1),
        "pattern read"
    );
    expect_suback(&mut alice, "sensors/bob/#", ReasonCode::NOT_AUTHORIZED).await;
    expect_suback(&mut alice, "other/#", ReasonCode::NOT_AUTHORIZED).await;
    // 3.1.1: the only failure code is 0x80 (MQTT-3.9.3-2 list).
    let mut old = connect(&server, V311, "a2", Some("alice")).await;
    expect_suback(&mut old, "sensors/bob/#", ReasonCode(0x80)).await;
    expect_suback(&mut old, "sensors/alice/x", ReasonCode(1)).await;
    // A user not named in the file gets only the patterns.
    let mut carol = connect(&server, V5, "c1", Some("carol")).await;
    expect_suback(&mut carol, "public/#", ReasonCode::NOT_AUTHORIZED).await;
    expect_suback(&mut carol, "sensors/carol/t", ReasonCode(1)).await;
}

#[tokio::test]
async fn anonymous_lines_and_no_username_never_matches_percent_u() {
    let (_dir, server) = start_acl().await;
    let mut anon = connect(&server, V5, "n1", None).await;
    expect_suback(&mut anon, "public/#", ReasonCode(1)).await;
    expect_suback(&mut anon, "sensors/+/t", ReasonCode::NOT_AUTHORIZED).await;
    expect_suback(&mut anon, "sensors/%u/t", ReasonCode::NOT_AUTHORIZED).await;
    publish_denied(&mut anon, "sensors/x/t", "p").await;
    assert_eq!(
        publish(&mut anon, "public/x", "p", false).await,
        ReasonCode::NOT_AUTHORIZED,
        "read only"
    );
}

#[tokio::test]
async fn denied_publish_is_refused_v5_and_dropped_v311() {
    let (_dir, server) = start_acl().await;
    let mut dash = dashboard(&server, "sensors/#").await;
    let mut alice = connect(&server, V5, "a1", Some("alice")).await;
    publish_denied(&mut alice, "sensors/bob/t", "v5-denied").await;
    let mut old = connect(&server, V311, "a2", Some("alice")).await;
    // 3.1.1: acknowledged (no way to refuse) and dropped.
    publish_ok(&mut old, "sensors/bob/t", "v3-denied").await;
    let mut q0 = v5::publish_packet("sensors/bob/t", QoS::AtMostOnce, b"q0-denied", 0);
    q0.retain = false;
    v5::publish(&mut old, q0).await;
    publish_ok(&mut old, "sensors/alice/t", "allowed").await;
    // The first message the dashboard sees is the allowed one: none of the denied got through.
    expect_only(&mut dash, "sensors/alice/t", "allowed").await;
}

#[tokio::test]
async fn retained_messages_obey_read_rules() {
    let (_dir, server) = start_acl().await;
    let mut alice = connect(&server, V5, "a1", Some("alice")).await;
    expect_publish(
        &mut alice,
        "sensors/alice/r",
        "kept",
        true,
        ReasonCode::SUCCESS,
    )
    .await;
    // Denied publishes are never retained.
    expect_publish(
        &mut alice,
        "sensors/bob/r",
        "not-kept",
        true,
        ReasonCode::NOT_AUTHORIZED,
    )
    .await;
    // bob's `sensors/+/r` is granted (his own level is readable) but alice's retained message
    // is not his to read.
    let mut bob = connect(&server, V5, "b1", Some("bob")).await;
    expect_suback(&mut bob, "sensors/+/r", ReasonCode(1)).await;
    v5::expect_silence(&mut bob, QUIET).await;
    let mut dash = dashboard(&server, "sensors/+/r").await;
    expect_only(&mut dash, "sensors/alice/r", "kept").await;
}

#[tokio::test]
async fn will_to_a_denied_topic_is_never_delivered() {
    let (_dir, server) = start_acl().await;
    let mut dash = dashboard(&server, "sensors/#").await;
    for (topic, payload) in [
        ("sensors/bob/will", "denied-will"),
        ("sensors/alice/will", "allowed-will"),
    ] {
        let mut connect = connect_packet(V5, "a1", Some("alice"));
        connect.will = Some(v5::will(topic, payload.as_bytes(), QoS::AtLeastOnce, false));
        let (c, first) = v5::open(server.mqtt_addr, connect).await;
        assert!(
            matches!(first, Some(Packet::ConnAck(ref a)) if a.reason_code.0 == 0),
            "{first:?}"
        );
        drop(c); // abnormal close: the will is due (MQTT-3.1.2-8)
    }
    expect_only(&mut dash, "sensors/alice/will", "allowed-will").await;
}

#[tokio::test]
async fn partly_allowed_filter_is_granted_and_filtered_at_delivery() {
    let (_dir, server) = start_acl().await;
    let mut dash = dashboard(&server, "sensors/#").await;
    expect_suback(&mut dash, "sensors/secret/#", ReasonCode::NOT_AUTHORIZED).await;
    let mut admin = connect(&server, V5, "x1", Some("admin")).await;
    publish_ok(&mut admin, "sensors/secret/k", "secret").await;
    publish_ok(&mut admin, "sensors/open/k", "open").await;
    expect_only(&mut dash, "sensors/open/k", "open").await;
}

#[tokio::test]
async fn sys_topics_only_where_the_acl_says() {
    let (_dir, server) = start_acl().await;
    let mut admin = connect(&server, V5, "x1", Some("admin")).await;
    // MQTT-4.7.2-1: admin's `#` rule does not reach `$SYS`.
    expect_suback(&mut admin, "$SYS/#", ReasonCode::NOT_AUTHORIZED).await;
    let mut dash = dashboard(&server, "$SYS/#").await;
    // No client publishes to `$SYS`, not even one the ACL lets read it.
    publish_denied(&mut dash, "$SYS/fake", "x").await;
    publish_denied(&mut admin, "$SYS/fake", "x").await;
    // The broker's own `$SYS` values reach the dashboard; the forged one never does.
    let mut got = Vec::new();
    while let Ok(Some(packet)) = dash.recv_within(QUIET).await {
        if let Packet::Publish(p) = packet {
            got.push(p.topic.to_string());
        }
    }
    assert!(got.iter().all(|t| t != "$SYS/fake"), "{got:?}");
    assert!(got.iter().all(|t| t.starts_with("$SYS/broker/")), "{got:?}");
}

#[tokio::test]
async fn reload_applies_new_rules_without_dropping_anyone() {
    let (dir, server) = start_acl().await;
    let mut dash = dashboard(&server, "sensors/#").await;
    let mut alice = connect(&server, V5, "a1", Some("alice")).await;
    publish_denied(&mut alice, "extra/x", "before").await;
    // A bad file keeps the running ACL.
    std::fs::write(dir.path().join("acl"), "topic read ok/#\nbogus line\n").expect("write");
    let report = server.reload();
    assert_eq!(report.kept.len(), 1, "{report:?}");
    assert!(
        report.kept[0].1.contains(":2:"),
        "names the line: {report:?}"
    );
    publish_ok(&mut alice, "sensors/alice/t", "still").await;
    expect_next(&mut dash, "sensors/alice/t", "still").await;
    // Denied again just before the reload: the connection remembers this topic's answer
    // (`client::write_memo`), which the reload must make stale.
    publish_denied(&mut alice, "extra/x", "denied").await;
    // New rules: alice may write `extra/#`; the dashboard loses `sensors/alice/#`.
    let changed = format!("{ACL}\nuser alice\ntopic write extra/#\n").replace(
        "topic deny sensors/secret/#",
        "topic deny sensors/secret/#\ntopic deny sensors/alice/#",
    );
    std::fs::write(dir.path().join("acl"), changed).expect("write");
    let report = server.reload();
    assert_eq!(report.reloaded.len(), 1, "{report:?}");
    publish_ok(&mut alice, "extra/x", "after").await;
    // The dashboard's subscription, fully granted under the old ACL, is re-checked.
    publish_ok(&mut alice, "sensors/alice/t", "now-denied").await;
    let mut admin = connect(&server, V5, "x1", Some("admin")).await;
    publish_ok(&mut admin, "sensors/bob/t", "ok").await;
    expect_next(&mut dash, "sensors/bob/t", "ok").await;
}

#[tokio::test]
async fn mosquitto_clients_with_username() {
    use crate::common::mosquitto::{mosquitto_pub, MosquittoSub};
    let (_dir, server) = start_acl().await;
    let port = server.mqtt_addr.port();
    let mut sub = MosquittoSub::spawn(
        port,
        &[
            "-V",
            "mqttv311",
            "-u",
            "dashboard",
            "-t",
            "sensors/#",
            "-q",
            "1",
            "-C",
            "1",
            "-F",
            "MSG|%t|%p",
        ],
    );
    sub.wait_for("SUBACK").await;
    // The denied one first: had it got through, the subscriber's one message would be it.
    for (topic, message) in [("sensors/bob/t", "denied"), ("sensors/alice/t", "allowed")] {
        let args = [
            "-V", "mqttv311", "-u", "alice", "-t", topic, "-m", message, "-q", "1",
        ];
        mosquitto_pub(port, &args).await;
    }
    assert_eq!(sub.wait_for("MSG|").await, "MSG|sensors/alice/t|allowed");
    sub.exit_ok().await;
}

#[tokio::test]
async fn bad_acl_line_stops_the_start_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::test_config();
    let path = common::set_acl(&mut config, dir.path(), "# ok\ntopic read a/#/b\n");
    let err = postbox::server::start(config)
        .await
        .expect_err("must not start");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
}

/// The real binary: SIGHUP re-reads the ACL; the connected client is not dropped and its next
/// PUBLISH is judged by the new file.
#[tokio::test]
async fn sighup_reloads_the_acl_of_the_binary() {
    use crate::common::process::{write_config_with, Broker};
    let dir = tempfile::tempdir().expect("tempdir");
    let acl = dir.path().join("acl");
    std::fs::write(&acl, ACL).expect("write acl");
    let config = write_config_with(
        dir.path(),
        &dir.path().join("data"),
        &format!("\n[auth]\nacl_file = {acl:?}\n"),
    );
    let broker = Broker::start(&config);
    let mut c = connect_to(config.mqtt, V5, "a1", Some("alice")).await;
    publish_denied(&mut c, "extra/x", "before").await;
    std::fs::write(&acl, format!("{ACL}\nuser alice\ntopic write extra/#\n")).expect("write");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &broker.pid().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(status.success());
    // Bounded wait for the broker's own word that it swapped the ACL in.
    let deadline = std::time::Instant::now() + WAIT;
    while !broker.log().iter().any(|l| l.contains("ACL reloaded")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no reload: {:?}",
            broker.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish_ok(&mut c, "extra/x", "after").await;
    broker.terminate();
}

/// A session resumed by another user keeps its subscriptions, but they now deliver only what
/// the new user may read (the grant was made for the old one).
#[tokio::test]
async fn resumed_session_of_another_user_is_checked_for_the_new_one() {
    let (_dir, server) = start_acl().await;
    let persistent = |user: &str| {
        let mut c = connect_packet(V5, "shared-id", Some(user));
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(300);
        c
    };
    let (mut alice, _) = v5::connect(server.mqtt_addr, persistent("alice")).await;
    expect_suback(&mut alice, "sensors/alice/#", ReasonCode(1)).await;
    v5::disconnect(alice).await;
    let (mut bob, ack) = v5::connect(server.mqtt_addr, persistent("bob")).await;
    assert!(ack.session_present, "MQTT-3.2.2-2");
    expect_suback(&mut bob, "sensors/bob/#", ReasonCode(1)).await;
    let mut admin = connect(&server, V5, "x1", Some("admin")).await;
    publish_ok(&mut admin, "sensors/alice/t", "alice-only").await;
    publish_ok(&mut admin, "sensors/bob/t", "bob").await;
    expect_only(&mut bob, "sensors/bob/t", "bob").await;
}

#[tokio::test]
async fn shared_group_picks_a_member_that_may_read() {
    // MQTT 5 §4.8.2: each message goes to one member of each group; with an ACL, only to a
    // member that may read it. A group none of whose members may read it gets no copy.
    let dir = tempfile::tempdir().expect("tempdir");
    let acl = "user alice\ntopic read jobs/#\nuser bob\ntopic read jobs/public/#\n\
               user boss\ntopic write jobs/#\n";
    let server = start(dir.path(), acl).await;
    let mut alice = connect(&server, V5, "sa", Some("alice")).await;
    let mut bob = connect(&server, V5, "sb", Some("bob")).await;
    expect_suback(&mut alice, "$share/g/jobs/#", ReasonCode(1)).await;
    // Partly readable for bob: granted, filtered per message.
    expect_suback(&mut bob, "$share/g/jobs/#", ReasonCode(1)).await;
    let mut lone = connect(&server, V5, "sl", Some("bob")).await;
    expect_suback(&mut lone, "$share/h/jobs/#", ReasonCode(1)).await;
    let mut boss = connect(&server, V5, "sx", Some("boss")).await;
    // Round-robin would hand bob every other one; he may read none of them.
    for i in 0..6 {
        let topic = format!("jobs/secret/{i}");
        publish_ok(&mut boss, &topic, "s").await;
    }
    for i in 0..6 {
        assert_eq!(
            next(&mut alice).await,
            (format!("jobs/secret/{i}"), "s".into()),
            "every secret job reaches alice"
        );
    }
    // Group h (bob alone) got none of the secret ones: its first message is the public one.
    publish_ok(&mut boss, "jobs/public/p", "p").await;
    expect_next(&mut lone, "jobs/public/p", "p").await;
}

/// Where an authentication method is configured, `%c` does not stand for the client id of a
/// client no method authenticated (as `%u` stands for nothing without a user name): its id is
/// whatever it chose. With `pattern readwrite clients/%c/#` and anonymous clients let in, a
/// stranger connecting as `kiosk` is refused `clients/kiosk/#` (SUBACK 0x87, v5 §3.9.3) and
/// its PUBLISH there (PUBACK 0x87, v5 §3.4.2.1), while `sensor1`, whom the password file
/// verified, has its own. Before, the stranger took a device's id and read and forged its
/// topics (issue 35, sixth adversarial pass, finding 11).
#[tokio::test]
async fn percent_c_does_not_stand_for_the_client_id_of_a_stranger() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("acl");
    std::fs::write(&path, "pattern readwrite clients/%c/#\n").expect("write acl");
    let mut config = common::test_config();
    config.auth.acl_file = Some(path);
    config.auth.password_file =
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example"));
    config.auth.allow_anonymous = true;
    let server = common::start_with(config).await;

    let mut stranger = v5::connect_id(server.mqtt_addr, "kiosk").await;
    let ack = v5::subscribe_with(
        &mut stranger,
        "clients/kiosk/#",
        SubscriptionOptions::default(),
        None,
    )
    .await;
    assert_eq!(ack.reason_codes, [ReasonCode::NOT_AUTHORIZED]);
    assert_eq!(
        v5::publish_qos1(&mut stranger, "clients/kiosk/state", b"forged", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );

    let mut connect = v5::connect_packet("sensor1");
    connect.username = Some("sensor1".into());
    connect.password = Some(bytes::Bytes::from_static(b"sensor1-secret"));
    let (mut device, ack) = v5::connect(server.mqtt_addr, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    v5::subscribe(&mut device, "clients/sensor1/#", QoS::AtLeastOnce).await;
}
