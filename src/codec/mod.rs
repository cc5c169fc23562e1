//! MQTT 3.1 / 3.1.1 / 5.0 wire format: pure, synchronous, no I/O.
//!
//! The only module that knows byte layouts. Decoding borrows nothing: what a caller may keep of
//! a packet (topics, strings, payloads) owns its bytes, never a slice of the connection's read
//! buffer (`owned`).

mod apart;
mod codes;
mod decode;
mod encode;
mod error;
mod owned;
mod properties;
mod publish_cache;
mod reader;
mod reason;
mod rules;
mod sink;
mod sniff;
pub mod topic;
mod types;
mod varint;

#[cfg(test)]
mod tests;

pub use apart::{
    encode_publish_apart, forwarded_len, share_forwarded, PieceSink, PublishApart, APART,
};
pub use codes::ReasonContext;
pub use decode::{
    decode, decode_fixed_header, decode_with, publish_has_disallowed_code_points, FixedHeader,
};
pub use encode::{encode, encode_publish, encode_within, PublishHeader};
pub use error::{DecodeError, EncodeError};
pub use publish_cache::{PublishAlias, PublishBody, PublishEncodings, PublishFlags};
pub use reason::ReasonCode;
pub use rules::DecodeRules;
pub use sniff::{holds_subscribe, peek_connect_version};
pub use types::*;
