//! MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6): the HTTP upgrade (`upgrade`) and the
//! byte stream the connection reads and writes ([`WsStream`], over the streaming codec of
//! `frames`).
//!
//! Generic over the underlying stream, so `wss` is [`upgrade_by`] over a TLS stream. The
//! upgrade runs in the connection task (bounded by `mqtt.connect_timeout`, see
//! `Handoff::spawn_prepared`), never in the accept loop.
//!
//! Why our own framing (issue 35, twelfth adversarial pass, U3): tungstenite buffers each
//! frame whole, in a read buffer it reserves to the frame's size, splits the frame off that
//! allocation and never shrinks it, so an idle connection kept the allocation of the largest
//! message it ever sent, counted nowhere: 300 connections that each sent one 2 MiB PUBLISH
//! and went idle grew the broker's RSS by 1.24 GB (debug build, `tokio-tungstenite` 0.26),
//! by 5.4 MB with this layer; 48 of 1 MiB, the suite's test, 99 MB against 1.1 MB
//! (`websocket::idle_connections_keep_nothing_of_the_large_messages_they_sent`). A frame's
//! bytes now go straight to the connection's read buffer, unmasked in place, where
//! `connection::partial` bounds, times and counts a packet that has not arrived whole (with
//! the right class, the CONNECT's bound before the CONNACK), and which the connection lets go
//! once its packets are handled. What this layer keeps per connection: a partial frame
//! header, the latest ping's payload and the control frame being written, a few hundred
//! bytes inline: 1,000 idle connections that each sent a 16 B PUBLISH grew RSS by 3.5 MB,
//! 11.6 MB with tungstenite's buffers (same test, debug build). Libraries do what is not per byte: `httparse` the upgrade request, `sha1`
//! the accept key.
//!
//! Must not: buffer a frame or a message; frame per packet.

mod frames;
mod stream;
mod upgrade;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::WebSocketConfig;
pub(crate) use stream::WsStream;

/// What a `ws` listener accepts, fixed at bind time and shared by its connections.
#[derive(Debug, Clone)]
pub(crate) struct WsSettings {
    path: String,
    allowed_origins: Vec<String>,
}

impl WsSettings {
    /// From the listener's `[listener.websocket]` table. Nothing of `mqtt`'s packet bounds:
    /// this layer holds no frame, the connection applies them to the bytes as they arrive.
    pub(crate) fn new(config: &WebSocketConfig) -> Arc<WsSettings> {
        Arc::new(WsSettings {
            path: config.path.clone(),
            allowed_origins: config.allowed_origins.clone(),
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
    /// Not a WebSocket upgrade at all (bad HTTP, a plain MQTT client, a request above 8 KiB;
    /// HTTP 400, 426 or 431).
    #[error("WebSocket handshake failed: {0}")]
    Handshake(&'static str),
    /// The socket failed or the peer went away during the upgrade.
    #[error("WebSocket handshake failed: {0}")]
    Io(#[source] std::io::Error),
}

impl UpgradeError {
    /// The `reason` label of `postbox_ws_upgrade_failures_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            UpgradeError::Path(_) => "path",
            UpgradeError::Origin(_) => "origin",
            UpgradeError::Subprotocol(_) => "subprotocol",
            UpgradeError::Handshake(_) | UpgradeError::Io(_) => "handshake",
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
pub(crate) async fn accept<S>(
    mut stream: S,
    settings: &WsSettings,
) -> Result<WsStream<S>, UpgradeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let early = upgrade::handshake(&mut stream, settings).await?;
    Ok(WsStream::new(stream, early))
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
