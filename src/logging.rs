//! The process's log output: `tracing` events as text or JSON lines, with a filter SIGHUP can
//! replace.
//!
//! Lives in the library (not `main.rs`) so the precedence rules and the format choice have
//! unit tests, and so an embedding program can reuse them. Output goes to stdout: systemd and
//! container runtimes collect it, and a terminal shows it.
//!
//! Which filter is in force, highest first: `RUST_LOG` (the environment, for a one-off
//! debugging session), then `-v` (debug), then `log.level` from the config file. A reload
//! (SIGHUP) replaces the filter only when `log.level` is what chose it.
//!
//! ANSI colour codes are written only when stdout is a terminal (and `NO_COLOR` is unset): a
//! log file, a pipe or journald gets plain text.

use std::io::IsTerminal;

use thiserror::Error;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::config::{LogConfig, LogFormat};

/// Why logging could not be set up or its filter changed.
#[derive(Debug, Error)]
pub enum LogError {
    /// `RUST_LOG` holds a filter that does not parse.
    #[error("RUST_LOG is not a valid filter: {0}")]
    Env(String),
    /// A global subscriber was installed already (only the first `init` in a process wins).
    #[error("logging was set up twice: {0}")]
    Init(String),
    /// The filter could not be swapped (the subscriber is gone).
    #[error("cannot change the log filter: {0}")]
    Reload(String),
}

/// Where the filter in force came from, highest precedence first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterSource {
    /// The `RUST_LOG` environment variable.
    Env,
    /// The `-v` / `--verbose` flag (`debug`).
    Verbose,
    /// `log.level` in the config file (the only one a reload may replace).
    Config,
}

impl FilterSource {
    /// Where the filter came from, as a person names it in a log line.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterSource::Env => "RUST_LOG",
            FilterSource::Verbose => "-v",
            FilterSource::Config => "log.level",
        }
    }
}

/// Picks the filter text and its source from the environment's `RUST_LOG` (if set and not
/// empty), the `-v` flag and the config: a pure function, so the precedence is tested.
pub fn choose_filter(
    env: Option<&str>,
    verbose: bool,
    config: &LogConfig,
) -> (String, FilterSource) {
    match env.map(str::trim).filter(|e| !e.is_empty()) {
        Some(env) => (env.to_owned(), FilterSource::Env),
        None if verbose => ("debug".to_owned(), FilterSource::Verbose),
        None => (config.level.clone(), FilterSource::Config),
    }
}

/// Whether to write ANSI colour codes: only to a terminal, and not when `NO_COLOR` is set
/// (<https://no-color.org>).
pub fn use_ansi(stream_is_terminal: bool, no_color: Option<&str>) -> bool {
    stream_is_terminal && no_color.is_none_or(str::is_empty)
}

/// The installed subscriber's filter, which [`LogHandle::set_level`] replaces on reload.
#[derive(Debug)]
pub struct LogHandle {
    filter: reload::Handle<EnvFilter, Registry>,
    source: FilterSource,
    format: LogFormat,
}

impl LogHandle {
    /// Where the filter in force came from.
    pub fn source(&self) -> FilterSource {
        self.source
    }

    /// The output format chosen at start (a change needs a restart).
    pub fn format(&self) -> LogFormat {
        self.format
    }

    /// Replaces the filter with `level` (a validated `log.level`), unless `RUST_LOG` or `-v`
    /// chose the filter: returns whether it was replaced.
    ///
    /// # Errors
    ///
    /// `LogError::Reload` when `level` does not parse (validation should have caught it) or the
    /// subscriber is gone.
    pub fn set_level(&self, level: &str) -> Result<bool, LogError> {
        if self.source != FilterSource::Config {
            return Ok(false);
        }
        let filter = EnvFilter::builder()
            .parse(level)
            .map_err(|e| LogError::Reload(e.to_string()))?;
        self.filter
            .reload(filter)
            .map_err(|e| LogError::Reload(e.to_string()))?;
        Ok(true)
    }
}

/// Installs the process-wide subscriber: the filter chosen by [`choose_filter`], text or JSON
/// lines on stdout, colour only on a terminal.
///
/// # Errors
///
/// `LogError::Env` for an unparsable `RUST_LOG`, `LogError::Init` when a subscriber exists.
pub fn init(config: &LogConfig, verbose: bool) -> Result<LogHandle, LogError> {
    let env = std::env::var("RUST_LOG").ok();
    let (text, source) = choose_filter(env.as_deref(), verbose, config);
    let filter = EnvFilter::builder()
        .parse(&text)
        .map_err(|e| match source {
            FilterSource::Env => LogError::Env(e.to_string()),
            _ => LogError::Init(e.to_string()),
        })?;
    let (filter, handle) = reload::Layer::new(filter);
    // The stream actually written is stdout, so that is the one asked.
    let ansi = use_ansi(
        std::io::stdout().is_terminal(),
        std::env::var("NO_COLOR").ok().as_deref(),
    );
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match config.format {
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_ansi(ansi))
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            )
            .try_init(),
    };
    installed.map_err(|e| LogError::Init(e.to_string()))?;
    Ok(LogHandle {
        filter: handle,
        source,
        format: config.format,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(level: &str) -> LogConfig {
        LogConfig {
            level: level.to_owned(),
            ..LogConfig::default()
        }
    }

    #[test]
    fn rust_log_beats_verbose_beats_the_config() {
        let c = config("warn");
        assert_eq!(
            choose_filter(Some("trace"), true, &c),
            ("trace".to_owned(), FilterSource::Env)
        );
        assert_eq!(
            choose_filter(None, true, &c),
            ("debug".to_owned(), FilterSource::Verbose)
        );
        assert_eq!(
            choose_filter(Some("  "), false, &c),
            ("warn".to_owned(), FilterSource::Config)
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_ansi(true, None));
        assert!(use_ansi(true, Some("")));
        assert!(!use_ansi(true, Some("1")));
        assert!(!use_ansi(false, None));
    }
}
