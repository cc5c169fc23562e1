//! The per-client protocol state machine after CONNACK: reads, acks, subscriptions,
//! outbound flow control, keep-alive, takeover and the will.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use bytestring::ByteString;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::futures::Notified;

use super::gated::{AckKind, Gated, GatedWrites};
use super::handshake::{self, Accepted, EnhancedAuth};
use super::io::{Io, IoEvent, WRITE_HIGH_WATER};
use super::topic_alias::OutboundAliases;
use crate::auth::{self, AuthState, AuthStep, PendingStep, StepInput};
use crate::broker::{
    Broker, Delivery, DeliveryFlags, Inflight, Message, OutboundAlias, OutboundStage, Session,
};
use crate::codec::{
    self, topic, Auth, AuthProperties, Disconnect, DisconnectProperties, LastWill, Packet,
    ProtocolVersion, PubResponse, Publish, QoS, ReasonCode, SubAck, Subscribe, SubscriptionOptions,
    UnsubAck, Unsubscribe,
};
use crate::config::OutboundTopicAliases;
use crate::storage::{Durable, Op, StorageError};

/// Why the connection is ending; decides the DISCONNECT sent (v5) and whether the will fires.
#[derive(Debug)]
enum Close {
    /// The client sent DISCONNECT; 0x04 keeps the will (MQTT-3.14.4-3).
    ClientDisconnect(ReasonCode),
    /// The peer closed or the socket failed without DISCONNECT.
    Lost,
    /// A protocol violation by the client.
    Violation(ReasonCode, String),
    /// No packet within 1.5 × keep-alive (MQTT-3.1.2-24).
    KeepAliveTimeout,
    /// Another connection took the session (MQTT-3.1.4-2).
    TakenOver,
    /// The broker is stopping.
    ServerShutdown,
}

/// What woke the connection (see [`Client::next_wake`]).
enum Wake {
    Durable(Result<(), StorageError>),
    Verdict(AuthStep),
    Io(IoEvent),
    Session,
}

/// Inbound topic alias table of one connection.
type InboundAliases = HashMap<u16, ByteString, foldhash::fast::RandomState>;

/// A connection's enhanced authentication (v5 §4.12): its method and any re-authentication
/// in progress.
struct AuthContext {
    method: EnhancedAuth,
    /// Method state between the rounds of a re-authentication in progress.
    state: Option<AuthState>,
    /// An authentication step being computed (possibly on the blocking pool).
    step: Option<PendingStep>,
}

/// One connected client.
pub struct Client<S> {
    io: Io<S>,
    broker: Arc<Broker>,
    session: Arc<Session>,
    generation: u64,
    peer: SocketAddr,
    version: ProtocolVersion,
    session_present: bool,
    /// 1.5 × keep-alive, or `None` when keep-alive is off. Enforced without a timer: the
    /// broker's periodic sweep wakes the connection once the deadline it last reported to the
    /// session has passed, and the connection then compares against `last_read`.
    keep_alive_limit: Option<Duration>,
    last_read: Instant,
    /// Boxed: most clients have none, and it is large (216 B) for a field held all the time.
    will: Option<Box<LastWill>>,
    /// Outbound QoS 1/2 window: min(broker's max inflight, client's Receive Maximum).
    window: usize,
    /// Largest packet the client accepts (v5 Maximum Packet Size).
    client_max_packet: usize,
    max_packet: usize,
    /// Inbound topic aliases (v5): alias -> topic, at most `alias_max_in` entries. Boxed and
    /// created on first use: most clients never send an alias.
    aliases: Option<Box<InboundAliases>>,
    /// Topic Alias Maximum we announced: inbound aliases 1..=this are valid.
    alias_max_in: u16,
    /// Outbound topic aliases, when `mqtt.outbound_topic_aliases` and the client allow them.
    aliases_out: Option<Box<OutboundAliases>>,
    /// Our Receive Maximum for this client (v5); `usize::MAX` for 3.x, which cannot be told.
    receive_maximum: usize,
    /// Inbound QoS 1 PUBLISHes whose PUBACK has not been queued yet. Together with the QoS 2
    /// ids awaiting PUBREL (the session's `inbound_qos2`, filled on receipt) it is what
    /// Receive Maximum bounds, see [`Client::check_receive_maximum`]. An ack that has to wait
    /// (e.g. for a durable commit) keeps its PUBLISH counted here until it is queued.
    pending_inbound: usize,
    /// The client accepts Reason Strings and User Properties (v5 Request Problem Information).
    problem_info: bool,
    /// The connection's enhanced authentication, for re-authentication; boxed, most clients
    /// have none.
    auth: Option<Box<AuthContext>>,
    /// Writes waiting for the durable store (acks, PUBREL, outbound QoS 2).
    gated: GatedWrites,
}

/// Stop reading from a client while this many of its writes wait for the store: bounds the
/// memory a fast publisher can tie up when the disk is slow (3.x has no Receive Maximum).
const MAX_GATED_WRITES: usize = 1024;

/// Stop moving deliveries out of the session queue while this many writes wait for the store:
/// each held batch can be up to `WRITE_HIGH_WATER` bytes, so this bounds a connection's held
/// output to about 1 MiB while a commit is slow.
const MAX_HELD_BATCHES: usize = 16;

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Takes over the connection from the handshake.
    pub fn new(
        mut io: Io<S>,
        broker: Arc<Broker>,
        accepted: Accepted,
        peer: SocketAddr,
    ) -> Client<S> {
        let Accepted {
            connect,
            attached,
            keep_alive,
            auth,
        } = accepted;
        let config = broker.config();
        let v5 = connect.protocol.is_v5();
        let aliases_out = match (
            config.outbound_topic_aliases,
            connect.properties.topic_alias_maximum,
        ) {
            // MQTT-3.1.2-27: none unless the client announced a maximum above 0.
            (OutboundTopicAliases::Lru, Some(max)) if v5 && max > 0 => {
                Some(Box::new(OutboundAliases::new(max)))
            }
            _ => None,
        };
        let problem_info = handshake::wants_problem_info(&connect);
        let our_receive_maximum = if v5 {
            usize::from(config.receive_maximum)
        } else {
            usize::MAX
        };
        let alias_max_in = config.topic_alias_maximum;
        let receive_maximum = connect.properties.receive_maximum.unwrap_or(u16::MAX);
        let window = usize::from(config.max_inflight_messages.min(receive_maximum).max(1));
        let client_max_packet = connect
            .properties
            .maximum_packet_size
            .map_or(usize::MAX, |m| m as usize);
        let max_packet = config.max_packet_size as usize;
        // The CONNECT has been taken out of it: do not keep its buffer for an idle client.
        io.release_read_buffer();
        Client {
            io,
            session: attached.session,
            generation: attached.generation,
            peer,
            version: connect.protocol,
            session_present: attached.session_present,
            keep_alive_limit: (keep_alive > 0)
                .then(|| Duration::from_millis(u64::from(keep_alive) * 1500)),
            last_read: Instant::now(),
            will: connect.will.map(Box::new),
            window,
            client_max_packet,
            max_packet,
            aliases: None,
            alias_max_in,
            aliases_out,
            receive_maximum: our_receive_maximum,
            pending_inbound: 0,
            problem_info,
            auth: auth.map(|method| {
                Box::new(AuthContext {
                    method,
                    state: None,
                    step: None,
                })
            }),
            gated: GatedWrites::default(),
            broker,
        }
    }

    /// Runs until the connection ends, then settles the will and the session.
    pub async fn run(mut self: Box<Self>) {
        self.report_keep_alive_deadline();
        if self.session_present {
            self.retransmit_inflight();
        }
        let close = self.serve().await;
        // Boxed, like the handshake: needed once, at the end, so it should not widen the
        // future held while the connection lives.
        Box::pin(self.finish(close)).await;
    }

    async fn serve(&mut self) -> Close {
        let session = Arc::clone(&self.session);
        loop {
            // Created before the checks below, so a wake-up that lands between a check and
            // the select is not lost (`Session::notified`).
            let woken = std::pin::pin!(session.notified());
            let now = Instant::now();
            if let Some(close) = self.check_standing(now) {
                return close;
            }
            if !self.fill_from_session(now) {
                return Close::TakenOver; // MQTT-3.1.4-2
            }
            self.io.release_write_buffer();
            match self.next_wake(woken).await {
                Wake::Durable(Ok(())) => {
                    self.gated.release_front();
                    self.release_gated();
                }
                Wake::Durable(Err(error)) => {
                    tracing::error!(client = %self.session.client_id, %error, "durable store failed; closing without acknowledging");
                    return Close::Violation(ReasonCode::UNSPECIFIED_ERROR, error.to_string());
                }
                Wake::Verdict(verdict) => {
                    if let Some(auth) = self.auth.as_deref_mut() {
                        auth.step = None;
                    }
                    if let Err(close) = self.on_auth_verdict(verdict) {
                        return close;
                    }
                }
                Wake::Io(IoEvent::Written(Ok(0) | Err(_)) | IoEvent::Read(Ok(0) | Err(_))) => {
                    return Close::Lost
                }
                Wake::Io(IoEvent::Written(Ok(n))) => {
                    self.broker.metrics.bytes_sent.increment(n as u64);
                }
                Wake::Io(IoEvent::Read(Ok(n))) => {
                    self.broker.metrics.bytes_received.increment(n as u64);
                    self.last_read = Instant::now();
                    let processed = self.process_input();
                    self.io.release_read_buffer();
                    if let Err(close) = processed {
                        return close;
                    }
                }
                Wake::Session => self.report_keep_alive_deadline(),
            }
        }
    }

    /// Waits for the next thing to do, in priority order: a commit the front gated write waits
    /// for, an authentication verdict, socket I/O (writes first, reads only while neither the
    /// write batch nor the gated writes are over their bounds), a session wake-up.
    ///
    /// One hand-written poll instead of `select!` over async helpers: this future is what
    /// every idle connection holds, and it is a few references plus `woken`.
    fn next_wake<'a, 'n: 'a>(
        &'a mut self,
        mut woken: Pin<&'a mut Notified<'n>>,
    ) -> impl Future<Output = Wake> + use<'a, 'n, S> {
        std::future::poll_fn(move |cx| {
            if self.gated.waiting() {
                if let Poll::Ready(r) = self.gated.poll_front_durable(cx) {
                    return Poll::Ready(Wake::Durable(r));
                }
            }
            if let Some(step) = self.auth.as_deref_mut().and_then(|a| a.step.as_mut()) {
                if let Poll::Ready(verdict) = step.as_mut().poll(cx) {
                    return Poll::Ready(Wake::Verdict(verdict));
                }
            }
            let can_write = !self.io.wbuf.is_empty();
            let can_read =
                self.io.wbuf.len() < WRITE_HIGH_WATER && self.gated.len() < MAX_GATED_WRITES;
            if can_write || can_read {
                if let Poll::Ready(event) = self.io.poll_event(cx, true, can_read) {
                    return Poll::Ready(Wake::Io(event));
                }
            }
            match woken.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Wake::Session),
                Poll::Pending => Poll::Pending,
            }
        })
    }

    /// Why the connection must close now, if it must: the server is stopping, or no packet
    /// arrived within 1.5 × keep-alive (MQTT-3.1.2-24). Takeover is checked under the session
    /// lock in [`Client::fill_from_session`].
    fn check_standing(&self, now: Instant) -> Option<Close> {
        if self.broker.is_shutting_down() {
            return Some(Close::ServerShutdown);
        }
        match self.keep_alive_limit {
            Some(limit) if now >= self.last_read + limit => Some(Close::KeepAliveTimeout),
            _ => None,
        }
    }

    /// Tells the session when this connection's keep-alive runs out, for the broker's sweep.
    /// Reads do not update it (that would cost every packet an atomic store); instead, when the
    /// sweep wakes the connection at a stale deadline, it lands here and moves it on.
    fn report_keep_alive_deadline(&self) {
        let deadline = match self.keep_alive_limit {
            Some(limit) => self.broker.clock_ms(self.last_read + limit),
            None => u64::MAX,
        };
        self.session.set_keep_alive_deadline(deadline);
    }

    /// Decodes and handles every complete packet in the read buffer.
    fn process_input(&mut self) -> Result<(), Close> {
        loop {
            match codec::decode(&mut self.io.rbuf, Some(self.version), self.max_packet) {
                Ok(Some(packet)) => self.handle(packet)?,
                Ok(None) => return Ok(()),
                Err(error) => {
                    self.broker.metrics.malformed_packets.increment(1);
                    return Err(Close::Violation(error.reason_code(), error.to_string()));
                }
            }
        }
    }

    fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(publish) => self.on_publish(publish),
            Packet::PubAck(ack) => {
                self.complete_outbound(ack.packet_id, OutboundStage::AwaitPubAck);
                Ok(())
            }
            Packet::PubRec(rec) => {
                self.on_pubrec(rec);
                Ok(())
            }
            Packet::PubComp(comp) => {
                self.complete_outbound(comp.packet_id, OutboundStage::AwaitPubComp);
                Ok(())
            }
            Packet::PubRel(rel) => {
                self.on_pubrel(rel);
                Ok(())
            }
            Packet::Subscribe(subscribe) => self.on_subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => {
                self.on_unsubscribe(unsubscribe);
                Ok(())
            }
            Packet::PingReq => {
                self.io.queue(&Packet::PingResp, self.version); // MQTT-3.12.4-1
                Ok(())
            }
            Packet::Disconnect(disconnect) => self.on_disconnect(disconnect),
            Packet::Connect(_) => Err(self.violation(
                ReasonCode::PROTOCOL_ERROR,
                "second CONNECT", // MQTT-3.1.0-2
            )),
            Packet::Auth(auth) => self.on_auth(auth),
            other => Err(self.violation(
                ReasonCode::PROTOCOL_ERROR,
                &format!("{} is not sent by clients", other.name()),
            )),
        }
    }

    fn violation(&self, code: ReasonCode, why: &str) -> Close {
        self.broker.metrics.protocol_errors.increment(1);
        Close::Violation(code, why.to_string())
    }

    fn on_publish(&mut self, mut publish: Publish) -> Result<(), Close> {
        let config = self.broker.config();
        self.broker.metrics.messages_received[publish.qos as usize].increment(1);
        if publish.qos as u8 > config.max_qos {
            return Err(self.violation(ReasonCode::QOS_NOT_SUPPORTED, "QoS above maximum"));
            // MQTT-3.2.2-11
        }
        if publish.retain && !config.retain_available {
            return Err(self.violation(ReasonCode::RETAIN_NOT_SUPPORTED, "retain not available"));
            // MQTT-3.2.2-14
        }
        if let Some(alias) = publish.properties.topic_alias {
            self.resolve_alias(alias, &mut publish)?;
        }
        let packet_id = publish.packet_id;
        let qos = publish.qos;
        if qos != QoS::AtMostOnce {
            self.check_receive_maximum(qos, packet_id)?;
        }
        if self.broker.config().validate_utf8_payload
            && publish.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&publish.payload).is_err()
        {
            let why = "payload is not valid UTF-8 (Payload Format Indicator 1)";
            return self.refuse_publish(qos, packet_id, ReasonCode::PAYLOAD_FORMAT_INVALID, why);
        }
        if qos == QoS::AtLeastOnce {
            // Counted until its PUBACK is written (`write_gated`), which may wait for the store.
            self.pending_inbound += 1;
        }
        // QoS 2: a packet id already awaiting PUBREL is a re-send; acknowledge it again but do
        // not route it again (MQTT-4.3.3-10). `stored`: the id must survive a restart too.
        let (route, stored) = {
            let mut st = self.session.lock();
            let fresh = qos != QoS::ExactlyOnce || st.inbound_qos2.insert(packet_id);
            (fresh, st.stored)
        };
        let mut durable = None;
        if route {
            let message = Arc::new(Message::from_publish(publish, Some(self.session.id)));
            let inbound =
                (qos == QoS::ExactlyOnce && stored).then_some((&self.session.client_id, packet_id));
            match self.broker.publish(message, inbound) {
                Ok(routed) => durable = routed.durable,
                Err(error) => return self.refuse_unstored(qos, packet_id, error),
            }
        }
        let kind = match qos {
            QoS::AtMostOnce => return Ok(()),
            QoS::AtLeastOnce => AckKind::Ack, // MQTT-4.3.2-2
            QoS::ExactlyOnce => AckKind::Rec, // MQTT-4.3.3-8
        };
        // Acknowledged only once the store holds the message (the durability promise).
        self.send_gated(durable, Gated::Ack(kind, PubResponse::new(packet_id)));
        Ok(())
    }

    /// Refuses more unacknowledged inbound QoS 1/2 PUBLISHes than our Receive Maximum
    /// (the client's duty, MQTT-3.3.4-7) with DISCONNECT 0x93. A QoS 2 retransmission of an id
    /// awaiting PUBREL is not a new PUBLISH and passes.
    fn check_receive_maximum(&self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        let unacked = {
            let st = self.session.lock();
            if qos == QoS::ExactlyOnce && st.inbound_qos2.contains(&packet_id) {
                return Ok(());
            }
            st.inbound_qos2.len() + self.pending_inbound
        };
        if unacked >= self.receive_maximum {
            return Err(self.violation(
                ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
                "more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum",
            ));
        }
        Ok(())
    }

    /// Answers a PUBLISH the broker will not route: PUBACK / PUBREC with `code` for QoS 1/2
    /// (a QoS 2 id refused this way is not remembered, MQTT-4.3.3-9), DISCONNECT for QoS 0.
    fn refuse_publish(
        &mut self,
        qos: QoS,
        packet_id: u16,
        code: ReasonCode,
        why: &str,
    ) -> Result<(), Close> {
        let mut ack = PubResponse::new(packet_id);
        ack.reason_code = code;
        ack.properties.reason_string = self.problem_string(why);
        let kind = match qos {
            QoS::AtMostOnce => return Err(self.violation(code, why)),
            QoS::AtLeastOnce => {
                self.pending_inbound += 1; // balanced when the PUBACK is written
                AckKind::Ack
            }
            QoS::ExactlyOnce => AckKind::Rec,
        };
        self.send_gated(None, Gated::Ack(kind, ack));
        Ok(())
    }

    /// The store refused a PUBLISH (disk budget, writer backlog, I/O failure): it was not
    /// accepted, so it must not be acknowledged as if it were. v5 says why in the ack (0x97
    /// quota exceeded, 0x80 unspecified); 3.x has no negative ack, so the connection closes and
    /// the client re-sends after reconnecting.
    fn refuse_unstored(
        &mut self,
        qos: QoS,
        packet_id: u16,
        error: StorageError,
    ) -> Result<(), Close> {
        match qos {
            QoS::AtMostOnce => return Ok(()),
            QoS::AtLeastOnce => self.pending_inbound = self.pending_inbound.saturating_sub(1),
            QoS::ExactlyOnce => {
                self.session.lock().inbound_qos2.remove(&packet_id);
            }
        }
        let code = match error {
            StorageError::QueueFull { .. } | StorageError::DiskBudgetExceeded { .. } => {
                ReasonCode::QUOTA_EXCEEDED
            }
            _ => ReasonCode::UNSPECIFIED_ERROR,
        };
        if !self.version.is_v5() {
            return Err(Close::Violation(code, error.to_string()));
        }
        self.refuse_publish(qos, packet_id, code, &error.to_string())
    }

    /// Writes now, or behind the writes that wait for the store.
    fn send_gated(&mut self, durable: Option<Durable>, item: Gated) {
        if durable.is_none() && self.gated.is_empty() {
            self.write_gated(item);
        } else {
            self.gated.push(durable, item);
        }
    }

    /// Writes every gated item that no longer waits.
    fn release_gated(&mut self) {
        while let Some(item) = self.gated.pop_ready() {
            self.write_gated(item);
        }
    }

    fn write_gated(&mut self, item: Gated) {
        match item {
            Gated::Ack(kind, ack) => {
                if kind == AckKind::Ack {
                    // The PUBLISH it answers stops counting against Receive Maximum.
                    self.pending_inbound = self.pending_inbound.saturating_sub(1);
                }
                self.io
                    .queue_within(&kind.packet(ack), self.version, self.client_max_packet)
            }
            Gated::Encoded(bytes) => self.io.wbuf.extend_from_slice(&bytes),
        }
    }

    /// `why` as a Reason String, if the client accepts problem information (MQTT-3.1.2-29).
    fn problem_string(&self, why: &str) -> Option<ByteString> {
        self.problem_info.then(|| ByteString::from(why.to_owned()))
    }

    /// Inbound topic aliases (v5 §3.3.2.3.4): set on first use, substituted afterwards.
    fn resolve_alias(&mut self, alias: u16, publish: &mut Publish) -> Result<(), Close> {
        if alias == 0 || alias > self.alias_max_in {
            // The client broke MQTT-3.3.2-9 (or sent 0, MQTT-3.3.2-8).
            return Err(self.violation(ReasonCode::TOPIC_ALIAS_INVALID, "topic alias out of range"));
        }
        if publish.topic.is_empty() {
            match self.aliases.as_deref().and_then(|a| a.get(&alias)) {
                Some(topic) => publish.topic = topic.clone(),
                None => {
                    return Err(self.violation(ReasonCode::PROTOCOL_ERROR, "unknown topic alias"))
                }
            }
        } else {
            // A copy, so a long-lived alias does not pin the read buffer the topic came in.
            let topic = ByteString::from(publish.topic.to_string());
            self.aliases
                .get_or_insert_with(Box::default)
                .insert(alias, topic);
        }
        Ok(())
    }

    fn on_pubrec(&mut self, rec: PubResponse) {
        let packet_id = rec.packet_id;
        let mut st = self.session.lock();
        let (durable, send_rel) =
            if let Some(i) = st.find_inflight(packet_id, OutboundStage::AwaitPubRec) {
                let seq = st.inflight.get(i).and_then(|f| f.delivery.seq);
                if rec.reason_code.is_error() {
                    st.inflight.remove(i); // the receiver refused it: done (v5 §4.3.3)
                    drop(st);
                    self.persist_entry(seq, None);
                    return;
                }
                if let Some(entry) = st.inflight.get_mut(i) {
                    entry.stage = OutboundStage::AwaitPubComp;
                }
                drop(st);
                // PUBREL only once the new stage is stored: a crash must not re-send the PUBLISH
                // after the receiver has released the id (MQTT-4.3.3-4 / exactly once).
                (
                    self.persist_entry(seq, Some((OutboundStage::AwaitPubComp, packet_id))),
                    true,
                )
            } else {
                let known = st
                    .find_inflight(packet_id, OutboundStage::AwaitPubComp)
                    .is_some();
                drop(st);
                (None, known)
            };
        let mut rel = PubResponse::new(packet_id);
        if !send_rel {
            rel.reason_code = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
        }
        self.send_gated(durable, Gated::Ack(AckKind::Rel, rel));
    }

    /// Records a persisted delivery's new handshake stage, or its removal (`None`).
    fn persist_entry(
        &self,
        seq: Option<u64>,
        stage: Option<(OutboundStage, u16)>,
    ) -> Option<Durable> {
        let seq = seq?;
        let client_id = self.session.client_id.clone();
        let op = match stage {
            Some((stage, packet_id)) => Op::UpdateEntry {
                client_id,
                seq,
                stage: crate::broker::entry_stage(stage, packet_id),
            },
            None => Op::RemoveEntry { client_id, seq },
        };
        self.broker.persist(vec![op])
    }

    fn on_pubrel(&mut self, rel: PubResponse) {
        let (known, stored) = {
            let mut st = self.session.lock();
            (st.inbound_qos2.remove(&rel.packet_id), st.stored)
        };
        let mut comp = PubResponse::new(rel.packet_id);
        let mut durable = None;
        if !known {
            comp.reason_code = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
        } else if stored {
            // PUBCOMP only once the release is stored, or the client's next use of this id
            // would look like a duplicate after a crash and be dropped.
            durable = self.broker.persist(vec![Op::RemoveInboundQos2 {
                client_id: self.session.client_id.clone(),
                packet_id: rel.packet_id,
            }]);
        }
        self.send_gated(durable, Gated::Ack(AckKind::Comp, comp)); // MQTT-4.3.3-11
    }

    /// PUBACK or PUBCOMP: the outbound message is done and its packet id is free again.
    fn complete_outbound(&mut self, packet_id: u16, stage: OutboundStage) {
        let removed = {
            let mut st = self.session.lock();
            st.find_inflight(packet_id, stage)
                .and_then(|i| st.inflight.remove(i))
        };
        if let Some(done) = removed {
            self.persist_entry(done.delivery.seq, None);
        }
    }

    fn on_subscribe(&mut self, subscribe: Subscribe) -> Result<(), Close> {
        let max_qos = self.broker.max_qos();
        let config = self.broker.config();
        let (wildcards_ok, ids_ok, shared_ok) = (
            config.wildcard_subscription_available,
            config.subscription_identifier_available,
            config.shared_subscription_available,
        );
        if subscribe
            .filters
            .iter()
            .any(|(f, o)| o.no_local && matches!(topic::split_shared(f), Some(Ok(_))))
        {
            // MQTT-3.8.3-4
            return Err(self.violation(
                ReasonCode::PROTOCOL_ERROR,
                "No Local on a shared subscription",
            ));
        }
        let ids_refused = subscribe.subscription_identifier.is_some() && !ids_ok;
        let mut reason_codes = Vec::with_capacity(subscribe.filters.len());
        let mut retained: SmallVec<[(ByteString, SubscriptionOptions); 4]> = SmallVec::new();
        let mut problem: Option<&'static str> = None;
        for (filter, options) in subscribe.filters {
            let shared = topic::split_shared(&filter);
            let inner = match shared {
                Some(Ok((_, inner))) => inner,
                _ => &filter[..],
            };
            let refusal = if ids_refused {
                Some((
                    ReasonCode::SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                    "subscription identifiers are not available",
                ))
            } else if matches!(shared, Some(Err(()))) || !topic::is_valid_filter(&filter) {
                // 3.x: 0x80 (MQTT-3.8.4-5 style failure)
                Some((ReasonCode::TOPIC_FILTER_INVALID, "invalid topic filter"))
            } else if shared.is_some() && !shared_ok {
                Some((
                    ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
                    "shared subscriptions are not available",
                ))
            } else if !wildcards_ok && topic::has_wildcards(inner) {
                Some((
                    ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
                    "wildcard subscriptions are not available",
                ))
            } else {
                None
            };
            let code = if let Some((code, why)) = refusal {
                problem.get_or_insert(why);
                code
            } else {
                let options = SubscriptionOptions {
                    qos: options.qos.min(max_qos), // MQTT-3.9.3-? granted ≤ requested
                    ..options
                };
                let existed = self.broker.subscribe(
                    &self.session,
                    &filter,
                    options,
                    subscribe.subscription_identifier,
                );
                // Retain Handling: 0 always, 1 only for a new subscription, 2 never (MQTT-3.3.1-9..11).
                // Retained messages go only to new non-shared subscriptions (v5 §3.3.1.3).
                let send_retained = shared.is_none()
                    && match options.retain_handling {
                        0 => true,
                        1 => !existed,
                        _ => false,
                    };
                if send_retained {
                    retained.push((filter, options));
                }
                ReasonCode(options.qos as u8)
            };
            reason_codes.push(code);
        }
        let mut suback = SubAck {
            packet_id: subscribe.packet_id,
            reason_codes,
            ..Default::default()
        };
        suback.properties.reason_string = problem.and_then(|why| self.problem_string(why));
        // MQTT-3.8.4-1
        self.io.queue_within(
            &Packet::SubAck(suback),
            self.version,
            self.client_max_packet,
        );
        for (filter, options) in retained {
            self.broker.deliver_retained(
                &self.session,
                &filter,
                options,
                subscribe.subscription_identifier,
            );
        }
        Ok(())
    }

    /// AUTH after CONNACK: re-authentication (MQTT 5 §4.12.1). 0x19 starts it with the
    /// connection's method (MQTT-4.12.1-1), 0x18 answers our challenge. Other packets keep
    /// flowing meanwhile.
    fn on_auth(&mut self, packet: Auth) -> Result<(), Close> {
        let started = match self.auth.as_deref_mut() {
            // MQTT-4.12.0-7: no method in CONNECT, so no AUTH.
            None => Err("AUTH without an authentication method"),
            Some(auth) => start_reauth_step(auth, packet, &self.session.client_id),
        };
        started.map_err(|why| self.violation(ReasonCode::PROTOCOL_ERROR, why))
    }

    /// The verdict of a re-authentication step: AUTH 0x00 (done), AUTH 0x18 (another round),
    /// or DISCONNECT (MQTT-4.12.1-2).
    fn on_auth_verdict(&mut self, verdict: AuthStep) -> Result<(), Close> {
        let Some(auth) = self.auth.as_deref_mut() else {
            return Ok(());
        };
        let (reason_code, data) = match verdict {
            AuthStep::Success(data) => (ReasonCode::SUCCESS, data),
            AuthStep::Continue { data, state } => {
                auth.state = Some(state);
                (ReasonCode::CONTINUE_AUTHENTICATION, data)
            }
            AuthStep::Fail(code) => {
                tracing::info!(client = %self.session.client_id, reason = ?code, "re-authentication failed");
                let code = match code.0 {
                    0x80 | 0x83 | 0x87 | 0x89 | 0x97 | 0x9F => code,
                    _ => ReasonCode::NOT_AUTHORIZED,
                };
                return Err(Close::Violation(
                    code,
                    "re-authentication failed".to_owned(),
                ));
            }
        };
        let packet = Packet::Auth(Auth {
            reason_code,
            properties: AuthProperties {
                authentication_method: Some(auth.method.method.clone()), // MQTT-4.12.0-5
                authentication_data: data,
                ..Default::default()
            },
        });
        self.io
            .queue_within(&packet, self.version, self.client_max_packet);
        Ok(())
    }

    fn on_unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let reason_codes = unsubscribe
            .filters
            .iter()
            .map(|filter| {
                if self.broker.unsubscribe(&self.session, filter) {
                    ReasonCode::SUCCESS
                } else {
                    ReasonCode::NO_SUBSCRIPTION_EXISTED
                }
            })
            .collect();
        let unsuback = UnsubAck {
            packet_id: unsubscribe.packet_id,
            reason_codes,
            ..Default::default()
        };
        self.io.queue(&Packet::UnsubAck(unsuback), self.version); // MQTT-3.10.4-4
    }

    fn on_disconnect(&mut self, disconnect: Disconnect) -> Result<(), Close> {
        if let Some(expiry) = disconnect.properties.session_expiry_interval {
            let mut st = self.session.lock();
            if st.expiry_interval == 0 && expiry != 0 {
                drop(st);
                // MQTT-3.14.2-2: a session opened with expiry 0 cannot be extended at DISCONNECT.
                return Err(
                    self.violation(ReasonCode::PROTOCOL_ERROR, "session expiry raised from 0")
                );
            }
            st.expiry_interval = expiry.min(self.broker.config().session_expiry_interval_max);
        }
        Err(Close::ClientDisconnect(disconnect.reason_code))
    }

    /// Moves queued deliveries into the write buffer while the window and buffer allow.
    /// QoS 0 passes freely; QoS 1/2 waits for a free inflight slot, preserving order (MQTT-4.6.0-6).
    ///
    /// Persisted deliveries record their new stage in the store. A QoS 2 PUBLISH is held back
    /// until that record is durable (otherwise a crash could re-send it under a new packet id:
    /// a duplicate), and so is everything after it, to keep the order.
    ///
    /// Returns false if this connection no longer owns the session (taken over).
    fn fill_from_session(&mut self, now: Instant) -> bool {
        if self.io.wbuf.len() >= WRITE_HIGH_WATER || self.gated.len() >= MAX_HELD_BATCHES {
            // The socket, or the store, is behind: leave the rest in the session's bounded
            // queue rather than piling encoded batches up here.
            return self.session.lock().is_owned_by(self.generation);
        }
        let session = Arc::clone(&self.session);
        let mut ops: Vec<Op> = Vec::new();
        let mut held = BytesMut::new();
        let mut hold = !self.gated.is_empty();
        let mut gate_on_ops = false;
        // Deliveries written per QoS, added to the metrics once per batch.
        let mut sent = [0u64; 3];
        {
            let mut st = session.lock();
            if !st.is_owned_by(self.generation) {
                return false;
            }
            while self.io.wbuf.len() + held.len() < WRITE_HIGH_WATER {
                let Some(front) = st.queue.front() else { break };
                if front.qos != QoS::AtMostOnce && st.inflight.len() >= self.window {
                    break;
                }
                let Some(delivery) = st.pop() else { break };
                if delivery.message.is_expired(now) {
                    if let Some(seq) = delivery.seq {
                        ops.push(Op::RemoveEntry {
                            client_id: session.client_id.clone(),
                            seq,
                        });
                    }
                    continue; // MQTT-3.3.2-5
                }
                let packet_id = match delivery.qos {
                    QoS::AtMostOnce => 0,
                    _ => match st.allocate_packet_id() {
                        Some(id) => id,
                        None => break,
                    },
                };
                let stage = match delivery.qos {
                    QoS::AtMostOnce => None,
                    QoS::AtLeastOnce => Some(OutboundStage::AwaitPubAck),
                    QoS::ExactlyOnce => Some(OutboundStage::AwaitPubRec),
                };
                if let (Some(seq), Some(stage)) = (delivery.seq, stage) {
                    ops.push(Op::UpdateEntry {
                        client_id: session.client_id.clone(),
                        seq,
                        stage: crate::broker::entry_stage(stage, packet_id),
                    });
                    if delivery.qos == QoS::ExactlyOnce {
                        hold = true;
                        gate_on_ops = true;
                    }
                }
                let out = if hold { &mut held } else { &mut self.io.wbuf };
                let written = encode_delivery(
                    out,
                    self.version,
                    self.client_max_packet,
                    self.aliases_out.as_deref_mut(),
                    &self.broker,
                    &delivery,
                    packet_id,
                    false,
                );
                if written {
                    sent[delivery.qos as usize] += 1;
                }
                if let (true, Some(stage)) = (written, stage) {
                    st.inflight.push_back(Inflight {
                        packet_id,
                        delivery,
                        stage,
                    });
                }
            }
        }
        for (qos, n) in sent.into_iter().enumerate() {
            if n > 0 {
                self.broker.metrics.messages_sent[qos].increment(n);
            }
        }
        let durable = self.broker.persist(ops);
        if !held.is_empty() {
            let gate = if gate_on_ops { durable } else { None };
            self.send_gated_behind(gate, Gated::Encoded(held.freeze()));
        }
        true
    }

    /// Queues a write behind any waiting ones, even when it has nothing to wait for itself.
    fn send_gated_behind(&mut self, durable: Option<Durable>, item: Gated) {
        if durable.is_none() && self.gated.is_empty() {
            self.write_gated(item);
        } else {
            self.gated.push(durable, item);
        }
    }

    /// Encodes one delivery into the write buffer; false if it could not be sent at all.
    fn write_delivery(&mut self, delivery: &Delivery, packet_id: u16, dup: bool) -> bool {
        let written = encode_delivery(
            &mut self.io.wbuf,
            self.version,
            self.client_max_packet,
            self.aliases_out.as_deref_mut(),
            &self.broker,
            delivery,
            packet_id,
            dup,
        );
        if written {
            self.broker.metrics.messages_sent[delivery.qos as usize].increment(1);
        }
        written
    }

    /// On a resumed session, resend every unacknowledged PUBLISH with DUP=1 and every
    /// pending PUBREL, in their original order (MQTT-4.4.0-1, MQTT-3.3.1-1).
    fn retransmit_inflight(&mut self) {
        let pending: Vec<(u16, OutboundStage, Delivery)> = {
            let st = self.session.lock();
            st.inflight
                .iter()
                .map(|f| (f.packet_id, f.stage, f.delivery.clone()))
                .collect()
        };
        for (packet_id, stage, delivery) in pending {
            match stage {
                OutboundStage::AwaitPubComp => self
                    .io
                    .queue(&Packet::PubRel(PubResponse::new(packet_id)), self.version),
                _ => {
                    self.write_delivery(&delivery, packet_id, true);
                }
            }
        }
    }

    /// Sends the closing DISCONNECT (v5), publishes the will if due, releases the session.
    async fn finish(mut self: Box<Self>, close: Close) {
        let v5 = self.version.is_v5();
        let (server_reason, publish_will) = match &close {
            Close::ClientDisconnect(code) => (None, *code == ReasonCode::DISCONNECT_WITH_WILL),
            Close::Lost => (None, true),
            Close::Violation(code, why) => {
                tracing::info!(peer = %self.peer, client = %self.session.client_id, reason = ?code, %why, "closing connection");
                (Some(*code), true)
            }
            Close::KeepAliveTimeout => {
                self.broker.metrics.keepalive_timeouts.increment(1);
                (Some(ReasonCode::KEEP_ALIVE_TIMEOUT), true)
            }
            Close::TakenOver => (Some(ReasonCode::SESSION_TAKEN_OVER), true),
            Close::ServerShutdown => (Some(ReasonCode::SERVER_SHUTTING_DOWN), false),
        };
        if let (true, Some(code)) = (v5, server_reason) {
            // v5 lets the server say why (MQTT-3.14.0-1: only after CONNACK, which we sent).
            let why = match &close {
                Close::Violation(_, why) => self.problem_string(why),
                _ => None,
            };
            let disconnect = Disconnect {
                reason_code: code,
                properties: DisconnectProperties {
                    reason_string: why,
                    ..Default::default()
                },
            };
            self.io.queue_within(
                &Packet::Disconnect(disconnect),
                self.version,
                self.client_max_packet,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            self.io.flush().await?;
            self.io.stream.shutdown().await
        })
        .await;
        if publish_will {
            if let Some(will) = self.will.take().map(|will| *will) {
                match will.properties.will_delay_interval.filter(|d| v5 && *d > 0) {
                    // Held until the delay passes or the session ends (MQTT-3.1.2-8).
                    Some(delay) => {
                        self.broker
                            .defer_will(&self.session, self.generation, will, delay)
                    }
                    None => self.broker.publish_will(will),
                }
            }
        }
        self.broker.disconnect(&self.session, self.generation);
        tracing::debug!(peer = %self.peer, client = %self.session.client_id, ?close, "disconnected");
    }
}

/// Starts the next step of a re-authentication for an AUTH packet: 0x19 starts one with the
/// connection's method (MQTT-4.12.1-1), 0x18 answers our challenge. The error is why the
/// packet breaks the protocol.
fn start_reauth_step(
    auth: &mut AuthContext,
    packet: Auth,
    client_id: &ByteString,
) -> Result<(), &'static str> {
    if packet.properties.authentication_method.as_ref() != Some(&auth.method.method) {
        return Err("AUTH with another authentication method");
    }
    if auth.step.is_some() {
        return Err("AUTH before the previous one was answered");
    }
    let input = match (packet.reason_code, auth.state.take()) {
        (ReasonCode::RE_AUTHENTICATE, None) => StepInput::Start(client_id.to_string()),
        (ReasonCode::CONTINUE_AUTHENTICATION, Some(state)) => StepInput::Continue(state),
        _ => return Err("AUTH reason code out of sequence"),
    };
    auth.step = Some(auth::run_step(
        Arc::clone(&auth.method.authenticator),
        input,
        packet.properties.authentication_data,
    ));
    Ok(())
}

/// Encodes one delivery into `out` for a client of `version`; false if it could not be sent
/// at all (above the client's Maximum Packet Size, MQTT-3.1.2-25, or unencodable). With
/// outbound topic aliases, only a PUBLISH that is actually written changes the alias table.
#[allow(clippy::too_many_arguments)]
fn encode_delivery(
    out: &mut BytesMut,
    version: ProtocolVersion,
    client_max_packet: usize,
    aliases_out: Option<&mut OutboundAliases>,
    broker: &Broker,
    delivery: &Delivery,
    packet_id: u16,
    dup: bool,
) -> bool {
    let start = out.len();
    let alias = aliases_out
        .as_ref()
        .map(|table| table.choose(&delivery.message.topic));
    let flags = DeliveryFlags {
        qos: delivery.qos,
        retain: delivery.retain,
        dup,
        packet_id,
        subscription_ids: &delivery.subscription_ids,
        topic_alias: alias.map(|choice| OutboundAlias {
            alias: choice.alias(),
            with_topic: choice.sends_topic(),
        }),
    };
    match delivery.message.write_to(out, version, flags) {
        Ok(len) if len <= client_max_packet => {
            if let (Some(table), Some(choice)) = (aliases_out, alias) {
                table.commit(&delivery.message.topic, choice);
            }
            true
        }
        Ok(_) => {
            out.truncate(start);
            broker.metrics.messages_dropped_too_large.increment(1);
            false
        }
        Err(error) => {
            out.truncate(start);
            tracing::warn!(%error, "cannot encode delivery");
            false
        }
    }
}
