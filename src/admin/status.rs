//! The status page (`/`): one self-contained HTML file (`status.html`, compiled in; no CDN,
//! no build step) whose script reads `GET /api/v1/overview` and `/metrics` every few seconds
//! and computes message rates from successive counter readings (and, when bridges are
//! configured, `GET /api/v1/bridges` for its Bridges table). `overview` gathers what the
//! page needs that `/metrics` does not say per session (the largest backlogs).

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

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
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
    retained: usize,
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
        retained: broker.retained_count(),
        largest_backlogs,
        store,
        bridges: super::bridges::summary(&state),
    })
    .into_response()
}
