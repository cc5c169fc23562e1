//! `[[bridge]]`: links from this broker to remote brokers (issue 15).
//!
//! One section per remote: where it is (`addresses`, tried in order with failover, or in turn
//! with `round_robin`), how to log in, TLS, reconnect backoff, when to connect (`start`), the
//! bound of the bridge's own durable queue and what happens when it is full, and the topic
//! rules in Mosquitto's grammar (`pattern`, `direction`, `qos`, `local_prefix`,
//! `remote_prefix`). The names follow Mosquitto's `connection` stanza where one exists, so
//! `postbox bridge import mosquitto.conf` is a mechanical translation.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::mqtt::OverflowPolicy;

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
