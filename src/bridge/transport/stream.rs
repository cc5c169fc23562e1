//! [`connect`]: from a configured `host:port` to a byte stream to the remote, and
//! [`RemoteStream`], that stream.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsConnector;

use super::{ClientTls, Step, TlsFailure, TransportError};

/// The byte stream to a remote broker: plain TCP or TLS over TCP. An enum rather than a
/// `Box<dyn>` so the bridge's reads and writes are direct calls.
#[derive(Debug)]
pub enum RemoteStream {
    /// Plain TCP (`TCP_NODELAY` set).
    Tcp(TcpStream),
    /// TLS over TCP (`TCP_NODELAY` set); boxed: the TLS state is a few KiB.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl RemoteStream {
    /// The TCP socket underneath (for socket options and readiness: the load generator's
    /// plain-TCP publisher drives it directly).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            RemoteStream::Tcp(tcp) => tcp,
            RemoteStream::Tls(tls) => tls.get_ref().0,
        }
    }

    /// The socket address connected to (which of the resolved addresses answered).
    ///
    /// # Errors
    ///
    /// The OS error when the socket is no longer connected.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// True for a TLS stream.
    pub fn is_tls(&self) -> bool {
        matches!(self, RemoteStream::Tls(_))
    }

    /// The ALPN protocol the remote chose, if any (`None` on plain TCP, or when the remote
    /// does not do ALPN: Mosquitto's listeners, for one, ignore the offer).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            RemoteStream::Tcp(_) => None,
            RemoteStream::Tls(tls) => tls.get_ref().1.alpn_protocol(),
        }
    }

    /// Turns an I/O error of this stream into a [`TransportError`] naming `address`. With
    /// TLS 1.3 the client's side of the handshake is over before the remote has checked the
    /// client certificate, so a refused (or missing) certificate arrives as an alert on the
    /// first read: this makes it a [`TransportError::Tls`] with
    /// [`TlsFailure::AlertReceived`], like a failure during [`connect`].
    pub fn read_error(&self, address: &str, error: io::Error) -> TransportError {
        let peer = self
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        match TlsFailure::of(&error) {
            Some(failure) => TransportError::Tls {
                address: address.to_owned(),
                peer,
                failure,
                source: error,
            },
            None => TransportError::Io {
                address: address.to_owned(),
                peer,
                source: error,
            },
        }
    }
}

impl AsyncRead for RemoteStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RemoteStream::Tcp(tcp) => Pin::new(tcp).poll_read(cx, buf),
            RemoteStream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RemoteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RemoteStream::Tcp(tcp) => Pin::new(tcp).poll_write(cx, buf),
            RemoteStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RemoteStream::Tcp(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            RemoteStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            RemoteStream::Tcp(tcp) => tcp.is_write_vectored(),
            RemoteStream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RemoteStream::Tcp(tcp) => Pin::new(tcp).poll_flush(cx),
            RemoteStream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RemoteStream::Tcp(tcp) => Pin::new(tcp).poll_shutdown(cx),
            RemoteStream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Splits `host:port` (`[v6]:port` for an IPv6 literal) into the host (brackets removed) and
/// the port.
pub(super) fn split_address(address: &str) -> Result<(&str, u16), TransportError> {
    let bad = |problem| TransportError::BadAddress {
        address: address.to_owned(),
        problem,
    };
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| bad("no port (write host:port)"))?;
    let host = match host.strip_prefix('[') {
        Some(inner) => inner
            .strip_suffix(']')
            .ok_or_else(|| bad("an IPv6 address needs brackets: [::1]:1883"))?,
        None if host.contains(':') => {
            return Err(bad("an IPv6 address needs brackets: [::1]:1883"))
        }
        None => host,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("the port is not a number in 1..=65535"))?;
    Ok((host, port))
}

/// Opens the byte stream to the remote at `address` (`host:port`; a DNS name, an IPv4 address
/// or a bracketed IPv6 address): resolves the host (every resolved address tried in order,
/// the time left shared between those still to try, so one silent address does not use up
/// the whole timeout), connects TCP with `TCP_NODELAY` (MQTT packets are small and the
/// bridge batches its own writes), then runs the TLS handshake when `tls` is given. The
/// whole takes at most `timeout`.
///
/// With `insecure` TLS, logs a warning at every connect.
///
/// # Errors
///
/// A [`TransportError`] naming `address` and the step that failed: the address is not
/// `host:port`, the resolution failed, every TCP connect failed (the last error), the
/// handshake failed (with a [`TlsFailure`]), or `timeout` ran out (with the [`Step`]).
pub async fn connect(
    address: &str,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<RemoteStream, TransportError> {
    let deadline = Instant::now() + timeout;
    let (host, port) = split_address(address)?;
    let timed_out = |step| TransportError::Timeout {
        address: address.to_owned(),
        step,
        timeout,
    };
    let server_name = match tls {
        Some(tls) => Some(
            tls.server_name(host)
                .ok_or_else(|| TransportError::BadAddress {
                    address: address.to_owned(),
                    problem: "the host is not usable as a TLS server name (set tls.server_name)",
                })?,
        ),
        None => None,
    };
    let peers: Vec<SocketAddr> = timeout_at(deadline, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| timed_out(Step::Resolve))?
        .map_err(|source| TransportError::Resolve {
            address: address.to_owned(),
            source,
        })?
        .collect();
    let (stream, peer) = connect_tcp(address, &peers, deadline, timeout).await?;
    let (Some(tls), Some(server_name)) = (tls, server_name) else {
        return Ok(RemoteStream::Tcp(stream));
    };
    if tls.is_insecure() {
        tracing::warn!(
            %address, %peer,
            "bridge TLS with `insecure = true`: the remote's certificate is NOT checked \
             (anyone on the path can pose as the remote); for tests only"
        );
    }
    let connector = TlsConnector::from(std::sync::Arc::clone(tls.config()));
    match timeout_at(deadline, connector.connect(server_name, stream)).await {
        Err(_) => Err(timed_out(Step::TlsHandshake)),
        Ok(Ok(stream)) => Ok(RemoteStream::Tls(Box::new(stream))),
        Ok(Err(source)) => Err(TransportError::Tls {
            address: address.to_owned(),
            peer,
            failure: TlsFailure::of(&source).unwrap_or(TlsFailure::Closed),
            source,
        }),
    }
}

/// TCP connect to the first of `peers` that answers by `deadline`; each attempt gets an
/// equal share of the time left.
async fn connect_tcp(
    address: &str,
    peers: &[SocketAddr],
    deadline: Instant,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), TransportError> {
    let mut last: Option<TransportError> = None;
    for (i, &peer) in peers.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = left / u32::try_from(peers.len() - i).unwrap_or(u32::MAX);
        let failed = |source| TransportError::Connect {
            address: address.to_owned(),
            peer,
            tried: i + 1,
            source,
        };
        match tokio::time::timeout(share, TcpStream::connect(peer)).await {
            Ok(Ok(stream)) => {
                stream.set_nodelay(true).map_err(failed)?;
                return Ok((stream, peer));
            }
            Ok(Err(source)) => last = Some(failed(source)),
            Err(_) => {
                last = Some(TransportError::Timeout {
                    address: address.to_owned(),
                    step: Step::TcpConnect,
                    timeout,
                });
            }
        }
    }
    Err(last.unwrap_or_else(|| TransportError::NoAddress {
        address: address.to_owned(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        assert_eq!(split_address("broker:1883").ok(), Some(("broker", 1883)));
        assert_eq!(
            split_address("10.0.0.1:8883").ok(),
            Some(("10.0.0.1", 8883))
        );
        assert_eq!(split_address("[::1]:1883").ok(), Some(("::1", 1883)));
        for bad in [
            "broker",
            "broker:",
            "broker:x",
            "broker:0",
            "::1:1883",
            "[::1:1883",
            ":1",
        ] {
            assert!(
                matches!(split_address(bad), Err(TransportError::BadAddress { .. })),
                "{bad}"
            );
        }
    }

    /// A loopback port nothing listens on (bound, then released).
    async fn closed_port() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        listener.local_addr().expect("addr")
    }

    #[tokio::test]
    async fn every_resolved_address_is_tried_in_order() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open_addr = open.local_addr().expect("addr");
        let (closed_a, closed_b) = (closed_port().await, closed_port().await);
        let deadline = Instant::now() + Duration::from_secs(10);
        let (stream, peer) = connect_tcp("x:1", &[closed_a, open_addr], deadline, Duration::ZERO)
            .await
            .expect("the second address answers");
        assert_eq!(peer, open_addr);
        assert!(stream.nodelay().expect("nodelay"), "TCP_NODELAY is set");
        match connect_tcp("x:1", &[closed_a, closed_b], deadline, Duration::ZERO).await {
            Err(TransportError::Connect {
                peer,
                tried,
                source,
                ..
            }) => {
                assert_eq!((peer, tried), (closed_b, 2), "the last one's error");
                assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused);
            }
            other => panic!("expected a refused connect: {other:?}"),
        }
    }
}
