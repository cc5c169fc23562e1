//! The stamp every generated message carries, so loss and latency are measured from the
//! messages themselves rather than inferred from counters.
//!
//! Layout (little endian), then zero padding up to the payload size:
//! `run: u32 | publisher: u32 | seq: u64 | sent_ns: u64`.

/// Bytes taken by the stamp; payloads shorter than this cannot be measured.
pub const STAMP_LEN: usize = 24;

/// Who sent a message, which one it was, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Random per run: messages left over from another run (retained, queued) are told apart.
    pub run: u32,
    /// Index of the publisher within the run.
    pub publisher: u32,
    /// Per-publisher sequence number, from 0.
    pub seq: u64,
    /// Nanoseconds since the run's epoch when the message was queued for sending.
    pub sent_ns: u64,
}

impl Stamp {
    /// Writes the stamp over the start of `buf` (which must hold `STAMP_LEN` bytes).
    #[inline]
    pub fn write(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&self.run.to_le_bytes());
        buf[4..8].copy_from_slice(&self.publisher.to_le_bytes());
        buf[8..16].copy_from_slice(&self.seq.to_le_bytes());
        buf[16..24].copy_from_slice(&self.sent_ns.to_le_bytes());
    }

    /// Reads a stamp; `None` for payloads too short to hold one (not ours).
    #[inline]
    pub fn read(payload: &[u8]) -> Option<Stamp> {
        let b = payload.get(..STAMP_LEN)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Some(Stamp {
            run: u32_at(0),
            publisher: u32_at(4),
            seq: u64_at(8),
            sent_ns: u64_at(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = Stamp {
            run: 7,
            publisher: 3,
            seq: 1 << 40,
            sent_ns: 123_456_789,
        };
        let mut buf = [0u8; 64];
        s.write(&mut buf);
        assert_eq!(Stamp::read(&buf), Some(s));
        assert_eq!(Stamp::read(&buf[..10]), None);
    }
}
