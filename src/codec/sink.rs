//! Encoding sinks: every packet body is written by one generic function run twice, first into
//! a `Counter` to learn the remaining length (and catch values that do not fit), then into a
//! `Writer` after a single `reserve`. Size and bytes can therefore never disagree.

use bytes::{BufMut, BytesMut};

use super::properties::write::WriteProperties;
use super::varint::{put_varint, varint_len, MAX_VARINT};
use super::EncodeError;

/// Something a packet body can be written to.
pub(super) trait Sink {
    /// One byte.
    fn u8(&mut self, v: u8);
    /// A big-endian Two Byte Integer.
    fn u16(&mut self, v: u16);
    /// A big-endian Four Byte Integer.
    fn u32(&mut self, v: u32);
    /// A Variable Byte Integer; the caller guarantees `v <= MAX_VARINT`.
    fn varint(&mut self, v: usize);
    /// Bytes with no length prefix (payloads, reason code lists).
    fn raw(&mut self, b: &[u8]);
    /// A property section: its length, then its properties.
    fn properties<P: WriteProperties>(&mut self, p: &P) -> Result<(), EncodeError>;

    /// Binary Data: two-byte length prefix, at most 65,535 bytes.
    #[inline]
    fn binary(&mut self, b: &[u8]) -> Result<(), EncodeError> {
        let n = u16::try_from(b.len()).map_err(|_| EncodeError::StringTooLong)?;
        self.u16(n);
        self.raw(b);
        Ok(())
    }

    /// A UTF-8 Encoded String (same layout as Binary Data).
    #[inline]
    fn string(&mut self, s: &str) -> Result<(), EncodeError> {
        self.binary(s.as_bytes())
    }
}

/// Counts bytes instead of writing them.
pub(super) struct Counter(pub usize);

impl Sink for Counter {
    #[inline]
    fn u8(&mut self, _: u8) {
        self.0 += 1;
    }
    #[inline]
    fn u16(&mut self, _: u16) {
        self.0 += 2;
    }
    #[inline]
    fn u32(&mut self, _: u32) {
        self.0 += 4;
    }
    #[inline]
    fn varint(&mut self, v: usize) {
        self.0 += varint_len(v);
    }
    #[inline]
    fn raw(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
    #[inline]
    fn properties<P: WriteProperties>(&mut self, p: &P) -> Result<(), EncodeError> {
        let n = properties_len(p)?;
        self.0 += varint_len(n) + n;
        Ok(())
    }
}

/// Appends to a buffer that already has room (see the module doc).
pub(super) struct Writer<'a>(pub &'a mut BytesMut);

impl Sink for Writer<'_> {
    #[inline]
    fn u8(&mut self, v: u8) {
        self.0.put_u8(v);
    }
    #[inline]
    fn u16(&mut self, v: u16) {
        self.0.put_u16(v);
    }
    #[inline]
    fn u32(&mut self, v: u32) {
        self.0.put_u32(v);
    }
    #[inline]
    fn varint(&mut self, v: usize) {
        put_varint(self.0, v);
    }
    #[inline]
    fn raw(&mut self, b: &[u8]) {
        self.0.put_slice(b);
    }
    #[inline]
    fn properties<P: WriteProperties>(&mut self, p: &P) -> Result<(), EncodeError> {
        let n = properties_len(p)?;
        put_varint(self.0, n);
        p.write(self)
    }
}

/// The encoded size of a property section's contents (without its length prefix).
#[inline]
pub(super) fn properties_len<P: WriteProperties>(p: &P) -> Result<usize, EncodeError> {
    let mut c = Counter(0);
    p.write(&mut c)?;
    if c.0 > MAX_VARINT {
        return Err(EncodeError::TooLarge(c.0));
    }
    Ok(c.0)
}
