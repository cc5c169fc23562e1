//! Order across connections by arrival: a read the kernel reported before another is handled
//! (up to its first PUBLISH) before the other's PUBLISH is routed.
//!
//! Why: the runtime wakes every connection one readiness event covers in the order the
//! kernel reported them, but then runs them in another order (the last one woken first, from
//! its LIFO slot; the others from the queue or stolen by another worker). A SUBSCRIBE that
//! reached the broker before a PUBLISH on another connection would then be handled after it
//! and miss the message: the subscribe-then-trigger race that request/response flows and
//! interop suites trip over (7 to 14 rounds in 50 before this).
//!
//! How: each connection reads through an [`ArrivalWaker`]. When the reactor wakes it, i.e.
//! in the order the kernel reported readiness, it draws a ticket from [`ArrivalOrder`] and
//! marks it outstanding. The connection takes the ticket with the read it woke for and
//! settles it once everything before the read's first PUBLISH is handled (a SUBSCRIBE is in
//! the trie by then). A connection about to route that PUBLISH first waits until no ticket
//! older than its own is outstanding ([`ArrivalOrder::wait_for_earlier`]).
//!
//! Cheap by construction: a wake costs one shared counter increment and one store, a read one
//! swap and one compare-exchange; the scan and the wait happen only for a connection that
//! was quiet before its PUBLISH (see the client's `QUIET`), never on a busy publisher's path.
//! Bounded: tickets live in a ring of [`RING`] slots (an outstanding ticket [`RING`] wakes
//! old is forgotten, not waited for) and a wait ends after [`MAX_WAIT`] whatever is left.
//!
//! Must not: wait without bound (5 ms at most; ring of 1,024 tickets) or cost a busy publisher a
//! scan.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::sync::Notify;

/// Outstanding tickets remembered: the wakes that can be in flight at once between two reads
/// being compared. A connection whose ticket is older than this many wakes is not waited
/// for; at 1,024 that is far more than the reads one worker turn handles.
const RING: usize = 1024;

/// The longest a PUBLISH waits for earlier arrivals. A connection that was woken but is not
/// reading (its writes are backed up) settles its ticket when it finds it cannot read, so the
/// bound is for the unforeseen, not the usual path.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// The tickets drawn by reactor wake-ups, in the order the kernel reported readiness, and
/// which of them are still outstanding.
#[derive(Debug)]
pub struct ArrivalOrder {
    /// The next ticket; 0 is never drawn (it means "none").
    next: AtomicU64,
    /// `ticket % RING` holds `ticket` while it is outstanding, anything else once settled.
    outstanding: Box<[AtomicU64]>,
    /// No ticket below this one is outstanding: where [`ArrivalOrder::has_earlier`] starts,
    /// so each settled ticket is passed over once, however many reads ask, rather than up to
    /// [`RING`] slots read by each (under callgrind's slow clock, fan-in publishers were quiet
    /// before most PUBLISHes and the scan was 1.4% of the broker's instructions).
    floor: AtomicU64,
    /// Publishers waiting in [`ArrivalOrder::wait_for_earlier`]: settles notify only then.
    waiting: AtomicUsize,
    settled: Notify,
}

impl Default for ArrivalOrder {
    fn default() -> Self {
        ArrivalOrder {
            next: AtomicU64::new(1),
            outstanding: (0..RING).map(|_| AtomicU64::new(0)).collect(),
            floor: AtomicU64::new(1),
            waiting: AtomicUsize::new(0),
            settled: Notify::new(),
        }
    }
}

impl ArrivalOrder {
    fn slot(&self, ticket: u64) -> &AtomicU64 {
        // The remainder is below RING, so it fits a usize.
        &self.outstanding[(ticket % RING as u64) as usize]
    }

    /// Draws the next ticket and marks it outstanding.
    fn draw(&self) -> u64 {
        let ticket = self.next.fetch_add(1, Ordering::AcqRel);
        self.slot(ticket).store(ticket, Ordering::Release);
        ticket
    }

    /// Marks `ticket` handled (0 is ignored), waking the publishers waiting for it.
    pub fn settle(&self, ticket: u64) {
        if ticket == 0 {
            return;
        }
        let slot = self.slot(ticket);
        let settled = slot
            .compare_exchange(ticket, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if settled && self.waiting.load(Ordering::Acquire) > 0 {
            self.settled.notify_waiters();
        }
    }

    /// True while a ticket older than `ticket` (and at most [`RING`] wakes older) is
    /// outstanding.
    #[must_use]
    ///
    /// From the floor up: the first outstanding ticket found is where the floor stays, and
    /// a scan that finds none raises it to `ticket`. A ticket drawn but not yet marked when a
    /// scan passes it (its waker between the draw and the store) is not waited for, as a
    /// concurrent scan would not have seen it either.
    pub fn has_earlier(&self, ticket: u64) -> bool {
        let oldest = ticket.saturating_sub(RING as u64 - 1).max(1);
        let mut earlier = self.floor.load(Ordering::Acquire).max(oldest);
        while earlier < ticket {
            if self.slot(earlier).load(Ordering::Acquire) == earlier {
                self.floor.fetch_max(earlier, Ordering::AcqRel);
                return true;
            }
            earlier += 1;
        }
        self.floor.fetch_max(ticket, Ordering::AcqRel);
        false
    }

    /// Waits until no ticket older than `ticket` is outstanding, or [`MAX_WAIT`] has passed.
    pub async fn wait_for_earlier(&self, ticket: u64) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _ = tokio::time::timeout(MAX_WAIT, async {
            loop {
                // Registered before the check, so a settle between the check and the await
                // wakes it.
                let mut settled = std::pin::pin!(self.settled.notified());
                settled.as_mut().enable();
                if !self.has_earlier(ticket) {
                    return;
                }
                settled.await;
            }
        })
        .await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One connection's read waker: forwards the reactor's wake-up to the connection's task and
/// draws the ticket that places the read in arrival order.
#[derive(Debug)]
pub(crate) struct ArrivalWaker {
    order: Arc<ArrivalOrder>,
    task: AtomicWaker,
    /// The ticket of the latest wake not yet taken by a read; 0 when none.
    ticket: AtomicU64,
    /// The ticket of the read being handled, or the one its PUBLISH waits behind; 0 when
    /// none. Kept here rather than in the connection, whose state must stay within its
    /// allocation class.
    held: AtomicU64,
}

impl ArrivalWaker {
    /// A waker drawing tickets from `order`.
    #[must_use]
    pub(crate) fn new(order: Arc<ArrivalOrder>) -> Arc<ArrivalWaker> {
        Arc::new(ArrivalWaker {
            order,
            task: AtomicWaker::new(),
            ticket: AtomicU64::new(0),
            held: AtomicU64::new(0),
        })
    }

    /// The order the tickets come from.
    #[must_use]
    pub(crate) fn order(&self) -> &ArrivalOrder {
        &self.order
    }

    /// Takes the ticket of the wake a read is about to consume (0 when the read was not woken
    /// by the reactor: a busy connection reading again). Call before polling the read, so a
    /// wake racing with the poll keeps its ticket for the next read.
    pub(crate) fn take_ticket(&self) -> u64 {
        self.ticket.swap(0, Ordering::AcqRel)
    }

    /// Keeps `ticket` with the connection: the read's until it is settled, then the position
    /// its PUBLISH waits behind.
    pub(crate) fn hold(&self, ticket: u64) {
        self.held.store(ticket, Ordering::Relaxed);
    }

    /// Takes what [`ArrivalWaker::hold`] kept (0 when nothing).
    pub(crate) fn take_held(&self) -> u64 {
        self.held.swap(0, Ordering::Relaxed)
    }

    /// Polls `read` with a context whose waker is this one, forwarding to `cx`'s task.
    pub(crate) fn poll_with<T>(
        self: &Arc<Self>,
        cx: &Context<'_>,
        read: impl FnOnce(&mut Context<'_>) -> T,
    ) -> T {
        self.task.register(cx.waker());
        let waker = Waker::from(Arc::clone(self));
        read(&mut Context::from_waker(&waker))
    }
}

impl Wake for ArrivalWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let ticket = self.order.draw();
        // A wake the connection never read for (it was woken twice) is superseded: settle it
        // so nobody waits for it.
        self.order
            .settle(self.ticket.swap(ticket, Ordering::AcqRel));
        self.task.wake();
    }
}

impl Drop for ArrivalWaker {
    fn drop(&mut self) {
        self.order.settle(*self.ticket.get_mut());
        self.order.settle(*self.held.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;

    fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        f.poll(&mut cx)
    }

    /// An arrival order with two connections' wakers on it, the first made first: the setup
    /// of every test here.
    fn two_connections() -> (Arc<ArrivalOrder>, Arc<ArrivalWaker>, Arc<ArrivalWaker>) {
        let order = Arc::new(ArrivalOrder::default());
        let first = ArrivalWaker::new(Arc::clone(&order));
        let second = ArrivalWaker::new(Arc::clone(&order));
        (order, first, second)
    }

    /// What the reactor does when `connection`'s socket becomes readable.
    fn wake(connection: &Arc<ArrivalWaker>) {
        Waker::from(Arc::clone(connection)).wake_by_ref();
    }

    #[test]
    fn tickets_follow_the_order_of_wakes_and_only_earlier_ones_are_waited_for() {
        let (order, first, second) = two_connections();
        wake(&first);
        wake(&second);
        let (a, b) = (first.take_ticket(), second.take_ticket());
        assert!(a < b);
        assert!(order.has_earlier(b), "the first read is not handled yet");
        assert!(!order.has_earlier(a), "nothing came before the first");
        order.settle(a);
        assert!(!order.has_earlier(b));
    }

    /// The floor changes how far a scan reads, not its answer: against a scan of the whole
    /// window, over wakes and settles in a shuffled order.
    #[test]
    fn the_floor_gives_the_answers_of_a_whole_scan() {
        let order = ArrivalOrder::default();
        let whole = |ticket: u64| {
            let oldest = ticket.saturating_sub(RING as u64 - 1).max(1);
            (oldest..ticket).any(|t| order.slot(t).load(Ordering::Acquire) == t)
        };
        let mut drawn = Vec::new();
        let mut seed = 0x9E37_79B9_u64;
        for _ in 0..5_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 3 {
                0 | 1 => drawn.push(order.draw()),
                _ if !drawn.is_empty() => {
                    let ticket = drawn.swap_remove((seed as usize / 3) % drawn.len());
                    order.settle(ticket);
                }
                _ => {}
            }
            if !drawn.is_empty() {
                let ticket = drawn[(seed as usize / 7) % drawn.len()];
                assert_eq!(order.has_earlier(ticket), whole(ticket), "ticket {ticket}");
            }
        }
    }

    #[test]
    fn a_second_wake_before_the_read_supersedes_the_first() {
        let (order, twice, later) = two_connections();
        let waker = Waker::from(Arc::clone(&twice));
        waker.wake_by_ref();
        waker.wake_by_ref();
        wake(&later);
        let last = later.take_ticket();
        order.settle(twice.take_ticket());
        assert!(!order.has_earlier(last), "the superseded ticket is settled");
    }

    #[test]
    fn a_dropped_connection_settles_its_ticket() {
        let (order, gone, later) = two_connections();
        wake(&gone);
        wake(&later);
        drop(gone);
        assert!(!order.has_earlier(later.take_ticket()));
    }

    #[tokio::test]
    async fn a_waiting_publisher_goes_once_the_earlier_read_settles() {
        let (order, subscriber, publisher) = two_connections();
        wake(&subscriber);
        wake(&publisher);
        let mine = publisher.take_ticket();
        let mut waiting = std::pin::pin!(order.wait_for_earlier(mine));
        assert!(poll_once(waiting.as_mut()).is_pending());
        order.settle(subscriber.take_ticket());
        assert!(poll_once(waiting.as_mut()).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_bounded() {
        let (order, stuck, publisher) = two_connections();
        wake(&stuck);
        wake(&publisher);
        let mine = publisher.take_ticket();
        order.wait_for_earlier(mine).await;
        assert!(
            order.has_earlier(mine),
            "it went although the earlier read never settled"
        );
    }
}
