//! The HTTP listener of `[metrics] bind`: one axum router for `/metrics`, the probes
//! (`/healthz`, `/readyz`, and `/health` kept for old scrapers), the admin API (`/api/v1/...`,
//! [`api`], [`bridges`], [`listeners`], [`shared`]) and the status page (`/`, [`status`]). With `admin.bind` the API and the page are
//! served by a second listener of their own ([`Serves`]).
//!
//! One HTTP stack rather than the hand-routed hyper service it replaces: the API needs
//! routing, path and query parameters, JSON and an access check, which axum gives in a few
//! lines on the same hyper. `/metrics` renders whatever closure the server hands in
//! ([`Render`]), so the metrics library behind it can change without touching this module.
//!
//! Access: `/metrics` and the probes are open (Prometheus, Kubernetes); the API and the page
//! go through the Host check ([`host`], 421 for a name that is not the broker's) and then
//! [`access::check`] (127.0.0.1 / `::1` free unless `admin.require_token_on_loopback`, other
//! peers a bearer token).
//!
//! Must not block the runtime: every handler reads atomics or takes the broker's locks for
//! short, bounded walks (see `broker::admin`).

pub(crate) mod access;
mod api;
mod bridges;
mod host;
mod listeners;
mod serve;
mod shared;
mod status;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::bridge::BridgeStatus;
use crate::broker::Broker;
use crate::storage::StoreHealth;
pub(crate) use access::{Token, TokenError};
pub(crate) use listeners::ListenerInfo;
pub(crate) use serve::HttpBounds;

/// Renders the Prometheus text of `/metrics` (running whatever must be copied in first).
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// What `/readyz` knows beyond the broker: whether every listener is bound and serving.
#[derive(Debug, Default)]
pub(crate) struct Readiness {
    listeners_up: AtomicBool,
}

impl Readiness {
    /// Called once every MQTT listener is bound and accepting.
    pub(crate) fn listeners_up(&self) {
        self.listeners_up.store(true, Ordering::Release);
    }
}

/// Everything the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    broker: Arc<Broker>,
    render: Render,
    /// The last `/metrics` body and when its rendering started: one rendering at a time,
    /// shared by every scrape that arrived before it started.
    rendered: Arc<tokio::sync::Mutex<Option<(std::time::Instant, bytes::Bytes)>>>,
    readiness: Arc<Readiness>,
    token: Option<Arc<Token>>,
    /// `storage.max_disk_bytes`, for the overview (0 = unlimited).
    store_budget_bytes: u64,
    /// Every `[[bridge]]`'s status, in config order (`/api/v1/bridges`, the overview).
    bridges: Arc<[Arc<BridgeStatus>]>,
    /// Every MQTT listener as started, in config order (`/api/v1/listeners`).
    listeners: Arc<[ListenerInfo]>,
    /// The Host names the API answers beyond `localhost` and addresses.
    allowed_hosts: Arc<host::AllowedHosts>,
    /// Whether 127.0.0.1 / `::1` may use the API without the token.
    loopback_trusted: bool,
    /// Which routes this listener serves.
    serves: Serves,
}

/// Which of the routes one HTTP listener serves: both kinds (the default, one listener on
/// `[metrics] bind`), or one kind each when `admin.bind` gives the API its own listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serves {
    /// `/metrics`, the probes, the API and the status page.
    All,
    /// `/metrics` and the probes only (`[metrics] bind` while `admin.bind` is set).
    MetricsAndProbes,
    /// The API and the status page only (`admin.bind`).
    Api,
}

/// Both ends of an HTTP connection: the peer decides the token rule, the local address is a
/// Host the API answers to.
#[derive(Debug, Clone, Copy)]
struct Ends {
    peer: SocketAddr,
    local: SocketAddr,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// The handlers' state: the broker, the `/metrics` renderer, the listeners' readiness and
    /// the token other than loopback peers need (none: loopback only).
    pub(crate) fn new(
        broker: Arc<Broker>,
        render: Render,
        readiness: Arc<Readiness>,
        token: Option<Token>,
    ) -> AdminState {
        AdminState {
            broker,
            render,
            rendered: Arc::default(),
            readiness,
            token: token.map(Arc::new),
            store_budget_bytes: 0,
            bridges: Arc::new([]),
            listeners: Arc::new([]),
            allowed_hosts: Arc::default(),
            loopback_trusted: true,
            serves: Serves::All,
        }
    }

    /// The `[admin]` rules beyond the token: the Host names the API answers besides
    /// `localhost` and addresses, and whether loopback needs the token too.
    #[must_use]
    pub(crate) fn with_rules(
        mut self,
        allowed_hosts: &[String],
        require_token_on_loopback: bool,
    ) -> Self {
        self.allowed_hosts = Arc::new(host::AllowedHosts::new(allowed_hosts));
        self.loopback_trusted = !require_token_on_loopback;
        self
    }

    /// Which routes the listener this state is served on answers (default: all).
    #[must_use]
    pub(crate) fn serving(mut self, serves: Serves) -> AdminState {
        self.serves = serves;
        self
    }

    /// The bridges' statuses (`[[bridge]]`, in config order), for `/api/v1/bridges`, the
    /// overview's summary and the status page's table.
    #[must_use]
    pub(crate) fn with_bridges(mut self, bridges: Vec<Arc<BridgeStatus>>) -> AdminState {
        self.bridges = bridges.into();
        self
    }

    /// The MQTT listeners as started (config order), for `/api/v1/listeners` and the status
    /// page's Listeners table.
    #[must_use]
    pub(crate) fn with_listeners(mut self, listeners: Vec<ListenerInfo>) -> AdminState {
        self.listeners = listeners.into();
        self
    }

    /// The store's budget (`storage.max_disk_bytes`) the overview shows beside its use.
    #[must_use]
    pub(crate) fn with_store_budget(mut self, bytes: u64) -> AdminState {
        self.store_budget_bytes = bytes;
        self
    }
}

/// The router of one listener (see [`Serves`]): open endpoints, and the API and page behind
/// the Host and access checks.
pub(crate) fn router(state: AdminState) -> Router {
    let guarded = api::routes()
        .merge(status::routes())
        .merge(bridges::routes())
        .merge(listeners::routes())
        .merge(shared::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_access,
        ));
    let open = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/health", get(health_legacy))
        .route("/readyz", get(readyz));
    match state.serves {
        Serves::All => open.merge(guarded),
        Serves::MetricsAndProbes => open,
        Serves::Api => guarded,
    }
    .with_state(state)
}

/// Serves `listener` until `stop` is cancelled, within `bounds` (`[metrics]`: connections in
/// all and per address, the header read timeout; see [`serve`](mod@self::serve) the module);
/// connections in progress then finish their request (bounded by the server's shutdown,
/// which gives up waiting after a while).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    bounds: Arc<HttpBounds>,
    stop: CancellationToken,
) {
    let refused = state.broker.metrics.http_connections_refused.clone();
    serve::accept_loop(listener, router(state), bounds, refused, stop).await;
}

async fn require_access(
    State(state): State<AdminState>,
    ConnectInfo(Ends { peer, local }): ConnectInfo<Ends>,
    request: Request,
    next: Next,
) -> Response {
    // Before the token: a rebound page is refused whatever it sends, and learns nothing.
    let host = match host::request_host(request.headers(), request.uri()) {
        Ok(host) => host,
        Err(why) => {
            tracing::debug!(%peer, path = %request.uri().path(), why, "admin API: ambiguous Host");
            return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
        }
    };
    if !state.allowed_hosts.allows(host, local) {
        tracing::debug!(%peer, path = %request.uri().path(), "admin API: Host names another server");
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "the admin API answers only requests whose Host is localhost, a loopback address, \
             the address they arrived on, or a name in admin.allowed_hosts\n",
        )
            .into_response();
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    let trusted = state.loopback_trusted;
    match access::check(peer.ip(), authorization, state.token.as_deref(), trusted) {
        access::Access::Allowed => next.run(request).await,
        access::Access::Unauthorized => {
            tracing::debug!(%peer, path = %request.uri().path(), "admin API: missing or wrong token");
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "a bearer token (admin.token_file) is needed from this address\n",
            )
                .into_response()
        }
        access::Access::Forbidden => (
            StatusCode::FORBIDDEN,
            "the admin API answers 127.0.0.1 and ::1 only: set admin.token_file to allow other \
             peers\n",
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let Some(body) = render_shared(&state).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// The `/metrics` body for a scrape that arrives now: rendered off the runtime (a reading may
/// walk every session, at most a tenth of the time: see `broker::backlog`), one rendering at
/// a time, and a rendering that started after this scrape arrived serves it too. `/metrics`
/// is open to anyone: 8 keep-alive scrapers from one address rendered on the workers that
/// serve MQTT, side by side, and raised a QoS 1 round trip from 1 to 90 ms with 20,000
/// sessions (issue 35, seventh pass, N3). Now they take at most the blocking thread that
/// renders, and every answer is as fresh as a scrape of its own.
async fn render_shared(state: &AdminState) -> Option<bytes::Bytes> {
    let arrived = std::time::Instant::now();
    let mut rendered = state.rendered.lock().await;
    if let Some((started, body)) = rendered.as_ref() {
        if *started >= arrived {
            return Some(body.clone());
        }
    }
    let started = std::time::Instant::now();
    let render = Arc::clone(&state.render);
    match tokio::task::spawn_blocking(move || render()).await {
        Ok(body) => {
            let body = bytes::Bytes::from(body);
            *rendered = Some((started, body.clone()));
            Some(body)
        }
        Err(error) => {
            tracing::warn!(%error, "rendering the metrics failed");
            None
        }
    }
}

/// 200 while the process serves HTTP at all (a liveness probe).
async fn healthz() -> &'static str {
    "ok\n"
}

/// The path the endpoint answered before `/healthz` (kept for existing checks).
async fn health_legacy() -> &'static str {
    "OK"
}

/// 200 `ready` when every listener is bound, the broker is not stopping and the store (if
/// persistence is on) is open and writable; else 503 with the reason on one line.
async fn readyz(State(state): State<AdminState>) -> Response {
    match not_ready(&state) {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// Why the broker is not ready, if it is not.
fn not_ready(state: &AdminState) -> Option<&'static str> {
    if !state.readiness.listeners_up.load(Ordering::Acquire) {
        return Some("not ready: the MQTT listeners are not bound yet");
    }
    if state.broker.is_shutting_down() {
        return Some("not ready: shutting down");
    }
    match state.broker.store().map(|s| s.health()) {
        None | Some(StoreHealth::Ok) => None,
        Some(StoreHealth::NoSpace) => {
            Some("not ready: the store's filesystem is out of space (new persistent messages are refused)")
        }
        Some(StoreHealth::Failed) => Some("not ready: the store failed and stopped writing"),
    }
}
