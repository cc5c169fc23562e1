//! The message-guarantee sections (issue 16): `[dead_letter]`, `[[schema]]` and `[dedup]`
//! (`mqtt.max_deliveries` lives in `[mqtt]` with the other per-session limits).
//!
//! Each one is off or cheap by default: dead letters are on (a drop is always explained),
//! schemas and dedup only exist when configured, so an unconfigured broker pays nothing for
//! them on the publish path.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::error::{invalid, seconds, within, ConfigError};

/// The dead-letter prefix's default: `$` keeps `#` subscribers from seeing dead letters
/// (MQTT-4.7.2-1), as for `$SYS`.
pub const DEFAULT_DEAD_LETTER_PREFIX: &str = "$dlq/";

/// `[dead_letter]`: where dropped messages go instead of vanishing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeadLetterConfig {
    /// Publish a dead letter for every message dropped instead of delivered (queue full,
    /// expired in a queue, too large for the client, schema invalid, delivery limit reached,
    /// rejected by the subscriber). On by default: with nobody subscribed to the prefix it
    /// costs one trie walk per drop, bounded by `max_rate`.
    pub enabled: bool,
    /// Topic prefix: a message dropped from `a/b` becomes `<prefix>a/b`. Clients may not
    /// publish under it (like `$SYS`); reading it obeys the ACL.
    pub prefix: String,
    /// Most dead letters published per second (one second's worth as burst); the excess is
    /// counted (`postbox_dead_letters_dropped_total`). 0 = no bound.
    pub max_rate: u32,
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            enabled: true,
            prefix: DEFAULT_DEAD_LETTER_PREFIX.to_owned(),
            max_rate: 100,
        }
    }
}

/// What a `[[schema]]` does with a payload its schema refuses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemaAction {
    /// Refuse the PUBLISH: v5 PUBACK / PUBREC 0x99 Payload format invalid (QoS 0: dropped
    /// and counted); 3.x as `on_invalid_v3` says. Nothing is routed.
    #[default]
    Reject,
    /// Accept the PUBLISH (it is acknowledged) and publish it as a dead letter with reason
    /// `schema_invalid` instead of routing it.
    DeadLetter,
}

/// How a 3.x publisher, which has no negative acknowledgement, learns of a `reject`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InvalidV3 {
    /// Acknowledge and drop (counted), as Mosquitto does with an ACL denial: the client goes
    /// on with its next message.
    #[default]
    Ack,
    /// Close the connection without acknowledging: the client re-sends after reconnecting
    /// (and is refused again), which a bad producer's operator notices.
    Disconnect,
}

/// One `[[schema]]`: a payload contract for a topic filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaConfig {
    /// The schema's id, e.g. `order/v2`: a v5 PUBLISH whose Content Type is this id is checked
    /// against this schema (when its topic matches `filter`).
    pub id: String,
    /// The topic filter the contract covers (wildcards allowed, no `$share/`).
    pub filter: String,
    /// The JSON Schema file (draft 2020-12 unless the file's `$schema` says otherwise), read
    /// and compiled at start and on SIGHUP; a relative path is read from the config file's
    /// directory, as the other files (`config::paths`).
    pub file: PathBuf,
    /// What to do with an invalid payload.
    #[serde(default)]
    pub action: SchemaAction,
    /// A 3.x publisher's invalid payload under `reject`.
    #[serde(default)]
    pub on_invalid_v3: InvalidV3,
    /// The filter's default version: the one applied when the Content Type names no schema
    /// registered for the topic (absent, 3.x, or another id). At most one per filter; when
    /// none says so, the filter's first `[[schema]]` is its default.
    #[serde(default)]
    pub default: bool,
}

impl SchemaConfig {
    /// The entry a `[[schema]]` with only its three required keys gives: `action = "reject"`,
    /// `on_invalid_v3 = "ack"`, not the filter's default. For configs built in code (tests,
    /// embedders); set the other fields on the result.
    pub fn new(id: &str, filter: &str, file: impl Into<PathBuf>) -> SchemaConfig {
        SchemaConfig {
            id: id.to_owned(),
            filter: filter.to_owned(),
            file: file.into(),
            action: SchemaAction::default(),
            on_invalid_v3: InvalidV3::default(),
            default: false,
        }
    }
}

/// `[dedup]`: duplicate detection for publishers that re-send under a new packet id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DedupConfig {
    /// The v5 user property carrying the publisher's message id (e.g. `message-id`); empty =
    /// deduplication off.
    pub property: String,
    /// Seconds a (topic, id) pair is remembered: a second PUBLISH with it inside the window
    /// is acknowledged and not routed again. 1..=86400.
    pub window: u32,
    /// Most pairs remembered; the oldest go first beyond it. At least 1.
    pub max_entries: usize,
    /// Most bytes of topics and ids remembered; the oldest go first beyond it. At least 1024.
    pub max_bytes: usize,
    /// Percent of `max_entries` and of `max_bytes` one publishing session may hold: beyond
    /// it its own oldest pairs go, not other publishers' (issue 35, seventh pass, N4: one
    /// client's ~280 publishes with 60 KB ids pushed everyone else's out). 1..=100.
    pub publisher_share: u8,
}

impl Default for DedupConfig {
    fn default() -> Self {
        DedupConfig {
            property: String::new(),
            window: 60,
            max_entries: 100_000,
            max_bytes: 16 * 1024 * 1024,
            publisher_share: 10,
        }
    }
}

impl DedupConfig {
    /// True when a property is named.
    pub fn is_enabled(&self) -> bool {
        !self.property.is_empty()
    }
}

/// The rules of the three sections.
///
/// # Errors
///
/// The first rule broken, keyed `dead_letter.prefix`, `schema[i].filter`, `dedup.window`, …
pub(super) fn validate(
    dead_letter: &DeadLetterConfig,
    schemas: &[SchemaConfig],
    dedup: &DedupConfig,
) -> Result<(), ConfigError> {
    let prefix = &dead_letter.prefix;
    if dead_letter.enabled {
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(invalid(
                "dead_letter.prefix",
                format!("must end with `/` (it is put before the original topic), got {prefix:?}"),
            ));
        }
        if prefix.contains(['+', '#', '\0']) {
            return Err(invalid(
                "dead_letter.prefix",
                format!("must not contain `+`, `#` or NUL, got {prefix:?}"),
            ));
        }
        if prefix.starts_with("$SYS") || prefix.starts_with("$share") {
            return Err(invalid(
                "dead_letter.prefix",
                format!("`$SYS` and `$share` are reserved, got {prefix:?}"),
            ));
        }
    }
    for (i, schema) in schemas.iter().enumerate() {
        let key = |k: &str| format!("schema[{i}].{k}");
        if schema.id.is_empty() {
            return Err(invalid(&key("id"), "must not be empty".to_owned()));
        }
        if let Some(j) = schemas[..i].iter().position(|s| s.id == schema.id) {
            return Err(invalid(
                &key("id"),
                format!("`{}` is already the id of schema[{j}]", schema.id),
            ));
        }
        if !crate::codec::topic::is_valid_filter(&schema.filter)
            || schema.filter.starts_with("$share/")
        {
            return Err(invalid(
                &key("filter"),
                format!("`{}` is not a topic filter (no `$share/`)", schema.filter),
            ));
        }
        if schema.action == SchemaAction::DeadLetter && !dead_letter.enabled {
            return Err(invalid(
                &key("action"),
                "`dead-letter` needs `[dead_letter] enabled = true` (the payload would vanish)"
                    .to_owned(),
            ));
        }
        if schema.default {
            if let Some(j) = schemas[..i]
                .iter()
                .position(|s| s.default && s.filter == schema.filter)
            {
                return Err(invalid(
                    &key("default"),
                    format!(
                        "schema[{j}] is already the default for `{}`; one default per filter",
                        schema.filter
                    ),
                ));
            }
        }
    }
    if dedup.is_enabled() {
        seconds("dedup.window", dedup.window, 1..=86_400)?;
        if dedup.max_entries == 0 {
            return Err(invalid(
                "dedup.max_entries",
                "must be at least 1".to_owned(),
            ));
        }
        let share = dedup.publisher_share;
        within("dedup.publisher_share", share, 1..=100, " percent")?;
        if dedup.max_bytes < 1024 {
            return Err(invalid(
                "dedup.max_bytes",
                format!("must be at least 1024, got {}", dedup.max_bytes),
            ));
        }
    }
    Ok(())
}
