//! One password hash of a `mosquitto_passwd` file: parsing, verifying and creating.
//!
//! Three formats, all as Mosquitto reads and writes them, so existing files work unchanged:
//!
//! - `$6$<salt>$<hash>`: base64 salt and base64 of SHA-512(password ‖ salt). Mosquitto's own
//!   format (1.x default), *not* crypt(3)'s sha512crypt, which shares the prefix.
//! - `$7$<iterations>$<salt>$<hash>`: PBKDF2-HMAC-SHA512, 64-byte key, base64 salt (12 bytes
//!   from Mosquitto 2.0, 64 from 2.1; any length is read) and key. Mosquitto 2.0's default.
//! - `$argon2id$v=19$m=…,t=…,p=…$<salt>$<hash>`: a PHC string (Mosquitto 2.1's default).
//!
//! Digests are compared in constant time (`subtle`).

use std::fmt;

use argon2::password_hash::{PasswordHasher, PasswordVerifier, SaltString};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha512};
use subtle::ConstantTimeEq;
use thiserror::Error;

/// Iterations `postbox passwd` writes for `$7$`: OWASP's 2023 figure for PBKDF2-HMAC-SHA512.
/// Mosquitto 2.0 writes 101, which costs an attacker with the file almost nothing; it reads
/// any count, so files with this one work with Mosquitto too.
pub const DEFAULT_PBKDF2_ITERATIONS: u32 = 210_000;

/// Salt length `postbox passwd` writes for `$7$`: Mosquitto 2.0's 12 bytes (96 bits, plenty
/// against precomputation). Mosquitto 2.0 cannot decode a longer salt ("Unable to decode
/// password salt", measured with 2.0.11) and drops the user, so 2.1's 64 would break files
/// shared with it; Postbox reads either.
const PBKDF2_SALT_LEN: usize = 12;

/// Key length of `$7$` (SHA-512's output, as Mosquitto).
const PBKDF2_KEY_LEN: usize = 64;

/// Why a hash string could not be read. Never carries the hash itself: messages go to logs.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HashError {
    /// Not `$6$`, `$7$` or `$argon2id$`.
    #[error("unknown hash format (expected $6$, $7$ or $argon2id$)")]
    UnknownFormat,
    /// The right prefix, but fields missing, not base64, or out of range.
    #[error("malformed {0} hash")]
    Malformed(&'static str),
}

/// A parsed password hash, ready to verify passwords against.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// `$6$`: SHA-512(password ‖ salt).
    Sha512 {
        /// Raw salt.
        salt: Vec<u8>,
        /// Raw digest (64 bytes).
        hash: Vec<u8>,
    },
    /// `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        /// Iteration count.
        iterations: u32,
        /// Raw salt.
        salt: Vec<u8>,
        /// Raw derived key.
        hash: Vec<u8>,
    },
    /// `$argon2id$…`: the PHC string, kept whole (it carries its own parameters).
    Argon2id(String),
}

impl fmt::Debug for PasswordHash {
    /// Names the format only: a hash must not end up in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordHash::Sha512 { .. } => f.write_str("PasswordHash($6$)"),
            PasswordHash::Pbkdf2 { iterations, .. } => {
                write!(f, "PasswordHash($7$, {iterations} iterations)")
            }
            PasswordHash::Argon2id(_) => f.write_str("PasswordHash($argon2id$)"),
        }
    }
}

fn b64(field: &str, what: &'static str) -> Result<Vec<u8>, HashError> {
    STANDARD
        .decode(field)
        .map_err(|_| HashError::Malformed(what))
}

impl PasswordHash {
    /// What verifying against this hash costs, as a key: equal keys take the same work (the
    /// format and its cost parameters; salts and digests aside). For the decoy that unknown
    /// users are verified against ([`super::file::Users::dummy`]).
    pub(crate) fn cost_class(&self) -> String {
        match self {
            PasswordHash::Sha512 { .. } => "6".to_owned(),
            PasswordHash::Pbkdf2 { iterations, .. } => format!("7:{iterations}"),
            // `$argon2id$v=19$m=…,t=…,p=…$salt$hash`: the version and parameters.
            PasswordHash::Argon2id(phc) => {
                let fields: Vec<&str> = phc.split('$').collect();
                format!(
                    "argon2id:{}",
                    fields.get(2..4).unwrap_or_default().join("$")
                )
            }
        }
    }

    /// Reads the part after `user:` of a password file line.
    ///
    /// # Errors
    ///
    /// [`HashError`] for an unknown prefix or a malformed hash.
    pub fn parse(text: &str) -> Result<PasswordHash, HashError> {
        if let Some(rest) = text.strip_prefix("$6$") {
            let (salt, hash) = rest.split_once('$').ok_or(HashError::Malformed("$6$"))?;
            let salt = b64(salt, "$6$")?;
            let hash = b64(hash, "$6$")?;
            if salt.is_empty() || hash.len() != 64 {
                return Err(HashError::Malformed("$6$"));
            }
            Ok(PasswordHash::Sha512 { salt, hash })
        } else if let Some(rest) = text.strip_prefix("$7$") {
            let mut fields = rest.split('$');
            let (Some(iterations), Some(salt), Some(hash), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(HashError::Malformed("$7$"));
            };
            let iterations: u32 = iterations
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(HashError::Malformed("$7$"))?;
            let salt = b64(salt, "$7$")?;
            let hash = b64(hash, "$7$")?;
            if salt.is_empty() || hash.is_empty() {
                return Err(HashError::Malformed("$7$"));
            }
            Ok(PasswordHash::Pbkdf2 {
                iterations,
                salt,
                hash,
            })
        } else if text.starts_with("$argon2id$") {
            let phc =
                argon2::PasswordHash::new(text).map_err(|_| HashError::Malformed("$argon2id$"))?;
            if phc.hash.is_none() || argon2::Params::try_from(&phc).is_err() {
                return Err(HashError::Malformed("$argon2id$"));
            }
            Ok(PasswordHash::Argon2id(text.to_owned()))
        } else {
            Err(HashError::UnknownFormat)
        }
    }

    /// Whether `password` matches. Expensive for `$7$` and argon2id by design: call it off
    /// the async runtime.
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Sha512 { salt, hash } => {
                let mut digest = Sha512::new();
                digest.update(password);
                digest.update(salt);
                digest.finalize().as_slice().ct_eq(hash).into()
            }
            PasswordHash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => {
                // HMAC pads a key shorter than its block (128 bytes for SHA-512) with zeros
                // (RFC 2104 §2), so PBKDF2-HMAC cannot tell `secret` from `secret\0`: both
                // derive the same key, and a password with NULs appended passed (issue 35,
                // third adversarial pass). No `$7$` hash is of a password ending in NUL
                // (`mosquitto_passwd` takes C strings; `postbox passwd` refuses them), so
                // such a password is refused here and the comparison is exact.
                if password.last() == Some(&0) {
                    return false;
                }
                let mut key = vec![0u8; hash.len()];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut key);
                key.ct_eq(hash).into()
            }
            PasswordHash::Argon2id(phc) => match argon2::PasswordHash::new(phc) {
                // The argon2 crate compares in constant time.
                Ok(parsed) => argon2::Argon2::default()
                    .verify_password(password, &parsed)
                    .is_ok(),
                Err(_) => false,
            },
        }
    }

    /// A new `$7$` hash of `password` with a random 12-byte salt.
    pub fn new_pbkdf2(password: &[u8], iterations: u32) -> PasswordHash {
        let mut salt = vec![0u8; PBKDF2_SALT_LEN];
        rand::fill(&mut salt[..]);
        let mut hash = vec![0u8; PBKDF2_KEY_LEN];
        pbkdf2::pbkdf2_hmac::<Sha512>(password, &salt, iterations.max(1), &mut hash);
        PasswordHash::Pbkdf2 {
            iterations: iterations.max(1),
            salt,
            hash,
        }
    }

    /// A new argon2id hash of `password` with the argon2 crate's defaults (OWASP's minimum:
    /// 19 MiB, 2 passes, 1 lane) and a random salt.
    ///
    /// # Errors
    ///
    /// The argon2 crate's error, as text (it does not fail for these parameters).
    pub fn new_argon2id(password: &[u8]) -> Result<PasswordHash, String> {
        let mut raw = [0u8; 16];
        rand::fill(&mut raw);
        let salt = SaltString::encode_b64(&raw).map_err(|e| e.to_string())?;
        let phc = argon2::Argon2::default()
            .hash_password(password, &salt)
            .map_err(|e| e.to_string())?;
        Ok(PasswordHash::Argon2id(phc.to_string()))
    }

    /// The text after `user:` in a password file.
    pub fn encode(&self) -> String {
        match self {
            PasswordHash::Sha512 { salt, hash } => {
                format!("$6${}${}", STANDARD.encode(salt), STANDARD.encode(hash))
            }
            PasswordHash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => format!(
                "$7${iterations}${}${}",
                STANDARD.encode(salt),
                STANDARD.encode(hash)
            ),
            PasswordHash::Argon2id(phc) => phc.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Written by the real `mosquitto_passwd` (Mosquitto 2.0.11, Debian):
    // `mosquitto_passwd -H sha512 -c -b f alice alice-secret`.
    const SHA512: &str = "$6$Eutey7htKAMgCbLQ$YH27dvlErrE9Wy3BHo27H62I7p0Z5KmPyRLNqq8u9crCifkBNgvkumrmUy20wakpY9wJ49EA5FHpejLoSm+cQg==";
    // `mosquitto_passwd -H sha512-pbkdf2 -c -b f bob bob-secret` (12-byte salt, 101 iterations).
    const PBKDF2_12: &str = "$7$101$yKLkIWm4PyNFL8gy$0SzgdK9kMgY8LNpCGsJrp3YOwmx8TohGoKa6ox8BdY3f7Zu3NT8Kp8BdhHxIQZntkOkrQ/Zb126hfrTMRM2o/Q==";

    /// Issue 35, third adversarial pass: HMAC's zero padding made `$7$` accept a password
    /// with NULs appended; every format compares exactly now.
    #[test]
    fn trailing_nul_bytes_do_not_pass() {
        let hashes = [
            PasswordHash::new_pbkdf2(b"secret", 10),
            PasswordHash::parse(PBKDF2_12).expect("parse"),
            PasswordHash::parse(SHA512).expect("parse"),
            PasswordHash::new_argon2id(b"secret").expect("argon2id"),
        ];
        for (h, right) in
            hashes
                .iter()
                .zip([&b"secret"[..], b"bob-secret", b"alice-secret", b"secret"])
        {
            assert!(h.verify(right), "{h:?}");
            for suffix in [&b"\0"[..], b"\0\0", b"\0x"] {
                let padded = [right, suffix].concat();
                assert!(!h.verify(&padded), "{h:?} {suffix:?}");
            }
        }
    }

    #[test]
    fn mosquitto_sha512_vector() {
        let h = PasswordHash::parse(SHA512).expect("parse");
        assert!(matches!(h, PasswordHash::Sha512 { .. }));
        assert!(h.verify(b"alice-secret"));
        assert!(!h.verify(b"alice-secreT"));
        assert!(!h.verify(b""));
        assert_eq!(h.encode(), SHA512, "re-encodes unchanged");
    }

    #[test]
    fn mosquitto_pbkdf2_vector_12_byte_salt() {
        let h = PasswordHash::parse(PBKDF2_12).expect("parse");
        let PasswordHash::Pbkdf2 {
            iterations, salt, ..
        } = &h
        else {
            panic!("{h:?}")
        };
        assert_eq!((*iterations, salt.len()), (101, 12));
        assert!(h.verify(b"bob-secret"));
        assert!(!h.verify(b"bob-secret "));
        assert_eq!(h.encode(), PBKDF2_12);
    }

    #[test]
    fn pbkdf2_64_byte_salt_and_round_trip() {
        // Mosquitto 2.1's layout: 64-byte salt (made here with the same derivation).
        let salt = [7u8; 64];
        let mut key = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(b"pw", &salt, 1000, &mut key);
        let text = format!("$7$1000${}${}", STANDARD.encode(salt), STANDARD.encode(key));
        let long = PasswordHash::parse(&text).expect("parse");
        assert!(long.verify(b"pw"));
        assert!(!long.verify(b"pW"));
        let made = PasswordHash::new_pbkdf2(b"pw", 1000);
        let back = PasswordHash::parse(&made.encode()).expect("parse");
        let PasswordHash::Pbkdf2 { salt, .. } = &back else {
            panic!("{back:?}")
        };
        assert_eq!(salt.len(), 12, "what Mosquitto 2.0 can read");
        assert!(back.verify(b"pw"));
        assert!(!back.verify(b"pW"));
    }

    #[test]
    fn argon2id_vector_and_round_trip() {
        // The reference implementation's test vector (phc-winner-argon2 src/test.c: argon2id,
        // t=2, m=2^16, p=1, "password", "somesalt"); Mosquitto 2.1 writes the same PHC form.
        let known = "$argon2id$v=19$m=65536,t=2,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc";
        let h = PasswordHash::parse(known).expect("parse");
        assert!(h.verify(b"password"));
        assert!(!h.verify(b"passwore"));
        let made = PasswordHash::new_argon2id(b"s3cret").expect("hash");
        let back = PasswordHash::parse(&made.encode()).expect("parse");
        assert!(back.verify(b"s3cret"));
        assert!(!back.verify(b"s3creT"));
    }

    #[test]
    fn malformed_and_unknown_are_refused_without_echoing() {
        for bad in [
            "$6$",
            "$6$abc",
            "$6$!!!$YH27",
            "$7$x$yKLkIWm4PyNFL8gy$0Szg",
            "$7$0$yKLkIWm4PyNFL8gy$0Szg",
            "$7$101$yKLkIWm4PyNFL8gy",
            "$argon2id$v=19$m=zz",
        ] {
            let e = PasswordHash::parse(bad).expect_err(bad);
            assert!(matches!(e, HashError::Malformed(_)), "{bad}: {e:?}");
        }
        // crypt(3) sha512crypt shares `$6$` but its hash is not base64 of 64 bytes.
        assert!(PasswordHash::parse("$6$rounds=5000$salt$hash").is_err());
        assert_eq!(
            PasswordHash::parse("plaintext"),
            Err(HashError::UnknownFormat)
        );
        let debug = format!("{:?}", PasswordHash::parse(SHA512).expect("parse"));
        assert!(!debug.contains("YH27"), "{debug}");
    }
}
