//! A session's queue: what admission decides for a new delivery (full by count, by bytes or
//! by the anonymous share; drained to half), and pushing, popping and taking back deliveries
//! with the byte counts that go with them. Split from `session` to keep each file to one job.
//!
//! Must not: do I/O, submit ops or take a lock (the caller holds the session's).

use super::*;

/// What a PUBLISH adds at most to a message's own bytes (`Message::size`, whose properties
/// count their identifiers and lengths already): fixed header 1 + remaining length 4, topic
/// length 2, packet id 2, property length 4, a Subscription Identifier 5 and a Topic Alias 3:
/// 21, rounded up (issue 35, sixteenth adversarial pass, C4: with 16, a message over 2 MiB
/// with 16 KiB of properties and a 4-byte subscription identifier was still one byte over).
const PUBLISH_OVERHEAD: usize = 24;

/// Whether a message of `size` bytes (`Message::size`) fits a client whose Maximum Packet
/// Size is `client_max` (0: none announced), with [`PUBLISH_OVERHEAD`]. A member that might
/// just take it is passed over only when another would (MQTT-3.1.2-24; issue 35, fourteenth
/// pass, A2: a member with a Maximum Packet Size of 100 dropped every job it was given, after
/// its PUBACK; fifteenth, B1: with 4 bytes of cushion, one 4-12 bytes over still did).
pub(in crate::broker) fn fits_client(size: usize, client_max: u32) -> bool {
    client_max == 0 || size.saturating_add(PUBLISH_OVERHEAD) <= client_max as usize
}

impl SessionState {
    pub(super) fn is_full(&self, limits: &QueueLimits, incoming: usize) -> bool {
        self.queue.len() >= limits.max_messages
            || (limits.max_bytes > 0 && self.queued_bytes + incoming > limits.max_bytes)
    }

    /// Its driver took deliveries (or a connection attached): the stall clock restarts and a
    /// stalled session is stalled no more.
    pub(in crate::broker) fn made_progress(&mut self, now_ms: u64) {
        self.progress_at_ms = now_ms;
        self.end_stall();
    }

    /// No longer counted as stalled (progress, detach or end).
    pub(in crate::broker) fn end_stall(&mut self) {
        if std::mem::take(&mut self.stalled) {
            super::super::flow::count_stalled(false);
        }
    }

    /// A connected session that has had work but made no progress for `stalled_after_ms`.
    pub(in crate::broker) fn is_stalled(&self, now_ms: u64, limits: &QueueLimits) -> bool {
        self.connection.is_some()
            && now_ms.saturating_sub(self.progress_at_ms) >= limits.stalled_after_ms
    }

    /// Whether a publisher paused for this session may go on: it drained to half its bounds,
    /// stalled, went offline or ended. Only looks: the draining side clears `pressured` (see
    /// [`SessionState::drained_for_publishers`]), so every paused publisher gets the wake-up.
    pub(in crate::broker) fn lets_publishers_go(&self, now_ms: u64, limits: &QueueLimits) -> bool {
        self.ended
            || self.connection.is_none()
            || self.is_stalled(now_ms, limits)
            || self.drained_to_half(limits)
    }

    pub(super) fn drained_to_half(&self, limits: &QueueLimits) -> bool {
        self.queue.len() <= limits.max_messages / 2
            && (limits.max_bytes == 0 || self.queued_bytes <= limits.max_bytes / 2)
    }

    /// After the driver took deliveries: true (once per episode) when publishers were paused
    /// for this session and it has now drained to half its bounds; they are to be woken.
    pub(in crate::broker) fn drained_for_publishers(&mut self, limits: &QueueLimits) -> bool {
        if self.pressured && self.drained_to_half(limits) {
            self.pressured = false;
            return true;
        }
        false
    }

    /// Appends a delivery restored from the durable store (already admitted once).
    pub(crate) fn restore_queued(&mut self, delivery: Delivery) {
        self.count_queued(delivery.message.size());
        self.queue.push_back(delivery);
    }

    pub(super) fn push(&mut self, delivery: Delivery, now_ms: u64) {
        if self.queue.is_empty() && self.inflight.is_empty() {
            // Work for an idle session: the stall clock starts now, not at its last delivery.
            self.progress_at_ms = now_ms;
        }
        self.count_queued(delivery.message.size());
        self.queue.push_back(delivery);
    }

    /// `bytes` of payload joined the queue; an anonymous session's count in the anonymous
    /// share with them (`flow::ANONYMOUS_SHARE`).
    pub(super) fn count_queued(&mut self, bytes: usize) {
        self.queued_bytes += bytes;
        if self.is_anonymous() {
            super::super::flow::anonymous_queued_counted(bytes, true);
        }
    }

    /// `bytes` of payload left the queue.
    pub(super) fn uncount_queued(&mut self, bytes: usize) {
        self.queued_bytes -= bytes;
        if self.is_anonymous() {
            super::super::flow::anonymous_queued_counted(bytes, false);
        }
    }

    /// Whether an anonymous session's queue is full because anonymous sessions hold their
    /// share of the budget ([`QueueLimits::anonymous_share`]) with `incoming` more: queued
    /// and in flight, online or not (issue 35, ninth pass R2: an online anonymous subscriber
    /// that never acknowledged took the whole budget into its window, and kept it offline).
    pub(super) fn over_anonymous_share(&self, limits: &QueueLimits, incoming: usize) -> bool {
        self.is_anonymous()
            && super::super::flow::anonymous_bytes().saturating_add(incoming as u64)
                > limits.anonymous_share
    }

    /// Whether a delivery of `size` bytes at `qos` would be kept, queued or queued over the
    /// bound with back-pressure (the admission of [`super::Session::admit`] without its
    /// effects), rather than dropped by the overflow policy or refused: what a shared group
    /// asks of a member before it picks it (issue 35, thirteenth adversarial pass, F5).
    pub(in crate::broker) fn would_keep(
        &self,
        message: &super::super::Message,
        limits: &QueueLimits,
        now_ms: u64,
    ) -> bool {
        let (size, qos) = (message.size(), message.qos);
        let online = self.connection.is_some();
        let share_size = if message.charged_anonymous() { 0 } else { size };
        if self.ended || self.over_anonymous_share(limits, share_size) {
            return false;
        }
        if !fits_client(size, self.client_max_packet) {
            return false;
        }
        if !online && qos == QoS::AtMostOnce && !limits.queue_qos0_offline {
            return false;
        }
        !self.is_full(limits, size)
            || (online
                && (qos != QoS::AtMostOnce || limits.backpressure_qos0)
                && !self.is_stalled(now_ms, limits))
    }

    /// Bytes (`Message::size`) of the queued deliveries (kept as they come and go: no walk).
    pub(in crate::broker) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Takes the oldest queued delivery.
    pub(crate) fn pop(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.uncount_queued(d.message.size());
        if self.queue.is_empty() {
            self.overflowing = false;
        }
        Some(d)
    }

    /// Removes and returns the deliveries made for shared subscriptions `group` accepts, so
    /// they can go to another member: every queued one, and, when `include_sent_qos1`, the
    /// QoS 1 ones sent but not acknowledged. QoS 2 messages already sent stay (MQTT-4.8.2-4).
    pub(crate) fn take_shared(
        &mut self,
        mut group: impl FnMut(&Delivery) -> bool,
        include_sent_qos1: bool,
    ) -> Vec<Delivery> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        let mut taken_bytes = 0;
        for d in self.queue.drain(..) {
            match &d.shared {
                Some(_) if group(&d) => {
                    taken_bytes += d.message.size();
                    taken.push(d);
                }
                _ => kept.push_back(d),
            }
        }
        self.uncount_queued(taken_bytes);
        self.queue = kept;
        if self.queue.is_empty() {
            self.overflowing = false;
        }
        if include_sent_qos1 {
            let mut sent = Vec::new();
            self.inflight.retain_mut(self.is_anonymous(), |f| {
                let move_it = f.stage == OutboundStage::AwaitPubAck
                    && f.delivery.shared.is_some()
                    && group(&f.delivery);
                if move_it {
                    sent.push(f.delivery.clone());
                }
                !move_it
            });
            // Sent first, then queued: roughly the order they were meant to arrive in.
            sent.append(&mut taken);
            taken = sent;
        }
        taken
    }
}
