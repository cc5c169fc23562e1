//! JSON Web Tokens as MQTT passwords: what cloud IoT backends mint for their devices.
//!
//! A client puts the token in CONNECT's password field. [`JwtVerifier::verify`] checks its
//! signature (RS256 or ES256, against a configured public key or a JWKS file), its `exp`
//! (and `nbf`, `iss`, `aud` when configured), and maps one claim to the username the ACL sees.
//! Optional `publish` / `subscribe` claims (lists of topic filters) narrow what the client may
//! do; they never widen the ACL. The keys are re-read on SIGHUP ([`crate::reload::Reload`]);
//! a bad new key file keeps the old keys.
//!
//! Verification uses `jsonwebtoken` on `ring` (the TLS listeners' crypto provider too), so it
//! adds no second crypto stack. A check is one signature verification (tens of microseconds
//! for RS256 2048): cheap enough to run on the connection's task.
//!
//! Must not: accept HS256 or `none`; log a token.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde::Deserialize;
use thiserror::Error;

pub(crate) use crate::config::JwtConfig;

/// Why a token was not accepted (or a key file could not be used). The messages never
/// contain the token.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum JwtError {
    /// The password is not a JWT at all.
    #[error("not a JSON Web Token")]
    NotAToken,
    /// Signed with an algorithm other than RS256 and ES256, or one no configured key fits.
    #[error("token algorithm {0:?} is not accepted (RS256, ES256 with a matching key)")]
    Algorithm(String),
    /// No configured key has the token's `kid`.
    #[error("no key for the token's kid")]
    UnknownKey,
    /// `exp` has passed (beyond the leeway).
    #[error("token expired")]
    Expired,
    /// The token failed verification: signature, `nbf`, `iss`, `aud`, or its shape.
    #[error("token rejected: {0}")]
    Invalid(String),
    /// The header lists critical extensions (`crit`): Postbox understands none, and RFC 7515
    /// §4.1.11 says such a token MUST be rejected (issue 35, eleventh adversarial pass, T5).
    #[error("token header lists critical extensions (crit), none of which is understood")]
    CriticalHeader,
    /// The username claim is missing or not a string.
    #[error("token has no string claim {0:?} for the username")]
    NoUsername(String),
    /// The username claim cannot be a user name: empty, or holding `+`, `#`, `/` or NUL
    /// (see [`usable_username`]). Names the claim, never its value.
    #[error("the token's claim {0:?} is not a usable user name (empty, or holding + # / or NUL)")]
    BadUsername(String),
    /// A key file could not be read or used.
    #[error("{}: {reason}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Whether a token's subject may be a user name: not empty, and none of `+`, `#`, `/`, NUL
/// (issue 35, third adversarial pass).
///
/// Why: the subject becomes the identity the ACL sees, and its `pattern` rules stand `%u`
/// for one topic level (`sensors/%u/#`). A level is never empty as a name, holds no `/`
/// (the separator), no wildcard and no NUL (MQTT-4.7.1-1, MQTT-4.7.3-2); a subject that could
/// not be one is refused like any bad credential (0x86, 3.1.1: 4) rather than trusted to
/// match nothing. The ACL refuses such names in `%u` as well (`auth::acl`), as Mosquitto
/// denies access to a "dangerous username" with `+` or `#`; an empty subject is also how a
/// token for nobody in particular looks, and must not become an identity sessions bind to.
/// The issuer is a third party: its subject namespace is not the operator's to vet.
pub(crate) fn usable_username(name: &str) -> bool {
    super::acl::one_level(name)
}

/// What a valid token says about its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The username claim's value.
    pub username: String,
    /// `exp` as Unix seconds: when the client's right to stay connected ends.
    pub expires_at: Option<u64>,
    /// The `publish` claim: topic filters the client may publish to (narrowing the ACL).
    pub publish: Option<Vec<String>>,
    /// The `subscribe` claim: topic filters the client may subscribe to (narrowing the ACL).
    pub subscribe: Option<Vec<String>>,
}

/// The keys tokens are checked against.
enum Keys {
    /// One PEM key, RSA or EC.
    Single(DecodingKey, Algorithm),
    /// A JWKS: keys by `kid` (with their algorithm).
    Set(Vec<(Option<String>, DecodingKey, Algorithm)>),
}

/// Checks tokens against the configured keys; shared by every connection, reloadable.
pub struct JwtVerifier {
    config: JwtConfig,
    keys: RwLock<Arc<Keys>>,
    /// Bumped by each reload that took new keys: a connection that logged in with a token
    /// checks it again when this moved (see [`JwtVerifier::generation`]).
    generation: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// True if `password` has the shape of a compact JWS (`header.payload.signature`, base64url,
/// the header a JSON object): such a password is checked as a token, any other as a password.
pub(crate) fn looks_like_jwt(password: &[u8]) -> bool {
    password.starts_with(b"eyJ")
        && password.iter().filter(|&&b| b == b'.').count() == 2
        && password
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn read(path: &Path) -> Result<Vec<u8>, JwtError> {
    std::fs::read(path).map_err(|e| JwtError::Key {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn load_keys(config: &JwtConfig) -> Result<Keys, JwtError> {
    match (&config.public_key, &config.jwks) {
        (Some(path), None) => {
            let pem = read(path)?;
            if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                return Ok(Keys::Single(key, Algorithm::RS256));
            }
            if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                return Ok(Keys::Single(key, Algorithm::ES256));
            }
            Err(JwtError::Key {
                path: path.clone(),
                reason: "not a PEM RSA or EC (P-256) public key".to_owned(),
            })
        }
        (None, Some(path)) => {
            let text = read(path)?;
            let set: JwkSet = serde_json::from_slice(&text).map_err(|e| JwtError::Key {
                path: path.clone(),
                reason: format!("not a JWKS: {e}"),
            })?;
            let mut keys = Vec::with_capacity(set.keys.len());
            for jwk in &set.keys {
                let algorithm = match &jwk.algorithm {
                    jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
                    jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
                    _ => continue, // symmetric and OKP keys are not accepted
                };
                let key = DecodingKey::from_jwk(jwk).map_err(|e| JwtError::Key {
                    path: path.clone(),
                    reason: format!("key {:?}: {e}", jwk.common.key_id),
                })?;
                keys.push((jwk.common.key_id.clone(), key, algorithm));
            }
            if keys.is_empty() {
                return Err(JwtError::Key {
                    path: path.clone(),
                    reason: "no RSA or EC key in the set".to_owned(),
                });
            }
            Ok(Keys::Set(keys))
        }
        _ => Err(JwtError::Key {
            path: PathBuf::from("auth.jwt"),
            reason: "set exactly one of public_key and jwks".to_owned(),
        }),
    }
}

/// The claims read from a token; the rest are ignored.
#[derive(Deserialize)]
struct Claims {
    exp: Option<u64>,
    publish: Option<Vec<String>>,
    subscribe: Option<Vec<String>>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl JwtVerifier {
    /// Loads the keys `config` names.
    ///
    /// # Errors
    ///
    /// [`JwtError::Key`] when a key file cannot be read or holds no usable key.
    pub fn load(config: JwtConfig) -> Result<JwtVerifier, JwtError> {
        let keys = load_keys(&config)?;
        Ok(JwtVerifier {
            config,
            keys: RwLock::new(Arc::new(keys)),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Checks `token` now.
    ///
    /// # Errors
    ///
    /// Why it is not accepted ([`JwtError`]); the caller refuses the CONNECT (0x86 / 4).
    pub fn verify(&self, token: &str) -> Result<Verified, JwtError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtError::NotAToken)?;
        if lists_critical_extensions(token) {
            return Err(JwtError::CriticalHeader);
        }
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(JwtError::Algorithm(format!("{:?}", header.alg)));
        }
        let keys = Arc::clone(&self.keys.read());
        let key = match &*keys {
            Keys::Single(key, algorithm) if *algorithm == header.alg => key,
            Keys::Single(..) => return Err(JwtError::Algorithm(format!("{:?}", header.alg))),
            Keys::Set(set) => {
                let found = match &header.kid {
                    Some(kid) => set.iter().find(|(k, ..)| k.as_deref() == Some(kid)),
                    None if set.len() == 1 => set.first(),
                    None => None,
                };
                match found {
                    Some((_, key, algorithm)) if *algorithm == header.alg => key,
                    Some(_) => return Err(JwtError::Algorithm(format!("{:?}", header.alg))),
                    None => return Err(JwtError::UnknownKey),
                }
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.config.leeway;
        validation.validate_nbf = true;
        validation.required_spec_claims.clear();
        validation.validate_exp = true;
        // A configured `iss` / `aud` is required, not only checked when present: a token the
        // same issuer minted without an audience (for another service) must not get in
        // (issue 35, second adversarial pass).
        if let Some(issuer) = &self.config.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".to_owned());
        }
        match &self.config.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                validation.required_spec_claims.insert("aud".to_owned());
            }
            None => validation.validate_aud = false,
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|e| match e
            .kind()
        {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => JwtError::Expired,
            kind => JwtError::Invalid(format!("{kind:?}")),
        })?;
        let claims = data.claims;
        let claim = &self.config.username_claim;
        let username = claims
            .rest
            .get(claim)
            .and_then(|v| v.as_str())
            .ok_or_else(|| JwtError::NoUsername(claim.clone()))?
            .to_owned();
        if !usable_username(&username) {
            return Err(JwtError::BadUsername(claim.clone()));
        }
        Ok(Verified {
            username,
            expires_at: claims.exp,
            publish: claims.publish,
            subscribe: claims.subscribe,
        })
    }

    /// Until when a client logged in with `verified` may stay connected: its `exp` plus the
    /// leeway (`verify` accepts the token until then, so a connection is not cut shorter
    /// than a new CONNECT with the same token would be allowed); `None` without `exp`.
    pub fn valid_until(&self, verified: &Verified) -> Option<SystemTime> {
        let exp = verified.expires_at?.saturating_add(self.config.leeway);
        UNIX_EPOCH.checked_add(std::time::Duration::from_secs(exp))
    }

    /// How many reloads took new keys. A connected client's token was verified under the
    /// keys of one generation; when the generation moves on, the connection verifies it again
    /// and closes if the new keys refuse it (issue 35, seventh pass, N7: after a key rotation
    /// every client of the old key stayed connected with its rights, for ever without `exp`).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl crate::reload::Reload for JwtVerifier {
    fn what(&self) -> String {
        "JWT keys".to_owned()
    }

    fn reload(&self) -> Result<(), String> {
        let keys = load_keys(&self.config).map_err(|e| e.to_string())?;
        *self.keys.write() = Arc::new(keys);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }
}

/// Whether the header of `token` (a well-formed JWT: `decode_header` read it) has a `crit`
/// member. `jsonwebtoken`'s header has no such field and ignores it, so it is read here.
fn lists_critical_extensions(token: &str) -> bool {
    use base64::Engine as _;
    /// The one header member this looks for.
    #[derive(serde::Deserialize)]
    struct Crit {
        crit: Option<serde::de::IgnoredAny>,
    }
    let Some(encoded) = token.split('.').next() else {
        return false;
    };
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded) else {
        return false;
    };
    serde_json::from_slice::<Crit>(&json).is_ok_and(|h| h.crit.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    fn certs(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("certs/jwt")
            .join(name)
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    }

    fn config() -> JwtConfig {
        JwtConfig {
            public_key: Some(certs("rsa.pub")),
            jwks: None,
            username_claim: "sub".to_owned(),
            issuer: None,
            audience: None,
            leeway: 0,
        }
    }

    fn sign(alg: Algorithm, kid: Option<&str>, claims: &serde_json::Value) -> String {
        let (file, key): (&str, fn(&[u8]) -> _) = match alg {
            Algorithm::RS256 => ("rsa.key", EncodingKey::from_rsa_pem),
            _ => ("ec.key", EncodingKey::from_ec_pem),
        };
        let pem = std::fs::read(certs(file)).expect("dev key");
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        encode(&header, claims, &key(&pem).expect("key")).expect("sign")
    }

    /// RFC 7515 §4.1.11: a token whose header lists a critical extension the verifier does
    /// not understand is invalid, however well it is signed (eleventh pass, T5).
    #[test]
    fn a_token_with_critical_extensions_is_refused() {
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let header = b64(br#"{"alg":"RS256","typ":"JWT","crit":["x"],"x":true}"#);
        let claims = serde_json::json!({"sub": "sensor1", "exp": now() + 600});
        let claims = b64(&serde_json::to_vec(&claims).expect("json"));
        let message = format!("{header}.{claims}");
        let pem = std::fs::read(certs("rsa.key")).expect("dev key");
        let key = EncodingKey::from_rsa_pem(&pem).expect("key");
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::RS256).expect("sign");
        let token = format!("{message}.{signature}");
        let v = JwtVerifier::load(config()).expect("load");
        assert_eq!(v.verify(&token), Err(JwtError::CriticalHeader));
        // The same claims under a plain header pass: only `crit` refused it.
        let plain = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "sensor1", "exp": now() + 600}),
        );
        assert!(v.verify(&plain).is_ok());
    }

    #[test]
    fn a_valid_rs256_token_names_its_user_and_expiry() {
        let v = JwtVerifier::load(config()).expect("load");
        let exp = now() + 600;
        let token = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "sensor1", "exp": exp, "publish": ["sensors/sensor1/#"]}),
        );
        assert!(looks_like_jwt(token.as_bytes()));
        let ok = v.verify(&token).expect("valid");
        assert_eq!(ok.username, "sensor1");
        assert_eq!(ok.expires_at, Some(exp));
        assert_eq!(ok.publish, Some(vec!["sensors/sensor1/#".to_owned()]));
        assert_eq!(ok.subscribe, None);
    }

    /// Issue 35, third adversarial pass: a subject that cannot be one topic level (what `%u`
    /// stands for in the ACL) is refused; one that can is taken as it is.
    #[test]
    fn subjects_that_cannot_be_a_user_name_are_refused() {
        let v = JwtVerifier::load(config()).expect("load");
        for bad in ["", "+", "#", "a/b", "sensors/+", "x\0", "#/../"] {
            let token = sign(
                Algorithm::RS256,
                None,
                &serde_json::json!({"sub": bad, "exp": now() + 60}),
            );
            assert_eq!(
                v.verify(&token),
                Err(JwtError::BadUsername("sub".to_owned())),
                "{bad:?}"
            );
        }
        for good in ["sensor-1", "user@example.com", "auth0|5f1c", "ü"] {
            let token = sign(
                Algorithm::RS256,
                None,
                &serde_json::json!({"sub": good, "exp": now() + 60}),
            );
            assert_eq!(v.verify(&token).map(|ok| ok.username), Ok(good.to_owned()));
        }
    }

    #[test]
    fn expired_tampered_and_foreign_tokens_are_refused() {
        let v = JwtVerifier::load(config()).expect("load");
        let old = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() - 60}),
        );
        assert_eq!(v.verify(&old), Err(JwtError::Expired));
        let good = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() + 60}),
        );
        // Another payload (from a token for someone else) under this one's signature.
        let other = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "admin", "exp": now() + 60}),
        );
        let mut parts: Vec<&str> = good.split('.').collect();
        parts[1] = other.split('.').nth(1).expect("payload");
        assert!(matches!(
            v.verify(&parts.join(".")),
            Err(JwtError::Invalid(_))
        ));
        // ES256 against an RSA key.
        let ec = sign(
            Algorithm::ES256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() + 60}),
        );
        assert!(matches!(v.verify(&ec), Err(JwtError::Algorithm(_))));
        // HS256 (a shared secret) is never accepted, whatever the key.
        let hs = encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "s"}),
            &EncodingKey::from_secret(b"secret"),
        )
        .expect("sign");
        assert!(matches!(v.verify(&hs), Err(JwtError::Algorithm(_))));
        assert_eq!(v.verify("not a token"), Err(JwtError::NotAToken));
        assert!(!looks_like_jwt(b"sensor1-secret"));
    }

    #[test]
    fn a_jwks_picks_the_key_by_kid() {
        let mut c = config();
        c.public_key = None;
        c.jwks = Some(certs("jwks.json"));
        c.username_claim = "device".to_owned();
        let v = JwtVerifier::load(c).expect("load");
        let claims = serde_json::json!({"device": "gw-7", "exp": now() + 60});
        let es = sign(Algorithm::ES256, Some("ec-dev"), &claims);
        assert_eq!(v.verify(&es).expect("ES256 by kid").username, "gw-7");
        let rs = sign(Algorithm::RS256, Some("rsa-dev"), &claims);
        assert_eq!(v.verify(&rs).expect("RS256 by kid").username, "gw-7");
        let unknown = sign(Algorithm::RS256, Some("other"), &claims);
        assert_eq!(v.verify(&unknown), Err(JwtError::UnknownKey));
        let no_user = sign(
            Algorithm::RS256,
            Some("rsa-dev"),
            &serde_json::json!({"exp": now() + 60}),
        );
        assert_eq!(
            v.verify(&no_user),
            Err(JwtError::NoUsername("device".to_owned()))
        );
    }

    #[test]
    fn issuer_and_audience_are_enforced_when_configured() {
        let mut c = config();
        c.issuer = Some("https://idp.example".to_owned());
        c.audience = Some("postbox".to_owned());
        let v = JwtVerifier::load(c).expect("load");
        let ok = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() + 60, "iss": "https://idp.example", "aud": "postbox"}),
        );
        assert!(v.verify(&ok).is_ok());
        let wrong = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() + 60, "iss": "https://evil.example", "aud": "postbox"}),
        );
        assert!(matches!(v.verify(&wrong), Err(JwtError::Invalid(_))));
        // Configured claims are required: a token without them is refused.
        for claims in [
            serde_json::json!({"sub": "s", "exp": now() + 60, "iss": "https://idp.example"}),
            serde_json::json!({"sub": "s", "exp": now() + 60, "aud": "postbox"}),
        ] {
            let missing = sign(Algorithm::RS256, None, &claims);
            assert!(
                matches!(v.verify(&missing), Err(JwtError::Invalid(_))),
                "{claims}"
            );
        }
    }

    #[test]
    fn a_bad_key_file_on_reload_keeps_the_old_keys() {
        use crate::reload::Reload;
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("key.pub");
        std::fs::copy(certs("rsa.pub"), &key).expect("copy");
        let mut c = config();
        c.public_key = Some(key.clone());
        let v = JwtVerifier::load(c).expect("load");
        std::fs::write(&key, "garbage").expect("write");
        assert!(v.reload().is_err());
        let token = sign(
            Algorithm::RS256,
            None,
            &serde_json::json!({"sub": "s", "exp": now() + 60}),
        );
        assert!(v.verify(&token).is_ok(), "still the old key");
        std::fs::copy(certs("ec.pub"), &key).expect("copy");
        v.reload().expect("a good new key");
        assert!(matches!(v.verify(&token), Err(JwtError::Algorithm(_))));
    }
}
