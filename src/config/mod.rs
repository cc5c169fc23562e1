//! Broker configuration: one TOML file, typed, validated, with errors that point at the line.
//!
//! The documented file `config/postbox.toml` is compiled in and *is* the default configuration
//! ([`Config::embedded_default`]); a unit test keeps it equal to [`Config::default`]. Every struct
//! denies unknown keys (a typo must not silently fall back to a default) and fills missing keys
//! from its defaults, so a user file only needs the options it changes.
//!
//! Errors name the file, the dotted key (`mqtt.max_inflight_messages`, `listener[1].bind`) and
//! the line, because a broker that refuses to start must say exactly why.
//!
//! Layout: this file holds the top-level [`Config`] and loading; each section with rules of its
//! own has a file (`listener`, `mqtt`, `storage`), `validate` ties the sections' rules together,
//! `error` turns problems into positioned messages, `overrides` applies the command line.

mod admin;
mod bridge;
mod cluster;
mod error;
mod guarantees;
mod hints;
mod listener;
mod mqtt;
mod overrides;
mod paths;
mod storage;
mod validate;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use admin::AdminConfig;
pub use admin::MetricsConfig;
pub use bridge::{
    BridgeConfig, BridgeProtocol, BridgeTlsConfig, Direction, StartMode, TopicRule,
    BRIDGE_SESSION_PREFIX, HOPS_PROPERTY, MAX_BRIDGE_NAME_LEN, MIN_BRIDGE_KEEP_ALIVE,
};
pub use cluster::{redact_server, ClusterConfig, MAX_NODE_ID_LEN};
pub use error::ConfigError;
pub use guarantees::{
    DeadLetterConfig, DedupConfig, InvalidV3, SchemaAction, SchemaConfig,
    DEFAULT_DEAD_LETTER_PREFIX,
};
pub use listener::{
    ClientCertMode, ListenerConfig, ListenerKind, TlsConfig, TlsIdentity, WebSocketConfig,
    DEFAULT_MAX_PENDING_CONNECTIONS, DEFAULT_MAX_PENDING_CONNECTIONS_PER_IP,
    DEFAULT_WEBSOCKET_PATH, MAX_LISTENER_NAME_LEN,
};
pub use mqtt::{
    auto_packet_size, available_memory, MemoryLimit, MqttConfig, OutboundTopicAliases,
    OverflowPolicy, RuntimeLimits, SharedStrategy, MAX_CLIENT_ID_LEN, MAX_PACKET_SIZE_LIMIT,
    MIN_CLIENT_ID_LEN, MIN_PACKET_SIZE,
};
pub use overrides::{ClusterNode, Overrides, CLUSTER_NODE_ENV};
pub use storage::{DiskFullPolicy, FsyncPolicy, StorageConfig, DEFAULT_DATA_DIR, MIN_DISK_BYTES};

/// The documented default configuration file, compiled into the binary.
const EMBEDDED_DEFAULT: &str = include_str!("../../config/postbox.toml");

/// Origin name used in errors about the embedded default file.
const EMBEDDED_ORIGIN: &str = "<embedded config/postbox.toml>";

/// The whole broker configuration, as read from one TOML file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The MQTT listeners, in file order (`[[listener]]`, or one `[listener]` table). The
    /// first is the one `-p` overrides and tests reach as `RunningServer::mqtt_addr`.
    #[serde(rename = "listener", deserialize_with = "listener::one_or_many")]
    pub listeners: Vec<ListenerConfig>,
    /// The Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// Protocol limits and session/queue behaviour.
    pub mqtt: MqttConfig,
    /// Who may connect.
    pub auth: AuthConfig,
    /// Where durable state lives.
    pub storage: StorageConfig,
    /// Logging.
    pub log: LogConfig,
    /// The admin API and status page (on the metrics listener, or on `admin.bind`).
    pub admin: AdminConfig,
    /// Links to remote brokers (`[[bridge]]`), in file order.
    #[serde(rename = "bridge", skip_serializing_if = "Vec::is_empty")]
    pub bridges: Vec<BridgeConfig>,
    /// Dead letters: where dropped messages go (`[dead_letter]`).
    pub dead_letter: DeadLetterConfig,
    /// Payload contracts (`[[schema]]`), in file order.
    #[serde(rename = "schema", skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<SchemaConfig>,
    /// Duplicate detection (`[dedup]`).
    pub dedup: DedupConfig,
    /// Several nodes as one broker over NATS JetStream (`[cluster]`); absent: one node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listeners: listener::default_listeners(),
            metrics: MetricsConfig::default(),
            mqtt: MqttConfig::default(),
            auth: AuthConfig::default(),
            storage: StorageConfig::default(),
            log: LogConfig::default(),
            admin: AdminConfig::default(),
            bridges: Vec::new(),
            dead_letter: DeadLetterConfig::default(),
            schemas: Vec::new(),
            dedup: DedupConfig::default(),
            cluster: None,
        }
    }
}

/// Authentication: who may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Accept clients that send no username (a listener's `allow_anonymous` overrides it).
    pub allow_anonymous: bool,
    /// A `mosquitto_passwd` file: clients that send a user name must match a line of it.
    /// None: any user name and password is accepted (see `allow_anonymous`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_file: Option<std::path::PathBuf>,
    /// How many recent successful logins are remembered, so reconnecting clients skip the
    /// (deliberately slow) hash; 0 = none.
    pub password_cache_size: usize,
    /// JWT as password (`[auth.jwt]`): a password shaped like a token is verified against
    /// these keys and its claim becomes the user name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtConfig>,
    /// SCRAM credentials file (`user:$scram-sha-256$...` lines, see `auth::scram_file`): when
    /// set, the enhanced authentication methods `SCRAM-SHA-256` and `SCRAM-SHA-512` are offered.
    pub scram_file: Option<std::path::PathBuf>,
    /// Mosquitto-format ACL file; when set, every publish, subscription, delivery and will is
    /// checked against it and what it does not allow is denied. Unset: no checks at all.
    pub acl_file: Option<std::path::PathBuf>,
    /// What a client gets that connects, authenticated as another identity, with the client
    /// id of a session someone else owns (issue 35): refused (the default), or a fresh session
    /// that replaces the offline owner's. Never the owner's queue, and never its connection:
    /// a connected owner is not kicked either way.
    pub session_binding: SessionBinding,
    /// An authenticated client's client id must be its user name, or the user name, `:` and
    /// anything (issue 35, fourth and fifth passes): no account can make a session under
    /// another device's client id, which `session_binding` would then keep from the device
    /// for as long as that session lives. Ids the broker assigned are exempt.
    pub client_ids_start_with_user: bool,
    /// Failed password-file logins allowed from one source address (IPv4 address, IPv6 /64)
    /// before its attempts are refused unchecked for a growing delay (online guessing,
    /// issue 35); 0: no limit.
    pub login_failures_per_address: u32,
    /// The same for one user name, from any address; 0: no limit.
    pub login_failures_per_user: u32,
    /// The first delay after the allowed failures, in ms; each further failure doubles it.
    pub login_delay_ms: u64,
    /// The longest delay, in ms.
    pub login_delay_max_ms: u64,
    /// Addresses, and user names, whose failures are remembered at most (each): the records'
    /// memory stays bounded whatever number of addresses an attacker has.
    pub login_limit_entries: usize,
}

/// [`AuthConfig::session_binding`]: a session's client id used by another identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionBinding {
    /// CONNACK 0x87 Not authorized (3.x: 5): the owner's session stays as it is.
    #[default]
    Refuse,
    /// The owner's session (offline) is discarded and the newcomer starts a clean one: for
    /// fleets whose devices change credentials and keep their client id.
    Fresh,
}

impl AuthConfig {
    /// The failed-login limits: a delay of 0, or a cap below the first delay, would make a
    /// limit that never holds anyone back.
    pub(crate) fn validate_login_limits(&self) -> Result<(), ConfigError> {
        let on = self.login_failures_per_address > 0 || self.login_failures_per_user > 0;
        if on && self.login_delay_ms == 0 {
            let why = "must be at least 1 while a login_failures_per_* limit is set";
            return Err(error::invalid("auth.login_delay_ms", why.to_owned()));
        }
        if self.login_delay_max_ms < self.login_delay_ms {
            let why = format!(
                "{} is below auth.login_delay_ms ({})",
                self.login_delay_max_ms, self.login_delay_ms
            );
            return Err(error::invalid("auth.login_delay_max_ms", why));
        }
        Ok(())
    }
}

/// `[auth.jwt]`: where the keys are and what the tokens must say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// A PEM public key (`-----BEGIN PUBLIC KEY-----`, RSA or EC P-256) tokens are signed
    /// with. One of `public_key` and `jwks` must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<std::path::PathBuf>,
    /// A JWKS file (`{"keys": [...]}`, as identity providers publish at their `jwks_uri`):
    /// the key is picked by the token's `kid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<std::path::PathBuf>,
    /// The claim that becomes the client's username (for the ACL and the logs).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// Required `iss`, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Required `aud` (one of the token's audiences), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    pub leeway: u64,
}

fn default_username_claim() -> String {
    "sub".to_owned()
}

fn default_leeway() -> u64 {
    30
}

/// Default of [`AuthConfig::password_cache_size`]: a reconnect storm of a few thousand devices
/// costs one hash each at most once per file generation; 32 bytes per entry.
pub const DEFAULT_PASSWORD_CACHE_SIZE: usize = 4096;

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            allow_anonymous: true,
            password_file: None,
            password_cache_size: DEFAULT_PASSWORD_CACHE_SIZE,
            jwt: None,
            scram_file: None,
            acl_file: None,
            session_binding: SessionBinding::Refuse,
            client_ids_start_with_user: false,
            login_failures_per_address: 20,
            login_failures_per_user: 10,
            login_delay_ms: 1_000,
            login_delay_max_ms: 60_000,
            login_limit_entries: 16_384,
        }
    }
}

/// Logging (set up by `logging::init`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`info`) or directives (`info,postbox::broker=debug`).
    /// `RUST_LOG` and `-v` take precedence; SIGHUP applies a new value.
    pub level: String,
    /// How each event is written: plain text for people, JSON lines for a log stack.
    pub format: LogFormat,
}

/// `log.format`: text lines (the default, for people and journald) or one JSON object per
/// line whose keys are the event's fields (for Loki, Elasticsearch, ...).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// `2026-01-01T00:00:00Z  INFO postbox::...: message key=value ...`.
    #[default]
    Text,
    /// `{"timestamp":...,"level":"INFO","message":...,"key":value,...}`.
    Json,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

impl Config {
    /// The embedded default config (what `postbox` with no arguments runs).
    ///
    /// It is the parse of `config/postbox.toml` as compiled in, so the documented file and the
    /// behaviour cannot drift apart; a test keeps it equal to [`Config::default`].
    pub fn embedded_default() -> Config {
        // Not user input: the text is compiled in and `embedded_default_matches_default` parses
        // it in CI, so a failure here is a build defect, not a runtime condition.
        Config::from_toml_str(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN)
            .expect("config/postbox.toml (embedded) must parse and validate")
    }

    /// The text of the embedded default file, e.g. for a `--print-default-config` flag.
    pub fn embedded_default_text() -> &'static str {
        EMBEDDED_DEFAULT
    }

    /// Parses and validates TOML text; `origin` (usually the file name) is quoted in errors.
    ///
    /// # Errors
    ///
    /// A `ConfigError`, positioned in `text`, for TOML that does not parse, an unknown key or a
    /// wrong type, or a value [`Config::validate`] rejects.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config = Config::parse_unvalidated(text, origin)?;
        config.validate().map_err(|e| e.locate(text, origin))?;
        Ok(config)
    }

    /// Reads, parses and validates a config file; errors name `path`.
    ///
    /// # Errors
    ///
    /// As [`Config::load_with`]: the file cannot be read, or its content is invalid.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with(Some(path), &Overrides::default())
    }

    /// What the binary runs: the file at `path` (or the embedded default), with the command
    /// line's `overrides` applied *before* validation, so an override is checked like the file.
    ///
    /// Errors are positioned in the file as usual; when a value involved came from a flag, the
    /// message says so (`-p 9000`), since the file alone would not explain it.
    ///
    /// # Errors
    ///
    /// A `ConfigError` when the file cannot be read, or its content (with `overrides` applied)
    /// does not parse or validate.
    pub fn load_with(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        Config::load_noting(path, overrides).map(|(config, _)| config)
    }

    /// [`Config::load_with`], with the notes a person should read once logging is up: a path
    /// found only relative to the working directory (relative paths in a file are read from
    /// the file's directory, `paths`).
    ///
    /// # Errors
    ///
    /// As [`Config::load_with`], and a file the config names that cannot be read (its key and
    /// line named).
    pub fn load_noting(
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let (text, origin) = match path {
            Some(path) => (
                std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                    path: path.to_owned(),
                    source,
                })?,
                path.display().to_string(),
            ),
            None => (EMBEDDED_DEFAULT.to_owned(), EMBEDDED_ORIGIN.to_owned()),
        };
        let base = path.map(|path| {
            let file = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
            file.parent().unwrap_or_else(|| Path::new(".")).to_owned()
        });
        let (mut config, notes) = Config::parse_at(&text, &origin, base.as_deref(), overrides)?;
        paths::check_files(&mut config).map_err(|e| e.locate(&text, &origin))?;
        Ok((config, notes))
    }

    /// What [`Config::load_noting`] makes of a file's `text`, without reading the files it
    /// names: to check a config meant for another machine (a Kubernetes ConfigMap whose
    /// password file is a Secret mounted there) with the `overrides` it will run with.
    /// Relative paths stay as written.
    ///
    /// # Errors
    ///
    /// As [`Config::from_toml_str`], with `overrides` applied before validation.
    pub fn from_toml_str_with(
        text: &str,
        origin: &str,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        Config::parse_at(text, origin, None, overrides).map(|(config, _)| config)
    }

    /// Parses `text`, reads its relative paths from `base` (notes for those found only from
    /// the working directory), applies `overrides` and validates.
    fn parse_at(
        text: &str,
        origin: &str,
        base: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let mut config = Config::parse_unvalidated(text, origin)?;
        let notes = base.map_or_else(Vec::new, |base| paths::resolve(&mut config, base));
        overrides.apply(&mut config, origin)?;
        config
            .validate()
            .map_err(|e| match e.locate(text, origin) {
                ConfigError::Invalid {
                    origin,
                    key,
                    line,
                    mut message,
                } => {
                    let notes = overrides.notes_for(&format!("{key} {message}"));
                    if !notes.is_empty() {
                        message = format!("{message} ({})", notes.join("; "));
                    }
                    ConfigError::Invalid {
                        origin,
                        key,
                        line,
                        message,
                    }
                }
                other => other,
            })?;
        Ok((config, notes))
    }

    /// Parses TOML text into a `Config` without the cross-field rules; errors are positioned.
    fn parse_unvalidated(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|e| error::parse_error(text, origin, &e, None))?;
        let mut config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let key = (path != ".").then_some(path);
            error::parse_error(text, origin, &e.into_inner(), key)
        })?;
        config.mqtt.resolve_auto();
        Ok(config)
    }

    /// The listeners' names, in order (see [`ListenerConfig::effective_name`]).
    pub fn listener_names(&self) -> Vec<String> {
        self.listeners
            .iter()
            .enumerate()
            .map(|(i, l)| l.effective_name(i))
            .collect()
    }
}

#[cfg(test)]
mod tests;
