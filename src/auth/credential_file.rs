//! The error of a credentials file (the password file, the SCRAM credentials file): one type,
//! since both are read the same way (whole file, one credential per line) and a user of either
//! needs the same two answers: which file could not be read, or which line is bad.
//!
//! Must not: quote a secret or a line's text.

use std::path::PathBuf;

use thiserror::Error;

/// Why a credentials file could not be used. Names the file and the line, never a secret
/// (no hash, key or line text is quoted).
#[derive(Debug, Error)]
pub enum CredentialFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not a credential of the file's format.
    #[error("{path}:{line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the secret).
        reason: String,
    },
}
