//! What one bridge reports about itself: link state, counters, last error.
//!
//! The engine calls these methods at each event; the metrics, the `$SYS` notification and the
//! admin API read from here, so none of them needs to know how the link is driven.
//!
//! Each event updates the bridge's `postbox_bridge_*` series (children taken once in
//! [`BridgeStatus::new`]: an atomic add per event, no label lookup). What the bridge's local
//! session holds for the remote (messages, bytes, oldest age) is read at each scrape from the
//! session itself ([`Broker::held_for`]), by a hook registered in `new`.
//!
//! With `notifications` on, the link state is published as Mosquitto does:
//! `$SYS/broker/connection/<name>/state`, retained, `0` at creation and `1` / `0` at every
//! change (see [`BridgeStatus::connected`] for the QoS and why).
//!
//! Must not: know how the link is driven; keep the broker alive (holds it weakly); publish
//! when the state did not change.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use bytestring::ByteString;
use parking_lot::Mutex;

use crate::broker::stranger_share::StrangerShare;
use crate::broker::{Broker, Message};
use crate::codec::{Publish, PublishProperties, QoS};
use crate::config::BridgeConfig;
use crate::metrics::BridgeMetrics;

/// Which way a message crossed the bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// From this broker to the remote.
    Out = 0,
    /// From the remote into this broker.
    In = 1,
}

impl Flow {
    /// Both directions, in index order.
    pub const ALL: [Flow; 2] = [Flow::Out, Flow::In];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Flow::Out => "out",
            Flow::In => "in",
        }
    }
}

/// The reasons [`BridgeStatus::dropped`] takes, in the order of the metric's label values.
pub(crate) use crate::metrics::bridge::DROP_REASONS;

/// The link's state, changed under one lock so the published `$SYS` values follow the
/// changes in the order they happened.
#[derive(Debug, Default)]
struct Link {
    address: Option<String>,
    last_error: Option<String>,
    /// When `last_error` happened (Unix ms): with `changed_at_unix_ms`, an operator tells an
    /// error that is the link's state now from one it recovered from (issue 37, item 5).
    last_error_at_unix_ms: Option<u64>,
    /// When the link last came up or went down (Unix ms; at creation: the creation).
    changed_at_unix_ms: u64,
}

/// Live state and counters of one bridge.
#[derive(Debug)]
pub struct BridgeStatus {
    name: String,
    local_session: String,
    /// The configured remote addresses, in order (for operators).
    addresses: Vec<String>,
    /// `$SYS/broker/connection/<name>/state`, when `notifications` is on.
    state_topic: Option<ByteString>,
    /// Held weakly: a status outliving its broker (in an admin handler, say) must not keep a
    /// stopped broker alive, and publishes nothing then.
    broker: Weak<Broker>,
    up: AtomicBool,
    link: Mutex<Link>,
    metrics: BridgeMetrics,
    /// Dropped per direction, every reason (also one not in [`DROP_REASONS`]).
    dropped: [AtomicU64; 2],
    /// The share its remote's messages count in (unless `trusted`).
    share: StrangerShare,
}

impl BridgeStatus {
    /// The status of the bridge `config` describes, on `broker`: its metric series (at 0),
    /// the scrape hook of its queue figures, and (with `notifications`) the retained state `0`.
    pub fn new(
        config: &BridgeConfig,
        share: StrangerShare,
        broker: &Arc<Broker>,
    ) -> Arc<BridgeStatus> {
        let metrics = broker.metrics.bridge(&config.name);
        let local_session = config.local_session_id();
        watch_queue(broker, &local_session, share, &metrics);
        let status = Arc::new(BridgeStatus {
            name: config.name.clone(),
            local_session,
            addresses: config.addresses.clone(),
            state_topic: config
                .notifications
                .then(|| ByteString::from(format!("$SYS/broker/connection/{}/state", config.name))),
            broker: Arc::downgrade(broker),
            up: AtomicBool::new(false),
            link: Mutex::new(Link {
                changed_at_unix_ms: crate::storage::now_unix_ms(),
                ..Link::default()
            }),
            metrics,
            dropped: [AtomicU64::new(0), AtomicU64::new(0)],
            share,
        });
        status.notify(false);
        status
    }

    /// The bridge's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client id of the bridge's local session.
    pub fn local_session(&self) -> &str {
        &self.local_session
    }

    /// The configured remote addresses, in the order they are tried.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// True while the remote connection is up (CONNACK accepted).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The address connected to, while up.
    pub fn address(&self) -> Option<String> {
        self.link.lock().address.clone()
    }

    /// Why the link last failed or closed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.link.lock().last_error.clone()
    }

    /// Why the link last failed or closed and when (Unix ms), read together.
    pub fn last_error_at(&self) -> Option<(String, u64)> {
        let link = self.link.lock();
        let at = link.last_error_at_unix_ms?;
        link.last_error.clone().map(|error| (error, at))
    }

    /// When the link last came up or went down (Unix ms; the bridge's creation until then).
    pub fn changed_at_unix_ms(&self) -> u64 {
        self.link.lock().changed_at_unix_ms
    }

    /// The remote accepted the connection at `address`; `reconnect` when it is not the first.
    ///
    /// Sets `postbox_bridge_up` to 1, counts the reconnect, and publishes `1` on the state
    /// topic if the link was down. The state is published at QoS 1, as Mosquitto does: a
    /// monitoring client with a persistent QoS 1 subscription gets every transition, also
    /// those that happened while it was offline (queued for it, and through the store). Link
    /// changes are rare (the reconnect backoff paces them), so that costs nothing that
    /// matters; the retained value itself stays in memory only, like every `$SYS` value
    /// (`broker::routing`), and a restart publishes `0` again at creation.
    pub fn connected(&self, address: &str, reconnect: bool) {
        let mut link = self.link.lock();
        link.address = Some(address.to_owned());
        if reconnect {
            self.metrics.reconnects.increment(1);
        }
        let was_up = self.up.swap(true, Ordering::Relaxed);
        self.metrics.up.set(1.0);
        if !was_up {
            link.changed_at_unix_ms = crate::storage::now_unix_ms();
            // Under the lock: a racing `disconnected` publishes its `0` after this `1`.
            self.notify(true);
        }
    }

    /// The link is down (closed, failed, or never came up); `error` says why, if it failed.
    /// Sets `postbox_bridge_up` to 0 and publishes `0` on the state topic if it was up.
    pub fn disconnected(&self, error: Option<String>) {
        let mut link = self.link.lock();
        let was_up = self.up.swap(false, Ordering::Relaxed);
        self.metrics.up.set(0.0);
        link.address = None;
        if let Some(error) = error {
            link.last_error = Some(error);
            link.last_error_at_unix_ms = Some(crate::storage::now_unix_ms());
        }
        if was_up {
            link.changed_at_unix_ms = crate::storage::now_unix_ms();
            self.notify(false);
        }
    }

    /// Reconnects since start (successful connects after the first).
    pub fn reconnects(&self) -> u64 {
        self.metrics.reconnects.get()
    }

    /// One message forwarded (and acknowledged, for QoS 1/2) in direction `flow`.
    pub fn forwarded(&self, flow: Flow) {
        self.metrics.forwarded(flow as usize).increment(1);
    }

    /// One message not forwarded in direction `flow`, for `reason` (a metric label:
    /// `max_hops`, `topic`, `refused`, `too_large`).
    pub fn dropped(&self, flow: Flow, reason: &'static str) {
        self.dropped[flow as usize].fetch_add(1, Ordering::Relaxed);
        match self.metrics.dropped(flow as usize, reason) {
            Some(counter) => counter.increment(1),
            None => {
                tracing::debug!(bridge = %self.name, reason, "bridge drop reason without a metric label");
            }
        }
    }

    /// Messages forwarded in direction `flow` since start.
    pub fn forwarded_total(&self, flow: Flow) -> u64 {
        self.metrics.forwarded(flow as usize).get()
    }

    /// Messages dropped in direction `flow` since start.
    pub fn dropped_total(&self, flow: Flow) -> u64 {
        self.dropped[flow as usize].load(Ordering::Relaxed)
    }

    /// Messages dropped in direction `flow` for `reason` (one of [`DROP_REASONS`]) since start.
    pub fn dropped_for(&self, flow: Flow, reason: &str) -> u64 {
        self.metrics
            .dropped(flow as usize, reason)
            .map_or(0, crate::metrics::Counter::get)
    }

    /// What the bridge's local session holds for the remote now (queued and unacknowledged);
    /// all zero while the session does not exist yet.
    pub fn held(&self) -> crate::broker::admin::HeldFigures {
        self.broker
            .upgrade()
            .and_then(|broker| broker.held_for(&self.local_session))
            .unwrap_or_default()
    }

    /// Publishes the link state (`notifications` on): retained, QoS 1, from nobody, routed like
    /// the other `$SYS` values (an ACL decides who reads it; no client may publish there).
    fn notify(&self, up: bool) {
        let (Some(topic), Some(broker)) = (&self.state_topic, self.broker.upgrade()) else {
            return;
        };
        let publish = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: topic.clone(),
            packet_id: 0,
            payload: Bytes::from_static(if up { b"1" } else { b"0" }),
            properties: PublishProperties::default(),
        };
        let message = Arc::new(Message::from_publish(publish, None));
        // Nobody waits for the commit: no publisher to acknowledge.
        if let Err(error) = broker.publish(message, None) {
            if broker.is_shutting_down() {
                tracing::debug!(bridge = %self.name, %error, "bridge state not published");
            } else {
                tracing::warn!(bridge = %self.name, %error, up, "bridge state not published");
            }
        }
    }
}

impl BridgeStatus {
    /// The share its remote's messages count in, apart from anonymous clients' and other
    /// bridges' (issue 35, seventeenth adversarial pass, D5).
    pub(super) fn share(&self) -> StrangerShare {
        self.share
    }
}

/// Registers the scrape hook that copies what the bridge's local session holds into its three
/// queue gauges, and what its `share` holds into the share gauge. Holds the broker weakly
/// (the hooks live inside its metrics) and nothing of the status, so the hook keeps nothing
/// alive.
fn watch_queue(
    broker: &Arc<Broker>,
    local_session: &str,
    share: StrangerShare,
    metrics: &BridgeMetrics,
) {
    let weak = Arc::downgrade(broker);
    let client_id = local_session.to_owned();
    let (messages, bytes, oldest, share_bytes) = (
        metrics.queued_messages.clone(),
        metrics.queued_bytes.clone(),
        metrics.oldest_queued_seconds.clone(),
        metrics.share_bytes.clone(),
    );
    broker.metrics.on_scrape(move |_| {
        share_bytes.set(share.bytes() as f64);
        let Some(broker) = weak.upgrade() else {
            return;
        };
        let held = broker.held_for(&client_id).unwrap_or_default();
        messages.set(held.messages as f64);
        bytes.set(held.bytes as f64);
        oldest.set(held.oldest.map_or(0.0, |age| age.as_secs_f64()));
    });
}
