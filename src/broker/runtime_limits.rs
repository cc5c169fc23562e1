//! The `[mqtt]` limits a reload (SIGHUP) may change while the broker runs.
//!
//! Every other `[mqtt]` key is copied into the broker's structures at start (queue bounds,
//! flow control, the shared-group strategy) or announced to clients in CONNACK, so changing
//! it under running sessions would break promises already made: those need a restart. The
//! keys here are read once per new connection or per SUBSCRIBE, never per PUBLISH, through
//! an `ArcSwap` (no lock; a reload swaps the whole set at once).
//!
//! Must not: be read per PUBLISH; hold a key announced in CONNACK or copied into queue bounds at
//! start.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::MqttConfig;
pub(crate) use crate::config::RuntimeLimits;

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
