//! Listeners: accept sockets and hand each to a connection task. Knows nothing of MQTT.

pub mod fd_table;
mod tcp;

pub use tcp::serve_tcp;

use std::net::SocketAddr;
use std::sync::Arc;

/// What the transport knows about one connection, handed to the connection task: where it
/// came from and which listener took it. The place for the TLS identity and the PROXY
/// protocol's real client address once those listeners exist.
#[derive(Clone, Debug)]
pub struct ConnectionInfo {
    /// The socket's peer address.
    pub peer: SocketAddr,
    /// The name of the listener that accepted it.
    pub listener: Arc<str>,
}
