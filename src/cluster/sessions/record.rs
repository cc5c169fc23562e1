//! A session's record in the `pb_sessions` bucket: what it holds as JSON, and the
//! [`Restore`] another node rebuilds it from.

use bytes::Bytes;
use bytestring::ByteString;
use serde::{Deserialize, Serialize};

use crate::broker::{HeldSession, Message, Restore};
use crate::cluster::wire;
use crate::codec::{LastWill, QoS, SubscriptionOptions};
use crate::storage::SessionOwner;

/// One subscription in a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::cluster) struct SubRecord {
    /// Topic filter.
    #[serde(rename = "f")]
    filter: String,
    /// Granted QoS.
    #[serde(rename = "q")]
    qos: u8,
    /// No Local.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[serde(rename = "nl")]
    no_local: bool,
    /// Retain As Published.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[serde(rename = "rap")]
    retain_as_published: bool,
    /// Retain Handling.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[serde(rename = "rh")]
    retain_handling: u8,
    /// Subscription Identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "id")]
    identifier: Option<u32>,
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// A session's record (JSON in the bucket). The JSON keeps the short names the first nodes
/// wrote (`subs`, `wd`, `q2`, ...): a rolling upgrade mixes versions, and every record is
/// read by both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::cluster) struct Record {
    /// The owning node.
    pub(in crate::cluster) owner: String,
    /// Seconds the session outlives its connection (0: it ends with it).
    pub(in crate::cluster) expiry: u32,
    /// Its subscriptions.
    #[serde(default)]
    #[serde(rename = "subs")]
    pub(in crate::cluster) subscriptions: Vec<SubRecord>,
    /// Replay from this stream sequence to find every message it has not acknowledged.
    #[serde(default)]
    pub(in crate::cluster) cursor: u64,
    /// Written by the previous owner: it gave the session up, `subscriptions` and `cursor` are final.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(in crate::cluster) handed: bool,
    /// The owner's incarnation ([`Records::life`]): a record of this node's id from an
    /// earlier run is an orphan like a dead node's.
    #[serde(default)]
    pub(in crate::cluster) life: u64,
    /// The will while it may still be published: an MQTT 5 PUBLISH frame ([`wire`]),
    /// base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::cluster) will: Option<String>,
    /// Its Will Delay Interval (seconds), while a connection holds the session.
    #[serde(default, skip_serializing_if = "is_zero32")]
    #[serde(rename = "wd")]
    pub(in crate::cluster) will_delay: u32,
    /// When the will is due (unix ms), once the connection ended with it pending.
    #[serde(default, skip_serializing_if = "is_zero64")]
    #[serde(rename = "wat")]
    pub(in crate::cluster) will_at: u64,
    /// When the session's connection ended (unix ms); 0 while one holds it.
    #[serde(default, skip_serializing_if = "is_zero64")]
    #[serde(rename = "gone")]
    pub(in crate::cluster) ended_at: u64,
    /// Held by a node that took it over from a dead one, with no connection: its will and
    /// expiry run there ([`crate::cluster::orphans`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(in crate::cluster) adopted: bool,
    /// Claimed with Clean Start: the previous owner hands nothing over (MQTT-3.1.2-4).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(in crate::cluster) fresh: bool,
    /// QoS 2 deliveries in flight: packet id and stream sequence (0: PUBREL sent, awaiting
    /// PUBCOMP). The next owner sends them again with their packet ids ([`Restore::qos2`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[serde(rename = "q2")]
    pub(in crate::cluster) qos2: Vec<(u16, u64)>,
    /// The packet ids among `qos2` of shared groups' deliveries ([`Restore::qos2_shared`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[serde(rename = "q2s")]
    pub(in crate::cluster) qos2_shared: Vec<u16>,
    /// Written by a claim: the owner of the record it replaced (empty: none, or not a claim).
    /// Only that node may answer with a hand-over ([`hand_over`]): another node's local copy
    /// of the session (one its store brought back after the session moved away while it
    /// was down) is stale, and written over the claim it would replace the live session's
    /// state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[serde(rename = "from")]
    pub(in crate::cluster) claimed_from: String,
    /// The life of that owner ([`Record::life`]).
    #[serde(default, skip_serializing_if = "is_zero64")]
    #[serde(rename = "from_life")]
    pub(in crate::cluster) claimed_from_life: u64,
    /// Whose session it is (issue 35, [`Who`]): a claim by another identity is refused (or
    /// starts clean, as `auth.session_binding` says). Absent in records of older nodes:
    /// unbound, the next claim binds it.
    #[serde(default, skip_serializing_if = "Who::is_unbound")]
    pub(in crate::cluster) who: Who,
    /// Sequences at or above `cursor` of QoS 2 messages the client has taken already
    /// ([`crate::cluster::taken`]): the next owner leaves them out. Absent in records of older
    /// nodes: none known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[serde(rename = "tk")]
    pub(in crate::cluster) taken: Vec<u64>,
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero32(v: &u32) -> bool {
    *v == 0
}

// serde's `skip_serializing_if` passes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero64(v: &u64) -> bool {
    *v == 0
}

/// A will as it goes into a record: the message as a frame, base64.
pub(in crate::cluster) fn encode_will(node: &str, will: &LastWill) -> Option<String> {
    use base64::Engine as _;
    let message = Message::from_will(will.clone());
    let frame = wire::encode(node, 0, &message).ok()?;
    Some(base64::engine::general_purpose::STANDARD.encode(frame))
}

/// The message of a record's will.
pub(in crate::cluster) fn decode_will(will: &str) -> Option<Message> {
    use base64::Engine as _;
    let frame = base64::engine::general_purpose::STANDARD
        .decode(will)
        .ok()?;
    // A will is marked by whoever publishes it (`Broker::publish_will_of`, by its owner).
    let (_, _, publish, _) = wire::decode(&frame).ok()?;
    Some(Message::from_publish(publish, None))
}

/// [`SessionOwner`] as a record holds it: absent (unbound), `"anonymous"`, or
/// `{"user": "<name>"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(in crate::cluster) enum Who {
    /// [`SessionOwner::Unbound`].
    #[default]
    Unbound,
    /// [`SessionOwner::Anonymous`].
    Anonymous,
    /// [`SessionOwner::User`].
    User(String),
}

impl Who {
    pub(super) fn is_unbound(&self) -> bool {
        *self == Who::Unbound
    }

    pub(super) fn of(owner: &SessionOwner) -> Who {
        match owner {
            SessionOwner::Unbound => Who::Unbound,
            SessionOwner::Anonymous => Who::Anonymous,
            SessionOwner::User(user) => Who::User(user.to_string()),
        }
    }

    /// The session owner it stands for (the identity its will is checked under).
    pub(in crate::cluster) fn owner(&self) -> SessionOwner {
        match self {
            Who::Unbound => SessionOwner::Unbound,
            Who::Anonymous => SessionOwner::Anonymous,
            Who::User(user) => SessionOwner::User(user.as_str().into()),
        }
    }
}

impl Record {
    pub(in crate::cluster) fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    pub(in crate::cluster) fn decode(value: &[u8]) -> Option<Record> {
        serde_json::from_slice(value).ok()
    }

    /// The record of a session held here: `will` is its connection's (from the claim),
    /// `written` the record last written (when its connection ended stays what it was).
    pub(super) fn from_view(
        owner: &str,
        life: u64,
        view: &HeldSession,
        cursor: u64,
        will: Option<&(String, u32)>,
        written: Option<&Record>,
    ) -> Record {
        let (will, wd, wat, gone) = if view.connected {
            (
                will.map(|(w, _)| w.clone()),
                will.map_or(0, |(_, d)| *d),
                0,
                0,
            )
        } else {
            let gone = written
                .map(|w| w.ended_at)
                .filter(|g| *g != 0)
                .unwrap_or_else(crate::storage::now_unix_ms);
            match &view.pending_will {
                Some((pending, at)) => (encode_will(owner, pending), 0, *at, gone),
                None => (None, 0, 0, gone),
            }
        };
        Record {
            life,
            will,
            will_delay: wd,
            will_at: wat,
            ended_at: gone,
            adopted: false,
            fresh: false,
            owner: owner.to_owned(),
            expiry: view.expiry_interval,
            subscriptions: view
                .subscriptions
                .iter()
                .map(|(filter, options, id)| SubRecord {
                    filter: filter.to_string(),
                    qos: options.qos as u8,
                    no_local: options.no_local,
                    retain_as_published: options.retain_as_published,
                    retain_handling: options.retain_handling,
                    identifier: *id,
                })
                .collect(),
            cursor,
            handed: false,
            qos2: view.qos2.clone(),
            qos2_shared: view.qos2_shared.clone(),
            claimed_from: String::new(),
            claimed_from_life: 0,
            who: Who::of(&view.owner),
            taken: Vec::new(),
        }
    }

    pub(in crate::cluster) fn restore(&self) -> Restore {
        Restore {
            subscriptions: self
                .subscriptions
                .iter()
                .map(|s| {
                    (
                        ByteString::from(s.filter.as_str()),
                        SubscriptionOptions {
                            qos: QoS::from_u8(s.qos).unwrap_or(QoS::AtMostOnce),
                            no_local: s.no_local,
                            retain_as_published: s.retain_as_published,
                            retain_handling: s.retain_handling,
                        },
                        s.identifier,
                    )
                })
                .collect(),
            cursor: self.cursor,
            qos2: self.qos2.clone(),
            qos2_shared: self.qos2_shared.clone(),
            taken: {
                let mut taken = self.taken.clone();
                taken.sort_unstable();
                taken.dedup();
                taken
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written before `q2s` existed (a node of the previous version, during a
    /// rolling upgrade) still decodes: its QoS 2 deliveries count as plain ones.
    #[test]
    fn a_record_without_the_shared_marks_decodes_as_plain() {
        let json = br#"{"owner":"a","expiry":60,"subs":[{"f":"t/#","q":2}],"cursor":5,"life":1,"q2":[[3,7],[4,0]]}"#;
        let record = Record::decode(json).expect("decodes");
        let restore = record.restore();
        assert_eq!(restore.qos2, vec![(3, 7), (4, 0)]);
        assert!(restore.qos2_shared.is_empty());
        assert_eq!(restore.cursor, 5);
    }

    /// A claim notes whose record it replaced (the one node that may hand over); a record
    /// written without it (a node of the previous version) decodes as naming nobody, and a
    /// record that is not a claim carries none.
    #[test]
    fn a_claims_previous_owner_survives_a_round_trip_and_defaults_to_none() {
        let claim = Record {
            owner: "b".into(),
            claimed_from: "a".into(),
            claimed_from_life: 7,
            ..Record::default()
        };
        let decoded = Record::decode(&claim.encode()).expect("decodes");
        assert_eq!(
            (decoded.claimed_from.as_str(), decoded.claimed_from_life),
            ("a", 7)
        );
        let old =
            Record::decode(br#"{"owner":"b","expiry":60,"cursor":5,"life":1}"#).expect("decodes");
        assert!(old.claimed_from.is_empty() && old.claimed_from_life == 0);
        let plain = Record {
            owner: "b".into(),
            ..Record::default()
        };
        assert!(!String::from_utf8_lossy(&plain.encode()).contains("from"));
    }

    /// What the client took above the cursor travels with the record, ascending for the
    /// replay's search; a record of an older node has none.
    #[test]
    fn the_taken_sequences_survive_a_round_trip_sorted() {
        let record = Record {
            owner: "b".into(),
            cursor: 5,
            taken: vec![9, 7, 9],
            ..Record::default()
        };
        let decoded = Record::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded.restore().taken, vec![7, 9]);
        let old = Record::decode(br#"{"owner":"b","expiry":60,"cursor":5}"#).expect("decodes");
        assert!(old.restore().taken.is_empty());
        assert!(!String::from_utf8_lossy(&old.encode()).contains("tk"));
    }

    /// The owner a record names is who an adopted will is checked under (issue 35, sixth
    /// adversarial pass, F1b): it survives a round trip, and a record of an older node,
    /// without one, stands for no user (checked as anonymous).
    #[test]
    fn the_owner_of_an_adopted_will_survives_a_round_trip_and_defaults_to_none() {
        let record = Record {
            owner: "a".into(),
            who: Who::User("sensor2".into()),
            ..Record::default()
        };
        let decoded = Record::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded.who.owner(), SessionOwner::User("sensor2".into()));
        assert_eq!(decoded.who.owner().user(), Some("sensor2"));
        let old = Record::decode(br#"{"owner":"a","expiry":60,"cursor":5,"will":"AA=="}"#)
            .expect("decodes");
        assert_eq!(old.who.owner().user(), None);
    }

    #[test]
    fn the_shared_marks_survive_a_round_trip() {
        let record = Record {
            owner: "b".into(),
            qos2: vec![(3, 7), (9, 8)],
            qos2_shared: vec![9],
            ..Record::default()
        };
        let decoded = Record::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded, record);
        assert_eq!(decoded.restore().qos2_shared, vec![9]);
        // Nothing shared: nothing written for it.
        let plain = Record {
            qos2_shared: Vec::new(),
            ..record
        };
        assert!(!String::from_utf8_lossy(&plain.encode()).contains("q2s"));
    }
}
