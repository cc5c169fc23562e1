//! The HTTP listeners' accept loop: bounded connections, each served by hyper's HTTP/1
//! connection with a header read timeout.
//!
//! Why not `axum::serve`: it sets no timer, so hyper applies no header read timeout, and it
//! takes every connection it can accept. `/metrics` is open without credentials by design
//! (`[metrics] bind` is 0.0.0.0 by default), so an idle or half-sent request held its socket
//! for ever, and 1100 of them from one address kept MQTT clients out of a broker limited to
//! 1024 file descriptors (issue 35, fifth pass, finding 3). Here a connection is counted at
//! accept against `metrics.max_connections` (both HTTP listeners together) and
//! `metrics.max_connections_per_ip` (by `connection::slots::source_key`: IPv4 address,
//! IPv6 /64) and closed at once past either (`postbox_http_connections_refused_total`); hyper
//! closes one that takes longer than `metrics.header_timeout` to send a request's headers,
//! which it counts from when it starts waiting for them: after accept and after every
//! response, so an idle keep-alive connection ends by the same bound.
//!
//! Writing is bounded too (issue 35, sixth adversarial pass, finding 5): hyper waits for the
//! peer's window for as long as it takes, so a peer that pipelined requests and never read
//! the answers held its slot for ever, and 8 addresses x 16 took all 128 (the Kubernetes
//! probes on the same port then failed and the pod was restarted). Now a write that makes no
//! progress for `header_timeout` fails and closes the connection ([`WriteDeadline`]), and a
//! connection lives at most [`LIFETIME_TIMEOUTS`] x `header_timeout` (then it finishes its
//! request and closes; forced `header_timeout` later), so a slow reader that trickles too is
//! bounded. And [`PROBE_SLOTS`] connections past `max_connections` are kept for the probes:
//! one per source address that is under its own bound, serving only `/healthz`, `/readyz` and
//! `/health` (anything else 503), one request, closed within `header_timeout`, and within
//! [`PROBE_HEADER_TIMEOUT`] (1 s) when its request has not come by then: with the pool full,
//! a kubelet still gets its answer unless the attacker also races for those few short-lived
//! slots from yet more addresses, reconnecting at once each time (a socket that sends
//! nothing no longer keeps a slot for `header_timeout`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

use super::Ends;
use crate::config::MetricsConfig;
use crate::connection::slots::source_key;
use crate::metrics::Counter;

/// The bounds on the HTTP listeners' connections (`[metrics]`), and the connections open now;
/// one per server, shared by the `[metrics] bind` and `admin.bind` listeners.
#[derive(Debug)]
pub(crate) struct HttpBounds {
    header_timeout: Duration,
    max: usize,
    max_per_source: usize,
    open: Mutex<Open>,
}

/// Connections past `max_connections` kept for the health probes (see the module doc).
pub(crate) const PROBE_SLOTS: usize = 4;

/// A connection lives at most this many `header_timeout`s (100 s by default): then it is
/// asked to finish its request and close.
pub(crate) const LIFETIME_TIMEOUTS: u32 = 10;

/// How long a connection in a probe slot may take to send its request's headers (at most
/// `header_timeout`): a probe sends its request at once, and a socket that sends nothing
/// held the slot for `header_timeout` (10 s), so four addresses past a full pool kept the
/// kubelet's probes out (issue 35, pass 7, note under F5).
pub(crate) const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// The paths a probe slot serves.
const PROBE_PATHS: [&str; 3] = ["/healthz", "/readyz", "/health"];

/// Open connections, in all and by source (entries removed at 0); probe slots apart, with
/// the sources holding one.
#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize, foldhash::fast::RandomState>,
    probe_sources: HashSet<IpAddr, foldhash::fast::RandomState>,
}

/// What a connection was admitted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A slot of `max_connections`: everything is served.
    Full,
    /// One of the [`PROBE_SLOTS`]: the probes only, one request, short.
    Probe,
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
    pub(crate) fn new(config: &MetricsConfig) -> Arc<HttpBounds> {
        Arc::new(HttpBounds {
            header_timeout: Duration::from_secs(u64::from(config.header_timeout)),
            max: config.max_connections,
            max_per_source: config.max_connections_per_ip,
            open: Mutex::new(Open::default()),
        })
    }

    /// Counts a connection from `peer` open, unless a bound is reached: a full slot while
    /// `max_connections` has room, else a probe slot for a source that holds none.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<HttpSlot, Over> {
        let source = source_key(peer);
        let mut open = self.open.lock();
        let from_source = open.by_source.get(&source).copied().unwrap_or(0);
        if self.max_per_source > 0 && from_source >= self.max_per_source {
            return Err(Over::PerSource);
        }
        let kind = if self.max == 0 || open.total < self.max {
            open.total += 1;
            Kind::Full
        } else if open.probe_sources.len() < PROBE_SLOTS && open.probe_sources.insert(source) {
            Kind::Probe
        } else {
            return Err(Over::All);
        };
        *open.by_source.entry(source).or_insert(0) += 1;
        Ok(HttpSlot {
            bounds: Arc::clone(self),
            source,
            kind,
        })
    }
}

/// One open HTTP connection's place in the bounds, given back when dropped.
#[derive(Debug)]
struct HttpSlot {
    bounds: Arc<HttpBounds>,
    source: IpAddr,
    kind: Kind,
}

impl Drop for HttpSlot {
    fn drop(&mut self) {
        let mut open = self.bounds.open.lock();
        match self.kind {
            Kind::Full => open.total -= 1,
            Kind::Probe => {
                open.probe_sources.remove(&self.source);
            }
        }
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
            serve_connection(stream, ends, router, header_timeout, slot.kind, stop).await;
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Serves HTTP/1 on one connection until it closes, its headers time out, a write makes no
/// progress for `header_timeout`, its lifetime ends, or `stop` (then the request in progress
/// finishes and the connection closes). A [`Kind::Probe`] connection serves one probe
/// request and lives `header_timeout` at most.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    ends: Ends,
    router: Router,
    header_timeout: Duration,
    kind: Kind,
    stop: CancellationToken,
) {
    let probe = kind == Kind::Probe;
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // What `ConnectInfo<Ends>` extracts (the access check, the Host rule).
        request.extensions_mut().insert(ConnectInfo(ends));
        let router = router.clone();
        async move {
            if probe && !PROBE_PATHS.contains(&request.uri().path()) {
                return Ok(probe_only());
            }
            // Router is always ready: `call` needs no `poll_ready` first.
            router.clone().call(request).await
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(if probe {
            header_timeout.min(PROBE_HEADER_TIMEOUT)
        } else {
            header_timeout
        })
        .keep_alive(!probe);
    let io = TokioIo::new(WriteDeadline::new(stream, header_timeout));
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let lifetime = if probe {
        Duration::ZERO
    } else {
        header_timeout * LIFETIME_TIMEOUTS
    };
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = stop.cancelled() => finish(connection, header_timeout).await,
        () = tokio::time::sleep(lifetime), if !probe => finish(connection, header_timeout).await,
        () = tokio::time::sleep(header_timeout), if probe => {
            tracing::debug!(peer = %ends.peer, "HTTP probe connection closed: its time is up");
            return;
        }
    };
    if let Err(error) = served {
        tracing::debug!(peer = %ends.peer, %error, timeout = error.is_timeout(), "HTTP connection ended");
    }
}

/// Tells `connection` to finish the request in progress and close, and waits for that at
/// most `limit` (then it is dropped: closed).
async fn finish<C>(mut connection: Pin<&mut C>, limit: Duration) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>> + GracefulShutdown,
{
    connection.as_mut().shutdown();
    // Past the limit: dropped by the caller, which closes the socket.
    tokio::time::timeout(limit, connection)
        .await
        .unwrap_or(Ok(()))
}

/// `graceful_shutdown` of hyper's HTTP/1 connection, named so [`finish`] can take it.
trait GracefulShutdown {
    fn shutdown(self: Pin<&mut Self>);
}

impl<I, S> GracefulShutdown for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shutdown(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// The answer of a probe slot to anything but a probe: the pool is full, come back later.
fn probe_only() -> axum::response::Response {
    let mut response = axum::response::Response::new(axum::body::Body::from(
        "busy: only /healthz and /readyz are served now\n",
    ));
    *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    response
}

/// A stream whose writes fail when they make no progress for `limit` (the peer does not
/// read): hyper would otherwise wait for the peer's window for ever. Any write that moves
/// bytes starts the wait afresh; reads pass through.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed at the first write that could not proceed, cleared by progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `Pending` from the stream: still pending while the deadline is ahead, an error past it
    /// (the deadline's timer wakes the task then).
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer read nothing for the header timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A write's outcome from the stream, with the deadline applied.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.pending(cx),
            ready @ Poll::Ready(_) => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progress(cx, polled)
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
        // All full: a probe slot, one per source.
        let probe = b.admit(ip("10.0.0.9")).expect("a probe slot");
        assert_eq!(probe.kind, Kind::Probe);
        assert_eq!(b.admit(ip("10.0.0.9")).map(drop), Err(Over::All));
        // A source at its own bound gets none.
        assert_eq!(b.admit(ip("10.0.0.1")).map(drop), Err(Over::PerSource));
        let probes: Vec<_> = (0..PROBE_SLOTS - 1)
            .map(|i| b.admit(ip(&format!("10.0.1.{i}"))).expect("probe slots"))
            .collect();
        assert_eq!(b.admit(ip("10.0.2.1")).map(drop), Err(Over::All));
        drop((probe, probes));
        assert!(b.open.lock().probe_sources.is_empty());
        drop(one);
        let again = b.admit(ip("10.0.0.1")).expect("a slot came back");
        assert_eq!(again.kind, Kind::Full);
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
