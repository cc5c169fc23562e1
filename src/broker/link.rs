//! An in-process client of the broker: a session driven without a socket.
//!
//! A [`Link`] connects a session, subscribes, publishes, receives deliveries and acknowledges
//! them through the same [`SessionHandle`] API a client connection uses, so queue limits,
//! persistence, retained messages and delivery metrics apply to it exactly as to a socket
//! client (the per-connection counters — bytes, packets received — are a socket's only). Users:
//! tests of routing and durability, and later the bridge (a durable session per remote broker),
//! the `$SYS` publisher and the cluster layer. It never encodes a packet.
//!
//! Must not: encode packets, bypass the router.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use bytestring::ByteString;
use smallvec::SmallVec;
use thiserror::Error;

use super::message::Delivery;
use super::session::DeliverySink;
use super::{
    AckMismatch, Broker, Fill, Message, PublishRefused, Resend, SessionHandle, SessionRequest,
};
use crate::codec::{topic, ProtocolVersion, Publish, PublishProperties, QoS, SubscriptionOptions};
use crate::storage::StorageError;

/// How a link connects its session.
#[derive(Clone, Debug)]
pub struct LinkOptions {
    /// The session's client id (links share the client id space with connections).
    pub client_id: ByteString,
    /// Discard any existing session first (MQTT-3.1.2-4).
    pub clean_start: bool,
    /// Seconds the session outlives the link; 0 ends it with the link, `u32::MAX` never.
    pub session_expiry: u32,
    /// Most unacknowledged QoS 1/2 deliveries the link holds at once (its Receive Maximum).
    pub receive_maximum: u16,
}

impl LinkOptions {
    /// A persistent session that never expires, with a window of 100 deliveries.
    pub fn persistent(client_id: impl Into<ByteString>) -> LinkOptions {
        LinkOptions {
            client_id: client_id.into(),
            clean_start: false,
            session_expiry: super::NEVER_EXPIRES,
            receive_maximum: 100,
        }
    }
}

/// Why a link operation failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The topic filter breaks MQTT 4.7 (or is a malformed `$share/...` filter).
    #[error("invalid topic filter {0:?}")]
    InvalidFilter(String),
    /// The topic name breaks MQTT 4.7 (wildcards, empty, NUL).
    #[error("invalid topic name {0:?}")]
    InvalidTopic(String),
    /// The durable store refused or failed: nothing was acknowledged.
    #[error("durable store: {0}")]
    Storage(#[from] StorageError),
    /// The message was not published: the store refused it, or a subscriber's queue is full
    /// and `mqtt.queue_overflow = "refuse"`. Nothing was acknowledged.
    #[error("not published: {0}")]
    Refused(#[from] PublishRefused),
    /// [`Link::ack`] of a delivery whose packet id now holds a delivery of another QoS or
    /// stage (a stale [`LinkDelivery`], acknowledged twice): what a socket client would be
    /// disconnected for (a Protocol Error); the session is unchanged.
    #[error("acknowledgement does not fit: {0}")]
    AckMismatch(#[from] AckMismatch),
}

/// One message received by a link, to be acknowledged with [`Link::ack`] (QoS 1/2).
#[derive(Clone, Debug)]
pub struct LinkDelivery {
    /// The packet id this delivery holds in the session's inflight window (0 for QoS 0).
    pub packet_id: u16,
    /// True when it was sent before, to a driver that did not acknowledge it (MQTT-3.3.1-1).
    pub dup: bool,
    /// The delivered QoS: `min(published, granted)`.
    pub qos: QoS,
    /// RETAIN as the subscriber sees it.
    pub retain: bool,
    /// Identifiers of the matching subscriptions (MQTT-3.3.4-4).
    pub subscription_ids: SmallVec<[u32; 1]>,
    /// The message, shared with every other subscriber.
    pub message: Arc<Message>,
}

/// An in-process client attached to one session.
#[derive(Debug)]
pub struct Link {
    handle: SessionHandle,
    session_present: bool,
    window: usize,
    inbox: VecDeque<LinkDelivery>,
    /// Packet ids of this link's own QoS 2 publishes (released at once after routing).
    next_publish_id: u16,
}

/// The sink a link drains its session into.
struct Inbox<'a>(&'a mut VecDeque<LinkDelivery>);

impl DeliverySink for Inbox<'_> {
    fn has_room_for(&self, _next: &Delivery) -> bool {
        true // the inflight window is the bound
    }

    fn write(&mut self, d: &Delivery, packet_id: u16, dup: bool, _after_commit: bool) -> bool {
        self.0.push_back(LinkDelivery {
            packet_id,
            dup,
            qos: d.qos,
            retain: d.retain,
            subscription_ids: d.subscription_ids.clone(),
            message: Arc::clone(&d.message),
        });
        true
    }
}

impl Link {
    /// Connects (or resumes) the session, taking it over from any connection that holds it.
    /// On a resumed session, what was sent and not acknowledged is received again first,
    /// with `dup` set (MQTT-4.4.0-1).
    pub fn connect(broker: &Arc<Broker>, options: LinkOptions) -> Link {
        let (mut link, resends) = Link::connect_driven(broker, options);
        for resend in resends {
            match resend {
                Resend::Publish(delivery, packet_id) => {
                    Inbox(&mut link.inbox).write(&delivery, packet_id, true, false);
                }
                // Our PUBREC was stored: the message was received; finish its handshake.
                // The id awaits PUBCOMP (that is what `Release` means) and nothing else
                // drives the session between the two calls, so it cannot mismatch.
                Resend::Release(packet_id) => {
                    if let Err(mismatch) = link.handle.on_pubcomp(packet_id) {
                        tracing::warn!(%mismatch, "link: resumed PUBREL stage changed");
                    }
                }
            }
        }
        link
    }

    /// Connects (or resumes) the session like [`Link::connect`], but hands what the session
    /// holds unacknowledged to the caller instead of receiving it: a driver that forwards to
    /// another broker (the bridge) re-sends those itself, under the same packet ids, and
    /// finishes a PUBREL stage only when that broker answers.
    pub fn connect_driven(broker: &Arc<Broker>, options: LinkOptions) -> (Link, Vec<Resend>) {
        let attached = broker.connect(SessionRequest {
            client_id: options.client_id,
            clean_start: options.clean_start,
            expiry_interval: options.session_expiry,
            protocol: ProtocolVersion::V5,
            client_max_packet: 0,
        });
        let link = Link {
            handle: attached.handle,
            session_present: attached.session_present,
            window: usize::from(options.receive_maximum.max(1)),
            inbox: VecDeque::new(),
            next_publish_id: 0,
        };
        let resends = if link.session_present {
            link.handle.retransmissions()
        } else {
            Vec::new()
        };
        (link, resends)
    }

    /// True if the session existed before this link connected.
    pub fn session_present(&self) -> bool {
        self.session_present
    }

    /// The session handle, for what the link has no shorthand for.
    pub fn handle(&self) -> &SessionHandle {
        &self.handle
    }

    /// Subscribes with `qos` (capped by the broker's maximum) and default options, and queues
    /// the matching retained messages (MQTT-3.3.1-9). Returns whether it replaced one.
    ///
    /// # Errors
    ///
    /// `LinkError::InvalidFilter` for a filter MQTT 4.7 does not allow, or a malformed
    /// `$share/...` filter.
    pub fn subscribe(&self, filter: &str, qos: QoS) -> Result<bool, LinkError> {
        if !topic::is_valid_filter(filter) || matches!(topic::split_shared(filter), Some(Err(()))) {
            return Err(LinkError::InvalidFilter(filter.to_owned()));
        }
        let options = SubscriptionOptions {
            qos: qos.min(self.handle.broker().max_qos()),
            ..SubscriptionOptions::default()
        };
        let filter = ByteString::from(filter);
        let existed = self.handle.subscribe(&filter, options, None);
        if topic::split_shared(&filter).is_none() {
            self.handle.deliver_retained(&filter, options, None);
        }
        Ok(existed)
    }

    /// Removes a subscription; true if it existed.
    pub fn unsubscribe(&self, filter: &str) -> bool {
        self.handle.unsubscribe(filter)
    }

    /// Waits until `target`, which the last publish filled past its bound, has room again,
    /// stalls or goes away (`broker::flow`); counted as a paused publisher meanwhile. Public
    /// for drivers that publish through [`Link::handle`] (the bridge's inbound side).
    pub async fn wait_for_room(&self, target: &super::Session) {
        /// Counts the pause as ended however the wait ends (also when its future is dropped).
        struct Paused<'a>(&'a super::FlowControl, Instant);
        impl Drop for Paused<'_> {
            fn drop(&mut self) {
                let micros = u64::try_from(self.1.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.0.pause_ended(micros);
            }
        }
        let broker = Arc::clone(self.handle.broker());
        let flow = broker.flow();
        flow.pause_started();
        let _paused = Paused(flow, Instant::now());
        loop {
            // Before the check, so a wake-up in between is not lost.
            let room = Arc::clone(flow.room()).notified_owned();
            let now = Instant::now();
            let Err(deadline_ms) = self.handle.may_resume(target, now) else {
                break;
            };
            let wait = deadline_ms.saturating_sub(broker.clock_ms(now));
            let _ = tokio::time::timeout(std::time::Duration::from_millis(wait), room).await;
        }
    }

    /// Publishes and returns once the broker has accepted it as a PUBACK / PUBCOMP would
    /// promise: queued for every subscriber and, where the store is involved, durable.
    ///
    /// # Errors
    ///
    /// `LinkError::InvalidTopic` for a topic name MQTT 4.7 does not allow; `LinkError::Storage`
    /// when the durable store refuses or fails, and the message must not count as accepted.
    pub async fn publish(
        &mut self,
        topic_name: &str,
        payload: impl Into<Bytes>,
        qos: QoS,
        retain: bool,
    ) -> Result<(), LinkError> {
        if topic::topic_name_error(topic_name).is_some() {
            return Err(LinkError::InvalidTopic(topic_name.to_owned()));
        }
        let packet_id = match qos {
            QoS::AtMostOnce => 0,
            _ => {
                self.next_publish_id = self.next_publish_id.wrapping_add(1).max(1);
                self.next_publish_id
            }
        };
        let publish = Publish {
            dup: false,
            qos,
            retain,
            topic: ByteString::from(topic_name),
            packet_id,
            payload: payload.into(),
            properties: PublishProperties::default(),
        };
        let published = self.handle.publish(publish)?;
        if let Some(target) = published.pressure {
            // Back-pressure, as a connection gets it: no next publish until there is room.
            self.wait_for_room(&target).await;
        }
        if let Some(gate) = published.answer.gate {
            gate.await?;
        }
        if qos == QoS::ExactlyOnce {
            if let Some(gate) = self.handle.on_pubrel(packet_id).gate {
                gate.await?;
            }
        }
        Ok(())
    }

    /// The next delivery, waiting for one. `None` once the session was taken over or the
    /// broker is stopping. QoS 1/2 deliveries stay in the session's inflight window until
    /// [`Link::ack`]; at most `receive_maximum` are handed out unacknowledged.
    ///
    /// # Errors
    ///
    /// `LinkError::Storage` when the store fails while a delivery's new stage is being stored.
    pub async fn recv(&mut self) -> Result<Option<LinkDelivery>, LinkError> {
        loop {
            if let Some(delivery) = self.inbox.pop_front() {
                return Ok(Some(delivery));
            }
            let session = Arc::clone(self.handle.session());
            let mut woken = std::pin::pin!(session.notified());
            woken.as_mut().enable();
            if self.handle.broker().is_shutting_down() {
                return Ok(None);
            }
            match self.fill() {
                Fill::TakenOver => return Ok(None),
                Fill::Filled { gate } => {
                    // Deliveries whose stage is being stored are handed out only once it is.
                    if let Some(gate) = gate {
                        gate.await?;
                    }
                }
            }
            if self.inbox.is_empty() {
                woken.await;
            }
        }
    }

    /// A delivery if one is ready now, without waiting.
    pub fn try_recv(&mut self) -> Option<LinkDelivery> {
        if self.inbox.is_empty() {
            // Without waiting, a delivery whose stage is still being stored is handed out
            // anyway: the in-process receiver cannot lose it in a crash the store survives.
            let _ = self.fill();
        }
        self.inbox.pop_front()
    }

    fn fill(&mut self) -> Fill {
        let mut inbox = Inbox(&mut self.inbox);
        self.handle.fill(self.window, Instant::now(), &mut inbox)
    }

    /// Acknowledges a delivery: PUBACK for QoS 1; PUBREC, then PUBCOMP once the PUBREC's
    /// stage is stored, for QoS 2. Frees its slot in the window. The kind follows the
    /// delivery's QoS, as a client's must (MQTT-4.3.2-4, MQTT-4.3.3-8); acknowledging a
    /// delivery that is no longer in flight does nothing, as for a socket client.
    ///
    /// # Errors
    ///
    /// `LinkError::Storage` when the store fails before the PUBREC's stage is durable;
    /// `LinkError::AckMismatch` when the packet id now belongs to another delivery whose
    /// stage this ack does not fit (a stale `delivery`, acknowledged after its id was reused).
    pub async fn ack(&mut self, delivery: &LinkDelivery) -> Result<(), LinkError> {
        match delivery.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self
                .handle
                .on_puback(delivery.packet_id, crate::codec::ReasonCode::SUCCESS)?,
            QoS::ExactlyOnce => {
                if let Some(answer) = self
                    .handle
                    .on_pubrec(delivery.packet_id, crate::codec::ReasonCode::SUCCESS)?
                {
                    if let Some(gate) = answer.gate {
                        gate.await?;
                    }
                    self.handle.on_pubcomp(delivery.packet_id)?;
                }
            }
        }
        Ok(())
    }

    /// Detaches from the session, which then lives on for its expiry interval.
    pub fn disconnect(self) {
        drop(self); // `Drop` detaches
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.handle.detach();
    }
}
