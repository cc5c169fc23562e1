//! Topic filter matching as plain string functions (MQTT 3.1.1 and 5.0 §4.7): which topic
//! names a filter matches ([`matches`]), whether one filter matches every topic another does
//! ([`covers`]), and whether two filters share a topic ([`intersects`]).
//!
//! Why one module: these rules must say the same thing wherever they are asked (a bridge's
//! rule, a cluster replay, a schema selection, a JWT claim, the admin API); four hand-written
//! copies had drifted in small ways (issue 36). The subscription trie
//! (the broker's `topic_tree::TopicTree`) stays the routing path and the reference the
//! property test in `broker::tests` checks these functions against; the ACL's tries walk their
//! own nodes. Why in the codec: it is the leaf every layer may import, and the filter syntax
//! ([`super::is_valid_filter`]) already lives here.
//!
//! The rules, from the specification:
//! - `/` separates levels; a level may be empty, and levels compare byte for byte (§4.7.1.1).
//! - `#` matches the parent level and any number of child levels; it is alone in the last
//!   level (MQTT-4.7.1-2 in 3.1.1, MQTT-4.7.1-1 in 5.0). `sport/#` matches `sport`.
//! - `+` matches exactly one level, possibly empty, and occupies a whole level (MQTT-4.7.1-3 in
//!   3.1.1, MQTT-4.7.1-2 in 5.0). `sport/+` matches `sport/` but not `sport`.
//! - Wildcards never appear in topic names (MQTT-4.7.1-1 in 3.1.1, MQTT-4.7.0-1 in 5.0).
//! - A filter whose first level is a wildcard does not match a topic name beginning with `$`
//!   (MQTT-4.7.2-1): `#` does not match `$SYS/uptime`, `$SYS/#` does.
//!
//! Inputs are assumed valid (callers check filters with [`super::is_valid_filter`] when they
//! take them in); on an invalid one the answer is defined (a `+` or `#` inside a level is an
//! ordinary character) but meaningless. Nothing here allocates: levels are walked with
//! `split`, so [`matches`] can sit on a per-message path (cluster replay, schema selection).
//!
//! Must not: allocate; route (the trie does); be copied.

/// True when the topic name `topic` matches the filter `filter` (a plain filter, not a
/// `$share/` one: strip that with [`super::split_shared`] first).
///
/// Why a string walk and not the trie: callers hold a handful of filters (bridge rules, one
/// session's subscriptions, schema entries) and ask per message; building a trie would cost
/// more than the walk.
pub(crate) fn matches(filter: &str, topic: &str) -> bool {
    // MQTT-4.7.2-1: a wildcard first level never matches a `$` topic.
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut levels = topic.split('/');
    for f in filter.split('/') {
        if f == "#" {
            return true; // the parent level and any number of children
        }
        match levels.next() {
            Some(level) if f == "+" || f == level => {}
            _ => return false,
        }
    }
    levels.next().is_none()
}

/// True when `outer` matches every topic name `inner` matches (a subscription to `inner` can
/// receive nothing `outer` does not allow). Exact, not an estimate: `false` means some topic
/// matches `inner` and not `outer`.
///
/// Why it exists: a subscription granted in full needs no check per delivery (JWT
/// `subscribe` claims, `auth::principal`). A topic name is a filter without wildcards, so
/// `covers(f, topic)` is `matches(f, topic)`.
pub(crate) fn covers(outer: &str, inner: &str) -> bool {
    let mut o = outer.split('/');
    let mut i = inner.split('/');
    let mut first = true;
    loop {
        match (o.next(), i.next()) {
            // Same length; or `outer`'s `#` meets `inner`'s end (its parent level, never
            // at the first level: `split` yields at least one level).
            (None | Some("#"), None) => return true,
            (None, Some(_)) | (Some(_), None) => return false,
            // MQTT-4.7.2-1: `#` first does not match the `$` topics a `$` level names.
            (Some("#"), Some(il)) => return !(first && il.starts_with('$')),
            // `inner`'s `#` also matches its parent (one level shorter than `outer` needs),
            // except at the first level, where there is no parent: `+/#` covers `#`.
            (Some("+"), Some("#")) => return first && o.next() == Some("#") && o.next().is_none(),
            (Some("+"), Some(il)) => {
                if first && il.starts_with('$') {
                    return false; // MQTT-4.7.2-1
                }
            }
            (Some(ol), Some(il)) => {
                if ol != il {
                    return false; // a literal covers only itself
                }
            }
        }
        first = false;
    }
}

/// True when some topic name matches both filters (symmetric). With a topic name for `b` it
/// is `matches(a, b)`. The empty name counts as a topic (one empty level), though
/// MQTT-4.7.3-1 forbids it: `+` meets `/#` through it alone, an overestimate kept from the
/// copy this replaced (safe where it is used: a partial grant is checked per delivery).
///
/// Why it exists: a subscription may receive something under a JWT `subscribe` claim only
/// when the two meet (a partial grant, checked per delivery).
pub(crate) fn intersects(a: &str, b: &str) -> bool {
    let mut a = a.split('/');
    let mut b = b.split('/');
    let mut first = true;
    loop {
        match (a.next(), b.next()) {
            (None | Some("#"), None) | (None, Some("#")) => return true,
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(al), Some(bl)) => {
                let wild = |l: &str| l == "#" || l == "+";
                // MQTT-4.7.2-1: a wildcard first level meets no `$` level.
                if first && ((wild(al) && bl.starts_with('$')) || (wild(bl) && al.starts_with('$')))
                {
                    return false;
                }
                if al == "#" || bl == "#" {
                    return true;
                }
                if al != "+" && bl != "+" && al != bl {
                    return false;
                }
            }
        }
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of §4.7.1.2, §4.7.1.3 and §4.7.2 (3.1.1 and 5.0 alike).
    #[test]
    fn matches_the_examples_of_section_4_7() {
        for (filter, topic, expected) in [
            ("sport/tennis/player1/#", "sport/tennis/player1", true),
            (
                "sport/tennis/player1/#",
                "sport/tennis/player1/ranking",
                true,
            ),
            (
                "sport/tennis/player1/#",
                "sport/tennis/player1/score/wimbledon",
                true,
            ),
            ("sport/#", "sport", true),
            ("#", "sport/tennis", true),
            ("sport/tennis/+", "sport/tennis/player1", true),
            ("sport/tennis/+", "sport/tennis/player1/ranking", false),
            ("sport/+", "sport", false),
            ("sport/+", "sport/", true),
            ("+/+", "/finance", true),
            ("/+", "/finance", true),
            ("+", "/finance", false),
            ("+", "finance", true),
            ("#", "$SYS/monitor/Clients", false),
            ("+/monitor/Clients", "$SYS/monitor/Clients", false),
            ("$SYS/#", "$SYS/monitor/Clients", true),
            ("$SYS/#", "$SYS", true),
            ("$SYS/monitor/+", "$SYS/monitor/Clients", true),
            ("+", "$SYS", false),
            ("#", "$", false),
            ("a/+/c", "a/b/c", true),
            ("a/+", "a/b/c", false),
            ("a/b", "a", false),
            ("a/b", "a/b/", false),
            ("ACCOUNTS", "Accounts", false),
        ] {
            assert_eq!(
                matches(filter, topic),
                expected,
                "matches({filter}, {topic})"
            );
            assert_eq!(covers(filter, topic), expected, "covers({filter}, {topic})");
            assert_eq!(intersects(filter, topic), expected, "{filter} ∩ {topic}");
            assert_eq!(intersects(topic, filter), expected, "{topic} ∩ {filter}");
        }
    }

    #[test]
    fn covers_and_intersects_between_filters() {
        for (outer, inner, cov, int) in [
            ("a/#", "a/b", true, true),
            ("a/#", "a", true, true),
            ("a/#", "a/#", true, true),
            ("a/+", "a/#", false, true),
            ("a/+", "a/b", true, true),
            ("a/+", "a/b/c", false, false),
            ("a/b", "a/+", false, true),
            ("a/b", "#", false, true),
            ("#", "$SYS/x", false, false),
            ("+/x", "$SYS/x", false, false),
            ("$SYS/#", "#", false, false),
            ("#", "+/x", true, true),
            ("a/b", "a/c", false, false),
            ("a/b", "a/b", true, true),
            ("sensors/s1/#", "sensors/+/t", false, true),
            ("+/+/#", "+/#", false, true),
            ("a/+/#", "a/#", false, true),
            ("+", "#", false, true),
            ("+", "/#", false, true), // through the empty name only, see `intersects`
        ] {
            assert_eq!(covers(outer, inner), cov, "covers({outer}, {inner})");
            assert_eq!(intersects(outer, inner), int, "{outer} ∩ {inner}");
            assert_eq!(intersects(inner, outer), int, "{inner} ∩ {outer}");
        }
    }

    /// `#` has no parent level at the first level, so `+/#` (one level, then anything)
    /// matches every topic `#` does; neither matches `$` topics (MQTT-4.7.2-1). The copy in
    /// `auth::principal` answered `false` here (a safe underestimate: a claim of `+/#` made
    /// a subscription to `#` a partial grant, checked per delivery, instead of a full one).
    #[test]
    fn plus_hash_covers_hash() {
        assert!(covers("+/#", "#"));
        assert!(covers("#", "+/#"));
        assert!(!covers("+/+/#", "#"), "`a` has one level");
        assert!(!covers("a/+/#", "a/#"), "`a/#` matches `a`");
        assert!(!covers("+/#", "$SYS/#"), "MQTT-4.7.2-1");
    }
}
