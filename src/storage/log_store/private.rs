//! The store is private to the broker's user: the data directory (and `store/`) is created
//! 0700 and every file the store writes (logs, snapshots, the lock file, a damaged store's
//! copy) 0600, whatever the umask (issue 35, sixth adversarial pass, finding 9: under the
//! usual umask 0022 they were 0755 / 0644, so any local account read every queued message,
//! retained message and stored will, outside the ACL).
//!
//! A data directory that already exists keeps its mode: it is the operator's (a mount point,
//! a directory shared with a backup agent's group on purpose), so a wider mode is logged once
//! as a WARN naming the fix instead of changed behind the operator's back. The files in
//! `store/` are the broker's own: the group's and others' access to them (files an older
//! version wrote 0644) is taken away at open, so the contents are private whatever the directories' modes.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
use std::path::Path;

/// Mode of the directories the store creates.
pub(super) const DIR_MODE: u32 = 0o700;
/// Mode of the files the store creates.
pub(super) const FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents, each 0700.
pub(super) fn create_dir_all(dir: &Path) -> io::Result<()> {
    builder().recursive(true).create(dir)
}

/// Creates `dir` (its parent exists), 0700.
pub(super) fn create_dir(dir: &Path) -> io::Result<()> {
    builder().create(dir)
}

fn builder() -> DirBuilder {
    let mut builder = DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(DIR_MODE);
    }
    builder
}

/// Options that create a file 0600 (the caller adds read / write / create flags).
pub(super) fn options() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(FILE_MODE);
    }
    options
}

/// Whether a mode gives the group or others any access.
pub(super) fn is_open(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// Logs one WARN for each of `dirs` that the group or others may enter or read.
pub(super) fn warn_if_open(dirs: &[&Path]) {
    #[cfg(unix)]
    for dir in dirs {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = fs::metadata(dir) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if is_open(mode) {
            tracing::warn!(
                dir = %dir.display(),
                mode = format_args!("{mode:04o}"),
                "the data directory is open to other local users (the store's files are 0600, \
                 but their names and sizes are visible); left as it is: chmod 700 it to make it \
                 private"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = dirs;
}

/// [`narrow`]s every regular file directly in `dir` (best effort: a read-only store is left as it is). Returns how many were narrowed.
pub(super) fn narrow_files(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
        .filter(|entry| narrow(&entry.path()))
        .count()
}

/// Takes the group's and others' access to the file at `path` away, if they have any; the
/// owner's bits stay (a file the operator made read-only stays read-only). Whether it did.
pub(super) fn narrow(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = fs::symlink_metadata(path) else {
            return false;
        };
        let mode = meta.permissions().mode() & 0o7777;
        meta.is_file()
            && is_open(mode)
            && fs::set_permissions(path, fs::Permissions::from_mode(mode & !0o077)).is_ok()
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("metadata").permissions().mode() & 0o777
    }

    #[test]
    fn modes_do_not_follow_the_umask() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b");
        create_dir_all(&dir).expect("mkdir");
        assert_eq!(mode(&root.path().join("a")), DIR_MODE);
        assert_eq!(mode(&dir), DIR_MODE);
        let file = dir.join("f");
        options()
            .write(true)
            .create_new(true)
            .open(&file)
            .expect("create");
        assert_eq!(mode(&file), FILE_MODE);

        let old = dir.join("old");
        fs::write(&old, b"x").expect("write");
        fs::set_permissions(&old, fs::Permissions::from_mode(0o644)).expect("chmod");
        let read_only = dir.join("read-only");
        fs::write(&read_only, b"x").expect("write");
        fs::set_permissions(&read_only, fs::Permissions::from_mode(0o444)).expect("chmod");
        assert_eq!(narrow_files(&dir), 2);
        assert_eq!(mode(&old), FILE_MODE);
        assert_eq!(mode(&read_only), 0o400, "the owner's bits stay");
        assert!(is_open(0o755) && is_open(0o701) && !is_open(0o700));
    }
}
