//! Bridges: links from this broker to remote brokers (`[[bridge]]`, issue 15).
//!
//! Each bridge is a durable session inside the broker (`$bridge/<name>`), fed by the router
//! through an in-process [`crate::broker::link::Link`], so ACLs, retained handling, queue
//! bounds and the store apply to what it forwards as to any subscriber. A message leaves that
//! session only when the remote broker acknowledged it. The remote side is driven with the
//! project's own codec.

pub mod import;
pub mod status;

pub use status::{BridgeStatus, Flow};
