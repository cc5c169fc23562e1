//! An application message as the router holds it: received once, shared by every subscriber.
//!
//! Must not: write bytes itself (asks `codec::publish_cache`).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use smallvec::SmallVec;

use super::stranger_share::StrangerShare;
use crate::codec::{
    self, LastWill, ProtocolVersion, Publish, PublishBody, PublishEncodings, PublishFlags,
    PublishHeader, PublishProperties, QoS,
};

/// [`Message`]'s mark: charged to the anonymous share for as long as it lives
/// ([`Message::charge_anonymous`]): a dead letter an anonymous client caused.
const CHARGED_ANONYMOUS: u8 = 1;
/// [`Message`]'s mark: [`Message::published_anonymously`].
const PUBLISHED_ANONYMOUSLY: u8 = 2;
/// Where [`Message`]'s marks keep its stranger's share ([`StrangerShare::slot`], six bits).
const SHARE_SHIFT: u8 = 2;

/// What an encoding of a message holds beside its topic, payload and properties: the fixed
/// header, lengths and packet id, at most.
const ENCODING_OVERHEAD: u64 = 16;

/// Identifies a session inside this broker process (cheaper than comparing client ids).
pub(crate) type SessionId = u64;

/// One published message. Wrapped in `Arc` and shared by all subscribers and queues; its wire
/// encoding is produced at most once per (protocol family, packet-id presence) and then copied,
/// with only the flags byte and the packet id patched per subscriber (the codec's
/// [`PublishEncodings`]).
#[derive(Debug)]
pub struct Message {
    /// Topic Name it was published to (never an alias: aliases are resolved on receipt).
    pub topic: ByteString,
    /// Application Message payload, shared by every queue holding the message.
    pub payload: Bytes,
    /// QoS the publisher used; subscribers receive `min(this, granted)`.
    pub qos: QoS,
    /// RETAIN flag as published: the message is also the topic's retained message.
    pub retain: bool,
    /// A stranger's retained message with a payload (where a method tells identities
    /// apart): what its store record and cluster frame say, so that it is charged to the
    /// anonymous share again after a restart or on another node. Set only with the charge
    /// ([`Message::set_published_by_stranger`]).
    pub(crate) from_anonymous: bool,
    /// [`CHARGED_ANONYMOUS`], [`PUBLISHED_ANONYMOUSLY`] and the stranger's share
    /// ([`SHARE_SHIFT`]): one byte, in the padding beside the flags above (two more `bool`s
    /// took `Message` past 224 bytes).
    marks: u8,
    /// What the message makes the broker hold, counted in every bound (the memory budget,
    /// queued bytes, the anonymous share): topic, payload and properties
    /// ([`Message::size`]). Fixed at construction: none of them changes after.
    size: u32,
    /// v5 properties to forward (topic alias and subscription ids stripped); `None` when there
    /// are none, as for every 3.x message: 8 bytes instead of 160 in each queued message.
    /// Read through [`Message::properties`].
    properties: Option<Box<HeldProperties>>,
    /// When the message stops being deliverable (Message Expiry Interval).
    pub expires_at: Option<Instant>,
    /// When the broker received it; persisted so expiry survives a restart.
    pub received_at: Instant,
    /// The publishing session, for No Local (read through [`Message::origin`]; session
    /// ids start at 1, so `None` costs no extra word).
    origin: Option<std::num::NonZeroU64>,
    /// Id of the stored body once the durable store holds it (set at most once, so every
    /// session that queues this message refers to one stored copy).
    pub store_id: OnceId,
    /// Its sequence in the cluster's message stream (`[cluster]`), once known: at once for
    /// a message from another node, at JetStream's acknowledgement for one published here;
    /// 0 until then (and always on a single node). Where a session's replay starts when it
    /// moves to another node.
    cluster_seq: std::sync::atomic::AtomicU64,
    /// What the engine that handed this message over waits for (a clustered shared group's
    /// message: JetStream's acknowledgement): settled when the last holder drops the
    /// message, given back by [`Message::give_back`]. `None` for every other message.
    /// Boxed twice so that the slot is one word (`Box<dyn _>` is two).
    settlement: Option<Box<Box<dyn Settlement>>>,
    /// Shared encodings, made by the codec on first use.
    encoded: PublishEncodings,
}

/// A message's receipt to the engine it came from, settled when the message is done with:
/// its `Drop` says "done" (delivered and acknowledged, or dropped and counted), and
/// [`Settlement::give_back`] says "not taken here, hand it to someone else". A message
/// carrying one is not written to the local store: the engine keeps it until settled, so a
/// crash of this node has it delivered again elsewhere rather than lost.
pub trait Settlement: Send + Sync + std::fmt::Debug {
    /// The message was not taken here after all: the engine hands it to another receiver
    /// (soon), and the later drop settles nothing. True when that was done.
    fn give_back(&self) -> bool;
}

/// [`Message::cluster_seq`]'s mark for "sent to JetStream, sequence still to come".
const AWAITED_SEQ: u64 = u64::MAX;

/// What [`Message::properties`] lends when a message has no properties.
static NO_PROPERTIES: PublishProperties = PublishProperties {
    payload_format_indicator: None,
    message_expiry_interval: None,
    topic_alias: None,
    response_topic: None,
    correlation_data: None,
    user_properties: Vec::new(),
    subscription_identifiers: SmallVec::new_const(),
    content_type: None,
};

/// An id set at most once, in 8 bytes (a `OnceLock<u64>` takes 16): the value plus one, 0
/// while unset. Routing sets it once per message, so no two callers race to set it.
#[derive(Debug, Default)]
pub struct OnceId(std::sync::atomic::AtomicU64);

impl OnceId {
    /// The id, set by `init` if it was not yet.
    pub fn get_or_init(&self, init: impl FnOnce() -> u64) -> u64 {
        use std::sync::atomic::Ordering;
        match self.0.load(Ordering::Acquire) {
            0 => {
                let id = init();
                match self.0.compare_exchange(
                    0,
                    id.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => id,
                    Err(current) => current.wrapping_sub(1),
                }
            }
            set => set.wrapping_sub(1),
        }
    }

    /// The id, if set.
    pub fn get(&self) -> Option<u64> {
        match self.0.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            set => Some(set.wrapping_sub(1)),
        }
    }
}

impl From<u64> for OnceId {
    fn from(id: u64) -> OnceId {
        OnceId(std::sync::atomic::AtomicU64::new(id.wrapping_add(1)))
    }
}

/// A message's properties, with those it forwards as they came encoded once when they are
/// large.
#[derive(Debug)]
struct HeldProperties {
    fields: PublishProperties,
    /// The forwarded properties' encoding ([`codec::share_forwarded`]) when it is at least
    /// [`codec::APART`] bytes: `fields`' variable-length fields are views of it, so the
    /// bytes are held once, and every delivery sends them from here rather than copying them
    /// into its connection's write buffer (issue 35, twenty-first adversarial pass, G1).
    forwarded: Option<Bytes>,
}

/// Boxes properties only when there are some, encoding large forwarded ones once. Their
/// size ([`PublishProperties::held_bytes`], counted at least as much as the encoding) is
/// what the message is counted with either way.
fn boxed_properties(mut fields: PublishProperties) -> Option<Box<HeldProperties>> {
    if fields.is_empty() {
        return None;
    }
    let forwarded = (fields.held_bytes() >= codec::APART
        && codec::forwarded_len(&fields).is_ok_and(|len| len >= codec::APART))
    .then(|| codec::share_forwarded(&mut fields).ok())
    .flatten();
    Some(Box::new(HeldProperties { fields, forwarded }))
}

/// What a message of `topic`, `payload` and `properties` holds: see [`Message::size`].
fn held_size(topic: &str, payload: &Bytes, properties: Option<&PublishProperties>) -> u32 {
    let bytes = topic.len() + payload.len() + properties.map_or(0, PublishProperties::held_bytes);
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// [`held_size`] of a message being made, counted in the memory budget (`broker::flow`) as
/// made; its [`Drop`] uncounts the same size.
fn made_size(topic: &str, payload: &Bytes, properties: Option<&HeldProperties>) -> u32 {
    let size = held_size(topic, payload, properties.map(|p| &p.fields));
    super::flow::message_made(size as usize);
    size
}

/// Uncounts the message from the memory budget (`broker::flow`), which counted it when it was
/// made. Its size is fixed at construction, so the two counts match; each cached encoding was
/// counted when it was made ([`Message::write_to`]) and leaves with it.
impl Drop for Message {
    fn drop(&mut self) {
        let encoded = self.encoded.held_bytes();
        super::flow::message_dropped(self.size() + encoded);
        if self.encodings_count_as_anonymous() && encoded > 0 {
            self.stranger_share().counted(encoded, false);
        }
        if self.marks & CHARGED_ANONYMOUS != 0 {
            self.stranger_share().counted(self.size(), false);
        }
    }
}

impl Message {
    /// Builds a routable message from a decoded PUBLISH, taking its topic and payload without copying.
    pub fn from_publish(publish: Publish, origin: Option<SessionId>) -> Message {
        let now = Instant::now();
        let mut properties = publish.properties;
        properties.topic_alias = None;
        properties.subscription_identifiers.clear();
        let expires_at = properties
            .message_expiry_interval
            .map(|secs| now + std::time::Duration::from_secs(u64::from(secs)));
        let properties = boxed_properties(properties);
        let size = made_size(&publish.topic, &publish.payload, properties.as_deref());
        Message {
            topic: publish.topic,
            payload: publish.payload,
            qos: publish.qos,
            retain: publish.retain,
            size,
            properties,
            expires_at,
            received_at: now,
            origin: origin.and_then(std::num::NonZeroU64::new),
            store_id: OnceId::default(),
            cluster_seq: std::sync::atomic::AtomicU64::new(0),
            settlement: None,
            encoded: PublishEncodings::default(),
            from_anonymous: false,
            marks: 0,
        }
    }

    /// Charges the message's bytes to the anonymous share until it is dropped: a dead letter
    /// an anonymous client caused, which waits in the queues of whoever reads dead letters.
    /// Counted in the budget only, an anonymous client's dead letters filled it and password
    /// users got 0x97 (issue 35, twelfth adversarial pass, U4). Once, before it is shared.
    pub(crate) fn charge_anonymous(&mut self) {
        if self.marks & CHARGED_ANONYMOUS == 0 {
            self.stranger_share().counted(self.size(), true);
            self.marks |= CHARGED_ANONYMOUS;
        }
    }

    /// [`Message::charge_anonymous`] to `share` (a bridge's remote's, or anonymous clients').
    pub(crate) fn charge_to(&mut self, share: StrangerShare) {
        if self.marks & CHARGED_ANONYMOUS == 0 {
            self.marks = (self.marks & ((1 << SHARE_SHIFT) - 1)) | (share.slot() << SHARE_SHIFT);
        }
        self.charge_anonymous();
    }

    /// The share a stranger's message is charged to ([`Message::charge_to`]); anonymous
    /// clients' for every other message.
    pub(crate) fn stranger_share(&self) -> StrangerShare {
        StrangerShare::from_slot(self.marks >> SHARE_SHIFT)
    }

    /// Whether the message counts in the anonymous share for its whole life
    /// ([`Message::charge_anonymous`]).
    pub(crate) fn charged_anonymous(&self) -> bool {
        self.marks & CHARGED_ANONYMOUS != 0
    }

    /// Published by an anonymous client (or its will), whatever its RETAIN flag: a dead
    /// letter made of it counts in the anonymous share, whoever's session lost it (issue 35,
    /// thirteenth adversarial pass, F1).
    pub(crate) fn published_anonymously(&self) -> bool {
        self.marks & PUBLISHED_ANONYMOUSLY != 0
    }

    /// Marks the message as published by an anonymous client (`anonymous`), and then charges
    /// it to the anonymous share for its life ([`Message::charge_anonymous`]: held anywhere,
    /// a verified user's queue too; issue 35, fourteenth adversarial pass, A1) and, retained
    /// with a payload, says so to its store record and cluster frame (`from_anonymous`). Set
    /// where it is made, before it is shared: by the publishing session's handle, a will's
    /// publication, and where it comes back from the store or another node (fifteenth pass,
    /// B3).
    pub(crate) fn set_published_anonymously(&mut self, anonymous: bool) {
        if anonymous {
            self.set_published_by_stranger(StrangerShare::ANONYMOUS);
        }
    }

    /// [`Message::set_published_anonymously`], charged to `share`: a bridge's remote's
    /// message to its bridge's share (issue 35, seventeenth adversarial pass, D5). The store
    /// and the cluster know it as an anonymous client's: after a restart, and on other
    /// nodes, it counts in anonymous clients' share.
    pub(crate) fn set_published_by_stranger(&mut self, share: StrangerShare) {
        self.from_anonymous = self.retain && !self.payload.is_empty();
        self.marks |= PUBLISHED_ANONYMOUSLY;
        self.charge_to(share);
    }

    /// Whether an encoding for `version` and `qos` may be cached: it is already, or the
    /// message's share has room for one more copy of it (a stranger's message).
    fn may_cache_for(&self, version: ProtocolVersion, qos: QoS) -> bool {
        self.encoded.is_cached(version, qos)
            || self
                .stranger_share()
                .has_room_for_copy(self.size() as u64 + ENCODING_OVERHEAD)
    }

    /// Whether its cached encodings count in the anonymous share too (tenth pass, S2): they
    /// are further copies of a message that does.
    fn encodings_count_as_anonymous(&self) -> bool {
        self.from_anonymous || self.charged_anonymous()
    }

    /// The message of a QoS 2 delivery restored at its PUBREL stage from another node
    /// (`ClusterSeam::restore`): only its PUBREL is ever sent again, so nothing of it is
    /// kept.
    pub fn released_placeholder() -> Message {
        Message::from_publish(
            Publish {
                dup: false,
                qos: QoS::ExactlyOnce,
                retain: false,
                topic: ByteString::new(),
                packet_id: 0,
                payload: Bytes::new(),
                properties: PublishProperties::default(),
            },
            None,
        )
    }

    /// Turns a will into an ordinary message from nobody (so No Local never suppresses it),
    /// forwarding its properties (MQTT 5 §3.1.3.2).
    pub fn from_will(will: LastWill) -> Message {
        let p = will.properties;
        let publish = Publish {
            dup: false,
            qos: will.qos,
            retain: will.retain,
            topic: will.topic,
            packet_id: 0,
            payload: will.payload,
            properties: PublishProperties {
                payload_format_indicator: p.payload_format_indicator,
                message_expiry_interval: p.message_expiry_interval,
                content_type: p.content_type,
                response_topic: p.response_topic,
                correlation_data: p.correlation_data,
                user_properties: p.user_properties,
                ..Default::default()
            },
        };
        Message::from_publish(publish, None)
    }

    /// Rebuilds a message from the durable store at restart. Wall-clock times become
    /// instants, so time spent down counts towards expiry and the forwarded remaining
    /// Message Expiry Interval (MQTT-3.3.2-6).
    pub fn from_stored(stored: &crate::storage::StoredMessage, store_id: Option<u64>) -> Message {
        let (received_at, expires_at) =
            super::restore::instants(stored, Instant::now(), crate::storage::now_unix_ms());
        let properties = boxed_properties(stored.properties.clone());
        let size = made_size(&stored.topic, &stored.payload, properties.as_deref());
        Message {
            size,
            topic: stored.topic.clone(),
            payload: stored.payload.clone(),
            qos: stored.qos,
            retain: stored.retain,
            properties,
            expires_at,
            received_at,
            origin: None,
            store_id: store_id.map_or_else(OnceId::default, OnceId::from),
            cluster_seq: std::sync::atomic::AtomicU64::new(0),
            settlement: None,
            encoded: PublishEncodings::default(),
            from_anonymous: false,
            marks: 0,
        }
    }

    /// The publishing session, for No Local; `None` for a will, a bridge's or another
    /// node's message.
    pub fn origin(&self) -> Option<SessionId> {
        self.origin.map(std::num::NonZeroU64::get)
    }

    /// Its sequence in the cluster's message stream, once known (see the field).
    pub fn cluster_seq(&self) -> Option<u64> {
        match self.cluster_seq.load(std::sync::atomic::Ordering::Acquire) {
            0 | AWAITED_SEQ => None,
            seq => Some(seq),
        }
    }

    /// Marks a message published here as on its way to the cluster's stream: its sequence
    /// comes with JetStream's acknowledgement ([`Message::awaits_cluster_seq`] until then).
    pub(crate) fn await_cluster_seq(&self) {
        let _ = self.cluster_seq.compare_exchange(
            0,
            AWAITED_SEQ,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
    }

    /// Whether its stream sequence is still to come (published here, not yet acknowledged
    /// by JetStream): a session's record cannot list it yet. False once known, and for a
    /// message whose sequence will never be known (not clustered, brought back by the store
    /// without one, or refused by JetStream).
    pub fn awaits_cluster_seq(&self) -> bool {
        self.cluster_seq.load(std::sync::atomic::Ordering::Acquire) == AWAITED_SEQ
    }

    /// The message, settled with the engine it came from through `settlement` once
    /// nobody holds it any more (see [`Settlement`]).
    #[must_use]
    pub fn with_settlement(mut self, settlement: Box<dyn Settlement>) -> Message {
        self.settlement = Some(Box::new(settlement));
        self
    }

    /// Whether an engine waits for this message to be settled: it is then kept in memory
    /// only (the engine holds the durable copy).
    pub fn awaits_settlement(&self) -> bool {
        self.settlement.is_some()
    }

    /// Hands the message back to the engine it came from, for another receiver: true when
    /// it had one and took it back (the holder then just drops it).
    pub fn give_back(&self) -> bool {
        self.settlement.as_ref().is_some_and(|s| s.give_back())
    }

    /// Records its sequence in the cluster's message stream.
    pub fn set_cluster_seq(&self, seq: u64) {
        self.cluster_seq
            .store(seq, std::sync::atomic::Ordering::Release);
    }

    /// The v5 properties forwarded with this message (empty for most messages).
    pub fn properties(&self) -> &PublishProperties {
        self.properties
            .as_deref()
            .map_or(&NO_PROPERTIES, |p| &p.fields)
    }

    /// The bytes this message makes the broker hold: its topic, payload and properties
    /// (`PublishProperties::held_bytes`). Every bound on what messages hold counts this, so
    /// a PUBLISH cannot carry past them in its properties (issue 35, eighth pass, Q1).
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// True once the Message Expiry Interval has passed (MQTT-3.3.2-5).
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| now >= t)
    }

    /// Appends this message as a PUBLISH for one subscriber to `out`.
    ///
    /// Uses the shared cached encoding unless this subscriber needs its own properties
    /// (subscription identifiers, a Message Expiry Interval that has counted down, or an
    /// outbound topic alias).
    /// Returns the number of bytes written.
    ///
    /// # Errors
    ///
    /// An `EncodeError` when the PUBLISH cannot be encoded for `version` (a field or the packet
    /// exceeds its wire limit).
    pub fn write_to(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
        delivery: PublishFlags<'_>,
    ) -> Result<usize, codec::EncodeError> {
        let start = out.len();
        let elapsed_secs = self.elapsed_for(version);
        if Self::is_custom(version, &delivery, elapsed_secs) {
            let (topic, props) = self.delivery_properties(&delivery, elapsed_secs);
            let header = Self::header(topic, Some(&props), &delivery);
            codec::encode_publish(&header, &self.payload, version, out)?;
            return Ok(out.len() - start);
        }
        if self.encodings_count_as_anonymous() && !self.may_cache_for(version, delivery.qos) {
            // A stranger's message whose share has no room for another copy: encoded for
            // this delivery alone (issue 35, nineteenth adversarial pass, F1: four cached
            // encodings each charged past the share took a stranger's retained messages to
            // 4.9 times it, and verified publishers to 0x97).
            let header = Self::header(&self.topic, self.fields(), &delivery);
            codec::encode_publish(&header, &self.payload, version, out)?;
            return Ok(out.len() - start);
        }
        let (written, made) = self.encoded.write(
            out,
            version,
            PublishBody {
                topic: &self.topic,
                payload: &self.payload,
                properties: self.fields(),
            },
            &delivery,
        )?;
        if made > 0 {
            // A cached encoding is another copy held as long as the message (issue 35, ninth
            // pass R4): counted once as it is made, at most four per message; an anonymous
            // client's retained message's in their share too (tenth pass, S2).
            super::flow::message_made(made);
            if self.encodings_count_as_anonymous() {
                self.stranger_share().counted(made, true);
            }
        }
        Ok(written)
    }

    /// Writes this message as a PUBLISH for one subscriber into `sink` with its large fields
    /// (a long topic, the forwarded properties, the payload) sent from the message rather
    /// than copied, so what a subscriber that stops reading holds is the message, counted
    /// once wherever its bytes count (issue 35: the twentieth adversarial pass, F1, found
    /// sixteen copies of a stranger's 2 MB payload in write buffers taking the budget to
    /// 108%; the twenty-first, G1, the same with 1.68 MB of User Properties). Nothing is
    /// cached. Returns the packet's length, and writes nothing when that is over `max_len`.
    ///
    /// # Errors
    ///
    /// As [`Message::write_to`]; nothing is written.
    pub fn write_apart(
        &self,
        sink: &mut impl codec::PieceSink,
        version: ProtocolVersion,
        delivery: PublishFlags<'_>,
        max_len: usize,
    ) -> Result<usize, codec::EncodeError> {
        let elapsed_secs = self.elapsed_for(version);
        let forwarded = self
            .properties
            .as_deref()
            .and_then(|p| p.forwarded.as_ref());
        let own;
        let (topic, properties) = if forwarded.is_some() {
            own = self.own_properties(&delivery, elapsed_secs);
            let properties = (!own.is_empty()).then_some(&own);
            (self.delivery_topic(&delivery), properties)
        } else if Self::is_custom(version, &delivery, elapsed_secs) {
            let (topic, props) = self.delivery_properties(&delivery, elapsed_secs);
            own = props;
            (topic, Some(&own))
        } else {
            (&*self.topic, self.fields())
        };
        let publish = codec::PublishApart {
            header: Self::header(topic, properties, &delivery),
            topic: (!topic.is_empty()).then(|| self.topic.as_bytes()),
            forwarded,
            payload: &self.payload,
        };
        codec::encode_publish_apart(&publish, version, max_len, sink)
    }

    /// Seconds since the message was received, where a subscriber of `version` is told its
    /// remaining expiry: the clock is read only for a v5 subscriber of an expiring message
    /// (a system call per delivery otherwise: 12% of fan-out CPU in the 2026-11-30 profile).
    #[inline]
    fn elapsed_for(&self, version: ProtocolVersion) -> u64 {
        if version.is_v5() && self.properties().message_expiry_interval.is_some() {
            self.received_at.elapsed().as_secs()
        } else {
            0
        }
    }

    /// Whether a subscriber of `version` needs properties of its own (subscription
    /// identifiers, an outbound topic alias, an expiry that has counted down) rather than the
    /// shared encoding.
    #[inline]
    fn is_custom(version: ProtocolVersion, delivery: &PublishFlags<'_>, elapsed_secs: u64) -> bool {
        version.is_v5()
            && (!delivery.subscription_ids.is_empty()
                || delivery.topic_alias.is_some()
                || elapsed_secs > 0)
    }

    /// The topic and properties of one subscriber's custom PUBLISH ([`Message::is_custom`]).
    fn delivery_properties(
        &self,
        delivery: &PublishFlags<'_>,
        elapsed_secs: u64,
    ) -> (&str, PublishProperties) {
        let mut props = self.properties().clone();
        let own = self.own_properties(delivery, elapsed_secs);
        props.subscription_identifiers = own.subscription_identifiers;
        props.message_expiry_interval = own.message_expiry_interval;
        props.topic_alias = own.topic_alias;
        (self.delivery_topic(delivery), props)
    }

    /// The properties of one delivery that are its own: the subscription identifiers, the
    /// remaining Message Expiry Interval, and the outbound Topic Alias.
    fn own_properties(&self, delivery: &PublishFlags<'_>, elapsed_secs: u64) -> PublishProperties {
        PublishProperties {
            subscription_identifiers: delivery.subscription_ids.into(),
            // Forward the remaining lifetime, not the original (MQTT-3.3.2-6).
            message_expiry_interval: self.properties().message_expiry_interval.map(|interval| {
                interval.saturating_sub(elapsed_secs.min(u64::from(u32::MAX)) as u32)
            }),
            topic_alias: delivery.topic_alias.map(|alias| alias.alias),
            ..PublishProperties::default()
        }
    }

    /// The topic one delivery carries: none where a Topic Alias stands for it (v5
    /// §3.3.2.3.4).
    fn delivery_topic(&self, delivery: &PublishFlags<'_>) -> &str {
        match delivery.topic_alias {
            Some(alias) if !alias.with_topic => "",
            _ => &self.topic,
        }
    }

    /// The properties, if any.
    fn fields(&self) -> Option<&PublishProperties> {
        self.properties.as_deref().map(|p| &p.fields)
    }

    /// The header of one delivery of this message.
    fn header<'a>(
        topic: &'a str,
        properties: Option<&'a PublishProperties>,
        delivery: &PublishFlags<'_>,
    ) -> PublishHeader<'a> {
        PublishHeader {
            dup: delivery.dup,
            qos: delivery.qos,
            retain: delivery.retain,
            topic,
            packet_id: delivery.packet_id,
            properties,
        }
    }
}

/// A message on its way to one session: what to send and with which options.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The shared message.
    pub message: std::sync::Arc<Message>,
    /// `min(publish QoS, granted QoS)` (MQTT-3.8.4-8 / MQTT-3.3.5-1).
    pub qos: QoS,
    /// RETAIN flag as the subscriber sees it.
    pub retain: bool,
    /// Identifiers of every matching subscription that carried one (MQTT-3.3.4-4).
    pub subscription_ids: SmallVec<[u32; 1]>,
    /// Position in the session's stored queue; `None` when this delivery is not persisted
    /// (in-memory store, non-persistent session, or QoS 0).
    pub seq: Option<u64>,
    /// The shared subscription (`$share/{group}/{filter}`) this delivery was chosen for, so
    /// the broker can hand it to another member if this session leaves; `None` otherwise.
    pub shared: Option<std::sync::Arc<str>>,
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
