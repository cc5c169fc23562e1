//! The handshake's waits: the one deadline (`mqtt.connect_timeout` from accept), and reads
//! that take a pending slot when they have to wait for the client.

use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::io::Io;
use crate::broker::Broker;
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

/// Reads more of the handshake. A read that would have to wait takes the connection's
/// pending slot first ([`HandshakeSlot::wait_for_client`]), so only handshakes that wait for
/// the client count against `max_pending_connections`: one whose CONNECT is already in the
/// socket (the usual case, since the kernel defers the accept until it arrives) reads it
/// without waiting and never does, however many clients connect at once.
pub(super) async fn read_more<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    slot: &mut HandshakeSlot,
    deadline: Instant,
    shutdown: &CancellationToken,
) -> ReadMore {
    // One poll: ready if the bytes are there, else the waker is registered for the wait.
    let ready = std::future::poll_fn(|cx| {
        Poll::Ready(match io.poll_read_some(cx) {
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
                r = tokio::time::timeout_at(deadline, io.read_some()) => match r {
                    Ok(read) => read,
                    Err(_) => return ReadMore::TimedOut,
                },
                () = shutdown.cancelled() => return ReadMore::Gone,
            }
        }
    };
    match read {
        Ok(n) if n > 0 => ReadMore::Data,
        _ => ReadMore::Gone,
    }
}

/// What [`while_connected`] reads of a client at most while it waits (bytes a client
/// pipelines behind CONNECT stay in the read buffer for the client loop); past it, only the
/// work or a shutdown ends the wait.
const WATCH_LIMIT: usize = 64 * 1024;

/// Runs `work` (a password check) while watching the client: `None` when the client closed
/// (end of stream, an error) or the server is stopping first. `work` is then dropped, so a
/// check still waiting for a hash worker never runs: issue 35, finding 4 (hashes went on for
/// connections that had closed). The read comes first, so a close that is already there is
/// seen before the work starts.
pub(super) async fn while_connected<S, F>(
    io: &mut Io<S>,
    shutdown: &CancellationToken,
    work: F,
) -> Option<F::Output>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: std::future::Future,
{
    let mut work = std::pin::pin!(work);
    // Bounded: each turn reads at least a byte, and reading stops at WATCH_LIMIT.
    loop {
        let room = io.rbuf.len() < WATCH_LIMIT;
        tokio::select! {
            biased;
            read = io.read_some(), if room => match read {
                Ok(n) if n > 0 => {}
                _ => return None,
            },
            () = shutdown.cancelled() => return None,
            out = &mut work => return Some(out),
        }
    }
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
