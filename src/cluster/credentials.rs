//! Who this node is to NATS: a user and password, from `[cluster] user` and `password_file`
//! (a file, so a Kubernetes Secret or a file only the service reads holds the password, not
//! the shared config), or written into a server's URL (`nats://user:password@host`,
//! `nats://token@host`). Read once at start; never logged.

use std::path::{Path, PathBuf};

use crate::config::ClusterConfig;

/// What the NATS client presents when it connects.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum NatsCredentials {
    /// A user and password (NATS `authorization { user, password }` or `users`).
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A token (NATS `authorization { token }`), from `nats://token@host`.
    Token(String),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsCredentials::UserPassword { user, .. } => {
                write!(f, "UserPassword({user}, <redacted>)")
            }
            NatsCredentials::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

/// Why the NATS credentials cannot be used: the node does not start (it would otherwise
/// start refusing every QoS 1/2 PUBLISH while NATS turns it away).
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// `cluster.password_file` could not be read.
    #[error("cluster.password_file: cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `cluster.password_file` holds nothing but whitespace.
    #[error("cluster.password_file: {} is empty; put the NATS password in it", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl NatsCredentials {
    /// The credentials `config` names: `user` with the password read from `password_file`
    /// (surrounding whitespace trimmed, as an editor or `kubectl create secret` leaves it),
    /// else those written into a server's URL, else none.
    ///
    /// # Errors
    ///
    /// [`CredentialsError`] when the password file cannot be read or is empty.
    pub(crate) fn load(
        config: &ClusterConfig,
    ) -> Result<Option<NatsCredentials>, CredentialsError> {
        if let (Some(user), Some(path)) = (&config.user, &config.password_file) {
            return Ok(Some(NatsCredentials::UserPassword {
                user: user.clone(),
                password: read_password(path)?,
            }));
        }
        Ok(config.servers.iter().find_map(|s| in_url(s)))
    }
}

fn read_password(path: &Path) -> Result<String, CredentialsError> {
    let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let password = text.trim();
    if password.is_empty() {
        return Err(CredentialsError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(password.to_owned())
}

/// The credentials written before the host of `server`, if any.
fn in_url(server: &str) -> Option<NatsCredentials> {
    let (_, rest) = server.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    Some(match userinfo.split_once(':') {
        Some((user, password)) => NatsCredentials::UserPassword {
            user: user.to_owned(),
            password: password.to_owned(),
        },
        None => NatsCredentials::Token(userinfo.to_owned()),
    })
}

/// `server` without the user and password (or token) written before its host: the NATS
/// client logs each server's URL at debug level (seventh adversarial pass, N8).
pub(super) fn without_credentials(server: &str) -> String {
    let Some((scheme, rest)) = server.split_once("://") else {
        return server.to_owned();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{host}{}", &rest[end..]),
        None => server.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(servers: &[&str]) -> ClusterConfig {
        ClusterConfig {
            node: "a".to_owned(),
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn the_password_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nats-password");
        std::fs::write(&path, "s3cret\n").expect("write");
        let mut c = config(&["nats://nats:4222"]);
        c.user = Some("postbox".to_owned());
        c.password_file = Some(path.clone());
        assert_eq!(
            NatsCredentials::load(&c).expect("loads"),
            Some(NatsCredentials::UserPassword {
                user: "postbox".to_owned(),
                password: "s3cret".to_owned()
            })
        );
        std::fs::write(&path, " \n").expect("write");
        assert!(matches!(
            NatsCredentials::load(&c),
            Err(CredentialsError::Empty { .. })
        ));
        c.password_file = Some(dir.path().join("missing"));
        let error = NatsCredentials::load(&c).expect_err("missing file");
        assert!(error
            .to_string()
            .starts_with("cluster.password_file: cannot read"));
    }

    #[test]
    fn credentials_in_a_url_are_taken_and_never_shown() {
        let c = config(&["nats://n1:4222", "nats://node:pw@n2:4222/"]);
        let found = NatsCredentials::load(&c).expect("loads");
        assert_eq!(
            found,
            Some(NatsCredentials::UserPassword {
                user: "node".to_owned(),
                password: "pw".to_owned()
            })
        );
        assert!(!format!("{found:?}").contains("pw"));
        assert_eq!(
            NatsCredentials::load(&config(&["nats://t0k@n:4222"])).expect("loads"),
            Some(NatsCredentials::Token("t0k".to_owned()))
        );
        assert_eq!(
            NatsCredentials::load(&config(&["nats://n:4222"])).expect("loads"),
            None
        );
        assert_eq!(
            without_credentials("nats://node:pw@n2:4222/x"),
            "nats://n2:4222/x"
        );
        assert_eq!(without_credentials("tls://t0k@n2:4222/"), "tls://n2:4222/");
        assert_eq!(without_credentials("tls://n2:4222"), "tls://n2:4222");
        assert_eq!(without_credentials("n2:4222"), "n2:4222");
    }
}
