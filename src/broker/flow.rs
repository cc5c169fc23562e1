//! Flow control: a burst is absorbed by pausing the publishers that cause it, not by dropping
//! what was acknowledged.
//!
//! - **Back-pressure.** When a delivery finds the queue of a connected session that is still
//!   taking messages full (`mqtt.max_queued_messages` / `_bytes`), it is queued anyway and the
//!   publishing connection pauses (stops reading its socket) until that queue has drained to
//!   half, the session stops draining ([`FlowControl::stalled_after`]) or it goes away. The
//!   overshoot is at most one message per paused publisher.
//! - **Stalled sessions.** A connected session with a full queue that took nothing off it for
//!   `mqtt.stalled_after` is treated like an offline one: the overflow policy applies and
//!   nobody waits for it, so two clients that publish to each other and stop reading both
//!   recover after that time.
//! - **Memory budget.** Messages the broker holds, subscriptions, sessions and partly
//!   received packets of connected clients count against `mqtt.max_memory`: above [`MemoryBudget::pause_at`] every publisher pauses
//!   until usage is back under [`MemoryBudget::resume_at`] (or `stalled_after` has passed),
//!   and over the budget itself QoS 1/2 PUBLISHes are refused. A filter that would take the
//!   subscriptions past half of the budget, or usage to the pause mark, is refused (0x97), so
//!   subscriptions alone never pause anyone.
//!
//! Nothing here holds a lock across an `.await`: a paused connection waits on [`FlowControl`]'s
//! notification and re-checks its target under that session's lock when woken.
//!
//! Must not: keep per-publisher state (the connection has it) or wait.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::{MemoryLimit, MqttConfig};

/// Bytes of every [`super::Message`] alive in the process (topic and payload), counted when one
/// is made and when the last reference to it goes: queued, in flight, retained or being
/// routed. One process-wide counter, like the partial-packet bytes, so a message needs no
/// pointer back to its broker. Signed: a thread that mostly drops messages flushes negative
/// deltas.
static MESSAGE_BYTES: AtomicI64 = AtomicI64::new(0);

/// Connected sessions stalled now (`SessionState::stalled`), process-wide like
/// [`MESSAGE_BYTES`]: a session changes it when it stalls and when it makes progress again,
/// detaches or ends, so the gauge costs no walk over the sessions.
static STALLED_SESSIONS: AtomicI64 = AtomicI64::new(0);

/// A session stalled (`up`) or stopped being stalled.
pub(in crate::broker) fn count_stalled(up: bool) {
    STALLED_SESSIONS.fetch_add(if up { 1 } else { -1 }, Ordering::Relaxed);
}

/// Connected sessions stalled now, in this process.
pub(crate) fn stalled_sessions() -> u64 {
    u64::try_from(STALLED_SESSIONS.load(Ordering::Relaxed)).unwrap_or(0)
}

/// How far a thread's own count may drift before it is added to [`MESSAGE_BYTES`]: messages
/// are made on the publisher's worker and dropped on the subscriber's, so one shared counter
/// touched per message would move its cache line between the cores twice per message (15% of
/// broker CPU per message in fan-in QoS 0). The budget is off by at most this per thread.
const FLUSH_BYTES: i64 = 256 * 1024;

thread_local! {
    /// This thread's not yet flushed share of [`MESSAGE_BYTES`].
    static UNFLUSHED: Cell<i64> = const { Cell::new(0) };
}

fn add_message_bytes(delta: i64) {
    UNFLUSHED.with(|local| {
        let pending = local.get() + delta;
        if pending.abs() >= FLUSH_BYTES {
            MESSAGE_BYTES.fetch_add(pending, Ordering::Relaxed);
            local.set(0);
        } else {
            local.set(pending);
        }
    });
}

/// This thread's not yet flushed count (for tests: one thread's messages, whatever other
/// tests do meanwhile, while it stays under [`FLUSH_BYTES`]).
#[cfg(test)]
pub(super) fn unflushed_message_bytes() -> i64 {
    UNFLUSHED.with(Cell::get)
}

/// Counts `bytes` of a new message.
pub(super) fn message_made(bytes: usize) {
    add_message_bytes(i64::try_from(bytes).unwrap_or(i64::MAX));
}

/// Uncounts a message's bytes when it is dropped.
pub(super) fn message_dropped(bytes: usize) {
    add_message_bytes(-i64::try_from(bytes).unwrap_or(i64::MAX));
}

/// Bytes counted against the budget besides partial packets: every message alive in the
/// process (see [`MESSAGE_BYTES`]), give or take [`FLUSH_BYTES`] per thread, every
/// subscription ([`subscription_cost`]) and every session ([`session_cost`]), which are added to the same counter so the publish path
/// reads one counter as before.
pub(crate) fn message_bytes() -> u64 {
    u64::try_from(MESSAGE_BYTES.load(Ordering::Relaxed)).unwrap_or(0)
}

/// Past this many bytes waiting for the durable store's writer
/// ([`crate::storage::backlog_bytes`]: ops keep their payloads alive until written),
/// publishers pause as at the budget's `Near`, whatever the budget; they pause too when
/// those bytes and [`message_bytes`] together reach the budget's pause mark, and resume once
/// both are under their resume marks (this one's half). A queue that long is a disk slower
/// than its publishers: one client rewriting one retained topic at QoS 0 queued gigabytes,
/// counted nowhere (issue 35, eighteenth pass, E0). Only a pause, never a refusal: the queue
/// drains by itself, and a publisher that fills it must not get everyone's PUBLISHes (or
/// SUBSCRIBEs) refused.
pub(crate) const STORE_BACKLOG_PAUSE: u64 = 64 << 20;

/// Bytes on their way out of the process that no [`super::Message`] counts (a cluster's
/// frames until NATS has taken them), counted in [`MESSAGE_BYTES`] from [`InTransit::new`]
/// until the guard is dropped, so the budget and its pauses see them however the frame
/// ends (sent, refused, or dropped at shutdown).
#[derive(Debug)]
pub(crate) struct InTransit(usize);

impl InTransit {
    /// Counts `bytes`.
    pub(crate) fn new(bytes: usize) -> InTransit {
        MESSAGE_BYTES.fetch_add(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
        InTransit(bytes)
    }
}

impl Drop for InTransit {
    fn drop(&mut self) {
        MESSAGE_BYTES.fetch_sub(i64::try_from(self.0).unwrap_or(i64::MAX), Ordering::Relaxed);
    }
}

/// The part of [`message_bytes`] that is subscriptions (for `$SYS`, which reports messages).
static SUBSCRIPTION_BYTES: AtomicI64 = AtomicI64::new(0);

/// What one subscription is taken to cost beside its filter: the session's record and the
/// tree's or the shared index's entry, measured at about this (issue 35 finding 6: 20,000
/// filters of 10 KB took 377 MB, twice their bytes and a little more).
const SUBSCRIPTION_OVERHEAD: usize = 256;

/// The bytes a subscription to a filter of `len` bytes counts against the budget: the filter
/// is held twice (the session's record and the index's levels) plus the entries around it.
pub(crate) fn subscription_cost(len: usize) -> u64 {
    u64::try_from(len.saturating_mul(2).saturating_add(SUBSCRIPTION_OVERHEAD)).unwrap_or(u64::MAX)
}

/// What anonymous sessions hold, where a method tells identities apart
/// ([`crate::storage::SessionOwner::Anonymous`]): their subscriptions ([`subscription_cost`]),
/// the sessions themselves ([`anonymous_session_cost`]), the payload bytes queued for them,
/// and the retained messages they published. Bounded together by [`ANONYMOUS_SHARE`]. (Their
/// connections' partly received packets have a bound of the same size of their own, out of
/// the budget: `connection::partial`.)
static ANONYMOUS_BYTES: AtomicI64 = AtomicI64::new(0);

/// The part of [`MESSAGE_BYTES`] that is sessions themselves ([`session_cost`], every
/// session's; not messages: `$SYS` reports messages).
static SESSION_BYTES: AtomicI64 = AtomicI64::new(0);

/// What anonymous clients make the broker hold may take at most this part of the budget (an
/// eighth), where a method tells identities apart: their subscriptions, their sessions and the
/// retained messages they publish, together. One stranger with many sessions (each under the
/// per-client bounds) filled the subscriptions' whole share in two seconds, and every client
/// then got 0x97 for a day (issue 35, fourth adversarial pass); the sixth pass pinned
/// unbounded persistent sessions (64 KB client ids, counted nowhere) and filled the budget
/// with retained messages. Now strangers fill only their eighth, and the clients a method
/// verified keep the rest.
pub(crate) const ANONYMOUS_SHARE: u64 = 8;

/// What one session is taken to cost beside its client id: the session's state, its entry in
/// the session map and its record in the store (a little over 500 B of state measured by
/// `size_of`, rounded up for the map and the store).
const SESSION_OVERHEAD: usize = 1024;

/// The bytes a session with a client id of `len` bytes counts in the budget, every session's
/// (issue 35, eleventh adversarial pass, T3: one password user kept 33,000 sessions, +48 MB
/// of RSS, counted nowhere), and an anonymous one's in the anonymous share too.
pub(crate) fn session_cost(len: usize) -> u64 {
    u64::try_from(len.saturating_add(SESSION_OVERHEAD)).unwrap_or(u64::MAX)
}

/// [`session_cost`] of an anonymous session: what it takes of the anonymous share.
pub(crate) fn anonymous_session_cost(len: usize) -> u64 {
    session_cost(len)
}

/// Connected anonymous clients: their connections ([`AnonymousConnection`]) and their
/// sessions that end with the connection (Session Expiry Interval 0), out of the budget,
/// bounded by a share of their own as large as the anonymous share. Sessions counted in the
/// budget, 7,000 anonymous connections took an 8 MiB budget past 100% and every password
/// user's QoS 1 PUBLISH got 0x97, while no bound refused them, since such a session is never
/// kept (issue 35, twelfth adversarial pass, U2). Such a session is part of what its
/// connection costs, like the connection's partly received packets (`connection::partial`),
/// and goes with it.
static ANONYMOUS_CONNECTED_BYTES: AtomicI64 = AtomicI64::new(0);

/// The anonymous share ([`anonymous_share`]) of the budget the broker was made with, for
/// what cannot reach its [`FlowControl`]: a stranger's message deciding whether to cache one
/// more encoding of itself (`Message::write_to`). No bound until a broker is made.
static SHARE_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// See [`SHARE_LIMIT`].
pub(crate) fn share_limit() -> u64 {
    SHARE_LIMIT.load(Ordering::Relaxed)
}

/// Where a session's own cost ([`session_cost`]) counts, which depends on its owner and on
/// whether it outlives its connection; moved by [`SessionCost::moved`] when either changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::broker) enum SessionCost {
    /// In the budget: a session a method verified, or any where no method tells identities
    /// apart.
    #[default]
    Budget,
    /// In the budget and the anonymous share: an anonymous session kept after its
    /// connection ends (Session Expiry Interval above 0).
    AnonymousKept,
    /// In [`ANONYMOUS_CONNECTED_BYTES`] only: an anonymous session that ends with its
    /// connection.
    AnonymousConnected,
}

impl SessionCost {
    /// Where the session of an owner that is `anonymous` and of `expiry_interval` counts.
    pub(in crate::broker) fn of(anonymous: bool, expiry_interval: u32) -> SessionCost {
        match (anonymous, expiry_interval) {
            (false, _) => SessionCost::Budget,
            (true, 0) => SessionCost::AnonymousConnected,
            (true, _) => SessionCost::AnonymousKept,
        }
    }

    /// Counts (`up`) or uncounts the cost of a session with a client id of `client_id_len`
    /// bytes where `self` says. Sessions are made, re-owned and dropped at CONNECT, DISCONNECT
    /// or restore, never per message.
    pub(in crate::broker) fn count(self, client_id_len: usize, up: bool) {
        let cost = i64::try_from(session_cost(client_id_len)).unwrap_or(i64::MAX);
        let delta = if up { cost } else { -cost };
        match self {
            SessionCost::Budget | SessionCost::AnonymousKept => {
                MESSAGE_BYTES.fetch_add(delta, Ordering::Relaxed);
                SESSION_BYTES.fetch_add(delta, Ordering::Relaxed);
            }
            SessionCost::AnonymousConnected => {
                ANONYMOUS_CONNECTED_BYTES.fetch_add(delta, Ordering::Relaxed);
            }
        }
        if self == SessionCost::AnonymousKept {
            ANONYMOUS_BYTES.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// Moves the cost of a session counted at `self` to `to`.
    pub(in crate::broker) fn moved(self, to: SessionCost, client_id_len: usize) -> SessionCost {
        if self != to {
            self.count(client_id_len, false);
            to.count(client_id_len, true);
        }
        to
    }
}

/// What an anonymous client's connection itself holds, charged to
/// [`ANONYMOUS_CONNECTED_BYTES`] from its CONNECT until the connection is gone (its
/// connected slot drops it). The session is charged apart ([`SessionCost`]); this is the
/// socket's buffers and the transport's state, which differ by an order of magnitude between
/// plain TCP and TLS: charged ~1 KiB each, a TLS listener let the share's worth of anonymous
/// connections hold 20-35 times the share (issue 35, thirteenth adversarial pass, F2). Four
/// bytes, so the connected slot it lives in stays 24 bytes; 0 is nothing charged.
#[derive(Debug, Default)]
pub(crate) struct AnonymousConnection(u32);

impl AnonymousConnection {
    /// Charges `cost` bytes for a connection if they and `session` bytes more (the session
    /// it will make, counted when made) fit the connected share of `budget`; `None` past it.
    /// Charged at once, so connections that pass the check together cannot overshoot it by
    /// more than their sessions.
    pub(crate) fn charge(cost: u32, session: u64, budget: &MemoryBudget) -> Option<Self> {
        let share = i64::try_from(anonymous_share(budget)).unwrap_or(i64::MAX);
        let session = i64::try_from(session).unwrap_or(i64::MAX);
        let held = ANONYMOUS_CONNECTED_BYTES.fetch_add(i64::from(cost), Ordering::Relaxed);
        if held.saturating_add(i64::from(cost)).saturating_add(session) > share {
            ANONYMOUS_CONNECTED_BYTES.fetch_sub(i64::from(cost), Ordering::Relaxed);
            return None;
        }
        Some(AnonymousConnection(cost))
    }
}

impl Drop for AnonymousConnection {
    fn drop(&mut self) {
        if self.0 > 0 {
            ANONYMOUS_CONNECTED_BYTES.fetch_sub(i64::from(self.0), Ordering::Relaxed);
        }
    }
}

/// What anonymous clients' connections and their sessions that end with them hold now
/// ([`ANONYMOUS_CONNECTED_BYTES`]).
pub(crate) fn anonymous_connected_bytes() -> u64 {
    u64::try_from(ANONYMOUS_CONNECTED_BYTES.load(Ordering::Relaxed)).unwrap_or(0)
}

/// The anonymous share of `budget` in bytes ([`ANONYMOUS_SHARE`]); also the bound of anonymous
/// clients' partly received packets (`connection::partial`).
pub(crate) fn anonymous_share(budget: &MemoryBudget) -> u64 {
    budget.limit / ANONYMOUS_SHARE
}

/// Whether what anonymous sessions hold may grow by `cost` bytes within their share of
/// `budget` ([`ANONYMOUS_SHARE`]).
pub(crate) fn anonymous_share_has_room(cost: u64, budget: &MemoryBudget) -> bool {
    anonymous_bytes().saturating_add(cost) <= anonymous_share(budget)
}

/// A retained message of `bytes` (topic and payload) published by an anonymous client entered
/// (`up`) or left the retained store. Its bytes are in [`MESSAGE_BYTES`] already, as every
/// message's; here they are charged to the anonymous share too.
pub(super) fn anonymous_retained_counted(bytes: usize, up: bool) {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    ANONYMOUS_BYTES.fetch_add(if up { bytes } else { -bytes }, Ordering::Relaxed);
}

/// `bytes` of payload joined (`up`) or left an anonymous session's queue: charged to the
/// anonymous share (the messages themselves are in [`MESSAGE_BYTES`] already, once however
/// many queues hold them; here each queue's copy counts, as it is what that session pins).
pub(super) fn anonymous_queued_counted(bytes: usize, up: bool) {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    ANONYMOUS_BYTES.fetch_add(if up { bytes } else { -bytes }, Ordering::Relaxed);
}

/// A will's bytes ([`crate::codec::LastWill::held_bytes`]) while a connection holds it (every
/// will, from CONNECT: issue 35, twelfth pass, U7) or while it waits for its delay: counted in
/// the budget, and for an anonymous session's in the anonymous share, from
/// the moment it is held until it is published or cancelled (made and dropped with the
/// connection's will, then with its `PendingWill`). A v5 will may carry up to `max_connect_size` and wait as long as its
/// session: counted nowhere, hundreds of them pinned memory past every bound (issue 35,
/// eighth adversarial pass, Q1).
#[derive(Debug)]
pub(crate) struct HeldWill {
    bytes: usize,
    anonymous: bool,
}

impl HeldWill {
    /// Counts `bytes` (and in the anonymous share when `anonymous`). Straight into
    /// [`MESSAGE_BYTES`], not the thread's share of it: one per connection with a will, not per
    /// message, and exact, so the next CONNECT's check and `postbox_memory_used_bytes` see it
    /// (issue 35, twelfth pass, U7: every will is counted now).
    pub(crate) fn new(bytes: usize, anonymous: bool) -> HeldWill {
        MESSAGE_BYTES.fetch_add(i64::try_from(bytes).unwrap_or(i64::MAX), Ordering::Relaxed);
        if anonymous {
            anonymous_retained_counted(bytes, true);
        }
        HeldWill { bytes, anonymous }
    }
}

impl Drop for HeldWill {
    fn drop(&mut self) {
        MESSAGE_BYTES.fetch_sub(
            i64::try_from(self.bytes).unwrap_or(i64::MAX),
            Ordering::Relaxed,
        );
        if self.anonymous {
            anonymous_retained_counted(self.bytes, false);
        }
    }
}

/// A session took a new filter of `len` bytes (`up`) or let go of one (`anonymous`: the
/// session is counted in [`anonymous_bytes`]). Straight to the shared counters (SUBSCRIBE is
/// rare next to PUBLISH): the check of the next SUBSCRIBE sees it.
pub(super) fn subscription_counted(len: usize, anonymous: bool, up: bool) {
    let cost = i64::try_from(subscription_cost(len)).unwrap_or(i64::MAX);
    let delta = if up { cost } else { -cost };
    MESSAGE_BYTES.fetch_add(delta, Ordering::Relaxed);
    SUBSCRIPTION_BYTES.fetch_add(delta, Ordering::Relaxed);
    if anonymous {
        ANONYMOUS_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Moves a filter of `len` bytes into (`anonymous`) or out of the anonymous sessions' count:
/// its session changed owner while holding it.
pub(super) fn subscription_owner_changed(len: usize, anonymous: bool) {
    let cost = i64::try_from(subscription_cost(len)).unwrap_or(i64::MAX);
    let delta = if anonymous { cost } else { -cost };
    ANONYMOUS_BYTES.fetch_add(delta, Ordering::Relaxed);
}

/// What anonymous sessions hold now, in this process (see [`ANONYMOUS_SHARE`]).
pub(crate) fn anonymous_bytes() -> u64 {
    u64::try_from(ANONYMOUS_BYTES.load(Ordering::Relaxed)).unwrap_or(0)
}

/// The part of [`message_bytes`] that is not messages: subscriptions and sessions.
pub(crate) fn bookkeeping_bytes() -> u64 {
    subscription_bytes() + u64::try_from(SESSION_BYTES.load(Ordering::Relaxed)).unwrap_or(0)
}

/// The bytes subscriptions count against the budget now, in this process.
pub(crate) fn subscription_bytes() -> u64 {
    u64::try_from(SUBSCRIPTION_BYTES.load(Ordering::Relaxed)).unwrap_or(0)
}

/// Where memory use stands against the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemoryLevel {
    /// Below the pause mark: nothing to do.
    Normal,
    /// Near the budget: publishers pause until usage is back under the resume mark.
    Near,
    /// Over the budget: QoS 1/2 PUBLISHes are refused, QoS 0 ones dropped.
    Over,
}

/// The memory budget (`mqtt.max_memory`) and its marks.
#[derive(Clone, Copy, Debug)]
pub struct MemoryBudget {
    /// The budget in bytes.
    pub limit: u64,
    /// Publishers pause from here on (90% of the budget).
    pub pause_at: u64,
    /// Paused publishers resume below this (80%).
    pub resume_at: u64,
}

impl MemoryBudget {
    /// The budget for `limit` bytes.
    pub fn new(limit: u64) -> MemoryBudget {
        MemoryBudget {
            limit,
            pause_at: limit / 10 * 9,
            resume_at: limit / 10 * 8,
        }
    }

    /// Resolves `mqtt.max_memory`: `auto` is half of the memory this process may use.
    pub fn from_setting(setting: MemoryLimit) -> MemoryBudget {
        match setting {
            MemoryLimit::Bytes(bytes) => MemoryBudget::new(bytes),
            MemoryLimit::Auto => MemoryBudget::new(crate::config::available_memory() / 2),
        }
    }

    /// Where `used` bytes stand.
    pub fn level(&self, used: u64) -> MemoryLevel {
        if used > self.limit {
            MemoryLevel::Over
        } else if used >= self.pause_at {
            MemoryLevel::Near
        } else {
            MemoryLevel::Normal
        }
    }
}

/// The broker's flow-control state: settings, the wake-up paused publishers wait on, the
/// memory budget, and the figures behind the pause metrics.
#[derive(Debug)]
pub struct FlowControl {
    /// `mqtt.stalled_after`, in milliseconds.
    pub stalled_after_ms: u64,
    /// `mqtt.backpressure_qos0`.
    pub backpressure_qos0: bool,
    /// The memory budget.
    pub memory: MemoryBudget,
    /// Woken when a session publishers were paused for has drained to its low-water mark,
    /// detached or ended, and when memory use falls under the resume mark. One for the whole
    /// broker: pauses are rare, and each woken publisher re-checks its own target.
    room: Arc<Notify>,
    /// Set while publishers are paused for memory, so draining subscribers know to wake them.
    memory_alarm: AtomicBool,
    /// Publishing connections paused now.
    paused: AtomicUsize,
    /// Microseconds publishers have spent paused, all together.
    paused_us: AtomicU64,
}

impl FlowControl {
    /// Flow control for the `[mqtt]` settings.
    pub fn new(config: &MqttConfig) -> FlowControl {
        let memory = MemoryBudget::from_setting(config.max_memory);
        SHARE_LIMIT.store(anonymous_share(&memory), Ordering::Relaxed);
        FlowControl {
            stalled_after_ms: u64::from(config.stalled_after) * 1000,
            backpressure_qos0: config.backpressure_qos0,
            memory,
            room: Arc::new(Notify::new()),
            memory_alarm: AtomicBool::new(false),
            paused: AtomicUsize::new(0),
            paused_us: AtomicU64::new(0),
        }
    }

    /// The wake-up a paused publisher waits on. Create the future *before* checking whether
    /// it may go on, so a wake-up in between is not lost.
    pub fn room(&self) -> &Arc<Notify> {
        &self.room
    }

    /// Wakes every paused publisher to re-check what it waits for.
    pub(super) fn wake_paused(&self) {
        if self.paused.load(Ordering::Relaxed) > 0 {
            self.room.notify_waiters();
        }
    }

    /// Where memory stands with `used` bytes (messages and partial packets), `Near` also
    /// while the store's queue is long ([`STORE_BACKLOG_PAUSE`]); raises the alarm that makes
    /// draining subscribers and store commits wake paused publishers once it is `Near` or
    /// worse.
    pub fn memory_level(&self, used: u64) -> MemoryLevel {
        let mut level = self.memory.level(used);
        if level == MemoryLevel::Normal {
            let backlog = crate::storage::backlog_bytes();
            if backlog >= STORE_BACKLOG_PAUSE || used + backlog >= self.memory.pause_at {
                level = MemoryLevel::Near;
            }
        }
        if level != MemoryLevel::Normal && !self.memory_alarm.load(Ordering::Relaxed) {
            self.memory_alarm.store(true, Ordering::Relaxed);
        }
        level
    }

    /// True if paused publishers may resume for memory: usage under the resume mark, with
    /// the store's queue too, and that queue under half of [`STORE_BACKLOG_PAUSE`].
    pub fn memory_resumes(&self, used: u64) -> bool {
        let backlog = crate::storage::backlog_bytes();
        used + backlog < self.memory.resume_at && backlog < STORE_BACKLOG_PAUSE / 2
    }

    /// Called as deliveries leave queues, after each store commit and as cluster frames
    /// leave: once the bytes held fall under the resume mark
    /// during an alarm, the alarm ends and paused publishers are woken. One relaxed load when
    /// there is no alarm.
    pub(crate) fn on_drained(&self) {
        if self.memory_alarm.load(Ordering::Relaxed) && self.memory_resumes(message_bytes()) {
            self.memory_alarm.store(false, Ordering::Relaxed);
            self.room.notify_waiters();
        }
    }

    /// A publisher paused.
    pub fn pause_started(&self) {
        self.paused.fetch_add(1, Ordering::Relaxed);
    }

    /// A publisher resumed after `micros` paused.
    pub fn pause_ended(&self, micros: u64) {
        self.paused.fetch_sub(1, Ordering::Relaxed);
        self.paused_us.fetch_add(micros, Ordering::Relaxed);
    }

    /// Publishers paused now, and the time all of them have spent paused (seconds).
    pub fn pause_figures(&self) -> (usize, f64) {
        (
            self.paused.load(Ordering::Relaxed),
            self.paused_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

impl super::Broker {
    /// Copies the flow-control figures into their metrics (the server's periodic sweep):
    /// paused publishers, time paused, memory used with `partial` bytes of partly received
    /// packets, and what anonymous clients hold (`anonymous_in_transit`: their connections'
    /// part, `connection::partial`).
    pub fn update_flow_metrics(&self, partial: u64, anonymous_in_transit: u64) {
        let (paused, seconds) = self.flow.pause_figures();
        self.metrics.publishers_paused.set(paused as f64);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.metrics
            .publisher_pause_seconds
            .absolute(seconds as u64);
        self.metrics.sessions_stalled.set(stalled_sessions() as f64);
        self.metrics
            .memory_budget_bytes
            .set(self.flow.memory.limit as f64);
        self.metrics
            .memory_used_bytes
            .set((message_bytes() + partial) as f64);
        self.metrics
            .store_queue_bytes
            .set(crate::storage::backlog_bytes() as f64);
        let [kept, connected, in_transit] = &self.metrics.anonymous_bytes;
        kept.set(anonymous_bytes() as f64);
        connected.set(anonymous_connected_bytes() as f64);
        in_transit.set(anonymous_in_transit as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_are_ninety_and_eighty_percent() {
        let budget = MemoryBudget::new(1000);
        assert_eq!(budget.level(899), MemoryLevel::Normal);
        assert_eq!(budget.level(900), MemoryLevel::Near);
        assert_eq!(budget.level(1000), MemoryLevel::Near);
        assert_eq!(budget.level(1001), MemoryLevel::Over);
        assert_eq!(budget.resume_at, 800);
    }

    #[test]
    fn auto_is_half_of_what_the_process_may_use() {
        let auto = MemoryBudget::from_setting(MemoryLimit::Auto);
        assert!(auto.limit > 0);
        assert!(auto.limit <= crate::config::available_memory() / 2);
    }
}
