//! `[admin]`: who may use the admin API and the status page, and where they are served; and
//! `[metrics]`: the HTTP listener of `/metrics` and the probes, and the bounds on its
//! connections (which the `admin.bind` listener shares).
//!
//! Why a section of its own rather than keys of `[metrics]`: `/metrics` and the probes are
//! meant for Prometheus and Kubernetes on the network, while the API can kick clients and
//! delete sessions. The API's rules (its token, the Host names it answers, its own listener)
//! are therefore kept apart from the scrape endpoint's.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{invalid, seconds, ConfigError};
use super::listener::{addresses_clash, ListenerConfig};

/// The admin API (`/api/v1/...`) and status page (`/`), served on `[metrics] bind` or on their
/// own `bind`.
///
/// Peers on 127.0.0.1 or `::1` need no token unless `require_token_on_loopback` (whoever runs on
/// the host can read the broker's files anyway); any other peer must send
/// `Authorization: Bearer <token>` with the token `token_file` holds, so binding the listener
/// beyond loopback does not open the API to the network. Every API request must also name the
/// broker in its Host header (`allowed_hosts`), which closes the API to DNS rebinding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// A file whose content (surrounding whitespace trimmed) is the bearer token other than
    /// loopback peers must send. Unset: only loopback peers may use the API.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Ask loopback peers for the token too: on a host shared with other users or
    /// containers in its network namespace, loopback is not the broker's operator alone.
    pub require_token_on_loopback: bool,
    /// Host names (without port) API requests may name besides `localhost`, loopback
    /// addresses and the address the request arrived on: the names operators reach the broker
    /// by (`broker.example.internal`). A browser page whose name was rebound to the broker's
    /// address sends its own name and is refused (421).
    pub allowed_hosts: Vec<String>,
    /// Serve the API and the status page on this address instead of `[metrics] bind`, which
    /// then serves only `/metrics` and the probes: metrics on the network, the API on
    /// loopback. Unset: both on `[metrics] bind`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind: Option<SocketAddr>,
}

/// The Prometheus exporter: scraped over HTTP at `http://<bind>/metrics`; the probes, and the
/// admin API unless `admin.bind` gives it a listener of its own. The connection bounds apply
/// to both HTTP listeners together: `/metrics` is open without credentials by design, so they
/// are what keeps idle or slow HTTP connections from taking the file descriptors MQTT clients
/// need (issue 35, fifth pass, finding 3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve metrics at all; when false no port is opened and metric updates are no-ops.
    pub enabled: bool,
    /// Address and port of the metrics HTTP endpoint (default `127.0.0.1:9883`: loopback only).
    pub bind: SocketAddr,
    /// Seconds an HTTP connection may take to send a request's headers, counted from when
    /// the server starts waiting for them: after accept, and after each response (so it also
    /// bounds an idle keep-alive connection). Past it the connection is closed.
    pub header_timeout: u32,
    /// HTTP connections open at once over both HTTP listeners; one more is closed at once.
    /// 0 = unlimited.
    pub max_connections: usize,
    /// HTTP connections open at once from one source address (IPv4 address, IPv6 /64);
    /// one more is closed at once. 0 = unlimited.
    pub max_connections_per_ip: usize,
}

/// Default `metrics.header_timeout`: `mqtt.connect_timeout`'s default, the broker's other
/// bound on a peer that has not said what it wants yet.
pub(crate) const DEFAULT_HTTP_HEADER_TIMEOUT: u32 = 10;
/// Default `metrics.max_connections`: scrapers, probes and a few people with the status page
/// open need a handful; 128 leaves room for many and still caps what an idle flood can take.
pub(crate) const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 128;
/// Default `metrics.max_connections_per_ip`: a browser opens up to 6 connections to a host,
/// a scraper or kubelet one or two; 16 per address leaves room for all on one host.
pub(crate) const DEFAULT_HTTP_MAX_CONNECTIONS_PER_IP: usize = 16;

/// Longest `metrics.header_timeout` taken (an hour): beyond it the bound bounds nothing.
const MAX_HTTP_HEADER_TIMEOUT: u32 = 3600;

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            bind: SocketAddr::from(([127, 0, 0, 1], 9883)),
            header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_HTTP_MAX_CONNECTIONS_PER_IP,
        }
    }
}

/// `[metrics]`'s bounds: a header timeout of 1 s to an hour, a per-address bound not above
/// the overall one.
pub(super) fn validate_metrics(metrics: &MetricsConfig) -> Result<(), ConfigError> {
    let timeouts = 1..=MAX_HTTP_HEADER_TIMEOUT;
    seconds("metrics.header_timeout", metrics.header_timeout, timeouts)?;
    let (max, per_ip) = (metrics.max_connections, metrics.max_connections_per_ip);
    if max > 0 && per_ip > max {
        return Err(invalid(
            "metrics.max_connections_per_ip",
            format!(
                "{per_ip} is above metrics.max_connections ({max}), so it would never apply; \
                 lower it, or raise max_connections"
            ),
        ));
    }
    Ok(())
}

/// Longest name `admin.allowed_hosts` takes (a DNS name's limit).
const MAX_HOST_LEN: usize = 253;

/// The section's rules: a readable, non-empty token file; a token when loopback must send
/// one; host names without port or wildcard; an own `bind` that clashes with no listener.
pub(super) fn validate(
    admin: &AdminConfig,
    metrics: &MetricsConfig,
    listeners: &[ListenerConfig],
) -> Result<(), ConfigError> {
    if let Some(path) = &admin.token_file {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => {
                return Err(invalid(
                    "admin.token_file",
                    format!("{} is empty; put the bearer token in it", path.display()),
                ))
            }
            Ok(_) => {}
            Err(e) => {
                return Err(invalid(
                    "admin.token_file",
                    format!("cannot read {}: {e}", path.display()),
                ))
            }
        }
    } else if admin.require_token_on_loopback {
        return Err(invalid(
            "admin.require_token_on_loopback",
            "needs admin.token_file: without a token no request could use the API".to_owned(),
        ));
    }
    for host in &admin.allowed_hosts {
        check_host(host).map_err(|why| invalid("admin.allowed_hosts", why))?;
    }
    if let Some(bind) = admin.bind {
        if metrics.enabled && addresses_clash(bind, metrics.bind) {
            return Err(invalid(
                "admin.bind",
                format!(
                    "{bind} clashes with metrics.bind ({}); give the API its own port, or \
                     remove admin.bind to serve it there",
                    metrics.bind
                ),
            ));
        }
        for (i, listener) in listeners.iter().enumerate() {
            if addresses_clash(bind, listener.bind) {
                return Err(invalid(
                    "admin.bind",
                    format!(
                        "{bind} clashes with MQTT listener[{i}].bind ({}); use another port",
                        listener.bind
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A host name or IP address as a Host header names it, without port.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > MAX_HOST_LEN {
        return Err(format!(
            "{host:?}: a host name must be 1 to {MAX_HOST_LEN} bytes"
        ));
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    if host.contains(':') {
        return Err(format!(
            "{host:?}: list the name without a port (every port of an allowed name is accepted)"
        ));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return Err(format!(
            "{host:?}: a host name has letters, digits, `-`, `_` and `.` only (no wildcards)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    fn key_of(text: &str) -> String {
        match Config::from_toml_str(text, "t.toml") {
            Err(ConfigError::Invalid { key, line, .. }) => {
                assert!(line.is_some(), "{text}: no line");
                key
            }
            other => panic!("{text}: expected an invalid key, got {other:?}"),
        }
    }

    #[test]
    fn the_section_names_its_bad_keys_and_lines() {
        assert_eq!(
            key_of("[admin]\nrequire_token_on_loopback = true\n"),
            "admin.require_token_on_loopback"
        );
        for bad in ["\"*.example\"", "\"host:9883\"", "\"\"", "\"a b\""] {
            assert_eq!(
                key_of(&format!("[admin]\nallowed_hosts = [{bad}]\n")),
                "admin.allowed_hosts",
                "{bad}"
            );
        }
        assert_eq!(
            key_of("[metrics]\nbind = \"127.0.0.1:9883\"\n[admin]\nbind = \"0.0.0.0:9883\"\n"),
            "admin.bind"
        );
        assert_eq!(
            key_of("[admin]\nbind = \"127.0.0.1:1883\"\n"),
            "admin.bind",
            "the default listener's port"
        );
        let ok = Config::from_toml_str(
            "[admin]\nallowed_hosts = [\"broker.example\", \"10.0.0.5\", \"[fd00::1]\"]\n\
             bind = \"127.0.0.1:9884\"\n",
            "t.toml",
        )
        .expect("valid");
        assert_eq!(
            ok.admin.bind,
            Some(SocketAddr::from(([127, 0, 0, 1], 9884)))
        );
        assert!(!ok.admin.require_token_on_loopback);
    }
}
