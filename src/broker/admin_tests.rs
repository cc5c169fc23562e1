//! Unit tests of `broker::admin` (kept apart so the module stays a readable size).

use super::*;

fn facts(listener: &Arc<str>, user: Option<&str>) -> ConnectionFacts {
    ConnectionFacts {
        peer: SocketAddr::from(([127, 0, 0, 1], 40000)),
        listener: Arc::clone(listener),
        protocol: ProtocolVersion::V5,
        connected_at_unix_ms: 1,
        user: user.map(Arc::from),
    }
}

fn ids(page: &[(ByteString, ConnectionFacts)]) -> Vec<String> {
    page.iter().map(|(id, _)| id.to_string()).collect()
}

/// A search that matches few clients walks the map in steps of `SCAN_STEP` and finds the
/// matches of every step, in order, resuming after `after` (issue 37, item 5).
#[test]
fn a_search_finds_matches_across_scan_steps_and_resumes_after_the_cursor() {
    let map = ConnectionFactsMap::default();
    let a: Arc<str> = Arc::from("a");
    let total = SCAN_STEP * 2 + 10;
    for i in 0..total {
        // Every 1000th client is "needle-<i>"'s user: found by user name, not by id.
        let user = (i % 1000 == 7).then_some("Needle");
        map.insert(&ByteString::from(format!("c{i:06}")), 1, facts(&a, user));
    }
    let query = ClientQuery {
        search: Some("nEEDLE"),
        limit: 4,
        ..ClientQuery::default()
    };
    let page = map.page(&query);
    // Four and one more: more follow.
    assert_eq!(
        ids(&page),
        ["c000007", "c001007", "c002007", "c003007", "c004007"]
    );
    let next = ClientQuery {
        after: Some("c003007"),
        ..query
    };
    assert_eq!(
        ids(&map.page(&next)),
        ["c004007", "c005007", "c006007", "c007007", "c008007"]
    );
    let last = ClientQuery {
        after: Some("c007007"),
        ..query
    };
    assert_eq!(ids(&map.page(&last)), ["c008007"], "past the last step");
    let prefixed = ClientQuery {
        prefix: "c0081",
        limit: 3,
        ..ClientQuery::default()
    };
    assert_eq!(
        ids(&map.page(&prefixed)),
        ["c008100", "c008101", "c008102", "c008103"]
    );
    // An `after` before the prefix starts at the prefix.
    let before = ClientQuery {
        after: Some("b"),
        ..prefixed
    };
    assert_eq!(map.page(&before).len(), 4);
}

/// The clients counted per listener follow inserts, takeovers (the entry replaced) and
/// removals, and a stale removal (an older generation) changes nothing.
#[test]
fn listener_counts_follow_takeovers_and_removals() {
    let map = ConnectionFactsMap::default();
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    let id = ByteString::from("dev");
    map.insert(&id, 1, facts(&a, None));
    map.insert(&ByteString::from("other"), 1, facts(&a, None));
    assert_eq!((map.on_listener("a"), map.on_listener("b")), (2, 0));
    // The same client id connects again through listener b: a takeover.
    map.insert(&id, 2, facts(&b, None));
    assert_eq!((map.on_listener("a"), map.on_listener("b")), (1, 1));
    map.remove("dev", 1);
    assert_eq!(map.on_listener("b"), 1, "the old connection's detach");
    map.remove("dev", 2);
    assert_eq!((map.on_listener("a"), map.on_listener("b")), (1, 0));
    assert_eq!(map.len(), 1);
}

#[test]
fn contains_ignores_ascii_case_only() {
    assert!(contains_ignore_ascii_case("Sensor-01", "sensor-0"));
    assert!(
        !contains_ignore_ascii_case("plant/Ä-7", "ä-7"),
        "only ASCII case is ignored"
    );
    assert!(contains_ignore_ascii_case("plant/Ä-7", "Ä-7"));
    assert!(contains_ignore_ascii_case("x", ""));
    assert!(!contains_ignore_ascii_case("ab", "abc"));
}
