//! What operators see of the broker and the two things they do to it (the admin API,
//! `src/admin`): the connected clients with their connection's facts, one session's state,
//! a page of retained messages, subscriptions by filter or topic, the largest backlogs; and
//! disconnecting a client or discarding a session.
//!
//! Nothing here is on the per-message path. The facts a connection has and a session does not
//! (peer address, listener, protocol, user name, since when) live in a side map sorted by
//! client id, set once at attach
//! ([`SessionHandle::record_connection`](super::SessionHandle::record_connection)) and
//! removed at detach, so neither `Session` nor the connection grows a byte for them; a page
//! of clients (searched or not) starts from its cursor in it and copies only its own
//! entries. Reads take the sessions map's lock only to copy out `Arc`s, then each session's
//! lock briefly; every list is bounded by its caller's limit.
//!
//! Must not: take an index lock while a session lock is held; hold the sessions map's lock beyond
//! copying `Arc`s out.

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Instant;

use bytestring::ByteString;
use parking_lot::Mutex;
use serde::Serialize;

use super::{Broker, Session, NEVER_EXPIRES};
use crate::codec::ProtocolVersion;

/// What a connection is, as the transport and the handshake know it: kept per connected
/// client for operators (`GET /api/v1/clients`).
#[derive(Clone, Debug)]
pub struct ConnectionFacts {
    /// The client's address (the PROXY header's when there is one).
    pub peer: SocketAddr,
    /// The listener it connected on (`[[listener]] name`).
    pub listener: Arc<str>,
    /// The protocol level of its CONNECT.
    pub protocol: ProtocolVersion,
    /// When its CONNECT was accepted, in Unix milliseconds.
    pub connected_at_unix_ms: u64,
    /// The user name it was admitted as (CONNECT's, the certificate's, the token's or the
    /// SCRAM user's), if any: the status page searches by it. Not a secret (the connect log
    /// line carries it too).
    pub user: Option<Arc<str>>,
}

/// The side map of [`ConnectionFacts`], by client id, with the generation of the attach that
/// recorded each (a detach of a taken-over connection must not remove its successor's).
///
/// Sorted by client id, so a page of `GET /api/v1/clients` starts where the last one ended
/// and copies only its own entries (issue 37, item 5: the listing copied every connected
/// client's facts per request, 100,000 with a fleet, to return 100); a connect pays a
/// B-tree insert instead of a hash insert, once per connection, off the message path. The
/// clients connected per listener are counted beside it under the same lock, so the
/// listeners' figures and the list always agree.
#[derive(Default)]
pub(super) struct ConnectionFactsMap {
    map: Mutex<FactsByClient>,
}

/// What [`ConnectionFactsMap`] locks.
#[derive(Default)]
struct FactsByClient {
    by_id: BTreeMap<ByteString, (u64, ConnectionFacts)>,
    /// Entries of `by_id` per listener name (a handful of listeners; entries kept at 0).
    by_listener: HashMap<Arc<str>, usize, foldhash::fast::RandomState>,
}

impl FactsByClient {
    fn count(&mut self, listener: &Arc<str>, up: bool) {
        let n = self.by_listener.entry(Arc::clone(listener)).or_insert(0);
        *n = if up { *n + 1 } else { n.saturating_sub(1) };
    }
}

/// How many entries of the facts map one hold of its lock examines when a search skips
/// entries that do not match: a search that matches little walks the whole map, in steps
/// this long, so a connect waits at most one step (about a millisecond), not the walk.
const SCAN_STEP: usize = 4096;

/// Longest `search` a clients query takes (bytes): enough for anything an operator types;
/// it is compared at every offset of every client id and user name a search meets, so it is
/// kept short (the query string alone would allow kilobytes).
pub(crate) const MAX_SEARCH_LEN: usize = 256;

/// Which connected clients `GET /api/v1/clients` lists: a page of at most `limit`, by client
/// id, after `after`, of those matching every criterion given.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientQuery<'a> {
    /// Client ids starting with this (exactly).
    pub prefix: &'a str,
    /// Client id or user name containing this, ASCII case ignored.
    pub search: Option<&'a str>,
    /// This user name, exactly.
    pub user: Option<&'a str>,
    /// Client ids sorting after this one (the `next` of the previous page).
    pub after: Option<&'a str>,
    /// The page size (the caller bounds it).
    pub limit: usize,
}

impl ClientQuery<'_> {
    fn matches(&self, client_id: &str, facts: &ConnectionFacts) -> bool {
        let user = facts.user.as_deref();
        self.user.is_none_or(|want| user == Some(want))
            && self.search.is_none_or(|needle| {
                contains_ignore_ascii_case(client_id, needle)
                    || user.is_some_and(|u| contains_ignore_ascii_case(u, needle))
            })
    }
}

/// True when `needle` occurs in `haystack`, ASCII letters compared without case (other bytes
/// exactly); allocates nothing.
fn contains_ignore_ascii_case(haystack: &str, needle: &str) -> bool {
    let (hay, needle) = (haystack.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// One page of connected clients ([`Broker::clients_page`]).
#[derive(Clone, Debug, Serialize)]
pub struct ClientPage {
    /// The page, by client id.
    pub clients: Vec<ClientView>,
    /// True when more clients match after this page.
    pub truncated: bool,
    /// The `after` of the next page (the last client id of this one), when there is one.
    pub next: Option<String>,
    /// Clients connected now, matching or not.
    pub connected: usize,
}

impl std::fmt::Debug for ConnectionFactsMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionFactsMap").finish_non_exhaustive()
    }
}

/// The protocol level as operators write it (`"3.1"`, `"3.1.1"`, `"5.0"`, as the
/// `postbox_clients_connected{protocol}` label).
pub(crate) fn protocol_name(protocol: ProtocolVersion) -> &'static str {
    match protocol {
        ProtocolVersion::V3_1 => "3.1",
        ProtocolVersion::V3_1_1 => "3.1.1",
        ProtocolVersion::V5 => "5.0",
    }
}

/// One connected client (`GET /api/v1/clients`).
#[derive(Clone, Debug, Serialize)]
pub struct ClientView {
    /// Its client id.
    pub client_id: String,
    /// Its address, `ip:port`.
    pub address: String,
    /// `"3.1"`, `"3.1.1"` or `"5.0"`.
    pub protocol: &'static str,
    /// The listener's name.
    pub listener: String,
    /// The user name it was admitted as (`null`: none).
    pub user: Option<String>,
    /// When it connected, Unix milliseconds.
    pub connected_since_unix_ms: u64,
    /// Its session's subscriptions (shared ones included).
    pub subscriptions: usize,
    /// QoS 1/2 messages sent to it and not yet acknowledged.
    pub inflight: usize,
    /// Messages waiting in its session's queue.
    pub queued: usize,
    /// Their bytes (topic, payload, properties: `Message::size`).
    pub queued_bytes: usize,
    /// Age of the oldest of them, in seconds (`null`: nothing queued).
    pub oldest_queued_secs: Option<f64>,
}

/// One subscription of a session.
#[derive(Clone, Debug, Serialize)]
pub struct SubscriptionView {
    /// The topic filter (`$share/{group}/...` for a shared one).
    pub filter: String,
    /// Maximum QoS granted.
    pub qos: u8,
    /// No Local (v5).
    pub no_local: bool,
    /// Retain As Published (v5).
    pub retain_as_published: bool,
    /// Retain Handling (v5): 0, 1 or 2.
    pub retain_handling: u8,
    /// Subscription Identifier, if the SUBSCRIBE carried one.
    pub identifier: Option<u32>,
}

/// One session (`GET /api/v1/sessions/{client_id}`).
#[derive(Clone, Debug, Serialize)]
pub struct SessionView {
    /// Its client id.
    pub client_id: String,
    /// True while a connection is attached.
    pub connected: bool,
    /// The protocol level of its last connection.
    pub protocol: &'static str,
    /// Session Expiry Interval in seconds (`null`: never expires).
    pub expiry_interval_secs: Option<u32>,
    /// Seconds until an offline session ends (`null` while connected or if it never expires).
    pub expires_in_secs: Option<u64>,
    /// Messages queued and not yet sent.
    pub backlog: usize,
    /// Bytes (topic, payload, properties) of the queued messages.
    pub backlog_bytes: usize,
    /// Age of the oldest queued message, in seconds (`null`: nothing queued).
    pub oldest_queued_secs: Option<f64>,
    /// QoS 1/2 messages sent and not yet acknowledged.
    pub inflight: usize,
    /// Whether a delayed will waits to be published.
    pub pending_will: bool,
    /// Its subscriptions, sorted by filter.
    pub subscriptions: Vec<SubscriptionView>,
}

/// A session with a backlog, for the status page's "largest backlogs".
#[derive(Clone, Debug, Serialize)]
pub struct BacklogView {
    /// Its client id.
    pub client_id: String,
    /// Messages queued and not yet sent.
    pub backlog: usize,
    /// Their bytes (topic, payload, properties: `Message::size`).
    pub backlog_bytes: usize,
    /// Age of the oldest of them, in seconds.
    pub oldest_queued_secs: f64,
    /// True while a connection is attached.
    pub connected: bool,
}

/// Figures over all sessions (one pass, for the overview).
#[derive(Clone, Debug, Default, Serialize)]
pub struct SessionTotals {
    /// Sessions held, connected or not.
    pub sessions: usize,
    /// Sessions with a connection attached.
    pub connected: usize,
    /// Messages queued over all sessions.
    pub queued: usize,
    /// Their bytes (topic, payload, properties: `Message::size`).
    pub queued_bytes: usize,
    /// Messages in flight over all sessions.
    pub inflight: usize,
    /// Sessions with at least one queued message.
    pub backlogged: usize,
}

/// One retained message (`GET /api/v1/retained`).
#[derive(Clone, Debug, Serialize)]
pub struct RetainedView {
    /// Its topic.
    pub topic: String,
    /// Its QoS.
    pub qos: u8,
    /// Payload size in bytes (the payload itself is not returned: it may be binary).
    pub payload_bytes: usize,
}

/// Retained messages, split as the admin API lists them ([`Broker::retained_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RetainedCounts {
    /// Topics not starting with `$`: what `GET /api/v1/retained` lists without a prefix.
    pub listed: usize,
    /// Topics under a `$` first level (`$SYS/...`), which a `#` does not match either.
    pub system: usize,
}

/// One subscriber of a filter (`GET /api/v1/subscriptions`).
#[derive(Clone, Debug, Serialize)]
pub struct SubscriberView {
    /// The subscribing session's client id.
    pub client_id: String,
    /// The subscription.
    #[serde(flatten)]
    pub subscription: SubscriptionView,
}

/// What one session holds for its driver: deliveries queued and those sent but not yet
/// acknowledged (for a bridge, everything its remote has not acknowledged).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeldFigures {
    /// Messages queued or in flight.
    pub messages: usize,
    /// Their bytes (topic, payload, properties: `Message::size`).
    pub bytes: usize,
    /// Age of the oldest of them (`None`: nothing held).
    pub oldest: Option<std::time::Duration>,
}

/// What [`Broker::kick`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kick {
    /// No session has that client id.
    NoSuchClient,
    /// The session exists but no connection is attached.
    NotConnected,
    /// The connection was told to close (v5: DISCONNECT 0x98 Administrative action).
    Disconnected,
}

fn subscription_view(filter: &str, sub: &super::SessionSubscription) -> SubscriptionView {
    SubscriptionView {
        filter: filter.to_owned(),
        qos: sub.options.qos as u8,
        no_local: sub.options.no_local,
        retain_as_published: sub.options.retain_as_published,
        retain_handling: sub.options.retain_handling,
        identifier: sub.identifier,
    }
}

impl ConnectionFactsMap {
    pub(super) fn insert(&self, client_id: &ByteString, generation: u64, facts: ConnectionFacts) {
        let mut map = self.map.lock();
        map.count(&facts.listener, true);
        // A takeover replaces the previous connection's entry: its listener has one less.
        if let Some((_, old)) = map.by_id.insert(client_id.clone(), (generation, facts)) {
            map.count(&old.listener, false);
        }
    }

    fn remove(&self, client_id: &str, generation: u64) {
        let mut map = self.map.lock();
        if map
            .by_id
            .get(client_id)
            .is_some_and(|(g, _)| *g == generation)
        {
            if let Some((_, facts)) = map.by_id.remove(client_id) {
                map.count(&facts.listener, false);
            }
        }
    }

    /// The entries of `query`'s page and one more (to tell whether more follow), in client
    /// id order. Holds the lock for at most [`SCAN_STEP`] entries at a time and copies only
    /// matching ones: memory is bounded by the page, not the fleet.
    fn page(&self, query: &ClientQuery<'_>) -> Vec<(ByteString, ConnectionFacts)> {
        let want = query.limit.saturating_add(1);
        let mut found = Vec::with_capacity(want.min(1024));
        // Where the next step starts: after `after`, and not before `prefix`.
        let mut from: Bound<ByteString> = match query.after {
            Some(after) if after >= query.prefix => Bound::Excluded(ByteString::from(after)),
            _ => Bound::Included(ByteString::from(query.prefix)),
        };
        loop {
            let map = self.map.lock();
            let mut examined = 0;
            let mut last = None;
            for (id, (_, facts)) in map.by_id.range((from.clone(), Bound::Unbounded)) {
                if !id.starts_with(query.prefix) {
                    return found;
                }
                if query.matches(id, facts) {
                    found.push((id.clone(), facts.clone()));
                    if found.len() == want {
                        return found;
                    }
                }
                examined += 1;
                if examined == SCAN_STEP {
                    last = Some(id.clone());
                    break;
                }
            }
            match last {
                Some(id) => from = Bound::Excluded(id),
                None => return found,
            }
        }
    }

    /// Connected clients recorded.
    pub(super) fn len(&self) -> usize {
        self.map.lock().by_id.len()
    }

    /// Connected clients recorded on listener `name`.
    fn on_listener(&self, name: &str) -> usize {
        self.map.lock().by_listener.get(name).copied().unwrap_or(0)
    }
}

impl Broker {
    /// Removes a detached connection's facts (no-op for a taken-over one, or a link).
    pub(super) fn forget_connection(&self, client_id: &str, generation: u64) {
        self.connection_facts.remove(client_id, generation);
    }

    /// One page of the clients with a connection recorded (see [`ClientQuery`]), each with
    /// its session's figures read now (each session locked briefly, one at a time).
    pub fn clients_page(&self, query: &ClientQuery<'_>) -> ClientPage {
        let mut facts = self.connection_facts.page(query);
        let truncated = facts.len() > query.limit;
        facts.truncate(query.limit);
        let next = truncated
            .then(|| facts.last().map(|(id, _)| id.to_string()))
            .flatten();
        let sessions: Vec<Option<Arc<Session>>> = {
            let map = self.sessions.lock();
            facts.iter().map(|(id, _)| map.get(id).cloned()).collect()
        };
        let now = Instant::now();
        let clients = facts
            .into_iter()
            .zip(sessions)
            .map(|((client_id, facts), session)| {
                let (inflight, queued, queued_bytes, oldest, subscriptions) =
                    session.map_or((0, 0, 0, None, 0), |s| {
                        let st = s.lock();
                        (
                            st.inflight.len(),
                            st.queue.len(),
                            st.queued_bytes(),
                            st.queue.front().map(|d| d.message.received_at),
                            st.subscriptions.len(),
                        )
                    });
                ClientView {
                    client_id: client_id.to_string(),
                    address: facts.peer.to_string(),
                    protocol: protocol_name(facts.protocol),
                    listener: facts.listener.to_string(),
                    user: facts.user.as_deref().map(str::to_owned),
                    connected_since_unix_ms: facts.connected_at_unix_ms,
                    subscriptions,
                    inflight,
                    queued,
                    queued_bytes,
                    oldest_queued_secs: oldest
                        .map(|at| now.saturating_duration_since(at).as_secs_f64()),
                }
            })
            .collect();
        ClientPage {
            clients,
            truncated,
            next,
            connected: self.connection_facts.len(),
        }
    }

    /// Clients connected now on the listener named `name` (as recorded for operators: the
    /// same records as [`Broker::clients_page`], so the two agree).
    pub fn connected_on(&self, name: &str) -> usize {
        self.connection_facts.on_listener(name)
    }

    /// Clients connected now (as recorded for operators).
    pub fn connected_count(&self) -> usize {
        self.connection_facts.len()
    }

    fn session_arc(&self, client_id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().get(client_id).cloned()
    }

    fn all_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().iter().cloned().collect()
    }

    /// The session of `client_id`, if there is one.
    pub fn session_view(&self, client_id: &str) -> Option<SessionView> {
        let session = self.session_arc(client_id)?;
        let now = Instant::now();
        let st = session.lock();
        let mut subscriptions: Vec<SubscriptionView> = st
            .subscriptions
            .iter()
            .map(|(filter, sub)| subscription_view(filter, sub))
            .collect();
        subscriptions.sort_unstable_by(|a, b| a.filter.cmp(&b.filter));
        let never = st.expiry_interval == NEVER_EXPIRES;
        let expires_in_secs = match st.disconnected_at {
            Some(at) if st.connection.is_none() && !never => Some(
                u64::from(st.expiry_interval)
                    .saturating_sub(now.saturating_duration_since(at).as_secs()),
            ),
            _ => None,
        };
        Some(SessionView {
            client_id: client_id.to_owned(),
            connected: st.connection.is_some(),
            protocol: protocol_name(st.protocol),
            expiry_interval_secs: (!never).then_some(st.expiry_interval),
            expires_in_secs,
            backlog: st.queue.len(),
            backlog_bytes: st.queued_bytes(),
            oldest_queued_secs: st.queue.front().map(|d| {
                now.saturating_duration_since(d.message.received_at)
                    .as_secs_f64()
            }),
            inflight: st.inflight.len(),
            pending_will: st.pending_will.is_some(),
            subscriptions,
        })
    }

    /// What the session of `client_id` holds for its driver, if there is such a session. Cheap
    /// enough for every scrape: the queue's bytes are kept by the session (a bridge's queue may
    /// hold a million entries), only the in-flight window (bounded by its Receive Maximum) is
    /// walked, under the session's lock.
    pub fn held_for(&self, client_id: &str) -> Option<HeldFigures> {
        let session = self.session_arc(client_id)?;
        let now = Instant::now();
        let st = session.lock();
        let inflight_bytes = st.inflight.bytes();
        // In flight were sent first, so the older of the two fronts is the oldest held.
        let oldest = [
            st.inflight.front().map(|f| f.delivery.message.received_at),
            st.queue.front().map(|d| d.message.received_at),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|at| now.saturating_duration_since(at));
        Some(HeldFigures {
            messages: st.queue.len() + st.inflight.len(),
            bytes: st.queued_bytes() + inflight_bytes,
            oldest,
        })
    }

    /// One pass over every session: totals, and the `top` sessions with the largest
    /// backlogs (largest first).
    pub fn backlogs(&self, top: usize) -> (SessionTotals, Vec<BacklogView>) {
        let now = Instant::now();
        let mut totals = SessionTotals::default();
        // (backlog, client id) of the largest, kept as a min-heap of at most `top`.
        let mut largest: BinaryHeap<std::cmp::Reverse<(usize, ByteString)>> = BinaryHeap::new();
        let mut ages: HashMap<ByteString, (f64, usize, bool)> = HashMap::new();
        for session in self.all_sessions() {
            let st = session.lock();
            totals.sessions += 1;
            totals.connected += usize::from(st.connection.is_some());
            totals.queued += st.queue.len();
            totals.queued_bytes += st.queued_bytes();
            totals.inflight += st.inflight.len();
            let Some(front) = st.queue.front() else {
                continue;
            };
            totals.backlogged += 1;
            if top == 0 {
                continue;
            }
            let entry = std::cmp::Reverse((st.queue.len(), session.client_id.clone()));
            if largest.len() < top {
                largest.push(entry);
            } else if largest.peek().is_some_and(|min| entry < *min) {
                if let Some(std::cmp::Reverse((_, gone))) = largest.pop() {
                    ages.remove(&gone);
                }
                largest.push(entry);
            } else {
                continue;
            }
            let age = now
                .saturating_duration_since(front.message.received_at)
                .as_secs_f64();
            ages.insert(
                session.client_id.clone(),
                (age, st.queued_bytes(), st.connection.is_some()),
            );
        }
        let mut top_views: Vec<BacklogView> = largest
            .into_iter()
            .map(|std::cmp::Reverse((backlog, id))| {
                let (age, bytes, connected) = ages.get(&id).copied().unwrap_or((0.0, 0, false));
                BacklogView {
                    client_id: id.to_string(),
                    backlog,
                    backlog_bytes: bytes,
                    oldest_queued_secs: age,
                    connected,
                }
            })
            .collect();
        top_views.sort_unstable_by(|a, b| {
            b.backlog
                .cmp(&a.backlog)
                .then_with(|| a.client_id.cmp(&b.client_id))
        });
        (totals, top_views)
    }

    /// Wakes every connected client's task, so each checks its standing again: after a reload
    /// of the JWT keys, a client whose token the new keys refuse closes (issue 35, seventh
    /// pass, N7). The session map is locked only to copy the handles.
    pub fn wake_connections(&self) {
        let sessions: Vec<_> = self.sessions.lock().iter().cloned().collect();
        for session in sessions {
            session.wake();
        }
    }

    /// Disconnects `client_id`'s connection, keeping its session (which then lives on for
    /// its expiry interval, as after any disconnect). The connection closes when it wakes:
    /// v5 DISCONNECT 0x98 Administrative action (MQTT 5 §3.14.2.1), 3.x a plain close; a will
    /// is published as for any close the client did not ask for (MQTT-3.1.2-8).
    pub fn kick(&self, client_id: &str) -> Kick {
        let Some(session) = self.session_arc(client_id) else {
            return Kick::NoSuchClient;
        };
        {
            let mut st = session.lock();
            if st.connection.is_none() || st.ended {
                return Kick::NotConnected;
            }
            st.kicked = true;
        }
        session.wake();
        Kick::Disconnected
    }

    /// Discards `client_id`'s session: its subscriptions, queue, in-flight messages and
    /// store records, as a clean start would (MQTT-3.1.2-4). A connected client is
    /// disconnected first (v5 DISCONNECT 0x98). False when there was no such session.
    pub fn discard_session(&self, client_id: &str) -> bool {
        let session = {
            let mut sessions = self.sessions.lock();
            let Some(session) = sessions.get(client_id).cloned() else {
                return false;
            };
            {
                let mut st = session.lock();
                if st.connection.take().is_some() {
                    st.kicked = true;
                }
                st.disconnected_at = Some(Instant::now());
                st.end_stall();
            }
            sessions.remove(client_id);
            self.metrics.sessions_current.set(sessions.len() as f64);
            session
        };
        let generation = session.lock().generation;
        self.forget_connection(client_id, generation);
        session.wake();
        self.end_session(&session);
        true
    }

    /// Retained messages whose topic starts with `prefix` and sorts after `after`, at most
    /// `limit`, in topic order; true when more follow (ask again with `after` = the last
    /// topic). One walk of the retained index under its read lock, keeping only `limit`
    /// topics: memory is bounded by the page, time by the retained messages under the
    /// prefix's deepest complete level.
    pub fn retained_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<RetainedView>, bool) {
        // The walk's filter: the prefix's complete levels, then `#` (`$` topics only when the
        // prefix names them, MQTT-4.7.2-1).
        let filter = match prefix.rfind('/') {
            Some(i) => format!("{}#", &prefix[..=i]),
            None => "#".to_owned(),
        };
        let dollar = prefix.starts_with('$');
        let mut page: BinaryHeap<(String, u8, usize)> = BinaryHeap::new();
        let mut more = false;
        let mut visit = |topic: &str, message: &Arc<super::Message>| {
            if !topic.starts_with(prefix) || after.is_some_and(|a| topic <= a) {
                return;
            }
            if page.len() == limit {
                more = true;
                if page.peek().is_some_and(|max| topic < max.0.as_str()) {
                    page.pop();
                } else {
                    return;
                }
            }
            page.push((topic.to_owned(), message.qos as u8, message.payload.len()));
        };
        {
            let retained = self.retained.read();
            if dollar && filter == "#" {
                // `#` skips `$` topics; a `$` prefix without a `/` walks each `$`-level root
                // it could name (in practice `$SYS`).
                retained.for_each_match(&format!("{prefix}/#"), &mut visit);
                if let Some(m) = retained.get(prefix) {
                    visit(prefix, m);
                }
            } else {
                retained.for_each_match(&filter, &mut visit);
            }
        }
        let page: Vec<RetainedView> = page
            .into_sorted_vec()
            .into_iter()
            .map(|(topic, qos, payload_bytes)| RetainedView {
                topic,
                qos,
                payload_bytes,
            })
            .collect();
        (page, more)
    }

    /// Subscriptions whose filter is `filter` (when given) and that match `topic` (when
    /// given), at most `limit`, sorted by client id then filter; true when more were found.
    pub fn subscriptions_matching(
        &self,
        filter: Option<&str>,
        topic: Option<&str>,
        limit: usize,
    ) -> (Vec<SubscriberView>, bool) {
        let mut found = Vec::new();
        let mut more = false;
        let mut sessions = self.all_sessions();
        sessions.sort_unstable_by(|a, b| a.client_id.cmp(&b.client_id));
        'sessions: for session in sessions {
            let st = session.lock();
            let mut subs: Vec<_> = st
                .subscriptions
                .iter()
                .filter(|(f, _)| filter.is_none_or(|want| &***f == want))
                .filter(|(f, _)| {
                    topic.is_none_or(|t| {
                        let plain = match crate::codec::topic::split_shared(f) {
                            Some(Ok((_, plain))) => plain,
                            _ => f,
                        };
                        crate::codec::topic::matching::matches(plain, t)
                    })
                })
                .collect();
            subs.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (f, sub) in subs {
                if found.len() == limit {
                    more = true;
                    break 'sessions;
                }
                found.push(SubscriberView {
                    client_id: session.client_id.to_string(),
                    subscription: subscription_view(f, sub),
                });
            }
        }
        (found, more)
    }

    /// Retained messages held: those `GET /api/v1/retained` lists without a prefix (topics
    /// not starting with `$`), and those under a `$` first level (`$SYS`, listed with
    /// `prefix=$SYS`). One rule for the overview and the listing (issue 37, item 5).
    pub fn retained_counts(&self) -> RetainedCounts {
        let retained = self.retained.read();
        let system = retained.system_len();
        RetainedCounts {
            listed: retained.len().saturating_sub(system),
            system,
        }
    }

    /// Subscriptions held (plain ones in the index, and shared-group memberships).
    pub fn subscription_count(&self) -> usize {
        self.subscriptions.read().len()
            + self
                .shared_members
                .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
#[path = "admin_tests.rs"]
mod tests;
