//! The handshake's waits: the one deadline (`mqtt.connect_timeout` from accept), and reads
//! that take a pending slot when they have to wait for the client.

use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::io::Io;
use crate::broker::Broker;
use crate::connection::held::HeldBytes;
use crate::connection::slots::{HandshakeSlot, Refused};
use crate::connection::ConnectionInfo;

/// What the next read of a handshake found (see [`read_more`]).
pub(super) enum ReadMore {
    /// Bytes arrived.
    Data,
    /// The client closed, the socket failed, or the server is stopping.
    Gone,
    /// `mqtt.connect_timeout` passed.
    TimedOut,
    /// The read had to wait, and no pending slot was free for that.
    Refused(Refused),
}

/// What the handshake reads first, before a CONNECT's fixed header tells its size: most
/// CONNECTs are whole in it, and no more than this of what a client pipelines behind its
/// CONNECT is read with it ([`packet_still_needs`]).
const FIRST_READ: usize = 1024;

/// How much more the handshake reads of the packet at the front of `rbuf`: what its fixed
/// header says is still missing, or the rest of [`FIRST_READ`] before the header is in.
/// Reading no further, what a client sends behind its CONNECT stays in the socket for the
/// client loop, and a handshake waiting for its login verdict holds at most a first read's
/// worth of it: read with the CONNECT, up to 16 KiB of a pipelined PUBLISH had counted as
/// part of a small CONNECT, which was then refused as a large one (issue 35, twenty-sixth
/// adversarial pass, L2).
pub(super) fn packet_still_needs(rbuf: &[u8]) -> usize {
    match crate::codec::decode_fixed_header(rbuf, usize::MAX) {
        Ok(Some(header)) => {
            (header.header_len + header.remaining_length).saturating_sub(rbuf.len())
        }
        _ => FIRST_READ.saturating_sub(rbuf.len()),
    }
    .max(1)
}

/// Reads more of the handshake: at most `most` bytes. A read that would have to wait takes
/// the connection's pending slot first ([`HandshakeSlot::wait_for_client`]), so only
/// handshakes that wait for the client count against `max_pending_connections`: one whose
/// CONNECT is already in the socket (the usual case, since the kernel defers the accept
/// until it arrives) reads it without waiting and never does, however many clients connect
/// at once.
pub(super) async fn read_more<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    (slot, most): (&mut HandshakeSlot, usize),
    deadline: Instant,
    shutdown: &CancellationToken,
) -> ReadMore {
    // One poll: ready if the bytes are there, else the waker is registered for the wait.
    let ready = std::future::poll_fn(|cx| {
        Poll::Ready(match io.poll_read_at_most(cx, most) {
            Poll::Ready(read) => Some(read),
            Poll::Pending => None,
        })
    })
    .await;
    let read = match ready {
        Some(read) => read,
        None => {
            if let Err(refused) = slot.wait_for_client() {
                return ReadMore::Refused(refused);
            }
            tokio::select! {
                r = tokio::time::timeout_at(deadline, io.read_at_most(most)) => match r {
                    Ok(read) => read,
                    Err(_) => return ReadMore::TimedOut,
                },
                () = shutdown.cancelled() => return ReadMore::Gone,
                () = slot.evicted() => return ReadMore::Refused(Refused::Evicted),
            }
        }
    };
    match read {
        Ok(n) if n > 0 => ReadMore::Data,
        _ => ReadMore::Gone,
    }
}

/// What [`while_connected`] reads of a client at most beyond what it held when the wait
/// began: enough to see a close behind a few pipelined packets. Bytes a client pipelines
/// behind its CONNECT past it stay in the socket for the client loop. It was 64 KiB, counted
/// nowhere, and 5,080 handshakes waiting for their hashes held 367 MB of it (issue 35,
/// twenty-fifth adversarial pass, K1); now it is counted with the CONNECT, and read only
/// where the CONNECTs not verified yet have room for it.
pub(super) const WATCH_LIMIT: usize = 1024;

/// Runs `work` (a password check) while watching the client: `None` when the client closed
/// (end of stream, an error) or the server is stopping first. `work` is then dropped, so a
/// check still waiting for a hash worker never runs: issue 35, finding 4 (hashes went on for
/// connections that had closed). The read comes first, so a close that is already there is
/// seen before the work starts.
///
/// What the watch reads is counted in `unverified` with the decoded CONNECT's
/// `connect_bytes`; when the CONNECTs not verified yet have no room for [`WATCH_LIMIT`] more
/// (`partial::count`), nothing is read and only the work or a shutdown ends the wait.
pub(super) async fn while_connected<S, F>(
    io: &mut Io<S>,
    shutdown: &CancellationToken,
    (unverified, connect_bytes): (&mut HeldBytes, usize),
    work: F,
) -> Option<F::Output>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: std::future::Future,
{
    let mut work = std::pin::pin!(work);
    let most = io.rbuf.len() + WATCH_LIMIT;
    let watching = unverified.set(connect_bytes + most).is_ok();
    // Bounded: each turn reads at least a byte, and reading stops at `most`.
    let out = loop {
        let room = if watching {
            most.saturating_sub(io.rbuf.len())
        } else {
            0
        };
        tokio::select! {
            biased;
            read = io.read_at_most(room), if room > 0 => match read {
                Ok(n) if n > 0 => {}
                _ => break None,
            },
            () = shutdown.cancelled() => break None,
            out = &mut work => break Some(out),
        }
    };
    // Shrinking: never refused.
    let _ = unverified.set(connect_bytes + io.rbuf.len());
    out
}

/// An enhanced-authentication exchange's share of the handshake: the connection's slot (the
/// exchange waits for the client too) and the handshake's deadline.
pub(super) struct Exchange<'a> {
    pub(super) slot: &'a mut HandshakeSlot,
    pub(super) deadline: Instant,
    /// The client's `connection::slots::source_key`: the failed-login limits' key.
    pub(super) source: std::net::IpAddr,
}

/// When the handshake of the connection holding `slot` must be done: `mqtt.connect_timeout`
/// after the listener accepted it.
pub(super) fn connect_deadline(broker: &Broker, slot: &HandshakeSlot) -> Instant {
    let limit = std::time::Duration::from_secs(u64::from(broker.config().connect_timeout));
    slot.accepted_at() + limit
}

/// Counts and logs a handshake that ran out of `mqtt.connect_timeout` (debug only: a flood of
/// silent sockets would otherwise flood the log; the metric counts them).
pub(super) fn connect_timed_out(broker: &Broker, info: &ConnectionInfo, held: usize) {
    broker.metrics.connect_timeouts.increment(1);
    tracing::debug!(peer = %info.peer, listener = %info.listener, held, "closing: no CONNECT within mqtt.connect_timeout");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::partial::{before_connect, HeldClass};
    use tokio::io::AsyncWriteExt;

    /// A work that gives the watch many turns and then ends (no time passes).
    async fn many_turns() {
        for _ in 0..200 {
            tokio::task::yield_now().await;
        }
    }

    /// Issue 35, twenty-fifth adversarial pass, K1: while a login verdict was due, the
    /// handshake read up to 64 KiB of what the client sent behind its CONNECT, counted
    /// nowhere. Now it reads at most [`WATCH_LIMIT`] more, counted with the CONNECT; the
    /// rest stays in the socket. And where the CONNECTs not verified yet have no room for
    /// that, it reads nothing.
    #[tokio::test]
    async fn the_watch_reads_little_and_counts_it() {
        // A CONNECT of more than the allowance, so that its address's part can be too small.
        let connect_bytes = 500 + 10 * 1024;
        let source = std::net::IpAddr::from([192, 0, 2, 77]);
        let roomy = before_connect(source, u64::MAX / 4, 1 << 20);
        let full = (
            HeldClass::BeforeConnect {
                source,
                source_share: connect_bytes as u64,
            },
            u64::MAX / 4,
        );
        for (class, reads) in [(roomy, WATCH_LIMIT), (full, 0)] {
            let (server, mut client) = tokio::io::duplex(256 * 1024);
            client.write_all(&[0u8; 65_536]).await.expect("write");
            let mut io = Io::new(server);
            let mut unverified = HeldBytes::new(class);
            unverified.set(connect_bytes).expect("the CONNECT fits");
            let watch = (&mut unverified, connect_bytes);
            let out =
                while_connected(&mut io, &CancellationToken::new(), watch, many_turns()).await;
            assert!(out.is_some(), "the work ended the wait");
            assert_eq!(io.rbuf.len(), reads, "read behind the CONNECT ({class:?})");
            assert_eq!(unverified.counted(), connect_bytes + reads);
        }
    }
}
