//! Topic name and topic filter rules (spec §4.7), shared by the decoder and the broker, and
//! the control characters MQTT asks strings not to carry (5.0 §1.5.4, 3.1.1 §1.5.3).
//! Which topics a filter matches is the `matching` submodule.

pub(crate) mod matching;

/// Why a topic name may not be published to.
pub fn topic_name_error(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        return Some("empty topic name"); // MQTT-4.7.3-1
    }
    if topic.len() > u16::MAX as usize {
        return Some("topic name too long");
    }
    if topic.bytes().any(|b| b == b'+' || b == b'#') {
        return Some("wildcard in topic name"); // MQTT-3.3.2-2
    }
    if topic.contains('\0') {
        return Some("null character in topic name"); // MQTT-4.7.3-2
    }
    None
}

/// True for a topic under `$SYS` (`$SYS` itself or `$SYS/...`): the broker's own statistics,
/// which only the broker publishes (Mosquitto's rule too). One byte compare for every other
/// topic, so it can sit on the PUBLISH path.
pub fn is_sys(topic: &str) -> bool {
    let bytes = topic.as_bytes();
    bytes.first() == Some(&b'$')
        && bytes.starts_with(b"$SYS")
        && (bytes.len() == 4 || bytes[4] == b'/')
}

/// True if `topic` (a name or a filter) is longer than `max_len` bytes or has more than
/// `max_levels` levels: the broker's own limits (`mqtt.max_topic_length`, `max_topic_levels`),
/// not the spec's. One pass over the bytes, only when the length alone does not decide.
pub fn exceeds_limits(topic: &str, max_len: usize, max_levels: usize) -> bool {
    if topic.len() > max_len {
        return true;
    }
    // `n` bytes hold at most `n + 1` levels (all empty): topics shorter than the level limit
    // need no count at all.
    topic.len() >= max_levels && topic.bytes().filter(|&b| b == b'/').count() >= max_levels
}

/// True if `filter` is a syntactically valid topic filter (MQTT-4.7.1-1, -2, -3; MQTT-4.7.3-1).
///
/// `#` must be alone in the last level; `+` must occupy a whole level. `$share/` prefixes are
/// checked by [`split_shared`], not here.
pub fn is_valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.len() > u16::MAX as usize || filter.contains('\0') {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        if level.contains('#') && (level != "#" || !last) {
            return false;
        }
        if level.contains('+') && level != "+" {
            return false;
        }
    }
    true
}

/// True if the filter contains `+` or `#`.
pub fn has_wildcards(filter: &str) -> bool {
    filter.bytes().any(|b| b == b'+' || b == b'#')
}

/// True if `filter` has no filter characters at all: empty (MQTT-4.7.3-1 "All Topic Names and
/// Topic Filters MUST be at least one character long"), or a `$share/{group}` prefix with
/// nothing after it, slash or not (MQTT-4.8.2-2: the `ShareName` "MUST be followed by a "/"
/// character. This "/" character MUST be followed by a Topic Filter").
///
/// Such a filter is not a filter the Server could refuse (SUBACK 0x8F is for one "correctly
/// formed but not allowed"): the decoder refuses the packet as malformed. Other invalid
/// filters (`a/#/b`, `$share//a`) are checked per filter by [`is_valid_filter`] and
/// [`split_shared`], so only their entry fails.
pub fn is_empty_filter(filter: &str) -> bool {
    match filter.strip_prefix("$share/") {
        None => filter.is_empty(),
        Some(rest) => rest
            .split_once('/')
            .is_none_or(|(_, inner)| inner.is_empty()),
    }
}

/// True if `s` contains a code point MQTT says strings SHOULD NOT carry and lets a receiver
/// treat as malformed (5.0 §1.5.4, 3.1.1 §1.5.3): a control character, U+0000..U+001F or
/// U+007F..U+009F (the Unicode `Cc` category, [`char::is_control`]), or a non-character,
/// U+FDD0..U+FDEF or the last two code points of any plane (U+FFFE, U+FFFF, U+1FFFE, ...).
/// Mosquitto refuses both in every string; U+0000 is always malformed (MQTT-1.5.4-2).
///
/// Works on bytes: in well-formed UTF-8 (which `&str` is) U+0080..U+009F are exactly the
/// sequences 0xC2 0x80..=0x9F, U+FDD0..U+FDEF 0xEF 0xB7 0x90..=0xAF, U+FFFE/U+FFFF 0xEF 0xBF
/// 0xBE/0xBF, and U+nFFFE/U+nFFFF four bytes whose second ends in 0xF, then 0xBF, 0xBE/0xBF;
/// a lead byte is never a continuation byte, so no decoding is needed.
pub fn has_disallowed_code_points(s: &str) -> bool {
    let bytes = s.as_bytes();
    bytes.iter().enumerate().any(|(i, &b)| match b {
        0x00..=0x1F | 0x7F => true,
        0xC2 => bytes.get(i + 1).is_some_and(|next| *next <= 0x9F),
        0xEF => matches!(
            bytes.get(i + 1..i + 3),
            Some([0xB7, 0x90..=0xAF] | [0xBF, 0xBE | 0xBF])
        ),
        0xF0..=0xF4 => matches!(
            bytes.get(i + 1..i + 4),
            Some([second, 0xBF, 0xBE | 0xBF]) if second & 0x0F == 0x0F
        ),
        _ => false,
    })
}

/// Splits `$share/{group}/{filter}` into `(group, filter)`.
///
/// Returns `None` for an ordinary filter and `Some(Err(()))` for a malformed share
/// (empty group, wildcard in the group, or no filter; MQTT-4.8.2-1, -2).
#[allow(clippy::result_unit_err)]
pub fn split_shared(filter: &str) -> Option<Result<(&str, &str), ()>> {
    let rest = filter.strip_prefix("$share/")?;
    let Some((group, inner)) = rest.split_once('/') else {
        return Some(Err(()));
    };
    if group.is_empty() || has_wildcards(group) || inner.is_empty() || !is_valid_filter(inner) {
        return Some(Err(()));
    }
    Some(Ok((group, inner)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_limits_count_bytes_and_levels() {
        assert!(!exceeds_limits("a/b/c", 5, 3));
        assert!(exceeds_limits("a/b/c", 4, 3), "5 bytes over a length of 4");
        assert!(exceeds_limits("a/b/c/d", 100, 3), "4 levels over 3");
        assert!(
            !exceeds_limits("a/b/c/", 100, 4),
            "an empty last level counts: 4"
        );
        assert!(exceeds_limits("////", 100, 4), "5 empty levels");
        assert!(!exceeds_limits("abcdefgh", 100, 1));
    }

    #[test]
    fn sys_topics_are_recognised() {
        for sys in ["$SYS", "$SYS/broker/uptime", "$SYS/"] {
            assert!(is_sys(sys), "{sys}");
        }
        for other in ["$SYSTEM/x", "$sys/x", "a/$SYS", "", "$", "SYS/x"] {
            assert!(!is_sys(other), "{other}");
        }
    }

    #[test]
    fn filters_follow_section_4_7() {
        for ok in [
            "#",
            "+",
            "a/#",
            "a/+/b",
            "+/+",
            "/",
            "a//b",
            "$SYS/#",
            "sport/tennis/+",
        ] {
            assert!(is_valid_filter(ok), "{ok}");
        }
        for bad in ["", "a#", "a/#/b", "a+", "a/b+/c", "#/a", "a/\0"] {
            assert!(!is_valid_filter(bad), "{bad:?}");
        }
    }

    #[test]
    fn topic_names_reject_wildcards() {
        assert!(topic_name_error("a/b").is_none());
        assert!(topic_name_error("a/+").is_some());
        assert!(topic_name_error("#").is_some());
        assert!(topic_name_error("").is_some());
    }

    #[test]
    fn empty_filters_mqtt_4_7_3_1_and_4_8_2_2() {
        for empty in ["", "$share/", "$share/g", "$share/g/", "$share//"] {
            assert!(is_empty_filter(empty), "{empty:?}");
        }
        for not_empty in [
            "a",
            "/",
            "$share/g//",
            "$share/g/a",
            "$share//a",
            "$share",
            "$shar/",
        ] {
            assert!(!is_empty_filter(not_empty), "{not_empty:?}");
        }
    }

    /// The byte scan agrees with the definition (5.0 §1.5.4: `char::is_control`, and the
    /// non-characters U+FDD0..U+FDEF and U+nFFFE/U+nFFFF) on every Unicode scalar value, alone
    /// and between other characters.
    #[test]
    fn disallowed_code_points_match_their_definition() {
        let disallowed = |c: char| {
            let n = u32::from(c);
            c.is_control() || (0xFDD0..=0xFDEF).contains(&n) || n & 0xFFFE == 0xFFFE
        };
        for c in (0..=0x10_FFFFu32).filter_map(char::from_u32) {
            for s in [c.to_string(), format!("a{c}"), format!("{c}\u{A0}b")] {
                assert_eq!(has_disallowed_code_points(&s), disallowed(c), "{s:?}");
            }
        }
        assert!(!has_disallowed_code_points(""));
        assert!(!has_disallowed_code_points("\u{C2}\u{A0}")); // Â and NBSP: 0xC3 0x82 0xC2 0xA0
        assert!(!has_disallowed_code_points("\u{EF}\u{BF}\u{BE}")); // ï ¿ ¾: no lead 0xEF
    }

    #[test]
    fn shared_filters_split() {
        assert_eq!(split_shared("a/b"), None);
        assert_eq!(split_shared("$share/g/a/+"), Some(Ok(("g", "a/+"))));
        assert_eq!(split_shared("$share//a"), Some(Err(())));
        assert_eq!(split_shared("$share/g"), Some(Err(())));
        assert_eq!(split_shared("$share/g+/a"), Some(Err(())));
    }
}
