//! [`Config::validate`]: the whole-file rules, section by section, plus the log filter check.
//!
//! Each section checks its own ranges (`mqtt`, `storage`, `listener`); this file only decides
//! the order and holds the rules that belong to no section. Validation runs after parsing and
//! again after command-line overrides, so both are held to the same rules.

use super::error::{invalid, ConfigError};
use super::{admin, bridge, guarantees, listener, Config};

impl Config {
    /// Cross-field validation: ranges the types cannot express and options that conflict.
    ///
    /// Call it again after overriding fields (e.g. from the command line), or use
    /// [`Config::load_with`]. Errors carry the key but no file position;
    /// [`Config::from_toml_str`] adds those.
    ///
    /// # Errors
    ///
    /// The first invalid value or conflicting pair of options found, with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.mqtt.validate()?;
        if let Err(message) = check_log_filter(&self.log.level) {
            return Err(invalid("log.level", message));
        }
        self.storage.validate()?;
        listener::validate(&self.listeners, &self.metrics)?;
        self.check_connection_bounds()?;
        admin::validate(&self.admin, &self.metrics, &self.listeners)?;
        admin::validate_metrics(&self.metrics)?;
        self.auth.validate_login_limits()?;
        bridge::validate(&self.bridges)?;
        if let Some(cluster) = &self.cluster {
            super::cluster::validate(cluster)?;
        }
        guarantees::validate(&self.dead_letter, &self.schemas, &self.dedup)
    }

    /// A listener's connection bound above the broker's (`mqtt.max_connections`) would never
    /// apply: reported on the listener's key, as the per-listener rule is.
    fn check_connection_bounds(&self) -> Result<(), ConfigError> {
        let global = self.mqtt.max_connections;
        if global == 0 {
            return Ok(());
        }
        for (i, l) in self.listeners.iter().enumerate() {
            for (key, value) in [
                ("max_connections", l.max_connections),
                ("max_connections_per_ip", l.max_connections_per_ip),
            ] {
                if value > global {
                    return Err(invalid(
                        &format!("listener[{i}].{key}"),
                        format!(
                            "{value} is above mqtt.max_connections ({global}), the bound of \
                             all listeners together, so it would never apply"
                        ),
                    ));
                }
            }
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
