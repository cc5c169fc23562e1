//! Messages to the client: draining the session into the write buffer, retransmission on
//! resume, PUBREC answers, and the writes that wait for the store.
//!
//! The session picks deliveries, packet ids and the window ([`SessionHandle::fill`]); this
//! side encodes them (with this connection's topic aliases and Maximum Packet Size) and keeps
//! every write that depends on a commit behind it, in order ([`GatedWrites`]).
//!
//! [`SessionHandle::fill`]: crate::broker::SessionHandle::fill
//! [`GatedWrites`]: crate::connection::gated::GatedWrites

use std::time::Instant;

use super::closing::Close;
use super::Client;
use crate::broker::{Broker, Delivery, DeliverySink, Fill, Message, Resend};
use crate::codec::{EncodeError, Packet, ProtocolVersion, PubResponse, PublishAlias, PublishFlags};
use crate::connection::gated::{AckKind, Gated};
use crate::connection::io::Socket;
use crate::connection::io::WRITE_HIGH_WATER;
use crate::connection::topic_alias::{AliasChoice, OutboundAliases};
use crate::connection::violation::Violation;
use crate::connection::write_queue::{WriteQueue, BY_REFERENCE};
use crate::storage::Durable;

/// Stop moving deliveries out of the session queue while this many writes wait for the store:
/// each held batch can be up to `WRITE_HIGH_WATER` bytes, so this bounds a connection's held
/// output to about 1 MiB while a commit is slow.
const MAX_HELD_BATCHES: usize = 16;

/// The connection's side of [`SessionHandle::fill`]: encodes each delivery into the write
/// buffer, or into `held` from the first one that must wait for a commit (and everything
/// after it, to keep the order).
///
/// A verified client's (`VERIFIED`) and an anonymous client's are apart at compile time, so
/// that what only one of them does costs the other nothing per delivery: sending large
/// fields from the message, and counting copies of strangers' messages in their shares. A
/// verified client's path pays for the second: a bit test of the message's marks in the room
/// check and after the write (callgrind, fan-out QoS 0: about 6 instructions per delivery of
/// 1,515 against the code before; 12 when the kind of client was read at run time).
///
/// [`SessionHandle::fill`]: crate::broker::SessionHandle::fill
struct Encoder<'a, const VERIFIED: bool> {
    out: &'a mut WriteQueue,
    held: WriteQueue,
    /// Write into `held`: something before is waiting for the store.
    hold: bool,
    version: ProtocolVersion,
    client_max_packet: usize,
    aliases_out: Option<&'a mut OutboundAliases>,
    broker: &'a Broker,
    /// The batch's one clock reading, for the delivery latency.
    now: Instant,
    /// What `out` and `held` hold outside their batches (fields sent from their message,
    /// and the batches sealed before them): updated only when a message is queued so, so
    /// that the room check per delivery reads two lengths as before.
    apart: usize,
}

impl<const VERIFIED: bool> Encoder<'_, VERIFIED> {
    /// Whether a copy of `message`, a stranger's, may join a verified client's output now:
    /// always when it goes out from the message (held once, counted as the message) or when
    /// nothing else waits to be sent (else a full share would starve the client of
    /// strangers' messages), otherwise only while its share has room for it beside this
    /// connection's copies not charged yet (`connection::stranger_copies`; issue 35,
    /// twenty-second adversarial pass, H1).
    #[inline(never)]
    fn stranger_copy_fits(&self, message: &Message) -> bool {
        if sends_apart::<VERIFIED>(message) || (self.out.is_empty() && self.held.is_empty()) {
            return true;
        }
        let share = message.stranger_share();
        let pending = self.out.strangers_uncharged(share) + self.held.strangers_uncharged(share);
        share.has_room_for_copy((pending + message.size()) as u64)
    }
}

impl<const VERIFIED: bool> DeliverySink for Encoder<'_, VERIFIED> {
    fn has_room_for(&self, next: &Delivery) -> bool {
        self.out.batch_len() + self.held.batch_len() + self.apart < WRITE_HIGH_WATER
            && (!VERIFIED
                || !next.message.charged_anonymous()
                || self.stranger_copy_fits(&next.message))
    }

    fn write(
        &mut self,
        delivery: &Delivery,
        packet_id: u16,
        dup: bool,
        after_commit: bool,
    ) -> bool {
        self.hold |= after_commit;
        let out = if self.hold {
            &mut self.held
        } else {
            &mut *self.out
        };
        let written = encode_delivery::<VERIFIED>(
            out,
            self.version,
            self.client_max_packet,
            self.aliases_out.as_deref_mut(),
            self.broker,
            delivery,
            packet_id,
            dup,
        );
        if written && sends_apart::<VERIFIED>(&delivery.message) {
            self.apart = self.out.apart_len() + self.held.apart_len();
        }
        if written {
            // From the PUBLISH being read (`Message::received_at`) to this write, with the
            // batch's clock reading: no clock read per delivery.
            let waited = self
                .now
                .saturating_duration_since(delivery.message.received_at);
            self.broker
                .metrics
                .delivery_latency
                .record(waited.as_secs_f64());
        }
        written
    }
}

impl<S: Socket> Client<S> {
    /// Moves queued deliveries into the write buffer while the window and buffer allow
    /// (MQTT-4.6.0-6: in order). A persisted QoS 2 PUBLISH is held back until its new stage is
    /// durable (otherwise a crash could re-send it under a new packet id: a duplicate), and so
    /// is everything after it.
    ///
    /// Returns false if this connection no longer owns the session (taken over).
    pub(super) fn fill_from_session(&mut self, now: Instant) -> bool {
        if self.io.out.len() >= WRITE_HIGH_WATER || self.gated.len() >= MAX_HELD_BATCHES {
            // The socket, or the store, is behind: leave the rest in the session's bounded
            // queue rather than piling encoded batches up here.
            return self.session.is_owner();
        }
        if self.settled.anonymous() {
            self.fill_encoded::<false>(now)
        } else {
            self.fill_encoded::<true>(now)
        }
    }

    /// [`Client::fill_from_session`] for a verified client (`VERIFIED`) or an anonymous one.
    fn fill_encoded<const VERIFIED: bool>(&mut self, now: Instant) -> bool {
        let broker = std::sync::Arc::clone(self.session.broker());
        let apart = self.io.out.apart_len();
        let mut encoder = Encoder::<VERIFIED> {
            out: &mut self.io.out,
            held: WriteQueue::default(),
            hold: !self.gated.is_empty(),
            version: self.version,
            client_max_packet: self.client_max_packet,
            aliases_out: self.aliases_out.as_deref_mut(),
            broker: &broker,
            now,
            apart,
        };
        let gate = match self
            .session
            .fill(usize::from(self.window), now, &mut encoder)
        {
            Fill::TakenOver => return false,
            Fill::Filled { gate } => gate,
        };
        let held = encoder.held;
        if !held.is_empty() {
            self.send_gated(gate, Gated::Encoded(held));
        }
        true
    }

    /// On a resumed session, resend every unacknowledged PUBLISH with DUP=1 and every
    /// pending PUBREL, in their original order (MQTT-4.4.0-1, MQTT-3.3.1-1). With
    /// `mqtt.max_deliveries` set, the session first gives up on poison messages and stores
    /// the new delivery counts: the resends then wait for that commit (and everything after
    /// them, in order), so a crash cannot deliver once more than counted.
    pub(super) fn retransmit_inflight(&mut self) {
        if self.settled.anonymous() {
            self.retransmit_encoded::<false>();
        } else {
            self.retransmit_encoded::<true>();
        }
    }

    /// [`Client::retransmit_inflight`] for a verified client (`VERIFIED`) or an anonymous one.
    fn retransmit_encoded<const VERIFIED: bool>(&mut self) {
        let retransmit = self.session.retransmit();
        let mut held = WriteQueue::default();
        let gated = retransmit.gate.is_some();
        for resend in retransmit.resends {
            let out = if gated { &mut held } else { &mut self.io.out };
            match resend {
                Resend::Release(packet_id) => {
                    let rel = Packet::PubRel(PubResponse::new(packet_id));
                    if let Err(e) = crate::codec::encode(&rel, self.version, out.batch()) {
                        tracing::warn!(packet = rel.name(), error = %e, "cannot encode packet");
                    }
                }
                Resend::Publish(delivery, packet_id) => {
                    let written = encode_delivery::<VERIFIED>(
                        out,
                        self.version,
                        self.client_max_packet,
                        self.aliases_out.as_deref_mut(),
                        self.session.broker(),
                        &delivery,
                        packet_id,
                        true,
                    );
                    if written {
                        self.broker().metrics.messages_sent[delivery.qos as usize].increment(1);
                    } else {
                        // Larger than this connection's Maximum Packet Size (it may be smaller
                        // than the last one's): discarded, and the session goes on as if it
                        // were completed (MQTT-3.1.2-25), or it would stay in flight forever.
                        self.session
                            .discard(packet_id, Some(crate::guarantees::DeadReason::TooLarge));
                    }
                }
            }
        }
        if gated {
            // Even with nothing to resend: what the fill writes next waits behind it.
            self.send_gated(retransmit.gate, Gated::Encoded(held));
        }
    }

    /// PUBREC: PUBREL once the session's new stage is stored (MQTT-4.3.3-4); nothing when the
    /// receiver refused the message (reason ≥ 0x80, v5 §4.3.3). A PUBREC for a QoS 1
    /// delivery is a Protocol Error (MQTT-4.3.2-4 asks for PUBACK; v5 §4.13.1).
    // Like every packet handler, takes the decoded packet it is dispatched with.
    #[allow(clippy::needless_pass_by_value)]
    pub(super) fn on_pubrec(&mut self, rec: PubResponse) -> Result<(), Close> {
        let answer = self
            .session
            .on_pubrec(rec.packet_id, rec.reason_code)
            .map_err(|mismatch| self.violation(Violation::AckMismatch(mismatch)))?;
        let Some(answer) = answer else {
            return Ok(());
        };
        let mut rel = PubResponse::new(rec.packet_id);
        rel.reason_code = answer.reason;
        self.send_gated(answer.gate, Gated::Ack(AckKind::Rel, rel));
        Ok(())
    }

    /// Writes now, or behind the writes that wait for the store (even one that waits for
    /// nothing itself: PUBACKs go out in PUBLISH order, MQTT-4.6.0-2).
    pub(super) fn send_gated(&mut self, durable: Option<Durable>, item: Gated) {
        if durable.is_none() && self.gated.is_empty() {
            self.write_gated(item);
        } else {
            self.gated.push(durable, item);
        }
    }

    /// Writes every gated item that no longer waits.
    pub(super) fn release_gated(&mut self) {
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
                    .queue_within(&kind.packet(ack), self.version, self.client_max_packet);
            }
            Gated::Encoded(encoded) => self.io.out.append(encoded),
        }
    }
}

/// Whether a delivery of `message` to a verified client (`VERIFIED`) or an anonymous one
/// sends its large fields from the message: a verified client's from [`BY_REFERENCE`] bytes
/// of the message's whole size, not its payload's, since a stranger can carry its bytes in
/// properties or a long topic (issue 35, twenty-first adversarial pass, G1). Never an
/// anonymous client's: its unread copy counts in the anonymous connections' bound, out of
/// the budget; sent by reference, the message it kept alive counted in the budget verified
/// publishers pause at, whole, while the bound counted only its unsent tail: sixteen
/// anonymous subscribers that stopped reading held 14.3 MB of a 16 MiB budget's verified
/// messages (twenty-first pass, G3).
#[inline(always)]
fn sends_apart<const VERIFIED: bool>(message: &Message) -> bool {
    VERIFIED && message.size() >= BY_REFERENCE
}

/// Encodes one delivery into `out` for a client of `version`, verified (`VERIFIED`) or not;
/// false if it could not be sent at all (above the client's Maximum Packet Size,
/// MQTT-3.1.2-25, or unencodable). With outbound topic aliases, only a PUBLISH that is
/// actually written changes the alias table. A large message to a verified client sends its
/// large fields from the message, not copied ([`sends_apart`], `connection::write_queue`);
/// a verified client's copy of a stranger's message counts in the stranger's share while
/// unwritten (`connection::stranger_copies`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn encode_delivery<const VERIFIED: bool>(
    out: &mut WriteQueue,
    version: ProtocolVersion,
    client_max_packet: usize,
    aliases_out: Option<&mut OutboundAliases>,
    broker: &Broker,
    delivery: &Delivery,
    packet_id: u16,
    dup: bool,
) -> bool {
    if sends_apart::<VERIFIED>(&delivery.message) {
        return encode_by_reference(
            out,
            version,
            client_max_packet,
            aliases_out,
            broker,
            delivery,
            packet_id,
            dup,
        );
    }
    let batch = out.batch();
    let start = batch.len();
    let (alias, flags) = delivery_flags(aliases_out.as_deref(), delivery, packet_id, dup);
    let written = delivery.message.write_to(batch, version, flags);
    if !matches!(written, Ok(len) if len <= client_max_packet) {
        batch.truncate(start);
    }
    let sent = settle(
        written,
        client_max_packet,
        aliases_out,
        alias,
        broker,
        delivery,
    );
    // An anonymous client's copy counts as its own, in the anonymous share, instead.
    if VERIFIED && sent && delivery.message.charged_anonymous() {
        let copied = out.batch_len() - start;
        out.copied_for_stranger(delivery.message.stranger_share(), copied);
    }
    sent
}

/// [`encode_delivery`] of a large message: its small fields into the batch, its large ones
/// queued from the message ([`Message::write_apart`]). Apart, so the path of every other
/// delivery stays as short as it was (measured: +1.5% instructions per fan-out delivery
/// when inline).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn encode_by_reference(
    out: &mut WriteQueue,
    version: ProtocolVersion,
    client_max_packet: usize,
    aliases_out: Option<&mut OutboundAliases>,
    broker: &Broker,
    delivery: &Delivery,
    packet_id: u16,
    dup: bool,
) -> bool {
    let (alias, flags) = delivery_flags(aliases_out.as_deref(), delivery, packet_id, dup);
    let written = delivery.message.write_apart(
        &mut out.pieces_of(&delivery.message),
        version,
        flags,
        client_max_packet,
    );
    settle(
        written,
        client_max_packet,
        aliases_out,
        alias,
        broker,
        delivery,
    )
}

/// The share a delivery's message is charged to, if it is a stranger's: where a verified
/// client's outbound alias table counts its topic (`connection::topic_alias`).
fn stranger_of(delivery: &Delivery) -> Option<crate::broker::stranger_share::StrangerShare> {
    let message = &delivery.message;
    message
        .charged_anonymous()
        .then(|| message.stranger_share())
}

/// One delivery's flags, with the outbound Topic Alias it would use (not yet committed).
#[inline(always)]
fn delivery_flags<'a>(
    aliases_out: Option<&OutboundAliases>,
    delivery: &'a Delivery,
    packet_id: u16,
    dup: bool,
) -> (Option<AliasChoice>, PublishFlags<'a>) {
    let alias = aliases_out
        .and_then(|table| table.choose_for(&delivery.message.topic, stranger_of(delivery)));
    let flags = PublishFlags {
        qos: delivery.qos,
        retain: delivery.retain,
        dup,
        packet_id,
        subscription_ids: &delivery.subscription_ids,
        topic_alias: alias.map(|choice| PublishAlias {
            alias: choice.alias(),
            with_topic: choice.sends_topic(),
        }),
    };
    (alias, flags)
}

/// What became of one delivery's encoding (`written`: the packet's length): sent (the
/// Topic Alias it used committed), or dropped as larger than the client takes, or as
/// unencodable. The caller has already undone any bytes of a dropped one.
#[inline(always)]
fn settle(
    written: Result<usize, EncodeError>,
    client_max_packet: usize,
    aliases_out: Option<&mut OutboundAliases>,
    alias: Option<AliasChoice>,
    broker: &Broker,
    delivery: &Delivery,
) -> bool {
    match written {
        Ok(len) if len <= client_max_packet => {
            if let (Some(table), Some(choice)) = (aliases_out, alias) {
                table.commit_for(&delivery.message.topic, choice, stranger_of(delivery));
            }
            true
        }
        Ok(_) => {
            broker.metrics.messages_dropped_too_large[delivery.qos as usize].increment(1);
            false
        }
        Err(error) => {
            tracing::warn!(%error, "cannot encode delivery");
            false
        }
    }
}
