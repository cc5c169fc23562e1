//! The CONNACKs that refuse a handshake: which code a full connection bound or a failed
//! authentication gets, and the refusal itself (sent within the client's Maximum Packet
//! Size, then the lingering close). Kept apart from the handshake's steps, which only decide
//! to refuse.
//!
//! Must not: decide who is refused (`connection::admission` does).

use tokio::io::{AsyncRead, AsyncWrite};

use super::super::admission::{self, client_max_packet, Refusal};
use super::super::io::Io;
use crate::codec::{Connect, DecodeError, Packet, ProtocolVersion, ReasonCode, ReasonContext};
use crate::connection::slots::Full;
use crate::metrics::Metrics;

/// The CONNACK refusing a client that found a connection bound full (3.x: 0x03 Server
/// unavailable for each, `ReasonCode::to_v3_connack`). MQTT 5.0 §3.2.2.2: 0x89 Server busy
/// ("try again later") when the listener or the broker is full, which another client leaving
/// cures; 0x97 Quota exceeded ("an implementation or administrative imposed limit") when the
/// client's own address has its share, which only its own connections closing cures. 0x9F
/// Connection rate exceeded is for a rate, not a count.
pub(super) fn full_refusal(full: Full) -> Refusal {
    match full {
        Full::Listener => (
            ReasonCode::SERVER_BUSY,
            "the listener has its maximum number of connections",
        ),
        Full::Server => (
            ReasonCode::SERVER_BUSY,
            "the server has its maximum number of connections",
        ),
        Full::PerSource => (
            ReasonCode::QUOTA_EXCEEDED,
            "too many connections from this address",
        ),
    }
}

/// A failure reason an authenticator gave, as a code CONNACK may carry (0x87 otherwise).
pub(super) fn connack_failure(code: ReasonCode) -> ReasonCode {
    code.or_if_not_allowed(ReasonContext::ConnAck, ReasonCode::NOT_AUTHORIZED)
}

/// Sends a rejection CONNACK (MQTT-3.2.2-6: session present 0), ends the stream with the
/// lingering close (`Io::finish_writing`, `Io::linger`) and lets the caller drop it.
/// With `explain = Some((why, connect))`, `why` becomes the v5 Reason String if the client
/// accepts problem information, and the CONNACK respects its Maximum Packet Size. Always
/// `None`, whatever the handshake step returns.
pub(super) async fn reject<S: AsyncRead + AsyncWrite + Unpin, T>(
    io: &mut Io<S>,
    metrics: &Metrics,
    version: ProtocolVersion,
    code: ReasonCode,
    explain: Option<(&str, &Connect)>,
) -> Option<T> {
    tracing::info!(version = %version, reason = %code, "connection refused");
    // `postbox_connack_refusals_total{reason}`: every refusing CONNACK goes through here.
    metrics.connack_refused(code.0);
    let client_max = explain.map_or(usize::MAX, |(_, connect)| client_max_packet(connect));
    let connack = admission::refusal_connack(
        code,
        explain.map(|(why, _)| why),
        explain.map(|(_, connect)| connect),
    );
    io.queue_within(&Packet::ConnAck(connack), version, client_max);
    // MQTT-3.2.2-7: the close follows; lingering lets a client that is still writing (one
    // that pipelines PUBLISHes behind its CONNECT) read the CONNACK first. Nothing is
    // attached yet, so the linger holds only the socket.
    if io.finish_writing().await {
        io.linger().await;
    }
    None
}

/// A CONNECT that could not be decoded: answer in the client's version when it can be read
/// (v5: the reason code; 3.x: only "unacceptable protocol version" has a return code).
pub(super) async fn reject_undecodable<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    metrics: &Metrics,
    error: &DecodeError,
    sniffed: Option<ProtocolVersion>,
) {
    // 3.x malformed CONNECT: close without CONNACK (MQTT-3.1.4-1)
    if let Some((version, code)) = admission::undecodable_answer(error, sniffed) {
        reject::<S, ()>(io, metrics, version, code, None).await;
    }
}
