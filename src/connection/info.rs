//! What a listener learns of a connection before MQTT starts (the socket's peer, the
//! listener's name, a TLS client identity), handed to the connection and its handshake. It
//! lives here, not in `transport`, so the connection layer needs nothing of the listeners
//! above it (the layering rule, `src/layering.rs`).
//!
//! Must not: name a listener type.

use std::net::SocketAddr;
use std::sync::Arc;

/// What the transport knows about a connection, handed to the connection (and its handshake,
/// so authentication can use it).
///
/// This is the place for what listener kinds learn before MQTT starts: the verified TLS
/// client identity, or the real client address from a PROXY protocol header (which replaces
/// `peer`, see `transport::Handoff`'s `spawn_prepared` and `spawn_upgraded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectionInfo {
    /// The remote address of the socket.
    pub peer: SocketAddr,
    /// Name of the listener the connection came through (`[[listener]] name`).
    pub listener: Arc<str>,
    /// What a TLS listener learnt (`None` on plain TCP). One pointer, so `ConnectionInfo`,
    /// which every connection keeps for its life, grows by 8 B only.
    pub tls: Option<Arc<TlsPeer>>,
}

/// What the TLS handshake established about the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsPeer {
    /// The identity (CN or SAN, per `tls.identity`) of the client's verified certificate.
    pub identity: Option<Arc<str>>,
    /// `tls.use_identity_as_username`: the MQTT handshake takes `identity` as the user name,
    /// ignoring CONNECT's, and refuses a client without one.
    pub identity_as_username: bool,
}
