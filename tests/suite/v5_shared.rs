//! Shared subscriptions (`$share/{group}/{filter}`) over real sockets: one member per group
//! gets each message, strategies, retained messages, No Local, 3.1.1 clients, and what happens
//! to a member's unacknowledged messages when it leaves.
//!
//! Statement ids follow the OASIS MQTT 5.0 text.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::rumq::V4;
use common::v5;
use common::{RawClient, WAIT};
use postbox::codec::{Packet, Publish, QoS, ReasonCode, SubscriptionOptions};
use postbox::config::SharedStrategy;
use postbox::server::RunningServer;

/// Receives (and acknowledges) `n` PUBLISHes spread over `members`; index = member.
async fn collect(members: &mut [&mut RawClient], n: usize) -> Vec<Vec<Publish>> {
    let mut out = vec![Vec::new(); members.len()];
    let mut total = 0;
    let deadline = Instant::now() + WAIT;
    while total < n {
        assert!(
            Instant::now() < deadline,
            "only {total} of {n} messages arrived: {out:?}"
        );
        for (i, m) in members.iter_mut().enumerate() {
            match m.recv_within(Duration::from_millis(20)).await {
                Ok(Some(Packet::Publish(p))) => {
                    v5::ack(m, &p).await;
                    out[i].push(p);
                    total += 1;
                }
                Ok(Some(other)) => panic!("unexpected {other:?}"),
                Ok(None) => panic!("member {i} disconnected"),
                Err(()) => {}
            }
        }
    }
    for m in members.iter_mut() {
        v5::expect_silence(m, Duration::from_millis(200)).await;
    }
    out
}

fn payloads(ps: &[Publish]) -> BTreeSet<String> {
    ps.iter()
        .map(|p| String::from_utf8_lossy(&p.payload).into_owned())
        .collect()
}

async fn publish_n(server: &RunningServer, topic: impl Fn(usize) -> String, n: usize) {
    let mut p = v5::connect_id(server.mqtt_addr, "publisher").await;
    for i in 0..n {
        let packet = v5::publish_packet(&topic(i), QoS::AtLeastOnce, format!("{i}").as_bytes(), 1);
        assert_eq!(v5::publish(&mut p, packet).await, ReasonCode::SUCCESS);
    }
}

fn persistent(id: &str, expiry: u32) -> postbox::codec::Connect {
    v5::persistent_connect(id, expiry)
}

/// Members of one shared group: connected clean in the order of `ids`, then subscribed in
/// that order to the shared `filter` at QoS 1.
async fn members<const N: usize>(
    server: &RunningServer,
    ids: [&str; N],
    filter: &str,
) -> [RawClient; N] {
    let mut members = Vec::with_capacity(N);
    for id in ids {
        members.push(v5::connect_id(server.mqtt_addr, id).await);
    }
    for member in &mut members {
        v5::subscribe(member, filter, QoS::AtLeastOnce).await;
    }
    members
        .try_into()
        .unwrap_or_else(|_| unreachable!("N members"))
}

/// Two members of one shared group: `a` with a session that outlives its connection (60 s)
/// and `b` clean, connected in that order, then both subscribed to the shared `filter` at
/// `qos`.
async fn persistent_and_clean(
    server: &RunningServer,
    [a, b]: [&str; 2],
    filter: &str,
    qos: QoS,
) -> (RawClient, RawClient) {
    let (mut a, _) = v5::connect(server.mqtt_addr, persistent(a, 60)).await;
    let mut b = v5::connect_id(server.mqtt_addr, b).await;
    v5::subscribe(&mut a, filter, qos).await;
    v5::subscribe(&mut b, filter, qos).await;
    (a, b)
}

#[tokio::test]
async fn round_robin_gives_each_message_to_exactly_one_member() {
    // v5 §4.8.2: each message goes to one session of the group; round-robin alternates.
    let server = common::start().await;
    let [mut a, mut b] = members(&server, ["rr-a", "rr-b"], "$share/g/jobs/+").await;
    publish_n(&server, |i| format!("jobs/{i}"), 10).await;
    let got = collect(&mut [&mut a, &mut b], 10).await;
    assert_eq!(got[0].len(), 5, "{got:?}");
    assert_eq!(got[1].len(), 5, "{got:?}");
    let all: BTreeSet<String> = payloads(&got[0])
        .union(&payloads(&got[1]))
        .cloned()
        .collect();
    assert_eq!(all.len(), 10, "every message exactly once");
    assert!(
        got.iter().flatten().all(|p| p.topic.starts_with("jobs/")),
        "topic, not the share filter"
    );
}

#[tokio::test]
async fn groups_are_independent_and_a_non_shared_copy_is_separate() {
    // v5 §4.8.2: a session with a shared and a non-shared subscription may get two copies.
    let server = common::start().await;
    let mut a = v5::connect_id(server.mqtt_addr, "ind-a").await;
    let mut b = v5::connect_id(server.mqtt_addr, "ind-b").await;
    v5::subscribe(&mut a, "$share/one/t", QoS::AtLeastOnce).await;
    v5::subscribe(&mut a, "t", QoS::AtLeastOnce).await;
    v5::subscribe(&mut b, "$share/two/t", QoS::AtLeastOnce).await;
    publish_n(&server, |_| "t".to_owned(), 1).await;
    let got = collect(&mut [&mut a, &mut b], 3).await;
    assert_eq!(got[0].len(), 2, "non-shared copy + group one: {got:?}");
    assert_eq!(got[1].len(), 1, "group two: {got:?}");
}

#[tokio::test]
async fn subscription_qos_and_identifier_are_the_members_own() {
    // MQTT-4.8.2-3 (granted QoS respected), MQTT-3.3.4-3 (its subscription identifier)
    let server = common::start().await;
    let mut a = v5::connect_id(server.mqtt_addr, "q-a").await;
    let opts = v5::options(QoS::AtMostOnce);
    let ack = v5::subscribe_with(&mut a, "$share/g/q", opts, Some(42)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_0]);
    publish_n(&server, |_| "q".to_owned(), 1).await;
    let p = v5::expect_publish(&mut a).await;
    assert_eq!(p.qos, QoS::AtMostOnce);
    assert_eq!(p.properties.subscription_identifiers.to_vec(), [42]);
}

#[tokio::test]
async fn retained_messages_are_not_sent_on_a_shared_subscribe() {
    // v5 §3.3.1.3: retained messages are sent when a new *non-shared* subscription is made.
    let server = common::start().await;
    let mut p = v5::connect_id(server.mqtt_addr, "ret-pub").await;
    v5::publish_retained(&mut p, "ret/1", b"kept", 1).await;
    let mut a = v5::connect_id(server.mqtt_addr, "ret-a").await;
    v5::subscribe(&mut a, "$share/g/ret/+", QoS::AtLeastOnce).await;
    v5::expect_silence(&mut a, Duration::from_millis(300)).await;
    v5::subscribe(&mut a, "ret/+", QoS::AtLeastOnce).await;
    let got = v5::receive(&mut a).await;
    assert!(
        got.retain && &got.payload[..] == b"kept",
        "non-shared subscribe gets it"
    );
}

#[tokio::test]
async fn no_local_on_a_shared_subscription_is_a_protocol_error() {
    // MQTT-3.8.3-4
    let server = common::start().await;
    let mut a = v5::connect_id(server.mqtt_addr, "nl").await;
    a.send(&Packet::Subscribe(postbox::codec::Subscribe {
        packet_id: 1,
        filters: vec![(
            "$share/g/x".into(),
            SubscriptionOptions {
                no_local: true,
                ..Default::default()
            },
        )],
        ..Default::default()
    }))
    .await;
    v5::expect_disconnect(&mut a, ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn malformed_share_names_are_refused_per_filter() {
    // MQTT-4.8.2-1 (empty ShareName), MQTT-4.8.2-2 (wildcard in it): 0x8F Topic Filter invalid,
    // the connection stays. A share with no Topic Filter after it (`$share/g`, `$share/g/`)
    // is a Malformed Packet instead (MQTT-4.7.3-1): tests/suite/input_validity.rs.
    let server = common::start().await;
    let mut a = v5::connect_id(server.mqtt_addr, "bad-share").await;
    for bad in ["$share//x", "$share/g+/x", "$share/g#/x"] {
        let ack = v5::subscribe_with(&mut a, bad, SubscriptionOptions::default(), None).await;
        assert_eq!(
            ack.reason_codes,
            [ReasonCode::TOPIC_FILTER_INVALID],
            "{bad}"
        );
    }
}

#[tokio::test]
async fn mqtt_311_clients_can_share_too() {
    // Accepted from 3.1.1 clients, as Mosquitto and EMQX do.
    let server = common::start().await;
    let mut a = V4::connect(server.mqtt_addr, "v3-a", true).await;
    let mut b = V4::connect(server.mqtt_addr, "v3-b", true).await;
    for c in [&mut a, &mut b] {
        let codes = c
            .subscribe("$share/g/v3/+", rumqttc::QoS::AtLeastOnce)
            .await;
        assert_eq!(
            codes,
            [rumqttc::SubscribeReasonCode::Success(
                rumqttc::QoS::AtLeastOnce
            )]
        );
    }
    publish_n(&server, |i| format!("v3/{i}"), 4).await;
    let mut seen = BTreeSet::new();
    for c in [&mut a, &mut b] {
        for _ in 0..2 {
            let p = c.next_publish().await;
            assert!(seen.insert(p.payload.to_vec()), "duplicate {p:?}");
        }
    }
    assert_eq!(seen.len(), 4);
}

#[tokio::test]
async fn unacknowledged_qos1_moves_to_a_connected_member_on_disconnect() {
    // v5 §4.8.2: a QoS 1 message not acknowledged when the member's connection breaks MAY be
    // sent to another member at once (Postbox does, for queued and sent-but-unacked ones).
    let server = common::start().await;
    let (mut a, mut b) =
        persistent_and_clean(&server, ["mv-a", "mv-b"], "$share/g/work", QoS::AtLeastOnce).await;
    publish_n(&server, |_| "work".to_owned(), 4).await;
    // a receives its two but never acknowledges them; b acknowledges its own.
    let a1 = v5::expect_publish(&mut a).await;
    let a2 = v5::expect_publish(&mut a).await;
    let b_first = collect(&mut [&mut b], 2).await.remove(0);
    drop(a);
    let b_then = collect(&mut [&mut b], 2).await.remove(0);
    assert_eq!(
        payloads(&b_then),
        payloads(&[a1, a2]),
        "a's unacknowledged messages"
    );
    let all: BTreeSet<String> = payloads(&b_first)
        .union(&payloads(&b_then))
        .cloned()
        .collect();
    assert_eq!(all.len(), 4);
    // They left a's session: its reconnect does not resend them.
    let (mut a, ack) = v5::connect(server.mqtt_addr, persistent("mv-a", 60)).await;
    assert!(ack.session_present);
    v5::expect_silence(&mut a, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn sent_qos2_stays_with_its_member_until_it_returns() {
    // MQTT-4.8.2-4: a QoS 2 delivery in progress is completed with that member on reconnect.
    let server = common::start().await;
    let (mut a, mut b) =
        persistent_and_clean(&server, ["q2-a", "q2-b"], "$share/g/q2", QoS::ExactlyOnce).await;
    let mut p = v5::connect_id(server.mqtt_addr, "q2-pub").await;
    for i in 0..2u8 {
        let packet = v5::publish_packet("q2", QoS::ExactlyOnce, &[b'0' + i], 1);
        v5::publish(&mut p, packet).await;
    }
    let held = v5::expect_publish(&mut a).await; // no PUBREC
    let other = v5::receive(&mut b).await;
    assert_ne!(held.payload, other.payload);
    drop(a);
    v5::expect_silence(&mut b, Duration::from_millis(500)).await;
    let (mut a, _) = v5::connect(server.mqtt_addr, persistent("q2-a", 60)).await;
    let again = v5::expect_publish(&mut a).await;
    assert!(again.dup, "retransmitted (MQTT-3.3.1-1)");
    assert_eq!(again.payload, held.payload);
    assert_eq!(again.packet_id, held.packet_id);
}

#[tokio::test]
async fn an_ending_session_hands_its_queue_to_the_remaining_members() {
    // v5 §4.8.2: if the member's session ends, its QoS 1 messages go to another member.
    let server = common::start().await;
    let (a, _) = v5::connect(server.mqtt_addr, persistent("end-a", 1)).await;
    let (b, _) = v5::connect(server.mqtt_addr, persistent("end-b", 60)).await;
    let mut a = a;
    let mut b = b;
    v5::subscribe(&mut a, "$share/g/end", QoS::AtLeastOnce).await;
    v5::subscribe(&mut b, "$share/g/end", QoS::AtLeastOnce).await;
    v5::disconnect(a).await;
    v5::disconnect(b).await;
    // Nobody connected: each message is queued for one (offline) member.
    publish_n(&server, |_| "end".to_owned(), 2).await;
    let (mut b, ack) = v5::connect(server.mqtt_addr, persistent("end-b", 60)).await;
    assert!(ack.session_present);
    // b gets its own queued message, then a's once a's session expires (1 s).
    let got = collect(&mut [&mut b], 2).await.remove(0);
    assert_eq!(payloads(&got).len(), 2, "{got:?}");
}

#[tokio::test]
async fn unsubscribing_leaves_the_group() {
    // MQTT-3.10.4-2 for a shared subscription.
    let server = common::start().await;
    let [mut a, mut b] = members(&server, ["un-a", "un-b"], "$share/g/un").await;
    a.send(&Packet::Unsubscribe(postbox::codec::Unsubscribe {
        packet_id: 5,
        filters: vec!["$share/g/un".into()],
        ..Default::default()
    }))
    .await;
    match a.recv().await {
        Some(Packet::UnsubAck(u)) => assert_eq!(u.reason_codes, [ReasonCode::SUCCESS]),
        other => panic!("{other:?}"),
    }
    publish_n(&server, |_| "un".to_owned(), 4).await;
    let got = collect(&mut [&mut a, &mut b], 4).await;
    assert!(got[0].is_empty() && got[1].len() == 4, "{got:?}");
}

async fn strategy_server(strategy: SharedStrategy) -> RunningServer {
    let mut config = common::test_config();
    config.mqtt.shared_subscription_strategy = strategy;
    common::start_with(config).await
}

#[tokio::test]
async fn hash_strategy_keeps_a_topic_on_one_member() {
    let server = strategy_server(SharedStrategy::Hash).await;
    let [mut a, mut b] = members(&server, ["h-a", "h-b"], "$share/g/h/+").await;
    publish_n(&server, |i| format!("h/{}", i % 4), 16).await;
    let got = collect(&mut [&mut a, &mut b], 16).await;
    let topics = |ps: &[Publish]| {
        ps.iter()
            .map(|p| p.topic.to_string())
            .collect::<BTreeSet<_>>()
    };
    assert!(
        topics(&got[0]).is_disjoint(&topics(&got[1])),
        "each topic went to one member: {:?} / {:?}",
        topics(&got[0]),
        topics(&got[1])
    );
}

#[tokio::test]
async fn random_strategy_delivers_each_message_once() {
    let server = strategy_server(SharedStrategy::Random).await;
    let [mut a, mut b, mut c] = members(&server, ["x-a", "x-b", "x-c"], "$share/g/rand").await;
    publish_n(&server, |_| "rand".to_owned(), 30).await;
    let got = collect(&mut [&mut a, &mut b, &mut c], 30).await;
    let mut all = BTreeSet::new();
    for p in got.iter().flatten() {
        assert!(all.insert(p.payload.to_vec()), "duplicate");
    }
    assert_eq!(all.len(), 30);
}
