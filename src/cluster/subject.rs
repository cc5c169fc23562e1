//! MQTT topic names to NATS subjects. NATS reserves `.` (level separator), `*` and `>`
//! (wildcards) and whitespace, and a subject near 4 KB breaks the client connection
//! (`maximum control line exceeded`), so each topic level is escaped on its own: bytes outside
//! `[A-Za-z0-9_-]` become `~XX` (hex), an empty level is `~`. The mapping is one-to-one, so
//! the subject alone names the topic; topics whose subject would pass [`MAX_SUBJECT`] become
//! `~long.<hash>` (the exact topic always travels in the message itself).

use sha2::{Digest, Sha256};

/// Longest subject tail this module makes; longer ones are hashed.
pub(crate) const MAX_SUBJECT: usize = 1024;

/// The escaped form of `topic`, one subject token per topic level.
pub(crate) fn escape(topic: &str) -> String {
    let mut out = String::with_capacity(topic.len() + 8);
    for (i, level) in topic.split('/').enumerate() {
        if i > 0 {
            out.push('.');
        }
        if level.is_empty() {
            out.push('~');
            continue;
        }
        for byte in level.bytes() {
            if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
                out.push(char::from(byte));
            } else {
                out.push('~');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xF)]));
            }
        }
        if out.len() > MAX_SUBJECT {
            return hashed(topic);
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// `~long.<first 16 bytes of SHA-256, hex>`: a bounded subject for a very long topic.
fn hashed(topic: &str) -> String {
    let digest = Sha256::digest(topic.as_bytes());
    let mut out = String::from("~long.");
    for byte in &digest[..16] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xF)]));
    }
    out
}

/// The topic an escaped subject tail stands for (`None` for a hashed or malformed one).
pub(crate) fn unescape(subject: &str) -> Option<String> {
    if subject.starts_with("~long.") {
        return None;
    }
    let mut bytes = Vec::with_capacity(subject.len());
    for (i, token) in subject.split('.').enumerate() {
        if i > 0 {
            bytes.push(b'/');
        }
        if token == "~" {
            continue;
        }
        let mut rest = token.as_bytes();
        while let Some((&first, tail)) = rest.split_first() {
            if first == b'~' {
                let hex = tail.get(..2)?;
                let value = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                bytes.push(value);
                rest = &tail[2..];
            } else {
                bytes.push(first);
                rest = tail;
            }
        }
    }
    String::from_utf8(bytes).ok()
}

/// The subject filters (after the stream prefix) that cover MQTT filter `filter`: each
/// level escaped as in [`escape`], `+` as `*`, a trailing `#` as `>` plus its parent level
/// (MQTT's `a/#` matches `a` itself, NATS's `a.>` does not). The caller still checks the
/// MQTT match (wildcards at the first level do not match `$` topics, MQTT-4.7.2-1).
pub(crate) fn filter_subjects(filter: &str) -> Vec<String> {
    let levels: Vec<&str> = filter.split('/').collect();
    let mut mapped: Vec<String> = Vec::with_capacity(levels.len());
    for level in &levels {
        mapped.push(match *level {
            "+" => "*".to_owned(),
            "#" => ">".to_owned(),
            level => escape(level),
        });
    }
    let whole = mapped.join(".");
    if whole.len() > MAX_SUBJECT {
        return vec![">".to_owned()];
    }
    if levels.len() > 1 && levels.last() == Some(&"#") {
        let parent = mapped[..mapped.len() - 1].join(".");
        vec![whole, parent]
    } else {
        vec![whole]
    }
}

/// A KV key for `topic` (`[-/_=.A-Za-z0-9]` only): the escaped subject with `~` as `=`.
pub fn key(topic: &str) -> String {
    escape(topic).replace('~', "=")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_escaped_one_by_one_and_come_back() {
        for topic in [
            "a/b/c",
            "sensors/room 1/temp",
            "/leading",
            "trailing/",
            "a//b",
            "$SYS/broker",
            "spBv1.0/plant1",
            "wild*card/>",
            "ünïcode/ß",
            "",
        ] {
            let subject = escape(topic);
            assert!(
                subject
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-~.".contains(&b)),
                "{subject}"
            );
            assert!(!subject.split('.').any(str::is_empty), "{subject}");
            assert_eq!(unescape(&subject).as_deref(), Some(topic), "{subject}");
        }
        assert_eq!(escape("a/b c/d.e"), "a.b~20c.d~2Ee");
        assert_eq!(escape("a//b"), "a.~.b");
    }

    #[test]
    fn a_very_long_topic_gets_a_bounded_subject() {
        let topic = "x/".repeat(2000);
        let subject = escape(&topic);
        assert!(
            subject.starts_with("~long.") && subject.len() < 64,
            "{subject}"
        );
        assert_eq!(unescape(&subject), None);
    }

    #[test]
    fn filters_map_onto_subject_wildcards() {
        assert_eq!(filter_subjects("a/+/c"), ["a.*.c"]);
        assert_eq!(filter_subjects("a/b c/#"), ["a.b~20c.>", "a.b~20c"]);
        assert_eq!(filter_subjects("#"), [">"]);
        assert_eq!(filter_subjects("a//b"), ["a.~.b"]);
    }

    #[test]
    fn keys_use_only_what_kv_allows() {
        let key = key("a b/$c//");
        assert!(key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b)));
        assert!(!key.starts_with('.') && !key.ends_with('.'));
    }
}
