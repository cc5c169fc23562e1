//! What a connection holds beside its packets counts where its partial packets count (issue
//! 35, twelfth adversarial pass): its inbound topic aliases (U6), its will (U7), and the
//! output a subscriber does not read (U5). A verified client's in `mqtt.max_memory`
//! (`postbox_partial_packet_bytes`, `postbox_memory_used_bytes`), an anonymous client's in
//! the anonymous share (an eighth of it), past which the connection is closed (aliases,
//! output: DISCONNECT 0x97, `postbox_anonymous_share_closes_total`) or the CONNECT refused
//! (a will: 0x97, 3.1.1 return code 3).

use std::time::Duration;

use postbox::codec::{Packet, QoS, ReasonCode};

use crate::client_bounds::{password_and_anonymous, sensor1};
use crate::common;
use common::{v5, RawClient};

const PARTIAL: &str = "postbox_partial_packet_bytes";
const CLOSES: &str = "postbox_anonymous_share_closes_total";
/// A budget of 4 MiB: the anonymous share is 512 KiB.
const BUDGET: u64 = 4 << 20;

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
