//! [`Config::validate`]: the whole-file rules, section by section, plus the log filter check.
//!
//! Each section checks its own ranges (`mqtt`, `storage`, `listener`); this file only decides
//! the order and holds the rules that belong to no section. Validation runs after parsing and
//! again after command-line overrides, so both are held to the same rules.

use super::error::{invalid, ConfigError};
use super::{listener, Config};

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
        listener::validate(&self.listeners, &self.metrics)
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
