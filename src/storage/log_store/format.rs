//! The on-disk format below the ops: the 24-byte file header (magic, format version,
//! generation, CRC), frames (`len: u32 | crc32(body): u32 | crc32(len, crc): u32 | body`,
//! the header CRC telling a corrupt length apart from a write cut short by a crash), file
//! names, and creating a log file.
//!
//! Must not change: these bytes are what existing stores hold (bump [`FORMAT_VERSION`] and
//! keep a reader for the old one instead). Must not know what an op is (see `record`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::storage::StorageError;

/// First bytes of a log file.
pub(super) const LOG_MAGIC: [u8; 8] = *b"PBXLOG\0\x01";
/// First bytes of a snapshot file.
pub(super) const SNAPSHOT_MAGIC: [u8; 8] = *b"PBXSNAP\x01";
/// Format version in every file header.
const FORMAT_VERSION: u32 = 1;
/// Bytes of a file header.
pub(crate) const HEADER_LEN: usize = 24;
/// Bytes of a frame header.
const FRAME_HEADER_LEN: usize = 12;
/// First body byte of a frame holding ops (log commits and snapshot chunks).
pub(super) const KIND_OPS: u8 = 0;
/// First body byte of a snapshot's last frame (op count, highest message id).
pub(super) const KIND_TRAILER: u8 = 1;

/// Reserves a frame header at the end of `buf`; returns where the frame starts.
pub(super) fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    start
}

/// Fills in the header of the frame begun at `start` (length and both CRCs).
pub(super) fn finish_frame(buf: &mut [u8], start: usize) {
    let body = &buf[start + FRAME_HEADER_LEN..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32fast::hash(&buf[start..start + 8]);
    buf[start + 8..start + 12].copy_from_slice(&hcrc.to_le_bytes());
}

/// The header of file `gen` of the kind `magic` names.
pub(super) fn file_header(magic: [u8; 8], gen: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&gen.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks that `buf` starts with the header of file `gen` of the kind `magic` names.
pub(super) fn check_header(buf: &[u8], magic: [u8; 8], gen: u64) -> Result<(), String> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err("file shorter than its header".to_owned());
    };
    if h[..8] != magic {
        return Err("bad magic".to_owned());
    }
    if file_header(magic, gen) != *h {
        let mut version = [0u8; 4];
        version.copy_from_slice(&h[8..12]);
        let version = u32::from_le_bytes(version);
        if version != FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        return Err("header checksum or generation mismatch".to_owned());
    }
    Ok(())
}

/// What the next bytes of a file hold.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next<'a> {
    /// An intact frame body.
    Frame(&'a [u8]),
    /// Clean end of the file.
    End,
    /// An incomplete last frame (a write cut short): everything from here is dropped.
    Torn,
    /// Damage that is not a torn tail.
    Corrupt(&'static str),
}

/// Reads the frame at `pos`, advancing it past an intact frame.
pub(super) fn next_frame<'a>(buf: &'a [u8], pos: &mut usize) -> Next<'a> {
    let rest = buf.get(*pos..).unwrap_or_default();
    if rest.is_empty() {
        return Next::End;
    }
    if rest.len() < FRAME_HEADER_LEN {
        return Next::Torn;
    }
    let word = |i: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&rest[i..i + 4]);
        u32::from_le_bytes(w)
    };
    let (len, crc, hcrc) = (word(0) as usize, word(4), word(8));
    if crc32fast::hash(&rest[..8]) != hcrc {
        if rest.iter().all(|b| *b == 0) {
            return Next::Torn; // zero-filled tail: the size grew but the data never landed
        }
        return Next::Corrupt("frame header checksum mismatch");
    }
    let Some(body) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
        return Next::Torn;
    };
    if crc32fast::hash(body) != crc {
        if FRAME_HEADER_LEN + len == rest.len() {
            return Next::Torn; // the last frame, partly written
        }
        return Next::Corrupt("frame checksum mismatch");
    }
    *pos += FRAME_HEADER_LEN + len;
    Next::Frame(body)
}

/// File name of log `gen`.
pub(crate) fn log_name(gen: u64) -> String {
    format!("log-{gen:020}.pbl")
}

/// File name of snapshot `gen`.
pub(crate) fn snapshot_name(gen: u64) -> String {
    format!("snapshot-{gen:020}.pbs")
}

/// What a file in the store directory is, by its name.
pub(super) enum FileKind {
    /// `log-<gen>.pbl`.
    Log(u64),
    /// `snapshot-<gen>.pbs`.
    Snapshot(u64),
    /// A snapshot being written (`*.tmp`).
    Temp,
}

/// Classifies a file name; `None` for files that are not the store's.
pub(super) fn parse_name(name: &str) -> Option<FileKind> {
    if name.ends_with(".tmp") {
        return Some(FileKind::Temp);
    }
    if let Some(g) = name
        .strip_prefix("log-")
        .and_then(|s| s.strip_suffix(".pbl"))
    {
        return g.parse().ok().map(FileKind::Log);
    }
    if let Some(g) = name
        .strip_prefix("snapshot-")
        .and_then(|s| s.strip_suffix(".pbs"))
    {
        return g.parse().ok().map(FileKind::Snapshot);
    }
    None
}

/// fsyncs a directory, so renames and new files in it survive a crash.
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates log `gen` (header written and synced, directory synced), open for appending.
pub(super) fn create_log(dir: &Path, gen: u64) -> Result<File, StorageError> {
    let path = dir.join(log_name(gen));
    let create = || -> std::io::Result<File> {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        f.write_all(&file_header(LOG_MAGIC, gen))?;
        f.sync_all()?;
        sync_dir(dir)?;
        // Reopen in append mode: every frame goes to the end in one write.
        OpenOptions::new().append(true).open(&path)
    };
    create().map_err(|e| StorageError::io(format!("creating {}", path.display()), e))
}

/// Deletes logs and snapshots of generations below `gen` (superseded by snapshot `gen`).
pub(super) fn remove_older_than(dir: &Path, gen: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let old = match parse_name(name) {
            Some(FileKind::Log(g) | FileKind::Snapshot(g)) => g < gen,
            // A temp file belongs to a running snapshot write; other names are not ours.
            Some(FileKind::Temp) | None => false,
        };
        if old {
            if let Err(error) = fs::remove_file(entry.path()) {
                tracing::warn!(%error, file = name, "cannot remove superseded store file");
            }
        }
    }
}
