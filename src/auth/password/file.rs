//! The password file's text: `user:hash` lines as `mosquitto_passwd` writes them, comments
//! (`#`) and blank lines. Reading it for the broker, and editing it for `postbox passwd`.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::hash::{HashError, PasswordHash};
use crate::auth::credential_file::CredentialFileError;

/// The users of one password file, in file order, by name.
#[derive(Debug, Clone, Default)]
pub struct Users {
    by_name: HashMap<String, PasswordHash>,
    /// A hash of the cost most users' hashes have ([`PasswordHash::cost_class`]): unknown
    /// users are verified against it, so that they take as long as a wrong password for most
    /// users (no user enumeration by timing). The first user's hash alone would single out
    /// every user whose hash costs more or less than it (a file part-way through a move from
    /// `$6$` to `$7$`, or with iterations raised for new users; issue 35, fourth pass).
    dummy: Option<PasswordHash>,
    /// One hash of each cost class in the file (the first user's of each, in file order):
    /// the store measures the slowest to pad every failure to it (issue 35, sixth pass,
    /// finding 4).
    classes: Vec<PasswordHash>,
}

impl Users {
    /// The hash of `user`, if present.
    pub fn get(&self, user: &str) -> Option<&PasswordHash> {
        self.by_name.get(user)
    }

    /// A hash of the same cost as real ones, for unknown users.
    pub fn dummy(&self) -> Option<&PasswordHash> {
        self.dummy.as_ref()
    }

    /// One hash of each cost class present, for measuring what the slowest costs.
    pub fn cost_classes(&self) -> &[PasswordHash] {
        &self.classes
    }

    /// How many users.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when the file has no user.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// Splits a line into user and the rest; `None` for blank lines and comments.
fn entry(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() || line.trim_start().starts_with('#') {
        return None;
    }
    Some(line.split_once(':').unwrap_or((line, "")))
}

/// Parses the text of a password file; `path` is for messages.
///
/// # Errors
///
/// [`CredentialFileError::Line`] for the first bad line: no `:`, an empty user name, a hash that is not
/// `$6$`/`$7$`/`$argon2id$` or malformed, or a user listed twice.
pub fn parse(text: &str, path: &Path) -> Result<Users, CredentialFileError> {
    let mut users = Users::default();
    // Per cost class: how many users, and the first one's hash (ties: the class seen first).
    let mut classes: Vec<(String, usize, PasswordHash)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let Some((user, hash)) = entry(raw) else {
            continue;
        };
        let bad = |reason: String| CredentialFileError::Line {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        if user.is_empty() {
            return Err(bad("empty user name".into()));
        }
        if hash.is_empty() {
            return Err(bad(format!("user {user:?}: no password hash (`user:hash` expected; a plaintext file needs `postbox passwd -U`)")));
        }
        let parsed =
            PasswordHash::parse(hash).map_err(|e: HashError| bad(format!("user {user:?}: {e}")))?;
        if users.by_name.contains_key(user) {
            return Err(bad(format!("user {user:?} is listed twice")));
        }
        let class = parsed.cost_class();
        match classes.iter_mut().find(|(c, _, _)| *c == class) {
            Some((_, count, _)) => *count += 1,
            None => classes.push((class, 1, parsed.clone())),
        }
        users.by_name.insert(user.to_owned(), parsed);
    }
    users.classes = classes.iter().map(|(_, _, hash)| hash.clone()).collect();
    // `max_by_key` keeps the last of equal maxima: reversed, the first class seen wins ties.
    users.dummy = classes
        .into_iter()
        .rev()
        .max_by_key(|(_, count, _)| *count)
        .map(|(_, _, hash)| hash);
    Ok(users)
}

/// Reads and parses the password file at `path`.
///
/// # Errors
///
/// As [`parse`], or [`CredentialFileError::Io`] when it cannot be read.
pub fn load(path: &Path) -> Result<Users, CredentialFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// What `postbox passwd` does to a file's lines.
#[derive(Debug)]
pub enum Edit<'a> {
    /// Add `user` or replace its hash.
    Set(&'a str, &'a PasswordHash),
    /// Remove `user`.
    Delete(&'a str),
}

/// Applies `edit` to the text of a file, keeping comments, blank lines and other users as they
/// are. Returns the new text and whether the user was there.
pub fn edit(text: &str, edit: &Edit<'_>) -> (String, bool) {
    let mut out = String::with_capacity(text.len() + 200);
    let mut found = false;
    for line in text.lines() {
        match (entry(line), edit) {
            (Some((user, _)), Edit::Set(name, hash)) if user == *name => {
                if !found {
                    out.push_str(&format!("{name}:{}\n", hash.encode()));
                }
                found = true;
            }
            (Some((user, _)), Edit::Delete(name)) if user == *name => found = true,
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if let (false, Edit::Set(name, hash)) = (found, edit) {
        out.push_str(&format!("{name}:{}\n", hash.encode()));
    }
    (out, found)
}

/// Replaces the file at `path` with `text` atomically (a temporary file in the same directory,
/// then rename), so the broker reloading it on SIGHUP never reads half a file. Mode 0600 for a
/// new file; an existing file keeps its mode.
///
/// # Errors
///
/// [`CredentialFileError::Io`] when the temporary file cannot be written or renamed.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), CredentialFileError> {
    let io = |source| CredentialFileError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| "passwd".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
        options.mode(mode);
    }
    let result = (|| {
        let mut file = options.open(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "alice:$6$Eutey7htKAMgCbLQ$YH27dvlErrE9Wy3BHo27H62I7p0Z5KmPyRLNqq8u9crCifkBNgvkumrmUy20wakpY9wJ49EA5FHpejLoSm+cQg==";

    /// Unknown users are verified against a hash of the cost most users have, not the first
    /// user's (issue 35, fourth pass: a `$6$` first user made every unknown name answer
    /// faster than the `$7$` users, so a guesser could tell names apart by timing).
    #[test]
    fn the_decoy_for_unknown_users_costs_what_most_users_cost() {
        let path = Path::new("/etc/pw");
        let pbkdf2 = |user: &str, iterations| {
            format!(
                "{user}:{}",
                PasswordHash::new_pbkdf2(b"pw", iterations).encode()
            )
        };
        let text = [
            ALICE.to_owned(),
            pbkdf2("bob", 101),
            pbkdf2("carol", 101),
            pbkdf2("dave", 202),
        ]
        .join("\n");
        let users = parse(&text, path).expect("parse");
        let decoy = users.dummy().expect("a decoy");
        assert_eq!(decoy.cost_class(), "7:101", "{decoy:?}");
        let classes: Vec<String> = users
            .cost_classes()
            .iter()
            .map(PasswordHash::cost_class)
            .collect();
        assert_eq!(
            classes,
            ["6", "7:101", "7:202"],
            "one of each, in file order"
        );
        // A tie goes to the class seen first.
        let users = parse(&format!("{ALICE}\n{}", pbkdf2("bob", 101)), path).expect("parse");
        assert_eq!(
            users.dummy().map(PasswordHash::cost_class).as_deref(),
            Some("6")
        );
    }

    #[test]
    fn comments_blank_lines_and_errors_name_the_line() {
        let path = Path::new("/etc/pw");
        let users = parse(&format!("# fleet\n\n  \n{ALICE}\r\n"), path).expect("parse");
        assert_eq!(users.len(), 1);
        assert!(users
            .get("alice")
            .is_some_and(|h| h.verify(b"alice-secret")));
        assert!(users.dummy().is_some());

        let e = parse(&format!("{ALICE}\nbob:$7$101$short\n"), path).expect_err("bad");
        let msg = e.to_string();
        assert!(msg.starts_with("/etc/pw:2: "), "{msg}");
        assert!(!msg.contains("short"), "the hash is not echoed: {msg}");
        let e = parse("carol:plain-password\n", path).expect_err("plain");
        assert!(!e.to_string().contains("plain-password"), "{e}");
        assert!(parse("nocolon\n", path).is_err());
        assert!(parse(":$6$x$y\n", path).is_err());
        assert!(parse(&format!("{ALICE}\n{ALICE}\n"), path).is_err());
    }

    #[test]
    fn edit_sets_replaces_and_deletes() {
        let h = PasswordHash::new_pbkdf2(b"x", 1);
        let (text, found) = edit(&format!("# c\n{ALICE}\n"), &Edit::Set("bob", &h));
        assert!(!found);
        assert!(text.starts_with("# c\nalice:"), "{text}");
        assert!(text.ends_with(&format!("bob:{}\n", h.encode())), "{text}");
        let (text, found) = edit(&text, &Edit::Set("alice", &h));
        assert!(found);
        assert_eq!(parse(&text, Path::new("f")).expect("parse").len(), 2);
        let (text, found) = edit(&text, &Edit::Delete("alice"));
        assert!(found);
        assert!(!text.contains("alice"), "{text}");
    }
}
