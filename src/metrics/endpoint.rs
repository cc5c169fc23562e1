//! The broker's `/metrics` HTTP endpoint on `hyper`: the broker's registry rendered per
//! request ([`super::Metrics::render`], whose scrape-time collectors read the store's
//! figures and the session backlog as they are at that moment). `/health` answers `OK`; any
//! other path returns the metrics.
//!
//! Must not block the runtime: rendering reads atomics and takes short locks.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::MetricsError;

/// The bound endpoint, not yet serving: run [`MetricsEndpoint::serve`].
pub struct MetricsEndpoint {
    listener: tokio::net::TcpListener,
}

impl std::fmt::Debug for MetricsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsEndpoint")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

/// Binds the HTTP endpoint at `bind`, for a caller that owns the endpoint's lifetime: the
/// server runs [`MetricsEndpoint::serve`] and drops it at shutdown, which closes the port.
/// Bound before the broker opens, so a taken port stops the start early. Must be called
/// inside a tokio runtime.
///
/// # Errors
///
/// `MetricsError::Bind` when the HTTP listener cannot bind.
pub fn start_exporter(bind: SocketAddr) -> Result<MetricsEndpoint, MetricsError> {
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
    /// Serves scrapes with the text `render` returns until dropped; each connection gets a
    /// task of its own.
    pub async fn serve(self, render: impl Fn() -> String + Send + Sync + 'static) {
        let render = Arc::new(render);
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
            let render = Arc::clone(&render);
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let response = respond(&request, &*render);
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

/// `/health` → `OK`; anything else → the metrics.
fn respond<B>(request: &Request<B>, render: &dyn Fn() -> String) -> Response<Full<Bytes>> {
    let (body, content_type) = if request.uri().path() == "/health" {
        (Bytes::from_static(b"OK"), "text/plain")
    } else {
        // A few hundred series: rendering takes well under a millisecond, no need for the
        // blocking pool.
        (
            Bytes::from(render()),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    let mut response = Response::new(Full::new(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
