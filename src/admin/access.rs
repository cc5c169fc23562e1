//! Who may use the admin API and the status page: peers on 127.0.0.1 / `::1` (unless
//! `admin.require_token_on_loopback`); other peers only with `Authorization: Bearer <token>`
//! matching `[admin] token_file`.
//!
//! Loopback needs no token by default because whoever can open a loopback connection runs on
//! the host, where the broker's files (its data, its config, the token file) are as close.
//! Only the two loopback addresses themselves are trusted, not the rest of 127.0.0.0/8: a
//! proxy or tunnel on the host that connects from 127.0.0.2 (issue 35, finding 5) is not the
//! operator, and nothing the operator runs needs another loopback source. The token is
//! compared as SHA-256 digests in constant time (`subtle`), so neither its content nor its
//! length leaks through timing, and it is never logged or echoed.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The configured token, kept only as its digest.
#[derive(Clone)]
pub(crate) struct Token {
    digest: [u8; 32],
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("admin.token_file: cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds nothing but whitespace.
    #[error("admin.token_file: {} is empty; put the bearer token in it", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl Token {
    /// The token `text` stands for (surrounding whitespace trimmed, as the file holds it).
    pub(crate) fn new(text: &str) -> Token {
        Token {
            digest: Sha256::digest(text.trim().as_bytes()).into(),
        }
    }

    /// Reads the token from `path` (at start).
    ///
    /// # Errors
    ///
    /// A `TokenError` when the file cannot be read or is empty.
    pub(crate) fn load(path: &Path) -> Result<Token, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        if text.trim().is_empty() {
            return Err(TokenError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Token::new(&text))
    }

    fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&digest).into()
    }
}

/// The answer of [`check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Serve the request.
    Allowed,
    /// 401: a token is configured and the request carries none, or a wrong one.
    Unauthorized,
    /// 403: a peer other than loopback, and no token is configured.
    Forbidden,
}

/// True for exactly 127.0.0.1, `::1` and IPv4-mapped `::ffff:127.0.0.1`: the addresses a
/// client on the host connects from unless it picks another source on purpose.
pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    let localhost = std::net::Ipv4Addr::LOCALHOST;
    match ip {
        IpAddr::V4(v4) => v4 == localhost,
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped() == Some(localhost),
    }
}

/// The access rule: loopback peers ([`is_loopback`]) are let in when `loopback_trusted`;
/// others need the configured token as `Authorization: Bearer <token>` (`authorization` is
/// that header's value, if any).
pub(crate) fn check(
    peer: IpAddr,
    authorization: Option<&[u8]>,
    token: Option<&Token>,
    loopback_trusted: bool,
) -> Access {
    if loopback_trusted && is_loopback(peer) {
        return Access::Allowed;
    }
    let Some(token) = token else {
        return Access::Forbidden;
    };
    let presented = authorization
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| {
            let (scheme, rest) = h.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    match presented {
        Some(p) if token.matches(p) => Access::Allowed,
        _ => Access::Unauthorized,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(peer: IpAddr, authorization: Option<&[u8]>, token: Option<&Token>) -> Access {
        super::check(peer, authorization, token, true)
    }

    #[test]
    fn only_the_loopback_addresses_themselves_are_trusted_and_only_when_asked() {
        let token = Token::new("s3cret");
        for lo in ["127.0.0.2", "127.1.2.3", "::ffff:127.0.0.2"] {
            let ip: IpAddr = lo.parse().unwrap();
            assert_eq!(check(ip, None, None), Access::Forbidden, "{lo}");
            assert_eq!(check(ip, None, Some(&token)), Access::Unauthorized, "{lo}");
        }
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            super::check(lo, None, Some(&token), false),
            Access::Unauthorized,
            "require_token_on_loopback"
        );
        assert_eq!(
            super::check(lo, Some(b"Bearer s3cret"), Some(&token), false),
            Access::Allowed
        );
    }

    #[test]
    fn loopback_needs_no_token_others_need_the_right_one() {
        let token = Token::new("s3cret\n");
        let lan: IpAddr = "192.0.2.7".parse().unwrap();
        for lo in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            let ip: IpAddr = lo.parse().unwrap();
            assert_eq!(check(ip, None, None), Access::Allowed, "{lo}");
        }
        assert_eq!(check(lan, None, None), Access::Forbidden);
        assert_eq!(
            check(lan, Some(b"Bearer s3cret"), None),
            Access::Forbidden,
            "no token configured: nothing opens it"
        );
        // Each Authorization header a LAN client may send, with the token configured.
        let headers: [(Option<&[u8]>, Access); 6] = [
            (None, Access::Unauthorized),
            (Some(b"Bearer wrong"), Access::Unauthorized),
            (Some(b"Bearer s3cret2"), Access::Unauthorized),
            (Some(b"Basic s3cret"), Access::Unauthorized),
            (Some(b"Bearer s3cret"), Access::Allowed),
            (Some(b"bearer  s3cret "), Access::Allowed),
        ];
        for (header, access) in headers {
            assert_eq!(check(lan, header, Some(&token)), access, "{header:?}");
        }
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
    }
}
