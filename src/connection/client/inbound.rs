//! Messages from the client: PUBLISH checks, topic aliases, Receive Maximum, PUBREL.
//!
//! The exactly-once state and the store ops belong to the session ([`SessionHandle::publish`],
//! [`SessionHandle::on_pubrel`]); this side checks what only the connection knows (its
//! aliases, its Receive Maximum, the announced capabilities) and answers in order.
//!
//! [`SessionHandle::publish`]: crate::broker::SessionHandle::publish
//! [`SessionHandle::on_pubrel`]: crate::broker::SessionHandle::on_pubrel

use std::time::Instant;

use super::closing::{refused_reason, Close};
use super::inbound_aliases::InboundAliases;
use super::write_memo::WriteMemo;
use super::Client;
use crate::auth::acl::Action;
use crate::broker::stranger_share::{ShareFit, StrangerShare};
use crate::broker::{MemoryLevel, PublishRefused};
use crate::codec::{topic, PubResponse, Publish, QoS, ReasonCode};
use crate::connection::gated::{AckKind, Gated};
use crate::connection::io::Socket;
use crate::connection::violation::Violation;

impl<S: Socket> Client<S> {
    pub(super) fn on_publish(&mut self, mut publish: Publish) -> Result<(), Close> {
        let config = self.broker().config();
        self.broker().metrics.messages_received[publish.qos as usize].increment(1);
        if !publish.properties.subscription_identifiers.is_empty() {
            // MQTT-3.3.4-6, however many there are (the codec collects every one).
            return Err(self.violation(Violation::SubscriptionIdentifierFromClient));
        }
        if publish.qos as u8 > config.max_qos {
            return Err(self.violation(Violation::QosNotSupported));
        }
        if publish.retain && !config.retain_available {
            return Err(self.violation(Violation::RetainNotSupported));
        }
        let validate_utf8 = config.validate_utf8_payload;
        let (max_topic_length, max_topic_levels) =
            (config.max_topic_length, config.max_topic_levels);
        if let Some(alias) = publish.properties.topic_alias {
            self.resolve_alias(alias, &mut publish)?;
        }
        let packet_id = publish.packet_id;
        let qos = publish.qos;
        if qos != QoS::AtMostOnce {
            self.check_receive_maximum(qos, packet_id)?;
        }
        if topic::exceeds_limits(&publish.topic, max_topic_length, max_topic_levels) {
            // 3.x has no negative ack: acknowledging would say it was accepted.
            if !self.version.is_v5() {
                return Err(self.violation(Violation::TopicOverLimit));
            }
            return self.refuse_publish(qos, packet_id, Violation::TopicOverLimit);
        }
        if validate_utf8
            && publish.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&publish.payload).is_err()
        {
            return self.refuse_publish(qos, packet_id, Violation::PayloadFormatInvalid);
        }
        if topic::is_sys(&publish.topic)
            || self.session.broker().is_dead_letter_topic(&publish.topic)
        {
            // `$SYS` and the dead-letter prefix (`$dlq/`) are the broker's own: no client
            // publishes there, ACL or not (the file's rules cannot grant it either,
            // `auth::acl`); a forged dead letter would pass for a lost message.
            return self.refuse_unauthorized(qos, packet_id);
        }
        // Disjoint borrows: the session handle (broker, session) and the memo.
        if let Some(authz) = self.session.broker().authz() {
            // Read before deciding (a reload between the two only makes the memo stale).
            let epoch = authz.acl.map_or(0, crate::auth::acl_slot::AclSlot::epoch);
            let session = self.session.session();
            let allowed = WriteMemo::allowed(&mut self.write_memo, epoch, &publish.topic, || {
                session.authorized(authz.acl, Action::Write, &publish.topic)
            });
            if !allowed {
                return self.refuse_unauthorized(qos, packet_id);
            }
        }
        let memory = self.memory_level();
        if memory == MemoryLevel::Over {
            return self.refuse_over_budget(qos, packet_id);
        }
        // A stranger's message counts in the anonymous share for as long as it is held
        // (retained, or queued at anyone's session: issue 35, fourteenth adversarial pass, A1),
        // so past the share it is refused, not taken into the budget verified clients share;
        // a retained one that replaces or clears an anonymous client's is taken within what
        // that frees (eighteenth pass, E3: the clear that would empty a full share was refused).
        if self.session.publishes_anonymously()
            && self
                .broker()
                .stranger_fits(&publish, StrangerShare::ANONYMOUS)
                == ShareFit::No
        {
            return self.refuse_over_anonymous_share(qos, packet_id);
        }
        if qos == QoS::AtLeastOnce {
            // Counted until its PUBACK is written (`write_gated`), which may wait for the store.
            self.pending_inbound += 1;
        }
        // What the rate counts: payload and properties (a PUBLISH may carry most of its bytes
        // in the latter).
        let size = publish.payload.len() + publish.properties.held_bytes();
        let published = match self.session.publish(publish) {
            Ok(published) => published,
            Err(error) => return self.refuse_unstored(qos, packet_id, error),
        };
        // Queued (so acknowledged below); the connection reads on only once there is room.
        if published.pressure.is_some() || memory == MemoryLevel::Near {
            self.begin_pause(published.pressure);
        } else if let Some(rate) = self.rate.as_deref_mut() {
            let now = Instant::now();
            if let Some(wait) = rate.take(size, now) {
                self.begin_rate_pause(wait, now);
            }
        }
        let answer = published.answer;
        let kind = match qos {
            QoS::AtMostOnce => return Ok(()),
            QoS::AtLeastOnce => AckKind::Ack, // MQTT-4.3.2-2
            QoS::ExactlyOnce => AckKind::Rec, // MQTT-4.3.3-8
        };
        // Acknowledged only once the store holds the message (the durability promise), with
        // 0x10 when nobody subscribes (v5 §3.4.2.1; 3.x acks carry no reason code).
        let mut ack = PubResponse::new(packet_id);
        ack.reason_code = answer.reason;
        self.send_gated(answer.gate, Gated::Ack(kind, ack));
        Ok(())
    }

    /// Refuses more unacknowledged inbound QoS 1/2 PUBLISHes than our Receive Maximum
    /// (the client's duty, MQTT-3.3.4-7) with DISCONNECT 0x93. A QoS 2 retransmission of an id
    /// awaiting PUBREL is not a new PUBLISH and passes.
    fn check_receive_maximum(&self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        let Some(unreleased) = self.session.unreleased_inbound(qos, packet_id) else {
            return Ok(());
        };
        if unreleased + self.pending_inbound as usize >= self.receive_maximum as usize {
            return Err(self.violation(Violation::ReceiveMaximumExceeded));
        }
        Ok(())
    }

    /// Answers a PUBLISH the broker will not route: PUBACK / PUBREC with the violation's code
    /// for QoS 1/2 (a QoS 2 id refused this way is not remembered, MQTT-4.3.3-9), DISCONNECT
    /// for QoS 0, which has no answer.
    fn refuse_publish(
        &mut self,
        qos: QoS,
        packet_id: u16,
        violation: Violation,
    ) -> Result<(), Close> {
        if qos == QoS::AtMostOnce {
            return Err(self.violation(violation));
        }
        let why = violation.describe();
        self.negative_ack(qos, packet_id, violation.reason_code(), &why);
        Ok(())
    }

    /// Queues PUBACK / PUBREC with a failure code (QoS 1/2 only).
    fn negative_ack(&mut self, qos: QoS, packet_id: u16, code: ReasonCode, why: &str) {
        let mut ack = PubResponse::new(packet_id);
        ack.reason_code = code;
        ack.properties.reason_string = self.problem_string(why);
        let kind = if qos == QoS::AtLeastOnce {
            self.pending_inbound += 1; // balanced when the PUBACK is written
            AckKind::Ack
        } else {
            AckKind::Rec
        };
        self.send_gated(None, Gated::Ack(kind, ack));
    }

    /// The store refused a PUBLISH (disk budget, writer backlog, full filesystem, I/O
    /// failure): it was not accepted, so it must not be acknowledged as if it were. v5 says why
    /// in the ack (0x97 quota exceeded, 0x80 unspecified); 3.x has no negative ack, so the
    /// connection closes and the client re-sends after reconnecting.
    fn refuse_unstored(
        &mut self,
        qos: QoS,
        packet_id: u16,
        error: PublishRefused,
    ) -> Result<(), Close> {
        if qos == QoS::AtLeastOnce {
            self.pending_inbound = self.pending_inbound.saturating_sub(1);
        }
        if let PublishRefused::PayloadInvalid { .. } = error {
            return self.refuse_invalid_payload(qos, packet_id, error);
        }
        if qos == QoS::AtMostOnce {
            return Ok(());
        }
        let code = refused_reason(&error);
        if !self.version.is_v5() {
            return Err(Close::StoreRefused(code, error));
        }
        self.negative_ack(qos, packet_id, code, &error.to_string());
        Ok(())
    }

    /// A `[[schema]]` with `action = "reject"` refused the payload; nothing was routed. QoS
    /// 0: dropped. v5 QoS 1/2: PUBACK / PUBREC 0x99 Payload format invalid with the first
    /// validation error as Reason String (when the client accepts problem information). 3.x
    /// has no negative ack: `on_invalid_v3 = "ack"` acknowledges and drops it,
    /// `"disconnect"` closes without an ack (the client re-sends after reconnecting).
    fn refuse_invalid_payload(
        &mut self,
        qos: QoS,
        packet_id: u16,
        error: PublishRefused,
    ) -> Result<(), Close> {
        let PublishRefused::PayloadInvalid {
            schema_id,
            why,
            on_invalid_v3,
        } = &error
        else {
            return Ok(());
        };
        let v5 = self.version.is_v5();
        let refused = qos != QoS::AtMostOnce
            && (v5 || *on_invalid_v3 == crate::config::InvalidV3::Disconnect);
        let metrics = &self.broker().metrics;
        if refused {
            metrics.messages_refused_schema_invalid[qos as usize].increment(1);
        } else {
            metrics.messages_dropped_schema_invalid[qos as usize].increment(1);
        }
        tracing::debug!(client = %self.session.client_id(), schema = %schema_id, %why, ?qos, "payload refused by its schema");
        match qos {
            QoS::AtMostOnce => Ok(()),
            _ if v5 => {
                let why = why.clone();
                self.negative_ack(qos, packet_id, error.reason_code(), &why);
                Ok(())
            }
            _ if refused => Err(Close::StoreRefused(error.reason_code(), error)),
            // 3.x `ack`: PUBACK / PUBREC (a PUBREL after the PUBREC finds no id held and is
            // answered with PUBCOMP).
            _ => {
                self.negative_ack(qos, packet_id, ReasonCode::SUCCESS, "");
                Ok(())
            }
        }
    }

    /// The ACL denies the topic: never routed, never retained, counted. v5 QoS 1/2: PUBACK /
    /// PUBREC 0x87 Not authorized; 3.x cannot be told: acknowledged and dropped (as
    /// Mosquitto does), QoS 0 dropped.
    fn refuse_unauthorized(&mut self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        self.broker().count_denied(Action::Write);
        match qos {
            QoS::AtMostOnce => {}
            _ if self.version.is_v5() => self.negative_ack(
                qos,
                packet_id,
                ReasonCode::NOT_AUTHORIZED,
                "not authorized to publish to this topic",
            ),
            // 3.x: PUBACK / PUBREC (the PUBREL that follows a PUBREC finds no id held and is
            // answered with PUBCOMP).
            _ => self.negative_ack(qos, packet_id, ReasonCode::SUCCESS, ""),
        }
        Ok(())
    }

    /// Over the memory budget: a QoS 1/2 PUBLISH is refused (v5 PUBACK / PUBREC 0x97; 3.x
    /// cannot be told, so the connection closes and the client re-sends later), a QoS 0 one
    /// is dropped and counted. Nothing is routed.
    fn refuse_over_budget(&mut self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        self.broker().metrics.messages_dropped_memory[qos as usize].increment(1);
        if qos == QoS::AtMostOnce {
            return Ok(());
        }
        if !self.version.is_v5() {
            return Err(Close::OverMemoryBudget);
        }
        self.negative_ack(
            qos,
            packet_id,
            ReasonCode::QUOTA_EXCEEDED,
            super::pause::OVER_BUDGET,
        );
        Ok(())
    }

    /// A message of an anonymous client (where a method tells identities apart) that would
    /// take what anonymous clients hold past their share of the memory budget
    /// (`flow::ANONYMOUS_SHARE`): a retained one (issue 35, sixth pass: one stranger filled
    /// the whole budget with retained messages, and every publisher paused) or any other,
    /// held while it waits in anyone's queue (fourteenth pass, A1). Not routed, counted as
    /// dropped for memory, as over the budget: v5 QoS 1/2 PUBACK / PUBREC 0x97 Quota
    /// exceeded; 3.x cannot be told, so the connection closes ("anonymous share full") and
    /// the client re-sends later, rather than being acknowledged for a message it lost;
    /// QoS 0 dropped.
    fn refuse_over_anonymous_share(&mut self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        self.broker().metrics.messages_dropped_memory[qos as usize].increment(1);
        tracing::debug!(client = %self.session.client_id(), "message refused: anonymous clients are at their share of the memory budget");
        if qos == QoS::AtMostOnce {
            return Ok(());
        }
        if !self.version.is_v5() {
            return Err(Close::OverAnonymousShare);
        }
        self.negative_ack(
            qos,
            packet_id,
            ReasonCode::QUOTA_EXCEEDED,
            "anonymous clients are at their share of the memory budget (mqtt.max_memory / 8)",
        );
        Ok(())
    }

    /// Inbound topic aliases (v5 §3.3.2.3.4): set on first use, substituted afterwards.
    fn resolve_alias(&mut self, alias: u16, publish: &mut Publish) -> Result<(), Close> {
        if alias == 0 || alias > self.alias_max_in {
            return Err(self.violation(Violation::TopicAliasOutOfRange));
        }
        if publish.topic.is_empty() {
            match self.aliases.as_deref().and_then(|a| a.get(alias)) {
                Some(topic) => publish.topic = topic.clone(),
                None => return Err(self.violation(Violation::TopicAliasUnknown)),
            }
        } else {
            // A copy (`bind`), so a long-lived alias does not pin the read buffer the topic
            // came in; counted as the connection's own, an anonymous client's within its
            // share (issue 35, twelfth adversarial pass, U6): past it, DISCONNECT 0x97.
            let class = self.held_class();
            let table = self
                .aliases
                .get_or_insert_with(|| Box::new(InboundAliases::new(class)));
            if table.bind(alias, &publish.topic).is_err() {
                tracing::debug!(client = %self.session.client_id(), alias, "topic alias refused: anonymous clients' connections hold their share of the memory budget");
                return Err(Close::OverAnonymousShare);
            }
        }
        Ok(())
    }

    /// PUBREL: PUBCOMP once the session's release of the id is stored (MQTT-4.3.3-11).
    // Like every packet handler, takes the decoded packet it is dispatched with.
    #[allow(clippy::needless_pass_by_value)]
    pub(super) fn on_pubrel(&mut self, rel: PubResponse) {
        let answer = self.session.on_pubrel(rel.packet_id);
        let mut comp = PubResponse::new(rel.packet_id);
        comp.reason_code = answer.reason;
        self.send_gated(answer.gate, Gated::Ack(AckKind::Comp, comp));
    }
}
