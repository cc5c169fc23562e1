//! v5 properties (spec 5.0 §2.2.2): identifiers, and per-packet decoding and encoding.
//!
//! Each packet has its own allowed set (spec 5.0 Table 2-4); the readers enforce it and the
//! writers only ever produce it.

pub(super) mod read;
pub(super) mod write;

/// Property identifiers (spec 5.0 §2.2.2.2).
pub(super) mod id {
    pub(crate) const PAYLOAD_FORMAT_INDICATOR: usize = 0x01;
    pub(crate) const MESSAGE_EXPIRY_INTERVAL: usize = 0x02;
    pub(crate) const CONTENT_TYPE: usize = 0x03;
    pub(crate) const RESPONSE_TOPIC: usize = 0x08;
    pub(crate) const CORRELATION_DATA: usize = 0x09;
    pub(crate) const SUBSCRIPTION_IDENTIFIER: usize = 0x0B;
    pub(crate) const SESSION_EXPIRY_INTERVAL: usize = 0x11;
    pub(crate) const ASSIGNED_CLIENT_IDENTIFIER: usize = 0x12;
    pub(crate) const SERVER_KEEP_ALIVE: usize = 0x13;
    pub(crate) const AUTHENTICATION_METHOD: usize = 0x15;
    pub(crate) const AUTHENTICATION_DATA: usize = 0x16;
    pub(crate) const REQUEST_PROBLEM_INFORMATION: usize = 0x17;
    pub(crate) const WILL_DELAY_INTERVAL: usize = 0x18;
    pub(crate) const REQUEST_RESPONSE_INFORMATION: usize = 0x19;
    pub(crate) const RESPONSE_INFORMATION: usize = 0x1A;
    pub(crate) const SERVER_REFERENCE: usize = 0x1C;
    pub(crate) const REASON_STRING: usize = 0x1F;
    pub(crate) const RECEIVE_MAXIMUM: usize = 0x21;
    pub(crate) const TOPIC_ALIAS_MAXIMUM: usize = 0x22;
    pub(crate) const TOPIC_ALIAS: usize = 0x23;
    pub(crate) const MAXIMUM_QOS: usize = 0x24;
    pub(crate) const RETAIN_AVAILABLE: usize = 0x25;
    pub(crate) const USER_PROPERTY: usize = 0x26;
    pub(crate) const MAXIMUM_PACKET_SIZE: usize = 0x27;
    pub(crate) const WILDCARD_SUBSCRIPTION_AVAILABLE: usize = 0x28;
    pub(crate) const SUBSCRIPTION_IDENTIFIER_AVAILABLE: usize = 0x29;
    pub(crate) const SHARED_SUBSCRIPTION_AVAILABLE: usize = 0x2A;

    /// True for an identifier the spec defines (in some packet).
    pub(crate) fn is_known(id: usize) -> bool {
        matches!(
            id,
            0x01..=0x03
                | 0x08
                | 0x09
                | 0x0B
                | 0x11..=0x13
                | 0x15..=0x1A
                | 0x1C
                | 0x1F
                | 0x21..=0x2A
        )
    }
}
