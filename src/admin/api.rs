//! The admin API, JSON over HTTP under `/api/v1/`: what is connected (paged and searchable),
//! one session, retained messages and subscriptions (each list bounded by `limit`, at most
//! [`MAX_LIMIT`]), and the two operator actions, disconnecting a client and discarding a
//! session.
//!
//! Errors are JSON too (`{"error": "..."}`): 404 for a client id nobody has, 400 for a bad
//! parameter. The broker side of every call is in `broker::admin`.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::AdminState;
use crate::broker::admin::{ClientQuery, Kick, MAX_SEARCH_LEN};
use crate::codec::topic;

/// The most entries one list call returns.
pub(super) const MAX_LIMIT: usize = 1000;
/// Entries returned when the call names no `limit`.
const DEFAULT_LIMIT: usize = 100;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/clients", get(clients))
        .route("/api/v1/clients/{client_id}", axum::routing::delete(kick))
        .route(
            "/api/v1/sessions/{client_id}",
            get(session).delete(discard_session),
        )
        .route("/api/v1/retained", get(retained))
        .route("/api/v1/subscriptions", get(subscriptions))
        .route("/api/v1/overview", get(super::status::overview))
}

/// The extractor of a call that takes no parameters: given one, the call is answered 400
/// naming it (a misspelt parameter is said, not ignored).
pub(super) struct NoParameters;

impl<S: Send + Sync> FromRequestParts<S> for NoParameters {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        let Query(params) = Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
            .map_err(IntoResponse::into_response)?;
        match params.keys().next() {
            Some(key) => Err(error(
                StatusCode::BAD_REQUEST,
                format!("unknown parameter {key:?}; this call takes none"),
            )),
            None => Ok(NoParameters),
        }
    }
}

/// A JSON error with its status.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Error {
        error: String,
    }
    (
        status,
        Json(Error {
            error: message.into(),
        }),
    )
        .into_response()
}

type Params = Query<HashMap<String, String>>;

/// A parameter the call cannot use: answered 400 with the message.
pub(super) struct BadRequest(String);

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        error(StatusCode::BAD_REQUEST, self.0)
    }
}

/// `limit` from the query: 1..=[`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
pub(super) fn limit(params: &HashMap<String, String>) -> Result<usize, BadRequest> {
    match params.get("limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(BadRequest(format!(
                "limit must be a number from 1 to {MAX_LIMIT}, not {text:?}"
            ))),
        },
    }
}

/// Refuses query parameters the call does not know (a typo must not silently widen a list).
pub(super) fn known(params: &HashMap<String, String>, allowed: &[&str]) -> Result<(), BadRequest> {
    match params.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(BadRequest(format!(
            "unknown parameter {k:?}; this call takes {allowed:?}"
        ))),
    }
}

/// `GET /api/v1/clients[?limit=&after=&prefix=&search=&user=]`: a page of the connected
/// clients, by client id: `prefix` (client ids starting with it), `search` (client id or user
/// name containing it, ASCII case ignored), `user` (exactly); `next` is the `after` of the
/// following page. The page is found without copying the rest of the fleet (see
/// `broker::admin::ClientQuery`), so a search of 100,000 clients allocates a page's worth.
async fn clients(State(state): State<AdminState>, Query(params): Params) -> Response {
    let allowed = ["limit", "after", "prefix", "search", "user"];
    let result = known(&params, &allowed).and_then(|()| limit(&params));
    let limit = match result {
        Ok(n) => n,
        Err(bad) => return bad.into_response(),
    };
    let text = |key: &str| params.get(key).map(String::as_str);
    // Only `search` is compared at every offset of every client id it meets; `after`, a
    // client id of the previous page, may be as long as a client id can be.
    if text("search").is_some_and(|v| v.len() > MAX_SEARCH_LEN) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("search is longer than {MAX_SEARCH_LEN} bytes"),
        );
    }
    let query = ClientQuery {
        prefix: text("prefix").unwrap_or(""),
        search: text("search").filter(|s| !s.is_empty()),
        user: text("user"),
        after: text("after"),
        limit,
    };
    Json(state.broker.clients_page(&query)).into_response()
}

/// `GET /api/v1/sessions/{client_id}`: one session, connected or not.
async fn session(State(state): State<AdminState>, Path(client_id): Path<String>) -> Response {
    match state.broker.session_view(&client_id) {
        Some(view) => Json(view).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no session for client id {client_id:?}"),
        ),
    }
}

/// `DELETE /api/v1/clients/{client_id}`: disconnects it (v5 DISCONNECT 0x98); the session
/// stays for its expiry interval.
async fn kick(State(state): State<AdminState>, Path(client_id): Path<String>) -> Response {
    match state.broker.kick(&client_id) {
        Kick::Disconnected => {
            tracing::info!(client = %client_id, "admin API: client disconnected by an operator");
            Json(serde_json::json!({ "client_id": client_id, "disconnected": true }))
                .into_response()
        }
        Kick::NotConnected => error(
            StatusCode::NOT_FOUND,
            format!("client id {client_id:?} is not connected (its session is kept)"),
        ),
        Kick::NoSuchClient => error(
            StatusCode::NOT_FOUND,
            format!("no client with id {client_id:?}"),
        ),
    }
}

/// `DELETE /api/v1/sessions/{client_id}`: disconnects the client if connected and discards
/// the session with its store records.
async fn discard_session(
    State(state): State<AdminState>,
    Path(client_id): Path<String>,
) -> Response {
    if state.broker.discard_session(&client_id) {
        tracing::info!(client = %client_id, "admin API: session discarded by an operator");
        Json(serde_json::json!({ "client_id": client_id, "discarded": true })).into_response()
    } else {
        error(
            StatusCode::NOT_FOUND,
            format!("no session for client id {client_id:?}"),
        )
    }
}

/// `GET /api/v1/retained?prefix=&after=&limit=`: retained messages by topic, a page at a
/// time; `next` is the `after` of the following page (`null`: this was the last).
async fn retained(State(state): State<AdminState>, Query(params): Params) -> Response {
    let result = known(&params, &["prefix", "after", "limit"]).and_then(|()| limit(&params));
    let limit = match result {
        Ok(n) => n,
        Err(bad) => return bad.into_response(),
    };
    let prefix = params.get("prefix").map_or("", String::as_str);
    if topic::has_wildcards(prefix) {
        return error(
            StatusCode::BAD_REQUEST,
            "prefix is the start of a topic name: no + or #",
        );
    }
    let after = params.get("after").map(String::as_str);
    let (retained, more) = state.broker.retained_page(prefix, after, limit);
    let next = more
        .then(|| retained.last().map(|r| r.topic.clone()))
        .flatten();
    #[derive(Serialize)]
    struct Page {
        retained: Vec<crate::broker::admin::RetainedView>,
        next: Option<String>,
    }
    Json(Page { retained, next }).into_response()
}

/// `GET /api/v1/subscriptions?filter=&topic=&limit=`: subscriptions whose filter is `filter`
/// (exactly, shared ones as `$share/{group}/...`) and/or that match the topic name `topic`.
async fn subscriptions(State(state): State<AdminState>, Query(params): Params) -> Response {
    let result = known(&params, &["filter", "topic", "limit"]).and_then(|()| limit(&params));
    let limit = match result {
        Ok(n) => n,
        Err(bad) => return bad.into_response(),
    };
    let filter = params.get("filter").map(String::as_str);
    if let Some(f) = filter {
        let plain = match topic::split_shared(f) {
            Some(Ok((_, plain))) => plain,
            Some(Err(())) => "",
            None => f,
        };
        if plain.is_empty() || !topic::is_valid_filter(plain) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{f:?} is not a valid topic filter"),
            );
        }
    }
    let topic_name = params.get("topic").map(String::as_str);
    if let Some(t) = topic_name {
        if t.is_empty() || topic::has_wildcards(t) {
            return error(
                StatusCode::BAD_REQUEST,
                format!("{t:?} is not a topic name (no + or #)"),
            );
        }
    }
    let (subscriptions, truncated) = state
        .broker
        .subscriptions_matching(filter, topic_name, limit);
    #[derive(Serialize)]
    struct List {
        subscriptions: Vec<crate::broker::admin::SubscriberView>,
        truncated: bool,
    }
    Json(List {
        subscriptions,
        truncated,
    })
    .into_response()
}
