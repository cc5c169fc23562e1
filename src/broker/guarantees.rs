//! The broker's side of the guarantees seam (`crate::guarantees`): where a PUBLISH meets the
//! schema check and the dedup window (`gate_publish`, once per PUBLISH, before fan-out), and
//! where a dropped message becomes a dead letter (`dead_letter`).
//!
//! Unconfigured, every entry point is one check of an empty `Option`.
//!
//! Must not: take a session lock; be called with one held; forget a dedup pair on a schema
//! refusal (it may be an earlier message's).

use std::sync::Arc;
use std::time::SystemTime;

use bytestring::ByteString;

use super::session::Victims;
use super::{Broker, EnqueueOutcome, Message, PublishRefused, SessionId};
use crate::codec::ReasonCode;
use crate::guarantees::dead_letter::Loss;
use crate::guarantees::{DeadLetters, DeadReason, Dedup, DedupCheck, Guarantees, Verdict};
use crate::storage::{Durable, Op, Store};

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
    /// What is configured; `None` in a broker built without `server::start`.
    pub fn guarantees(&self) -> Option<&Guarantees> {
        self.guarantees.as_ref()
    }

    /// The schema check, then the dedup window, for one PUBLISH from a client (or a bridge).
    /// `publisher`: whose shares it spends, the publishing session's
    /// [`Session::share_key`](super::Session::share_key) (its identity, not the session).
    ///
    /// # Errors
    ///
    /// [`PublishRefused::PayloadInvalid`]: a schema whose action is `reject` refused it.
    pub fn gate_publish(
        &self,
        message: &Arc<Message>,
        publisher: u64,
    ) -> Result<Gate, PublishRefused> {
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
                            gate: self.dead_letter(
                                message,
                                DeadReason::SchemaInvalid,
                                None,
                                publisher,
                                None,
                            ),
                        })
                    }
                };
            }
        }
        if let Some((dedup, key)) = dedup_key(g, message) {
            // A long topic as its digest, in the window and in the store alike.
            let topic = crate::guarantees::topic_key(&message.topic);
            return Ok(
                match dedup.check_from(&topic, &key, publisher, crate::storage::now_unix_ms()) {
                    DedupCheck::Fresh { expires_at_unix_ms } => Gate::Route {
                        dedup: self.store.is_some().then(|| {
                            Box::new(Op::PutDedup {
                                // Copied: the topic may be a slice of its whole packet,
                                // which the store's state must not keep alive.
                                topic: ByteString::from(&*topic),
                                key: ByteString::from(&*key),
                                expires_at_unix_ms,
                            })
                        }),
                    },
                    DedupCheck::Duplicate => Gate::Duplicate,
                },
            );
        }
        Ok(Gate::Route { dedup: None })
    }

    /// Stores a dedup key that came without anything of its message to store (no persistent
    /// subscriber, not retained), batched with others ([`super::dedup_spool::DedupSpool`]); resolves once it is
    /// durable, which the PUBACK awaits. A key that came *with* its message is never
    /// spooled: both are in one submit, durable or not together.
    pub(super) fn spool_dedup_key(
        &self,
        store: &Arc<dyn Store>,
        op: Op,
    ) -> Result<Durable, crate::storage::StorageError> {
        self.dedup_spool.submit(store, op)
    }

    /// What a duplicate's PUBACK waits for: everything stored so far, its first copy's key
    /// included (which may still be waiting in the spool).
    pub fn dedup_barrier(&self) -> Option<Durable> {
        let store = self.store.as_ref()?;
        Some(self.dedup_spool.barrier(store))
    }

    /// Undoes [`Broker::gate_publish`]'s dedup check of a message whose routing was then
    /// refused (`PublishRefused` from `publish_with`): nothing was routed, so the publisher's
    /// re-send must be taken as new. Only for a `Gate::Route`d message (a schema refusal
    /// never reached the window, and the pair may be an earlier message's).
    pub fn forget_dedup(&self, message: &Message) {
        if let Some((dedup, key)) = self.guarantees().and_then(|g| dedup_key(g, message)) {
            dedup.forget(&message.topic, &key);
        }
    }

    /// The value of `[dedup] property` in `message` (`None`: dedup off, or no such user
    /// property, e.g. MQTT 3.x), for the duplicate's log line.
    pub fn dedup_key_of<'m>(&self, message: &'m Message) -> Option<&'m str> {
        self.guarantees()
            .and_then(|g| raw_dedup_key(g, message))
            .map(|(_, key)| key)
    }

    /// The dead-letter prefix in force, when dead letters are on.
    pub fn dead_letters(&self) -> Option<&DeadLetters> {
        self.guarantees()?.dead_letters.as_ref()
    }

    /// True for a topic under the dead-letter prefix: reserved like `$SYS`, so no client,
    /// will or bridge publishes there (a dead letter is the broker's word), and a dead letter
    /// is never dead-lettered again. One `Option` check and a prefix compare.
    pub fn is_dead_letter_topic(&self, topic: &str) -> bool {
        self.dead_letters()
            .is_some_and(|letters| letters.is_dead_letter(topic))
    }

    /// Publishes `message`'s dead letter, when dead letters are on, within their rate, and
    /// `message` is not a dead letter itself. Call with no session lock held (it routes).
    /// `client_id`: the session where it was lost, if any; `source`: whose share of the rate
    /// it spends, that session's (else the publisher's)
    /// [`Session::share_key`](super::Session::share_key), an identity (issue 35, pass 7b,
    /// P3: a client id was a source, so twelve of one user's spent the whole rate); a message
    /// an anonymous client published spends the anonymous clients' common share instead
    /// (thirteenth pass, F1: a stranger's messages too large for a user's session spent that
    /// user's share). Returns the dead letter's commit (`None`: nothing to wait for).
    pub fn dead_letter(
        &self,
        message: &Message,
        reason: DeadReason,
        client_id: Option<&ByteString>,
        source: u64,
        reason_code: Option<ReasonCode>,
    ) -> Option<Durable> {
        let letters = self.dead_letters()?;
        if letters.is_dead_letter(&message.topic) {
            return None; // never dead-lettered again
        }
        let source = if message.published_anonymously() {
            ANONYMOUS_PUBLISHERS
        } else {
            source
        };
        if !letters.take(source) {
            self.guarantee_metrics
                .dead_letters_dropped_rate
                .increment(1);
            return None;
        }
        let publisher = message
            .origin()
            .and_then(|id| self.client_id_of(letters, id));
        let loss = Loss {
            topic: &message.topic,
            payload: &message.payload,
            properties: message.properties(),
            reason,
            client_id: client_id.map(|c| &**c),
            publisher: publisher.as_deref(),
            reason_code,
        };
        let mut letter = Message::from_publish(letters.build(&loss, SystemTime::now()), None);
        // What an anonymous client causes waits in the queues of whoever reads dead letters:
        // it counts in the anonymous share, and past it is not published (issue 35, twelfth
        // adversarial pass, U4), whether the anonymous client lost it (its session) or
        // published it, wherever it was lost (thirteenth pass, F1: an anonymous publisher's
        // messages too large for a password user's session filled the budget with letters).
        if super::owner::is_anonymous_key(source) || message.published_anonymously() {
            // A bridge's remote's message: its bridge's share (seventeenth pass, D5).
            let share = message.stranger_share();
            if !share.has_room(letter.size() as u64, &self.flow.memory) {
                self.guarantee_metrics
                    .dead_letters_dropped_share
                    .increment(1);
                return None;
            }
            letter.charge_to(share);
        }
        match self.publish(Arc::new(letter), None) {
            Ok(routed) => {
                self.guarantee_metrics.dead_letters[reason.index()].increment(1);
                routed.durable
            }
            Err(error) => {
                self.guarantee_metrics
                    .dead_letters_dropped_refused
                    .increment(1);
                tracing::warn!(%error, topic = %message.topic, reason = reason.as_str(), "dead letter refused");
                None
            }
        }
    }

    /// The client id of a session by its id (dead letters' `publisher`). A flood of drops
    /// usually comes from one publisher: the last answer is kept (session ids are never
    /// reused, so it cannot go stale), and only another publisher's message walks the
    /// sessions, which happens at most `max_rate` times a second.
    fn client_id_of(&self, letters: &DeadLetters, id: SessionId) -> Option<ByteString> {
        if let Some(client_id) = letters.cached_publisher(id) {
            return Some(client_id);
        }
        let client_id = self
            .sessions
            .lock()
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.client_id.clone())?;
        letters.cache_publisher(id, client_id.clone());
        Some(client_id)
    }
}

/// The dead-letter rate share of messages anonymous clients published, wherever they were
/// lost: one for all of them (they cannot be told apart by the message), marked anonymous
/// like their own share keys (`owner::is_anonymous_key`; a session's is a 64-bit hash, 3
/// with a chance of one in 2^62).
const ANONYMOUS_PUBLISHERS: u64 = 3;

/// Messages lost to full queues while routing: noted under no lock by the router (an `Arc`
/// and a client id each, only for an actual drop and only with dead letters on) and
/// dead-lettered once no session lock is held ([`Broker::dead_letter_losses`]). Empty, it
/// allocates nothing.
#[derive(Debug, Default)]
pub(super) struct QueueLosses {
    /// Deliveries a drop-oldest admission pushed out: gone from the session already (with
    /// the session's client id and share key).
    victims: Vec<(ByteString, u64, Arc<Message>)>,
    /// New deliveries a drop-new admission refused: lost only once the message is accepted.
    refused: Vec<(ByteString, u64, Arc<Message>)>,
}

impl QueueLosses {
    /// Notes what admitting a delivery of `message` to `session` lost: the
    /// drop-oldest victims (taken out of `victims`), and `message` itself for a drop-new
    /// refusal. A publisher refused under `queue_overflow = "refuse"` never gets here (it
    /// was refused before routing: not a drop), nor does QoS 0 to an offline session without
    /// `queue_qos0_messages` (not a drop reason).
    pub(super) fn note(
        &mut self,
        broker: &Broker,
        session: &super::Session,
        outcome: EnqueueOutcome,
        message: &Arc<Message>,
        victims: &mut Victims,
    ) {
        let dropped_new = outcome == EnqueueOutcome::DroppedQueueFull;
        if !dropped_new && victims.no_messages() {
            return;
        }
        let victim_messages = victims.take_messages();
        if broker.dead_letters().is_none() {
            return;
        }
        let source = session.share_key();
        for victim in victim_messages {
            self.victims
                .push((session.client_id.clone(), source, victim));
        }
        if dropped_new {
            self.refused
                .push((session.client_id.clone(), source, Arc::clone(message)));
        }
    }

    /// True when nothing is left to dead-letter (the common case: one branch).
    pub(super) fn is_empty(&self) -> bool {
        self.victims.is_empty() && self.refused.is_empty()
    }

    /// Publishes the victims' dead letters (no session lock held). Before the submit that
    /// removes their stored entries: one log, in submit order, so a crash between the two
    /// keeps the message somewhere.
    pub(super) fn publish_victims(&mut self, broker: &Broker) {
        Self::publish(broker, &mut self.victims);
    }

    /// Publishes every dead letter noted (no session lock held).
    pub(super) fn publish_all(&mut self, broker: &Broker) {
        Self::publish(broker, &mut self.victims);
        Self::publish(broker, &mut self.refused);
    }

    /// Publishes (and empties) `lost`: each a full queue's loss in its session.
    fn publish(broker: &Broker, lost: &mut Vec<(ByteString, u64, Arc<Message>)>) {
        for (client_id, source, message) in lost.drain(..) {
            broker.dead_letter(
                &message,
                DeadReason::QueueFull,
                Some(&client_id),
                source,
                None,
            );
        }
    }
}

/// The window and the key of `message` when dedup is on and the message carries the configured
/// user property (its first occurrence; a long one as its digest, `guarantees::key_of`); MQTT
/// 3.x messages have none.
fn dedup_key<'g, 'm>(
    g: &'g Guarantees,
    message: &'m Message,
) -> Option<(&'g Dedup, std::borrow::Cow<'m, str>)> {
    raw_dedup_key(g, message).map(|(dedup, key)| (dedup, crate::guarantees::key_of(key)))
}

/// [`dedup_key`] as the message carries it (for the log).
fn raw_dedup_key<'g, 'm>(g: &'g Guarantees, message: &'m Message) -> Option<(&'g Dedup, &'m str)> {
    let dedup = g.dedup.as_ref()?;
    let key = message
        .properties()
        .user_properties
        .iter()
        .find(|(k, _)| k == dedup.property())
        .map(|(_, v)| &**v)?;
    Some((dedup, key))
}
