//! One connected client after CONNACK: the wait loop and packet dispatch.
//!
//! The client decodes, calls the session API ([`SessionHandle`]), waits for the commits its
//! answers depend on ([`GatedWrites`]) and writes. It owns only what dies with the socket:
//! keep-alive, topic aliases, Receive Maximum accounting, the will, re-authentication. By
//! concern: [`inbound`] (PUBLISH and PUBREL from the client), [`outbound`] (deliveries and
//! their acks), [`subscribe`], [`reauth`], [`closing`].
//!
//! Must not: touch session state except through `SessionHandle`; hold a lock while paused.

mod closing;
mod inbound;
mod inbound_aliases;
mod outbound;
mod pause;
mod rate;
mod reauth;
mod subscribe;
mod write_memo;

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytestring::ByteString;
use tokio::sync::futures::Notified;

use super::admission;
use super::gated::GatedWrites;
use super::handshake::Accepted;
use super::io::{Io, IoEvent, Socket, ANSWERS_WHILE_BEHIND};
use super::partial::{HeldClass, PartialCheck};
use super::topic_alias::OutboundAliases;
use super::violation::Violation;
use crate::auth::AuthStep;
use crate::broker::{flow, ArrivalWaker, Broker, SessionHandle};
use crate::codec::{self, LastWill, Packet, ProtocolVersion};
use crate::config::OutboundTopicAliases;
use crate::connection::ConnectionInfo;
use crate::storage::StorageError;
use closing::Close;
use reauth::AuthContext;

/// What woke the connection (see [`Client::next_wake`]).
enum Wake {
    Durable(Result<(), StorageError>),
    Verdict(AuthStep),
    Io(IoEvent),
    Session,
    /// The PUBLISH at the front of the read buffer may be routed now (see
    /// [`Input::PublishNext`]).
    PublishTurn,
    /// The broker's flow-control notification fired while this connection is paused: see
    /// whether it may read again ([`Client::pause_over`]).
    Room,
    /// The output the socket did not take would take anonymous clients past their share
    /// (`Io::count_unwritten`, issue 35, twelfth pass, U5): the connection closes.
    OverShare,
}

/// Control packet type of PUBLISH (MQTT 2.1.2), read from the first byte of a packet.
const PUBLISH_TYPE: u8 = 3;

/// A connection whose previous read is at least this old waits, before its first PUBLISH,
/// for the reads that arrived before it ([`crate::broker::ArrivalOrder`]): the
/// subscribe-then-trigger race happens between connections that were quiet. A busy
/// connection does not (it still waits for the fence): holding back every read's PUBLISH
/// cost 14% of fan-in QoS 1 throughput, and running the whole runtime in FIFO order 14-23%
/// of p2p QoS 1 and 40% of p50 latency (`benches/results/conformance-fifo-runtime.txt`).
const QUIET: Duration = Duration::from_millis(5);

/// Whether [`Client::process_input`] may route a PUBLISH yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PublishTurn {
    /// First pass over a read: stop before the first PUBLISH.
    NotYet,
    /// After the yield: handle everything.
    Now,
}

/// How far [`Client::process_input`] got.
enum Input {
    /// Every complete packet was handled.
    Done,
    /// The next packet is a PUBLISH and it must wait its turn ([`Wake::PublishTurn`]):
    /// until the reads that arrived before this one are handled up to their own first
    /// PUBLISH ([`ArrivalOrder`]; a SUBSCRIBE among them is then in the trie), and until no
    /// SUBSCRIBE read anywhere is being handled ([`crate::broker::SubscribeFence`]). Once per
    /// read, not per packet: a busy publisher's read carries many packets.
    PublishNext,
    /// A PUBLISH paused the connection (`pause`): the rest waits in the buffer.
    Paused,
}

/// One connected client.
pub(super) struct Client<S> {
    io: Io<S>,
    session: SessionHandle,
    /// Where the connection came from (peer address, listener), for logs.
    info: ConnectionInfo,
    version: ProtocolVersion,
    /// What the handshake settled that the connection reads later (session present, not
    /// authenticated), packed in one byte: the client state is at its size bound.
    settled: Settled,
    /// 1.5 × keep-alive in milliseconds (at most 98,302,500), or `None` when keep-alive is
    /// off. Enforced without a timer: the broker's periodic sweep wakes the connection once
    /// the deadline it last reported to the session has passed, and the connection then
    /// compares against `last_read`. 4 bytes, not a `Duration`'s 16: that made room for the
    /// unwritten output's count in `Io` (issue 35, twelfth pass, U5) within the client
    /// state's size bound (`size_tests`).
    keep_alive_limit_ms: Option<NonZeroU32>,
    last_read: Instant,
    /// Boxed: most clients have none, and it is large (216 B) for a field held all the time.
    will: Option<Box<HeldLastWill>>,
    /// Outbound QoS 1/2 window: min(broker's max inflight, client's Receive Maximum).
    window: u16,
    /// Largest packet the client accepts (v5 Maximum Packet Size).
    client_max_packet: usize,
    /// Inbound topic aliases (v5): alias -> topic, at most `alias_max_in` entries, their
    /// bytes counted as the connection's own (U6). Boxed and created on first use: most
    /// clients never send an alias.
    aliases: Option<Box<inbound_aliases::InboundAliases>>,
    /// Topic Alias Maximum we announced: inbound aliases 1..=this are valid.
    alias_max_in: u16,
    /// Outbound topic aliases, when `mqtt.outbound_topic_aliases` and the client allow them.
    aliases_out: Option<Box<OutboundAliases>>,
    /// Our Receive Maximum for this client (v5); `u32::MAX` for 3.x, which cannot be told.
    receive_maximum: u32,
    /// Inbound QoS 1 PUBLISHes whose PUBACK has not been queued yet. Together with the QoS 2
    /// ids awaiting PUBREL (kept by the session) it is what Receive Maximum bounds, see
    /// [`Client::check_receive_maximum`]. An ack that has to wait (e.g. for a durable commit)
    /// keeps its PUBLISH counted here until it is queued.
    pending_inbound: u32,
    /// The client accepts Reason Strings and User Properties (v5 Request Problem Information).
    problem_info: bool,
    /// The connection's enhanced authentication, for re-authentication, and when its
    /// credentials expire; boxed, most clients have neither.
    auth: Option<Box<AuthContext>>,
    /// Writes waiting for the durable store (acks, PUBREL, outbound QoS 2).
    gated: GatedWrites,
    /// The PUBLISH at the front of the read buffer waits its turn (see
    /// [`Input::PublishNext`]).
    publish_waits: bool,
    /// The waker reads are polled with, which places them in arrival order.
    arrival: Arc<ArrivalWaker>,
    /// Set while back-pressure pauses this publisher (`pause`); boxed, rare.
    pause: Option<Box<pause::Pause>>,
    /// The publish rate bucket, when `mqtt.max_publish_rate` / `max_publish_bytes_rate` set
    /// a limit (see `rate`); boxed, none by default.
    rate: Option<Box<rate::RateBucket>>,
    /// The last PUBLISH topic's authorisation, when an ACL or token claims apply (see
    /// `write_memo`); boxed, made at the first checked PUBLISH.
    write_memo: Option<Box<write_memo::WriteMemo>>,
}

/// Facts of the handshake in one byte (see [`Client::settled`]).
#[derive(Debug, Clone, Copy)]
struct Settled(u8);

impl Settled {
    const SESSION_PRESENT: u8 = 1;
    const UNAUTHENTICATED: u8 = 2;
    const NOT_KEPT: u8 = 4;
    const ANONYMOUS: u8 = 8;

    fn new(
        session_present: bool,
        unauthenticated: bool,
        not_kept: bool,
        anonymous: bool,
    ) -> Settled {
        Settled(
            (u8::from(session_present) * Self::SESSION_PRESENT)
                | (u8::from(unauthenticated) * Self::UNAUTHENTICATED)
                | (u8::from(not_kept) * Self::NOT_KEPT)
                | (u8::from(anonymous) * Self::ANONYMOUS),
        )
    }

    /// The session's owner is `SessionOwner::Anonymous`: a partly received packet counts in
    /// the anonymous share (`partial::HeldClass::Anonymous`).
    fn anonymous(self) -> bool {
        self.0 & Self::ANONYMOUS != 0
    }

    /// The client resumed a session: what it had in flight is sent again.
    fn session_present(self) -> bool {
        self.0 & Self::SESSION_PRESENT != 0
    }

    /// No configured method authenticated the client: a DISCONNECT's Session Expiry
    /// Interval is capped at `mqtt.max_session_expiry_anonymous` as the CONNECT's was.
    fn unauthenticated(self) -> bool {
        self.0 & Self::UNAUTHENTICATED != 0
    }

    /// The anonymous share had no room for the session the client asked to keep (CONNACK
    /// said Session Expiry Interval 0): a DISCONNECT asking for more is not heeded.
    fn not_kept(self) -> bool {
        self.0 & Self::NOT_KEPT != 0
    }
}

/// Stop reading from a client while this many of its writes wait for the store: bounds the
/// memory a fast publisher can tie up when the disk is slow (3.x has no Receive Maximum).
const MAX_GATED_WRITES: usize = 1024;

/// The will a connection holds, with its bytes counted from CONNECT until it is published,
/// deferred (the session's count takes over) or dropped (`flow::HeldWill`: ninth adversarial
/// pass, R1, for delayed wills; issue 35, twelfth pass, U7, for every will).
struct HeldLastWill {
    will: LastWill,
    _held: Option<flow::HeldWill>,
}

impl<S: Socket> Client<S> {
    /// Takes over the connection from the handshake.
    pub(super) fn new(mut io: Io<S>, accepted: Accepted, info: ConnectionInfo) -> Client<S> {
        let connect = accepted.connect;
        let attached = accepted.attached;
        let keep_alive = accepted.keep_alive;
        let broker = Arc::clone(attached.handle.broker());
        let config = broker.config();
        let limits = broker.runtime_limits().get();
        let v5 = connect.protocol.is_v5();
        let aliases_out = match (
            config.outbound_topic_aliases,
            connect.properties.topic_alias_maximum,
        ) {
            // MQTT-3.1.2-27: none unless the client announced a maximum above 0.
            (OutboundTopicAliases::Lru, Some(max)) if v5 && max > 0 => {
                let class = if accepted.anonymous {
                    let share = flow::anonymous_share(&broker.flow().memory);
                    (HeldClass::Anonymous, share)
                } else {
                    (HeldClass::Connected, 0)
                };
                Some(Box::new(OutboundAliases::new(max, class)))
            }
            _ => None,
        };
        let problem_info = admission::wants_problem_info(&connect);
        let our_receive_maximum = if v5 {
            u32::from(config.receive_maximum)
        } else {
            u32::MAX
        };
        let alias_max_in = config.topic_alias_maximum;
        let receive_maximum = connect.properties.receive_maximum.unwrap_or(u16::MAX);
        let window = config.max_inflight_messages.min(receive_maximum).max(1);
        let client_max_packet = connect
            .properties
            .maximum_packet_size
            .map_or(usize::MAX, |m| m as usize);
        // The CONNECT has been taken out of it: do not keep its buffer for an idle client, nor
        // the CONNECT's allocation behind packets sent right after it.
        io.release_read_buffer(usize::MAX);
        Client {
            io,
            session: attached.handle,
            info,
            version: connect.protocol,
            settled: Settled::new(
                attached.session_present,
                accepted.unauthenticated,
                accepted.not_kept,
                accepted.anonymous,
            ),
            keep_alive_limit_ms: NonZeroU32::new(u32::from(keep_alive) * 1500),
            last_read: Instant::now(),
            will: connect.will.map(|will| {
                Box::new(HeldLastWill {
                    will,
                    _held: accepted.will_held,
                })
            }),
            window,
            client_max_packet,
            aliases: None,
            alias_max_in,
            aliases_out,
            receive_maximum: our_receive_maximum,
            pending_inbound: 0,
            problem_info,
            auth: AuthContext::new(accepted.auth, accepted.credentials_expire, accepted.token),
            gated: GatedWrites::default(),
            publish_waits: false,
            arrival: ArrivalWaker::new(Arc::clone(broker.arrival_order())),
            pause: None,
            // Read per connection from the limits a reload may change (`broker::runtime_limits`).
            rate: rate::RateBucket::new(
                limits.max_publish_rate,
                limits.max_publish_bytes_rate,
                Instant::now(),
            )
            .map(Box::new),
            write_memo: None,
        }
    }

    /// 1.5 × keep-alive, or `None` when keep-alive is off (MQTT-3.1.2-24).
    fn keep_alive_limit(&self) -> Option<Duration> {
        self.keep_alive_limit_ms
            .map(|ms| Duration::from_millis(u64::from(ms.get())))
    }

    /// The broker the client's session lives in.
    fn broker(&self) -> &Arc<Broker> {
        self.session.broker()
    }

    /// Where the bytes this connection holds count (its partial packet, its inbound aliases,
    /// its unwritten output): an anonymous client's in the anonymous share (with the share's
    /// size), any other's in the memory budget.
    fn held_class(&self) -> (HeldClass, u64) {
        if self.settled.anonymous() {
            let share = flow::anonymous_share(&self.broker().flow().memory);
            (HeldClass::Anonymous, share)
        } else {
            (HeldClass::Connected, 0)
        }
    }

    /// Runs until the connection ends, then settles the will and the session.
    pub(super) async fn run(mut self: Box<Self>) {
        self.report_keep_alive_deadline();
        if self.settled.session_present() {
            self.retransmit_inflight();
        }
        let close = self.serve().await;
        // A connection that closes while paused is no longer a paused publisher.
        self.abandon_pause();
        // Boxed, like the handshake: needed once, at the end, so it should not widen the
        // future held while the connection lives.
        Box::pin(self.finish(close)).await;
    }

    async fn serve(&mut self) -> Close {
        let session = Arc::clone(self.session.session());
        // The byte stream is one stream from its first byte: a client need not wait for
        // CONNACK before sending more (5.0 and 3.1.1 §3.1.4: "Clients are allowed to send
        // further MQTT Control Packets immediately after sending a CONNECT"), so whatever the
        // handshake read past CONNECT (one write carrying CONNECT + SUBSCRIBE, say) is this
        // loop's first input: the socket will not wake the loop for bytes already read. It is
        // handled after the first fill, so a resumed session's queued messages go out first,
        // as they would to a client that waited for CONNACK.
        let mut read_ahead = !self.io.rbuf.is_empty();
        loop {
            // Created before the checks below, so a wake-up that lands between a check and
            // the select is not lost (`Session::notified`).
            let woken = std::pin::pin!(session.notified());
            let now = Instant::now();
            if let Some(close) = self.check_standing(now) {
                return close;
            }
            if !self.fill_from_session(now) {
                // Taken over (MQTT-3.1.4-3), or an operator's disconnect (admin API).
                return if self.session.was_kicked() {
                    Close::Administrative
                } else {
                    Close::TakenOver
                };
            }
            if std::mem::take(&mut read_ahead) {
                if let Err(close) = self.process_before_publish(true) {
                    return close;
                }
                continue;
            }
            self.io.release_write_buffer();
            match self.next_wake(woken).await {
                Wake::Durable(Ok(())) => {
                    self.gated.release_front();
                    self.release_gated();
                }
                Wake::Durable(Err(error)) => {
                    tracing::warn!(client = %self.session.client_id(), %error, "the durable store did not store what an answer waits for; closing without that answer");
                    return Close::StoreFailed(error);
                }
                Wake::Verdict(verdict) => {
                    if let Some(auth) = self.auth.as_deref_mut() {
                        auth.step = None;
                    }
                    if let Err(close) = self.on_auth_verdict(verdict) {
                        return close;
                    }
                }
                Wake::Io(IoEvent::Written(Ok(0) | Err(_)) | IoEvent::Read(Ok(0) | Err(_))) => {
                    return Close::Lost
                }
                Wake::Io(IoEvent::Written(Ok(n))) => {
                    self.broker().metrics.bytes_sent.increment(n as u64);
                }
                Wake::Io(IoEvent::Read(Ok(n))) => {
                    self.broker().metrics.bytes_received.increment(n as u64);
                    let now = Instant::now();
                    let was_quiet = now.duration_since(self.last_read) >= QUIET;
                    self.last_read = now;
                    // `Input::PublishNext` has set `publish_waits`.
                    if let Err(close) = self.process_before_publish(was_quiet) {
                        return close;
                    }
                }
                Wake::PublishTurn => {
                    // Reads that arrived before this one go first ...
                    // The position held by `process_before_publish` (0: only the fence).
                    let ticket = self.arrival.take_held();
                    if ticket != 0 {
                        let order = Arc::clone(self.broker().arrival_order());
                        // Boxed: rare, and it would otherwise widen every connection's future.
                        Box::pin(order.wait_for_earlier(ticket)).await;
                    }
                    // ... and SUBSCRIBEs other workers are still handling.
                    if self.broker().subscribe_fence().is_closed() {
                        // Boxed: rare, and it would otherwise widen every connection's future.
                        Box::pin(self.broker().subscribe_fence().wait_open()).await;
                    }
                    let held = self.io.rbuf.len();
                    let processed = self.process_input(PublishTurn::Now);
                    self.io
                        .release_read_buffer(held.saturating_sub(self.io.rbuf.len()));
                    if let Err(close) = processed {
                        return close;
                    }
                }
                Wake::Session if self.pause.is_some() => {
                    if let Err(close) = self.resume_if_room() {
                        return close;
                    }
                }
                Wake::Session => self.report_keep_alive_deadline(),
                Wake::Room => {
                    if let Err(close) = self.resume_if_room() {
                        return close;
                    }
                }
                Wake::OverShare => return Close::OverAnonymousShare,
            }
        }
    }

    /// A paused connection re-checks its pause; once over, it handles what it had read and
    /// reads on.
    fn resume_if_room(&mut self) -> Result<(), Close> {
        if !self.pause_over(Instant::now()) {
            return Ok(());
        }
        let held = self.io.rbuf.len();
        let processed = self.process_input(PublishTurn::Now);
        self.io
            .release_read_buffer(held.saturating_sub(self.io.rbuf.len()));
        processed.map(|_| ())
    }

    /// Waits for the next thing to do, in priority order: a commit the front gated write waits
    /// for, an authentication verdict, socket I/O (writes first, reads only while neither the
    /// write batch nor the gated writes are over their bounds), a session wake-up.
    ///
    /// One hand-written poll instead of `select!` over async helpers: this future is what
    /// every idle connection holds, and it is a few references plus `woken`.
    fn next_wake<'a, 'n: 'a>(
        &'a mut self,
        mut woken: Pin<&'a mut Notified<'n>>,
    ) -> impl Future<Output = Wake> + use<'a, 'n, S> {
        std::future::poll_fn(move |cx| {
            if std::mem::take(&mut self.publish_waits) {
                return Poll::Ready(Wake::PublishTurn);
            }
            if self.gated.waiting() {
                if let Poll::Ready(r) = self.gated.poll_front_durable(cx) {
                    return Poll::Ready(Wake::Durable(r));
                }
            }
            if let Some(step) = self.auth.as_deref_mut().and_then(|a| a.step.as_mut()) {
                if let Poll::Ready(verdict) = step.as_mut().poll(cx) {
                    return Poll::Ready(Wake::Verdict(verdict));
                }
            }
            if let Some(pause) = self.pause.as_deref_mut() {
                if pause.poll_room(cx) {
                    return Poll::Ready(Wake::Room);
                }
            }
            let can_write = !self.io.out.is_empty();
            let can_read = self.io.out.answers_behind() < ANSWERS_WHILE_BEHIND
                && self.gated.len() < MAX_GATED_WRITES
                && self.pause.is_none();
            if can_write {
                if let Poll::Ready(event) = self.io.poll_event(cx, true, false) {
                    return Poll::Ready(Wake::Io(event));
                }
                // The socket took nothing: the batch waits in the write buffer, counted as
                // the connection's own while it does (never when writes complete at once).
                let class = self.held_class();
                if self.io.count_unwritten(class).is_err() {
                    return Poll::Ready(Wake::OverShare);
                }
            }
            // The ticket of the wake this read consumes, taken before the poll so a wake
            // racing with it keeps its own for the next read.
            let ticket = self.arrival.take_ticket();
            if can_read {
                let io = &mut self.io;
                let read = self.arrival.poll_with(cx, |cx| io.poll_read_some(cx));
                if let Poll::Ready(read) = read {
                    match read {
                        // Settled once handled up to its first PUBLISH.
                        Ok(n) if n > 0 => self.arrival.hold(ticket),
                        _ => self.arrival.order().settle(ticket),
                    }
                    return Poll::Ready(Wake::Io(IoEvent::Read(read)));
                }
            }
            // Not read (nothing there, or reading paused while writes back up): nobody waits
            // for this connection.
            self.arrival.order().settle(ticket);
            match woken.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Wake::Session),
                Poll::Pending => Poll::Pending,
            }
        })
    }

    /// Why the connection must close now, if it must: the server is stopping, the client's
    /// credentials expired (`reauth`), a started packet missed its deadline
    /// (`connection::partial`), or no packet arrived within 1.5 × keep-alive
    /// (MQTT-3.1.2-24). Takeover is checked under the session lock in
    /// [`Client::fill_from_session`].
    fn check_standing(&mut self, now: Instant) -> Option<Close> {
        if self.broker().is_shutting_down() {
            return Some(Close::ServerShutdown);
        }
        if self.credentials_expire_at().is_some_and(|at| now >= at) {
            return Some(Close::CredentialsExpired);
        }
        if self.token_revoked() {
            return Some(Close::CredentialsRevoked);
        }
        // While a PUBLISH waits its turn the buffer's front is complete: nothing to check. The
        // deadline does not run while the store holds reads back (the broker's delay, not the
        // client's); it does while the client's unread output does (its own).
        // Reads that end on packet boundaries (most) leave nothing to look at.
        if !self.publish_waits && self.io.holds_partial() {
            // A pause is the broker's doing too.
            let store_allows = self.gated.len() < MAX_GATED_WRITES && self.pause.is_none();
            let broker = self.session.broker();
            let anonymous = self
                .settled
                .anonymous()
                .then(|| flow::anonymous_share(&broker.flow().memory));
            match self
                .io
                .check_partial(now, store_allows, anonymous, broker.config())
            {
                PartialCheck::Expired => return Some(Close::PacketTimeout),
                PartialCheck::OverShare => return Some(Close::OverAnonymousShare),
                PartialCheck::Armed(_) => self.report_keep_alive_deadline(),
                PartialCheck::Clear | PartialCheck::Holding => {}
            }
        }
        if self
            .aliases_out
            .as_deref()
            .is_some_and(OutboundAliases::over_share)
        {
            return Some(Close::OverAnonymousShare);
        }
        // Not while paused: the client's packets wait unread in the socket.
        let limit = self.keep_alive_limit().filter(|_| self.pause.is_none())?;
        if now >= self.last_read + limit {
            return Some(Close::KeepAliveTimeout);
        }
        if self
            .io
            .out
            .stalled_since()
            .is_some_and(|since| now >= since + limit)
        {
            // Its packets are read behind its output; whether it reads is whether its TCP
            // stack acknowledged more of that output since last asked (issue 35,
            // twenty-second adversarial pass, H2: a client that never read but sent a
            // PINGREQ now and then stayed forever).
            let acked = self.io.bytes_acked();
            if !self.io.out.took_more_since(acked, now) {
                return Some(Close::OutputStalled);
            }
        }
        None
    }

    /// Tells the session when this connection's keep-alive runs out, for the broker's sweep.
    /// Reads do not update it (that would cost every packet an atomic store); instead, when the
    /// sweep wakes the connection at a stale deadline, it lands here and moves it on.
    fn report_keep_alive_deadline(&self) {
        let deadline = match self.keep_alive_limit() {
            Some(limit) => {
                let since = match self.io.out.stalled_since() {
                    Some(stalled) => stalled.min(self.last_read),
                    None => self.last_read,
                };
                self.broker().clock_ms(since + limit)
            }
            None => u64::MAX,
        };
        // A partial packet's deadline is enforced by the same sweep (rounded up a millisecond,
        // so the wake-up does not come just before it).
        let deadline = match self.io.partial_deadline() {
            Some(at) => deadline.min(self.broker().clock_ms(at).saturating_add(1)),
            None => deadline,
        };
        // A paused publisher re-checks when its target would count as stalled.
        let deadline = match self.pause.as_deref() {
            Some(pause) => deadline.min(pause.deadline_ms),
            None => deadline,
        };
        // Expiring credentials are enforced by the same sweep.
        let deadline = match self.credentials_expire_at() {
            Some(at) => deadline.min(self.broker().clock_ms(at).saturating_add(1)),
            None => deadline,
        };
        self.session.session().set_keep_alive_deadline(deadline);
    }

    /// True when the JWT keys were reloaded since the client's token last passed and the new
    /// keys refuse it (issue 35, seventh pass, N7). A reload wakes every connection
    /// (`Broker::wake_connections`), so this runs once per connection and reload; the rest of
    /// the time it is one atomic load, and nothing for a client without a token.
    fn token_revoked(&mut self) -> bool {
        let Some((token, checked)) = self.auth.as_deref_mut().and_then(|a| a.token.as_mut()) else {
            return false;
        };
        let Some(jwt) = self.session.broker().logins().and_then(|l| l.jwt()) else {
            return false;
        };
        let generation = jwt.generation();
        if generation == *checked {
            return false;
        }
        match jwt.verify(token) {
            Ok(_) => {
                *checked = generation;
                false
            }
            Err(error) => {
                tracing::info!(peer = %self.info.peer, client = %self.session.client_id(), %error, "closing connection: the JWT keys now in force refuse its token");
                true
            }
        }
    }

    /// When the client's credentials expire, if they do (a JWT's `exp`).
    fn credentials_expire_at(&self) -> Option<Instant> {
        self.auth.as_deref().and_then(|auth| auth.expires_at)
    }

    /// The first pass over a read: everything before its first PUBLISH, fenced when it holds
    /// a SUBSCRIBE (see [`crate::broker::SubscribeFence`]); then its arrival ticket is
    /// settled. A quiet connection's PUBLISH then waits for [`Wake::PublishTurn`] while reads
    /// that arrived before it are outstanding ([`crate::broker::ArrivalOrder`]) or the fence
    /// is closed; a busy one's only while the fence is closed.
    fn process_before_publish(&mut self, was_quiet: bool) -> Result<Input, Close> {
        let held = self.io.rbuf.len();
        let ticket = self.arrival.take_held();
        // An `Arc` of its own only when there is a SUBSCRIBE, so the entry can outlive the
        // `&mut self` call below; PUBLISH-only reads (the hot path) skip it.
        let fenced = codec::holds_subscribe(&self.io.rbuf).then(|| Arc::clone(self.broker()));
        let entry = fenced.as_ref().map(|b| b.subscribe_fence().enter());
        let mut processed = self.process_input(PublishTurn::NotYet);
        // Everything before the first PUBLISH is handled, SUBSCRIBEs included. Let go before
        // any wait: two connections each waiting for the other's entry would never wake.
        drop(entry);
        // Handled up to its first PUBLISH: reads that arrived after this one may go.
        let order = self.arrival.order();
        order.settle(ticket);
        if let Ok(Input::PublishNext) = processed {
            let behind = was_quiet && ticket != 0 && order.has_earlier(ticket);
            if behind || self.broker().subscribe_fence().is_closed() {
                self.arrival.hold(if behind { ticket } else { 0 });
                self.publish_waits = true;
                return processed;
            }
            processed = self.process_input(PublishTurn::Now);
        }
        self.io
            .release_read_buffer(held.saturating_sub(self.io.rbuf.len()));
        processed
    }

    /// Decodes and handles every complete packet in the read buffer; with
    /// [`PublishTurn::NotYet`], stops before the first PUBLISH (see [`Input::PublishNext`]).
    fn process_input(&mut self, turn: PublishTurn) -> Result<Input, Close> {
        let rules = super::decode_rules(self.broker().config());
        loop {
            if self.pause.is_some() {
                return Ok(Input::Paused);
            }
            if turn == PublishTurn::NotYet
                && self.io.rbuf.first().is_some_and(|b| b >> 4 == PUBLISH_TYPE)
            {
                return Ok(Input::PublishNext);
            }
            match codec::decode_with(&mut self.io.rbuf, Some(self.version), rules) {
                Ok(Some(packet)) => self.handle(packet)?,
                Ok(None) => return Ok(Input::Done),
                Err(error) => {
                    self.broker().metrics.malformed_packets.increment(1);
                    return Err(Close::Violation(Violation::Undecodable(error)));
                }
            }
        }
    }

    fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(publish) => self.on_publish(publish),
            // An ack of the wrong kind for an in-flight id is a Protocol Error (v5 §4.13.1,
            // 3.1.1 MQTT-4.8.0-1); one for an id with nothing in flight is ignored.
            Packet::PubAck(ack) => self
                .session
                .on_puback(ack.packet_id, ack.reason_code)
                .map_err(|mismatch| self.violation(Violation::AckMismatch(mismatch))),
            Packet::PubRec(rec) => self.on_pubrec(rec),
            Packet::PubComp(comp) => self
                .session
                .on_pubcomp(comp.packet_id)
                .map_err(|mismatch| self.violation(Violation::AckMismatch(mismatch))),
            Packet::PubRel(rel) => {
                self.on_pubrel(rel);
                Ok(())
            }
            Packet::Subscribe(subscribe) => self.on_subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => {
                self.on_unsubscribe(unsubscribe);
                Ok(())
            }
            Packet::PingReq => {
                self.io.queue(&Packet::PingResp, self.version); // MQTT-3.12.4-1
                Ok(())
            }
            Packet::Disconnect(disconnect) => self.on_disconnect(disconnect),
            Packet::Connect(_) => Err(self.violation(Violation::SecondConnect)),
            Packet::Auth(auth) => self.on_auth(auth),
            other => Err(self.violation(Violation::ServerPacket(other.name()))),
        }
    }

    /// Counts a protocol violation (not a malformed packet, counted apart) and closes.
    fn violation(&self, violation: Violation) -> Close {
        self.broker().metrics.protocol_errors.increment(1);
        Close::Violation(violation)
    }

    /// `why` as a Reason String, if the client accepts problem information (MQTT-3.1.2-29).
    fn problem_string(&self, why: &str) -> Option<ByteString> {
        self.problem_info.then(|| ByteString::from(why.to_owned()))
    }
}
