//! The `[mqtt]` limits a reload (SIGHUP) may change while the broker runs.
//!
//! Every other `[mqtt]` key is copied into the broker's structures at start (queue bounds,
//! flow control, the shared-group strategy) or announced to clients in CONNACK, so changing
//! it under running sessions would break promises already made: those need a restart. The
//! keys here are read once per new connection or per SUBSCRIBE, never per PUBLISH, through
//! an `ArcSwap` (no lock; a reload swaps the whole set at once).

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::MqttConfig;

/// The `[mqtt]` keys a reload applies, with the config key each one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLimits {
    /// `mqtt.max_publish_rate`: read when a connection starts (its token bucket).
    pub max_publish_rate: u32,
    /// `mqtt.max_publish_bytes_rate`: read when a connection starts.
    pub max_publish_bytes_rate: u64,
    /// `mqtt.max_subscriptions_per_client`: read at every SUBSCRIBE.
    pub max_subscriptions_per_client: usize,
    /// `mqtt.max_subscription_bytes_per_client`: read at every SUBSCRIBE.
    pub max_subscription_bytes_per_client: usize,
}

impl RuntimeLimits {
    /// The config keys (dotted) a reload applies, in the order [`RuntimeLimits`] lists them;
    /// `mqtt.max_connections` (the listeners' shared slot bound) and `log.level` are applied
    /// by the server and the binary.
    pub const KEYS: &'static [&'static str] = &[
        "mqtt.max_publish_rate",
        "mqtt.max_publish_bytes_rate",
        "mqtt.max_subscriptions_per_client",
        "mqtt.max_subscription_bytes_per_client",
    ];

    /// The values in `config`.
    pub fn from_config(config: &MqttConfig) -> RuntimeLimits {
        RuntimeLimits {
            max_publish_rate: config.max_publish_rate,
            max_publish_bytes_rate: config.max_publish_bytes_rate,
            max_subscriptions_per_client: config.max_subscriptions_per_client,
            max_subscription_bytes_per_client: config.max_subscription_bytes_per_client,
        }
    }
}

/// The limits in force, swapped whole on reload.
#[derive(Debug)]
pub struct RuntimeLimitsSlot(ArcSwap<RuntimeLimits>);

impl RuntimeLimitsSlot {
    /// Starts with the values of `config`.
    pub fn new(config: &MqttConfig) -> RuntimeLimitsSlot {
        RuntimeLimitsSlot(ArcSwap::from_pointee(RuntimeLimits::from_config(config)))
    }

    /// The limits in force now (a copy: they are a few words).
    pub fn get(&self) -> RuntimeLimits {
        **self.0.load()
    }

    /// Puts new limits in force for the connections and SUBSCRIBEs that read them next.
    pub fn set(&self, limits: RuntimeLimits) {
        self.0.store(Arc::new(limits));
    }
}
