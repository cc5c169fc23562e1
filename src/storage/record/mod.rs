//! The record format: compact binary encoding of [`Op`](super::Op)s: little-endian integers,
//! u32-length-prefixed byte strings, one tag byte per op. Hand-written (no serde format
//! crate) so payloads are written straight from their `Bytes`, and so every read from disk
//! is bounds-checked and returns an error instead of panicking. [`Enc`] (in `write`) and
//! [`Dec`] (in `read`) must mirror each other field for field.
//!
//! Must not do integrity or framing: the frames around these bytes carry CRCs (see
//! `log_store::format`). Must not change an existing tag or field order: logs and snapshots
//! on disk are decoded with it.
//!
//! Must not: frame, checksum, or trust lengths when reading.

mod read;
mod write;

pub(super) use read::Dec;
pub(super) use write::Enc;

/// Why bytes could not be decoded; always means corruption or a format bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {pos}")]
pub(super) struct DecodeError {
    /// What was expected.
    pub what: &'static str,
    /// Offset in the decoded buffer.
    pub pos: usize,
}

// One tag byte per op kind; the values are on disk, never renumber.
const PUT_SESSION: u8 = 1;
const DELETE_SESSION: u8 = 2;
const PUT_SUBSCRIPTION: u8 = 3;
const DELETE_SUBSCRIPTION: u8 = 4;
const PUT_MESSAGE: u8 = 5;
const ENQUEUE: u8 = 6;
const UPDATE_ENTRY: u8 = 7;
const REMOVE_ENTRY: u8 = 8;
const PUT_INBOUND: u8 = 9;
const REMOVE_INBOUND: u8 = 10;
const PUT_RETAINED: u8 = 11;
const DELETE_RETAINED: u8 = 12;
const PUT_WILL: u8 = 13;
const DELETE_WILL: u8 = 14;
const COUNT_DELIVERY: u8 = 15;
const PUT_DEDUP: u8 = 16;
/// `PUT_SESSION` followed by the owner (issue 35): written only for a bound session, so a
/// store of a broker without authentication keeps the older tag.
const PUT_SESSION_OWNED: u8 = 17;
/// [`Op::SequenceMessage`](crate::storage::Op::SequenceMessage): a body's cluster stream
/// sequence. A tag of its own, written only by a clustered node, so a single node's store
/// holds the same bytes as before (and an older store, without it, loads as it did).
const SEQUENCE_MESSAGE: u8 = 18;
/// `PUT_RETAINED` of a retained message an anonymous client published (pass 7B, P1): the
/// same fields, the tag says it counts in the anonymous share when restored. Written only for
/// such a message, so a store without anonymous retained messages holds the same bytes as
/// before (and an older store, without it, loads as it did).
const PUT_RETAINED_ANONYMOUS: u8 = 19;
/// `PUT_MESSAGE` of a body an anonymous client published (issue 35, fifteenth adversarial
/// pass, B3): the same fields, the tag says it is charged to the anonymous share for its life
/// again when restored. Written only for such a body, so a store without a stranger's queued
/// message holds the same bytes as before (and an older store loads as it did).
const PUT_MESSAGE_ANONYMOUS: u8 = 20;
/// `ENQUEUE` of a shared group's delivery, its group's key (`$share/{group}/{filter}`) after
/// the same fields (issue 35, sixteenth adversarial pass, C3: restored without it, a
/// delivery stayed with its session whatever became of it, and a member's end or smaller
/// Maximum Packet Size lost the jobs it held). Written only for such a delivery, so a store
/// without one holds the same bytes as before (and an older store loads as it did).
const ENQUEUE_SHARED: u8 = 21;
