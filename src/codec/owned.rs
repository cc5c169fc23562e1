//! What a decoded packet keeps owns its own bytes, and nothing of the read buffer.
//!
//! A `Bytes` slice keeps its whole allocation alive, not only its bytes: a 1-byte retained
//! message (or a filter) sliced off the read buffer behind a 1 MB packet kept that megabyte
//! alive while the bounds counted 27 bytes (issue 35, ninth adversarial pass, R5); a packet
//! sliced off a buffer that went on to hold the next large packet kept that one too (tenth
//! pass, S1); and a copy of the whole packet was kept whole by any field of it, a small filter
//! or delayed will kept its padded SUBSCRIBE or CONNECT (eleventh pass). So a packet is
//! decoded from a slice of the read buffer that lives only as long as the decoding, and every
//! field a caller may keep is copied into an allocation of its own
//! ([`super::reader::Reader::owning`]); acknowledgements and pings, of which nothing outlives
//! their handling, are read as slices ([`keeps_nothing`]).
//!
//! The hot path is the PUBLISH: its payload is one copy, and its topic is the worker's last
//! topic when it is the same (a fleet's publishers repeat theirs; [`owned_topic`]), else a
//! copy that becomes the last topic.
//!
//! Must not: hand out a slice of the read buffer for anything a caller may keep; hold more
//! than [`CACHED_TOPIC_MAX`] bytes per worker thread.

use std::cell::RefCell;

use bytestring::ByteString;

/// Longest topic kept as a worker's last topic. A fleet's topics are tens of bytes; a longer one
/// is copied each time, so what the cache holds stays this small per worker thread.
pub(super) const CACHED_TOPIC_MAX: usize = 256;

thread_local! {
    /// The last topic a PUBLISH decoded on this thread had (at most [`CACHED_TOPIC_MAX`] bytes).
    static LAST_TOPIC: RefCell<ByteString> = const { RefCell::new(ByteString::from_static("")) };
}

/// Packets of which nothing outlives their handling (acknowledgements and pings: a packet id,
/// a reason code, properties that are logged at most): sliced off the read buffer, not copied.
/// Half the packets of a QoS 1 stream are these.
#[inline]
pub(super) fn keeps_nothing(packet_type: u8) -> bool {
    use super::decode::{PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBREC, PUBREL};
    matches!(
        packet_type,
        PUBACK | PUBREC | PUBREL | PUBCOMP | PINGREQ | PINGRESP
    )
}

/// `topic` in an allocation of its own: the worker's last topic when equal, else a copy.
#[inline]
pub(super) fn owned_topic(topic: &ByteString) -> ByteString {
    if topic.is_empty() {
        return ByteString::new();
    }
    if topic.len() > CACHED_TOPIC_MAX {
        return copy(topic);
    }
    LAST_TOPIC.with(|last| {
        let mut last = last.borrow_mut();
        if *last != *topic {
            *last = copy(topic);
        }
        last.clone()
    })
}

fn copy(topic: &ByteString) -> ByteString {
    ByteString::from(String::from(&**topic))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backing allocation of `b`: equal for slices of one buffer.
    fn same_allocation(a: &ByteString, b: &ByteString) -> bool {
        a.as_bytes().as_ptr() == b.as_bytes().as_ptr()
    }

    #[test]
    fn a_repeated_topic_is_the_last_one_and_a_new_one_replaces_it() {
        let first = owned_topic(&ByteString::from_static("fleet/a/temp"));
        let again = owned_topic(&ByteString::from(String::from("fleet/a/temp")));
        assert!(same_allocation(&first, &again));
        let other = owned_topic(&ByteString::from_static("fleet/b/temp"));
        assert_eq!(&*other, "fleet/b/temp");
        assert!(!same_allocation(&first, &other));
    }

    #[test]
    fn a_long_topic_is_copied_and_never_cached() {
        let long = "t/".repeat(CACHED_TOPIC_MAX);
        let a = owned_topic(&ByteString::from(long.clone()));
        let b = owned_topic(&ByteString::from(long));
        assert!(!same_allocation(&a, &b));
        LAST_TOPIC.with(|last| assert!(last.borrow().len() <= CACHED_TOPIC_MAX));
    }

    #[test]
    fn a_topic_of_the_read_buffer_is_never_handed_out() {
        // A static topic stands for a slice of the read buffer: what comes back is a copy.
        let read = ByteString::from_static("fleet/c/temp");
        let owned = owned_topic(&read);
        assert_eq!(owned, read);
        assert!(!same_allocation(&owned, &read));
    }
}
