//! The write decision for the connection's last PUBLISH topic, remembered.
//!
//! Why: a device publishes to the same few topics over and over, and with an ACL every
//! PUBLISH is one authorisation decision (two trie walks, ~530 instructions with a
//! 10,000-rule ACL, measured with callgrind: about 10% of a fan-in message's whole cost).
//! The answer for one topic changes only when the ACL is reloaded (its epoch) or the
//! client's identity changes, and the identity is fixed for a connection's life (set at
//! attach; re-authentication as another user is refused). So the last topic and its answer
//! are kept, stamped with the ACL epoch read before deciding, and a PUBLISH to the same topic
//! under the same epoch costs a string compare.
//!
//! Boxed and made at the first checked PUBLISH, so a connection without an ACL pays one
//! pointer; the topic is copied into a buffer the memo owns (not a slice of the read buffer,
//! which would keep that buffer alive), reused when the topic changes, so it allocates only
//! when a topic is longer than any before.

/// The last checked topic, its answer and the epoch it was decided under.
#[derive(Debug, Default)]
pub(super) struct WriteMemo {
    epoch: u32,
    allowed: bool,
    topic: String,
}

impl WriteMemo {
    /// May the client publish to `topic`? From the memo when it holds `topic` under `epoch`,
    /// else from `decide`, which is then remembered. `epoch` must be read before `decide` runs
    /// (see [`crate::auth::acl_slot::AclSlot::epoch`]).
    pub(super) fn allowed(
        memo: &mut Option<Box<WriteMemo>>,
        epoch: u32,
        topic: &str,
        decide: impl FnOnce() -> bool,
    ) -> bool {
        let memo = memo.get_or_insert_with(Box::default);
        if memo.epoch == epoch && memo.topic == topic && !memo.topic.is_empty() {
            return memo.allowed;
        }
        let allowed = decide();
        memo.topic.clear();
        memo.topic.push_str(topic);
        memo.epoch = epoch;
        memo.allowed = allowed;
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::WriteMemo;

    #[test]
    fn remembers_one_topic_per_epoch() {
        let mut memo = None;
        let asked = std::cell::Cell::new(0);
        let mut ask = |epoch, topic: &str, answer| {
            WriteMemo::allowed(&mut memo, epoch, topic, || {
                asked.set(asked.get() + 1);
                answer
            })
        };
        assert!(ask(1, "a/b", true));
        assert!(ask(1, "a/b", false), "same topic and epoch: remembered");
        assert!(!ask(1, "a/c", false), "another topic is decided");
        assert!(ask(1, "a/b", true), "only the last topic is kept");
        assert!(!ask(2, "a/b", false), "a reload (new epoch) decides again");
        assert_eq!(asked.get(), 4);
    }
}
