//! `[mqtt]`: protocol limits and session/queue behaviour, and the range rules for them.
//!
//! These are the options the broker core reads (`Broker::new` takes an [`MqttConfig`]); their
//! limits come from the MQTT specification, so the rules live next to the fields.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::error::{bytes, invalid, seconds, within, ConfigError};

/// Largest possible MQTT packet: 1 byte fixed header + 4 bytes remaining length + `268_435_455`.
pub const MAX_PACKET_SIZE_LIMIT: u32 = 268_435_460;

/// The least `max_packet_size = "auto"` gives: 1 MiB, the fixed default it replaced.
const AUTO_PACKET_SIZE_FLOOR: u32 = 1_048_576;

/// Smallest `mqtt.max_packet_size` accepted; below this not even a CONNECT with properties fits.
pub const MIN_PACKET_SIZE: u32 = 20;

/// Smallest `mqtt.max_client_id_len`: MQTT requires servers to accept client ids of 1 to 23
/// characters (MQTT-3.1.3-5), and 3.1 clients are limited to 23.
pub const MIN_CLIENT_ID_LEN: usize = 23;

/// Default of `mqtt.max_topic_levels`: far more than any real hierarchy (EMQX uses the same
/// number), and a bound on the work one topic can cost the tries' matching.
pub(super) const DEFAULT_MAX_TOPIC_LEVELS: usize = 128;

/// Longest client id that can exist on the wire (a UTF-8 string has a 16-bit length prefix).
pub const MAX_CLIENT_ID_LEN: usize = 65_535;

/// Default of `mqtt.max_client_id_len`: room for any id in common use (UUIDs are 36 bytes,
/// cloud thing names up to 128) while a session's id stays small; MQTT 3.1.1 guarantees only
/// 23 (MQTT-3.1.3-5). Was 65,535: one anonymous address pinned sessions of 64 KB ids (issue
/// 35, sixth adversarial pass).
pub(super) const DEFAULT_MAX_CLIENT_ID_LEN: usize = 256;

/// Default of `mqtt.max_connect_size`: 256 KiB. A CONNECT carries at most a client id
/// (`max_client_id_len`), a user name, a password or token, a will topic and a will payload
/// (each at most 64 KiB, 2-byte lengths) and properties; real ones are a few KiB, and one
/// with a full 64 KiB will and a large token fits with room to spare. Far below the default
/// `max_packet_size`, so a connection that sent no credentials yet holds at most this while
/// its CONNECT arrives (issue 35, sixth adversarial pass).
pub(super) const DEFAULT_MAX_CONNECT_SIZE: u32 = 262_144;

/// What the broker does when a session's outbound queue is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverflowPolicy {
    /// Keep the queue as it is and drop the arriving message (Mosquitto's behaviour).
    #[default]
    DropNew,
    /// Drop the oldest queued message to make room: freshest data wins (telemetry).
    DropOldest,
    /// Drop nothing: a QoS 1/2 PUBLISH that would overflow any of its targets is refused for
    /// all of them (v5 PUBACK / PUBREC 0x97 Quota exceeded; a 3.x publisher is disconnected
    /// and re-sends after reconnecting), so its publisher keeps it. QoS 0 overflow is dropped
    /// as with `drop-new`. Also refuses the message to every other subscriber of the topic
    /// until the full session drains or expires: choose it where losing a message is worse
    /// than stopping its producers.
    Refuse,
}

impl OverflowPolicy {
    /// The policy as the config spells it (`drop-new`, `drop-oldest`, `refuse`), for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            OverflowPolicy::DropNew => "drop-new",
            OverflowPolicy::DropOldest => "drop-oldest",
            OverflowPolicy::Refuse => "refuse",
        }
    }
}

impl fmt::Display for OverflowPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OverflowPolicy::DropNew => "drop-new",
            OverflowPolicy::DropOldest => "drop-oldest",
            OverflowPolicy::Refuse => "refuse",
        })
    }
}

/// The memory budget for messages and partly received packets (`mqtt.max_memory`).
///
/// Written `"auto"` or a number of bytes in the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MemoryLimit {
    /// Half of what the machine or the container may use (the cgroup's `memory.max` when it
    /// is lower than physical memory), resolved at start.
    #[default]
    #[serde(with = "auto")]
    Auto,
    /// This many bytes.
    Bytes(u64),
}

/// The default largest packet: an eighth of the memory budget, at least 1 MiB (the fixed
/// default before, so a small budget refuses nothing it took) and at most the protocol's
/// largest packet (what Mosquitto's defaults take). A fixed 1 MiB made a 5 MB message from
/// paho or MQTT.js (which ignore the Maximum Packet Size CONNACK announces) a reconnect
/// storm: disconnected (v5 0x95), re-sent by the client's auto-reconnect about once a
/// second, forever, with everything behind it waiting (issue 37, item 6). An eighth, not
/// more: a packet arrives whole into its connection's read buffer, counted in the budget,
/// and one near the budget's pause mark (90%) would pause every publisher, its own sender
/// included, and could never complete; an eighth is also what anonymous clients' packets in
/// transit may hold together.
pub fn auto_packet_size(max_memory: MemoryLimit) -> u32 {
    let budget = match max_memory {
        MemoryLimit::Bytes(bytes) => bytes,
        MemoryLimit::Auto => available_memory() / 2,
    };
    u32::try_from(budget / 8)
        .unwrap_or(u32::MAX)
        .clamp(AUTO_PACKET_SIZE_FLOOR, MAX_PACKET_SIZE_LIMIT)
}

/// What the machine, or the container or systemd unit (cgroup `memory.max` when lower), may
/// use: the base of `max_memory = "auto"` and of [`auto_packet_size`].
pub fn available_memory() -> u64 {
    const FALLBACK: u64 = 4 << 30;
    let physical = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(FALLBACK);
    // cgroup v2, then v1; "max" (no limit) and absurd v1 values do not parse or are larger.
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .filter_map(|text| text.trim().parse::<u64>().ok())
    .min();
    cgroup.map_or(physical, |limit| limit.min(physical))
}

/// `max_packet_size`: a number of bytes, or `"auto"` ([`auto_packet_size`]), read as the
/// marker 0 (below any valid size) until [`MqttConfig::resolve_auto`] replaces it.
mod packet_size {
    use serde::{de, Deserialize, Deserializer, Serializer};

    /// What `"auto"` (and a missing key) reads as until it is resolved.
    pub(super) const AUTO: u32 = 0;

    pub(super) fn auto_marker() -> u32 {
        AUTO
    }

    // serde's `with` hands a reference.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub(super) fn serialize<S: Serializer>(value: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(*value)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u32),
            Word(String),
        }
        match Written::deserialize(d)? {
            Written::Bytes(AUTO) => Err(de::Error::custom(
                "must be between 20 and 268435460 bytes, or \"auto\", got 0",
            )),
            Written::Bytes(bytes) => Ok(bytes),
            Written::Word(word) if word == "auto" => Ok(AUTO),
            Written::Word(word) => Err(de::Error::custom(format!(
                "expected \"auto\" or a whole number of bytes, got {word:?}"
            ))),
        }
    }
}

/// `"auto"` as the unit variant of [`MemoryLimit`].
mod auto {
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("auto")
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
        let text = String::deserialize(d)?;
        if text == "auto" {
            Ok(())
        } else {
            Err(de::Error::custom(format!(
                "expected \"auto\" or a number of bytes, got {text:?}"
            )))
        }
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
    /// Upper bound on clients connected at once over all listeners (CONNECT accepted); a
    /// CONNECT beyond it is refused with 0x89 Server busy (3.x: 0x03). 0 = unlimited, the
    /// default: what a broker can hold depends on its memory and file descriptors, which
    /// `max_memory` and the descriptor limit already bound, so any fixed number would be too
    /// low for some deployments and meaningless for others.
    pub max_connections: usize,
    /// Largest whole MQTT packet accepted, in bytes (v5: announced as Maximum Packet Size).
    /// `"auto"` in the file (the default): [`auto_packet_size`] of `max_memory`, resolved
    /// when the file is read, so this always holds a number of bytes.
    #[serde(default = "packet_size::auto_marker", with = "packet_size")]
    pub max_packet_size: u32,
    /// Largest CONNECT accepted, in bytes (the smaller of this and `max_packet_size` applies):
    /// what a connection nobody authenticated yet may make the broker hold while it arrives
    /// (issue 35, sixth pass: half-sent CONNECTs of 1 MiB filled the memory budget).
    pub max_connect_size: u32,
    /// Cap on the client keep-alive, in seconds (v5: announced as Server Keep Alive).
    pub max_keepalive: u16,
    /// Seconds from the broker accepting a TCP connection until its CONNECT must be accepted
    /// (enhanced-authentication exchanges included); the one deadline of a connection that
    /// has not finished CONNECT, silent or sending slowly. 1..=65535.
    pub connect_timeout: u32,
    /// Seconds a packet may take to arrive once its first bytes are in, plus its size over
    /// [`MqttConfig::min_packet_rate`]: a started packet cannot pin its buffer forever, also
    /// with keep-alive 0, and a large one arriving at a reasonable rate is not cut off.
    /// 1..=65535.
    pub packet_timeout: u32,
    /// Bytes per second a large packet is granted on top of `packet_timeout`: a packet of
    /// `n` bytes must be complete `packet_timeout + n / min_packet_rate` seconds after its
    /// first bytes arrived. At least 1.
    pub min_packet_rate: u32,
    /// Per-client window of unacknowledged outbound QoS 1/2 messages.
    pub max_inflight_messages: u16,
    /// Poison messages: a QoS 1/2 message sent this many times to a session that never
    /// acknowledged it (its client crashed or disconnected each time) is taken out of the
    /// session's in-flight window and dead-lettered (`max_deliveries`), so the queue moves on.
    /// The count is stored with the session. 0 = unlimited (the MQTT default). A bridge's own
    /// session (`$bridge/<name>`, [`crate::config::BRIDGE_SESSION_PREFIX`]) is exempt: a
    /// remote that keeps failing is an outage, not a poison message; its messages wait for
    /// it as the bridge's store-and-forward promises.
    pub max_deliveries: u16,
    /// Per-session bound on messages queued beyond the in-flight window; at least 1. For a
    /// connected session that is taking messages it is the high-water mark at which its
    /// publishers are paused; for an offline or stalled one the hard bound `queue_overflow`
    /// applies at.
    pub max_queued_messages: usize,
    /// Per-session bound on queued bytes (topic, payload, properties), applied like
    /// `max_queued_messages`; 0 = no byte bound.
    pub max_queued_bytes: usize,
    /// Seconds a connected session with a full queue may go without taking a message off it
    /// before it counts as stalled: its publishers are no longer paused for it and its
    /// overflow goes to `queue_overflow`, as for an offline session. 1..=3600.
    pub stalled_after: u32,
    /// Per-client limit on PUBLISH packets per second, enforced by reading that client's
    /// socket no faster (back-pressure, nothing dropped), with one second's worth as burst;
    /// 0 = none.
    pub max_publish_rate: u32,
    /// Per-client limit on PUBLISH payload and property bytes per second, enforced like
    /// `max_publish_rate`; 0 = none.
    pub max_publish_bytes_rate: u64,
    /// Pause publishers for QoS 0 messages too (not only QoS 1 and 2) when a connected,
    /// draining subscriber's queue is full.
    pub backpressure_qos0: bool,
    /// Memory budget for messages held by the broker (queued, in flight, retained) and partly
    /// received packets: near it every publisher is paused, over it QoS 1/2 PUBLISHes are
    /// refused (v5 0x97, 3.x disconnect) and QoS 0 ones dropped and counted.
    pub max_memory: MemoryLimit,
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
    /// Longest topic name or filter accepted, in bytes (PUBLISH, will, SUBSCRIBE); 1..=65535.
    pub max_topic_length: usize,
    /// Most levels (`/`-separated parts) a topic name or filter may have; 1..=65535.
    pub max_topic_levels: usize,
    /// Most subscriptions one session may hold at once; 0 = no limit. Finite by default
    /// (issue 35, finding 6): any client, anonymous ones too, could otherwise pin filters
    /// without bound.
    pub max_subscriptions_per_client: usize,
    /// Most bytes of topic filters one session may hold at once (the sum of its filters'
    /// lengths); 0 = no limit. Bounds what long filters cost beside the count above.
    pub max_subscription_bytes_per_client: usize,
    /// Cap on the session expiry interval a client may request, in seconds.
    pub session_expiry_interval_max: u32,
    /// Cap on the session expiry interval of a client no configured method authenticated
    /// (no password checked, no certificate, token or SCRAM), in seconds; MQTT 5 clients are
    /// told it in CONNACK. Bounds how long a stranger's session outlives it.
    pub max_session_expiry_anonymous: u32,
    /// Accept the control characters U+0001..U+001F and U+007F..U+009F and the
    /// non-characters (U+FDD0..U+FDEF, U+nFFFE, U+nFFFF) in topic names (PUBLISH, will), topic
    /// filters (SUBSCRIBE, UNSUBSCRIBE), client ids, user names and the properties a message
    /// carries to subscribers (content type, response topic, user properties). MQTT says they
    /// SHOULD NOT appear and lets a receiver treat them as malformed (5.0 §1.5.4, 3.1.1
    /// §1.5.3); refusing them (false, the default, as Mosquitto) keeps them out of logs, ACLs,
    /// bridges and subscribers' clients that may not expect them. U+0000 is always malformed
    /// (MQTT-1.5.4-2).
    pub allow_control_characters: bool,
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
    /// Publish the wills of clients still connected at shutdown: MQTT-3.1.2-8 counts the
    /// server closing the connection without the client's DISCONNECT among the triggers;
    /// Mosquitto does not (false). See `config/postbox.toml` for the choice of default.
    pub wills_on_shutdown: bool,
    /// Seconds between `$SYS` updates (Mosquitto's topics, retained); 0 = no `$SYS` topics.
    /// 0..=86400.
    pub sys_interval: u32,
}

/// Default of [`MqttConfig::max_subscriptions_per_client`]: far above what a device (a few
/// command and config filters) or a dashboard (one per panel) holds.
pub(crate) const DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT: usize = 1000;

/// Default of [`MqttConfig::max_subscription_bytes_per_client`]: 1,000 filters of 256 bytes.
pub(crate) const DEFAULT_MAX_SUBSCRIPTION_BYTES_PER_CLIENT: usize = 256 * 1024;

/// Default of [`MqttConfig::max_session_expiry_anonymous`]: one day, so an unauthenticated
/// device that drops off overnight keeps its session, and nobody's lasts forever.
pub(crate) const DEFAULT_MAX_SESSION_EXPIRY_ANONYMOUS: u32 = 86_400;

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_connections: 0,
            max_packet_size: auto_packet_size(MemoryLimit::Auto),
            max_connect_size: DEFAULT_MAX_CONNECT_SIZE,
            max_keepalive: 65_535,
            connect_timeout: 10,
            packet_timeout: 30,
            min_packet_rate: 4096,
            max_inflight_messages: 100,
            max_deliveries: 0,
            max_queued_messages: 1000,
            max_queued_bytes: 16 * 1024 * 1024,
            stalled_after: 5,
            backpressure_qos0: true,
            max_publish_rate: 0,
            max_publish_bytes_rate: 0,
            max_memory: MemoryLimit::Auto,
            queue_qos0_messages: false,
            queue_overflow: OverflowPolicy::DropNew,
            retain_available: true,
            max_qos: 2,
            allow_zero_length_clientid: true,
            max_client_id_len: DEFAULT_MAX_CLIENT_ID_LEN,
            max_topic_length: 65_535,
            max_topic_levels: DEFAULT_MAX_TOPIC_LEVELS,
            max_subscriptions_per_client: DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT,
            max_subscription_bytes_per_client: DEFAULT_MAX_SUBSCRIPTION_BYTES_PER_CLIENT,
            session_expiry_interval_max: u32::MAX,
            max_session_expiry_anonymous: DEFAULT_MAX_SESSION_EXPIRY_ANONYMOUS,
            allow_control_characters: false,
            receive_maximum: 1024,
            topic_alias_maximum: 10,
            outbound_topic_aliases: OutboundTopicAliases::Off,
            wildcard_subscription_available: true,
            subscription_identifier_available: true,
            shared_subscription_available: true,
            shared_subscription_strategy: SharedStrategy::RoundRobin,
            response_information: None,
            validate_utf8_payload: false,
            wills_on_shutdown: true,
            sys_interval: 10,
        }
    }
}

impl MqttConfig {
    /// Replaces what the file left to `"auto"` by its value (`max_packet_size` from
    /// `max_memory`): once, right after parsing, before validation.
    pub(super) fn resolve_auto(&mut self) {
        if self.max_packet_size == packet_size::AUTO {
            self.max_packet_size = auto_packet_size(self.max_memory);
        }
    }

    /// The ranges the types cannot express; errors name the `mqtt.*` key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let m = self;
        let sizes = MIN_PACKET_SIZE..=MAX_PACKET_SIZE_LIMIT;
        bytes("mqtt.max_packet_size", m.max_packet_size, sizes.clone())?;
        bytes("mqtt.max_connect_size", m.max_connect_size, sizes)?;
        if m.max_keepalive == 0 {
            return Err(invalid(
                "mqtt.max_keepalive",
                "must be between 1 and 65535 seconds, got 0".to_owned(),
            ));
        }
        for (key, value) in [
            ("mqtt.connect_timeout", m.connect_timeout),
            ("mqtt.packet_timeout", m.packet_timeout),
        ] {
            seconds(key, value, 1..=u32::from(u16::MAX))?;
        }
        if m.min_packet_rate == 0 {
            return Err(invalid(
                "mqtt.min_packet_rate",
                "must be at least 1 byte per second, got 0".to_owned(),
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
        if m.sys_interval > 86_400 {
            return Err(invalid(
                "mqtt.sys_interval",
                format!(
                    "must be between 0 (off) and 86400 seconds, got {}",
                    m.sys_interval
                ),
            ));
        }
        seconds("mqtt.stalled_after", m.stalled_after, 1..=3600)?;
        if m.max_memory == MemoryLimit::Bytes(0) {
            return Err(invalid(
                "mqtt.max_memory",
                "must be \"auto\" or a number of bytes above 0, got 0".to_owned(),
            ));
        }
        if m.max_qos > 2 {
            return Err(invalid(
                "mqtt.max_qos",
                format!("must be 0, 1 or 2, got {}", m.max_qos),
            ));
        }
        let id_lens = MIN_CLIENT_ID_LEN..=MAX_CLIENT_ID_LEN;
        bytes("mqtt.max_client_id_len", m.max_client_id_len, id_lens)?;
        for (key, value) in [
            ("mqtt.max_topic_length", m.max_topic_length),
            ("mqtt.max_topic_levels", m.max_topic_levels),
        ] {
            within(key, value, 1..=65_535, "")?;
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
        Ok(())
    }
}

/// The `[mqtt]` keys a reload applies, with the config key each one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLimits {
    /// `mqtt.max_publish_rate`: read when a connection starts (its token bucket).
    pub max_publish_rate: u32,
    /// `mqtt.max_publish_bytes_rate`: read when a connection starts.
    pub max_publish_bytes_rate: u64,
    /// `mqtt.max_subscriptions_per_client`: read at every SUBSCRIBE.
    pub max_subscriptions_per_client: usize,
    /// `mqtt.max_subscription_bytes_per_client`: read at every SUBSCRIBE.
    pub max_subscription_bytes_per_client: usize,
}

impl RuntimeLimits {
    /// The config keys (dotted) a reload applies, in the order [`RuntimeLimits`] lists them;
    /// `mqtt.max_connections` (the listeners' shared slot bound) and `log.level` are applied
    /// by the server and the binary.
    pub const KEYS: &'static [&'static str] = &[
        "mqtt.max_publish_rate",
        "mqtt.max_publish_bytes_rate",
        "mqtt.max_subscriptions_per_client",
        "mqtt.max_subscription_bytes_per_client",
    ];

    /// The values in `config`.
    pub fn from_config(config: &MqttConfig) -> RuntimeLimits {
        RuntimeLimits {
            max_publish_rate: config.max_publish_rate,
            max_publish_bytes_rate: config.max_publish_bytes_rate,
            max_subscriptions_per_client: config.max_subscriptions_per_client,
            max_subscription_bytes_per_client: config.max_subscription_bytes_per_client,
        }
    }
}
