//! Listeners: accept sockets and hand each to a connection task. Knows nothing of MQTT.
//!
//! Every kind of listener (TCP, TLS, WebSocket, WebSocket over TLS) implements [`Listener`],
//! and [`bind`] picks the kind for a `[[listener]]` entry. The server only binds, runs and
//! stops listeners through that trait, so a new kind is added here (and in the config), not in
//! the server. What a listener learns about a connection travels with it as
//! [`ConnectionInfo`].

pub mod fd_table;
pub(crate) mod proxy;
mod tcp;
mod tls;
pub(crate) mod ws;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::config::{ListenerConfig, ListenerKind};
use crate::connection;

/// The slots a listener admits connections into live with the connection that holds them.
pub(crate) use crate::connection::slots::{
    Admission, AdmissionLimits, HandshakeSlot, Refused, ServerSlots,
};
/// What a listener learns of a connection is the connection's ([`crate::connection::info`]).
pub(crate) use crate::connection::{ConnectionInfo, TlsPeer};
pub(crate) use tcp::PlainTcpListener;
/// PEM certificate files, read the same way for the bridges' TLS (`bridge::transport`).
pub(crate) use tls::read_certs;
pub(crate) use tls::TlsListener;

/// Everything a listener needs to hand an accepted stream to the broker: one per server,
/// cloned into every listener.
#[derive(Clone, Debug)]
pub(crate) struct Handoff {
    broker: Arc<Broker>,
    shutdown: CancellationToken,
    connections: TaskTracker,
    /// Connected clients of every listener (`mqtt.max_connections`).
    server_slots: Arc<ServerSlots>,
}

impl Handoff {
    /// `shutdown` is the token connections watch during their handshake; `connections` tracks
    /// every connection task so the server can wait for them at shutdown.
    pub(crate) fn new(
        broker: Arc<Broker>,
        shutdown: CancellationToken,
        connections: TaskTracker,
    ) -> Self {
        let server_slots = ServerSlots::new(broker.config().max_connections);
        Handoff {
            broker,
            shutdown,
            connections,
            server_slots,
        }
    }

    /// The bound of every listener together (`mqtt.max_connections`), which a reload sets.
    pub(crate) fn server_slots(&self) -> &Arc<ServerSlots> {
        &self.server_slots
    }

    /// The slot counts of a listener with `limits`, within the broker-wide bound every
    /// listener shares.
    pub(crate) fn admission(&self, name: &str, limits: AdmissionLimits) -> Arc<Admission> {
        Admission::new(name, limits, &self.server_slots, &self.broker.metrics)
    }

    /// Spawns the connection task for `stream`, which holds `slot` (its place in the
    /// listener's [`Admission`]) until its CONNECT is accepted, and a connected slot then.
    pub(crate) fn spawn<S>(&self, stream: S, info: ConnectionInfo, slot: HandshakeSlot)
    where
        S: connection::Socket + Send + 'static,
    {
        let broker = Arc::clone(&self.broker);
        let shutdown = self.shutdown.clone();
        self.connections
            .spawn(connection::serve(stream, info, broker, shutdown, slot));
    }

    /// Like [`Handoff::spawn`], for a listener whose connections are upgraded before MQTT (a
    /// TLS handshake, and for `wss` the WebSocket upgrade on top): the connection task first
    /// reads the PROXY header from `stream` when `proxy_protocol` is set (before the TLS
    /// handshake, as a balancer sends it; see [`Handoff::spawn_prepared`] for what is done
    /// with it), then runs `upgrade` on the stream with the connection's `info` and its
    /// connect deadline, and serves the stream it yields; `None` closes the socket. All of it
    /// within `mqtt.connect_timeout` of accept; shutdown abandons a pending upgrade.
    pub(crate) fn spawn_upgraded<R, F, Fut, S>(
        &self,
        mut stream: R,
        mut info: ConnectionInfo,
        mut slot: HandshakeSlot,
        proxy_protocol: bool,
        upgrade: F,
    ) where
        R: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnOnce(R, ConnectionInfo, tokio::time::Instant) -> Fut + Send + 'static,
        Fut: Future<Output = Option<(S, ConnectionInfo)>> + Send + 'static,
        S: connection::Socket + Send + 'static,
    {
        let broker = Arc::clone(&self.broker);
        let shutdown = self.shutdown.clone();
        let deadline = connect_deadline(&broker, &slot);
        self.connections.spawn(async move {
            let upgrading = async {
                if proxy_protocol
                    && !read_proxy_header(&mut stream, &mut info, &mut slot, deadline, &broker)
                        .await
                {
                    return None;
                }
                let peer = (info.peer, Arc::clone(&info.listener));
                match paced_by_client(&mut slot, upgrade(stream, info, deadline)).await {
                    Ok(upgraded) => upgraded,
                    Err(refused) => {
                        no_pending_slot(&peer.0, &peer.1, refused);
                        None
                    }
                }
            };
            let upgraded = tokio::select! {
                upgraded = upgrading => upgraded,
                () = shutdown.cancelled() => None,
            };
            if let Some((stream, info)) = upgraded {
                connection::serve(stream, info, broker, shutdown, slot).await;
            }
        });
    }

    /// Like [`Handoff::spawn`], for a plain TCP listener with work before MQTT: with
    /// `proxy_protocol` the task first reads the PROXY header (the client it names replaces
    /// the balancer in `info` and in the slot's per-address count; none in time: closed and
    /// counted in `postbox_connections_refused_total{reason="proxy_header"}`), with
    /// `websocket` it then runs the WebSocket upgrade (refusals counted in
    /// `postbox_ws_upgrade_failures_total{listener,reason}`), all within `mqtt.connect_timeout`
    /// of accept; then it serves MQTT over what is left.
    pub(crate) fn spawn_prepared<S>(
        &self,
        mut stream: S,
        mut info: ConnectionInfo,
        mut slot: HandshakeSlot,
        proxy_protocol: bool,
        websocket: Option<Arc<ws::WsSettings>>,
    ) where
        S: connection::Socket + Send + 'static,
    {
        let broker = Arc::clone(&self.broker);
        let shutdown = self.shutdown.clone();
        let deadline = connect_deadline(&broker, &slot);
        self.connections.spawn(async move {
            if proxy_protocol
                && !read_proxy_header(&mut stream, &mut info, &mut slot, deadline, &broker).await
            {
                return;
            }
            match websocket {
                Some(settings) => {
                    let failures = broker.metrics.ws_upgrade_failures();
                    let upgrade = ws::upgrade_by(deadline, stream, &settings, &info, &failures);
                    let ws = match paced_by_client(&mut slot, upgrade).await {
                        Ok(Some(ws)) => ws,
                        Ok(None) => return,
                        Err(refused) => {
                            no_pending_slot(&info.peer, &info.listener, refused);
                            return;
                        }
                    };
                    connection::serve(ws, info, broker, shutdown, slot).await;
                }
                None => connection::serve(stream, info, broker, shutdown, slot).await,
            }
        });
    }

    /// The broker connections are handed to (its metrics, for the listener's counts).
    pub(crate) fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }
}

/// The future a listener runs as, until it is told to stop.
pub(crate) type ListenerTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A bound listener of some kind, ready to accept.
pub(crate) trait Listener: Send {
    /// Its name (unique within the server).
    fn name(&self) -> &Arc<str>;

    /// Where it actually listens (port 0 resolved).
    fn local_addr(&self) -> SocketAddr;

    /// Accepts connections and hands them over until `stop` is cancelled; then it returns and
    /// closes its socket. Connections already handed over are not its business any more: the
    /// server stops those.
    fn run(self: Box<Self>, handoff: Handoff, stop: CancellationToken) -> ListenerTask;

    /// What SIGHUP should re-read for this listener (a TLS listener's certificates).
    fn reloader(&self) -> Option<Arc<dyn crate::reload::Reload>> {
        None
    }
}

/// Binds the listener `config` describes, named `name`. Binding is synchronous so a start-up
/// that cannot bind fails before anything is served.
///
/// # Errors
///
/// The OS error when the address cannot be bound (in use, no permission) or the socket
/// options cannot be set.
pub(crate) fn bind(name: Arc<str>, config: &ListenerConfig) -> std::io::Result<Box<dyn Listener>> {
    Ok(match config.kind {
        ListenerKind::Tls | ListenerKind::Wss => Box::new(TlsListener::bind(name, config)?),
        // `ws` is plain TCP with the upgrade in the connection task.
        ListenerKind::Tcp | ListenerKind::Ws => Box::new(PlainTcpListener::bind(name, config)?),
    })
}

/// When a connection accepted into `slot` must have finished everything before MQTT (PROXY
/// header, TLS, WebSocket upgrade) and its CONNECT: `mqtt.connect_timeout` after accept.
pub(crate) fn connect_deadline(broker: &Broker, slot: &HandshakeSlot) -> tokio::time::Instant {
    let timeout = std::time::Duration::from_secs(u64::from(broker.config().connect_timeout));
    slot.accepted_at() + timeout
}

/// Runs `step`, a step before MQTT that waits for the client (the PROXY header, the TLS
/// handshake, the WebSocket upgrade), taking the connection's pending slot the first time the
/// step has to wait, as the MQTT handshake does for its reads (`connection::handshake`): a
/// step whose bytes are all there (what `TCP_DEFER_ACCEPT` handed over) never takes one. The
/// slot, once taken, is the one the MQTT handshake goes on holding (never a second).
///
/// Why: without it a socket that stops in its TLS handshake, its upgrade or its PROXY header
/// held a file descriptor and memory until `mqtt.connect_timeout` uncounted and unbounded
/// (issue 35, fifth pass, finding 2: 8000 half-finished TLS handshakes from one address).
///
/// # Errors
///
/// [`Refused`] when no pending slot is free (counted in `postbox_connections_refused_total`);
/// `step` is dropped, and the caller closes the connection at once.
async fn paced_by_client<F: Future>(
    slot: &mut HandshakeSlot,
    step: F,
) -> Result<F::Output, Refused> {
    let mut step = std::pin::pin!(step);
    let ready = std::future::poll_fn(|cx| match step.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    if let Some(out) = ready {
        return Ok(out);
    }
    slot.wait_for_client()?;
    // The slot may go to a newcomer from a source holding fewer (`slots::Pending::evict_for`).
    tokio::select! {
        out = step => Ok(out),
        () = slot.evicted() => Err(Refused::Evicted),
    }
}

/// Logs a connection closed before MQTT for want of a pending slot (debug: a flood would
/// flood the log; `postbox_connections_refused_total` counts them).
fn no_pending_slot(peer: &SocketAddr, listener: &str, refused: Refused) {
    tracing::debug!(%peer, %listener, ?refused, "closing: no pending slot for a connection that waits before MQTT");
}

/// Reads the PROXY header of `stream` by `deadline` and puts the client address it names in
/// `info` and `slot`; `false` (logged and counted) when there is none in time, or when
/// waiting for it needs a pending slot and none is free (for the balancer's address, or for
/// the client's once it is named: [`HandshakeSlot::set_source`]).
async fn read_proxy_header<S>(
    stream: &mut S,
    info: &mut ConnectionInfo,
    slot: &mut HandshakeSlot,
    deadline: tokio::time::Instant,
    broker: &Broker,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let read = tokio::time::timeout_at(deadline, proxy::read_header(stream));
    let read = match paced_by_client(slot, read).await {
        Ok(read) => read,
        Err(refused) => {
            no_pending_slot(&info.peer, &info.listener, refused);
            return false;
        }
    };
    match read {
        Ok(Ok(Some(client))) => {
            if let Err(refused) = slot.set_source(client.ip()) {
                no_pending_slot(&client, &info.listener, refused);
                return false;
            }
            info.peer = client;
            true
        }
        Ok(Ok(None)) => true, // the balancer's own check: its address stands
        Ok(Err(error)) => {
            broker.metrics.connections_refused_proxy.increment(1);
            tracing::info!(peer = %info.peer, listener = %info.listener, %error, "closing connection: PROXY header");
            false
        }
        Err(_) => {
            broker.metrics.connections_refused_proxy.increment(1);
            tracing::info!(peer = %info.peer, listener = %info.listener, "closing connection: no PROXY header within mqtt.connect_timeout");
            false
        }
    }
}
