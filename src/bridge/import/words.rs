//! The words of mosquitto.conf values, read as Mosquitto's `conf.c` reads them: addresses,
//! `topic` lines, strings (the rest of the line), booleans and numbers.

use crate::config::{Direction, TopicRule};

/// `host[:port]` as Mosquitto reads it (port after the last `:`, default 1883) to
/// `host:port`, IPv6 hosts in brackets.
pub(super) fn address(word: &str) -> Result<String, String> {
    let (host, port) = match word.rsplit_once(':') {
        Some((host, port)) if !word.ends_with(']') => (host, port),
        _ => (word, "1883"),
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("`{port}` is not a port (1..=65535)"))?;
    if host.is_empty() {
        return Err("no host".to_owned());
    }
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.contains(':') && !bracketed {
        Ok(format!("[{host}]:{port}"))
    } else {
        Ok(format!("{host}:{port}"))
    }
}

/// `topic pattern [[[out|in|both] qos] local_prefix remote_prefix]`; `""` is empty, a
/// pattern in double quotes may hold blanks (Mosquitto 2.1).
pub(super) fn topic(rest: &str) -> Result<(TopicRule, Vec<String>), String> {
    let words = topic_words(rest);
    let mut notes = Vec::new();
    let mut words = words.into_iter();
    let pattern = words.next().ok_or("no pattern")?;
    let direction = match words.next() {
        None => Direction::Out,
        Some(d) => match d.to_ascii_lowercase().as_str() {
            "out" => Direction::Out,
            "in" => Direction::In,
            "both" => Direction::Both,
            _ => return Err(format!("unknown direction `{d}`")),
        },
    };
    let qos = match words.next() {
        None => 0,
        Some(q) => match q.parse::<u8>() {
            Ok(q) if q <= 2 => q,
            _ => return Err(format!("QoS `{q}` is not 0, 1 or 2")),
        },
    };
    let local_prefix = words.next().unwrap_or_default();
    let remote_prefix = words.next().unwrap_or_default();
    let extra: Vec<String> = words.collect();
    if !extra.is_empty() {
        notes.push(format!(
            "words after the remote prefix ignored: {}",
            extra.join(" ")
        ));
    }
    if pattern.is_empty() && (local_prefix.is_empty() || remote_prefix.is_empty()) {
        return Err(
            "an empty pattern needs both a local and a remote prefix (Mosquitto refuses it too)"
                .to_owned(),
        );
    }
    Ok((
        TopicRule {
            pattern,
            direction,
            qos,
            local_prefix,
            remote_prefix,
        },
        notes,
    ))
}

/// The words of a `topic` line: blank-separated, `""` an empty word, `"a b"` one word.
fn topic_words(rest: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let Some(&first) = chars.peek() else {
            return words;
        };
        let mut word = String::new();
        if first == '"' {
            chars.next();
            for c in chars.by_ref() {
                if c == '"' {
                    break;
                }
                word.push(c);
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ' ' && *c != '\t') {
                word.push(c);
            }
        }
        words.push(word);
    }
}

/// A string option: the rest of the line (Mosquitto keeps inner and trailing blanks).
pub(super) fn string(rest: &str) -> Result<String, String> {
    if rest.is_empty() {
        return Err("no value".to_owned());
    }
    Ok(rest.to_owned())
}

/// `true` or `false`, as Mosquitto spells them.
pub(super) fn boolean(word: &str) -> Result<bool, String> {
    match word {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("`{other}` is not `true` or `false`")),
    }
}

/// A number of type `T`; out of its range is an error, as Mosquitto's range checks.
pub(super) fn number_of<T: std::str::FromStr>(word: &str) -> Result<T, String> {
    word.parse()
        .map_err(|_| format!("`{word}` is not a number in range"))
}
