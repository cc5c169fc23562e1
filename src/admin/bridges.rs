//! `GET /api/v1/bridges`: every `[[bridge]]` with its link state, counters and what its local
//! session holds for the remote; and the bridges' summary in the overview.
//!
//! The list is not paged: it has one entry per configured bridge (a handful), and each costs
//! one lock of its status and one of its local session (no queue walk, see
//! `Broker::held_for`).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::AdminState;
use crate::bridge::status::DROP_REASONS;
use crate::bridge::{BridgeStatus, Flow};

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/api/v1/bridges", get(bridges))
}

/// One count per direction.
#[derive(Clone, Debug, Serialize)]
struct ByDirection {
    out: u64,
    #[serde(rename = "in")]
    inbound: u64,
}

/// Drops in one direction: all, and by reason (the metric's `reason` label values).
#[derive(Clone, Debug, Serialize)]
struct Drops {
    total: u64,
    by_reason: BTreeMap<&'static str, u64>,
}

/// One bridge, as `GET /api/v1/bridges` lists it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct BridgeView {
    /// `[[bridge]] name`.
    name: String,
    /// True while the link to the remote is up.
    up: bool,
    /// The address connected to, while up.
    address: Option<String>,
    /// The configured addresses, in the order they are tried.
    addresses: Vec<String>,
    /// Why the link last failed or closed (kept after a reconnect: compare its time with
    /// `since_unix_ms` and `up` to tell whether the link recovered from it).
    last_error: Option<String>,
    /// When `last_error` happened, Unix ms (`null`: no error yet).
    last_error_at_unix_ms: Option<u64>,
    /// When the link last came up or went down, Unix ms (until then: the bridge's creation).
    since_unix_ms: u64,
    /// Successful connects after the first.
    reconnects: u64,
    /// Messages forwarded, by direction.
    forwarded: ByDirection,
    /// Messages not forwarded, by direction and reason.
    dropped: DropsByDirection,
    /// Messages the local session holds for the remote (queued or unacknowledged).
    queued_messages: usize,
    /// Their bytes (topic, payload, properties).
    queued_bytes: usize,
    /// Age of the oldest of them, seconds (`null`: none).
    oldest_queued_secs: Option<f64>,
    /// The client id of the bridge's local session (`GET /api/v1/sessions/{id}` shows it).
    local_session: String,
}

#[derive(Clone, Debug, Serialize)]
struct DropsByDirection {
    out: Drops,
    #[serde(rename = "in")]
    inbound: Drops,
}

fn drops(status: &BridgeStatus, flow: Flow) -> Drops {
    Drops {
        total: status.dropped_total(flow),
        by_reason: DROP_REASONS
            .iter()
            .map(|reason| (*reason, status.dropped_for(flow, reason)))
            .collect(),
    }
}

/// The view of one bridge, read now.
pub(super) fn view(status: &BridgeStatus) -> BridgeView {
    let held = status.held();
    let (last_error, last_error_at_unix_ms) = status.last_error_at().unzip();
    BridgeView {
        name: status.name().to_owned(),
        up: status.is_up(),
        address: status.address(),
        addresses: status.addresses().to_vec(),
        last_error,
        last_error_at_unix_ms,
        since_unix_ms: status.changed_at_unix_ms(),
        reconnects: status.reconnects(),
        forwarded: ByDirection {
            out: status.forwarded_total(Flow::Out),
            inbound: status.forwarded_total(Flow::In),
        },
        dropped: DropsByDirection {
            out: drops(status, Flow::Out),
            inbound: drops(status, Flow::In),
        },
        queued_messages: held.messages,
        queued_bytes: held.bytes,
        oldest_queued_secs: held.oldest.map(|age| age.as_secs_f64()),
        local_session: status.local_session().to_owned(),
    }
}

/// The overview's line about bridges.
#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct BridgesSummary {
    /// Bridges configured.
    configured: usize,
    /// Of those, links up now.
    up: usize,
    /// Messages held for remotes, all bridges.
    queued_messages: usize,
    /// Age of the oldest of them, seconds (`null`: none).
    oldest_queued_secs: Option<f64>,
}

/// The summary of every bridge, read now.
pub(super) fn summary(state: &AdminState) -> BridgesSummary {
    let mut summary = BridgesSummary {
        configured: state.bridges.len(),
        ..BridgesSummary::default()
    };
    for status in state.bridges.iter() {
        summary.up += usize::from(status.is_up());
        let held = status.held();
        summary.queued_messages += held.messages;
        if let Some(age) = held.oldest {
            let secs = age.as_secs_f64();
            summary.oldest_queued_secs =
                Some(summary.oldest_queued_secs.map_or(secs, |o| o.max(secs)));
        }
    }
    summary
}

/// `GET /api/v1/bridges`: every bridge, in config order. Takes no parameters.
async fn bridges(State(state): State<AdminState>, _: super::api::NoParameters) -> Response {
    #[derive(Serialize)]
    struct List {
        bridges: Vec<BridgeView>,
    }
    let bridges = state.bridges.iter().map(|s| view(s)).collect();
    Json(List { bridges }).into_response()
}
