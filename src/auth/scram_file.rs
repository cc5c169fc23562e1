//! The SCRAM credentials file (`auth.scram_file`) and the store the SCRAM methods read.
//!
//! One credential a line: `user:$scram-sha-256$<iterations>$<salt b64>$<StoredKey b64>$<ServerKey b64>`
//! (or `$scram-sha-512$`); `#` starts a comment line. A user may have one line of each kind.
//! Only the derived keys are stored (RFC 5802 §3): the file does not reveal the password, and
//! the server never runs PBKDF2. Errors name the file and line but never quote key material.
//! SIGHUP re-reads the file ([`Reload`]); a bad file keeps the credentials already loaded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use parking_lot::RwLock;
use thiserror::Error;

use super::credential_file::CredentialFileError;
use super::scram::{Scram, ScramKind};
use super::{AuthRegistry, RegistryError};
use crate::reload::Reload;

/// Fewest PBKDF2 iterations a line may use (RFC 7677 §4: at least 4096).
pub const MIN_ITERATIONS: u32 = 4096;

/// Most iterations a line may use: bounds what a client's library must compute per login.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// One user's keys for one hash (RFC 5802 §3).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// Hi's iteration count, sent to the client.
    pub iterations: u32,
    /// The salt, sent to the client.
    pub salt: Vec<u8>,
    /// H(HMAC(SaltedPassword, "Client Key")): checks the client's proof.
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key"): signs the server-final-message.
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// Derives the stored keys from a password (PBKDF2: slow on purpose; never on the
    /// connection path, only when credential lines are made).
    pub fn derive(kind: ScramKind, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = kind.salted_password(password, salt, iterations);
        let client_key = kind.hmac(&salted, b"Client Key");
        ScramCredential {
            iterations,
            salt: salt.to_vec(),
            stored_key: kind.hash(&client_key),
            server_key: kind.hmac(&salted, b"Server Key"),
        }
    }
}

/// Every user's credentials, by kind.
#[derive(Debug, Clone)]
pub struct ScramCredentials {
    by_kind: HashMap<(ScramKind, String), ScramCredential>,
    /// The iteration count most lines use: what unknown users are offered, so the count
    /// does not tell them apart from real ones.
    usual_iterations: u32,
    /// The server key of the first credential added (the file's first line): the secret
    /// unknown users' fake salts are derived from ([`ScramStore::fake`]). Stable across
    /// restarts and reloads while that line stays, and as secret as the key itself.
    first_server_key: Option<Vec<u8>>,
}

impl Default for ScramCredentials {
    fn default() -> Self {
        ScramCredentials {
            by_kind: HashMap::new(),
            usual_iterations: MIN_ITERATIONS,
            first_server_key: None,
        }
    }
}

impl ScramCredentials {
    /// Adds (or replaces) `user`'s credential of `kind` (recounts the usual iterations: for
    /// building small sets in code; files go through [`parse`]).
    pub fn insert(&mut self, kind: ScramKind, user: String, credential: ScramCredential) {
        self.first_server_key
            .get_or_insert_with(|| credential.server_key.clone());
        self.by_kind.insert((kind, user), credential);
        self.usual_iterations = self.most_common_iterations();
    }

    fn most_common_iterations(&self) -> u32 {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for c in self.by_kind.values() {
            *counts.entry(c.iterations).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by_key(|&(iterations, n)| (n, iterations))
            .map_or(MIN_ITERATIONS, |(iterations, _)| iterations)
    }

    /// How many lines were loaded.
    pub fn len(&self) -> usize {
        self.by_kind.len()
    }

    /// True when no credential is loaded.
    pub fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

/// Why SCRAM could not be offered from the credentials file.
#[derive(Debug, Error)]
pub enum ScramFileError {
    /// The file could not be read, or a line is not a credential.
    #[error("cannot use the SCRAM credentials file: {0}")]
    File(#[from] CredentialFileError),
    /// The methods could not be registered.
    #[error("cannot offer SCRAM: {0}")]
    Register(#[from] RegistryError),
}

/// Parses one credential line into user, kind and keys.
///
/// # Errors
///
/// What is wrong with the line, without quoting it.
pub fn parse_line(line: &str) -> Result<(String, ScramKind, ScramCredential), &'static str> {
    let (user, rest) = line
        .rsplit_once(":$")
        .ok_or("expected user:$scram-sha-256$... or user:$scram-sha-512$...")?;
    if user.is_empty() {
        return Err("empty user name");
    }
    let fields: Vec<&str> = rest.split('$').collect();
    let [tag, iterations, salt, stored, server] = fields[..] else {
        return Err("expected 5 $-separated fields after the user name");
    };
    let kind = ScramKind::ALL
        .into_iter()
        .find(|k| k.tag() == tag)
        .ok_or("unknown kind (expected scram-sha-256 or scram-sha-512)")?;
    let iterations: u32 = iterations.parse().map_err(|_| "iterations not a number")?;
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err("iterations must be 4096 to 10000000");
    }
    let salt = B64.decode(salt).map_err(|_| "salt is not base64")?;
    if salt.is_empty() {
        return Err("empty salt");
    }
    let stored_key = B64.decode(stored).map_err(|_| "StoredKey is not base64")?;
    let server_key = B64.decode(server).map_err(|_| "ServerKey is not base64")?;
    if stored_key.len() != kind.key_len() || server_key.len() != kind.key_len() {
        return Err("StoredKey or ServerKey has the wrong length for the hash");
    }
    Ok((
        user.to_owned(),
        kind,
        ScramCredential {
            iterations,
            salt,
            stored_key,
            server_key,
        },
    ))
}

/// Parses a whole file's text; `path` is for errors.
///
/// # Errors
///
/// The first bad line (file and line number), or a user with two lines of the same kind.
pub fn parse(text: &str, path: &Path) -> Result<ScramCredentials, CredentialFileError> {
    let mut creds = ScramCredentials::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |reason: &str| CredentialFileError::Line {
            path: path.to_owned(),
            line: i + 1,
            reason: reason.to_owned(),
        };
        let (user, kind, cred) = parse_line(line).map_err(bad)?;
        if creds.by_kind.contains_key(&(kind, user.clone())) {
            return Err(bad("second line of the same kind for this user"));
        }
        creds
            .first_server_key
            .get_or_insert_with(|| cred.server_key.clone());
        creds.by_kind.insert((kind, user), cred);
    }
    creds.usual_iterations = creds.most_common_iterations();
    Ok(creds)
}

/// Reads and parses the file at `path`.
///
/// # Errors
///
/// As [`parse`], or the file cannot be read.
pub fn load(path: &Path) -> Result<ScramCredentials, CredentialFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// A credential line for `user` with a random 16-byte salt, for `postbox passwd --scram`
/// (and tests). Runs PBKDF2 `iterations` times: slow on purpose. The file splits a line at
/// its last `:$`, so user names may contain `:`.
pub fn scram_credential_line(
    kind: ScramKind,
    user: &str,
    password: &str,
    iterations: u32,
) -> String {
    let salt: [u8; 16] = rand::random();
    let c = ScramCredential::derive(kind, password.as_bytes(), &salt, iterations);
    format!(
        "{user}:${}${}${}${}${}",
        kind.tag(),
        c.iterations,
        B64.encode(&c.salt),
        B64.encode(&c.stored_key),
        B64.encode(&c.server_key)
    )
}

/// The key unknown users' fake salts are derived from: from the first credential's server
/// key, so an unknown name gets the same salt after a restart as before it, as a real user
/// does (a key random per process gave every unknown name a new salt at each restart, which
/// told them apart; issue 35, fourth pass). Without credentials every name is unknown and
/// nothing can be told apart: random then. Kept across reloads.
fn decoy_secret(credentials: &ScramCredentials) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    credentials
        .first_server_key
        .as_ref()
        .map_or_else(rand::random, |key| {
            let mut digest = Sha256::new();
            digest.update(b"postbox scram decoy salt key\0");
            digest.update(key);
            digest.finalize().into()
        })
}

/// The credentials the SCRAM methods read, swapped whole on reload.
pub struct ScramStore {
    path: Option<PathBuf>,
    credentials: RwLock<Arc<ScramCredentials>>,
    /// Derives unknown users' fake salts ([`decoy_secret`]).
    secret: [u8; 32],
}

impl std::fmt::Debug for ScramStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramStore")
            .field("path", &self.path)
            .field("credentials", &self.credentials.read().len())
            .finish_non_exhaustive()
    }
}

impl ScramStore {
    /// A store of fixed credentials (no file: reload keeps them).
    pub fn from_credentials(credentials: ScramCredentials) -> ScramStore {
        ScramStore {
            path: None,
            secret: decoy_secret(&credentials),
            credentials: RwLock::new(Arc::new(credentials)),
        }
    }

    /// Loads the file at `path`.
    ///
    /// # Errors
    ///
    /// As [`load`].
    pub fn open(path: &Path) -> Result<ScramStore, ScramFileError> {
        let mut store = ScramStore::from_credentials(load(path)?);
        store.path = Some(path.to_owned());
        Ok(store)
    }

    /// `user`'s credential of `kind`.
    pub fn get(&self, kind: ScramKind, user: &str) -> Option<ScramCredential> {
        self.credentials
            .read()
            .by_kind
            .get(&(kind, user.to_owned()))
            .cloned()
    }

    /// A credential for an unknown user: salt and keys derived from the name and the secret,
    /// so the same name always gets the same salt (as a real user does) and no proof matches.
    pub fn fake(&self, kind: ScramKind, user: &str) -> ScramCredential {
        let derive = |label: &[u8]| {
            let mut input = label.to_vec();
            input.extend_from_slice(kind.tag().as_bytes());
            input.push(0);
            input.extend_from_slice(user.as_bytes());
            kind.hmac(&self.secret, &input)
        };
        let mut salt = derive(b"salt");
        salt.truncate(16);
        ScramCredential {
            iterations: self.credentials.read().usual_iterations,
            salt,
            stored_key: derive(b"stored"),
            server_key: derive(b"server"),
        }
    }

    /// How many credentials are loaded.
    pub fn len(&self) -> usize {
        self.credentials.read().len()
    }

    /// True when none is loaded.
    pub fn is_empty(&self) -> bool {
        self.credentials.read().is_empty()
    }
}

impl Reload for ScramStore {
    fn what(&self) -> String {
        match &self.path {
            Some(path) => format!("SCRAM credentials {}", path.display()),
            None => "SCRAM credentials (fixed)".to_owned(),
        }
    }

    fn reload(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let fresh = load(path).map_err(|e| e.to_string())?;
        *self.credentials.write() = Arc::new(fresh);
        Ok(())
    }
}

/// Loads `path` and offers `SCRAM-SHA-256` and `SCRAM-SHA-512` in `registry`; returns the
/// store for the server to register with its reloaders.
///
/// # Errors
///
/// The file is bad (as [`load`]) or a method name is taken.
pub fn register(registry: &AuthRegistry, path: &Path) -> Result<Arc<ScramStore>, ScramFileError> {
    let store = Arc::new(ScramStore::open(path)?);
    for kind in ScramKind::ALL {
        registry.register(Arc::new(Scram::new(kind, Arc::clone(&store))))?;
    }
    tracing::info!(file = %path.display(), credentials = store.len(), "SCRAM-SHA-256 and SCRAM-SHA-512 offered");
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown name gets the same fake salt from a store opened again on the same file
    /// (a restart), as a real user keeps its salt; a key random per process told unknown
    /// names apart across a restart (issue 35, fourth pass).
    #[test]
    fn an_unknown_users_fake_salt_survives_a_restart() {
        let text = format!(
            "{}\n{}\n",
            scram_credential_line(ScramKind::Sha256, "u", "p", 4096),
            scram_credential_line(ScramKind::Sha256, "v", "q", 4096)
        );
        let open = || ScramStore::from_credentials(parse(&text, Path::new("f")).expect("parses"));
        let (before, after) = (open(), open());
        assert_eq!(
            before.fake(ScramKind::Sha256, "nobody").salt,
            after.fake(ScramKind::Sha256, "nobody").salt
        );
        assert_ne!(
            before.fake(ScramKind::Sha256, "nobody").salt,
            before.fake(ScramKind::Sha256, "somebody").salt
        );
        // Another first line (another file): another key.
        let other = ScramStore::from_credentials(
            parse(
                &scram_credential_line(ScramKind::Sha256, "u", "other", 4096),
                Path::new("f"),
            )
            .expect("parses"),
        );
        assert_ne!(
            before.fake(ScramKind::Sha256, "nobody").salt,
            other.fake(ScramKind::Sha256, "nobody").salt
        );
    }

    #[test]
    fn lines_round_trip_and_a_user_may_have_both_kinds() {
        let text = format!(
            "# comment\n\n{}\n  {}  \n",
            scram_credential_line(ScramKind::Sha256, "u", "p", 4096),
            scram_credential_line(ScramKind::Sha512, "u", "p", 4096)
        );
        let creds = parse(&text, Path::new("f")).expect("parses");
        assert_eq!(creds.len(), 2);
        let store = ScramStore::from_credentials(creds);
        let c = store.get(ScramKind::Sha512, "u").expect("512");
        assert_eq!(c.stored_key.len(), 64);
        assert!(store.get(ScramKind::Sha256, "u").is_some());
        assert!(store.get(ScramKind::Sha256, "v").is_none());
        assert_eq!(store.fake(ScramKind::Sha256, "v").iterations, 4096);
    }

    #[test]
    fn unknown_users_get_the_usual_iteration_count() {
        let text = [
            scram_credential_line(ScramKind::Sha256, "a", "p", 5000),
            scram_credential_line(ScramKind::Sha256, "b", "p", 5000),
            scram_credential_line(ScramKind::Sha256, "c", "p", 4096),
        ]
        .join("\n");
        let store = ScramStore::from_credentials(parse(&text, Path::new("f")).expect("parses"));
        assert_eq!(store.fake(ScramKind::Sha256, "nobody").iterations, 5000);
    }

    #[test]
    fn bad_lines_name_file_and_line_without_key_material() {
        let good = scram_credential_line(ScramKind::Sha256, "u", "p", 4096);
        let cases = [
            "u:$scram-sha-1$4096$c2FsdA==$AAAA$AAAA".to_owned(),
            "u:$scram-sha-256$100$c2FsdA==$AAAA$AAAA".to_owned(),
            "u:$scram-sha-256$4096$c2FsdA==$SECRETKEY$AAAA".to_owned(),
            "u:$scram-sha-256$4096$c2FsdA==$AAAA".to_owned(),
            "no separator SECRETKEY".to_owned(),
            ":$scram-sha-256$4096$c2FsdA==$AAAA$AAAA".to_owned(),
            good.replace("$4096$", "$x$"),
            format!("{good}\n{good}"),
        ];
        for case in cases {
            let text = format!("# c\n{case}\n");
            let err = parse(&text, Path::new("/etc/scram")).expect_err(&case);
            let msg = err.to_string();
            assert!(
                msg.starts_with("/etc/scram:2: ") || msg.starts_with("/etc/scram:3: "),
                "{msg}"
            );
            assert!(!msg.contains("SECRET") && !msg.contains("c2Fsd"), "{msg}");
        }
    }

    #[test]
    fn reload_swaps_in_a_good_file_and_keeps_the_old_on_a_bad_one() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("scram");
        std::fs::write(
            &path,
            scram_credential_line(ScramKind::Sha256, "a", "p", 4096),
        )
        .expect("write");
        let store = ScramStore::open(&path).expect("opens");
        assert!(store.get(ScramKind::Sha256, "a").is_some());
        std::fs::write(&path, "garbage\n").expect("write");
        assert!(store.reload().expect_err("bad").contains(":1:"));
        assert!(store.get(ScramKind::Sha256, "a").is_some(), "old kept");
        std::fs::write(
            &path,
            scram_credential_line(ScramKind::Sha256, "b", "p", 4096),
        )
        .expect("write");
        store.reload().expect("good");
        assert!(store.get(ScramKind::Sha256, "a").is_none());
        assert!(store.get(ScramKind::Sha256, "b").is_some());
    }
}
