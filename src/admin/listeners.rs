//! `GET /api/v1/listeners`: every MQTT listener (`[[listener]]`, in config order) with its
//! address, kind, who it admits and the clients connected through it now; the status page's
//! Listeners table (issue 37, item 5: the listeners appeared nowhere on it).
//!
//! What a listener is does not change while the broker runs: it is described once at start
//! ([`ListenerInfo`], from the config and the bound address) and only the connected count is
//! read per request (`Broker::connected_on`, one lock, the same records `GET /api/v1/clients`
//! lists). The description names no file (certificates, password files): only what a client
//! on the network learns by connecting anyway.

use std::net::SocketAddr;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::AdminState;
use crate::config::{ClientCertMode, ListenerConfig};

pub(super) fn routes() -> Router<AdminState> {
    Router::new().route("/api/v1/listeners", get(listeners))
}

/// One MQTT listener as operators see it, fixed at start.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ListenerInfo {
    /// `[[listener]] name` (or its default).
    name: String,
    /// The address it accepts on (port 0 resolved).
    address: String,
    /// `tcp`, `tls`, `ws` or `wss`.
    kind: &'static str,
    /// Who may connect, in words: what the listener asks of a client (credentials, none,
    /// a client certificate).
    admits: String,
    /// Whether anyone without credentials may connect (`allow_anonymous`, or no
    /// authentication method at all).
    anonymous: bool,
    /// `none`, `optional` or `required` for TLS kinds (`null` for plain ones).
    client_certificates: Option<&'static str>,
    /// True when it listens on loopback only (this machine), false when the network reaches it.
    loopback_only: bool,
    /// Expects a PROXY protocol header first (behind a load balancer).
    proxy_protocol: bool,
    /// `max_connections` (0: unlimited).
    max_connections: usize,
}

impl ListenerInfo {
    /// The listener `config` bound at `address`; `admits` is the start-up line's phrase of
    /// what it asks of its clients, `anonymous` whether it lets in clients without any.
    pub(crate) fn new(
        name: &str,
        address: SocketAddr,
        config: &ListenerConfig,
        admits: &str,
        anonymous: bool,
    ) -> ListenerInfo {
        let client_certificates = config.tls.as_ref().map(|tls| match tls.client_cert {
            ClientCertMode::None => "none",
            ClientCertMode::Optional => "optional",
            ClientCertMode::Required => "required",
        });
        let admits = match client_certificates {
            Some("required") => format!("{admits}; a client certificate is required"),
            Some("optional") => format!("{admits}; a client certificate is checked if sent"),
            _ => admits.to_owned(),
        };
        ListenerInfo {
            name: name.to_owned(),
            address: address.to_string(),
            kind: config.kind.as_str(),
            admits,
            anonymous,
            client_certificates,
            loopback_only: address.ip().is_loopback(),
            proxy_protocol: config.proxy_protocol,
            max_connections: config.max_connections,
        }
    }
}

/// One listener with its clients now (`GET /api/v1/listeners`).
#[derive(Serialize)]
struct ListenerView<'a> {
    #[serde(flatten)]
    info: &'a ListenerInfo,
    /// Clients connected through it now.
    clients_connected: usize,
}

/// `GET /api/v1/listeners`: every listener, in config order. Not paged (one entry per
/// configured listener); takes no parameters.
async fn listeners(State(state): State<AdminState>, _: super::api::NoParameters) -> Response {
    #[derive(Serialize)]
    struct List<'a> {
        listeners: Vec<ListenerView<'a>>,
    }
    let listeners = state
        .listeners
        .iter()
        .map(|info| ListenerView {
            info,
            clients_connected: state.broker.connected_on(&info.name),
        })
        .collect();
    Json(List { listeners }).into_response()
}
