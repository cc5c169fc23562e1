//! A client's publish rate limit (`mqtt.max_publish_rate`, `mqtt.max_publish_bytes_rate`): a
//! token bucket per connection, holding one second's worth of messages and bytes. A PUBLISH
//! that overdraws it is still handled (it was read, and will be acknowledged as usual); the
//! connection then reads nothing until the bucket is back to zero (`pause`), so a flooding
//! client is slowed by TCP back-pressure instead of having its messages dropped, and the
//! broker's time goes to everyone else meanwhile.

use std::time::{Duration, Instant};

/// Tokens of one connection; boxed in the client, present only when a limit is configured.
#[derive(Debug)]
pub(super) struct RateBucket {
    /// Messages per second; 0 = no limit on the count.
    messages_per_s: f64,
    /// Payload and property bytes per second; 0 = no limit on the bytes.
    bytes_per_s: f64,
    messages: f64,
    bytes: f64,
    at: Instant,
}

impl RateBucket {
    /// A full bucket, or `None` when neither limit is set (the client then carries none).
    pub(super) fn new(messages_per_s: u32, bytes_per_s: u64, now: Instant) -> Option<Self> {
        if messages_per_s == 0 && bytes_per_s == 0 {
            return None;
        }
        let (m, b) = (f64::from(messages_per_s), bytes_per_s as f64);
        Some(RateBucket {
            messages_per_s: m,
            bytes_per_s: b,
            messages: m,
            bytes: b,
            at: now,
        })
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        // A second's worth at most: a client quiet for an hour gets a burst of one second.
        self.messages = (self.messages + elapsed * self.messages_per_s).min(self.messages_per_s);
        self.bytes = (self.bytes + elapsed * self.bytes_per_s).min(self.bytes_per_s);
    }

    /// Takes one message of `size` payload bytes. `None`: within the limits; otherwise how
    /// long the connection must stop reading for the bucket to be back to zero.
    pub(super) fn take(&mut self, size: usize, now: Instant) -> Option<Duration> {
        self.refill(now);
        if self.messages_per_s > 0.0 {
            self.messages -= 1.0;
        }
        if self.bytes_per_s > 0.0 {
            self.bytes -= size as f64;
        }
        self.wait()
    }

    /// How long until neither count is below zero; `None` when neither is.
    pub(super) fn wait_at(&mut self, now: Instant) -> Option<Duration> {
        self.refill(now);
        self.wait()
    }

    fn wait(&self) -> Option<Duration> {
        let mut seconds: f64 = 0.0;
        if self.messages < 0.0 {
            seconds = seconds.max(-self.messages / self.messages_per_s);
        }
        if self.bytes < 0.0 {
            seconds = seconds.max(-self.bytes / self.bytes_per_s);
        }
        (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limits_no_bucket() {
        assert!(RateBucket::new(0, 0, Instant::now()).is_none());
    }

    #[test]
    fn a_second_of_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = RateBucket::new(10, 0, t0).expect("bucket");
        for _ in 0..10 {
            assert_eq!(b.take(100, t0), None);
        }
        let wait = b.take(100, t0).expect("the 11th overdraws");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // A tenth of a second later the bucket is back at zero: reading may go on.
        assert_eq!(b.wait_at(t0 + Duration::from_millis(100)), None);
        // Quiet for an hour: still only one second's worth.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..10 {
            assert_eq!(b.take(1, later), None);
        }
        assert!(b.take(1, later).is_some());
    }

    #[test]
    fn bytes_limit_alone() {
        let t0 = Instant::now();
        let mut b = RateBucket::new(0, 1000, t0).expect("bucket");
        assert_eq!(b.take(1000, t0), None);
        let wait = b.take(500, t0).expect("over the bytes");
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
    }
}
