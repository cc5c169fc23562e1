//! The on-disk format below the ops: the 24-byte file header (magic, format version,
//! generation, CRC), frames (`len: u32 | crc32(body): u32 | hcrc: u32 | body`, the header
//! CRC telling a corrupt length apart from a write cut short by a crash), finding the next
//! intact frame after damage, file names, and creating a log file.
//!
//! Format versions (per file, in its header): version 1 seals a frame header with
//! `hcrc = crc32(len, crc)`; version 2 (written since) with `hcrc = crc32(magic, generation,
//! offset of the frame in the file, len, crc)` ([`Seal`]). The header CRC is the sync marker
//! recovery scans for past a damaged frame (a random position matches with odds 2^-32);
//! version 2 also makes a frame valid only at the place it was written, so a copy of frames
//! inside a message payload (a log file published as a payload, say) is never taken for a
//! commit while scanning. Both versions are read; only version 2 is written.
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
/// Format version written into every new file header (see the module doc; 1 is still read).
const FORMAT_VERSION: u32 = 2;
/// Bytes of a file header.
pub(crate) const HEADER_LEN: usize = 24;
/// Bytes of a frame header.
pub(super) const FRAME_HEADER_LEN: usize = 12;
/// First body byte of a frame holding ops (log commits and snapshot chunks).
pub(crate) const KIND_OPS: u8 = 0;
/// First body byte of a snapshot's last frame (op count, highest message id).
pub(crate) const KIND_TRAILER: u8 = 1;

/// Reserves a frame header at the end of `buf`; returns where the frame starts.
pub(super) fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    start
}

/// How the frames of one file are sealed: what the frame-header CRC covers (see the module
/// doc). Recovery needs it to recognise a frame, the writer to write one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seal {
    /// Format version 1: `crc32(len, crc)`.
    V1,
    /// Format version 2: `crc32(magic, gen, offset, len, crc)`.
    V2 {
        /// The file's magic (a log frame is not a snapshot frame).
        magic: [u8; 8],
        /// The file's generation.
        gen: u64,
    },
}

impl Seal {
    /// The seal of new frames in log `gen`.
    pub(super) fn log(gen: u64) -> Seal {
        Seal::V2 {
            magic: LOG_MAGIC,
            gen,
        }
    }

    /// The seal of new frames in snapshot `gen`.
    pub(super) fn snapshot(gen: u64) -> Seal {
        Seal::V2 {
            magic: SNAPSHOT_MAGIC,
            gen,
        }
    }

    /// The header CRC of a frame at file offset `at` whose first 8 header bytes are `head`.
    fn header_crc(self, at: u64, head: &[u8]) -> u32 {
        match self {
            Seal::V1 => crc32fast::hash(head),
            Seal::V2 { magic, gen } => {
                let mut h = crc32fast::Hasher::new();
                h.update(&magic);
                h.update(&gen.to_le_bytes());
                h.update(&at.to_le_bytes());
                h.update(head);
                h.finalize()
            }
        }
    }
}

/// Fills in the header of the frame begun at `start` (length and both CRCs); `buf_at` is the
/// file offset `buf[0]` will be written at (the seal binds a frame to its place).
pub(super) fn finish_frame(buf: &mut [u8], start: usize, seal: Seal, buf_at: u64) {
    let body = &buf[start + FRAME_HEADER_LEN..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    let hcrc = seal.header_crc(buf_at + start as u64, &buf[start..start + 8]);
    buf[start + 8..start + 12].copy_from_slice(&hcrc.to_le_bytes());
}

/// The header of file `gen` of the kind `magic` names, in the current format version.
pub(super) fn file_header(magic: [u8; 8], gen: u64) -> [u8; HEADER_LEN] {
    header_of_version(magic, gen, FORMAT_VERSION)
}

fn header_of_version(magic: [u8; 8], gen: u64, version: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..20].copy_from_slice(&gen.to_le_bytes());
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks that `buf` starts with the header of file `gen` of the kind `magic` names, in a
/// format version this build reads; returns how its frames are sealed.
pub(super) fn check_header(buf: &[u8], magic: [u8; 8], gen: u64) -> Result<Seal, String> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Err("file shorter than its header".to_owned());
    };
    if h[..8] != magic {
        return Err("bad magic".to_owned());
    }
    let version = header_version(buf).unwrap_or(0);
    let seal = match version {
        1 => Seal::V1,
        2 => Seal::V2 { magic, gen },
        _ => return Err(format!("unsupported format version {version}")),
    };
    if header_of_version(magic, gen, version) != *h {
        return Err("header checksum or generation mismatch".to_owned());
    }
    Ok(seal)
}

/// The format version field of a file header (unchecked).
fn header_version(buf: &[u8]) -> Option<u32> {
    let mut version = [0u8; 4];
    version.copy_from_slice(buf.get(8..12)?);
    Some(u32::from_le_bytes(version))
}

/// How to read the frames of a file whose header failed [`check_header`]: the version its
/// header names if that is one this build knows, else whichever seal finds a frame first.
pub(super) fn guess_seal(buf: &[u8], magic: [u8; 8], gen: u64) -> Seal {
    let v2 = Seal::V2 { magic, gen };
    match header_version(buf) {
        Some(1) => Seal::V1,
        Some(2) => v2,
        _ => match (
            resync(buf, HEADER_LEN, v2),
            resync(buf, HEADER_LEN, Seal::V1),
        ) {
            (Some(a), Some(b)) if b < a => Seal::V1,
            (None, Some(_)) => Seal::V1,
            _ => v2,
        },
    }
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

/// Why no intact frame starts at an offset.
enum Bad {
    /// Fewer than a frame header's bytes left.
    ShortHeader,
    /// The header CRC does not match (damage, or not a frame start).
    HeaderCrc,
    /// The length reaches past the end of the file.
    PastEnd,
    /// The body CRC does not match; `at_end`: the frame ends exactly at the end of the file.
    BodyCrc { at_end: bool },
}

/// The body of the intact frame starting at `at`, or why there is none. Cheap (no scan), so
/// [`resync`] can try it at every offset.
fn frame_at(buf: &[u8], at: usize, seal: Seal) -> Result<&[u8], Bad> {
    let rest = buf.get(at..).unwrap_or_default();
    let Some(head) = rest.get(..FRAME_HEADER_LEN) else {
        return Err(Bad::ShortHeader);
    };
    let word = |i: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&head[i..i + 4]);
        u32::from_le_bytes(w)
    };
    let (len, crc, hcrc) = (word(0) as usize, word(4), word(8));
    if seal.header_crc(at as u64, &head[..8]) != hcrc {
        return Err(Bad::HeaderCrc);
    }
    let Some(body) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
        return Err(Bad::PastEnd);
    };
    if crc32fast::hash(body) != crc {
        return Err(Bad::BodyCrc {
            at_end: FRAME_HEADER_LEN + len == rest.len(),
        });
    }
    Ok(body)
}

/// Reads the frame at `pos` of a file sealed with `seal`, advancing `pos` past an intact frame.
pub(super) fn next_frame<'a>(buf: &'a [u8], pos: &mut usize, seal: Seal) -> Next<'a> {
    if *pos >= buf.len() {
        return Next::End;
    }
    match frame_at(buf, *pos, seal) {
        Ok(body) => {
            *pos += FRAME_HEADER_LEN + body.len();
            Next::Frame(body)
        }
        Err(Bad::ShortHeader | Bad::PastEnd | Bad::BodyCrc { at_end: true }) => Next::Torn,
        Err(Bad::HeaderCrc) => {
            if buf[*pos..].iter().all(|b| *b == 0) {
                return Next::Torn; // zero-filled tail: the size grew but the data never landed
            }
            Next::Corrupt("frame header checksum mismatch")
        }
        Err(Bad::BodyCrc { at_end: false }) => Next::Corrupt("frame checksum mismatch"),
    }
}

/// The first offset at or after `from` where an intact frame starts (header and body CRC
/// match and the body lies inside `buf`), for reading on past damage; `None` if there is none.
/// Only runs after damage: it tries every byte offset, first whether the length fits in
/// the file (cheap; random bytes fail it 63 times in 64), then the header CRC.
pub(super) fn resync(buf: &[u8], from: usize, seal: Seal) -> Option<usize> {
    let last = buf.len().checked_sub(FRAME_HEADER_LEN)?;
    (from..=last).find(|&at| {
        let mut len = [0u8; 4];
        len.copy_from_slice(&buf[at..at + 4]);
        u32::from_le_bytes(len) as usize <= last - at && frame_at(buf, at, seal).is_ok()
    })
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
        let mut f = super::private::options()
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

#[cfg(test)]
pub(crate) mod test_files {
    //! Files built by hand for the recovery tests: old format versions, chosen frames.
    use super::{begin_frame, finish_frame, header_of_version, Seal, LOG_MAGIC, SNAPSHOT_MAGIC};

    /// A log (or snapshot) file `gen` in format `version` (1 or 2), one frame per body.
    pub(crate) fn file_of(snapshot: bool, gen: u64, version: u32, bodies: &[Vec<u8>]) -> Vec<u8> {
        let magic = if snapshot { SNAPSHOT_MAGIC } else { LOG_MAGIC };
        let seal = if version == 1 {
            Seal::V1
        } else {
            Seal::V2 { magic, gen }
        };
        let mut out = header_of_version(magic, gen, version).to_vec();
        for body in bodies {
            let start = begin_frame(&mut out);
            out.extend_from_slice(body);
            finish_frame(&mut out, start, seal, 0);
        }
        out
    }
}
