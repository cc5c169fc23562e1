//! Command-line overrides (`-p`, `--metrics-port`, `--data-dir`), applied to the loaded file
//! and then validated with it.
//!
//! They live here rather than in `main.rs` so that an override is held to the same rules as
//! the file (a `-p` that clashes with the metrics port is a config error, not a bind failure),
//! and so that the error can say which flag set the value.

use std::path::PathBuf;

use super::Config;

/// Values given on the command line that replace parts of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Port of the first listener (`-p/--port`); its address stays as configured.
    pub port: Option<u16>,
    /// Port of `metrics.bind` (`--metrics-port`); 0 turns the metrics endpoint off.
    pub metrics_port: Option<u16>,
    /// `storage.dir` (`--data-dir`); also turns persistence on.
    pub data_dir: Option<PathBuf>,
}

impl Overrides {
    /// Writes the overridden values into `config` (without validating; see
    /// [`Config::load_with`]).
    pub fn apply(&self, config: &mut Config) {
        if let (Some(port), Some(first)) = (self.port, config.listeners.first_mut()) {
            first.bind.set_port(port);
        }
        match self.metrics_port {
            Some(0) => config.metrics.enabled = false,
            Some(port) => {
                config.metrics.enabled = true;
                config.metrics.bind.set_port(port);
            }
            None => {}
        }
        if let Some(dir) = &self.data_dir {
            config.storage.dir = Some(dir.clone());
            config.storage.persistence = true;
        }
    }

    /// "`listener[0].bind` has its port from `-p 9000`"-style notes for the overridden keys
    /// that `text` (an error's key and message) mentions; empty if none.
    pub(super) fn notes_for(&self, text: &str) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(port) = self.port {
            if text.contains("listener[0]") || text.contains("listener.bind") {
                notes.push(format!(
                    "the first listener's port is {port} from `-p {port}`"
                ));
            }
        }
        if let Some(port) = self.metrics_port {
            if text.contains("metrics.bind") {
                notes.push(format!(
                    "the metrics port is {port} from `--metrics-port {port}`"
                ));
            }
        }
        if let Some(dir) = &self.data_dir {
            if text.contains("storage.dir") {
                notes.push(format!(
                    "storage.dir is {} from `--data-dir`",
                    dir.display()
                ));
            }
        }
        notes
    }
}
