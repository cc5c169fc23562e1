//! TCP listener: plain MQTT, or MQTT inside WebSocket frames (`kind = "ws"`, the upgrade
//! in the connection task, see `Handoff::spawn_prepared`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpSocket;
use tokio_util::sync::CancellationToken;

use super::ws::WsSettings;
use super::{AdmissionLimits, HandshakeSlot};
use super::{ConnectionInfo, Handoff, Listener, ListenerTask};
use crate::config::{ListenerConfig, ListenerKind, WebSocketConfig};

/// A bound plain-TCP MQTT listener.
#[derive(Debug)]
pub(crate) struct PlainTcpListener {
    name: Arc<str>,
    listener: tokio::net::TcpListener,
    local_addr: SocketAddr,
    limits: AdmissionLimits,
    /// `proxy_protocol`: a PROXY header comes first on every connection.
    proxy_protocol: bool,
    /// `kind = "ws"`: the upgrade rules; `None` for plain MQTT.
    websocket: Option<WebSocketConfig>,
}

impl PlainTcpListener {
    /// Binds `config.bind` (with a large backlog and `TCP_DEFER_ACCEPT`, see below).
    ///
    /// # Errors
    ///
    /// The OS error when the address cannot be bound (in use, no permission) or the socket
    /// options cannot be set.
    pub(crate) fn bind(
        name: Arc<str>,
        config: &ListenerConfig,
    ) -> std::io::Result<PlainTcpListener> {
        let listener = bind_listener(config.bind)?;
        let local_addr = listener.local_addr()?;
        Ok(PlainTcpListener {
            name,
            listener,
            local_addr,
            limits: AdmissionLimits::of(config),
            proxy_protocol: config.proxy_protocol,
            websocket: (config.kind == ListenerKind::Ws).then(|| config.websocket.clone()),
        })
    }
}

impl PlainTcpListener {
    /// The bound socket and what the accept loop needs (name, limits, `proxy_protocol`), for
    /// listeners built on this one (TLS).
    pub(super) fn into_parts(self) -> (Arc<str>, tokio::net::TcpListener, AdmissionLimits, bool) {
        (self.name, self.listener, self.limits, self.proxy_protocol)
    }
}

impl Listener for PlainTcpListener {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    fn run(self: Box<Self>, handoff: Handoff, stop: CancellationToken) -> ListenerTask {
        Box::pin(self.accept_loop(handoff, stop))
    }
}

impl PlainTcpListener {
    /// Accepts until `stop`, handing each connection over with its slot in the listener's
    /// [`Admission`]. The bounds are applied by the handshake: the pending ones
    /// (`max_pending_connections`, overall and per source address) when it has to wait for
    /// the client, `max_connections` when it accepts the CONNECT (`connection::handshake`).
    async fn accept_loop(self, handoff: Handoff, stop: CancellationToken) {
        let PlainTcpListener {
            name,
            listener,
            limits,
            proxy_protocol,
            websocket,
            ..
        } = self;
        let websocket = websocket.map(|config| WsSettings::new(&config));
        let each = |stream, info, slot| {
            if proxy_protocol || websocket.is_some() {
                handoff.spawn_prepared(stream, info, slot, proxy_protocol, websocket.clone());
            } else {
                handoff.spawn(stream, info, slot);
            }
        };
        accept_each(&handoff, &listener, &name, limits, &stop, each).await;
    }
}

/// The accept loop of every TCP-based listener (plain and TLS), until `stop`: each accepted
/// socket gets its slot in the listener's [`Admission`](super::Admission) and its
/// [`ConnectionInfo`] (no TLS yet), and goes to `each`, which hands it over.
pub(super) async fn accept_each(
    handoff: &Handoff,
    listener: &tokio::net::TcpListener,
    name: &Arc<str>,
    limits: AdmissionLimits,
    stop: &CancellationToken,
    mut each: impl FnMut(tokio::net::TcpStream, ConnectionInfo, HandshakeSlot),
) {
    let admission = handoff.admission(name, limits);
    while let Some((stream, peer)) = next_accepted(listener, name, stop).await {
        let slot = admission.arrive(peer.ip());
        let info = ConnectionInfo {
            peer,
            listener: Arc::clone(name),
            tls: None,
        };
        each(stream, info, slot);
    }
}

/// The next accepted socket (`TCP_NODELAY` set), or `None` once `stop` is cancelled. Shared by
/// every listener kind's accept loop. An accept error (typically EMFILE) is logged and backed
/// off for 50 ms instead of spinning on it.
pub(super) async fn next_accepted(
    listener: &tokio::net::TcpListener,
    name: &str,
    stop: &CancellationToken,
) -> Option<(tokio::net::TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                // Latency matters more than packet count: the connection batches its writes.
                let _ = stream.set_nodelay(true);
                return Some((stream, peer));
            }
            Err(error) => {
                tracing::warn!(listener = %name, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Pending handshakes the kernel queues for the listener. The default 128 overflowed under
/// connection storms (200 concurrent handshakes), turning them into 1 s SYN retransmits; the
/// kernel caps this at `net.core.somaxconn` anyway.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds a TCP listening socket with [`LISTEN_BACKLOG`] (what `TcpListener::bind` does, but with
/// a larger backlog).
fn bind_listener(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(not(windows))]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(LISTEN_BACKLOG)?;
    defer_accept_until_data(&listener);
    Ok(listener)
}

/// Seconds the kernel holds a new connection back from `accept` until its first bytes (the
/// CONNECT) arrive; after that it is handed over anyway and `mqtt.connect_timeout` applies.
///
/// One second, the shortest the option takes (the kernel rounds it to one SYN-ACK
/// retransmission, after 1 s): a real client sends its CONNECT right after the handshake, so
/// the wake-up it saves is saved just as well; a silent socket reaches the broker's own
/// CONNECT deadline after 1 s instead of 7 or 15 (at 5 s, which made a silent socket's life
/// 17-25 s against the 10 s of a slow CONNECT: two timeouts where users see one).
const DEFER_ACCEPT_SECS: libc::c_int = 1;

/// MQTT clients speak first, so the listener asks the kernel (`TCP_DEFER_ACCEPT`) to wake it
/// only once a connection's CONNECT is readable: one wake-up per handshake instead of two
/// (accept, then data), which is what limited the connect rate. Best effort: on failure the
/// listener just accepts as usual.
#[cfg(target_os = "linux")]
fn defer_accept_until_data(listener: &tokio::net::TcpListener) {
    use std::os::fd::AsRawFd;
    let secs = DEFER_ACCEPT_SECS;
    // SAFETY: `listener` owns a valid socket for the duration of the call; the option value is
    // a properly sized and aligned c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const secs).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_DEFER_ACCEPT not set");
    }
}

#[cfg(not(target_os = "linux"))]
fn defer_accept_until_data(_listener: &tokio::net::TcpListener) {}
