//! What a connection holds beside its packets counts where its partial packets count (issue
//! 35, twelfth adversarial pass): its inbound topic aliases (U6), its will (U7), and the
//! output a subscriber does not read (U5). A verified client's in `mqtt.max_memory`
//! (`postbox_partial_packet_bytes`, `postbox_memory_used_bytes`), an anonymous client's in
//! the anonymous share (an eighth of it), past which the connection is closed (aliases,
//! output: DISCONNECT 0x97, `postbox_anonymous_share_closes_total`) or the CONNECT refused
//! (a will: 0x97, 3.1.1 return code 3).

use std::time::Duration;

use postbox::codec::{Packet, ProtocolVersion, QoS, ReasonCode};
use tokio::net::TcpSocket;

use crate::client_bounds::{most_shown, password_and_anonymous, sensor1};
use crate::common;
use common::{v5, RawClient};

const PARTIAL: &str = "postbox_partial_packet_bytes";
const CLOSES: &str = "postbox_anonymous_share_closes_total";
const USED: &str = "postbox_memory_used_bytes";
const CONNECTIONS: &str = "postbox_connections_current";
/// A budget of 4 MiB: the anonymous share is 512 KiB.
const BUDGET: u64 = 4 << 20;
const SHARE: usize = (BUDGET / 8) as usize;

/// A QoS 1 PUBLISH binding `alias` to `topic` (v5 §3.3.2.3.4); the broker's answer: PUBACK
/// (the binding held) or DISCONNECT (refused), `None` if it closed.
async fn bind(c: &mut RawClient, alias: u16, topic: &str, id: u16) -> Option<Packet> {
    let mut publish = v5::publish_packet(topic, QoS::AtLeastOnce, b"x", id);
    publish.properties.topic_alias = Some(alias);
    c.send(&Packet::Publish(publish)).await;
    c.recv().await
}

/// Asserts `answer` is a PUBACK taking the message (0x00, or 0x10 No matching subscribers).
fn accepted(answer: Option<Packet>) {
    match answer {
        Some(Packet::PubAck(ack)) => assert!(ack.reason_code.0 < 0x80, "{ack:?}"),
        other => panic!("expected a PUBACK, got {other:?}"),
    }
}

/// A topic of about `len` bytes, distinct per `tag`.
fn long_topic(tag: &str, len: usize) -> String {
    format!("{tag}/{}", "t".repeat(len))
}

/// U6 (high): inbound topic aliases (client -> broker) may each bind a topic of up to 64 KiB
/// for the connection's life (our Topic Alias Maximum, 10, MQTT-3.2.2-17), counted nowhere
/// before: 1,000 anonymous connections binding 10 aliases to 65,000-byte topics took +700 MB.
/// Now a verified client's table shows in `postbox_partial_packet_bytes` (in the budget),
/// a rebinding to a shorter topic gives the difference back, and anonymous clients' tables
/// share 512 KiB: seven 60 KB bindings fit, one of the next two gets DISCONNECT 0x97 (MQTT
/// 5.0 §3.14.2.1, counted), and a connection that ends gives its bindings back. Fails
/// without the count: the gauge stays at 0 and every binding is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_topic_aliases_count_as_the_connections_own() {
    const TOPIC: usize = 60_000;
    let broker = password_and_anonymous(BUDGET).await;
    let (mut device, _) = v5::connect(broker.addr, sensor1("sensor1-aliases")).await;
    for alias in 1..=4 {
        let topic = long_topic(&format!("sensors/sensor1/{alias}"), TOPIC);
        accepted(bind(&mut device, alias, &topic, alias).await);
    }
    broker
        .wait_metric(PARTIAL, |n| n >= (4 * TOPIC) as f64)
        .await;
    for alias in 1..=4 {
        let topic = format!("sensors/sensor1/{alias}");
        accepted(bind(&mut device, alias, &topic, 10 + alias).await);
    }
    broker.wait_metric(PARTIAL, |n| n < TOPIC as f64).await;

    // Anonymous: 4 + 3 bindings fit in 512 KiB (with the last one's PUBLISH, counted as a
    // partial packet while it arrived: up to 60 KB more), two more do not.
    let mut anonymous = Vec::new();
    for i in 0..2 {
        let (mut c, _) = v5::connect(broker.addr, v5::connect_packet(&format!("anon-{i}"))).await;
        for alias in 1..=(4 - i) {
            accepted(
                bind(
                    &mut c,
                    alias,
                    &long_topic(&format!("anon/{i}/{alias}"), TOPIC),
                    alias,
                )
                .await,
            );
        }
        anonymous.push(c);
    }
    let (mut third, _) = v5::connect(broker.addr, v5::connect_packet("anon-2")).await;
    let mut refused = None;
    for alias in 1..=2 {
        match bind(
            &mut third,
            alias,
            &long_topic(&format!("anon/2/{alias}"), TOPIC),
            alias,
        )
        .await
        {
            Some(Packet::PubAck(ack)) if alias == 1 && ack.reason_code.0 < 0x80 => {}
            Some(Packet::Disconnect(d)) => {
                refused = Some(d.reason_code);
                break;
            }
            other => panic!("expected PUBACK or DISCONNECT, got {other:?}"),
        }
    }
    assert_eq!(
        refused,
        Some(ReasonCode::QUOTA_EXCEEDED),
        "DISCONNECT 0x97 past the anonymous share"
    );
    assert!(third.recv().await.is_none(), "closed after the DISCONNECT");
    broker.wait_metric(CLOSES, |n| n >= 1.0).await;

    // A connection that ends gives its bindings back: a new client binds as many again.
    v5::disconnect(anonymous.remove(0)).await;
    let (mut fourth, _) = v5::connect(broker.addr, v5::connect_packet("anon-3")).await;
    let deadline = tokio::time::Instant::now() + common::WAIT;
    for alias in 1..=4 {
        let topic = long_topic(&format!("anon/3/{alias}"), TOPIC);
        // The first client's close is settled by its task: bounded retries until it is.
        loop {
            match bind(&mut fourth, alias, &topic, alias).await {
                Some(Packet::PubAck(ack)) if ack.reason_code.0 < 0x80 => break,
                other => {
                    assert!(tokio::time::Instant::now() < deadline, "{other:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let (c, _) = v5::connect(broker.addr, v5::connect_packet("anon-3")).await;
                    fourth = c;
                }
            }
        }
    }
    // Everything given back once every connection ends.
    v5::disconnect(fourth).await;
    v5::disconnect(anonymous.remove(0)).await;
    v5::disconnect(device).await;
    broker.wait_metric(PARTIAL, |n| n == 0.0).await;
}

/// A v5 CONNECT of an anonymous clean session with a 60,000-byte will (no delay).
fn anonymous_with_will(client_id: &str) -> postbox::codec::Connect {
    let mut connect = v5::connect_packet(client_id);
    connect.will = Some(v5::will(
        &format!("wills/{client_id}"),
        &[0x57; 60_000],
        QoS::AtMostOnce,
        false,
    ));
    connect
}

/// Connects anonymous clients with 60,000-byte wills until one is refused; returns those
/// connected, asserting the refusal is CONNACK 0x97 (MQTT 5.0 §3.2.2.2 Quota exceeded).
async fn fill_with_wills(
    broker: &common::async_process::BrokerProcess,
    round: u32,
) -> Vec<RawClient> {
    let mut held = Vec::new();
    for i in 0..20 {
        let id = format!("will-{round}-{i:02}");
        match v5::open(broker.addr, anonymous_with_will(&id)).await {
            (c, Some(Packet::ConnAck(ack))) if ack.reason_code == ReasonCode::SUCCESS => {
                held.push(c);
            }
            (_, Some(Packet::ConnAck(ack))) => {
                assert_eq!(ack.reason_code, ReasonCode::QUOTA_EXCEEDED, "{ack:?}");
                return held;
            }
            (_, other) => panic!("expected CONNACK, got {other:?}"),
        }
    }
    panic!("20 anonymous connections with 60 KB wills were all accepted in a 512 KiB share");
}

/// U7 (medium): a will without a delay is held for the whole connection, up to
/// `mqtt.max_connect_size`, and was counted nowhere: 1,000 anonymous connections with
/// 60,000-byte wills took +260 MB. Now every will counts from CONNECT until it is published
/// or dropped: a verified client's in `postbox_memory_used_bytes` (dropped by a normal
/// DISCONNECT, MQTT-3.1.2-10), an anonymous client's in the anonymous share, where a will
/// that does not fit refuses the CONNECT (v5 0x97; 3.1.1 return code 3 Server unavailable,
/// §3.2.2.3). Exactly as many fit as the share holds once each (a will counted twice would
/// halve them), and after the connections end (wills cancelled by DISCONNECT, or published
/// when a connection is lost) as many fit again (a will counted after it left would not).
/// Fails without the count: twenty are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_will_counts_until_it_is_published_or_dropped() {
    let broker = password_and_anonymous(BUDGET).await;
    let before = broker.metric(USED).await.unwrap_or(0.0);
    let mut connect = sensor1("sensor1-will");
    connect.will = Some(v5::will(
        "sensors/sensor1/will",
        &[0x57; 60_000],
        QoS::AtMostOnce,
        false,
    ));
    let (device, _) = v5::connect(broker.addr, connect).await;
    broker.wait_metric(USED, |n| n >= before + 60_000.0).await;
    v5::disconnect(device).await;
    // The session (1 KiB and its id) stays; the will goes.
    broker.wait_metric(USED, |n| n < before + 8_000.0).await;

    let connections = broker.metric(CONNECTIONS).await.unwrap_or(0.0);
    // Each costs its will (60,000 + topic + 16) and its session (1,024 + id).
    let each = 60_000 + "wills/will-0-00".len() + 16 + 1_024 + "will-0-00".len();
    let fit = (0..)
        .take_while(|k| k * each + each - 1_024 - 9 <= SHARE)
        .count();
    let mut first = fill_with_wills(&broker, 0).await;
    assert_eq!(first.len(), fit, "60 KB wills counted once each in 512 KiB");

    // 3.1.1: refused with return code 3.
    let mut old = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut connect = common::connect_packet(ProtocolVersion::V3_1_1, "will-old");
    connect.will = Some(v5::will(
        "wills/old",
        &[0x57; 60_000],
        QoS::AtMostOnce,
        false,
    ));
    old.send(&Packet::Connect(Box::new(connect))).await;
    let bytes = tokio::time::timeout(common::WAIT, old.recv_bytes(4))
        .await
        .expect("CONNACK in time");
    assert_eq!(
        bytes,
        [0x20, 0x02, 0x00, 0x03],
        "3.1.1 CONNACK Server unavailable"
    );

    // Half end with a normal DISCONNECT (the will is dropped), half are lost (published).
    let lost = first.split_off(fit / 2);
    for c in first {
        v5::disconnect(c).await;
    }
    drop(lost);
    broker.wait_metric(CONNECTIONS, |n| n <= connections).await;
    let mut again = Vec::new();
    let deadline = tokio::time::Instant::now() + common::WAIT;
    // The last task may still be settling its session when the gauge moves: bounded retries.
    while again.len() < fit {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} fit again",
            again.len()
        );
        again = fill_with_wills(&broker, 1).await;
        if again.len() < fit {
            for c in again.drain(..) {
                v5::disconnect(c).await;
            }
            broker.wait_metric(CONNECTIONS, |n| n <= connections).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(
        again.len(),
        fit,
        "the wills of ended connections left the share"
    );
}

/// Asserts that exactly `expected` anonymous connections with 60 KB wills fit the share now
/// ([`fill_with_wills`]), then ends them with a normal DISCONNECT (their wills dropped) and
/// waits for `postbox_connections_current` to be back at `connections`. What the closes
/// before it gave back is settled by their tasks a moment after the socket closes: an answer
/// that is one short is tried again, within `WAIT`.
async fn expect_room_for(
    broker: &common::async_process::BrokerProcess,
    round: u32,
    expected: usize,
    connections: f64,
) {
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        let held = fill_with_wills(broker, round).await;
        let fit = held.len();
        for c in held {
            v5::disconnect(c).await;
        }
        broker.wait_metric(CONNECTIONS, |n| n <= connections).await;
        if fit == expected {
            return;
        }
        assert!(
            fit < expected && tokio::time::Instant::now() < deadline,
            "{fit} wills fit, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// U7: a will's count moves with it. Deferred (the connection lost, its session kept, a
/// Will Delay Interval pending, MQTT-3.1.3-9): the session's count takes over from the
/// connection's, once; cancelled by a new connection within the delay (MQTT-3.1.2-8): gone.
/// Taken over (MQTT-3.1.4-3: the old connection is closed, and its will without a delay is
/// published): gone. Measured by how many 60 KB wills fit the anonymous share (ids and
/// topics of one length, so each takes the same room): four deferred wills leave four fewer,
/// as they would counted once; none are left once they are cancelled or published. Fails
/// without the count of wills at CONNECT (twenty fit every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wills_count_moves_with_it_when_deferred_cancelled_or_taken_over() {
    let broker = password_and_anonymous(BUDGET).await;
    let connections = broker.metric(CONNECTIONS).await.unwrap_or(0.0);
    let base = fill_with_wills(&broker, 0).await.len();
    broker.wait_metric(CONNECTIONS, |n| n <= connections).await;

    // Four kept sessions with delayed wills lose their connections: the wills wait.
    let delayed = |i: usize| {
        let mut connect = anonymous_with_will(&format!("defer-{i:03}"));
        connect.clean_start = false;
        connect.properties.session_expiry_interval = Some(600);
        if let Some(will) = connect.will.as_mut() {
            will.properties.will_delay_interval = Some(600);
        }
        connect
    };
    for i in 0..4 {
        let (c, ack) = v5::connect(broker.addr, delayed(i)).await;
        assert_eq!(
            ack.properties.session_expiry_interval, None,
            "kept: {ack:?}"
        );
        drop(c);
    }
    broker.wait_metric(CONNECTIONS, |n| n <= connections).await;
    expect_room_for(&broker, 1, base - 4, connections).await;

    // Their clients come back without a will: the delayed wills are cancelled. The sessions
    // stay (1 KiB and the id each, which leaves the count of 60 KB wills as it was).
    for i in 0..4 {
        let mut connect = v5::persistent_connect(&format!("defer-{i:03}"), 600);
        connect.clean_start = false;
        let (c, _) = v5::connect(broker.addr, connect).await;
        v5::disconnect(c).await;
    }
    broker.wait_metric(CONNECTIONS, |n| n <= connections).await;
    expect_room_for(&broker, 2, base, connections).await;

    // A connection with a will is taken over by one without: the old will is published.
    let (mut old, _) = v5::connect(broker.addr, anonymous_with_will("take-0000")).await;
    let (new, _) = v5::connect(broker.addr, v5::connect_packet("take-0000")).await;
    match old.expect_close().await.last() {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::SESSION_TAKEN_OVER),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    expect_room_for(&broker, 3, base, connections + 1.0).await;
    v5::disconnect(new).await;
}

/// Opens a connection whose receive buffer is as small as the kernel allows, so a client that
/// stops reading leaves the broker's output in its write buffer after a few KiB.
async fn open_small_window(addr: std::net::SocketAddr) -> RawClient {
    open_window(addr, 1024).await
}

/// Opens a connection with a receive buffer of `bytes` (the kernel doubles it).
async fn open_window(addr: std::net::SocketAddr, bytes: u32) -> RawClient {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("tcp connect");
    stream.set_nodelay(true).expect("nodelay");
    RawClient::over(stream, v5::V)
}

/// Connects `connect` over a small window and subscribes to `filter` at QoS 0; from then on
/// the test does not read it.
async fn stalled_subscriber(
    addr: std::net::SocketAddr,
    connect: postbox::codec::Connect,
    filter: &str,
) -> RawClient {
    let mut c = open_small_window(addr).await;
    c.send(&Packet::Connect(Box::new(connect))).await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    v5::subscribe(&mut c, filter, QoS::AtMostOnce).await;
    c
}

/// Publishes `count` QoS 0 messages of `size` bytes to `topic` (no answer to wait for).
async fn publish_many(c: &mut RawClient, topic: &str, size: usize, count: usize) {
    let payload = vec![0x42; size];
    for _ in 0..count {
        let publish = v5::publish_packet(topic, QoS::AtMostOnce, &payload, 0);
        c.send(&Packet::Publish(publish)).await;
    }
}

/// U5 (low): a subscriber that stops reading keeps the encoded batch (up to a whole large
/// message) in its connection's write buffer, counted nowhere before. While the socket does
/// not take it, it counts as the connection's own: a verified subscriber's in
/// `postbox_partial_packet_bytes` (in the budget), given back when the connection ends.
/// 500 messages of 12 KB (below the size sent from the message itself,
/// `connection::write_queue`): more than the kernel's buffers take for a receive window of
/// 1 KiB, fewer than the budget's pause mark (14.4 MB of 16 MiB). Fails without the count:
/// the gauge stays at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_subscribers_unread_output_counts_in_the_budget() {
    const SIZE: usize = 12_000;
    let broker = password_and_anonymous(16 << 20).await;
    let (mut publisher, _) = v5::connect(broker.addr, sensor1("sensor1-pub")).await;
    let topic = "sensors/sensor1/big";
    let subscriber = stalled_subscriber(broker.addr, sensor1("sensor1-sub"), topic).await;
    publish_many(&mut publisher, topic, SIZE, 500).await;
    // The batch is filled up to 64 KiB again whenever the socket took part of it: at least
    // half of that is left.
    broker.wait_metric(PARTIAL, |n| n >= 32_768.0).await;
    drop(subscriber);
    broker.wait_metric(PARTIAL, |n| n == 0.0).await;
    v5::disconnect(publisher).await;
}

/// U5 for anonymous subscribers: their unread output counts in the anonymous share (512 KiB
/// of a 4 MiB budget) with their partial packets. An anonymous client holding all but the
/// last byte of a 300 KB PUBLISH, and an anonymous subscriber stuck on a 400 KB message, do
/// not fit it together: the subscriber, whose bytes came second, is closed (as for a partial
/// packet past the share: DISCONNECT 0x97, which it does not read; counted in
/// `postbox_anonymous_share_closes_total`), the other stays, and what the subscriber held is
/// given back. The 400 KB payload goes out from its message (`connection::write_queue`),
/// and for an anonymous subscriber counts as its own all the same. Fails without the count
/// (or with a payload sent from its message left out of it): nobody is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_subscribers_unread_output_is_kept_within_their_share() {
    const SIZE: usize = 400_000;
    const HELD: usize = 300_000;
    let broker = password_and_anonymous(BUDGET).await;
    let (mut publisher, _) = v5::connect(broker.addr, sensor1("sensor1-pub")).await;
    let (mut holder, _) = v5::connect(broker.addr, v5::connect_packet("anon-holder")).await;
    let half_sent = v5::encoded_qos0_publish("anon/held", HELD, v5::V);
    holder.send_raw(&half_sent[..HELD]).await;
    broker.wait_metric(PARTIAL, |n| n >= HELD as f64).await;
    let subscriber =
        stalled_subscriber(broker.addr, v5::connect_packet("anon-sub"), "anon/big").await;
    // One message at a time: the subscriber's queue is the anonymous share's too, and a
    // message arriving while the last one is still queued is dropped (queue full), so a burst
    // may never get as far as the write buffer. At most 80 messages, 20 ms apart.
    let mut published = 0;
    while broker.metric(CLOSES).await.unwrap_or(0.0) < 1.0 {
        assert!(
            published < 80,
            "no connection closed after {published} messages"
        );
        publish_many(&mut publisher, "anon/big", SIZE, 1).await;
        published += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        holder
            .recv_within(Duration::from_millis(200))
            .await
            .is_err(),
        "the client whose bytes were counted first stays connected"
    );
    broker
        .wait_metric(PARTIAL, |n| n < (HELD + SIZE / 4) as f64)
        .await;
    drop(subscriber);
    drop(holder);
    broker.wait_metric(PARTIAL, |n| n == 0.0).await;
    v5::disconnect(publisher).await;
}

/// Issue 35, twentieth adversarial pass, F1 (medium): sixteen verified subscribers that stop
/// reading, and one anonymous client publishing messages as large as its share allows (an
/// eighth of the budget, also the largest packet by default). Each delivery was copied whole
/// into every subscriber's write buffer and counted there as the subscriber's own, in the
/// budget, while the message itself (and so the share) was let go at once: in the pass,
/// three 2 MB messages took a 16 MiB budget to 108%, and every verified QoS 1 PUBLISH got
/// 0x97 until the subscribers were closed (never, with keep-alive 0). A large payload now
/// goes out from the message (`connection::write_queue`): held once for all sixteen,
/// charged to the stranger's share until its last byte is sent, so the stranger's next
/// message is what gets 0x97. 8 MB messages on a 64 MiB budget: the kernel takes at most
/// 4 MiB of each for a subscriber that does not read (`tcp_wmem`), so sixteen copies are
/// more than the budget. Fails without it: memory used reaches the budget, and sensor2
/// waits or gets 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_message_waiting_for_subscribers_that_stop_reading_stays_in_its_share() {
    let payload = vec![b's'; 8_000_000];
    strangers_messages_to_stuck_subscribers("f1", |id| {
        v5::publish_packet("w/x", QoS::AtLeastOnce, &payload, id)
    })
    .await;
}

/// Issue 35, twenty-first adversarial pass, G1 (medium): as pass 20's F1 above, with the
/// stranger's bytes in User Properties (v5 §3.3.2.3.7) and a 1-byte payload. The copy F1
/// removed for payloads stayed for the rest of the packet: each verified v5 subscriber
/// that stopped reading held its own copy of the properties, counted as verified memory,
/// and 1.68 MB messages took a 16 MiB budget to 109% with every verified QoS 1 PUBLISH at
/// 0x97. Now a large message's forwarded properties are encoded once and sent from it
/// (`codec::apart`), like its payload (and a long topic). 120 properties of 64,000 bytes
/// (7.7 MB, within the 8 MiB share and largest packet of a 64 MiB budget), for the same
/// reason as F1's 8 MB. Fails without it: memory used reaches the budget, and sensor2 waits
/// or gets 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_large_properties_waiting_for_subscribers_that_stop_reading_stay_in_its_share()
{
    let value = "p".repeat(64_000);
    strangers_messages_to_stuck_subscribers("g1", |id| {
        let mut publish = v5::publish_packet("w/x", QoS::AtLeastOnce, b"1", id);
        publish.properties.user_properties = (0..120)
            .map(|i| (format!("k{i}").into(), value.as_str().into()))
            .collect();
        publish
    })
    .await;
}

/// Issue 35, twenty-second adversarial pass, H1 (medium): messages below the size sent from
/// the message itself (16 KiB, `connection::write_queue`) are copied into each subscriber's
/// write batch, and a verified subscriber that stopped reading kept its batch (about
/// 128 KiB) counted as its own, in the budget, whoever published: one anonymous client's
/// 16,300-byte messages to 140 verified subscribers that had stopped reading took a 16 MiB
/// budget to 108%, and verified PUBLISHes got 0x97. A verified client's copies of a
/// stranger's message now count in the stranger's share instead, and a connection with
/// output waiting takes no further copy once that share is full; one with nothing else to
/// send still takes one, so a full share starves no one (the count of those past the share
/// is `write_queue`'s unit test's: twenty-third pass, I1). The stranger publishes up to 300
/// QoS 1 messages
/// (enough to fill the stuck subscribers' kernel buffers and batches) until one is refused;
/// memory used stays under half the budget, the share within its eighth plus one message per
/// stuck subscriber, a verified subscriber that reads gets every accepted message in order
/// (MQTT-4.6.0-6), a verified client's QoS 1 PUBLISH is accepted, and the share is given back
/// once the stuck subscribers go. Fails without it: memory used passes the budget, and the
/// verified PUBLISH gets 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_messages_copied_to_stuck_verified_subscribers_stay_in_its_share() {
    const BUDGET: u64 = 16 << 20;
    const SUBSCRIBERS: usize = 140;
    const SIZE: usize = 16_300;
    const KEPT: &str = "postbox_anonymous_bytes{part=\"kept\"}";
    let data = tempfile::tempdir().expect("tempdir");
    let broker = fast_passwords_and_anonymous(data.path(), BUDGET).await;
    let mut stuck = Vec::new();
    for i in 0..SUBSCRIBERS {
        let connect = v5::as_user(v5::connect_packet(&format!("h1-stuck-{i}")), "sensor1");
        stuck.push(stalled_subscriber(broker.addr, connect, "w/#").await);
    }
    let (mut reader, _) = v5::connect(broker.addr, sensor1("h1-reader")).await;
    v5::subscribe(&mut reader, "w/#", QoS::AtMostOnce).await;
    let (ids, mut received) = tokio::sync::mpsc::unbounded_channel();
    let reading = tokio::spawn(async move {
        while let Ok(Some(Packet::Publish(p))) = reader.recv_within(WAIT_FOR_MORE).await {
            if ids
                .send(u16::from_be_bytes([p.payload[0], p.payload[1]]))
                .is_err()
            {
                break;
            }
        }
    });
    let mut stranger = v5::connect_id(broker.addr, "h1-stranger").await;
    let mut accepted = 0;
    for id in 1..=300u16 {
        let mut payload = vec![b's'; SIZE];
        payload[..2].copy_from_slice(&id.to_be_bytes());
        let publish = v5::publish_packet("w/x", QoS::AtLeastOnce, &payload, id);
        if v5::publish(&mut stranger, publish).await.is_error() {
            break;
        }
        accepted = id;
    }
    assert!(
        accepted >= 10,
        "the stranger's messages fit its share at first: {accepted}"
    );
    let used = most_shown(&broker, USED).await;
    assert!(
        used < (BUDGET / 2) as f64,
        "memory used {used} of {BUDGET} with {SUBSCRIBERS} verified subscribers stuck"
    );
    let kept = most_shown(&broker, KEPT).await;
    let most = BUDGET as usize / 8 + SUBSCRIBERS * 16_384;
    assert!(kept <= most as f64, "the stranger's share holds {kept}");
    for expected in 1..=accepted {
        let got = tokio::time::timeout(WAIT_FOR_MORE, received.recv()).await;
        assert_eq!(
            got,
            Ok(Some(expected)),
            "the reading subscriber's next message"
        );
    }
    reading.abort();
    let (mut sensor2, _) = v5::connect(
        broker.addr,
        v5::as_user(v5::connect_packet("h1-verified"), "sensor2"),
    )
    .await;
    served_then_all_given_back(&broker, &mut sensor2, "sensors/sensor2/t", stuck).await;
    // What the copies charged to the share is given back with them.
    broker.wait_metric(KEPT, |n| n < 1_000_000.0).await;
}

/// How long a reader waits for the next message before it decides none is coming.
const WAIT_FOR_MORE: Duration = Duration::from_secs(10);

/// Sixteen verified subscribers to `w/#` that stop reading, on a 64 MiB budget; an
/// anonymous client publishes three QoS 1 messages made by `message` (ids 1 to 3): the
/// first fits its share, memory used stays under a quarter of the budget and the share
/// within its eighth, and a verified client's QoS 1 PUBLISH is accepted.
async fn strangers_messages_to_stuck_subscribers(
    prefix: &str,
    message: impl Fn(u16) -> postbox::codec::Publish,
) {
    const BUDGET: u64 = 64 << 20;
    let data = tempfile::tempdir().expect("tempdir");
    let broker = fast_passwords_and_anonymous(data.path(), BUDGET).await;
    let mut stuck = Vec::new();
    for i in 0..16 {
        let connect = v5::as_user(
            v5::connect_packet(&format!("{prefix}-stuck-{i}")),
            "sensor1",
        );
        stuck.push(stalled_subscriber(broker.addr, connect, "w/#").await);
    }
    let mut stranger = v5::connect_id(broker.addr, &format!("{prefix}-stranger")).await;
    let mut accepted = 0;
    for id in 1..=3u16 {
        if !v5::publish(&mut stranger, message(id)).await.is_error() {
            accepted += 1;
        }
    }
    assert!(accepted >= 1, "the stranger's first message fits its share");
    let used = most_shown(&broker, USED).await;
    assert!(
        used < (BUDGET / 4) as f64,
        "memory used {used} of {BUDGET} after {accepted} of the stranger's messages"
    );
    let kept = most_shown(&broker, "postbox_anonymous_bytes{part=\"kept\"}").await;
    assert!(
        kept <= (BUDGET / 8) as f64,
        "the stranger's share holds {kept}"
    );
    let (mut sensor2, _) = v5::connect(
        broker.addr,
        v5::as_user(v5::connect_packet(&format!("{prefix}-verified")), "sensor2"),
    )
    .await;
    served_then_all_given_back(&broker, &mut sensor2, "sensors/sensor2/t", stuck).await;
}

/// A broker without persistence, of `budget` bytes, taking the example users (hashed for
/// speed, in `dir`) and anonymous clients.
async fn fast_passwords_and_anonymous(
    dir: &std::path::Path,
    budget: u64,
) -> common::async_process::BrokerProcess {
    let sections = format!(
        "[storage]\npersistence = false\n[mqtt]\nmax_memory = {budget}\n\
         [auth]\npassword_file = {:?}\nallow_anonymous = true\n",
        common::fast_example_passwords(dir)
    );
    common::async_process::BrokerProcess::spawn_sections(&[""], &sections).await
}

/// A verified client's QoS 1 PUBLISH to `topic` is accepted; once the `stuck` subscribers
/// are gone, memory used is back under 1 MB.
async fn served_then_all_given_back(
    broker: &common::async_process::BrokerProcess,
    verified: &mut RawClient,
    topic: &str,
    stuck: Vec<RawClient>,
) {
    let code = v5::publish_qos1(verified, topic, b"1", 1).await;
    assert!(
        !code.is_error(),
        "the verified PUBLISH to {topic}: {code:?}"
    );
    drop(stuck);
    broker.wait_metric(USED, |n| n < 1_000_000.0).await;
}

/// Issue 35, twenty-first adversarial pass, G3 (medium): sixteen anonymous subscribers that
/// stop reading, each on a topic of its own to which a verified publisher sends two 1.1 MB
/// messages. An anonymous subscriber's output is copied into its write buffer, as before
/// payloads went by reference (`connection::write_queue`), and the copy counts in the
/// anonymous connections' bound, out of `mqtt.max_memory`: past it they are closed, and the
/// verified messages are let go. Sent by reference, each kept a whole verified message
/// alive in the budget while the bound counted only its unsent tail: 14.3 MB of 16 MiB, and
/// verified publishers paused. Fails without it: memory used is over half the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_subscribers_that_stop_reading_do_not_hold_verified_messages_in_the_budget() {
    const SIZE: usize = 1_100_000;
    let budget = 16u64 << 20;
    let broker = password_and_anonymous(budget).await;
    let (mut publisher, _) = v5::connect(broker.addr, sensor1("g3-publisher")).await;
    let mut stuck = Vec::new();
    for i in 0..16 {
        let topic = format!("p/{i}");
        let connect = v5::connect_packet(&format!("g3-anon-{i}"));
        stuck.push(stalled_subscriber(broker.addr, connect, &topic).await);
        publish_many(&mut publisher, &topic, SIZE, 2).await;
    }
    let used = most_shown(&broker, USED).await;
    assert!(
        used < (budget / 2) as f64,
        "memory used {used} of {budget} with sixteen anonymous subscribers stuck"
    );
    served_then_all_given_back(&broker, &mut publisher, "sensors/sensor1/t", stuck).await;
}

/// Issue 35, twenty-first adversarial pass, G2: a subscriber that reads, slowly, behind a
/// backlog of its output is not closed for keep-alive (MQTT-3.1.2-24: it sends PINGREQs
/// within it). The broker held reads back while 64 KiB of output waited, so behind a 600 KB
/// message its PINGREQs waited unread in the socket and it was closed after 1.5 times its
/// keep-alive; the client's packets are now read behind any backlog until the answers to
/// them fill up (`connection::io::ANSWERS_WHILE_BEHIND`), and the socket taking output is
/// what shows it reads. Fails without it: closed within the first seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reading_slowly_behind_its_output_is_not_closed_for_keep_alive() {
    let broker = password_and_anonymous(64 << 20).await;
    slow_reader_stays(&broker, sensor1("g2-slow-reader")).await;
}

/// The same for an anonymous subscriber (twenty-second pass, H4), whose deliveries are
/// copied into its write buffer (`outbound::sends_apart`): a 600 KB copy took the
/// buffer past what stopped reads, and it was closed at 20 s. Fails without it: closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_subscriber_reading_slowly_behind_its_output_is_not_closed_for_keep_alive() {
    let broker = password_and_anonymous(64 << 20).await;
    slow_reader_stays(&broker, v5::connect_packet("h4-slow-reader")).await;
}

/// `connect` (keep-alive set to 2 s) subscribes to `slow/#` over a receive buffer of 64 KiB
/// (smaller ones make the kernel's zero-window probes, not the reader, set the pace), a
/// publisher sends it twenty 600 KB messages, and it reads 16 KiB every 100 ms (a message
/// takes 3.75 s) for 10 s with a PINGREQ every 500 ms: it is not closed, and nobody is
/// closed for keep-alive.
async fn slow_reader_stays(
    broker: &common::async_process::BrokerProcess,
    mut connect: postbox::codec::Connect,
) {
    const CHUNK: usize = 16 * 1024;
    connect.keep_alive = 2;
    let mut reader = open_window(broker.addr, 64 * 1024).await;
    reader.send(&Packet::Connect(Box::new(connect))).await;
    match reader.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK, got {other:?}"),
    }
    v5::subscribe(&mut reader, "slow/#", QoS::AtMostOnce).await;
    let (mut publisher, _) = v5::connect(broker.addr, sensor1("g2-publisher")).await;
    publish_many(&mut publisher, "slow/x", 600_000, 20).await;
    let ping = common::encode(&Packet::PingReq, v5::V);
    for round in 0..100 {
        let got = reader.recv_bytes(CHUNK).await;
        assert_eq!(got.len(), CHUNK, "the connection closed at round {round}");
        if round % 5 == 0 {
            reader.send_raw(&ping).await;
        }
        // The reader's pace, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        broker.metric("postbox_keepalive_timeouts_total").await,
        Some(0.0),
        "a connection was closed for keep-alive"
    );
}

/// Issue 35, twenty-second adversarial pass, H2: with its packets read behind its output
/// (G2 above), a client that never reads but sends a PINGREQ now and then was never closed
/// (still there after 60 s at keep-alive 4 s, holding 2 MB of messages and 2 MB of kernel
/// buffer), where keep-alive had closed it at 8 s. Output that the socket takes none of for
/// 1.5 times the keep-alive (its TCP stack acknowledging nothing more) now closes it (0x8D,
/// `postbox_keepalive_timeouts_total`). Keep-alive 1 s, a PINGREQ every 500 ms for at most
/// 30 s. Fails without it: nothing is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_but_never_reads_is_closed_at_its_keep_alive() {
    let broker = password_and_anonymous(64 << 20).await;
    let mut connect = sensor1("h2-never-reads");
    connect.keep_alive = 1;
    let mut stuck = stalled_subscriber(broker.addr, connect, "stuck/#").await;
    let (mut publisher, _) = v5::connect(broker.addr, sensor1("h2-publisher")).await;
    publish_many(&mut publisher, "stuck/x", 200_000, 20).await;
    let ping = common::encode(&Packet::PingReq, v5::V);
    let pinging = tokio::spawn(async move {
        for _ in 0..60 {
            stuck.send_raw(&ping).await;
            // The client's pace, not a wait for an event.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    broker
        .wait_metric("postbox_keepalive_timeouts_total", |n| n >= 1.0)
        .await;
    pinging.abort();
    v5::disconnect(publisher).await;
}

/// A v5 connection over TLS to `addr` with `connect`, which must be accepted (CONNACK 0x00).
async fn served_over_tls(
    addr: std::net::SocketAddr,
    connect: postbox::codec::Connect,
) -> common::cutting::OpenConnection {
    use common::cutting::{connect_over, Transport};
    let connect = Packet::Connect(Box::new(connect));
    let (c, answer) = connect_over(Transport::Tls, addr, &connect, ProtocolVersion::V5)
        .await
        .unwrap_or_else(|e| panic!("TLS connection: {e}"));
    assert!(
        matches!(&answer, Some(Packet::ConnAck(a)) if a.reason_code == ReasonCode::SUCCESS),
        "{answer:?}"
    );
    c
}

/// An anonymous client's connection counts in the connected share what one idle connection
/// of its listener's kind holds (32 KiB on TLS, 2 KiB on TCP: measured, rustls keeps a whole
/// record's buffer), beside its session; past the share the CONNECT is refused with 0x97
/// (v5 §3.2.2.2, MQTT-3.2.2-8: a Reason Code of 0x80 or more and the connection closed), a
/// password user over the same listener is served, and closing the connections gives the
/// share back. Before, each was charged its session alone (~1 KiB): a TLS listener let the
/// share's worth of anonymous connections in, 20-35 times the share in memory (issue 35,
/// thirteenth adversarial pass, F2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_tls_connections_count_what_tls_holds() {
    use common::cutting::{connect_over, Transport};
    const CONNECTED: &str = "postbox_anonymous_bytes{part=\"connected\"}";
    let passwd = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/passwd.example");
    // A share of 128 KiB: three TLS connections of 33 KiB (connection and session).
    let broker = common::async_process::BrokerProcess::spawn_sections(
        &["", &Transport::Tls.listener_keys()],
        &format!(
            "[storage]\npersistence = false\n[mqtt]\nmax_memory = 1048576\n\
             [auth]\npassword_file = {passwd:?}\nallow_anonymous = true\n"
        ),
    )
    .await;
    let tls = broker.addrs[1];
    let v5 = ProtocolVersion::V5;
    let (open, refused_at) =
        common::open_until_quota_exceeded(40, "anonymous TLS connection", async |n| {
            let connect = Packet::Connect(Box::new(v5::connect_packet(&format!("tls-{n}"))));
            connect_over(Transport::Tls, tls, &connect, v5)
                .await
                .unwrap_or_else(|e| panic!("anonymous TLS connection {n}: {e}"))
        })
        .await;
    let n = refused_at.expect("40 anonymous TLS connections were all admitted in a 128 KiB share");
    assert_eq!(n, 3, "refused at {n}");
    let connected = broker.wait_metric(CONNECTED, |b| b >= 3.0 * 32768.0).await;
    assert!(connected <= 131_072.0, "{CONNECTED} {connected}");
    // A password user over the same listener is served: only strangers are charged.
    let _user = served_over_tls(tls, sensor1("sensor1")).await;
    // Closed, the connections give their share back.
    drop(open);
    broker.wait_metric(CONNECTED, |b| b == 0.0).await;
    let _c = served_over_tls(tls, v5::connect_packet("tls-again")).await;
}
