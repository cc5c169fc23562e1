//! Whose session it is (issue 35, finding 2): the decision, when a CONNECT names the client
//! id of a session that exists, between resuming it, replacing it with a fresh one, and
//! refusing the client. Before, any identity with the client id resumed the session (and read
//! what was queued for its owner) or took over its connection.
//!
//! A pure function of the owner, the newcomer and `auth.session_binding`, so every case is a
//! unit test; `Broker::connect_as` applies it under the sessions lock.

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
