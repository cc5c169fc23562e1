//! Authentication after CONNACK: re-authentication (MQTT 5 §4.12.1), AUTH exchanges while
//! other packets keep flowing, whose steps run through [`crate::auth::run_step`] (off the
//! runtime when they are slow) and whose verdicts arrive as wake-ups of the connection; and
//! the end of credentials that expire (a JWT's `exp`), which closes the connection.
//!
//! Expiry costs no timer: the deadline joins the keep-alive one the connection reports to the
//! broker's sweep (`Client::report_keep_alive_deadline`), which wakes the connection once it
//! has passed, and `Client::check_standing` closes it then.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytestring::ByteString;

use super::closing::Close;
use super::Client;
use crate::auth::{self, AuthState, AuthStep, PendingStep, StepInput};
use crate::codec::{Auth, AuthProperties, Packet, ReasonCode, ReasonContext};
use crate::connection::handshake::EnhancedAuth;
use crate::connection::io::Socket;
use crate::connection::violation::Violation;

/// A connection's authentication after CONNACK, for the few that need any (boxed in the
/// client): its enhanced authentication method (v5 §4.12) and any re-authentication in
/// progress, and when the credentials it connected with expire. One box for both, as the
/// client's size is at its bound (`size_tests`).
pub(super) struct AuthContext {
    /// `None` for a client without an enhanced method (one whose token expires).
    method: Option<EnhancedAuth>,
    /// Method state between the rounds of a re-authentication in progress.
    state: Option<AuthState>,
    /// An authentication step being computed (possibly on the blocking pool).
    pub(super) step: Option<PendingStep>,
    /// When the client's credentials expire (a JWT's `exp` plus the leeway): the connection
    /// is closed then, v5 with DISCONNECT 0x87 Not authorized.
    pub(super) expires_at: Option<Instant>,
    /// The JWT the client logged in with and the key generation it last passed under
    /// (`JwtVerifier::generation`): checked again after a reload of the keys.
    pub(super) token: Option<(Box<str>, u64)>,
}

impl AuthContext {
    /// The context of a client that used `method` and whose credentials expire at `expires`;
    /// `None` (no box) when it has neither.
    pub(super) fn new(
        method: Option<EnhancedAuth>,
        expires: Option<SystemTime>,
        token: Option<(Box<str>, u64)>,
    ) -> Option<Box<AuthContext>> {
        let expires_at = expires.map(|at| {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            Instant::now() + left
        });
        (method.is_some() || expires_at.is_some() || token.is_some()).then(|| {
            Box::new(AuthContext {
                method,
                state: None,
                step: None,
                expires_at,
                token,
            })
        })
    }
}

impl<S: Socket> Client<S> {
    /// AUTH after CONNACK: 0x19 starts a re-authentication with the connection's method
    /// (MQTT-4.12.1-1), 0x18 answers our challenge.
    pub(super) fn on_auth(&mut self, packet: Auth) -> Result<(), Close> {
        let started = match self.auth.as_deref_mut() {
            Some(auth) if auth.method.is_some() => {
                start_reauth_step(auth, packet, self.session.client_id())
            }
            _ => Err(Violation::AuthWithoutMethod),
        };
        started.map_err(|violation| self.violation(violation))
    }

    /// The verdict of a re-authentication step: AUTH 0x00 (done), AUTH 0x18 (another round),
    /// or DISCONNECT (MQTT-4.12.1-2).
    pub(super) fn on_auth_verdict(&mut self, verdict: AuthStep) -> Result<(), Close> {
        let Some(auth) = self.auth.as_deref_mut() else {
            return Ok(());
        };
        let Some(method) = auth.method.as_ref().map(|m| m.method.clone()) else {
            return Ok(()); // no step runs without a method
        };
        let (reason_code, data) = match verdict {
            AuthStep::Success(data) => (ReasonCode::SUCCESS, data),
            // MQTT 5 §4.12.1: re-authentication proves the client is still who it was; the
            // session's identity (and the ACL's grants made for it) stay as they are. A client
            // proving to be someone else is refused (DISCONNECT 0x87) rather than silently
            // keeping the old identity or switching grants mid-connection.
            AuthStep::Authenticated { data, user } => {
                if auth.method.as_ref().and_then(|m| m.user.as_deref()) != Some(user.as_str()) {
                    tracing::info!(client = %self.session.client_id(), "re-authentication as another user refused");
                    return Err(Close::ReauthFailed(ReasonCode::NOT_AUTHORIZED));
                }
                (ReasonCode::SUCCESS, data)
            }
            AuthStep::Continue { data, state } => {
                auth.state = Some(state);
                (ReasonCode::CONTINUE_AUTHENTICATION, data)
            }
            AuthStep::Fail(code) => {
                tracing::info!(client = %self.session.client_id(), reason = %code, "re-authentication failed");
                let code =
                    code.or_if_not_allowed(ReasonContext::Disconnect, ReasonCode::NOT_AUTHORIZED);
                return Err(Close::ReauthFailed(code));
            }
        };
        let packet = Packet::Auth(Auth {
            reason_code,
            properties: AuthProperties {
                authentication_method: Some(method), // MQTT-4.12.0-5
                authentication_data: data,
                ..Default::default()
            },
        });
        self.io
            .queue_within(&packet, self.version, self.client_max_packet);
        Ok(())
    }
}

/// Starts the next step of a re-authentication for an AUTH packet: 0x19 starts one with the
/// connection's method (MQTT-4.12.1-1), 0x18 answers our challenge.
fn start_reauth_step(
    auth: &mut AuthContext,
    packet: Auth,
    client_id: &ByteString,
) -> Result<(), Violation> {
    let Some(method) = &auth.method else {
        return Err(Violation::AuthWithoutMethod);
    };
    if packet.properties.authentication_method.as_ref() != Some(&method.method) {
        return Err(Violation::AuthMethodChanged);
    }
    let authenticator = Arc::clone(&method.authenticator);
    if auth.step.is_some() {
        return Err(Violation::AuthOutOfSequence);
    }
    let input = match (packet.reason_code, auth.state.take()) {
        (ReasonCode::RE_AUTHENTICATE, None) => StepInput::Start(client_id.to_string()),
        (ReasonCode::CONTINUE_AUTHENTICATION, Some(state)) => StepInput::Continue(state),
        _ => return Err(Violation::AuthOutOfSequence),
    };
    auth.step = Some(auth::run_step(
        authenticator,
        input,
        packet.properties.authentication_data,
    ));
    Ok(())
}
