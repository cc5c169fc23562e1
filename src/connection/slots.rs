//! Who may hold a connection of a listener: slots for connections whose handshake waits for
//! the client ("pending": CONNECT not complete in what arrived, or an AUTH answer due), bounded
//! overall and per source address, and slots for connected clients, counted apart and bounded
//! per listener (`max_connections`), per source address of the listener
//! (`max_connections_per_ip`) and across every listener (`mqtt.max_connections`,
//! [`ServerSlots`]).
//!
//! Why apart: a socket that never sends its CONNECT costs an attacker nothing, and when it
//! held one of `max_connections` slots, a few hundred of them kept every real client out until
//! the CONNECT timeout (issue 11, item 6). Now every accepted connection gets a
//! [`HandshakeSlot`]; it takes a pending slot the first time its handshake has to wait for
//! the client (or is closed at once when none is free, counted in
//! `postbox_connections_refused_total`), and trades it for a connected slot when its CONNECT
//! is accepted (or is refused with a CONNACK when a connected bound is reached, [`Full`]).
//! Silent and slow sockets can fill the pending slots, but never the ones finished clients
//! hold, and the per-address bounds stop one host from filling all pending or connected slots.
//! A newcomer that finds the listener's pending slots full takes the slot of a handshake of
//! the source holding the most, where that one holds more than the newcomer's would, or of
//! the oldest of an equal one that has waited [`EVICTABLE_AFTER`], or at once one of an
//! address that left a handshake unfinished lately (`Pending::evict_for`, `StalledLately`):
//! every TLS and WebSocket client's handshake waits for it, so stalled sockets in every slot
//! had kept them all out (issue 35, twenty-sixth and twenty-seventh adversarial passes, L4,
//! M1).
//!
//! The steps before MQTT that wait for the client take the same slot the first time they
//! wait (`transport::paced_by_client`): a PROXY header, a TLS handshake, a WebSocket upgrade;
//! the MQTT handshake after them keeps it. Before (issue 35, fifth pass, finding 2) they
//! waited uncounted, and 8000 half-finished TLS handshakes from one address held 8000 file
//! descriptors until `mqtt.connect_timeout`.
//!
//! Why only when it waits: the kernel hands a connection over once its CONNECT has arrived
//! (`TCP_DEFER_ACCEPT`), so a real client's handshake never waits, however many connect at
//! once. Counting every accepted connection instead refused bursts of real clients: the
//! accept loop takes a hundred connections from one host before their tasks have run, which
//! the benchmark's 100 publishers on one address hit at a per-address bound of 64.
//! Everything here is touched a few times per connection, never per packet: the connected
//! counts are atomics, the per-address ones a map under a lock taken at CONNECT and at close
//! (and only when `max_connections_per_ip` is set).
//!
//! Must not: be touched per packet.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::broker::flow::AnonymousConnection;
use crate::config::{ListenerConfig, ListenerKind};
use crate::metrics::{Counter, Gauge, ListenerMetrics, Metrics};

/// The bounds of one listener (from its `[[listener]]` entry); 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdmissionLimits {
    /// Connected clients at once (`max_connections`).
    pub max_connections: usize,
    /// Connected clients at once from one source ([`source_key`]), (`max_connections_per_ip`).
    pub max_connections_per_source: usize,
    /// Connections in their handshake at once (`max_pending_connections`).
    pub max_pending: usize,
    /// Connections in their handshake at once from one source ([`source_key`]),
    /// (`max_pending_connections_per_ip`).
    pub max_pending_per_source: usize,
    /// What one connection of the listener's kind holds while idle ([`connection_cost`]):
    /// an anonymous client's is charged to the connected share (`flow::AnonymousConnection`).
    pub connection_cost: u32,
}

impl AdmissionLimits {
    /// The limits a listener entry configures.
    pub(crate) fn of(config: &ListenerConfig) -> AdmissionLimits {
        AdmissionLimits {
            max_connections: config.max_connections,
            max_connections_per_source: config.max_connections_per_ip,
            max_pending: config.max_pending_connections,
            max_pending_per_source: config.max_pending_connections_per_ip,
            connection_cost: connection_cost(config.kind),
        }
    }
}

/// What one idle connection of `kind` holds (bytes; its session is charged apart). Measured
/// RSS per idle connection (release build, 2,000 connections each with one small PUBLISH):
/// tcp 2.0 KiB, ws 3.7 KiB, tls 13.9 KiB, wss 20.2 KiB; after one large message rustls keeps
/// a whole TLS record's buffer (~16 KiB) for good: wss 36.8 KiB after a 1 MB message, tls
/// 26.6 KiB (issue 35, thirteenth and fourteenth adversarial passes, F2). The charge is the
/// worst of these rounded up to a power of two of KiB: tcp 2, ws 4, tls 32, wss 40.
pub(crate) fn connection_cost(kind: ListenerKind) -> u32 {
    match kind {
        ListenerKind::Tcp => 2 * 1024,
        ListenerKind::Ws => 4 * 1024,
        ListenerKind::Tls => 32 * 1024,
        ListenerKind::Wss => 40 * 1024,
    }
}

/// Why a connection got no pending slot; it is closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The listener's `max_pending_connections` are all taken.
    PendingLimit,
    /// Its source has `max_pending_connections_per_ip` pending already.
    PendingPerSource,
    /// Its slot went to a newcomer from a source holding fewer ([`Pending::evict_for`]).
    Evicted,
}

/// Why a CONNECT got no connected slot ([`HandshakeSlot::promote`]); the handshake refuses it
/// with a CONNACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The listener has its `max_connections` clients.
    Listener,
    /// The client's source address has `max_connections_per_ip` clients on the listener.
    PerSource,
    /// The broker has `mqtt.max_connections` clients over all its listeners.
    Server,
}

impl Full {
    /// The config key of the bound that was reached, for logs and Reason Strings.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Full::Listener => "max_connections",
            Full::PerSource => "max_connections_per_ip",
            Full::Server => "mqtt.max_connections",
        }
    }
}

/// Connected clients across every listener of a server, bounded by `mqtt.max_connections`
/// (0 = unlimited): one per server, shared by every listener's [`Admission`] (through the
/// `Handoff`), so one atomic add and subtract per connection.
#[derive(Debug)]
pub(crate) struct ServerSlots {
    /// The bound, which a reload may change (SIGHUP): one relaxed load per CONNECT.
    max: AtomicUsize,
    connected: AtomicUsize,
}

impl ServerSlots {
    /// Slots for at most `max` connected clients (0 = unlimited).
    pub(crate) fn new(max: usize) -> Arc<ServerSlots> {
        Arc::new(ServerSlots {
            max: AtomicUsize::new(max),
            connected: AtomicUsize::new(0),
        })
    }

    /// A new bound for the CONNECTs that come next (a reload of `mqtt.max_connections`):
    /// clients connected already stay, even above a lowered bound.
    pub(crate) fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// The bound in force (0 = unlimited).
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Connected clients of every listener now.
    #[cfg(test)]
    pub(crate) fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }
}

/// Counts one more in `count` unless that passes `max` (0 = unlimited); `false` when full.
fn take_slot(count: &AtomicUsize, max: usize) -> bool {
    if max == 0 {
        count.fetch_add(1, Ordering::AcqRel);
        return true;
    }
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// How long a handshake must have waited for its client before a newcomer from a source
/// holding as many may take its pending slot, when the listener has none free
/// ([`Pending::evict_for`]; one from a source holding fewer need not wait for that). Stalled
/// sockets in every slot of a TLS or WebSocket listener had kept every client out, since
/// each of those handshakes waits a round trip for its client (issue 35, twenty-sixth
/// adversarial pass, L4: 17 addresses x 64 sockets sending two bytes, 26 of 26 TLS logins
/// failed); a burst of real clients larger than the slots still refuses the newest rather
/// than cutting the oldest short.
pub(crate) const EVICTABLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Pending connections by source, under one lock (taken at accept and when a handshake
/// ends, never per packet).
#[derive(Debug, Default)]
struct Pending {
    total: usize,
    /// Entries are removed at 0, so the map never holds more than `total` sources.
    by_source: HashMap<IpAddr, usize, foldhash::fast::RandomState>,
    /// The waiting handshakes by when they began to wait, oldest first; those that ended
    /// leave their entry until it reaches the front or the queue is compacted.
    order: std::collections::VecDeque<(u64, Instant)>,
    /// The waiting handshakes now: their source and the token that evicts them.
    live: HashMap<u64, (IpAddr, CancellationToken), foldhash::fast::RandomState>,
    next_id: u64,
    /// The sources whose handshakes ended unfinished lately ([`STALLED_REMEMBERED`]).
    stalled: StalledLately,
}

/// How long a source whose handshake was evicted does not evict one of an equal source in
/// turn ([`Pending::evict_for`]): a stalled socket renewed at once after its eviction
/// would otherwise take the next slot that has waited [`EVICTABLE_AFTER`], and with a
/// thousand addresses holding one each, every such slot went to the renewals before a real
/// client's newcomer got it (twenty-eighth adversarial pass, F1: 11 of 20 TLS logins
/// refused). An attacker now needs ten times as many addresses to keep them renewed.
const STALLED_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(10);

/// At most this many evicted sources are remembered, the oldest forgotten first: 16 bytes
/// and a map entry each.
const STALLED_MOST: usize = 16_384;

/// Sources with a handshake that ended unfinished within [`STALLED_REMEMBERED`] (evicted,
/// or closed while it waited for the client), oldest first, at most [`STALLED_MOST`].
#[derive(Debug, Default)]
struct StalledLately {
    order: std::collections::VecDeque<(IpAddr, Instant)>,
    /// Each source's latest unfinished end (an older entry in `order` for it is stale), and
    /// whether one within the window was its client's own close ([`Ended::Closed`]).
    latest: HashMap<IpAddr, (Instant, bool), foldhash::fast::RandomState>,
}

/// How a pending handshake ended unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Its slot went to a newcomer.
    Evicted,
    /// The connection closed while it waited (its client left, timed out, or was refused).
    Closed,
}

impl StalledLately {
    /// Remembers that a handshake of `source` ended unfinished at `now`.
    fn record(&mut self, source: IpAddr, now: Instant, ended: Ended) {
        self.forget_before(now);
        if self.order.len() >= STALLED_MOST {
            self.pop_oldest();
        }
        self.order.push_back((source, now));
        let closed = self.latest.get(&source).is_some_and(|(_, closed)| *closed);
        self.latest
            .insert(source, (now, closed || ended == Ended::Closed));
    }

    /// Whether a handshake of `source` ended unfinished within [`STALLED_REMEMBERED`] of `now`.
    fn lately(&mut self, source: IpAddr, now: Instant) -> bool {
        self.forget_before(now);
        self.latest.contains_key(&source)
    }

    /// Whether a handshake of `source` was closed while it waited within
    /// [`STALLED_REMEMBERED`] of `now` (not only evicted).
    #[cfg(test)]
    fn closed_lately(&mut self, source: IpAddr, now: Instant) -> bool {
        self.forget_before(now);
        self.closed(source)
    }

    /// Whether a handshake of `source` was closed while it waited, as of the last forgetting:
    /// for a scan that forgets once ([`StalledLately::forget_before`]).
    fn closed(&self, source: IpAddr) -> bool {
        self.latest.get(&source).is_some_and(|(_, closed)| *closed)
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= STALLED_REMEMBERED)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((source, at)) = self.order.pop_front() {
            if self
                .latest
                .get(&source)
                .is_some_and(|(latest, _)| *latest == at)
            {
                self.latest.remove(&source);
            }
        }
    }
}

impl Pending {
    /// Gives a newcomer from `newcomer`, whose source holds `has` pending slots, the slot of
    /// another handshake, which is closed (its token tells its task); false when none may
    /// give way. Only a source that would still hold as many as the newcomer's gives way:
    /// the one holding the most, its oldest handshake, at once where it holds more than the
    /// newcomer's would; otherwise the oldest of those, once it has waited
    /// [`EVICTABLE_AFTER`]. So stalled sockets renewed as fast as they are closed take no
    /// slot from a source holding fewer (twenty-seventh adversarial pass, M1: 17 addresses
    /// reopening theirs at once kept TLS clients out again when the oldest went first), and
    /// a burst of real clients from one address does not cut its own oldest short. Among
    /// equals, a source with a handshake ended unfinished within [`STALLED_REMEMBERED`]
    /// does not evict in turn, and where one was closed while it waited (not only evicted),
    /// its handshakes give way at any age when none has waited that long: stalled sockets the attacker closes itself before they turn evictable, and
    /// reopens at once, had kept 14 of 20 TLS logins out (twenty-ninth pass, F1-C).
    fn evict_for(&mut self, newcomer: IpAddr, has: usize, now: Instant) -> bool {
        let after = has + 1;
        let Some((biggest, most)) = self
            .by_source
            .iter()
            .filter(|(source, _)| **source != newcomer)
            .max_by_key(|(_, n)| **n)
            .map(|(source, n)| (*source, *n))
        else {
            return false;
        };
        if most < after {
            return false;
        }
        if most == after && self.stalled.lately(newcomer, now) {
            return false;
        }
        let Pending {
            order,
            live,
            by_source,
            stalled,
            ..
        } = &mut *self;
        let victim = if most > after {
            order
                .iter()
                .position(|(id, _)| live.get(id).is_some_and(|(s, _)| *s == biggest))
        } else {
            let gives_way = |source: &IpAddr| {
                *source != newcomer && by_source.get(source).copied().unwrap_or(0) >= after
            };
            // Oldest first: past the first one too young, all are.
            order
                .iter()
                .take_while(|(_, since)| now.saturating_duration_since(*since) >= EVICTABLE_AFTER)
                .position(|(id, _)| live.get(id).is_some_and(|(s, _)| gives_way(s)))
                .or_else(|| {
                    stalled.forget_before(now);
                    order.iter().position(|(id, _)| {
                        live.get(id)
                            .is_some_and(|(s, _)| gives_way(s) && stalled.closed(*s))
                    })
                })
        };
        let Some((id, _)) = victim.and_then(|at| order.remove(at)) else {
            return false;
        };
        if let Some((source, token)) = live.remove(&id) {
            token.cancel();
            self.forget(source);
            self.stalled.record(source, now, Ended::Evicted);
        }
        true
    }

    /// One pending handshake of `source` fewer.
    fn forget(&mut self, source: IpAddr) {
        self.total -= 1;
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

/// A handshake's pending slot: its place in [`Pending`] and the token that tells it the
/// slot was given to a newcomer ([`HandshakeSlot::evicted`]).
#[derive(Debug)]
struct Waiting {
    id: u64,
    evicted: CancellationToken,
}

/// The slot counts of one listener, shared by its accept loop and its connections.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: AdmissionLimits,
    pending: Mutex<Pending>,
    connected: AtomicUsize,
    /// Connected clients by source, kept only when `max_connections_per_source` is set;
    /// entries are removed at 0.
    connected_by_source: Mutex<HashMap<IpAddr, usize, foldhash::fast::RandomState>>,
    /// The broker-wide bound (`mqtt.max_connections`), shared with the other listeners.
    server: Arc<ServerSlots>,
    pending_gauge: Gauge,
    refused_pending: Counter,
    refused_per_source: Counter,
    /// Handshakes whose pending slot went to a newcomer.
    evicted: Counter,
    refused_max: Counter,
    refused_max_per_source: Counter,
    refused_server: Counter,
    /// `postbox_connections_current` and `_total`, kept here so that the slots, which live
    /// as long as the connection anyway, also count it open and closed: the connection's own
    /// future then needs no handle for it.
    open_gauge: Gauge,
    accepted: Counter,
    /// `postbox_clients_connected{listener,protocol}` and `_connects_total`: taken once for
    /// this listener, counted by [`ConnectedSlot::count_client`] and the slot's drop.
    clients: ListenerMetrics,
}

impl Admission {
    /// Slot counts for a listener with `limits`, within the broker-wide `server` bound,
    /// reporting into `metrics` as listener `name`.
    pub(crate) fn new(
        name: &str,
        limits: AdmissionLimits,
        server: &Arc<ServerSlots>,
        metrics: &Metrics,
    ) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            pending: Mutex::new(Pending::default()),
            connected: AtomicUsize::new(0),
            connected_by_source: Mutex::new(HashMap::default()),
            server: Arc::clone(server),
            pending_gauge: metrics.connections_pending.clone(),
            refused_pending: metrics.connections_refused_pending.clone(),
            refused_per_source: metrics.connections_refused_per_ip.clone(),
            evicted: metrics.connections_evicted.clone(),
            refused_max: metrics.connections_refused_max.clone(),
            refused_max_per_source: metrics.connections_refused_max_per_ip.clone(),
            refused_server: metrics.connections_refused_server.clone(),
            open_gauge: metrics.connections_current.clone(),
            accepted: metrics.connections_total.clone(),
            clients: metrics.listener(name),
        })
    }

    /// The slot of a connection just accepted from `peer`: it counts the connection open,
    /// and takes a pending slot only once its handshake waits for the client
    /// ([`HandshakeSlot::wait_for_client`]).
    pub(crate) fn arrive(self: &Arc<Self>, peer: IpAddr) -> HandshakeSlot {
        self.accepted.increment(1);
        self.open_gauge.increment(1.0);
        HandshakeSlot {
            admission: Arc::clone(self),
            source: source_key(peer),
            accepted_at: Instant::now(),
            state: State::Arrived,
            waiting: None,
        }
    }

    /// Takes a pending slot for `source`, or says why there is none (and counts that). With
    /// the listener's slots all taken, another source's handshake may give its slot up
    /// ([`Pending::evict_for`]).
    fn take_pending(&self, source: IpAddr) -> Result<Waiting, Refused> {
        let mut pending = self.pending.lock();
        let from_source = pending.by_source.get(&source).copied().unwrap_or(0);
        if self.limits.max_pending_per_source > 0
            && from_source >= self.limits.max_pending_per_source
        {
            drop(pending);
            self.refused_per_source.increment(1);
            return Err(Refused::PendingPerSource);
        }
        let now = Instant::now();
        if self.limits.max_pending > 0 && pending.total >= self.limits.max_pending {
            if !pending.evict_for(source, from_source, now) {
                drop(pending);
                self.refused_pending.increment(1);
                return Err(Refused::PendingLimit);
            }
            self.evicted.increment(1);
            self.pending_gauge.decrement(1.0);
        }
        *pending.by_source.entry(source).or_insert(0) += 1;
        pending.total += 1;
        let id = pending.next_id;
        pending.next_id += 1;
        let evicted = CancellationToken::new();
        pending.order.push_back((id, now));
        pending.live.insert(id, (source, evicted.clone()));
        // Ended waits leave their entries behind: compacted once they outnumber the rest.
        if pending.order.len() > 2 * pending.live.len() + 64 {
            let Pending { order, live, .. } = &mut *pending;
            order.retain(|(id, _)| live.contains_key(id));
        }
        drop(pending);
        self.pending_gauge.increment(1.0);
        Ok(Waiting { id, evicted })
    }

    /// Moves the pending slot `id` from `from` to `to` (the listener's total stays), unless
    /// `to` has its per-source bound already (counted).
    fn move_pending(&self, id: u64, from: IpAddr, to: IpAddr) -> Result<(), Refused> {
        if from == to {
            return Ok(());
        }
        let mut pending = self.pending.lock();
        let Some(entry) = pending.live.get_mut(&id) else {
            return Ok(()); // evicted: its task closes the connection
        };
        entry.0 = to;
        let to_count = pending.by_source.get(&to).copied().unwrap_or(0);
        let bound = self.limits.max_pending_per_source;
        if bound > 0 && to_count >= bound {
            drop(pending);
            self.refused_per_source.increment(1);
            return Err(Refused::PendingPerSource);
        }
        *pending.by_source.entry(to).or_insert(0) += 1;
        if let Some(n) = pending.by_source.get_mut(&from) {
            *n -= 1;
            if *n == 0 {
                pending.by_source.remove(&from);
            }
        }
        Ok(())
    }

    /// Connections of this listener whose handshake waits for the client now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.lock().total
    }

    /// Connected clients of this listener now.
    #[cfg(test)]
    pub(crate) fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    /// Connected clients of this listener from `ip`'s source now (0 when
    /// `max_connections_per_ip` is not set: they are not counted then).
    #[cfg(test)]
    pub(crate) fn connected_from(&self, ip: IpAddr) -> usize {
        self.connected_by_source
            .lock()
            .get(&source_key(ip))
            .copied()
            .unwrap_or(0)
    }

    /// Takes a connected slot for a client from `source` under all three bounds, or says
    /// which one is reached (and counts that). `exempt` (asked only at a bound) lets the
    /// client in anyway. `Ok(true)` when the slot is counted per source.
    fn take_connected(
        &self,
        source: IpAddr,
        exempt: &mut impl FnMut() -> bool,
    ) -> Result<bool, Full> {
        if !take_slot(&self.connected, self.limits.max_connections) {
            if !exempt() {
                self.refused_max.increment(1);
                return Err(Full::Listener);
            }
            self.connected.fetch_add(1, Ordering::AcqRel);
        }
        let per_source = self.limits.max_connections_per_source;
        let counted = per_source > 0;
        if counted {
            let mut by_source = self.connected_by_source.lock();
            let at_bound = by_source.get(&source).is_some_and(|&n| n >= per_source);
            if at_bound {
                // `exempt` may take locks of its own: not under this one.
                drop(by_source);
                if !exempt() {
                    self.connected.fetch_sub(1, Ordering::AcqRel);
                    self.refused_max_per_source.increment(1);
                    return Err(Full::PerSource);
                }
                by_source = self.connected_by_source.lock();
            }
            *by_source.entry(source).or_insert(0) += 1;
        }
        if !take_slot(&self.server.connected, self.server.max()) {
            if !exempt() {
                self.release_connected(counted.then_some(source));
                self.refused_server.increment(1);
                return Err(Full::Server);
            }
            self.server.connected.fetch_add(1, Ordering::AcqRel);
        }
        Ok(counted)
    }

    /// Gives back the listener's and the source's connected slot (not the server's).
    fn release_connected(&self, source: Option<IpAddr>) {
        self.connected.fetch_sub(1, Ordering::AcqRel);
        if let Some(source) = source {
            let mut by_source = self.connected_by_source.lock();
            if let Some(n) = by_source.get_mut(&source) {
                *n -= 1;
                if *n == 0 {
                    by_source.remove(&source);
                }
            }
        }
    }

    /// Gives back the pending slot `id`, unless a newcomer took it already (evicted).
    fn release_pending(&self, id: u64, unfinished: bool) {
        let mut pending = self.pending.lock();
        let Some((source, _)) = pending.live.remove(&id) else {
            return;
        };
        pending.forget(source);
        if unfinished {
            pending
                .stalled
                .record(source, Instant::now(), Ended::Closed);
        }
        drop(pending);
        self.pending_gauge.decrement(1.0);
    }
}

/// The source a pending bound counts against (`auth::source`).
pub(crate) use crate::auth::source::source_key;

/// Where a [`HandshakeSlot`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Accepted; its handshake has not waited for the client yet.
    Arrived,
    /// Holds a pending slot.
    Waiting,
    /// Traded for a [`ConnectedSlot`].
    Connected,
}

/// A connection's place in its listener from accept until its CONNECT is accepted
/// ([`HandshakeSlot::promote`]) or it closes; holds a pending slot from the first time its
/// handshake waits for the client.
#[derive(Debug)]
pub(crate) struct HandshakeSlot {
    admission: Arc<Admission>,
    source: IpAddr,
    accepted_at: Instant,
    state: State,
    /// The pending slot, while [`State::Waiting`].
    waiting: Option<Waiting>,
}

impl HandshakeSlot {
    /// What one connection of this listener holds while idle ([`connection_cost`]).
    pub(crate) fn connection_cost(&self) -> u32 {
        self.admission.limits.connection_cost
    }

    /// When the listener accepted the connection: its CONNECT deadline counts from here.
    pub(crate) fn accepted_at(&self) -> Instant {
        self.accepted_at
    }

    /// Counts the connection against `ip` instead of the socket's peer: the client a PROXY
    /// header names. When waiting for the header took a pending slot (counted against the
    /// balancer's address), that slot moves to `ip`'s source, within its per-address bound.
    ///
    /// # Errors
    ///
    /// [`Refused::PendingPerSource`] when `ip`'s source has its pending bound already (the
    /// slot stays where it was; the caller closes the connection).
    pub(crate) fn set_source(&mut self, ip: IpAddr) -> Result<(), Refused> {
        let source = source_key(ip);
        match self.state {
            State::Arrived => self.source = source,
            State::Waiting => {
                let id = self.waiting.as_ref().map_or(u64::MAX, |w| w.id);
                self.admission.move_pending(id, self.source, source)?;
                self.source = source;
            }
            State::Connected => {}
        }
        Ok(())
    }

    /// Called when the handshake has to wait for the client (what arrived does not complete
    /// the CONNECT, or an AUTH answer is due): takes a pending slot, once.
    ///
    /// # Errors
    ///
    /// [`Refused`] when the listener's or the source's pending bound is reached; the caller
    /// closes the connection.
    pub(crate) fn wait_for_client(&mut self) -> Result<(), Refused> {
        if self.state == State::Arrived {
            self.waiting = Some(self.admission.take_pending(self.source)?);
            self.state = State::Waiting;
        }
        Ok(())
    }

    /// Resolves when this handshake's pending slot was given to a newcomer (the listener had
    /// no slot free, and this one's source held more, or as many and it had waited
    /// [`EVICTABLE_AFTER`]): the caller closes the connection. Never, while it holds no
    /// pending slot.
    pub(crate) async fn evicted(&self) {
        match &self.waiting {
            Some(waiting) => waiting.evicted.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// Trades this slot for a connected one, when the listener's `max_connections`, its
    /// `max_connections_per_ip` for this source and the broker's `mqtt.max_connections`
    /// allow. At a bound a connection is still let in when `replacing()` (asked only then,
    /// once) says it takes over a connected client id: the old connection is about to close,
    /// and refusing would keep a device whose previous connection went stale out until its
    /// keep-alive runs out.
    ///
    /// # Errors
    ///
    /// The slot back, and the bound that was reached ([`Full`], counted in
    /// `postbox_connections_refused_total`).
    pub(crate) fn promote(
        mut self,
        replacing: impl FnOnce() -> bool,
    ) -> Result<ConnectedSlot, (HandshakeSlot, Full)> {
        let mut replacing = Some(replacing);
        let mut answer = None;
        let mut exempt = || *answer.get_or_insert_with(|| replacing.take().is_some_and(|f| f()));
        let counted = match self.admission.take_connected(self.source, &mut exempt) {
            Ok(counted) => counted,
            Err(full) => return Err((self, full)),
        };
        if let Some(waiting) = self.waiting.take() {
            self.admission.release_pending(waiting.id, false);
        }
        self.state = State::Connected;
        Ok(ConnectedSlot {
            admission: Arc::clone(&self.admission),
            source: counted.then(|| Box::new(self.source)),
            protocol: None,
            anonymous: AnonymousConnection::default(),
        })
    }
}

impl Drop for HandshakeSlot {
    /// The connection closes before its CONNECT was accepted (or the slot was promoted).
    fn drop(&mut self) {
        if let Some(waiting) = self.waiting.take() {
            self.admission.release_pending(waiting.id, true);
        }
        if self.state != State::Connected {
            self.admission.open_gauge.decrement(1.0);
        }
    }
}

/// A connected client's slot, held until the connection is gone, whatever ends it (a
/// DISCONNECT, a takeover, an error, shutdown): dropping it gives back the listener's, the
/// source's and the broker's count, and an anonymous client's charge to the connected share.
/// 24 bytes; the source is boxed (and only there when `max_connections_per_ip` counts it),
/// since every connected client holds this.
#[derive(Debug)]
pub(crate) struct ConnectedSlot {
    admission: Arc<Admission>,
    source: Option<Box<IpAddr>>,
    /// The protocol index ([`crate::metrics::PROTOCOL_LABELS`]) the client was counted
    /// under in `postbox_clients_connected`, once counted.
    protocol: Option<u8>,
    /// An anonymous client's connection, charged to the connected share until it is gone.
    anonymous: AnonymousConnection,
}

impl ConnectedSlot {
    /// Counts the client connected on this listener with protocol index `protocol` (0 = 3.1,
    /// 1 = 3.1.1, 2 = 5.0) until the slot is dropped: called once the CONNECT is accepted.
    pub(crate) fn count_client(&mut self, protocol: u8) {
        if self.protocol.is_none() {
            self.admission.clients.connected(usize::from(protocol));
            self.protocol = Some(protocol);
        }
    }

    /// Holds an anonymous client's charge ([`AnonymousConnection`]) as long as the
    /// connection: given back when the slot drops.
    pub(crate) fn hold(&mut self, charge: AnonymousConnection) {
        self.anonymous = charge;
    }
}

impl Drop for ConnectedSlot {
    fn drop(&mut self) {
        let admission = &self.admission;
        if let Some(protocol) = self.protocol {
            admission.clients.disconnected(usize::from(protocol));
        }
        admission.release_connected(self.source.as_deref().copied());
        admission.server.connected.fetch_sub(1, Ordering::AcqRel);
        admission.open_gauge.decrement(1.0);
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
