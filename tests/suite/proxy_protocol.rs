//! Listeners behind a load balancer (`proxy_protocol = true`, issue 13): every connection
//! starts with a PROXY protocol header (`HAProxy`'s spec, v1 text and v2 binary) that names the
//! real client, and the broker counts and logs that client instead of the balancer. Here the
//! test plays the balancer on 127.0.0.1 and names other clients.

use std::time::{Duration, Instant};

use postbox::codec::{Packet, ProtocolVersion};

use crate::common;
use common::async_process::BrokerProcess;
use common::{connect_bytes, RawClient, WAIT};

fn v1_header(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n").into_bytes()
}

/// Polls `postbox_connections_pending` until it reads `want` (bounded by `WAIT`).
async fn pending_becomes(broker: &BrokerProcess, want: f64) -> f64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = broker
            .metric("postbox_connections_pending")
            .await
            .unwrap_or(-1.0);
        if now == want || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

    let v2 = [
        b"\r\n\r\n\0\r\nQUIT\n".as_slice(),
        &[0x21, 0x11, 0x00, 0x0c], // v2 PROXY, TCP over IPv4, 12 address bytes
        &[198, 51, 100, 9, 127, 0, 0, 1],
        &40001u16.to_be_bytes(),
        &broker.addr.port().to_be_bytes(),
    ]
    .concat();
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
    assert_eq!(pending_becomes(&broker, 1.0).await, 1.0);
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
        pending_becomes(&broker, 2.0).await,
        2.0,
        "198.51.100.9 has a bound of its own"
    );
    other.send_raw(&connect[2..]).await;
    assert!(matches!(other.recv().await, Some(Packet::ConnAck(_))));
    a.send_raw(&connect[2..]).await;
    assert!(matches!(a.recv().await, Some(Packet::ConnAck(_))));
}
