//! MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6): the HTTP upgrade and an adapter that
//! turns the WebSocket back into the byte stream the connection reads and writes.
//!
//! Generic over the underlying stream, so `wss` is [`accept`] over a TLS stream. The upgrade
//! runs in the connection task (bounded by `mqtt.connect_timeout`, see
//! `Handoff::spawn_prepared`), never in the accept loop. Built on `tokio-tungstenite`
//! (handshake feature only, no TLS, no client).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use futures_core::Stream;
use futures_sink::Sink;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig as ProtocolConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::config::WebSocketConfig;

/// Subprotocols a client may ask for: `mqtt` (MQTT 3.1.1 and 5.0 [MQTT-6.0.0-3]) and
/// `mqttv3.1` (MQTT 3.1 clients; Mosquitto accepts it too). The answer is the one asked for.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Read buffer of the WebSocket layer per connection: small, as the connection's own buffer
/// holds the packets (tungstenite's default of 128 KiB per connection would dwarf the rest).
const READ_BUFFER_SIZE: usize = 4096;

/// What a `ws` listener accepts, fixed at bind time and shared by its connections.
#[derive(Debug, Clone)]
pub struct WsSettings {
    path: String,
    allowed_origins: Vec<String>,
    max_message_size: usize,
}

impl WsSettings {
    /// From the listener's `[listener.websocket]` table; `max_packet_size` (`mqtt.max_packet_size`)
    /// bounds what one WebSocket message may buffer (the connection enforces the packet bound
    /// itself; this only stops a huge frame from being buffered whole first).
    pub fn new(config: &WebSocketConfig, max_packet_size: u32) -> Arc<WsSettings> {
        Arc::new(WsSettings {
            path: config.path.clone(),
            allowed_origins: config.allowed_origins.clone(),
            // Room for a full packet plus its fixed header, and for a few small packets
            // packed with it in one frame [MQTT-6.0.0-2].
            max_message_size: (max_packet_size as usize).saturating_add(64 * 1024),
        })
    }
}

/// Why an upgrade was refused; `reason()` is the metric label.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The request named another path (HTTP 404).
    #[error("WebSocket upgrade for path {0:?}, not the listener's path")]
    Path(String),
    /// A browser `Origin` that is not in `allowed_origins` (HTTP 403).
    #[error("WebSocket upgrade from Origin {0:?}, not in allowed_origins")]
    Origin(String),
    /// No `mqtt` / `mqttv3.1` in `Sec-WebSocket-Protocol` (HTTP 400) [MQTT-6.0.0-3].
    #[error("WebSocket upgrade without the mqtt subprotocol (asked for {0:?})")]
    Subprotocol(String),
    /// Not a WebSocket upgrade at all (bad HTTP, a plain MQTT client, the peer went away).
    #[error("WebSocket handshake failed: {0}")]
    Handshake(#[source] Box<WsError>),
}

impl UpgradeError {
    /// The `reason` label of `postbox_ws_upgrade_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            UpgradeError::Path(_) => "path",
            UpgradeError::Origin(_) => "origin",
            UpgradeError::Subprotocol(_) => "subprotocol",
            UpgradeError::Handshake(_) => "handshake",
        }
    }
}

/// Runs the server side of the HTTP upgrade on `stream` and returns the byte stream MQTT
/// runs over. The caller bounds it in time.
///
/// # Errors
///
/// [`UpgradeError`] when the request is refused (an HTTP error answer has been sent) or is
/// not a WebSocket upgrade.
// The callback's error type is tungstenite's HTTP response.
#[allow(clippy::result_large_err)]
pub async fn accept<S>(stream: S, settings: &WsSettings) -> Result<WsStream<S>, UpgradeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut refused: Option<UpgradeError> = None;
    let callback = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        check_request(settings, request, response).map_err(|(error, status)| {
            refused = Some(error);
            let mut answer = ErrorResponse::new(None);
            *answer.status_mut() = status;
            answer
        })
    };
    let config = ProtocolConfig::default()
        .read_buffer_size(READ_BUFFER_SIZE)
        .write_buffer_size(0)
        .max_message_size(Some(settings.max_message_size))
        .max_frame_size(Some(settings.max_message_size));
    match tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await {
        Ok(ws) => Ok(WsStream {
            ws,
            chunk: Bytes::new(),
            queued: 0,
        }),
        Err(error) => Err(refused
            .take()
            .unwrap_or_else(|| UpgradeError::Handshake(Box::new(error)))),
    }
}

/// Path, Origin and subprotocol of an upgrade request; the response names the subprotocol.
fn check_request(
    settings: &WsSettings,
    request: &Request,
    mut response: Response,
) -> Result<Response, (UpgradeError, StatusCode)> {
    let path = request.uri().path();
    if path != settings.path {
        return Err((UpgradeError::Path(path.to_owned()), StatusCode::NOT_FOUND));
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        if !settings.allowed_origins.is_empty()
            && !settings.allowed_origins.iter().any(|o| *o == origin)
        {
            return Err((
                UpgradeError::Origin(origin.into_owned()),
                StatusCode::FORBIDDEN,
            ));
        }
    }
    let asked: Vec<&str> = request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    // The first of ours in our order of preference: `mqtt` when offered [MQTT-6.0.0-4].
    let Some(chosen) = SUBPROTOCOLS.iter().find(|p| asked.contains(p)) else {
        return Err((
            UpgradeError::Subprotocol(asked.join(",")),
            StatusCode::BAD_REQUEST,
        ));
    };
    response.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(chosen),
    );
    Ok(response)
}

/// A WebSocket seen as the byte stream MQTT expects: reads yield the payloads of binary
/// messages in order (packets may span messages, or several share one [MQTT-6.0.0-2]); one
/// write call becomes one binary message (the connection batches its packets into one write).
/// A text message is an error that closes the connection [MQTT-6.0.0-1]; pings are answered
/// by the WebSocket layer; a close message reads as the end of the stream.
#[derive(Debug)]
pub struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// What is left of the binary message being read.
    chunk: Bytes,
    /// Bytes of the caller's buffer already framed and queued, whose flush is still pending:
    /// the write that queued them returns their count once they are out.
    queued: usize,
}

fn to_io(error: WsError) -> io::Error {
    match error {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, "WebSocket closed")
        }
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.chunk.is_empty() {
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.chunk = data,
                Some(Ok(Message::Text(_))) => {
                    // [MQTT-6.0.0-1]: only binary data frames carry MQTT.
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "WebSocket text frame (MQTT needs binary frames)",
                    )));
                }
                // Answered (pong) or ignored by the WebSocket layer.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(
                    Ok(Message::Close(_)) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed),
                )
                | None => {
                    return Poll::Ready(Ok(()));
                }
                Some(Err(error)) => return Poll::Ready(Err(to_io(error))),
            }
        }
        let n = this.chunk.len().min(buf.remaining());
        buf.put_slice(&this.chunk[..n]);
        this.chunk.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    /// Frames all of `buf` as one binary message and writes it out. Pending while the socket
    /// takes it; the caller polls again with the same bytes first (as `write_all` and the
    /// connection's batch do), which are then not framed twice.
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.queued == 0 {
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(to_io)?;
            Pin::new(&mut this.ws)
                .start_send(Message::Binary(Bytes::copy_from_slice(buf)))
                .map_err(to_io)?;
            this.queued = buf.len();
        }
        ready!(Pin::new(&mut this.ws).poll_flush(cx)).map_err(to_io)?;
        Poll::Ready(Ok(std::mem::take(&mut this.queued)))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(to_io)
    }

    /// Sends a close frame (after what is queued) and shuts the socket's sending side.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(to_io(error))),
        }
    }
}

/// Runs the upgrade on `stream` by `deadline`; a refused, failed or late one is logged and
/// counted (`postbox_ws_upgrade_failures_total{listener,reason}`) and gives `None`. Shared by
/// `ws` (over TCP) and `wss` (over the TLS stream) listeners.
pub async fn upgrade_by<S>(
    deadline: tokio::time::Instant,
    stream: S,
    settings: &WsSettings,
    info: &super::ConnectionInfo,
    failures: &crate::metrics::FailureCounts,
) -> Option<WsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let failed = |reason: &'static str| {
        failures.failed(&info.listener, reason);
    };
    match tokio::time::timeout_at(deadline, accept(stream, settings)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            failed(error.reason());
            tracing::info!(peer = %info.peer, listener = %info.listener, %error, "closing connection: WebSocket upgrade");
            None
        }
        Err(_) => {
            failed("timeout");
            tracing::info!(peer = %info.peer, listener = %info.listener, "closing connection: no WebSocket upgrade within mqtt.connect_timeout");
            None
        }
    }
}
