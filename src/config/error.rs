//! Configuration errors, and finding where in the text a problem is.
//!
//! A broker that refuses to start must say exactly why, so every error names the file, the
//! dotted key (`mqtt.max_inflight_messages`, `listener[1].bind` for the second `[[listener]]`)
//! and the line. Parse errors get their position from the TOML span; validation errors only
//! know their key, and [`ConfigError::locate`] finds the line by re-parsing the text.

use std::path::PathBuf;

/// Why a configuration could not be loaded; every variant says where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file we tried to read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or a value has the wrong type, or a key is unknown.
    #[error("{}", fmt_parse(origin, *line, *column, key.as_deref(), message))]
    Parse {
        /// The file name (or another description of where the text came from).
        origin: String,
        /// 1-based line of the problem; 0 if unknown.
        line: usize,
        /// 1-based column (in characters) of the problem; 0 if unknown.
        column: usize,
        /// Dotted key path (`mqtt.max_qos`), when the problem concerns a key.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The value parsed but is out of range or inconsistent with another value.
    #[error("{}", fmt_invalid(origin.as_deref(), *line, key, message))]
    Invalid {
        /// The file name, when the configuration came from text; `None` for a built `Config`.
        origin: Option<String>,
        /// Dotted key path of the offending option (`mqtt.max_inflight_messages`).
        key: String,
        /// 1-based line where the key is set, if it is set in the text at all.
        line: Option<usize>,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A command-line override that the file cannot take (`--cluster-node` without a
    /// `[cluster]` section): no key of the file is wrong, the combination is.
    #[error("{origin}: {message}")]
    Override {
        /// The file name (or the embedded default's description).
        origin: String,
        /// Which flag, and what it needs.
        message: String,
    },
}

fn fmt_parse(origin: &str, line: usize, column: usize, key: Option<&str>, message: &str) -> String {
    let mut s = origin.to_owned();
    if line > 0 {
        s.push_str(&format!(":{line}"));
        if column > 0 {
            s.push_str(&format!(":{column}"));
        }
    }
    match key {
        Some(key) => s.push_str(&format!(": key `{key}`: {message}")),
        None => s.push_str(&format!(": {message}")),
    }
    s
}

fn fmt_invalid(origin: Option<&str>, line: Option<usize>, key: &str, message: &str) -> String {
    let place = match (origin, line) {
        (Some(o), Some(l)) => format!("{o}:{l}: "),
        (Some(o), None) => format!("{o}: "),
        (None, Some(l)) => format!("line {l}: "),
        (None, None) => String::new(),
    };
    format!("{place}invalid value for key `{key}`: {message}")
}

/// `value` of `key` within `range`, else an `Invalid` error saying "must be between `lo` and
/// `hi``unit`, got `value`": the rule of most numeric keys, said the same way for each
/// (`unit` with its leading space, " seconds", or "" for a count).
pub(super) fn within<T: PartialOrd + Copy + std::fmt::Display>(
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
    unit: &str,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    let (lo, hi) = range.into_inner();
    Err(invalid(
        key,
        format!("must be between {lo} and {hi}{unit}, got {value}"),
    ))
}

/// [`within`] with its unit: `seconds`, `millis` and `bytes`, each the check of its unit.
macro_rules! within_unit {
    ($($name:ident: $unit:literal),*) => {$(
        #[doc = concat!("[`within`], in", $unit, ".")]
        pub(super) fn $name<T: PartialOrd + Copy + std::fmt::Display>(
            key: &str,
            value: T,
            range: std::ops::RangeInclusive<T>,
        ) -> Result<(), ConfigError> {
            within(key, value, range, $unit)
        }
    )*};
}
within_unit!(seconds: " seconds", millis: " milliseconds", bytes: " bytes");

/// An `Invalid` error for `key` with no position yet (see [`ConfigError::locate`]).
pub(super) fn invalid(key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: None,
        key: key.to_owned(),
        line: None,
        message,
    }
}

impl ConfigError {
    /// Adds the origin and the key's line to an `Invalid` error produced by `validate`.
    ///
    /// Keys of array entries are produced as `listener[0].bind`; when the text wrote that
    /// array as a single table (`[listener]`), the key and message are respelled the way the
    /// text has it (`listener.bind`), so the user finds what they wrote.
    pub(super) fn locate(self, text: &str, origin: &str) -> ConfigError {
        match self {
            ConfigError::Invalid {
                key, line, message, ..
            } => {
                let doc = toml::de::DeTable::parse(text).ok();
                let doc = doc.as_ref().map(toml::Spanned::get_ref);
                let (key, message) = match doc {
                    Some(doc) => (respell(doc, &key), respell(doc, &message)),
                    None => (key, message),
                };
                ConfigError::Invalid {
                    line: line.or_else(|| key_line(text, &key)),
                    origin: Some(origin.to_owned()),
                    key,
                    message,
                }
            }
            other => other,
        }
    }
}

/// Rewrites `name[0]` to `name` for every top-level `name` that `doc` holds as a table rather
/// than an array (the one-table spelling of a one-entry array, like `[listener]`).
fn respell(doc: &toml::de::DeTable<'_>, s: &str) -> String {
    let mut out = s.to_owned();
    for (k, v) in doc {
        if v.get_ref().is_table() {
            out = out.replace(&format!("{}[0]", k.get_ref()), k.get_ref());
        }
    }
    out
}

/// Converts a toml error into `Parse`, computing line/column from its span.
pub(super) fn parse_error(
    text: &str,
    origin: &str,
    e: &toml::de::Error,
    key: Option<String>,
) -> ConfigError {
    let found = e.span().and_then(|span| text.get(span));
    let (line, column) = match e.span() {
        Some(span) => line_col(text, span.start),
        // No span (rare): fall back to where the key is written, if we know the key.
        None => key
            .as_deref()
            .and_then(|k| key_line(text, k))
            .map_or((0, 0), |l| (l, 0)),
    };
    let message = super::hints::reword(e.message().trim_end(), key.as_deref(), found);
    ConfigError::Parse {
        origin: origin.to_owned(),
        line,
        column,
        key,
        message,
    }
}

/// 1-based line and column (in characters) of byte offset `offset` in `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Line on which the dotted `key` is set in `text`, by re-parsing it with spans.
///
/// Works for `[table]` headers, dotted keys and inline tables alike, because the spanned
/// document tree does not care how a key was spelled. A segment may index an array
/// (`listener[1]`, as `serde_path_to_error` writes it): `[[listener]]` entries are arrays.
///
/// A key the text does not set inside an array entry (`bridge[0].addresses` left out) gets
/// the line of the deepest entry that holds it (the `[[bridge]]` header): the entry is where
/// the key is missing. Outside arrays a missing key has no line.
pub(super) fn key_line(text: &str, key: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut segments = key.split('.').peekable();
    let mut entry_line = None;
    while let Some(segment) = segments.next() {
        let Some((name, indices)) = split_indices(segment) else {
            return entry_line;
        };
        let Some((k, mut value)) = table.get_key_value(name) else {
            return entry_line;
        };
        let mut span = k.span();
        for index in indices {
            let Some(element) = value.get_ref().get(index) else {
                return entry_line;
            };
            value = element;
            span = value.span();
            entry_line = Some(line_col(text, span.start).0);
        }
        if segments.peek().is_none() {
            return Some(line_col(text, span.start).0);
        }
        let Some(inner) = value.get_ref().as_table() else {
            return entry_line;
        };
        table = inner;
    }
    entry_line
}

/// `listener[1][2]` -> (`listener`, [1, 2]); `None` if the brackets are malformed.
fn split_indices(segment: &str) -> Option<(&str, Vec<usize>)> {
    let Some(open) = segment.find('[') else {
        return Some((segment, Vec::new()));
    };
    let mut indices = Vec::new();
    for part in segment[open + 1..].split('[') {
        indices.push(part.strip_suffix(']')?.parse().ok()?);
    }
    Some((&segment[..open], indices))
}
