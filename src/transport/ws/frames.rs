//! RFC 6455 §5 framing, as a streaming codec: a client's frames decoded in place as their bytes
//! arrive ([`Inbound`]), and the headers of the server's frames ([`data_header`],
//! [`ControlFrame`]).
//!
//! Why our own: a decoder that holds a frame until it is whole keeps memory per connection
//! that no bound of the connection sees (issue 35, twelfth adversarial pass, U3; see
//! `transport::ws`). This one holds the header of the frame arriving (at most 14 bytes) and
//! the payload of the latest ping (at most 125): the payload of a binary frame is unmasked
//! where it was read, moved over the headers before it, and is the connection's to keep.
//!
//! Must not: allocate; buffer any data payload; accept what RFC 6455 makes a protocol error
//! for a server (unmasked client frames, RSV bits, fragmented or oversized control frames,
//! continuation out of place) or what MQTT forbids (text frames, [MQTT-6.0.0-1]).

/// Opcodes (RFC 6455 §5.2).
const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
pub(super) const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
pub(super) const PONG: u8 = 0xA;

/// A control frame's payload may be at most this long (RFC 6455 §5.5).
pub(super) const MAX_CONTROL_PAYLOAD: usize = 125;
/// The longest frame header: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEADER: usize = 14;

/// Why a client's frames end the connection: each is a protocol error of RFC 6455 or a frame
/// MQTT does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// RFC 6455 §5.1: a client masks every frame it sends.
    #[error("unmasked WebSocket frame from the client")]
    Unmasked,
    /// RFC 6455 §5.2: no extension was negotiated, so the RSV bits must be 0.
    #[error("WebSocket frame with RSV bits set")]
    Reserved,
    /// RFC 6455 §5.2: opcodes 3-7 and 0xB-0xF are reserved.
    #[error("WebSocket frame with reserved opcode {0:#x}")]
    Opcode(u8),
    /// [MQTT-6.0.0-1]: MQTT travels in binary frames only.
    #[error("WebSocket text frame (MQTT needs binary frames)")]
    Text,
    /// RFC 6455 §5.5: control frames are not fragmented.
    #[error("fragmented WebSocket control frame")]
    FragmentedControl,
    /// RFC 6455 §5.5: a control frame's payload is at most 125 bytes.
    #[error("WebSocket control frame above 125 bytes")]
    ControlTooLong,
    /// RFC 6455 §5.4: a continuation frame only follows an unfinished data frame.
    #[error("WebSocket continuation frame without a message to continue")]
    StrayContinuation,
    /// RFC 6455 §5.4: a new data frame while a message is unfinished.
    #[error("WebSocket data frame inside an unfinished message")]
    Interleaved,
    /// RFC 6455 §5.2: the most significant bit of a 64-bit length must be 0.
    #[error("WebSocket frame length with its top bit set")]
    Length,
}

impl FrameError {
    /// The status code of the close frame that answers it (RFC 6455 §7.4.1): 1003 for data
    /// of a type MQTT does not accept, 1002 for a protocol error.
    pub(super) fn close_code(self) -> u16 {
        match self {
            FrameError::Text => 1003,
            _ => 1002,
        }
    }
}

/// What the payload of the frame arriving is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Binary or continuation: MQTT bytes for the connection.
    Data,
    /// Kept in [`Inbound::ping`], answered by a pong with the same payload.
    Ping,
    /// Its status code (first two bytes) kept, the reason dropped.
    Close,
    /// Ignored (RFC 6455 §5.5.3: an unsolicited pong needs no answer).
    Pong,
}

/// The frame whose payload is arriving.
#[derive(Debug, Clone, Copy)]
struct Payload {
    kind: Kind,
    /// Payload bytes still to come.
    left: u64,
    /// Payload bytes seen so far (where the mask stands, and where a control payload goes).
    seen: u64,
    mask: [u8; 4],
}

/// The client side of a WebSocket connection, decoded as it arrives.
#[derive(Debug)]
pub(crate) struct Inbound {
    /// The frame header arriving, and how much of it is in.
    header: [u8; MAX_HEADER],
    header_len: u8,
    /// The frame whose payload is arriving, once its header is in.
    payload: Option<Payload>,
    /// A data message is unfinished: only a continuation (or a control frame) may follow.
    in_message: bool,
    /// The payload of the latest ping (`ping_len` bytes of it).
    ping: [u8; MAX_CONTROL_PAYLOAD],
    ping_len: u8,
    /// The latest ping is complete and no pong has answered it yet.
    pong_wanted: bool,
    /// The client's close frame arrived: nothing after it is read (RFC 6455 §5.5.1).
    closed: bool,
    /// The status code of that close frame (how much of it is in), echoed in the answer.
    close_code: [u8; 2],
    close_code_len: u8,
}

impl Default for Inbound {
    fn default() -> Inbound {
        Inbound {
            header: [0; MAX_HEADER],
            header_len: 0,
            payload: None,
            in_message: false,
            ping: [0; MAX_CONTROL_PAYLOAD],
            ping_len: 0,
            pong_wanted: false,
            closed: false,
            close_code: [0; 2],
            close_code_len: 0,
        }
    }
}

impl Inbound {
    /// Decodes `bytes` just read, in place: the payload bytes of data frames, unmasked, are
    /// moved to the front of `bytes` in order, and their count is returned; headers and
    /// control frames are taken out. Stops at the client's close frame (what follows it is
    /// dropped).
    ///
    /// # Errors
    ///
    /// [`FrameError`] for a frame the connection must be failed for (RFC 6455 §7.1.7); what
    /// `bytes` holds is then undefined.
    pub(crate) fn decode(&mut self, bytes: &mut [u8]) -> Result<usize, FrameError> {
        let mut read = 0;
        let mut kept = 0;
        while read < bytes.len() && !self.closed {
            let Some(payload) = &mut self.payload else {
                self.header[usize::from(self.header_len)] = bytes[read];
                self.header_len += 1;
                read += 1;
                self.header_byte()?;
                continue;
            };
            let n = usize::try_from(payload.left)
                .unwrap_or(usize::MAX)
                .min(bytes.len() - read);
            let offset = (payload.seen % 4) as usize;
            match payload.kind {
                Kind::Data => {
                    unmask_within(bytes, read, kept, n, payload.mask, offset);
                    kept += n;
                }
                Kind::Ping => {
                    // `seen + n` <= 125: the header was checked.
                    let at = payload.seen as usize;
                    let to = &mut self.ping[at..at + n];
                    unmask_into(&bytes[read..read + n], to, payload.mask, offset);
                    self.ping_len = (at + n) as u8;
                }
                Kind::Close => {
                    let at = payload.seen as usize;
                    let code = (at..at + n).take_while(|&i| i < 2);
                    for (i, j) in code.zip(read..) {
                        self.close_code[i] = bytes[j] ^ payload.mask[i % 4];
                        self.close_code_len = (i + 1) as u8;
                    }
                }
                Kind::Pong => {}
            }
            read += n;
            payload.left -= n as u64;
            payload.seen += n as u64;
            if payload.left == 0 {
                self.frame_done();
            }
        }
        Ok(kept)
    }

    /// Follows the header byte just added; starts the frame once its header is complete.
    /// Everything that can be refused is refused as soon as the byte that shows it is in.
    fn header_byte(&mut self) -> Result<(), FrameError> {
        let h = &self.header[..usize::from(self.header_len)];
        if h.len() == 1 {
            let opcode = h[0] & 0x0F;
            if h[0] & 0x70 != 0 {
                return Err(FrameError::Reserved);
            }
            let fin = h[0] & 0x80 != 0;
            return match opcode {
                TEXT => Err(FrameError::Text),
                CONTINUATION if !self.in_message => Err(FrameError::StrayContinuation),
                BINARY if self.in_message => Err(FrameError::Interleaved),
                CLOSE | PING | PONG if !fin => Err(FrameError::FragmentedControl),
                CONTINUATION | BINARY | CLOSE | PING | PONG => Ok(()),
                other => Err(FrameError::Opcode(other)),
            };
        }
        if h.len() == 2 {
            if h[1] & 0x80 == 0 {
                return Err(FrameError::Unmasked);
            }
            if h[0] & 0x08 != 0 && usize::from(h[1] & 0x7F) > MAX_CONTROL_PAYLOAD {
                return Err(FrameError::ControlTooLong);
            }
        }
        let extended = match h[1] & 0x7F {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        if h.len() < 2 + extended + 4 {
            return Ok(());
        }
        let len = match extended {
            0 => u64::from(h[1] & 0x7F),
            2 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            _ => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&h[2..10]);
                u64::from_be_bytes(b)
            }
        };
        if len >> 63 != 0 {
            return Err(FrameError::Length);
        }
        let mut mask = [0u8; 4];
        mask.copy_from_slice(&h[2 + extended..2 + extended + 4]);
        let fin = h[0] & 0x80 != 0;
        let kind = match h[0] & 0x0F {
            PING => {
                // A new ping supersedes one not answered yet (RFC 6455 §5.5.3).
                self.ping_len = 0;
                self.pong_wanted = false;
                Kind::Ping
            }
            CLOSE => Kind::Close,
            PONG => Kind::Pong,
            _ => {
                self.in_message = !fin;
                Kind::Data
            }
        };
        self.header_len = 0;
        self.payload = Some(Payload {
            kind,
            left: len,
            seen: 0,
            mask,
        });
        if len == 0 {
            self.frame_done();
        }
        Ok(())
    }

    /// The frame's payload is all in.
    fn frame_done(&mut self) {
        match self.payload.take().map(|p| p.kind) {
            Some(Kind::Ping) => self.pong_wanted = true,
            Some(Kind::Close) => self.closed = true,
            _ => {}
        }
    }

    /// The client's close frame arrived.
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// The status code of the client's close frame, if it gave one.
    pub(super) fn close_code(&self) -> Option<u16> {
        (self.close_code_len == 2).then(|| u16::from_be_bytes(self.close_code))
    }

    /// The payload of the latest ping, once, if it is complete and not answered yet.
    pub(super) fn take_pong(&mut self) -> Option<&[u8]> {
        if !self.pong_wanted {
            return None;
        }
        self.pong_wanted = false;
        Some(&self.ping[..usize::from(self.ping_len)])
    }
}

/// Unmasks `n` bytes of `bytes` from `from` and writes them at `to` (`to <= from`), in one
/// forward pass: eight bytes at a time, each word read before it is written.
fn unmask_within(bytes: &mut [u8], from: usize, to: usize, n: usize, mask: [u8; 4], offset: usize) {
    let m = rotated(mask, offset);
    let word = u64::from_ne_bytes([m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]]);
    let mut i = 0;
    while i + 8 <= n {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[from + i..from + i + 8]);
        let v = u64::from_ne_bytes(w) ^ word;
        bytes[to + i..to + i + 8].copy_from_slice(&v.to_ne_bytes());
        i += 8;
    }
    while i < n {
        bytes[to + i] = bytes[from + i] ^ m[i % 4];
        i += 1;
    }
}

/// Unmasks `from` into `to` (same length).
fn unmask_into(from: &[u8], to: &mut [u8], mask: [u8; 4], offset: usize) {
    let m = rotated(mask, offset);
    for (i, (t, f)) in to.iter_mut().zip(from).enumerate() {
        *t = f ^ m[i % 4];
    }
}

/// The mask as it applies from payload byte `offset` on.
fn rotated(mask: [u8; 4], offset: usize) -> [u8; 4] {
    let mut m = mask;
    m.rotate_left(offset % 4);
    m
}

/// The header of a server's binary frame with FIN (unmasked, RFC 6455 §5.1) carrying `len`
/// bytes: written to the front of `out`, its length returned.
pub(super) fn data_header(len: usize, out: &mut [u8; 10]) -> usize {
    out[0] = 0x80 | BINARY;
    write_length(len, out)
}

/// The 7-bit length, or 126 / 127 and the 16- / 64-bit length, after the first byte.
fn write_length(len: usize, out: &mut [u8; 10]) -> usize {
    if len < 126 {
        out[1] = len as u8;
        2
    } else if let Ok(short) = u16::try_from(len) {
        out[1] = 126;
        out[2..4].copy_from_slice(&short.to_be_bytes());
        4
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    }
}

/// A server control frame (a pong or a close) being written: small enough to live in the
/// stream, so answering a ping allocates nothing.
#[derive(Debug)]
pub(super) struct ControlFrame {
    bytes: [u8; 2 + MAX_CONTROL_PAYLOAD],
    len: u8,
    /// How much of it the socket took.
    sent: u8,
}

impl Default for ControlFrame {
    fn default() -> ControlFrame {
        ControlFrame {
            bytes: [0; 2 + MAX_CONTROL_PAYLOAD],
            len: 0,
            sent: 0,
        }
    }
}

impl ControlFrame {
    /// Starts writing a control frame of `opcode` with `payload` (at most 125 bytes, cut
    /// there otherwise).
    pub(super) fn start(&mut self, opcode: u8, payload: &[u8]) {
        let payload = &payload[..payload.len().min(MAX_CONTROL_PAYLOAD)];
        self.bytes[0] = 0x80 | opcode;
        self.bytes[1] = payload.len() as u8;
        self.bytes[2..2 + payload.len()].copy_from_slice(payload);
        self.len = 2 + payload.len() as u8;
        self.sent = 0;
    }

    /// What is left to write; empty when there is no frame (or it is all out).
    pub(super) fn unsent(&self) -> &[u8] {
        &self.bytes[usize::from(self.sent)..usize::from(self.len)]
    }

    /// The socket took `n` more bytes.
    pub(super) fn advance(&mut self, n: usize) {
        self.sent = (usize::from(self.sent) + n).min(usize::from(self.len)) as u8;
        if self.sent == self.len {
            self.len = 0;
            self.sent = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A masked client frame: the length as a server writes it (`server_frames_are_encoded`
    /// checks that byte for byte), with the mask bit and key.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut header = [0u8; 10];
        header[0] = if fin { 0x80 } else { 0 } | opcode;
        let n = write_length(payload.len(), &mut header);
        header[1] |= 0x80;
        let mut out = header[..n].to_vec();
        out.extend_from_slice(&MASK);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        out
    }

    /// What a stream of reads decoded to: the data bytes in order, the pongs wanted after
    /// each read, whether the close arrived.
    type Decoded = (Vec<u8>, Vec<Vec<u8>>, bool);

    /// What a stream of reads cut at `cuts` decodes to.
    fn decode_cut(wire: &[u8], cuts: &[usize]) -> Result<Decoded, FrameError> {
        let mut inbound = Inbound::default();
        let mut data = Vec::new();
        let mut pongs = Vec::new();
        let mut start = 0;
        for &end in cuts.iter().chain(std::iter::once(&wire.len())) {
            let mut read = wire[start..end].to_vec();
            let kept = inbound.decode(&mut read)?;
            data.extend_from_slice(&read[..kept]);
            if let Some(p) = inbound.take_pong() {
                pongs.push(p.to_vec());
            }
            start = end;
        }
        Ok((data, pongs, inbound.closed()))
    }

    /// A message of three fragments (one of 300 bytes: a 16-bit length) with a ping and a
    /// pong between them, a binary frame of 70,000 bytes (64-bit length), then a close:
    /// every cut of the stream at one and at two byte boundaries decodes to the same bytes,
    /// pongs and close. Masks run across reads (RFC 6455 §5.3), control frames may come
    /// between the frames of a message (§5.4).
    #[test]
    fn frames_split_at_every_byte_boundary_decode_the_same() {
        let first: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let big: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut wire = frame(false, BINARY, b"hello ");
        wire.extend(frame(true, PING, b"are you there"));
        wire.extend(frame(false, CONTINUATION, &first));
        wire.extend(frame(true, PONG, b"unsolicited"));
        wire.extend(frame(true, CONTINUATION, b"!"));
        wire.extend(frame(true, BINARY, &big));
        let big_at = wire.len() - big.len() + 1..wire.len();
        wire.extend(frame(true, BINARY, b""));
        wire.extend(frame(true, CLOSE, &1000u16.to_be_bytes()));
        wire.extend(frame(true, BINARY, b"after the close"));
        let mut want = b"hello ".to_vec();
        want.extend_from_slice(&first);
        want.push(b'!');
        want.extend_from_slice(&big);
        let whole = decode_cut(&wire, &[]).expect("decodes");
        assert_eq!(whole.0, want);
        assert_eq!(whole.1, vec![b"are you there".to_vec()]);
        assert!(whole.2, "the close arrived");
        // Every single cut (through the large frame's payload, every 331st: it is one
        // unmasking loop), and pairs of cuts through the first 400 bytes.
        for cut in (1..wire.len()).filter(|c| !big_at.contains(c) || c % 331 == 0) {
            assert_eq!(
                decode_cut(&wire, &[cut]).expect("decodes"),
                whole,
                "cut at {cut}"
            );
        }
        for a in 1..400 {
            for b in (a + 1..400).step_by(7) {
                assert_eq!(
                    decode_cut(&wire, &[a, b]).expect("decodes"),
                    whole,
                    "{a} {b}"
                );
            }
        }
        // One byte per read.
        let cuts: Vec<usize> = (1..wire.len()).collect();
        assert_eq!(decode_cut(&wire, &cuts).expect("decodes"), whole);
    }

    /// RFC 6455 §5.5.3: of pings not answered yet, the latest is the one answered; a ping's
    /// payload masked across reads is unmasked whole.
    #[test]
    fn the_latest_ping_is_answered() {
        let mut inbound = Inbound::default();
        let mut wire = frame(true, PING, b"first");
        wire.extend(frame(true, PING, b"second and longer"));
        let (a, b) = wire.split_at_mut(9);
        assert_eq!(inbound.decode(a), Ok(0));
        assert_eq!(inbound.decode(b), Ok(0));
        assert_eq!(inbound.take_pong(), Some(&b"second and longer"[..]));
        assert_eq!(inbound.take_pong(), None, "answered once");
        let mut empty = frame(true, PING, b"");
        assert_eq!(inbound.decode(&mut empty), Ok(0));
        assert_eq!(inbound.take_pong(), Some(&b""[..]));
    }

    /// Each protocol error is refused as soon as the byte that shows it is in.
    #[test]
    fn protocol_errors_are_refused() {
        let unmasked = {
            let mut f = frame(true, BINARY, b"x");
            f[1] &= 0x7F;
            f
        };
        let long_ping = {
            let mut f = frame(true, PING, &[0; 126]);
            f.truncate(2);
            f
        };
        let top_bit = {
            let mut f = frame(true, BINARY, &[0; 70_000]);
            f[2] |= 0x80;
            f
        };
        let cases: Vec<(Vec<u8>, FrameError)> = vec![
            (unmasked, FrameError::Unmasked),
            (frame(true, BINARY | 0x40, b"x"), FrameError::Reserved),
            (frame(true, BINARY | 0x10, b"x"), FrameError::Reserved),
            (frame(true, 0x3, b"x"), FrameError::Opcode(3)),
            (frame(true, 0xB, b"x"), FrameError::Opcode(0xB)),
            (frame(true, TEXT, b"MQTT"), FrameError::Text),
            (frame(false, PING, b"x"), FrameError::FragmentedControl),
            (frame(false, CLOSE, b""), FrameError::FragmentedControl),
            (long_ping, FrameError::ControlTooLong),
            (
                frame(true, CONTINUATION, b"x"),
                FrameError::StrayContinuation,
            ),
            (top_bit, FrameError::Length),
        ];
        for (wire, error) in cases {
            let mut inbound = Inbound::default();
            let mut wire = wire;
            assert_eq!(inbound.decode(&mut wire), Err(error), "{error}");
        }
        // A new binary frame inside an unfinished message.
        let mut inbound = Inbound::default();
        let mut wire = frame(false, BINARY, b"a");
        wire.extend(frame(true, BINARY, b"b"));
        assert_eq!(inbound.decode(&mut wire), Err(FrameError::Interleaved));
        // A text frame inside a message is refused as text.
        let mut inbound = Inbound::default();
        let mut wire = frame(false, BINARY, b"a");
        wire.extend(frame(true, TEXT, b"b"));
        assert_eq!(inbound.decode(&mut wire), Err(FrameError::Text));
        assert_eq!(FrameError::Text.close_code(), 1003);
        assert_eq!(FrameError::Unmasked.close_code(), 1002);
    }

    /// The close frame's status code is kept (split across reads) for the answer.
    #[test]
    fn the_close_code_is_kept() {
        let mut inbound = Inbound::default();
        let mut wire = frame(true, CLOSE, &[0x03, 0xE9, b'b', b'y', b'e']);
        let (a, b) = wire.split_at_mut(7);
        assert_eq!(inbound.decode(a), Ok(0));
        assert!(!inbound.closed());
        assert_eq!(inbound.decode(b), Ok(0));
        assert!(inbound.closed());
        assert_eq!(inbound.close_code(), Some(1001));
        let mut inbound = Inbound::default();
        assert_eq!(inbound.decode(&mut frame(true, CLOSE, b"")), Ok(0));
        assert!(inbound.closed());
        assert_eq!(inbound.close_code(), None);
    }

    /// Server headers use the shortest length (RFC 6455 §5.2) and no mask; a control frame
    /// is written in pieces.
    #[test]
    fn server_frames_are_encoded() {
        let mut h = [0u8; 10];
        assert_eq!(data_header(125, &mut h), 2);
        assert_eq!(h[..2], [0x82, 125]);
        assert_eq!(data_header(126, &mut h), 4);
        assert_eq!(h[..4], [0x82, 126, 0, 126]);
        assert_eq!(data_header(65_536, &mut h), 10);
        assert_eq!(h[..10], [0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
        let mut c = ControlFrame::default();
        assert!(c.unsent().is_empty());
        c.start(PONG, b"abc");
        assert_eq!(c.unsent(), [0x8A, 3, b'a', b'b', b'c']);
        c.advance(2);
        assert_eq!(c.unsent(), b"abc");
        c.advance(3);
        assert!(c.unsent().is_empty());
    }
}
