//! Snapshot files: the state written out as ops in frames of about 1 MiB, then a trailer
//! frame (op count, highest message id). Written to a temp file, fsynced, renamed, directory
//! fsynced: a snapshot is either complete or absent.
//!
//! Must not decide when to snapshot (that is `compaction`) or what to do with a bad one
//! (that is `recovery`); reading only says whether the bytes are a valid snapshot.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use super::format::{
    begin_frame, check_header, file_header, finish_frame, next_frame, remove_older_than,
    snapshot_name, sync_dir, Next, HEADER_LEN, KIND_OPS, KIND_TRAILER, SNAPSHOT_MAGIC,
};
use crate::storage::record::{Dec, Enc};
use crate::storage::state::State;
use crate::storage::StorageError;

/// Snapshot frames are cut at about this size, so no single frame gets huge.
const SNAPSHOT_FRAME_BYTES: usize = 1 << 20;

/// The bytes of snapshot `gen` holding `state`.
pub(super) fn encode_snapshot(state: &State, gen: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&file_header(SNAPSHOT_MAGIC, gen));
    let mut total: u64 = 0;
    let mut frame: Option<(usize, usize, u32)> = None; // (frame start, count offset, count)
    let close = |out: &mut Vec<u8>, (start, at, count): (usize, usize, u32)| {
        out[at..at + 4].copy_from_slice(&count.to_le_bytes());
        finish_frame(out, start);
    };
    state.for_each_op(|op| {
        let (start, at, count) = match frame.take() {
            Some(f) => f,
            None => {
                let start = begin_frame(&mut out);
                out.push(KIND_OPS);
                let at = out.len();
                out.extend_from_slice(&[0u8; 4]);
                (start, at, 0)
            }
        };
        Enc(&mut out).op(op);
        total += 1;
        let f = (start, at, count + 1);
        if out.len() - start >= SNAPSHOT_FRAME_BYTES {
            close(&mut out, f);
        } else {
            frame = Some(f);
        }
    });
    if let Some(f) = frame {
        close(&mut out, f);
    }
    let start = begin_frame(&mut out);
    let mut enc = Enc(&mut out);
    enc.u8(KIND_TRAILER);
    enc.u64(total);
    enc.u64(state.max_message_id);
    finish_frame(&mut out, start);
    out
}

/// Writes a snapshot atomically, then deletes the files it supersedes.
pub(super) fn write_snapshot(dir: &Path, gen: u64, bytes: &[u8]) -> Result<(), StorageError> {
    let path = dir.join(snapshot_name(gen));
    let tmp = dir.join(format!("{}.tmp", snapshot_name(gen)));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(StorageError::io(format!("writing {}", path.display()), e));
    }
    remove_older_than(dir, gen);
    Ok(())
}

/// The state snapshot `gen` holds, or why `bytes` are not a valid snapshot.
pub(super) fn read_snapshot(bytes: &[u8], gen: u64) -> Result<State, String> {
    check_header(bytes, SNAPSHOT_MAGIC, gen)?;
    let mut state = State::default();
    let mut pos = HEADER_LEN;
    let mut total: u64 = 0;
    loop {
        match next_frame(bytes, &mut pos) {
            Next::Frame(body) => {
                let mut dec = Dec::new(body);
                match dec.u8().map_err(|e| e.to_string())? {
                    KIND_OPS => {
                        for op in dec.ops().map_err(|e| e.to_string())? {
                            state.apply(op);
                            total += 1;
                        }
                    }
                    KIND_TRAILER => {
                        let count = dec.u64().map_err(|e| e.to_string())?;
                        let max_id = dec.u64().map_err(|e| e.to_string())?;
                        if count != total {
                            return Err(format!("trailer counts {count} ops, found {total}"));
                        }
                        if pos != bytes.len() {
                            return Err("data after the trailer".to_owned());
                        }
                        state.end_batch();
                        state.max_message_id = state.max_message_id.max(max_id);
                        return Ok(state);
                    }
                    kind => return Err(format!("unexpected frame kind {kind}")),
                }
                if !dec.is_empty() {
                    return Err("trailing bytes in frame".to_owned());
                }
            }
            Next::End | Next::Torn => return Err("cut short (no trailer)".to_owned()),
            Next::Corrupt(why) => return Err(format!("{why} at byte {pos}")),
        }
    }
}
