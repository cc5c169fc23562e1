//! `[[bridge]]`: links from this broker to remote brokers (issue 15).
//!
//! One section per remote: where it is (`addresses`, tried in order with failover, or in turn
//! with `round_robin`), how to log in, TLS, reconnect backoff, when to connect (`start`), the
//! bound of the bridge's own durable queue and what happens when it is full, and the topic
//! rules in Mosquitto's grammar (`pattern`, `direction`, `qos`, `local_prefix`,
//! `remote_prefix`). The names follow Mosquitto's `connection` stanza where one exists, so
//! `postbox bridge import mosquitto.conf` is a mechanical translation.
//!
//! A little over 600 lines: the section's types and the rules that check them stay together
//! (each rule names the field it checks); the unit tests are in `bridge_tests.rs`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::mqtt::{OverflowPolicy, MAX_CLIENT_ID_LEN};
use crate::codec::topic;

/// The protocol the bridge speaks to its remote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BridgeProtocol {
    /// MQTT 3.1.1 (Mosquitto's `bridge_protocol_version mqttv311`): loop prevention through
    /// the bridge flag in the protocol level (`try_private`), no properties.
    #[serde(rename = "3.1.1")]
    V3_1_1,
    /// MQTT 5.0: No Local and Retain As Published on the remote subscriptions, properties
    /// passed through, the hop count.
    #[default]
    #[serde(rename = "5")]
    V5,
}

/// When a bridge connects (Mosquitto's `start_type`; `once` is not offered: a bridge that
/// gives up after one failure loses the guarantee).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartMode {
    /// Connect at start and reconnect whenever the link drops.
    #[default]
    Automatic,
    /// Connect once `threshold` messages are queued for the remote; disconnect after
    /// `idle_timeout` seconds with nothing to send (metered links).
    Lazy,
}

/// Which way a topic rule forwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Local messages to the remote (Mosquitto's default).
    #[default]
    Out,
    /// Remote messages into this broker.
    In,
    /// Both ways (loop prevention keeps a message from coming back).
    Both,
}

impl Direction {
    /// True if local messages matching the rule go to the remote.
    pub fn is_out(self) -> bool {
        matches!(self, Direction::Out | Direction::Both)
    }

    /// True if remote messages matching the rule come into this broker.
    pub fn is_in(self) -> bool {
        matches!(self, Direction::In | Direction::Both)
    }
}

/// One `[[bridge.topic]]` rule (Mosquitto: `topic pattern direction qos local_prefix
/// remote_prefix`). The local filter is `local_prefix + pattern`, the remote one
/// `remote_prefix + pattern`; a forwarded topic loses one prefix and gains the other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicRule {
    /// A topic filter (wildcards allowed), relative to the prefixes.
    pub pattern: String,
    /// Which way the rule forwards.
    #[serde(default)]
    pub direction: Direction,
    /// The QoS of the subscriptions the rule makes (local for `out`, remote for `in`); 0..=2.
    /// Default 1, not Mosquitto's 0: a bridge that may lose messages is the problem this one
    /// solves.
    #[serde(default = "default_rule_qos")]
    pub qos: u8,
    /// Prefix of the topic on this broker (stripped going out, added coming in).
    #[serde(default)]
    pub local_prefix: String,
    /// Prefix of the topic on the remote (added going out, stripped coming in).
    #[serde(default)]
    pub remote_prefix: String,
}

fn default_rule_qos() -> u8 {
    1
}

/// `[bridge.tls]`: TLS to the remote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgeTlsConfig {
    /// CA certificates (PEM) the remote's certificate must chain to (Mosquitto's
    /// `bridge_cafile`). Unset: the system's trust store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mTLS (`bridge_certfile`); needs `key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of `cert` (`bridge_keyfile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// The name sent as SNI and checked against the certificate; unset: the host of the
    /// address being connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// ALPN protocols offered (`bridge_alpn`), e.g. `["mqtt"]` or `["x-amzn-mqtt-ca"]`.
    pub alpn: Vec<String>,
    /// Accept any certificate (`bridge_insecure`). For tests only: it removes the protection
    /// TLS is there for, and the bridge logs a warning at every connect.
    pub insecure: bool,
}

/// One `[[bridge]]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgeConfig {
    /// Unique name: metric label, `$SYS/broker/connection/<name>/state`, the local session's
    /// client id `$bridge/<name>`, log field.
    pub name: String,
    /// `host:port` of the remote, tried in order (failover); at least one.
    pub addresses: Vec<String>,
    /// Use the addresses in turn at every connect, instead of always returning to the first.
    pub round_robin: bool,
    /// The protocol spoken to the remote.
    pub protocol: BridgeProtocol,
    /// Client id on the remote; unset: `postbox-bridge-<name>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// User name on the remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password on the remote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Keep-alive on the remote connection, seconds (`keepalive_interval`, default 60).
    pub keep_alive: u16,
    /// Ask the remote to discard the bridge's session at connect (`cleansession`). Default
    /// false: what the remote holds for the bridge survives an outage.
    pub clean_start: bool,
    /// v5: seconds the remote keeps the bridge's session after a disconnect (default one day).
    pub session_expiry: u32,
    /// Reconnect backoff `[base, cap]` in seconds (Mosquitto 2.1's `restart_timeout base
    /// cap`): the wait grows exponentially from `base` up to `cap`, with jitter.
    pub restart_timeout: [u32; 2],
    /// When to connect.
    pub start: StartMode,
    /// `lazy`: queued messages that make the bridge connect (Mosquitto's `threshold`).
    pub threshold: usize,
    /// `lazy`: seconds without traffic after which the bridge disconnects (`idle_timeout`).
    pub idle_timeout: u32,
    /// Most QoS 1/2 messages sent to the remote and not yet acknowledged (capped by the
    /// remote's Receive Maximum).
    pub inflight: u16,
    /// Most messages the bridge's queue holds while the remote cannot take them.
    pub max_queued_messages: usize,
    /// Whether the remote's messages count as a verified client's: `false` (the default),
    /// where a method tells identities apart here, they count in the anonymous share as an
    /// anonymous client's (their publishers were verified, if at all, by the remote), so
    /// a stranger on the remote can take no more of this broker than one here. `true` for a
    /// remote whose publishers you vouch for.
    pub trusted: bool,
    /// Most payload bytes the bridge's queue holds; 0 = no byte bound.
    pub max_queued_bytes: usize,
    /// What a full queue does: `refuse` (default: local QoS 1/2 publishers get 0x97 / a 3.x
    /// disconnect, so nothing acknowledged is lost), `drop-oldest` (freshest data wins,
    /// counted) or `drop-new`.
    pub queue_overflow: OverflowPolicy,
    /// Messages per second forwarded to the remote; 0 = no limit. Spreads a replay after an
    /// outage instead of flooding the remote.
    pub max_forward_rate: u32,
    /// Forward the RETAIN flag as published (Mosquitto keeps it too); false clears it.
    pub keep_retain: bool,
    /// 3.1.1: connect with the bridge flag (protocol level 0x84) so a Mosquitto or Postbox
    /// remote does not echo the bridge's own messages and keeps their RETAIN flag.
    pub try_private: bool,
    /// v5: messages that crossed this many bridges are not forwarded again (a loop between
    /// brokers dies out); the count travels as the `postbox-hops` user property.
    pub max_hops: u8,
    /// Publish the link state: `1`/`0` retained on `$SYS/broker/connection/<name>/state`
    /// locally, and on the remote (as the will, and at connect).
    pub notifications: bool,
    /// TLS to the remote; unset = plain TCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<BridgeTlsConfig>,
    /// The topic rules (`[[bridge.topic]]`); at least one.
    #[serde(rename = "topic")]
    pub topics: Vec<TopicRule>,
}

/// Prefix of the client ids of the bridges' local sessions; clients may not use it.
pub const BRIDGE_SESSION_PREFIX: &str = "$bridge/";

/// The user-property name carrying the hop count on v5.
pub const HOPS_PROPERTY: &str = "postbox-hops";

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            name: String::new(),
            addresses: Vec::new(),
            round_robin: false,
            protocol: BridgeProtocol::V5,
            client_id: None,
            username: None,
            password: None,
            keep_alive: 60,
            clean_start: false,
            session_expiry: 86_400,
            restart_timeout: [5, 30],
            start: StartMode::Automatic,
            threshold: 10,
            idle_timeout: 60,
            inflight: 100,
            max_queued_messages: 1_000_000,
            max_queued_bytes: 1 << 30,
            trusted: false,
            queue_overflow: OverflowPolicy::Refuse,
            max_forward_rate: 0,
            keep_retain: true,
            try_private: true,
            max_hops: 8,
            notifications: true,
            tls: None,
            topics: Vec::new(),
        }
    }
}

impl BridgeConfig {
    /// The client id this bridge uses on the remote.
    pub fn remote_client_id(&self) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| format!("postbox-bridge-{}", self.name))
    }

    /// The client id of the bridge's durable session on this broker.
    pub fn local_session_id(&self) -> String {
        format!("{BRIDGE_SESSION_PREFIX}{}", self.name)
    }
}

/// Longest bridge name, in bytes: it is a metric label, a topic level and part of a client id,
/// and a name longer than a line of a dashboard helps nobody.
pub const MAX_BRIDGE_NAME_LEN: usize = 64;

/// The shortest keep-alive other than 0 (Mosquitto's minimum for `keepalive_interval`).
pub const MIN_BRIDGE_KEEP_ALIVE: u16 = 5;

/// Checks every `[[bridge]]` section and that their names are unique; keys are spelled
/// `bridge[i].key` and `bridge[i].topic[j].key`, so [`ConfigError::locate`] finds the line.
pub(super) fn validate(bridges: &[BridgeConfig]) -> Result<(), ConfigError> {
    for (i, bridge) in bridges.iter().enumerate() {
        bridge.validate(i)?;
        if let Some(j) = bridges[..i].iter().position(|b| b.name == bridge.name) {
            return Err(invalid(
                &format!("bridge[{i}].name"),
                format!(
                    "`{}` is already the name of bridge[{j}]; every bridge needs its own name \
                     (it names its metrics, its state topic and its local session)",
                    bridge.name
                ),
            ));
        }
    }
    Ok(())
}

impl BridgeConfig {
    /// The rules of one section (`i` is its index, for the error keys): what the types cannot
    /// say, checked at load so a bridge never starts with a setting it would fail on later.
    ///
    /// # Errors
    ///
    /// The first rule broken, as `ConfigError::Invalid` keyed `bridge[i]...`.
    pub(super) fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("bridge[{i}].{k}");
        check_name(&self.name).map_err(|m| invalid(&key("name"), m))?;
        if self.addresses.is_empty() {
            return Err(invalid(
                &key("addresses"),
                "at least one `host:port` of the remote broker is needed".to_owned(),
            ));
        }
        for (k, address) in self.addresses.iter().enumerate() {
            check_address(address).map_err(|m| invalid(&key(&format!("addresses[{k}]")), m))?;
        }
        if let Some(id) = &self.client_id {
            check_client_id(id).map_err(|m| invalid(&key("client_id"), m))?;
        }
        if self.password.is_some()
            && self.username.is_none()
            && self.protocol == BridgeProtocol::V3_1_1
        {
            return Err(invalid(
                &key("password"),
                "MQTT 3.1.1 sends a password only with a user name [MQTT-3.1.2-22]; set \
                 `username` too (Mosquitto: remote_password needs remote_username)"
                    .to_owned(),
            ));
        }
        if self.keep_alive != 0 && self.keep_alive < MIN_BRIDGE_KEEP_ALIVE {
            return Err(invalid(
                &key("keep_alive"),
                format!(
                    "{} is below {MIN_BRIDGE_KEEP_ALIVE} seconds (Mosquitto's minimum too): a \
                     link that must answer a ping every few seconds drops on any hiccup of a \
                     slow uplink and reconnects over and over; use 0 (no keep-alive) or >= \
                     {MIN_BRIDGE_KEEP_ALIVE}",
                    self.keep_alive
                ),
            ));
        }
        self.check_numbers(i)?;
        if let Some(tls) = &self.tls {
            check_tls(i, tls)?;
        }
        if self.topics.is_empty() {
            return Err(invalid(
                &key("topic"),
                "at least one topic rule is needed (`[[bridge.topic]]` with a `pattern`); \
                 a bridge without one forwards nothing"
                    .to_owned(),
            ));
        }
        for (j, rule) in self.topics.iter().enumerate() {
            rule.validate()
                .map_err(|(field, m)| invalid(&key(&format!("topic[{j}].{field}")), m))?;
        }
        Ok(())
    }

    /// The numeric ranges: backoff, window, queue bound, lazy start.
    fn check_numbers(&self, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("bridge[{i}].{k}");
        let [base, cap] = self.restart_timeout;
        if base == 0 {
            return Err(invalid(
                &key("restart_timeout"),
                "the base must be at least 1 second: 0 would reconnect in a tight loop to a \
                 remote that refuses the bridge"
                    .to_owned(),
            ));
        }
        if base > cap {
            return Err(invalid(
                &key("restart_timeout"),
                format!("the base ({base} s) is above the cap ({cap} s); write [base, cap]"),
            ));
        }
        if self.inflight == 0 {
            return Err(invalid(
                &key("inflight"),
                "must be 1..=65535: with 0 no QoS 1/2 message could ever be sent".to_owned(),
            ));
        }
        if self.max_queued_messages == 0 {
            return Err(invalid(
                &key("max_queued_messages"),
                "must be at least 1: the bridge's queue is what holds messages while the \
                 remote is away"
                    .to_owned(),
            ));
        }
        if self.threshold == 0 {
            return Err(invalid(
                &key("threshold"),
                "must be at least 1 (the number of queued messages that starts a lazy bridge)"
                    .to_owned(),
            ));
        }
        if self.start == StartMode::Lazy && self.idle_timeout == 0 {
            return Err(invalid(
                &key("idle_timeout"),
                "a lazy bridge with idle_timeout 0 would disconnect as soon as it connected; \
                 use at least 1 second"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

impl TopicRule {
    /// The local filter (`local_prefix + pattern`): what the bridge subscribes to on this
    /// broker for `out`, and the topic space `in` messages land in.
    pub fn local_filter(&self) -> String {
        format!("{}{}", self.local_prefix, self.pattern)
    }

    /// The remote filter (`remote_prefix + pattern`): what the bridge subscribes to on the
    /// remote for `in`, and the topic space `out` messages land in.
    pub fn remote_filter(&self) -> String {
        format!("{}{}", self.remote_prefix, self.pattern)
    }

    /// Mosquitto's rules for a `topic` line: QoS 0..=2, prefixes without wildcards, an empty
    /// pattern only with both prefixes (one topic remapped to another), and both resulting
    /// filters valid. The error names the field.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.qos > 2 {
            return Err(("qos", format!("must be 0, 1 or 2, got {}", self.qos)));
        }
        for (field, prefix) in [
            ("local_prefix", &self.local_prefix),
            ("remote_prefix", &self.remote_prefix),
        ] {
            if topic::has_wildcards(prefix) || prefix.contains('\0') {
                return Err((
                    field,
                    format!(
                        "{prefix:?} must be a plain topic prefix: no `+`, `#` or NUL (the \
                         wildcards belong in `pattern`)"
                    ),
                ));
            }
        }
        if self.pattern.is_empty() {
            if self.local_prefix.is_empty() || self.remote_prefix.is_empty() {
                return Err((
                    "pattern",
                    "an empty pattern remaps one topic to another and needs both \
                     `local_prefix` and `remote_prefix` (the local and the remote topic)"
                        .to_owned(),
                ));
            }
        } else if !topic::is_valid_filter(&self.pattern) {
            return Err((
                "pattern",
                format!(
                    "{:?} is not a valid topic filter (`#` only as the last level, `+` only \
                     as a whole level) [MQTT-4.7.1-1, -2, -3]",
                    self.pattern
                ),
            ));
        }
        for (field, filter) in [
            ("local_prefix", self.local_filter()),
            ("remote_prefix", self.remote_filter()),
        ] {
            if filter.starts_with("$share/") {
                return Err((
                    field,
                    format!(
                        "{filter:?} is a shared subscription: forwarded topics never carry \
                         the `$share/<group>/` part, so the prefix could not be mapped"
                    ),
                ));
            }
            if !topic::is_valid_filter(&filter) {
                return Err((
                    field,
                    format!(
                        "prefix + pattern = {filter:?} is not a valid topic filter; a prefix \
                         usually ends with `/` (`site1/` + `sensors/#`)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Bridge names end up as a metric label, a topic level (`$SYS/broker/connection/<name>/state`)
/// and in the client id `$bridge/<name>`: no level separator, no wildcard, no control
/// character.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(
            "every bridge needs a `name` (its metrics, state topic and local \
                    session are named after it)"
                .to_owned(),
        );
    }
    if name.len() > MAX_BRIDGE_NAME_LEN {
        return Err(format!(
            "{name:?} is longer than {MAX_BRIDGE_NAME_LEN} bytes"
        ));
    }
    if name.contains(['/', '+', '#']) || topic::has_disallowed_code_points(name) {
        return Err(format!(
            "{name:?} may not contain `/`, `+`, `#` or control characters: the name is a \
             topic level of $SYS/broker/connection/<name>/state and part of the client id \
             {BRIDGE_SESSION_PREFIX}<name>"
        ));
    }
    Ok(())
}

/// `host:port`, `[v6]:port`; a port from 1 to 65535 (no default port: the file says which).
fn check_address(address: &str) -> Result<(), String> {
    let help = "write `host:port`, e.g. `broker.example.com:8883`, `10.0.0.5:1883` or \
                `[2001:db8::1]:1883`";
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let Some((v6, port)) = rest.split_once("]:") else {
            return Err(format!("{address:?} is not an address; {help}"));
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "{address:?}: `{v6}` is not an IPv6 address; {help}"
            ));
        }
        (v6, port)
    } else {
        let Some((host, port)) = address.rsplit_once(':') else {
            return Err(format!("{address:?} has no port; {help}"));
        };
        if host.contains(':') {
            return Err(format!(
                "{address:?}: an IPv6 address needs brackets (`[{host}]:{port}`)"
            ));
        }
        (host, port)
    };
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err(format!(
            "{address:?}: the host is empty or not a host name; {help}"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!(
            "{address:?}: the port must be a number from 1 to 65535; {help}"
        )),
    }
}

/// A client id any MQTT server must accept the shape of: 1 to 65535 bytes of UTF-8 (a TOML
/// string is UTF-8), no NUL [MQTT-1.5.4-2]. Servers may refuse more (Postbox's own
/// `mqtt.max_client_id_len`); the remote's CONNACK says so at connect.
fn check_client_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err(
            "must not be empty (leave it out for `postbox-bridge-<name>`): a remote \
                    would assign a new id, and so a new session, at every connect"
                .to_owned(),
        );
    }
    if id.len() > MAX_CLIENT_ID_LEN {
        return Err(format!(
            "is {} bytes; an MQTT string holds at most {MAX_CLIENT_ID_LEN}",
            id.len()
        ));
    }
    if id.contains('\0') {
        return Err("must not contain NUL [MQTT-1.5.4-2]".to_owned());
    }
    Ok(())
}

/// `[bridge.tls]`: cert and key go together, every file named is readable now (not at the
/// first connect, maybe hours later), SNI is a name, ALPN ids fit their length byte.
fn check_tls(i: usize, tls: &BridgeTlsConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("bridge[{i}].tls.{k}");
    match (&tls.cert, &tls.key) {
        (Some(_), None) => {
            return Err(invalid(
                &key("cert"),
                "a client certificate needs its private key: set `key` too".to_owned(),
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                &key("key"),
                "a private key without `cert` is of no use: set both or neither".to_owned(),
            ))
        }
        _ => {}
    }
    for (field, path) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
        if let Some(path) = path {
            check_readable(path).map_err(|m| invalid(&key(field), m))?;
        }
    }
    if let Some(name) = &tls.server_name {
        if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
            return Err(invalid(
                &key("server_name"),
                format!("{name:?} is not a DNS name or an IP address"),
            ));
        }
    }
    for (k, protocol) in tls.alpn.iter().enumerate() {
        if protocol.is_empty() || protocol.len() > 255 {
            return Err(invalid(
                &key(&format!("alpn[{k}]")),
                format!("{protocol:?}: an ALPN protocol id is 1 to 255 bytes"),
            ));
        }
    }
    Ok(())
}

/// A file the bridge will read at connect must be readable at start, as `admin.token_file`.
fn check_readable(path: &Path) -> Result<(), String> {
    match std::fs::read(path) {
        Ok(bytes) if bytes.is_empty() => Err(format!("{} is empty", path.display())),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
#[path = "bridge_tests.rs"]
mod tests;
