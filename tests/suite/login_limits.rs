//! Failed-login limits and the password hash workers under a flood (issue 35, finding 4),
//! through the real `postbox` binary with `auth.password_file`: one source address flooding
//! wrong passwords does not starve a login from another address of the hash workers, a
//! connection that closed before its turn is not hashed, and an address (or a user name) that
//! keeps failing is refused without a hash (v5 CONNACK 0x9F Connection rate exceeded, 3.1.1
//! return code 3) until its delay has passed, with one WARN line, not one per attempt.
//!
//! Other hosts are played from other loopback addresses (`connect_from`: 127.0.0.0/8 is local
//! on Linux). No assertion is on a duration: each one compares counts the broker exports
//! (`postbox_auth_failures_total{reason="bad_credentials"}` is counted once per hash of a wrong
//! password) at a moment an answer fixes. Except the padding test, where time is the property:
//! it compares two answer times with each other, never with a constant.
//!
//! MQTT-3.1.4-2 (the Server MAY check the credentials), MQTT 5 §3.2.2.2 (0x86 Bad User Name
//! or Password, 0x9F Connection rate exceeded), 3.1.1 §3.2.2.3 (return codes 3 and 4).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use postbox::codec::{Packet, ProtocolVersion, ReasonCode};
use postbox::test_support::auth::password::PasswordHash;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common;
use common::async_process::{connect_from, BrokerProcess};
use common::{v5, RawClient, WAIT};

/// The failed-login limits switched off: the tests of the hash workers see the workers alone.
const LIMITS_OFF: &str = "login_failures_per_address = 0\nlogin_failures_per_user = 0\n";

const BAD_CREDENTIALS: &str = "postbox_auth_failures_total{reason=\"bad_credentials\"}";

fn host(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// A password file of `(user, PBKDF2 iterations)` in `dir`; each user's password is
/// `<user>-secret`.
fn password_file(dir: &Path, users: &[(&str, u32)]) -> PathBuf {
    let text: String = users
        .iter()
        .map(|(user, iterations)| {
            let password = format!("{user}-secret");
            let hash = PasswordHash::new_pbkdf2(password.as_bytes(), *iterations);
            format!("{user}:{}\n", hash.encode())
        })
        .collect();
    let path = dir.join("passwd");
    std::fs::write(&path, text).expect("write the password file");
    path
}

/// [`broker`] with a fresh [`password_file`] of `users` (the directory kept alive by the
/// caller).
async fn broker_of(users: &[(&str, u32)], extra: &str) -> (tempfile::TempDir, BrokerProcess) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), users);
    (dir, broker(&file, extra).await)
}

/// A broker that refuses anonymous clients, with `file` and the `[auth]` keys `extra`.
async fn broker(file: &Path, extra: &str) -> BrokerProcess {
    BrokerProcess::spawn(
        "",
        &format!("\n[auth]\nallow_anonymous = false\npassword_file = {file:?}\n{extra}"),
    )
    .await
}

/// The bytes of a CONNECT for `id` with `user` and `password`.
fn connect_bytes(version: ProtocolVersion, id: &str, user: &str, password: &str) -> Vec<u8> {
    let connect = postbox::codec::Connect {
        username: Some(user.into()),
        password: Some(password.as_bytes().to_vec().into()),
        ..common::connect_packet(version, id)
    };
    common::encode(&Packet::Connect(Box::new(connect)), version)
}

/// A connection from `source` that has sent its CONNECT in one write.
async fn send_connect(
    source: Ipv4Addr,
    addr: SocketAddr,
    version: ProtocolVersion,
    id: &str,
    user: &str,
    password: &str,
) -> TcpStream {
    let mut stream = connect_from(source, addr).await;
    stream
        .write_all(&connect_bytes(version, id, user, password))
        .await
        .expect("write CONNECT");
    stream
}

/// The CONNACK code (v5 reason code; a 3.1.1 return code as its 5.0 equivalent) the broker
/// answers a CONNECT from
/// `source` with.
async fn connack(
    source: Ipv4Addr,
    addr: SocketAddr,
    version: ProtocolVersion,
    user: &str,
    password: &str,
) -> u8 {
    // A client id per user: with one id for all, a user's CONNECT right behind another
    // user's could find that session still attached, bound to the other identity (0x87),
    // before the broker saw the first connection close.
    let id = format!("limits-{user}");
    let stream = send_connect(source, addr, version, &id, user, password).await;
    connack_on(stream, version).await
}

/// [`connack`] must be `code`.
async fn expect_connack(
    source: Ipv4Addr,
    addr: SocketAddr,
    version: ProtocolVersion,
    (user, password): (&str, &str),
    code: u8,
) {
    let got = connack(source, addr, version, user, password).await;
    assert_eq!(got, code, "{user}:{password:?} from {source} ({version:?})");
}

/// The next packet on `c` must be a CONNACK, in time: its code (a 3.1.1 return code as its
/// 5.0 equivalent).
async fn read_connack(c: &mut RawClient) -> u8 {
    match tokio::time::timeout(WAIT, c.recv()).await {
        Ok(Some(Packet::ConnAck(ack))) => ack.reason_code.0,
        other => panic!("expected a CONNACK, got {other:?}"),
    }
}

/// Issue 35, finding 4: 300 wrong-password connections from one address delayed a first login
/// from another to 9.95 s, because every hash waited in one first-come queue. Now one
/// address holds at most half of the hash workers (at least one): the login from 127.0.0.1
/// gets a free worker at once. Checked by counts, not time: when its CONNACK arrives, few of
/// the flood's 300 passwords have been hashed (before, all of them were, since it queued
/// behind every one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_leaves_hash_workers_for_another() {
    const FLOOD: usize = 300;
    // ~50 ms per hash of alice's: the flood's hashes take seconds, each.
    let (_dir, broker) = broker_of(&[("alice", 50_000), ("bob", 1_000)], LIMITS_OFF).await;
    let addr = broker.addr;
    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let id = format!("flood-{i}");
        flood.push(send_connect(host(2), addr, v5::V, &id, "alice", "wrong").await);
    }
    // The flood is being hashed.
    broker.wait_metric(BAD_CREDENTIALS, |v| v >= 1.0).await;
    let code = connack(host(1), addr, v5::V, "bob", "bob-secret").await;
    assert_eq!(code, ReasonCode::SUCCESS.0, "bob from another address");
    let hashed = broker.metric(BAD_CREDENTIALS).await.unwrap_or(0.0);
    assert!(
        hashed < 50.0,
        "{hashed} of the flood's {FLOOD} passwords were hashed before bob's login was"
    );
    drop(flood);
}

/// Issue 35, finding 4: hashing went on for connections that had closed (1,105 hashes for 141
/// answers). Now a verification waiting for a hash worker watches its connection and is
/// dropped, unhashed, when the client leaves (`postbox_auth_hashes_skipped_total`).
///
/// 127.0.0.2 first fills its share of the workers with slow hashes (half the workers, at
/// least one: `blockers` logins of a 6,000,000-iteration line, seconds each); then 200
/// clients from there send a wrong password and close at once, so every one of them waits
/// for a place while its close arrives; a client from 127.0.0.3 then waits for its answer.
/// When it has it, the only hashes run are the blockers' and its own, and every closer ends
/// skipped (before: all 200 were hashed, in turn, ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_before_their_turn_are_not_hashed() {
    const CLOSERS: usize = 200;
    let (_dir, broker) = broker_of(&[("alice", 1_000), ("slow", 6_000_000)], LIMITS_OFF).await;
    let addr = broker.addr;
    // The broker's share per address: half its hash workers (one per CPU), at least one.
    let share = (std::thread::available_parallelism().map_or(1, std::num::NonZero::get) / 2).max(1);
    let blockers = f64::from(u32::try_from(share).unwrap_or(u32::MAX));
    let mut held = Vec::new();
    for i in 0..share {
        let id = format!("blocker-{i}");
        held.push(send_connect(host(2), addr, v5::V, &id, "slow", "wrong").await);
    }
    broker
        .wait_metric("postbox_auth_hashes_total", |v| v >= blockers)
        .await;
    for i in 0..CLOSERS {
        let id = format!("closer-{i}");
        drop(send_connect(host(2), addr, v5::V, &id, "alice", "wrong").await);
    }
    // The right password: a failure would be padded to the slow user's hash (the file's
    // slowest class, issue 35, sixth pass, finding 4), past this test's wait.
    let code = connack(host(3), addr, v5::V, "alice", "alice-secret").await;
    assert_eq!(code, ReasonCode::SUCCESS.0);
    let hashes = broker
        .metric("postbox_auth_hashes_total")
        .await
        .expect("the hash count is exported");
    assert_eq!(
        hashes,
        blockers + 1.0,
        "hashes run when the one client waiting for an answer got it"
    );
    let hashed = broker.metric(BAD_CREDENTIALS).await.unwrap_or(0.0);
    assert!(hashed <= 1.0 + blockers, "{hashed} wrong passwords hashed");
    // Every closer ends skipped; none is hashed later either.
    broker
        .wait_metric("postbox_auth_hashes_skipped_total", |v| v >= CLOSERS as f64)
        .await;
    drop(held);
    assert_eq!(
        broker.metric("postbox_auth_hashes_skipped_total").await,
        Some(CLOSERS as f64)
    );
}

/// Three failures per address, five per user, and a delay of 10 minutes: no delay passes
/// during a test.
const NO_DELAY_PASSES: &str = "login_failures_per_address = 3\nlogin_failures_per_user = 5\n\
                               login_delay_ms = 600000\nlogin_delay_max_ms = 600000\n";

/// The CONNACK codes these tests expect: accepted, bad credentials, throttled (0x9F).
const CODES: (u8, u8, u8) = (
    ReasonCode::SUCCESS.0,
    ReasonCode::BAD_USER_NAME_OR_PASSWORD.0,
    ReasonCode::CONNECTION_RATE_EXCEEDED.0,
);

/// Issue 35, finding 4: nothing limited guessing (about 24 guesses/s from one address). Now
/// after `login_failures_per_address` hashed failures, an address is refused without a hash
/// (0x9F, 3.1.1: 3) until its delay passes (10 minutes here: no delay passes during the test);
/// after `login_failures_per_user` a user name is, from any address. One WARN line per throttled address or user, counted in
/// `postbox_auth_throttled_total{key}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_are_throttled_per_address_and_per_user() {
    use ProtocolVersion::{V3_1_1, V5};
    let (_dir, broker) = broker_of(
        &[("alice", 1_000), ("bob", 1_000), ("carol", 1_000)],
        NO_DELAY_PASSES,
    )
    .await;
    let addr = broker.addr;
    let (ok, bad, throttled) = CODES;

    // Per address: alice logs in once (remembered), then guesses from 127.0.0.2.
    expect_connack(host(2), addr, V5, ("alice", "alice-secret"), ok).await;
    for _ in 0..3 {
        expect_connack(host(2), addr, V5, ("alice", "guess"), bad).await;
    }
    for _ in 0..3 {
        expect_connack(host(2), addr, V5, ("alice", "guess"), throttled).await;
    }
    // 3.1.1 return code 3 (Server unavailable), read back as its 5.0 equivalent, 0x88.
    let unavailable = ReasonCode::SERVER_UNAVAILABLE.0;
    expect_connack(host(2), addr, V3_1_1, ("alice", "guess"), unavailable).await;
    // Unchecked: even a right password not seen lately waits out the delay…
    expect_connack(host(2), addr, V5, ("bob", "bob-secret"), throttled).await;
    // … and so does alice's, accepted from here before: its address failed for alice since,
    // so the pair is no longer trusted (`a_remembered_password_is_no_oracle_while_throttled`).
    expect_connack(host(2), addr, V5, ("alice", "alice-secret"), throttled).await;
    // Other addresses are not concerned.
    expect_connack(host(3), addr, V5, ("bob", "bob-secret"), ok).await;
    assert_eq!(
        broker.metric(BAD_CREDENTIALS).await,
        Some(3.0),
        "throttled ones unhashed"
    );
    let by_address = "postbox_auth_throttled_total{key=\"address\"}";
    assert_eq!(broker.metric(by_address).await, Some(6.0));

    // Per user: carol guessed from five addresses (each under its own limit), then a sixth.
    for last in 10..15 {
        expect_connack(host(last), addr, V5, ("carol", "guess"), bad).await;
    }
    expect_connack(host(15), addr, V5, ("carol", "guess"), throttled).await;
    expect_connack(host(16), addr, V5, ("carol", "carol-secret"), throttled).await;
    let by_user = "postbox_auth_throttled_total{key=\"user\"}";
    assert_eq!(broker.metric(by_user).await, Some(2.0));

    // One WARN line per throttled address and user, however many attempts it refused.
    broker
        .wait_log(|l| l.contains("WARN") && l.contains("carol") && l.contains("throttl"))
        .await;
    let logs = broker.logs();
    let warned = |needle: &str| {
        logs.iter()
            .filter(|l| l.contains("WARN") && l.contains(needle) && l.contains("throttl"))
            .count()
    };
    assert_eq!(warned("127.0.0.2"), 1, "{logs:#?}");
    assert_eq!(warned("carol"), 1, "{logs:#?}");
    for secret in ["alice-secret", "bob-secret", "guess"] {
        assert!(
            !logs.iter().any(|l| l.contains(secret)),
            "no password in the log"
        );
    }
}

/// Issue 35, third adversarial pass: the success cache was asked before the throttle, so a
/// throttled guesser got a fast yes (a password the cache remembered: 0x00) or no (0x9F) at
/// line rate, about 120 guesses/s, and a device's remembered success cleared its user's
/// failures, handing the guessers elsewhere a fresh allowance. Now a throttled attempt is
/// refused whatever its password, unless its (user, address) pair proved the password
/// before and has not failed since: a device attacked from elsewhere, or behind the
/// attacker's address, still gets in. (On the old code the right password from the throttled
/// address got 0x00, and the guess after the device's reconnect was checked: 0x86.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_password_is_no_oracle_while_throttled() {
    let (_dir, broker) = broker_of(&[("alice", 1_000), ("bob", 1_000)], NO_DELAY_PASSES).await;
    let addr = broker.addr;
    let (ok, bad, throttled) = CODES;
    let (device, attacker) = (host(4), host(2));
    // alice's device logs in from 127.0.0.4 (now remembered), bob's from the address the
    // attacker will use (a shared NAT).
    expect_connack(device, addr, v5::V, ("alice", "alice-secret"), ok).await;
    expect_connack(attacker, addr, v5::V, ("bob", "bob-secret"), ok).await;
    for _ in 0..3 {
        expect_connack(attacker, addr, v5::V, ("alice", "guess"), bad).await;
    }
    // The throttled address learns nothing: the remembered password is refused like a guess.
    for password in ["alice-secret", "guess", "alice-secret"] {
        assert_eq!(
            connack(attacker, addr, v5::V, "alice", password).await,
            throttled,
            "{password}"
        );
    }
    // bob's device behind the same address proved its password there: not locked out.
    expect_connack(attacker, addr, v5::V, ("bob", "bob-secret"), ok).await;
    // Two more guesses from elsewhere: alice's user name is throttled (5 failures).
    for last in [10, 11] {
        expect_connack(host(last), addr, v5::V, ("alice", "guess"), bad).await;
    }
    assert_eq!(
        connack(host(12), addr, v5::V, "alice", "alice-secret").await,
        throttled,
        "the right password from an address that never proved it"
    );
    // The device still gets in, and its success does not clear the attackers' failures.
    expect_connack(device, addr, v5::V, ("alice", "alice-secret"), ok).await;
    assert_eq!(
        connack(host(13), addr, v5::V, "alice", "guess").await,
        throttled,
        "no fresh allowance after the device's login"
    );
    assert_eq!(
        broker.metric(BAD_CREDENTIALS).await,
        Some(5.0),
        "only the five checked guesses were hashed"
    );
}

/// Issue 35, third adversarial pass: `alice-secret` followed by NUL bytes was accepted for a
/// `$7$` (PBKDF2-HMAC-SHA512) line: HMAC pads a short key with zeros, so both derive the same
/// key. Now the comparison is exact: 0x86 (3.1.1: 4), MQTT-3.1.4-2 and v5 §3.2.2.2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_nul_bytes_appended_is_refused() {
    let (_dir, broker) = broker_of(&[("alice", 1_000)], LIMITS_OFF).await;
    let addr = broker.addr;
    let bad = ReasonCode::BAD_USER_NAME_OR_PASSWORD.0;
    for padded in ["alice-secret\0", "alice-secret\0\0\0"] {
        for version in [v5::V, ProtocolVersion::V3_1_1] {
            assert_eq!(
                connack(host(1), addr, version, "alice", padded).await,
                bad,
                "{padded:?} {version:?}"
            );
        }
    }
    let ok = ReasonCode::SUCCESS.0;
    expect_connack(host(1), addr, v5::V, ("alice", "alice-secret"), ok).await;
}

/// The CONNACK code a SCRAM-SHA-256 exchange for `user` with `password` from `source` ends
/// with: at once when the broker answers CONNECT with a CONNACK (no challenge), else after
/// the client's proof.
async fn scram_connack(source: Ipv4Addr, addr: SocketAddr, user: &str, password: &str) -> u8 {
    match scram_start(source, addr, "scram-limits", user, password).await {
        Ok(exchange) => scram_finish(exchange).await,
        Err(code) => code,
    }
}

/// [`scram_connack`] must be `code`.
async fn expect_scram(source: Ipv4Addr, addr: SocketAddr, (user, secret): (&str, &str), code: u8) {
    let got = scram_connack(source, addr, user, secret).await;
    assert_eq!(got, code, "SCRAM {user}:{secret:?} from {source}");
}

/// A SCRAM-SHA-256 credential line for `user` with `secret`, written to `dir`/scram.
fn scram_file(dir: &Path, user: &str, secret: &str) -> PathBuf {
    use postbox::test_support::auth::scram::ScramKind;
    let line = postbox::test_support::auth::scram_file::scram_credential_line(
        ScramKind::Sha256,
        user,
        secret,
        4096,
    );
    let path = dir.join("scram");
    std::fs::write(&path, format!("{line}\n")).expect("scram file");
    path
}

/// Issue 35, third adversarial pass: failed SCRAM exchanges (MQTT 5 enhanced authentication,
/// §4.12) were not counted, so SCRAM was an unthrottled way to guess. Now they count in the
/// same records as password failures, per address and per user, and a throttled exchange is
/// refused with CONNACK 0x9F before its challenge (no proof is judged). (On the old code the
/// fourth exchange got its challenge and 0x00, and the password login after SCRAM failures
/// was checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_scram_exchanges_count_in_the_login_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), &[("alice", 1_000)]);
    let scram = scram_file(dir.path(), "alice", "alice-scram");
    let limits = format!(
        "scram_file = {scram:?}\nlogin_failures_per_address = 3\nlogin_failures_per_user = 5\n\
         login_delay_ms = 600000\nlogin_delay_max_ms = 600000\n"
    );
    let broker = broker(&file, &limits).await;
    let addr = broker.addr;
    let (ok, bad, throttled) = CODES;
    // A device proves alice's SCRAM credentials from 127.0.0.4.
    expect_scram(host(4), addr, ("alice", "alice-scram"), ok).await;
    for _ in 0..3 {
        expect_scram(host(2), addr, ("alice", "guess"), bad).await;
    }
    // Per address: refused before the challenge, the right secret too, and the password
    // file's login from there as well (one record, whatever the method).
    expect_scram(host(2), addr, ("alice", "alice-scram"), throttled).await;
    expect_connack(host(2), addr, v5::V, ("alice", "alice-secret"), throttled).await;
    // Per user: two more failures from elsewhere, then alice is refused from a third.
    for last in [10, 11] {
        expect_scram(host(last), addr, ("alice", "guess"), bad).await;
    }
    expect_scram(host(12), addr, ("alice", "alice-scram"), throttled).await;
    // The device that proved the credentials still gets in.
    expect_scram(host(4), addr, ("alice", "alice-scram"), ok).await;
    let by_address = "postbox_auth_throttled_total{key=\"address\"}";
    let by_user = "postbox_auth_throttled_total{key=\"user\"}";
    assert_eq!(broker.metric(by_address).await, Some(2.0));
    assert_eq!(broker.metric(by_user).await, Some(1.0));
}

/// The CONNACK code on `stream` (a 3.1.1 return code as its 5.0 equivalent).
async fn connack_on(stream: TcpStream, version: ProtocolVersion) -> u8 {
    read_connack(&mut RawClient::over(stream, version)).await
}

/// How many of `codes` are `code`.
fn count(codes: &[u8], code: u8) -> usize {
    codes.iter().filter(|&&c| c == code).count()
}

/// Issue 35, fourth adversarial pass: the limits read only the failures already judged, so
/// every guess in flight passed: 60 CONNECTs sent at once with wrong passwords got 59 checked
/// guesses (0x86) and the right one 0x00, with 20 allowed per address and 10 per user. Now
/// the check reserves: of a burst for one user from one address at most the user's allowance
/// is judged (the right password sent last included), the rest are refused unchecked
/// (0x9F); a burst at many user names stops at the address's allowance. A device that logged
/// in before from its own address still gets in, at once, from its remembered password.
/// (On the old code all 40 guesses of the first burst were judged, and the right one let in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_parallel_guesses_gets_no_more_checks_than_allowed() {
    const BURST: usize = 40;
    const PER_USER: usize = 10;
    const PER_ADDRESS: usize = 20;
    // A minute to answer a CONNECT: under a loaded machine the 40 queued hashes took past the
    // default 10 s, and the broker closed the last CONNECTs unanswered (a flaky failure).
    let limits = format!(
        "login_failures_per_address = {PER_ADDRESS}\nlogin_failures_per_user = {PER_USER}\n\
         login_delay_ms = 600000\nlogin_delay_max_ms = 600000\n"
    );
    // ~25 ms a hash: the burst is all in flight before the first guesses are judged.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), &[("alice", 50_000)]);
    let broker = BrokerProcess::spawn(
        "",
        &format!(
            "connect_timeout = 60\n[auth]\nallow_anonymous = false\npassword_file = {file:?}\n\
             {limits}"
        ),
    )
    .await;
    let addr = broker.addr;
    let (ok, bad, throttled) = CODES;
    let (device, attacker) = (host(4), host(2));
    expect_connack(device, addr, v5::V, ("alice", "alice-secret"), ok).await;

    // One user from one address: every CONNECT is written before any answer is read.
    let mut burst = Vec::with_capacity(BURST + 1);
    for i in 0..BURST {
        let id = format!("burst-{i}");
        let guess = format!("guess-{i}");
        burst.push(send_connect(attacker, addr, v5::V, &id, "alice", &guess).await);
    }
    burst.push(send_connect(attacker, addr, v5::V, "right", "alice", "alice-secret").await);
    // The device logs in while the burst is in flight: its pair passes, from the cache.
    expect_connack(device, addr, v5::V, ("alice", "alice-secret"), ok).await;
    let mut codes = Vec::with_capacity(burst.len());
    for stream in burst {
        codes.push(connack_on(stream, v5::V).await);
    }
    let right = codes.last().copied();
    let judged = count(&codes, bad) + count(&codes, ok);
    assert!(
        judged <= PER_USER,
        "{judged} of {} attempts judged (right password: {right:?}): {codes:?}",
        codes.len()
    );
    assert!(judged >= 1, "the allowance is used: {codes:?}");
    assert_eq!(
        count(&codes, throttled),
        codes.len() - judged,
        "the rest refused unchecked: {codes:?}"
    );
    let hashed = broker.metric(BAD_CREDENTIALS).await.unwrap_or(0.0);
    assert!(hashed <= PER_USER as f64, "{hashed} wrong passwords hashed");
    // Whatever the burst did, the device that proved the password gets in.
    expect_connack(device, addr, v5::V, ("alice", "alice-secret"), ok).await;

    // Many user names from one address: the address's allowance (unknown users are hashed
    // as a wrong password would be, and counted the same).
    let other = host(3);
    let mut burst = Vec::with_capacity(BURST);
    for i in 0..BURST {
        let (id, user) = (format!("names-{i}"), format!("user-{i}"));
        burst.push(send_connect(other, addr, v5::V, &id, &user, "guess").await);
    }
    let mut codes = Vec::with_capacity(BURST);
    for stream in burst {
        codes.push(connack_on(stream, v5::V).await);
    }
    let judged = count(&codes, bad);
    assert!(
        judged <= PER_ADDRESS,
        "{judged} of {BURST} judged: {codes:?}"
    );
    assert!(judged >= 1, "the allowance is used: {codes:?}");
    assert_eq!(count(&codes, throttled), BURST - judged, "{codes:?}");
}

/// A SCRAM-SHA-256 exchange from `source` for `user` whose first answer is read: `Ok` with
/// the client, connection and server-first-message when challenged, `Err` with the CONNACK
/// code when refused at once.
async fn scram_start(
    source: Ipv4Addr,
    addr: SocketAddr,
    id: &str,
    user: &str,
    password: &str,
) -> Result<(crate::scram::ScramClient, RawClient, String), u8> {
    use crate::scram::{Hash, ScramClient};
    let method = Hash::Sha256.method();
    let client = ScramClient::new(Hash::Sha256, user, password);
    let connect = v5::auth_connect(id, method, client.client_first());
    let mut c = RawClient::over(connect_from(source, addr).await, v5::V);
    c.send(&Packet::Connect(Box::new(connect))).await;
    let first = tokio::time::timeout(WAIT, c.recv())
        .await
        .expect("an answer");
    if let Some(Packet::ConnAck(ack)) = first {
        return Err(ack.reason_code.0);
    }
    let server_first = v5::expect_challenge(first, method);
    Ok((client, c, server_first))
}

/// The end of an exchange [`scram_start`] began: the client's proof sent, the CONNACK code.
async fn scram_finish(
    (mut client, mut c, server_first): (crate::scram::ScramClient, RawClient, String),
) -> u8 {
    use crate::scram::Hash;
    let fin = client.client_final(&server_first, false);
    let method = Hash::Sha256.method();
    c.send(&v5::auth_packet(
        ReasonCode::CONTINUE_AUTHENTICATION,
        method,
        &fin,
    ))
    .await;
    read_connack(&mut c).await
}

/// Issue 35, fourth adversarial pass: 60 SCRAM exchanges started at once were all challenged
/// and all 60 proofs judged, with 10 failures allowed per user. Now an exchange holds its
/// place from its challenge to its verdict: of a burst for one user from one address only
/// the user's allowance is challenged, the others get 0x9F before any challenge, and so does
/// the right secret started while those are open. The device that proved the secret before
/// still gets in. (On the old code all 30 were challenged and the right one let in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_parallel_scram_exchanges_gets_no_more_proofs_judged() {
    const BURST: usize = 30;
    const PER_USER: usize = 10;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), &[("alice", 1_000)]);
    let scram = scram_file(dir.path(), "alice", "alice-scram");
    let limits = format!(
        "scram_file = {scram:?}\nlogin_failures_per_address = 20\n\
         login_failures_per_user = {PER_USER}\nlogin_delay_ms = 600000\n\
         login_delay_max_ms = 600000\n"
    );
    let broker = broker(&file, &limits).await;
    let addr = broker.addr;
    let (ok, bad, throttled) = CODES;
    let (device, attacker) = (host(4), host(2));
    expect_scram(device, addr, ("alice", "alice-scram"), ok).await;
    // Every exchange of the burst is started (its first answer read) before any proof.
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..BURST {
        let id = format!("scram-burst-{i}");
        match scram_start(attacker, addr, &id, "alice", "guess").await {
            Ok(exchange) => open.push(exchange),
            Err(code) => {
                assert_eq!(code, throttled, "refused before the challenge");
                refused += 1;
            }
        }
    }
    assert_eq!(open.len(), PER_USER, "challenged: the user's allowance");
    assert_eq!(refused, BURST - PER_USER);
    let right = scram_start(attacker, addr, "scram-right", "alice", "alice-scram").await;
    assert_eq!(
        right.as_ref().err(),
        Some(&throttled),
        "the right secret while the burst's exchanges are open"
    );
    // The device's pair passes the busy user.
    expect_scram(device, addr, ("alice", "alice-scram"), ok).await;
    for exchange in open {
        assert_eq!(
            scram_finish(exchange).await,
            bad,
            "a judged proof of a guess"
        );
    }
    // Judged and failed: the user is throttled now, the right secret too, from elsewhere.
    expect_scram(host(12), addr, ("alice", "alice-scram"), throttled).await;
    expect_scram(device, addr, ("alice", "alice-scram"), ok).await;
}

/// When the broker answers a CONNECT from `source` for `user` with a wrong password, and
/// how long after the connection was made, with its CONNACK code.
async fn timed_failure(
    source: Ipv4Addr,
    addr: SocketAddr,
    user: &str,
) -> (std::time::Instant, Duration, u8) {
    let started = std::time::Instant::now();
    let stream = send_connect(source, addr, v5::V, "timed", user, "wrong").await;
    let code = connack_on(stream, v5::V).await;
    let answered = std::time::Instant::now();
    (answered, answered - started, code)
}

/// What one probe of the P4 attack saw.
struct Probe {
    /// The candidates' shortest answer time: at least one padded failure.
    own: Duration,
    /// From the first answer to a candidate (or filler) to the probe's answer.
    gap: Duration,
}

/// One probe of the P4 attack: `places` wrong-password CONNECTs for `candidate` from
/// 127.0.0.1 (all of that address's places), when `busy_from` is given as many for the slow
/// user from it (with them every hash worker is busy), then, once all are being hashed, one
/// wrong-password CONNECT for an unknown name from `probe_from`, which must wait for a place
/// or a worker one of them holds.
async fn probe_after(
    broker: &BrokerProcess,
    places: usize,
    candidate: &str,
    busy_from: Option<Ipv4Addr>,
    probe_from: Ipv4Addr,
) -> Probe {
    let addr = broker.addr;
    let before = broker
        .metric("postbox_auth_hashes_total")
        .await
        .unwrap_or(0.0);
    let mut tasks = Vec::new();
    for _ in 0..places {
        let candidate = candidate.to_owned();
        tasks.push(tokio::spawn(async move {
            timed_failure(host(1), addr, &candidate).await
        }));
    }
    if let Some(busy) = busy_from {
        for _ in 0..places {
            tasks.push(tokio::spawn(timed_failure(busy, addr, "slow")));
        }
    }
    let in_flight = tasks.len() as f64;
    broker
        .wait_metric("postbox_auth_hashes_total", |v| v >= before + in_flight)
        .await;
    let (probe, _, code) = timed_failure(probe_from, addr, "no-such-user").await;
    assert_eq!(code, ReasonCode::BAD_USER_NAME_OR_PASSWORD.0, "probe");
    let (mut own, mut first) = (Duration::MAX, probe);
    for task in tasks {
        let (answered, took, code) = task.await.expect("candidate task");
        assert_eq!(code, ReasonCode::BAD_USER_NAME_OR_PASSWORD.0, "candidate");
        own = own.min(took);
        first = first.min(answered);
    }
    Probe {
        own,
        gap: probe.saturating_duration_since(first),
    }
}

/// Issue 35, pass 7, P4 (F4 bypass): a failure was padded to the slowest class's hash, but
/// its address's hash place and its worker were given back when its real hash ended, so the
/// next verification waiting for them (a second probe from the same address, or with every
/// worker busy one from anywhere) began at the candidate's true hash time: a second probe
/// sent right after a slow-class user's wrong password was answered a whole slow hash later
/// than one sent after an unknown name (pass 7: 4.3 s against 2.35 s). Now a failure holds
/// both until its padded answer, so the probe waits as long after either.
///
/// Checked by what the broker's own sleep guarantees, not by comparing two timings (that
/// check failed once in CI under the parallel suite): after an unknown name's wrong password
/// (a cheap hash, answered padded), the probe's hash may begin only at that padded answer,
/// and is itself padded, so the probe is answered at least one padded failure after the
/// first candidate's answer. Load on the machine only lengthens the padding and the wait.
/// The old code began the probe's hash when the cheap hash ended, and answered it a cheap
/// hash (a thirtieth of the padding) after the candidate. The padding is read from a slow
/// user's wrong password (its answer time, never shorter than the padding); the bound is half
/// of it, the best of three tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_probe_does_not_tell_a_slow_hash_from_an_unknown_name() {
    const TRIES: usize = 3;
    // Most users cheap (unknown names are hashed at their cost), one 30 times dearer: about
    // 1 s a slow hash in a debug build; thirty times the iterations in a release build (about
    // 0.25 s), where ten times padded failures to 86 ms, and a stall of the test's runtime
    // could be half of that.
    let scale = if cfg!(debug_assertions) { 1 } else { 30 };
    let (_dir, broker) = broker_of(
        &[
            ("alice", 1_000 * scale),
            ("bob", 1_000 * scale),
            ("slow", 30_000 * scale),
        ],
        LIMITS_OFF,
    )
    .await;
    // The broker's share per address: half its hash workers (one per CPU), at least one.
    let places =
        (std::thread::available_parallelism().map_or(1, std::num::NonZero::get) / 2).max(1);
    // The same address's next probe (it waits for the address's place), then one from another
    // address while 127.0.0.2 keeps the other half of the workers busy (it waits for a worker).
    for (busy, probe_from) in [(None, host(1)), (Some(host(2)), host(3))] {
        let (mut padded, mut gap) = (Duration::MAX, Duration::ZERO);
        for _ in 0..TRIES {
            padded = padded.min(
                probe_after(&broker, places, "slow", busy, probe_from)
                    .await
                    .own,
            );
            let after_unknown = probe_after(&broker, places, "nobody-here", busy, probe_from).await;
            gap = gap.max(after_unknown.gap);
        }
        eprintln!("probe from {probe_from}: {gap:?} after an unknown name, padding {padded:?}");
        assert!(
            gap >= padded / 2,
            "probe from {probe_from}: answered {gap:?} after an unknown name's failure, \
             less than half a padded failure ({padded:?}): its hash began before that \
             failure's padded answer"
        );
    }
}

/// The CONNACK code on `stream`, or `None` when it is closed without one.
async fn answer_on(stream: TcpStream, version: ProtocolVersion) -> Option<u8> {
    let mut c = RawClient::over(stream, version);
    match tokio::time::timeout(WAIT, c.recv()).await {
        Ok(Some(Packet::ConnAck(ack))) => Some(ack.reason_code.0),
        Ok(None) => None,
        other => panic!("expected a CONNACK or a close, got {other:?}"),
    }
}

/// Issue 35, twenty-fifth adversarial pass, K1: nothing bounded how many handshakes waited
/// for a password hash: 5,080 from 254 addresses, each holding its CONNECT. Now a check
/// waits only where the hash workers can get to it before its deadline
/// (`mqtt.connect_timeout`, 2 s here): with hashes of ~0.2 s, one address's place checks
/// about ten in that time, and of thirty wrong passwords sent at once from it the rest are
/// answered at once with 0x89 Server busy (v5 §3.2.2.2: "try again later"), unhashed;
/// before, all thirty waited, to be answered 0x86 or closed at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_wait_for_a_hash_only_as_many_as_can_be_done_in_time() {
    const AT_ONCE: usize = 30;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), &[("alice", 200_000)]);
    let broker = BrokerProcess::spawn(
        "",
        &format!(
            "connect_timeout = 2\n[auth]\nallow_anonymous = false\n\
             password_file = {file:?}\n{LIMITS_OFF}"
        ),
    )
    .await;
    // One hash timed: the store knows its pace.
    expect_connack(host(3), broker.addr, v5::V, ("alice", "alice-secret"), 0).await;
    let mut sent = Vec::with_capacity(AT_ONCE);
    for i in 0..AT_ONCE {
        let id = format!("waiting-{i}");
        sent.push(send_connect(host(2), broker.addr, v5::V, &id, "alice", "wrong").await);
    }
    let mut codes = Vec::with_capacity(AT_ONCE);
    for stream in sent {
        codes.push(answer_on(stream, v5::V).await);
    }
    let busy = codes
        .iter()
        .filter(|&&c| c == Some(ReasonCode::SERVER_BUSY.0))
        .count();
    let other = codes
        .iter()
        .filter(|&&c| {
            c.is_some_and(|c| {
                c != ReasonCode::SERVER_BUSY.0 && c != ReasonCode::BAD_USER_NAME_OR_PASSWORD.0
            })
        })
        .count();
    assert_eq!(other, 0, "{codes:?}");
    assert!(busy >= AT_ONCE / 6, "too few answered busy: {codes:?}");
}

/// Issue 35, twenty-sixth adversarial pass, L1: handshakes waiting for a hash had been
/// bounded by the listener's pending slots, which strangers fill with sockets that send two
/// bytes; then every login whose password the broker did not remember was refused (76 of 76,
/// 0x89). The pending slots are for handshakes that wait for the client: with all of them
/// held by silent sockets, a first login (its hash run, not remembered) still gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_in_every_pending_slot_leave_first_logins_alone() {
    const SLOTS: usize = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = password_file(dir.path(), &[("alice", 1_000)]);
    let broker = BrokerProcess::spawn(
        &format!("max_pending_connections = {SLOTS}"),
        &format!("\n[auth]\nallow_anonymous = false\npassword_file = {file:?}\n"),
    )
    .await;
    let mut silent = Vec::with_capacity(SLOTS);
    for i in 0..SLOTS {
        let mut stream = connect_from(host(20 + i as u8), broker.addr).await;
        stream.write_all(&[0x10, 0x40]).await.expect("write");
        silent.push(stream);
    }
    broker
        .wait_metric("postbox_connections_pending", |v| v >= SLOTS as f64)
        .await;
    expect_connack(host(1), broker.addr, v5::V, ("alice", "alice-secret"), 0).await;
    assert_eq!(
        broker.metric(BAD_CREDENTIALS).await.unwrap_or(0.0),
        0.0,
        "alice's password was checked"
    );
    assert_eq!(broker.metric("postbox_auth_hashes_total").await, Some(1.0));
    drop(silent);
}

/// Issue 35, twenty-fifth adversarial pass, K5: each address had its share of the hash
/// workers, but 254 addresses with one wrong password each made a 254-deep queue ahead of
/// every first login, which waited 6-10 s of its 10 s `connect_timeout`. Now the
/// verifications of addresses that failed lately wait behind those of addresses that have
/// not: at most one fewer than the workers (at least one) of theirs are ahead of a login
/// from elsewhere. Six addresses fail once each, then send a wrong password each at once;
/// a first login from 127.0.0.1 is answered when at most two of those six have been hashed
/// (before, every one of them was ahead of it: with two workers, at least five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_that_failed_wait_behind_those_that_have_not() {
    const SUSPECTS: u8 = 6;
    // ~0.2 s a hash.
    let users = [("alice", 200_000), ("bob", 200_000), ("carol", 200_000)];
    let (_dir, broker) = broker_of(&users, "").await;
    let addr = broker.addr;
    // Each address fails once (bob's failures stay under his allowance of 10).
    let first: Vec<_> = (0..SUSPECTS)
        .map(|i| tokio::spawn(connack(host(10 + i), addr, v5::V, "bob", "wrong")))
        .collect();
    for answer in first {
        let code = answer.await.expect("task");
        assert_eq!(code, ReasonCode::BAD_USER_NAME_OR_PASSWORD.0);
    }
    let failed_before = f64::from(SUSPECTS);
    assert_eq!(broker.metric(BAD_CREDENTIALS).await, Some(failed_before));
    let mut flood = Vec::new();
    for i in 0..SUSPECTS {
        let id = format!("suspect-{i}");
        flood.push(send_connect(host(10 + i), addr, v5::V, &id, "carol", "wrong").await);
    }
    // The first of them is being hashed.
    broker
        .wait_metric("postbox_auth_hashes_total", |v| v > failed_before)
        .await;
    let code = connack(host(1), addr, v5::V, "alice", "alice-secret").await;
    assert_eq!(
        code,
        ReasonCode::SUCCESS.0,
        "alice from an address that never failed"
    );
    let failed = broker.metric(BAD_CREDENTIALS).await.unwrap_or(0.0) - failed_before;
    assert!(
        failed <= 2.0,
        "{failed} of the failed addresses' wrong passwords were hashed before alice's login"
    );
    drop(flood);
}
