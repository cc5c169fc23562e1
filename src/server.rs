//! Start-up and shutdown of a whole broker: listeners, metrics, broker state.
//!
//! Used by the binary and by the integration tests, which run the real broker in-process on
//! an ephemeral port.

use std::net::SocketAddr;
use std::sync::Arc;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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
}

/// A broker that is up and serving.
pub struct RunningServer {
    /// Where the MQTT TCP listener actually listens (resolves port 0).
    pub mqtt_addr: SocketAddr,
    pub broker: Arc<Broker>,
    shutdown: CancellationToken,
    listener_task: JoinHandle<()>,
}

/// Binds every configured listener and starts serving.
pub async fn start(config: Config) -> Result<RunningServer, StartError> {
    if config.metrics.enabled {
        metrics::install_exporter(config.metrics.bind)
            .map_err(|e| StartError::Metrics(e.to_string()))?;
    }
    let broker = Broker::new(
        config.mqtt.clone(),
        config.auth.clone(),
        Metrics::register(),
    );
    let listener = TcpListener::bind(config.listener.bind)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listener.bind,
            source,
        })?;
    let mqtt_addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.listener.bind,
        source,
    })?;
    let shutdown = CancellationToken::new();
    let listener_task = tokio::spawn(transport::serve_tcp(
        listener,
        Arc::clone(&broker),
        shutdown.clone(),
        config.listener.max_connections,
    ));
    tracing::info!(%mqtt_addr, "MQTT listener up");
    Ok(RunningServer {
        mqtt_addr,
        broker,
        shutdown,
        listener_task,
    })
}

impl RunningServer {
    /// Stops accepting, tells every client the server is going away (v5 0x8B), and waits
    /// for the listener to stop.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.listener_task.await;
    }

    /// A token that stops the server when cancelled (e.g. from a signal handler).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
