//! The bridge's way to a remote broker (issue 15): TCP or TLS to one `host:port`, the reconnect
//! backoff, and which address to try next.
//!
//! The bridge engine (`bridge::engine`) runs one connect cycle after another: it asks the
//! [`AddressPicker`] for the order of this cycle, calls [`connect`] on each address until one
//! answers, tells the picker which one did, and waits [`Backoff::next_delay`] before the next
//! cycle when none did. Everything here is about bytes reaching the remote; MQTT starts above
//! [`RemoteStream`] (`bridge::remote`).
//!
//! - `tls`: [`ClientTls`], the rustls client configuration built once per bridge from
//!   `[bridge.tls]` (ring provider, TLS 1.2 and 1.3, CA or system roots, mTLS, ALPN, SNI,
//!   `insecure`).
//! - `stream`: [`connect`] (resolve, TCP with `TCP_NODELAY`, handshake, all under one timeout)
//!   and [`RemoteStream`].
//! - `error`: [`TransportError`], which names the address, the step and the cause.
//! - `backoff`: [`Backoff`], Mosquitto 2.1's `restart_timeout base cap` (decorrelated jitter).
//! - `picker`: [`AddressPicker`], failover or Mosquitto's `round_robin`.
//!
//! Must not: speak MQTT; retry by itself (the engine runs the cycles).

mod backoff;
mod error;
mod picker;
mod stream;
mod tls;

pub(crate) use backoff::Backoff;
pub use error::{Step, TlsFailure, TransportError};
pub use picker::AddressPicker;
pub use stream::{connect, RemoteStream};
pub use tls::ClientTls;
