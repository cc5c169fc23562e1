//! Plain TCP listener.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::connection;

/// Accepts until `shutdown`, spawning one task per connection. With `max_connections > 0`,
/// connections beyond the limit are closed at once (Mosquitto's `max_connections`).
pub async fn serve_tcp(
    listener: TcpListener,
    broker: Arc<Broker>,
    shutdown: CancellationToken,
    connections: TaskTracker,
    max_connections: usize,
) {
    let name: Arc<str> = Arc::from("default");
    let limit = (max_connections > 0).then(|| Arc::new(Semaphore::new(max_connections)));
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => {
                // Connections do not watch the token themselves (one less future each).
                broker.begin_shutdown();
                return;
            }
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Typically EMFILE: back off briefly instead of spinning on the error.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match &limit {
            Some(sem) => match Arc::clone(sem).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    tracing::warn!(%peer, max_connections, "connection limit reached, refusing");
                    continue;
                }
            },
            None => None,
        };
        // Latency matters more than packet count: batching is done by the connection itself.
        let _ = stream.set_nodelay(true);
        let broker = Arc::clone(&broker);
        let shutdown = shutdown.clone();
        let name = Arc::clone(&name);
        connections.spawn(async move {
            let info = super::ConnectionInfo {
                peer,
                listener: Arc::clone(&name),
            };
            connection::serve(stream, info, broker, shutdown).await;
            drop(permit);
        });
    }
}
