//! [`TransportError`]: what went wrong reaching a remote, said so an operator can act on it
//! (the address, the step that failed and the cause), and typed so the engine and the tests
//! can tell the causes apart.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// Why the bridge could not set up (or keep) its byte stream to a remote.
///
/// Every variant about a connection names the configured address (`host:port` as written
/// in `addresses`), so a log line or `BridgeStatus::last_error` says which remote failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `[bridge.tls]` cannot be used: a file that cannot be read or holds nothing usable, a
    /// key without its certificate, an invalid `server_name`. Found at bridge start.
    #[error("bridge TLS: {0}")]
    TlsConfig(String),
    /// The address is not `host:port`.
    #[error("{address}: not a host:port address: {problem}")]
    BadAddress {
        /// The configured address.
        address: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The host name could not be resolved (DNS error, unknown host).
    #[error("{address}: cannot resolve the host: {source}")]
    Resolve {
        /// The configured address.
        address: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// The host name resolved to no socket address.
    #[error("{address}: the host resolved to no address")]
    NoAddress {
        /// The configured address.
        address: String,
    },
    /// TCP connect failed on every resolved socket address (refused, unreachable); the error
    /// is the last one's.
    #[error("{address}: TCP connect to {peer} failed ({tried} address(es) tried): {source}")]
    Connect {
        /// The configured address.
        address: String,
        /// The last socket address tried.
        peer: SocketAddr,
        /// How many resolved socket addresses were tried.
        tried: usize,
        /// The OS error (e.g. `ConnectionRefused`).
        #[source]
        source: io::Error,
    },
    /// The connect timeout ran out during `step`.
    #[error("{address}: timed out after {timeout:?} during {step}")]
    Timeout {
        /// The configured address.
        address: String,
        /// The step that was running when the time ran out.
        step: Step,
        /// The whole connect's timeout.
        timeout: Duration,
    },
    /// The TLS handshake failed (or, with TLS 1.3, the remote refused the client certificate
    /// by an alert that arrives after the client's side of the handshake completed: see
    /// [`super::RemoteStream::read_error`]).
    #[error("{address}: TLS with {peer} failed: {failure}: {source}")]
    Tls {
        /// The configured address.
        address: String,
        /// The socket address of the remote.
        peer: SocketAddr,
        /// The kind of failure.
        failure: TlsFailure,
        /// rustls' error (inside an `io::Error`), with its details.
        #[source]
        source: io::Error,
    },
    /// The established stream failed with an I/O error that is not a TLS failure.
    #[error("{address}: connection to {peer} failed: {source}")]
    Io {
        /// The configured address.
        address: String,
        /// The socket address of the remote.
        peer: SocketAddr,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// The step of [`super::connect`] a [`TransportError::Timeout`] happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Resolving the host name.
    Resolve,
    /// The TCP connect.
    TcpConnect,
    /// The TLS handshake.
    TlsHandshake,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Resolve => "name resolution",
            Step::TcpConnect => "TCP connect",
            Step::TlsHandshake => "TLS handshake",
        })
    }
}

/// What kind of TLS failure a [`TransportError::Tls`] is: the cases an operator fixes
/// differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The remote's certificate does not chain to a trusted CA (`ca`, or the system store).
    UnknownIssuer,
    /// The remote's certificate is not valid for the name checked (`server_name`, or the
    /// host of the address).
    NameMismatch,
    /// The remote's certificate is expired or not yet valid.
    Expired,
    /// Another problem with the remote's certificate (bad signature, wrong usage, revoked…).
    BadCertificate,
    /// The remote sent a fatal alert: it refused us (no or an unknown client certificate,
    /// no common protocol version or cipher suite, …).
    AlertReceived(rustls::AlertDescription),
    /// Another TLS protocol error.
    Protocol,
    /// The connection closed or failed during the handshake without a TLS error (e.g. the
    /// remote is not speaking TLS on that port).
    Closed,
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsFailure::UnknownIssuer => {
                f.write_str("certificate unknown (not issued by a trusted CA)")
            }
            TlsFailure::NameMismatch => f.write_str("certificate name mismatch"),
            TlsFailure::Expired => f.write_str("certificate expired or not yet valid"),
            TlsFailure::BadCertificate => f.write_str("bad certificate"),
            TlsFailure::AlertReceived(alert) => write!(f, "the remote sent the alert {alert:?}"),
            TlsFailure::Protocol => f.write_str("protocol error"),
            TlsFailure::Closed => f.write_str("connection closed during the handshake"),
        }
    }
}

impl TlsFailure {
    /// The kind of `error` if it carries a rustls error, else `None` (a plain I/O error).
    pub(super) fn of(error: &io::Error) -> Option<TlsFailure> {
        use rustls::CertificateError as C;
        let rustls = error.get_ref()?.downcast_ref::<rustls::Error>()?;
        Some(match rustls {
            rustls::Error::InvalidCertificate(cert) => match cert {
                C::UnknownIssuer => TlsFailure::UnknownIssuer,
                C::NotValidForName | C::NotValidForNameContext { .. } => TlsFailure::NameMismatch,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => TlsFailure::Expired,
                _ => TlsFailure::BadCertificate,
            },
            rustls::Error::AlertReceived(alert) => TlsFailure::AlertReceived(*alert),
            _ => TlsFailure::Protocol,
        })
    }
}
