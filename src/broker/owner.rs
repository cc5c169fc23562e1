//! Whose session it is (issue 35, finding 2): the decision, when a CONNECT names the client
//! id of a session that exists, between resuming it, replacing it with a fresh one, and
//! refusing the client. Before, any identity with the client id resumed the session (and read
//! what was queued for its owner) or took over its connection.
//!
//! A pure function of the owner, the newcomer and `auth.session_binding`, so every case is a
//! unit test; `Broker::connect_as` applies it under the sessions lock.
//!
//! Must not: kick a connected owner for another identity.

use crate::config::SessionBinding;
use crate::storage::SessionOwner;

/// What a CONNECT may do with an existing, live session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerCheck {
    /// The same identity (or nobody can be told apart): the CONNECT's Clean Start decides.
    Resume,
    /// Another identity that may start over: the old session ends (a connected anonymous
    /// owner is taken over) and the newcomer gets a clean one, Session Present 0.
    Fresh,
    /// Another identity that may not: CONNACK 0x87, the owner's session and connection stay.
    Refuse,
}

/// Decides what `newcomer` may do with a session `owner` holds (`connected`: a connection is
/// attached to it now) under `client_id`.
///
/// - Nobody is told apart (no authentication method configured: the newcomer is `Unbound`):
///   resume.
/// - A session never bound (stored before a method was configured, or before sessions had
///   owners): nobody can prove it is theirs, so only a user whose name is the client id
///   resumes (and binds) it; anyone else gets a fresh one in its place. Resumed by whoever
///   came first, it gave an account or an anonymous client the device's queue (issue 35,
///   fifth adversarial pass).
/// - The same identity: resume.
/// - An anonymous session and an authenticated newcomer: fresh. Anonymous clients cannot be
///   told apart, so one of them could otherwise squat a device's client id forever; the
///   squatter loses a session nobody can prove was its own, and the device gets none of it.
/// - A user's session and anyone else: refused while the owner is connected (never kicked),
///   else as `binding` says.
pub(crate) fn check(
    owner: &SessionOwner,
    connected: bool,
    newcomer: &SessionOwner,
    client_id: &str,
    binding: SessionBinding,
) -> OwnerCheck {
    match (owner, newcomer) {
        (_, SessionOwner::Unbound) => OwnerCheck::Resume,
        (SessionOwner::Unbound, SessionOwner::User(user)) if **user == *client_id => {
            OwnerCheck::Resume
        }
        (SessionOwner::Unbound, _) => OwnerCheck::Fresh,
        (a, b) if a == b => OwnerCheck::Resume,
        (SessionOwner::Anonymous, SessionOwner::User(_)) => OwnerCheck::Fresh,
        _ if connected => OwnerCheck::Refuse,
        _ => match binding {
            SessionBinding::Refuse => OwnerCheck::Refuse,
            SessionBinding::Fresh => OwnerCheck::Fresh,
        },
    }
}

/// Whose share of a bounded resource a session's traffic spends: the dedup window's
/// `publisher_share` (`guarantees::Dedup::check_from`) and the dead-letter rate's per-source
/// part (`guarantees::DeadLetters::take`). Keyed by identity, not by session or client id:
/// both are free, so one user with a dozen clean sessions or client ids got a dozen shares
/// and pushed out everyone's dedup keys, or spent the whole dead-letter rate (issue 35,
/// pass 7b, P2 and P3).
///
/// - A verified user (`SessionOwner::User`): its name, whatever the session or address.
/// - Nobody verified (anonymous, or no method configured): the client's source
///   (`auth::source`: the IPv4 address, or the /64 of an IPv6 one, as every per-source bound
///   counts it; the PROXY header's address where there is one; eighth pass, Q2). Such clients cannot be told
///   apart otherwise, and the address is the one thing about them they cannot choose
///   freely; one common share for all of them would give every client of a broker without
///   authentication one tenth of the window together, and let one stranger evict the keys
///   of every other. Without an address (an in-process link, a session restored or adopted
///   before its client came back): one common key.
///
/// Never 0 (`guarantees`: the key of what counts in no share); its lowest bit is set for an
/// anonymous owner ([`is_anonymous_key`]). Hashed with a per-process
/// seed: the keys live in memory only.
pub(crate) fn share_key(owner: &SessionOwner, peer: Option<std::net::IpAddr>) -> u64 {
    use std::hash::BuildHasher as _;
    static SEED: std::sync::LazyLock<foldhash::quality::RandomState> =
        std::sync::LazyLock::new(foldhash::quality::RandomState::default);
    let key = match (owner, peer) {
        (SessionOwner::User(user), _) => SEED.hash_one((0u8, &**user)),
        (_, Some(ip)) => SEED.hash_one((1u8, crate::auth::source::source_key(ip))),
        (_, None) => SEED.hash_one(2u8),
    };
    // The lowest bit says whether the owner is anonymous ([`is_anonymous_key`]), so what is
    // charged to the key can be charged to the anonymous share too without a session lock.
    (key & !1).max(2) | u64::from(*owner == SessionOwner::Anonymous)
}

/// Whether a [`share_key`] is an anonymous client's: a dead letter it causes counts in the
/// anonymous share (issue 35, twelfth adversarial pass, U4).
pub(crate) fn is_anonymous_key(key: u64) -> bool {
    key & 1 == 1
}

/// A CONNECT refused because the client id's session belongs to another identity.
#[derive(Debug, thiserror::Error)]
#[error("the session of this client id belongs to another identity")]
pub struct NotOwner;

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> SessionOwner {
        SessionOwner::User(name.into())
    }

    /// Issue 35, pass 7b, P2/P3: a user's key is its name's, whatever the address; clients
    /// nobody verified share one per address, and none is 0 (no share).
    #[test]
    fn share_keys_are_by_identity_not_by_session() {
        let a: std::net::IpAddr = [127, 0, 0, 1].into();
        let b: std::net::IpAddr = [127, 0, 0, 2].into();
        assert_eq!(
            share_key(&user("m"), Some(a)),
            share_key(&user("m"), Some(b))
        );
        assert_eq!(share_key(&user("m"), Some(a)), share_key(&user("m"), None));
        assert_ne!(
            share_key(&user("m"), Some(a)),
            share_key(&user("s"), Some(a))
        );
        let anonymous = SessionOwner::Anonymous;
        let unbound = SessionOwner::Unbound;
        // The same address's, but marked anonymous (issue 35, twelfth pass, U4).
        assert_eq!(
            share_key(&anonymous, Some(a)),
            share_key(&unbound, Some(a)) | 1
        );
        assert!(is_anonymous_key(share_key(&anonymous, Some(a))));
        assert!(is_anonymous_key(share_key(&anonymous, None)));
        assert!(!is_anonymous_key(share_key(&unbound, Some(a))));
        assert!(!is_anonymous_key(share_key(&user("m"), Some(a))));
        assert_ne!(
            share_key(&anonymous, Some(a)),
            share_key(&anonymous, Some(b))
        );
        assert_ne!(
            share_key(&anonymous, Some(a)),
            share_key(&user("m"), Some(a))
        );
        assert_eq!(share_key(&anonymous, None), share_key(&unbound, None) | 1);
        // Eighth pass, Q2: one /64 is one source, as for every per-source bound.
        let v6 = |s: &str| Some(s.parse::<std::net::IpAddr>().expect("address"));
        assert_eq!(
            share_key(&anonymous, v6("2001:db8::1")),
            share_key(&anonymous, v6("2001:db8::ffff:2"))
        );
        assert_ne!(
            share_key(&anonymous, v6("2001:db8::1")),
            share_key(&anonymous, v6("2001:db8:0:1::1"))
        );
        for key in [share_key(&anonymous, None), share_key(&user(""), None)] {
            assert_ne!(key, 0);
        }
    }

    #[test]
    fn the_owner_and_the_unbound_resume() {
        let refuse = SessionBinding::Refuse;
        assert_eq!(
            check(&user("a"), true, &user("a"), "c", refuse),
            OwnerCheck::Resume
        );
        let anonymous = SessionOwner::Anonymous;
        assert_eq!(
            check(&anonymous, true, &anonymous, "c", refuse),
            OwnerCheck::Resume
        );
        let unbound = SessionOwner::Unbound;
        assert_eq!(
            check(&user("a"), true, &unbound, "c", refuse),
            OwnerCheck::Resume
        );
    }

    /// A session stored before any method was configured is resumed only by the user whose
    /// name is its client id; any other identity gets a fresh session, never its queue.
    #[test]
    fn an_unbound_session_is_resumed_only_by_the_user_its_client_id_names() {
        let unbound = SessionOwner::Unbound;
        for binding in [SessionBinding::Refuse, SessionBinding::Fresh] {
            assert_eq!(
                check(&unbound, false, &user("sensor1"), "sensor1", binding),
                OwnerCheck::Resume
            );
            for other in [user("mallory"), SessionOwner::Anonymous] {
                assert_eq!(
                    check(&unbound, false, &other, "sensor1", binding),
                    OwnerCheck::Fresh
                );
            }
        }
    }

    #[test]
    fn another_identity_never_gets_a_users_session() {
        for binding in [SessionBinding::Refuse, SessionBinding::Fresh] {
            for other in [user("b"), SessionOwner::Anonymous] {
                // Connected: never kicked, whatever the binding.
                assert_eq!(
                    check(&user("a"), true, &other, "c", binding),
                    OwnerCheck::Refuse
                );
                let offline = check(&user("a"), false, &other, "c", binding);
                assert_ne!(offline, OwnerCheck::Resume);
                assert_eq!(
                    offline == OwnerCheck::Fresh,
                    binding == SessionBinding::Fresh
                );
            }
        }
    }

    #[test]
    fn an_authenticated_client_replaces_an_anonymous_squatter() {
        let anonymous = SessionOwner::Anonymous;
        for connected in [false, true] {
            let verdict = check(
                &anonymous,
                connected,
                &user("a"),
                "c",
                SessionBinding::Refuse,
            );
            assert_eq!(verdict, OwnerCheck::Fresh);
        }
    }
}
