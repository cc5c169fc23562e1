//! Dead letters (`[dead_letter]`): a message dropped instead of delivered is published again
//! on `<prefix><original topic>`, with its payload and properties and user properties saying
//! why (`reason`), for which session (`client_id`), from whom (`publisher`) and when (`time`),
//! so a persistent `<prefix>#` subscriber keeps every loss durably.
//!
//! This module builds the dead letter and bounds their rate; `Broker::dead_letter` routes
//! it (as a message from nobody, like a will) with no session lock held. A dead letter is
//! never dead-lettered again.
//!
//! Must not: route (the broker does).

use std::time::{Duration, SystemTime};

use bytestring::ByteString;
use parking_lot::Mutex;

use crate::codec::{Publish, PublishProperties, QoS, ReasonCode};
use crate::config::DeadLetterConfig;

/// Why a message was dropped: the `reason` user property of its dead letter and the `reason`
/// label of `postbox_dead_letters_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// A session's queue overflowed (drop-new: the new message; drop-oldest: the oldest).
    QueueFull,
    /// Its Message Expiry Interval ran out while queued (MQTT-3.3.2-5).
    Expired,
    /// Larger than the client's Maximum Packet Size (MQTT-3.1.2-25).
    TooLarge,
    /// Its payload broke a `[[schema]]` whose action is `dead-letter`.
    SchemaInvalid,
    /// Sent `mqtt.max_deliveries` times without an acknowledgement.
    MaxDeliveries,
    /// A v5 subscriber answered PUBACK / PUBREC with a reason code ≥ 0x80.
    Rejected,
    /// Queued or in flight for a session whose identity may no longer read its topic: the
    /// ACL changed (SIGHUP), or the session came back under other claims (issue 35).
    NotAuthorized,
}

impl DeadReason {
    /// Every reason, in label order.
    pub const ALL: [DeadReason; 7] = [
        DeadReason::QueueFull,
        DeadReason::Expired,
        DeadReason::TooLarge,
        DeadReason::SchemaInvalid,
        DeadReason::MaxDeliveries,
        DeadReason::Rejected,
        DeadReason::NotAuthorized,
    ];

    /// The value of the `reason` property and label.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::QueueFull => "queue_full",
            DeadReason::Expired => "expired",
            DeadReason::TooLarge => "too_large",
            DeadReason::SchemaInvalid => "schema_invalid",
            DeadReason::MaxDeliveries => "max_deliveries",
            DeadReason::Rejected => "rejected",
            DeadReason::NotAuthorized => "not_authorized",
        }
    }

    /// Index in [`DeadReason::ALL`] (metric arrays).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One dropped message (its topic, payload and properties as routed) and its circumstances.
/// Plain parts rather than the broker's `Message`, so this module needs nothing of the broker.
#[derive(Debug, Clone, Copy)]
pub struct Loss<'a> {
    /// The topic it was published on.
    pub topic: &'a str,
    /// Its payload.
    pub payload: &'a bytes::Bytes,
    /// Its properties as routed.
    pub properties: &'a PublishProperties,
    /// Why it was dropped.
    pub reason: DeadReason,
    /// The session that lost it, when there is one (not for `schema_invalid`).
    pub client_id: Option<&'a str>,
    /// The publisher's client id, when known.
    pub publisher: Option<&'a str>,
    /// The subscriber's reason code, for `rejected`.
    pub reason_code: Option<ReasonCode>,
}

/// The dead-letter publisher's settings and rate bound.
#[derive(Debug)]
pub struct DeadLetters {
    prefix: String,
    bucket: Option<Mutex<Buckets>>,
    /// The last publisher looked up (the broker's session id → client id): a flood of drops
    /// from one publisher walks the sessions once (`Broker::client_id_of`).
    last_publisher: Mutex<Option<(u64, ByteString)>>,
}

/// A token bucket of `rate` per second, one second's worth as burst.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    fn full(rate: f64, at: std::time::Instant) -> Bucket {
        Bucket {
            rate,
            tokens: rate,
            at,
        }
    }

    /// Refills for the time passed; true when a token is there (not taken).
    fn refill(&mut self, now: std::time::Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.tokens >= 1.0
    }
}

/// One source's part of `max_rate`, in tenths: the identity of the session where messages are
/// lost (or of their publisher; `broker::owner::share_key`: a user, else an address) gets a
/// tenth of the broker's dead-letter rate, so one client cannot spend all of it (issue 35,
/// seventh pass, N5: one client's own drops took the whole budget and others' dead letters
/// were not published; pass 7b, P3: keyed by client id, twelve sessions of one user took it
/// all again).
const SOURCE_SHARE_DIVISOR: f64 = 10.0;
/// The part of the broker's bucket kept for sources that have used little: a source that
/// has spent more than half of its own burst takes a token only while the broker's bucket
/// holds more than this part of its rate, so sources flooding at their share together can
/// never empty it, and a quiet source's dead letter still finds one (pass 7b, P3).
const RESERVED: f64 = 0.5;
/// Sources remembered at most; beyond it, the full ones (which are as good as new) go.
const MAX_SOURCES: usize = 1024;

/// The broker's bucket and one per source, under one lock.
#[derive(Debug)]
struct Buckets {
    all: Bucket,
    sources: std::collections::HashMap<u64, Bucket>,
}

impl DeadLetters {
    /// From `[dead_letter]` (only when `enabled`).
    pub fn new(config: &DeadLetterConfig) -> DeadLetters {
        DeadLetters {
            prefix: config.prefix.clone(),
            bucket: (config.max_rate > 0).then(|| {
                let rate = f64::from(config.max_rate);
                Mutex::new(Buckets {
                    all: Bucket::full(rate, std::time::Instant::now()),
                    sources: std::collections::HashMap::new(),
                })
            }),
            last_publisher: Mutex::new(None),
        }
    }

    /// The client id cached for session `id`, if it is the last one looked up.
    pub fn cached_publisher(&self, id: u64) -> Option<ByteString> {
        match &*self.last_publisher.lock() {
            Some((cached, client_id)) if *cached == id => Some(client_id.clone()),
            _ => None,
        }
    }

    /// Remembers `client_id` as session `id`'s (session ids are never reused, so the entry
    /// cannot go stale; it is only replaced by the next publisher's).
    pub fn cache_publisher(&self, id: u64, client_id: ByteString) {
        *self.last_publisher.lock() = Some((id, client_id));
    }

    /// The topic prefix of dead letters.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// True for a topic under the prefix: a dead letter (never dead-lettered again), and a
    /// topic clients may not publish to.
    pub fn is_dead_letter(&self, topic: &str) -> bool {
        topic.starts_with(&self.prefix)
    }

    /// Takes one token of the broker's and one of `source`'s (the share key of the identity
    /// where the message was lost, or of its publisher; 0: the broker's own); false when
    /// either is spent, or when the source has used more than half of its own burst and the
    /// broker's bucket is down to its [`RESERVED`] part (the caller counts the drop).
    pub fn take(&self, source: u64) -> bool {
        self.take_at(source, std::time::Instant::now())
    }

    /// [`DeadLetters::take`] at `now`.
    fn take_at(&self, source: u64, now: std::time::Instant) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let mut b = bucket.lock();
        let rate = (b.all.rate / SOURCE_SHARE_DIVISOR).max(1.0);
        if !b.sources.contains_key(&source) && b.sources.len() >= MAX_SOURCES {
            b.sources.retain(|_, s| !s.refill(now) || s.tokens < s.rate);
        }
        let all_has = b.all.refill(now);
        let reserve = b.all.rate * RESERVED;
        let all_tokens = b.all.tokens;
        let mine = b
            .sources
            .entry(source)
            .or_insert_with(|| Bucket::full(rate, now));
        if !mine.refill(now) {
            return false;
        }
        // A source that has used little draws from the whole bucket; one that has used more
        // only from above the reserve. What it asks for is spent from its own bucket even
        // when the broker's refuses it: a flood refused by the reserve stays a flood, it
        // does not grow quiet again while waiting.
        let quiet = mine.tokens > mine.rate / 2.0;
        mine.tokens -= 1.0;
        if !all_has || (!quiet && all_tokens < reserve + 1.0) {
            return false;
        }
        b.all.tokens -= 1.0;
        true
    }

    /// The dead letter of `loss`, stamped `now`: QoS 1, not retained, the original payload
    /// and properties without Message Expiry, plus `reason`, `client_id`, `publisher`, `time`
    /// (and `reason_code` for `rejected`) user properties; the broker publishes it as a
    /// message from nobody.
    pub fn build(&self, loss: &Loss<'_>, now: SystemTime) -> Publish {
        let source = loss.properties;
        let mut properties = PublishProperties {
            payload_format_indicator: source.payload_format_indicator,
            message_expiry_interval: None,
            topic_alias: None,
            response_topic: source.response_topic.clone(),
            correlation_data: source.correlation_data.clone(),
            user_properties: source.user_properties.clone(),
            subscription_identifiers: Default::default(),
            content_type: source.content_type.clone(),
        };
        let user = &mut properties.user_properties;
        user.push((
            ByteString::from_static("reason"),
            ByteString::from_static(loss.reason.as_str()),
        ));
        if let Some(client_id) = loss.client_id {
            user.push((
                ByteString::from_static("client_id"),
                ByteString::from(client_id),
            ));
        }
        if let Some(publisher) = loss.publisher {
            user.push((
                ByteString::from_static("publisher"),
                ByteString::from(publisher),
            ));
        }
        let time = humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + Duration::from_millis(unix_ms(now)),
        );
        user.push((
            ByteString::from_static("time"),
            ByteString::from(time.to_string()),
        ));
        if let Some(code) = loss.reason_code {
            user.push((
                ByteString::from_static("reason_code"),
                ByteString::from(format!("0x{:02X}", code.0)),
            ));
        }
        let mut topic = String::with_capacity(self.prefix.len() + loss.topic.len());
        topic.push_str(&self.prefix);
        topic.push_str(loss.topic);
        Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: ByteString::from(topic),
            packet_id: 0,
            payload: loss.payload.clone(),
            properties,
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(max_rate: u32) -> DeadLetters {
        DeadLetters::new(&DeadLetterConfig {
            enabled: true,
            prefix: "$dlq/".to_owned(),
            max_rate,
        })
    }

    fn user<'a>(m: &'a Publish, key: &str) -> Vec<&'a str> {
        m.properties
            .user_properties
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| &**v)
            .collect()
    }

    /// The dead letter: `<prefix><topic>`, QoS 1, not retained, the payload and the
    /// original properties without Message Expiry, plus `reason`, `client_id`, `publisher`,
    /// `time` (RFC 3339, UTC) and, for `rejected`, `reason_code`.
    #[test]
    fn build_carries_the_message_and_why_it_was_lost() {
        let original = Publish {
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: "a/b".into(),
            packet_id: 9,
            payload: bytes::Bytes::from_static(b"payload"),
            properties: PublishProperties {
                message_expiry_interval: Some(30),
                content_type: Some("application/json".into()),
                response_topic: Some("reply/x".into()),
                correlation_data: Some(bytes::Bytes::from_static(b"c")),
                payload_format_indicator: Some(1),
                user_properties: vec![("k".into(), "v".into())],
                ..Default::default()
            },
            ..Default::default()
        };
        let at = std::time::UNIX_EPOCH + Duration::from_millis(1_764_676_800_123);
        let letter = letters(0).build(
            &Loss {
                topic: &original.topic,
                payload: &original.payload,
                properties: &original.properties,
                reason: DeadReason::Rejected,
                client_id: Some("sub-1"),
                publisher: Some("pub-1"),
                reason_code: Some(ReasonCode(0x83)),
            },
            at,
        );
        assert_eq!(&*letter.topic, "$dlq/a/b");
        assert_eq!(letter.qos, QoS::AtLeastOnce);
        assert!(!letter.retain);
        assert_eq!(&letter.payload[..], b"payload");
        let p = &letter.properties;
        assert_eq!(p.message_expiry_interval, None);
        assert_eq!(p.content_type.as_deref(), Some("application/json"));
        assert_eq!(p.response_topic.as_deref(), Some("reply/x"));
        assert_eq!(p.correlation_data.as_deref(), Some(&b"c"[..]));
        assert_eq!(p.payload_format_indicator, Some(1));
        assert_eq!(user(&letter, "k"), ["v"]);
        assert_eq!(user(&letter, "reason"), ["rejected"]);
        assert_eq!(user(&letter, "client_id"), ["sub-1"]);
        assert_eq!(user(&letter, "publisher"), ["pub-1"]);
        assert_eq!(user(&letter, "time"), ["2025-12-02T12:00:00.123Z"]);
        assert_eq!(user(&letter, "reason_code"), ["0x83"]);
        // Without a session, a publisher or a code, those properties are left out.
        let bare = letters(0).build(
            &Loss {
                topic: &original.topic,
                payload: &original.payload,
                properties: &original.properties,
                reason: DeadReason::SchemaInvalid,
                client_id: None,
                publisher: None,
                reason_code: None,
            },
            at,
        );
        for key in ["client_id", "publisher", "reason_code"] {
            assert!(user(&bare, key).is_empty(), "{key}");
        }
        assert_eq!(user(&bare, "reason"), ["schema_invalid"]);
    }

    /// `max_rate` gives one second's worth as burst, then refuses; 0 never refuses.
    #[test]
    fn the_rate_bound_allows_a_seconds_worth() {
        let bounded = letters(3);
        let taken = (1..=10).filter(|&i| bounded.take(i)).count();
        assert!((3..=4).contains(&taken), "{taken}");
        let unbounded = letters(0);
        assert!((0..1000).all(|_| unbounded.take(1)));
    }

    /// Issue 35, seventh pass, N5: one source (the session where messages are lost) gets a
    /// tenth of `max_rate`, so its flood leaves the rest for others' dead letters; before,
    /// one client's own drops spent the broker-wide budget.
    #[test]
    fn one_source_cannot_spend_everyone_elses_rate() {
        let bounded = letters(100);
        let (mallory, sensor1) = (1, 2);
        let flooder = (0..1000).filter(|_| bounded.take(mallory)).count();
        assert!((10..=11).contains(&flooder), "{flooder}");
        assert!(
            bounded.take(sensor1),
            "another source still gets its dead letter"
        );
        // Many sources together still stay within the broker's rate.
        let many = (100..1100).filter(|&i| bounded.take(i)).count();
        assert!(many <= 100, "{many}");
    }

    /// Issue 35, pass 7b, P3: sources that keep flooding at their share (here twelve, each
    /// as much as it may, second after second) take the broker's bucket down to its reserve
    /// and no further: a quiet source's dead letter still gets through. Before, twelve
    /// sources at a tenth each spent it all.
    #[test]
    fn floods_at_their_share_leave_the_reserve_to_quiet_sources() {
        let bounded = letters(100);
        let start = std::time::Instant::now();
        let mut taken = 0;
        // Ten seconds, every 10 ms each flooder asks for as much as it gets; flooder k
        // starts at 30k ms, so their refills do not come all in one tick.
        for tick in 0..1000u32 {
            let now = start + Duration::from_millis(u64::from(tick) * 10);
            for source in (1..=12u64).filter(|k| u64::from(tick) >= 3 * k) {
                for _ in 0..20 {
                    if bounded.take_at(source, now) {
                        taken += 1;
                    }
                }
            }
            if tick >= 150 && tick % 25 == 0 {
                // After the first bursts: a quiet source always gets its letter.
                assert!(bounded.take_at(1000 + u64::from(tick), now), "tick {tick}");
            }
        }
        // Within the broker's rate, and far from the reserve's half.
        assert!(taken <= 100 * 11, "{taken}");
        assert!(taken >= 200, "{taken}");
    }

    /// A source over half its own burst takes no token from the broker's reserve; one
    /// under it does (deterministic, one instant).
    #[test]
    fn a_busy_source_stops_at_the_reserve_a_quiet_one_does_not() {
        let bounded = letters(20); // broker 20, each source 2, reserve 10
        let now = std::time::Instant::now();
        // Quiet sources (each its first of two tokens) bring the broker's bucket to 11.
        for source in 1..=9 {
            assert!(bounded.take_at(source, now));
        }
        // Source 1 has used half its burst: busy. 11 > the reserve: it gets one more.
        assert!(bounded.take_at(1, now));
        // Source 2, busy too, finds the broker's bucket at 10: the reserve, refused.
        assert!(!bounded.take_at(2, now));
        // A quiet source still takes from the reserve.
        assert!(bounded.take_at(50, now));
    }

    /// Only topics under the prefix are dead letters.
    #[test]
    fn is_dead_letter_is_a_prefix_test() {
        let l = letters(0);
        assert!(l.is_dead_letter("$dlq/a"));
        assert!(!l.is_dead_letter("dlq/a"));
        assert!(!l.is_dead_letter("$dlqx"));
    }
}
