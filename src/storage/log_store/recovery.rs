//! Recovery at open: load the newest snapshot, replay the logs after it in order, and keep
//! every frame that passes its checksums. A torn tail of the last log (a crash during a
//! write: nobody was told that frame was durable) is cut off in place. Any other damage (a
//! frame failing its checksum, a missing log, a damaged header, an undecodable frame) is
//! skipped: the reader resynchronises on the next intact frame (`format::resync`), and
//! `damage` keeps a copy of the damaged files, reports what was lost and writes what was
//! kept as a new generation.
//!
//! An I/O error (permissions, a read-only file system, a disk error) is not corruption: it
//! fails the open with [`StorageError::Unusable`] naming the path and the fix. Everything is
//! read before anything is written, and the first write is opening the log for appending,
//! so such an error leaves the store as it was.
//!
//! Must not fail the open for corruption, and must not move or delete damaged data (a copy is
//! kept for analysis, and the old files go only once their replacement is complete).

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use super::damage::{rebuild, Damage};
use super::format::{
    check_header, create_log, file_header, guess_seal, log_name, next_frame, parse_name,
    remove_older_than, resync, snapshot_name, sync_dir, FileKind, Next, Seal, HEADER_LEN, KIND_OPS,
    LOG_MAGIC,
};
use super::snapshot::read_snapshot;
use super::unusable::explain;
use crate::storage::record::Dec;
use crate::storage::state::State;
use crate::storage::{RecoveryLoss, StorageError};

/// A store ready for the writer.
pub(super) struct Opened {
    pub(super) state: State,
    pub(super) log: File,
    pub(super) log_gen: u64,
    pub(super) log_len: u64,
    pub(super) log_bytes: u64,
    pub(super) snapshot_bytes: u64,
    /// What damaged files cost (empty after a clean start).
    pub(super) loss: RecoveryLoss,
}

/// Where the replay of the last log ended, to reopen it for appending.
struct Tail {
    gen: u64,
    /// End of the last intact frame.
    valid: u64,
    /// Bytes after `valid` are a torn frame to cut off.
    torn: bool,
    /// How its frames are sealed; `None`: shorter than its header, to be created again.
    seal: Option<Seal>,
}

/// Opens the store in `store_dir` (inside `dir`): creates it, recovers it, or recovers what
/// is intact and rewrites it (see the module doc).
pub(super) fn recover(dir: &Path, store_dir: &Path) -> Result<Opened, StorageError> {
    open_store(dir, store_dir).map_err(|e| explain(e, store_dir))
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> StorageError + '_ {
    move |e| StorageError::io(format!("reading {}", path.display()), e)
}

fn open_store(dir: &Path, store_dir: &Path) -> Result<Opened, StorageError> {
    if !store_dir.exists() {
        super::private::create_dir_all(store_dir)
            .map_err(|e| StorageError::io(format!("creating {}", store_dir.display()), e))?;
        if let Some(parent) = store_dir.parent() {
            let _ = sync_dir(parent);
        }
        return fresh(store_dir);
    }
    // Read everything first: an I/O error stops the open before anything was written.
    let entries = fs::read_dir(store_dir).map_err(read_error(store_dir))?;
    let (mut logs, mut snapshots, mut temps) = (Vec::new(), Vec::new(), Vec::new());
    for entry in entries {
        let entry = entry.map_err(read_error(store_dir))?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_name) {
            Some(FileKind::Log(g)) => logs.push(g),
            Some(FileKind::Snapshot(g)) => snapshots.push(g),
            Some(FileKind::Temp) => temps.push(entry.path()), // an interrupted snapshot write
            None => {
                let file = entry.path();
                tracing::warn!(file = %file.display(), "ignoring unknown file in the store directory");
            }
        }
    }
    logs.sort_unstable();
    let newest = logs.iter().chain(&snapshots).copied().max().unwrap_or(0);
    let snapshot_gen = snapshots.iter().copied().max().unwrap_or(0);
    let mut damage = Damage::default();
    let mut read = Vec::new(); // the files the state comes from, copied if damaged
    let mut state = State::default();
    let mut snapshot_bytes = 0;
    if snapshot_gen > 0 {
        let path = store_dir.join(snapshot_name(snapshot_gen));
        let bytes = fs::read(&path).map_err(read_error(&path))?;
        snapshot_bytes = bytes.len() as u64;
        state = read_snapshot(&path, &bytes, snapshot_gen, &mut damage);
        read.push(path);
    }
    let first = snapshot_gen.max(1);
    let logs: Vec<u64> = logs.into_iter().filter(|g| *g >= first).collect();
    if logs.is_empty() && snapshot_gen > 0 {
        damage.missing(&log_name(first));
    }
    let mut log_bytes: u64 = 0;
    let mut tail = None;
    let mut expected = first;
    for (i, gen) in logs.iter().copied().enumerate() {
        for missing in expected..gen {
            damage.missing(&log_name(missing));
            damage.inbound_forgotten += state.forget_inbound_qos2();
        }
        expected = gen + 1;
        let path = store_dir.join(log_name(gen));
        let bytes = fs::read(&path).map_err(read_error(&path))?;
        let end = replay_log(
            &path,
            &bytes,
            gen,
            i + 1 == logs.len(),
            &mut state,
            &mut damage,
        );
        log_bytes += end.valid;
        read.push(path);
        tail = Some(end);
    }
    if !damage.is_empty() {
        damage.inflight_requeued = state.requeue_colliding_inflight();
        let opened = rebuild(dir, store_dir, &read, state, &damage, newest + 1)?;
        remove_temps(&temps);
        return Ok(opened);
    }
    let Some(tail) = tail else {
        remove_temps(&temps);
        return fresh(store_dir); // an empty directory
    };
    let (log, log_gen, log_len) = reopen(store_dir, &tail)?;
    // The log appended to counts with its length now (a new one, if it was started).
    let reopened = if log_gen == tail.gen { tail.valid } else { 0 };
    let log_bytes = log_bytes - reopened + log_len;
    remove_temps(&temps);
    remove_older_than(store_dir, snapshot_gen);
    Ok(Opened {
        state,
        log,
        log_gen,
        log_len,
        log_bytes,
        snapshot_bytes,
        loss: RecoveryLoss::default(),
    })
}

fn remove_temps(temps: &[PathBuf]) {
    for temp in temps {
        let _ = fs::remove_file(temp);
    }
}

/// True for the bytes a crash while creating log `gen` can leave: nothing, zeros (the size
/// reached the disk, the data did not), or the start of its header.
fn torn_create(bytes: &[u8], gen: u64) -> bool {
    let header = file_header(LOG_MAGIC, gen);
    bytes.iter().all(|b| *b == 0) || header.starts_with(bytes)
}

/// Replays log `gen` (read from `path`) into `state`, skipping damaged stretches (recorded
/// in `damage`); returns where its intact data ends.
fn replay_log(
    path: &Path,
    bytes: &[u8],
    gen: u64,
    last: bool,
    state: &mut State,
    damage: &mut Damage,
) -> Tail {
    let mut tail = Tail {
        gen,
        valid: 0,
        torn: false,
        seal: None,
    };
    if bytes.len() < HEADER_LEN {
        if last && torn_create(bytes, gen) {
            tracing::warn!(file = %path.display(), bytes = bytes.len(),
                "store log is shorter than its header: created again, empty. A crash while \
                 creating it leaves this; if the file was cut short instead, the commits it \
                 held are lost");
        } else {
            damage.stretch(path, bytes, 0, bytes.len(), "shorter than its header");
            damage.inbound_forgotten += state.forget_inbound_qos2();
        }
        return tail;
    }
    let seal = check_header(bytes, LOG_MAGIC, gen).unwrap_or_else(|why| {
        damage.header(path, bytes.len(), &why);
        guess_seal(bytes, LOG_MAGIC, gen)
    });
    tail.seal = Some(seal);
    let mut pos = HEADER_LEN;
    loop {
        let at = pos;
        match next_frame(bytes, &mut pos, seal) {
            Next::Frame(body) => {
                if let Err(why) = apply_log_frame(state, body) {
                    damage.stretch(path, bytes, at, pos, &why);
                    damage.inbound_forgotten += state.forget_inbound_qos2();
                }
            }
            Next::End => break,
            Next::Torn if last => {
                tracing::warn!(file = %path.display(), at, dropped = bytes.len() - at,
                    "store log ends in an incomplete frame (crash during a write); dropping it");
                tail.torn = true;
                break;
            }
            Next::Torn => {
                damage.stretch(path, bytes, at, bytes.len(), "cut short");
                damage.inbound_forgotten += state.forget_inbound_qos2();
                pos = bytes.len();
                break;
            }
            Next::Corrupt(why) => {
                let next = resync(bytes, at + 1, seal);
                damage.stretch(path, bytes, at, next.unwrap_or(bytes.len()), why);
                damage.inbound_forgotten += state.forget_inbound_qos2();
                match next {
                    Some(next) => pos = next,
                    None => {
                        pos = bytes.len();
                        break;
                    }
                }
            }
        }
    }
    tail.valid = pos as u64;
    tail
}

fn apply_log_frame(state: &mut State, body: &[u8]) -> Result<(), String> {
    let mut dec = Dec::new(body);
    let kind = dec.u8().map_err(|e| e.to_string())?;
    if kind != KIND_OPS {
        return Err(format!("unexpected frame kind {kind}"));
    }
    // Decode the whole frame before applying: a commit is all or nothing.
    let ops = dec.ops().map_err(|e| e.to_string())?;
    if !dec.is_empty() {
        return Err("trailing bytes in frame".to_owned());
    }
    for op in ops {
        state.apply(op);
    }
    state.end_batch();
    Ok(())
}

/// Opens the last log for appending, first cutting off a torn tail. A log shorter than its
/// header is created again; a log of format version 1 is left as it is (it is read, never
/// appended to) and log `gen + 1` is started. Returns the log, its generation and length.
fn reopen(store_dir: &Path, tail: &Tail) -> Result<(File, u64, u64), StorageError> {
    let Some(seal) = tail.seal else {
        return Ok((
            create_log(store_dir, tail.gen)?,
            tail.gen,
            HEADER_LEN as u64,
        ));
    };
    let path = store_dir.join(log_name(tail.gen));
    // The first write of the open: on a read-only store it fails here, having changed nothing.
    let log = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|e| StorageError::io(format!("opening {} for writing", path.display()), e))?;
    if tail.torn {
        log.set_len(tail.valid)
            .and_then(|()| log.sync_all())
            .map_err(|e| StorageError::io(format!("truncating {}", path.display()), e))?;
    }
    if seal == Seal::V1 {
        drop(log);
        let gen = tail.gen + 1;
        return Ok((create_log(store_dir, gen)?, gen, HEADER_LEN as u64));
    }
    Ok((log, tail.gen, tail.valid))
}

/// Creates the files of an empty store: `log-1`.
fn fresh(store_dir: &Path) -> Result<Opened, StorageError> {
    let log = create_log(store_dir, 1)?;
    Ok(Opened {
        state: State::default(),
        log,
        log_gen: 1,
        log_len: HEADER_LEN as u64,
        log_bytes: HEADER_LEN as u64,
        snapshot_bytes: 0,
        loss: RecoveryLoss::default(),
    })
}
