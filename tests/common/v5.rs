//! Byte-level MQTT 5 helpers on top of [`RawClient`]: connect with chosen properties,
//! subscribe, publish and wait for the acknowledgement, expect or rule out packets.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use postbox::codec::{
    Auth, AuthProperties, ConnAck, Connect, Disconnect, LastWill, Packet, ProtocolVersion,
    PubResponse, Publish, PublishProperties, QoS, ReasonCode, SubAck, Subscribe,
    SubscriptionOptions,
};

use super::RawClient;

/// The protocol level of every helper here.
pub const V: ProtocolVersion = ProtocolVersion::V5;

/// A clean-start v5 CONNECT with keep-alive 60 and no properties; adjust fields as needed.
pub fn connect_packet(client_id: &str) -> Connect {
    super::connect_packet(V, client_id)
}

/// A v5 CONNECT (Clean Start 0) for a session that outlives the connection by `expiry`
/// seconds (its Session Expiry Interval).
pub fn persistent_connect(client_id: &str, expiry: u32) -> Connect {
    let mut connect = connect_packet(client_id);
    connect.clean_start = false;
    connect.properties.session_expiry_interval = Some(expiry);
    connect
}

/// A will message on `topic` with `payload`, `qos` and `retain`, and no properties (no delay):
/// for a CONNECT's `will`.
pub fn will(topic: &str, payload: &[u8], qos: QoS, retain: bool) -> LastWill {
    LastWill {
        topic: topic.into(),
        payload: Bytes::copy_from_slice(payload),
        qos,
        retain,
        properties: Default::default(),
    }
}

/// Sends `connect` and returns the client with the broker's first answer (CONNACK, AUTH, or
/// `None` if it closed).
pub async fn open(addr: SocketAddr, connect: Connect) -> (RawClient, Option<Packet>) {
    let mut c = RawClient::open(addr, V).await;
    c.send(&Packet::Connect(Box::new(connect))).await;
    let first = c.recv().await;
    (c, first)
}

/// Sends `connect` and expects a successful CONNACK.
pub async fn connect(addr: SocketAddr, connect: Connect) -> (RawClient, ConnAck) {
    match open(addr, connect).await {
        (c, Some(Packet::ConnAck(ack))) if ack.reason_code == ReasonCode::SUCCESS => (c, ack),
        (_, other) => panic!("expected a successful CONNACK, got {other:?}"),
    }
}

/// Connects clean with default properties.
pub async fn connect_id(addr: SocketAddr, client_id: &str) -> RawClient {
    connect(addr, connect_packet(client_id)).await.0
}

/// Subscribes to one filter and returns the SUBACK.
pub async fn subscribe_with(
    c: &mut RawClient,
    filter: &str,
    options: SubscriptionOptions,
    identifier: Option<u32>,
) -> SubAck {
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: 77,
        subscription_identifier: identifier,
        filters: vec![(filter.into(), options)],
        ..Default::default()
    }))
    .await;
    loop {
        match c.recv().await {
            Some(Packet::SubAck(ack)) => {
                assert_eq!(ack.packet_id, 77);
                return ack;
            }
            Some(_) => {}
            None => panic!("connection closed before SUBACK"),
        }
    }
}

/// A subscriber left offline: `client_id` connects with a session that outlives the
/// connection (1 h), subscribes to `filter` at QoS 1 and disconnects normally, so that what
/// is published next queues for it.
pub async fn offline_subscriber(addr: SocketAddr, client_id: &str, filter: &str) {
    let (mut c, _) = connect(addr, persistent_connect(client_id, 3600)).await;
    subscribe(&mut c, filter, QoS::AtLeastOnce).await;
    disconnect(c).await;
}

/// Publishes `count` retained QoS 0 messages of `size` bytes to `topic` as fast as the
/// socket takes them (one frame, its payload's first 8 bytes the message's number, `%08d`),
/// with a PINGREQ after every 50 whose PINGRESP is awaited before `each_50` runs: a client
/// rewriting one retained value at full speed, kept in step with the broker.
pub async fn rewrite_retained(
    c: &mut RawClient,
    topic: &str,
    size: usize,
    count: usize,
    mut each_50: impl FnMut(),
) {
    let mut p = publish_packet(topic, QoS::AtMostOnce, &vec![b'r'; size], 0);
    p.retain = true;
    let mut frame = bytes::BytesMut::new();
    postbox::codec::encode(&Packet::Publish(p), ProtocolVersion::V5, &mut frame).expect("encode");
    let mut frame = frame.to_vec();
    let at = frame.len() - size;
    for i in 0..count {
        frame[at..at + 8].copy_from_slice(format!("{i:08}").as_bytes());
        c.send_raw(&frame).await;
        if i % 50 == 49 {
            c.send(&Packet::PingReq).await;
            assert!(
                matches!(c.recv().await, Some(Packet::PingResp)),
                "PINGRESP after message {i}"
            );
            each_50();
        }
    }
}

/// Publishes `payload` on `topic` at QoS 1 with RETAIN 1 (packet id `packet_id`); the
/// PUBACK's reason code.
pub async fn publish_retained(
    c: &mut RawClient,
    topic: &str,
    payload: &[u8],
    packet_id: u16,
) -> ReasonCode {
    let mut p = publish_packet(topic, QoS::AtLeastOnce, payload, packet_id);
    p.retain = true;
    publish(c, p).await
}

/// The bytes of a QoS 0 PUBLISH on `topic` at `version` whose payload is `size` bytes of
/// 0x42: a large packet to send whole, or to leave half-sent.
pub fn encoded_qos0_publish(topic: &str, size: usize, version: ProtocolVersion) -> Vec<u8> {
    let publish = publish_packet(topic, QoS::AtMostOnce, &vec![0x42; size], 0);
    super::encode(&Packet::Publish(publish), version)
}

/// Client `client_id` connected (clean, v5) and subscribed to `filter` at `qos` ([`subscribe`]).
pub async fn subscriber(addr: SocketAddr, client_id: &str, filter: &str, qos: QoS) -> RawClient {
    let mut c = connect_id(addr, client_id).await;
    subscribe(&mut c, filter, qos).await;
    c
}

/// Subscription options asking for `qos`, the others at their defaults.
pub fn options(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..Default::default()
    }
}

/// Subscribes to one filter at `qos` and asserts it was granted.
pub async fn subscribe(c: &mut RawClient, filter: &str, qos: QoS) {
    let ack = subscribe_with(c, filter, options(qos), None).await;
    assert_eq!(
        ack.reason_codes,
        [ReasonCode(qos as u8)],
        "SUBACK for {filter}"
    );
}

/// A SUBSCRIBE of one filter at `qos` with default options, packet id `id`.
pub fn subscribe_packet(id: u16, filter: &str, qos: QoS) -> Subscribe {
    Subscribe {
        packet_id: id,
        filters: vec![(filter.into(), options(qos))],
        ..Default::default()
    }
}

/// A PUBLISH with the given fields (packet id 0 for QoS 0, else `id`).
pub fn publish_packet(topic: &str, qos: QoS, payload: &[u8], id: u16) -> Publish {
    Publish {
        qos,
        topic: topic.into(),
        packet_id: if qos == QoS::AtMostOnce { 0 } else { id },
        payload: payload.to_vec().into(),
        ..Default::default()
    }
}

/// Sends a PUBLISH and completes its QoS flow; returns the PUBACK / PUBREC reason code
/// (SUCCESS for QoS 0). Other packets arriving meanwhile are skipped.
pub async fn publish(c: &mut RawClient, publish: Publish) -> ReasonCode {
    let qos = publish.qos;
    let id = publish.packet_id;
    c.send(&Packet::Publish(publish)).await;
    match qos {
        QoS::AtMostOnce => ReasonCode::SUCCESS,
        QoS::AtLeastOnce => loop {
            match c.recv().await {
                Some(Packet::PubAck(a)) if a.packet_id == id => return a.reason_code,
                Some(_) => {}
                None => panic!("closed before PUBACK"),
            }
        },
        QoS::ExactlyOnce => {
            let code = loop {
                match c.recv().await {
                    Some(Packet::PubRec(r)) if r.packet_id == id => break r.reason_code,
                    Some(_) => {}
                    None => panic!("closed before PUBREC"),
                }
            };
            if code.is_error() {
                return code;
            }
            c.send(&Packet::PubRel(PubResponse::new(id))).await;
            loop {
                match c.recv().await {
                    Some(Packet::PubComp(p)) if p.packet_id == id => return code,
                    Some(_) => {}
                    None => panic!("closed before PUBCOMP"),
                }
            }
        }
    }
}

/// Publishes `payload` to `topic` at QoS 1 with packet id `id` and returns the PUBACK reason
/// code: the tests that check how the broker answers one QoS 1 message (accepted, refused
/// while NATS is down, ...) then need one line to send it.
pub async fn publish_qos1(c: &mut RawClient, topic: &str, payload: &[u8], id: u16) -> ReasonCode {
    publish(c, publish_packet(topic, QoS::AtLeastOnce, payload, id)).await
}

/// Publishes three QoS 1 messages to `topic` (payloads and ids 1, 2, 3), which must be
/// accepted, then a fourth at QoS 1 and a fifth at QoS 2, which must both be refused with 0x97
/// Quota exceeded (PUBACK, then PUBREC; v5 §3.4.2.1, §3.5.2.1): the `queue_overflow = "refuse"`
/// check for a queue of 3 that is full (`whose` names that queue in the failure message).
pub async fn fill_a_queue_of_3_then_refused(c: &mut RawClient, topic: &str, whose: &str) {
    for i in 1..=3u16 {
        let p = publish_packet(topic, QoS::AtLeastOnce, &[i as u8], i);
        assert_eq!(
            publish(c, p).await,
            ReasonCode::SUCCESS,
            "{whose}: message {i}"
        );
    }
    let p = publish_packet(topic, QoS::AtLeastOnce, b"4", 4);
    assert_eq!(
        publish(c, p).await,
        ReasonCode::QUOTA_EXCEEDED,
        "{whose} is full"
    );
    let p = publish_packet(topic, QoS::ExactlyOnce, b"5", 5);
    assert_eq!(
        publish(c, p).await,
        ReasonCode::QUOTA_EXCEEDED,
        "{whose}: QoS 2: PUBREC 0x97"
    );
}

/// Publishes `topics` in order from a fresh client `client_id`, each at QoS 1 (packet id 1,
/// acknowledged before the next) with its index as payload: for the tests of what a
/// subscriber sees of a sequence of topics (topic aliases).
pub async fn publish_in_order(addr: SocketAddr, client_id: &str, topics: &[&str]) {
    let mut p = connect_id(addr, client_id).await;
    for (i, t) in topics.iter().enumerate() {
        publish(
            &mut p,
            publish_packet(t, QoS::AtLeastOnce, format!("{i}").as_bytes(), 1),
        )
        .await;
    }
}

/// Publishes with properties.
pub async fn publish_props(
    c: &mut RawClient,
    topic: &str,
    qos: QoS,
    payload: &[u8],
    properties: PublishProperties,
) -> ReasonCode {
    let mut p = publish_packet(topic, qos, payload, 1);
    p.properties = properties;
    publish(c, p).await
}

/// The next packet, which must be a PUBLISH.
pub async fn expect_publish(c: &mut RawClient) -> Publish {
    match c.recv().await {
        Some(Packet::Publish(p)) => p,
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// Acknowledges a received PUBLISH (PUBACK, or PUBREC then PUBCOMP after the PUBREL).
pub async fn ack(c: &mut RawClient, p: &Publish) {
    match p.qos {
        QoS::AtMostOnce => {}
        QoS::AtLeastOnce => c.send(&Packet::PubAck(PubResponse::new(p.packet_id))).await,
        QoS::ExactlyOnce => {
            c.send(&Packet::PubRec(PubResponse::new(p.packet_id))).await;
            match c.recv().await {
                Some(Packet::PubRel(r)) if r.packet_id == p.packet_id => {}
                other => panic!("expected PUBREL, got {other:?}"),
            }
            c.send(&Packet::PubComp(PubResponse::new(p.packet_id)))
                .await;
        }
    }
}

/// Receives the next PUBLISH and acknowledges it.
pub async fn receive(c: &mut RawClient) -> Publish {
    let p = expect_publish(c).await;
    ack(c, &p).await;
    p
}

/// The payloads of the next `count` PUBLISHes `c` receives (each acknowledged), in order.
pub async fn receive_payloads(c: &mut RawClient, count: usize) -> Vec<Vec<u8>> {
    let mut payloads = Vec::with_capacity(count);
    for _ in 0..count {
        payloads.push(receive(c).await.payload.to_vec());
    }
    payloads
}

/// Asserts that nothing arrives within `limit` (for "must not be sent" checks; keep short).
pub async fn expect_silence(c: &mut RawClient, limit: Duration) {
    if let Ok(p) = c.recv_within(limit).await {
        panic!("expected nothing, got {p:?}");
    }
}

/// Expects the broker to send DISCONNECT with `code` and close.
pub async fn expect_disconnect(c: &mut RawClient, code: ReasonCode) -> Disconnect {
    let seen = c.expect_close().await;
    match seen.last() {
        Some(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, code, "DISCONNECT reason (seen: {seen:?})");
            d.clone()
        }
        _ => panic!("expected DISCONNECT {code:?} before close, got {seen:?}"),
    }
}

/// Expects the broker to send exactly one DISCONNECT, with `code`, and close: stricter than
/// [`expect_disconnect`], for the tests where nothing else may come first.
pub async fn expect_only_disconnect(c: &mut RawClient, code: ReasonCode) {
    match c.expect_close().await.as_slice() {
        [Packet::Disconnect(d)] => assert_eq!(d.reason_code, code, "DISCONNECT reason"),
        other => panic!("expected only DISCONNECT {code:?} before close, got {other:?}"),
    }
}

/// Expects the broker to answer the CONNECT with exactly one CONNACK, with `code`, and close:
/// the check for a CONNECT the broker refuses.
pub async fn expect_only_connack(c: &mut RawClient, code: ReasonCode) {
    match c.expect_close().await.as_slice() {
        [Packet::ConnAck(ack)] => assert_eq!(ack.reason_code, code, "CONNACK reason"),
        other => panic!("expected only CONNACK {code:?} before close, got {other:?}"),
    }
}

/// Sends a normal DISCONNECT and waits for the close.
pub async fn disconnect(mut c: RawClient) {
    c.send(&Packet::Disconnect(Disconnect::default())).await;
    let _ = c.expect_close().await;
}

/// Sends DISCONNECT with a reason code and properties.
pub async fn disconnect_with(mut c: RawClient, d: Disconnect) {
    c.send(&Packet::Disconnect(d)).await;
    let _ = c.expect_close().await;
}

/// Sends a v5 CONNECT for `id` over `stream` and returns the CONNACK's reason code (`None`:
/// closed without one).
pub async fn connack_over<S>(stream: &mut S, id: &str) -> Option<ReasonCode>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut out = bytes::BytesMut::new();
    let connect = Packet::Connect(Box::new(connect_packet(id)));
    postbox::codec::encode(&connect, V, &mut out).expect("encode");
    tokio::io::AsyncWriteExt::write_all(stream, &out)
        .await
        .expect("write CONNECT");
    let mut buf = bytes::BytesMut::new();
    tokio::time::timeout(super::WAIT, async {
        loop {
            match postbox::codec::decode(&mut buf, Some(V), 1 << 20) {
                Ok(Some(Packet::ConnAck(ack))) => return Some(ack.reason_code),
                Ok(Some(other)) => panic!("expected CONNACK, got {other:?}"),
                Ok(None) => {}
                Err(e) => panic!("undecodable answer: {e}"),
            }
            match tokio::io::AsyncReadExt::read_buf(stream, &mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("an answer within WAIT")
}

/// `connect` as `user` with the password `<user>-secret` (the example password file's,
/// `common::fast_example_passwords`).
pub fn as_user(mut connect: Connect, user: &str) -> Connect {
    connect.username = Some(user.into());
    connect.password = Some(Bytes::from(format!("{user}-secret")));
    connect
}

/// A clean-start CONNECT for `id` that opens enhanced authentication (MQTT 5 §4.12) with
/// `method` and `data`: the one copy for the SCRAM tests and the test-only methods of `v5_auth`.
pub fn auth_connect(id: &str, method: &str, data: impl AsRef<[u8]>) -> Connect {
    let mut c = connect_packet(id);
    c.properties.authentication_method = Some(method.into());
    c.properties.authentication_data = Some(Bytes::copy_from_slice(data.as_ref()));
    c
}

/// An AUTH packet with `code`, `method` and `data` (a client's step of §4.12).
pub fn auth_packet(code: ReasonCode, method: &str, data: &str) -> Packet {
    Packet::Auth(Auth {
        reason_code: code,
        properties: AuthProperties {
            authentication_method: Some(method.into()),
            authentication_data: Some(Bytes::copy_from_slice(data.as_bytes())),
            ..Default::default()
        },
    })
}

/// Expects AUTH 0x18 with `method` (MQTT-4.12.0-2, MQTT-4.12.0-5) and returns its data as
/// text: the broker's challenge, checked the same way by every enhanced-auth test.
pub fn expect_challenge(packet: Option<Packet>, method: &str) -> String {
    match packet {
        Some(Packet::Auth(a)) => {
            assert_eq!(
                a.reason_code,
                ReasonCode::CONTINUE_AUTHENTICATION,
                "MQTT-4.12.0-2"
            );
            assert_eq!(
                a.properties.authentication_method.as_deref(),
                Some(method),
                "MQTT-4.12.0-5"
            );
            String::from_utf8(a.properties.authentication_data.expect("data").to_vec())
                .expect("utf8")
        }
        other => panic!("expected AUTH 0x18, got {other:?}"),
    }
}
