//! One remote connection's traffic: the bridge's local session ↔ the remote broker.
//!
//! Out: the local session's deliveries are encoded straight into the remote's write buffer
//! under the packet ids the session gave them (so the session's stored in-flight window *is*
//! the remote's, and a restart re-sends exactly what the remote may not have); a remote
//! PUBACK / PUBCOMP is the local acknowledgement that finally removes the message from the
//! store. In: a remote PUBLISH is routed through the session like a client's, and its PUBACK /
//! PUBREC goes back only once the store holds it.
//!
//! One task, one `select!`: the remote's reads, single writes, the local session's wake-up,
//! the acks waiting for commits, keep-alive and the forward rate all in one loop.
//!
//! Must not: send a delivery before its stored stage (`Fill` gate); ack the remote before the store
//! holds the message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::held_in::{Charge, Held, HeldIn, Passage};
use super::remote::{RemoteError, RemoteIo};
use super::remote_sink::{hops_of, set_hops, RemoteSink};
use super::remote_subscriptions::RemoteSubscriptions;
use super::status::{BridgeStatus, Flow};
use super::topics::Rules;
use crate::broker::link::Link;
use crate::broker::session::DeliverySink;
use crate::broker::stranger_share::StrangerShare;
use crate::broker::{Fill, Resend, SessionHandle};
use crate::codec::{topic, Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode};
use crate::config::{BridgeConfig, StartMode};
use crate::storage::{Durable, InOrder};

/// Encoded bytes waiting for the socket above which no more deliveries are taken.
pub(super) const WRITE_HIGH_WATER: usize = 256 * 1024;

/// How a connection's pump ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The broker is stopping.
    Shutdown,
    /// `start = "lazy"`: nothing to send for `idle_timeout`.
    Idle,
    /// Some of the remote's PUBLISHes were skipped for lack of room and the held ones are
    /// routed: reconnect at once, so the remote sends the skipped ones again (their count).
    Resend(usize),
}

/// What the remote told us at connect that bounds what we send.
#[derive(Debug, Clone, Copy)]
pub(super) struct RemoteLimits {
    /// QoS 1/2 messages in flight at once: `min(inflight, remote Receive Maximum)`.
    pub(super) window: usize,
    /// The remote's Maximum Packet Size (v5), else unbounded.
    pub(super) max_packet_size: usize,
    /// The remote's Maximum QoS (v5), else 2.
    pub(super) max_qos: QoS,
    /// Whether the remote keeps RETAIN (v5 Retain Available).
    pub(super) retain_available: bool,
    /// Whether the remote resumed the bridge's session (CONNACK Session Present): it still
    /// holds the subscriptions made on an earlier connection.
    pub(super) session_present: bool,
}

/// The per-connection state of the pump.
pub(super) struct Pump<'a, S> {
    config: &'a BridgeConfig,
    rules: &'a Rules,
    status: &'a BridgeStatus,
    link: &'a mut Link,
    io: RemoteIo<S>,
    limits: RemoteLimits,
    /// Acks waiting for their commit, in the order they must be written.
    gated: InOrder<Packet>,
    /// Forward-rate tokens (`max_forward_rate`), refilled continuously.
    tokens: f64,
    refilled_at: Instant,
    last_write: Instant,
    last_read: Instant,
    ping_sent: Option<Instant>,
    last_traffic: Instant,
    /// The packet id of the SUBSCRIBE sent at connect, until its SUBACK: no new delivery is
    /// taken meanwhile, so no new PUBLISH can take that id (MQTT-2.2.1-3).
    suback_pending: Option<u16>,
    /// Whether the remote acknowledged the `in` subscriptions on this connection.
    subscribed: bool,
    /// The remote's PUBLISHes held unacknowledged while the broker has no room for them.
    held_in: HeldIn,
    /// What the remote's messages are charged to.
    charge: Charge,
}

impl<S> std::fmt::Debug for Pump<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pump")
            .field("bridge", &self.config.name)
            .finish()
    }
}

impl<'a, S: AsyncRead + AsyncWrite + Unpin> Pump<'a, S> {
    /// A pump over a connected remote.
    pub(super) fn new(
        config: &'a BridgeConfig,
        rules: &'a Rules,
        status: &'a BridgeStatus,
        link: &'a mut Link,
        io: RemoteIo<S>,
        limits: RemoteLimits,
        share: StrangerShare,
    ) -> Pump<'a, S> {
        let now = Instant::now();
        // The remote's publishers were verified there, not here: where a method tells
        // identities apart, their messages are strangers' unless the operator vouches for
        // the remote (`trusted`).
        let verifying = link
            .handle()
            .broker()
            .logins()
            .is_some_and(crate::auth::login::Logins::binds_sessions);
        let charge = if verifying && !config.trusted {
            Charge::Stranger(share)
        } else {
            Charge::Budget
        };
        Pump {
            config,
            rules,
            status,
            link,
            io,
            limits,
            gated: InOrder::default(),
            tokens: f64::from(config.max_forward_rate.max(1)),
            refilled_at: now,
            last_write: now,
            last_read: now,
            ping_sent: None,
            last_traffic: now,
            suback_pending: None,
            subscribed: false,
            // The remote sends no more unacknowledged than the Receive Maximum announced;
            // past it, or past a held MiB, a PUBLISH is skipped (sent again after a
            // reconnect), unless the remote's session ends with the connection.
            held_in: HeldIn::new(usize::from(config.inflight.max(1)), !config.clean_start),
            charge,
        }
    }

    /// Subscribes on the remote for the `in` rules (No Local and Retain As Published on v5,
    /// so what the bridge sends is not echoed back), re-sends what the local session holds
    /// unacknowledged, then moves messages both ways until an error, shutdown or idleness.
    ///
    /// `remote` says what the remote holds of the bridge's subscriptions from earlier
    /// connections of this run ([`RemoteSubscriptions`]), and is brought up to date.
    ///
    /// # Errors
    ///
    /// Why the connection failed: the remote's I/O or protocol, the store, a takeover.
    pub(super) async fn run(
        mut self,
        resends: Vec<Resend>,
        remote: &mut RemoteSubscriptions,
        shutdown: &CancellationToken,
    ) -> Result<Ended, RemoteError> {
        // An id none of the re-sent PUBLISHes holds (they keep theirs across the reconnect).
        let held: Vec<u16> = resends
            .iter()
            .map(|r| match r {
                Resend::Publish(_, id) | Resend::Release(id) => *id,
            })
            .collect();
        let subscribe_id = (1..=u16::MAX).find(|id| !held.contains(id)).unwrap_or(1);
        let v5 = self.io.version() == ProtocolVersion::V5;
        if v5 || !remote.still_held(self.limits.session_present) {
            // MQTT 5: Retain Handling 1 once they were acknowledged in this run, so a
            // subscription the remote still holds brings no retained message again, and
            // one it lost (a session replaced there) is made anew with them.
            let retain_handling = u8::from(v5 && remote.acknowledged);
            self.subscribe_remote(subscribe_id, retain_handling)?;
        }
        self.resend(resends)?;
        let result = self.pump(shutdown).await;
        remote.acknowledged |= self.subscribed;
        remote.after_resend = matches!(result, Ok(Ended::Resend(_)));
        self.held_in.end(self.link.handle().broker().flow());
        if matches!(result, Ok(Ended::Shutdown | Ended::Idle | Ended::Resend(_))) {
            self.io.close().await;
        }
        result
    }

    fn subscribe_remote(&mut self, packet_id: u16, retain_handling: u8) -> Result<(), RemoteError> {
        let filters: Vec<_> = self
            .rules
            .remote_subscriptions()
            .into_iter()
            .map(|(filter, qos)| {
                let options = crate::codec::SubscriptionOptions {
                    qos: qos.min(self.limits.max_qos),
                    no_local: true,
                    retain_as_published: true,
                    retain_handling,
                };
                (ByteString::from(filter), options)
            })
            .collect();
        if filters.is_empty() {
            return Ok(());
        }
        let subscribe = crate::codec::Subscribe {
            packet_id,
            subscription_identifier: None,
            user_properties: Vec::new(),
            filters,
        };
        self.io.tx.push(&Packet::Subscribe(subscribe))?;
        self.suback_pending = Some(packet_id);
        Ok(())
    }

    /// What the session held unacknowledged when it was resumed: PUBLISHes again with DUP
    /// (MQTT-4.4.0-1), PUBRELs again; in the order they were first sent.
    fn resend(&mut self, resends: Vec<Resend>) -> Result<(), RemoteError> {
        for resend in resends {
            match resend {
                Resend::Publish(delivery, packet_id) => {
                    let sent = self.sink().write(&delivery, packet_id, true, false);
                    if !sent {
                        // Not forwardable any more (its rule is gone, too many hops, too
                        // large): the session lets it go, as a fill would.
                        self.forget(packet_id);
                    }
                }
                Resend::Release(packet_id) => {
                    self.io
                        .tx
                        .push(&Packet::PubRel(PubResponse::new(packet_id)))?;
                }
            }
        }
        Ok(())
    }

    /// Lets go of a re-sent message the bridge can no longer forward. Not dead-lettered
    /// here: mostly its rules changed or a loop was cut (`max_hops`), which lose nothing.
    fn forget(&mut self, packet_id: u16) {
        self.link.handle().discard(packet_id, None);
    }

    fn sink(&mut self) -> RemoteSink<'_> {
        self.handle_and_sink().1
    }

    /// The local session's handle and a sink into the write buffer, borrowed together (a
    /// fill hands the one to the other): the one place a [`RemoteSink`] is made.
    fn handle_and_sink(&mut self) -> (&SessionHandle, RemoteSink<'_>) {
        let version = self.io.version();
        let sink = RemoteSink::new(
            &mut self.io.tx.wbuf,
            self.config,
            self.rules,
            self.status,
            version,
            self.limits,
            self.tokens,
        );
        (self.link.handle(), sink)
    }

    fn refill_tokens(&mut self, now: Instant) {
        let rate = f64::from(self.config.max_forward_rate);
        if rate == 0.0 {
            return;
        }
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate.max(1.0));
        self.refilled_at = now;
    }

    /// Takes what the local session has ready into the write buffer, within the window, the
    /// buffer's high-water mark and the forward rate.
    async fn fill(&mut self) -> Result<bool, RemoteError> {
        if self.io.tx.wbuf.len() >= WRITE_HIGH_WATER || self.suback_pending.is_some() {
            return Ok(false);
        }
        self.refill_tokens(Instant::now());
        if self.config.max_forward_rate > 0 && self.tokens < 1.0 {
            return Ok(false);
        }
        let window = self.limits.window;
        let before = self.io.tx.wbuf.len();
        let (handle, mut sink) = self.handle_and_sink();
        let fill = handle.fill(window, Instant::now(), &mut sink as &mut dyn DeliverySink);
        let taken = sink.taken;
        if self.config.max_forward_rate > 0 {
            self.tokens -= taken as f64;
        }
        match fill {
            Fill::TakenOver => return Err(RemoteError::TakenOver),
            Fill::Filled { gate: Some(gate) } => {
                // A delivery whose new stage is being stored must not reach the remote first
                // (a crash would re-send it under another id): held until the commit.
                gate.await?;
            }
            Fill::Filled { gate: None } => {}
        }
        Ok(self.io.tx.wbuf.len() > before)
    }

    async fn pump(&mut self, shutdown: &CancellationToken) -> Result<Ended, RemoteError> {
        let session = Arc::clone(self.link.handle().session());
        let broker = Arc::clone(self.link.handle().broker());
        let keep_alive = Duration::from_secs(u64::from(self.config.keep_alive));
        loop {
            // Armed before the fill, so a delivery queued in between still wakes us.
            let woken = session.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Armed before the held PUBLISHes are looked at, likewise; only while some are.
            let room = (!self.held_in.is_empty())
                .then(|| Arc::clone(broker.flow().room()).notified_owned());
            self.release_held_in().await?;
            if self.fill().await? {
                self.last_traffic = Instant::now();
            }
            self.release_gated()?;
            if self.held_in.wants_resend() && self.gated.is_empty() {
                // Every held one is routed and acknowledged (the close flushes the acks):
                // the skipped ones come again on the next connection.
                return Ok(Ended::Resend(self.held_in.skipped()));
            }
            let now = Instant::now();
            let next_timer = self.next_timer(now, keep_alive);
            let may_take = self.io.tx.wbuf.len() < WRITE_HIGH_WATER
                && self.suback_pending.is_none()
                && (self.config.max_forward_rate == 0 || self.tokens >= 1.0);
            let has_gated = !self.gated.is_empty();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(Ended::Shutdown),
                read = self.io.rx.fill_read(), if self.held_in.may_read() => {
                    read?;
                    self.last_read = Instant::now();
                    self.ping_sent = None;
                    while let Some(packet) = self.io.rx.next_packet()? {
                        self.on_packet(packet).await?;
                    }
                }
                written = self.io.tx.write_some(), if !self.io.tx.wbuf.is_empty() => {
                    written?;
                    self.last_write = Instant::now();
                }
                durable = self.gated.wait_front(), if has_gated => {
                    durable?;
                }
                () = room_or_a_second(room), if !self.held_in.is_empty() => {}
                () = &mut woken, if may_take => {}
                () = tokio::time::sleep_until(next_timer.into()) => {
                    if let Some(ended) = self.on_timer(keep_alive)? {
                        return Ok(ended);
                    }
                }
            }
        }
    }

    /// Moves acks whose commit is done (in order) into the write buffer.
    fn release_gated(&mut self) -> Result<(), RemoteError> {
        while let Some(packet) = self.gated.pop_ready() {
            self.io.tx.push(&packet)?;
        }
        Ok(())
    }

    fn next_timer(&self, now: Instant, keep_alive: Duration) -> Instant {
        let mut next = now + Duration::from_secs(1);
        if !keep_alive.is_zero() {
            let ping_at = match self.ping_sent {
                Some(sent) => sent + keep_alive,
                None => self.last_write + keep_alive,
            };
            next = next.min(ping_at.max(now + Duration::from_millis(1)));
        }
        if self.config.max_forward_rate > 0 && self.tokens < 1.0 {
            let wait = (1.0 - self.tokens) / f64::from(self.config.max_forward_rate);
            next = next.min(now + Duration::from_secs_f64(wait.max(0.001)));
        }
        next
    }

    fn on_timer(&mut self, keep_alive: Duration) -> Result<Option<Ended>, RemoteError> {
        let now = Instant::now();
        if !keep_alive.is_zero() {
            match self.ping_sent {
                Some(sent) if now.duration_since(sent) >= keep_alive => {
                    return Err(RemoteError::KeepAlive(keep_alive));
                }
                None if now.duration_since(self.last_write) >= keep_alive => {
                    self.io.tx.push(&Packet::PingReq)?;
                    self.ping_sent = Some(now);
                }
                _ => {}
            }
        }
        if self.config.start == StartMode::Lazy
            && now.duration_since(self.last_traffic)
                >= Duration::from_secs(u64::from(self.config.idle_timeout))
            && self.gated.is_empty()
            && self.io.tx.wbuf.is_empty()
        {
            let view = self
                .link
                .handle()
                .broker()
                .session_view(self.link.handle().client_id());
            if view.is_none_or(|v| v.backlog == 0 && v.inflight == 0) {
                return Ok(Some(Ended::Idle));
            }
        }
        Ok(None)
    }

    async fn on_packet(&mut self, packet: Packet) -> Result<(), RemoteError> {
        self.last_traffic = Instant::now();
        let handle = self.link.handle();
        match packet {
            Packet::PubAck(ack) => {
                handle
                    .on_puback(ack.packet_id, ack.reason_code)
                    .map_err(|m| RemoteError::Protocol(m.to_string()))?;
                self.count_outcome(ack.reason_code);
            }
            Packet::PubRec(rec) => {
                let refused = rec.reason_code.0 >= 0x80;
                let answer = handle
                    .on_pubrec(rec.packet_id, rec.reason_code)
                    .map_err(|m| RemoteError::Protocol(m.to_string()))?;
                if refused {
                    self.count_outcome(rec.reason_code);
                }
                if let Some(answer) = answer {
                    let mut rel = PubResponse::new(rec.packet_id);
                    rel.reason_code = answer.reason;
                    self.send_after(answer.gate, Packet::PubRel(rel));
                }
            }
            Packet::PubComp(comp) => {
                handle
                    .on_pubcomp(comp.packet_id)
                    .map_err(|m| RemoteError::Protocol(m.to_string()))?;
                self.status.forwarded(Flow::Out);
            }
            Packet::Publish(publish) => self.on_remote_publish(publish).await?,
            Packet::PubRel(rel) => {
                let answer = handle.on_pubrel(rel.packet_id);
                let mut comp = PubResponse::new(rel.packet_id);
                comp.reason_code = answer.reason;
                self.send_after(answer.gate, Packet::PubComp(comp));
            }
            Packet::SubAck(ack) => {
                let filters = self.rules.remote_subscriptions();
                if self.suback_pending == Some(ack.packet_id) {
                    self.suback_pending = None;
                    self.subscribed = true;
                    // From here the remote sends what its `in` rules ask for: before it, a
                    // message published there found no subscription of this bridge.
                    tracing::info!(bridge = %self.config.name, filters = filters.len(), "bridge: subscribed on the remote");
                }
                for (i, code) in ack.reason_codes.iter().enumerate() {
                    if code.0 >= 0x80 {
                        let filter = filters.get(i).map_or("?", |(f, _)| f.as_str());
                        tracing::warn!(bridge = %self.config.name, filter, reason = code.0, "bridge: the remote refused a subscription; messages for it will not come in");
                    }
                }
            }
            Packet::UnsubAck(_) | Packet::PingResp => {}
            Packet::Disconnect(d) => return Err(RemoteError::Disconnected(d.reason_code.0)),
            other => {
                return Err(RemoteError::Protocol(format!(
                    "unexpected {} from the remote",
                    other.name()
                )))
            }
        }
        Ok(())
    }

    fn count_outcome(&self, code: ReasonCode) {
        if code.0 >= 0x80 {
            tracing::warn!(bridge = %self.config.name, reason = code.0, "bridge: the remote refused a message; it is dropped");
            self.status.dropped(Flow::Out, "refused");
        } else {
            self.status.forwarded(Flow::Out);
        }
    }

    /// A PUBLISH from the remote: renamed by the `in` rules and routed through the bridge's
    /// session like a client's; acknowledged once the store holds it.
    async fn on_remote_publish(&mut self, mut publish: Publish) -> Result<(), RemoteError> {
        let (qos, packet_id) = (publish.qos, publish.packet_id);
        let v5 = self.io.version() == ProtocolVersion::V5;
        let local = self.rules.incoming(&publish.topic).filter(|t| {
            topic::topic_name_error(t).is_none()
                && !topic::is_sys(t)
                && !self.link.handle().broker().is_dead_letter_topic(t)
        });
        let hops = hops_of(&publish.properties);
        // The local clients' rule for control characters and non-characters holds for what
        // the remote sends too (issue 35, fourteenth adversarial pass, A3).
        let disallowed = !self
            .link
            .handle()
            .broker()
            .config()
            .allow_control_characters
            && crate::codec::publish_has_disallowed_code_points(&publish);
        let verdict = match local {
            None => Err("topic"),
            Some(_) if disallowed => Err("refused"),
            Some(_) if v5 && hops >= self.config.max_hops => Err("max_hops"),
            Some(name) => Ok(name),
        };
        let name = match verdict {
            Ok(name) => name,
            Err(reason) => {
                // Acknowledged (the remote must not re-send it) and counted.
                self.status.dropped(Flow::In, reason);
                self.ack_remote(qos, packet_id, ReasonCode::SUCCESS, None);
                return Ok(());
            }
        };
        publish.topic = ByteString::from(name);
        publish.dup = false;
        publish.properties.topic_alias = None;
        publish.properties.subscription_identifiers.clear();
        if v5 {
            set_hops(&mut publish.properties, hops.saturating_add(1));
        }
        // Near the memory budget, or the remote's messages at the anonymous share: held
        // unacknowledged until there is room, as a local publisher pauses; the remote keeps
        // what it has not sent (issue 35, fifteenth adversarial pass, B6; sixteenth, C2).
        let broker = Arc::clone(self.link.handle().broker());
        match self.held_in.may_pass(&broker, self.charge, &publish) {
            Passage::InOrder => self.route_in(publish, true).await,
            Passage::Ahead => {
                if qos != QoS::AtMostOnce {
                    self.held_in.passed_ahead(&publish.topic);
                }
                self.route_in(publish, false).await
            }
            Passage::Wait => {
                if qos == QoS::AtMostOnce {
                    self.status.dropped(Flow::In, "memory");
                } else if self.held_in.hold(broker.flow(), publish) == Held::Skipped
                    && self.held_in.skipped() == 1
                {
                    tracing::warn!(bridge = %self.config.name, "bridge: no room for more of the remote's messages; those past the held ones are left with the remote and fetched again by reconnecting once the held ones are routed");
                }
                Ok(())
            }
        }
    }

    /// Routes what [`Pump::release_held_in`] lets go, oldest first.
    async fn release_held_in(&mut self) -> Result<(), RemoteError> {
        let broker = Arc::clone(self.link.handle().broker());
        while let Some(publish) = self.held_in.release(&broker, self.charge) {
            self.route_in(publish, true).await?;
        }
        Ok(())
    }

    /// Routes a renamed PUBLISH of the remote through the bridge's session and answers the
    /// remote once the store holds it; or, not to `acknowledge` ([`Passage::Ahead`]), leaves
    /// it with the remote, which sends it again at the next connection, refused or not.
    async fn route_in(&mut self, publish: Publish, acknowledge: bool) -> Result<(), RemoteError> {
        let (qos, packet_id) = (publish.qos, publish.packet_id);
        let v5 = self.io.version() == ProtocolVersion::V5;
        // Kept to be tried again if it is refused for now.
        let again = (acknowledge && qos != QoS::AtMostOnce).then(|| publish.clone());
        let handle = self.link.handle();
        let routed = match self.charge {
            Charge::Budget => handle.publish(publish),
            Charge::Stranger(share) => handle.publish_as_stranger(publish, share),
        };
        match routed {
            Ok(published) => {
                if let Some(target) = published.pressure {
                    // A local subscriber is full: read nothing more from the remote until it
                    // has room (back-pressure travels upstream instead of dropping).
                    self.link.wait_for_room(&target).await;
                }
                self.status.forwarded(Flow::In);
                if !acknowledge {
                    return Ok(());
                }
                let reason = if v5 {
                    ReasonCode::SUCCESS
                } else {
                    published.answer.reason
                };
                self.ack_remote(qos, packet_id, reason, published.answer.gate);
            }
            Err(refused) => {
                if !acknowledge && qos != QoS::AtMostOnce {
                    // Counted as skipped: the remote sends it again.
                    return Ok(());
                }
                let Some(again) = again else {
                    self.status.dropped(Flow::In, "refused");
                    return Ok(());
                };
                if refused.is_for_now() {
                    // Held unacknowledged and tried again: refused (v5) the remote drops
                    // it, and a 3.x bridge reconnected in a loop (seventeenth pass, D5).
                    tracing::debug!(bridge = %self.config.name, %refused, "bridge: a message from the remote cannot be taken now; held and tried again");
                    let broker = Arc::clone(self.link.handle().broker());
                    self.held_in.retry_later(broker.flow(), again);
                    return Ok(());
                }
                if !v5
                    && matches!(
                        refused,
                        crate::broker::PublishRefused::PayloadInvalid { .. }
                    )
                {
                    // A schema's refusal is final: re-sending after a reconnect would be
                    // refused again, forever. Acknowledged (the remote drops it) and counted.
                    self.status.dropped(Flow::In, "refused");
                    self.ack_remote(qos, packet_id, ReasonCode::SUCCESS, None);
                    return Ok(());
                }
                if !v5 {
                    // 3.x has no negative ack: closing makes the remote re-send it later.
                    return Err(RemoteError::Protocol(format!(
                        "a message from the remote was refused locally ({refused}); reconnecting so the remote keeps it"
                    )));
                }
                self.status.dropped(Flow::In, "refused");
                let code = refused.reason_code();
                self.ack_remote(qos, packet_id, code, None);
            }
        }
        Ok(())
    }

    fn ack_remote(&mut self, qos: QoS, packet_id: u16, reason: ReasonCode, gate: Option<Durable>) {
        let mut ack = PubResponse::new(packet_id);
        ack.reason_code = reason;
        let packet = match qos {
            QoS::AtMostOnce => return,
            QoS::AtLeastOnce => Packet::PubAck(ack),
            QoS::ExactlyOnce => Packet::PubRec(ack),
        };
        self.send_after(gate, packet);
    }

    /// Queues `packet` for the remote behind every earlier gated write, to be written once
    /// `gate` (if any) is durable.
    fn send_after(&mut self, gate: Option<Durable>, packet: Packet) {
        self.gated.push(gate, packet);
    }
}

/// Returns when `room` is notified (memory fell under the resume mark) or after a second, a
/// floor for room made otherwise (a retained message cleared, a share drained); never
/// without `room`.
async fn room_or_a_second(room: Option<tokio::sync::futures::OwnedNotified>) {
    match room {
        Some(room) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), room).await;
        }
        None => std::future::pending().await,
    }
}
