//! The load generator's engine, separate from its command line (src/main.rs) so the test suite
//! can run a scenario against the broker in-process (tests/harness.rs).
//!
//! Layout: [`client`] is a minimal pipelined MQTT client on the project's codec; [`payload`]
//! stamps every message with run, publisher, sequence number and send time; [`tracker`] turns
//! those stamps into loss, duplicate and reorder counts; [`pubsub`] runs publishers and
//! subscribers against one broker; [`scenarios`] defines the named workloads (with
//! [`connections`], [`handshakes`] and [`retained`] in their own modules); [`transport`] is
//! plain TCP or TLS under the client; [`procfs`] reads
//! the broker's CPU and memory; [`report`] prints and stores results; [`summary`] folds stored
//! results into the Postbox/Mosquitto comparison.

pub mod burst;
pub mod client;
pub mod connections;
pub mod handshakes;
pub mod payload;
pub mod procfs;
pub mod pubsub;
pub mod report;
pub mod retained;
pub mod scenarios;
pub mod summary;
pub mod tracker;
pub mod transport;
