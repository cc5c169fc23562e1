//! The HTTP listener's bounds (`[metrics]`, issue 35, fifth pass, finding 3), against the
//! binary over real sockets: a connection that sends no request, or only part of its headers,
//! or stays idle after a response, is closed after `metrics.header_timeout`; connections past
//! `metrics.max_connections_per_ip` (one address) or `metrics.max_connections` (all) are
//! closed at once and counted in `postbox_http_connections_refused_total`; `/metrics` keeps
//! answering meanwhile. Before, all of them stayed open for as long as the peer liked.
//!
//! Most of these run on the defaults (10 s, 128, 16), which the README documents.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::async_process::{closed_within, connect_from, BrokerProcess};
use common::WAIT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// `metrics.header_timeout`'s default.
const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// `metrics.max_connections_per_ip`'s default.
const DEFAULT_PER_IP: usize = 16;
/// `metrics.max_connections`'s default.
const DEFAULT_MAX: usize = 128;
/// Connections past `metrics.max_connections` kept for the health probes.
const PROBE_SLOTS: usize = 4;

fn host(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

fn http_addr(broker: &BrokerProcess) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, broker.metrics_port))
}

/// `over`, a connection past a bound, is closed at once (within half the header timeout, so
/// not by it); `what` names it when it stays open.
async fn closed_at_once(mut over: TcpStream, what: &str) {
    let after = closed_within(&mut over, WAIT).await.expect(what);
    assert!(
        after < DEFAULT_HEADER_TIMEOUT / 2,
        "closed at once, not at the timeout: {after:?}"
    );
}

/// Whether `/metrics` answers a GET from 127.0.0.1 now.
async fn scrape_works(broker: &BrokerProcess) -> bool {
    broker.scrape().await.starts_with("HTTP/1.1 200")
}

/// On the defaults: a connection that sends nothing, one that sends half its headers, and a
/// keep-alive connection idle after its response are all closed by the 10 s header timeout
/// (not much sooner, and well before twice that), while `/metrics` answers meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_http_connections_are_closed_by_the_header_timeout() {
    let broker = BrokerProcess::spawn("", "").await;
    let addr = http_addr(&broker);
    let started = Instant::now();
    let mut idle = connect_from(host(3), addr).await;
    let mut half = connect_from(host(3), addr).await;
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("write half the headers");
    let mut kept = connect_from(host(3), addr).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write a request");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 1024];
        while !answer.ends_with(b"ok\n") {
            let n = kept.read(&mut buf).await.expect("read the answer");
            assert!(n > 0, "closed before answering");
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("/healthz answers within WAIT");
    assert!(scrape_works(&broker).await, "/metrics answers meanwhile");

    let limit = DEFAULT_HEADER_TIMEOUT * 2;
    for (what, stream) in [
        ("idle", &mut idle),
        ("half-sent", &mut half),
        ("kept-alive", &mut kept),
    ] {
        let left = limit.saturating_sub(started.elapsed());
        assert!(
            closed_within(stream, left).await.is_some(),
            "the {what} connection is still open after {limit:?}"
        );
        let at = started.elapsed();
        assert!(
            at >= DEFAULT_HEADER_TIMEOUT - Duration::from_secs(1),
            "the {what} connection was closed after {at:?}, before the header timeout"
        );
    }
    assert!(scrape_works(&broker).await);
    broker.kill().await;
}

/// A configured `metrics.header_timeout` of 1 s closes an idle connection after about a
/// second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_timeout_is_configurable() {
    let broker = spawn_with_metrics("header_timeout = 1\n").await;
    let mut idle = connect_from(host(3), http_addr(&broker)).await;
    let after = closed_within(&mut idle, WAIT)
        .await
        .expect("closed within WAIT");
    assert!(after < Duration::from_secs(5), "closed after {after:?}");
    broker.kill().await;
}

/// On the defaults: 16 idle connections from one address are held, the 17th is closed at
/// once and counted, and `/metrics` from another address answers meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connections_past_the_per_address_bound_are_closed_at_once() {
    let broker = BrokerProcess::spawn("", "").await;
    let addr = http_addr(&broker);
    let mut held = Vec::with_capacity(DEFAULT_PER_IP);
    for _ in 0..DEFAULT_PER_IP {
        held.push(connect_from(host(4), addr).await);
    }
    closed_at_once(
        connect_from(host(4), addr).await,
        "the 17th connection is closed",
    )
    .await;
    assert!(
        scrape_works(&broker).await,
        "/metrics answers another address"
    );
    assert_eq!(
        broker
            .metric("postbox_http_connections_refused_total{reason=\"max_connections_per_ip\"}")
            .await,
        Some(1.0)
    );
    // The held ones are still open: a request on one is answered.
    let mut first = held.swap_remove(0);
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let answer = common::http::exchange(&mut first, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(held);
    broker.kill().await;
}

/// On the defaults: 128 idle connections (16 from each of 8 addresses) are held, and the 4
/// probe slots; one more is closed at once and counted; once one closes, `/metrics` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connections_past_the_overall_bound_are_closed_at_once() {
    let broker = BrokerProcess::spawn("", "").await;
    let addr = http_addr(&broker);
    let hosts = DEFAULT_MAX / DEFAULT_PER_IP;
    let mut held = Vec::with_capacity(DEFAULT_MAX);
    for i in 0..DEFAULT_MAX {
        let n = u8::try_from(10 + i % hosts).expect("small");
        held.push(connect_from(host(n), addr).await);
    }
    // The probe slots past the bound (one per address, see
    // `probes_answer_while_the_pool_is_full`) are taken by idle connections too…
    let mut probes = Vec::with_capacity(PROBE_SLOTS);
    for i in 0..PROBE_SLOTS {
        let n = u8::try_from(30 + i).expect("small");
        probes.push(connect_from(host(n), addr).await);
    }
    // … so the next one is closed at once.
    closed_at_once(
        connect_from(host(40), addr).await,
        "the connection past the bound and the probe slots is closed",
    )
    .await;
    // One held connection closes: its slot comes back when the broker sees the end. A poll
    // (another process), bounded by WAIT.
    drop(held.pop());
    let deadline = Instant::now() + WAIT;
    let mut answered = None;
    while answered.is_none() && Instant::now() < deadline {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .ok();
        let mut body = String::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_string(&mut body)).await;
        if body.starts_with("HTTP/1.1 200") {
            answered = Some(body);
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let body = answered.expect("/metrics answers once a slot is free");
    assert!(
        body.lines().any(|l| {
            l.strip_prefix("postbox_http_connections_refused_total{reason=\"max_connections\"} ")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|v| v >= 1.0)
        }),
        "the closed one is counted (and the scrapes refused while the bound held)"
    );
    drop(held);
    broker.kill().await;
}

/// A connection from `source` with a 1 KiB receive buffer that pipelines `requests` GETs of
/// `path` and never reads the answers (the writing runs in its own task: it may block once
/// the broker stops reading). The stream is kept open by the returned task's handle.
async fn never_reading(
    source: Ipv4Addr,
    addr: SocketAddr,
    path: &str,
    requests: usize,
) -> tokio::task::JoinHandle<TcpStream> {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .set_recv_buffer_size(1024)
        .expect("small receive buffer");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind source address");
    let mut stream = tokio::time::timeout(WAIT, socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").repeat(requests);
    tokio::spawn(async move {
        // Bounded: once the broker closes the connection the write fails.
        let _ = tokio::time::timeout(WAIT * 3, stream.write_all(request.as_bytes())).await;
        stream
    })
}

/// One GET of `path` from `source` with `Connection: close`: the status, or `None` when the
/// connection was closed without an answer.
async fn get_from(source: Ipv4Addr, addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = connect_from(source, addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

/// A broker whose `[metrics]` section has `keys` (and storage not persisted).
async fn spawn_with_metrics(keys: &str) -> BrokerProcess {
    let sections = format!("{keys}[storage]\npersistence = false\n");
    BrokerProcess::spawn_sections(&[""], &sections).await
}

/// A broker with `max_connections = 4` and `max_connections_per_ip = 2`, its pool full of
/// peers that never read (two from each of two addresses): the broker, its HTTP address and
/// the peers' tasks. Full once a fifth connection, from a third address, is not served in
/// full (polled, bounded by `WAIT`).
async fn full_pool() -> (
    BrokerProcess,
    SocketAddr,
    Vec<tokio::task::JoinHandle<TcpStream>>,
) {
    let broker = spawn_with_metrics("max_connections = 4\nmax_connections_per_ip = 2\n").await;
    let addr = http_addr(&broker);
    let mut held = Vec::new();
    for n in [10, 10, 11, 11] {
        held.push(never_reading(host(n), addr, "/metrics", 500).await);
    }
    let deadline = Instant::now() + WAIT;
    while get_from(host(12), addr, "/metrics").await == Some(200) {
        assert!(Instant::now() < deadline, "the pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (broker, addr, held)
}

/// A peer that pipelines requests and never reads the answers loses its slot within bounded
/// time (issue 35, sixth adversarial pass, finding 5: hyper waited for its window for ever, so
/// 8 addresses x 16 of them held every slot and the Kubernetes probes failed). With
/// `max_connections_per_ip = 1` and `header_timeout = 1`, the address's one slot comes back:
/// a later request from it is answered. Before, every later connection from the address was
/// closed at accept for as long as the non-reader stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_its_answers_loses_its_slot() {
    let broker = spawn_with_metrics("header_timeout = 1\nmax_connections_per_ip = 1\n").await;
    let addr = http_addr(&broker);
    let source = host(5);
    // /metrics answers are tens of KB: 500 of them are far more than the socket buffers hold.
    let held = never_reading(source, addr, "/metrics", 500).await;
    // The slot is taken (accepted in order, before the next connection from the address).
    assert_eq!(
        get_from(source, addr, "/healthz").await,
        None,
        "the non-reader holds the address's slot"
    );
    // Until the broker gives up on it. A poll (another connection from the address), bounded
    // in count and time.
    let mut answered = None;
    for _ in 0..200 {
        answered = get_from(source, addr, "/healthz").await;
        if answered.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        answered,
        Some(200),
        "the non-reader's slot never came back: a later request from the address is still refused"
    );
    assert!(
        broker
            .metric("postbox_http_connections_refused_total{reason=\"max_connections_per_ip\"}")
            .await
            .is_some_and(|v| v >= 1.0),
        "the refusals while it held the slot are counted"
    );
    held.abort();
    broker.kill().await;
}

/// With every slot of `max_connections` held (here by peers that never read), `/healthz` and
/// `/readyz` still answer from another address (the probe slots: Kubernetes probes the same
/// port), anything else there is answered 503, and one address holds one probe slot at most.
/// Before, the probes were closed at accept and the kubelet restarted the pod (issue 35, sixth
/// adversarial pass, finding 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_the_pool_is_full() {
    let (broker, addr, held) = full_pool().await;
    // Each from its own address: a probe slot comes back when the broker has closed it,
    // which may be a moment after the client read the end.
    assert_eq!(get_from(host(13), addr, "/healthz").await, Some(200));
    assert_eq!(get_from(host(14), addr, "/readyz").await, Some(200));
    assert_eq!(get_from(host(15), addr, "/metrics").await, Some(503));
    // One probe slot per address: a second connection from one address while its first is
    // open is closed at once.
    let _probe = connect_from(host(16), addr).await;
    let mut second = connect_from(host(16), addr).await;
    assert!(
        closed_within(&mut second, DEFAULT_HEADER_TIMEOUT / 2)
            .await
            .is_some(),
        "a second probe slot for one address"
    );
    for h in held {
        h.abort();
    }
    broker.kill().await;
}

/// Pass 7, note under F5: a probe slot was held `header_timeout` (10 s) by a socket that sent
/// nothing, so with the pool full four addresses holding silent sockets kept `/healthz` out
/// (33 of 33 failed). Now a probe slot's request must come within 1 s: with the pool full and
/// every probe slot taken by a silent socket, `/healthz` from another address is answered
/// well before the header timeout would have freed a slot, and the silent sockets are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_does_not_keep_a_probe_slot() {
    let (broker, addr, held) = full_pool().await;
    // Every probe slot: a silent socket each, from four addresses.
    let mut silent = Vec::new();
    for n in 20..20 + PROBE_SLOTS {
        silent.push(connect_from(host(u8::try_from(n).expect("host")), addr).await);
    }
    let started = Instant::now();
    let limit = DEFAULT_HEADER_TIMEOUT / 2;
    let mut tries = 0;
    loop {
        tries += 1;
        if get_from(host(30), addr, "/healthz").await == Some(200) {
            break;
        }
        assert!(
            started.elapsed() < limit,
            "/healthz not answered in {limit:?} ({tries} tries) while silent sockets held the probe slots"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for mut s in silent {
        assert!(
            closed_within(&mut s, limit).await.is_some(),
            "a silent socket kept its probe slot"
        );
    }
    for h in held {
        h.abort();
    }
    broker.kill().await;
}
