//! A packet that has started to arrive and is not complete: the deadline it must make, and
//! the bytes it holds (`postbox_partial_packet_bytes`).
//!
//! Why: a client that sends most of a large PUBLISH and stops held its read buffer for as
//! long as the socket stayed open, which with keep-alive 0 is forever (issue 11, item 5: 200
//! such connections held 207 MB). Now a packet of `n` bytes must be complete
//! `mqtt.packet_timeout + n / mqtt.min_packet_rate` seconds after its first bytes were seen:
//! a deadline per packet, fixed when it starts (from the size its fixed header announces),
//! rather than a minimum rate measured as it arrives, so a burst of bytes earns no extra time,
//! a stalled link gets `packet_timeout` whatever the size, and a large packet arriving at
//! `min_packet_rate` or faster always makes it.
//!
//! Cost: nothing for a connection whose reads end on packet boundaries (the common case); the
//! state is boxed and exists only while a partial packet is held, and the deadline is enforced
//! by the broker's keep-alive sweep, not a timer per connection.
//!
//! Must not: arm anything for a read that ends on a packet boundary.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::codec;
use crate::config::MqttConfig;

/// Bytes held by partial packets of connected clients that are not anonymous
/// ([`HeldClass::Connected`]), and what their connections hold beside (inbound topic
/// aliases, unread output: `connection::held`, issue 35, twelfth pass, U5, U6), across every
/// connection of the process: one atomic the
/// connections add to and take from, so a connection needs no metric handle of its own; the
/// server copies it into the gauge with each keep-alive sweep.
static HELD: AtomicU64 = AtomicU64::new(0);

/// The same for CONNECTs still arriving and CONNECTs waiting for their login verdict (no
/// credentials checked yet): kept out of the memory budget publishers pause for, so
/// connections nobody authenticated cannot make them pause or be refused (issue 35, sixth
/// adversarial pass: two sources of half-sent 1 MiB CONNECTs took the budget past 100% and
/// authenticated publishers got 0x97). Bounded instead by a share of their own, as large as
/// the anonymous share and apart from it, past which a CONNECT holding more than
/// [`CONNECT_ALLOWANCE`] is refused: `mqtt.max_connect_size` per connection times the
/// pending slots of every listener had let 1,088 half-sent CONNECTs hold 268 MB on one
/// listener, and decoded ones waiting for a hash ten times their wire size (twenty-fourth
/// pass, J1).
static HELD_BEFORE_CONNECT: AtomicU64 = AtomicU64::new(0);

/// What one CONNECT still arriving or waiting for its verdict may hold whatever the others
/// hold ([`HELD_BEFORE_CONNECT`]'s share): ordinary CONNECTs (an id, a user name, a
/// password or a token of a few KiB, a small will) are never refused for what strangers'
/// CONNECTs hold. Past the share the most that can be held is this (and
/// [`BEHIND_CONNECT`]) per handshake that waits: for the client, in a pending slot of its
/// listener, or for a password hash, in the password store's queue
/// (`auth::password::queue`, at most 1,024). Twenty-fifth pass, K1: those waiting for a hash
/// were bounded by nothing, and 5,080 of them held 40 MB of CONNECTs this allowance let past
/// the share.
pub(super) const CONNECT_ALLOWANCE: usize = 8 * 1024;

/// What a handshake may hold past its CONNECT, within the allowance too: the rest of its
/// first read and what it reads while its login verdict is due (`handshake::wait`,
/// `FIRST_READ` and `WATCH_LIMIT`, 1 KiB each). A small CONNECT with a packet pipelined
/// behind it is an ordinary one (twenty-sixth adversarial pass, L2).
pub(super) const BEHIND_CONNECT: usize = 2 * 1024;

/// What one handshake holds at most whatever the others hold: [`CONNECT_ALLOWANCE`] and
/// [`BEHIND_CONNECT`].
const UNBOUNDED_HOLDING: usize = CONNECT_ALLOWANCE + BEHIND_CONNECT;

/// Of the share of the CONNECTs not verified yet, what one source address (IPv4 address,
/// IPv6 /64, `connection::slots::source_key`) may hold in CONNECTs of more than
/// [`UNBOUNDED_HOLDING`]: this part of the share, or one `mqtt.max_connect_size` if that is
/// more ([`before_connect`]). Eight sockets from one address holding half-sent CONNECTs of
/// 262 KB had filled the whole share and kept it full, and every verified client whose
/// CONNECT held more than 8 KiB (a will of 20 KB) was closed while it arrived (issue 35,
/// twenty-fifth adversarial pass, K3); now that takes this many addresses.
const SOURCE_PART: u64 = 8;

/// Bytes of the CONNECTs of more than [`UNBOUNDED_HOLDING`] not verified yet, by source
/// address: each held within [`SOURCE_PART`] of the share. Touched only by such CONNECTs (a
/// lock per read of a large CONNECT), never by ordinary ones; entries are removed at 0.
static LARGE_BY_SOURCE: std::sync::LazyLock<
    parking_lot::Mutex<std::collections::HashMap<IpAddr, u64, foldhash::fast::RandomState>>,
> = std::sync::LazyLock::new(Default::default);

/// The class and share of the CONNECTs not verified yet, for a connection from `source`
/// (its `source_key`): the share is `share` bytes for all of them, and its address's part
/// of it an eighth ([`SOURCE_PART`]), or one CONNECT of `max_connect_size` where that is
/// more, so a CONNECT the broker takes always fits while its address holds nothing else.
pub(crate) fn before_connect(
    source: IpAddr,
    share: u64,
    max_connect_size: u32,
) -> (HeldClass, u64) {
    let source_share = (share / SOURCE_PART).max(u64::from(max_connect_size));
    (
        HeldClass::BeforeConnect {
            source,
            source_share,
        },
        share,
    )
}

/// The bytes of a CONNECT holding `held` that count in its address's part: all of them once
/// past [`UNBOUNDED_HOLDING`], none below.
fn large(held: usize) -> u64 {
    if held > UNBOUNDED_HOLDING {
        held as u64
    } else {
        0
    }
}

/// Moves `source`'s count of large CONNECT bytes from `from` to `to`; false, with nothing
/// changed, when growing would take it past `source_share`.
fn move_large(source: IpAddr, from: u64, to: u64, source_share: u64) -> bool {
    if from == to {
        return true;
    }
    let mut by_source = LARGE_BY_SOURCE.lock();
    let now = by_source.get(&source).copied().unwrap_or(0);
    let next = now.saturating_sub(from).saturating_add(to);
    if to > from && next > source_share {
        return false;
    }
    if next == 0 {
        by_source.remove(&source);
    } else {
        by_source.insert(source, next);
    }
    true
}

/// The same for connected anonymous clients ([`HeldClass::Anonymous`]): kept out of the
/// memory budget like [`HELD_BEFORE_CONNECT`], and bounded by an anonymous share of their
/// own.
static HELD_ANONYMOUS: AtomicU64 = AtomicU64::new(0);

/// Bytes currently held in read buffers by packets that have started to arrive and are not
/// complete (every connection in the process, handshakes included): what the gauge
/// `postbox_partial_packet_bytes` shows, and what a memory budget has to count.
pub(crate) fn partial_packet_bytes() -> u64 {
    HELD.load(Ordering::Relaxed)
        + HELD_BEFORE_CONNECT.load(Ordering::Relaxed)
        + HELD_ANONYMOUS.load(Ordering::Relaxed)
}

/// The part of [`partial_packet_bytes`] held by the packets of connected clients that are
/// not anonymous: what counts in the memory budget (`mqtt.max_memory`).
pub(crate) fn budgeted_partial_bytes() -> u64 {
    HELD.load(Ordering::Relaxed)
}

/// The part of [`partial_packet_bytes`] held for connected anonymous clients, out of the
/// budget and bounded by their own share ([`HeldClass::Anonymous`]): a part of the gauge
/// `postbox_anonymous_bytes`.
pub(crate) fn anonymous_partial_bytes() -> u64 {
    HELD_ANONYMOUS.load(Ordering::Relaxed)
}

/// Whose bytes a partial packet holds, which decides where they count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldClass {
    /// A CONNECT still arriving or waiting for its login verdict: [`HELD_BEFORE_CONNECT`],
    /// outside the memory budget, in a share of its own, and past [`UNBOUNDED_HOLDING`] in
    /// its address's part of that ([`before_connect`]).
    BeforeConnect {
        /// The connection's source (`connection::slots::source_key`).
        source: IpAddr,
        /// What that source's CONNECTs of more than [`UNBOUNDED_HOLDING`] may hold.
        source_share: u64,
    },
    /// A connected client a method verified, or any client where no method tells identities
    /// apart: [`HELD`], in the memory budget.
    Connected,
    /// A connected anonymous client (`SessionOwner::Anonymous`): [`HELD_ANONYMOUS`], out of
    /// the memory budget and bounded by a share of its own, as large as the anonymous share
    /// (an eighth of the budget, `flow::anonymous_share`). Ten anonymous connections that
    /// each sent all but the last byte of a 1 MiB PUBLISH took an 8 MiB budget past 100%,
    /// and every password user's QoS 1 PUBLISH got 0x97 for as long as they held (issue 35,
    /// eleventh adversarial pass, T6). Now a packet that would take what anonymous clients'
    /// packets hold past that share closes its connection ([`PartialCheck::OverShare`]), and
    /// the clients a method verified keep the whole budget they had.
    ///
    /// Apart from what anonymous clients keep (`flow::ANONYMOUS_BYTES`), not in it: with one
    /// bound for both, once strangers' sessions or retained messages filled their share (as
    /// they may), every anonymous packet that took more than one read was a reason to close
    /// its connection, where the answer is a PUBACK 0x97 for what cannot be kept.
    Anonymous,
}

/// Moves the `counted` bytes of a holder of `class` to `held`; false, with nothing more
/// counted, when the growth would take anonymous clients' partial packets past `share` bytes
/// ([`HeldClass::Anonymous`]), or for a holder of more than [`UNBOUNDED_HOLDING`] the
/// CONNECTs not verified yet past theirs, or its address past its part of it
/// ([`HeldClass::BeforeConnect`]). Only a connection holding a partial packet (or what
/// `connection::held` counts: issue 35, twelfth pass, U5, U6) gets here, never one whose
/// reads end on packet boundaries.
pub(super) fn count(class: HeldClass, counted: &mut usize, held: usize, share: u64) -> bool {
    let counter = match class {
        HeldClass::BeforeConnect { .. } => &HELD_BEFORE_CONNECT,
        HeldClass::Connected => &HELD,
        HeldClass::Anonymous => &HELD_ANONYMOUS,
    };
    // The address's part first, taken back below if the whole share has no room.
    let by_source = match class {
        HeldClass::BeforeConnect {
            source,
            source_share,
        } => Some((source, large(*counted), large(held), source_share)),
        _ => None,
    };
    if let Some((source, from, to, source_share)) = by_source {
        if !move_large(source, from, to, source_share) {
            return false;
        }
    }
    if held > *counted {
        let grown = (held - *counted) as u64;
        let before = counter.fetch_add(grown, Ordering::Relaxed);
        // Added first and taken back if over: two connections growing at once cannot both
        // pass on the same room.
        let over = before.saturating_add(grown) > share;
        let bounded = match class {
            HeldClass::Anonymous => true,
            HeldClass::BeforeConnect { .. } => held > UNBOUNDED_HOLDING,
            HeldClass::Connected => false,
        };
        if bounded && over {
            counter.fetch_sub(grown, Ordering::Relaxed);
            if let Some((source, from, to, _)) = by_source {
                move_large(source, to, from, u64::MAX);
            }
            return false;
        }
    } else if held < *counted {
        counter.fetch_sub((*counted - held) as u64, Ordering::Relaxed);
    }
    *counted = held;
    true
}

/// How long a packet whose fixed header announces `len` bytes may take to arrive once its
/// first bytes are in: `packet_timeout` plus `len / min_packet_rate` seconds.
pub(super) fn packet_time_limit(config: &MqttConfig, len: usize) -> Duration {
    let rate = u64::from(config.min_packet_rate.max(1));
    let allowance_ms = (len as u64).saturating_mul(1000) / rate;
    Duration::from_secs(u64::from(config.packet_timeout)) + Duration::from_millis(allowance_ms)
}

/// What [`PartialPacket::check`] found in the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PartialCheck {
    /// No partial packet: the buffer is empty.
    Clear,
    /// The same partial packet as at the last check, still within its deadline.
    Holding,
    /// A new partial packet (or one whose deadline restarted): it must be complete by this
    /// instant, which the caller reports to the keep-alive sweep.
    Armed(Instant),
    /// The partial packet missed its deadline: the connection must close.
    Expired,
    /// The partial packet of an anonymous client would take what anonymous clients hold past
    /// their share of the budget ([`HeldClass::Anonymous`]): the connection must close. What
    /// it held is no longer counted.
    OverShare,
}

/// The partial packet at the front of a connection's read buffer (boxed in `Io`, only while
/// one is held).
#[derive(Debug)]
pub(super) struct PartialPacket {
    /// Length of the read buffer when this packet's deadline was set.
    held_at_start: usize,
    /// Bytes read since then. If the buffer now holds exactly `held_at_start + read_since`,
    /// nothing was taken out of it, so its front is still the same packet; anything less
    /// means a packet was consumed and what is left is a new one.
    pub(super) read_since: usize,
    /// Bytes this packet has added to [`HELD`] (or [`HELD_BEFORE_CONNECT`]).
    counted: usize,
    /// Where they count.
    class: HeldClass,
    /// The anonymous share when it was counted (for [`HeldClass::Anonymous`]).
    share: u64,
    /// When it must be complete.
    deadline: Instant,
}

impl PartialPacket {
    /// Looks at `rbuf` after its complete packets were handled. `slot` is the connection's
    /// state (created here, dropped when the buffer is empty). With `reading = false` (the
    /// broker does not read from the connection for a reason of its own: the store is behind
    /// with the connection's acks) the deadline restarts instead of running: the client cannot
    /// finish a packet the broker does not read. A client that does not read its own output,
    /// so that the broker stops reading from it, is not excused: that would let it hold a
    /// partial packet forever. `class` says where its bytes count; `share` is the anonymous
    /// clients' share of the budget in bytes (for [`HeldClass::Anonymous`]).
    pub(super) fn check(
        slot: &mut Option<Box<PartialPacket>>,
        rbuf: &BytesMut,
        now: Instant,
        reading: bool,
        (class, share): (HeldClass, u64),
        config: &MqttConfig,
    ) -> PartialCheck {
        let held = rbuf.len();
        if held == 0 || slot.as_ref().is_some_and(|p| p.class != class) {
            *slot = None; // Drop gives its bytes back
        }
        if held == 0 {
            return PartialCheck::Clear;
        }
        if let Some(p) = slot.as_deref_mut() {
            if !p.recount(held) {
                *slot = None;
                return PartialCheck::OverShare;
            }
            if reading && held == p.held_at_start + p.read_since {
                return if now >= p.deadline {
                    PartialCheck::Expired
                } else {
                    PartialCheck::Holding
                };
            }
        }
        // The size the fixed header announces, once it is in; before that (at most 4 bytes)
        // what is there.
        let len = match codec::decode_fixed_header(rbuf, usize::MAX) {
            Ok(Some(header)) => header.header_len + header.remaining_length,
            _ => held,
        };
        let deadline = now + packet_time_limit(config, len);
        let p = slot.get_or_insert_with(|| {
            Box::new(PartialPacket {
                held_at_start: 0,
                read_since: 0,
                counted: 0,
                class,
                share,
                deadline,
            })
        });
        if !p.recount(held) {
            *slot = None;
            return PartialCheck::OverShare;
        }
        p.held_at_start = held;
        p.read_since = 0;
        p.deadline = deadline;
        PartialCheck::Armed(deadline)
    }

    /// When the partial packet must be complete.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Brings [`HELD`] (and the anonymous share) in line with the `held` bytes of this
    /// packet; false when they would take anonymous clients past their share.
    fn recount(&mut self, held: usize) -> bool {
        count(self.class, &mut self.counted, held, self.share)
    }
}

impl Drop for PartialPacket {
    fn drop(&mut self) {
        count(self.class, &mut self.counted, 0, self.share);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(timeout: u32, rate: u32) -> MqttConfig {
        MqttConfig {
            packet_timeout: timeout,
            min_packet_rate: rate,
            ..MqttConfig::default()
        }
    }

    #[test]
    fn time_limit_is_the_timeout_plus_size_over_rate() {
        let c = config(30, 4096);
        assert_eq!(packet_time_limit(&c, 0), Duration::from_secs(30));
        assert_eq!(
            packet_time_limit(&c, 1 << 20),
            Duration::from_secs(30 + 256)
        );
        assert_eq!(
            packet_time_limit(&config(1, 1), 268_435_460),
            Duration::from_secs(1 + 268_435_460)
        );
    }

    const CONNECTED: (HeldClass, u64) = (HeldClass::Connected, 0);

    /// Issue 35, twenty-fifth adversarial pass, K3: eight sockets from one address holding
    /// half-sent CONNECTs filled the whole share of the CONNECTs not verified yet. Now one
    /// address holds at most its part of it in CONNECTs past the allowance (an eighth, or one
    /// `max_connect_size`): its second large CONNECT is refused while another address's is
    /// held, ordinary ones pass, and what a holder gives back frees its address's part.
    #[test]
    fn one_address_holds_at_most_its_part_of_the_connects_not_verified() {
        // A share too large for the rest of this binary to fill: only the part binds.
        let share = u64::MAX / 4;
        let max_connect = 100_000;
        let one = IpAddr::from([192, 0, 2, 31]);
        let other = IpAddr::from([192, 0, 2, 32]);
        let part = (share / SOURCE_PART).max(max_connect);
        let tight = |source| before_connect(source, 8 * max_connect, max_connect as u32);
        assert_eq!(
            before_connect(one, share, 1).0,
            HeldClass::BeforeConnect {
                source: one,
                source_share: part
            }
        );
        let (class, pool) = tight(one);
        let (mut first, mut second, mut small) = (0, 0, 0);
        assert!(
            count(class, &mut first, 90_000, pool),
            "the first large CONNECT"
        );
        assert!(
            !count(class, &mut second, 20_000, pool),
            "a second past the part"
        );
        assert_eq!(second, 0, "nothing counted for the refused one");
        assert!(
            count(class, &mut small, UNBOUNDED_HOLDING, pool),
            "an ordinary one"
        );
        let (other_class, _) = tight(other);
        let mut elsewhere = 0;
        assert!(
            count(other_class, &mut elsewhere, 90_000, pool),
            "another address"
        );
        assert!(count(class, &mut first, 0, pool));
        assert!(
            count(class, &mut second, 20_000, pool),
            "room once the first left"
        );
        for (class, held) in [
            (class, &mut second),
            (class, &mut small),
            (other_class, &mut elsewhere),
        ] {
            assert!(count(class, held, 0, pool));
        }
        assert!(
            !LARGE_BY_SOURCE.lock().contains_key(&one),
            "no entry kept at 0"
        );
    }

    fn counted(slot: Option<&PartialPacket>) -> usize {
        slot.map_or(0, |p| p.counted)
    }

    /// What goes into [`HELD`] is checked per packet (`counted`): other tests in this binary
    /// may hold partial packets of their own at the same time.
    #[test]
    fn a_partial_packet_is_armed_once_counted_and_expires() {
        let c = config(10, 1_000);
        let start = Instant::now();
        let mut slot = None;
        // A PUBLISH announcing 2,000 bytes of remaining length, 100 of them in.
        let mut rbuf = BytesMut::from(&[0x30, 0xD0, 0x0F][..]);
        rbuf.extend_from_slice(&[0; 97]);
        let deadline = match PartialPacket::check(&mut slot, &rbuf, start, true, CONNECTED, &c) {
            PartialCheck::Armed(d) => d,
            other => panic!("expected Armed, got {other:?}"),
        };
        // 10 s + 2,003 bytes at 1,000 B/s.
        assert_eq!(deadline - start, Duration::from_millis(12_003));
        assert_eq!(counted(slot.as_deref()), 100);

        // More of the same packet arrives: same deadline, more bytes counted.
        rbuf.extend_from_slice(&[0; 400]);
        slot.as_deref_mut().expect("armed").read_since += 400;
        let later = start + Duration::from_secs(12);
        assert_eq!(
            PartialPacket::check(&mut slot, &rbuf, later, true, CONNECTED, &c),
            PartialCheck::Holding
        );
        assert_eq!(counted(slot.as_deref()), 500);
        assert_eq!(
            PartialPacket::check(&mut slot, &rbuf, deadline, true, CONNECTED, &c),
            PartialCheck::Expired
        );

        // While the connection does not read, the deadline restarts.
        assert!(matches!(
            PartialPacket::check(&mut slot, &rbuf, deadline, false, CONNECTED, &c),
            PartialCheck::Armed(d) if d > deadline
        ));

        // A packet was taken out and another begun: a new deadline.
        let _ = rbuf.split_to(10);
        let now = deadline + Duration::from_secs(1);
        assert!(matches!(
            PartialPacket::check(&mut slot, &rbuf, now, true, CONNECTED, &c),
            PartialCheck::Armed(d) if d > now
        ));
        assert_eq!(counted(slot.as_deref()), 490);

        rbuf.clear();
        assert_eq!(
            PartialPacket::check(&mut slot, &rbuf, now, true, CONNECTED, &c),
            PartialCheck::Clear
        );
        assert!(slot.is_none(), "dropped, giving its bytes back");
    }
}
