//! What one bridge reports about itself: link state, counters, last error.
//!
//! The engine calls these methods at each event; the metrics, the `$SYS` notification and the
//! admin API read from here, so none of them needs to know how the link is driven.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::broker::Broker;
use crate::config::BridgeConfig;

/// Which way a message crossed the bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// From this broker to the remote.
    Out = 0,
    /// From the remote into this broker.
    In = 1,
}

impl Flow {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Flow::Out => "out",
            Flow::In => "in",
        }
    }
}

/// Live state and counters of one bridge.
#[derive(Debug)]
pub struct BridgeStatus {
    name: String,
    local_session: String,
    up: AtomicBool,
    address: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    reconnects: AtomicU64,
    forwarded: [AtomicU64; 2],
    dropped: [AtomicU64; 2],
}

impl BridgeStatus {
    /// The status of the bridge `config` describes, on `broker`.
    pub fn new(config: &BridgeConfig, broker: &Arc<Broker>) -> Arc<BridgeStatus> {
        let _ = broker;
        Arc::new(BridgeStatus {
            name: config.name.clone(),
            local_session: config.local_session_id(),
            up: AtomicBool::new(false),
            address: Mutex::new(None),
            last_error: Mutex::new(None),
            reconnects: AtomicU64::new(0),
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            dropped: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    /// The bridge's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client id of the bridge's local session.
    pub fn local_session(&self) -> &str {
        &self.local_session
    }

    /// True while the remote connection is up (CONNACK accepted).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The address connected to, while up.
    pub fn address(&self) -> Option<String> {
        self.address.lock().clone()
    }

    /// Why the link last failed or closed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// The remote accepted the connection at `address`; `reconnect` when it is not the first.
    pub fn connected(&self, address: &str, reconnect: bool) {
        *self.address.lock() = Some(address.to_owned());
        if reconnect {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        self.up.store(true, Ordering::Relaxed);
    }

    /// The link is down (closed, failed, or never came up); `error` says why, if it failed.
    pub fn disconnected(&self, error: Option<String>) {
        self.up.store(false, Ordering::Relaxed);
        *self.address.lock() = None;
        if let Some(error) = error {
            *self.last_error.lock() = Some(error);
        }
    }

    /// Reconnects since start (successful connects after the first).
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// One message forwarded (and acknowledged, for QoS 1/2) in direction `flow`.
    pub fn forwarded(&self, flow: Flow) {
        self.forwarded[flow as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// One message not forwarded in direction `flow`, for `reason` (a metric label:
    /// `max_hops`, `topic`, `refused`, `queue_full`).
    pub fn dropped(&self, flow: Flow, reason: &'static str) {
        let _ = reason;
        self.dropped[flow as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Messages forwarded in direction `flow` since start.
    pub fn forwarded_total(&self, flow: Flow) -> u64 {
        self.forwarded[flow as usize].load(Ordering::Relaxed)
    }

    /// Messages dropped in direction `flow` since start.
    pub fn dropped_total(&self, flow: Flow) -> u64 {
        self.dropped[flow as usize].load(Ordering::Relaxed)
    }
}
