//! Start-up and shutdown of a whole broker: listeners, metrics, broker state.
//!
//! Used by the binary and by the integration tests, which run the real broker in-process on
//! an ephemeral port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::config::Config;
use crate::metrics::{self, Metrics};
use crate::transport;

/// Why the broker could not start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics endpoint: {0}")]
    Metrics(String),
    #[error("cannot open the durable store: {0}")]
    Storage(#[from] crate::storage::StorageError),
}

/// Opens the store, restores what it holds into a new broker (blocking I/O, off the runtime).
async fn open_broker(config: &Config) -> Result<Arc<Broker>, StartError> {
    let storage_config = config.storage.clone();
    let (store, snapshot) = tokio::task::spawn_blocking(move || {
        let store = crate::storage::open(&storage_config)?;
        let snapshot = store.load()?;
        Ok::<_, crate::storage::StorageError>((store, snapshot))
    })
    .await
    .map_err(|e| StartError::Storage(crate::storage::StorageError::Failed(e.to_string())))??;
    let durable = store.is_durable();
    let broker = Broker::new(
        config.mqtt.clone(),
        config.auth.clone(),
        Some(store),
        Metrics::register(),
    );
    if durable {
        let summary = broker.restore(snapshot);
        tracing::info!(
            sessions = summary.sessions,
            expired_sessions = summary.expired_sessions,
            queued = summary.queued,
            inflight = summary.inflight,
            retained = summary.retained,
            wills = summary.wills,
            "restored durable state"
        );
    }
    Ok(broker)
}

/// Pending handshakes the kernel queues for the listener. The default 128 overflowed under
/// connection storms (200 concurrent handshakes), turning them into 1 s SYN retransmits; the
/// kernel caps this at `net.core.somaxconn` anyway.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the MQTT listener with [`LISTEN_BACKLOG`] (what `TcpListener::bind` does, but with
/// a larger backlog).
fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
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
/// CONNECT) arrive; after that it is handed over anyway and the CONNECT timeout applies.
const DEFER_ACCEPT_SECS: libc::c_int = 5;

/// MQTT clients speak first, so the listener asks the kernel (`TCP_DEFER_ACCEPT`) to wake it
/// only once a connection's CONNECT is readable: one wake-up per handshake instead of two
/// (accept, then data), which is what limited the connect rate. Best effort: on failure the
/// listener just accepts as usual.
#[cfg(target_os = "linux")]
fn defer_accept_until_data(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    let secs = DEFER_ACCEPT_SECS;
    // SAFETY: `listener` owns a valid socket for the duration of the call; the option value is
    // a properly sized and aligned c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&secs as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "TCP_DEFER_ACCEPT not set");
    }
}

#[cfg(not(target_os = "linux"))]
fn defer_accept_until_data(_listener: &TcpListener) {}

/// A broker that is up and serving.
pub struct RunningServer {
    /// Where the MQTT TCP listener actually listens (resolves port 0).
    pub mqtt_addr: SocketAddr,
    pub broker: Arc<Broker>,
    shutdown: CancellationToken,
    listener_task: JoinHandle<()>,
    /// Every connection task, so shutdown can wait for their last store updates.
    connections: TaskTracker,
}

/// How long shutdown waits for connection tasks to send their DISCONNECTs and finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Binds every configured listener and starts serving.
pub async fn start(config: Config) -> Result<RunningServer, StartError> {
    if config.metrics.enabled {
        metrics::install_exporter(config.metrics.bind)
            .map_err(|e| StartError::Metrics(e.to_string()))?;
    }
    let broker = open_broker(&config).await?;
    let listener = bind_listener(config.listeners[0].bind).map_err(|source| StartError::Bind {
        addr: config.listeners[0].bind,
        source,
    })?;
    let mqtt_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listeners[0].bind,
        source,
    })?;
    let shutdown = CancellationToken::new();
    let connections = TaskTracker::new();
    if let Some(store) = broker.store().cloned() {
        tokio::spawn(export_store_stats(store, shutdown.clone()));
    }
    tokio::spawn(sweep_keep_alives(Arc::clone(&broker), shutdown.clone()));
    let listener_task = tokio::spawn(transport::serve_tcp(
        listener,
        Arc::clone(&broker),
        shutdown.clone(),
        connections.clone(),
        config.listeners[0].max_connections,
    ));
    tracing::info!(%mqtt_addr, "MQTT listener up");
    Ok(RunningServer {
        mqtt_addr,
        broker,
        shutdown,
        listener_task,
        connections,
    })
}

/// Wakes connections whose keep-alive ran out, every [`crate::broker::KEEP_ALIVE_SWEEP`],
/// until shutdown: one task for all connections instead of a timer in each.
async fn sweep_keep_alives(broker: Arc<Broker>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(crate::broker::KEEP_ALIVE_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                broker.wake_expired_keep_alives();
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Copies the store's counters into metrics once a second until shutdown.
async fn export_store_stats(store: Arc<dyn crate::storage::Store>, shutdown: CancellationToken) {
    let metrics = crate::metrics::StoreMetrics::register();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => metrics.update(&store.stats()),
            _ = shutdown.cancelled() => return,
        }
    }
}

impl RunningServer {
    /// Stops accepting, tells every client the server is going away (v5 0x8B), and waits
    /// for the listener to stop.
    pub async fn shutdown(self) {
        // The listener sees the token and tells the broker (`Broker::begin_shutdown`).
        self.shutdown.cancel();
        let _ = self.listener_task.await;
        self.connections.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, self.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the shutdown grace period");
        }
        if let Some(store) = self.broker.store().cloned() {
            // Final commit and sync; blocking file I/O, so off the runtime's workers.
            match tokio::task::spawn_blocking(move || store.close()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(%error, "durable store did not close cleanly"),
                Err(error) => tracing::error!(%error, "durable store close panicked"),
            }
        }
    }

    /// A token that stops the server when cancelled (e.g. from a signal handler).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
