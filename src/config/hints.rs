//! What turns the TOML parser's and serde's messages into ones a person can act on: the
//! nearest valid key for a typo, a type named in words with the key's meaning and range (read
//! from the embedded default config's comment on that key), the name of a duplicated key.
//!
//! Why: the parser says `unknown key`, then lists every key of the table (40 for `[mqtt]`);
//! says `expected u32`; says `duplicate key` without naming it (issue 37, item 4). The
//! default config's comments already say what each key means and which values it takes, so
//! the error quotes them rather than keeping a second description that could drift.
//!
//! Must not: change which configurations are accepted (only the wording of refusals).

/// The embedded default config, whose comments describe every key.
const DEFAULT_TEXT: &str = super::EMBEDDED_DEFAULT;

/// The parser's `message` reworded for a person: `key` is the dotted key it concerns, if
/// any; `found` is the text the error's span covers, if any.
pub(super) fn reword(message: &str, key: Option<&str>, found: Option<&str>) -> String {
    let message = message.replace("unknown field", "unknown key");
    if let Some(rest) = message.strip_prefix("unknown key `") {
        return unknown_key(rest);
    }
    if message == "duplicate key" {
        if let Some(name) = found.map(str::trim).filter(|n| !n.is_empty()) {
            return format!(
                "duplicate key `{name}`: it is set (or its table opened) earlier in the file; each may appear once"
            );
        }
    }
    // serde's untagged enums drop their variants' errors; say what the one we have takes
    // (thirteenth adversarial pass: `max_memory = "64MiB"` got "data did not match any
    // variant of untagged enum MemoryLimit").
    let message = if message.starts_with("data did not match any variant of untagged enum") {
        "expected \"auto\" or a whole number of bytes".to_owned()
    } else {
        message
    };
    let message = match message.find("expected struct ") {
        Some(i) => format!("{}expected a table", &message[..i]),
        None => message,
    };
    let message = match message.rfind(", expected ") {
        Some(i) => {
            let expected = &message[i + ", expected ".len()..];
            format!("{}, expected {}", &message[..i], in_words(expected))
        }
        None => message,
    };
    match key.and_then(meaning) {
        Some(meaning) => format!("{message}. {meaning}"),
        None => message,
    }
}

/// `name`, expected one of `a`, `b`, ... -> the nearest of the candidates, or the list when
/// none is near.
fn unknown_key(rest: &str) -> String {
    let Some((name, tail)) = rest.split_once('`') else {
        return format!("unknown key `{rest}");
    };
    let candidates: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    match nearest(name, &candidates) {
        Some(near) => format!("unknown key `{name}`; did you mean `{near}`?"),
        None if candidates.is_empty() => format!("unknown key `{name}`: this table takes none"),
        None => format!("unknown key `{name}`{tail}"),
    }
}

/// The candidate closest to `name` by edit distance, when it is close enough to be the
/// intended one: at most a third of the name's length (and at least 1) away, or the only
/// one whose words are all in `name` (`max_packet` for `packet_max`).
fn nearest<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    let (best, distance) = candidates
        .iter()
        .map(|c| (*c, strsim::damerau_levenshtein(name, c)))
        .min_by_key(|(_, d)| *d)?;
    if distance <= limit {
        return Some(best);
    }
    let words = |s: &str| {
        let mut w: Vec<String> = s.split('_').map(str::to_owned).collect();
        w.sort();
        w
    };
    let same_words: Vec<&str> = candidates
        .iter()
        .copied()
        .filter(|c| words(c) == words(name))
        .collect();
    match same_words.as_slice() {
        [one] => Some(one),
        _ => None,
    }
}

/// serde's name of an expected type, in words.
fn in_words(expected: &str) -> String {
    let bound = |max: u64| format!("a whole number from 0 to {max}");
    match expected {
        "u8" => bound(u64::from(u8::MAX)),
        "u16" => bound(u64::from(u16::MAX)),
        "u32" => bound(u64::from(u32::MAX)),
        "u64" | "usize" => "a whole number from 0".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" | "bool" => "true or false".to_owned(),
        "a sequence" => "a list (`[...]`)".to_owned(),
        "a map" => "a table".to_owned(),
        other => other.to_owned(),
    }
}

/// What the default config's comment says of `key` (`mqtt.max_packet_size`,
/// `listener[0].bind`): its first sentence, and its range or default when the comment gives
/// one. `None` for a key it does not describe.
fn meaning(key: &str) -> Option<String> {
    let table = key.split(['.', '[']).next()?;
    let name = key.rsplit('.').next()?;
    let comment = comment_above(DEFAULT_TEXT, table, name)?;
    let first = comment
        .split_inclusive(". ")
        .next()
        .unwrap_or(&comment)
        .trim();
    let mut out = format!("`{name}`: {first}");
    let range = comment
        .split(". ")
        .map(str::trim)
        .find(|s| s.starts_with("Range") || s.starts_with("Default"));
    if let Some(range) = range.filter(|r| !first.contains(*r)) {
        out.push(' ');
        out.push_str(range.trim_end_matches('.'));
        out.push('.');
    }
    Some(out)
}

/// The comment lines right above `name = ...` (set or commented out) inside the `[table]` (or
/// `[[table]]`) section of `text`, joined into one paragraph.
fn comment_above(text: &str, table: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let header = |line: &str| {
        let l = line.trim_start_matches('#').trim();
        l.starts_with('[') && l.trim_matches(['[', ']']).split('.').next() == Some(table)
    };
    let start = lines.iter().position(|l| header(l))?;
    let assigns = |line: &str| {
        let l = line.trim_start_matches('#').trim_start();
        l.strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    };
    let at = lines[start + 1..]
        .iter()
        .take_while(|l| !l.starts_with('[') || header(l))
        .position(|l| assigns(l))?
        + start
        + 1;
    // Keys set together share the comment above the first of them.
    let is_assignment = |line: &str| {
        let l = line.trim_start_matches('#').trim_start();
        l.split_once('=').is_some_and(|(k, _)| {
            let k = k.trim();
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    let mut block: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .skip_while(|l| is_assignment(l))
        .take_while(|l| l.starts_with('#') && !is_assignment(l))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    block.reverse();
    let paragraph = block.join(" ");
    (!paragraph.is_empty()).then_some(paragraph)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_nearest_key_not_the_whole_list() {
        let msg = reword(
            "unknown field `max_packet_sise`, expected one of `max_connections`, `max_packet_size`, `max_qos`",
            Some("mqtt.max_packet_sise"),
            None,
        );
        assert_eq!(
            msg,
            "unknown key `max_packet_sise`; did you mean `max_packet_size`?"
        );
        let msg = reword(
            "unknown field `size_packet_max`, expected one of `max_packet_size`, `max_qos`",
            None,
            None,
        );
        assert!(msg.contains("did you mean `max_packet_size`"), "{msg}");
        let msg = reword(
            "unknown field `colour`, expected one of `max_packet_size`, `max_qos`",
            None,
            None,
        );
        assert!(msg.contains("expected one of `max_packet_size`"), "{msg}");
    }

    #[test]
    fn a_type_error_says_the_type_in_words_and_what_the_key_is() {
        let msg = reword(
            "invalid type: string \"x\", expected u32",
            Some("mqtt.max_packet_size"),
            None,
        );
        assert!(
            msg.contains("expected a whole number from 0 to 4294967295"),
            "{msg}"
        );
        assert!(
            msg.contains("Largest MQTT packet accepted from a client"),
            "{msg}"
        );
        assert!(msg.contains("Range 20..=268435460"), "{msg}");
        let msg = reword(
            "invalid type: integer `1`, expected a boolean",
            Some("mqtt.retain_available"),
            None,
        );
        assert!(msg.contains("expected true or false"), "{msg}");
        let msg = reword(
            "invalid type: string \"x\", expected u16",
            Some("listener[1].proxy_protocol_timeout_nonexistent"),
            None,
        );
        assert!(msg.ends_with("from 0 to 65535"), "{msg}");
    }

    #[test]
    fn an_untagged_enum_says_what_it_takes() {
        let msg = reword(
            "data did not match any variant of untagged enum MemoryLimit",
            Some("mqtt.max_memory"),
            None,
        );
        assert!(
            msg.starts_with("expected \"auto\" or a whole number of bytes"),
            "{msg}"
        );
        assert!(msg.contains("`max_memory`: Memory budget"), "{msg}");
    }

    #[test]
    fn a_duplicate_key_is_named() {
        assert!(reword("duplicate key", None, Some("mqtt")).starts_with("duplicate key `mqtt`"));
        assert_eq!(reword("duplicate key", None, None), "duplicate key");
    }

    /// Every key the default config sets has a comment the errors can quote.
    #[test]
    fn every_key_of_the_default_has_a_comment() {
        let doc: toml::Table = toml::from_str(DEFAULT_TEXT).expect("default parses");
        for (table, value) in &doc {
            let entries = match value {
                toml::Value::Table(t) => vec![t.clone()],
                toml::Value::Array(a) => a.iter().filter_map(|v| v.as_table().cloned()).collect(),
                _ => continue,
            };
            for entry in entries {
                for (name, value) in &entry {
                    if value.is_table() {
                        continue;
                    }
                    assert!(
                        meaning(&format!("{table}.{name}")).is_some(),
                        "{table}.{name} has no comment in config/postbox.toml"
                    );
                }
            }
        }
    }
}
