//! The two steps of a handshake that only a cluster has: the claim of the session
//! cluster-wide before it attaches (its connection elsewhere closed, what it held there
//! brought back), and the rebuild of that state after it attached, before the CONNACK.
//!
//! Must not: attach the session or write to the client (the handshake does, with the
//! refusal these steps return).

use std::sync::Arc;

use crate::broker::{Attached, Broker, ClaimRefused, ClaimRequest, Restore};
use crate::codec::ReasonCode;
use crate::connection::admission::Refusal;
use crate::connection::ConnectionInfo;

/// What a claim brings to the attach: the state to rebuild here, and the revision of the
/// session's record to confirm once attached. Empty where no cluster is configured.
#[derive(Default)]
pub(super) struct Claim {
    restore: Option<Restore>,
    revision: Option<u64>,
}

/// Claims the session cluster-wide when a cluster is configured. A session that must
/// outlive this connection is refused (0x88 Server unavailable) while the cluster cannot
/// claim it; a clean one carries on here alone. Another identity's session, here or on
/// another node, is refused 0x87 (issue 35).
pub(super) async fn claim(
    broker: &Arc<Broker>,
    info: &ConnectionInfo,
    request: ClaimRequest<'_>,
    username: Option<&str>,
) -> Result<Claim, Refusal> {
    let Some(cluster) = broker.cluster() else {
        return Ok(Claim::default());
    };
    let peer = info.peer;
    let (client_id, clean) = (
        request.client_id,
        request.clean_start && request.expiry_interval == 0,
    );
    match cluster.claim(broker, request).await {
        Ok(claimed) => Ok(Claim {
            restore: claimed.restore,
            revision: Some(claimed.revision),
        }),
        Err(ClaimRefused::NotOwner) => {
            tracing::info!(%peer, listener = %info.listener, client = %client_id, username = username.unwrap_or(""), "refusing CONNECT: the client id's session belongs to another identity");
            Err((ReasonCode::NOT_AUTHORIZED, "not authorized"))
        }
        Err(refused) if clean => {
            tracing::warn!(%peer, client = %client_id, %refused, "clean session accepted on this node alone");
            Ok(Claim::default())
        }
        Err(refused) => {
            tracing::info!(%peer, client = %client_id, %refused, "refusing CONNECT: the cluster cannot claim the session");
            let why = "the cluster cannot take the session now";
            Err((ReasonCode::SERVER_UNAVAILABLE, why))
        }
    }
}

/// After the attach: rebuilds the session from what the claim brought (nothing when a
/// racing CONNECT resumed it here meanwhile), then confirms the claim, which gives the
/// session up at once if another node claimed it since. Refused (0x88) when the session
/// cannot be rebuilt whole: a CONNACK with a session missing what it held would lose it.
pub(super) async fn settle(
    broker: &Arc<Broker>,
    info: &ConnectionInfo,
    claim: Claim,
    attached: &mut Attached,
) -> Result<(), Refusal> {
    let Some(cluster) = broker.cluster() else {
        return Ok(());
    };
    if let Some(restore) = claim.restore {
        let restore = if attached.session_present {
            Restore::default()
        } else {
            restore
        };
        let (session, generation) = (attached.handle.session(), attached.handle.generation());
        if !cluster.restore(broker, session, generation, restore).await {
            tracing::info!(peer = %info.peer, client = %attached.handle.client_id(), "refusing CONNECT: the session could not be rebuilt from the cluster");
            let why = "the cluster cannot rebuild the session now";
            return Err((ReasonCode::SERVER_UNAVAILABLE, why));
        }
        attached.session_present = true;
    }
    if let Some(revision) = claim.revision {
        cluster.confirm(broker, attached.handle.client_id(), revision);
    }
    Ok(())
}
