//! Bridges: links from this broker to remote brokers (`[[bridge]]`, issue 15).
//!
//! Each bridge is a durable session inside the broker (`$bridge/<name>`), fed by the router
//! through an in-process [`crate::broker::link::Link`], so ACLs, retained handling, queue
//! bounds and the store apply to what it forwards as to any subscriber. A message leaves that
//! session only when the remote broker acknowledged it. The remote side is driven with the
//! project's own codec.

mod engine;
mod held_in;
pub(crate) mod import;
mod pump;
pub(crate) mod remote;
mod remote_sink;
mod remote_subscriptions;
pub(crate) mod status;
pub(crate) mod topics;
pub(crate) mod transport;

pub use status::{BridgeStatus, Flow};

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::config::BridgeConfig;

/// A bridge whose TLS settings could not be loaded: the broker does not start.
#[derive(Debug, thiserror::Error)]
#[error("bridge {name}: {source}")]
pub struct BridgeStartError {
    /// The bridge's name.
    pub name: String,
    /// What was wrong with its TLS files.
    pub source: transport::TransportError,
}

/// Loads every bridge's TLS settings, before anything starts: a bad file stops the start.
///
/// # Errors
///
/// The first bridge whose TLS files cannot be loaded.
pub(crate) fn load_tls(
    configs: &[BridgeConfig],
) -> Result<Vec<Option<Arc<transport::ClientTls>>>, BridgeStartError> {
    configs
        .iter()
        .map(|config| match &config.tls {
            Some(tls) => {
                transport::ClientTls::load(tls)
                    .map(Some)
                    .map_err(|source| BridgeStartError {
                        name: config.name.clone(),
                        source,
                    })
            }
            None => Ok(None),
        })
        .collect()
}

/// Starts one task per bridge on `tasks` (so shutdown waits for their last store updates),
/// each reporting into its status; `tls`, `statuses` and `configs` are in the same order.
pub(crate) fn start(
    broker: &Arc<Broker>,
    configs: &[BridgeConfig],
    tls: Vec<Option<Arc<transport::ClientTls>>>,
    statuses: &[Arc<BridgeStatus>],
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    for ((config, status), tls) in configs.iter().zip(statuses).zip(tls) {
        let bridge = engine::Bridge {
            share: status.share(),
            broker: Arc::clone(broker),
            config: config.clone(),
            status: Arc::clone(status),
            tls,
        };
        tasks.spawn(bridge.run(shutdown.clone()));
    }
}
