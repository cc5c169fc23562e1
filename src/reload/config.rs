//! What SIGHUP does with the config file (`-c`): which changed keys take effect at once, and
//! which need a restart.
//!
//! A reload re-reads and fully validates the file (the binary does, with the command line's
//! overrides applied as at start); a file that does not load is rejected whole and the running
//! config kept. Of a valid file, only the keys in [`RUNTIME_KEYS`] are applied: each is read
//! per new connection, per SUBSCRIBE or per log event, so a new value cannot contradict what a
//! running session was told. Every other changed key is reported as needing a restart and the
//! running value stays; [`ConfigChanges::running`] is the config actually in force after the
//! reload, so the next reload compares against it and reports the same keys again.
//!
//! Must not: read files (the binary loads and validates the file).

use crate::config::{Config, RuntimeLimits};

/// The keys a reload applies to the running broker. `log.level` is applied by the binary
/// (the log subscriber is the process's), unless `RUST_LOG` or `-v` chose the filter.
pub(crate) const RUNTIME_KEYS: &[&str] = &[
    "log.level",
    "mqtt.max_connections",
    "mqtt.max_publish_rate",
    "mqtt.max_publish_bytes_rate",
    "mqtt.max_subscriptions_per_client",
    "mqtt.max_subscription_bytes_per_client",
    "schema",
];

/// True for a key a reload applies: one of [`RUNTIME_KEYS`], or a key inside it
/// (`schema[0].file` is part of `schema`, the `[[schema]]` list, swapped whole).
pub(crate) fn is_runtime(key: &str) -> bool {
    RUNTIME_KEYS.iter().any(|k| {
        key == *k
            || key
                .strip_prefix(k)
                .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
    })
}

/// The outcome of comparing a reloaded config with the running one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigChanges {
    /// Changed keys now in force (a subset of [`RUNTIME_KEYS`]).
    pub applied: Vec<String>,
    /// Changed keys whose running value stays until a restart.
    pub needs_restart: Vec<String>,
    /// The running config with the applied keys' new values.
    pub running: Config,
}

/// Compares `new` with `running`: which keys changed, which of those apply now, and the
/// config in force afterwards.
pub(crate) fn compare(running: &Config, new: &Config) -> ConfigChanges {
    let mut applied = Vec::new();
    let mut needs_restart = Vec::new();
    for key in changed_keys(running, new) {
        if is_runtime(&key) {
            applied.push(key);
        } else {
            needs_restart.push(key);
        }
    }
    let mut after = running.clone();
    after.log.level.clone_from(&new.log.level);
    after.mqtt.max_connections = new.mqtt.max_connections;
    let limits = RuntimeLimits::from_config(&new.mqtt);
    after.mqtt.max_publish_rate = limits.max_publish_rate;
    after.mqtt.max_publish_bytes_rate = limits.max_publish_bytes_rate;
    after.mqtt.max_subscriptions_per_client = limits.max_subscriptions_per_client;
    after.mqtt.max_subscription_bytes_per_client = limits.max_subscription_bytes_per_client;
    // Compiled and swapped in by the server (`RunningServer::reload_config`), which puts the
    // running list back when a file does not compile or the broker started without schemas.
    after.schemas.clone_from(&new.schemas);
    ConfigChanges {
        applied,
        needs_restart,
        running: after,
    }
}

/// The dotted keys (`mqtt.max_qos`, `listener[1].bind`) whose values differ, sorted by key;
/// a list of tables that changed length is one key (`listener`).
pub(crate) fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let (Ok(old), Ok(new)) = (toml::Value::try_from(old), toml::Value::try_from(new)) else {
        // Not expected (a `Config` always serializes); say the whole file differs.
        return vec!["<config>".to_owned()];
    };
    let mut out = Vec::new();
    diff("", Some(&old), Some(&new), &mut out);
    out
}

fn diff(key: &str, old: Option<&toml::Value>, new: Option<&toml::Value>, out: &mut Vec<String>) {
    use toml::Value;
    match (old, new) {
        (Some(Value::Table(a)), Some(Value::Table(b))) => {
            let mut keys: Vec<&String> = a.keys().collect();
            keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
            for k in keys {
                let child = if key.is_empty() {
                    k.clone()
                } else {
                    format!("{key}.{k}")
                };
                diff(&child, a.get(k), b.get(k), out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b)))
            if a.len() == b.len() && a.iter().all(Value::is_table) =>
        {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{key}[{i}]"), Some(x), Some(y), out);
            }
        }
        (a, b) if a != b => out.push(key.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::from_toml_str(text, "test.toml").expect("valid")
    }

    #[test]
    fn runtime_keys_apply_and_the_rest_need_a_restart() {
        let running = parse("[mqtt]\nmax_publish_rate = 10\n");
        let new = parse(
            "[mqtt]\nmax_publish_rate = 20\nmax_qos = 1\n[log]\nlevel = \"debug\"\n\
             [[listener]]\nbind = \"127.0.0.1:1884\"\n",
        );
        let changes = compare(&running, &new);
        assert_eq!(changes.applied, ["log.level", "mqtt.max_publish_rate"]);
        assert_eq!(changes.needs_restart, ["listener[0].bind", "mqtt.max_qos"]);
        assert_eq!(changes.running.mqtt.max_publish_rate, 20);
        assert_eq!(changes.running.mqtt.max_qos, 2, "the running value stays");
        assert_eq!(changes.running.log.level, "debug");
        // Compared again, the same key still needs the restart; the applied ones are done.
        let again = compare(&changes.running, &new);
        assert!(again.applied.is_empty());
        assert_eq!(again.needs_restart, changes.needs_restart);
    }

    #[test]
    fn a_listener_added_is_one_key() {
        let running = parse("[[listener]]\nbind = \"127.0.0.1:1884\"\n");
        let new = parse(
            "[[listener]]\nbind = \"127.0.0.1:1884\"\n[[listener]]\nbind = \"127.0.0.1:1885\"\n",
        );
        assert_eq!(changed_keys(&running, &new), ["listener"]);
        assert!(changed_keys(&running, &running).is_empty());
    }

    #[test]
    fn every_runtime_key_is_a_real_key() {
        // A key renamed in the config but not here would never be applied.
        let running = Config::default();
        let mut new = Config::default();
        new.log.level = "debug".into();
        new.mqtt.max_connections = 7;
        new.mqtt.max_publish_rate = 7;
        new.mqtt.max_publish_bytes_rate = 7;
        new.mqtt.max_subscriptions_per_client = 7;
        new.mqtt.max_subscription_bytes_per_client = 7;
        new.schemas
            .push(crate::config::SchemaConfig::new("a", "a/#", "a.json"));
        let mut applied = compare(&running, &new).applied;
        applied.sort_unstable();
        let mut keys = RUNTIME_KEYS.to_vec();
        keys.sort_unstable();
        assert_eq!(applied, keys);
    }

    #[test]
    fn a_changed_schema_list_is_applied_whole() {
        let one = "[[schema]]\nid = \"a\"\nfilter = \"a/#\"\nfile = \"a.json\"\n";
        let running = parse(one);
        let new = parse(&one.replace("a.json", "b.json"));
        let changes = compare(&running, &new);
        assert_eq!(changes.applied, ["schema[0].file"]);
        assert!(changes.needs_restart.is_empty());
        assert_eq!(changes.running.schemas, new.schemas);
        let two = format!("{one}[[schema]]\nid = \"b\"\nfilter = \"b\"\nfile = \"b.json\"\n");
        assert_eq!(compare(&running, &parse(&two)).applied, ["schema"]);
        assert_eq!(compare(&Config::default(), &running).applied, ["schema"]);
        assert!(!is_runtime("schemas"), "a prefix is not a key");
    }
}
