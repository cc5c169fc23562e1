//! Bounds on connected clients (issue 13: "max connections globally, per listener and per
//! source IP"), against the real binary over real sockets: per source address of a listener
//! (`max_connections_per_ip`, CONNACK 0x97 Quota exceeded) and over all listeners
//! (`mqtt.max_connections`, CONNACK 0x89 Server busy); 3.1.1 clients get return code 0x03
//! Server unavailable for both. The per-listener bound is `pending_connections.rs`'s.
//!
//! A refused CONNECT is answered (MQTT 5.0 §3.2.2.2: a CONNACK with a reason code >= 0x80,
//! then the close, MQTT-3.2.2-7; 3.1.1 §3.2.2.3, MQTT-3.2.2-5), counted in
//! `postbox_connections_refused_total{reason}`, and every way a connected client goes
//! (DISCONNECT, takeover, protocol error, lost socket) gives its slot back: each is followed
//! by a new client taking the freed slot. Several hosts are played by loopback source
//! addresses 127.0.0.x.

use std::net::{Ipv4Addr, SocketAddr};

use postbox::codec::{Packet, ProtocolVersion, ReasonCode};

use crate::common;
use common::async_process::{connect_from, BrokerProcess};
use common::{connect_bytes, v5, RawClient};

const CONNECTED: &str = "postbox_connections_current";

fn host(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A client socket to `addr` from 127.0.0.`source`, no CONNECT sent yet.
async fn open_from(addr: SocketAddr, source: u8, version: ProtocolVersion) -> RawClient {
    RawClient::over(connect_from(host(source), addr).await, version)
}

/// A v5 CONNECT for `id` from 127.0.0.`source`: the client and the CONNACK's reason code.
async fn connect_v5(addr: SocketAddr, source: u8, id: &str) -> (RawClient, ReasonCode) {
    let mut c = open_from(addr, source, v5::V).await;
    c.send(&Packet::Connect(Box::new(v5::connect_packet(id))))
        .await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => (c, ack.reason_code),
        other => panic!("expected CONNACK for {id}, got {other:?}"),
    }
}

/// A v5 client that must be let in.
async fn connected(addr: SocketAddr, source: u8, id: &str) -> RawClient {
    let (c, code) = connect_v5(addr, source, id).await;
    assert_eq!(code, ReasonCode::SUCCESS, "{id} from 127.0.0.{source}");
    c
}

/// A 3.1.1 CONNECT's return code (decoded as its v5 equivalent: 3 = `SERVER_UNAVAILABLE`).
async fn connect_v311(addr: SocketAddr, source: u8, id: &str) -> ReasonCode {
    let mut c = open_from(addr, source, ProtocolVersion::V3_1_1).await;
    c.send_raw(&connect_bytes(id)).await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => ack.reason_code,
        other => panic!("expected CONNACK for {id}, got {other:?}"),
    }
}

/// Waits until the broker holds `n` open connections: a client that left has given its slot
/// back once its connection is gone (the slots count `postbox_connections_current`).
async fn open_connections_become(broker: &BrokerProcess, n: usize) {
    broker.wait_metric(CONNECTED, |v| v == n as f64).await;
}

/// `postbox_connections_refused_total{reason="max_connections_per_ip"}` now.
async fn refused_per_ip(broker: &BrokerProcess) -> Option<f64> {
    broker
        .metric("postbox_connections_refused_total{reason=\"max_connections_per_ip\"}")
        .await
}

/// `max_connections_per_ip = 2`: a third client from one address gets CONNACK 0x97 Quota
/// exceeded (3.1.1: 0x03), another address has its own two, and each way a client of the
/// full address leaves frees its slot for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_per_ip_refuses_with_quota_exceeded_and_every_exit_frees_a_slot() {
    let broker = BrokerProcess::spawn("max_connections_per_ip = 2", "").await;
    let addr = broker.addr;
    let mut a = connected(addr, 2, "a").await;
    let b = connected(addr, 2, "b").await;
    assert_eq!(connect_v5(addr, 2, "c").await.1, ReasonCode::QUOTA_EXCEEDED);
    assert_eq!(
        connect_v311(addr, 2, "d").await,
        ReasonCode::SERVER_UNAVAILABLE
    );
    let _e = connected(addr, 3, "e").await;
    assert_eq!(refused_per_ip(&broker).await, Some(2.0));
    open_connections_become(&broker, 3).await; // a, b, e

    // DISCONNECT.
    v5::disconnect(b).await;
    open_connections_become(&broker, 2).await;
    let f = connected(addr, 2, "f").await;
    assert_eq!(
        connect_v5(addr, 2, "still-full").await.1,
        ReasonCode::QUOTA_EXCEEDED
    );

    // Takeover from another address: the old connection's slot on 127.0.0.2 comes back.
    let _a_moved = connected(addr, 4, "a").await;
    v5::expect_disconnect(&mut a, ReasonCode::SESSION_TAKEN_OVER).await;
    drop(a);
    open_connections_become(&broker, 3).await; // a (on .4), e, f
    let mut g = connected(addr, 2, "g").await;

    // A protocol error (a second CONNECT, MQTT-3.1.0-2).
    g.send(&Packet::Connect(Box::new(v5::connect_packet("g"))))
        .await;
    v5::expect_disconnect(&mut g, ReasonCode::PROTOCOL_ERROR).await;
    drop(g);
    open_connections_become(&broker, 3).await;
    let _h = connected(addr, 2, "h").await;

    // The socket lost without a word.
    drop(f);
    open_connections_become(&broker, 3).await; // a, e, h
    let _i = connected(addr, 2, "i").await;
    assert_eq!(refused_per_ip(&broker).await, Some(3.0));
    broker.kill().await;
}

/// `mqtt.max_connections = 2` spans the listeners: with one client on each of two listeners,
/// a third on either gets CONNACK 0x89 Server busy (3.1.1: 0x03); a client taking over its own
/// session is let in; a client leaving frees a slot for any listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_max_connections_spans_listeners() {
    let broker = BrokerProcess::spawn_listeners(&["", ""], "max_connections = 2").await;
    let (one, two) = (broker.addrs[0], broker.addrs[1]);
    let first = connected(one, 2, "first").await;
    let mut second = connected(two, 3, "second").await;
    assert_eq!(connect_v5(one, 4, "third").await.1, ReasonCode::SERVER_BUSY);
    assert_eq!(
        connect_v311(two, 5, "fourth").await,
        ReasonCode::SERVER_UNAVAILABLE
    );
    // MQTT-3.1.4-3: "second" again takes its session over; the bound does not keep it out.
    let _second_again = connected(one, 3, "second").await;
    v5::expect_disconnect(&mut second, ReasonCode::SESSION_TAKEN_OVER).await;
    drop(second);
    assert_eq!(
        broker
            .metric("postbox_connections_refused_total{reason=\"global_max_connections\"}")
            .await,
        Some(2.0)
    );
    open_connections_become(&broker, 2).await;
    assert_eq!(connect_v5(two, 6, "fifth").await.1, ReasonCode::SERVER_BUSY);
    v5::disconnect(first).await;
    open_connections_become(&broker, 1).await;
    let _sixth = connected(two, 6, "sixth").await;
    broker.kill().await;
}
