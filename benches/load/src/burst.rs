//! A connect storm without the async runtime: raw non-blocking sockets and one epoll loop.
//!
//! In the `connections` scenario the generator's core, not the broker, sets the pace: on
//! loopback it also runs the server half of every TCP handshake. A tokio task per handshake
//! added a task, a waker round, a timer and a `getsockopt(SO_ERROR)` to each one. Here a
//! handshake is `socket`, `bind`, `connect`, one `epoll_ctl`, `send` (CONNECT) and `recv`
//! (CONNACK), driven by one `epoll_wait` loop for all handshakes in flight; the finished
//! sockets are handed to tokio afterwards, outside the timed part.

use std::io;
use std::net::{SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use postbox::codec::{self, Packet, ProtocolVersion, ReasonCode};

/// One handshake in flight.
struct Pending {
    fd: OwnedFd,
    /// Which client (0..n) this is: its CONNECT carries that client's id.
    index: usize,
    /// The CONNECT is written once the socket is connected (first EPOLLOUT).
    sent: bool,
    /// CONNACK bytes read so far.
    input: BytesMut,
}

/// Converts a negative libc return into the OS error.
fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Opens a non-blocking socket bound to `source` and starts connecting it to `broker`.
fn start_connect(broker: SocketAddrV4, source: SocketAddrV4) -> io::Result<OwnedFd> {
    // SAFETY: plain system calls on a descriptor this function owns (wrapped in OwnedFd as
    // soon as it exists, so every early return closes it); the sockaddr values live on the
    // stack for the duration of each call and their sizes are passed exactly.
    unsafe {
        let raw = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let fd = OwnedFd::from_raw_fd(raw);
        let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = sockaddr(source);
        check(libc::bind(fd.as_raw_fd(), (&raw const local).cast(), len))?;
        let remote = sockaddr(broker);
        let rc = libc::connect(fd.as_raw_fd(), (&raw const remote).cast(), len);
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(err);
            }
        }
        Ok(fd)
    }
}

/// Opens `n` MQTT connections to `broker`, at most `concurrency` handshakes at a time, each
/// from the next source tuple `next_source` gives (skipping tuples in use). `connect_packet`
/// encodes the CONNECT of the i-th client. Returns the connected sockets (non-blocking) in
/// completion order.
///
/// # Errors
///
/// A socket call fails, a handshake is refused or malformed, or not all `n` connect in time.
// libc casts: EPOLLET is bit 31 of an i32 flag set (reinterpreted as the u32 `events`), the
// event buffer is small, and epoll_wait/send/recv counts are cast only once non-negative.
#[allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]
pub fn connect_all(
    broker: SocketAddrV4,
    n: usize,
    concurrency: usize,
    version: ProtocolVersion,
    mut next_source: impl FnMut() -> SocketAddrV4,
    connect_packet: impl Fn(usize) -> Result<BytesMut>,
    deadline: Instant,
) -> Result<Vec<TcpStream>> {
    // SAFETY: epoll_create1 returns a new descriptor, owned from here on.
    let epoll = unsafe { OwnedFd::from_raw_fd(check(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
    let mut slots: Vec<Option<Pending>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut done: Vec<TcpStream> = Vec::with_capacity(n);
    let mut started = 0;
    let mut in_flight = 0;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    while done.len() < n {
        while in_flight < concurrency.max(1) && started < n {
            let mut attempt = 0;
            let fd = loop {
                match start_connect(broker, next_source()) {
                    Ok(fd) => break fd,
                    Err(e)
                        if attempt < 16
                            && matches!(
                                e.kind(),
                                io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
                            ) =>
                    {
                        attempt += 1;
                    }
                    Err(e) => return Err(e).context(format!("connect to {broker}")),
                }
            };
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            let mut event = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET) as u32,
                u64: slot as u64,
            };
            // SAFETY: both descriptors are open; `event` is a valid epoll_event.
            check(unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    fd.as_raw_fd(),
                    &raw mut event,
                )
            })?;
            slots[slot] = Some(Pending {
                fd,
                index: started,
                sent: false,
                input: BytesMut::new(),
            });
            started += 1;
            in_flight += 1;
        }
        if Instant::now() >= deadline {
            bail!(
                "connections: timed out with {} of {n} connected",
                done.len()
            );
        }
        // SAFETY: `events` has room for the number of entries passed.
        let ready = check(unsafe {
            libc::epoll_wait(
                epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                100,
            )
        });
        let ready = match ready {
            Ok(k) => k as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e.into()),
        };
        for event in &events[..ready] {
            let (flags, slot) = (event.events, event.u64 as usize);
            let Some(pending) = slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if flags & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0 {
                bail!("connection {slot} failed during the handshake (error or hang-up)");
            }
            if !pending.sent && flags & libc::EPOLLOUT as u32 != 0 {
                let connect = connect_packet(pending.index)?;
                // SAFETY: the buffer is valid for its length; the descriptor is open.
                let sent = check(unsafe {
                    libc::send(
                        pending.fd.as_raw_fd(),
                        connect.as_ptr().cast(),
                        connect.len(),
                        libc::MSG_NOSIGNAL,
                    ) as libc::c_int
                })
                .context("send CONNECT")?;
                if sent as usize != connect.len() {
                    bail!("short write of CONNECT ({sent} of {} bytes)", connect.len());
                }
                pending.sent = true;
            }
            if pending.sent && flags & libc::EPOLLIN as u32 != 0 {
                let mut chunk = [0u8; 64];
                // SAFETY: `chunk` is valid for writes of its length; the descriptor is open.
                let got = unsafe {
                    libc::recv(
                        pending.fd.as_raw_fd(),
                        chunk.as_mut_ptr().cast(),
                        chunk.len(),
                        0,
                    )
                };
                if got == 0 {
                    bail!("broker closed connection {slot} before CONNACK");
                }
                if got < 0 {
                    let err = io::Error::last_os_error();
                    if err.kind() == io::ErrorKind::WouldBlock {
                        continue;
                    }
                    return Err(err).context("read CONNACK");
                }
                pending.input.extend_from_slice(&chunk[..got as usize]);
                match codec::decode(&mut pending.input, Some(version), 1 << 20) {
                    Ok(Some(Packet::ConnAck(ack))) if ack.reason_code == ReasonCode::SUCCESS => {}
                    Ok(Some(Packet::ConnAck(ack))) => {
                        bail!("CONNACK refused: reason {:#04x}", ack.reason_code.0)
                    }
                    Ok(Some(other)) => bail!("expected CONNACK, got {}", other.name()),
                    Ok(None) => continue,
                    Err(e) => bail!("undecodable CONNACK: {e}"),
                }
                if let Some(finished) = slots[slot].take() {
                    done.push(TcpStream::from(finished.fd));
                    free.push(slot);
                    in_flight -= 1;
                }
            }
        }
    }
    // Dropping `epoll` removes every socket from it; tokio registers them afresh.
    Ok(done)
}
