//! Postbox: an MQTT 3.1 / 3.1.1 / 5.0 broker for IoT fleets.
//!
//! The library holds everything; `main.rs` is only the command line. Module map and data flow:
//! see `docs/ARCHITECTURE.md` (and keep it true with every change).
//!
//! The public surface is deliberate and small: the MQTT codec ([`codec`], what a client or a
//! fuzzer needs), the configuration ([`config`]), starting and stopping a server ([`server`]),
//! logging ([`logging`]), the open-file preparation ([`fd_table`]) and the command line's
//! offline tools ([`tools`]). Everything else is `pub(crate)`, so the compiler finds what
//! nothing uses; what the tests and benchmarks reach inside is named once, in
//! [`test_support`] (issue 36).

pub(crate) mod admin;
pub(crate) mod auth;
pub(crate) mod bridge;
pub(crate) mod broker;
pub(crate) mod cluster;
pub mod codec;
pub mod config;
pub(crate) mod connection;
pub(crate) mod guarantees;
#[cfg(test)]
mod layering;
pub mod logging;
pub(crate) mod metrics;
pub(crate) mod reload;
pub mod server;
pub(crate) mod storage;
pub(crate) mod transport;

/// The open-file limit and the kernel's fd table, prepared by the binary before anything
/// else runs (a connect storm must not stall on growing them).
pub use transport::fd_table;

/// What the command line's offline subcommands use: hashing passwords and editing a
/// `mosquitto_passwd` file (`postbox passwd`), SCRAM credential lines (`postbox scram`), and
/// reading a Mosquitto bridge stanza (`postbox import-bridge`).
pub mod tools {
    /// Password hashes and the password file's lines.
    pub mod password {
        pub use crate::auth::password::{file, PasswordHash, DEFAULT_PBKDF2_ITERATIONS};
    }
    /// SCRAM credentials (RFC 5802 / 7677).
    pub mod scram {
        pub use crate::auth::scram::ScramKind;
        pub use crate::auth::scram_file::scram_credential_line;
    }
    pub use crate::bridge::import::import as import_bridge;
}

/// What the integration tests, the benchmarks and the fuzz targets reach inside the broker,
/// named here once, under the paths of the modules they come from; not an API (hidden from
/// the docs, free to change with the code).
#[doc(hidden)]
pub mod test_support {
    /// Authentication.
    pub mod auth {
        pub use crate::auth::{AuthRegistry, AuthState, AuthStep, Authenticator};
        /// Password files.
        pub mod password {
            pub use crate::auth::password::{file, PasswordHash};
        }
        /// SCRAM.
        pub mod scram {
            pub use crate::auth::scram::ScramKind;
        }
        /// SCRAM credential files.
        pub mod scram_file {
            pub use crate::auth::scram_file::scram_credential_line;
        }
    }
    /// Bridges.
    pub mod bridge {
        pub use crate::bridge::{BridgeStatus, Flow};
        /// Importing a Mosquitto bridge stanza.
        pub mod import {
            pub use crate::bridge::import::import;
        }
        /// The remote's transport.
        pub mod transport {
            pub use crate::bridge::transport::{
                connect, AddressPicker, ClientTls, RemoteStream, Step, TlsFailure, TransportError,
            };
        }
    }
    /// The core.
    pub mod broker {
        pub use crate::broker::{
            Attached, Broker, Message, Parts, SessionQueueLimits, SessionRequest,
        };
        /// In-process links.
        pub mod link {
            pub use crate::broker::link::{Link, LinkDelivery, LinkError, LinkOptions};
        }
        /// The subscription trie.
        pub mod topic_tree {
            pub use crate::broker::topic_tree::TopicTree;
        }
    }
    /// The cluster's names in NATS.
    pub mod cluster {
        pub use crate::cluster::{SESSIONS_BUCKET, STREAM};
        /// Subjects and keys.
        pub mod subject {
            pub use crate::cluster::subject::key;
        }
        /// Session records.
        pub mod sessions {
            pub use crate::cluster::sessions::RECORD_INTERVAL;
        }
    }
    /// The handshake's rules.
    pub mod connection {
        pub use crate::connection::admission;
    }
    /// Dead letters and schemas.
    pub mod guarantees {
        pub use crate::guarantees::{DeadReason, Guarantees, Verdict};
    }
    /// Metric names and handles.
    pub mod metrics {
        pub use crate::metrics::{names, ConnackRefusal, Counter, Metrics};
    }
    /// The store.
    pub mod storage {
        pub use crate::storage::{
            log_store, now_unix_ms, open, EntryStage, FsyncPolicy, LogOptions, LogStore, Op,
            QueueEntry, SessionMeta, SessionOwner, Snapshot, StorageConfig, StorageError, Store,
            StoredMessage,
        };
    }
}
