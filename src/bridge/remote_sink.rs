//! The local session's deliveries encoded for the remote broker: renamed by the `out` rules,
//! with the hop count that stops loops, the remaining expiry, and nothing the remote did
//! not ask for (subscription ids, aliases, RETAIN where it has none).
//!
//! Why apart from the pump: the pump is the connection's loop; this is what one delivery
//! becomes on the remote's wire, and the hop rules the pump's inbound side shares.
//!
//! Must not: write past the remote's Maximum Packet Size (a delivery too large is dropped as
//! a dead letter, never truncated); take more than the forward rate allows.

use bytes::BytesMut;
use bytestring::ByteString;

use super::pump::{RemoteLimits, WRITE_HIGH_WATER};
use super::status::{BridgeStatus, Flow};
use super::topics::Rules;
use crate::broker::session::DeliverySink;
use crate::broker::Delivery;
use crate::codec::{Packet, ProtocolVersion, Publish, PublishProperties, QoS};
use crate::config::{BridgeConfig, HOPS_PROPERTY};

/// Deliveries the forward rate lets through now (`usize::MAX` without a rate).
#[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
fn whole_tokens(rate: u32, tokens: f64) -> usize {
    if rate == 0 {
        usize::MAX
    } else {
        // Clamped to 0..=rate first: the cast is exact for these values.
        tokens.clamp(0.0, f64::from(rate)).floor() as usize
    }
}

/// The hop count a message carries (0 when it has none).
pub(super) fn hops_of(properties: &PublishProperties) -> u8 {
    properties
        .user_properties
        .iter()
        .rev()
        .find(|(k, _)| k == HOPS_PROPERTY)
        .and_then(|(_, v)| v.parse::<u8>().ok())
        .unwrap_or(0)
}

/// Sets the hop count, replacing any earlier one.
pub(super) fn set_hops(properties: &mut PublishProperties, hops: u8) {
    properties
        .user_properties
        .retain(|(k, _)| k != HOPS_PROPERTY);
    properties
        .user_properties
        .push((HOPS_PROPERTY.into(), hops.to_string().into()));
}

/// Encodes the local session's deliveries for the remote, renamed by the `out` rules.
pub(super) struct RemoteSink<'a> {
    out: &'a mut BytesMut,
    rules: &'a Rules,
    status: &'a BridgeStatus,
    version: ProtocolVersion,
    limits: RemoteLimits,
    max_hops: u8,
    keep_retain: bool,
    tokens: usize,
    /// Deliveries taken in this fill (the pump charges them to the forward rate).
    pub(super) taken: usize,
    /// Why the last refused delivery was dropped (`DeliverySink::refusal`): only one too
    /// large for the remote is a dead letter.
    refused_as: Option<crate::guarantees::DeadReason>,
}

impl<'a> RemoteSink<'a> {
    /// A sink into `out` for one fill, with what the bridge's config and the forward rate
    /// (`tokens`) allow.
    pub(super) fn new(
        out: &'a mut BytesMut,
        config: &BridgeConfig,
        rules: &'a Rules,
        status: &'a BridgeStatus,
        version: ProtocolVersion,
        limits: RemoteLimits,
        tokens: f64,
    ) -> RemoteSink<'a> {
        RemoteSink {
            refused_as: None,
            out,
            rules,
            status,
            version,
            limits,
            max_hops: config.max_hops,
            keep_retain: config.keep_retain,
            tokens: whole_tokens(config.max_forward_rate, tokens),
            taken: 0,
        }
    }
}

impl DeliverySink for RemoteSink<'_> {
    fn has_room_for(&self, _next: &Delivery) -> bool {
        self.out.len() < WRITE_HIGH_WATER && self.taken < self.tokens
    }

    fn refusal(&self) -> Option<crate::guarantees::DeadReason> {
        self.refused_as
    }

    fn write(&mut self, d: &Delivery, packet_id: u16, dup: bool, _after_commit: bool) -> bool {
        self.taken += 1;
        self.refused_as = None;
        let message = &d.message;
        let v5 = self.version == ProtocolVersion::V5;
        let Some(name) = self.rules.outgoing(&message.topic) else {
            self.status.dropped(Flow::Out, "topic");
            return false;
        };
        let mut properties = message.properties().clone();
        if v5 {
            let hops = hops_of(&properties);
            if hops >= self.max_hops {
                self.status.dropped(Flow::Out, "max_hops");
                return false;
            }
            set_hops(&mut properties, hops.saturating_add(1));
            if let Some(interval) = properties.message_expiry_interval.as_mut() {
                // The remaining lifetime, not the original (MQTT-3.3.2-6).
                let elapsed = message.received_at.elapsed().as_secs();
                *interval = interval.saturating_sub(elapsed.min(u64::from(u32::MAX)) as u32);
            }
        } else {
            properties = PublishProperties::default();
        }
        properties.subscription_identifiers.clear();
        properties.topic_alias = None;
        let publish = Publish {
            dup: dup && d.qos != QoS::AtMostOnce,
            qos: d.qos,
            retain: self.keep_retain && d.retain && self.limits.retain_available,
            topic: ByteString::from(name),
            packet_id,
            payload: message.payload.clone(),
            properties,
        };
        let start = self.out.len();
        let encoded = crate::codec::encode(&Packet::Publish(publish), self.version, self.out);
        if encoded.is_err() || self.out.len() - start > self.limits.max_packet_size {
            self.out.truncate(start);
            self.status.dropped(Flow::Out, "too_large");
            self.refused_as = Some(crate::guarantees::DeadReason::TooLarge);
            return false;
        }
        if d.qos == QoS::AtMostOnce {
            self.status.forwarded(Flow::Out);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_are_read_and_replaced() {
        let mut p = PublishProperties::default();
        assert_eq!(hops_of(&p), 0);
        set_hops(&mut p, 1);
        set_hops(&mut p, 2);
        assert_eq!(hops_of(&p), 2);
        assert_eq!(p.user_properties.len(), 1);
        p.user_properties
            .push((HOPS_PROPERTY.into(), "not a number".into()));
        assert_eq!(hops_of(&p), 0);
    }
}
