//! Copies of strangers' messages in a verified client's unread output, charged to the
//! strangers' shares while the socket does not take them.
//!
//! Why: a message below the size sent from the message itself (`write_queue::BY_REFERENCE`)
//! is copied into each subscriber's write batch. A verified subscriber that stops reading
//! kept up to a batch of such copies (about 128 KiB of allocation), counted as its own in the
//! budget whoever published them: one anonymous client sending 16,300-byte messages to 140
//! verified subscribers that had stopped reading took a 16 MiB budget to 108%, and every
//! verified QoS 1 PUBLISH got 0x97 (issue 35, twenty-second adversarial pass, H1). The copies
//! now count in their publisher's share ([`StrangerShare`]) instead of the budget, and the
//! share bounds them: a connection with other output waiting takes no further stranger's
//! message once the share is full (`outbound::Encoder`), so a stranger's publishing stops at
//! its share, and verified clients' budget never holds a stranger's bytes. A connection with
//! nothing else to send takes one all the same (else a full share would starve it of
//! strangers' messages): one message per such connection past the share, counted there,
//! bounded by the connections verified clients hold. Counted in the budget too, those took
//! it past 100% with 1,000 stuck subscribers of 16 MiB (twenty-third pass, I1).
//!
//! Must not: cost a connection that copies no stranger's message anything (the record lives
//! in the write queue's `Behind`, made only when there is something to keep).

use crate::broker::stranger_share::StrangerShare;

/// Per share, the bytes of its messages copied into the write queue and not known to be
/// written, and how many of them are charged to the share now. Whatever is charged is given
/// back when the bytes are written or the record is dropped.
#[derive(Debug, Default)]
pub(super) struct StrangerCopies {
    shares: Vec<Copies>,
}

/// One share's entry in [`StrangerCopies`].
#[derive(Debug)]
struct Copies {
    share: StrangerShare,
    /// Copied and not yet known to be written.
    bytes: usize,
    /// Of `bytes`, charged to `share` ([`StrangerCopies::charge`]).
    charged: usize,
}

impl StrangerCopies {
    /// `bytes` of a message charged to `share` were copied into the queue.
    pub(super) fn copied(&mut self, share: StrangerShare, bytes: usize) {
        match self.shares.iter_mut().find(|c| c.share == share) {
            Some(copies) => copies.bytes += bytes,
            None => self.shares.push(Copies {
                share,
                bytes,
                charged: 0,
            }),
        }
    }

    /// Bytes of `share`'s messages copied and not yet charged to it: what this queue would
    /// add to the share if the socket stopped taking it now.
    pub(super) fn uncharged(&self, share: StrangerShare) -> usize {
        self.shares
            .iter()
            .find(|c| c.share == share)
            .map_or(0, |c| c.bytes - c.charged)
    }

    /// Every byte recorded, whatever its share.
    pub(super) fn total(&self) -> usize {
        self.shares.iter().map(|c| c.bytes).sum()
    }

    /// Whether nothing is recorded.
    pub(super) fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// Charges every copied byte to its share: the socket stopped taking them.
    pub(super) fn charge(&mut self) {
        for copies in &mut self.shares {
            if copies.bytes > copies.charged {
                copies.share.counted(copies.bytes - copies.charged, true);
                copies.charged = copies.bytes;
            }
        }
    }

    /// The queue holds only `unwritten` bytes now: no more of them can be strangers' copies.
    /// Which of its bytes were written is not told apart, so the record keeps the most that
    /// may still be there (taken off the oldest entries first), never less.
    pub(super) fn written_down_to(&mut self, unwritten: usize) {
        let mut excess = self.total().saturating_sub(unwritten);
        for copies in &mut self.shares {
            if excess == 0 {
                break;
            }
            let taken = excess.min(copies.bytes);
            copies.bytes -= taken;
            excess -= taken;
            if copies.charged > copies.bytes {
                copies.share.counted(copies.charged - copies.bytes, false);
                copies.charged = copies.bytes;
            }
        }
        self.shares.retain(|c| c.bytes > 0);
    }

    /// Takes over what `other` recorded (a queue appended behind this one's).
    pub(super) fn absorb(&mut self, mut other: StrangerCopies) {
        for copies in std::mem::take(&mut other.shares) {
            match self.shares.iter_mut().find(|c| c.share == copies.share) {
                Some(mine) => {
                    mine.bytes += copies.bytes;
                    mine.charged += copies.charged;
                }
                None => self.shares.push(copies),
            }
        }
    }
}

impl Drop for StrangerCopies {
    fn drop(&mut self) {
        for copies in &self.shares {
            if copies.charged > 0 {
                copies.share.counted(copies.charged, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies are charged only when asked, trimmed to what the queue still holds (oldest
    /// first), merged per share, and given back in full when the record goes. Checked on a
    /// bridge's share no other test of this binary uses.
    #[test]
    fn charged_while_unwritten_and_given_back() {
        let (share, other) = (StrangerShare::of_bridge(50), StrangerShare::of_bridge(51));
        let (before, before_other) = (share.bytes(), other.bytes());
        let mut copies = StrangerCopies::default();
        copies.copied(share, 1_000);
        copies.copied(other, 500);
        assert_eq!(copies.uncharged(share), 1_000);
        assert_eq!(
            share.bytes(),
            before,
            "nothing charged before the socket stops"
        );
        copies.charge();
        assert_eq!(copies.uncharged(share), 0);
        assert_eq!(share.bytes(), before + 1_000);
        assert_eq!(other.bytes(), before_other + 500);
        copies.copied(share, 200);
        assert_eq!(copies.uncharged(share), 200);
        // 1,700 recorded, 900 left unwritten: 800 taken off the oldest (`share`'s).
        copies.written_down_to(900);
        assert_eq!(share.bytes(), before + 400);
        assert_eq!(other.bytes(), before_other + 500);
        let mut later = StrangerCopies::default();
        later.copied(other, 100);
        copies.absorb(later);
        assert_eq!(copies.uncharged(other), 100);
        drop(copies);
        assert_eq!((share.bytes(), other.bytes()), (before, before_other));
    }
}
