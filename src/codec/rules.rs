//! [`DecodeRules`]: the receiver's choices the decoder applies.
//!
//! Must not: allocate per field; read the config (the caller fills in
//! the rules).

/// What a receiver refuses beyond the spec's MUSTs: the limits and SHOULD NOTs the spec leaves
/// to it, chosen by its configuration (the codec knows no config; the caller fills this in).
///
/// They live in the decoder, not after it, because the decoder already scans the bytes they
/// are about: the PUBLISH topic is checked for NUL and wildcards in one pass on the hot path,
/// and the control-character test rides in that same pass instead of costing a second one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeRules {
    /// Largest whole packet accepted; beyond it `PacketTooLarge`, from the fixed header alone.
    pub max_packet_size: usize,
    /// Accept U+0001..U+001F and U+007F..U+009F in topic names (PUBLISH, will) and topic
    /// filters (SUBSCRIBE, UNSUBSCRIBE). When false, such a packet is `Malformed`: 5.0 §1.5.4
    /// says strings SHOULD NOT carry them and a receiver "MAY treat it as a Malformed Packet"
    /// (3.1.1 §1.5.3: MAY close the connection). Client ids and user names are the broker's to
    /// check, which refuses them with their own CONNACK codes.
    pub allow_control_characters: bool,
}

impl DecodeRules {
    /// Only what the spec requires, and packets up to `max_packet_size`.
    pub fn new(max_packet_size: usize) -> DecodeRules {
        DecodeRules {
            max_packet_size,
            allow_control_characters: true,
        }
    }
}
