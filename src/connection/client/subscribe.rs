//! SUBSCRIBE and UNSUBSCRIBE: per-filter checks against the announced capabilities, then the
//! session API; SUBACK / UNSUBACK before the retained messages they trigger.

use bytestring::ByteString;
use smallvec::SmallVec;

use super::closing::Close;
use super::{pause, Client};
use crate::auth::acl::{Action, FilterAccess};
use crate::broker::flow::{self, MemoryBudget};
use crate::broker::SubscriptionQuota;
use crate::codec::{
    topic, Packet, ReasonCode, SubAck, Subscribe, SubscriptionOptions, UnsubAck, Unsubscribe,
};
use crate::connection::gated::Gated;
use crate::connection::io::Socket;
use crate::connection::violation::Violation;
use crate::connection::write_queue::WriteQueue;

impl<S: Socket> Client<S> {
    /// Subscriptions count against `mqtt.max_memory` (issue 35, finding 6): a new filter is
    /// refused when subscriptions would hold more than half of the budget, or the memory in
    /// use would reach the pause mark. So subscriptions alone never pause the publishers, and
    /// a flood of them leaves at least 40% of the budget to the messages. Anonymous sessions
    /// (where a method tells identities apart) have an eighth of the budget between them for
    /// what they hold, subscriptions included ([`flow::ANONYMOUS_SHARE`]), so strangers
    /// cannot take it from the clients a method verified. `Some(why)` when the filter is refused.
    fn over_subscription_budget(&self, filter: &str, budget: MemoryBudget) -> Option<&'static str> {
        let cost = flow::subscription_cost(filter.len());
        let why = if flow::subscription_bytes().saturating_add(cost) > budget.limit / 2
            || pause::memory_used().saturating_add(cost) >= budget.pause_at
        {
            "subscriptions are at their share of the memory budget (mqtt.max_memory)"
        } else if !flow::anonymous_share_has_room(cost, &budget) && self.session.is_anonymous() {
            "anonymous clients are at their share of the memory budget (mqtt.max_memory / 8)"
        } else {
            return None;
        };
        // Subscribing again to a filter it holds adds nothing (MQTT-3.8.4-3).
        (!self.session.holds_filter(filter)).then_some(why)
    }

    pub(super) fn on_subscribe(&mut self, subscribe: Subscribe) -> Result<(), Close> {
        if subscribe
            .filters
            .iter()
            .any(|(f, o)| o.no_local && matches!(topic::split_shared(f), Some(Ok(_))))
        {
            return Err(self.violation(Violation::NoLocalOnSharedSubscription));
        }
        let max_qos = self.broker().max_qos();
        let config = self.broker().config();
        let (wildcards_ok, ids_ok, shared_ok) = (
            config.wildcard_subscription_available,
            config.subscription_identifier_available,
            config.shared_subscription_available,
        );
        // A reload may change the per-client bounds (`broker::runtime_limits`).
        let limits = self.broker().runtime_limits().get();
        let (max_topic_length, max_topic_levels, max_subscriptions, max_bytes) = (
            config.max_topic_length,
            config.max_topic_levels,
            limits.max_subscriptions_per_client,
            limits.max_subscription_bytes_per_client,
        );
        // What the session's filters take now, once per SUBSCRIBE; grows with each granted.
        let mut held_bytes = if max_bytes == 0 {
            0
        } else {
            self.session.held_filter_bytes()
        };
        let budget = self.broker().flow().memory;
        let ids_refused = subscribe.subscription_identifier.is_some() && !ids_ok;
        // A 3.x bridge (Mosquitto's `try_private`) subscribes as Mosquitto lets it: No Local,
        // so the messages it publishes here are not sent back to it (a loop between the two
        // brokers), and Retain As Published, so RETAIN travels (3.x subscriptions have
        // neither option). One session lock per SUBSCRIBE of a 3.x client.
        let bridge = !self.version.is_v5() && self.session.is_bridge();
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
            } else if topic::exceeds_limits(&filter, max_topic_length, max_topic_levels) {
                // v5: "correctly formed but not allowed" (0x8F); 3.x: 0x80.
                Some((
                    ReasonCode::TOPIC_FILTER_INVALID,
                    "topic filter over mqtt.max_topic_length or max_topic_levels",
                ))
            } else if let Err(quota) =
                self.session
                    .subscription_fits(&filter, max_subscriptions, max_bytes, held_bytes)
            {
                // v5 0x97 (MQTT-3.9.3-1: one code per filter, in order); 3.x 0x80 Failure.
                Some((
                    ReasonCode::QUOTA_EXCEEDED,
                    match quota {
                        SubscriptionQuota::Count => "mqtt.max_subscriptions_per_client reached",
                        SubscriptionQuota::Bytes => {
                            "mqtt.max_subscription_bytes_per_client reached"
                        }
                    },
                ))
            } else if let Some(why) = self.over_subscription_budget(&filter, budget) {
                Some((ReasonCode::QUOTA_EXCEEDED, why))
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
            } else if self.broker().authz().is_some_and(|authz| {
                self.session.session().filter_access(authz.acl, inner).0 == FilterAccess::Denied
            }) {
                // A filter none of whose topics may be read: 0x87 (3.1.1: 0x80, via
                // `SubAck`'s v3 mapping). One that covers some denied topics is granted and
                // filtered at delivery (`Subscriber::acl_generation`).
                self.broker().count_denied(Action::Read);
                Some((
                    ReasonCode::NOT_AUTHORIZED,
                    "not authorized to subscribe to this filter",
                ))
            } else {
                None
            };
            let code = if let Some((code, why)) = refusal {
                problem.get_or_insert(why);
                code
            } else {
                let mut options = SubscriptionOptions {
                    qos: options.qos.min(max_qos), // granted ≤ requested (v5 §3.9.3)
                    ..options
                };
                if bridge {
                    // Not on a shared subscription, which may not have No Local
                    // (MQTT-3.8.3-4): a bridge's copy through a group can come back.
                    options.no_local = shared.is_none();
                    options.retain_as_published = true;
                }
                let existed =
                    self.session
                        .subscribe(&filter, options, subscribe.subscription_identifier);
                if !existed {
                    held_bytes = held_bytes.saturating_add(filter.len());
                }
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
        // MQTT-3.8.4-1; clustered, once the session's record holds the subscriptions.
        self.answer_after_record(&Packet::SubAck(suback));
        for (filter, options) in retained {
            self.session
                .deliver_retained(&filter, options, subscribe.subscription_identifier);
        }
        Ok(())
    }

    // Like every packet handler, takes the decoded packet it is dispatched with.
    #[allow(clippy::needless_pass_by_value)]
    pub(super) fn on_unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let reason_codes = unsubscribe
            .filters
            .iter()
            .map(|filter| {
                if self.session.unsubscribe(filter) {
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
        self.answer_after_record(&Packet::UnsubAck(unsuback)); // MQTT-3.10.4-4
    }

    /// Sends a SUBACK or UNSUBACK: clustered, once the session's record in the cluster holds
    /// what it confirms (a node that takes the session over after this one died resumes from
    /// the record: written up to a second late, it would not have the subscription the client
    /// was told of); at once otherwise.
    fn answer_after_record(&mut self, packet: &Packet) {
        let Some(barrier) = self.session.cluster_record_barrier() else {
            self.io
                .queue_within(packet, self.version, self.client_max_packet);
            return;
        };
        let mut out = WriteQueue::default();
        match crate::codec::encode_within(packet, self.version, self.client_max_packet, out.batch())
        {
            Ok(true) => self.send_gated(Some(barrier), Gated::Encoded(out)),
            Ok(false) => tracing::debug!(
                packet = packet.name(),
                "packet above the peer's maximum size not sent"
            ),
            Err(e) => tracing::warn!(packet = packet.name(), error = %e, "cannot encode packet"),
        }
    }
}
