//! The HTTP listener of `[metrics] bind`, bound at start so a taken port stops the start
//! early (before the store opens); served by the `admin` module (`/metrics` rendered from the
//! broker's registry by [`super::Metrics::render`], whose scrape-time collectors read the
//! store's figures and the session backlog as they are at that moment; the probes, the admin
//! API and the status page).

use std::net::SocketAddr;

use super::MetricsError;

/// The bound listener, not yet serving: the server hands it to `admin::serve`.
pub(crate) struct MetricsEndpoint {
    listener: tokio::net::TcpListener,
}

impl std::fmt::Debug for MetricsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsEndpoint")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

/// Binds the HTTP listener at `bind`, for a caller that owns its lifetime: the server serves
/// it (`admin::serve`) until shutdown, which closes the port. Must be called inside a
/// tokio runtime.
///
/// # Errors
///
/// `MetricsError::Bind` when the HTTP listener cannot bind.
pub(crate) fn start_exporter(bind: SocketAddr) -> Result<MetricsEndpoint, MetricsError> {
    let bind_error = |e: std::io::Error| MetricsError::Bind {
        bind,
        message: e.to_string(),
    };
    let listener = std::net::TcpListener::bind(bind).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(bind_error)?;
    Ok(MetricsEndpoint { listener })
}

impl MetricsEndpoint {
    /// The bound listener, for the HTTP server.
    pub(crate) fn into_listener(self) -> tokio::net::TcpListener {
        self.listener
    }
}
