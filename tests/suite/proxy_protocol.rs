//! Listeners behind a load balancer (`proxy_protocol = true`, issue 13): every connection
//! starts with a PROXY protocol header (`HAProxy`'s spec, v1 text and v2 binary) that names the
//! real client, and the broker counts and logs that client instead of the balancer. Here the
//! test plays the balancer on 127.0.0.1 and names other clients. On `tls` and `wss` listeners
//! the header comes before the TLS handshake, in the clear, as a balancer that passes TLS
//! through sends it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use postbox::codec::{Packet, ProtocolVersion, ReasonCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common;
use crate::websocket::{upgrade_over, BINARY, CONNACK_OK};
use common::async_process::BrokerProcess;
use common::{connect_bytes, v5, RawClient, WAIT};

/// Connections whose handshake is still waiting for the client.
const PENDING: &str = "postbox_connections_pending";

fn v1_header(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n").into_bytes()
}

/// A v2 header naming `client` (port 40001), as a balancer sends it for TCP over IPv4.
fn v2_header(client: Ipv4Addr, port: u16) -> Vec<u8> {
    [
        b"\r\n\r\n\0\r\nQUIT\n".as_slice(),
        &[0x21, 0x11, 0x00, 0x0c], // v2 PROXY, TCP over IPv4, 12 address bytes
        &client.octets(),
        &[127, 0, 0, 1],
        &40001u16.to_be_bytes(),
        &port.to_be_bytes(),
    ]
    .concat()
}

fn certs() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs")
}

/// The keys of a `kind` (`tls` or `wss`) listener with the dev server certificate behind a
/// balancer, plus `extra` listener keys.
fn tls_listener(kind: &str, extra: &str) -> String {
    format!(
        "proxy_protocol = true\nkind = \"{kind}\"\n{extra}\n\
         [listener.tls]\ncert = {:?}\nkey = {:?}\n",
        certs().join("server.pem"),
        certs().join("server.key")
    )
}

/// Plays a balancer that passes TLS through: writes `header` on a new connection to `addr`,
/// then runs a TLS client (trusting the dev CA) over the same socket.
async fn tls_after_header(
    addr: SocketAddr,
    header: &[u8],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(header).await.expect("write header");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    tokio::time::timeout(WAIT, common::dev_ca_connector().connect(name, tcp))
        .await
        .expect("the TLS handshake ends within WAIT")
}

/// [`tls_after_header`], which must complete the handshake, then a v5 CONNECT for `id`: the
/// stream (keep it to stay counted) and the CONNACK's reason code (`None`: closed without one).
async fn connack_after_header(
    addr: SocketAddr,
    header: &[u8],
    id: &str,
) -> (
    tokio_rustls::client::TlsStream<TcpStream>,
    Option<ReasonCode>,
) {
    let mut tls = tls_after_header(addr, header)
        .await
        .expect("TLS handshake after the PROXY header");
    let code = v5::connack_over(&mut tls, id).await;
    (tls, code)
}

/// A client behind the balancer connects and publishes as usual once the header is read;
/// the v2 binary form works like v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_behind_the_balancer_are_served() {
    let broker = BrokerProcess::spawn("proxy_protocol = true", "").await;
    let mut c = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut first = v1_header("203.0.113.7", broker.addr.port());
    first.extend(connect_bytes("behind-lb"));
    c.send_raw(&first).await;
    assert!(matches!(c.recv().await, Some(Packet::ConnAck(_))));

    let v2 = v2_header(Ipv4Addr::new(198, 51, 100, 9), broker.addr.port());
    let mut c2 = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut bytes = v2;
    bytes.extend(connect_bytes("behind-lb-v2"));
    c2.send_raw(&bytes).await;
    assert!(matches!(c2.recv().await, Some(Packet::ConnAck(_))));
}

/// A connection that skips the balancer (no header: it starts with CONNECT) is closed
/// without an answer and counted, and the listener keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_the_header_is_closed() {
    let broker = BrokerProcess::spawn("proxy_protocol = true", "").await;
    let mut direct = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    direct.send_raw(&connect_bytes("sneaky")).await;
    let seen = direct.expect_close().await;
    assert!(
        seen.is_empty(),
        "no CONNACK without a PROXY header: {seen:?}"
    );
    let refused = broker
        .metric("postbox_connections_refused_total{reason=\"proxy_header\"}")
        .await;
    assert_eq!(refused, Some(1.0));
    let mut ok = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    let mut bytes = v1_header("203.0.113.8", broker.addr.port());
    bytes.extend(connect_bytes("after"));
    ok.send_raw(&bytes).await;
    assert!(matches!(ok.recv().await, Some(Packet::ConnAck(_))));
}

/// Per-address limits count the client the header names, not the balancer: with one pending
/// handshake allowed per address, a second slow client from the same named address is turned
/// away, while one from another address (through the same balancer socket address) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_address_limits_count_the_named_client() {
    let broker = BrokerProcess::spawn(
        "proxy_protocol = true\nmax_pending_connections_per_ip = 1",
        "",
    )
    .await;
    let port = broker.addr.port();
    let connect = connect_bytes("slow");
    // Each sends its header and the first 2 bytes of a CONNECT: its handshake waits.
    let mut a = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    a.send_raw(&[v1_header("203.0.113.7", port), connect[..2].to_vec()].concat())
        .await;
    assert_eq!(broker.metric_settles_at(PENDING, 1.0).await, Some(1.0));
    let mut same = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    same.send_raw(&[v1_header("203.0.113.7", port), connect[..2].to_vec()].concat())
        .await;
    assert!(
        same.expect_close().await.is_empty(),
        "a second slow handshake from 203.0.113.7 is over its per-address bound"
    );
    let mut other = RawClient::open(broker.addr, ProtocolVersion::V3_1_1).await;
    other
        .send_raw(&[v1_header("198.51.100.9", port), connect[..2].to_vec()].concat())
        .await;
    assert_eq!(
        broker.metric_settles_at(PENDING, 2.0).await,
        Some(2.0),
        "198.51.100.9 has a bound of its own"
    );
    other.send_raw(&connect[2..]).await;
    assert!(matches!(other.recv().await, Some(Packet::ConnAck(_))));
    a.send_raw(&connect[2..]).await;
    assert!(matches!(a.recv().await, Some(Packet::ConnAck(_))));
}

/// `kind = "tls"` with `proxy_protocol`: the header (v1 or v2) is read before the TLS
/// handshake, and the client it names is the one counted. With one connected client allowed
/// per address, a second client named 203.0.113.7 is refused with 0x97 Quota exceeded, while
/// one named 198.51.100.9 is let in, though all three sockets come from 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listener_reads_the_header_before_the_handshake_and_counts_the_named_client() {
    let broker = BrokerProcess::spawn(&tls_listener("tls", "max_connections_per_ip = 1"), "").await;
    let port = broker.addr.port();
    let (_a, code) =
        connack_after_header(broker.addr, &v1_header("203.0.113.7", port), "tls-a").await;
    assert_eq!(code, Some(ReasonCode::SUCCESS));
    let (_b, code) =
        connack_after_header(broker.addr, &v1_header("203.0.113.7", port), "tls-b").await;
    assert_eq!(
        code,
        Some(ReasonCode::QUOTA_EXCEEDED),
        "203.0.113.7 has its one connection"
    );
    let v2 = v2_header(Ipv4Addr::new(198, 51, 100, 9), port);
    let (_c, code) = connack_after_header(broker.addr, &v2, "tls-c").await;
    assert_eq!(
        code,
        Some(ReasonCode::SUCCESS),
        "198.51.100.9 is counted apart from 203.0.113.7"
    );
}

/// A TLS client that skips the balancer (its `ClientHello` comes first) is closed before any
/// handshake and counted; the listener keeps serving clients with a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_without_the_header_is_refused() {
    let broker = BrokerProcess::spawn(&tls_listener("tls", ""), "").await;
    assert!(
        tls_after_header(broker.addr, b"").await.is_err(),
        "no TLS session without a PROXY header"
    );
    assert_eq!(
        broker
            .metric("postbox_connections_refused_total{reason=\"proxy_header\"}")
            .await,
        Some(1.0)
    );
    let header = v1_header("203.0.113.9", broker.addr.port());
    let (_ok, code) = connack_after_header(broker.addr, &header, "after").await;
    assert_eq!(code, Some(ReasonCode::SUCCESS));
}

/// `kind = "wss"`: header, TLS, WebSocket upgrade, MQTT. The named client is counted: a
/// second 3.1.1 client named 203.0.113.7 is refused (return code 0x03) at one per address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_listener_reads_the_header_before_the_handshake() {
    let broker = BrokerProcess::spawn(&tls_listener("wss", "max_connections_per_ip = 1"), "").await;
    let port = broker.addr.port();
    let mut clients = Vec::new();
    for (id, connack) in [("wss-a", CONNACK_OK), ("wss-b", [0x20, 0x02, 0x00, 0x03])] {
        let tls = tls_after_header(broker.addr, &v1_header("203.0.113.7", port))
            .await
            .expect("TLS handshake after the header");
        let (head, mut ws) =
            upgrade_over(Box::new(tls), broker.addr, "/mqtt", Some("mqtt"), None).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        ws.send_frame(BINARY, &connect_bytes(id)).await;
        assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&connack[..]), "{id}");
        clients.push(ws);
    }
    assert!(
        tls_after_header(broker.addr, b"").await.is_err(),
        "no TLS session without a PROXY header"
    );
}
