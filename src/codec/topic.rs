//! Topic name and topic filter rules (spec §4.7), shared by the decoder and the broker.

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
    fn shared_filters_split() {
        assert_eq!(split_shared("a/b"), None);
        assert_eq!(split_shared("$share/g/a/+"), Some(Ok(("g", "a/+"))));
        assert_eq!(split_shared("$share//a"), Some(Err(())));
        assert_eq!(split_shared("$share/g"), Some(Err(())));
        assert_eq!(split_shared("$share/g+/a"), Some(Err(())));
    }
}
