//! One task per client: the handshake, then the per-client protocol state machine.
//!
//! The connection owns its socket and its transient protocol state (keep-alive, topic aliases,
//! the will); everything that must outlive the socket lives in the broker's `Session`.

mod client;
mod gated;
mod handshake;
mod io;
pub mod topic_alias;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
pub use io::{READ_CHUNK, WRITE_HIGH_WATER};

/// Serves one client connection until it closes; never panics on client input.
pub async fn serve<S>(stream: S, peer: SocketAddr, broker: Arc<Broker>, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    broker.metrics.connections_total.increment(1);
    broker.metrics.connections_current.increment(1.0);
    let mut io = io::Io::new(stream);
    match handshake::accept(&mut io, &broker, &shutdown, peer).await {
        Some(accepted) => {
            client::Client::new(io, broker.clone(), accepted, shutdown, peer)
                .run()
                .await
        }
        None => tracing::debug!(%peer, "handshake did not complete"),
    }
    broker.metrics.connections_current.decrement(1.0);
}
