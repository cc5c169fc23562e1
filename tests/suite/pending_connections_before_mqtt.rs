//! The pending-connection bounds before MQTT (issue 35, fifth pass, finding 2): a connection
//! that stops in its PROXY header, its TLS handshake or its WebSocket upgrade waits for the
//! client just as one that stops in its CONNECT, so it takes the same pending slot (per source
//! address, per listener, broker-wide gauge) and is closed at once when none is free. Before,
//! on `tls`, `ws`, `wss` and `proxy_protocol` listeners all of them were held until
//! `mqtt.connect_timeout`, uncounted (`postbox_connections_pending` 0), none refused.
//!
//! README promise checked: "sockets that never send a CONNECT cannot keep real clients out":
//! a real client still connects while the bound holds the stalled ones.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use postbox::codec::ReasonCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::websocket::{upgrade_over, WsIo, BINARY, CONNACK_OK};
use common::async_process::{connect_from, report_close, BrokerProcess};
use common::{connect_bytes, v5, WAIT};

/// The per-address pending bound of every listener here.
const PER_IP: usize = 4;
/// Stalled sockets opened from one address: three more than the bound.
const STALLED: usize = PER_IP + 3;
const PENDING: &str = "postbox_connections_pending";
const REFUSED_PER_IP: &str = "postbox_connections_refused_total{reason=\"pending_per_ip\"}";

/// The source address of the stalled sockets (the real clients use 127.0.0.1).
const STALLER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The start of a TLS `ClientHello` record: its header promises 512 bytes that never come.
const HALF_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
/// The first line of a WebSocket upgrade request, without the rest.
const HALF_UPGRADE: &[u8] = b"GET /mqtt HTTP/1.1\r\n";
/// The start of a PROXY v1 header, without its end.
const HALF_PROXY_HEADER: &[u8] = b"PROXY TCP4 ";

fn certs() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs")
}

/// A broker with one listener of `kind` (plus `extra` keys) at [`PER_IP`] pending
/// connections per address, and a connect timeout far past the test's waits, so only the
/// bound can close a stalled socket in time.
async fn broker(kind: &str, extra: &str) -> BrokerProcess {
    let tls = if kind == "tls" || kind == "wss" {
        format!(
            "[listener.tls]\ncert = {:?}\nkey = {:?}\n",
            certs().join("server.pem"),
            certs().join("server.key")
        )
    } else {
        String::new()
    };
    let listener =
        format!("kind = \"{kind}\"\nmax_pending_connections_per_ip = {PER_IP}\n{extra}\n{tls}");
    BrokerProcess::spawn(&listener, "connect_timeout = 120").await
}

/// Opens [`STALLED`] sockets from [`STALLER`] that each send `opening` and then nothing;
/// the receiver gets a socket's index when the broker closes it (read to end or reset). The
/// watchers are aborted with the returned handles.
async fn stall(
    addr: SocketAddr,
    opening: &'static [u8],
) -> (Vec<tokio::task::JoinHandle<()>>, UnboundedReceiver<usize>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watchers = Vec::with_capacity(STALLED);
    for i in 0..STALLED {
        let mut socket = connect_from(STALLER, addr).await;
        socket.write_all(opening).await.expect("write the opening");
        // Aborted at the end of the test.
        watchers.push(report_close(socket, i, tx.clone()));
    }
    (watchers, rx)
}

/// Stalls [`STALLED`] sockets with `opening`: those past the bound are closed at once and
/// counted, the others held and counted pending. Returns the watchers of the held ones.
async fn bound_holds(
    broker: &BrokerProcess,
    opening: &'static [u8],
) -> Vec<tokio::task::JoinHandle<()>> {
    let started = std::time::Instant::now();
    let (watchers, mut closed) = stall(broker.addr, opening).await;
    for n in 0..STALLED - PER_IP {
        tokio::time::timeout(WAIT, closed.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "only {n} of the {} past the bound were closed within {WAIT:?}",
                    STALLED - PER_IP
                )
            })
            .expect("watchers alive");
    }
    assert!(
        started.elapsed() < WAIT,
        "closed at once, not at a timeout: {:?}",
        started.elapsed()
    );
    broker.wait_metric(PENDING, |n| n >= PER_IP as f64).await;
    assert_eq!(
        broker.metric(PENDING).await,
        Some(PER_IP as f64),
        "the held ones are pending"
    );
    assert_eq!(
        broker.metric(REFUSED_PER_IP).await,
        Some((STALLED - PER_IP) as f64),
        "the closed ones are counted"
    );
    assert!(closed.try_recv().is_err(), "the other {PER_IP} are held");
    watchers
}

/// A TLS session to `addr` from 127.0.0.1, trusting the dev CA.
async fn tls_client(addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    tokio::time::timeout(WAIT, common::dev_ca_connector().connect(name, tcp))
        .await
        .expect("the TLS handshake ends within WAIT")
        .expect("TLS handshake")
}

/// Upgrades `stream` to a WebSocket on `/mqtt` (subprotocol `mqtt`) and connects `client_id`
/// over it: the real client that gets in while the bound holds the stalled ones.
async fn connects_over_websocket(stream: Box<dyn WsIo>, addr: SocketAddr, client_id: &str) {
    let (head, mut ws) = upgrade_over(stream, addr, "/mqtt", Some("mqtt"), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    ws.send_frame(BINARY, &connect_bytes(client_id)).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
}

/// The scenario of every listener kind here: a broker with one listener of `kind` (plus
/// `extra` keys) whose bound holds [`STALLED`] sockets that each sent only `opening`
/// ([`bound_holds`]); meanwhile `real` connects a real client, then the broker is killed.
async fn while_the_bound_holds(
    (kind, extra): (&str, &str),
    opening: &'static [u8],
    real: impl AsyncFnOnce(&BrokerProcess),
) {
    let broker = broker(kind, extra).await;
    let watchers = bound_holds(&broker, opening).await;
    real(&broker).await;
    watchers.iter().for_each(tokio::task::JoinHandle::abort);
    broker.kill().await;
}

/// `kind = "tls"`: half-sent `ClientHello`s past the bound are closed at once; a real TLS
/// client connects meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_handshakes_that_stall_take_pending_slots() {
    while_the_bound_holds(("tls", ""), HALF_CLIENT_HELLO, async |broker| {
        let mut real = tls_client(broker.addr).await;
        assert_eq!(
            v5::connack_over(&mut real, "real-tls").await,
            Some(ReasonCode::SUCCESS)
        );
        // The real client's handshake waited for it, so it held a slot too, and gave it back.
        assert_eq!(broker.metric(PENDING).await, Some(PER_IP as f64));
    })
    .await;
}

/// `kind = "ws"`: upgrade requests that stop after their first line, past the bound, are
/// closed at once; a real WebSocket client connects meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_that_stall_take_pending_slots() {
    while_the_bound_holds(("ws", ""), HALF_UPGRADE, async |broker| {
        let tcp = TcpStream::connect(broker.addr).await.expect("connect");
        connects_over_websocket(Box::new(tcp), broker.addr, "real-ws").await;
    })
    .await;
}

/// `kind = "wss"`: half-sent `ClientHello`s past the bound are closed at once; a real client
/// (TLS, upgrade, CONNECT) connects meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_handshakes_that_stall_take_pending_slots() {
    while_the_bound_holds(("wss", ""), HALF_CLIENT_HELLO, async |broker| {
        let tls = tls_client(broker.addr).await;
        connects_over_websocket(Box::new(tls), broker.addr, "real-wss").await;
    })
    .await;
}

/// `proxy_protocol = true`: sockets that stop in their PROXY header count against the
/// socket's address (the header that would name another is not there); past the bound they
/// are closed at once, and a client behind the balancer connects meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_headers_that_stall_take_pending_slots() {
    let kind = ("tcp", "proxy_protocol = true");
    while_the_bound_holds(kind, HALF_PROXY_HEADER, async |broker| {
        let mut real = TcpStream::connect(broker.addr).await.expect("connect");
        let header = format!(
            "PROXY TCP4 203.0.113.5 127.0.0.1 40000 {}\r\n",
            broker.addr.port()
        );
        real.write_all(header.as_bytes())
            .await
            .expect("write header");
        assert_eq!(
            v5::connack_over(&mut real, "real-proxied").await,
            Some(ReasonCode::SUCCESS)
        );
    })
    .await;
}

/// `kind = "tls"` behind a balancer: a client whose TLS handshake stalls after its header
/// holds the pending slot of the address the header names, not the balancer's: at one per
/// address, a second such client of that address is closed at once, one of another address
/// is held, and the balancer's own address keeps its room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_handshake_behind_a_balancer_counts_the_named_client() {
    let certs = certs();
    let listener = format!(
        "kind = \"tls\"\nproxy_protocol = true\nmax_pending_connections_per_ip = 1\n\
         [listener.tls]\ncert = {:?}\nkey = {:?}\n",
        certs.join("server.pem"),
        certs.join("server.key")
    );
    let broker = BrokerProcess::spawn(&listener, "connect_timeout = 120").await;
    let port = broker.addr.port();
    let stalled = |client: &str| {
        let header = format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n");
        [header.as_bytes(), HALF_CLIENT_HELLO].concat()
    };
    let stalling = async |client: &str| {
        let mut socket = TcpStream::connect(broker.addr).await.expect("connect");
        socket.write_all(&stalled(client)).await.expect("write");
        socket
    };
    let first = stalling("203.0.113.7").await;
    broker.wait_metric(PENDING, |n| n >= 1.0).await;
    let mut second = stalling("203.0.113.7").await;
    common::async_process::closed(&mut second).await;
    let other = stalling("198.51.100.9").await;
    broker.wait_metric(PENDING, |n| n >= 2.0).await;
    assert_eq!(broker.metric(REFUSED_PER_IP).await, Some(1.0));
    drop((first, other));
}

/// Issue 35, twenty-sixth and twenty-seventh adversarial passes, L4, M1: half-sent
/// `ClientHello`s in every pending slot of a TLS listener kept every TLS client out (26 of
/// 26 failed), since each TLS handshake waits a round trip for its client and so needs a
/// slot. Now a real client's handshake takes a slot of the address holding the most (the
/// staller's four, more than the client's one would be), that socket is closed and counted
/// (`pending_evicted`), and the client connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_takes_a_slot_of_the_address_holding_the_most() {
    let broker = broker("tls", &format!("max_pending_connections = {PER_IP}")).await;
    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let mut watchers = Vec::with_capacity(PER_IP);
    for i in 0..PER_IP {
        let mut socket = connect_from(STALLER, broker.addr).await;
        socket
            .write_all(HALF_CLIENT_HELLO)
            .await
            .expect("write the opening");
        watchers.push(report_close(socket, i, tx.clone()));
    }
    broker.wait_metric(PENDING, |n| n >= PER_IP as f64).await;
    let mut real = tls_client(broker.addr).await;
    assert_eq!(
        v5::connack_over(&mut real, "real-tls").await,
        Some(ReasonCode::SUCCESS)
    );
    tokio::time::timeout(WAIT, closed.recv())
        .await
        .expect("the oldest stalled socket is closed")
        .expect("watchers alive");
    let evicted = "postbox_connections_refused_total{reason=\"pending_evicted\"}";
    assert_eq!(broker.metric(evicted).await, Some(1.0));
    assert!(closed.try_recv().is_err(), "one gave way, not more");
    watchers.iter().for_each(tokio::task::JoinHandle::abort);
    broker.kill().await;
}
