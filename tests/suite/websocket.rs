//! `kind = "ws"` listeners (MQTT 5.0 / 3.1.1 section 6, issue 13): MQTT inside WebSocket
//! binary frames. A real client (rumqttc's websocket transport) round-trips QoS 0 and 1; a
//! hand-written WebSocket client (raw frames over a `TcpStream`, so frames can be split,
//! packed and mistyped at will) checks the framing rules and the upgrade's refusals.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;
use common::async_process::BrokerProcess;
use common::rumq::V4;
use common::{connect_bytes, WAIT};

const WS_LISTENER: &str =
    "kind = \"ws\"\n[listener.websocket]\nallowed_origins = [\"http://good.example\"]\n";

async fn ws_broker() -> BrokerProcess {
    BrokerProcess::spawn(WS_LISTENER, "").await
}

/// A byte stream a raw WebSocket client runs over: TCP (`ws`) or TLS over TCP (`wss`).
pub(crate) trait WsIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> WsIo for T {}

/// A raw WebSocket client: the upgrade and frames written by hand.
pub(crate) struct RawWs {
    stream: Box<dyn WsIo>,
    /// Bytes read past the HTTP response or a frame.
    pending: Vec<u8>,
}

/// The upgrade's HTTP status line and headers, or the connection's end.
async fn upgrade(
    addr: SocketAddr,
    path: &str,
    protocol: Option<&str>,
    origin: Option<&str>,
) -> (String, RawWs) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    upgrade_over(Box::new(stream), addr, path, protocol, origin).await
}

/// An upgrade to `/mqtt` offering the subprotocol `protocol`, which must succeed (101) and
/// name `protocol` in its answer ([MQTT-6.0.0-4]).
async fn upgraded_naming(addr: SocketAddr, protocol: &str) -> RawWs {
    let (head, ws) = upgrade(addr, "/mqtt", Some(protocol), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let named = format!("sec-websocket-protocol: {protocol}\r\n");
    assert!(head.to_ascii_lowercase().contains(&named), "{head}");
    ws
}

/// [`upgrade`] over a stream already open (e.g. a TLS session, for `wss`).
pub(crate) async fn upgrade_over(
    stream: Box<dyn WsIo>,
    addr: SocketAddr,
    path: &str,
    protocol: Option<&str>,
    origin: Option<&str>,
) -> (String, RawWs) {
    upgrade_sending(stream, addr, (path, protocol, origin), &[]).await
}

/// [`upgrade_over`], with `behind` written in the same write right behind the request.
async fn upgrade_sending(
    mut stream: Box<dyn WsIo>,
    addr: SocketAddr,
    (path, protocol, origin): (&str, Option<&str>, Option<&str>),
    behind: &[u8],
) -> (String, RawWs) {
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    );
    if let Some(p) = protocol {
        request.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
    }
    if let Some(o) = origin {
        request.push_str(&format!("Origin: {o}\r\n"));
    }
    request.push_str("\r\n");
    let mut request = request.into_bytes();
    request.extend_from_slice(behind);
    stream.write_all(&request).await.expect("write");
    let mut buf = Vec::new();
    let head_end = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return i + 4;
            }
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return buf.len();
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("an HTTP answer in time");
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut pending = buf[head_end..].to_vec();
    // A refusal's body (a line for a person) is HTTP, not frames: read past it, to the
    // close that follows it.
    if !head.starts_with("HTTP/1.1 101") {
        pending.clear();
        let mut body = Vec::new();
        let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut body)).await;
    }
    (head, RawWs { stream, pending })
}

pub(crate) const BINARY: u8 = 2;
const TEXT: u8 = 1;
const PING: u8 = 9;

impl RawWs {
    pub(crate) async fn send_frame(&mut self, opcode: u8, payload: &[u8]) {
        self.stream
            .write_all(&common::cutting::client_frame(opcode, payload))
            .await
            .expect("write frame");
    }

    async fn fill(&mut self, want: usize) -> bool {
        while self.pending.len() < want {
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
            }
        }
        true
    }

    /// The next server frame (opcode, payload), or `None` when the connection ends; bounded
    /// by `WAIT`.
    async fn next_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        tokio::time::timeout(WAIT, async {
            if !self.fill(2).await {
                return None;
            }
            let opcode = self.pending[0] & 0x0F;
            let (len, header) = match self.pending[1] & 0x7F {
                126 => {
                    if !self.fill(4).await {
                        return None;
                    }
                    (
                        usize::from(u16::from_be_bytes([self.pending[2], self.pending[3]])),
                        4,
                    )
                }
                127 => {
                    if !self.fill(10).await {
                        return None;
                    }
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&self.pending[2..10]);
                    (u64::from_be_bytes(b) as usize, 10)
                }
                n => (usize::from(n), 2),
            };
            if !self.fill(header + len).await {
                return None;
            }
            let payload = self.pending[header..header + len].to_vec();
            self.pending.drain(..header + len);
            Some((opcode, payload))
        })
        .await
        .expect("a frame or the end within WAIT")
    }

    /// MQTT bytes from binary frames until `n` are in (pings/pongs skipped).
    pub(crate) async fn read_mqtt(&mut self, n: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..64 {
            if out.len() >= n {
                return Some(out);
            }
            let (opcode, payload) = self.next_frame().await?;
            if opcode == BINARY {
                out.extend_from_slice(&payload);
            }
        }
        None
    }

    /// How the TCP connection ends after the closing handshake: `Some(Ok(()))` for a clean
    /// end (EOF, nothing more), `Some(Err(_))` for a reset or stray bytes, `None` while it is
    /// still open after `limit`.
    async fn tcp_end_within(&mut self, limit: Duration) -> Option<Result<(), String>> {
        if !self.pending.is_empty() {
            return Some(Err(format!(
                "bytes after the close frame: {:?}",
                self.pending
            )));
        }
        let mut chunk = [0u8; 64];
        match tokio::time::timeout(limit, self.stream.read(&mut chunk)).await {
            Err(_) => None,
            Ok(Ok(0)) => Some(Ok(())),
            Ok(Ok(n)) => Some(Err(format!(
                "bytes after the close frame: {:?}",
                &chunk[..n]
            ))),
            Ok(Err(e)) => Some(Err(e.to_string())),
        }
    }

    /// True once the server ends the connection (a close frame, then EOF) within `WAIT`.
    /// The status code of the server's close frame (if one came) before the end of the
    /// stream, other frames passed over (at most 64).
    async fn close_code_then_end(&mut self) -> Option<[u8; 2]> {
        let mut close_code = None;
        for _ in 0..64 {
            match self.next_frame().await {
                None => break,
                Some((8, payload)) => close_code = payload.get(..2).map(|c| [c[0], c[1]]),
                Some(_) => {}
            }
        }
        close_code
    }

    async fn closed(&mut self) -> bool {
        for _ in 0..64 {
            match self.next_frame().await {
                None => return true,
                Some((8, _)) => {}
                Some((opcode, _)) if opcode == BINARY || opcode == 10 => {}
                Some(_) => return false,
            }
        }
        false
    }
}

pub(crate) const CONNACK_OK: [u8; 4] = [0x20, 0x02, 0x00, 0x00];

/// RFC 6455 §7.1.1-§7.1.2 (issue 34, finding 3): after a client's DISCONNECT, and when the
/// server ends a connection itself (here for a second CONNECT, MQTT-3.1.0-2), the server
/// sends a close frame and then waits for the client's: it closes the TCP connection only
/// after the client answered (a client that writes its close frame into a closed socket gets
/// `EPIPE` or a reset, as MQTT.js did on every clean `end()`), and the end is a clean EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_closing_handshake_waits_for_the_clients_close_frame() {
    const CLOSE: u8 = 8;
    // Short: the server must still be waiting for the answer after it ("must not" check).
    const QUIET: Duration = Duration::from_millis(200);
    let broker = ws_broker().await;
    for (client, ending) in [
        ("ws-disconnect", &[0xE0, 0x00][..]),
        ("ws-violation", &connect_bytes("ws-violation")[..]),
    ] {
        let (head, mut ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        ws.send_frame(BINARY, &connect_bytes(client)).await;
        assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
        ws.send_frame(BINARY, ending).await;
        let frame = ws.next_frame().await;
        assert!(
            matches!(frame, Some((CLOSE, _))),
            "{client}: a close frame first, got {frame:?}"
        );
        assert_eq!(
            ws.tcp_end_within(QUIET).await,
            None,
            "{client}: the TCP connection must wait for the client's close frame"
        );
        ws.send_frame(CLOSE, &1000u16.to_be_bytes()).await;
        assert_eq!(
            ws.tcp_end_within(WAIT).await,
            Some(Ok(())),
            "{client}: a clean end after the client's close frame"
        );
    }
}

/// A real client (rumqttc over `ws://…/mqtt`) publishes and receives at QoS 0 and 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_round_trips_qos0_and_qos1_over_ws() {
    let broker = ws_broker().await;
    let url = format!("ws://{}/mqtt", broker.addr);
    let mut options = rumqttc::MqttOptions::new("ws-client", url, broker.addr.port());
    options.set_transport(rumqttc::Transport::Ws);
    options.set_keep_alive(Duration::from_secs(30));
    let mut client = V4::connect_with(options).await;
    client.subscribe("ws/#", rumqttc::QoS::AtLeastOnce).await;
    for (qos, payload) in [
        (rumqttc::QoS::AtMostOnce, &b"zero"[..]),
        (rumqttc::QoS::AtLeastOnce, &[7u8; 3000][..]),
    ] {
        client.publish("ws/t", qos, false, payload).await;
        let got = client.next_publish().await;
        assert_eq!(got.topic, "ws/t");
        assert_eq!(&got.payload[..], payload);
        assert_eq!(got.qos, qos);
    }
}

/// [MQTT-6.0.0-2]: a CONNECT split over three frames is one packet, and two packets packed
/// in one frame are both handled. [MQTT-6.0.0-4]: the answer names the `mqtt` subprotocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_split_across_and_packed_into_frames() {
    let broker = ws_broker().await;
    let mut ws = upgraded_naming(broker.addr, "mqtt").await;
    let connect = connect_bytes("split");
    let third = connect.len() / 3;
    ws.send_frame(BINARY, &connect[..third]).await;
    ws.send_frame(BINARY, &connect[third..2 * third]).await;
    ws.send_frame(BINARY, &connect[2 * third..]).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));

    // SUBSCRIBE and PINGREQ in one frame: a SUBACK and a PINGRESP come back.
    let mut packed = vec![0x82, 0x08, 0x00, 0x01, 0x00, 0x03, b'a', b'/', b'b', 0x00];
    packed.extend_from_slice(&[0xC0, 0x00]);
    ws.send_frame(BINARY, &packed).await;
    let out = ws.read_mqtt(7).await.expect("SUBACK and PINGRESP");
    assert_eq!(out, [0x90, 0x03, 0x00, 0x01, 0x00, 0xD0, 0x00]);

    // A WebSocket ping is answered with a pong and disturbs nothing.
    ws.send_frame(PING, b"hi").await;
    assert_eq!(ws.next_frame().await, Some((10, b"hi".to_vec())));
    ws.send_frame(BINARY, &[0xC0, 0x00]).await;
    assert_eq!(ws.read_mqtt(2).await.as_deref(), Some(&[0xD0, 0x00][..]));
}

/// [MQTT-6.0.0-1]: a text frame closes the connection; `mqttv3.1` is accepted for old
/// clients and named in the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_frame_closes_the_connection() {
    let broker = ws_broker().await;
    let mut ws = upgraded_naming(broker.addr, "mqttv3.1").await;
    ws.send_frame(BINARY, &connect_bytes("texter")).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
    // A PUBLISH whose bytes are valid UTF-8, so the frame is a well-formed text frame.
    ws.send_frame(TEXT, &[0x30, 0x04, 0x00, 0x01, b't', b'x'])
        .await;
    // Failed with a close frame 1003 (RFC 6455 §7.1.7, §7.4.1: data it cannot accept), then
    // the end of the stream (thirteenth adversarial pass: no close frame was sent).
    let close_code = ws.close_code_then_end().await;
    assert_eq!(
        close_code,
        Some(1003u16.to_be_bytes()),
        "a close frame 1003, then the end"
    );
    // The same before any CONNECT, where the handshake drops the stream.
    let (head, mut ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    ws.send_frame(TEXT, b"hello").await;
    let close_code = ws.close_code_then_end().await;
    assert_eq!(
        close_code,
        Some(1003u16.to_be_bytes()),
        "before CONNECT too"
    );
}

/// The upgrade is refused without the `mqtt` subprotocol [MQTT-6.0.0-3] (400), on another
/// path (404), from an Origin not allowed (403); each counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_upgrades_are_refused_with_http_status() {
    let broker = ws_broker().await;
    for (path, protocol, origin, status) in [
        ("/mqtt", None, None, "400"),
        ("/mqtt", Some("chat, superchat"), None, "400"),
        ("/other", Some("mqtt"), None, "404"),
        ("/", Some("mqtt"), None, "404"),
        ("/mqtt", Some("mqtt"), Some("http://evil.example"), "403"),
    ] {
        let (head, mut ws) = upgrade(broker.addr, path, protocol, origin).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}")),
            "{path} {protocol:?} {origin:?}: {head}"
        );
        assert!(ws.closed().await);
    }
    // The allowed Origin passes.
    let (head, _ws) = upgrade(
        broker.addr,
        "/mqtt",
        Some("mqtt"),
        Some("http://good.example"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    for (reason, want) in [("subprotocol", 2.0), ("path", 2.0), ("origin", 1.0)] {
        let series =
            format!("postbox_ws_upgrade_failures_total{{listener=\"ws\",reason=\"{reason}\"}}");
        let got = broker.wait_metric(&series, |v| v >= want).await;
        assert_eq!(got, want, "{series}");
    }
}

/// A browser or curl pointed at the ws port (a plain GET, no Upgrade header) gets 426
/// Upgrade Required naming the upgrade (RFC 9110 §15.5.22) and a line saying what listens
/// there and on which path, not an empty reply (issue 37, item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_get_is_told_what_listens_here() {
    let broker = ws_broker().await;
    let mut s = TcpStream::connect(broker.addr).await.expect("connect");
    let request = b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/8\r\n\r\n";
    let answer = common::http::exchange(&mut s, request).await;
    assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
    assert!(answer.contains("Upgrade: websocket"), "{answer}");
    assert!(
        answer.contains("MQTT over WebSocket listener") && answer.contains("/mqtt"),
        "{answer}"
    );
}

/// A plain MQTT client on the ws port is closed without a CONNACK, while a WebSocket
/// client on the same port carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_mqtt_on_the_ws_port_is_refused_without_disturbing_others() {
    let broker = ws_broker().await;
    let (head, mut ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    ws.send_frame(BINARY, &connect_bytes("bystander")).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));

    let mut plain = TcpStream::connect(broker.addr).await.expect("connect");
    plain
        .write_all(&connect_bytes("plain"))
        .await
        .expect("write");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, plain.read(&mut buf))
        .await
        .expect("closed within WAIT");
    if let Ok(n) = read {
        // An HTTP 400 at most, never a CONNACK.
        assert!(n == 0 || buf[0] != 0x20, "{:?}", &buf[..n]);
    }
    broker
        .wait_metric(
            "postbox_ws_upgrade_failures_total{listener=\"ws\",reason=\"handshake\"}",
            |v| v >= 1.0,
        )
        .await;

    ws.send_frame(BINARY, &[0xC0, 0x00]).await;
    assert_eq!(ws.read_mqtt(2).await.as_deref(), Some(&[0xD0, 0x00][..]));
}

/// `kind = "wss"`: the WebSocket upgrade on top of TLS (the dev server certificate), then MQTT
/// in binary frames, as over `ws` [MQTT-6.0.0-4]; a client that skips TLS gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_is_the_websocket_upgrade_over_tls() {
    let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs");
    let listener = format!(
        "kind = \"wss\"\n[listener.tls]\ncert = {:?}\nkey = {:?}\n",
        certs.join("server.pem"),
        certs.join("server.key")
    );
    let broker = BrokerProcess::spawn(&listener, "").await;
    let connector = common::dev_ca_connector();
    let tcp = TcpStream::connect(broker.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let (head, mut ws) =
        upgrade_over(Box::new(tls), broker.addr, "/mqtt", Some("mqtt"), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: mqtt"),
        "{head}"
    );
    ws.send_frame(BINARY, &connect_bytes("wss-client")).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));

    // The same upgrade without TLS is not a TLS ClientHello: closed, no HTTP answer.
    let (head, _) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
    assert!(!head.contains("101"), "{head}");
}

/// The fixed header of a packet of `kind` (first byte) whose whole size is `size` bytes, for
/// `size` from 131 to 16,386 (a 2-byte Remaining Length) or from 16,388 to 2 MiB (3 bytes).
fn fixed_header(kind: u8, size: usize) -> Vec<u8> {
    let mut out = vec![kind];
    let header = if size <= 16_386 { 3 } else { 4 };
    let mut remaining = size - header;
    loop {
        let byte = (remaining & 0x7F) as u8;
        remaining >>= 7;
        if remaining == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// Issue 35, seventh pass, N6, as it stands since twelfth pass U3: the WebSocket layer holds
/// no frame, so a frame's bytes go to the connection's read buffer as they arrive, where the
/// CONNECT bound and the partial-packet count of the TCP path apply to them. Before the
/// CONNECT is answered, a packet announcing more than `mqtt.max_connect_size` is refused at
/// its fixed header, whatever frame carries it (64 half-sent 1 MiB frames held ~133 MB until
/// `connect_timeout` when the WebSocket layer buffered them); half of one under it is
/// counted in `postbox_partial_packet_bytes` while it arrives, outside the memory budget
/// publishers pause for. Once connected, a half-sent large PUBLISH counts in
/// `postbox_memory_used_bytes` like a half-sent packet over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_before_connect_are_bounded_and_counted() {
    const PARTIAL: &str = "postbox_partial_packet_bytes";
    const MEMORY: &str = "postbox_memory_used_bytes";
    // A long connect_timeout: without the bound the frames below would be held for all of it.
    let broker = BrokerProcess::spawn(
        WS_LISTENER,
        "connect_timeout = 60\nmax_connect_size = 65536",
    )
    .await;
    let open = || async {
        let (head, ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        ws
    };

    // A 300 kB CONNECT: refused at its fixed header, in the first write of its frame.
    let mut big = open().await;
    let mut connect = fixed_header(0x10, 300_000);
    connect.resize(300_000, 0x10);
    let frame = common::cutting::client_frame(BINARY, &connect);
    big.stream.write_all(&frame[..4096]).await.expect("write");
    assert!(
        big.closed().await,
        "a 300 kB CONNECT before CONNACK is refused"
    );

    // Half of a 60 kB CONNECT (in a frame of its own size): counted, out of the budget.
    let mut half = open().await;
    let mut connect = fixed_header(0x10, 60_000);
    connect.resize(60_000, 0x10);
    let frame = common::cutting::client_frame(BINARY, &connect);
    half.stream
        .write_all(&frame[..30_000])
        .await
        .expect("write");
    broker.wait_metric(PARTIAL, |n| n >= 29_900.0).await;
    let memory = broker.metric(MEMORY).await.unwrap_or(0.0);
    assert!(memory < 29_900.0, "not in the memory budget: {memory}");

    let mut client = open().await;
    client.send_frame(BINARY, &connect_bytes("ws-large")).await;
    assert_eq!(client.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
    // QoS 1 PUBLISH (3.1.1) of 200,000 bytes, topic "t", packet id 1.
    let body: u32 = 2 + 1 + 2 + 200_000;
    let mut publish = vec![
        0x32,
        0x80 | (body & 0x7F) as u8,
        0x80 | ((body >> 7) & 0x7F) as u8,
    ];
    publish.push((body >> 14) as u8);
    publish.extend_from_slice(&[0x00, 0x01, b't', 0x00, 0x01]);
    publish.extend(std::iter::repeat_n(0x5a, 200_000));
    let frame = common::cutting::client_frame(BINARY, &publish);
    client
        .stream
        .write_all(&frame[..100_000])
        .await
        .expect("write");
    broker.wait_metric(MEMORY, |n| n >= 99_900.0).await;
    client
        .stream
        .write_all(&frame[100_000..])
        .await
        .expect("write");
    assert_eq!(
        client.read_mqtt(4).await.as_deref(),
        Some(&[0x40, 0x02, 0x00, 0x01][..]),
        "the large PUBLISH after CONNACK is acknowledged"
    );
}

/// Issue 35, seventh pass, N6: a packet that has started to arrive in a WebSocket frame must
/// be complete by the deadline a packet of its size gets (`mqtt.packet_timeout + size /
/// mqtt.min_packet_rate`), keep-alive 0 or not, as over TCP: half a frame carrying half a
/// PUBLISH was held for as long as the socket stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_frame_is_dropped_after_the_packet_deadline() {
    use postbox::codec::{Packet, ProtocolVersion};
    let broker = BrokerProcess::spawn(
        WS_LISTENER,
        "packet_timeout = 1\nmin_packet_rate = 100000000",
    )
    .await;
    let (head, mut ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut connect = common::connect_packet(ProtocolVersion::V3_1_1, "ws-stalled");
    connect.keep_alive = 0;
    let connect = common::encode(&Packet::Connect(Box::new(connect)), ProtocolVersion::V3_1_1);
    ws.send_frame(BINARY, &connect).await;
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
    let mut publish = fixed_header(0x30, 10_000);
    publish.extend_from_slice(&[0x00, 0x01, b't']);
    publish.resize(10_000, 0x30);
    let frame = common::cutting::client_frame(BINARY, &publish);
    ws.stream.write_all(&frame[..5_000]).await.expect("write");
    let started = std::time::Instant::now();
    // Bounded by WAIT (10 s); the deadline is ~1 s.
    assert!(ws.closed().await, "the half-sent frame ends the connection");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed by the deadline, not for the bytes: {:?}",
        started.elapsed()
    );
}

/// RFC 6455 §4.1 lets a client send frames as soon as it has sent its request; bytes that
/// arrive behind the upgrade request in the same read are the start of the frame stream: a
/// CONNECT frame written together with the request is answered (here with a PINGREQ split
/// across it and a second frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_right_behind_the_upgrade_request_is_answered() {
    let broker = ws_broker().await;
    let tcp = TcpStream::connect(broker.addr).await.expect("connect");
    let mut behind = connect_bytes("eager");
    behind.push(0xC0);
    let behind = common::cutting::client_frame(BINARY, &behind);
    let (head, mut ws) = upgrade_sending(
        Box::new(tcp),
        broker.addr,
        ("/mqtt", Some("mqtt"), None),
        &behind,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
    ws.send_frame(BINARY, &[0x00]).await;
    assert_eq!(ws.read_mqtt(2).await.as_deref(), Some(&[0xD0, 0x00][..]));
}

/// Issue 35, twelfth adversarial pass, U3: an idle WebSocket connection keeps nothing of the
/// largest message it sent. With tungstenite's frame buffering each one kept the allocation
/// of its largest frame for the socket's life, counted nowhere (600 connections that each
/// sent one 2 MB PUBLISH held 1.28 GB). Here 48 connections each send one 1 MiB QoS 0
/// PUBLISH (and a PINGREQ, whose PINGRESP shows the PUBLISH was handled) and stay open: the
/// broker's resident set grows by far less than 48 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_keep_nothing_of_the_large_messages_they_sent() {
    const CONNECTIONS: usize = 48;
    const PAYLOAD: usize = 1 << 20;
    let broker = BrokerProcess::spawn(WS_LISTENER, "max_packet_size = 2097152").await;
    let publish = postbox::codec::Packet::Publish(postbox::codec::Publish {
        topic: "u3/large".into(),
        payload: vec![0x55; PAYLOAD].into(),
        ..Default::default()
    });
    let mut bytes = common::encode(&publish, postbox::codec::ProtocolVersion::V3_1_1);
    bytes.extend_from_slice(&[0xC0, 0x00]);
    let frame = common::cutting::client_frame(BINARY, &bytes);
    let send_one = |name: String| {
        let frame = &frame;
        async move {
            let (head, mut ws) = upgrade(broker.addr, "/mqtt", Some("mqtt"), None).await;
            assert!(head.starts_with("HTTP/1.1 101"), "{head}");
            ws.send_frame(BINARY, &connect_bytes(&name)).await;
            assert_eq!(ws.read_mqtt(4).await.as_deref(), Some(&CONNACK_OK[..]));
            ws.stream.write_all(frame).await.expect("write");
            assert_eq!(ws.read_mqtt(2).await.as_deref(), Some(&[0xD0, 0x00][..]));
            ws
        }
    };
    // Two first, so what every connection and a first large read cost once is in the base.
    let mut open = vec![send_one("u3-0".into()).await, send_one("u3-1".into()).await];
    let before = common::process::rss_bytes(broker.pid());
    for i in 0..CONNECTIONS {
        open.push(send_one(format!("u3-{}", i + 2)).await);
    }
    let grown = common::process::rss_bytes(broker.pid()).saturating_sub(before);
    println!(
        "RSS grew by {} KiB for {CONNECTIONS} idle connections",
        grown >> 10
    );
    assert!(
        grown < (CONNECTIONS * PAYLOAD / 4) as u64,
        "RSS grew by {grown} B for {CONNECTIONS} idle connections that each sent 1 MiB"
    );
    drop(open);
}
