//! Poison messages (issue 16, `mqtt.max_deliveries`): a QoS 1/2 message a persistent
//! subscriber receives and never acknowledges (its client crashes each time) is sent at most
//! `max_deliveries` times; then it leaves the session's in-flight window, is dead-lettered with
//! reason `max_deliveries`, and the queue moves on. The count is stored, so a broker restart —
//! graceful or `kill -9` — does not reset it, and the dead letter itself survives the restart.
//! Unconfigured (0) the MQTT rule stands: redelivered on every reconnect until acknowledged
//! (MQTT-4.4.0-1).
//!
//! Real broker processes with a durable store in a temp dir, raw MQTT 5 clients over sockets
//! (a raw client never acknowledges on its own: "crashing" is dropping the socket before the
//! PUBACK / PUBREC). The in-flight window is 1, so the next message waits in the queue
//! behind the poison one.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::async_process::BrokerProcess;
use common::{v5, RawClient};
use postbox::codec::{Packet, PubResponse, Publish, QoS};

const TOPIC: &str = "jobs/poison";
const VICTIM: &str = "poison-victim";
const DLQ: &str = "poison-dlq";

/// A broker whose store lives in `data` across restarts, with `max_deliveries` set.
struct Harness {
    data: tempfile::TempDir,
    max_deliveries: u16,
}

/// How the broker goes down between two runs.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGTERM, waiting for its exit.
    Graceful,
    /// SIGKILL: a crash.
    Kill,
}

impl Harness {
    fn new(max_deliveries: u16) -> Harness {
        Harness {
            data: tempfile::tempdir().expect("tempdir"),
            max_deliveries,
        }
    }

    async fn start(&self) -> BrokerProcess {
        BrokerProcess::spawn_file(
            &format!(
                "[storage]\ndir = {:?}\n[mqtt]\nmax_deliveries = {}\nmax_inflight_messages = 1\n",
                self.data.path(),
                self.max_deliveries
            ),
            &[],
        )
        .await
    }

    async fn restart(&self, broker: BrokerProcess, stop: Stop) -> BrokerProcess {
        match stop {
            Stop::Graceful => {
                let mut broker = broker;
                broker.signal(libc::SIGTERM);
                let (status, _) = broker.wait_exit(common::WAIT).await;
                assert!(status.success(), "graceful stop: {status:?}");
            }
            Stop::Kill => broker.kill().await,
        }
        self.start().await
    }
}

/// Connects `id` to its persistent session (it must exist unless `first`).
async fn resume(addr: SocketAddr, id: &str, first: bool) -> RawClient {
    let (c, ack) = v5::connect(addr, v5::persistent_connect(id, 3600)).await;
    assert_eq!(ack.session_present, !first, "{id}: session present");
    c
}

/// Sets up the victim's and the dead-letter subscriber's sessions (both then offline), and
/// publishes `first` then `second` at `qos` to the victim's topic.
async fn setup(addr: SocketAddr, qos: QoS) {
    let mut dlq = resume(addr, DLQ, true).await;
    v5::subscribe(&mut dlq, "$dlq/#", QoS::AtLeastOnce).await;
    v5::disconnect(dlq).await;
    let mut victim = resume(addr, VICTIM, true).await;
    v5::subscribe(&mut victim, TOPIC, qos).await;
    v5::disconnect(victim).await;
    let mut publisher = v5::connect_id(addr, "poison-publisher").await;
    for (id, payload) in [(1, "first"), (2, "second")] {
        let code = v5::publish(
            &mut publisher,
            v5::publish_packet(TOPIC, qos, payload.as_bytes(), id),
        )
        .await;
        assert!(!code.is_error(), "{payload}: {code:?}");
    }
    v5::disconnect(publisher).await;
}

/// One crash of the victim: it connects, gets `first` (a redelivery unless `initial`) and
/// drops the socket without acknowledging it.
async fn receive_and_crash(addr: SocketAddr, qos: QoS, initial: bool) {
    let mut victim = resume(addr, VICTIM, false).await;
    let p = v5::expect_publish(&mut victim).await;
    assert_eq!(&p.payload[..], b"first", "{p:?}");
    assert_eq!(p.qos, qos);
    assert_eq!(p.dup, !initial, "DUP on a redelivery (MQTT-3.3.1-1): {p:?}");
    drop(victim);
}

/// The victim's next connection: the poison message is gone, `second` comes first (the
/// queue moved on); acknowledged.
async fn expect_moved_on(addr: SocketAddr) -> RawClient {
    let mut victim = resume(addr, VICTIM, false).await;
    let p = v5::expect_publish(&mut victim).await;
    assert_eq!(
        &p.payload[..],
        b"second",
        "the poison message was sent again: {p:?}"
    );
    assert!(!p.dup, "{p:?}");
    v5::ack(&mut victim, &p).await;
    victim
}

/// The dead-letter subscriber gets exactly one dead letter: `first`'s, reason
/// `max_deliveries`, for the victim's session.
async fn expect_one_dead_letter(addr: SocketAddr) {
    let mut dlq = resume(addr, DLQ, false).await;
    let letter = v5::expect_publish(&mut dlq).await;
    check_dead_letter(&letter);
    v5::ack(&mut dlq, &letter).await;
    // Nothing else is on its way (no event can say "no more": a bounded wait).
    match dlq.recv_within(Duration::from_millis(500)).await {
        Err(()) => {}
        Ok(other) => panic!("a second dead letter or packet: {other:?}"),
    }
    v5::disconnect(dlq).await;
}

fn check_dead_letter(letter: &Publish) {
    assert_eq!(&*letter.topic, "$dlq/jobs/poison");
    assert_eq!(&letter.payload[..], b"first");
    let prop = |name: &str| {
        letter
            .properties
            .user_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string())
    };
    assert_eq!(
        prop("reason").as_deref(),
        Some("max_deliveries"),
        "{letter:?}"
    );
    assert_eq!(prop("client_id").as_deref(), Some(VICTIM), "{letter:?}");
}

fn dropped_series(qos: QoS) -> String {
    format!(
        "postbox_messages_dropped_total{{qos=\"{}\",reason=\"max_deliveries\"}}",
        qos as u8
    )
}

/// Issue 16: "a message delivered `max_deliveries` times without an acknowledgement is
/// dead-lettered with reason `max_deliveries` and the queue moves on", counted in
/// `postbox_messages_dropped_total{reason="max_deliveries"}` with a WARN line.
async fn poison_is_dead_lettered_and_the_queue_moves_on(qos: QoS) {
    let harness = Harness::new(3);
    let broker = harness.start().await;
    setup(broker.addr, qos).await;
    receive_and_crash(broker.addr, qos, true).await; // sent 1
    receive_and_crash(broker.addr, qos, false).await; // sent 2
    receive_and_crash(broker.addr, qos, false).await; // sent 3
    let victim = expect_moved_on(broker.addr).await;
    v5::disconnect(victim).await;
    expect_one_dead_letter(broker.addr).await;
    assert_eq!(broker.metric(&dropped_series(qos)).await, Some(1.0));
    broker
        .wait_log(|l| {
            l.contains("WARN")
                && l.contains("poison message")
                && l.contains(VICTIM)
                && l.contains(TOPIC)
                && l.contains("deliveries=3")
        })
        .await;
}

#[tokio::test]
async fn qos1_poison_is_dead_lettered_and_the_queue_moves_on() {
    poison_is_dead_lettered_and_the_queue_moves_on(QoS::AtLeastOnce).await;
}

#[tokio::test]
async fn qos2_poison_is_dead_lettered_and_the_queue_moves_on() {
    poison_is_dead_lettered_and_the_queue_moves_on(QoS::ExactlyOnce).await;
}

/// Issue 16: "the count is stored with the session, so a restart does not reset it": two
/// crashes, a broker restart, one more crash, and the message is dead-lettered; the dead
/// letter is durable too (it reaches its subscriber after one more restart).
async fn count_survives_restart(stop: Stop) {
    let harness = Harness::new(3);
    let qos = QoS::AtLeastOnce;
    let broker = harness.start().await;
    setup(broker.addr, qos).await;
    receive_and_crash(broker.addr, qos, true).await; // sent 1
    receive_and_crash(broker.addr, qos, false).await; // sent 2
    let broker = harness.restart(broker, stop).await;
    receive_and_crash(broker.addr, qos, false).await; // sent 3
    let victim = expect_moved_on(broker.addr).await;
    v5::disconnect(victim).await;
    let broker = harness.restart(broker, stop).await;
    expect_one_dead_letter(broker.addr).await;
}

#[tokio::test]
async fn delivery_count_survives_a_graceful_restart() {
    count_survives_restart(Stop::Graceful).await;
}

#[tokio::test]
async fn delivery_count_survives_kill_9() {
    count_survives_restart(Stop::Kill).await;
}

/// A QoS 2 message in its PUBREL stage is not counted (the client has it, MQTT-4.3.3): its
/// PUBREL is sent again on every reconnect however often the client crashes, and it is never
/// dead-lettered.
#[tokio::test]
async fn qos2_pubrel_stage_is_not_counted() {
    let harness = Harness::new(2);
    let broker = harness.start().await;
    let addr = broker.addr;
    setup(addr, QoS::ExactlyOnce).await;
    let mut victim = resume(addr, VICTIM, false).await;
    let p = v5::expect_publish(&mut victim).await;
    assert_eq!(&p.payload[..], b"first");
    victim
        .send(&Packet::PubRec(PubResponse::new(p.packet_id)))
        .await;
    match victim.recv().await {
        Some(Packet::PubRel(r)) if r.packet_id == p.packet_id => {}
        other => panic!("expected PUBREL, got {other:?}"),
    }
    drop(victim); // no PUBCOMP
    for round in 0..4 {
        let mut victim = resume(addr, VICTIM, false).await;
        match victim.recv().await {
            Some(Packet::PubRel(r)) if r.packet_id == p.packet_id => {}
            other => panic!("round {round}: expected PUBREL again, got {other:?}"),
        }
        drop(victim);
    }
    let mut victim = resume(addr, VICTIM, false).await;
    match victim.recv().await {
        Some(Packet::PubRel(r)) if r.packet_id == p.packet_id => {}
        other => panic!("expected PUBREL, got {other:?}"),
    }
    victim
        .send(&Packet::PubComp(PubResponse::new(p.packet_id)))
        .await;
    let next = v5::expect_publish(&mut victim).await;
    assert_eq!(&next.payload[..], b"second");
    assert_eq!(
        broker.metric(&dropped_series(QoS::ExactlyOnce)).await,
        Some(0.0)
    );
}

/// `max_deliveries = 0` (the default) changes nothing: the message is sent again on every
/// reconnect until acknowledged (MQTT-4.4.0-1), and nothing is dead-lettered.
#[tokio::test]
async fn unlimited_redelivers_forever() {
    let harness = Harness::new(0);
    let broker = harness.start().await;
    let qos = QoS::AtLeastOnce;
    setup(broker.addr, qos).await;
    receive_and_crash(broker.addr, qos, true).await;
    for _ in 0..5 {
        receive_and_crash(broker.addr, qos, false).await;
    }
    let mut victim = resume(broker.addr, VICTIM, false).await;
    let p = v5::expect_publish(&mut victim).await;
    assert_eq!(&p.payload[..], b"first");
    v5::ack(&mut victim, &p).await;
    let next = v5::expect_publish(&mut victim).await;
    assert_eq!(&next.payload[..], b"second");
    assert_eq!(broker.metric(&dropped_series(qos)).await, Some(0.0));
    let mut dlq = resume(broker.addr, DLQ, false).await;
    match dlq.recv_within(Duration::from_millis(500)).await {
        Err(()) => {}
        Ok(other) => panic!("a dead letter without max_deliveries: {other:?}"),
    }
}
