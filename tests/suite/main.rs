//! The integration suite: every test that talks to a real broker (in-process on a loopback
//! port, or the `postbox` binary as a child process) over real sockets, one module per area.
//!
//! One test binary rather than one per file: each integration-test file is a crate of its own,
//! compiled and linked against the whole library, and with ~30 of them linking was most of CI's
//! time. A test that cannot share a process stays a binary of its own: `tests/ordering.rs`
//! (it must not share the two cores with other tests while it measures arrival order).
//! Metrics are per broker (no global recorder), so the metrics tests and the real-Prometheus
//! test (`deploy_prometheus`) are modules here.
//!
//! Run one area with a filter: `cargo test --release --test suite v5_shared::`.

#[path = "../common/mod.rs"]
mod common;

mod acks;
mod acl;
mod admin;
mod admin_host;
mod admin_http_bounds;
mod auth_matrix;
mod backlog_watch;
mod binary;
mod bridge;
mod bridge_broker;
mod bridge_held;
mod bridge_import;
mod bridge_observe;
mod bridge_transport;
mod client_bounds;
mod closing;
mod cluster;
mod cluster_binding;
mod cluster_operations;
mod cluster_orphans;
mod cluster_restart;
mod cluster_security;
mod cluster_sessions;
mod cluster_shares;
mod config_files;
mod connection_holdings;
mod connection_limits;
mod core_v311;
mod core_v5;
mod crash;
mod cuttings;
mod dead_letters;
mod dedup;
mod deploy_checks;
mod deploy_files;
mod deploy_prometheus;
mod disk_faults;
mod docs_examples;
mod durability;
mod flow_control;
mod fuzz_corpus;
mod input_validity;
mod interop;
mod jwt;
mod limits;
mod link;
mod listeners;
mod login_limits;
mod malformed;
mod metrics;
mod mosquitto_clients;
mod operations;
mod partial_packets;
mod passwords;
mod pending_connections;
mod pending_connections_before_mqtt;
mod poison;
mod proxy_protocol;
mod recovery;
mod schema;
mod scram;
mod secure_config;
mod session_binding;
mod status_page;
mod sys_topics;
mod tls;
mod v5_auth;
mod v5_capabilities;
mod v5_expiry;
mod v5_flow_control;
mod v5_interop;
mod v5_payload_format;
mod v5_shared;
mod v5_subscriptions;
mod v5_topic_alias;
mod v5_will;
mod websocket;
