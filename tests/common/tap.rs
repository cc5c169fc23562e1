//! A TCP relay on a loopback port in front of a real server (a node's NATS), whose
//! client-to-server direction can be swallowed from a chosen moment on: what the client
//! writes after that never arrives, as if it had crashed right before writing it, while
//! what the server sends still reaches it. Connections made after the swallowing began are
//! relayed whole (a restarted client reconnects normally), and the connections made so far
//! can be cut. For the window a crash or a dropped connection can hit but a test cannot
//! time: after a node's commit, before its JetStream acknowledgement.
// Compiled into each test crate as a private `mod common`: `pub` is the harness API, and not
// every test crate uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::WAIT;

/// Swallowed bytes kept to look in (the rest is counted only).
const KEPT: usize = 1 << 20;

/// The relay; it stops (with its connections) when dropped.
pub struct Tap {
    /// Its loopback port: give the client this one instead of the server's.
    pub port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

struct Shared {
    /// Connections numbered below this have their client-to-server bytes swallowed.
    swallow_below: AtomicU64,
    /// The next connection's number.
    next: AtomicU64,
    /// What was swallowed (the first `KEPT` bytes), and a wake-up per addition.
    swallowed: parking_lot::Mutex<Vec<u8>>,
    more: tokio::sync::Notify,
    /// Connections numbered below this are closed.
    cut_below: tokio::sync::watch::Sender<u64>,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Tap {
    /// A relay to `127.0.0.1:upstream` on a free loopback port.
    pub async fn start(upstream: u16) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
        let port = listener.local_addr().expect("tap address").port();
        let shared = Arc::new(Shared {
            swallow_below: AtomicU64::new(0),
            next: AtomicU64::new(0),
            swallowed: parking_lot::Mutex::new(Vec::new()),
            more: tokio::sync::Notify::new(),
            cut_below: tokio::sync::watch::Sender::new(0),
        });
        let accept = tokio::spawn(accept(listener, upstream, Arc::clone(&shared)));
        Tap {
            port,
            shared,
            accept,
        }
    }

    /// From now on, what the clients connected so far write is swallowed.
    pub fn swallow_upstream(&self) {
        let next = self.shared.next.load(Ordering::Acquire);
        self.shared.swallow_below.store(next, Ordering::Release);
    }

    /// Closes the connections made so far, both ways: their clients see them drop.
    pub fn cut(&self) {
        let next = self.shared.next.load(Ordering::Acquire);
        self.shared.cut_below.send_replace(next);
    }

    /// Waits (bounded by `WAIT`) until the swallowed bytes contain `needle`.
    pub async fn wait_swallowed(&self, needle: &[u8]) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let more = self.shared.more.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            if self
                .shared
                .swallowed
                .lock()
                .windows(needle.len())
                .any(|w| w == needle)
            {
                return;
            }
            assert!(
                tokio::time::timeout_at(deadline, more).await.is_ok(),
                "the tap never swallowed {:?}",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

async fn accept(listener: TcpListener, upstream: u16, shared: Arc<Shared>) {
    let mut relays = tokio::task::JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        let number = shared.next.fetch_add(1, Ordering::AcqRel);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            continue;
        };
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        relays.spawn(downstream(
            server_read,
            client_write,
            number,
            Arc::clone(&shared),
        ));
        relays.spawn(upstream_of(
            client_read,
            server_write,
            number,
            Arc::clone(&shared),
        ));
    }
}

/// Server to client, always relayed (until cut).
async fn downstream(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    number: u64,
    shared: Arc<Shared>,
) {
    let mut cut = shared.cut_below.subscribe();
    tokio::select! {
        _ = tokio::io::copy(&mut from, &mut to) => {}
        _ = cut.wait_for(|below| number < *below) => {}
    }
}

/// Client to server, relayed until the connection's swallowing begins (or it is cut).
async fn upstream_of(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    number: u64,
    shared: Arc<Shared>,
) {
    let mut cut = shared.cut_below.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut.wait_for(|below| number < *below) => return,
        };
        if number < shared.swallow_below.load(Ordering::Acquire) {
            let mut swallowed = shared.swallowed.lock();
            let room = KEPT.saturating_sub(swallowed.len()).min(n);
            swallowed.extend_from_slice(&buf[..room]);
            drop(swallowed);
            shared.more.notify_waiters();
        } else if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
