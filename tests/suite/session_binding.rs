//! Sessions belong to the identity that made them (issue 35, finding 2), Mosquitto's
//! `use_username_as_clientid`, and the read ACL checked again on what was queued or in flight
//! under other rules (finding 3). Real sockets against an in-process broker with the shipped
//! example password file (`config/passwd.example`: sensor1, sensor2, dashboard, each with
//! the password `<user>-secret`).
//!
//! Normative statements: MQTT-3.1.4-2 (a CONNECT for a connected client id takes the session
//! over: only for its owner here; the spec lets the server refuse a client it does not
//! authorize, v5 §3.2.2.2 0x87 / 3.1.1 §3.2.2.3 return code 5), MQTT-3.2.2-2 / MQTT-3.2.2-3
//! (Session Present), MQTT-3.1.3-6 / v5 §3.2.2.3.7 (Assigned Client Identifier),
//! MQTT-4.4.0-1 (unacknowledged PUBLISHes are sent again on a resumed session: not one the
//! client may no longer read).

use std::path::{Path, PathBuf};
use std::time::Duration;

use postbox::codec::{Connect, Packet, ProtocolVersion, QoS, ReasonCode};
use postbox::config::{Config, SessionBinding};
use postbox::server::RunningServer;

use crate::common::{self, v5, RawClient, WAIT};

/// Short: only for "must not arrive" checks, after a later message proved the path works.
const QUIET: Duration = Duration::from_millis(300);

fn passwd() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example")
}

fn config(binding: SessionBinding, anonymous: bool) -> Config {
    let mut config = common::test_config();
    config.auth.password_file = Some(passwd());
    config.auth.allow_anonymous = anonymous;
    config.auth.session_binding = binding;
    config
}

/// A v5 CONNECT for a session that outlives the connection, as `user` (password
/// `<user>-secret`) or anonymous.
fn persistent(client: &str, user: Option<&str>) -> Connect {
    let mut c = v5::persistent_connect(client, 3600);
    c.username = user.map(Into::into);
    c.password = user.map(|u| bytes::Bytes::from(format!("{u}-secret")));
    c
}

/// The CONNACK's reason code and Session Present, and the client when it was accepted.
async fn try_connect(server: &RunningServer, connect: Connect) -> (ReasonCode, bool, RawClient) {
    let (c, first) = v5::open(server.mqtt_addr, connect).await;
    match first {
        Some(Packet::ConnAck(ack)) => (ack.reason_code, ack.session_present, c),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

/// [`try_connect`] as `user` (see [`persistent`]), which must be accepted: the client.
async fn connect_ok(server: &RunningServer, client: &str, user: &str) -> RawClient {
    let (code, _, c) = try_connect(server, persistent(client, Some(user))).await;
    assert_eq!(code, ReasonCode::SUCCESS, "{client} as {user}");
    c
}

/// The dashboard (a new connection of its own) sends `commands/sensor1/ping` at QoS 1 (packet
/// id `id`), and the connected `sensor1` receives it (`what` names the wait): sensor1 is still
/// connected and served after what another identity tried.
async fn ping_reaches_sensor1(
    server: &RunningServer,
    sensor1: &mut RawClient,
    id: u16,
    what: &str,
) {
    let (_, _, mut dashboard) = try_connect(server, persistent("dash", Some("dashboard"))).await;
    let command = v5::publish_packet("commands/sensor1/ping", QoS::AtLeastOnce, b"1", id);
    assert_eq!(
        v5::publish(&mut dashboard, command).await,
        ReasonCode::SUCCESS
    );
    let p = next_publish(sensor1, what).await;
    assert_eq!(&*p.topic, "commands/sensor1/ping");
}

/// The next PUBLISH on `c` within `WAIT`, acknowledged (`what` names it when it is missing).
async fn next_publish(c: &mut RawClient, what: &str) -> postbox::codec::Publish {
    tokio::time::timeout(WAIT, v5::receive(c))
        .await
        .expect(what)
}

/// A 3.1.1 CONNECT's return code (the raw CONNACK's last byte).
async fn v311_code(server: &RunningServer, client: &str, user: Option<&str>) -> u8 {
    let version = ProtocolVersion::V3_1_1;
    let mut c = RawClient::open(server.mqtt_addr, version).await;
    let mut connect = persistent(client, user);
    connect.protocol = version;
    connect.properties = Default::default();
    c.send(&Packet::Connect(Box::new(connect))).await;
    let bytes = tokio::time::timeout(WAIT, c.recv_bytes(4))
        .await
        .expect("CONNACK in time");
    assert_eq!(&bytes[..2], &[0x20, 0x02], "{bytes:?}");
    bytes[3]
}

/// sensor1's persistent session subscribed to its commands, with one QoS 1 command queued
/// while it is offline.
async fn queued_command(server: &RunningServer) {
    let mut sensor1 = connect_ok(server, "sensor1", "sensor1").await;
    v5::subscribe(&mut sensor1, "commands/sensor1/#", QoS::AtLeastOnce).await;
    v5::disconnect(sensor1).await;
    let mut dashboard = connect_ok(server, "dash", "dashboard").await;
    let command = v5::publish_packet("commands/sensor1/reboot", QoS::AtLeastOnce, b"now", 1);
    assert_eq!(
        v5::publish(&mut dashboard, command).await,
        ReasonCode::SUCCESS
    );
    v5::disconnect(dashboard).await;
}

#[tokio::test]
async fn another_identity_never_gets_the_owners_queue_nor_kicks_it() {
    let server = common::start_with(config(SessionBinding::Refuse, true)).await;
    queued_command(&server).await;
    // Another user, and an anonymous client, with sensor1's client id: refused, whether they
    // ask to resume (Clean Start 0) or to start over (which would discard the owner's queue).
    for user in [Some("sensor2"), None] {
        for clean in [false, true] {
            let mut connect = persistent("sensor1", user);
            connect.clean_start = clean;
            let (code, present, _) = try_connect(&server, connect).await;
            assert_eq!(code, ReasonCode::NOT_AUTHORIZED, "{user:?} clean {clean}");
            assert!(!present, "MQTT-3.2.2-6: Session Present 0 with a refusal");
        }
        assert_eq!(v311_code(&server, "sensor1", user).await, 5, "{user:?}");
    }
    // The owner resumes its session and gets its command.
    let (code, present, mut sensor1) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!(code, ReasonCode::SUCCESS);
    assert!(present, "MQTT-3.2.2-3: the owner's session is there");
    let p = next_publish(&mut sensor1, "the queued command").await;
    assert_eq!(&*p.topic, "commands/sensor1/reboot");
    // Connected, it is not taken over by another identity (MQTT-3.1.4-2 is for the owner).
    let (code, _, _) = try_connect(&server, persistent("sensor1", Some("sensor2"))).await;
    assert_eq!(code, ReasonCode::NOT_AUTHORIZED);
    ping_reaches_sensor1(&server, &mut sensor1, 2, "still connected and served").await;
    // Its own second connection still takes the session over (MQTT-3.1.4-2).
    let (code, present, _again) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, true));
    v5::expect_disconnect(&mut sensor1, ReasonCode::SESSION_TAKEN_OVER).await;
    let refused = server.broker.metrics.session_binding[0].get();
    assert_eq!(refused, 7, "counted: postbox_session_binding_total");
}

#[tokio::test]
async fn fresh_binding_gives_another_identity_a_clean_session_without_the_queue() {
    let server = common::start_with(config(SessionBinding::Fresh, false)).await;
    queued_command(&server).await;
    let (code, present, mut sensor2) =
        try_connect(&server, persistent("sensor1", Some("sensor2"))).await;
    assert_eq!(code, ReasonCode::SUCCESS);
    assert!(!present, "a fresh session, not the owner's");
    v5::expect_silence(&mut sensor2, QUIET).await;
    // Connected now, sensor2 owns the id: sensor1 may not kick it, even under `fresh`.
    let (code, _, _) = try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!(code, ReasonCode::NOT_AUTHORIZED);
    v5::disconnect(sensor2).await;
    let (code, present, _) = try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, false));
}

#[tokio::test]
async fn an_authenticated_device_replaces_an_anonymous_squatter() {
    let server = common::start_with(config(SessionBinding::Refuse, true)).await;
    let (code, _, mut squatter) = try_connect(&server, persistent("sensor1", None)).await;
    assert_eq!(code, ReasonCode::SUCCESS);
    v5::subscribe(&mut squatter, "commands/#", QoS::AtLeastOnce).await;
    let (code, present, mut sensor1) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, false));
    v5::expect_disconnect(&mut squatter, ReasonCode::SESSION_TAKEN_OVER).await;
    // None of the squatter's subscriptions came with it.
    let (_, _, mut dashboard) = try_connect(&server, persistent("dash", Some("dashboard"))).await;
    let command = v5::publish_packet("commands/sensor2/x", QoS::AtLeastOnce, b"1", 1);
    assert_eq!(
        v5::publish(&mut dashboard, command).await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    v5::expect_silence(&mut sensor1, QUIET).await;
}

#[tokio::test]
async fn the_binding_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(SessionBinding::Refuse, false);
    config.storage.persistence = true;
    config.storage.dir = Some(dir.path().to_path_buf());
    let server = common::start_with(config.clone()).await;
    queued_command(&server).await;
    server.shutdown().await;
    let server = common::start_with(config).await;
    let (code, _, _) = try_connect(&server, persistent("sensor1", Some("sensor2"))).await;
    assert_eq!(code, ReasonCode::NOT_AUTHORIZED, "restored with its owner");
    let (code, present, mut sensor1) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, true));
    let p = next_publish(&mut sensor1, "the queued command").await;
    assert_eq!(&*p.topic, "commands/sensor1/reboot");
}

#[tokio::test]
async fn username_as_client_id_gives_every_user_its_own_session() {
    let mut config = config(SessionBinding::Refuse, true);
    config.listeners[0].use_username_as_clientid = true;
    let server = common::start_with(config).await;
    let mut sensor1 = connect_ok(&server, "whatever", "sensor1").await;
    v5::subscribe(&mut sensor1, "commands/sensor1/#", QoS::AtLeastOnce).await;
    // sensor2 naming sensor1's id gets its own session, under its own name.
    let (c, first) = v5::open(server.mqtt_addr, persistent("sensor1", Some("sensor2"))).await;
    let Some(Packet::ConnAck(ack)) = first else {
        panic!("expected CONNACK, got {first:?}")
    };
    assert_eq!(
        (ack.reason_code, ack.session_present),
        (ReasonCode::SUCCESS, false)
    );
    let assigned = ack.properties.assigned_client_identifier.as_deref();
    assert_eq!(assigned, Some("sensor2"), "v5 §3.2.2.3.7");
    drop(c);
    // sensor1 was not taken over: it still gets its commands.
    ping_reaches_sensor1(&server, &mut sensor1, 1, "still connected").await;
    // No user name, no client id: refused as Mosquitto does.
    let (code, _, _) = try_connect(&server, persistent("anon", None)).await;
    assert_eq!(code, ReasonCode::NOT_AUTHORIZED);
}

/// A user name that becomes the client id (`use_username_as_clientid`) gets the client id's
/// checks: one starting with `$bridge/` (the bridges' own sessions) is refused with 0x85
/// Client Identifier not valid (v5 §3.2.2.2), as that client id would be; before, the check
/// ran on the client id the CONNECT carried, and a user named `$bridge/<name>` (unverified
/// where no method is configured, as in Mosquitto) took that bridge's session (third
/// adversarial pass of issue 35).
#[tokio::test]
async fn a_user_name_used_as_the_client_id_gets_the_client_id_checks() {
    let mut config = common::test_config();
    config.listeners[0].use_username_as_clientid = true;
    let server = common::start_with(config).await;
    let mut connect = v5::persistent_connect("plain", 60);
    connect.username = Some("$bridge/cloud".into());
    let (code, _, _) = try_connect(&server, connect).await;
    assert_eq!(code, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    // An ordinary user name is still the client id.
    let mut connect = v5::persistent_connect("plain", 60);
    connect.username = Some("device-7".into());
    let (code, _, _) = try_connect(&server, connect).await;
    assert_eq!(code, ReasonCode::SUCCESS);
}

/// `auth.client_ids_start_with_user`: an account cannot make a session under another
/// device's client id (CONNACK 0x85, 3.1.1: 2), so it cannot squat the id and keep the device
/// out (with the default binding, the first comer owns the session until it expires; issue
/// 35, fourth adversarial pass). The device's own ids, its user name or that, a colon and
/// more, are admitted (`-` is no separator: user `sensor1` would take user `sensor1-eu`'s
/// id, fifth pass); a broker-assigned id is exempt. With the key off (the default)
/// the squat succeeds and the device is refused: the case this key exists for.
#[tokio::test]
async fn client_ids_that_must_start_with_the_user_keep_squatters_off_a_devices_id() {
    // The default: sensor2 takes sensor1's id first, and sensor1 is then refused.
    let server = common::start_with(config(SessionBinding::Refuse, false)).await;
    let squatter = connect_ok(&server, "sensor1", "sensor2").await;
    drop(squatter);
    let (code, _, _) = try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!(code, ReasonCode::NOT_AUTHORIZED, "the squatter owns the id");

    let mut rule = config(SessionBinding::Refuse, false);
    rule.auth.client_ids_start_with_user = true;
    let server = common::start_with(rule).await;
    for id in [
        "sensor1",
        "sensor1:backup",
        "sensor10",
        "sensor2-x",
        "sensor2/x",
    ] {
        let (code, _, _) = try_connect(&server, persistent(id, Some("sensor2"))).await;
        assert_eq!(
            code,
            ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            "sensor2 as {id}"
        );
    }
    assert_eq!(v311_code(&server, "sensor1", Some("sensor2")).await, 2);
    for id in ["sensor1", "sensor1:backup", "sensor1:7:a"] {
        let (code, _, c) = try_connect(&server, persistent(id, Some("sensor1"))).await;
        assert_eq!(code, ReasonCode::SUCCESS, "sensor1 as {id}");
        v5::disconnect(c).await;
    }
    // An id the broker assigns (an empty client id) is not the client's choice.
    let mut assigned = v5::connect_packet("");
    assigned.username = Some("sensor2".into());
    assigned.password = Some(bytes::Bytes::from_static(b"sensor2-secret"));
    let (code, _, _) = try_connect(&server, assigned).await;
    assert_eq!(code, ReasonCode::SUCCESS, "an assigned id");
}

/// With `auth.client_ids_start_with_user`, a client no method authenticated may not take a
/// password-file user's id either, `sensor1` or `sensor1:...` (CONNACK 0x85, 3.1.1: 2;
/// MQTT-3.1.3-8: the server may reject a client id with 0x85), so an id names one user for strangers
/// too; other ids, and an id the broker assigns, are theirs. Before, an anonymous client
/// connected as `sensor1` and, with `%c` rules, read and forged the device's topics (issue 35,
/// sixth adversarial pass, finding 11).
#[tokio::test]
async fn an_anonymous_client_may_not_take_a_users_client_id() {
    let mut rule = config(SessionBinding::Refuse, true);
    rule.auth.client_ids_start_with_user = true;
    let server = common::start_with(rule).await;
    for id in ["sensor1", "sensor1:main", "dashboard"] {
        let (code, _, _) = try_connect(&server, persistent(id, None)).await;
        assert_eq!(
            code,
            ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            "anonymous as {id}"
        );
    }
    assert_eq!(v311_code(&server, "sensor1", None).await, 2);
    for id in ["sensor10", "kiosk", ""] {
        let (code, _, c) = try_connect(&server, persistent(id, None)).await;
        assert_eq!(code, ReasonCode::SUCCESS, "anonymous as {id:?}");
        v5::disconnect(c).await;
    }
}

const ACL: &str = "\
user dashboard
topic read sensors/#
topic write sensors/#
";

/// A queued message, and one in flight unacknowledged, for the dashboard's persistent session
/// on `sensors/sensor1/…`; then the ACL takes `sensors/sensor1/#` from it (SIGHUP's reload):
/// neither is delivered when it comes back (Mosquitto delivers none either), and both are
/// dead-lettered as `not_authorized` (a PUBACK promised them).
#[tokio::test]
async fn queued_and_in_flight_messages_follow_an_acl_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = common::test_config();
    let acl = common::set_acl(&mut config, dir.path(), ACL);
    let server = common::start_with(config).await;
    let dashboard = || {
        let mut c = v5::persistent_connect("dash", 3600);
        c.username = Some("dashboard".into());
        c
    };
    let (mut dash, _) = v5::connect(server.mqtt_addr, dashboard()).await;
    v5::subscribe(&mut dash, "sensors/#", QoS::AtLeastOnce).await;
    let mut publisher = {
        let mut c = v5::connect_packet("pub");
        c.username = Some("dashboard".into());
        v5::connect(server.mqtt_addr, c).await.0
    };
    let first = v5::publish_packet("sensors/sensor1/t", QoS::AtLeastOnce, b"in-flight", 1);
    assert_eq!(
        v5::publish(&mut publisher, first).await,
        ReasonCode::SUCCESS
    );
    let p = tokio::time::timeout(WAIT, v5::expect_publish(&mut dash))
        .await
        .expect("delivered once");
    assert_eq!(&*p.payload, b"in-flight");
    // Gone without its PUBACK: in flight. The broker detaches the session before it closes
    // the socket, so it is offline once the close arrives.
    v5::disconnect(dash).await;
    let second = v5::publish_packet("sensors/sensor1/t", QoS::AtLeastOnce, b"queued", 2);
    assert_eq!(
        v5::publish(&mut publisher, second).await,
        ReasonCode::SUCCESS
    );
    std::fs::write(&acl, format!("{ACL}topic deny sensors/sensor1/#\n")).expect("write acl");
    assert_eq!(server.reload().reloaded.len(), 1);
    let allowed = v5::publish_packet("sensors/sensor2/t", QoS::AtLeastOnce, b"allowed", 3);
    assert_eq!(
        v5::publish(&mut publisher, allowed).await,
        ReasonCode::SUCCESS
    );
    let (mut dash, ack) = v5::connect(server.mqtt_addr, dashboard()).await;
    assert!(ack.session_present);
    // The first thing it gets is the message it may still read.
    let p = next_publish(&mut dash, "the allowed message").await;
    assert_eq!(
        (&*p.topic, &*p.payload),
        ("sensors/sensor2/t", &b"allowed"[..])
    );
    v5::expect_silence(&mut dash, QUIET).await;
    let dead = server.broker.guarantee_metrics().dead_letters
        [postbox::test_support::guarantees::DeadReason::NotAuthorized.index()]
    .get();
    assert_eq!(dead, 2, "both dead-lettered as not_authorized");
}

/// The password file and the shipped example ACL (`config/acl.example`: devices read
/// `commands/<user>/#`, the dashboard writes `commands/#`), persistence in `dir`.
fn durable_with_acl(dir: &Path) -> Config {
    let mut config = config(SessionBinding::Refuse, false);
    config.auth.acl_file = Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/acl.example"));
    config.storage.persistence = true;
    config.storage.dir = Some(dir.to_path_buf());
    config
}

/// After a restart, a QoS 1 command the dashboard publishes (and is acknowledged) for a
/// device whose session the store brought back reaches the device when it comes back. Before,
/// the restored session was anonymous for the ACL until its client connected, and the command
/// was dropped as a denied read although its PUBACK had promised it (issue 35, fifth
/// adversarial pass; MQTT-4.3.2-2 / MQTT-4.5.0-1: an acknowledged QoS 1 message is delivered
/// to the matching subscriptions). What the ACL denies the device is still not delivered:
/// reads are checked as the queue is handed out, under the identity it connects with.
#[tokio::test]
async fn a_restored_session_gets_the_commands_published_for_it_before_its_device_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = common::start_with(durable_with_acl(dir.path())).await;
    let mut sensor1 = connect_ok(&server, "sensor1", "sensor1").await;
    // Granted in part: `commands/sensor1/#` is readable, the rest of `commands/#` is not.
    v5::subscribe(&mut sensor1, "commands/#", QoS::AtLeastOnce).await;
    v5::disconnect(sensor1).await;
    server.shutdown().await;

    let server = common::start_with(durable_with_acl(dir.path())).await;
    let mut dashboard = connect_ok(&server, "dash", "dashboard").await;
    for (id, topic) in [
        (1, "commands/sensor2/reboot"),
        (2, "commands/sensor1/reboot"),
    ] {
        let command = v5::publish_packet(topic, QoS::AtLeastOnce, b"now", id);
        assert_eq!(
            v5::publish(&mut dashboard, command).await,
            ReasonCode::SUCCESS,
            "{topic}"
        );
    }
    let (code, present, mut sensor1) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, true));
    let p = next_publish(&mut sensor1, "the command published after the restart").await;
    assert_eq!(&*p.topic, "commands/sensor1/reboot");
    v5::expect_silence(&mut sensor1, QUIET).await;
}

/// A persistent session with one QoS 1 command queued, stored by a broker without any
/// authentication method (every session unbound) in `dir`.
async fn stored_before_authentication(dir: &Path) {
    let mut config = common::test_config();
    config.storage.persistence = true;
    config.storage.dir = Some(dir.to_path_buf());
    let server = common::start_with(config).await;
    let (mut device, _) =
        v5::connect(server.mqtt_addr, v5::persistent_connect("sensor1", 3600)).await;
    v5::subscribe(&mut device, "commands/sensor1/#", QoS::AtLeastOnce).await;
    v5::disconnect(device).await;
    let mut publisher = v5::connect_id(server.mqtt_addr, "ops").await;
    let command = v5::publish_packet("commands/sensor1/unlock", QoS::AtLeastOnce, b"4711", 1);
    assert_eq!(
        v5::publish(&mut publisher, command).await,
        ReasonCode::SUCCESS
    );
    server.shutdown().await;
}

/// Sessions stored before a method was configured belong to nobody anyone can prove: after
/// the password file is turned on, only the user whose name is the client id resumes one (and
/// gets its queue); another account, or an anonymous client, gets a clean session with none
/// of it. Before, whoever came first resumed it and read the device's queue (issue 35, fifth
/// adversarial pass). Normative: MQTT-3.2.2-2 / MQTT-3.2.2-3 (Session Present says which).
#[tokio::test]
async fn a_session_stored_before_authentication_is_resumed_only_by_the_user_it_names() {
    for first in [None, Some("sensor2"), Some("sensor1")] {
        let dir = tempfile::tempdir().expect("tempdir");
        stored_before_authentication(dir.path()).await;
        let mut config = config(SessionBinding::Refuse, true);
        config.storage.persistence = true;
        config.storage.dir = Some(dir.path().to_path_buf());
        let server = common::start_with(config).await;
        let (code, present, mut c) = try_connect(&server, persistent("sensor1", first)).await;
        assert_eq!(code, ReasonCode::SUCCESS, "{first:?}");
        if first == Some("sensor1") {
            assert!(present, "the device resumes its session");
            let p = next_publish(&mut c, "its queued command").await;
            assert_eq!(&*p.payload, b"4711");
        } else {
            assert!(!present, "{first:?} resumed the device's session");
            v5::expect_silence(&mut c, QUIET).await;
        }
        server.shutdown().await;
    }
}

/// `connect` (sensor2's) with a retained QoS 1 will on `topic` (payload `id`) delayed `delay`
/// seconds, which must be accepted: the client, to be dropped (an abnormal end) or kept
/// connected over a shutdown.
async fn arm_will(
    server: &RunningServer,
    id: &str,
    topic: &str,
    delay: u32,
    mut connect: Connect,
) -> RawClient {
    connect.will = Some(postbox::codec::LastWill {
        topic: topic.into(),
        payload: bytes::Bytes::copy_from_slice(id.as_bytes()),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: postbox::codec::WillProperties {
            will_delay_interval: Some(delay),
            ..Default::default()
        },
    });
    let (code, _, c) = try_connect(server, connect).await;
    assert_eq!(code, ReasonCode::SUCCESS, "{id}");
    c
}

/// A new subscriber of sensor1's commands gets nothing: no retained message was kept there.
async fn no_retained_command_for_sensor1(server: &RunningServer) {
    let mut later = connect_ok(server, "sensor1b", "sensor1").await;
    v5::subscribe(&mut later, "commands/sensor1/#", QoS::AtLeastOnce).await;
    v5::expect_silence(&mut later, QUIET).await;
}

/// A delayed will that a restart kept is published only where its owner may write, as
/// without the restart: sensor2's will on its own topic arrives, its will on sensor1's
/// commands (retained) does not, neither live nor as a retained message (issue 35, sixth
/// adversarial pass: a restored will was published unchecked, so any client could write
/// anywhere by arming a will and waiting for a restart). MQTT-3.1.2-8 (the will is published
/// after its delay); the ACL applies to a will as to its client's PUBLISH (MQTT 5 §5.4.2).
#[tokio::test]
async fn a_will_kept_over_a_restart_is_published_only_where_its_owner_may_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = common::start_with(durable_with_acl(dir.path())).await;
    let mut armed = Vec::new();
    for (id, topic) in [
        ("s2-own", "sensors/sensor2/status"),
        ("s2-forged", "commands/sensor1/reboot"),
    ] {
        armed.push(arm_will(&server, id, topic, 2, persistent(id, Some("sensor2"))).await);
    }
    // Stopped while they are connected: their delayed wills are stored for after the restart.
    server.shutdown().await;
    drop(armed);
    let server = common::start_with(durable_with_acl(dir.path())).await;
    let mut dash = connect_ok(&server, "dash", "dashboard").await;
    v5::subscribe(&mut dash, "sensors/#", QoS::AtLeastOnce).await;
    let mut sensor1 = connect_ok(&server, "sensor1", "sensor1").await;
    v5::subscribe(&mut sensor1, "commands/sensor1/#", QoS::AtLeastOnce).await;
    let own = next_publish(&mut dash, "sensor2's will on its own topic").await;
    assert_eq!(&*own.topic, "sensors/sensor2/status");
    v5::expect_silence(&mut sensor1, QUIET).await;
    // Nor kept as a retained message for later subscribers.
    no_retained_command_for_sensor1(&server).await;
}

/// A delayed will whose session expired while the broker was down is due at the restart; it
/// is checked under that session's owner, as the will of a session still there is: sensor2's
/// will on its own topic is published, its will on sensor1's commands is not (issue 35, sixth
/// adversarial pass). MQTT-3.1.2-8 (a delayed will is published when the session ends, if
/// that is before its delay); the ACL applies to a will as to its client's PUBLISH (MQTT 5
/// §5.4.2). The readers' sessions outlive the downtime, so what is published before they
/// reconnect is queued for them.
#[tokio::test]
async fn a_will_whose_session_expired_during_a_restart_is_checked_under_its_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = common::start_with(durable_with_acl(dir.path())).await;
    for (id, user, filter) in [
        ("dash", "dashboard", "sensors/#"),
        ("sensor1", "sensor1", "commands/sensor1/#"),
    ] {
        let (code, _, mut c) = try_connect(&server, persistent(id, Some(user))).await;
        assert_eq!(code, ReasonCode::SUCCESS);
        v5::subscribe(&mut c, filter, QoS::AtLeastOnce).await;
        v5::disconnect(c).await;
    }
    let mut armed = Vec::new();
    for (id, topic) in [
        ("s2-forged", "commands/sensor1/reboot"),
        ("s2-own", "sensors/sensor2/status"),
    ] {
        let mut connect = persistent(id, Some("sensor2"));
        // The session ends 1 s after its connection, long before the will's delay.
        connect.properties.session_expiry_interval = Some(1);
        armed.push(arm_will(&server, id, topic, 600, connect).await);
    }
    server.shutdown().await;
    drop(armed);
    // Down for longer than their sessions last (the scenario, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let server = common::start_with(durable_with_acl(dir.path())).await;
    let (code, present, mut dash) =
        try_connect(&server, persistent("dash", Some("dashboard"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, true));
    let own = next_publish(&mut dash, "sensor2's will on its own topic").await;
    assert_eq!(&*own.topic, "sensors/sensor2/status");
    let (code, present, mut sensor1) =
        try_connect(&server, persistent("sensor1", Some("sensor1"))).await;
    assert_eq!((code, present), (ReasonCode::SUCCESS, true));
    v5::expect_silence(&mut sensor1, QUIET).await;
    no_retained_command_for_sensor1(&server).await;
}
