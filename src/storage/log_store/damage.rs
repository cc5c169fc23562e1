//! Damage found at open: what was skipped (frames, bytes, records by kind as far as the damaged
//! bytes still parse), where, and what to do about it: keep a copy of the damaged files for
//! analysis, report the loss (`tracing::error!` and [`RecoveryLoss`] for the metrics), and
//! write the recovered state as a new generation so the next start reads clean files.
//!
//! Must not delete or move the damaged files before their replacement is complete: the copy
//! is made first (hard links, else copies), and only a complete snapshot of the new
//! generation supersedes the old files (as in compaction, a crash at any step leaves a
//! recoverable set and the next start redoes the recovery).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use super::format::{create_log, sync_dir, FRAME_HEADER_LEN, HEADER_LEN, KIND_OPS};
use super::recovery::Opened;
use super::snapshot::{encode_snapshot, write_snapshot};
use super::STORE_DIR;
use crate::storage::record::Dec;
use crate::storage::state::State;
use crate::storage::{now_unix_ms, Op, RecoveryLoss, StorageError};

/// Everything recovery skipped, accumulated over the files it read.
#[derive(Debug, Default)]
pub(super) struct Damage {
    /// The counts the metrics export.
    pub(super) loss: RecoveryLoss,
    /// One line per damaged stretch, header or missing file, for the log.
    places: Vec<String>,
    /// Inbound QoS 2 ids forgotten where log frames were skipped (`State::forget_inbound_qos2`).
    pub(super) inbound_forgotten: usize,
    /// In-flight entries put back to queued (`State::requeue_colliding_inflight`).
    pub(super) inflight_requeued: usize,
}

/// How far the body of a damaged frame still parsed.
struct Parsed {
    by_kind: [u64; Op::KIND_NAMES.len()],
    /// The op count the frame declares, if it could be read and is plausible.
    declared: Option<u64>,
    /// Every declared op parsed and the body ended exactly after them.
    complete: bool,
}

/// Counts the ops a damaged frame body still yields, one by one until one fails to parse.
/// Best effort: the bytes failed their checksum, so a damaged tag can be miscounted.
fn parse_records(body: &[u8]) -> Parsed {
    let mut parsed = Parsed {
        by_kind: [0; Op::KIND_NAMES.len()],
        declared: None,
        complete: false,
    };
    let mut dec = Dec::new(body);
    match dec.u8() {
        Ok(KIND_OPS) => {}
        // A trailer (op count and highest id) holds no records; garbage holds unknown ones.
        Ok(kind) => {
            parsed.complete = kind == super::format::KIND_TRAILER;
            return parsed;
        }
        Err(_) => return parsed,
    }
    let Ok(declared) = dec.u32() else {
        return parsed;
    };
    // Each op takes at least two bytes: a larger count is itself damaged.
    if declared as usize * 2 <= body.len() {
        parsed.declared = Some(u64::from(declared));
    }
    let mut n = 0;
    while n < declared {
        match dec.op() {
            Ok(op) => parsed.by_kind[op.kind()] += 1,
            Err(_) => return parsed,
        }
        n += 1;
    }
    parsed.complete = parsed.declared.is_some() && dec.is_empty();
    parsed
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

impl Damage {
    /// True when nothing was damaged.
    pub(super) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Records the damaged stretch `bytes[from..to]` of `file` (one frame, or a stretch
    /// whose frames cannot be told apart), counting what its body still parses to.
    pub(super) fn stretch(&mut self, file: &Path, bytes: &[u8], from: usize, to: usize, why: &str) {
        let loss = &mut self.loss;
        loss.frames += 1;
        loss.bytes += (to - from) as u64;
        let parsed = parse_records(bytes.get(from + FRAME_HEADER_LEN..to).unwrap_or_default());
        for (total, n) in loss.records.iter_mut().zip(parsed.by_kind) {
            *total += n;
        }
        let counted: u64 = parsed.by_kind.iter().sum();
        if let Some(declared) = parsed.declared {
            loss.unknown_records += declared.saturating_sub(counted);
        }
        loss.partial |= !parsed.complete;
        self.places
            .push(format!("{} bytes {from}..{to}: {why}", file_name(file)));
    }

    /// Records a damaged file header of a file of `len` bytes. The frames after it are read
    /// on (with the format version the header names, else guessed), so what is lost is its
    /// bytes, and whatever frames the guess could not find: counts become a lower bound.
    pub(super) fn header(&mut self, file: &Path, len: usize, why: &str) {
        self.loss.bytes += len.min(HEADER_LEN) as u64;
        self.loss.partial = true;
        self.places
            .push(format!("{} header: {why}", file_name(file)));
    }

    /// Records a missing log file: its commits are lost, their number unknown.
    pub(super) fn missing(&mut self, file: &str) {
        self.loss.frames += 1;
        self.loss.partial = true;
        self.places.push(format!("{file} is missing"));
    }

    /// Records what a snapshot's trailer says was lost beyond the records already counted.
    pub(super) fn note(&mut self, file: &Path, what: &str, unknown_records: u64, partial: bool) {
        self.loss.unknown_records += unknown_records;
        self.loss.partial |= partial;
        self.places.push(format!("{} {what}", file_name(file)));
    }

    /// Lost records counted so far, all kinds (the snapshot reader compares with its trailer).
    pub(super) fn counted_records(&self) -> u64 {
        self.loss.total_records()
    }

    /// The lost records by kind, for the log line (`put_message=1 enqueue=1`).
    fn records_text(&self) -> String {
        let mut out = String::new();
        for (name, n) in Op::KIND_NAMES.iter().zip(self.loss.records) {
            if n > 0 {
                let _ = write!(out, "{name}={n} ");
            }
        }
        if self.loss.unknown_records > 0 {
            let _ = write!(out, "unknown={} ", self.loss.unknown_records);
        }
        if out.is_empty() {
            out.push_str("none ");
        }
        out.push_str(if self.loss.partial {
            "(at least)"
        } else {
            "(exact)"
        });
        out
    }

    /// Logs the damage and what was kept.
    fn report(&self, copy: &Path, state: &State) {
        let places = self.places.join("; ");
        let (sessions, queued, retained) = state.counts();
        tracing::error!(
            lost_frames = self.loss.frames,
            lost_bytes = self.loss.bytes,
            lost_records = %self.records_text(),
            damage = %places,
            copy = %copy.display(),
            kept_sessions = sessions,
            kept_queued = queued,
            kept_retained = retained,
            inbound_qos2_ids_forgotten = self.inbound_forgotten,
            inflight_requeued = self.inflight_requeued,
            "STORE DAMAGED: skipped the frames that fail their checksums and kept every intact \
             one; the records in the skipped frames are lost (a lost removal can bring a message \
             back: it is delivered again rather than lost). A copy of the damaged files is kept \
             for analysis."
        );
    }
}

/// Links (or, where links are not supported, copies) `files` into a new
/// `<dir>/store.corrupt-<unix-secs>` directory, synced, and returns it.
fn keep_copy(dir: &Path, files: &[PathBuf]) -> Result<PathBuf, StorageError> {
    let secs = now_unix_ms() / 1000;
    let mut copy = dir.join(format!("{STORE_DIR}.corrupt-{secs}"));
    let mut n = 1;
    while copy.exists() {
        copy = dir.join(format!("{STORE_DIR}.corrupt-{secs}-{n}"));
        n += 1;
    }
    super::private::create_dir(&copy)
        .map_err(|e| StorageError::io(format!("creating {}", copy.display()), e))?;
    for file in files {
        let Some(name) = file.file_name() else {
            continue;
        };
        let to = copy.join(name);
        if fs::hard_link(file, &to).is_err() {
            fs::copy(file, &to).map_err(|e| {
                StorageError::io(format!("copying {} to {}", file.display(), to.display()), e)
            })?;
        }
    }
    sync_dir(&copy)
        .and_then(|()| sync_dir(dir))
        .map_err(|e| StorageError::io(format!("syncing {}", copy.display()), e))?;
    Ok(copy)
}

/// Keeps a copy of the damaged `files`, reports the damage, and writes `state` (everything
/// that was intact) as generation `gen`: log `gen` first, then snapshot `gen`, whose
/// completion deletes the older files.
pub(super) fn rebuild(
    dir: &Path,
    store_dir: &Path,
    files: &[PathBuf],
    state: State,
    damage: &Damage,
    gen: u64,
) -> Result<Opened, StorageError> {
    let copy = keep_copy(dir, files)?;
    damage.report(&copy, &state);
    let log = create_log(store_dir, gen)?;
    let bytes = encode_snapshot(&state, gen);
    write_snapshot(store_dir, gen, &bytes)?;
    Ok(Opened {
        state,
        log,
        log_gen: gen,
        log_len: HEADER_LEN as u64,
        log_bytes: HEADER_LEN as u64,
        snapshot_bytes: bytes.len() as u64,
        loss: damage.loss,
    })
}
