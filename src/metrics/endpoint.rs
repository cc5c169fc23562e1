//! The broker's `/metrics` HTTP endpoint: the Prometheus recorder's text, rendered per
//! request, after the scrape hooks ran.
//!
//! Served here (on `hyper`, which the exporter's own listener uses too) rather than by the
//! exporter's listener for one reason: figures kept outside the recorder — the store's
//! counters and sizes, counted on its own thread — are copied in right before each scrape
//! ([`MetricsEndpoint::before_scrape`]), so a scrape shows them as they are at that moment
//! rather than as of the last periodic copy (issue 11: a full disk read 24 bytes for a 5 MB
//! store, and refusals showed up to a second late). `/health` answers `OK`; any other path
//! returns the metrics, as the exporter's listener does.
//!
//! Must not block the runtime: a hook only reads atomics.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
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
/// caller that owns the endpoint's lifetime: the server runs [`MetricsEndpoint::serve`] and
/// drops it at shutdown, which closes the port. Must be called inside a tokio runtime, and
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

    /// Serves scrapes until dropped; each connection gets a task of its own.
    pub async fn serve(self) {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, typically: back off instead of spinning.
                    tracing::warn!(%error, "metrics endpoint cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handle = self.handle.clone();
            let hooks = Arc::clone(&self.hooks);
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let response = respond(&request, &handle, &hooks);
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(async move {
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "metrics scrape connection ended with an error");
                }
            });
        }
    }
}

/// `/health` → `OK`; anything else → the metrics, after the hooks ran.
fn respond<B>(
    request: &Request<B>,
    handle: &PrometheusHandle,
    hooks: &Mutex<Vec<Hook>>,
) -> Response<Full<Bytes>> {
    let (body, content_type) = if request.uri().path() == "/health" {
        (Bytes::from_static(b"OK"), "text/plain")
    } else {
        for hook in hooks.lock().iter() {
            hook();
        }
        handle.run_upkeep();
        // A few dozen series: rendering takes microseconds, no need for the blocking pool.
        (
            Bytes::from(handle.render()),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    let mut response = Response::new(Full::new(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
