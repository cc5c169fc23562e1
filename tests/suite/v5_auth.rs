//! MQTT 5 enhanced authentication (§4.12) over a raw socket, with test-only methods
//! registered through the broker's authenticator registry: the CONNECT → AUTH … → CONNACK
//! exchange, refusals, re-authentication, and expensive steps kept off the runtime.
//!
//! Statement ids follow the OASIS MQTT 5.0 text.

use crate::common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::v5;
use common::RawClient;
use postbox::codec::{Packet, ReasonCode};
use postbox::server::RunningServer;
use postbox::test_support::auth::{AuthState, AuthStep, Authenticator};

const METHOD: &str = "TEST-CHALLENGE";

/// Two challenge rounds: the client opens with "hello", then answers each
/// `challenge:<nonce>:<round>` with `response:<nonce>:<round>`; success carries "welcome".
struct TestChallenge;

struct Round {
    nonce: String,
    round: u8,
}

impl Round {
    fn challenge(self) -> AuthStep {
        let data = Bytes::from(format!("challenge:{}:{}", self.nonce, self.round));
        AuthStep::Continue {
            data: Some(data),
            state: Box::new(self),
        }
    }
}

impl Authenticator for TestChallenge {
    fn method(&self) -> &str {
        METHOD
    }

    fn start(&self, client_id: &str, data: Option<Bytes>) -> AuthStep {
        if data.as_deref() != Some(&b"hello"[..]) {
            return AuthStep::Fail(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        }
        Round {
            nonce: format!("n-{client_id}"),
            round: 1,
        }
        .challenge()
    }

    fn continue_(&self, state: AuthState, data: Option<Bytes>) -> AuthStep {
        let Ok(round) = state.downcast::<Round>() else {
            return AuthStep::Fail(ReasonCode::UNSPECIFIED_ERROR);
        };
        let want = format!("response:{}:{}", round.nonce, round.round);
        if data.as_deref() != Some(want.as_bytes()) {
            return AuthStep::Fail(ReasonCode::NOT_AUTHORIZED);
        }
        if round.round == 2 {
            return AuthStep::Success(Some(Bytes::from_static(b"welcome")));
        }
        Round {
            nonce: round.nonce,
            round: 2,
        }
        .challenge()
    }
}

/// A method whose first step blocks until the test releases it (or 5 s pass: then it fails).
struct Blocking(Mutex<mpsc::Receiver<()>>);

impl Authenticator for Blocking {
    fn method(&self) -> &str {
        "TEST-BLOCKING"
    }
    fn start(&self, _client_id: &str, _data: Option<Bytes>) -> AuthStep {
        let released = self
            .0
            .lock()
            .is_ok_and(|rx| rx.recv_timeout(Duration::from_secs(5)).is_ok());
        if released {
            AuthStep::Success(None)
        } else {
            AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)
        }
    }
    fn continue_(&self, _state: AuthState, _data: Option<Bytes>) -> AuthStep {
        AuthStep::Fail(ReasonCode::PROTOCOL_ERROR)
    }
    fn is_expensive(&self) -> bool {
        true
    }
}

async fn auth_server(config: postbox::config::Config) -> RunningServer {
    let server = common::start_with(config).await;
    server
        .broker
        .authenticators()
        .register(Arc::new(TestChallenge))
        .expect("registers");
    server
}

/// Answers a challenge the way `TestChallenge` expects.
fn answer(challenge: &str) -> String {
    challenge.replacen("challenge:", "response:", 1)
}

/// Runs both rounds on `c`, whose first challenge is `first`.
async fn two_rounds(c: &mut RawClient, first: Option<Packet>, code: ReasonCode) -> Option<Packet> {
    let ch = v5::expect_challenge(first, METHOD);
    assert!(ch.ends_with(":1"), "{ch}");
    c.send(&v5::auth_packet(code, METHOD, &answer(&ch))).await;
    let ch = v5::expect_challenge(c.recv().await, METHOD);
    assert!(ch.ends_with(":2"), "{ch}");
    c.send(&v5::auth_packet(code, METHOD, &answer(&ch))).await;
    c.recv().await
}

#[tokio::test]
async fn challenge_response_exchange_ends_in_connack_with_the_method() {
    // MQTT-4.12.0-2, MQTT-4.12.0-3, MQTT-4.12.0-5
    let server = auth_server(common::test_config()).await;
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("ea", METHOD, b"hello")).await;
    match two_rounds(&mut c, first, ReasonCode::CONTINUE_AUTHENTICATION).await {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
            assert_eq!(
                ack.properties.authentication_method.as_deref(),
                Some(METHOD)
            );
            assert_eq!(
                ack.properties.authentication_data.as_deref(),
                Some(&b"welcome"[..])
            );
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    c.send(&Packet::PingReq).await;
    assert!(matches!(c.recv().await, Some(Packet::PingResp)));
}

#[tokio::test]
async fn a_wrong_answer_is_refused_in_connack() {
    // MQTT-4.12.0-4: CONNACK >= 0x80, then the connection closes.
    let server = auth_server(common::test_config()).await;
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("eb", METHOD, b"hello")).await;
    v5::expect_challenge(first, METHOD);
    c.send(&v5::auth_packet(
        ReasonCode::CONTINUE_AUTHENTICATION,
        METHOD,
        "response:wrong:1",
    ))
    .await;
    match c.expect_close().await.as_slice() {
        [Packet::ConnAck(ack)] => assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED),
        other => panic!("{other:?}"),
    }
    // A refusal in the first step keeps the method's own reason code.
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("ec", METHOD, b"nope")).await;
    match first {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason_code, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.expect_close().await.is_empty());
}

#[tokio::test]
async fn an_unknown_method_is_refused_with_0x8c() {
    // MQTT-4.12.0-1
    let server = auth_server(common::test_config()).await;
    match v5::open(
        server.mqtt_addr,
        v5::auth_connect("ed", "SCRAM-SHA-1", b"x"),
    )
    .await
    .1
    {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason_code, ReasonCode::BAD_AUTHENTICATION_METHOD);
            assert_eq!(ack.properties.authentication_method, None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn only_auth_may_follow_connect_before_connack() {
    // MQTT-3.1.2-30 (list: -33; the client's duty) and MQTT-4.12.0-5 (same method): Protocol Error.
    let server = auth_server(common::test_config()).await;
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("ee", METHOD, b"hello")).await;
    v5::expect_challenge(first, METHOD);
    c.send(&Packet::PingReq).await;
    match c.expect_close().await.as_slice() {
        [Packet::ConnAck(ack)] => assert_eq!(ack.reason_code, ReasonCode::PROTOCOL_ERROR),
        other => panic!("{other:?}"),
    }
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("ef", METHOD, b"hello")).await;
    let ch = v5::expect_challenge(first, METHOD);
    c.send(&v5::auth_packet(
        ReasonCode::CONTINUE_AUTHENTICATION,
        "OTHER",
        &answer(&ch),
    ))
    .await;
    match c.expect_close().await.as_slice() {
        [Packet::ConnAck(ack)] => assert_eq!(ack.reason_code, ReasonCode::PROTOCOL_ERROR),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn re_authentication_succeeds_while_other_packets_flow() {
    // MQTT-4.12.1-1: AUTH 0x19 with the same method after CONNACK.
    let server = auth_server(common::test_config()).await;
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("eg", METHOD, b"hello")).await;
    assert!(matches!(
        two_rounds(&mut c, first, ReasonCode::CONTINUE_AUTHENTICATION).await,
        Some(Packet::ConnAck(_))
    ));
    c.send(&v5::auth_packet(
        ReasonCode::RE_AUTHENTICATE,
        METHOD,
        "hello",
    ))
    .await;
    let ch = v5::expect_challenge(c.recv().await, METHOD);
    c.send(&Packet::PingReq).await; // still served mid-exchange
    assert!(matches!(c.recv().await, Some(Packet::PingResp)));
    c.send(&v5::auth_packet(
        ReasonCode::CONTINUE_AUTHENTICATION,
        METHOD,
        &answer(&ch),
    ))
    .await;
    let ch = v5::expect_challenge(c.recv().await, METHOD);
    c.send(&v5::auth_packet(
        ReasonCode::CONTINUE_AUTHENTICATION,
        METHOD,
        &answer(&ch),
    ))
    .await;
    match c.recv().await {
        Some(Packet::Auth(a)) => {
            assert_eq!(a.reason_code, ReasonCode::SUCCESS);
            assert_eq!(a.properties.authentication_method.as_deref(), Some(METHOD));
        }
        other => panic!("expected AUTH 0x00, got {other:?}"),
    }
}

#[tokio::test]
async fn failed_or_malformed_re_authentication_disconnects() {
    // MQTT-4.12.1-2 (failure: DISCONNECT, close), MQTT-4.12.1-1 (same method required)
    let server = auth_server(common::test_config()).await;
    for (case, packet, code) in [
        (
            "wrong data",
            v5::auth_packet(ReasonCode::RE_AUTHENTICATE, METHOD, "nope"),
            ReasonCode::NOT_AUTHORIZED,
        ),
        (
            "other method",
            v5::auth_packet(ReasonCode::RE_AUTHENTICATE, "OTHER", "hello"),
            ReasonCode::PROTOCOL_ERROR,
        ),
        (
            "0x18 first",
            v5::auth_packet(ReasonCode::CONTINUE_AUTHENTICATION, METHOD, "x"),
            ReasonCode::PROTOCOL_ERROR,
        ),
    ] {
        let (mut c, first) =
            v5::open(server.mqtt_addr, v5::auth_connect("eh", METHOD, b"hello")).await;
        assert!(matches!(
            two_rounds(&mut c, first, ReasonCode::CONTINUE_AUTHENTICATION).await,
            Some(Packet::ConnAck(_))
        ));
        c.send(&packet).await;
        let d = v5::expect_disconnect(&mut c, code).await;
        assert!(d.properties.reason_string.is_some(), "{case}");
    }
}

#[tokio::test]
async fn auth_without_a_method_in_connect_is_a_protocol_error() {
    // MQTT-4.12.0-6 (no method in CONNACK), MQTT-4.12.0-7 (client must not send AUTH)
    let server = auth_server(common::test_config()).await;
    let (mut c, ack) = v5::connect(server.mqtt_addr, v5::connect_packet("ei")).await;
    assert_eq!(ack.properties.authentication_method, None);
    c.send(&v5::auth_packet(
        ReasonCode::RE_AUTHENTICATE,
        METHOD,
        "hello",
    ))
    .await;
    v5::expect_disconnect(&mut c, ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn enhanced_authentication_admits_clients_when_anonymous_access_is_off() {
    let mut config = common::test_config();
    config.auth.allow_anonymous = false;
    let server = auth_server(config).await;
    let (mut c, first) = v5::open(server.mqtt_addr, v5::auth_connect("ej", METHOD, b"hello")).await;
    match two_rounds(&mut c, first, ReasonCode::CONTINUE_AUTHENTICATION).await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("{other:?}"),
    }
    match v5::open(server.mqtt_addr, v5::connect_packet("anonymous"))
        .await
        .1
    {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn expensive_steps_do_not_stall_other_connections() {
    // The blocking step runs on the blocking pool: on this single-threaded test runtime,
    // another client is served while it waits, and only then releases it.
    let server = common::start().await;
    let (release, released) = mpsc::channel();
    server
        .broker
        .authenticators()
        .register(Arc::new(Blocking(Mutex::new(released))))
        .expect("registers");
    let mut slow = RawClient::open(server.mqtt_addr, v5::V).await;
    slow.send(&Packet::Connect(Box::new(v5::auth_connect(
        "slow",
        "TEST-BLOCKING",
        b"",
    ))))
    .await;
    let mut other = v5::connect_id(server.mqtt_addr, "other").await;
    other.send(&Packet::PingReq).await;
    assert!(matches!(other.recv().await, Some(Packet::PingResp)));
    release.send(()).expect("authenticator waiting");
    match slow.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("{other:?}"),
    }
}
