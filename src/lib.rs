//! Postbox: an MQTT 3.1 / 3.1.1 / 5.0 broker for IoT fleets.
//!
//! The library holds everything; `main.rs` is only the command line. Module map and data flow:
//! see `docs/ARCHITECTURE.md` (and keep it true with every change).

pub(crate) mod admin;
pub mod auth;
pub mod bridge;
pub mod broker;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod connection;
pub mod guarantees;
#[cfg(test)]
mod layering;
pub mod logging;
pub mod metrics;
pub(crate) mod reload;
pub mod server;
pub mod storage;
pub(crate) mod transport;

/// The open-file limit and the kernel's fd table, prepared by the binary before anything
/// else runs (a connect storm must not stall on growing them).
pub use transport::fd_table;
