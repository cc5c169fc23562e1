//! `[[listener]]` (and `[metrics] bind` against them): the sockets the broker opens, and the rules that keep them
//! apart.
//!
//! The broker serves any number of MQTT listeners (`[[listener]]` entries, in file order); the
//! older single `[listener]` table is read as a one-entry list, so existing files keep working.
//! Every listener has a unique name — logs say which listener a connection came through, and
//! later layers (TLS, per-listener auth) will refer to listeners by it. Clashing ports are
//! caught here, as a config error naming both keys, rather than as a bind failure at start.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::MetricsConfig;

/// Longest listener name accepted.
pub const MAX_LISTENER_NAME_LEN: usize = 64;

/// One MQTT listener: where clients connect and how many may.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    /// Unique name (ASCII letters, digits, `-`, `_`, `.`); when absent, see
    /// [`ListenerConfig::effective_name`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Address and port to accept MQTT connections on (default `127.0.0.1:1883`: loopback only).
    pub bind: SocketAddr,
    /// Upper bound on clients connected at once through this listener (CONNECT accepted);
    /// 0 = unlimited. Connections still in their handshake do not count: they have slots of
    /// their own ([`ListenerConfig::max_pending_connections`]), so sockets that never send a
    /// CONNECT cannot hold the slots finished clients need.
    pub max_connections: usize,
    /// Upper bound on clients connected at once through this listener from one source
    /// address (IPv4 address; IPv6 /64 prefix; the client a PROXY header names), so one host
    /// cannot take all of [`ListenerConfig::max_connections`]. 0 = unlimited (the default:
    /// whole fleets connect from behind one NAT address).
    pub max_connections_per_ip: usize,
    /// Upper bound on connections of this listener whose handshake waits for the client (its
    /// CONNECT not complete in what arrived, or an AUTH answer due); one that would be beyond
    /// it is closed at once. 0 = unlimited.
    pub max_pending_connections: usize,
    /// The same bound per source address (IPv4 address; IPv6 /64 prefix), so one host cannot
    /// take all of [`ListenerConfig::max_pending_connections`]. 0 = unlimited.
    pub max_pending_connections_per_ip: usize,
    /// Expect a PROXY protocol (v1 or v2) header first on every connection, from a load
    /// balancer: its client address replaces the socket's peer in logs, limits and ACLs. A
    /// connection without one is closed. Only for listeners nothing else can reach.
    pub proxy_protocol: bool,
    /// Whether clients without a user name may connect through this listener; when absent,
    /// `auth.allow_anonymous` decides (e.g. anonymous on a localhost listener only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_anonymous: Option<bool>,
    /// Use the user name as the client id, whatever CONNECT said (Mosquitto's
    /// `use_username_as_clientid`): one session per user, so no device can take another's
    /// client id. A client without a user name is refused (0x87, 3.x: 5). With
    /// `tls.use_identity_as_username`, the certificate's identity becomes the client id.
    pub use_username_as_clientid: bool,
    /// What the listener speaks: plain MQTT over TCP (the default), MQTT over TLS, or MQTT
    /// inside WebSocket frames.
    pub kind: ListenerKind,
    /// Certificates of a `tls` listener (`[listener.tls]`); required for that kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// The HTTP upgrade rules of a `ws` listener (`[listener.websocket]`); ignored by others.
    pub websocket: WebSocketConfig,
}

/// The protocol a listener speaks on its socket; one enum so every kind is chosen by the same
/// `kind` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// MQTT straight over TCP (port 1883 by convention).
    #[default]
    Tcp,
    /// MQTT over TLS 1.2/1.3 (port 8883 by convention), optionally with client certificates.
    Tls,
    /// MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6; port 9001 or 8080 by convention), for
    /// browsers and networks that only pass HTTP.
    Ws,
    /// MQTT over WebSocket over TLS (port 443 or 8084 by convention).
    Wss,
}

impl ListenerKind {
    /// The kind as the config spells it (`tcp`, `tls`, `ws`, `wss`), for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerKind::Tcp => "tcp",
            ListenerKind::Tls => "tls",
            ListenerKind::Ws => "ws",
            ListenerKind::Wss => "wss",
        }
    }
}

/// Whether a TLS listener asks clients for a certificate (Mosquitto's `require_certificate`,
/// with the third state it lacks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientCertMode {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A client may present one (then it must chain to `client_ca`) or none.
    Optional,
    /// A client without a certificate that chains to `client_ca` fails the TLS handshake.
    Required,
}

/// Which part of a verified client certificate names the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsIdentity {
    /// The subject's Common Name (Mosquitto's `use_identity_as_username`).
    #[default]
    Cn,
    /// The first DNS name of the Subject Alternative Name extension.
    SanDns,
    /// The first e-mail address (rfc822Name) of the Subject Alternative Name extension.
    SanEmail,
    /// No identity is taken from the certificate.
    None,
}

/// `[listener.tls]`: the files of a TLS listener. Relative paths are read from the config
/// file's directory (`config::paths`); all are re-read on SIGHUP and when their modification
/// time changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// The server's certificate chain (PEM), leaf first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// CA certificates (PEM bundle) client certificates must chain to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
    /// Whether clients are asked for a certificate.
    pub client_cert: ClientCertMode,
    /// Certificate revocation list(s) (PEM) checked against client certificates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crl: Option<PathBuf>,
    /// Which certificate field is the client's identity.
    pub identity: TlsIdentity,
    /// Use the identity as the MQTT user name, ignoring the one in CONNECT (Mosquitto's
    /// `use_identity_as_username`); a client without a certificate is then refused.
    pub use_identity_as_username: bool,
}

/// `[listener.websocket]`: which HTTP upgrade requests a `ws` listener accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebSocketConfig {
    /// The request path the upgrade must name (`/mqtt`, as EMQX, `HiveMQ` and `MQTT.js` default
    /// to); any other path gets HTTP 404. `/` is accepted only when configured, so a
    /// misdirected web client is not silently served.
    pub path: String,
    /// `Origin` values a browser request may carry; empty = any. A request whose `Origin` is
    /// not listed gets HTTP 403 (requests without `Origin`, from non-browser clients, pass).
    pub allowed_origins: Vec<String>,
}

/// Default of [`WebSocketConfig::path`].
pub const DEFAULT_WEBSOCKET_PATH: &str = "/mqtt";

impl Default for WebSocketConfig {
    fn default() -> Self {
        WebSocketConfig {
            path: DEFAULT_WEBSOCKET_PATH.to_owned(),
            allowed_origins: Vec::new(),
        }
    }
}

/// Default of [`ListenerConfig::max_pending_connections`]: a real client's handshake does not
/// wait (the kernel hands the connection over once its CONNECT is in), so this only bounds
/// silent and slow ones: room for plenty of slow links, far below what would pin much memory
/// (each may hold a partial CONNECT until `mqtt.connect_timeout`).
pub const DEFAULT_MAX_PENDING_CONNECTIONS: usize = 1024;

/// Default of [`ListenerConfig::max_pending_connections_per_ip`]: a host (or a NAT gateway)
/// has 64 handshakes in flight at once before it is turned away, so sixteen hosts are needed
/// to fill [`DEFAULT_MAX_PENDING_CONNECTIONS`].
pub const DEFAULT_MAX_PENDING_CONNECTIONS_PER_IP: usize = 64;

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            name: None,
            bind: SocketAddr::from(([127, 0, 0, 1], 1883)),
            max_connections: 0,
            max_connections_per_ip: 0,
            max_pending_connections: DEFAULT_MAX_PENDING_CONNECTIONS,
            max_pending_connections_per_ip: DEFAULT_MAX_PENDING_CONNECTIONS_PER_IP,
            proxy_protocol: false,
            allow_anonymous: None,
            use_username_as_clientid: false,
            kind: ListenerKind::Tcp,
            tls: None,
            websocket: WebSocketConfig::default(),
        }
    }
}

impl ListenerConfig {
    /// Whether only a client certificate gets in here: `tls.use_identity_as_username` takes
    /// the user name from it, ignores CONNECT credentials and refuses a client without one,
    /// whatever `allow_anonymous` says (what the start-up lines and the admin API report).
    pub fn certificate_only(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|tls| tls.use_identity_as_username)
    }

    /// The name the listener at position `index` goes by: its `name`, else its kind (`tcp`,
    /// `tls`, `ws`, `wss`) for the first listener and `<kind>-<port>` for the others (so one
    /// unnamed listener per port needs no thought, and a second one on an ephemeral port must
    /// be named). By kind, so logs and metrics do not call a TLS listener `tcp-8883` (issue
    /// 37); plain TCP listeners keep the names they always had.
    pub fn effective_name(&self, index: usize) -> String {
        let kind = self.kind.as_str();
        match &self.name {
            Some(name) => name.clone(),
            None if index == 0 => kind.to_owned(),
            None => format!("{kind}-{}", self.bind.port()),
        }
    }
}

/// The default list: one listener on `127.0.0.1:1883` (loopback only, as Mosquitto 2 without
/// a config: nothing is reachable from the network until the operator says so).
pub(super) fn default_listeners() -> Vec<ListenerConfig> {
    vec![ListenerConfig::default()]
}

/// Reads `listener` as either one table (`[listener]`, the original form) or an array of
/// tables (`[[listener]]`).
///
/// A hand-written visitor rather than `#[serde(untagged)]`: untagged buffers the value and
/// loses the path, so an error inside the second entry could not be reported as
/// `listener[1].bind` with its line.
pub(super) fn one_or_many<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ListenerConfig>, D::Error> {
    struct OneOrMany;

    impl<'de> Visitor<'de> for OneOrMany {
        type Value = Vec<ListenerConfig>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table or an array of tables")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            ListenerConfig::deserialize(de::value::MapAccessDeserializer::new(map))
                .map(|listener| vec![listener])
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut listeners = Vec::with_capacity(seq.size_hint().unwrap_or(1));
            while let Some(listener) = seq.next_element()? {
                listeners.push(listener);
            }
            Ok(listeners)
        }
    }

    deserializer.deserialize_any(OneOrMany)
}

/// At least one listener, valid unique names, no two sockets on one port. Keys of entries are
/// spelled `listener[i]` ([`ConfigError::locate`] respells them for a one-table file).
pub(super) fn validate(
    listeners: &[ListenerConfig],
    metrics: &MetricsConfig,
) -> Result<(), ConfigError> {
    if listeners.is_empty() {
        return Err(invalid(
            "listener",
            "at least one listener is needed (a `[[listener]]` entry with a `bind` address)"
                .to_owned(),
        ));
    }
    let names: Vec<String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| l.effective_name(i))
        .collect();
    for (i, listener) in listeners.iter().enumerate() {
        if let Some(name) = &listener.name {
            check_name(name).map_err(|message| invalid(&format!("listener[{i}].name"), message))?;
        }
        check_kind(i, listener)?;
        check_connection_limits(i, listener)?;
        for j in 0..i {
            if names[j] == names[i] {
                return Err(match &listener.name {
                    Some(name) => invalid(
                        &format!("listener[{i}].name"),
                        format!(
                            "`{name}` is already the name of listener[{j}]; \
                             every listener needs its own name"
                        ),
                    ),
                    None => invalid(
                        &format!("listener[{i}]"),
                        format!(
                            "has no `name`, and its default name `{}` is already the name of \
                             listener[{j}]; give it a `name`",
                            names[i]
                        ),
                    ),
                });
            }
            if addresses_clash(listener.bind, listeners[j].bind) {
                return Err(invalid(
                    &format!("listener[{i}].bind"),
                    format!(
                        "{} clashes with listener `{}` (listener[{j}].bind = {}); \
                         each listener needs its own port",
                        listener.bind, names[j], listeners[j].bind
                    ),
                ));
            }
        }
    }
    if metrics.enabled {
        for (i, listener) in listeners.iter().enumerate() {
            if addresses_clash(metrics.bind, listener.bind) {
                return Err(invalid(
                    "metrics.bind",
                    format!(
                        "{} clashes with MQTT listener `{}` (listener[{i}].bind = {}); \
                         use another port",
                        metrics.bind, names[i], listener.bind
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A per-address bound above the listener's own can never be reached: most likely the two
/// keys were swapped, or one was meant per address and the other per listener.
fn check_connection_limits(i: usize, listener: &ListenerConfig) -> Result<(), ConfigError> {
    let (max, per_ip) = (listener.max_connections, listener.max_connections_per_ip);
    if max > 0 && per_ip > max {
        return Err(invalid(
            &format!("listener[{i}].max_connections_per_ip"),
            format!(
                "{per_ip} is above the listener's max_connections ({max}), so it would never \
                 apply; lower it, or raise max_connections"
            ),
        ));
    }
    Ok(())
}

/// The `kind` is one this build serves, and a `tls` listener has its files.
fn check_kind(i: usize, listener: &ListenerConfig) -> Result<(), ConfigError> {
    match listener.kind {
        ListenerKind::Tcp => Ok(()),
        ListenerKind::Ws => {
            if !listener.websocket.path.starts_with('/') {
                return Err(invalid(
                    &format!("listener[{i}].websocket.path"),
                    format!("must start with `/`, got {:?}", listener.websocket.path),
                ));
            }
            Ok(())
        }
        ListenerKind::Tls | ListenerKind::Wss => {
            if listener.kind == ListenerKind::Wss && !listener.websocket.path.starts_with('/') {
                return Err(invalid(
                    &format!("listener[{i}].websocket.path"),
                    format!("must start with `/`, got {:?}", listener.websocket.path),
                ));
            }
            let Some(tls) = &listener.tls else {
                return Err(invalid(
                    &format!("listener[{i}].kind"),
                    "a `tls` or `wss` listener needs a `[listener.tls]` table with `cert` and `key`"
                        .to_owned(),
                ));
            };
            for (key, value) in [("cert", &tls.cert), ("key", &tls.key)] {
                if value.is_none() {
                    return Err(invalid(
                        &format!("listener[{i}].tls"),
                        format!("a `tls` listener needs `tls.{key}` (a PEM file)"),
                    ));
                }
            }
            if tls.client_cert != ClientCertMode::None && tls.client_ca.is_none() {
                return Err(invalid(
                    &format!("listener[{i}].tls.client_cert"),
                    "asking for client certificates needs `tls.client_ca` (a PEM CA bundle)"
                        .to_owned(),
                ));
            }
            if tls.use_identity_as_username && tls.client_cert == ClientCertMode::None {
                return Err(invalid(
                    &format!("listener[{i}].tls.use_identity_as_username"),
                    "needs `client_cert = \"optional\"` or `\"required\"`".to_owned(),
                ));
            }
            if tls.use_identity_as_username && tls.identity == TlsIdentity::None {
                return Err(invalid(
                    &format!("listener[{i}].tls.use_identity_as_username"),
                    "needs an `identity` other than `none`".to_owned(),
                ));
            }
            Ok(())
        }
    }
}

/// Names end up in logs and, later, metric labels and auth rules: keep them plain.
fn check_name(name: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > MAX_LISTENER_NAME_LEN || !name.chars().all(plain) {
        return Err(format!(
            "must be 1 to {MAX_LISTENER_NAME_LEN} ASCII letters, digits, `-`, `_` or `.`, \
             got {name:?}"
        ));
    }
    Ok(())
}

/// True when two sockets would compete for the same port (port 0 = ephemeral never clashes).
pub(super) fn addresses_clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config_file, invalid_at, invalid_with, parse, refusal};
    use super::super::{Config, ConfigError, Overrides};
    use super::*;

    #[test]
    fn tls_kind_rules_name_their_key() {
        invalid_with(
            "[[listener]]\nkind = \"wss\"\n",
            "listener[0].kind",
            Some(2),
            &["[listener.tls]"],
        );
        let (key, _, msg) = invalid_at("[[listener]]\nkind = \"tls\"\n");
        assert_eq!(key, "listener[0].kind", "{msg}");
        let (key, line, _) = invalid_at(
            "[[listener]]\nkind = \"tls\"\n[listener.tls]\ncert = \"c\"\nkey = \"k\"\nclient_cert = \"required\"\n",
        );
        assert_eq!(
            (key.as_str(), line),
            ("listener[0].tls.client_cert", Some(6))
        );
        let c = parse("[[listener]]\nkind = \"tls\"\n[listener.tls]\ncert = \"c\"\nkey = \"k\"\n")
            .expect("parses");
        assert_eq!(c.listeners[0].kind, ListenerKind::Tls);
        assert_eq!(
            parse("").expect("default").listeners[0].kind,
            ListenerKind::Tcp
        );
    }

    #[test]
    fn listener_array_parses_in_order_with_default_names() {
        let c = parse(
            "[[listener]]\nname = \"inside\"\nbind = \"127.0.0.1:1883\"\n\n\
             [[listener]]\nbind = \"0.0.0.0:8883\"\nmax_connections = 5\n\n\
             [[listener]]\nbind = \"[::1]:1884\"\n",
        )
        .expect("parses");
        assert_eq!(c.listeners.len(), 3);
        assert_eq!(c.listeners[1].max_connections, 5);
        assert_eq!(
            c.listeners[1].max_pending_connections,
            DEFAULT_MAX_PENDING_CONNECTIONS
        );
        assert_eq!(c.listener_names(), ["inside", "tcp-8883", "tcp-1884"]);
        assert_eq!(Config::default().listener_names(), ["tcp"]);
        // Unnamed listeners of other kinds go by their kind, not `tcp` (issue 37).
        let kinds = parse(
            "[[listener]]\nbind = \"127.0.0.1:9001\"\nkind = \"ws\"\n\n\
             [[listener]]\nbind = \"127.0.0.1:1883\"\n\n\
             [[listener]]\nbind = \"127.0.0.1:9002\"\nkind = \"ws\"\n",
        )
        .expect("parses");
        assert_eq!(kinds.listener_names(), ["ws", "tcp-1883", "ws-9002"]);
        let unlimited = parse(
            "[[listener]]\nbind = \"127.0.0.1:1883\"\nmax_pending_connections = 0\n\
             max_pending_connections_per_ip = 3\n",
        )
        .expect("0 = unlimited");
        assert_eq!(unlimited.listeners[0].max_pending_connections, 0);
        assert_eq!(unlimited.listeners[0].max_pending_connections_per_ip, 3);
        assert_eq!(
            unlimited.listeners[0].max_connections_per_ip, 0,
            "default: unlimited"
        );
    }

    #[test]
    fn connection_limits_parse_and_a_per_address_bound_above_the_listeners_is_an_error() {
        let c = parse(
            "[[listener]]\nbind = \"127.0.0.1:1883\"\nmax_connections = 100\n\
             max_connections_per_ip = 10\n",
        )
        .expect("parses");
        assert_eq!(c.listeners[0].max_connections_per_ip, 10);
        let unbounded_listener =
            parse("[[listener]]\nbind = \"127.0.0.1:1883\"\nmax_connections_per_ip = 10\n")
                .expect("a per-address bound alone is fine");
        assert_eq!(unbounded_listener.listeners[0].max_connections, 0);
        invalid_with(
            "[[listener]]\nbind = \"127.0.0.1:1883\"\nmax_connections = 5\n\
             max_connections_per_ip = 6\n",
            "listener[0].max_connections_per_ip",
            Some(4),
            &["max_connections (5)"],
        );
        let msg = refusal("[[listener]]\nmax_connections_per_ip = -1\n");
        assert!(msg.contains("listener[0].max_connections_per_ip"), "{msg}");
    }

    #[test]
    fn proxy_protocol_is_allowed_on_every_kind() {
        for kind in ["tcp", "ws", "tls", "wss"] {
            let c = parse(&format!(
                "[[listener]]\nkind = \"{kind}\"\nproxy_protocol = true\n\
                 [listener.tls]\ncert = \"c\"\nkey = \"k\"\n"
            ))
            .expect("parses");
            assert!(c.listeners[0].proxy_protocol, "{kind}");
        }
    }

    #[test]
    fn single_table_is_one_listener() {
        let c = parse("[listener]\nbind = \"127.0.0.1:1884\"\nname = \"lan\"\n").expect("parses");
        assert_eq!(c.listeners.len(), 1);
        assert_eq!(c.listener_names(), ["lan"]);
        // Serialized back as an array of tables, which reads back the same.
        let text = toml::to_string(&c).expect("serializes");
        assert!(text.contains("[[listener]]"), "{text}");
        assert_eq!(parse(&text).expect("reparses"), c);
    }

    #[test]
    fn parse_error_in_second_listener_names_it() {
        let text = "[[listener]]\nbind = \"127.0.0.1:1883\"\n\n[[listener]]\nname = \"b\"\n\
                    bind = \"nowhere\"\n";
        let err = parse(text).expect_err("bad address");
        match &err {
            ConfigError::Parse { line, key, .. } => {
                assert_eq!(key.as_deref(), Some("listener[1].bind"));
                assert_eq!(*line, 6);
            }
            other => panic!("expected Parse, got {other:?}"),
        }
        assert!(err.to_string().starts_with("test.toml:6:"), "{err}");

        let text = "[[listener]]\nbind = \"127.0.0.1:1883\"\n[[listener]]\nbnid = \"x\"\n";
        let msg = parse(text).expect_err("unknown key").to_string();
        assert!(msg.starts_with("test.toml:4:"), "{msg}");
        assert!(msg.contains("listener[1].bnid"), "{msg}");
    }

    #[test]
    fn duplicate_name_names_file_line_and_key() {
        let text = "[[listener]]\nname = \"mqtt\"\nbind = \"127.0.0.1:1883\"\n\n\
                    [[listener]]\nbind = \"127.0.0.1:1884\"\nname = \"mqtt\"\n";
        invalid_with(text, "listener[1].name", Some(7), &["listener[0]"]);
        let msg = parse(text).expect_err("dup").to_string();
        assert!(
            msg.starts_with("test.toml:7: invalid value for key `listener[1].name`"),
            "{msg}"
        );
    }

    #[test]
    fn duplicate_default_name_asks_for_a_name() {
        let text = "[[listener]]\nbind = \"127.0.0.1:0\"\n[[listener]]\nbind = \"127.0.0.1:0\"\n\
                    [[listener]]\nbind = \"127.0.0.1:0\"\n";
        invalid_with(text, "listener[2]", Some(5), &["`tcp-0`", "listener[1]"]);
    }

    #[test]
    fn duplicate_bind_names_both_listeners() {
        let text = "[[listener]]\nname = \"a\"\nbind = \"0.0.0.0:1883\"\n\
                    [[listener]]\nname = \"b\"\nbind = \"127.0.0.1:1883\"\n";
        invalid_with(
            text,
            "listener[1].bind",
            Some(6),
            &["`a`", "listener[0].bind"],
        );
        // Different ports, or ephemeral ports, are fine.
        parse("[[listener]]\nbind = \"127.0.0.1:0\"\n[[listener]]\nname = \"b\"\nbind = \"127.0.0.1:0\"\n")
            .expect("ephemeral ports never clash");
    }

    #[test]
    fn metrics_clash_names_the_listener() {
        let text = "[[listener]]\nbind = \"127.0.0.1:1883\"\n[[listener]]\nname = \"b\"\n\
                    bind = \"127.0.0.1:9883\"\n";
        let (key, _, message) = invalid_at(text);
        assert_eq!(key, "metrics.bind");
        assert!(
            message.contains("`b`") && message.contains("listener[1].bind"),
            "{message}"
        );
        // The one-table form is named as written; metrics.bind is not in the text: no line.
        invalid_with(
            "\n[listener]\nbind = \"127.0.0.1:9883\"\n",
            "metrics.bind",
            None,
            &["(listener.bind = "],
        );
    }

    #[test]
    fn websocket_kind_and_table() {
        let c = parse(
            "[[listener]]\nbind = \"127.0.0.1:9001\"\nkind = \"ws\"\n\
             [listener.websocket]\nallowed_origins = [\"https://a.example\"]\n",
        )
        .expect("parses");
        assert_eq!(c.listeners[0].kind, ListenerKind::Ws);
        assert_eq!(c.listeners[0].websocket.path, DEFAULT_WEBSOCKET_PATH);
        assert_eq!(
            c.listeners[0].websocket.allowed_origins,
            ["https://a.example"]
        );
        assert_eq!(Config::default().listeners[0].kind, ListenerKind::Tcp);
        // `wss` is TLS with the upgrade on top: it needs the TLS files.
        invalid_with(
            "[listener]\nkind = \"wss\"\n",
            "listener.kind",
            Some(2),
            &["[listener.tls]"],
        );
        let (key, _, _) =
            invalid_at("[listener]\nkind = \"ws\"\n[listener.websocket]\npath = \"mqtt\"\n");
        assert_eq!(key, "listener.websocket.path");
    }

    #[test]
    fn listener_rules() {
        let (key, line, _) = invalid_at("listener = []\n");
        assert_eq!((key.as_str(), line), ("listener", Some(1)));
        let (key, line, _) = invalid_at("[[listener]]\nname = \"a b\"\n");
        assert_eq!((key.as_str(), line), ("listener[0].name", Some(2)));
        let (key, _, _) = invalid_at("[listener]\nname = \"\"\n");
        assert_eq!(key, "listener.name");
        let long = "x".repeat(MAX_LISTENER_NAME_LEN + 1);
        invalid_at(&format!("[listener]\nname = \"{long}\"\n"));
        parse(&format!("[listener]\nname = \"{}\"\n", "a-B_9.".repeat(10)))
            .expect("plain name of 60 characters");
    }

    #[test]
    fn overrides_are_validated_and_named() {
        let clash = Overrides {
            port: Some(9000),
            metrics_port: Some(9000),
            ..Overrides::default()
        };
        let err = Config::load_with(None, &clash).expect_err("same port twice");
        let msg = err.to_string();
        // Both keys and both flags are named.
        for part in [
            "metrics.bind",
            "listener[0].bind",
            "`-p 9000`",
            "`--metrics-port 9000`",
        ] {
            assert!(msg.contains(part), "{msg}");
        }

        let ok = Overrides {
            port: Some(9000),
            metrics_port: Some(0),
            data_dir: Some("/tmp/x".into()),
            ..Overrides::default()
        };
        let c = Config::load_with(None, &ok).expect("metrics off");
        assert_eq!(c.listeners[0].bind.port(), 9000);
        assert!(!c.metrics.enabled);
        assert_eq!(
            c.storage.persistence_dir(),
            Some(std::path::Path::new("/tmp/x"))
        );
        let c = Config::load_with(
            None,
            &Overrides {
                metrics_port: Some(9001),
                ..Overrides::default()
            },
        )
        .expect("metrics moved");
        assert_eq!(c.metrics.bind.port(), 9001);
        assert_eq!(c.listeners[0].bind.port(), 1883);
    }

    #[test]
    fn port_override_is_only_the_first_listener_and_checked_against_the_others() {
        let (_dir, path) = config_file(
            "two.toml",
            "[[listener]]\nbind = \"127.0.0.1:1883\"\n[[listener]]\nname = \"b\"\nbind = \"127.0.0.1:1884\"\n",
        );
        let port = |p| Overrides {
            port: Some(p),
            ..Overrides::default()
        };
        let c = Config::load_with(Some(&path), &port(2000)).expect("loads");
        assert_eq!(c.listeners[0].bind.port(), 2000);
        assert_eq!(c.listeners[1].bind.port(), 1884);
        let msg = Config::load_with(Some(&path), &port(1884))
            .expect_err("clash with the second")
            .to_string();
        assert!(msg.contains(&format!("{}:5:", path.display())), "{msg}");
        assert!(
            msg.contains("listener[1].bind") && msg.contains("`-p 1884`"),
            "{msg}"
        );
    }
}
