//! CONNECT → CONNACK: the I/O of the handshake (reading CONNECT, the AUTH exchange, the
//! CONNACK or refusal, the lingering close) and the session attach; the rules it applies are
//! `connection::admission`'s. Its deadline and its reads that wait for the client are in
//! `wait`, the enhanced authentication exchange in `enhanced`, the refusing CONNACKs in
//! `refuse`.
//!
//! Must not: decide who is refused (asks `connection::admission`).

mod cluster_claim;
mod enhanced;
mod refuse;
mod wait;

use std::sync::Arc;

use bytestring::ByteString;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::admission::{self, client_max_packet, Answer, Policy, Refusal};
use super::io::Io;
use crate::auth::{self, password, Authenticator};
use crate::broker::{Attached, Broker, SessionRequest};
use crate::codec::{self, Connect, Packet, ProtocolVersion, ReasonCode};
use crate::connection::slots::{ConnectedSlot, HandshakeSlot};
use crate::connection::ConnectionInfo;
use crate::storage::SessionOwner;
use enhanced::authenticate;
use refuse::{full_refusal, reject, reject_undecodable};
use tokio::time::Instant;
use wait::{connect_deadline, connect_timed_out, read_more, while_connected, Exchange, ReadMore};

/// A client that passed the handshake.
pub(super) struct Accepted {
    pub connect: Box<Connect>,
    pub attached: Attached,
    /// Keep-alive in force (may be lowered by the broker's maximum).
    pub keep_alive: u16,
    /// The enhanced authentication method the client used, kept for re-authentication.
    pub auth: Option<EnhancedAuth>,
    /// When the token the client logged in with expires (JWT `exp` + leeway): the connection
    /// is closed then.
    pub credentials_expire: Option<std::time::SystemTime>,
    /// The JWT the client logged in with and the key generation it was verified under: it is
    /// verified again when the keys are reloaded, and the connection closed if it no longer
    /// passes.
    pub token: Option<(Box<str>, u64)>,
    /// No configured method authenticated the client: its session expiry stays capped at
    /// `mqtt.max_session_expiry_anonymous`, also when DISCONNECT asks for more.
    pub unauthenticated: bool,
    /// The anonymous share of the budget had no room for the session this v5 client asked to
    /// keep: CONNACK said Session Expiry Interval 0, and a DISCONNECT asking for more is not
    /// heeded either.
    pub not_kept: bool,
    /// The session's owner is `SessionOwner::Anonymous` (a method tells identities apart and
    /// none named this client): its partly received packets count in the anonymous share
    /// (`partial::HeldClass::Anonymous`).
    pub anonymous: bool,
    /// The will's bytes, counted while the connection holds the will (see `flow::HeldWill`;
    /// every will, delayed or not: issue 35, twelfth pass, U7).
    pub will_held: Option<crate::broker::flow::HeldWill>,
}

/// The enhanced authentication method of a connection (MQTT 5 §4.12).
pub(super) struct EnhancedAuth {
    /// The Authentication Method property, which every later AUTH must repeat (MQTT-4.12.0-5).
    pub method: ByteString,
    /// The method's implementation.
    pub authenticator: Arc<dyn Authenticator>,
    /// The user the exchange authenticated, for a method that names one (SCRAM): a
    /// re-authentication must prove the same user (`client::reauth`).
    pub user: Option<Box<str>>,
}

/// Reads CONNECT, validates it, attaches the session and queues CONNACK. `None` when the
/// client was rejected (the rejection CONNACK is flushed) or vanished. `info` is what the
/// transport knows of the connection (for authentication to use later).
///
/// `slot` is the connection's place in its listener: it takes a pending slot the first time
/// the handshake has to wait for the client (none free: the connection is closed at once,
/// see [`read_more`]), and becomes the returned connected slot just before the session is
/// attached, or the CONNECT is refused ([`full_refusal`]) when a connection bound is reached.
///
/// The whole handshake, enhanced-authentication exchanges included, must be done within
/// `mqtt.connect_timeout` of the listener accepting the socket: the one deadline of a
/// connection that is not connected yet, whether it sends nothing, a CONNECT slowly, or
/// answers AUTH challenges slowly.
pub(super) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Arc<Broker>,
    shutdown: &CancellationToken,
    info: &ConnectionInfo,
    mut slot: HandshakeSlot,
) -> Option<(Accepted, ConnectedSlot)> {
    let peer = info.peer;
    // A CONNECT is bounded by `mqtt.max_connect_size` too: a connection nobody has
    // authenticated holds at most that much while it arrives (issue 35, sixth pass).
    let mut rules = super::decode_rules(broker.config());
    rules.max_packet_size = rules
        .max_packet_size
        .min(broker.config().max_connect_size as usize);
    let deadline = connect_deadline(broker, &slot);
    // What CONNECTs not verified yet may hold together (`connection::partial`): as much as
    // the anonymous share, and room for four of `mqtt.max_connect_size` under a small budget.
    let share = crate::broker::flow::anonymous_share(&broker.flow().memory)
        .max(4 * u64::from(broker.config().max_connect_size));
    // ... and one address's part of it (twenty-fifth pass, K3).
    let source = crate::connection::slots::source_key(peer.ip());
    let unverified_class =
        super::partial::before_connect(source, share, broker.config().max_connect_size);
    let connect = loop {
        // Read before decoding: a failed decode may already have consumed the bytes.
        let sniffed = codec::peek_connect_version(&io.rbuf);
        match codec::decode_with(&mut io.rbuf, None, rules) {
            Ok(Some(Packet::Connect(connect))) => break connect,
            Ok(Some(other)) => {
                // The decoder rejects these already; belt and braces (MQTT-3.1.0-1).
                tracing::debug!(%peer, packet = other.name(), "first packet is not CONNECT");
                return None;
            }
            Ok(None) => {
                // Counted in `postbox_partial_packet_bytes` while it arrives, but not in the
                // memory budget that pauses publishers (`partial::budgeted_partial_bytes`); its
                // deadline is this handshake's.
                let now = std::time::Instant::now();
                let check = io.check_partial_before_connect(now, unverified_class, broker.config());
                if check == super::partial::PartialCheck::OverShare {
                    broker
                        .metrics
                        .connections_refused_connect_bytes
                        .increment(1);
                    tracing::info!(%peer, listener = %info.listener, "refusing a CONNECT while it arrives: the CONNECTs not verified yet hold their share of the memory budget (or its address's part), and this one is large");
                    // Answered where its version is in (always, past the allowance): a
                    // client is told 0x97 (3.x: 3 Server unavailable) rather than reset, so
                    // it can tell a limit from a network fault (twenty-fifth pass, K3).
                    if let Some(version) = sniffed {
                        let code = ReasonCode::QUOTA_EXCEEDED;
                        return reject(io, &broker.metrics, version, code, None).await;
                    }
                    return None;
                }
            }
            Err(error) => {
                broker.metrics.malformed_packets.increment(1);
                tracing::info!(%peer, %error, "rejecting CONNECT");
                reject_undecodable(io, &broker.metrics, &error, sniffed).await;
                return None;
            }
        }
        let most = wait::packet_still_needs(&io.rbuf);
        match read_more(io, (&mut slot, most), deadline, shutdown).await {
            ReadMore::Data => {}
            ReadMore::Gone => return None,
            ReadMore::TimedOut => {
                connect_timed_out(broker, info, io.rbuf.len());
                return None;
            }
            ReadMore::Refused(refused) => {
                tracing::debug!(%peer, listener = %info.listener, ?refused, "closing: no pending slot for a handshake that waits");
                return None;
            }
        }
    };

    let version = connect.protocol;
    let mut connect = connect;
    // What the decoded CONNECT holds may be far more than its wire bytes (a User Property is
    // a 64-byte pair in memory, 4 bytes on the wire): bounded like its wire size, since the
    // connection keeps its will for its life (issue 35, ninth adversarial pass, R3) and the
    // whole of it while the login verdict is due (twenty-fourth pass, J1: 64 CONNECTs of
    // tiny User Properties from one address held 210 MB).
    if connect.held_bytes() > broker.config().max_connect_size as usize {
        let why = "the CONNECT holds more than mqtt.max_connect_size";
        let code = ReasonCode::PACKET_TOO_LARGE;
        let brief = connect.brief();
        drop(connect);
        return reject(io, &broker.metrics, version, code, Some((why, &brief))).await;
    }
    // Counted with the CONNECTs still arriving until this handshake ends: a CONNECT waiting
    // for a password hash or a token check is held as long as that takes, and so is what
    // the client sent behind it (read with it, or while the verdict is due).
    io.forget_partial();
    let connect_bytes = connect.held_bytes();
    let mut unverified = super::held::HeldBytes::new(unverified_class);
    if unverified.set(connect_bytes + io.rbuf.len()).is_err() {
        broker
            .metrics
            .connections_refused_connect_bytes
            .increment(1);
        let why = "the CONNECTs not verified yet hold their share of the memory budget";
        let code = ReasonCode::QUOTA_EXCEEDED;
        let brief = connect.brief();
        drop((connect, unverified));
        return reject(io, &broker.metrics, version, code, Some((why, &brief))).await;
    }
    let logins = broker.logins();
    // Authenticated already (a verified certificate, a token): the password file is not asked.
    let mut authenticated = false;
    let mut credentials_expire = None;
    if let Some(tls) = info.tls.as_deref().filter(|tls| tls.identity_as_username) {
        // `tls.use_identity_as_username` (Mosquitto's): the certificate names the user, the
        // CONNECT's user name is ignored; without a certificate the client is not
        // authorized (0x87, 3.1.1: 0x05). MQTT 5.0 §5.4.9 / 3.1.1 §5.4.9: a TLS client
        // certificate may serve to authenticate the client.
        match &tls.identity {
            Some(identity) => connect.username = Some(ByteString::from(&**identity)),
            None => {
                let why = "no client certificate to take the user name from";
                let code = ReasonCode::NOT_AUTHORIZED;
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            }
        }
        tracing::info!(%peer, username = connect.username.as_deref().unwrap_or(""), "user name from the TLS certificate");
        authenticated = true;
    }
    let policy = Policy {
        config: broker.config(),
        allow_anonymous: logins.map_or(broker.allow_anonymous(), |l| {
            l.anonymous_allowed(&info.listener)
        }),
        password_file: logins.is_some_and(|l| l.passwords().is_some()),
        jwt: logins.is_some_and(|l| l.jwt().is_some()),
        certified: authenticated,
        authenticators: broker.authenticators(),
    };
    let mut admitted = match admission::admit(&connect, &policy) {
        Ok(admitted) => admitted,
        Err((code, why)) => {
            if (code, why) == admission::ANONYMOUS_REFUSED {
                if let Some(logins) = logins {
                    logins.metrics().anonymous.increment(1);
                }
                tracing::info!(%peer, listener = %info.listener, client = %connect.client_id, "refusing CONNECT: anonymous access is not allowed");
            }
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
    };
    // A JWT as password (`[auth.jwt]`): its claim is the user name from here on, and the
    // password file is not asked. A password that is not shaped like a token goes on to it.
    // Its `publish` / `subscribe` claims narrow what the client may do (with the identity).
    let mut claims = None;
    let mut token = None;
    if let (Some(jwt), Some(password), None, false) = (
        logins.and_then(|l| l.jwt()),
        connect.password.as_deref(),
        &admitted.auth_method,
        authenticated,
    ) {
        if auth::jwt::looks_like_jwt(password) {
            let generation = jwt.generation();
            let verdict = std::str::from_utf8(password)
                .map_err(|_| auth::jwt::JwtError::NotAToken)
                .and_then(|token| jwt.verify(token));
            if let Ok(ok) = &verdict {
                credentials_expire = jwt.valid_until(ok);
                // The generation before the check: a reload during it makes a second check.
                token = std::str::from_utf8(password)
                    .ok()
                    .map(|t| (Box::from(t), generation));
            }
            let refusal = match verdict {
                Ok(ok) => match connect.username.as_deref() {
                    Some(user) if user != ok.username => Some("user name does not match the token"),
                    _ => {
                        connect.username = Some(ok.username.as_str().into());
                        claims = auth::principal::TopicClaims::new(ok.publish, ok.subscribe);
                        None
                    }
                },
                Err(error) => {
                    tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, %error, "authentication failed: JWT");
                    Some("bad user name or password")
                }
            };
            if let Some(why) = refusal {
                if let Some(logins) = logins {
                    logins.metrics().jwt_refused.increment(1);
                }
                let code = ReasonCode::BAD_USER_NAME_OR_PASSWORD;
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            }
            authenticated = true;
        }
    }
    // Fail closed (issue 35, finding 1): where a method that verifies credentials is
    // configured (a password file, JWT, an enhanced method such as SCRAM), credentials none
    // of them will verify are refused, not taken for anonymous access: a password that is not
    // a token goes to the password file, which needs a user name to check it by. Before,
    // with `[auth.jwt]` alone any password that did not look like a token was admitted, one
    // without a user name passed as anonymous next to a password file, and (the auth matrix)
    // where anonymous access is on, a bare user name next to JWT or SCRAM was admitted as
    // that user, with its ACL rights. Certificate identities (`use_identity_as_username` on
    // any listener) name users too: on another listener that lets anonymous clients in, a
    // bare user name would pass for a certificate's (the third adversarial pass). Only a
    // broker with no such method takes a user name unverified (Mosquitto's behaviour
    // without a password file).
    let file_will_check = policy.password_file && connect.username.is_some();
    let verifier = logins.is_some_and(auth::login::Logins::binds_sessions)
        || !broker.authenticators().is_empty();
    if verifier
        && (connect.password.is_some() || connect.username.is_some())
        && admitted.auth_method.is_none()
        && !authenticated
        && !file_will_check
    {
        tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "authentication failed: credentials no configured method checks");
        if let Some(logins) = logins {
            logins.metrics().bad_credentials.increment(1);
        }
        let code = ReasonCode::BAD_USER_NAME_OR_PASSWORD;
        let why = "bad user name or password";
        return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
    }
    // The password file, for a client that sent a user name and no enhanced authentication
    // method (that method then decides). Within the handshake's deadline, like everything.
    if let (Some(store), Some(user), None, false) = (
        logins.and_then(|l| l.passwords()),
        connect.username.as_deref(),
        &admitted.auth_method,
        authenticated,
    ) {
        let password = connect.password.as_deref().unwrap_or_default();
        // Keyed as the connection bounds are (IPv4 address, IPv6 /64; a PROXY header's client).
        // How many checks may wait for a hash is the password store's to bound (it answers
        // `Verdict::Busy` past what its workers can check in time), not the pending slots':
        // those strangers can fill with silent sockets, and a login that waited for one was
        // refused whenever they did (twenty-sixth pass, L1).
        let verify =
            tokio::time::timeout_at(deadline, store.verify(user, password, source, deadline));
        // Watching the client meanwhile: one that leaves before its hash is not hashed.
        let watch = (&mut unverified, connect_bytes);
        let Some(verdict) = while_connected(io, shutdown, watch, verify).await else {
            tracing::debug!(%peer, listener = %info.listener, "closed while its password waited to be checked");
            return None;
        };
        match verdict {
            Ok(password::Verdict::Ok) => authenticated = true,
            Ok(password::Verdict::NoTime) | Err(_) => {
                connect_timed_out(broker, info, io.rbuf.len());
                return None;
            }
            Ok(password::Verdict::Busy) => {
                // More checks wait for a hash than the workers can do before their deadlines:
                // v5 0x89 Server busy, 3.x 3 (Server unavailable), "try again later" (the
                // client's next attempt may find its password remembered, or the queue
                // shorter), instead of a close at `connect_timeout` (twenty-sixth pass, K1/L1).
                tracing::debug!(%peer, listener = %info.listener, client = %admitted.client_id, user, "refusing CONNECT unchecked: the password checks are behind");
                let code = ReasonCode::SERVER_BUSY;
                let why = "the password checks are behind; try again later";
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            }
            Ok(password::Verdict::Throttled) => {
                // Not checked (`auth::throttle`): v5 0x9F, 3.x 3 (Server unavailable), which
                // a client takes for "later", not for a wrong password.
                tracing::debug!(%peer, listener = %info.listener, client = %admitted.client_id, user, "refusing CONNECT unchecked: too many failed logins");
                let code = ReasonCode::CONNECTION_RATE_EXCEEDED;
                let why = "too many failed logins; try again later";
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            }
            Ok(verdict) => {
                tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, user, reason = verdict.reason(), "authentication failed");
                let code = ReasonCode::BAD_USER_NAME_OR_PASSWORD;
                let why = "bad user name or password";
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            }
        }
    }
    let (auth, auth_data) = match &admitted.auth_method {
        Some(method) => {
            let Some(authenticator) = broker.authenticators().get(method) else {
                // Offered when `admit` looked; gone since (tests may unregister): MQTT-4.12.0-1.
                let why = "authentication method not supported";
                let code = ReasonCode::BAD_AUTHENTICATION_METHOD;
                return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
            };
            let mut auth = EnhancedAuth {
                method: method.clone(),
                authenticator,
                user: None,
            };
            let exchange = Exchange {
                slot: &mut slot,
                deadline,
                source: crate::connection::slots::source_key(peer.ip()),
            };
            match authenticate(
                io,
                broker,
                shutdown,
                &connect,
                &admitted.client_id,
                &auth,
                exchange,
            )
            .await
            {
                Ok((data, user)) => {
                    // The method's user (SCRAM's) is the ACL identity, whatever CONNECT said.
                    if let Some(user) = user {
                        connect.username = Some(user.as_str().into());
                        auth.user = Some(user.into());
                        authenticated = true;
                    }
                    (Some(auth), data)
                }
                Err(Some((code, why))) => {
                    tracing::info!(%peer, client = %admitted.client_id, method = %auth.method, reason = %code, "authentication failed");
                    return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
                }
                Err(None) => {
                    if Instant::now() >= deadline {
                        connect_timed_out(broker, info, io.rbuf.len());
                    }
                    return None;
                }
            }
        }
        None => (None, None),
    };

    // `use_username_as_clientid` (Mosquitto's): the user name, as authenticated above, is the
    // client id; v5 clients are told in CONNACK's Assigned Client Identifier.
    if logins.is_some_and(|l| l.username_as_client_id(&info.listener)) {
        let Some(user) = connect.username.clone() else {
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "refusing CONNECT: no user name to use as the client id");
            let why = "a user name is required on this listener";
            let code = ReasonCode::NOT_AUTHORIZED;
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        };
        if let Err((code, why)) = admission::user_as_client_id(&user, broker.config()) {
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "refusing CONNECT: {why}");
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
        admitted.assigned = admitted.client_id != user || admitted.assigned;
        admitted.client_id = user;
    }
    // Whose session this CONNECT may resume (issue 35): the identity a method verified, or
    // anonymous; nobody's where no method could tell identities apart.
    let owner = match (
        logins.is_some_and(auth::login::Logins::binds_sessions),
        authenticated,
    ) {
        (false, _) => SessionOwner::Unbound,
        (true, true) => connect
            .username
            .as_deref()
            .map_or(SessionOwner::Anonymous, |user| {
                SessionOwner::User(user.into())
            }),
        (true, false) => SessionOwner::Anonymous,
    };
    // `auth.client_ids_start_with_user`: an account names only its own client ids, so none
    // can hold a session under another device's (issue 35, fourth pass). 0x85 (3.x: 2).
    if let (SessionOwner::User(user), Some(logins)) = (&owner, logins) {
        if !admitted.assigned && !logins.client_id_allowed(user, &admitted.client_id) {
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, user = %user, "refusing CONNECT: the client id does not start with the user name (auth.client_ids_start_with_user)");
            let why = "the client identifier must start with the user name";
            let code = ReasonCode::CLIENT_IDENTIFIER_NOT_VALID;
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
    }
    // With the rule on, the ids of the password file's users are theirs alone: an anonymous
    // client may not take `user` or `user:...` either (issue 35, sixth pass: a stranger on an
    // anonymous listener connected as a device's id and read and forged its `%c` topics).
    if let (SessionOwner::Anonymous, Some(logins)) = (&owner, logins) {
        if !admitted.assigned && logins.client_id_names_a_user(&admitted.client_id) {
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "refusing CONNECT: an anonymous client may not use a user's client id (auth.client_ids_start_with_user)");
            let why = "the client identifier belongs to a user";
            let code = ReasonCode::CLIENT_IDENTIFIER_NOT_VALID;
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
    }
    let client_max = client_max_packet(&connect);
    let (mut connack, keep_alive, mut expiry_interval) = match admission::answer(
        &connect,
        broker.config(),
        &admitted,
        auth_data,
    ) {
        Answer::Accept {
            connack,
            keep_alive,
            expiry_interval,
        } => (*connack, keep_alive, expiry_interval),
        Answer::Refuse {
            refusal: (code, why),
            explain,
        } => {
            let explain = explain.then_some((why, &*connect));
            return reject(io, &broker.metrics, version, code, explain).await;
        }
        Answer::CloseUnanswered => {
            // MQTT-3.1.2-24 (list: -27): nothing above the client's Maximum Packet Size
            // may be sent, and the smallest CONNACK is above it. With no way to answer,
            // close; before attaching, so neither the session nor a connection holding
            // it is touched.
            tracing::info!(%peer, client = %admitted.client_id, max = client_max, "closing: no CONNACK fits the client's Maximum Packet Size");
            return None;
        }
    };
    // A client no configured method authenticated (a password file checked no password, no
    // certificate, token or SCRAM exchange named it) keeps its session at most
    // `mqtt.max_session_expiry_anonymous` (issue 35, finding 6).
    let unauthenticated = !(authenticated || file_will_check || auth.is_some());
    if unauthenticated {
        admission::cap_unauthenticated_expiry(
            &connect,
            broker.config(),
            &mut connack,
            &mut expiry_interval,
        );
    }
    // What anonymous clients hold has an eighth of the memory budget (`flow::ANONYMOUS_SHARE`):
    // past it, a new anonymous session is not kept beyond its connection (issue 35, sixth
    // pass: one address pinned a session of a 64 KB id per CONNECT, counted nowhere). v5 is
    // told Session Expiry Interval 0 in CONNACK (the server may lower it, §3.2.2.3.2); 3.x
    // cannot be, so clean session 0 is refused with 3 (Server unavailable). A session the
    // client id already has is counted already (resumed, or replaced by this one). A will
    // with a delay may wait as long as the session, so it counts too (eighth pass, Q1): a
    // session not kept ends with its connection, and its will is published then.
    let mut not_kept = false;
    let delayed_will = connect
        .will
        .as_ref()
        .filter(|w| w.properties.will_delay_interval.is_some_and(|d| d > 0))
        .map_or(0, |w| w.held_bytes() as u64);
    if owner == SessionOwner::Anonymous
        && expiry_interval > 0
        && !crate::broker::flow::anonymous_share_has_room(
            crate::broker::flow::anonymous_session_cost(admitted.client_id.len()) + delayed_will,
            &broker.flow().memory,
        )
        && !broker.has_session(&admitted.client_id)
    {
        tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "anonymous clients are at their share of the memory budget: the session is not kept");
        if !version.is_v5() {
            let why = "anonymous clients are at their share of the memory budget";
            let code = ReasonCode::SERVER_UNAVAILABLE;
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
        expiry_interval = 0;
        connack.properties.session_expiry_interval = Some(0);
        not_kept = true;
    }
    // Every will is held from CONNECT until it is published or dropped, up to
    // `mqtt.max_connect_size`, delayed or not: an anonymous client's counts in the share, and
    // past it the CONNECT is refused (0x97 Quota exceeded, v5 §3.2.2.2; 3.x: 3 Server
    // unavailable), as a session it resumes cannot be dropped here (ninth pass, R1: 300
    // resumed sessions took 72 MB of delayed wills; twelfth pass, U7: 1,000 connections
    // with 60,000-byte wills without a delay took +260 MB, counted nowhere).
    let anonymous = owner == SessionOwner::Anonymous;
    let will_bytes = connect.will.as_ref().map_or(0, codec::LastWill::held_bytes);
    if anonymous
        && will_bytes > 0
        && !crate::broker::flow::anonymous_share_has_room(will_bytes as u64, &broker.flow().memory)
    {
        tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "anonymous clients are at their share of the memory budget: the will is refused");
        let why = "anonymous clients are at their share of the memory budget";
        let code = ReasonCode::QUOTA_EXCEEDED;
        return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
    }
    // An anonymous client's connection, and its session when that ends with the
    // connection, count in a share of their own, out of the budget: the connection what
    // its listener's kind holds idle (`slots::connection_cost`: 2 KiB on tcp, 32 KiB on
    // tls), charged from here until it is gone. Past the share the CONNECT is refused
    // (0x97 Quota exceeded, v5 §3.2.2.2; 3 Server unavailable for 3.x). Counted in the
    // budget and bounded by nothing else, 7,000 anonymous connections took the budget past
    // 100%, and password users got 0x97 (issue 35, twelfth adversarial pass, U2); charged
    // the session's 1 KiB alone, a TLS listener let in the share's worth of connections
    // holding 20-35 times the share (thirteenth pass, F2). A client id with a session has
    // its session counted already.
    let anonymous_connection = if anonymous {
        let session = if expiry_interval == 0 && !broker.has_session(&admitted.client_id) {
            crate::broker::flow::anonymous_session_cost(admitted.client_id.len())
        } else {
            0
        };
        let charge = crate::broker::flow::AnonymousConnection::charge(
            slot.connection_cost(),
            session,
            &broker.flow().memory,
        );
        let Some(charge) = charge else {
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, "anonymous clients' connections are at their share: the CONNECT is refused");
            let why = "anonymous clients' connections are at their share of the memory budget";
            let code = ReasonCode::QUOTA_EXCEEDED;
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        };
        Some(charge)
    } else {
        None
    };
    // Counted from now, not from when the connection ends: connections held open together
    // would otherwise all pass the check above (ninth pass, R1). It moves with the will: the
    // session's own count takes over when the will is deferred (`Broker::defer_will`), the
    // message's when it is published; dropped with the will (a normal DISCONNECT,
    // MQTT-3.1.2-10), so never counted twice.
    let mut will_held =
        (will_bytes > 0).then(|| crate::broker::flow::HeldWill::new(will_bytes, anonymous));
    // Only now does the connection take a connected slot (the listener's `max_connections`,
    // its source's `max_connections_per_ip`, the broker's `mqtt.max_connections`): until
    // here it held a pending one, so sockets that never get this far cannot keep finished
    // clients out. At a bound, a client taking over its own connection is still let in.
    let mut connected = match slot.promote(|| broker.is_connected(&admitted.client_id)) {
        Ok(connected) => connected,
        Err((_pending, full)) => {
            // `_pending` is held through the refusal's lingering close; the refusal is
            // counted by the slot (`postbox_connections_refused_total`).
            tracing::info!(%peer, listener = %info.listener, client = %admitted.client_id, limit = full.key(), "refusing CONNECT: connection limit reached");
            let (code, why) = full_refusal(full);
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
    };
    if let Some(charge) = anonymous_connection {
        connected.hold(charge);
    }
    // A will the token's `publish` claim denies is dropped here, not kept to be denied when
    // it is due: claims are fixed for the connection, so the answer is the same now, and a
    // will that outlives it (stored for after a restart, or in the session's record for
    // the node that adopts it when this one dies) is then checked under its owner's name
    // alone, since claims are stored nowhere. Kept, such a will was published after a
    // restart where no ACL file decides (issue 35, sixth adversarial pass, F1 JWT variant).
    if let (Some(claims), Some(will)) = (&claims, &connect.will) {
        if !claims.allow(auth::acl::Action::Write, &will.topic) {
            broker.count_denied(auth::acl::Action::Write);
            tracing::info!(%peer, client = %admitted.client_id, topic = %will.topic, "will not published: the token's publish claim denies its topic");
            connect.will = None;
            will_held = None;
        }
    }
    // Clustered: the session is claimed cluster-wide first (`cluster_claim`).
    let request = crate::broker::ClaimRequest {
        client_id: &admitted.client_id,
        clean_start: connect.clean_start,
        expiry_interval,
        will: connect.will.as_ref(),
        owner: &owner,
    };
    let claim = match cluster_claim::claim(broker, info, request, connect.username.as_deref()).await
    {
        Ok(claim) => claim,
        Err((code, why)) => {
            return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
        }
    };
    let request = SessionRequest {
        client_id: admitted.client_id,
        clean_start: connect.clean_start,
        expiry_interval,
        protocol: version,
        client_max_packet: connect.properties.maximum_packet_size.unwrap_or(0),
    };
    let client_id = request.client_id.clone();
    // Anonymous where a method tells identities apart: `%c` does not stand for its client id
    // in the ACL (`Principal::stranger`).
    let stranger = owner == SessionOwner::Anonymous;
    let Ok(mut attached) = broker.connect_as(request, owner) else {
        // The client id's session belongs to another identity (issue 35): the owner's
        // session and connection stay as they are.
        tracing::info!(%peer, listener = %info.listener, client = %client_id, username = connect.username.as_deref().unwrap_or(""), "refusing CONNECT: the client id's session belongs to another identity");
        let why = "not authorized";
        let code = ReasonCode::NOT_AUTHORIZED;
        return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
    };
    if let Err((code, why)) = cluster_claim::settle(broker, info, claim, &mut attached).await {
        return reject(io, &broker.metrics, version, code, Some((why, &connect))).await;
    }
    if connect.bridge {
        // Mosquitto's bridge flag (3.x `try_private`): its subscriptions get No Local and
        // Retain As Published (`connection::client::subscribe`). Attach cleared it.
        attached.handle.set_bridge(true);
    }
    // The one place the identity for ACL checks is set: the user name as authenticated above
    // (CONNECT's, the certificate's, the token's or the SCRAM user's) and the token's claims.
    if claims.is_some() || broker.authz().is_some() {
        let mut principal = auth::principal::Principal::new(connect.username.as_deref(), claims);
        if stranger {
            principal = principal.stranger();
        }
        broker.set_identity(attached.handle.session(), principal);
    }
    attached
        .handle
        .record_connection(crate::broker::admin::ConnectionFacts {
            peer: info.peer,
            listener: Arc::clone(&info.listener),
            protocol: version,
            connected_at_unix_ms: crate::storage::now_unix_ms(),
            user: connect.username.as_deref().map(Arc::from),
        });
    // Session Present is 0 whenever the session was started clean (MQTT-3.2.2-2). The flag
    // does not change the CONNACK's size, so the check above still holds.
    connack.session_present = attached.session_present;
    io.queue_within(&Packet::ConnAck(connack), version, client_max);
    // `postbox_clients_connected{listener,protocol}` until the slot is dropped.
    connected.count_client(match version {
        ProtocolVersion::V3_1 => 0,
        ProtocolVersion::V3_1_1 => 1,
        ProtocolVersion::V5 => 2,
    });
    // Mosquitto's "New client connected from ADDRESS as ID (p5, c1, k60, u'name')", as fields
    // so a JSON log has them as keys. The user name is not a secret (Mosquitto logs it too);
    // the password, token or SCRAM messages are never logged.
    tracing::info!(
        %peer,
        listener = %info.listener,
        client = %attached.handle.client_id(),
        protocol = version.label(),
        clean = connect.clean_start,
        keep_alive,
        username = connect.username.as_deref().unwrap_or(""),
        session_present = attached.session_present,
        bridge = connect.bridge,
        "client connected"
    );
    Some((
        Accepted {
            connect,
            attached,
            keep_alive,
            auth,
            credentials_expire,
            token,
            unauthenticated,
            not_kept,
            anonymous,
            will_held,
        },
        connected,
    ))
}

/// Reads the next packet during the handshake, before its `deadline`.
async fn next_packet<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut Io<S>,
    broker: &Broker,
    shutdown: &CancellationToken,
    slot: &mut HandshakeSlot,
    deadline: Instant,
) -> Result<Option<Packet>, Refusal> {
    let rules = super::decode_rules(broker.config());
    loop {
        match codec::decode_with(&mut io.rbuf, Some(ProtocolVersion::V5), rules) {
            Ok(Some(packet)) => return Ok(Some(packet)),
            Ok(None) => {
                io.check_partial(std::time::Instant::now(), true, None, broker.config());
            }
            Err(error) => {
                broker.metrics.malformed_packets.increment(1);
                return Err((error.reason_code(), "malformed packet"));
            }
        }
        let most = wait::packet_still_needs(&io.rbuf);
        match read_more(io, (slot, most), deadline, shutdown).await {
            ReadMore::Data => {}
            // A timeout is counted by the caller, which sees the deadline passed.
            ReadMore::Gone | ReadMore::TimedOut | ReadMore::Refused(_) => return Ok(None),
        }
    }
}
