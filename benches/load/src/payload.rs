//! The stamp every generated message carries, so loss and latency are measured from the
//! messages themselves rather than inferred from counters.
//!
//! Layout (little endian), then zero padding up to the payload size:
//! `run: u32 | publisher: u32 | seq: u64 | sent_ns: u64`.
//!
//! A fixed payload from a file (`--payload-file`, e.g. a JSON document a `[[schema]]` checks)
//! carries the same 24 bytes as 48 lowercase hex digits in place of its first run of 48 ASCII
//! `0`s ([`hex_slot`]), so the payload stays valid text and is still measured.

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

/// Characters taken by the hex form of the stamp.
pub const STAMP_HEX_LEN: usize = 2 * STAMP_LEN;

/// Where the hex stamp goes in a payload template: its first run of [`STAMP_HEX_LEN`] ASCII
/// `0`s, `None` when it has none.
pub fn hex_slot(template: &[u8]) -> Option<usize> {
    template
        .windows(STAMP_HEX_LEN)
        .position(|w| w.iter().all(|&b| b == b'0'))
}

impl Stamp {
    /// Writes the stamp as [`STAMP_HEX_LEN`] lowercase hex digits over the start of `buf`.
    #[inline]
    pub fn write_hex(&self, buf: &mut [u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut raw = [0u8; STAMP_LEN];
        self.write(&mut raw);
        for (i, b) in raw.iter().enumerate() {
            buf[2 * i] = DIGITS[usize::from(b >> 4)];
            buf[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
        }
    }

    /// Reads a stamp written by [`Stamp::write_hex`] at `at`; `None` when it is not there.
    #[inline]
    pub fn read_hex(payload: &[u8], at: usize) -> Option<Stamp> {
        let hex = payload.get(at..at + STAMP_HEX_LEN)?;
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut raw = [0u8; STAMP_LEN];
        for (i, pair) in hex.chunks_exact(2).enumerate() {
            raw[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
        }
        Stamp::read(&raw)
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

    #[test]
    fn hex_round_trip_in_a_template() {
        let s = Stamp {
            run: 0xdead_beef,
            publisher: 1,
            seq: 42,
            sent_ns: u64::MAX,
        };
        let template = format!(r#"{{"id":"{}","qty":1}}"#, "0".repeat(STAMP_HEX_LEN));
        let at = hex_slot(template.as_bytes()).expect("a slot");
        assert_eq!(at, 7);
        let mut buf = template.into_bytes();
        s.write_hex(&mut buf[at..]);
        assert!(std::str::from_utf8(&buf).is_ok());
        assert_eq!(Stamp::read_hex(&buf, at), Some(s));
        assert_eq!(Stamp::read_hex(b"{}", 0), None);
        assert_eq!(hex_slot(b"{\"id\":\"000\"}"), None);
    }
}
