//! Per-publisher sequence tracking: exact loss, duplicate and reorder counts.
//!
//! Each subscriber keeps one bitset per publisher it hears from, sized by that publisher's
//! message count, so a message is counted once however often or late it arrives, and
//! `expected - unique` is the loss with no guessing.

use crate::payload::Stamp;

/// What one received message was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// First time this (publisher, seq) arrived.
    New,
    /// Arrived before: a redelivery.
    Duplicate,
    /// Not from this run, or outside any publisher's range.
    Foreign,
}

/// Sequence bookkeeping for one subscriber.
#[derive(Debug)]
pub struct SeqTracker {
    run: u32,
    /// Message count of every publisher in the run, by publisher index.
    counts: Vec<u64>,
    seen: Vec<Option<PublisherSeen>>,
    /// Distinct messages received.
    pub unique: u64,
    /// Messages received more than once (each extra copy counts).
    pub duplicates: u64,
    /// New messages that arrived after a higher sequence number of the same publisher.
    pub reordered: u64,
    /// Messages that were not ours.
    pub foreign: u64,
}

#[derive(Debug)]
struct PublisherSeen {
    bits: Vec<u64>,
    highest: Option<u64>,
}

impl SeqTracker {
    /// A tracker for run `run` whose publishers send `counts[i]` messages each.
    pub fn new(run: u32, counts: Vec<u64>) -> SeqTracker {
        let seen = counts.iter().map(|_| None).collect();
        SeqTracker {
            run,
            counts,
            seen,
            unique: 0,
            duplicates: 0,
            reordered: 0,
            foreign: 0,
        }
    }

    /// Records one received stamp.
    #[inline]
    pub fn record(&mut self, stamp: &Stamp) -> Seen {
        let p = stamp.publisher as usize;
        let in_range = stamp.run == self.run && self.counts.get(p).is_some_and(|&c| stamp.seq < c);
        if !in_range {
            self.foreign += 1;
            return Seen::Foreign;
        }
        let count = self.counts[p];
        let entry = self.seen[p].get_or_insert_with(|| PublisherSeen {
            bits: vec![0; count.div_ceil(64) as usize],
            highest: None,
        });
        let (word, bit) = ((stamp.seq / 64) as usize, 1u64 << (stamp.seq % 64));
        if entry.bits[word] & bit != 0 {
            self.duplicates += 1;
            return Seen::Duplicate;
        }
        entry.bits[word] |= bit;
        self.unique += 1;
        match entry.highest {
            Some(h) if h > stamp.seq => self.reordered += 1,
            _ => entry.highest = Some(stamp.seq),
        }
        Seen::New
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(publisher: u32, seq: u64) -> Stamp {
        Stamp {
            run: 1,
            publisher,
            seq,
            sent_ns: 0,
        }
    }

    #[test]
    fn counts_unique_duplicates_reorders_and_foreign() {
        let mut t = SeqTracker::new(1, vec![100, 3]);
        assert_eq!(t.record(&stamp(0, 5)), Seen::New);
        assert_eq!(t.record(&stamp(0, 5)), Seen::Duplicate);
        assert_eq!(t.record(&stamp(0, 4)), Seen::New);
        assert_eq!(t.record(&stamp(1, 3)), Seen::Foreign);
        assert_eq!(t.record(&stamp(2, 0)), Seen::Foreign);
        let mut other_run = stamp(0, 1);
        other_run.run = 2;
        assert_eq!(t.record(&other_run), Seen::Foreign);
        assert_eq!(
            (t.unique, t.duplicates, t.reordered, t.foreign),
            (2, 1, 1, 3)
        );
    }
}
