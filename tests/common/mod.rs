//! Shared test harness: the real broker in-process on an ephemeral loopback port, a raw MQTT
//! client for byte-level cases, and bounded waits (no sleeps as synchronisation).
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

pub mod async_process;
pub mod cluster;
pub mod cutting;
pub mod disk;
pub mod http;
pub mod mosquitto;
pub mod mosquitto_broker;
pub mod nats;
pub mod process;
pub mod rumq;
pub mod tap;
pub mod v5;

use bytes::BytesMut;
use postbox::codec::{self, Packet, ProtocolVersion};
use postbox::config::Config;
use postbox::server::{self, RunningServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A clean-start CONNECT at `version` for `client_id` (keep-alive 60, no will, no
/// credentials, no properties): the one CONNECT builder every test starts from and adjusts
/// (`Connect { clean_start: false, ..connect_packet(..) }`).
pub fn connect_packet(version: ProtocolVersion, client_id: &str) -> codec::Connect {
    codec::Connect {
        protocol: version,
        clean_start: true,
        keep_alive: 60,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: Default::default(),
        bridge: false,
    }
}

/// `packet` encoded at `version`: for tests that write raw bytes (split packets, PROXY
/// headers, WebSocket frames, several packets in one write).
pub fn encode(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    codec::encode(packet, version, &mut out).expect("encode");
    out.to_vec()
}

/// A clean 3.1.1 CONNECT for `client_id` (keep-alive 60), encoded.
pub fn connect_bytes(client_id: &str) -> Vec<u8> {
    let connect = connect_packet(ProtocolVersion::V3_1_1, client_id);
    encode(&Packet::Connect(Box::new(connect)), ProtocolVersion::V3_1_1)
}

/// Upper bound for any single wait in a test; generous for a loaded 2-core CI machine.
pub const WAIT: Duration = Duration::from_secs(10);

/// A config for tests: loopback, port 0, no metrics exporter (it is process-global), in memory.
pub fn test_config() -> Config {
    let mut config = Config::default();
    config.listeners[0].bind = "127.0.0.1:0".parse().expect("literal address");
    config.metrics.enabled = false;
    config.storage.persistence = false; // durability has its own tests, on temp dirs
    config
}

/// Writes `rules` to `dir/acl` and makes it `config`'s ACL file (`auth.acl_file`); returns its
/// path, for tests that rewrite it and reload.
pub fn set_acl(config: &mut Config, dir: &std::path::Path, rules: &str) -> std::path::PathBuf {
    let path = dir.join("acl");
    std::fs::write(&path, rules).expect("write acl");
    config.auth.acl_file = Some(path.clone());
    path
}

/// Starts a broker with the test config.
pub async fn start() -> RunningServer {
    start_with(test_config()).await
}

/// Starts a broker with a given config.
///
/// A restart in this process right after a shutdown on the same data directory may find
/// the store's lock still held by this very process: the shutdown released it, but a child
/// process another test is spawning at that moment holds a copy of the lock file's
/// descriptor until its exec closes it (a `flock` belongs to the open file, not to one
/// descriptor). Nothing signals that exec, so the start is tried again, at most 50 times
/// 20 ms apart; a lock held by another process fails at once.
pub async fn start_with(config: Config) -> RunningServer {
    let ours = format!("pid {},", std::process::id());
    for _ in 0..50 {
        match server::start(config.clone()).await {
            Err(server::StartError::Storage(
                postbox::test_support::storage::StorageError::Locked { holder, .. },
            )) if holder.starts_with(&ours) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            started => return started.expect("broker starts"),
        }
    }
    server::start(config).await.expect("broker starts")
}

/// A byte-level MQTT client for malformed-input and protocol-detail tests.
///
/// Its packets go out cut: [`RawClient::send`] writes each one in one to three pieces at
/// seeded random places ([`cutting::XorShift`], seeded per client from `POSTBOX_TEST_SEED`
/// or the test's thread name), each flushed on its own, so every test that drives the
/// broker with it also checks that a packet split across reads is handled like a whole
/// one (issue 34). With `POSTBOX_TEST_PIPELINE=1`, [`RawClient::connect`] does not wait for
/// the CONNACK either: the test's next packets follow the CONNECT at once, as a pipelining
/// client's do, and the first [`RawClient::recv`] checks the CONNACK (a way to run the
/// whole suite as such a client: see `tests/common/cutting.rs`).
pub struct RawClient {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub version: ProtocolVersion,
    /// Where the cuts of [`RawClient::send`] fall.
    cuts: cutting::XorShift,
    /// A CONNACK is owed and not read yet (`POSTBOX_TEST_PIPELINE`).
    connack_owed: bool,
}

/// The seed of a new [`RawClient`]'s cuts: `POSTBOX_TEST_SEED` if set, else a hash of the
/// test's name (the thread's), so a failure replays; mixed with a per-process count so two
/// clients of one test cut differently.
fn cut_seed() -> u64 {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CLIENTS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match std::env::var("POSTBOX_TEST_SEED") {
        Ok(seed) => seed.hash(&mut hasher),
        Err(_) => std::thread::current().name().hash(&mut hasher),
    }
    hasher.finish() ^ CLIENTS.fetch_add(1, Ordering::Relaxed)
}

/// Whether [`RawClient::connect`] pipelines (`POSTBOX_TEST_PIPELINE=1`).
fn pipelining() -> bool {
    std::env::var("POSTBOX_TEST_PIPELINE").is_ok_and(|v| v == "1")
}

impl RawClient {
    /// Opens a TCP connection (no CONNECT yet).
    pub async fn open(addr: SocketAddr, version: ProtocolVersion) -> RawClient {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        stream.set_nodelay(true).expect("nodelay");
        RawClient::over(stream, version)
    }

    /// A client on a socket opened by the caller (a source address, a small window).
    pub fn over(stream: TcpStream, version: ProtocolVersion) -> RawClient {
        RawClient {
            stream,
            buf: BytesMut::new(),
            version,
            cuts: cutting::XorShift::new(cut_seed()),
            connack_owed: false,
        }
    }

    /// Opens and completes a CONNECT / CONNACK handshake.
    pub async fn connect(
        addr: SocketAddr,
        version: ProtocolVersion,
        client_id: &str,
        clean: bool,
    ) -> RawClient {
        let mut c = RawClient::open(addr, version).await;
        let connect = codec::Connect {
            clean_start: clean,
            ..connect_packet(version, client_id)
        };
        c.send(&Packet::Connect(Box::new(connect))).await;
        if pipelining() {
            c.connack_owed = true;
            return c;
        }
        match c.recv().await {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code.0, 0, "CONNACK refused"),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        c
    }

    /// Encodes and sends a packet, cut in one to three writes (see [`RawClient`]). A write
    /// the broker's close (or death) made fail ends the sending: the next [`RawClient::recv`]
    /// reports the close, as it would have for a write the kernel took before the reset.
    pub async fn send(&mut self, packet: &Packet) {
        let out = encode(packet, self.version);
        let mut rest = &out[..];
        for _ in 0..2 {
            if rest.len() < 2 || self.cuts.below(2) == 0 {
                break;
            }
            let at = 1 + self.cuts.below(rest.len() as u64 - 1) as usize;
            let (piece, after) = rest.split_at(at);
            if self.stream.write_all(piece).await.is_err() || self.stream.flush().await.is_err() {
                return;
            }
            rest = after;
        }
        let _ = self.stream.write_all(rest).await;
    }

    /// Sends raw bytes as they are.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        // The broker may already have closed; that is for the caller to observe.
        let _ = self.stream.write_all(bytes).await;
    }

    /// Next packet from the broker, or `None` if the connection closed. Panics after `WAIT`.
    pub async fn recv(&mut self) -> Option<Packet> {
        tokio::time::timeout(WAIT, self.recv_inner())
            .await
            .expect("timed out waiting for a packet")
    }

    /// Next packet within `limit`, `Err(())` on timeout.
    pub async fn recv_within(&mut self, limit: Duration) -> Result<Option<Packet>, ()> {
        tokio::time::timeout(limit, self.recv_inner())
            .await
            .map_err(|_| ())
    }

    /// Exactly `n` raw bytes from the broker (for checking wire layouts), after the CONNACK
    /// when one is owed (`POSTBOX_TEST_PIPELINE`).
    pub async fn recv_bytes(&mut self, n: usize) -> Vec<u8> {
        if std::mem::take(&mut self.connack_owed) {
            match tokio::time::timeout(WAIT, self.next_packet()).await {
                Ok(Some(Packet::ConnAck(ack))) => {
                    assert_eq!(ack.reason_code.0, 0, "CONNACK refused");
                }
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }
        tokio::time::timeout(WAIT, async {
            while self.buf.len() < n {
                match self.stream.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("timed out waiting for bytes");
        let take = n.min(self.buf.len());
        self.buf.split_to(take).to_vec()
    }

    /// Reads the CONNACK still owed (`POSTBOX_TEST_PIPELINE`), for a test whose next step
    /// needs the client connected, not just its CONNECT sent (a server shutdown that must
    /// find it connected to tell it so). Without pipelining it was read already.
    pub async fn connected(&mut self) {
        if std::mem::take(&mut self.connack_owed) {
            match tokio::time::timeout(WAIT, self.next_packet()).await {
                Ok(Some(Packet::ConnAck(ack))) => {
                    assert_eq!(ack.reason_code.0, 0, "CONNACK refused");
                }
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }
    }

    async fn recv_inner(&mut self) -> Option<Packet> {
        if std::mem::take(&mut self.connack_owed) {
            match self.next_packet().await {
                Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason_code.0, 0, "CONNACK refused"),
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }
        self.next_packet().await
    }

    async fn next_packet(&mut self) -> Option<Packet> {
        loop {
            match codec::decode(&mut self.buf, Some(self.version), 1 << 28) {
                Ok(Some(p)) => return Some(p),
                Ok(None) => {}
                Err(e) => panic!("broker sent an undecodable packet: {e}"),
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Asserts the broker closes the connection without sending anything first (3.1.1 has no
    /// server DISCONNECT); `why` is the failure's message.
    pub async fn expect_silent_close(&mut self, why: &str) {
        let seen = self.expect_close().await;
        assert!(seen.is_empty(), "{why}: {seen:?}");
    }

    /// Sends PINGREQ and says whether the next packet is its PINGRESP (MQTT-3.12.4-1): the
    /// connection is up and nothing else was queued before it.
    pub async fn answers_ping(&mut self) -> bool {
        self.send(&Packet::PingReq).await;
        matches!(self.recv().await, Some(Packet::PingResp))
    }

    /// Asserts the broker closes the connection (after optionally sending packets, returned).
    pub async fn expect_close(&mut self) -> Vec<Packet> {
        let mut seen = Vec::new();
        loop {
            match self.recv().await {
                Some(p) => seen.push(p),
                None => return seen,
            }
        }
    }
}

/// Connects a clean 3.1.1 client `client_id` to `addr` and sends a QoS 1 PUBLISH of `payload`
/// to `topic` (packet id `packet_id`) that the broker must refuse: 3.1.1 has no negative
/// acknowledgement, so the connection must close with no PUBACK (`why` opens the failure
/// message). The one copy of that check for every refusal (limits, budgets, a cluster down).
pub async fn expect_v311_publish_refused(
    addr: SocketAddr,
    client_id: &str,
    topic: &str,
    payload: &[u8],
    packet_id: u16,
    why: &str,
) {
    let mut old = RawClient::connect(addr, ProtocolVersion::V3_1_1, client_id, true).await;
    old.send(&Packet::Publish(v5::publish_packet(
        topic,
        codec::QoS::AtLeastOnce,
        payload,
        packet_id,
    )))
    .await;
    let seen = old.expect_close().await;
    assert!(
        !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
        "{why}: {seen:?}"
    );
}

/// Opens connection after connection with `open` (given its index, from 0 below `limit`),
/// keeping every one admitted (CONNACK 0x00), until one is refused with 0x97 Quota exceeded:
/// the kept connections and the index refused (`None`: all were admitted). Any other answer
/// fails the test, naming `what` and the index. The bound tests' admission loop.
pub async fn open_until_quota_exceeded<C>(
    limit: u16,
    what: &str,
    mut open: impl AsyncFnMut(u16) -> (C, Option<Packet>),
) -> (Vec<C>, Option<u16>) {
    let mut kept = Vec::new();
    for n in 0..limit {
        match open(n).await {
            (c, Some(Packet::ConnAck(ack))) if ack.reason_code == codec::ReasonCode::SUCCESS => {
                kept.push(c);
            }
            (_, Some(Packet::ConnAck(ack)))
                if ack.reason_code == codec::ReasonCode::QUOTA_EXCEEDED =>
            {
                return (kept, Some(n));
            }
            (_, other) => panic!("{what} {n}: {other:?}"),
        }
    }
    (kept, None)
}

/// Subscribes `c` (a persistent session) to `filter` at `qos`, awaits the SUBACK and
/// disconnects cleanly: a subscriber left offline, for what is published next to queue for
/// it (the durability and crash tests' setup).
pub async fn subscribe_and_leave(mut c: RawClient, filter: &str, qos: codec::QoS) {
    c.send(&Packet::Subscribe(codec::Subscribe {
        packet_id: 1,
        filters: vec![(
            filter.into(),
            codec::SubscriptionOptions {
                qos,
                ..Default::default()
            },
        )],
        ..Default::default()
    }))
    .await;
    assert!(matches!(c.recv().await, Some(Packet::SubAck(_))));
    c.send(&Packet::Disconnect(Default::default())).await;
    assert!(c.expect_close().await.is_empty());
}

/// A TLS connector that trusts the development CA (`certs/ca.pem`) and presents no client
/// certificate, on the broker's own provider (ring): the client side of TLS listener tests
/// that need a socket of their own (a PROXY header first, a WebSocket upgrade after).
pub fn dev_ca_connector() -> tokio_rustls::TlsConnector {
    let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("certs/ca.pem");
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).expect("dev CA") {
        roots.add(cert.expect("dev CA cert")).expect("add dev CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// Runs `cmd`, which must start and succeed (else the panic names the command and shows its
/// stderr): the one run-and-check for the tools the tests drive (openssl, `postbox passwd`,
/// `mosquitto_passwd`).
pub fn run_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} does not run (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `openssl ARGS`, which must succeed, and returns its stdout: for the tests that make
/// keys, certificates and signatures on the fly.
pub fn openssl(args: &[&str]) -> Vec<u8> {
    run_ok(std::process::Command::new("openssl").args(args)).stdout
}

/// A new P-256 key at `key` and a certificate for it signed by itself at `pem` (subject
/// `/CN=cn`, valid `days`, then `extra` arguments such as `-addext`), by `openssl req -x509`:
/// a CA or server certificate of a test's own.
pub fn self_signed_p256(key: &str, pem: &str, cn: &str, days: u32, extra: &[&str]) {
    let (days, subject) = (days.to_string(), format!("/CN={cn}"));
    let mut args = vec![
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key,
        "-out",
        pem,
        "-days",
        &days,
        "-subj",
        &subject,
    ];
    args.extend_from_slice(extra);
    openssl(&args);
}

/// The users of `config/passwd.example` (sensor1, sensor2, dashboard; password
/// `<user>-secret`) hashed with 101 PBKDF2 iterations instead of 210 000, written to
/// `dir/passwd`: a broker in a debug build verifies a login at once, so tests that log in
/// many times stay within their waits.
pub fn fast_example_passwords(dir: &std::path::Path) -> std::path::PathBuf {
    const LINES: [&str; 3] = [
    "sensor1:$7$101$NilWHcWjBCPy2itQ$K/GWk1NQni7SbHIsP/lax4FsCpUylDupBceX14jcQIzfWomMobLv+qj6Ys96Qrw0uZG9MmKz6McQQIgIXxDN9A==\n",
    "sensor2:$7$101$zmrBedfkLeBJMX6r$aHCZnqx1fj3WJq7SP+Y4Bq+tJilxTTCrdOTUN1S950FEdv2eVlBCNX4zwon4JF2jfqP+nkx0D13Bd8klikk+Qg==\n",
    "dashboard:$7$101$FVa0+laaNHwa08k2$TwtN043zxVbtZgdGPno+c5Xk7cyNllYeVEPKGijXhf9qzH9XQBRa125vvrCjYntRrBzQAV7nFgIf7fqTUO+a4Q==\n",
    ];
    let path = dir.join("passwd");
    std::fs::write(&path, LINES.concat()).expect("write the password file");
    path
}
