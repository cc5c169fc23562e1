//! The HTTP listeners' accept loop: bounded connections, each served by hyper's HTTP/1
//! connection with a header read timeout.
//!
//! Why not `axum::serve`: it sets no timer, so hyper applies no header read timeout, and it
//! takes every connection it can accept. `/metrics` is open without credentials by design
//! (`[metrics] bind` is 0.0.0.0 by default), so an idle or half-sent request held its socket
//! for ever, and 1100 of them from one address kept MQTT clients out of a broker limited to
//! 1024 file descriptors (issue 35, fifth pass, finding 3). Here a connection is counted at
//! accept against `metrics.max_connections` (both HTTP listeners together) and
//! `metrics.max_connections_per_ip` (by `transport::admission::source_key`: IPv4 address,
//! IPv6 /64) and closed at once past either (`postbox_http_connections_refused_total`); hyper
//! closes one that takes longer than `metrics.header_timeout` to send a request's headers,
//! which it counts from when it starts waiting for them: after accept and after every
//! response, so an idle keep-alive connection ends by the same bound.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use super::Ends;
use crate::config::MetricsConfig;
use crate::metrics::Counter;
use crate::transport::admission::source_key;

/// The bounds on the HTTP listeners' connections (`[metrics]`), and the connections open now;
/// one per server, shared by the `[metrics] bind` and `admin.bind` listeners.
#[derive(Debug)]
pub struct HttpBounds {
    header_timeout: Duration,
    max: usize,
    max_per_source: usize,
    open: Mutex<Open>,
}

/// Open connections, in all and by source (entries removed at 0).
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize, foldhash::fast::RandomState>,
}

/// Which bound refused a connection: the index of its `reason` in
/// `Metrics::http_connections_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// `metrics.max_connections`.
    All = 0,
    /// `metrics.max_connections_per_ip`.
    PerSource = 1,
}

impl HttpBounds {
    /// The bounds `[metrics]` configures.
    pub fn new(config: &MetricsConfig) -> Arc<HttpBounds> {
        Arc::new(HttpBounds {
            header_timeout: Duration::from_secs(u64::from(config.header_timeout)),
            max: config.max_connections,
            max_per_source: config.max_connections_per_ip,
            open: Mutex::new(Open::default()),
        })
    }

    /// Counts a connection from `peer` open, unless a bound is reached.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<HttpSlot, Over> {
        let source = source_key(peer);
        let mut open = self.open.lock();
        if self.max > 0 && open.total >= self.max {
            return Err(Over::All);
        }
        let from_source = open.by_source.entry(source).or_insert(0);
        if self.max_per_source > 0 && *from_source >= self.max_per_source {
            return Err(Over::PerSource);
        }
        *from_source += 1;
        open.total += 1;
        Ok(HttpSlot {
            bounds: Arc::clone(self),
            source,
        })
    }
}

/// One open HTTP connection's place in the bounds, given back when dropped.
#[derive(Debug)]
struct HttpSlot {
    bounds: Arc<HttpBounds>,
    source: IpAddr,
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        let mut open = self.bounds.open.lock();
        open.total -= 1;
        if let Some(n) = open.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&self.source);
            }
        }
    }
}

/// Accepts on `listener` until `stop`, serving `router` on every connection the bounds let
/// in; then waits for the connections in progress, each told to finish its request and close
/// (the server bounds that wait). `refused` counts closures at accept, by [`Over`].
pub(super) async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    bounds: Arc<HttpBounds>,
    refused: [Counter; 2],
    stop: CancellationToken,
) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Typically EMFILE: back off instead of spinning on it.
                tracing::warn!(%error, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let slot = match bounds.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(over) => {
                refused[over as usize].increment(1);
                tracing::debug!(%peer, ?over, "HTTP connection closed at accept: [metrics] connection bound");
                drop(stream);
                continue;
            }
        };
        // A socket that lost its local address is gone; unspecified matches no Host.
        let local = stream
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let ends = Ends { peer, local };
        let router = router.clone();
        let stop = stop.clone();
        let header_timeout = bounds.header_timeout;
        connections.spawn(async move {
            serve_connection(stream, ends, router, header_timeout, stop).await;
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Serves HTTP/1 on one connection until it closes, its headers time out, or `stop` (then
/// the request in progress finishes and the connection closes).
async fn serve_connection(
    stream: tokio::net::TcpStream,
    ends: Ends,
    router: Router,
    header_timeout: Duration,
    stop: CancellationToken,
) {
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // What `ConnectInfo<Ends>` extracts (the access check, the Host rule).
        request.extensions_mut().insert(ConnectInfo(ends));
        // Router is always ready: `call` needs no `poll_ready` first.
        router.clone().call(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        tracing::debug!(peer = %ends.peer, %error, timeout = error.is_timeout(), "HTTP connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(max: usize, per_source: usize) -> Arc<HttpBounds> {
        HttpBounds::new(&MetricsConfig {
            max_connections: max,
            max_connections_per_ip: per_source,
            ..MetricsConfig::default()
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("literal address")
    }

    #[test]
    fn connections_are_bounded_in_all_and_per_source_and_given_back() {
        let b = bounds(3, 2);
        let one = b.admit(ip("10.0.0.1")).expect("first");
        let _two = b.admit(ip("10.0.0.1")).expect("second");
        assert_eq!(b.admit(ip("10.0.0.1")).map(drop), Err(Over::PerSource));
        // The /64 of an IPv6 host is one source.
        let _v6 = b.admit(ip("2001:db8::1")).expect("another source");
        assert_eq!(b.admit(ip("10.0.0.9")).map(drop), Err(Over::All));
        drop(one);
        let _again = b.admit(ip("10.0.0.1")).expect("a slot came back");
        assert_eq!(b.open.lock().total, 3);
    }

    #[test]
    fn zero_is_unlimited() {
        let b = bounds(0, 0);
        let slots: Vec<_> = (0..1000)
            .map(|_| b.admit(ip("10.0.0.1")).expect("unlimited"))
            .collect();
        drop(slots);
        assert!(b.open.lock().by_source.is_empty());
    }
}
