//! Listeners: accept sockets and hand each to a connection task. Knows nothing of MQTT.

pub mod fd_table;
mod tcp;

pub use tcp::serve_tcp;
