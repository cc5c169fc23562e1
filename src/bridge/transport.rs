//! TEMPORARY stand-in (plain TCP only) for helper C's module with the same interface; replaced
//! wholesale at the merge.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

/// TLS settings of one bridge (not in this stand-in).
#[derive(Debug)]
pub struct ClientTls;

impl ClientTls {
    /// Not in this stand-in.
    ///
    /// # Errors
    ///
    /// Always.
    pub fn load(
        _config: &crate::config::BridgeTlsConfig,
    ) -> Result<Arc<ClientTls>, TransportError> {
        Err(TransportError::Tls("TLS not built yet".into()))
    }
}

/// The connected stream.
pub type RemoteStream = TcpStream;

/// Why connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TCP.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    /// Timeout.
    #[error("cannot connect to {0}: timed out")]
    Timeout(String),
    /// TLS.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Connects over TCP.
///
/// # Errors
///
/// The connect error.
pub async fn connect(
    address: &str,
    _tls: Option<&ClientTls>,
    timeout: Duration,
) -> Result<RemoteStream, TransportError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(address))
        .await
        .map_err(|_| TransportError::Timeout(address.to_owned()))?
        .map_err(|e| TransportError::Connect(address.to_owned(), e))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Reconnect delays.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// From `base` to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            next: base,
        }
    }
    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        d
    }
    /// After a connection that worked.
    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

/// Which address to try.
#[derive(Debug)]
pub struct AddressPicker {
    addresses: Vec<String>,
    round_robin: bool,
    last: usize,
}

impl AddressPicker {
    /// Over `addresses`.
    pub fn new(addresses: Vec<String>, round_robin: bool) -> Self {
        AddressPicker {
            addresses,
            round_robin,
            last: 0,
        }
    }
    /// Indexes to try now.
    pub fn order(&self) -> Vec<usize> {
        let n = self.addresses.len();
        let start = if self.round_robin {
            (self.last + 1) % n.max(1)
        } else {
            0
        };
        (0..n).map(|i| (start + i) % n).collect()
    }
    /// The address at `index`.
    pub fn address(&self, index: usize) -> &str {
        &self.addresses[index]
    }
    /// `index` worked.
    pub fn succeeded(&mut self, index: usize) {
        self.last = index;
    }
}
