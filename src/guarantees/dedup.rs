//! Deduplication (`[dedup]`): a second PUBLISH with the same (topic, user property value)
//! inside the window is acknowledged and not routed again. Bounded by entries and bytes,
//! oldest out first; stored with the message that carried the key (`Op::PutDedup`, in the
//! same submit), restored at start.
//!
//! SKELETON: interfaces fixed by the lead; the dedup helper fills them in.

use bytestring::ByteString;

use crate::config::DedupConfig;
use crate::storage::{DedupRecord, Op};

/// What [`Dedup::check`] says about one PUBLISH.
#[derive(Debug)]
pub enum DedupCheck {
    /// Not seen within the window (now remembered): route it, and store `op` in the
    /// message's submit (with persistence on).
    Fresh {
        /// `Op::PutDedup` for the key.
        op: Box<Op>,
    },
    /// Seen within the window: acknowledge it (once what the first one's commit holds is
    /// durable) and route nothing.
    Duplicate,
}

/// The window of remembered keys.
#[derive(Debug)]
pub struct Dedup {
    config: DedupConfig,
}

impl Dedup {
    /// An empty window.
    pub fn new(config: &DedupConfig) -> Dedup {
        Dedup {
            config: config.clone(),
        }
    }

    /// The user property this window keys on.
    pub fn property(&self) -> &str {
        &self.config.property
    }

    /// Looks `key` up for `topic` and remembers it if new.
    pub fn check(&self, topic: &ByteString, key: &str, now_unix_ms: u64) -> DedupCheck {
        let _ = (topic, key, now_unix_ms);
        DedupCheck::Fresh {
            op: Box::new(Op::PutDedup {
                topic: topic.clone(),
                key: ByteString::from(key),
                expires_at_unix_ms: now_unix_ms + u64::from(self.config.window) * 1000,
            }),
        }
    }

    /// Forgets `key` again: the message it came with was refused (nothing was routed, so a
    /// re-send must not be taken for a duplicate).
    pub fn forget(&self, topic: &str, key: &str) {
        let _ = (topic, key);
    }

    /// Remembers the keys the store held at start (their windows still open).
    #[allow(clippy::needless_pass_by_value)] // SKELETON: the implementation consumes them
    pub fn restore(&self, records: Vec<DedupRecord>) {
        let _ = records;
    }
}
