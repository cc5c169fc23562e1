//! `[cluster]`: several Postbox nodes acting as one broker over NATS JetStream (issue 17).
//! Absent, the broker is a single node and the cluster layer costs nothing.

use serde::{Deserialize, Serialize};

use super::error::{invalid, seconds, within};
use super::ConfigError;

/// Longest node id: it is part of NATS consumer names and headers.
pub const MAX_NODE_ID_LEN: usize = 32;

/// `[cluster]`: this node's identity and the NATS JetStream it shares state through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's id, unique in the cluster: `[A-Za-z0-9_-]`, 1..=32 bytes. It names the
    /// node's JetStream consumer (`node-<id>`) and marks what the node publishes (loop-free).
    pub node: String,
    /// NATS server URLs (`nats://host:port`, `tls://host:port`); the client fails over
    /// between them and reconnects forever.
    pub servers: Vec<String>,
    /// JetStream replicas of every stream and bucket: 1 for a single `nats-server` (tests),
    /// 3 in production (a power loss on R=1 can lose what 2.9's file store had not synced).
    pub replicas: usize,
    /// Seconds a message stays in the `PB_MSGS` stream: how long a session may be offline
    /// and still be resumed on another node with everything queued for it. 60..=2592000.
    pub retention: u64,
    /// Most bytes the `PB_MSGS` stream holds (and `PB_REGROUP`, apart); 0 (the default): no
    /// bound but JetStream's store. Set below the store's size so that the session and
    /// retained buckets keep room: a full stream refuses QoS 1/2 PUBLISHes (v5 0x97, 3.x
    /// disconnect) and never drops what it took.
    pub max_stream_bytes: u64,
    /// Most bytes of QoS 1/2 messages this node's anonymous clients may put into the
    /// stream within `retention`; past it their QoS 1/2 PUBLISHes are refused (v5 0x97, 3.x
    /// disconnect). Absent (the default): the anonymous share of `mqtt.max_memory` (an
    /// eighth). A message nobody subscribes to holds no node's memory, only the stream.
    pub anonymous_stream_bytes: Option<u64>,
    /// Most bytes of QoS 1/2 messages one verified identity (a user name; where no method
    /// tells identities apart, one source address) may put into the stream from this node
    /// within `retention`; past it its QoS 1/2 PUBLISHes are refused (v5 0x97, 3.x
    /// disconnect), so one user cannot fill the stream for everyone. Absent (the default):
    /// a quarter of `max_stream_bytes`, none when that is 0. 0: no bound.
    pub identity_stream_bytes: Option<u64>,
    /// Most messages waiting for NATS (sent, PubAck not yet in). Beyond it a QoS 1/2 PUBLISH
    /// is refused (v5 0x97, 3.x disconnect) and a QoS 0 one is dropped and counted.
    pub max_pending: usize,
    /// Seconds a message waits for the JetStream PubAck before its publisher's connection is
    /// closed unacknowledged (the publisher re-sends). 1..=60.
    pub publish_timeout: u64,
    /// The NATS user this node connects as, with `password_file`: NATS is inside the trust
    /// boundary, so it should admit the Postbox nodes alone.
    pub user: Option<String>,
    /// A file holding the NATS password of `user` (surrounding whitespace trimmed): kept
    /// out of this file so one config serves every node while a Kubernetes Secret (or a
    /// file only the service can read) holds the password. Read at start.
    pub password_file: Option<std::path::PathBuf>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node: String::new(),
            servers: vec!["nats://127.0.0.1:4222".to_owned()],
            replicas: 1,
            retention: 3600,
            max_stream_bytes: 0,
            anonymous_stream_bytes: None,
            identity_stream_bytes: None,
            max_pending: 10_000,
            publish_timeout: 5,
            user: None,
            password_file: None,
        }
    }
}

impl ClusterConfig {
    /// What `identity_stream_bytes` bounds one identity to (0: nothing).
    pub fn identity_stream_bound(&self) -> u64 {
        self.identity_stream_bytes
            .unwrap_or(self.max_stream_bytes / 4)
    }
}

/// `server` as it may be logged or shown in an error: the password of a
/// `nats://user:password@host:port` URL replaced by `***` (user and host kept, to say which),
/// and so is a token (`nats://token@host:port`).
pub fn redact_server(server: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = server.split_once("://") else {
        return server.into();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return server.into();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}").into(),
        None => format!("{scheme}://***@{host}").into(), // a token
    }
}

/// The rules of `[cluster]`.
///
/// # Errors
///
/// The first rule broken, keyed `cluster.node`, `cluster.servers`, …
pub(super) fn validate(cluster: &ClusterConfig) -> Result<(), ConfigError> {
    if cluster.node.is_empty() {
        return Err(invalid(
            "cluster.node",
            "name this node: every node of a cluster needs its own id".to_owned(),
        ));
    }
    if cluster.node.len() > MAX_NODE_ID_LEN
        || !cluster
            .node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "cluster.node",
            format!(
                "{:?}: use 1 to {MAX_NODE_ID_LEN} of A-Z a-z 0-9 _ -",
                cluster.node
            ),
        ));
    }
    if cluster.servers.is_empty() {
        return Err(invalid(
            "cluster.servers",
            "list at least one NATS server (nats://host:port)".to_owned(),
        ));
    }
    if let Some(bad) = cluster.servers.iter().find(|s| {
        !(s.starts_with("nats://") || s.starts_with("tls://")) || s.contains(char::is_whitespace)
    }) {
        return Err(invalid(
            "cluster.servers",
            format!(
                "{:?}: expected nats://host:port or tls://host:port",
                redact_server(bad)
            ),
        ));
    }
    match (&cluster.user, &cluster.password_file) {
        (Some(user), Some(_)) => {
            if user.is_empty() {
                return Err(invalid(
                    "cluster.user",
                    "empty: name the NATS user".to_owned(),
                ));
            }
            if cluster.servers.iter().any(|s| {
                s.split_once("://").is_some_and(|(_, rest)| {
                    rest.split('/').next().is_some_and(|a| a.contains('@'))
                })
            }) {
                return Err(invalid(
                    "cluster.user",
                    "credentials are also written in a server URL (user:password@host): give them in one place".to_owned(),
                ));
            }
        }
        (Some(_), None) => {
            return Err(invalid(
                "cluster.user",
                "needs cluster.password_file, the file holding its NATS password".to_owned(),
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                "cluster.password_file",
                "needs cluster.user, the NATS user the password is for".to_owned(),
            ))
        }
        (None, None) => {}
    }
    // JetStream's bounds.
    let c = cluster;
    within("cluster.replicas", c.replicas, 1..=5, "")?;
    seconds("cluster.retention", c.retention, 60..=2_592_000)?;
    if c.max_pending == 0 {
        return Err(invalid(
            "cluster.max_pending",
            "must be at least 1".to_owned(),
        ));
    }
    seconds("cluster.publish_timeout", c.publish_timeout, 1..=60)?;
    if (1..65_536).contains(&c.max_stream_bytes) {
        return Err(invalid(
            "cluster.max_stream_bytes",
            "must be 0 (no bound) or at least 65536".to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{redact_server, validate, ClusterConfig};

    #[test]
    fn a_stream_bound_too_small_for_a_message_is_refused_by_its_key() {
        let config = |max_stream_bytes| ClusterConfig {
            node: "a".to_owned(),
            max_stream_bytes,
            ..ClusterConfig::default()
        };
        let error = validate(&config(1_000)).expect_err("1000 bytes");
        assert!(
            error.to_string().contains("cluster.max_stream_bytes"),
            "{error}"
        );
        validate(&config(0)).expect("no bound");
        validate(&config(65_536)).expect("64 KiB");
    }

    #[test]
    fn a_servers_password_is_never_shown() {
        assert_eq!(
            redact_server("nats://node:s3cret@nats:4222"),
            "nats://node:***@nats:4222"
        );
        assert_eq!(redact_server("tls://nats:4222"), "tls://nats:4222");
        assert_eq!(
            redact_server("nats://t0ken@nats:4222"),
            "nats://***@nats:4222"
        );
    }
}
