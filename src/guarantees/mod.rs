//! Guarantees MQTT brokers do not give (issue 16): dead letters, poison messages (delivery
//! limits), schema contracts and deduplication. The backlog watch lives with the broker's
//! other figures (`broker::backlog`).
//!
//! Every part is optional: [`Guarantees`] is one of the parts the broker is built with
//! (`broker::Parts`, by `server::start`), holding only what the configuration turns on, so a broker without schemas or dedup pays one pointer test per PUBLISH for them. The
//! broker calls in at fixed points: `Broker::gate_publish` (schema, then dedup: once per
//! PUBLISH, before fan-out) and `Broker::dead_letter` (every drop that has a reason, called
//! with no session lock held). Nothing here takes a session lock or does I/O on the publish
//! path.

pub(crate) mod dead_letter;
pub(crate) mod dedup;
mod metrics;
pub(crate) mod schema;

pub use dead_letter::DeadReason;

pub(crate) use dead_letter::DeadLetters;
pub(crate) use dedup::{key_of, topic_key, Dedup, DedupCheck};
pub(crate) use metrics::{DedupMetrics, GuaranteeMetrics};
pub(crate) use schema::SchemaSlot;
pub use schema::Verdict;

use std::sync::Arc;

/// What the configuration turned on; `None` parts cost nothing.
#[derive(Debug, Default)]
pub struct Guarantees {
    /// `[dead_letter] enabled`.
    pub dead_letters: Option<DeadLetters>,
    /// `[[schema]]` entries, compiled; swapped whole on SIGHUP.
    pub schemas: Option<Arc<SchemaSlot>>,
    /// `[dedup] property`. Shared with the broker's key spool, which forgets the keys of a
    /// batch the store refused.
    pub dedup: Option<Arc<Dedup>>,
}

impl Guarantees {
    /// What `config` turns on, schemas compiled.
    ///
    /// # Errors
    ///
    /// A schema file that cannot be read or compiled.
    pub fn from_config(config: &crate::config::Config) -> Result<Guarantees, schema::SchemaError> {
        let schemas = if config.schemas.is_empty() {
            None
        } else {
            Some(Arc::new(SchemaSlot::load(&config.schemas)?))
        };
        Ok(Guarantees {
            dead_letters: config
                .dead_letter
                .enabled
                .then(|| DeadLetters::new(&config.dead_letter)),
            schemas,
            dedup: config
                .dedup
                .is_enabled()
                .then(|| Arc::new(Dedup::new(&config.dedup))),
        })
    }
}
