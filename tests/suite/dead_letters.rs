//! Dead letters (`[dead_letter]`, issue 16): a message dropped instead of delivered is
//! published again on `$dlq/<topic>` with its payload and properties and user properties
//! saying why (`reason`), for which session (`client_id`), from whom (`publisher`) and when
//! (`time`, RFC 3339), so a persistent `$dlq/#` subscriber keeps every loss.
//!
//! Each test names the issue's requirement it checks and, where one applies, the normative
//! statement behind the drop: MQTT-3.3.2-5 (expired while queued), MQTT-3.1.2-25 (larger than
//! the client's Maximum Packet Size), v5 §3.4.2.1 / §3.5.2.1 (PUBACK / PUBREC reason codes ≥
//! 0x80), MQTT-4.7.2-1 (`$` topics are not matched by `#`), v5 §3.4.2.1 0x87 (Not authorized).

use std::time::{Duration, SystemTime};

use postbox::codec::{
    Packet, ProtocolVersion, PubResponse, Publish, PublishProperties, QoS, ReasonCode,
};
use postbox::config::{Config, OverflowPolicy};
use postbox::server::RunningServer;
use postbox::test_support::guarantees::DeadReason;

use crate::common::{self, mosquitto::MosquittoSub, v5, RawClient, WAIT};

/// Short: only for "nothing more arrives" checks, after what should arrive did.
const QUIET: Duration = Duration::from_millis(300);

/// A test broker whose queues hold `max_queued` messages and overflow by `policy`.
fn config(max_queued: usize, policy: OverflowPolicy) -> Config {
    let mut c = common::test_config();
    c.mqtt.max_queued_messages = max_queued;
    c.mqtt.queue_overflow = policy;
    c
}

/// The persistent `$dlq/#` subscriber of the issue, connected.
async fn dlq_subscriber(server: &RunningServer, id: &str) -> RawClient {
    let (mut c, _) = v5::connect(server.mqtt_addr, v5::persistent_connect(id, 3600)).await;
    v5::subscribe(&mut c, "$dlq/#", QoS::AtLeastOnce).await;
    c
}

/// The values of user property `key`.
fn user<'a>(p: &'a Publish, key: &str) -> Vec<&'a str> {
    p.properties
        .user_properties
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| &**v)
        .collect()
}

/// Original properties every test publishes with, so the dead letter can be checked to
/// carry them.
fn original_properties() -> PublishProperties {
    PublishProperties {
        content_type: Some("text/plain".into()),
        user_properties: vec![("trace".into(), "t-1".into())],
        ..Default::default()
    }
}

/// The issue's shape of a dead letter: on `$dlq/<topic>`, the payload and original
/// properties, and exactly one each of `reason`, `client_id`, `publisher` (when known) and a
/// `time` that parses as RFC 3339 and is recent.
fn assert_letter(
    p: &Publish,
    topic: &str,
    reason: &str,
    client_id: &str,
    publisher: Option<&str>,
    payload: &[u8],
) {
    assert_eq!(&*p.topic, format!("$dlq/{topic}"), "{p:?}");
    assert_eq!(&p.payload[..], payload, "{p:?}");
    assert_eq!(user(p, "reason"), [reason], "{p:?}");
    assert_eq!(user(p, "client_id"), [client_id], "{p:?}");
    assert_eq!(
        user(p, "publisher"),
        publisher.into_iter().collect::<Vec<_>>(),
        "{p:?}"
    );
    let time = user(p, "time");
    assert_eq!(time.len(), 1, "{p:?}");
    let at = humantime::parse_rfc3339(time[0]).expect("time is RFC 3339");
    let age = SystemTime::now().duration_since(at).unwrap_or_default();
    assert!(age < WAIT, "time {} is not now", time[0]);
    assert_eq!(user(p, "trace"), ["t-1"], "original user property: {p:?}");
    assert_eq!(p.properties.content_type.as_deref(), Some("text/plain"));
}

/// Publishes `payload` on `topic` at QoS 1 with [`original_properties`] and returns the
/// PUBACK's reason code.
async fn publish(c: &mut RawClient, topic: &str, payload: &[u8], id: u16) -> ReasonCode {
    let mut p = v5::publish_packet(topic, QoS::AtLeastOnce, payload, id);
    p.properties = original_properties();
    v5::publish(c, p).await
}

/// Publishes `stale` on `topic` (QoS 1, packet id 1, the properties a dead letter must
/// keep) with a Message Expiry Interval of 1 s.
async fn publish_expiring_in_1s(c: &mut RawClient, topic: &str) -> ReasonCode {
    let mut publish = v5::publish_packet(topic, QoS::AtLeastOnce, b"stale", 1);
    publish.properties = original_properties();
    publish.properties.message_expiry_interval = Some(1);
    v5::publish(c, publish).await
}

/// Receives the next dead letter (acknowledged).
async fn next_letter(dlq: &mut RawClient) -> Publish {
    v5::receive(dlq).await
}

fn dead_count(server: &RunningServer, reason: DeadReason) -> u64 {
    server.broker.guarantee_metrics().dead_letters[reason.index()].get()
}

/// A broker whose queues hold 2 messages under `policy`, a dead-letter subscriber (returned
/// with the server) and an offline session `slow` on `q/#`, to which `publisher` then
/// publishes 3 messages (`1`, `2`, `3`) on `topic`: one more than the queue holds.
async fn overflow_a_queue_of_2(
    policy: OverflowPolicy,
    publisher: &str,
    topic: &str,
) -> (RunningServer, RawClient) {
    let server = common::start_with(config(2, policy)).await;
    let dlq = dlq_subscriber(&server, "dlq").await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, publisher).await;
    for (i, payload) in [b"1", b"2", b"3"].into_iter().enumerate() {
        publish(&mut p, topic, payload, i as u16 + 1).await;
    }
    (server, dlq)
}

/// Issue 16, `queue_full` with drop-new: the new message refused by a full queue is the
/// dead letter, once, for the session whose queue was full.
#[tokio::test]
async fn queue_full_drop_new_dead_letters_the_refused_message() {
    let (server, mut dlq) = overflow_a_queue_of_2(OverflowPolicy::DropNew, "pub-new", "q/x").await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(&letter, "q/x", "queue_full", "slow", Some("pub-new"), b"3");
    v5::expect_silence(&mut dlq, QUIET).await;
    assert_eq!(dead_count(&server, DeadReason::QueueFull), 1);
}

/// Issue 16, `queue_full` with drop-oldest: the message pushed out is the dead letter, once.
#[tokio::test]
async fn queue_full_drop_oldest_dead_letters_the_victim() {
    let (server, mut dlq) =
        overflow_a_queue_of_2(OverflowPolicy::DropOldest, "pub-old", "q/y").await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(&letter, "q/y", "queue_full", "slow", Some("pub-old"), b"1");
    v5::expect_silence(&mut dlq, QUIET).await;
    // The session kept the two newest.
    let (mut slow, _) = v5::connect(server.mqtt_addr, v5::persistent_connect("slow", 3600)).await;
    assert_eq!(&v5::receive(&mut slow).await.payload[..], b"2");
    assert_eq!(&v5::receive(&mut slow).await.payload[..], b"3");
}

/// Issue 16, `expired` (MQTT-3.3.2-5: a message whose expiry passed while queued is not
/// sent): its dead letter names the session, and carries no Message Expiry of its own.
#[tokio::test]
async fn expired_while_queued_is_dead_lettered() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    v5::offline_subscriber(server.mqtt_addr, "late", "e/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-exp").await;
    publish_expiring_in_1s(&mut p, "e/1").await;
    // Waiting for the expiry itself (time must pass), not for an event.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (mut late, _) = v5::connect(server.mqtt_addr, v5::persistent_connect("late", 3600)).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(&letter, "e/1", "expired", "late", Some("pub-exp"), b"stale");
    assert_eq!(letter.properties.message_expiry_interval, None);
    v5::expect_silence(&mut late, QUIET).await;
    v5::expect_silence(&mut dlq, QUIET).await;
}

/// Issue 16, `too_large` (MQTT-3.1.2-25: a packet over the client's Maximum Packet Size is
/// discarded without sending): dead-lettered once, and the session goes on.
#[tokio::test]
async fn too_large_for_the_client_is_dead_lettered() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    let mut connect = v5::connect_packet("small");
    connect.properties.maximum_packet_size = Some(128);
    let (mut small, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut small, "big/#", QoS::AtLeastOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-big").await;
    publish(&mut p, "big/1", &[b'x'; 300], 1).await;
    publish(&mut p, "big/1", b"fits", 2).await;
    assert_eq!(&v5::receive(&mut small).await.payload[..], b"fits");
    let letter = next_letter(&mut dlq).await;
    assert_letter(
        &letter,
        "big/1",
        "too_large",
        "small",
        Some("pub-big"),
        &[b'x'; 300],
    );
    v5::expect_silence(&mut dlq, QUIET).await;
}

/// Issue 16, `too_large` for a retransmission: a resumed session whose new connection has a
/// smaller Maximum Packet Size cannot get its unacknowledged message again (MQTT-3.1.2-25):
/// it is dead-lettered and taken out of flight, so the session is not stuck on it.
#[tokio::test]
async fn too_large_retransmission_is_dead_lettered_and_let_go() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    let mut connect = v5::persistent_connect("shrinks", 3600);
    connect.properties.receive_maximum = Some(1);
    let (mut sub, _) = v5::connect(server.mqtt_addr, connect.clone()).await;
    v5::subscribe(&mut sub, "rt/#", QoS::AtLeastOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-rt").await;
    publish(&mut p, "rt/1", &[b'y'; 300], 1).await;
    let first = v5::expect_publish(&mut sub).await; // not acknowledged
    assert_eq!(first.payload.len(), 300);
    drop(sub);
    connect.properties.maximum_packet_size = Some(128);
    let (mut sub, _) = v5::connect(server.mqtt_addr, connect).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(
        &letter,
        "rt/1",
        "too_large",
        "shrinks",
        Some("pub-rt"),
        &[b'y'; 300],
    );
    // Out of flight: with Receive Maximum 1, the next message gets through.
    publish(&mut p, "rt/1", b"next", 2).await;
    assert_eq!(&v5::receive(&mut sub).await.payload[..], b"next");
    v5::expect_silence(&mut dlq, QUIET).await;
}

/// Issue 16, `rejected` (v5 §3.4.2.1: a PUBACK reason code ≥ 0x80 says the receiver did
/// not accept the message): dead-lettered with the subscriber's `reason_code`.
#[tokio::test]
async fn puback_with_a_failure_code_is_dead_lettered() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    let mut sub = v5::subscriber(server.mqtt_addr, "refuser", "r/#", QoS::AtLeastOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-rej").await;
    publish(&mut p, "r/1", b"unwanted", 1).await;
    let got = v5::expect_publish(&mut sub).await;
    let mut ack = PubResponse::new(got.packet_id);
    ack.reason_code = ReasonCode(0x80);
    sub.send(&Packet::PubAck(ack)).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(
        &letter,
        "r/1",
        "rejected",
        "refuser",
        Some("pub-rej"),
        b"unwanted",
    );
    assert_eq!(user(&letter, "reason_code"), ["0x80"]);
    v5::expect_silence(&mut dlq, QUIET).await;
    // A successful PUBACK is no dead letter.
    publish(&mut p, "r/1", b"wanted", 2).await;
    v5::receive(&mut sub).await;
    v5::expect_silence(&mut dlq, QUIET).await;
    assert_eq!(dead_count(&server, DeadReason::Rejected), 1);
}

/// Issue 16, `rejected` for QoS 2 (v5 §3.5.2.1: a PUBREC reason code ≥ 0x80 ends the
/// exchange, MQTT-4.3.3-4 asks for no PUBREL then).
#[tokio::test]
async fn pubrec_with_a_failure_code_is_dead_lettered() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    let mut sub = v5::subscriber(server.mqtt_addr, "refuser2", "r2/#", QoS::ExactlyOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-rej2").await;
    let mut publish = v5::publish_packet("r2/1", QoS::ExactlyOnce, b"nope", 1);
    publish.properties = original_properties();
    v5::publish(&mut p, publish).await;
    let got = v5::expect_publish(&mut sub).await;
    let mut rec = PubResponse::new(got.packet_id);
    rec.reason_code = ReasonCode::NOT_AUTHORIZED;
    sub.send(&Packet::PubRec(rec)).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(
        &letter,
        "r2/1",
        "rejected",
        "refuser2",
        Some("pub-rej2"),
        b"nope",
    );
    assert_eq!(user(&letter, "reason_code"), ["0x87"]);
    v5::expect_silence(&mut sub, QUIET).await; // no PUBREL
}

/// Issue 16: "a dead letter is never dead-lettered again": the dead-letter subscriber's own
/// full queue drops the second dead letter, which is counted and not published as
/// `$dlq/$dlq/...`.
#[tokio::test]
async fn a_dropped_dead_letter_is_not_dead_lettered_again() {
    let server = common::start_with(config(1, OverflowPolicy::DropNew)).await;
    v5::offline_subscriber(server.mqtt_addr, "dlq-off", "$dlq/#").await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-twice").await;
    for (i, payload) in [b"1", b"2", b"3"].into_iter().enumerate() {
        publish(&mut p, "q/z", payload, i as u16 + 1).await;
    }
    // "2" and "3" were dropped for `slow`; the second dead letter found `dlq-off` full.
    assert_eq!(dead_count(&server, DeadReason::QueueFull), 2);
    let (mut dlq, _) = v5::connect(server.mqtt_addr, v5::persistent_connect("dlq-off", 3600)).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(
        &letter,
        "q/z",
        "queue_full",
        "slow",
        Some("pub-twice"),
        b"2",
    );
    v5::expect_silence(&mut dlq, QUIET).await;
    assert_eq!(dead_count(&server, DeadReason::QueueFull), 2);
}

/// Issue 16, `max_rate`: beyond it dead letters are not published but counted in
/// `postbox_dead_letters_dropped_total{reason="rate"}`; published plus dropped is every loss.
#[tokio::test]
async fn the_rate_bound_counts_the_excess() {
    let mut c = config(1, OverflowPolicy::DropNew);
    c.dead_letter.max_rate = 2;
    let server = common::start_with(c).await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-flood").await;
    for i in 1..=11u16 {
        publish(&mut p, "q/f", format!("{i}").as_bytes(), i).await;
    }
    let published = dead_count(&server, DeadReason::QueueFull);
    let dropped = server
        .broker
        .guarantee_metrics()
        .dead_letters_dropped_rate
        .get();
    assert_eq!(
        published + dropped,
        10,
        "every loss is published or counted"
    );
    assert!(dropped >= 5, "published {published}, dropped {dropped}");
    for _ in 0..published {
        let letter = next_letter(&mut dlq).await;
        assert_eq!(user(&letter, "reason"), ["queue_full"]);
    }
    v5::expect_silence(&mut dlq, QUIET).await;
    let text = server.broker.metrics.render();
    assert!(
        text.contains(&format!(
            "postbox_dead_letters_dropped_total{{reason=\"rate\"}} {dropped}"
        )),
        "{text}"
    );
}

/// Issue 16: a dead letter nobody reads is no `no_subscribers` drop (its loss is counted
/// once, as the dead letter).
#[tokio::test]
async fn an_unread_dead_letter_is_not_a_no_subscribers_drop() {
    let server = common::start_with(config(1, OverflowPolicy::DropNew)).await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-alone").await;
    publish(&mut p, "q/n", b"1", 1).await;
    publish(&mut p, "q/n", b"2", 2).await;
    assert_eq!(dead_count(&server, DeadReason::QueueFull), 1);
    let no_subscribers = &server.broker.metrics.messages_dropped_no_subscribers;
    assert_eq!(
        no_subscribers
            .iter()
            .map(postbox::test_support::metrics::Counter::get)
            .sum::<u64>(),
        0
    );
}

/// Issue 16: `$dlq/` is reserved like `$SYS`: a v5 PUBLISH there is refused with 0x87 Not
/// authorized (v5 §3.4.2.1), a 3.x one acknowledged and dropped, and a will there is not
/// published; a `$dlq/#` subscriber sees none of them.
#[tokio::test]
async fn clients_cannot_publish_dead_letters() {
    let server = common::start().await;
    let mut dlq = dlq_subscriber(&server, "dlq").await;
    let mut c = v5::connect_id(server.mqtt_addr, "forger").await;
    assert_eq!(
        publish(&mut c, "$dlq/q/x", b"forged", 1).await,
        ReasonCode::NOT_AUTHORIZED
    );
    let mut old =
        RawClient::connect(server.mqtt_addr, ProtocolVersion::V3_1_1, "forger3", true).await;
    old.send(&Packet::Publish(v5::publish_packet(
        "$dlq/q/x",
        QoS::AtLeastOnce,
        b"forged",
        1,
    )))
    .await;
    match old.recv().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, 1),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let mut connect = v5::connect_packet("will-forger");
    connect.will = Some(v5::will("$dlq/w", b"forged", QoS::AtLeastOnce, false));
    let (w, _) = v5::connect(server.mqtt_addr, connect).await;
    drop(w); // abnormal close: the will is due at once
             // The will's refusal is counted when the broker sees the close: wait for it (bounded).
    let denied = &server.broker.metrics.authz_denied[1];
    let deadline = tokio::time::Instant::now() + WAIT;
    while denied.get() < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        denied.get(),
        3,
        "the v5, 3.x and will publishes were refused"
    );
    v5::expect_silence(&mut dlq, QUIET).await;
}

/// Issue 16: reading `$dlq/` obeys the ACL like any topic: a user granted `$dlq/#` gets dead
/// letters, another is refused the subscription (v5 SUBACK 0x87, §3.9.3).
#[tokio::test]
async fn reading_dead_letters_obeys_the_acl() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(1, OverflowPolicy::DropNew);
    common::set_acl(
        &mut c,
        dir.path(),
        "topic readwrite q/#\n\nuser ops\ntopic read $dlq/#\ntopic readwrite q/#\n",
    );
    let server = common::start_with(c).await;
    let mut nosy = v5::connect_id(server.mqtt_addr, "nosy").await;
    let ack = v5::subscribe_with(&mut nosy, "$dlq/#", Default::default(), None).await;
    assert_eq!(ack.reason_codes, [ReasonCode::NOT_AUTHORIZED]);
    let mut connect = v5::persistent_connect("ops", 3600);
    connect.username = Some("ops".into());
    let (mut ops, _) = v5::connect(server.mqtt_addr, connect).await;
    v5::subscribe(&mut ops, "$dlq/#", QoS::AtLeastOnce).await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-acl").await;
    publish(&mut p, "q/a", b"1", 1).await;
    publish(&mut p, "q/a", b"2", 2).await;
    let letter = next_letter(&mut ops).await;
    assert_letter(&letter, "q/a", "queue_full", "slow", Some("pub-acl"), b"2");
    v5::expect_silence(&mut nosy, QUIET).await;
}

/// Issue 16: the real `mosquitto_sub -V mqttv5 -F '%t %P %p'` sees a dead letter's user
/// properties (`%P`) and payload.
#[tokio::test]
async fn mosquitto_sub_sees_the_properties() {
    let server = common::start_with(config(1, OverflowPolicy::DropNew)).await;
    let port = server.mqtt_addr.port().to_string();
    let mut sub = MosquittoSub::spawn(
        server.mqtt_addr.port(),
        &["-V", "mqttv5", "-q", "1", "-t", "$dlq/#", "-F", "%t %P %p"],
    );
    sub.wait_for("SUBACK").await;
    v5::offline_subscriber(server.mqtt_addr, "slow", "q/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-mosq").await;
    publish(&mut p, "q/m", b"first", 1).await;
    publish(&mut p, "q/m", b"lost-one", 2).await;
    let line = sub.wait_for("lost-one").await;
    assert!(line.starts_with("$dlq/q/m "), "{line} (port {port})");
    for part in [
        "reason:queue_full",
        "client_id:slow",
        "publisher:pub-mosq",
        "trace:t-1",
        "time:",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
}

/// Issue 16, `expired`, across a restart: a message that expired in an offline session's
/// queue while the broker was down is dead-lettered when the session comes back (MQTT-3.3.2-5:
/// not sent), not dropped silently by the store's start-up purge.
#[tokio::test]
async fn expired_in_a_queue_across_a_restart_is_dead_lettered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = || {
        let mut config = common::test_config();
        config.storage.persistence = true;
        config.storage.dir = Some(dir.path().to_path_buf());
        config
    };
    let server = common::start_with(durable()).await;
    dlq_subscriber(&server, "dlq-r").await;
    v5::offline_subscriber(server.mqtt_addr, "late-r", "er/#").await;
    let mut p = v5::connect_id(server.mqtt_addr, "pub-er").await;
    publish_expiring_in_1s(&mut p, "er/1").await;
    server.shutdown().await;
    // Waiting for the expiry itself (time must pass while the broker is down), not for an event.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let server = common::start_with(durable()).await;
    let (mut dlq, _) = v5::connect(server.mqtt_addr, v5::persistent_connect("dlq-r", 3600)).await;
    let (mut late, _) = v5::connect(server.mqtt_addr, v5::persistent_connect("late-r", 3600)).await;
    let letter = next_letter(&mut dlq).await;
    assert_letter(&letter, "er/1", "expired", "late-r", None, b"stale");
    v5::expect_silence(&mut late, QUIET).await;
}

/// Issue 35, pass 7b, P3 (the dead-letter rate's share was per client id): one user's twelve
/// sessions, each losing a flood of messages too large for it (MQTT-3.1.2-25), spent the
/// whole `max_rate`, and another user's command that expired in its queue (MQTT-3.3.2-5)
/// was not dead-lettered. The share is the user's now, and a source that keeps losing
/// messages cannot take the broker's last half: the command reaches `$dlq/`.
#[tokio::test]
async fn one_users_many_sessions_cannot_stop_anothers_dead_letter() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut c = common::test_config();
    let dir = tempfile::tempdir().expect("tempdir");
    c.auth.password_file = Some(common::fast_example_passwords(dir.path()));
    c.auth.allow_anonymous = false;
    c.dead_letter.enabled = true;
    // 5/s: a source's share is the least, 1/s; twelve of them ask for more than all.
    c.dead_letter.max_rate = 5;
    let server = common::start_with(c).await;
    let addr = server.mqtt_addr;
    let (mut watcher, _) = v5::connect(
        addr,
        v5::as_user(v5::connect_packet("dashboard"), "dashboard"),
    )
    .await;
    v5::subscribe(&mut watcher, "$dlq/commands/#", QoS::AtLeastOnce).await;
    let sensor1 = v5::as_user(v5::persistent_connect("sensor1", 3600), "sensor1");
    let (mut s1, _) = v5::connect(addr, sensor1.clone()).await;
    v5::subscribe(&mut s1, "commands/sensor1/#", QoS::AtLeastOnce).await;
    v5::disconnect(s1).await;
    // sensor2's twelve client ids, each with room for nothing the flood carries.
    let mut small = Vec::new();
    for i in 0..12 {
        let mut connect = v5::as_user(v5::connect_packet(&format!("sensor2-{i}")), "sensor2");
        connect.properties.maximum_packet_size = Some(64);
        let (mut s, _) = v5::connect(addr, connect).await;
        v5::subscribe(&mut s, "flood/#", QoS::AtMostOnce).await;
        small.push(s);
    }
    let (mut flooder, _) = v5::connect(
        addr,
        v5::as_user(v5::connect_packet("sensor2-pub"), "sensor2"),
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let flood = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            let began = std::time::Instant::now();
            let payload = [b'y'; 200];
            for _ in 0..2_000_000u32 {
                if stop.load(Ordering::Relaxed) || began.elapsed() > Duration::from_secs(60) {
                    break;
                }
                let p = v5::publish_packet("flood/x", QoS::AtMostOnce, &payload, 0);
                flooder.send(&Packet::Publish(p)).await;
            }
            flooder
        }
    });
    // The flood is over its share (rate drops counted) before the command is sent.
    let dropped = || {
        server
            .broker
            .guarantee_metrics()
            .dead_letters_dropped_rate
            .get()
    };
    let began = std::time::Instant::now();
    while dropped() == 0 {
        assert!(
            began.elapsed() < WAIT,
            "the flood never reached the rate bound"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (mut dashboard, _) = v5::connect(
        addr,
        v5::as_user(v5::connect_packet("dashboard-pub"), "dashboard"),
    )
    .await;
    let mut command = v5::publish_packet(
        "commands/sensor1/unlock",
        QoS::AtLeastOnce,
        b"must-be-dead-lettered",
        1,
    );
    command.properties.message_expiry_interval = Some(1);
    v5::publish(&mut dashboard, command).await;
    // Waiting for the expiry itself (time must pass), not for an event.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dropped_before = dropped();
    // The expiry is noticed as the resumed session's queue is read.
    let (_s1, ack) = v5::connect(addr, sensor1).await;
    assert!(ack.session_present);
    let letter = watcher.recv_within(WAIT).await;
    stop.store(true, Ordering::Relaxed);
    let _ = flood.await;
    assert!(
        dropped() > dropped_before,
        "the flood was still over the rate while the command expired"
    );
    match letter {
        Ok(Some(Packet::Publish(letter))) => {
            assert_eq!(&*letter.topic, "$dlq/commands/sensor1/unlock");
            assert_eq!(user(&letter, "reason"), ["expired"]);
            assert_eq!(user(&letter, "client_id"), ["sensor1"]);
        }
        other => panic!("sensor1's expired command was not dead-lettered: {other:?}"),
    }
}
