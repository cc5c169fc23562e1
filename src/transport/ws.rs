//! MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6): the HTTP upgrade and an adapter that
//! turns the WebSocket back into the byte stream the connection reads and writes.
//!
//! Generic over the underlying stream, so `wss` is [`accept`] over a TLS stream. The upgrade
//! runs in the connection task (bounded by `mqtt.connect_timeout`, see
//! `Handoff::spawn_prepared`), never in the accept loop. Built on `tokio-tungstenite`
//! (handshake feature only, no TLS, no client).
//!
//! Must not: frame per packet; buffer more than `mqtt.max_packet_size` + 64 KiB per message.

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

use crate::config::{MqttConfig, WebSocketConfig};
use crate::connection::TransportHeld;

/// Subprotocols a client may ask for: `mqtt` (MQTT 3.1.1 and 5.0 [MQTT-6.0.0-3]) and
/// `mqttv3.1` (MQTT 3.1 clients; Mosquitto accepts it too). The answer is the one asked for.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// How late after a frame's deadline a read may come and still count as the connection
/// having waited for it (rather than not reading at all, see `WsStream::poll_stall`).
const STALL_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Read buffer of the WebSocket layer per connection: small, as the connection's own buffer
/// holds the packets (tungstenite's default of 128 KiB per connection would dwarf the rest).
const READ_BUFFER_SIZE: usize = 4096;

/// What a `ws` listener accepts, fixed at bind time and shared by its connections.
#[derive(Debug, Clone)]
pub(crate) struct WsSettings {
    path: String,
    allowed_origins: Vec<String>,
    max_message_size: usize,
    /// What one frame or message may announce until the broker has answered the CONNECT:
    /// `mqtt.max_connect_size` (and not above `max_message_size`).
    max_connect_message_size: usize,
    /// `mqtt.packet_timeout` and `mqtt.min_packet_rate`: a frame must be complete by the
    /// deadline a packet of its size gets.
    packet_timeout: u32,
    min_packet_rate: u32,
}

impl WsSettings {
    /// From the listener's `[listener.websocket]` table and `mqtt`'s packet bounds: what one
    /// WebSocket frame or message may make the broker buffer (the WebSocket layer holds a
    /// frame whole before the connection sees a byte of it, so the connection's own packet
    /// bounds come too late): `max_connect_size` until the CONNECT is answered, as for a
    /// CONNECT over TCP (issue 35, seventh pass, N6); `max_packet_size` plus room for a few
    /// small packets packed with a full one [MQTT-6.0.0-2] after.
    ///
    /// A frame that has started to arrive must be complete by the deadline a packet of its
    /// size gets (`mqtt.packet_timeout + size / mqtt.min_packet_rate`), as over TCP: the
    /// connection's own deadline sees only complete frames.
    pub(crate) fn new(config: &WebSocketConfig, mqtt: &MqttConfig) -> Arc<WsSettings> {
        let max_message_size = (mqtt.max_packet_size as usize).saturating_add(64 * 1024);
        Arc::new(WsSettings {
            path: config.path.clone(),
            allowed_origins: config.allowed_origins.clone(),
            max_message_size,
            max_connect_message_size: (mqtt.max_connect_size as usize).min(max_message_size),
            packet_timeout: mqtt.packet_timeout,
            min_packet_rate: mqtt.min_packet_rate,
        })
    }
}

/// Why an upgrade was refused; `reason()` is the metric label.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpgradeError {
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
    pub(crate) fn reason(&self) -> &'static str {
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
pub(crate) async fn accept<S>(stream: S, settings: &WsSettings) -> Result<WsStream<S>, UpgradeError>
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
    let metered = Metered::new(stream, settings.max_connect_message_size);
    match tokio_tungstenite::accept_hdr_async_with_config(metered, callback, Some(config)).await {
        Ok(ws) => Ok(WsStream {
            ws,
            chunk: Bytes::new(),
            queued: 0,
            held: TransportHeld::default(),
            connected: false,
            max_message_size: settings.max_message_size,
            stall: None,
            packet_timeout: settings.packet_timeout,
            min_packet_rate: settings.min_packet_rate,
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
pub(crate) struct WsStream<S> {
    ws: WebSocketStream<Metered<S>>,
    /// What is left of the binary message being read.
    chunk: Bytes,
    /// Bytes of the caller's buffer already framed and queued, whose flush is still pending:
    /// the write that queued them returns their count once they are out.
    queued: usize,
    /// What the WebSocket layer holds of messages the connection has not read yet (`chunk`
    /// and the frames still arriving), counted in `postbox_partial_packet_bytes`.
    held: TransportHeld,
    /// The broker has answered the CONNECT (its CONNACK went through [`AsyncWrite`]): frames
    /// may be as large as a packet from then on, and what they hold counts in the memory
    /// budget.
    connected: bool,
    /// The bound on a frame or message once connected.
    max_message_size: usize,
    /// The deadline of the frame arriving (and which frame it is), while one is: the
    /// connection's partial-packet deadline never sees a frame that is not complete.
    stall: Option<(Pin<Box<tokio::time::Sleep>>, u64)>,
    packet_timeout: u32,
    min_packet_rate: u32,
}

impl<S> WsStream<S> {
    /// What the connection sets when it accepts the CONNECT: whether what this layer holds
    /// counts in the anonymous share (`connection::serve`).
    pub(crate) fn held_class(&self) -> Arc<crate::connection::HeldClassCell> {
        self.held.cell()
    }
}

/// The read error of a connection whose held frames would take anonymous clients past their
/// share of the memory budget: the connection closes as for its own partial packet.
fn over_share(error: crate::connection::OverAnonymousShare) -> io::Error {
    io::Error::other(error)
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Brings the count of held bytes up to date.
    ///
    /// # Errors
    ///
    /// When an anonymous client's frames would take anonymous clients past their share
    /// (`connection::partial::TransportHeld::set`).
    fn recount(&mut self) -> io::Result<()> {
        let held = self.chunk.len() + self.ws.get_ref().frames.held();
        self.held.set(held).map_err(over_share)
    }

    /// Polls the deadline of the frame arriving, if one is (armed when it starts); ready with
    /// an error once it has passed.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let Some((seq, len)) = self.ws.get_ref().frames.arriving() else {
            self.stall = None;
            return Poll::Pending;
        };
        if self.stall.as_ref().is_none_or(|(_, armed)| *armed != seq) {
            let limit =
                crate::connection::time_limit(self.packet_timeout, self.min_packet_rate, len);
            self.stall = Some((Box::pin(tokio::time::sleep(limit)), seq));
        }
        let Some((sleep, _)) = &mut self.stall else {
            return Poll::Pending;
        };
        ready!(std::future::Future::poll(sleep.as_mut(), cx));
        // Read long after the deadline: the connection did not read in between (paused by
        // the broker), so neither did this layer and the client could not send; the deadline
        // restarts, as the connection's own does while it does not read.
        let now = tokio::time::Instant::now();
        if now > sleep.deadline() + STALL_GRACE {
            let limit =
                crate::connection::time_limit(self.packet_timeout, self.min_packet_rate, len);
            sleep.as_mut().reset(now + limit);
            ready!(std::future::Future::poll(sleep.as_mut(), cx));
        }
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            "WebSocket frame not complete within mqtt.packet_timeout",
        ))
    }

    /// Looks for the CONNACK in what the broker writes before it answered the CONNECT (only
    /// AUTH packets may come before it): once it is out, the bounds of a connected client
    /// apply.
    fn watch_for_connack(&mut self, buf: &[u8]) {
        if self.connected || !carries_connack(buf) {
            return;
        }
        self.connected = true;
        self.ws.get_mut().frames.limit = self.max_message_size;
        // Past the share already: the next read fails (`recount`), as nothing was counted.
        let _ = self.held.connected();
    }
}

/// Whether the MQTT packets in `buf` (whole packets, as the connection writes them) include
/// a CONNACK.
fn carries_connack(mut buf: &[u8]) -> bool {
    const CONNACK: u8 = 2;
    for _ in 0..64 {
        let Ok(Some(header)) = crate::codec::decode_fixed_header(buf, usize::MAX) else {
            return false;
        };
        if buf[0] >> 4 == CONNACK {
            return true;
        }
        let size = header.header_len + header.remaining_length;
        if size >= buf.len() {
            return false;
        }
        buf = &buf[size..];
    }
    false
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
            let next = Pin::new(&mut this.ws).poll_next(cx);
            // Frames that arrived count while they wait for the rest of their message.
            if let Err(error) = this.recount() {
                return Poll::Ready(Err(error));
            }
            if next.is_pending() {
                if let Poll::Ready(error) = this.poll_stall(cx) {
                    return Poll::Ready(Err(error));
                }
            }
            match ready!(next) {
                Some(Ok(Message::Binary(data))) => {
                    this.chunk = data;
                    if let Err(error) = this.recount() {
                        return Poll::Ready(Err(error));
                    }
                }
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
        // Less is held than before: giving back cannot fail.
        let _ = this.recount();
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
            this.watch_for_connack(buf);
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
pub(crate) async fn upgrade_by<S>(
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

/// The socket under the WebSocket layer, watching the frames as they arrive: the WebSocket
/// layer buffers a frame whole (reserving what its header announces) before it hands any of
/// it on, so this is where a frame's size can be refused before that memory is taken, and
/// where what is buffered can be counted (issue 35, seventh pass, N6: half-sent 1 MiB frames
/// before any CONNECT held ~2 MB each, outside every bound).
#[derive(Debug)]
struct Metered<S> {
    stream: S,
    frames: FrameWatch,
}

impl<S> Metered<S> {
    fn new(stream: S, limit: usize) -> Metered<S> {
        Metered {
            stream,
            frames: FrameWatch {
                limit,
                ..FrameWatch::default()
            },
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        Poll::Ready(this.frames.arrived(&buf.filled()[before..]))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Follows the client's bytes: the HTTP upgrade request, then frame headers and payload
/// lengths (RFC 6455 §5.2), without buffering anything.
#[derive(Debug, Default)]
struct FrameWatch {
    /// Largest frame, and largest message (its data frames together), allowed now.
    limit: usize,
    /// The upgrade request is over (its blank line seen): frames follow.
    upgraded: bool,
    /// How much of `\r\n\r\n` the request's last bytes matched.
    blank_line: usize,
    /// The frame header arriving (at most 14 bytes) and how much of it is in.
    header: [u8; 14],
    header_len: usize,
    /// The frame whose payload is arriving: its length, what is left of it, and whether it
    /// is a data frame and the last of its message.
    frame: Option<Frame>,
    /// Payload of the data frames already in of a message that has not ended.
    message: usize,
    /// Frames started so far: tells one frame's deadline from the next one's.
    started: u64,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    len: usize,
    left: usize,
    data: bool,
    fin: bool,
}

impl FrameWatch {
    /// What the WebSocket layer holds of frames and messages that have not ended: the frame
    /// arriving counts with the size its header announced (reserved when it is seen).
    fn held(&self) -> usize {
        self.message + self.frame.map_or(self.header_len, |f| f.len)
    }

    /// The frame whose payload is arriving, as (its number, its length), if one is.
    fn arriving(&self) -> Option<(u64, usize)> {
        self.frame.map(|f| (self.started, f.len))
    }

    /// Follows `bytes` just read; an error (which closes the connection) for a frame or a
    /// message above the limit.
    fn arrived(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !self.upgraded {
            let Some((&b, rest)) = bytes.split_first() else {
                return Ok(());
            };
            bytes = rest;
            self.blank_line = match (self.blank_line, b) {
                (0 | 2, b'\r') | (1 | 3, b'\n') => self.blank_line + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            self.upgraded = self.blank_line == 4;
        }
        while !bytes.is_empty() {
            match &mut self.frame {
                Some(frame) => {
                    let n = frame.left.min(bytes.len());
                    frame.left -= n;
                    bytes = &bytes[n..];
                    if frame.left == 0 {
                        self.frame_done();
                    }
                }
                None => {
                    self.header[self.header_len] = bytes[0];
                    self.header_len += 1;
                    bytes = &bytes[1..];
                    self.header_done()?;
                }
            }
        }
        Ok(())
    }

    /// Starts the frame once its header is in.
    fn header_done(&mut self) -> io::Result<()> {
        let h = &self.header[..self.header_len];
        if h.len() < 2 {
            return Ok(());
        }
        let extended = match h[1] & 0x7F {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if h[1] & 0x80 != 0 { 4 } else { 0 };
        if h.len() < 2 + extended + mask {
            return Ok(());
        }
        let len = match extended {
            0 => u64::from(h[1] & 0x7F),
            2 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            _ => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&h[2..10]);
                u64::from_be_bytes(b)
            }
        };
        let data = h[0] & 0x08 == 0;
        let fin = h[0] & 0x80 != 0;
        let message = if data { self.message } else { 0 };
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len.saturating_add(message) > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "WebSocket frame of {len} bytes (message {}) above the limit of {} bytes",
                    len.saturating_add(message),
                    self.limit
                ),
            ));
        }
        self.header_len = 0;
        self.started += 1;
        self.frame = Some(Frame {
            len,
            left: len,
            data,
            fin,
        });
        if len == 0 {
            self.frame_done();
        }
        Ok(())
    }

    /// The frame's payload is all in: the WebSocket layer hands on a finished message.
    fn frame_done(&mut self) {
        if let Some(frame) = self.frame.take() {
            if frame.data {
                self.message = if frame.fin {
                    0
                } else {
                    self.message + frame.len
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: u8, len: usize) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        match len {
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
        out.extend_from_slice(&[1, 2, 3, 4]);
        out.extend(std::iter::repeat_n(0u8, len));
        out
    }

    /// The watch follows the request, then frames split anywhere; it counts a frame by the
    /// size its header announces and a fragmented message by its frames so far, and refuses
    /// a frame or a message above the limit as soon as the header is in.
    #[test]
    fn frames_are_followed_counted_and_bounded() {
        let mut w = FrameWatch {
            limit: 100_000,
            ..FrameWatch::default()
        };
        w.arrived(b"GET / HTTP/1.1\r\nHost: x\r\n\r")
            .expect("request");
        assert!(!w.upgraded);
        let mut bytes = b"\n".to_vec();
        bytes.extend(frame(true, 2, 10));
        bytes.extend(frame(false, 2, 70_000));
        bytes.extend(frame(true, 9, 5)); // a ping between fragments
        let split = bytes.len() - 3;
        w.arrived(&bytes[..split]).expect("frames");
        assert_eq!(w.held(), 70_000 + 5, "the fragment and the ping arriving");
        w.arrived(&bytes[split..]).expect("frames");
        assert_eq!(w.held(), 70_000, "the first fragment of the message");
        let last = frame(true, 0, 20_000);
        w.arrived(&last[..3]).expect("header part");
        w.arrived(&last[3..100]).expect("header and some payload");
        assert_eq!(w.held(), 90_000);
        w.arrived(&last[100..]).expect("rest");
        assert_eq!(w.held(), 0, "the message ended");

        let big = frame(true, 2, 100_001);
        assert!(w.arrived(&big[..14]).is_err(), "a frame above the limit");
        let mut w = FrameWatch {
            limit: 100_000,
            upgraded: true,
            ..FrameWatch::default()
        };
        w.arrived(&frame(false, 2, 60_000)).expect("first fragment");
        assert!(
            w.arrived(&frame(true, 0, 50_000)[..14]).is_err(),
            "a message above the limit"
        );
    }

    #[test]
    fn connack_is_found_behind_auth() {
        assert!(carries_connack(&[0x20, 0x02, 0x00, 0x00]));
        assert!(carries_connack(&[0xF0, 0x01, 0x18, 0x20, 0x02, 0x00, 0x00]));
        assert!(!carries_connack(&[0xF0, 0x01, 0x18]));
        assert!(!carries_connack(&[0x30, 0x03, 0x00, 0x01, b'a']));
    }
}
