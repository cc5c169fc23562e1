//! The broker's `/metrics` text: the Prometheus recorder's, rendered per request after the
//! scrape hooks ran, and the HTTP listener it is served on (by `crate::admin`, with the
//! probes, the admin API and the status page).
//!
//! Rendered here rather than by the exporter's own listener for one reason: figures kept
//! outside the recorder — the store's counters and sizes, counted on its own thread — are
//! copied in right before each scrape ([`MetricsEndpoint::before_scrape`]), so a scrape shows
//! them as they are at that moment rather than as of the last periodic copy (issue 11: a full
//! disk read 24 bytes for a 5 MB store, and refusals showed up to a second late).
//!
//! Must not block the runtime: a hook only reads atomics.

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;

use super::MetricsError;

/// Something to run before every scrape.
type Hook = Box<dyn Fn() + Send + Sync>;

/// The bound endpoint, not yet serving: register hooks, then run [`MetricsEndpoint::serve`].
pub struct MetricsEndpoint {
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    hooks: Arc<Mutex<Vec<Hook>>>,
}

impl std::fmt::Debug for MetricsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsEndpoint")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

/// Installs the global Prometheus recorder and binds the HTTP endpoint at `bind`, for a
/// caller that owns the endpoint's lifetime: the server takes the listener and the renderer
/// apart ([`MetricsEndpoint::into_parts`]) and serves them (`crate::admin::serve`) until
/// shutdown, which closes the port. Must be called inside a tokio runtime, and
/// before [`super::Metrics::register`] (handles taken earlier stay no-ops).
///
/// # Errors
///
/// `MetricsError::Bind` when the HTTP listener cannot bind; `MetricsError::Install` when a
/// recorder is installed already.
pub fn start_exporter(bind: SocketAddr) -> Result<MetricsEndpoint, MetricsError> {
    let bind_error = |e: std::io::Error| MetricsError::Bind {
        bind,
        message: e.to_string(),
    };
    let listener = std::net::TcpListener::bind(bind).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(bind_error)?;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Install(e.to_string()))?;
    Ok(MetricsEndpoint {
        listener,
        handle,
        hooks: Arc::default(),
    })
}

impl MetricsEndpoint {
    /// Runs `hook` before every scrape, to copy figures kept elsewhere into the recorder.
    pub fn before_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.hooks.lock().push(Box::new(hook));
    }

    /// The bound listener, and the closure that renders `/metrics` (hooks first).
    pub fn into_parts(
        self,
    ) -> (
        tokio::net::TcpListener,
        Arc<dyn Fn() -> String + Send + Sync>,
    ) {
        let handle = self.handle;
        let hooks = self.hooks;
        let render = move || {
            for hook in hooks.lock().iter() {
                hook();
            }
            handle.run_upkeep();
            handle.render()
        };
        (self.listener, Arc::new(render))
    }
}
