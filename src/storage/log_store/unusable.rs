//! Start-up errors that are not corruption: the store cannot be read or written (permissions,
//! a read-only file system, a disk error, a file where the directory should be). The broker
//! must not start then, and must not move, delete or "repair" anything: [`explain`] turns the
//! I/O error into a [`StorageError::Unusable`] that names the path and says what to do.
//!
//! Must not decide anything about the data (that is `recovery`).

use std::io::ErrorKind;
use std::path::Path;

use crate::storage::StorageError;

/// What an operator can do about `error` on the store in `store_dir`.
fn fix(error: &std::io::Error, store_dir: &Path) -> String {
    let dir = store_dir.display();
    let what = match error.kind() {
        ErrorKind::PermissionDenied => format!(
            "Give the user postbox runs as read and write access to {dir} and every file in it \
             (owner and mode), and check that no file there is immutable (`lsattr`)"
        ),
        ErrorKind::ReadOnlyFilesystem => format!(
            "The file system holding {dir} is mounted read-only: remount it read-write, or set \
             storage.dir (--data-dir) to a writable directory"
        ),
        ErrorKind::NotADirectory => format!(
            "{dir} (or a directory above it) is not a directory: move that file away, or set \
             storage.dir (--data-dir) elsewhere"
        ),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
            format!("The file system holding {dir} is full: free space on it")
        }
        _ => format!(
            "The disk reported an error: check it (kernel log, SMART) before starting again. \
             A file that cannot be read can be moved out of {dir}; the broker then starts \
             without it and reports what it held as lost"
        ),
    };
    format!("{what}. The store was left in place (nothing was moved or deleted); start postbox again once this is fixed")
}

/// Turns an I/O error met while opening the store into [`StorageError::Unusable`]; other
/// errors pass through.
pub(super) fn explain(error: StorageError, store_dir: &Path) -> StorageError {
    match error {
        StorageError::Io { context, source } => {
            let fix = fix(&source, store_dir);
            StorageError::Unusable {
                context,
                source,
                fix,
            }
        }
        other => other,
    }
}
