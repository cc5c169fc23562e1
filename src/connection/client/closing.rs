//! The end of a connection: why it ends, the DISCONNECT a v5 client gets, the will, handing
//! the session back to the broker, and then the lingering close of the socket.

use super::Client;
use crate::broker::PublishRefused;
use crate::codec::{DecodeError, Disconnect, DisconnectProperties, Packet, ReasonCode};
use crate::connection::io::Socket;
use crate::connection::violation::Violation;
use crate::storage::StorageError;

/// Why the connection is ending; decides the DISCONNECT sent (v5) and whether the will fires.
#[derive(Debug)]
pub(super) enum Close {
    /// The client sent DISCONNECT; 0x04 keeps the will (MQTT-3.14.4-3).
    ClientDisconnect(ReasonCode),
    /// The peer closed or the socket failed without DISCONNECT.
    Lost,
    /// A protocol violation by the client (the table in `connection::violation`).
    Violation(Violation),
    /// The durable store failed, or refused an update, that a waiting answer depends on: that
    /// answer is not sent (v5 DISCONNECT 0x97 when the store was only full, else 0x80).
    StoreFailed(StorageError),
    /// A 3.x client's PUBLISH was refused (by the store, or a full queue under
    /// `queue_overflow = "refuse"`), which 3.x cannot answer negatively: closing makes the
    /// client re-send it after reconnecting.
    StoreRefused(ReasonCode, PublishRefused),
    /// A 3.x client's QoS 1/2 PUBLISH arrived while the broker was over its memory budget
    /// (`mqtt.max_memory`); 3.x cannot refuse it in an ack, so the connection closes and the
    /// client re-sends it after reconnecting.
    OverMemoryBudget,
    /// Re-authentication failed (MQTT-4.12.1-2), with the authenticator's code.
    ReauthFailed(ReasonCode),
    /// The credentials the client connected with expired (a JWT's `exp`): it is no longer
    /// authorized (v5 DISCONNECT 0x87).
    CredentialsExpired,
    /// The JWT keys were reloaded and no longer accept the token the client connected with
    /// (v5 DISCONNECT 0x87, as for an expired one).
    CredentialsRevoked,
    /// No packet within 1.5 × keep-alive (MQTT-3.1.2-24).
    KeepAliveTimeout,
    /// Output waited and the socket took none of it for 1.5 × keep-alive: the client sends
    /// (its PINGREQs are read behind the backlog) but does not read (issue 35, twenty-second
    /// adversarial pass, H2). Closed as for keep-alive, which closed it before its packets
    /// were read there.
    OutputStalled,
    /// A started packet was not complete by its deadline (`mqtt.packet_timeout`,
    /// `mqtt.min_packet_rate`; see `connection::partial`).
    PacketTimeout,
    /// A packet an anonymous client was sending, a topic alias it
    /// bound (U6) or the output it does not read (U5) would take what anonymous clients'
    /// connections hold past their share (an eighth of `mqtt.max_memory`;
    /// `connection::partial`, `connection::held`, `HeldClass::Anonymous`): v5 DISCONNECT
    /// 0x97 Quota exceeded, 3.x closed. The client may connect again when there is room.
    OverAnonymousShare,
    /// Another connection took the session (MQTT-3.1.4-3).
    TakenOver,
    /// The broker is stopping.
    ServerShutdown,
    /// An operator disconnected the client or discarded its session (the admin API).
    Administrative,
}

impl Close {
    /// The DISCONNECT reason a v5 client is told, and why in words; `None` sends nothing.
    fn server_reason(&self) -> Option<(ReasonCode, Option<String>)> {
        match self {
            Close::ClientDisconnect(_) | Close::Lost => None,
            Close::Violation(v) => Some((v.reason_code(), Some(v.describe()))),
            Close::StoreFailed(e) => Some((store_reason(e), Some(e.to_string()))),
            Close::StoreRefused(code, e) => Some((*code, Some(e.to_string()))),
            Close::OverMemoryBudget => Some((
                ReasonCode::QUOTA_EXCEEDED,
                Some(super::pause::OVER_BUDGET.into()),
            )),
            Close::ReauthFailed(code) => Some((*code, Some("re-authentication failed".into()))),
            // MQTT 5.0 §3.14.2.1: 0x87 Not authorized, which a server may send in DISCONNECT.
            Close::CredentialsExpired => Some((
                ReasonCode::NOT_AUTHORIZED,
                Some("the token the client connected with has expired".into()),
            )),
            // The same code: the client is no longer authorized. 0x8C Bad authentication
            // method is for a method that is not supported or not the connection's; 0x86 is
            // not a DISCONNECT code (MQTT 5.0 §3.14.2.1).
            Close::CredentialsRevoked => Some((
                ReasonCode::NOT_AUTHORIZED,
                Some(
                    "the token the client connected with no longer passes the server's keys".into(),
                ),
            )),
            Close::KeepAliveTimeout => Some((ReasonCode::KEEP_ALIVE_TIMEOUT, None)),
            Close::OutputStalled => Some((
                ReasonCode::KEEP_ALIVE_TIMEOUT,
                Some("nothing read from the server within 1.5 times the keep-alive".into()),
            )),
            // No code says "packet too slow"; 0x8D (no packet received in time) is the
            // nearest, and the Reason String says which limit it was.
            Close::PacketTimeout => Some((
                ReasonCode::KEEP_ALIVE_TIMEOUT,
                Some("packet not complete within mqtt.packet_timeout".into()),
            )),
            // MQTT 5.0 §3.14.2.1: 0x97 Quota exceeded, "an implementation or administrative
            // imposed limit has been exceeded".
            Close::OverAnonymousShare => Some((
                ReasonCode::QUOTA_EXCEEDED,
                Some(OVER_ANONYMOUS_SHARE.into()),
            )),
            Close::TakenOver => Some((ReasonCode::SESSION_TAKEN_OVER, None)),
            // MQTT 5.0 §3.14.2.1: 0x98 Administrative action.
            Close::Administrative => Some((
                ReasonCode::ADMINISTRATIVE_ACTION,
                Some("disconnected by an operator".into()),
            )),
            Close::ServerShutdown => Some((ReasonCode::SERVER_SHUTTING_DOWN, None)),
        }
    }

    /// Whether the will is published (MQTT-3.1.2-8): not after a normal DISCONNECT; on server
    /// shutdown as `mqtt.wills_on_shutdown` says (the spec counts "the server closes the
    /// connection without a DISCONNECT" among the will's triggers; Mosquitto skips them).
    fn publishes_will(&self, wills_on_shutdown: bool) -> bool {
        match self {
            Close::ClientDisconnect(code) => *code == ReasonCode::DISCONNECT_WITH_WILL,
            Close::ServerShutdown => wills_on_shutdown,
            _ => true,
        }
    }

    /// Why the connection ended, in the words of the `client disconnected` log line (a fixed
    /// set, so a log stack can count them).
    fn label(&self) -> &'static str {
        match self {
            Close::ClientDisconnect(code) if *code == ReasonCode::DISCONNECT_WITH_WILL => {
                "client disconnect with will"
            }
            Close::ClientDisconnect(_) => "client disconnect",
            Close::Lost => "connection lost",
            Close::Violation(_) => "protocol error",
            Close::StoreFailed(_) => "store failed",
            Close::StoreRefused(..) => "publish refused",
            Close::OverMemoryBudget => "over memory budget",
            Close::ReauthFailed(_) => "re-authentication failed",
            Close::CredentialsExpired => "credentials expired",
            Close::CredentialsRevoked => "credentials revoked",
            Close::KeepAliveTimeout => "keep-alive timeout",
            Close::OutputStalled => "output not read within keep-alive",
            Close::PacketTimeout => "packet timeout",
            Close::OverAnonymousShare => "anonymous share full",
            Close::TakenOver => "session taken over",
            Close::ServerShutdown => "server shutdown",
            Close::Administrative => "administrative action",
        }
    }
}

/// The Reason String of [`Close::OverAnonymousShare`].
const OVER_ANONYMOUS_SHARE: &str =
    "what anonymous clients' connections hold is at their share of the memory budget (mqtt.max_memory)";

/// How long a client's DISCONNECT waits for the commits its earlier packets' answers wait
/// for ([`Client::answer_before_closing`]): one group commit is milliseconds; a store that
/// takes longer is stalled, and the close does not wait for it.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The reason code a v5 client is told when the store did not take what it sent: 0x97 Quota
/// exceeded for "too much for now" (queue, budget, full filesystem; it may try again later),
/// 0x80 Unspecified error for a broken store.
pub(super) fn store_reason(error: &StorageError) -> ReasonCode {
    if error.is_quota() {
        ReasonCode::QUOTA_EXCEEDED
    } else {
        ReasonCode::UNSPECIFIED_ERROR
    }
}

/// The reason code for a refused PUBLISH: 0x97 for a full queue and the store's "too much
/// for now", 0x80 for a broken store.
pub(super) fn refused_reason(error: &PublishRefused) -> ReasonCode {
    error.reason_code()
}

impl<S: Socket> Client<S> {
    /// DISCONNECT from the client, possibly with a new Session Expiry Interval.
    // Like every packet handler, takes the decoded packet it is dispatched with.
    #[allow(clippy::needless_pass_by_value)]
    pub(super) fn on_disconnect(&mut self, disconnect: Disconnect) -> Result<(), Close> {
        if let Some(mut expiry) = disconnect.properties.session_expiry_interval {
            if self.settled.not_kept() {
                // CONNACK lowered it to 0 for the anonymous share: it stays 0 (and the
                // client, which asked for more in CONNECT, may name any value here).
                expiry = 0;
            } else if self.settled.unauthenticated() {
                // At least 1: a session that had 0 still sees a raise from 0 (a violation).
                let cap = self.broker().config().max_session_expiry_anonymous.max(1);
                expiry = expiry.min(cap);
            }
            if self.session.set_expiry_at_disconnect(expiry).is_err() {
                return Err(self.violation(Violation::SessionExpiryRaisedFromZero));
            }
        }
        if disconnect.reason_code != ReasonCode::DISCONNECT_WITH_WILL {
            // MQTT-3.1.2-10: a normal DISCONNECT removes the will; its count goes with it now,
            // not after the closing writes and the linger (issue 35, twelfth pass, U7).
            self.will = None;
        }
        Err(Close::ClientDisconnect(disconnect.reason_code))
    }

    /// Writes the deliveries already queued for the session and the answers still waiting
    /// for a commit (PUBACK, PUBREC, held QoS 2 deliveries) before a client's DISCONNECT
    /// closes the connection, within [`ANSWER_WAIT`]. The client
    /// sent those packets before its DISCONNECT, without waiting for their answers (MQTT does
    /// not ask it to wait), and their answers come before the close, as Mosquitto's do: a
    /// QoS 1 publisher that pipelines PUBLISH then DISCONNECT learns its message was taken
    /// and does not send it again on its next connection. A commit that fails or takes
    /// longer leaves its answer unsent (the message is not lost: the client sends it again).
    async fn answer_before_closing(&mut self) {
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        // Messages routed to the session before the DISCONNECT was read (its own PUBLISHes
        // to a topic it subscribes to, pipelined before it) go out first, up to the window.
        self.fill_from_session(std::time::Instant::now());
        self.release_gated();
        while self.gated.waiting() {
            let front = std::future::poll_fn(|cx| self.gated.poll_front_durable(cx));
            match tokio::time::timeout_at(deadline, front).await {
                Ok(Ok(())) => {
                    self.gated.release_front();
                    self.release_gated();
                }
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Sends the closing DISCONNECT (v5), publishes the will if due, releases the session,
    /// then lingers on the socket (`Io::linger`) if the client has something left to read.
    pub(super) async fn finish(mut self: Box<Self>, close: Close) {
        let v5 = self.version.is_v5();
        let server_reason = close.server_reason();
        match (&close, &server_reason) {
            (
                Close::Violation(Violation::Undecodable(DecodeError::PacketTooLarge { size, max })),
                _,
            ) => {
                self.broker().metrics.packets_too_large.increment(1);
                let client = self.session.client_id();
                if crate::connection::told_once::first_time(client, std::time::Instant::now()) {
                    tracing::info!(peer = %self.info.peer, listener = %self.info.listener, %client, size, max, "closing connection: a packet over mqtt.max_packet_size; many client libraries send it again after every reconnect, so raise max_packet_size or make the message smaller (logged once an hour per client id, counted in postbox_packets_too_large_total)");
                } else {
                    tracing::debug!(peer = %self.info.peer, %client, size, max, "closing connection: a packet over mqtt.max_packet_size, again");
                }
            }
            (Close::Violation(v), _) => {
                tracing::debug!(peer = %self.info.peer, listener = %self.info.listener, client = %self.session.client_id(), reason = %v.reason_code(), statement = v.statement(), why = %v.describe(), "closing connection: protocol violation");
            }
            (
                Close::StoreRefused(..)
                | Close::StoreFailed(_)
                | Close::ReauthFailed(_)
                | Close::CredentialsExpired
                | Close::CredentialsRevoked
                | Close::OverMemoryBudget,
                Some((code, why)),
            ) => {
                if matches!(close, Close::CredentialsExpired) {
                    self.broker().metrics.credentials_expired.increment(1);
                }
                tracing::debug!(peer = %self.info.peer, client = %self.session.client_id(), reason = %code, why = why.as_deref().unwrap_or(""), "closing connection");
            }
            (Close::KeepAliveTimeout | Close::OutputStalled, _) => {
                self.broker().metrics.keepalive_timeouts.increment(1);
            }
            (Close::Administrative, _) => {
                tracing::info!(peer = %self.info.peer, client = %self.session.client_id(), "closing connection: disconnected by an operator");
            }
            (Close::OverAnonymousShare, _) => {
                self.broker().metrics.anonymous_share_closes.increment(1);
                tracing::debug!(peer = %self.info.peer, client = %self.session.client_id(), "closing connection: what it holds (a packet arriving, a topic alias, unread output) would take anonymous clients' connections past their share of the memory budget");
            }
            (Close::PacketTimeout, _) => {
                self.broker().metrics.packet_timeouts.increment(1);
                tracing::debug!(peer = %self.info.peer, client = %self.session.client_id(), "closing connection: packet not complete in time");
            }
            _ => {}
        }
        let server_reason_text = server_reason.as_ref().and_then(|(_, why)| why.clone());
        // A v5 client gets a DISCONNECT with the reason; a 3.x client's connection is closed
        // without a packet (3.1.1 has no server DISCONNECT).
        if let (true, Some((code, why))) = (v5, server_reason) {
            // v5 lets the server say why (MQTT-3.14.0-1: only after CONNACK, which we sent).
            let disconnect = Disconnect {
                reason_code: code,
                properties: DisconnectProperties {
                    reason_string: why.and_then(|why| self.problem_string(&why)),
                    ..Default::default()
                },
            };
            self.io.queue_within(
                &Packet::Disconnect(disconnect),
                self.version,
                self.client_max_packet,
            );
        }
        if matches!(close, Close::ClientDisconnect(_)) {
            self.answer_before_closing().await;
        }
        let linger = self.io.finish_writing().await;
        let had_will = self.will.is_some();
        let will_due = close.publishes_will(self.broker().config().wills_on_shutdown);
        if will_due {
            if let Some(will) = self.will.take().map(|held| held.will) {
                // Held until the delay passes or the session ends (MQTT-3.1.2-8); v5 only.
                let delay = will.properties.will_delay_interval.filter(|_| v5);
                self.session.publish_will(will, delay);
            }
        }
        self.session.detach();
        // Mosquitto's "Client ID disconnected[: reason]", as fields (see the `connected` line).
        let detail = server_reason_text.unwrap_or_default();
        tracing::info!(
            peer = %self.info.peer,
            listener = %self.info.listener,
            client = %self.session.client_id(),
            reason = close.label(),
            detail = %detail,
            will = will_due && had_will,
            "client disconnected"
        );
        if linger {
            // Socket hygiene only, so after the will and the session are settled, and with
            // everything but the socket dropped first (the block ends before the linger).
            let mut io = {
                let client = *self;
                client.io
            };
            io.linger().await;
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every `reason` of the `client disconnected` line is documented (README, or the guide
    /// under docs/), read from [`super::Close::label`]'s own source, so a new reason cannot
    /// ship undocumented: `administrative action`, `credentials revoked` and `anonymous share
    /// full` were missing from the README's list (issue 37, "Seen" 7).
    #[test]
    fn every_close_reason_is_documented() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut docs = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
            for entry in entries.flatten() {
                if entry.path().extension().is_some_and(|e| e == "md") {
                    docs.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
                }
            }
        }
        let source = include_str!("closing.rs");
        let start = source.find("fn label(&self)").expect("label");
        let body = &source[start..start + source[start..].find("\n    }\n").expect("end")];
        let labels: Vec<&str> = body
            .split("=> \"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .chain(
                body.split("{\n                \"")
                    .skip(1)
                    .filter_map(|r| r.split('"').next()),
            )
            .collect();
        assert!(labels.len() >= 15, "{labels:?}");
        for label in labels {
            assert!(
                docs.contains(&format!("`{label}`")),
                "`{label}` is not documented"
            );
        }
    }
}
