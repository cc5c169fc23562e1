//! Broker configuration: one TOML file, typed, validated, with errors that point at the line.
//!
//! The documented file `config/postbox.toml` is compiled in and *is* the default configuration
//! ([`Config::embedded_default`]); a unit test keeps it equal to [`Config::default`]. Every struct
//! denies unknown keys (a typo must not silently fall back to a default) and fills missing keys
//! from its defaults, so a user file only needs the options it changes.
//!
//! Errors name the file, the dotted key (`mqtt.max_inflight_messages`) and the line, because a
//! broker that refuses to start must say exactly why.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The documented default configuration file, compiled into the binary.
const EMBEDDED_DEFAULT: &str = include_str!("../config/postbox.toml");

/// Origin name used in errors about the embedded default file.
const EMBEDDED_ORIGIN: &str = "<embedded config/postbox.toml>";

/// Largest possible MQTT packet: 1 byte fixed header + 4 bytes remaining length + 268_435_455.
pub const MAX_PACKET_SIZE_LIMIT: u32 = 268_435_460;

/// Smallest `mqtt.max_packet_size` accepted; below this not even a CONNECT with properties fits.
pub const MIN_PACKET_SIZE: u32 = 20;

/// Smallest `mqtt.max_client_id_len`: MQTT requires servers to accept client ids of 1 to 23
/// characters (MQTT-3.1.3-5), and 3.1 clients are limited to 23.
pub const MIN_CLIENT_ID_LEN: usize = 23;

/// Longest client id that can exist on the wire (a UTF-8 string has a 16-bit length prefix).
pub const MAX_CLIENT_ID_LEN: usize = 65_535;

/// The whole broker configuration, as read from one TOML file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The MQTT (TCP) listener.
    pub listener: ListenerConfig,
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
}

/// The MQTT listener: where clients connect and how many may.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    /// Address and port to accept MQTT connections on (`0.0.0.0:1883`).
    pub bind: SocketAddr,
    /// Upper bound on concurrently open client connections; 0 = unlimited.
    pub max_connections: usize,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            bind: SocketAddr::from(([0, 0, 0, 0], 1883)),
            max_connections: 0,
        }
    }
}

/// The Prometheus exporter: scraped over HTTP at `http://<bind>/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve metrics at all; when false no port is opened and metric updates are no-ops.
    pub enabled: bool,
    /// Address and port of the metrics HTTP endpoint (`0.0.0.0:9883`).
    pub bind: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            bind: SocketAddr::from(([0, 0, 0, 0], 9883)),
        }
    }
}

/// What the broker does when a session's outbound queue is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverflowPolicy {
    /// Keep the queue as it is and drop the arriving message (Mosquitto's behaviour).
    #[default]
    DropNew,
    /// Drop the oldest queued message to make room: freshest data wins (telemetry).
    DropOldest,
}

impl fmt::Display for OverflowPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OverflowPolicy::DropNew => "drop-new",
            OverflowPolicy::DropOldest => "drop-oldest",
        })
    }
}

/// Whether the broker uses topic aliases on PUBLISH packets it sends to MQTT 5 clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutboundTopicAliases {
    /// Never send topic aliases: every subscriber shares one cached PUBLISH encoding.
    #[default]
    Off,
    /// Alias topics per connection, evicting the least recently used alias when the client's
    /// Topic Alias Maximum is reached; costs one PUBLISH encoding per aliased delivery.
    Lru,
}

/// How one member of a shared subscription group is chosen for each message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharedStrategy {
    /// Members take turns (connected members first).
    #[default]
    RoundRobin,
    /// A uniformly random connected member.
    Random,
    /// A member chosen by a hash of the topic name: one topic sticks to one member while the
    /// group is unchanged, so per-topic order is kept.
    Hash,
}

/// Protocol limits and session/queue behaviour; names follow Mosquitto where one exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Largest whole MQTT packet accepted, in bytes (v5: announced as Maximum Packet Size).
    pub max_packet_size: u32,
    /// Cap on the client keep-alive, in seconds (v5: announced as Server Keep Alive).
    pub max_keepalive: u16,
    /// Per-client window of unacknowledged outbound QoS 1/2 messages.
    pub max_inflight_messages: u16,
    /// Per-session bound on messages queued beyond the in-flight window; at least 1.
    pub max_queued_messages: usize,
    /// Per-session bound on queued payload bytes; 0 = no byte bound.
    pub max_queued_bytes: usize,
    /// Queue QoS 0 messages for offline persistent sessions (MQTT says drop them).
    pub queue_qos0_messages: bool,
    /// Which message to drop when a session queue is full.
    pub queue_overflow: OverflowPolicy,
    /// Whether retained messages are supported (v5: announced as Retain Available).
    pub retain_available: bool,
    /// Highest QoS granted to subscriptions and accepted on PUBLISH, 0..=2 (v5: Maximum QoS).
    pub max_qos: u8,
    /// Let clients connect with an empty client id and have one assigned (3.1.1 and 5.0).
    pub allow_zero_length_clientid: bool,
    /// Longest client id accepted, in bytes.
    pub max_client_id_len: usize,
    /// Cap on the session expiry interval a client may request, in seconds.
    pub session_expiry_interval_max: u32,
    /// Unacknowledged inbound QoS 1/2 PUBLISHes a v5 client may have (its Receive Maximum
    /// towards us); 1..=65535. More is a protocol violation (DISCONNECT 0x93).
    pub receive_maximum: u16,
    /// Inbound topic aliases a v5 client may set up (Topic Alias Maximum); 0 = none.
    pub topic_alias_maximum: u16,
    /// Whether PUBLISHes to v5 clients that accept aliases use outbound topic aliases.
    pub outbound_topic_aliases: OutboundTopicAliases,
    /// Whether subscriptions may use `+` and `#` (v5: Wildcard Subscription Available).
    pub wildcard_subscription_available: bool,
    /// Whether SUBSCRIBE may carry a Subscription Identifier (v5: announced in CONNACK).
    pub subscription_identifier_available: bool,
    /// Whether `$share/{group}/{filter}` subscriptions are supported (v5: announced in CONNACK).
    pub shared_subscription_available: bool,
    /// How a shared subscription group picks the member that receives a message.
    pub shared_subscription_strategy: SharedStrategy,
    /// Response Information returned to v5 clients that request it (a topic prefix for their
    /// response topics); `None` (key absent) = never returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_information: Option<String>,
    /// Check that payloads marked as UTF-8 (Payload Format Indicator 1) really are.
    pub validate_utf8_payload: bool,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_packet_size: 1_048_576,
            max_keepalive: 65_535,
            max_inflight_messages: 20,
            max_queued_messages: 1000,
            max_queued_bytes: 0,
            queue_qos0_messages: false,
            queue_overflow: OverflowPolicy::DropNew,
            retain_available: true,
            max_qos: 2,
            allow_zero_length_clientid: true,
            max_client_id_len: MAX_CLIENT_ID_LEN,
            session_expiry_interval_max: u32::MAX,
            receive_maximum: 1024,
            topic_alias_maximum: 10,
            outbound_topic_aliases: OutboundTopicAliases::Off,
            wildcard_subscription_available: true,
            subscription_identifier_available: true,
            shared_subscription_available: true,
            shared_subscription_strategy: SharedStrategy::RoundRobin,
            response_information: None,
            validate_utf8_payload: false,
        }
    }
}

/// Authentication: who may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Accept clients that send no username.
    pub allow_anonymous: bool,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            allow_anonymous: true,
        }
    }
}

/// When the durable store forces its log to stable storage (see `config/postbox.toml` for what
/// each policy can lose).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsyncPolicy {
    /// fdatasync after every group commit, before acknowledging: survives power loss.
    #[default]
    EveryBatch,
    /// Write every commit to the OS at once, fdatasync every `fsync_interval_ms`.
    Interval,
    /// Write every commit to the OS, never fdatasync (the OS flushes when it likes).
    Never,
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsyncPolicy::EveryBatch => "every-batch",
            FsyncPolicy::Interval => "interval",
            FsyncPolicy::Never => "never",
        })
    }
}

/// What the durable store does with new data once `storage.max_disk_bytes` is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFullPolicy {
    /// Refuse the whole submit; the broker refuses the PUBLISH (v5: Quota exceeded).
    #[default]
    Reject,
    /// Store everything but the new data; the broker still delivers it from memory, but it
    /// does not survive a restart.
    KeepInMemory,
}

/// Durable state: where it lives and how hard the broker works to keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Keep durable state on disk (Mosquitto's `persistence`). Off: everything in memory,
    /// lost on restart.
    pub persistence: bool,
    /// Directory for durable state (relative paths are relative to the working directory).
    pub dir: Option<PathBuf>,
    /// When the log is forced to disk.
    pub fsync: FsyncPolicy,
    /// Milliseconds between fdatasyncs with `fsync = "interval"`; 1..=60000.
    pub fsync_interval_ms: u64,
    /// Most ops in one group commit; at least 1.
    pub max_batch_ops: usize,
    /// Microseconds the writer waits for more ops before committing a batch; 0 = commit at
    /// once (ops arriving during an fsync still share the next one). At most 100000.
    pub commit_window_us: u64,
    /// Ops that may wait for the writer before submits are refused (backpressure); at least
    /// `max_batch_ops`.
    pub queue_capacity_ops: usize,
    /// Budget for stored data in bytes; 0 = unlimited. Otherwise at least 1048576.
    pub max_disk_bytes: u64,
    /// What happens to new data when the budget is reached.
    pub disk_full: DiskFullPolicy,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            persistence: true,
            dir: Some(PathBuf::from(DEFAULT_DATA_DIR)),
            fsync: FsyncPolicy::EveryBatch,
            fsync_interval_ms: 100,
            max_batch_ops: 4096,
            commit_window_us: 0,
            queue_capacity_ops: 65_536,
            max_disk_bytes: 0,
            disk_full: DiskFullPolicy::Reject,
        }
    }
}

/// Where durable state lives unless `storage.dir` says otherwise: next to where the broker
/// runs, like Mosquitto's default `persistence_location`. Packaged deployments set an
/// absolute path (`/var/lib/postbox`).
pub const DEFAULT_DATA_DIR: &str = "postbox-data";

impl StorageConfig {
    /// The directory to keep durable state in, or `None` to keep everything in memory.
    pub fn durable_dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref().filter(|_| self.persistence)
    }
}

/// Smallest non-zero `storage.max_disk_bytes`: below this not even session metadata fits.
pub const MIN_DISK_BYTES: u64 = 1_048_576;

/// Logging.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`info`) or directives (`info,postbox::broker=debug`).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_owned(),
        }
    }
}

/// Why a configuration could not be loaded; every variant says where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file we tried to read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or a value has the wrong type, or a key is unknown.
    #[error("{}", fmt_parse(origin, *line, *column, key.as_deref(), message))]
    Parse {
        /// The file name (or another description of where the text came from).
        origin: String,
        /// 1-based line of the problem; 0 if unknown.
        line: usize,
        /// 1-based column (in characters) of the problem; 0 if unknown.
        column: usize,
        /// Dotted key path (`mqtt.max_qos`), when the problem concerns a key.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The value parsed but is out of range or inconsistent with another value.
    #[error("{}", fmt_invalid(origin.as_deref(), *line, key, message))]
    Invalid {
        /// The file name, when the configuration came from text; `None` for a built `Config`.
        origin: Option<String>,
        /// Dotted key path of the offending option (`mqtt.max_inflight_messages`).
        key: String,
        /// 1-based line where the key is set, if it is set in the text at all.
        line: Option<usize>,
        /// What is wrong and what is allowed.
        message: String,
    },
}

fn fmt_parse(origin: &str, line: usize, column: usize, key: Option<&str>, message: &str) -> String {
    let mut s = origin.to_owned();
    if line > 0 {
        s.push_str(&format!(":{line}"));
        if column > 0 {
            s.push_str(&format!(":{column}"));
        }
    }
    match key {
        Some(key) => s.push_str(&format!(": key `{key}`: {message}")),
        None => s.push_str(&format!(": {message}")),
    }
    s
}

fn fmt_invalid(origin: Option<&str>, line: Option<usize>, key: &str, message: &str) -> String {
    let place = match (origin, line) {
        (Some(o), Some(l)) => format!("{o}:{l}: "),
        (Some(o), None) => format!("{o}: "),
        (None, Some(l)) => format!("line {l}: "),
        (None, None) => String::new(),
    };
    format!("{place}invalid value for key `{key}`: {message}")
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
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let deserializer =
            toml::Deserializer::parse(text).map_err(|e| parse_error(text, origin, e, None))?;
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let key = (path != ".").then_some(path);
            parse_error(text, origin, e.into_inner(), key)
        })?;
        config.validate().map_err(|e| e.locate(text, origin))?;
        Ok(config)
    }

    /// Reads, parses and validates a config file; errors name `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml_str(&text, &path.display().to_string())
    }

    /// Cross-field validation: ranges the types cannot express and options that conflict.
    ///
    /// Call it again after overriding fields (e.g. from the command line). Errors carry the key
    /// but no file position; [`Config::from_toml_str`] adds those.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.mqtt;
        if !(MIN_PACKET_SIZE..=MAX_PACKET_SIZE_LIMIT).contains(&m.max_packet_size) {
            return Err(invalid(
                "mqtt.max_packet_size",
                format!(
                    "must be between {MIN_PACKET_SIZE} and {MAX_PACKET_SIZE_LIMIT} bytes, got {}",
                    m.max_packet_size
                ),
            ));
        }
        if m.max_keepalive == 0 {
            return Err(invalid(
                "mqtt.max_keepalive",
                "must be between 1 and 65535 seconds, got 0".to_owned(),
            ));
        }
        if m.max_inflight_messages == 0 {
            return Err(invalid(
                "mqtt.max_inflight_messages",
                "must be between 1 and 65535, got 0 (MQTT 5 forbids a Receive Maximum of 0)"
                    .to_owned(),
            ));
        }
        if m.max_queued_messages == 0 {
            return Err(invalid(
                "mqtt.max_queued_messages",
                "must be at least 1, got 0 (unbounded queues are not allowed)".to_owned(),
            ));
        }
        if m.max_qos > 2 {
            return Err(invalid(
                "mqtt.max_qos",
                format!("must be 0, 1 or 2, got {}", m.max_qos),
            ));
        }
        if !(MIN_CLIENT_ID_LEN..=MAX_CLIENT_ID_LEN).contains(&m.max_client_id_len) {
            return Err(invalid(
                "mqtt.max_client_id_len",
                format!(
                    "must be between {MIN_CLIENT_ID_LEN} and {MAX_CLIENT_ID_LEN} bytes, got {}",
                    m.max_client_id_len
                ),
            ));
        }
        if m.receive_maximum == 0 {
            return Err(invalid(
                "mqtt.receive_maximum",
                "must be between 1 and 65535, got 0 (MQTT 5 forbids a Receive Maximum of 0)"
                    .to_owned(),
            ));
        }
        if let Some(info) = &m.response_information {
            if info.is_empty() || info.len() > usize::from(u16::MAX) {
                return Err(invalid(
                    "mqtt.response_information",
                    "must be 1 to 65535 bytes; remove the key to return none".to_owned(),
                ));
            }
            if info.contains(['+', '#', '\0']) {
                return Err(invalid(
                    "mqtt.response_information",
                    format!("must be usable in a topic name (no `+`, `#` or NUL), got {info:?}"),
                ));
            }
        }
        if let Err(message) = check_log_filter(&self.log.level) {
            return Err(invalid("log.level", message));
        }
        if let Some(dir) = &self.storage.dir {
            if dir.as_os_str().is_empty() {
                return Err(invalid(
                    "storage.dir",
                    "must not be empty; set storage.persistence = false to keep state in memory"
                        .to_owned(),
                ));
            }
        }
        let st = &self.storage;
        if !(1..=60_000).contains(&st.fsync_interval_ms) {
            return Err(invalid(
                "storage.fsync_interval_ms",
                format!(
                    "must be between 1 and 60000 milliseconds, got {}",
                    st.fsync_interval_ms
                ),
            ));
        }
        if st.max_batch_ops == 0 {
            return Err(invalid(
                "storage.max_batch_ops",
                "must be at least 1, got 0".to_owned(),
            ));
        }
        if st.commit_window_us > 100_000 {
            return Err(invalid(
                "storage.commit_window_us",
                format!(
                    "must be at most 100000 microseconds, got {}",
                    st.commit_window_us
                ),
            ));
        }
        if st.queue_capacity_ops < st.max_batch_ops {
            return Err(invalid(
                "storage.queue_capacity_ops",
                format!(
                    "must be at least storage.max_batch_ops ({}), got {}",
                    st.max_batch_ops, st.queue_capacity_ops
                ),
            ));
        }
        if st.max_disk_bytes != 0 && st.max_disk_bytes < MIN_DISK_BYTES {
            return Err(invalid(
                "storage.max_disk_bytes",
                format!(
                    "must be 0 (unlimited) or at least {MIN_DISK_BYTES}, got {}",
                    st.max_disk_bytes
                ),
            ));
        }
        if self.metrics.enabled && addresses_clash(self.metrics.bind, self.listener.bind) {
            return Err(invalid(
                "metrics.bind",
                format!(
                    "{} clashes with listener.bind {}; use another port",
                    self.metrics.bind, self.listener.bind
                ),
            ));
        }
        Ok(())
    }
}

/// Accepts a level (`info`) or `tracing` directives whose every level is spelled correctly.
///
/// `EnvFilter` alone would take `level = "verbose"` as "everything from target `verbose`", so a
/// typo would silently hide all logs; requiring each directive to end in a level catches that.
fn check_log_filter(filter: &str) -> Result<(), String> {
    use tracing_subscriber::filter::LevelFilter;

    const HELP: &str = "use error, warn, info, debug, trace or off, or directives like \
                        `info,postbox::broker=debug`";
    if filter.trim().is_empty() {
        return Err(format!("must not be empty; {HELP}"));
    }
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if level.parse::<LevelFilter>().is_err() {
            return Err(format!("`{directive}` does not end in a level; {HELP}"));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map(drop)
        .map_err(|e| format!("`{filter}` is not a valid filter ({e}); {HELP}"))
}

/// True when two listeners would compete for the same port (port 0 = ephemeral never clashes).
fn addresses_clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

fn invalid(key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: None,
        key: key.to_owned(),
        line: None,
        message,
    }
}

impl ConfigError {
    /// Adds the origin and the key's line to an `Invalid` error produced by `validate`.
    fn locate(self, text: &str, origin: &str) -> ConfigError {
        match self {
            ConfigError::Invalid {
                key, line, message, ..
            } => ConfigError::Invalid {
                line: line.or_else(|| key_line(text, &key)),
                origin: Some(origin.to_owned()),
                key,
                message,
            },
            other => other,
        }
    }
}

/// Converts a toml error into `Parse`, computing line/column from its span.
fn parse_error(text: &str, origin: &str, e: toml::de::Error, key: Option<String>) -> ConfigError {
    let (line, column) = match e.span() {
        Some(span) => line_col(text, span.start),
        // No span (rare): fall back to where the key is written, if we know the key.
        None => key
            .as_deref()
            .and_then(|k| key_line(text, k))
            .map_or((0, 0), |l| (l, 0)),
    };
    ConfigError::Parse {
        origin: origin.to_owned(),
        line,
        column,
        key,
        message: tomlish(e.message().trim_end()),
    }
}

/// Rewords serde's Rust-flavoured messages in TOML terms (`field` -> `key`, `struct` -> table).
fn tomlish(message: &str) -> String {
    let message = message.replace("unknown field", "unknown key");
    match message.find("expected struct ") {
        Some(i) => format!("{}expected a table", &message[..i]),
        None => message,
    }
}

/// 1-based line and column (in characters) of byte offset `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Line on which the dotted `key` is set in `text`, by re-parsing it with spans.
///
/// Works for `[table]` headers, dotted keys and inline tables alike, because the spanned
/// document tree does not care how a key was spelled.
fn key_line(text: &str, key: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut segments = key.split('.').peekable();
    while let Some(segment) = segments.next() {
        let (k, v) = table.get_key_value(segment)?;
        if segments.peek().is_none() {
            return Some(line_col(text, k.span().start).0);
        }
        table = v.get_ref().as_table()?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(text, "test.toml")
    }

    #[test]
    fn embedded_default_matches_default() {
        assert_eq!(Config::embedded_default(), Config::default());
    }

    #[test]
    fn default_is_valid() {
        Config::default().validate().expect("defaults validate");
    }

    #[test]
    fn empty_text_is_default() {
        assert_eq!(parse("").expect("empty parses"), Config::default());
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = parse("[mqtt]\nmax_inflight_messages = 5\nqueue_overflow = \"drop-oldest\"\n")
            .expect("parses");
        assert_eq!(c.mqtt.max_inflight_messages, 5);
        assert_eq!(c.mqtt.queue_overflow, OverflowPolicy::DropOldest);
        assert_eq!(c.mqtt.max_queued_messages, 1000);
        assert_eq!(c.listener, ListenerConfig::default());
    }

    #[test]
    fn storage_dir_and_bind_parse() {
        let c =
            parse("[storage]\ndir = \"/var/lib/postbox\"\n[listener]\nbind = \"127.0.0.1:1884\"\n")
                .expect("parses");
        assert_eq!(c.storage.dir, Some(PathBuf::from("/var/lib/postbox")));
        assert_eq!(c.listener.bind, SocketAddr::from(([127, 0, 0, 1], 1884)));
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[listener]\nbind = \"0.0.0.0:1883\"\n\n[mqtt]\nmax_inflight = 10\n";
        let err = parse(text).expect_err("unknown key rejected");
        match &err {
            ConfigError::Parse {
                origin, line, key, ..
            } => {
                assert_eq!(origin, "test.toml");
                assert_eq!(*line, 5);
                assert_eq!(key.as_deref(), Some("mqtt.max_inflight"));
            }
            other => panic!("expected Parse, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("test.toml:5:"), "{msg}");
        assert!(msg.contains("mqtt.max_inflight"), "{msg}");
        assert!(msg.contains("unknown key `max_inflight`"), "{msg}");
    }

    #[test]
    fn unknown_table_names_key_and_line() {
        let err = parse("# hi\n[tls]\ncert = \"x\"\n").expect_err("unknown table rejected");
        let msg = err.to_string();
        assert!(msg.contains("test.toml:2:"), "{msg}");
        assert!(msg.contains("`tls`"), "{msg}");
    }

    #[test]
    fn table_given_as_value_says_table() {
        let err = parse("listener = 5\n").expect_err("not a table");
        assert!(err.to_string().ends_with("expected a table"), "{err}");
    }

    #[test]
    fn wrong_type_names_key_and_line() {
        let text = "[mqtt]\nmax_qos = 1\nmax_inflight_messages = \"twenty\"\n";
        let err = parse(text).expect_err("wrong type rejected");
        match &err {
            ConfigError::Parse {
                line, column, key, ..
            } => {
                assert_eq!(*line, 3);
                assert_eq!(*column, 25);
                assert_eq!(key.as_deref(), Some("mqtt.max_inflight_messages"));
            }
            other => panic!("expected Parse, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with("test.toml:3:25: key `mqtt.max_inflight_messages`"),
            "{msg}"
        );
    }

    #[test]
    fn integer_overflow_for_type_names_key_and_line() {
        let err = parse("[mqtt]\nmax_inflight_messages = 70000\n").expect_err("u16 overflow");
        let msg = err.to_string();
        assert!(msg.contains("test.toml:2:"), "{msg}");
        assert!(msg.contains("mqtt.max_inflight_messages"), "{msg}");
    }

    #[test]
    fn bad_socket_address_names_key_and_line() {
        let err = parse("[metrics]\nenabled = true\nbind = \"localhost\"\n").expect_err("bad addr");
        let msg = err.to_string();
        assert!(msg.contains("test.toml:3:"), "{msg}");
        assert!(msg.contains("metrics.bind"), "{msg}");
    }

    #[test]
    fn bad_enum_value_names_key_and_line() {
        let err = parse("[mqtt]\nqueue_overflow = \"drop-all\"\n").expect_err("bad enum");
        let msg = err.to_string();
        assert!(msg.contains("test.toml:2:"), "{msg}");
        assert!(msg.contains("mqtt.queue_overflow"), "{msg}");
        assert!(msg.contains("drop-oldest"), "{msg}");
    }

    #[test]
    fn syntax_error_names_line() {
        let err = parse("[mqtt]\nmax_qos = = 1\n").expect_err("syntax error");
        match &err {
            ConfigError::Parse { line, .. } => assert_eq!(*line, 2),
            other => panic!("expected Parse, got {other:?}"),
        }
        assert!(err.to_string().starts_with("test.toml:2:"), "{err}");
    }

    #[test]
    fn out_of_range_names_key_and_line() {
        let text = "[mqtt]\nmax_qos = 2\n\nmax_inflight_messages = 0\n";
        let err = parse(text).expect_err("0 inflight rejected");
        match &err {
            ConfigError::Invalid {
                origin, key, line, ..
            } => {
                assert_eq!(origin.as_deref(), Some("test.toml"));
                assert_eq!(key, "mqtt.max_inflight_messages");
                assert_eq!(*line, Some(4));
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.starts_with("test.toml:4: invalid value for key `mqtt.max_inflight_messages`"),
            "{msg}"
        );
    }

    #[test]
    fn out_of_range_found_in_dotted_and_inline_keys() {
        let err = parse("mqtt.max_qos = 3\n").expect_err("dotted");
        assert!(err.to_string().starts_with("test.toml:1: "), "{err}");
        assert!(err.to_string().contains("mqtt.max_qos"), "{err}");
        let err = parse("\n\nmqtt = { max_queued_messages = 0 }\n").expect_err("inline");
        assert!(err.to_string().starts_with("test.toml:3: "), "{err}");
        assert!(
            err.to_string().contains("mqtt.max_queued_messages"),
            "{err}"
        );
    }

    #[test]
    fn each_range_rule_is_enforced() {
        let cases = [
            ("[mqtt]\nmax_packet_size = 0", "mqtt.max_packet_size"),
            (
                "[mqtt]\nmax_packet_size = 268435461",
                "mqtt.max_packet_size",
            ),
            ("[mqtt]\nmax_keepalive = 0", "mqtt.max_keepalive"),
            (
                "[mqtt]\nmax_inflight_messages = 0",
                "mqtt.max_inflight_messages",
            ),
            (
                "[mqtt]\nmax_queued_messages = 0",
                "mqtt.max_queued_messages",
            ),
            ("[mqtt]\nmax_qos = 3", "mqtt.max_qos"),
            ("[mqtt]\nmax_client_id_len = 22", "mqtt.max_client_id_len"),
            (
                "[mqtt]\nmax_client_id_len = 65536",
                "mqtt.max_client_id_len",
            ),
            ("[mqtt]\nreceive_maximum = 0", "mqtt.receive_maximum"),
            (
                "[mqtt]\nresponse_information = \"\"",
                "mqtt.response_information",
            ),
            (
                "[mqtt]\nresponse_information = \"a/#\"",
                "mqtt.response_information",
            ),
            ("[log]\nlevel = \"verbose\"", "log.level"),
            ("[log]\nlevel = \"info,postbox=loud\"", "log.level"),
            ("[log]\nlevel = \"\"", "log.level"),
            ("[storage]\ndir = \"\"", "storage.dir"),
            (
                "[storage]\nfsync_interval_ms = 0",
                "storage.fsync_interval_ms",
            ),
            (
                "[storage]\nfsync_interval_ms = 60001",
                "storage.fsync_interval_ms",
            ),
            ("[storage]\nmax_batch_ops = 0", "storage.max_batch_ops"),
            (
                "[storage]\ncommit_window_us = 100001",
                "storage.commit_window_us",
            ),
            (
                "[storage]\nqueue_capacity_ops = 10",
                "storage.queue_capacity_ops",
            ),
            ("[storage]\nmax_disk_bytes = 1000", "storage.max_disk_bytes"),
            ("[metrics]\nbind = \"127.0.0.1:1883\"", "metrics.bind"),
        ];
        for (text, want) in cases {
            match parse(text) {
                Err(ConfigError::Invalid { key, line, .. }) => {
                    assert_eq!(key, want, "{text}");
                    assert_eq!(line, Some(2), "{text}");
                }
                other => panic!("{text}: expected Invalid for {want}, got {other:?}"),
            }
        }
    }

    #[test]
    fn boundary_values_are_accepted() {
        let text = "[mqtt]\nmax_packet_size = 268435460\nmax_qos = 0\nmax_client_id_len = 23\n\
                    max_inflight_messages = 65535\nsession_expiry_interval_max = 0\n\
                    [metrics]\nenabled = false\nbind = \"0.0.0.0:1883\"\n\
                    [log]\nlevel = \"warn,postbox::broker=DEBUG\"\n";
        let c = parse(text).expect("boundaries accepted");
        assert_eq!(c.mqtt.max_packet_size, MAX_PACKET_SIZE_LIMIT);
        assert!(!c.metrics.enabled);
    }

    #[test]
    fn validate_without_text_has_no_position() {
        let mut c = Config::default();
        c.mqtt.max_qos = 7;
        let err = c.validate().expect_err("max_qos 7");
        assert_eq!(
            err.to_string(),
            "invalid value for key `mqtt.max_qos`: must be 0, 1 or 2, got 7"
        );
    }

    #[test]
    fn load_names_missing_file() {
        let err = Config::load(Path::new("/nonexistent/postbox.toml")).expect_err("missing");
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(
            err.to_string().contains("/nonexistent/postbox.toml"),
            "{err}"
        );
    }

    #[test]
    fn load_reads_file_and_names_it_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[auth]\nallow_anonymous = \"yes\"\n").expect("write");
        let err = Config::load(&path).expect_err("wrong type");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{}:2:", path.display())), "{msg}");
        assert!(msg.contains("auth.allow_anonymous"), "{msg}");
    }

    #[test]
    fn serialize_round_trips() {
        let mut c = Config::default();
        c.storage.dir = Some(PathBuf::from("/data"));
        c.mqtt.queue_overflow = OverflowPolicy::DropOldest;
        let text = toml::to_string(&c).expect("serializes");
        assert_eq!(parse(&text).expect("reparses"), c);
    }

    #[test]
    fn storage_policies_parse() {
        let c = parse(
            "[storage]\nfsync = \"interval\"\nfsync_interval_ms = 5\nmax_disk_bytes = 1048576\n\
             disk_full = \"keep-in-memory\"\n",
        )
        .expect("parses");
        assert_eq!(c.storage.fsync, FsyncPolicy::Interval);
        assert_eq!(c.storage.fsync_interval_ms, 5);
        assert_eq!(c.storage.max_disk_bytes, MIN_DISK_BYTES);
        assert_eq!(c.storage.disk_full, DiskFullPolicy::KeepInMemory);
        let err = parse("[storage]\nfsync = \"always\"\n").expect_err("bad policy");
        assert!(err.to_string().contains("every-batch"), "{err}");
    }

    #[test]
    fn mqtt5_feature_options_parse() {
        let c = parse(
            "[mqtt]\nreceive_maximum = 65535\ntopic_alias_maximum = 0\n\
             outbound_topic_aliases = \"lru\"\nwildcard_subscription_available = false\n\
             subscription_identifier_available = false\nshared_subscription_available = false\n\
             shared_subscription_strategy = \"hash\"\nresponse_information = \"replies/\"\n\
             validate_utf8_payload = true\n",
        )
        .expect("parses");
        assert_eq!(c.mqtt.receive_maximum, 65535);
        assert_eq!(c.mqtt.topic_alias_maximum, 0);
        assert_eq!(c.mqtt.outbound_topic_aliases, OutboundTopicAliases::Lru);
        assert!(!c.mqtt.wildcard_subscription_available);
        assert!(!c.mqtt.subscription_identifier_available);
        assert!(!c.mqtt.shared_subscription_available);
        assert_eq!(c.mqtt.shared_subscription_strategy, SharedStrategy::Hash);
        assert_eq!(c.mqtt.response_information.as_deref(), Some("replies/"));
        assert!(c.mqtt.validate_utf8_payload);
        for strategy in ["round-robin", "random"] {
            parse(&format!(
                "[mqtt]\nshared_subscription_strategy = \"{strategy}\"\n"
            ))
            .expect("strategy parses");
        }
        let err = parse("[mqtt]\nshared_subscription_strategy = \"sticky\"\n").expect_err("bad");
        assert!(err.to_string().contains("round-robin"), "{err}");
        let err = parse("[mqtt]\noutbound_topic_aliases = \"always\"\n").expect_err("bad");
        assert!(err.to_string().contains("lru"), "{err}");
        let text = toml::to_string(&c).expect("serializes");
        assert_eq!(parse(&text).expect("reparses"), c);
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé=x", 6), (2, 3));
        assert_eq!(line_col("ab\ncé=x", 7), (2, 4));
        assert_eq!(line_col("", 10), (1, 1));
    }
}
