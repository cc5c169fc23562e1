//! Bytes a connection holds beside its partial packet, counted where its partial packets
//! count: the inbound topic alias table and the output the socket has not taken yet.
//!
//! Why: both could grow to megabytes per connection and were counted nowhere (issue 35,
//! twelfth adversarial pass). U6: 1,000 anonymous v5 connections each binding 10 inbound
//! aliases to 65,000-byte topics took +700 MB RSS. U5: a subscriber that stops reading keeps
//! its last encoded batch (up to a whole large message) in the write buffer. Counted through
//! `partial`'s counters ([`HeldClass`]): a verified client's in the memory budget, an
//! anonymous client's in the anonymous share, past which the connection closes (v5
//! DISCONNECT 0x97).
//!
//! Must not: count anything on the hot path of a connection that holds nothing (a holder
//! exists only while there is something to count).

use super::partial::{count, HeldClass};

/// What [`HeldBytes::set`] fails with: the bytes of an anonymous client would take what
/// anonymous clients' connections hold past their share (`flow::anonymous_share`); nothing
/// more was counted, and the connection must close as for a partial packet.
#[derive(Debug, thiserror::Error)]
#[error("anonymous clients' connections hold their share of the memory budget")]
pub(crate) struct OverShare;

/// Bytes one part of a connection holds, counted in [`HeldClass`]'s counter until they are
/// set to 0 or the holder is dropped (which gives them back).
#[derive(Debug)]
pub(crate) struct HeldBytes {
    /// Bytes this holder has added to its counter.
    counted: usize,
    /// Where they count.
    class: HeldClass,
    /// The anonymous share in bytes, for [`HeldClass::Anonymous`].
    share: u64,
}

impl HeldBytes {
    /// A holder of nothing yet, counting in `class` (with the anonymous `share`).
    pub(crate) fn new((class, share): (HeldClass, u64)) -> HeldBytes {
        HeldBytes {
            counted: 0,
            class,
            share,
        }
    }

    /// Sets the bytes held now; growing or shrinking, the counter moves by the difference.
    ///
    /// # Errors
    ///
    /// [`OverShare`] (the count unchanged) when an anonymous client's growth would take
    /// anonymous clients past their share.
    pub(crate) fn set(&mut self, held: usize) -> Result<(), OverShare> {
        if count(self.class, &mut self.counted, held, self.share) {
            Ok(())
        } else {
            Err(OverShare)
        }
    }

    /// The bytes counted now.
    pub(crate) fn counted(&self) -> usize {
        self.counted
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        let _ = self.set(0); // giving back never fails
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The holder counts what it is told, refuses growth past the anonymous share without
    /// counting it, and gives everything back when dropped. Checked on its own `counted`
    /// (other tests in this binary move the same counters meanwhile).
    #[test]
    fn counts_within_the_share_and_gives_back() {
        let mut held = HeldBytes::new((HeldClass::Anonymous, u64::MAX / 2));
        held.set(1_000).expect("room");
        assert_eq!(held.counted(), 1_000);
        held.set(10).expect("shrinking");
        assert_eq!(held.counted(), 10);
        let mut tight = HeldBytes::new((HeldClass::Anonymous, 0));
        assert!(tight.set(1).is_err(), "no share at all");
        assert_eq!(tight.counted(), 0);
        let mut verified = HeldBytes::new((HeldClass::Connected, 0));
        verified
            .set(5_000)
            .expect("a verified client's never fails");
        drop(verified);
        drop(held);
    }
}
