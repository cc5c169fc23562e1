//! The status page (`/`): one self-contained HTML file (`status.html`, compiled in; no CDN,
//! no build step, served with a Content Security Policy that allows only its own inline
//! script and style) whose script reads `GET /api/v1/overview`, `/api/v1/listeners`, a page
//! of `/api/v1/clients` (searched and paged by the server) and `/metrics` every few seconds,
//! computing message rates from successive counter readings (and, when bridges are
//! configured, `GET /api/v1/bridges` for its Bridges table). `overview` gathers what the
//! page needs that `/metrics` does not say per session (the largest backlogs).

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::AdminState;
use crate::broker::admin::{BacklogView, SessionTotals};
use crate::storage::StoreHealth;

/// The page, as shipped.
const PAGE: &str = include_str!("status.html");

/// How many of the largest backlogs the overview lists.
const TOP_BACKLOGS: usize = 10;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/", get(page))
}

/// The page's Content Security Policy: nothing but its own inline script and style (by
/// their SHA-256, computed once from the page as shipped) and requests to its own origin.
/// An operator's reverse proxy may add a policy of its own; this one already holds, so a
/// client id or user name that somehow reached the DOM as markup could run nothing (the
/// script writes them with `textContent` only), and no other site may frame the page.
static POLICY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        inline_hash(PAGE, "<script>", "</script>"),
        inline_hash(PAGE, "<style>", "</style>"),
    )
});

/// `sha256-<base64>` of the text between the first `open` and the following `close` in
/// `page` (CSP Level 2 §4.2.4: the hash of the element's content, as the browser sees it).
fn inline_hash(page: &str, open: &str, close: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let content = page
        .split_once(open)
        .and_then(|(_, rest)| rest.split_once(close))
        .map_or("", |(content, _)| content);
    let digest = sha2::Sha256::digest(content.as_bytes());
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// The store as the page shows it.
#[derive(Serialize)]
struct StoreView {
    /// False: everything in memory (`storage.persistence = false`).
    persistence: bool,
    /// `ok`, `no_space` or `failed`.
    health: &'static str,
    live_bytes: u64,
    disk_bytes: u64,
    /// `storage.max_disk_bytes` (0 = unlimited).
    budget_bytes: u64,
    commits: u64,
    rejected: u64,
}

/// `GET /api/v1/overview`.
#[derive(Serialize)]
struct Overview {
    version: &'static str,
    uptime_secs: u64,
    clients_connected: usize,
    sessions: SessionTotals,
    subscriptions: usize,
    /// Retained messages as `GET /api/v1/retained` lists them without a prefix: topics not
    /// starting with `$` (issue 37, item 5: this counted `$SYS` too, 49 against the API's 1).
    retained: usize,
    /// Retained messages under a `$` first level (`$SYS/...`), not in `retained`; listed with
    /// `GET /api/v1/retained?prefix=$SYS`.
    retained_system: usize,
    largest_backlogs: Vec<BacklogView>,
    store: StoreView,
    /// `[[bridge]]` links: how many, how many up, what they hold for their remotes.
    bridges: super::bridges::BridgesSummary,
}

/// `GET /api/v1/overview`: connections, sessions and their largest backlogs, subscriptions,
/// retained messages and the store. One pass over the sessions (each locked briefly).
pub(super) async fn overview(State(state): State<AdminState>) -> Response {
    let broker = &state.broker;
    let (sessions, largest_backlogs) = broker.backlogs(TOP_BACKLOGS);
    let retained = broker.retained_counts();
    let store = match broker.store() {
        Some(store) => {
            let stats = store.stats();
            StoreView {
                persistence: true,
                health: match store.health() {
                    StoreHealth::Ok => "ok",
                    StoreHealth::NoSpace => "no_space",
                    StoreHealth::Failed => "failed",
                },
                live_bytes: stats.live_bytes,
                disk_bytes: stats.disk_bytes,
                budget_bytes: state.store_budget_bytes,
                commits: stats.commits,
                rejected: stats.rejected_queue_full
                    + stats.rejected_disk_full
                    + stats.rejected_no_space,
            }
        }
        None => StoreView {
            persistence: false,
            health: "ok",
            live_bytes: 0,
            disk_bytes: 0,
            budget_bytes: 0,
            commits: 0,
            rejected: 0,
        },
    };
    Json(Overview {
        version: env!("CARGO_PKG_VERSION"),
        uptime_secs: broker.clock_ms(std::time::Instant::now()) / 1000,
        clients_connected: broker.connected_count(),
        sessions,
        subscriptions: broker.subscription_count(),
        retained: retained.listed,
        retained_system: retained.system,
        largest_backlogs,
        store,
        bridges: super::bridges::summary(&state),
    })
    .into_response()
}
