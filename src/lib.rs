//! Postbox: an MQTT 3.1 / 3.1.1 / 5.0 broker for IoT fleets.
//!
//! The library holds everything; `main.rs` is only the command line. Module map and data flow:
//! see `docs/ARCHITECTURE.md` (and keep it true with every change).

pub mod admin;
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
pub mod reload;
pub mod server;
pub mod storage;
pub mod transport;
