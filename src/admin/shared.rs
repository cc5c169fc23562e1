//! `GET /api/v1/shared?limit=`: the shared-subscription groups (`$share/{group}/{filter}`),
//! each with its members (all, connected) and its backlog (messages queued for the group
//! across its members: count, bytes, oldest age). Sorted by the group's full filter,
//! bounded by `limit` like every list (`truncated` says more exist); an unknown parameter is
//! a 400. The walk is `Broker::shared_groups` (each member session locked once, briefly).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::api::{known, limit};
use super::AdminState;
use crate::broker::shared_backlog::SharedGroupView;

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/api/v1/shared", get(shared))
}

/// `GET /api/v1/shared[?limit=]`.
async fn shared(
    State(state): State<AdminState>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let limit = match known(&params, &["limit"]).and_then(|()| limit(&params)) {
        Ok(n) => n,
        Err(bad) => return bad.into_response(),
    };
    #[derive(Serialize)]
    struct Groups {
        groups: Vec<SharedGroupView>,
        truncated: bool,
    }
    let (groups, truncated) = state.broker.shared_groups(limit);
    Json(Groups { groups, truncated }).into_response()
}
