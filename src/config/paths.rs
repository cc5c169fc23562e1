//! The files and directories a config file names: read relative to the file's own directory,
//! and checked before anything starts, each error with its key and line.
//!
//! Why relative to the file: an example such as `config/secure.toml` ran only from the
//! repository root, and a service's config only from the directory its unit happened to start
//! in; a newcomer got `cannot load the ACL: config/acl.example: cannot read`, naming neither the
//! key nor the file (issue 37, item 3). Mosquitto reads relative paths from the working
//! directory; a file an older config named that way is still found there, with a note saying
//! how to write it, since moving a store's directory or refusing a certificate on upgrade would
//! lose what the broker kept or keep it from starting.
//!
//! The store's directory (`storage.dir`) is not among them: it is where the broker writes, not
//! a file shipped with the config, and stays relative to the working directory, as
//! `--data-dir` and the embedded default's `./postbox-data` are; otherwise `postbox -c
//! config/postbox.toml` and `postbox` would keep their state in different places.
//!
//! Must not: read the files' contents (their loaders do, with their own errors).

use std::path::{Path, PathBuf};

use super::error::{invalid, ConfigError};
use super::Config;

/// Calls `each` with every file `config` names and the key an error names it by (as the file
/// spells it; `ConfigError::locate` finds its line).
fn for_each_path(config: &mut Config, mut each: impl FnMut(String, &mut PathBuf)) {
    for (i, listener) in config.listeners.iter_mut().enumerate() {
        if let Some(tls) = &mut listener.tls {
            let key = |name: &str| format!("listener[{i}].tls.{name}");
            for (name, path) in [
                ("cert", &mut tls.cert),
                ("key", &mut tls.key),
                ("client_ca", &mut tls.client_ca),
                ("crl", &mut tls.crl),
            ] {
                if let Some(path) = path {
                    each(key(name), path);
                }
            }
        }
    }
    let auth = &mut config.auth;
    for (name, path) in [
        ("password_file", &mut auth.password_file),
        ("scram_file", &mut auth.scram_file),
        ("acl_file", &mut auth.acl_file),
    ] {
        if let Some(path) = path {
            each(format!("auth.{name}"), path);
        }
    }
    if let Some(jwt) = &mut auth.jwt {
        for (name, path) in [("public_key", &mut jwt.public_key), ("jwks", &mut jwt.jwks)] {
            if let Some(path) = path {
                each(format!("auth.jwt.{name}"), path);
            }
        }
    }
    if let Some(path) = &mut config.admin.token_file {
        each("admin.token_file".to_owned(), path);
    }
    for (i, bridge) in config.bridges.iter_mut().enumerate() {
        if let Some(tls) = &mut bridge.tls {
            for (name, path) in [
                ("ca", &mut tls.ca),
                ("cert", &mut tls.cert),
                ("key", &mut tls.key),
            ] {
                if let Some(path) = path {
                    each(format!("bridge[{i}].tls.{name}"), path);
                }
            }
        }
    }
    for (i, schema) in config.schemas.iter_mut().enumerate() {
        each(format!("schema[{i}].file"), &mut schema.file);
    }
    if let Some(cluster) = &mut config.cluster {
        if let Some(path) = &mut cluster.password_file {
            each("cluster.password_file".to_owned(), path);
        }
    }
}

/// Makes every relative path in `config` relative to `base`, the config file's directory, and
/// returns a note for each one found only relative to the working directory (taken from
/// there, as before; the note says how to write it). Paths that exist nowhere are taken
/// beside the file, where [`check_files`] reports them.
pub(super) fn resolve(config: &mut Config, base: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    for_each_path(config, |key, path| {
        if path.is_absolute() || path.as_os_str().is_empty() {
            return;
        }
        let beside = base.join(&*path);
        if !beside.exists() && path.exists() {
            let taken = std::path::absolute(&*path).unwrap_or_else(|_| path.clone());
            notes.push(format!(
                "{key} = {:?} is read from the working directory ({}), not beside the config \
                 file: relative paths in a config file are read from its directory ({}); write \
                 the path from there, or an absolute one",
                path.display().to_string(),
                taken.display(),
                base.display()
            ));
            *path = taken;
        } else {
            *path = beside;
        }
    });
    notes
}

/// Checks that every file `config` names can be opened for reading: a missing certificate or
/// password file is a config error with its key and line (after [`ConfigError::locate`]),
/// before anything is bound or created, rather than a failure to listen that names neither.
pub(super) fn check_files(config: &mut Config) -> Result<(), ConfigError> {
    let mut first = None;
    for_each_path(config, |key, path| {
        if first.is_some() {
            return;
        }
        let problem = match std::fs::metadata(&*path) {
            Ok(meta) if meta.is_dir() => Some("is a directory, not a file".to_owned()),
            Ok(_) => std::fs::File::open(&*path)
                .err()
                .map(|e| format!("cannot be read: {}", plain(&e))),
            Err(e) => Some(format!("cannot be read: {}", plain(&e))),
        };
        if let Some(problem) = problem {
            first = Some(invalid(&key, format!("{} {problem}", path.display())));
        }
    });
    first.map_or(Ok(()), Err)
}

/// An I/O error in words, without the `(os error N)` suffix.
fn plain(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_acl(path: &str) -> Config {
        let mut config = Config::default();
        config.auth.acl_file = Some(PathBuf::from(path));
        config
    }

    /// A relative path is taken beside the config file; an absolute one as it is.
    #[test]
    fn relative_paths_are_read_beside_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("acl"), "topic read #\n").expect("write");
        let mut config = with_acl("acl");
        assert!(resolve(&mut config, dir.path()).is_empty());
        assert_eq!(config.auth.acl_file, Some(dir.path().join("acl")));
        assert!(check_files(&mut config).is_ok());
        let mut config = with_acl("/etc/hostname-that-is-absolute");
        resolve(&mut config, dir.path());
        assert_eq!(
            config.auth.acl_file,
            Some(PathBuf::from("/etc/hostname-that-is-absolute"))
        );
    }

    /// A file found only from the working directory (an older config) is taken from there,
    /// with a note naming the key and how to write it.
    #[test]
    fn a_path_found_only_from_the_working_directory_is_taken_with_a_note() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Cargo runs unit tests from the package root, where Cargo.toml is.
        let mut config = with_acl("Cargo.toml");
        let notes = resolve(&mut config, dir.path());
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("auth.acl_file = \"Cargo.toml\""),
            "{notes:?}"
        );
        let taken = config.auth.acl_file.expect("kept");
        assert!(
            taken.is_absolute() && taken.ends_with("Cargo.toml"),
            "{taken:?}"
        );
    }

    /// A file that exists nowhere is reported with its key and the path looked at.
    #[test]
    fn a_missing_file_names_its_key_and_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = with_acl("nope.acl");
        resolve(&mut config, dir.path());
        let err = check_files(&mut config).expect_err("missing");
        let text = err.to_string();
        assert!(text.contains("auth.acl_file"), "{text}");
        assert!(
            text.contains(&dir.path().join("nope.acl").display().to_string()),
            "{text}"
        );
        assert!(text.contains("no such file"), "{text}");
    }
}
