//! The broker's side of the guarantees seam (`crate::guarantees`): where a PUBLISH meets the
//! schema check and the dedup window (`gate_publish`, once per PUBLISH, before fan-out), and
//! where a dropped message becomes a dead letter (`dead_letter`).
//!
//! Unconfigured, every entry point is one `OnceLock` read that finds nothing.

use std::sync::Arc;
use std::time::SystemTime;

use bytestring::ByteString;

use super::{Broker, Message, PublishRefused, SessionId};
use crate::codec::ReasonCode;
use crate::guarantees::dead_letter::Loss;
use crate::guarantees::{DeadReason, Dedup, DedupCheck, Guarantees, Verdict};
use crate::storage::{Durable, Op};

/// What [`Broker::gate_publish`] decided for one PUBLISH.
#[derive(Debug)]
pub enum Gate {
    /// Route it; store `dedup` (the key it carried) in the same submit.
    Route {
        /// `Op::PutDedup` of a fresh deduplication key.
        dedup: Option<Box<Op>>,
    },
    /// A duplicate inside the dedup window: acknowledge (after `gate`), route nothing.
    Duplicate,
    /// Its payload broke a schema whose action is `dead-letter`: it was published as a dead
    /// letter; acknowledge it once that is durable.
    DeadLettered {
        /// The dead letter's commit.
        gate: Option<Durable>,
    },
}

impl Broker {
    /// Installs what `[dead_letter]`, `[[schema]]` and `[dedup]` turned on; once, by
    /// `server::start`, before the store's contents are restored. A second call is ignored.
    pub fn install_guarantees(&self, mut guarantees: Guarantees) {
        if let Some(dedup) = guarantees.dedup.as_mut() {
            dedup.attach_metrics(self.metrics.dedup.clone());
        }
        if self.guarantees.set(guarantees).is_err() {
            tracing::warn!("guarantees installed twice; the first stays");
        }
    }

    /// What is configured; `None` in a broker built without `server::start`.
    pub fn guarantees(&self) -> Option<&Guarantees> {
        self.guarantees.get()
    }

    /// The schema check, then the dedup window, for one PUBLISH from a client (or a bridge).
    ///
    /// # Errors
    ///
    /// [`PublishRefused::PayloadInvalid`]: a schema whose action is `reject` refused it.
    pub fn gate_publish(&self, message: &Arc<Message>) -> Result<Gate, PublishRefused> {
        let Some(g) = self.guarantees() else {
            return Ok(Gate::Route { dedup: None });
        };
        if let Some(schemas) = &g.schemas {
            let verdict = schemas.current().check(
                &message.topic,
                message.properties().content_type.as_deref(),
                &message.payload,
            );
            if let Verdict::Invalid {
                schema_id,
                action,
                on_invalid_v3,
                why,
            } = verdict
            {
                return match action {
                    crate::config::SchemaAction::Reject => Err(PublishRefused::PayloadInvalid {
                        schema_id,
                        why,
                        on_invalid_v3,
                    }),
                    crate::config::SchemaAction::DeadLetter => {
                        // Dropped from its topic (and dead-lettered): counted as a drop.
                        self.metrics.messages_dropped_schema_invalid[message.qos as usize]
                            .increment(1);
                        tracing::debug!(topic = %message.topic, schema = %schema_id, %why, "payload dead-lettered by its schema");
                        Ok(Gate::DeadLettered {
                            gate: self.dead_letter(message, DeadReason::SchemaInvalid, None, None),
                        })
                    }
                };
            }
        }
        if let Some((dedup, key)) = dedup_key(g, message) {
            return Ok(
                match dedup.check(&message.topic, key, crate::storage::now_unix_ms()) {
                    DedupCheck::Fresh { op } => Gate::Route {
                        dedup: self.store.is_some().then_some(op),
                    },
                    DedupCheck::Duplicate => Gate::Duplicate,
                },
            );
        }
        Ok(Gate::Route { dedup: None })
    }

    /// Undoes [`Broker::gate_publish`]'s dedup check of a message whose routing was then
    /// refused (`PublishRefused` from `publish_with`): nothing was routed, so the publisher's
    /// re-send must be taken as new. Only for a `Gate::Route`d message (a schema refusal
    /// never reached the window, and the pair may be an earlier message's).
    pub fn forget_dedup(&self, message: &Message) {
        if let Some((dedup, key)) = self.guarantees().and_then(|g| dedup_key(g, message)) {
            dedup.forget(&message.topic, key);
        }
    }

    /// The value of `[dedup] property` in `message` (`None`: dedup off, or no such user
    /// property, e.g. MQTT 3.x), for the duplicate's log line.
    pub fn dedup_key_of<'m>(&self, message: &'m Message) -> Option<&'m str> {
        self.guarantees()
            .and_then(|g| dedup_key(g, message))
            .map(|(_, key)| key)
    }

    /// Publishes `message`'s dead letter, when dead letters are on, within their rate, and
    /// `message` is not a dead letter itself. Call with no session lock held (it routes).
    /// Returns the dead letter's commit (`None`: nothing to wait for).
    pub fn dead_letter(
        &self,
        message: &Message,
        reason: DeadReason,
        client_id: Option<&ByteString>,
        reason_code: Option<ReasonCode>,
    ) -> Option<Durable> {
        let letters = self.guarantees()?.dead_letters.as_ref()?;
        if letters.is_dead_letter(&message.topic) {
            return None; // never dead-lettered again
        }
        if !letters.take() {
            return None;
        }
        let publisher = message.origin.and_then(|id| self.client_id_of(id));
        let loss = Loss {
            message,
            reason,
            client_id: client_id.map(|c| &**c),
            publisher: publisher.as_deref(),
            reason_code,
        };
        let letter = letters.build(&loss, SystemTime::now());
        match self.publish(Arc::new(letter), None) {
            Ok(routed) => routed.durable,
            Err(error) => {
                tracing::warn!(%error, topic = %message.topic, reason = reason.as_str(), "dead letter refused");
                None
            }
        }
    }

    /// The client id of a live session by its id (dead letters' `publisher`): a walk of the
    /// sessions, only ever on a drop, bounded by the dead-letter rate.
    fn client_id_of(&self, id: SessionId) -> Option<ByteString> {
        self.sessions
            .lock()
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.client_id.clone())
    }
}

/// The window and the key of `message` when dedup is on and the message carries the configured
/// user property (its first occurrence); MQTT 3.x messages have none.
fn dedup_key<'g, 'm>(g: &'g Guarantees, message: &'m Message) -> Option<(&'g Dedup, &'m str)> {
    let dedup = g.dedup.as_ref()?;
    let key = message
        .properties()
        .user_properties
        .iter()
        .find(|(k, _)| k == dedup.property())
        .map(|(_, v)| &**v)?;
    Some((dedup, key))
}
