//! A session handle's subscriptions: SUBSCRIBE and UNSUBSCRIBE through the broker, the
//! per-client bounds asked before, and the retained messages a new subscription gets.

use bytestring::ByteString;

use super::{SessionHandle, SubscriptionQuota};
use crate::codec::SubscriptionOptions;

impl SessionHandle {
    /// Adds or replaces a subscription; true if one existed (see [`Broker::subscribe`]).
    pub fn subscribe(
        &self,
        filter: &ByteString,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) -> bool {
        self.broker
            .subscribe(&self.session, filter, options, identifier)
    }

    /// Whether one more subscription to `filter` fits the per-client bounds: `max` filters
    /// and `max_bytes` bytes of filters (0 = none), `held_bytes` being what the session holds
    /// now (from [`SessionHandle::held_filter_bytes`], plus what this SUBSCRIBE added). A
    /// filter the session already holds is replaced, not added (MQTT-3.8.4-3), so it always
    /// fits.
    ///
    /// # Errors
    ///
    /// The bound the filter would pass.
    pub fn subscription_fits(
        &self,
        filter: &str,
        max: usize,
        max_bytes: usize,
        held_bytes: usize,
    ) -> Result<(), SubscriptionQuota> {
        if max == 0 && max_bytes == 0 {
            return Ok(());
        }
        let st = self.session.lock();
        if st.subscriptions.contains_key(filter) {
            return Ok(());
        }
        if max != 0 && st.subscriptions.len() >= max {
            return Err(SubscriptionQuota::Count);
        }
        if max_bytes != 0 && held_bytes.saturating_add(filter.len()) > max_bytes {
            return Err(SubscriptionQuota::Bytes);
        }
        Ok(())
    }

    /// Whether the session holds a subscription to `filter` (a SUBSCRIBE to it replaces it).
    pub fn holds_filter(&self, filter: &str) -> bool {
        self.session.lock().subscriptions.contains_key(filter)
    }

    /// Whether the session is anonymous where a method tells identities apart: its filters
    /// take from the anonymous sessions' share of the memory budget.
    pub fn is_anonymous(&self) -> bool {
        self.session.lock().is_anonymous()
    }

    /// [`SessionHandle::is_anonymous`] without the session's lock, for every PUBLISH: one
    /// atomic load (the share key carries the owner's anonymous mark).
    pub fn publishes_anonymously(&self) -> bool {
        super::super::owner::is_anonymous_key(self.session.share_key())
    }

    /// The bytes of the filters the session holds now (one walk of its subscriptions, read
    /// once per SUBSCRIBE when `mqtt.max_subscription_bytes_per_client` is set).
    pub fn held_filter_bytes(&self) -> usize {
        self.session.lock().subscriptions.filter_bytes()
    }

    /// Removes a subscription; true if it existed.
    pub fn unsubscribe(&self, filter: &str) -> bool {
        self.broker.unsubscribe(&self.session, filter)
    }

    /// Queues the retained messages matching a new subscription (MQTT-3.3.1-9).
    pub fn deliver_retained(
        &self,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) {
        self.broker
            .deliver_retained(&self.session, filter, options, identifier);
    }
}
