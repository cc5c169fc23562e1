//! Schema contracts (`[[schema]]`): JSON Schema documents bound to topic filters, compiled at
//! start and on SIGHUP, checked once per PUBLISH before fan-out.
//!
//! Which schema a PUBLISH meets: among the entries whose filter matches its topic, the one
//! whose `id` is the PUBLISH's v5 Content Type; else the default of the first matching
//! entry's filter (the entry of that filter with `default = true`, else its first entry).
//! The walk over the entries allocates nothing; only a topic some entry covers pays for
//! parsing its payload.
//!
//! The validator is `jsonschema` without its default features: no HTTP or file resolving, so
//! a `$ref` to anything outside the file fails at load instead of reaching out at run time.
//!
//! Must not: echo payload values into reasons or logs; fetch anything at run time; exist when no
//! `[[schema]]` is configured.

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::codec::topic::matching::matches;
use crate::config::{InvalidV3, SchemaAction, SchemaConfig};

/// Longest `why` handed out (bytes): it becomes a v5 Reason String and a log field, and a
/// schema's error message can quote long `enum` lists.
pub(crate) const MAX_WHY_BYTES: usize = 200;

/// Why the schemas could not be loaded (at start: the broker does not start; on reload: the
/// running ones stay).
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A file could not be read or is not a valid JSON Schema.
    #[error("schema[{index}] ({id}): {path}: {why}")]
    Load {
        /// Index of the `[[schema]]` entry.
        index: usize,
        /// Its id.
        id: String,
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// What a payload's check says.
#[derive(Debug)]
pub enum Verdict {
    /// No schema covers the topic, or the payload is valid: route it.
    Pass,
    /// The payload breaks the schema `schema_id`.
    Invalid {
        /// The schema that refused it.
        schema_id: String,
        /// What the configuration says to do.
        action: SchemaAction,
        /// For a 3.x publisher under `reject`.
        on_invalid_v3: InvalidV3,
        /// The first error, for the v5 Reason String and the log (at most
        /// [`MAX_WHY_BYTES`]).
        why: String,
    },
}

/// One compiled `[[schema]]`.
struct Entry {
    config: SchemaConfig,
    validator: jsonschema::Validator,
    /// Index of the entry that is the default of this entry's filter.
    default: usize,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.config.id)
            .field("filter", &self.config.filter)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

/// The compiled `[[schema]]` entries, in file order.
#[derive(Debug, Default)]
pub struct SchemaRegistry {
    entries: Vec<Entry>,
}

impl SchemaRegistry {
    /// Reads and compiles every entry's file.
    ///
    /// # Errors
    ///
    /// The first entry whose file cannot be read or compiled.
    pub fn load(configs: &[SchemaConfig]) -> Result<SchemaRegistry, SchemaError> {
        let mut entries = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let fail = |why: String| SchemaError::Load {
                index,
                id: config.id.clone(),
                path: config.file.display().to_string(),
                why,
            };
            let validator = compile(&config.file).map_err(fail)?;
            // The filter's `default = true` entry, else its first entry.
            let same_filter = |c: &&SchemaConfig| c.filter == config.filter;
            let default = configs
                .iter()
                .position(|c| same_filter(&c) && c.default)
                .or_else(|| configs.iter().position(|c| same_filter(&c)))
                .unwrap_or(index);
            entries.push(Entry {
                config: config.clone(),
                validator,
                default,
            });
        }
        Ok(SchemaRegistry { entries })
    }

    /// The entries this registry was compiled from, in file order.
    pub fn configs(&self) -> Vec<SchemaConfig> {
        self.entries.iter().map(|e| e.config.clone()).collect()
    }

    /// The schema a PUBLISH on `topic` with `content_type` meets (see the module doc), or
    /// `None` when no entry covers the topic. Allocates nothing.
    fn select(&self, topic: &str, content_type: Option<&str>) -> Option<&Entry> {
        let mut first = None;
        for (i, entry) in self.entries.iter().enumerate() {
            if !matches(&entry.config.filter, topic) {
                continue;
            }
            if content_type == Some(entry.config.id.as_str()) {
                return Some(entry);
            }
            first.get_or_insert(i);
        }
        first.map(|i| &self.entries[self.entries[i].default])
    }

    /// Checks one PUBLISH: the schema its Content Type names among those whose filter matches
    /// `topic`, else the filter's default; `Pass` when none covers the topic. A payload that
    /// is not UTF-8 JSON is invalid.
    pub fn check(&self, topic: &str, content_type: Option<&str>, payload: &[u8]) -> Verdict {
        let Some(entry) = self.select(topic, content_type) else {
            return Verdict::Pass;
        };
        let why = match serde_json::from_slice::<serde_json::Value>(payload) {
            Ok(value) => {
                if entry.validator.is_valid(&value) {
                    return Verdict::Pass;
                }
                match entry.validator.validate(&value) {
                    Ok(()) => return Verdict::Pass,
                    Err(error) => {
                        let at = error.instance_path().as_str();
                        let at = if at.is_empty() { "/" } else { at };
                        format!("{at}: {}", error.masked())
                    }
                }
            }
            Err(error) => format!("not JSON: {error}"),
        };
        Verdict::Invalid {
            schema_id: entry.config.id.clone(),
            action: entry.config.action,
            on_invalid_v3: entry.config.on_invalid_v3,
            why: bounded(why),
        }
    }
}

/// Reads and compiles one schema file.
fn compile(path: &Path) -> Result<jsonschema::Validator, String> {
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let schema: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("not JSON: {e}"))?;
    jsonschema::options()
        .build(&schema)
        .map_err(|e| format!("not a valid JSON Schema: {}", bounded(e.to_string())))
}

/// `why` cut to [`MAX_WHY_BYTES`] at a character boundary, marked with `…` when cut.
fn bounded(mut why: String) -> String {
    if why.len() > MAX_WHY_BYTES {
        let mut end = MAX_WHY_BYTES - '…'.len_utf8();
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push('…');
    }
    why
}

/// The registry in force, swapped whole by a reload (SIGHUP) that compiled every file.
#[derive(Debug)]
pub struct SchemaSlot {
    current: ArcSwap<SchemaRegistry>,
}

impl SchemaSlot {
    /// Compiles `configs` into a slot.
    ///
    /// # Errors
    ///
    /// See [`SchemaRegistry::load`].
    pub fn load(configs: &[SchemaConfig]) -> Result<SchemaSlot, SchemaError> {
        Ok(SchemaSlot {
            current: ArcSwap::from_pointee(SchemaRegistry::load(configs)?),
        })
    }

    /// The registry in force.
    pub fn current(&self) -> arc_swap::Guard<Arc<SchemaRegistry>> {
        self.current.load()
    }

    /// The entries this slot reloads.
    pub fn configs(&self) -> Vec<SchemaConfig> {
        self.current.load().configs()
    }

    /// Compiles a new `[[schema]]` list (a reloaded config file) and puts it in force; when a
    /// file does not compile the running schemas stay.
    ///
    /// # Errors
    ///
    /// See [`SchemaRegistry::load`].
    pub fn replace(&self, configs: &[SchemaConfig]) -> Result<(), SchemaError> {
        let registry = SchemaRegistry::load(configs)?;
        self.current.store(Arc::new(registry));
        Ok(())
    }
}

impl crate::reload::Reload for SchemaSlot {
    fn what(&self) -> String {
        "schemas".to_owned()
    }

    fn reload(&self) -> Result<(), String> {
        self.replace(&self.configs()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER_V1: &str = r#"{"type":"object","required":["id","qty"],
        "properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}}"#;
    const ORDER_V2: &str = r#"{"type":"object","required":["id","items"],
        "properties":{"id":{"type":"string"},"items":{"type":"array","minItems":1}}}"#;
    const ANYTHING_ARRAY: &str = r#"{"type":"array"}"#;

    struct Files(tempfile::TempDir);

    impl Files {
        fn new() -> Files {
            Files(tempfile::tempdir().expect("temp dir"))
        }

        fn put(&self, name: &str, text: &str) -> std::path::PathBuf {
            let path = self.0.path().join(name);
            std::fs::write(&path, text).expect("write schema");
            path
        }
    }

    fn entry(id: &str, filter: &str, file: &Path, default: bool) -> SchemaConfig {
        SchemaConfig {
            default,
            ..SchemaConfig::new(id, filter, file)
        }
    }

    fn id_of(v: &Verdict) -> Option<&str> {
        match v {
            Verdict::Pass => None,
            Verdict::Invalid { schema_id, .. } => Some(schema_id),
        }
    }

    fn selected<'a>(r: &'a SchemaRegistry, topic: &str, ct: Option<&str>) -> Option<&'a str> {
        r.select(topic, ct).map(|e| e.config.id.as_str())
    }

    #[test]
    fn content_type_picks_the_version_else_the_first_entry_of_the_filter() {
        let f = Files::new();
        let (v1, v2) = (f.put("v1.json", ORDER_V1), f.put("v2.json", ORDER_V2));
        let r = SchemaRegistry::load(&[
            entry("order/v1", "orders/#", &v1, false),
            entry("order/v2", "orders/#", &v2, false),
        ])
        .expect("compiles");
        assert_eq!(
            selected(&r, "orders/eu", Some("order/v2")),
            Some("order/v2")
        );
        assert_eq!(
            selected(&r, "orders/eu", Some("order/v1")),
            Some("order/v1")
        );
        assert_eq!(selected(&r, "orders/eu", None), Some("order/v1"));
        assert_eq!(
            selected(&r, "orders/eu", Some("text/plain")),
            Some("order/v1")
        );
        assert_eq!(
            selected(&r, "orders", None),
            Some("order/v1"),
            "`#` covers the parent"
        );
        assert_eq!(selected(&r, "invoices/eu", Some("order/v2")), None);
    }

    #[test]
    fn default_true_wins_over_file_order() {
        let f = Files::new();
        let (v1, v2) = (f.put("v1.json", ORDER_V1), f.put("v2.json", ORDER_V2));
        let r = SchemaRegistry::load(&[
            entry("order/v1", "orders/#", &v1, false),
            entry("order/v2", "orders/#", &v2, true),
        ])
        .expect("compiles");
        assert_eq!(selected(&r, "orders/eu", None), Some("order/v2"));
        assert_eq!(
            selected(&r, "orders/eu", Some("order/v1")),
            Some("order/v1")
        );
    }

    #[test]
    fn several_filters_the_first_matching_entry_decides_and_any_names_a_version() {
        let f = Files::new();
        let (v1, v2, arr) = (
            f.put("v1.json", ORDER_V1),
            f.put("v2.json", ORDER_V2),
            f.put("arr.json", ANYTHING_ARRAY),
        );
        let r = SchemaRegistry::load(&[
            entry("other", "sensors/+", &arr, false),
            entry("eu", "orders/eu", &v1, false),
            entry("all", "orders/#", &v2, false),
            entry("all/v9", "orders/#", &arr, true),
        ])
        .expect("compiles");
        // `orders/eu` is first in file order among the matching filters: its default.
        assert_eq!(selected(&r, "orders/eu", None), Some("eu"));
        // Another matching filter's version is still selected by name.
        assert_eq!(selected(&r, "orders/eu", Some("all")), Some("all"));
        // Only `orders/#` matches: its `default = true`.
        assert_eq!(selected(&r, "orders/us", None), Some("all/v9"));
        // A name whose filter does not match is no version for this topic.
        assert_eq!(selected(&r, "orders/us", Some("other")), Some("all/v9"));
        // MQTT-4.7.2-1: a wildcard first level does not cover `$` topics.
        let r = SchemaRegistry::load(&[entry("x", "#", &arr, false)]).expect("compiles");
        assert_eq!(selected(&r, "$dlq/a", None), None);
    }

    #[test]
    fn payloads_valid_invalid_and_not_json() {
        let f = Files::new();
        let v1 = f.put("v1.json", ORDER_V1);
        let r =
            SchemaRegistry::load(&[entry("order/v1", "orders/#", &v1, false)]).expect("compiles");
        let check = |p: &[u8]| r.check("orders/1", None, p);
        assert!(matches!(check(br#"{"id":"a","qty":1}"#), Verdict::Pass));
        assert!(matches!(check(b"anything"), Verdict::Invalid { .. }));
        for bad in [
            &br#"{"id":"a","qty":0}"#[..],
            br#"{"id":"a"}"#,
            br#"{"id":1,"qty":2}"#,
            br#"[1]"#,
            b"",
            b"\xff\xfe{}",
            b"{\"id\":\"\xff\",\"qty\":1}",
        ] {
            assert_eq!(id_of(&check(bad)), Some("order/v1"), "{bad:?}");
        }
        let Verdict::Invalid { why, .. } = check(br#"{"id":"a","qty":0}"#) else {
            panic!("invalid");
        };
        assert!(why.starts_with("/qty: "), "{why}");
        // Not covered: anything goes.
        assert!(matches!(r.check("other", None, b"\xff"), Verdict::Pass));
    }

    #[test]
    fn why_is_bounded_and_masks_the_payload() {
        let f = Files::new();
        let long_enum: Vec<String> = (0..200).map(|i| format!("\"value-number-{i}\"")).collect();
        let path = f.put(
            "enum.json",
            &format!(r#"{{"enum":[{}]}}"#, long_enum.join(",")),
        );
        let r = SchemaRegistry::load(&[entry("e", "#", &path, false)]).expect("compiles");
        let secret = format!("\"{}\"", "s".repeat(10_000));
        let Verdict::Invalid { why, .. } = r.check("t", None, secret.as_bytes()) else {
            panic!("invalid");
        };
        assert!(why.len() <= MAX_WHY_BYTES, "{}", why.len());
        assert!(!why.contains("ssss"), "the payload is not echoed: {why}");
        assert_eq!(bounded("é".repeat(150)).len(), MAX_WHY_BYTES - 1);
    }

    #[test]
    fn a_bad_file_names_entry_id_and_file() {
        let f = Files::new();
        let good = f.put("good.json", ORDER_V1);
        let broken = f.put("broken.json", "{ not json");
        let not_schema = f.put("not-schema.json", r#"{"type": 12}"#);
        let remote = f.put(
            "remote.json",
            r#"{"$ref": "https://schemas.invalid/order.json"}"#,
        );
        let missing = f.0.path().join("missing.json");
        for (bad, what) in [
            (&broken, "not JSON"),
            (&not_schema, "not a valid JSON Schema"),
            (&remote, ""),
            (&missing, ""),
        ] {
            let error = SchemaRegistry::load(&[
                entry("good", "a/#", &good, false),
                entry("bad/v1", "b/#", bad, false),
            ])
            .expect_err("must fail");
            let text = error.to_string();
            assert!(text.starts_with("schema[1] (bad/v1): "), "{text}");
            assert!(text.contains(&bad.display().to_string()), "{text}");
            assert!(text.contains(what), "{text}");
        }
    }

    #[test]
    fn reload_keeps_the_running_schemas_when_a_file_breaks() {
        use crate::reload::Reload;
        let f = Files::new();
        let path = f.put("order.json", ORDER_V1);
        let slot = SchemaSlot::load(&[entry("o", "orders/#", &path, false)]).expect("compiles");
        let bad = br#"{"id":"a","qty":0}"#;
        assert!(matches!(
            slot.current().check("orders/1", None, bad),
            Verdict::Invalid { .. }
        ));
        f.put("order.json", "{ broken");
        assert!(slot.reload().expect_err("kept").contains("order.json"));
        assert!(matches!(
            slot.current().check("orders/1", None, bad),
            Verdict::Invalid { .. }
        ));
        f.put("order.json", r#"{"type":"object"}"#);
        slot.reload().expect("reloaded");
        assert!(matches!(
            slot.current().check("orders/1", None, bad),
            Verdict::Pass
        ));
        // A new list (the config file reloaded) replaces the entries.
        slot.replace(&[entry("o", "other/#", &path, false)])
            .expect("compiles");
        assert_eq!(slot.configs()[0].filter, "other/#");
    }
}
