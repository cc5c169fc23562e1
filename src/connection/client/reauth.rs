//! Re-authentication after CONNACK (MQTT 5 §4.12.1): AUTH exchanges while other packets keep
//! flowing. The method's steps run through [`crate::auth::run_step`] (off the runtime when
//! they are slow); their verdicts arrive as wake-ups of the connection.

use std::sync::Arc;

use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};

use super::closing::Close;
use super::Client;
use crate::auth::{self, AuthState, AuthStep, PendingStep, StepInput};
use crate::codec::{Auth, AuthProperties, Packet, ReasonCode, ReasonContext};
use crate::connection::handshake::EnhancedAuth;
use crate::connection::violation::Violation;

/// A connection's enhanced authentication (v5 §4.12): its method and any re-authentication
/// in progress.
pub(super) struct AuthContext {
    method: EnhancedAuth,
    /// Method state between the rounds of a re-authentication in progress.
    state: Option<AuthState>,
    /// An authentication step being computed (possibly on the blocking pool).
    pub(super) step: Option<PendingStep>,
}

impl AuthContext {
    pub(super) fn new(method: EnhancedAuth) -> AuthContext {
        AuthContext {
            method,
            state: None,
            step: None,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// AUTH after CONNACK: 0x19 starts a re-authentication with the connection's method
    /// (MQTT-4.12.1-1), 0x18 answers our challenge.
    pub(super) fn on_auth(&mut self, packet: Auth) -> Result<(), Close> {
        let started = match self.auth.as_deref_mut() {
            None => Err(Violation::AuthWithoutMethod),
            Some(auth) => start_reauth_step(auth, packet, self.session.client_id()),
        };
        started.map_err(|violation| self.violation(violation))
    }

    /// The verdict of a re-authentication step: AUTH 0x00 (done), AUTH 0x18 (another round),
    /// or DISCONNECT (MQTT-4.12.1-2).
    pub(super) fn on_auth_verdict(&mut self, verdict: AuthStep) -> Result<(), Close> {
        let Some(auth) = self.auth.as_deref_mut() else {
            return Ok(());
        };
        let (reason_code, data) = match verdict {
            AuthStep::Success(data) => (ReasonCode::SUCCESS, data),
            // MQTT 5 §4.12.1: re-authentication proves the client is still who it was; the
            // session's identity (and the ACL's grants made for it) stay as they are. A client
            // proving to be someone else is refused (DISCONNECT 0x87) rather than silently
            // keeping the old identity or switching grants mid-connection.
            AuthStep::Authenticated { data, user } => {
                if auth.method.user.as_deref() != Some(user.as_str()) {
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
                tracing::info!(client = %self.session.client_id(), reason = ?code, "re-authentication failed");
                let code =
                    code.or_if_not_allowed(ReasonContext::Disconnect, ReasonCode::NOT_AUTHORIZED);
                return Err(Close::ReauthFailed(code));
            }
        };
        let packet = Packet::Auth(Auth {
            reason_code,
            properties: AuthProperties {
                authentication_method: Some(auth.method.method.clone()), // MQTT-4.12.0-5
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
    if packet.properties.authentication_method.as_ref() != Some(&auth.method.method) {
        return Err(Violation::AuthMethodChanged);
    }
    if auth.step.is_some() {
        return Err(Violation::AuthOutOfSequence);
    }
    let input = match (packet.reason_code, auth.state.take()) {
        (ReasonCode::RE_AUTHENTICATE, None) => StepInput::Start(client_id.to_string()),
        (ReasonCode::CONTINUE_AUTHENTICATION, Some(state)) => StepInput::Continue(state),
        _ => return Err(Violation::AuthOutOfSequence),
    };
    auth.step = Some(auth::run_step(
        Arc::clone(&auth.method.authenticator),
        input,
        packet.properties.authentication_data,
    ));
    Ok(())
}
