//! Conversations replayed under any cutting of their bytes (issue 34): a client's packets are
//! one byte stream from the CONNECT's first byte, and a client need not wait for any answer
//! (5.0 and 3.1.1 §3.1.4: "Clients are allowed to send further MQTT Control Packets
//! immediately after sending a CONNECT"). A broker must give the same answers whether that
//! stream arrives in one write, one write per packet, one byte per write or cut anywhere;
//! before this harness, a SUBSCRIBE written together with its CONNECT was dropped.
//!
//! A [`Conversation`] lists what one connection sends and what it must get back; a
//! [`Scenario`] runs conversations one after another (a persistent session over several
//! connections). [`replay`] writes a conversation's bytes under a [`Cutting`] over a
//! [`Transport`] (tcp, tls, ws, wss, tcp with a PROXY header) without waiting for anything
//! between writes, then reads every answer until the conversation's end (the close after its
//! DISCONNECT, or the PINGRESP the runner appends) and compares them with the expected ones:
//! the same answers, in the same order within each kind that has an order (acks of SUBSCRIBE /
//! UNSUBSCRIBE, acks of PUBLISH / PUBREL, deliveries, PINGRESPs). Interleaving across kinds is
//! free: 5.0 §4.6 orders each flow, not flows against each other (Mosquitto routes a QoS 2
//! message at PUBREL, Postbox at PUBLISH; both are allowed).
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use postbox::codec::{self, Packet, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::WAIT;

/// How a conversation's bytes are cut into writes. Every write is flushed before the next
/// one starts (`TCP_NODELAY`, so each leaves as its own segment), and none waits for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cutting {
    /// Every packet of the conversation in one write (CONNECT and all that follows).
    Whole,
    /// One write per packet, back to back.
    PerPacket,
    /// One write per byte.
    EveryByte,
    /// Cut at random places (a seeded xorshift, so a failure replays): pieces of 1 to 2x the
    /// mean packet size, across packet boundaries.
    Random(u64),
}

impl Cutting {
    /// The cuttings every conversation is replayed under: the three fixed ones and `seeds`
    /// random ones.
    pub fn all(seeds: u64) -> Vec<Cutting> {
        let mut all = vec![Cutting::Whole, Cutting::PerPacket, Cutting::EveryByte];
        all.extend((1..=seeds).map(Cutting::Random));
        all
    }

    /// The writes for packets `packets` (each already encoded).
    pub fn writes(self, packets: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let all: Vec<u8> = packets.concat();
        match self {
            Cutting::Whole => vec![all],
            Cutting::PerPacket => packets.to_vec(),
            Cutting::EveryByte => all.iter().map(|b| vec![*b]).collect(),
            Cutting::Random(seed) => {
                let mean = (all.len() / packets.len().max(1)).max(1);
                let mut rng = XorShift::new(seed);
                let mut out = Vec::new();
                let mut at = 0;
                while at < all.len() {
                    let len = 1 + rng.below(2 * mean as u64) as usize;
                    let end = (at + len).min(all.len());
                    out.push(all[at..end].to_vec());
                    at = end;
                }
                out
            }
        }
    }
}

/// Cut points for any number of writes, chosen by a proptest: `cuts` are offsets into the
/// conversation's bytes (out-of-range ones ignored, duplicates merged).
pub fn writes_at(packets: &[Vec<u8>], cuts: &[usize]) -> Vec<Vec<u8>> {
    let all: Vec<u8> = packets.concat();
    let mut points: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|c| *c > 0 && *c < all.len())
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points.into_iter().chain(std::iter::once(all.len())) {
        out.push(all[at..p].to_vec());
        at = p;
    }
    out
}

/// A small deterministic generator (xorshift64*): test cuttings must replay from their seed.
pub struct XorShift(u64);

impl XorShift {
    /// Seeded; a zero seed is moved off zero (xorshift's fixed point).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// The ways into a broker a conversation can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain MQTT over TCP.
    Tcp,
    /// TCP with a PROXY protocol v1 header first; the header is part of the cut stream (a
    /// balancer writes it together with the client's first bytes).
    Proxy,
    /// MQTT over TLS (the development CA); each write is its own TLS record.
    Tls,
    /// MQTT inside WebSocket binary frames; each write is its own frame (the upgrade is
    /// waited for: RFC 6455 §4.1 has the client wait for it).
    Ws,
    /// The same over TLS.
    Wss,
}

impl Transport {
    /// Every transport.
    pub const ALL: [Transport; 5] = [
        Transport::Tcp,
        Transport::Proxy,
        Transport::Tls,
        Transport::Ws,
        Transport::Wss,
    ];

    /// The `[[listener]]` keys (after `bind`) of a listener of this kind, with the
    /// development certificates; `name` is the listener's name.
    pub fn listener_keys(self) -> String {
        let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs");
        let tls = format!(
            "[listener.tls]\ncert = {:?}\nkey = {:?}\n",
            certs.join("server.pem").display().to_string(),
            certs.join("server.key").display().to_string()
        );
        match self {
            Transport::Tcp => "name = \"tcp\"\n".into(),
            Transport::Proxy => "name = \"proxy\"\nproxy_protocol = true\n".into(),
            Transport::Tls => format!("name = \"tls\"\nkind = \"tls\"\n{tls}"),
            Transport::Ws => "name = \"ws\"\nkind = \"ws\"\n".into(),
            Transport::Wss => format!("name = \"wss\"\nkind = \"wss\"\n{tls}"),
        }
    }

    /// The listener's name in [`Transport::listener_keys`].
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Proxy => "proxy",
            Transport::Tls => "tls",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
        }
    }
}

/// A stream a conversation runs over.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection's wire: the stream, and for a WebSocket the framing both ways.
struct Wire {
    stream: Box<dyn Stream>,
    ws: bool,
    /// WebSocket bytes read and not yet taken apart into frames.
    pending: Vec<u8>,
}

impl Wire {
    async fn open(transport: Transport, addr: SocketAddr) -> Result<Wire, String> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let stream: Box<dyn Stream> = match transport {
            Transport::Tcp | Transport::Proxy | Transport::Ws => Box::new(tcp),
            Transport::Tls | Transport::Wss => {
                let name = rustls::pki_types::ServerName::try_from("localhost")
                    .map_err(|e| e.to_string())?;
                let tls = super::dev_ca_connector()
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake: {e}"))?;
                Box::new(tls)
            }
        };
        let mut wire = Wire {
            stream,
            ws: matches!(transport, Transport::Ws | Transport::Wss),
            pending: Vec::new(),
        };
        if wire.ws {
            wire.upgrade(addr).await?;
        }
        Ok(wire)
    }

    async fn upgrade(&mut self, addr: SocketAddr) -> Result<(), String> {
        let request = format!(
            "GET /mqtt HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: mqtt\r\n\r\n"
        );
        self.stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let end = loop {
            if let Some(i) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err("connection ended during the upgrade".into()),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
        if !head.starts_with("HTTP/1.1 101") {
            return Err(format!("upgrade refused: {head}"));
        }
        self.pending.drain(..end);
        Ok(())
    }

    /// Writes one piece of the client's bytes (a frame of its own on a WebSocket) and
    /// flushes it.
    async fn write(&mut self, piece: &[u8]) -> std::io::Result<()> {
        if self.ws {
            self.stream.write_all(&client_frame(0x2, piece)).await?;
        } else {
            self.stream.write_all(piece).await?;
        }
        self.stream.flush().await
    }

    /// Appends what arrived to `out` (the MQTT bytes of binary frames on a WebSocket);
    /// `false` at the end of the stream (a close frame on a WebSocket).
    async fn read(&mut self, out: &mut BytesMut) -> bool {
        if !self.ws {
            return matches!(self.stream.read_buf(out).await, Ok(n) if n > 0);
        }
        loop {
            if let Some((opcode, payload, used)) = server_frame(&self.pending) {
                self.pending.drain(..used);
                match opcode {
                    0x2 => {
                        out.extend_from_slice(&payload);
                        return true;
                    }
                    0x8 => {
                        // Answer the close (RFC 6455 §5.5.1), then read to the TCP end.
                        let _ = self.stream.write_all(&client_frame(0x8, &payload)).await;
                        let mut rest = [0u8; 256];
                        while matches!(self.stream.read(&mut rest).await, Ok(n) if n > 0) {}
                        return false;
                    }
                    _ => continue, // pings are answered by nobody here; the broker sends none
                }
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

/// A masked client frame with FIN (RFC 6455 §5.2).
pub fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x37u8, 0xfa, 0x21, 0x3d];
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// One complete unmasked server frame at the front of `buf`: (opcode, payload, bytes used).
fn server_frame(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if buf.len() < 2 {
        return None;
    }
    let (len, header) = match buf[1] & 0x7F {
        126 if buf.len() >= 4 => (usize::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() >= 10 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (u64::from_be_bytes(b) as usize, 10)
        }
        126 | 127 => return None,
        n => (usize::from(n), 2),
    };
    if buf.len() < header + len {
        return None;
    }
    Some((
        buf[0] & 0x0F,
        buf[header..header + len].to_vec(),
        header + len,
    ))
}

/// What one connection sends, and the answers it must get back (as [`answer`] writes them).
#[derive(Debug, Clone)]
pub struct Conversation {
    pub version: ProtocolVersion,
    /// CONNECT first.
    pub packets: Vec<Packet>,
    /// Every answer, in the order a broker that handles one packet at a time would send
    /// them; compared per kind ([`answer_kind`]).
    pub answers: Vec<String>,
}

impl Conversation {
    /// Whether it ends with the client's DISCONNECT (then the broker's close ends it;
    /// otherwise the runner appends a PINGREQ and its PINGRESP ends it).
    fn disconnects(&self) -> bool {
        matches!(self.packets.last(), Some(Packet::Disconnect(_)))
    }

    /// The client's byte stream over `transport`, a piece per packet: the packets encoded,
    /// behind a PROXY v1 header on [`Transport::Proxy`] (a balancer writes it and the
    /// client's first bytes as they come, so it is cut like the rest).
    pub fn stream(&self, transport: Transport) -> Vec<Vec<u8>> {
        let header = (transport == Transport::Proxy)
            .then(|| b"PROXY TCP4 198.51.100.7 127.0.0.1 40000 1883\r\n".to_vec());
        header
            .into_iter()
            .chain(self.packets.iter().map(|p| {
                let mut out = BytesMut::new();
                codec::encode(p, self.version, &mut out).expect("encode");
                out.to_vec()
            }))
            .collect()
    }
}

/// Conversations that run one after another (each to its end before the next starts).
pub type Scenario = Vec<Conversation>;

/// The line an answer is compared by: the packet's kind and the fields a client acts on.
/// Server-chosen packet ids of deliveries and v5 properties (which differ between brokers
/// and are checked by the tests of each feature) are left out.
pub fn answer(packet: &Packet) -> String {
    match packet {
        Packet::ConnAck(a) => format!(
            "CONNACK sp={} rc={:#04x}",
            u8::from(a.session_present),
            a.reason_code.0
        ),
        Packet::SubAck(a) => {
            let mut s = format!("SUBACK id={}", a.packet_id);
            for c in &a.reason_codes {
                let _ = write!(s, " {:#04x}", c.0);
            }
            s
        }
        Packet::UnsubAck(a) => format!("UNSUBACK id={}", a.packet_id),
        Packet::PubAck(a) => format!("PUBACK id={} rc={:#04x}", a.packet_id, a.reason_code.0),
        Packet::PubRec(a) => format!("PUBREC id={} rc={:#04x}", a.packet_id, a.reason_code.0),
        Packet::PubComp(a) => format!("PUBCOMP id={} rc={:#04x}", a.packet_id, a.reason_code.0),
        Packet::PubRel(_) => "PUBREL".into(),
        Packet::Publish(p) => format!(
            "PUBLISH {} q{} r{} {}",
            p.topic,
            p.qos as u8,
            u8::from(p.retain),
            String::from_utf8_lossy(&p.payload)
        ),
        Packet::PingResp => "PINGRESP".into(),
        Packet::Disconnect(d) => format!("DISCONNECT rc={:#04x}", d.reason_code.0),
        other => other.name().to_owned(),
    }
}

/// The ordered flow an answer belongs to: answers are compared in order within a flow only.
pub fn answer_kind(answer: &str) -> &'static str {
    match answer.split(' ').next().unwrap_or("") {
        "CONNACK" => "connack",
        "SUBACK" | "UNSUBACK" => "subscriptions",
        "PUBACK" | "PUBREC" | "PUBCOMP" => "publish acks",
        "PUBLISH" | "PUBREL" => "deliveries",
        "PINGRESP" => "pings",
        _ => "other",
    }
}

/// Where to replay: the broker's listener for each transport.
pub trait Target {
    /// The address of the listener for `transport`.
    fn addr(&self, transport: Transport) -> SocketAddr;
}

impl Target for postbox::server::RunningServer {
    fn addr(&self, transport: Transport) -> SocketAddr {
        self.listener_addr(transport.name())
            .unwrap_or_else(|| panic!("no {} listener", transport.name()))
    }
}

/// A plain TCP broker (Mosquitto, say) as a target: TCP only.
pub struct TcpTarget(pub SocketAddr);

impl Target for TcpTarget {
    fn addr(&self, transport: Transport) -> SocketAddr {
        assert_eq!(transport, Transport::Tcp, "a TCP-only target");
        self.0
    }
}

/// Writes `conversation` as `writes` (pieces of its bytes) over `transport`, without waiting
/// between writes, then reads the answers until its end; `Err` says what differed from its
/// expected answers (with the writes' sizes, to reproduce).
pub async fn replay_writes(
    target: &dyn Target,
    transport: Transport,
    conversation: &Conversation,
    writes: &[Vec<u8>],
) -> Result<(), String> {
    let mut wire = Wire::open(transport, target.addr(transport)).await?;
    let disconnects = conversation.disconnects();
    let version = conversation.version;
    let run = async {
        for piece in writes {
            // The broker may close early (a refusal): what arrived is compared below.
            if wire.write(piece).await.is_err() {
                break;
            }
        }
        let mut got: Vec<String> = Vec::new();
        let mut buf = BytesMut::new();
        let mut pinged = false;
        loop {
            while let Some(packet) = decode(&mut buf, version)? {
                got.push(answer(&packet));
            }
            if !disconnects && !pinged && covers(&got, &conversation.answers) {
                // Everything expected is in: one more round trip catches answers too many.
                let mut ping = BytesMut::new();
                codec::encode(&Packet::PingReq, version, &mut ping).expect("encode");
                wire.write(&ping).await.map_err(|e| e.to_string())?;
                pinged = true;
            }
            if pinged && got.iter().filter(|a| *a == "PINGRESP").count() > pings(conversation) {
                got.pop();
                return Ok(got);
            }
            if !wire.read(&mut buf).await {
                return Ok(got);
            }
        }
    };
    let got = tokio::time::timeout(WAIT, run)
        .await
        .map_err(|_| "no end within WAIT".to_owned())
        .and_then(|r: Result<Vec<String>, String>| r);
    let sizes: Vec<usize> = writes.iter().map(Vec::len).collect();
    let summary = if sizes.len() > 24 {
        format!("{} writes", sizes.len())
    } else {
        format!("writes {sizes:?}")
    };
    match got {
        Ok(got) => compare(&got, &conversation.answers).map_err(|why| {
            format!(
                "{transport:?}, {summary}: {why}\n  got      {got:?}\n  expected {:?}",
                conversation.answers
            )
        }),
        Err(why) => Err(format!("{transport:?}, {summary}: {why}")),
    }
}

/// A connection held open over some [`Transport`], for tests of what connections hold.
pub struct OpenConnection {
    _wire: Wire,
}

/// Opens a connection over `transport` to `addr`, sends `connect` and reads the answer to it
/// (within [`WAIT`]): the connection, and the first packet back (`None` if it closed first).
pub async fn connect_over(
    transport: Transport,
    addr: SocketAddr,
    connect: &Packet,
    version: ProtocolVersion,
) -> Result<(OpenConnection, Option<Packet>), String> {
    let mut wire = Wire::open(transport, addr).await?;
    let mut bytes = BytesMut::new();
    codec::encode(connect, version, &mut bytes).map_err(|e| e.to_string())?;
    wire.write(&bytes).await.map_err(|e| e.to_string())?;
    let mut buf = BytesMut::new();
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(packet) = decode(&mut buf, version)? {
                return Ok::<_, String>(Some(packet));
            }
            if !wire.read(&mut buf).await {
                return Ok(None);
            }
        }
    })
    .await
    .map_err(|_| format!("no answer to CONNECT within {WAIT:?}"))??;
    Ok((OpenConnection { _wire: wire }, answer))
}

fn decode(buf: &mut BytesMut, version: ProtocolVersion) -> Result<Option<Packet>, String> {
    codec::decode(buf, Some(version), 1 << 28).map_err(|e| format!("undecodable answer: {e}"))
}

/// PINGRESPs the conversation itself asks for.
fn pings(conversation: &Conversation) -> usize {
    conversation
        .answers
        .iter()
        .filter(|a| *a == "PINGRESP")
        .count()
}

/// Whether `got` holds at least every expected answer (as a multiset).
fn covers(got: &[String], expected: &[String]) -> bool {
    let mut left: Vec<&String> = got.iter().collect();
    expected.iter().all(|e| {
        left.iter()
            .position(|g| *g == e)
            .map(|i| left.swap_remove(i))
            .is_some()
    })
}

/// `Ok` when `got` are the expected answers, in order within each flow; CONNACK first
/// (MQTT-3.2.0-1: the first packet the server sends).
pub fn compare(got: &[String], expected: &[String]) -> Result<(), String> {
    if got.first().map(|a| answer_kind(a)) != Some("connack") {
        return Err("the first answer is not CONNACK (MQTT-3.2.0-1)".into());
    }
    for kind in [
        "connack",
        "subscriptions",
        "publish acks",
        "deliveries",
        "pings",
        "other",
    ] {
        let g: Vec<&String> = got.iter().filter(|a| answer_kind(a) == kind).collect();
        let e: Vec<&String> = expected.iter().filter(|a| answer_kind(a) == kind).collect();
        if g != e {
            return Err(format!("{kind} differ: got {g:?}, expected {e:?}"));
        }
    }
    Ok(())
}

/// Runs `scenario` once under `cutting` over `transport`.
pub async fn replay(
    target: &dyn Target,
    transport: Transport,
    scenario: &Scenario,
    cutting: Cutting,
) -> Result<(), String> {
    for (i, conversation) in scenario.iter().enumerate() {
        let writes = cutting.writes(&conversation.stream(transport));
        replay_writes(target, transport, conversation, &writes)
            .await
            .map_err(|why| format!("conversation {i}, {cutting:?}: {why}"))?;
    }
    Ok(())
}

/// Runs the scenario `make(tag)` (fresh client ids and topics per `tag`) under every cutting
/// of [`Cutting::all`] over every transport in `transports`; panics with every failure.
pub async fn replay_all(
    target: &dyn Target,
    transports: &[Transport],
    seeds: u64,
    make: impl Fn(&str) -> Scenario,
) {
    let mut failures = Vec::new();
    let mut runs = 0;
    for transport in transports {
        for cutting in Cutting::all(seeds) {
            let tag = format!("{}-{}", transport.name(), cutting_tag(cutting));
            runs += 1;
            if let Err(why) = replay(target, *transport, &make(&tag), cutting).await {
                failures.push(why);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} replays differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn cutting_tag(cutting: Cutting) -> String {
    match cutting {
        Cutting::Whole => "whole".into(),
        Cutting::PerPacket => "packets".into(),
        Cutting::EveryByte => "bytes".into(),
        Cutting::Random(seed) => format!("r{seed}"),
    }
}

/// How long a conversation against a broker may take at most (each replay is bounded by
/// [`WAIT`]); for callers that bound a whole set.
pub const REPLAY_LIMIT: Duration = WAIT;
