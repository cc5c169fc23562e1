//! The broker's side of bridges (issue 15): Mosquitto's bridge flag (`try_private`, protocol
//! level 0x83 / 0x84) accepted with Mosquitto's semantics (No Local and Retain As Published on
//! the bridge's subscriptions), a real Mosquitto bridging into Postbox, the `$bridge/` client
//! ids reserved for the bridges' own sessions, and per-session queue limits (a bridge's
//! session under its own bound and overflow policy).

use crate::common;

use std::time::Duration;

use common::mosquitto::{mosquitto_pub, MosquittoSub};
use common::mosquitto_broker::MosquittoBroker;
use common::{v5, RawClient};
use postbox::codec::{Connect, Packet, ProtocolVersion, Publish, QoS, ReasonCode};
use postbox::config::OverflowPolicy;
use postbox::server::RunningServer;
use postbox::test_support::broker::link::{Link, LinkDelivery, LinkOptions};
use postbox::test_support::broker::SessionQueueLimits;
use postbox::test_support::metrics::ConnackRefusal;

/// A CONNECT of `version` for `client_id`, with Mosquitto's bridge flag as asked.
fn connect_packet(version: ProtocolVersion, client_id: &str, bridge: bool) -> Connect {
    Connect {
        bridge,
        ..common::connect_packet(version, client_id)
    }
}

fn encoded(connect: Connect) -> Vec<u8> {
    let version = connect.protocol;
    common::encode(&Packet::Connect(Box::new(connect)), version)
}

/// Connects a raw client with the bridge flag (3.x) and expects CONNACK 0.
async fn bridge_client(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    id: &str,
) -> RawClient {
    let bytes = encoded(connect_packet(version, id, true));
    let level = if version == ProtocolVersion::V3_1 {
        bytes[10]
    } else {
        bytes[8]
    };
    assert_eq!(
        level,
        version as u8 | 0x80,
        "the bridge flag is on the wire"
    );
    let mut c = RawClient::open(addr, version).await;
    c.send_raw(&bytes).await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected CONNACK 0, got {other:?}"),
    }
    c
}

fn publish(topic: &str, payload: &[u8], id: u16, retain: bool) -> Publish {
    Publish {
        retain,
        ..v5::publish_packet(topic, QoS::AtLeastOnce, payload, id)
    }
}

/// Sends the CONNECT `bytes` on a socket of its own and asserts the 3.x CONNACK refusing it
/// with `return_code`, then the close (MQTT-3.2.2-5).
async fn refused_with(addr: std::net::SocketAddr, bytes: &[u8], return_code: u8) {
    let mut c = RawClient::open(addr, ProtocolVersion::V3_1_1).await;
    c.send_raw(bytes).await;
    assert_eq!(c.recv_bytes(4).await, [0x20, 0x02, 0x00, return_code]);
    assert!(c.expect_close().await.is_empty());
}

/// Mosquitto's bridge flag: a CONNECT at level 0x84 (3.1.1) or 0x83 (3.1, "MQIsdp") is a
/// bridge's, and is accepted (CONNACK 0). 0x85 is no level MQTT knows (Mosquitto never sends
/// it): refused with return code 0x01 (v5 0x84) and closed (MQTT-3.1.2-2).
#[tokio::test]
async fn the_bridge_flag_is_accepted_at_3_x_only() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    drop(bridge_client(addr, ProtocolVersion::V3_1_1, "edge-311").await);
    drop(bridge_client(addr, ProtocolVersion::V3_1, "edge-31").await);

    let mut bytes = encoded(connect_packet(ProtocolVersion::V5, "edge-5", false));
    assert_eq!(bytes[8], 5);
    bytes[8] = 0x85;
    // MQTT-3.1.2-2: CONNACK with return code 0x01 (unacceptable protocol level), then close.
    refused_with(addr, &bytes, 0x01).await;
    let refusals = &server.broker.metrics;
    assert_eq!(
        refusals.connack_refusals(ConnackRefusal::UnsupportedProtocol),
        1
    );
}

/// What Mosquitto gives a client connected with the bridge flag: its subscriptions have No
/// Local (MQTT-3.8.3-3: its own messages are not sent back to it) and Retain As Published
/// (MQTT-3.3.1-12: RETAIN as the publisher set it), though 3.x subscriptions have neither
/// option; an ordinary 3.1.1 subscriber still gets RETAIN 0 on live messages (3.1.1
/// MQTT-3.3.1-9) and its own messages back.
#[tokio::test]
async fn a_bridge_client_gets_no_local_and_retain_as_published() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let mut bridge = bridge_client(addr, ProtocolVersion::V3_1_1, "edge").await;
    v5::subscribe(&mut bridge, "nl/#", QoS::AtLeastOnce).await;
    let mut plain = RawClient::connect(addr, ProtocolVersion::V3_1_1, "plain", true).await;
    v5::subscribe(&mut plain, "nl/#", QoS::AtLeastOnce).await;

    // The bridge's own retained message: the plain subscriber gets it (RETAIN 0, live), the
    // bridge does not. Its PUBACK comes after routing, so an echo would be queued by then.
    bridge
        .send(&Packet::Publish(publish("nl/from-bridge", b"a", 1, true)))
        .await;
    match bridge.recv().await {
        Some(Packet::PubAck(ack)) => assert_eq!(ack.packet_id, 1),
        other => panic!("expected the PUBACK and no echo, got {other:?}"),
    }
    let got = v5::receive(&mut plain).await;
    assert_eq!((&*got.topic, got.retain), ("nl/from-bridge", false));

    // The plain client's retained message reaches the bridge with RETAIN 1, and is the first
    // thing the bridge receives: its own message was not queued for it before.
    assert_eq!(
        v5::publish(&mut plain, publish("nl/from-plain", b"b", 2, true)).await,
        ReasonCode::SUCCESS
    );
    let got = v5::receive(&mut bridge).await;
    assert_eq!(
        (&*got.topic, got.retain),
        ("nl/from-plain", true),
        "the bridge gets the plain client's message, RETAIN as published, and not its own"
    );
    v5::expect_silence(&mut bridge, Duration::from_millis(200)).await;
}

/// Client ids starting with `$bridge/` name the bridges' local sessions: a socket client may
/// not take one (it would take a bridge's queue). Refused with CONNACK 0x85 Client Identifier
/// not valid (v5 §3.2.2.2) / 3.1.1 return code 2 (identifier rejected), counted as
/// `client_id_invalid`; `$bridgehead` is an ordinary id.
#[tokio::test]
async fn bridge_session_ids_are_refused_to_clients() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let (mut c, ack) = v5::open(addr, v5::connect_packet("$bridge/x")).await;
    match ack {
        Some(Packet::ConnAck(ack)) => {
            assert_eq!(ack.reason_code, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
        }
        other => panic!("expected CONNACK 0x85, got {other:?}"),
    }
    assert!(c.expect_close().await.is_empty());

    let bytes = encoded(connect_packet(ProtocolVersion::V3_1_1, "$bridge/x", false));
    refused_with(addr, &bytes, 0x02).await;
    let refusals = &server.broker.metrics;
    assert_eq!(
        refusals.connack_refusals(ConnackRefusal::ClientIdInvalid),
        2
    );
    drop(RawClient::connect(addr, ProtocolVersion::V3_1_1, "$bridgehead", true).await);
}

/// A real Mosquitto (2.x) bridging INTO Postbox with `try_private true` over 3.1.1 (so it
/// connects with level 0x84): messages flow both ways exactly once, none is echoed back to
/// the side it came from, and a retained message published on Postbox is retained on
/// Mosquitto (it travels with RETAIN 1: Retain As Published for the bridge's subscription).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_bridge_into_postbox_does_not_echo() {
    let server = common::start().await;
    let addr = server.mqtt_addr;
    let mut on_postbox = v5::connect_id(addr, "pb-sub").await;
    v5::subscribe(&mut on_postbox, "bb/#", QoS::AtLeastOnce).await;
    let mut pb_pub = v5::connect_id(addr, "pb-pub").await;

    let mosquitto = MosquittoBroker::start(&format!(
        "connection postbox\naddress 127.0.0.1:{}\nbridge_protocol_version mqttv311\n\
         try_private true\ncleansession false\nremote_clientid mosquitto-edge\n\
         notifications false\nrestart_timeout 1\ntopic bb/# both 1\n",
        addr.port()
    ))
    .await;
    // Mosquitto 2.0 logs "Connecting bridge (step 1) postbox (127.0.0.1:PORT)".
    mosquitto.wait_log("Connecting bridge").await;
    mosquitto
        .wait_log("Received CONNACK on connection local.mosquitto-edge")
        .await;
    // Its subscription on Postbox is in place once Postbox answered it.
    mosquitto.wait_log("Received SUBACK").await;
    assert!(server.broker.is_connected("mosquitto-edge"));
    let port = mosquitto.port;
    let mut on_mosquitto =
        MosquittoSub::spawn(port, &["-i", "m-sub", "-q", "1", "-v", "-t", "bb/#"]);
    on_mosquitto.wait_for("SUBACK").await;

    // Mosquitto -> Postbox.
    mosquitto_pub(port, &["-q", "1", "-t", "bb/from-mosquitto", "-m", "one"]).await;
    let got = v5::receive(&mut on_postbox).await;
    assert_eq!(
        (&*got.topic, &got.payload[..]),
        ("bb/from-mosquitto", &b"one"[..])
    );
    on_mosquitto.wait_for("bb/from-mosquitto one").await;
    // A marker from Postbox: it follows any echo of "one" on the bridge's connection (the
    // echo would have been queued for the bridge before Postbox's subscriber got "one").
    v5::publish(&mut pb_pub, publish("bb/marker-1", b"m", 1, false)).await;
    on_mosquitto.wait_for("bb/marker-1 m").await;
    let ones = on_mosquitto
        .consumed()
        .iter()
        .filter(|l| *l == "bb/from-mosquitto one")
        .count();
    assert_eq!(
        ones, 1,
        "Mosquitto's subscriber got its message once (no echo)"
    );
    let marker = v5::receive(&mut on_postbox).await;
    assert_eq!(&*marker.topic, "bb/marker-1");

    // Postbox -> Mosquitto.
    v5::publish(&mut pb_pub, publish("bb/from-postbox", b"two", 2, false)).await;
    on_mosquitto.wait_for("bb/from-postbox two").await;
    mosquitto_pub(port, &["-q", "1", "-t", "bb/marker-2", "-m", "m"]).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let got = v5::receive(&mut on_postbox).await;
        seen.push(got.topic.to_string());
        if &*got.topic == "bb/marker-2" {
            break;
        }
    }
    assert_eq!(
        seen,
        ["bb/from-postbox", "bb/marker-2"],
        "Postbox's subscriber got Postbox's message once, then the marker"
    );

    // A retained message published on Postbox is retained on Mosquitto: a subscriber that
    // comes later is sent it with RETAIN 1 (MQTT-3.3.1-6).
    v5::publish(&mut pb_pub, publish("bb/kept", b"three", 3, true)).await;
    on_mosquitto.wait_for("bb/kept three").await;
    let mut late = MosquittoSub::spawn(
        port,
        &["-i", "m-late", "-t", "bb/kept", "-F", "%r %t %p", "-C", "1"],
    );
    late.wait_for("1 bb/kept three").await;
    late.exit_ok().await;
    // And one retained on Mosquitto is retained on Postbox.
    mosquitto_pub(port, &["-q", "1", "-r", "-t", "bb/kept-m", "-m", "four"]).await;
    let mut arrived = false;
    for _ in 0..4 {
        if &*v5::receive(&mut on_postbox).await.topic == "bb/kept-m" {
            arrived = true;
            break;
        }
    }
    assert!(arrived, "bb/kept-m reached Postbox");
    let mut pb_late = v5::connect_id(addr, "pb-late").await;
    v5::subscribe(&mut pb_late, "bb/kept-m", QoS::AtLeastOnce).await;
    let got = v5::receive(&mut pb_late).await;
    assert_eq!((&*got.payload, got.retain), (&b"four"[..], true));
}

async fn next(link: &mut Link) -> LinkDelivery {
    let d = tokio::time::timeout(common::WAIT, link.recv())
        .await
        .expect("a delivery within the wait")
        .expect("store ok")
        .expect("link still attached");
    link.ack(&d).await.expect("ack");
    d
}

/// The set-up both per-session bound tests compare against: a broker-wide bound of
/// `broker_wide` messages (drop-new); the bridge's session `bridge` under its own bound
/// (`max_messages`, `overflow`; no byte bound), subscribed to `filter` and offline; another
/// offline session ("other") on the same filter under the broker-wide bound. Returns the
/// server, the other session's CONNECT (clean start 0, to resume it) and a publisher `pub`,
/// connected.
async fn bridge_and_other_offline(
    broker_wide: usize,
    bridge: &str,
    (max_messages, overflow): (usize, OverflowPolicy),
    filter: &str,
) -> (RunningServer, Connect, RawClient) {
    let mut config = common::test_config();
    config.mqtt.max_queued_messages = broker_wide;
    config.mqtt.queue_overflow = OverflowPolicy::DropNew;
    let server = common::start_with(config).await;
    let limits = SessionQueueLimits {
        max_messages,
        max_bytes: 0,
        overflow,
    };
    server.broker.set_queue_limits(bridge, limits);
    let link = Link::connect(&server.broker, LinkOptions::persistent(bridge));
    link.subscribe(filter, QoS::AtLeastOnce).expect("filter");
    link.disconnect();
    let mut offline = v5::persistent_connect("other", 600);
    offline.clean_start = false;
    let (mut other, _) = v5::connect(server.mqtt_addr, offline.clone()).await;
    v5::subscribe(&mut other, filter, QoS::AtLeastOnce).await;
    v5::disconnect(other).await;
    let publisher = v5::connect_id(server.mqtt_addr, "pub").await;
    (server, offline, publisher)
}

/// A bridge's session under its own bound with `refuse`: once it holds its bound offline, a
/// local v5 QoS 1 / 2 publisher gets PUBACK / PUBREC 0x97 Quota exceeded (v5 §3.4.2.1,
/// §3.5.2.1) and a 3.1.1 one is disconnected; another session on the topic, under the
/// broker-wide bound, does not change that and is not refused on its own.
#[tokio::test]
async fn a_bridge_session_with_refuse_refuses_at_its_own_bound() {
    let (server, offline, mut publisher) =
        bridge_and_other_offline(100, "$bridge/q", (3, OverflowPolicy::Refuse), "lim/#").await;
    let broker = &server.broker;
    v5::fill_a_queue_of_3_then_refused(&mut publisher, "lim/t", "the bridge's queue of 3").await;
    assert_eq!(broker.metrics.messages_refused_queue_full[1].get(), 1);
    // 3.1.1 has no negative ack: closed without a PUBACK.
    common::expect_v311_publish_refused(
        server.mqtt_addr,
        "old",
        "lim/t",
        b"6",
        6,
        "no PUBACK for a refused message",
    )
    .await;
    // A topic only the other session (broker-wide bound, drop-new) takes is not refused.
    let (mut other, _) = v5::connect(server.mqtt_addr, offline.clone()).await;
    let seen = v5::receive_payloads(&mut other, 3).await;
    assert_eq!(
        seen,
        [[1], [2], [3]],
        "the other session got the accepted ones"
    );
    v5::subscribe(&mut other, "solo/#", QoS::AtLeastOnce).await;
    v5::disconnect(other).await;
    for i in 10..=14u16 {
        let p = v5::publish_packet("solo/t", QoS::AtLeastOnce, b"x", i);
        assert_eq!(v5::publish(&mut publisher, p).await, ReasonCode::SUCCESS);
    }

    // The bridge's session drains: accepted again, and it holds what was accepted, in order.
    let mut link = Link::connect(broker, LinkOptions::persistent("$bridge/q"));
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(next(&mut link).await.message.payload.to_vec());
    }
    assert_eq!(got, [[1], [2], [3]]);
    let p = v5::publish_packet("lim/t", QoS::AtLeastOnce, b"7", 7);
    assert_eq!(v5::publish(&mut publisher, p).await, ReasonCode::SUCCESS);
    assert_eq!(&next(&mut link).await.message.payload[..], b"7");
}

/// A bridge's session with `drop-oldest` and a bound of 2 keeps the newest 2 while offline;
/// each message it drops is counted in `postbox_messages_dropped_total{reason="queue_full"}`.
/// Another offline session on the same topic keeps the broker-wide bound (5, drop-new): it
/// holds its first 5.
#[tokio::test]
async fn a_bridge_session_with_drop_oldest_keeps_the_newest() {
    let (server, offline, mut publisher) =
        bridge_and_other_offline(5, "$bridge/d", (2, OverflowPolicy::DropOldest), "old/#").await;
    let broker = &server.broker;
    for i in 1..=6u16 {
        let p = v5::publish_packet("old/t", QoS::AtLeastOnce, &[i as u8], i);
        assert_eq!(v5::publish(&mut publisher, p).await, ReasonCode::SUCCESS);
    }
    // The bridge's session: 4 oldest dropped; the other: the sixth dropped (drop-new).
    assert_eq!(broker.metrics.messages_dropped_queue_full[1].get(), 4 + 1);

    let mut link = Link::connect(broker, LinkOptions::persistent("$bridge/d"));
    let got = [next(&mut link).await, next(&mut link).await].map(|d| d.message.payload.to_vec());
    assert_eq!(got, [[5], [6]], "the bridge's session kept the newest two");
    let (mut other, _) = v5::connect(server.mqtt_addr, offline).await;
    let seen = v5::receive_payloads(&mut other, 5).await;
    assert_eq!(
        seen,
        [[1], [2], [3], [4], [5]],
        "the other kept the global bound of 5"
    );
    v5::expect_silence(&mut other, Duration::from_millis(200)).await;
}
