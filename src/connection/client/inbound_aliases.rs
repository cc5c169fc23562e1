//! The inbound topic alias table (v5 §3.3.2.3.4, client -> broker), with the bytes it holds
//! counted as the connection's own ([`HeldBytes`]).
//!
//! Why: each alias up to our Topic Alias Maximum may bind a topic of up to 64 KiB for the
//! connection's life, and the table was counted nowhere: 1,000 anonymous v5 connections each
//! binding 10 aliases to 65,000-byte topics took +700 MB RSS (issue 35, twelfth adversarial
//! pass, U6). Now a verified client's table counts in the memory budget, an anonymous
//! client's in the anonymous share, and a binding that would take anonymous clients past
//! their share is refused (the connection closes with DISCONNECT 0x97).
//!
//! Must not: exist for a client that never sends an alias (boxed, made on first binding).

use std::collections::HashMap;

use bytestring::ByteString;

use crate::connection::held::{HeldBytes, OverShare};
use crate::connection::partial::HeldClass;

/// What one binding is taken to hold beside its topic's bytes: the map's entry (alias and
/// string handle) and the topic's allocation header, rounded up.
const BINDING_OVERHEAD: usize = 48;

/// Alias -> topic for one connection, at most the Topic Alias Maximum we announced.
#[derive(Debug)]
pub(super) struct InboundAliases {
    /// The bound topics (each a copy of its own, so no read buffer is pinned).
    topics: HashMap<u16, ByteString, foldhash::fast::RandomState>,
    /// What the table holds, counted in the connection's class.
    held: HeldBytes,
}

impl InboundAliases {
    /// An empty table whose bytes count in `class` (with the anonymous share).
    pub(super) fn new(class: (HeldClass, u64)) -> InboundAliases {
        InboundAliases {
            topics: HashMap::default(),
            held: HeldBytes::new(class),
        }
    }

    /// The topic `alias` is bound to.
    pub(super) fn get(&self, alias: u16) -> Option<&ByteString> {
        self.topics.get(&alias)
    }

    /// Binds `alias` to `topic` (replacing what it was bound to): counted first, so a
    /// rebinding to a shorter topic gives bytes back and a longer one takes them.
    ///
    /// # Errors
    ///
    /// [`OverShare`] when the binding would take anonymous clients past their share: nothing
    /// changes (the alias keeps its old topic), and the connection must close.
    pub(super) fn bind(&mut self, alias: u16, topic: &str) -> Result<(), OverShare> {
        let replaced = self
            .topics
            .get(&alias)
            .map_or(0, |old| old.len() + BINDING_OVERHEAD);
        let held = self.held.counted() - replaced + topic.len() + BINDING_OVERHEAD;
        self.held.set(held)?;
        self.topics
            .insert(alias, ByteString::from(topic.to_owned()));
        Ok(())
    }

    /// The bytes counted for the table now.
    #[cfg(test)]
    pub(super) fn counted(&self) -> usize {
        self.held.counted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bindings count their topics, rebinding to a shorter topic gives back the difference,
    /// and a binding past an anonymous client's share is refused with the table unchanged.
    #[test]
    fn bindings_are_counted_and_rebinding_shorter_frees() {
        let mut table = InboundAliases::new((HeldClass::Connected, 0));
        table.bind(1, &"a".repeat(1_000)).expect("bound");
        table.bind(2, "b").expect("bound");
        assert_eq!(table.counted(), 1_001 + 2 * BINDING_OVERHEAD);
        table.bind(1, "short").expect("rebound");
        assert_eq!(table.counted(), 6 + 2 * BINDING_OVERHEAD);
        assert_eq!(table.get(1).map(|t| &**t), Some("short"));

        let share = (100 + BINDING_OVERHEAD) as u64;
        let mut anonymous = InboundAliases::new((HeldClass::Anonymous, share));
        // The share is process-wide: other tests may hold some of it, so only a binding far
        // past it is sure to be refused.
        assert!(anonymous.bind(1, &"x".repeat(10_000)).is_err());
        assert_eq!(anonymous.counted(), 0);
        assert!(anonymous.get(1).is_none());
    }
}
