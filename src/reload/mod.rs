//! What SIGHUP reloads: credentials, ACLs and certificates read from files.
//!
//! Each file-backed part of the broker (a TLS listener's certificate, the password file, the
//! ACL) registers a [`Reload`] with the server at start-up. On SIGHUP (or
//! `server::RunningServer::reload`) every one re-reads its files. A part whose new
//! files are bad keeps what it had and says why: a typo in a file must never lock a fleet
//! out. The new state applies to what comes next (new handshakes, the next ACL check);
//! connections already established are not touched, except that new JWT keys make every
//! client connected with a token check it again (`server::JwtReload`).

use std::fmt;
use std::sync::Arc;

/// One part of the broker that can re-read its files while running.
pub(crate) trait Reload: Send + Sync + 'static {
    /// What it is, for the log line (`listener tls: certificate`, `password file`).
    fn what(&self) -> String;

    /// Reads the files again and swaps the new state in, or keeps the old one.
    ///
    /// # Errors
    ///
    /// Why the new files could not be used (file, line, reason); the old state is kept.
    fn reload(&self) -> Result<(), String>;
}

/// Everything registered for reload, in registration order.
#[derive(Clone, Default)]
pub(crate) struct Reloaders {
    parts: Vec<Arc<dyn Reload>>,
}

impl fmt::Debug for Reloaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.parts.iter().map(|p| p.what()))
            .finish()
    }
}

/// The outcome of one reload: which parts took their new files and which kept the old ones.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Parts that now use their new files.
    pub reloaded: Vec<String>,
    /// Parts that kept their old state, with the reason.
    pub kept: Vec<(String, String)>,
}

impl Reloaders {
    /// Adds a part to reload on SIGHUP.
    pub(crate) fn register(&mut self, part: Arc<dyn Reload>) {
        self.parts.push(part);
    }

    /// True when nothing is registered (SIGHUP then only logs that there is nothing to do).
    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Reloads every part, logging each outcome; one part's failure does not stop the others.
    pub(crate) fn reload_all(&self) -> ReloadReport {
        let mut report = ReloadReport::default();
        for part in &self.parts {
            let what = part.what();
            match part.reload() {
                Ok(()) => {
                    tracing::info!(part = %what, "reloaded");
                    report.reloaded.push(what);
                }
                Err(error) => {
                    tracing::error!(part = %what, %error, "reload failed; keeping the running state");
                    report.kept.push((what, error));
                }
            }
        }
        report
    }
}

pub(crate) mod config;
