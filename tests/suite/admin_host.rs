//! The admin API's own guards (issue 35, finding 5), over real sockets against the `postbox`
//! binary: the Host header check that closes DNS rebinding (421 Misdirected Request, RFC 9110
//! §15.5.20), trust of exactly 127.0.0.1 / `::1` rather than all of 127.0.0.0/8, the token
//! required on loopback too when asked, and the API on a listener apart from `/metrics`.
//! `/metrics` and the probes stay open to any Host (Prometheus and the kubelet send the pod's
//! address or a service name).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;
use common::async_process::{connect_from, free_port, BrokerProcess};
use common::{v5, WAIT};

/// One HTTP/1.1 request from `source` to `to`, Host `host`, extra `headers` (CRLF-ended
/// lines): the status and the body.
async fn http(
    source: Ipv4Addr,
    to: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &str,
) -> (u16, String) {
    let mut s = connect_from(source, to).await;
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .expect("read");
    common::http::status_and_body(&String::from_utf8_lossy(&raw))
}

const IN_MEMORY: &str = "[storage]\npersistence = false\n";
const LOOPBACK: Ipv4Addr = Ipv4Addr::LOCALHOST;
const OTHER_LOOPBACK: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The API path of the session [`with_a_victim`] leaves.
const VICTIM: &str = "/api/v1/sessions/victim";

/// An in-memory broker with the offline session `victim` (at [`VICTIM`]): its HTTP address
/// and the `Host` value that names it (`127.0.0.1:PORT`), for the tests of who may delete it.
async fn with_a_victim() -> (BrokerProcess, SocketAddr, String) {
    let broker = BrokerProcess::spawn_file(IN_MEMORY, &[]).await;
    let http_addr = SocketAddr::from((LOOPBACK, broker.metrics_port));
    let own = format!("127.0.0.1:{}", broker.metrics_port);
    offline_session(&broker, "victim").await;
    (broker, http_addr, own)
}

/// A session that outlives its connection, for the API to find and delete.
async fn offline_session(broker: &BrokerProcess, id: &str) {
    let (c, _) = v5::connect(broker.addr, v5::persistent_connect(id, 3600)).await;
    v5::disconnect(c).await;
}

/// The finding as reported: `Host: attacker.example` (a page rebound to 127.0.0.1) and a peer
/// on 127.0.0.2 (a proxy or tunnel on the host) could DELETE a session. Now the first gets 421
/// and the second 403 (no token configured), the session stays, and the open endpoints still
/// answer both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_name_or_another_loopback_source_cannot_use_the_api() {
    let (broker, http_addr, own) = with_a_victim().await;
    let path = VICTIM;

    let (status, body) = http(LOOPBACK, http_addr, "DELETE", path, "attacker.example", "").await;
    assert_eq!(status, 421, "a rebound name: {body}");
    assert!(
        body.contains("admin.allowed_hosts"),
        "says what to set: {body}"
    );
    let (status, _) = http(LOOPBACK, http_addr, "GET", "/", "attacker.example:80", "").await;
    assert_eq!(status, 421, "the status page too");
    // The status page's fleet listings answer under the same rules as every API call
    // (issue 37, item 5).
    for fleet in ["/api/v1/listeners", "/api/v1/clients?search=vic"] {
        let (status, _) = http(LOOPBACK, http_addr, "GET", fleet, "attacker.example:80", "").await;
        assert_eq!(status, 421, "{fleet}");
        let (status, _) = http(OTHER_LOOPBACK, http_addr, "GET", fleet, &own, "").await;
        assert_eq!(status, 403, "{fleet} from 127.0.0.2");
    }

    let (status, body) = http(OTHER_LOOPBACK, http_addr, "DELETE", path, &own, "").await;
    assert_eq!(status, 403, "127.0.0.2 is not trusted as loopback: {body}");

    let (status, body) = http(LOOPBACK, http_addr, "GET", path, &own, "").await;
    assert_eq!(status, 200, "the session is still there: {body}");
    for host in [
        "localhost",
        &format!("localhost:{}", broker.metrics_port),
        "[::1]:1",
    ] {
        let (status, _) = http(LOOPBACK, http_addr, "GET", "/api/v1/clients", host, "").await;
        assert_eq!(status, 200, "Host {host}");
    }
    for open in ["/metrics", "/healthz", "/readyz", "/health"] {
        let (status, _) = http(OTHER_LOOPBACK, http_addr, "GET", open, "10.1.2.3:9883", "").await;
        assert_eq!(status, 200, "{open} answers any peer and Host");
    }
    let (status, body) = http(LOOPBACK, http_addr, "DELETE", path, &own, "").await;
    assert_eq!(status, 200, "the operator on 127.0.0.1 still can: {body}");
}

/// `[admin] bind` serves the API (and the page) alone, `[metrics] bind` only `/metrics` and
/// the probes; `require_token_on_loopback` asks 127.0.0.1 for the token; `allowed_hosts`
/// adds a name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_can_listen_apart_and_ask_loopback_for_its_token() {
    let work = tempfile::tempdir().expect("tempdir");
    let secret = "tok-0b7f2e91c4d3a655";
    let token_file = work.path().join("admin-token");
    std::fs::write(&token_file, format!("{secret}\n")).expect("token file");
    let api_port = free_port();
    let broker = BrokerProcess::spawn_file(
        &format!(
            "{IN_MEMORY}[admin]\ntoken_file = {token_file:?}\nrequire_token_on_loopback = true\n\
             allowed_hosts = [\"broker.example\"]\nbind = \"127.0.0.1:{api_port}\"\n"
        ),
        &[],
    )
    .await;
    let metrics = SocketAddr::from((LOOPBACK, broker.metrics_port));
    let api = SocketAddr::from((LOOPBACK, api_port));
    let bearer = format!("Authorization: Bearer {secret}\r\n");

    for open in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(
            http(LOOPBACK, metrics, "GET", open, "x", "").await.0,
            200,
            "{open}"
        );
        assert_eq!(
            http(LOOPBACK, api, "GET", open, "localhost", "").await.0,
            404,
            "{open}"
        );
    }
    let status = http(
        LOOPBACK,
        metrics,
        "GET",
        "/api/v1/clients",
        "localhost",
        &bearer,
    )
    .await;
    assert_eq!(status.0, 404, "no API beside /metrics");

    let (status, body) = http(LOOPBACK, api, "GET", "/api/v1/clients", "localhost", "").await;
    assert_eq!(status, 401, "loopback needs the token too: {body}");
    for host in ["localhost", "broker.example", "BROKER.example:8443"] {
        let (status, body) = http(LOOPBACK, api, "GET", "/api/v1/clients", host, &bearer).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    let (status, _) = http(LOOPBACK, api, "GET", "/", "evil.example", &bearer).await;
    assert_eq!(status, 421, "the token does not open a foreign Host");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let log = broker.logs().join("\n");
    assert!(!log.contains(secret), "the token was logged:\n{log}");
}

/// Issue 35, third adversarial pass: with two Host headers the first was checked (a proxy in
/// front may route by another), and an absolute-form request's authority was ignored for the
/// Host header (`DELETE http://attacker.example/… ` with `Host: 127.0.0.1` passed). Now more
/// than one Host is 400 Bad Request (RFC 9112 §3.2: "A server MUST respond with a 400 … to
/// any HTTP/1.1 request message that … contains more than one Host header field line"), and
/// the authority of an absolute-form URI is the host checked (RFC 9112 §3.2.2: the server
/// "MUST ignore the received Host header field … and instead use the host information of the
/// request-target"), one with a user name in it refused (RFC 9110 §4.2.4). (On the old code
/// the first DELETE got 200 and deleted the session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_host_headers_and_absolute_form_uris_name_the_host_checked() {
    let (_broker, http_addr, own) = with_a_victim().await;
    let path = VICTIM;

    let foreign = "Host: attacker.example\r\n";
    let (status, body) = http(LOOPBACK, http_addr, "DELETE", path, &own, foreign).await;
    assert_eq!(status, 400, "own Host, then a foreign one: {body}");
    let second_own = format!("Host: {own}\r\n");
    let (status, body) = http(
        LOOPBACK,
        http_addr,
        "DELETE",
        path,
        "attacker.example",
        &second_own,
    )
    .await;
    assert_eq!(status, 400, "a foreign Host, then the own one: {body}");

    let absolute = format!("http://attacker.example{path}");
    let (status, body) = http(LOOPBACK, http_addr, "DELETE", &absolute, &own, "").await;
    assert_eq!(
        status, 421,
        "the request-target names another server: {body}"
    );
    let disguised = format!("http://127.0.0.1@attacker.example{path}");
    let (status, body) = http(LOOPBACK, http_addr, "DELETE", &disguised, &own, "").await;
    assert!(status == 400 || status == 421, "{status}: {body}");

    // The absolute form naming this broker works, whatever the Host header says.
    let absolute_own = format!("http://{own}{path}");
    let (status, body) = http(
        LOOPBACK,
        http_addr,
        "GET",
        &absolute_own,
        "attacker.example",
        "",
    )
    .await;
    assert_eq!(status, 200, "the session is still there: {body}");
    let (status, body) = http(LOOPBACK, http_addr, "GET", path, &own, "").await;
    assert_eq!(status, 200, "one own Host, origin form: {body}");
}
