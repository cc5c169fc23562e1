//! JWT as password (`[auth.jwt]`, issue 13) through the real `postbox` binary. Tokens are
//! made here with the `openssl` command line (not with the broker's library), signed with the
//! development keys in `certs/jwt/`. A valid token lets a real client (`mosquitto_pub`, and a
//! raw MQTT 5 client) in under the token's user name; an expired one, one signed by another
//! key and one whose user name disagrees with the CONNECT's are refused with 0x86 Bad User
//! Name or Password (3.1.1: return code 4), MQTT-3.1.4-2 and v5 §3.2.2.2. A token that
//! expires while its client is connected ends the connection: v5 with DISCONNECT 0x87 Not
//! authorized (§3.14.2.1), 3.1.1 by closing.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use postbox::codec::{Packet, ProtocolVersion, ReasonCode};

use crate::common;
use common::async_process::BrokerProcess;
use common::mosquitto::MosquittoSub;
use common::{v5, RawClient};

pub(crate) fn jwt_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("certs/jwt")
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A new 2048-bit RSA private key at `path` (`openssl genpkey`): a key the broker does not
/// know yet.
fn new_rsa_key(path: &Path) {
    common::openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        path.to_str().expect("utf8"),
    ]);
}

/// An RS256 token for `claims`, signed by `openssl dgst -sha256 -sign KEY`.
pub(crate) fn rs256(key: &Path, claims: &str) -> String {
    let signing_input = format!(
        "{}.{}",
        b64(br#"{"alg":"RS256","typ":"JWT"}"#),
        b64(claims.as_bytes())
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("input");
    std::fs::write(&input, &signing_input).expect("write");
    let signature = common::openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        key.to_str().expect("utf8"),
        input.to_str().expect("utf8"),
    ]);
    format!("{signing_input}.{}", b64(&signature))
}

/// A broker that refuses anonymous clients and takes tokens signed by the dev RSA key.
async fn broker() -> BrokerProcess {
    let key = jwt_dir().join("rsa.pub");
    BrokerProcess::spawn(
        "",
        &format!(
            "\n[auth]\nallow_anonymous = false\n[auth.jwt]\npublic_key = {key:?}\nleeway = 0\n"
        ),
    )
    .await
}

async fn connack_v5(broker: &BrokerProcess, user: Option<&str>, password: &str) -> ReasonCode {
    let mut connect = v5::connect_packet("device");
    connect.username = user.map(Into::into);
    connect.password = Some(password.as_bytes().to_vec().into());
    match v5::open(broker.addr, connect).await {
        (_, Some(Packet::ConnAck(ack))) => ack.reason_code,
        (_, other) => panic!("expected CONNACK, got {other:?}"),
    }
}

/// The v5 client gets DISCONNECT 0x87 Not authorized with a reason string that says `why`;
/// the 3.1.1 client is closed without a packet (3.1.1 has no DISCONNECT from the server).
async fn expect_both_dropped(v5_client: &mut RawClient, v3_client: &mut RawClient, why: &str) {
    let disconnect = v5::expect_disconnect(v5_client, ReasonCode::NOT_AUTHORIZED).await;
    let reason = disconnect
        .properties
        .reason_string
        .expect("a reason string");
    assert!(reason.contains(why), "{reason}");
    assert!(
        v3_client.expect_close().await.is_empty(),
        "a 3.1.1 client is closed without a packet"
    );
}

/// A 3.1.1 CONNECT's CONNACK code as `user` with `password` (a return code read as its v5
/// equivalent: 4 is 0x86).
async fn connack_v311(broker: &BrokerProcess, user: &str, password: &str) -> ReasonCode {
    let mut old = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut connect = v5::connect_packet("old");
    connect.protocol = ProtocolVersion::V3_1_1;
    connect.username = Some(user.into());
    connect.password = Some(password.as_bytes().to_vec().into());
    old.send(&Packet::Connect(Box::new(connect))).await;
    match old.recv().await {
        Some(Packet::ConnAck(ack)) => ack.reason_code,
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_token_logs_in_under_its_subject() {
    let broker = broker().await;
    let token = rs256(
        &jwt_dir().join("rsa.key"),
        &format!(r#"{{"sub":"sensor1","exp":{}}}"#, now() + 300),
    );
    // No user name needed: the token names its user.
    assert_eq!(connack_v5(&broker, None, &token).await, ReasonCode::SUCCESS);
    assert_eq!(
        connack_v5(&broker, Some("sensor1"), &token).await,
        ReasonCode::SUCCESS
    );
    // A real client, with the token as its password, publishes to a subscriber.
    let mut sub = MosquittoSub::spawn(
        broker.addr.port(),
        &[
            "-t", "t/jwt", "-q", "1", "-u", "sensor1", "-P", &token, "-i", "sub",
        ],
    );
    sub.wait_for("SUBACK").await;
    common::mosquitto::mosquitto_pub(
        broker.addr.port(),
        &[
            "-t", "t/jwt", "-q", "1", "-m", "signed", "-P", &token, "-u", "sensor1",
        ],
    )
    .await;
    sub.wait_for("signed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_foreign_and_mismatched_tokens_are_refused() {
    let broker = broker().await;
    let key = jwt_dir().join("rsa.key");
    let expired = rs256(&key, &format!(r#"{{"sub":"s1","exp":{}}}"#, now() - 10));
    assert_eq!(
        connack_v5(&broker, None, &expired).await,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    // Signed by a key the broker does not trust.
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other.key");
    new_rsa_key(&other);
    let foreign = rs256(&other, &format!(r#"{{"sub":"s1","exp":{}}}"#, now() + 300));
    assert_eq!(
        connack_v5(&broker, None, &foreign).await,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    // A token for s1 presented as s2.
    let good = rs256(&key, &format!(r#"{{"sub":"s1","exp":{}}}"#, now() + 300));
    assert_eq!(
        connack_v5(&broker, Some("s2"), &good).await,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    // 3.1.1: return code 4 (bad user name or password), which the codec reads as its v5
    // equivalent 0x86.
    assert_eq!(
        connack_v311(&broker, "s1", &expired).await,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    let refused = broker
        .metric("postbox_auth_failures_total{reason=\"jwt\"}")
        .await;
    assert_eq!(refused, Some(4.0));
}

/// A token with `exp` 2 s ahead: its v5 client gets DISCONNECT 0x87 Not authorized when it
/// expires (enforced by the broker-wide sweep, no timer per connection), its 3.1.1 client is
/// closed without a packet, and a client whose token has no `exp` stays connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_expiring_while_connected_ends_the_connection() {
    let broker = broker().await;
    let key = jwt_dir().join("rsa.key");
    let soon = rs256(&key, &format!(r#"{{"sub":"s1","exp":{}}}"#, now() + 2));
    let lasting = rs256(&key, r#"{"sub":"s2"}"#);
    // With the token's user name: 3.1.1 allows no password without one (MQTT-3.1.2-22).
    let with_token = |id: &str, (user, token): (&str, &str), protocol| {
        let mut connect = v5::connect_packet(id);
        connect.protocol = protocol;
        connect.username = Some(user.into());
        connect.password = Some(token.as_bytes().to_vec().into());
        Packet::Connect(Box::new(connect))
    };
    let mut v5_client = RawClient::open(broker.addr, ProtocolVersion::V5).await;
    let mut v3_client = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut staying = RawClient::open(broker.addr, ProtocolVersion::V5).await;
    for (c, id, login) in [
        (&mut v5_client, "expiring-v5", ("s1", soon.as_str())),
        (&mut v3_client, "expiring-v3", ("s1", soon.as_str())),
        (&mut staying, "no-exp", ("s2", lasting.as_str())),
    ] {
        c.send(&with_token(id, login, c.version)).await;
        match c.recv().await {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS, "{id}"),
            other => panic!("expected CONNACK for {id}, got {other:?}"),
        }
    }
    // Bounded by the harness's WAIT (10 s): the token has at most 2 s left.
    expect_both_dropped(&mut v5_client, &mut v3_client, "expired").await;
    // The client without `exp` is still served after the others' tokens ran out.
    staying.send(&Packet::PingReq).await;
    assert!(matches!(staying.recv().await, Some(Packet::PingResp)));
    // Both closes are counted, before the DISCONNECT or the close is written (`finish`).
    assert_eq!(
        broker.metric("postbox_credentials_expired_total").await,
        Some(2.0)
    );
}

/// Claims narrow the client: `publish` / `subscribe` filters in the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_subscribe_claims_narrow_what_the_client_may_do() {
    // No ACL file: the token's claims alone narrow the client. v5 §3.4.2.1 (PUBACK 0x87),
    // §3.9.3 (SUBACK 0x87); a filter partly inside the `subscribe` claim is granted and
    // filtered at delivery, as the ACL's partial grants are.
    let broker = broker().await;
    let key = jwt_dir().join("rsa.key");
    let narrow = rs256(
        &key,
        &format!(
            r#"{{"sub":"dev","exp":{},"publish":["out/#"],"subscribe":["in/#"]}}"#,
            now() + 300
        ),
    );
    let free = rs256(&key, &format!(r#"{{"sub":"ops","exp":{}}}"#, now() + 300));
    let login = |id: &str, token: &str| {
        let mut connect = v5::connect_packet(id);
        connect.password = Some(token.as_bytes().to_vec().into());
        connect
    };
    let (mut dev, ack) = v5::open(broker.addr, login("dev", &narrow)).await;
    assert!(matches!(ack, Some(Packet::ConnAck(a)) if a.reason_code == ReasonCode::SUCCESS));
    let qos1 = postbox::codec::SubscriptionOptions {
        qos: postbox::codec::QoS::AtLeastOnce,
        ..Default::default()
    };
    let refused = v5::subscribe_with(&mut dev, "out/#", qos1, None).await;
    assert_eq!(refused.reason_codes[0], ReasonCode::NOT_AUTHORIZED);
    let partial = v5::subscribe_with(&mut dev, "#", qos1, None).await;
    assert_eq!(
        partial.reason_codes[0],
        ReasonCode(1),
        "partly inside: granted"
    );
    let p = v5::publish_packet("in/x", postbox::codec::QoS::AtLeastOnce, b"no", 4);
    assert_eq!(v5::publish(&mut dev, p).await, ReasonCode::NOT_AUTHORIZED);
    let p = v5::publish_packet("out/x", postbox::codec::QoS::AtLeastOnce, b"yes", 5);
    assert_ne!(v5::publish(&mut dev, p).await, ReasonCode::NOT_AUTHORIZED);
    // A token without claims is not narrowed; what it publishes reaches `dev` only inside
    // `dev`'s claim: `out/1` (sent first) never arrives, `in/1` does.
    let (mut ops, ack) = v5::open(broker.addr, login("ops", &free)).await;
    assert!(matches!(ack, Some(Packet::ConnAck(a)) if a.reason_code == ReasonCode::SUCCESS));
    for (topic, id) in [("out/1", 6), ("in/1", 7)] {
        let p = v5::publish_packet(topic, postbox::codec::QoS::AtLeastOnce, b"m", id);
        // out/1: 0x10 No matching subscribers, since `dev` may not read it.
        let code = v5::publish(&mut ops, p).await;
        assert_ne!(code, ReasonCode::NOT_AUTHORIZED, "{topic}");
    }
    let got = tokio::time::timeout(common::WAIT, v5::receive(&mut dev))
        .await
        .expect("a PUBLISH in time");
    assert_eq!(&*got.topic, "in/1", "out/1 is outside the subscribe claim");
}

/// Issue 35, finding 1 (critical): with `[auth.jwt]` any password that did not look like a
/// token was admitted (the README's own setup let `dashboard` / `not-a-token` in and publish
/// as dashboard), with anonymous access on or off; and next to a password file, an MQTT 5
/// CONNECT with a password and no user name passed as anonymous. Now a password no configured
/// method verifies is refused with 0x86 Bad User Name or Password (MQTT-3.1.4-2, v5
/// §3.2.2.2; 3.1.1: return code 4), and a client without credentials is still anonymous
/// where that is allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_no_method_verifies_is_refused() {
    let key = jwt_dir().join("rsa.pub");
    let passwd = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example");
    let setups = [
        ("jwt, anonymous allowed", format!("\n[auth]\nallow_anonymous = true\n[auth.jwt]\npublic_key = {key:?}\n")),
        ("jwt, anonymous refused", format!("\n[auth]\nallow_anonymous = false\n[auth.jwt]\npublic_key = {key:?}\n")),
        (
            "jwt and a password file, anonymous refused",
            format!("\n[auth]\nallow_anonymous = false\npassword_file = {passwd:?}\n[auth.jwt]\npublic_key = {key:?}\n"),
        ),
        (
            "a password file, anonymous allowed",
            format!("\n[auth]\nallow_anonymous = true\npassword_file = {passwd:?}\n"),
        ),
    ];
    for (setup, auth) in setups {
        let broker = BrokerProcess::spawn("", &auth).await;
        for (user, password) in [
            (Some("dashboard"), "not-a-token"),
            (None, "not-a-token"),
            (None, "dashboard-secret"),
            (Some("dashboard"), "eyJub3QiOiJhIHRva2VuIn0.e30.c2ln"),
        ] {
            assert_eq!(
                connack_v5(&broker, user, password).await,
                ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                "{setup}: user {user:?}, password {password:?}"
            );
        }
        // 3.1.1 too (return code 4).
        let mut c = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
        let mut connect = v5::connect_packet("device-v3");
        connect.protocol = ProtocolVersion::V3_1_1;
        connect.username = Some("dashboard".into());
        connect.password = Some(b"not-a-token".to_vec().into());
        c.send(&Packet::Connect(Box::new(connect))).await;
        match c.recv().await {
            Some(Packet::ConnAck(ack)) => assert_eq!(
                ack.reason_code,
                ReasonCode::BAD_USER_NAME_OR_PASSWORD,
                "{setup}: 3.1.1"
            ),
            other => panic!("{setup}: expected CONNACK, got {other:?}"),
        }
        // The right password through the file still works where there is one.
        if auth.contains("password_file") {
            assert_eq!(
                connack_v5(&broker, Some("dashboard"), "dashboard-secret").await,
                ReasonCode::SUCCESS,
                "{setup}"
            );
        }
        // No credentials at all: anonymous where allowed, 0x87 where not.
        let mut connect = v5::connect_packet("nobody");
        connect.username = None;
        connect.password = None;
        let expected = if auth.contains("allow_anonymous = true") {
            ReasonCode::SUCCESS
        } else {
            ReasonCode::NOT_AUTHORIZED
        };
        match v5::open(broker.addr, connect).await {
            (_, Some(Packet::ConnAck(ack))) => assert_eq!(ack.reason_code, expected, "{setup}"),
            (_, other) => panic!("{setup}: expected CONNACK, got {other:?}"),
        }
    }
}

/// Issue 35, third adversarial pass: a verified token whose `sub` is empty or holds `+`, `#`,
/// `/` or NUL was admitted under that name, which becomes the ACL identity that `%u` in a
/// `pattern` rule stands for (one topic level). Now it is refused like any bad credential:
/// v5 0x86 Bad User Name or Password, 3.1.1 return code 4 (MQTT-3.1.4-2, v5 §3.2.2.2). (On
/// the old code each got 0x00.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_that_cannot_be_one_topic_level_is_refused() {
    let broker = broker().await;
    let key = jwt_dir().join("rsa.key");
    let exp = now() + 300;
    for sub in ["", "+", "#", "sensors/+", "a/b", "x\\u0000"] {
        let token = rs256(&key, &format!(r#"{{"sub":"{sub}","exp":{exp}}}"#));
        assert_eq!(
            connack_v5(&broker, None, &token).await,
            ReasonCode::BAD_USER_NAME_OR_PASSWORD,
            "sub {sub:?}"
        );
    }
    let plus = rs256(&key, &format!(r#"{{"sub":"+","exp":{exp}}}"#));
    assert_eq!(
        connack_v311(&broker, "+", &plus).await,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD
    );
    let fine = rs256(&key, &format!(r#"{{"sub":"sensor-1@site","exp":{exp}}}"#));
    assert_eq!(connack_v5(&broker, None, &fine).await, ReasonCode::SUCCESS);
}

/// Issue 35, sixth adversarial pass (F1, JWT variant, high): a token's `publish` claim holds
/// for its will also when the will outlives the broker. Claims are stored nowhere, so a
/// delayed will kept over a restart was published where no ACL file decides, wherever its
/// topic: mallory (`publish: ["mallory/#"]`) armed a retained will on sensor1's commands and
/// a restart published it. Now a will outside the claim is dropped at CONNECT; mallory's will
/// on its own topic (the control) is still published after the restart. MQTT-3.1.2-8 (a
/// delayed will is published after its delay); the claims narrow writes as the ACL does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_outside_the_publish_claim_is_not_published_after_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let public = jwt_dir().join("rsa.pub");
    let sections = format!(
        "[storage]\ndir = {:?}\n[auth]\nallow_anonymous = false\n[auth.jwt]\npublic_key = {public:?}\n",
        data.path()
    );
    let key = jwt_dir().join("rsa.key");
    let exp = now() + 300;
    let mallory = rs256(
        &key,
        &format!(r#"{{"sub":"mallory","exp":{exp},"publish":["mallory/#"]}}"#),
    );
    let ops = rs256(&key, &format!(r#"{{"sub":"ops","exp":{exp}}}"#));
    let login = |id: &str, token: &str| {
        let mut connect = v5::persistent_connect(id, 600);
        connect.password = Some(token.as_bytes().to_vec().into());
        connect
    };
    let broker = BrokerProcess::spawn_sections(&[""], &sections).await;
    // A persistent watcher: what is published after the restart is queued for it, however
    // soon after the start the wills come due.
    let (mut watch, _) = v5::connect(broker.addr, login("watch", &ops)).await;
    v5::subscribe(&mut watch, "#", postbox::codec::QoS::AtLeastOnce).await;
    v5::disconnect(watch).await;
    let armed = [
        ("m-forged", "commands/sensor1/reboot"),
        ("m-own", "mallory/will"),
    ]
    .map(|(id, topic)| {
        let mut connect = login(id, &mallory);
        connect.will = Some(postbox::codec::LastWill {
            topic: topic.into(),
            payload: id.as_bytes().to_vec().into(),
            qos: postbox::codec::QoS::AtLeastOnce,
            retain: true,
            properties: postbox::codec::WillProperties {
                will_delay_interval: Some(2),
                ..Default::default()
            },
        });
        connect
    });
    let broker = broker
        .restart_while_connected(armed.into(), &sections)
        .await;
    let (mut watch, ack) = v5::connect(broker.addr, login("watch", &ops)).await;
    assert!(ack.session_present);
    let own = tokio::time::timeout(common::WAIT, v5::receive(&mut watch))
        .await
        .expect("mallory's will on its own topic");
    assert_eq!(&*own.topic, "mallory/will");
    v5::expect_silence(&mut watch, std::time::Duration::from_secs(1)).await;
    // Nor kept as a retained message.
    let (mut later, _) = v5::connect(broker.addr, login("later", &ops)).await;
    v5::subscribe(&mut later, "commands/#", postbox::codec::QoS::AtLeastOnce).await;
    v5::expect_silence(&mut later, std::time::Duration::from_millis(300)).await;
}

/// Issue 35, seventh pass, N7: a reload of the JWT keys (SIGHUP) that drops the key a
/// connected client's token was signed with disconnects that client: v5 with DISCONNECT 0x87
/// Not authorized (§3.14.2.1; the re-check of a client's credentials failing is what
/// MQTT-4.12.1-2 asks a DISCONNECT "with an appropriate Reason Code" for, and 0x87 is the one
/// an expired token gets: 0x8C is about the method, 0x86 is not a DISCONNECT code), 3.1.1 by
/// closing. Tokens without `exp`, which stayed connected until a restart before. A reload
/// that keeps the key touches nobody; a token of the new key logs in and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotation_disconnects_the_old_keys_clients() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("current.pub");
    std::fs::copy(jwt_dir().join("rsa.pub"), &key_file).expect("copy the key");
    let new_key = dir.path().join("new.key");
    let new_pub = dir.path().join("new.pub");
    new_rsa_key(&new_key);
    common::openssl(&[
        "pkey",
        "-pubout",
        "-in",
        new_key.to_str().expect("utf-8"),
        "-out",
        new_pub.to_str().expect("utf-8"),
    ]);
    let broker = BrokerProcess::spawn(
        "",
        &format!(
            "\n[auth]\nallow_anonymous = false\n[auth.jwt]\npublic_key = {key_file:?}\nleeway = 0\n"
        ),
    )
    .await;
    let old = rs256(&jwt_dir().join("rsa.key"), r#"{"sub":"mallory"}"#);
    let login = |c: &RawClient, id: &str, token: &str| {
        let mut connect = v5::connect_packet(id);
        connect.protocol = c.version;
        connect.username = Some("mallory".into());
        connect.password = Some(token.as_bytes().to_vec().into());
        Packet::Connect(Box::new(connect))
    };
    let mut v5_client = RawClient::open(broker.addr, ProtocolVersion::V5).await;
    let mut v3_client = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    for (c, id) in [(&mut v5_client, "old-v5"), (&mut v3_client, "old-v3")] {
        c.send(&login(c, id, &old)).await;
        match c.recv().await {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS, "{id}"),
            other => panic!("expected CONNACK for {id}, got {other:?}"),
        }
    }

    // The same key again: nobody is touched.
    broker.signal(libc::SIGHUP);
    broker
        .wait_log(|l| l.contains("reloaded") && l.contains("JWT keys"))
        .await;
    for c in [&mut v5_client, &mut v3_client] {
        c.send(&Packet::PingReq).await;
        assert!(matches!(c.recv().await, Some(Packet::PingResp)));
    }

    // Rotated: the old key's clients are disconnected; a new key's token gets in and stays.
    std::fs::copy(&new_pub, &key_file).expect("replace the key");
    broker.signal(libc::SIGHUP);
    expect_both_dropped(&mut v5_client, &mut v3_client, "no longer passes").await;
    let fresh = rs256(&new_key, r#"{"sub":"mallory"}"#);
    let mut newcomer = RawClient::open(broker.addr, ProtocolVersion::V5).await;
    newcomer.send(&login(&newcomer, "new-v5", &fresh)).await;
    match newcomer.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    broker.signal(libc::SIGHUP);
    // The third reload's line (the output of another process: polled, bounded).
    let reloads = || {
        broker
            .logs()
            .iter()
            .filter(|l| l.contains("reloaded") && l.contains("JWT keys"))
            .count()
    };
    for _ in 0..500 {
        if reloads() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(reloads(), 3, "the third reload was logged");
    newcomer.send(&Packet::PingReq).await;
    assert!(matches!(newcomer.recv().await, Some(Packet::PingResp)));
}
