//! Who a session acts as for authorisation: its [`Principal`] (the authenticated user name and,
//! for a JWT login, the token's `publish` / `subscribe` claims), fixed per attachment.
//!
//! Why a value of its own, swapped whole: the checks on the hot path (every PUBLISH of the
//! client, every delivery to it that must be checked) read it from other tasks without the
//! session's lock (`Session::identity`, an `ArcSwapOption`); it changes only when a connection
//! attaches. The claims narrow the ACL file: a topic must be allowed by both (no ACL file:
//! by the claims alone), and a client without claims costs nothing more than the ACL.
//!
//! Must not: lock or allocate per check.

use super::acl::{Action, FilterAccess, Identity};
use super::acl_slot::AclSlot;
use crate::codec::topic::matching::{covers, intersects, matches};

/// The topic filters a JWT's `publish` / `subscribe` claims list (`None`: that claim is
/// absent, nothing is narrowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicClaims {
    publish: Option<Box<[Box<str>]>>,
    subscribe: Option<Box<[Box<str>]>>,
}

impl TopicClaims {
    /// The claims of a token; `None` when it has neither (so nothing is checked for them).
    pub fn new(publish: Option<Vec<String>>, subscribe: Option<Vec<String>>) -> Option<Self> {
        fn boxed(list: Option<Vec<String>>) -> Option<Box<[Box<str>]>> {
            list.map(|l| l.into_iter().map(String::into_boxed_str).collect())
        }
        if publish.is_none() && subscribe.is_none() {
            return None;
        }
        Some(TopicClaims {
            publish: boxed(publish),
            subscribe: boxed(subscribe),
        })
    }

    fn list(&self, action: Action) -> Option<&[Box<str>]> {
        match action {
            Action::Write => self.publish.as_deref(),
            Action::Read => self.subscribe.as_deref(),
        }
    }

    /// May the holder do `action` on the topic name `topic`? (`publish` for writes,
    /// `subscribe` for reads: a delivery on a partly granted filter is checked here too.)
    pub fn allow(&self, action: Action, topic: &str) -> bool {
        self.list(action)
            .is_none_or(|filters| filters.iter().any(|f| matches(f, topic)))
    }

    /// What a subscription to `filter` may receive under the `subscribe` claim: full when one
    /// claimed filter matches every topic it matches, partial when one matches some.
    pub fn filter_access(&self, filter: &str) -> FilterAccess {
        let Some(filters) = self.subscribe.as_deref() else {
            return FilterAccess::Full;
        };
        if filters.iter().any(|c| covers(c, filter)) {
            FilterAccess::Full
        } else if filters.iter().any(|c| intersects(c, filter)) {
            FilterAccess::Partial
        } else {
            FilterAccess::Denied
        }
    }
}

/// The identity ACL checks use for one session attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    username: Option<Box<str>>,
    claims: Option<TopicClaims>,
    /// Restored from the store before its client came back ([`Principal::restored`]).
    restored: bool,
    /// Anonymous where a method tells identities apart ([`Principal::stranger`]).
    stranger: bool,
}

impl Principal {
    /// `username` as authenticated (CONNECT, certificate, token or SCRAM), and the token's
    /// claims if any.
    pub fn new(username: Option<&str>, claims: Option<TopicClaims>) -> Principal {
        Principal {
            username: username.map(Box::from),
            claims,
            restored: false,
            stranger: false,
        }
    }

    /// This identity for a client no method authenticated, where one could have (a password
    /// file, JWT, SCRAM, certificate identities): `%c` in `pattern` rules does not stand for
    /// its client id, as `%u` does not without a user name. Its client id is whatever it
    /// chose, so with `%c` rules a stranger took a device's id and read and forged the
    /// device's topics (issue 35, sixth adversarial pass).
    #[must_use]
    pub fn stranger(mut self) -> Principal {
        self.stranger = true;
        self
    }

    /// The identity of a session the store brought back at a restart, until its client
    /// connects again: the stored owner's user name, but not a token's claims (they are not
    /// stored). Reads are let through: what is queued meanwhile is checked again as it is
    /// handed out, under the identity the client then connects with (the restored session's
    /// queue is unchecked, `SessionState::acl_checked`). Before, a restored session was
    /// anonymous for the ACL, so every message routed to it before its client came back was
    /// dropped as denied although its publisher had been acknowledged (issue 35, fifth
    /// adversarial pass). Writes (a restored will, `Broker::publish_will`) are checked
    /// against the ACL under the user name; a will the token's claims denied was dropped at
    /// CONNECT, so the claims need not be kept for it (sixth adversarial pass).
    pub fn restored(username: Option<&str>) -> Principal {
        Principal {
            username: username.map(Box::from),
            claims: None,
            restored: true,
            stranger: false,
        }
    }

    /// The user name the ACL file's `user` blocks and `%u` see.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The token's claims, if it had any.
    pub fn claims(&self) -> Option<&TopicClaims> {
        self.claims.as_ref()
    }

    /// One decision: the claims (if any) and the ACL (if any) must both allow it.
    /// No allocation, no lock.
    pub fn allow(
        &self,
        acl: Option<&AclSlot>,
        client_id: &str,
        action: Action,
        topic: &str,
    ) -> bool {
        if self.restored && action == Action::Read {
            return true;
        }
        if let Some(claims) = &self.claims {
            if !claims.allow(action, topic) {
                return false;
            }
        }
        acl.is_none_or(|acl| acl.allow(self.identity(client_id), action, topic))
    }

    /// What a subscription to `filter` may receive under both, and the ACL generation it was
    /// decided under (1 without an ACL file).
    pub fn filter_access(
        &self,
        acl: Option<&AclSlot>,
        client_id: &str,
        filter: &str,
    ) -> (FilterAccess, u32) {
        let (by_acl, generation) = match acl {
            Some(acl) => acl.filter_access(self.identity(client_id), filter),
            None => (FilterAccess::Full, 1),
        };
        let by_claims = self
            .claims
            .as_ref()
            .map_or(FilterAccess::Full, |c| c.filter_access(filter));
        let access = match (by_acl, by_claims) {
            (FilterAccess::Denied, _) | (_, FilterAccess::Denied) => FilterAccess::Denied,
            (FilterAccess::Full, FilterAccess::Full) => FilterAccess::Full,
            _ => FilterAccess::Partial,
        };
        (access, generation)
    }

    fn identity<'a>(&'a self, client_id: &'a str) -> Identity<'a> {
        Identity {
            username: self.username.as_deref(),
            // An empty id stands for no level (`acl::one_level`): `%c` matches nothing.
            client_id: if self.stranger { "" } else { client_id },
        }
    }
}

/// The identity of a session that has none recorded: anonymous, no claims.
pub(crate) static ANONYMOUS: Principal = Principal {
    username: None,
    claims: None,
    restored: false,
    stranger: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_narrow_per_action() {
        let claims = TopicClaims::new(Some(vec!["out/#".into()]), Some(vec!["in/+".into()]))
            .expect("claims");
        assert!(claims.allow(Action::Write, "out/x/y"));
        assert!(!claims.allow(Action::Write, "in/x"));
        assert!(claims.allow(Action::Read, "in/x"));
        assert!(!claims.allow(Action::Read, "in/x/y"));
        assert_eq!(claims.filter_access("in/x"), FilterAccess::Full);
        assert_eq!(claims.filter_access("in/#"), FilterAccess::Partial);
        assert_eq!(claims.filter_access("out/#"), FilterAccess::Denied);
        let publish_only = TopicClaims::new(Some(vec!["p".into()]), None).expect("claims");
        assert_eq!(publish_only.filter_access("#"), FilterAccess::Full);
        assert!(TopicClaims::new(None, None).is_none());
    }

    /// A `subscribe` claim of `+/#` matches every topic `#` does (`#` has no parent level at
    /// the first level; neither matches `$` topics, MQTT-4.7.2-1), so a subscription to `#` is
    /// a full grant. The copy of `covers` this module had said partial (issue 36: one module).
    #[test]
    fn plus_hash_claim_grants_hash_in_full() {
        let claims = TopicClaims::new(None, Some(vec!["+/#".into()])).expect("claims");
        assert_eq!(claims.filter_access("#"), FilterAccess::Full);
        assert_eq!(claims.filter_access("$SYS/#"), FilterAccess::Denied);
        assert!(claims.allow(Action::Read, "a"));
        assert!(!claims.allow(Action::Read, "$SYS/x"));
    }
}
