//! What a broker is built from: its configuration and the parts plugged into it at
//! construction (`../shared/ARCHITECTURE.md`: a small core, parts chosen before it exists).
//! A part left `None` costs nothing: each of its hooks is one check of an empty `Option`.
//! Built by `server::start` in the order the parts need (metrics, then logins, the ACL,
//! the guarantees and the cluster, each before the store opens), so the broker has no
//! setters and no construction order of its own.
//!
//! Must not: grow setters.

use std::sync::Arc;

use super::ClusterSeam;
use crate::auth::acl_slot::AclSlot;
use crate::auth::login::Logins;
use crate::config::{AuthConfig, MqttConfig};
use crate::guarantees::Guarantees;
use crate::metrics::Metrics;
use crate::storage::Store;

/// The broker's configuration and parts; [`super::Broker::new`] takes them whole.
pub struct Parts {
    /// `[mqtt]`: limits, queues, expiry.
    pub config: MqttConfig,
    /// `[auth]`: what the broker itself decides about identities (anonymous access, session
    /// binding, client id rules).
    pub auth: AuthConfig,
    /// The durable store; `None` (or one that does not survive a restart) keeps everything in
    /// memory and builds no store ops.
    pub store: Option<Arc<dyn Store>>,
    /// The metric registry the broker and every part declare their groups in.
    pub metrics: Metrics,
    /// Password file, JWT and per-listener anonymous rules; `None` in brokers built directly
    /// (benchmarks, unit tests): `auth.allow_anonymous` alone then decides.
    pub logins: Option<Logins>,
    /// The ACL (`auth.acl_file`); `None`, no check runs anywhere.
    pub acl: Option<Arc<AclSlot>>,
    /// Dead letters, schema contracts, dedup; `None`, none of them costs anything.
    pub guarantees: Option<Guarantees>,
    /// The cluster layer (`[cluster]`); `None` on a single node. Its tasks start once the
    /// broker holds its restored state (`cluster::Cluster::run`).
    pub cluster: Option<Arc<dyn ClusterSeam>>,
}

impl Parts {
    /// A broker of `config` and `auth` with no store and no parts: what benchmarks and unit
    /// tests build; `server::start` fills in the rest.
    pub fn bare(config: MqttConfig, auth: AuthConfig, metrics: Metrics) -> Parts {
        Parts {
            config,
            auth,
            store: None,
            metrics,
            logins: None,
            acl: None,
            guarantees: None,
            cluster: None,
        }
    }
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("store", &self.store.is_some())
            .field("logins", &self.logins.is_some())
            .field("acl", &self.acl.is_some())
            .field("guarantees", &self.guarantees.is_some())
            .field("cluster", &self.cluster.is_some())
            .finish_non_exhaustive()
    }
}
