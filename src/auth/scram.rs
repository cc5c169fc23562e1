//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as MQTT 5 enhanced authentication
//! methods (§4.12), named as EMQX and `HiveMQ` name them.
//!
//! The exchange: CONNECT carries the client-first-message; the broker answers AUTH 0x18 with
//! the server-first-message (combined nonce, salt, iterations); the client's AUTH 0x18 carries
//! the client-final-message (channel binding, proof); CONNACK 0x00 carries the
//! server-final-message (`v=` signature). Re-authentication (AUTH 0x19) runs the same steps.
//!
//! The server stores `StoredKey` and `ServerKey` (see [`super::scram_file`]), so a step is a few
//! HMACs and one hash — microseconds — and [`Authenticator::is_expensive`] is false: a hop to
//! the blocking pool would cost more than the step. No PBKDF2 ever runs on the server.
//! Unknown users get a salt derived from their name and a per-process secret and fail at the
//! proof, like known users with a wrong password (RFC 5802 §9: no user enumeration).
//!
//! Must not: run PBKDF2 on the connection path; echo key material in errors; panic on client data.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::scram_file::{ScramCredential, ScramStore};
use super::{AuthState, AuthStep, Authenticator};
use crate::codec::ReasonCode;

/// The hash a SCRAM method is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramKind {
    /// SCRAM-SHA-256 (RFC 7677).
    Sha256,
    /// SCRAM-SHA-512 (same construction with SHA-512).
    Sha512,
}

impl ScramKind {
    /// Both kinds, for registration.
    pub const ALL: [ScramKind; 2] = [ScramKind::Sha256, ScramKind::Sha512];

    /// The MQTT Authentication Method name.
    pub fn method(self) -> &'static str {
        match self {
            ScramKind::Sha256 => "SCRAM-SHA-256",
            ScramKind::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The tag of a credential line (`$scram-sha-256$`).
    pub fn tag(self) -> &'static str {
        match self {
            ScramKind::Sha256 => "scram-sha-256",
            ScramKind::Sha512 => "scram-sha-512",
        }
    }

    /// Output length of the hash, which is also the length of keys and proofs.
    pub fn key_len(self) -> usize {
        match self {
            ScramKind::Sha256 => 32,
            ScramKind::Sha512 => 64,
        }
    }

    /// HMAC(key, data).
    pub(crate) fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramKind::Sha256 => hmac_with::<Hmac<Sha256>>(key, data),
            ScramKind::Sha512 => hmac_with::<Hmac<Sha512>>(key, data),
        }
    }

    /// H(data).
    pub(crate) fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramKind::Sha256 => Sha256::digest(data).to_vec(),
            ScramKind::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// Hi(password, salt, i) of RFC 5802: PBKDF2 with HMAC of this hash.
    pub(crate) fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.key_len()];
        match self {
            ScramKind::Sha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
            }
            ScramKind::Sha512 => {
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
            }
        }
        out
    }
}

fn hmac_with<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = <M as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// One SCRAM method (one hash) over a shared credential store.
pub(crate) struct Scram {
    kind: ScramKind,
    store: Arc<ScramStore>,
}

impl std::fmt::Debug for Scram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scram").field("kind", &self.kind).finish()
    }
}

/// Why a SCRAM message was refused (kept to the log at debug level, never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Malformed {
    /// Not the grammar of RFC 5802 §7.
    Syntax,
    /// Channel binding required (`p=`) or a mandatory extension (`m=`): not supported.
    Unsupported,
}

/// What the second step needs from the first.
struct Pending {
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    credential: ScramCredential,
    /// The user the client named (saslname escapes decoded): its identity once proven.
    username: String,
    /// False for an unknown user: the exchange runs on a fake credential and always fails.
    known: bool,
}

impl Scram {
    /// The method for `kind`, reading credentials from `store` at every exchange (so a
    /// reload applies to the next one).
    pub(crate) fn new(kind: ScramKind, store: Arc<ScramStore>) -> Scram {
        Scram { kind, store }
    }

    /// The first step with a chosen server nonce (tests inject the RFC's).
    fn first(&self, data: Option<&[u8]>, server_nonce: &str) -> AuthStep {
        let Some(text) = data.and_then(|d| std::str::from_utf8(d).ok()) else {
            return fail_malformed(Malformed::Syntax);
        };
        let first = match parse_client_first(text) {
            Ok(first) => first,
            Err(why) => return fail_malformed(why),
        };
        let (credential, known) = match self.store.get(self.kind, &first.username) {
            Some(credential) => (credential, true),
            None => (self.store.fake(self.kind, &first.username), false),
        };
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        AuthStep::Continue {
            data: Some(Bytes::from(server_first.clone())),
            state: Box::new(Pending {
                gs2_header: first.gs2_header.to_owned(),
                client_first_bare: first.bare.to_owned(),
                server_first,
                nonce,
                credential,
                username: first.username,
                known,
            }),
        }
    }

    /// The second step: checks the client-final-message against what the first step sent.
    fn last(&self, pending: &Pending, data: Option<&[u8]>) -> AuthStep {
        let Some(text) = data.and_then(|d| std::str::from_utf8(d).ok()) else {
            return fail_malformed(Malformed::Syntax);
        };
        let Some(fin) = parse_client_final(text) else {
            return fail_malformed(Malformed::Syntax);
        };
        let binding_ok = B64
            .decode(fin.channel_binding)
            .is_ok_and(|cb| cb == pending.gs2_header.as_bytes());
        // The combined nonce must come back unchanged: it begins with the client's nonce and
        // ends with ours (RFC 5802 §5.1 `r`).
        if !binding_ok || fin.nonce != pending.nonce {
            return AuthStep::Fail(ReasonCode::NOT_AUTHORIZED);
        }
        let Ok(proof) = B64.decode(fin.proof) else {
            return fail_malformed(Malformed::Syntax);
        };
        let kind = self.kind;
        let credential = &pending.credential;
        if proof.len() != kind.key_len() {
            return AuthStep::Fail(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        }
        let auth_message = format!(
            "{},{},{}",
            pending.client_first_bare, pending.server_first, fin.without_proof
        );
        let client_signature = kind.hmac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let matches: bool = kind.hash(&client_key).ct_eq(&credential.stored_key).into();
        if !(matches && pending.known) {
            return AuthStep::Fail(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        }
        let server_signature = kind.hmac(&credential.server_key, auth_message.as_bytes());
        AuthStep::Authenticated {
            data: Some(Bytes::from(format!("v={}", B64.encode(server_signature)))),
            user: pending.username.clone(),
        }
    }
}

fn fail_malformed(why: Malformed) -> AuthStep {
    tracing::debug!(?why, "SCRAM message refused");
    AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)
}

/// A random server nonce: 18 random bytes, base64 (printable, no comma).
fn server_nonce() -> String {
    let bytes: [u8; 18] = rand::random();
    B64.encode(bytes)
}

impl Authenticator for Scram {
    fn method(&self) -> &str {
        self.kind.method()
    }

    fn start(&self, _client_id: &str, data: Option<Bytes>) -> AuthStep {
        self.first(data.as_deref(), &server_nonce())
    }

    fn continue_(&self, state: AuthState, data: Option<Bytes>) -> AuthStep {
        match state.downcast::<Pending>() {
            Ok(pending) => self.last(&pending, data.as_deref()),
            Err(_) => AuthStep::Fail(ReasonCode::UNSPECIFIED_ERROR),
        }
    }

    /// False: a step is a few HMACs over stored keys (no PBKDF2), cheaper than a hop to the
    /// blocking pool.
    fn is_expensive(&self) -> bool {
        false
    }

    /// The user the client-first-message named (known or not): the failed-login limits are
    /// asked with it before the proof is judged.
    fn claimed_user(&self, state: &AuthState) -> Option<String> {
        state
            .downcast_ref::<Pending>()
            .map(|pending| pending.username.clone())
    }
}

/// The parts of a client-first-message the server uses.
#[derive(Debug, PartialEq, Eq)]
struct ClientFirst<'a> {
    /// `gs2-cbind-flag "," [authzid] ","`, echoed back (base64) in the final message.
    gs2_header: &'a str,
    /// client-first-message-bare, part of `AuthMessage`.
    bare: &'a str,
    /// The user name, saslname escapes decoded.
    username: String,
    nonce: &'a str,
}

/// Parses `gs2-header client-first-message-bare` (RFC 5802 §7).
fn parse_client_first(text: &str) -> Result<ClientFirst<'_>, Malformed> {
    let (flag, rest) = text.split_once(',').ok_or(Malformed::Syntax)?;
    match flag {
        // "y": the client could bind but thinks we cannot; we offer no -PLUS variant, so fine.
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(Malformed::Unsupported),
        _ => return Err(Malformed::Syntax),
    }
    let (authzid, bare) = rest.split_once(',').ok_or(Malformed::Syntax)?;
    let gs2_header = &text[..flag.len() + authzid.len() + 2];
    let mut attrs = bare.split(',');
    let user = match attrs.next() {
        Some(a) if a.starts_with("m=") => return Err(Malformed::Unsupported),
        Some(a) => a.strip_prefix("n=").ok_or(Malformed::Syntax)?,
        None => return Err(Malformed::Syntax),
    };
    let username = decode_saslname(user).ok_or(Malformed::Syntax)?;
    if username.is_empty() {
        return Err(Malformed::Syntax);
    }
    if !authzid.is_empty() {
        // An authorization identity other than the user's own is not supported.
        let authz = authzid.strip_prefix("a=").ok_or(Malformed::Syntax)?;
        if decode_saslname(authz).as_deref() != Some(username.as_str()) {
            return Err(Malformed::Unsupported);
        }
    }
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .filter(|n| is_nonce(n))
        .ok_or(Malformed::Syntax)?;
    // Optional extensions follow; each must at least look like `x=...`.
    if !attrs.all(is_attribute) {
        return Err(Malformed::Syntax);
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        username,
        nonce,
    })
}

/// `printable = %x21-2B / %x2D-7E` (no comma), at least one.
fn is_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// `attr-val = ALPHA "=" value`.
fn is_attribute(a: &str) -> bool {
    let b = a.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b'='
}

/// Decodes a saslname: `=2C` is `,`, `=3D` is `=`; any other `=` (or a raw `,`) is invalid.
pub(crate) fn decode_saslname(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['=', ',']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("=2C") {
            out.push(',');
        } else if tail.starts_with("=3D") {
            out.push('=');
        } else {
            return None;
        }
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The parts of a client-final-message the server uses.
#[derive(Debug, PartialEq, Eq)]
struct ClientFinal<'a> {
    channel_binding: &'a str,
    nonce: &'a str,
    proof: &'a str,
    /// client-final-message-without-proof, part of `AuthMessage`.
    without_proof: &'a str,
}

/// Parses `c=...,r=...[,ext...],p=...` (RFC 5802 §7).
fn parse_client_final(text: &str) -> Option<ClientFinal<'_>> {
    let at = text.rfind(",p=")?;
    let (without_proof, proof) = (&text[..at], &text[at + 3..]);
    if proof.is_empty() || proof.contains(',') {
        return None;
    }
    let mut attrs = without_proof.split(',');
    let channel_binding = attrs.next()?.strip_prefix("c=")?;
    let nonce = attrs.next()?.strip_prefix("r=").filter(|n| is_nonce(n))?;
    if !attrs.all(is_attribute) {
        return None;
    }
    Some(ClientFinal {
        channel_binding,
        nonce,
        proof,
        without_proof,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram_file::{scram_credential_line, ScramCredentials};

    /// RFC 7677 §3.
    const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    /// The RFC's user, with keys derived from `pencil` and the RFC's salt.
    fn rfc_store() -> Arc<ScramStore> {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let cred = ScramCredential::derive(ScramKind::Sha256, b"pencil", &salt, 4096);
        let mut creds = ScramCredentials::default();
        creds.insert(ScramKind::Sha256, "user".into(), cred);
        Arc::new(ScramStore::from_credentials(creds))
    }

    fn text(data: Option<&Bytes>) -> &str {
        std::str::from_utf8(data.expect("data")).expect("utf8")
    }

    fn run(scram: &Scram, first: &str, nonce: &str, fin: impl Fn(&str) -> String) -> AuthStep {
        match scram.first(Some(first.as_bytes()), nonce) {
            AuthStep::Continue { data, state } => {
                let answer = fin(text(data.as_ref()));
                scram.continue_(state, Some(Bytes::from(answer)))
            }
            other => other,
        }
    }

    #[test]
    fn rfc7677_test_vector() {
        let scram = Scram::new(ScramKind::Sha256, rfc_store());
        let AuthStep::Continue { data, state } =
            scram.first(Some(CLIENT_FIRST.as_bytes()), SERVER_NONCE)
        else {
            panic!("expected a challenge")
        };
        assert_eq!(text(data.as_ref()), SERVER_FIRST);
        match scram.continue_(state, Some(Bytes::from_static(CLIENT_FINAL.as_bytes()))) {
            AuthStep::Authenticated { data, user } => {
                assert_eq!(text(data.as_ref()), SERVER_FINAL);
                assert_eq!(user, "user", "the proven user is the identity");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_wrong_proof_or_nonce_or_binding_fails() {
        let scram = Scram::new(ScramKind::Sha256, rfc_store());
        let bad_proof = CLIENT_FINAL.replace("p=dHzb", "p=dHzc");
        let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| bad_proof.clone());
        assert!(matches!(
            step,
            AuthStep::Fail(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
        ));
        let bad_nonce = CLIENT_FINAL.replace("k0,p=", "k1,p=");
        let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| bad_nonce.clone());
        assert!(matches!(step, AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)));
        let bad_binding = CLIENT_FINAL.replace("c=biws", "c=eSws");
        let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| bad_binding.clone());
        assert!(matches!(step, AuthStep::Fail(ReasonCode::NOT_AUTHORIZED)));
    }

    #[test]
    fn an_unknown_user_gets_a_stable_fake_salt_and_fails_at_the_proof() {
        let scram = Scram::new(ScramKind::Sha256, rfc_store());
        let first = "n,,n=nobody,r=abc";
        let salt_of = |step: AuthStep| match step {
            AuthStep::Continue { data, .. } => text(data.as_ref())
                .split(',')
                .find(|a| a.starts_with("s="))
                .expect("salt")
                .to_owned(),
            other => panic!("{other:?}"),
        };
        let a = salt_of(scram.first(Some(first.as_bytes()), "x"));
        let b = salt_of(scram.first(Some(first.as_bytes()), "y"));
        assert_eq!(a, b, "the same fake salt each time, as for a real user");
        let other = salt_of(scram.first(Some(b"n,,n=somebody,r=abc"), "x"));
        assert_ne!(a, other);
        let step = run(&scram, first, "x", |sf| {
            let nonce = sf.split(',').next().expect("r").to_owned();
            format!("c=biws,{nonce},p={}", B64.encode([0u8; 32]))
        });
        assert!(matches!(
            step,
            AuthStep::Fail(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
        ));
    }

    #[test]
    fn saslnames_are_unescaped() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_saslname("plain").as_deref(), Some("plain"));
        assert_eq!(decode_saslname("a=2"), None);
        assert_eq!(decode_saslname("a=41"), None);
        assert_eq!(decode_saslname("a="), None);
        let first = parse_client_first("n,,n=a=2Cb=3D,r=x").expect("parses");
        assert_eq!(first.username, "a,b=");
        assert_eq!(first.bare, "n=a=2Cb=3D,r=x");
        assert_eq!(first.gs2_header, "n,,");
        let first = parse_client_first("y,a=u,n=u,r=x,q=ext").expect("parses");
        assert_eq!(first.gs2_header, "y,a=u,");
    }

    #[test]
    fn escaped_user_names_authenticate_with_sha512() {
        let mut creds = ScramCredentials::default();
        let line = scram_credential_line(ScramKind::Sha512, "a,b=c", "pw", 4096);
        let (user, kind, cred) = super::super::scram_file::parse_line(&line).expect("line");
        assert_eq!((user.as_str(), kind), ("a,b=c", ScramKind::Sha512));
        creds.insert(kind, user, cred);
        let scram = Scram::new(
            ScramKind::Sha512,
            Arc::new(ScramStore::from_credentials(creds)),
        );
        let first = "n,,n=a=2Cb=3Dc,r=cn";
        let step = run(&scram, first, "sn", |sf| {
            client_final(ScramKind::Sha512, b"pw", "n=a=2Cb=3Dc,r=cn", sf)
        });
        assert!(
            matches!(&step, AuthStep::Authenticated { data: Some(_), user } if user == "a,b=c"),
            "{step:?}"
        );
    }

    /// A minimal client side, for the tests above only.
    fn client_final(kind: ScramKind, password: &[u8], bare: &str, server_first: &str) -> String {
        let mut salt = Vec::new();
        let mut iterations = 0;
        let mut nonce = "";
        for a in server_first.split(',') {
            if let Some(s) = a.strip_prefix("s=") {
                salt = B64.decode(s).expect("salt");
            } else if let Some(i) = a.strip_prefix("i=") {
                iterations = i.parse().expect("i");
            } else if let Some(r) = a.strip_prefix("r=") {
                nonce = r;
            }
        }
        let salted = kind.salted_password(password, &salt, iterations);
        let client_key = kind.hmac(&salted, b"Client Key");
        let stored = kind.hash(&client_key);
        let without = format!("c=biws,r={nonce}");
        let msg = format!("{bare},{server_first},{without}");
        let sig = kind.hmac(&stored, msg.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        format!("{without},p={}", B64.encode(proof))
    }

    #[test]
    fn garbage_never_panics_and_always_fails() {
        let scram = Scram::new(ScramKind::Sha256, rfc_store());
        let firsts: &[&[u8]] = &[
            b"",
            b",",
            b",,",
            b"n,,",
            b"n,,n=",
            b"n,,n=user",
            b"n,,n=user,r=",
            b"n,,r=abc,n=user",
            b"p=tls-unique,,n=user,r=abc",
            b"n,,m=ext,n=user,r=abc",
            b"n,a=other,n=user,r=abc",
            b"x,,n=user,r=abc",
            b"n,,n=us=er,r=abc",
            b"n,,n=user,r=a b",
            b"n,,n=user,r=abc,1",
            b"\xff\xfe,,n=user,r=abc",
            "n,,n=üser,r=ä".as_bytes(),
        ];
        for first in firsts {
            let step = scram.first(Some(first), "s");
            assert!(matches!(step, AuthStep::Fail(_)), "{first:?}: {step:?}");
        }
        assert!(matches!(scram.start("c", None), AuthStep::Fail(_)));
        let finals: &[&[u8]] = &[
            b"",
            b"p=",
            b"c=biws",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=!!",
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
            b"c=!!,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,c=biws,p=AAAA",
            b"\x00\x01\x02",
        ];
        for fin in finals {
            let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| {
                String::from_utf8_lossy(fin).into_owned()
            });
            assert!(matches!(step, AuthStep::Fail(_)), "{fin:?}: {step:?}");
        }
        let AuthStep::Continue { state, .. } = scram.first(Some(CLIENT_FIRST.as_bytes()), "s")
        else {
            panic!()
        };
        assert!(matches!(scram.continue_(state, None), AuthStep::Fail(_)));
        assert!(matches!(
            scram.continue_(Box::new(5u8), Some(Bytes::new())),
            AuthStep::Fail(_)
        ));
        // Random bytes, as a fuzzer would send them.
        for _ in 0..2000 {
            let len = rand::random_range(0..64);
            let junk: Vec<u8> = (0..len).map(|_| rand::random()).collect();
            assert!(!matches!(
                scram.first(Some(&junk), "s"),
                AuthStep::Authenticated { .. }
            ));
            let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| {
                String::from_utf8_lossy(&junk).into_owned()
            });
            assert!(matches!(step, AuthStep::Fail(_)));
        }
    }

    #[test]
    fn server_nonces_differ_and_are_printable() {
        let (a, b) = (server_nonce(), server_nonce());
        assert_ne!(a, b);
        assert!(is_nonce(&a) && is_nonce(&b));
    }

    /// Measures a whole server-side exchange (both steps), to back `is_expensive() == false`.
    /// `cargo test --lib scram::tests::step_cost -- --nocapture`
    #[test]
    fn step_cost() {
        let scram = Scram::new(ScramKind::Sha256, rfc_store());
        let n = 200u32;
        let started = std::time::Instant::now();
        for _ in 0..n {
            let step = run(&scram, CLIENT_FIRST, SERVER_NONCE, |_| {
                CLIENT_FINAL.to_owned()
            });
            assert!(matches!(step, AuthStep::Authenticated { .. }));
        }
        let each = started.elapsed() / n;
        println!("SCRAM-SHA-256 server exchange: {each:?} per client (both steps)");
    }
}
