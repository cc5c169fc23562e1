//! Snapshot files: the state written out as ops in frames of about 1 MiB, then a trailer
//! frame (op count, highest message id). Written to a temp file, fsynced, renamed, directory
//! fsynced: a snapshot is either complete or absent.
//!
//! Must not decide when to snapshot (that is `compaction`) or what to do with a damaged one
//! (that is `recovery`); reading keeps every intact frame and records the rest as damage.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::damage::Damage;
use super::format::{
    begin_frame, check_header, file_header, finish_frame, guess_seal, next_frame,
    remove_older_than, resync, snapshot_name, sync_dir, Next, Seal, HEADER_LEN, KIND_OPS,
    KIND_TRAILER, SNAPSHOT_MAGIC,
};
use crate::storage::record::{Dec, Enc};
use crate::storage::state::State;
use crate::storage::{Op, StorageError};

/// Snapshot frames are cut at about this size, so no single frame gets huge.
const SNAPSHOT_FRAME_BYTES: usize = 1 << 20;

/// The bytes of snapshot `gen` holding `state`.
pub(super) fn encode_snapshot(state: &State, gen: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let seal = Seal::snapshot(gen);
    out.extend_from_slice(&file_header(SNAPSHOT_MAGIC, gen));
    let mut total: u64 = 0;
    let mut frame: Option<(usize, usize, u32)> = None; // (frame start, count offset, count)
    let close = |out: &mut Vec<u8>, (start, at, count): (usize, usize, u32)| {
        out[at..at + 4].copy_from_slice(&count.to_le_bytes());
        finish_frame(out, start, seal, 0);
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
    finish_frame(&mut out, start, seal, 0);
    out
}

/// Writes a snapshot atomically, then deletes the files it supersedes.
pub(super) fn write_snapshot(dir: &Path, gen: u64, bytes: &[u8]) -> Result<(), StorageError> {
    let path = dir.join(snapshot_name(gen));
    let tmp = dir.join(format!("{}.tmp", snapshot_name(gen)));
    let write = || -> std::io::Result<()> {
        let mut f = super::private::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
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

/// What one intact snapshot frame holds.
enum Chunk {
    Ops(Vec<Op>),
    Trailer { count: u64, max_id: u64 },
}

fn decode_chunk(body: &[u8]) -> Result<Chunk, String> {
    let mut dec = Dec::new(body);
    let chunk = match dec.u8().map_err(|e| e.to_string())? {
        KIND_OPS => Chunk::Ops(dec.ops().map_err(|e| e.to_string())?),
        KIND_TRAILER => Chunk::Trailer {
            count: dec.u64().map_err(|e| e.to_string())?,
            max_id: dec.u64().map_err(|e| e.to_string())?,
        },
        kind => return Err(format!("unexpected frame kind {kind}")),
    };
    if !dec.is_empty() {
        return Err("trailing bytes in frame".to_owned());
    }
    Ok(chunk)
}

/// The state snapshot `gen` (read from `path`) holds: every intact frame's ops. Damaged
/// frames are skipped and recorded in `damage`, with the records the trailer says are
/// missing; a snapshot is never rejected as a whole.
pub(super) fn read_snapshot(path: &Path, bytes: &[u8], gen: u64, damage: &mut Damage) -> State {
    let mut state = State::default();
    let counted_before = damage.counted_records();
    let seal = check_header(bytes, SNAPSHOT_MAGIC, gen).unwrap_or_else(|why| {
        damage.header(path, bytes.len(), &why);
        guess_seal(bytes, SNAPSHOT_MAGIC, gen)
    });
    let mut pos = HEADER_LEN.min(bytes.len());
    let mut total: u64 = 0;
    let mut trailer = None;
    let mut ends_damaged = false;
    loop {
        let at = pos;
        match next_frame(bytes, &mut pos, seal) {
            Next::Frame(body) => {
                ends_damaged = false;
                match (decode_chunk(body), trailer) {
                    (Ok(Chunk::Ops(ops)), None) => {
                        for op in ops {
                            state.apply(op);
                            total += 1;
                        }
                    }
                    (Ok(Chunk::Trailer { count, max_id }), None) => trailer = Some((count, max_id)),
                    (Ok(_), Some(_)) => {
                        damage.stretch(path, bytes, at, pos, "data after the trailer");
                    }
                    (Err(why), _) => {
                        damage.stretch(path, bytes, at, pos, &why);
                        ends_damaged = true;
                    }
                }
            }
            Next::End => break,
            Next::Torn => {
                damage.stretch(path, bytes, at, bytes.len(), "cut short");
                ends_damaged = true;
                break;
            }
            Next::Corrupt(why) => {
                let next = resync(bytes, at + 1, seal);
                damage.stretch(path, bytes, at, next.unwrap_or(bytes.len()), why);
                ends_damaged = true;
                match next {
                    Some(next) => pos = next,
                    None => break,
                }
            }
        }
    }
    // Bodies whose entries were in a skipped frame go here, as at the end of any batch.
    state.end_batch();
    match trailer {
        Some((count, max_id)) => {
            state.max_message_id = state.max_message_id.max(max_id);
            let counted = damage.counted_records() - counted_before;
            if count > total + counted {
                let missing = count - total - counted;
                damage.note(
                    path,
                    &format!("trailer: {missing} more records lost"),
                    missing,
                    false,
                );
            } else if count < total {
                damage.note(
                    path,
                    &format!("trailer counts {count} records, found {total}"),
                    0,
                    true,
                );
            }
        }
        None => {
            if !ends_damaged {
                // Cut at a frame boundary: at least the trailer is gone.
                damage.stretch(path, bytes, bytes.len(), bytes.len(), "no trailer");
            }
            damage.note(
                path,
                "has no trailer: the number of records lost is unknown",
                0,
                true,
            );
        }
    }
    state
}
