//! One bridge's life: its durable local session, the connect loop (failover, backoff with
//! jitter), lazy start, and a [`Pump`] per remote connection.
//!
//! The local session `$bridge/<name>` is made (or found again after a restart) before the
//! first connect, with the `out` rules' subscriptions, so messages published while the
//! remote was never reached are kept too. Between connections it is detached: it is an
//! offline session then, whose bound and overflow policy are the bridge's own.
//!
//! Must not: keep messages anywhere but the session.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use tokio_util::sync::CancellationToken;

use super::pump::{Ended, Pump, RemoteLimits};
use super::remote::{RemoteError, RemoteIo};
use super::status::BridgeStatus;
use super::topics::Rules;
use super::transport::{self, AddressPicker, Backoff, ClientTls};
use crate::broker::link::{Link, LinkOptions};
use crate::broker::{Broker, SessionQueueLimits};
use crate::codec::{
    Connect, ConnectProperties, ProtocolVersion, QoS, ReasonCode, SubscriptionOptions,
};
use crate::config::{BridgeConfig, BridgeProtocol, StartMode};

/// How long one connect attempt (TCP, TLS, CONNECT/CONNACK) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection that stayed up this long resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// How often a lazy bridge looks at its queue while it waits for the threshold.
const LAZY_POLL: Duration = Duration::from_millis(250);

/// Everything one bridge task needs.
#[derive(Debug)]
pub(super) struct Bridge {
    /// The broker it bridges.
    pub(super) broker: Arc<Broker>,
    /// Its `[[bridge]]` section.
    pub(super) config: BridgeConfig,
    /// What it reports.
    pub(super) status: Arc<BridgeStatus>,
    /// TLS to the remote, when configured (loaded at start).
    pub(super) tls: Option<Arc<ClientTls>>,
    /// The share its remote's messages count in (unless `trusted`), apart from anonymous
    /// clients' and other bridges'.
    pub(super) share: crate::broker::stranger_share::StrangerShare,
}

impl Bridge {
    /// Prepares the local session, then connects, forwards, and reconnects until shutdown.
    pub(super) async fn run(self, shutdown: CancellationToken) {
        let rules = Rules::new(&self.config.topics);
        self.prepare_local_session(&rules);
        let mut picker = AddressPicker::new(self.config.addresses.clone(), self.config.round_robin);
        let [base, cap] = self.config.restart_timeout;
        let mut backoff = Backoff::new(
            Duration::from_secs(u64::from(base.max(1))),
            Duration::from_secs(u64::from(cap.max(base).max(1))),
        );
        let mut connected_before = false;
        let mut remote_subscriptions = super::remote_subscriptions::RemoteSubscriptions::default();
        let mut failures_logged = 0u32;
        loop {
            if self.config.start == StartMode::Lazy && !self.wait_for_threshold(&shutdown).await {
                return;
            }
            let attempt = tokio::select! {
                () = shutdown.cancelled() => return,
                attempt = self.connect(&picker) => attempt,
            };
            let (io, limits, address, index) = match attempt {
                Ok(connected) => connected,
                Err(error) => {
                    // The first failures are worth a warning; a long outage is not a log flood.
                    if failures_logged < 3 {
                        tracing::warn!(bridge = %self.config.name, %error, "bridge: cannot connect to the remote; retrying");
                    } else {
                        tracing::debug!(bridge = %self.config.name, %error, "bridge: cannot connect to the remote; retrying");
                    }
                    failures_logged = failures_logged.saturating_add(1);
                    self.status.disconnected(Some(error.to_string()));
                    if !sleep_or_shutdown(backoff.next_delay(), &shutdown).await {
                        return;
                    }
                    continue;
                }
            };
            failures_logged = 0;
            picker.succeeded(index);
            let options = LinkOptions {
                receive_maximum: u16::try_from(limits.window).unwrap_or(u16::MAX),
                ..LinkOptions::persistent(self.config.local_session_id())
            };
            let (mut link, resends) = Link::connect_driven(&self.broker, options);
            self.status.connected(&address, connected_before);
            connected_before = true;
            tracing::info!(bridge = %self.config.name, %address, protocol = io.version().label(), resending = resends.len(), "bridge: connected to the remote");
            let started = Instant::now();
            let result = Pump::new(
                &self.config,
                &rules,
                &self.status,
                &mut link,
                io,
                limits,
                self.share,
            )
            .run(resends, &mut remote_subscriptions, &shutdown)
            .await;
            drop(link); // detached: an offline session with the bridge's bound until the next connect
            match result {
                Ok(Ended::Shutdown) => {
                    self.status.disconnected(None);
                    return;
                }
                Ok(Ended::Resend(skipped)) => {
                    tracing::info!(bridge = %self.config.name, skipped, "bridge: reconnecting so the remote sends again what it had no room for");
                    self.status.disconnected(None);
                    backoff.reset();
                }
                Ok(Ended::Idle) => {
                    tracing::info!(bridge = %self.config.name, "bridge: idle, disconnected (start = \"lazy\")");
                    self.status.disconnected(None);
                    backoff.reset();
                }
                Err(error) => {
                    tracing::warn!(bridge = %self.config.name, %error, "bridge: connection to the remote lost; reconnecting");
                    self.status.disconnected(Some(error.to_string()));
                    if started.elapsed() >= STABLE_AFTER {
                        backoff.reset();
                    }
                    if !sleep_or_shutdown(backoff.next_delay(), &shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Makes (or finds again) the bridge's durable session and gives it exactly the `out`
    /// rules' subscriptions: No Local (what the bridge publishes locally from the remote is
    /// not sent back) and Retain As Published (the RETAIN flag travels). A new subscription
    /// queues the matching retained messages, as for any subscriber (MQTT-3.3.1-9).
    fn prepare_local_session(&self, rules: &Rules) {
        let local_id = self.config.local_session_id();
        // The bridge's own bound and policy, in place before the session takes a message.
        self.broker.set_queue_limits(
            &local_id,
            SessionQueueLimits {
                max_messages: self.config.max_queued_messages.max(1),
                max_bytes: self.config.max_queued_bytes,
                overflow: self.config.queue_overflow,
            },
        );
        let (link, _resends) =
            Link::connect_driven(&self.broker, LinkOptions::persistent(local_id.clone()));
        let handle = link.handle();
        let wanted = rules.local_subscriptions();
        if let Some(view) = self.broker.session_view(&local_id) {
            for old in view.subscriptions {
                if !wanted.iter().any(|(f, _)| *f == old.filter) {
                    tracing::info!(bridge = %self.config.name, filter = %old.filter, "bridge: dropping a local subscription no rule asks for any more");
                    handle.unsubscribe(&old.filter);
                }
            }
        }
        for (filter, qos) in wanted {
            let options = SubscriptionOptions {
                qos: qos.min(self.broker.max_qos()),
                no_local: true,
                retain_as_published: true,
                ..SubscriptionOptions::default()
            };
            let filter = ByteString::from(filter);
            if !handle.subscribe(&filter, options, None) {
                handle.deliver_retained(&filter, options, None);
            }
        }
        drop(link);
    }

    /// Waits until the local session holds `threshold` messages; false at shutdown.
    async fn wait_for_threshold(&self, shutdown: &CancellationToken) -> bool {
        let local_id = self.config.local_session_id();
        loop {
            let queued = self
                .broker
                .session_view(&local_id)
                .map_or(0, |v| v.backlog + v.inflight);
            if queued >= self.config.threshold {
                return true;
            }
            if !sleep_or_shutdown(LAZY_POLL, shutdown).await {
                return false;
            }
        }
    }

    /// One connect cycle: the addresses in the picker's order until one answers CONNACK.
    async fn connect(
        &self,
        picker: &AddressPicker,
    ) -> Result<
        (
            RemoteIo<transport::RemoteStream>,
            RemoteLimits,
            String,
            usize,
        ),
        RemoteError,
    > {
        let mut last = RemoteError::Connect("no address configured".into());
        for index in picker.order() {
            let address = picker.address(index).to_owned();
            let stream =
                match transport::connect(&address, self.tls.as_deref(), CONNECT_TIMEOUT).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        last = RemoteError::Connect(error.to_string());
                        continue;
                    }
                };
            if self.config.tls.as_ref().is_some_and(|t| t.insecure) {
                tracing::warn!(bridge = %self.config.name, %address, "bridge: TLS certificate checks are off (tls.insecure = true): for tests only");
            }
            match RemoteIo::handshake(stream, &self.connect_packet(), CONNECT_TIMEOUT).await {
                Ok((io, ack)) => {
                    let p = &ack.properties;
                    let limits = RemoteLimits {
                        window: usize::from(self.config.inflight.max(1))
                            .min(usize::from(p.receive_maximum.unwrap_or(u16::MAX).max(1))),
                        max_packet_size: p.maximum_packet_size.map_or(usize::MAX, |m| m as usize),
                        max_qos: p.maximum_qos.unwrap_or(QoS::ExactlyOnce),
                        retain_available: p.retain_available.unwrap_or(true),
                        session_present: ack.session_present,
                    };
                    if ack.reason_code != ReasonCode::SUCCESS {
                        tracing::debug!(bridge = %self.config.name, reason = ack.reason_code.0, "bridge: CONNACK");
                    }
                    return Ok((io, limits, address, index));
                }
                Err(error) => {
                    last = RemoteError::Connect(format!("{address}: {error}"));
                }
            }
        }
        Err(last)
    }

    /// The CONNECT the bridge sends.
    fn connect_packet(&self) -> Connect {
        let c = &self.config;
        let v5 = c.protocol == BridgeProtocol::V5;
        Connect {
            protocol: if v5 {
                ProtocolVersion::V5
            } else {
                ProtocolVersion::V3_1_1
            },
            clean_start: c.clean_start,
            keep_alive: c.keep_alive,
            client_id: ByteString::from(c.remote_client_id()),
            will: None,
            username: c.username.clone().map(ByteString::from),
            password: c
                .password
                .clone()
                .map(|p| bytes::Bytes::from(p.into_bytes())),
            // 3.1.1: Mosquitto's bridge flag (level 0x84), so a Mosquitto or Postbox remote
            // does not echo what the bridge sends and keeps its RETAIN flag.
            bridge: !v5 && c.try_private,
            properties: if v5 {
                ConnectProperties {
                    session_expiry_interval: Some(if c.clean_start { 0 } else { c.session_expiry }),
                    receive_maximum: Some(c.inflight.max(1)),
                    maximum_packet_size: crate::connection::admission::announced_packet_size(
                        self.broker.config().max_packet_size,
                    ),
                    ..ConnectProperties::default()
                }
            } else {
                ConnectProperties::default()
            },
        }
    }
}

/// Sleeps for `wait`; false if shutdown came first.
async fn sleep_or_shutdown(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}
