//! A cursor over one packet's body that hands out its fields as `Bytes` (slices of the body,
//! or copies of their own: [`Reader::owning`]) and turns every short read into
//! `DecodeError::Malformed` (never a panic).

use bytes::{Buf, Bytes};
use bytestring::ByteString;

use super::varint::decode_varint;
use super::DecodeError;

const TRUNCATED: DecodeError = DecodeError::Malformed("field runs past the end of the packet");

/// Owns the not-yet-read part of a packet body. Reading advances it.
pub(super) struct Reader {
    buf: Bytes,
    /// Whether the fields handed out are copies ([`Reader::owning`]) or slices of `buf`.
    copies: bool,
}

impl Reader {
    /// Wraps a packet body (the bytes after the fixed header) whose fields are handed out as
    /// slices of it: for what nothing is kept of (acknowledgements, pings), or a body that is
    /// a copy of its own already.
    #[inline]
    pub(super) fn new(buf: Bytes) -> Self {
        Reader { buf, copies: false }
    }

    /// Wraps a packet body sliced off the read buffer whose every field is handed out as a
    /// copy of its own: what a caller keeps of the packet (a filter, a will, a payload) then
    /// holds its own bytes, not the packet and not the read buffer it came in (issue 35,
    /// adversarial passes 9-11: a 1-byte retained message, a kept filter or a delayed will
    /// pinned the megabytes around it while the bounds counted its few bytes).
    #[inline]
    pub(super) fn owning(buf: Bytes) -> Self {
        Reader { buf, copies: true }
    }

    /// Whether fields are handed out as copies ([`Reader::owning`]).
    #[inline]
    pub(super) fn copies(&self) -> bool {
        self.copies
    }

    /// True when everything has been read.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// One byte.
    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        match self.buf.first() {
            Some(&b) => {
                self.buf.advance(1);
                Ok(b)
            }
            None => Err(TRUNCATED),
        }
    }

    /// A big-endian Two Byte Integer.
    #[inline]
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        match self.buf.get(..2) {
            Some(&[a, b]) => {
                self.buf.advance(2);
                Ok(u16::from_be_bytes([a, b]))
            }
            _ => Err(TRUNCATED),
        }
    }

    /// A big-endian Four Byte Integer.
    #[inline]
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        match self.buf.get(..4) {
            Some(&[a, b, c, d]) => {
                self.buf.advance(4);
                Ok(u32::from_be_bytes([a, b, c, d]))
            }
            _ => Err(TRUNCATED),
        }
    }

    /// A Variable Byte Integer that must end inside the packet.
    #[inline]
    pub(super) fn varint(&mut self) -> Result<usize, DecodeError> {
        match decode_varint(&self.buf)? {
            Some((value, used)) => {
                self.buf.advance(used);
                Ok(value)
            }
            None => Err(TRUNCATED),
        }
    }

    /// The next `n` bytes: a copy when [`Reader::owning`], else a slice of the body.
    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        let field = self.take_slice(n)?;
        Ok(if self.copies {
            Bytes::copy_from_slice(&field)
        } else {
            field
        })
    }

    /// The next `n` bytes as a slice of the body whatever the mode: for a field the caller
    /// looks at and then copies itself (the PUBLISH topic, `codec::owned`).
    #[inline]
    pub(super) fn take_slice(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.buf.len() {
            return Err(TRUNCATED);
        }
        Ok(self.buf.split_to(n))
    }

    /// Binary Data: a two-byte length followed by that many bytes.
    #[inline]
    pub(super) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    /// A UTF-8 Encoded String (MQTT-1.5.4-1, -2): well-formed UTF-8 (which already excludes
    /// surrogates) and no U+0000.
    #[inline]
    pub(super) fn string(&mut self) -> Result<ByteString, DecodeError> {
        let raw = self.binary()?;
        utf8(raw)
    }

    /// A UTF-8 String Pair (MQTT-1.5.7-1), as carried by the User Property.
    #[inline]
    pub(super) fn pair(&mut self) -> Result<(ByteString, ByteString), DecodeError> {
        let key = self.string()?;
        let value = self.string()?;
        Ok((key, value))
    }

    /// A v5 property section: its Variable Byte Integer length, then that many bytes, returned
    /// as a reader of their own so a bad length cannot spill into the payload.
    #[inline]
    pub(super) fn section(&mut self) -> Result<Reader, DecodeError> {
        let n = self.varint()?;
        if n > self.buf.len() {
            return Err(DecodeError::Malformed(
                "property length runs past the end of the packet",
            ));
        }
        Ok(Reader {
            buf: self.buf.split_to(n),
            copies: self.copies,
        })
    }

    /// Consumes a zero property length if that is what comes next: the common case, which
    /// then skips building a section reader.
    #[inline]
    pub(super) fn skip_empty_section(&mut self) -> bool {
        if self.buf.first() == Some(&0) {
            self.buf.advance(1);
            true
        } else {
            false
        }
    }

    /// Everything not read yet (a PUBLISH payload, a list of reason codes): a copy when
    /// [`Reader::owning`].
    #[inline]
    pub(super) fn rest(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.buf);
        if self.copies && !rest.is_empty() {
            Bytes::copy_from_slice(&rest)
        } else {
            rest
        }
    }

    /// Fails if bytes are left over: the remaining length claimed more than the content.
    #[inline]
    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed(
                "remaining length larger than the packet's content",
            ))
        }
    }
}

/// Validates `raw` as an MQTT UTF-8 Encoded String without copying it.
#[inline]
pub(super) fn utf8(raw: Bytes) -> Result<ByteString, DecodeError> {
    if raw.contains(&0) {
        return Err(DecodeError::Malformed("U+0000 in a UTF-8 string"));
    }
    ByteString::try_from(raw).map_err(|_| DecodeError::Malformed("invalid UTF-8 in a string"))
}
