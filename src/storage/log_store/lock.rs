//! One broker per data directory: an exclusive lock on `<storage.dir>/postbox.lock`, held from
//! before recovery reads the store until the store is closed.
//!
//! Two brokers on one directory would each replay, append to and compact the same logs, and
//! each would delete files the other still writes to: messages one of them acknowledged are
//! lost (issue 11: B acked 30 retained QoS 1 messages, A compacted, all 30 gone). The lock is
//! `flock`-style (`File::try_lock`), tied to the open file, so the kernel drops it when the
//! process dies, even on `kill -9`: a lock file left behind by a dead broker blocks nothing.
//! The holder writes its pid into the file so a refused broker can say who holds it.
//!
//! Must not block: a second broker is refused at once, not queued behind the first.

use std::fs::{File, TryLockError};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::storage::StorageError;

/// Name of the lock file inside `storage.dir`.
pub const LOCK_FILE: &str = "postbox.lock";

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub(super) struct DirLock {
    _file: File,
}

/// Takes the exclusive lock on `dir` (which must exist) and writes this process's pid into
/// the lock file.
///
/// # Errors
///
/// [`StorageError::Locked`] naming the holder when another process holds it;
/// [`StorageError::Io`] when the lock file cannot be opened or locked.
pub(super) fn lock_dir(dir: &Path) -> Result<DirLock, StorageError> {
    let path = dir.join(LOCK_FILE);
    // Not truncated on open: a refused broker must not wipe the holder's pid.
    // 0600 when created; one left 0644 by an older version loses the group and other bits.
    super::private::narrow(&path);
    let opened = super::private::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path);
    let (mut file, writable) = match opened {
        Ok(file) => (file, true),
        // A lock needs no write access: on a read-only mount or with an unwritable lock file
        // the lock is still taken, and recovery then names what it cannot write and the fix.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            match File::open(&path) {
                Ok(file) => (file, false),
                Err(_) => return Err(StorageError::io(format!("creating {}", path.display()), e)),
            }
        }
        Err(e) => return Err(StorageError::io(format!("opening {}", path.display()), e)),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(StorageError::Locked {
                dir: dir.to_path_buf(),
                holder: holder(&mut file, &path),
            })
        }
        Err(TryLockError::Error(e)) => {
            return Err(StorageError::io(format!("locking {}", path.display()), e))
        }
    }
    if !writable {
        return Ok(DirLock { _file: file });
    }
    // The pid is only for the message a second broker prints: failing to write it (a full
    // disk) does not stop this broker.
    let pid = std::process::id();
    let written = file
        .set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| writeln!(file, "{pid}"));
    if let Err(error) = written {
        tracing::warn!(%error, file = %path.display(), "cannot write the pid into the lock file");
    }
    Ok(DirLock { _file: file })
}

/// What the lock file says about its holder, for the refusal message.
fn holder(file: &mut File, path: &Path) -> String {
    let mut text = String::new();
    match file.read_to_string(&mut text) {
        Ok(_) => match text.trim().parse::<u32>() {
            Ok(pid) => format!("pid {pid}, lock file {}", path.display()),
            Err(_) => format!("pid unknown, lock file {}", path.display()),
        },
        Err(e) => format!("pid unreadable: {e}, lock file {}", path.display()),
    }
}
