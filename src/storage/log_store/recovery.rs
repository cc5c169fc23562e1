//! Recovery at open: load the newest snapshot, replay the logs after it in order, repair a
//! torn tail of the last log in place (nobody was told that frame was durable). Any other
//! damage is corruption: the store is moved aside to `store.corrupt-<unix-secs>`, the state
//! up to the damage (snapshot plus every intact frame before it) is written to a fresh
//! store, and `tracing::error!` says so. A damaged snapshot leaves nothing to build on, so
//! that case starts empty.
//!
//! Must not fail the open for corruption (only for a directory that cannot be used), and
//! must not delete a damaged store (it is kept for analysis).

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use super::format::{
    check_header, create_log, log_name, next_frame, parse_name, remove_older_than, snapshot_name,
    sync_dir, FileKind, Next, HEADER_LEN, KIND_OPS, LOG_MAGIC,
};
use super::snapshot::{encode_snapshot, read_snapshot, write_snapshot};
use super::STORE_DIR;
use crate::storage::record::Dec;
use crate::storage::state::State;
use crate::storage::{now_unix_ms, StorageError};

/// A store ready for the writer.
pub(super) struct Opened {
    pub(super) state: State,
    pub(super) log: File,
    pub(super) log_gen: u64,
    pub(super) log_len: u64,
    pub(super) log_bytes: u64,
    pub(super) snapshot_bytes: u64,
}

/// Why recovery failed, and the state that could still be verified.
pub(super) struct Broken {
    reason: String,
    state: State,
    frames_recovered: u64,
}

fn broken(reason: impl Into<String>, state: State, frames_recovered: u64) -> Box<Broken> {
    Box::new(Broken {
        reason: reason.into(),
        state,
        frames_recovered,
    })
}

/// Loads snapshot + logs. Only a torn tail of the last log is repaired in place; anything
/// else is returned as [`Broken`].
pub(super) fn recover(store_dir: &Path) -> Result<Opened, Box<Broken>> {
    if !store_dir.exists() {
        let create = || -> Result<Opened, StorageError> {
            fs::create_dir_all(store_dir)
                .map_err(|e| StorageError::io(format!("creating {}", store_dir.display()), e))?;
            if let Some(parent) = store_dir.parent() {
                let _ = sync_dir(parent);
            }
            fresh(store_dir, State::default())
        };
        return create().map_err(|e| broken(e.to_string(), State::default(), 0));
    }
    let entries = fs::read_dir(store_dir).map_err(|e| {
        broken(
            format!("cannot list {}: {e}", store_dir.display()),
            State::default(),
            0,
        )
    })?;
    let mut logs = Vec::new();
    let mut snapshots = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| broken(format!("cannot list store: {e}"), State::default(), 0))?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_name) {
            Some(FileKind::Log(g)) => logs.push(g),
            Some(FileKind::Snapshot(g)) => snapshots.push(g),
            Some(FileKind::Temp) => {
                let _ = fs::remove_file(entry.path()); // an interrupted snapshot write
            }
            None => tracing::warn!(file = ?name, "ignoring unknown file in the store directory"),
        }
    }
    logs.sort_unstable();
    let snapshot_gen = snapshots.iter().copied().max().unwrap_or(0);
    let mut state = State::default();
    let mut snapshot_bytes = 0;
    if snapshot_gen > 0 {
        let path = store_dir.join(snapshot_name(snapshot_gen));
        let bytes = fs::read(&path).map_err(|e| {
            broken(
                format!("cannot read {}: {e}", path.display()),
                State::default(),
                0,
            )
        })?;
        snapshot_bytes = bytes.len() as u64;
        state = read_snapshot(&bytes, snapshot_gen).map_err(|why| {
            broken(
                format!("snapshot {}: {why}", path.display()),
                State::default(),
                0,
            )
        })?;
    }
    let first = snapshot_gen.max(1);
    let logs: Vec<u64> = logs.into_iter().filter(|g| *g >= first).collect();
    if logs.is_empty() {
        if snapshot_gen > 0 {
            return Err(broken(format!("log {first} is missing"), state, 0));
        }
        return fresh(store_dir, state).map_err(|e| broken(e.to_string(), State::default(), 0));
    }
    for (i, g) in logs.iter().enumerate() {
        if *g != first + i as u64 {
            return Err(broken(
                format!("log {} is missing", first + i as u64),
                state,
                0,
            ));
        }
    }
    let mut frames: u64 = 0;
    let mut log_bytes: u64 = 0;
    let last = logs.len() - 1;
    let mut tail: Option<(u64, u64, bool)> = None; // (gen, valid length, torn)
    for (i, gen) in logs.iter().copied().enumerate() {
        let path = store_dir.join(log_name(gen));
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                return Err(broken(
                    format!("cannot read {}: {e}", path.display()),
                    state,
                    frames,
                ))
            }
        };
        if i == last && bytes.len() < HEADER_LEN {
            // Created but its header never fully reached the disk: no frame can follow.
            tail = Some((gen, 0, true));
            break;
        }
        if let Err(why) = check_header(&bytes, LOG_MAGIC, gen) {
            return Err(broken(format!("{}: {why}", path.display()), state, frames));
        }
        let mut pos = HEADER_LEN;
        loop {
            match next_frame(&bytes, &mut pos) {
                Next::Frame(body) => {
                    if let Err(why) = apply_log_frame(&mut state, body) {
                        return Err(broken(
                            format!("{} at byte {pos}: {why}", path.display()),
                            state,
                            frames,
                        ));
                    }
                    frames += 1;
                }
                Next::End => break,
                Next::Torn if i == last => {
                    tracing::warn!(file = %path.display(), at = pos, dropped = bytes.len() - pos,
                        "store log ends in an incomplete frame (crash during a write); dropping it");
                    break;
                }
                Next::Torn => {
                    return Err(broken(
                        format!("{} is cut short at byte {pos}", path.display()),
                        state,
                        frames,
                    ))
                }
                Next::Corrupt(why) => {
                    return Err(broken(
                        format!("{} at byte {pos}: {why}", path.display()),
                        state,
                        frames,
                    ))
                }
            }
        }
        log_bytes += pos as u64;
        tail = Some((gen, pos as u64, pos < bytes.len()));
    }
    remove_older_than(store_dir, snapshot_gen);
    let Some((gen, valid, torn)) = tail else {
        return fresh(store_dir, state).map_err(|e| broken(e.to_string(), State::default(), 0));
    };
    let path = store_dir.join(log_name(gen));
    let reopen = || -> Result<File, StorageError> {
        if valid < HEADER_LEN as u64 {
            return create_log(store_dir, gen);
        }
        if torn {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))?;
            f.set_len(valid)
                .and_then(|()| f.sync_all())
                .map_err(|e| StorageError::io(format!("truncating {}", path.display()), e))?;
        }
        OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| StorageError::io(format!("opening {}", path.display()), e))
    };
    match reopen() {
        Ok(log) => Ok(Opened {
            state,
            log,
            log_gen: gen,
            log_len: valid.max(HEADER_LEN as u64),
            log_bytes,
            snapshot_bytes,
        }),
        Err(e) => Err(broken(e.to_string(), state, frames)),
    }
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

/// Creates the files of a store holding `state`: `snapshot-1` (if not empty) and `log-1`.
fn fresh(store_dir: &Path, state: State) -> Result<Opened, StorageError> {
    let mut snapshot_bytes = 0;
    let empty = state.live_bytes == 0 && state.max_message_id == 0;
    if !empty {
        let bytes = encode_snapshot(&state, 1);
        snapshot_bytes = bytes.len() as u64;
        write_snapshot(store_dir, 1, &bytes)?;
    }
    let log = create_log(store_dir, 1)?;
    Ok(Opened {
        state,
        log,
        log_gen: 1,
        log_len: HEADER_LEN as u64,
        log_bytes: HEADER_LEN as u64,
        snapshot_bytes,
    })
}

/// Moves a broken store aside and starts a new one from what could be verified.
pub(super) fn rebuild(
    dir: &Path,
    store_dir: &Path,
    broken: Broken,
) -> Result<Opened, StorageError> {
    let secs = now_unix_ms() / 1000;
    let mut aside = dir.join(format!("{STORE_DIR}.corrupt-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = dir.join(format!("{STORE_DIR}.corrupt-{secs}-{n}"));
        n += 1;
    }
    if store_dir.exists() {
        fs::rename(store_dir, &aside).map_err(|e| {
            StorageError::io(
                format!(
                    "moving the corrupt store {} aside to {}",
                    store_dir.display(),
                    aside.display()
                ),
                e,
            )
        })?;
    }
    let sessions = broken.state.to_snapshot().sessions.len();
    tracing::error!(
        reason = %broken.reason,
        moved_to = %aside.display(),
        frames_recovered = broken.frames_recovered,
        sessions_recovered = sessions,
        "STORE CORRUPT: moved aside; starting from the state before the damage \
         (messages committed after it are lost). Keep the moved directory for analysis."
    );
    // Build the replacement beside it and rename it in, so a crash now cannot leave a
    // half-written store that would itself look corrupt (or empty) at the next start.
    let building = dir.join(format!("{STORE_DIR}.rebuilding"));
    if building.exists() {
        fs::remove_dir_all(&building)
            .map_err(|e| StorageError::io(format!("removing {}", building.display()), e))?;
    }
    fs::create_dir_all(&building)
        .map_err(|e| StorageError::io(format!("creating {}", building.display()), e))?;
    let opened = fresh(&building, broken.state)?;
    fs::rename(&building, store_dir)
        .and_then(|()| sync_dir(dir))
        .map_err(|e| StorageError::io(format!("renaming {}", building.display()), e))?;
    Ok(opened)
}
