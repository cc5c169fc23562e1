//! The authentication matrix (issue 35, "What to build", first bullet): one broker per
//! combination of methods (password file, JWT, SCRAM, mTLS identity, anonymous access), and
//! for each, every shape of credentials (none, user only, password only, wrong, right,
//! token-shaped, not token-shaped, SCRAM right and wrong) over TCP, TLS without a client
//! certificate and TLS with one, each answered by the CONNACK the rule gives:
//!
//! a CONNECT is admitted only when a method verified it (a password the file holds, a token
//! that verifies, a SCRAM exchange, a certificate on a listener that takes its identity as the
//! user name), or anonymous access is on and no credentials were offered. The one exception
//! is a broker with no method that can verify anything (neither file nor JWT nor SCRAM): there
//! a user name is a name, admitted where anonymous access is on, as Mosquitto does.
//!
//! Where Mosquitto has the method (password file, anonymous access), the same CONNECTs go to a
//! real Mosquitto 2.0 with the same file: Postbox never admits what Mosquitto refuses (it may
//! refuse more: a password without a user name, issue 35 finding 1).
//!
//! MQTT-3.1.4-2, MQTT 5 §3.2.2.2 (0x86 Bad User Name or Password, 0x87 Not authorized, 0x8C
//! Bad authentication method), §4.12 (enhanced authentication), MQTT-4.12.0-1.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::BytesMut;
use postbox::codec::{self, Connect, Packet, ReasonCode};
use postbox::test_support::auth::password::PasswordHash;
use postbox::test_support::auth::scram::ScramKind;
use postbox::test_support::auth::scram_file::scram_credential_line;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::common;
use crate::jwt::{jwt_dir, now, rs256};
use crate::scram::{Hash, ScramClient};
use common::async_process::{connect_from, BrokerProcess};
use common::mosquitto_broker::MosquittoBroker;
use common::{v5, WAIT};

const OK: u8 = 0x00;
const BAD: u8 = 0x86;
const NOT_AUTHORIZED: u8 = 0x87;
const BAD_METHOD: u8 = 0x8C;

/// How a client reaches the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Tcp,
    /// TLS, no client certificate.
    Tls,
    /// TLS with the client certificate whose CN is `sensor1`.
    TlsCert,
}

const TRANSPORTS: [Transport; 3] = [Transport::Tcp, Transport::Tls, Transport::TlsCert];

/// The methods one broker runs.
#[derive(Clone, Copy, Debug)]
struct Methods {
    file: bool,
    jwt: bool,
    scram: bool,
    /// The TLS listener takes the certificate's CN as the user name.
    mtls: bool,
    anonymous: bool,
}

impl Methods {
    /// No method and no anonymous access: each setup turns on what it tests.
    const NONE: Methods = Methods {
        file: false,
        jwt: false,
        scram: false,
        mtls: false,
        anonymous: false,
    };
}

/// What a client offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    None,
    UserOnly,
    PasswordOnly,
    Wrong,
    Right,
    /// No user name, a token that verifies (its `sub` is the user).
    Token,
    /// A user name and a password shaped like a token, not signed by the key.
    ForgedToken,
    /// No user name, a password that is not shaped like a token.
    NotTokenOnly,
    ScramRight,
    ScramWrong,
}

const SHAPES: [Shape; 10] = [
    Shape::None,
    Shape::UserOnly,
    Shape::PasswordOnly,
    Shape::Wrong,
    Shape::Right,
    Shape::Token,
    Shape::ForgedToken,
    Shape::NotTokenOnly,
    Shape::ScramRight,
    Shape::ScramWrong,
];

const FORGED: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzZW5zb3IxIn0.c2lnbmF0dXJl";

impl Shape {
    /// User name and password of the CONNECT (SCRAM shapes: none; the method carries them).
    fn credentials(self, token: &str) -> (Option<&'static str>, Option<String>) {
        let user = Some("sensor1");
        let right = || Some("sensor1-secret".to_owned());
        match self {
            Shape::None | Shape::ScramRight | Shape::ScramWrong => (None, None),
            Shape::UserOnly => (user, None),
            Shape::PasswordOnly => (None, right()),
            Shape::Wrong => (user, Some("wrong".to_owned())),
            Shape::Right => (user, right()),
            Shape::Token => (None, Some(token.to_owned())),
            Shape::ForgedToken => (user, Some(FORGED.to_owned())),
            Shape::NotTokenOnly => (None, Some("not-a-token".to_owned())),
        }
    }
}

/// The rule: the CONNACK code a CONNECT of `shape` over `transport` gets from a broker with
/// `m` (v5 codes).
fn expected(m: Methods, shape: Shape, transport: Transport) -> u8 {
    let scram = |right: bool| match (m.scram, right) {
        (false, _) => BAD_METHOD,
        (true, true) => OK,
        (true, false) => BAD,
    };
    if m.mtls && transport != Transport::Tcp {
        // The certificate names the user; without one there is nobody to admit.
        return match shape {
            _ if transport == Transport::Tls => NOT_AUTHORIZED,
            Shape::ScramRight => scram(true),
            Shape::ScramWrong => scram(false),
            _ => OK,
        };
    }
    match shape {
        Shape::ScramRight => return scram(true),
        Shape::ScramWrong => return scram(false),
        _ => {}
    }
    let (user, password) = shape.credentials("eyJ");
    let (user, password) = (user.is_some(), password.is_some());
    if !user && !password {
        return if m.anonymous { OK } else { NOT_AUTHORIZED };
    }
    if m.jwt && matches!(shape, Shape::Token | Shape::ForgedToken) {
        return if shape == Shape::Token { OK } else { BAD };
    }
    if m.file && user {
        return if shape == Shape::Right { OK } else { BAD };
    }
    // Credentials offered that no method verified.
    // Certificate identities name users: on a listener without a certificate, a bare user
    // name must not pass for one (the third adversarial pass of issue 35).
    let verifier = m.file || m.jwt || m.scram || m.mtls;
    match (m.anonymous, verifier) {
        (true, true) => BAD,
        (true, false) => OK,
        (false, _) if user || m.jwt => BAD,
        (false, _) => NOT_AUTHORIZED,
    }
}

fn certs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("certs")
}

/// The files every broker of the matrix may name.
struct Files {
    _dir: tempfile::TempDir,
    passwd: PathBuf,
    scram: PathBuf,
    token: String,
}

fn files() -> Files {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = dir.path().join("passwd");
    let hash = PasswordHash::new_pbkdf2(b"sensor1-secret", 1_000).encode();
    std::fs::write(&passwd, format!("sensor1:{hash}\n")).expect("passwd");
    let scram = dir.path().join("scram");
    let line = scram_credential_line(ScramKind::Sha256, "sensor1", "sensor1-scram", 4096);
    std::fs::write(&scram, format!("{line}\n")).expect("scram");
    let claims = format!(r#"{{"sub":"sensor1","exp":{}}}"#, now() + 3600);
    let token = rs256(&jwt_dir().join("rsa.key"), &claims);
    Files {
        _dir: dir,
        passwd,
        scram,
        token,
    }
}

/// A Postbox with `m`: a TCP listener and a TLS one (client certificates optional).
async fn postbox(m: Methods, f: &Files) -> BrokerProcess {
    let mut tls = format!(
        "kind = \"tls\"\n[listener.tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n\
         client_cert = \"optional\"\n",
        certs().join("server.pem"),
        certs().join("server.key"),
        certs().join("ca.pem"),
    );
    if m.mtls {
        tls.push_str("identity = \"cn\"\nuse_identity_as_username = true\n");
    }
    let mut auth = format!(
        "[storage]\npersistence = false\n[auth]\nallow_anonymous = {}\n",
        m.anonymous
    );
    if m.file {
        auth.push_str(&format!("password_file = {:?}\n", f.passwd));
    }
    if m.scram {
        auth.push_str(&format!("scram_file = {:?}\n", f.scram));
    }
    if m.jwt {
        let key = jwt_dir().join("rsa.pub");
        auth.push_str(&format!("[auth.jwt]\npublic_key = {key:?}\n"));
    }
    BrokerProcess::spawn_sections(&["", &tls], &auth).await
}

/// A TLS connector trusting the dev CA, presenting `sensor1`'s certificate or none.
fn connector(with_cert: bool) -> tokio_rustls::TlsConnector {
    if !with_cert {
        return common::dev_ca_connector();
    }
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(certs().join("ca.pem")).expect("CA") {
        roots.add(cert.expect("CA cert")).expect("add CA");
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(certs().join("sensor1.pem"))
        .expect("client cert")
        .map(|c| c.expect("cert"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(certs().join("sensor1.key")).expect("client key");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client certificate");
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Writes `packet` to `stream`.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, packet: &Packet) {
    let mut out = BytesMut::new();
    codec::encode(packet, v5::V, &mut out).expect("encode");
    stream.write_all(&out).await.expect("write");
}

/// The next packet from `stream` (`None`: closed).
async fn next<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Option<Packet> {
    tokio::time::timeout(WAIT, async {
        loop {
            match codec::decode(buf, Some(v5::V), 1 << 20) {
                Ok(Some(packet)) => return Some(packet),
                Ok(None) => {}
                Err(e) => panic!("undecodable answer: {e}"),
            }
            match stream.read_buf(buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("an answer within WAIT")
}

/// The CONNACK code the broker answers `shape` with over `stream` (SCRAM: after the
/// exchange). `None`: closed without a CONNACK.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    shape: Shape,
    token: &str,
) -> Option<u8> {
    let mut buf = BytesMut::new();
    let scram = match shape {
        Shape::ScramRight => Some("sensor1-scram"),
        Shape::ScramWrong => Some("wrong"),
        _ => None,
    };
    if let Some(password) = scram {
        let mut client = ScramClient::new(Hash::Sha256, "sensor1", password);
        let method = Hash::Sha256.method();
        let connect = v5::auth_connect("matrix", method, client.client_first());
        send(&mut stream, &Packet::Connect(Box::new(connect))).await;
        let first = next(&mut stream, &mut buf).await;
        if let Some(Packet::ConnAck(ack)) = first {
            return Some(ack.reason_code.0);
        }
        let fin = client.client_final(&v5::expect_challenge(first, method), false);
        let continuing = ReasonCode::CONTINUE_AUTHENTICATION;
        send(&mut stream, &v5::auth_packet(continuing, method, &fin)).await;
    } else {
        let (user, password) = shape.credentials(token);
        let connect = Connect {
            username: user.map(Into::into),
            password: password.map(|p| p.into_bytes().into()),
            ..v5::connect_packet("matrix")
        };
        send(&mut stream, &Packet::Connect(Box::new(connect))).await;
    }
    match next(&mut stream, &mut buf).await {
        Some(Packet::ConnAck(ack)) => Some(ack.reason_code.0),
        None => None,
        Some(other) => panic!("expected CONNACK, got {other:?}"),
    }
}

/// One CONNECT of `shape` to `addr` over `transport`, from `source`.
async fn try_shape(
    addr: SocketAddr,
    source: Ipv4Addr,
    transport: Transport,
    shape: Shape,
    token: &str,
) -> Option<u8> {
    let tcp = connect_from(source, addr).await;
    if transport == Transport::Tcp {
        return answer(tcp, shape, token).await;
    }
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio::time::timeout(
        WAIT,
        connector(transport == Transport::TlsCert).connect(name, tcp),
    )
    .await
    .expect("TLS handshake in time")
    .expect("TLS handshake");
    answer(tls, shape, token).await
}

fn setups() -> Vec<(&'static str, Methods)> {
    let none = Methods::NONE;
    vec![
        (
            "anonymous",
            Methods {
                anonymous: true,
                ..none
            },
        ),
        ("nothing", none),
        ("file", Methods { file: true, ..none }),
        (
            "file+anonymous",
            Methods {
                file: true,
                anonymous: true,
                ..none
            },
        ),
        ("jwt", Methods { jwt: true, ..none }),
        (
            "jwt+anonymous",
            Methods {
                jwt: true,
                anonymous: true,
                ..none
            },
        ),
        (
            "jwt+file",
            Methods {
                jwt: true,
                file: true,
                ..none
            },
        ),
        (
            "scram",
            Methods {
                scram: true,
                ..none
            },
        ),
        (
            "scram+anonymous",
            Methods {
                scram: true,
                anonymous: true,
                ..none
            },
        ),
        (
            "scram+file",
            Methods {
                scram: true,
                file: true,
                ..none
            },
        ),
        ("mtls", Methods { mtls: true, ..none }),
        (
            "mtls+file",
            Methods {
                mtls: true,
                file: true,
                ..none
            },
        ),
        (
            "mtls+anonymous",
            Methods {
                mtls: true,
                anonymous: true,
                ..none
            },
        ),
        (
            "all, anonymous",
            Methods {
                file: true,
                jwt: true,
                scram: true,
                mtls: true,
                anonymous: true,
            },
        ),
    ]
}

/// Every combination, every shape, every transport: the CONNACK the rule gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_combination_admits_only_verified_or_anonymous_clients() {
    let f = files();
    let mut wrong = Vec::new();
    for (s, (name, m)) in setups().into_iter().enumerate() {
        let broker = postbox(m, &f).await;
        for (t, transport) in TRANSPORTS.into_iter().enumerate() {
            // Each setup and transport from its own address: the failed-login limits (on by
            // default) count per address, and no cell may be throttled by another's.
            let source = Ipv4Addr::new(127, 1, u8::try_from(s).expect("few"), 1 + t as u8);
            let addr = broker.addrs[usize::from(transport != Transport::Tcp)];
            for shape in SHAPES {
                let got = try_shape(addr, source, transport, shape, &f.token).await;
                let want = expected(m, shape, transport);
                if got != Some(want) {
                    wrong.push(format!(
                        "{name} / {transport:?} / {shape:?}: got {got:02x?}, want {want:#04x}"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cells differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The reference: where Mosquitto has the methods (a password file, anonymous access), it
/// gets the same CONNECTs (over TCP) and Postbox admits none that it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postbox_never_admits_what_mosquitto_refuses() {
    let f = files();
    let none = Methods::NONE;
    let setups = [
        (
            "anonymous",
            Methods {
                anonymous: true,
                ..none
            },
            "allow_anonymous true\n".to_owned(),
        ),
        (
            "file",
            Methods { file: true, ..none },
            format!(
                "allow_anonymous false\npassword_file {}\n",
                f.passwd.display()
            ),
        ),
        (
            "file+anonymous",
            Methods {
                file: true,
                anonymous: true,
                ..none
            },
            format!(
                "allow_anonymous true\npassword_file {}\n",
                f.passwd.display()
            ),
        ),
    ];
    let mut looser = Vec::new();
    for (s, (name, m, conf)) in setups.into_iter().enumerate() {
        let postbox = postbox(m, &f).await;
        let mosquitto = MosquittoBroker::start(&conf).await;
        let reference = SocketAddr::from(([127, 0, 0, 1], mosquitto.port));
        let source = Ipv4Addr::new(127, 2, u8::try_from(s).expect("few"), 1);
        for shape in SHAPES {
            if matches!(shape, Shape::ScramRight | Shape::ScramWrong) {
                continue; // Mosquitto has no SCRAM
            }
            let theirs = try_shape(reference, source, Transport::Tcp, shape, &f.token).await;
            let ours = try_shape(postbox.addr, source, Transport::Tcp, shape, &f.token).await;
            let refused = |code: Option<u8>| code.is_none_or(|c| c >= 0x80);
            if refused(theirs) && !refused(ours) {
                looser.push(format!(
                    "{name} / {shape:?}: Mosquitto {theirs:02x?}, Postbox {ours:02x?}"
                ));
            }
        }
    }
    assert!(
        looser.is_empty(),
        "admitted where Mosquitto refuses:\n{}",
        looser.join("\n")
    );
}
