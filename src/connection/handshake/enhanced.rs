//! The enhanced authentication exchange of a CONNECT (MQTT 5 §4.12): the method's steps,
//! AUTH challenges and answers, the failed-login limits asked before any proof is judged.

use std::sync::Arc;

use bytes::Bytes;
use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::refuse::connack_failure;
use super::wait::Exchange;
use super::{next_packet, EnhancedAuth};
use crate::auth::{self, AuthStep, StepInput};
use crate::broker::Broker;
use crate::codec::{Auth, AuthProperties, Connect, Packet, ProtocolVersion, ReasonCode};
use crate::connection::admission::{self, client_max_packet, Refusal};
use crate::connection::io::Io;

/// Runs the enhanced authentication exchange: CONNECT → (AUTH 0x18 ⇄ AUTH 0x18)* → verdict,
/// all before the handshake's `deadline`. `Ok` carries the Authentication Data for CONNACK
/// and the user the method authenticated, if it names one; `Err(None)` means the client left
/// or the deadline passed.
pub(super) async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Arc<Broker>,
    shutdown: &CancellationToken,
    connect: &Connect,
    client_id: &ByteString,
    auth: &EnhancedAuth,
    exchange: Exchange<'_>,
) -> Result<(Option<Bytes>, Option<String>), Option<Refusal>> {
    let Exchange {
        slot,
        deadline,
        source,
    } = exchange;
    let client_max = client_max_packet(connect);
    // The user the exchange claims, once the method has read it: asked of the failed-login
    // limits before any proof is judged, and charged with a failure (issue 35).
    let mut limit = auth::login::ExchangeLimit::new(broker.logins(), source);
    let mut step = auth::run_step(
        Arc::clone(&auth.authenticator),
        StepInput::Start(client_id.to_string()),
        connect.properties.authentication_data.clone(),
    )
    .await;
    loop {
        let state = match step {
            AuthStep::Success(data) => return Ok((data, None)),
            AuthStep::Authenticated { data, user } => {
                limit.succeeded(&user);
                return Ok((data, Some(user)));
            }
            AuthStep::Fail(code) => {
                limit.failed();
                return Err(Some((connack_failure(code), "authentication failed")));
            }
            AuthStep::Continue { data, state } => {
                // Refused unchecked as a password would be (0x9F), before the challenge.
                if limit
                    .claim(|| auth.authenticator.claimed_user(&state))
                    .is_err()
                {
                    let why = "too many failed logins; try again later";
                    return Err(Some((ReasonCode::CONNECTION_RATE_EXCEEDED, why)));
                }
                let challenge = Auth {
                    reason_code: ReasonCode::CONTINUE_AUTHENTICATION, // MQTT-4.12.0-2
                    properties: AuthProperties {
                        authentication_method: Some(auth.method.clone()),
                        authentication_data: data,
                        ..Default::default()
                    },
                };
                io.queue_within(&Packet::Auth(challenge), ProtocolVersion::V5, client_max);
                match tokio::time::timeout_at(deadline, io.flush()).await {
                    Ok(Ok(())) => {}
                    _ => return Err(None),
                }
                state
            }
        };
        let answer = match next_packet(io, broker, shutdown, slot, deadline).await {
            Ok(Some(p)) => p,
            Ok(None) => return Err(None),
            Err(refusal) => return Err(Some(refusal)),
        };
        let data = match admission::auth_answer(answer, &auth.method) {
            Ok(Some(data)) => data,
            Ok(None) => return Err(None),
            Err(refusal) => return Err(Some(refusal)),
        };
        step = auth::run_step(
            Arc::clone(&auth.authenticator),
            StepInput::Continue(state),
            data,
        )
        .await;
    }
}
