//! The cluster seam (`../shared/ARCHITECTURE.md`): what the broker asks of the layer that
//! makes several nodes one broker (`crate::cluster`, NATS JetStream). The broker holds it in a
//! `OnceLock`, installed once by `server::start` when `[cluster]` is configured; unset (one
//! node), every hook below is one relaxed load of an empty cell.

use std::sync::Arc;

use super::{Broker, Message, PublishRefused};
use crate::codec::QoS;
use crate::storage::Durable;

/// The engine-backed half of the cluster, as the broker sees it.
pub trait ClusterSeam: Send + Sync + std::fmt::Debug {
    /// Before a client's PUBLISH is routed: whether this node can make it durable
    /// cluster-wide. A QoS 1/2 message is refused while the cluster link is down or its
    /// queue to the engine is full, before anyone got it (v5 0x97, 3.x disconnect).
    ///
    /// # Errors
    ///
    /// Why the message cannot be taken now.
    fn admit(&self, qos: QoS) -> Result<(), PublishRefused>;

    /// After local routing: hands the message to the other nodes, once (not per
    /// subscriber). For QoS 1/2, the commit its publisher's PUBACK / PUBREC must also wait
    /// for (the engine's acknowledgement); `None` for QoS 0.
    fn forward(&self, message: &Arc<Message>) -> Option<Durable>;
}

impl Broker {
    /// Installs the cluster layer (at start, before any client connects); a second call is
    /// ignored.
    pub fn install_cluster(&self, cluster: Arc<dyn ClusterSeam>) {
        let _ = self.cluster.set(cluster);
    }

    /// The cluster layer, when `[cluster]` is configured.
    pub fn cluster(&self) -> Option<&Arc<dyn ClusterSeam>> {
        self.cluster.get()
    }

    /// [`ClusterSeam::admit`] when clustered; `Ok` otherwise.
    pub(crate) fn cluster_admit(&self, qos: QoS) -> Result<(), PublishRefused> {
        match self.cluster.get() {
            Some(cluster) => cluster.admit(qos),
            None => Ok(()),
        }
    }

    /// [`ClusterSeam::forward`] when clustered, joined with the local commit `local`: the
    /// publisher's acknowledgement waits for both.
    pub(crate) fn cluster_forward(
        &self,
        message: &Arc<Message>,
        local: Option<Durable>,
    ) -> Option<Durable> {
        match self.cluster.get() {
            Some(cluster) => Durable::both(local, cluster.forward(message)),
            None => local,
        }
    }
}

impl Broker {
    /// Makes `message` the retained message of its topic (an empty payload deletes it,
    /// MQTT-3.3.1-10) without routing it: the cluster's retained bucket changed on another
    /// node. Stored like a local retained message, so a restart without NATS still has it.
    pub fn apply_cluster_retained(&self, message: &Arc<Message>) {
        if self.store.is_some() {
            drop(self.persist(vec![super::persist::retained(message)]));
        }
        self.store_retained(message);
    }
}
