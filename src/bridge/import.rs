//! `postbox bridge import mosquitto.conf`: Mosquitto `connection` stanzas as `[[bridge]]` TOML.
//!
//! A gateway moving from Mosquitto keeps its bridge definitions: the keys of
//! [`crate::config::BridgeConfig`] follow the `connection` stanza, so most lines map one to one.
//! What does not map exactly (an option Postbox lacks, a default that differs, a value
//! Mosquitto would refuse) becomes a note naming the file, the line and why, so nothing is
//! dropped silently. Lines outside stanzas configure the broker, not bridges: they are left
//! out and summed up in one note.
//!
//! Parsing follows Mosquitto's `conf.c`: a line whose first character is `#` is a comment,
//! options are split on blanks, strings (`remote_password`, file paths, ...) are the rest of
//! the line, `""` is an empty prefix or pattern, an address's port is after its last `:`
//! (default 1883), a `#` word ends an address list. Lenient where Mosquitto refuses (the
//! note says so), so one bad line does not hide the rest of the file.
//!
//! Layout: this file reads the lines and keeps the notes; `words` reads values as `conf.c`
//! does, `options` holds the option tables, `emit` writes the TOML (by hand, not serialized,
//! so it carries the origin of each bridge and comments on keys whose defaults differ).
//!
//! Must not: read files (the binary does, and validates the result).

mod emit;
mod options;
mod words;

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::config::{BridgeConfig, BridgeProtocol, StartMode};
use emit::write_bridge;
use options::{BRIDGE_OPTIONS, NOT_MAPPED};
use words::{address, boolean, number_of, string, topic};

/// What [`import`] produced: the TOML to paste into a Postbox config, and what the user must
/// read before using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportResult {
    /// One `[[bridge]]` section per `connection` stanza, in file order (a comment only when
    /// there was none).
    pub toml: String,
    /// One line per option that was not mapped exactly, `origin:line: why`.
    pub notes: Vec<String>,
}

/// Translates the `connection` stanzas of a mosquitto.conf `text`; `origin` (the file name)
/// prefixes every note. Pure: reads no file (included directories are named in a note).
pub fn import(text: &str, origin: &str) -> ImportResult {
    let mut state = Importer {
        origin,
        stanzas: Vec::new(),
        notes: Vec::new(),
        outside: Vec::new(),
    };
    for (index, raw) in text.lines().enumerate() {
        state.line(index + 1, raw);
    }
    state.finish()
}

/// One `connection` stanza being read.
struct Stanza {
    /// Line of `connection`.
    line: usize,
    /// The bridge, starting from Mosquitto's defaults where they differ from Postbox's.
    config: BridgeConfig,
    /// TLS was asked for (`bridge_cafile`, `bridge_capath`, `bridge_tls_use_os_certs`,
    /// `bridge_certfile`, `bridge_keyfile`).
    tls: bool,
    /// `bridge_session_expiry_interval` was given (Mosquitto's default 0 differs).
    session_expiry_set: bool,
    /// Line of the first `address` (Mosquitto allows one).
    address_line: Option<usize>,
    /// Keys seen, for duplicate notes.
    seen: BTreeSet<&'static str>,
}

impl Stanza {
    fn new(line: usize, name: String) -> Stanza {
        let mut config = BridgeConfig {
            name,
            // Mosquitto's default protocol; Postbox's default would be 5.
            protocol: BridgeProtocol::V3_1_1,
            ..BridgeConfig::default()
        };
        config.session_expiry = 0;
        Stanza {
            line,
            config,
            tls: false,
            session_expiry_set: false,
            address_line: None,
            seen: BTreeSet::new(),
        }
    }
}

struct Importer<'a> {
    origin: &'a str,
    stanzas: Vec<Stanza>,
    notes: Vec<String>,
    /// `(line, option)` of every line outside a stanza's options.
    outside: Vec<(usize, String)>,
}

impl Importer<'_> {
    fn note(&mut self, line: usize, text: impl AsRef<str>) {
        self.notes
            .push(format!("{}:{line}: {}", self.origin, text.as_ref()));
    }

    fn line(&mut self, number: usize, raw: &str) {
        let line = raw.trim_end_matches(['\r', '\n']);
        let trimmed = line.trim_start_matches([' ', '\t']);
        if trimmed.is_empty() || trimmed.starts_with('#') {
            return;
        }
        let (option, rest) = match trimmed.find([' ', '\t']) {
            Some(i) => (&trimmed[..i], trimmed[i..].trim_start_matches([' ', '\t'])),
            None => (trimmed, ""),
        };
        if option == "connection" {
            self.connection(number, rest);
            return;
        }
        if option == "include_dir" {
            self.note(
                number,
                format!(
                    "`include_dir {rest}`: the files there were not read; import each of them \
                     too if it holds connection stanzas"
                ),
            );
            return;
        }
        let Some(known) = BRIDGE_OPTIONS.iter().copied().find(|o| *o == option) else {
            self.outside.push((number, option.to_owned()));
            return;
        };
        if self.stanzas.is_empty() {
            self.note(
                number,
                format!("`{option}` before any `connection` line: ignored (Mosquitto refuses it)"),
            );
            return;
        }
        if let Err(why) = self.option(number, known, rest) {
            self.note(number, format!("`{option} {rest}`: {why}; line ignored"));
        }
    }

    /// `connection <name>`: a new stanza, its name made safe and unique.
    fn connection(&mut self, number: usize, rest: &str) {
        let given = rest.split([' ', '\t']).next().unwrap_or_default();
        let mut name: String = given
            .chars()
            .map(|c| {
                if matches!(c, '/' | '+' | '#') || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        if name.is_empty() {
            name = format!("bridge{}", self.stanzas.len() + 1);
            self.note(
                number,
                format!("`connection` without a name (Mosquitto refuses it): named `{name}`"),
            );
        } else if name != given {
            self.note(
                number,
                format!(
                    "connection name `{given}` written `{name}`: a bridge name is a topic level \
                     and a metric label, so `/`, `+`, `#` and control characters are replaced"
                ),
            );
        }
        if self.stanzas.iter().any(|s| s.config.name == name) {
            let unique = (2..)
                .map(|n| format!("{name}-{n}"))
                .find(|n| self.stanzas.iter().all(|s| &s.config.name != n))
                .unwrap_or_default();
            self.note(
                number,
                format!("connection `{name}` appears twice: the second is named `{unique}`"),
            );
            name = unique;
        }
        self.stanzas.push(Stanza::new(number, name));
    }

    /// One option of the current stanza; `Err` says why the line was not used.
    fn option(&mut self, number: usize, option: &'static str, rest: &str) -> Result<(), String> {
        if let Some((_, why)) = NOT_MAPPED.iter().find(|(o, _)| *o == option) {
            self.note(number, format!("`{option}` not mapped: {why}"));
            return Ok(());
        }
        let words: Vec<&str> = rest.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
        let first = words.first().copied().unwrap_or_default();
        let mut notes = Vec::new();
        let stanza = self.stanzas.last_mut().ok_or("no stanza")?;
        let canonical = match option {
            "addresses" => "address",
            "clientid" => "remote_clientid",
            "username" => "remote_username",
            "password" => "remote_password",
            other => other,
        };
        if option != "topic" && !stanza.seen.insert(canonical) {
            notes.push(format!(
                "`{option}` given again in this stanza: the later value wins (Mosquitto \
                 refuses some duplicates)"
            ));
        }
        let config = &mut stanza.config;
        match option {
            "address" | "addresses" => {
                if stanza.address_line.is_none() {
                    stanza.address_line = Some(number);
                } else {
                    notes.push(
                        "a second `address` line (Mosquitto refuses it): its addresses are \
                         added after the first line's"
                            .to_owned(),
                    );
                }
                let mut any = false;
                for word in words.iter().take_while(|w| !w.starts_with('#')) {
                    match address(word) {
                        Ok(a) => {
                            config.addresses.push(a);
                            any = true;
                        }
                        Err(why) => notes.push(format!("address `{word}` left out: {why}")),
                    }
                }
                if !any {
                    notes.push("no usable address on the line".to_owned());
                }
            }
            "round_robin" => config.round_robin = boolean(first)?,
            "topic" => {
                let (rule, rule_notes) = topic(rest)?;
                notes.extend(rule_notes);
                config.topics.push(rule);
            }
            "bridge_protocol_version" => {
                config.protocol = match first {
                    "mqttv50" => BridgeProtocol::V5,
                    "mqttv311" => BridgeProtocol::V3_1_1,
                    "mqttv31" => {
                        notes.push(
                            "`mqttv31` imported as 3.1.1: Postbox speaks MQTT 3.1.1 or 5 to a \
                             remote; a broker that only takes 3.1 will refuse it"
                                .to_owned(),
                        );
                        BridgeProtocol::V3_1_1
                    }
                    other => return Err(format!("unknown protocol version `{other}`")),
                };
            }
            "remote_clientid" | "clientid" => config.client_id = Some(string(rest)?),
            "remote_username" | "username" => config.username = Some(string(rest)?),
            "remote_password" | "password" => config.password = Some(string(rest)?),
            "keepalive_interval" => {
                let seconds: u16 = number_of(first)?;
                if seconds < 5 {
                    return Err("Mosquitto's minimum is 5 seconds".to_owned());
                }
                config.keep_alive = seconds;
            }
            "cleansession" => config.clean_start = boolean(first)?,
            "restart_timeout" => {
                let values = words
                    .iter()
                    .map(|w| number_of::<u32>(w))
                    .collect::<Result<Vec<_>, _>>()?;
                config.restart_timeout = match values.as_slice() {
                    [constant] => [*constant, *constant],
                    [base, cap] => [*base, *cap],
                    [base, cap, stable] => {
                        notes.push(format!(
                            "`restart_timeout`'s third value (stable = {stable} s) is not \
                             supported: the backoff restarts from the base after every \
                             successful connect"
                        ));
                        [*base, *cap]
                    }
                    _ => return Err("takes one, two or three numbers".to_owned()),
                };
            }
            "start_type" => {
                config.start = match first {
                    "automatic" => StartMode::Automatic,
                    "lazy" => StartMode::Lazy,
                    "once" => {
                        notes.push(
                            "`start_type once` imported as `automatic`: a bridge that stops \
                             after its first failure would strand its queue, so Postbox's \
                             bridges always reconnect"
                                .to_owned(),
                        );
                        StartMode::Automatic
                    }
                    other => return Err(format!("unknown start type `{other}`")),
                };
            }
            "threshold" => config.threshold = number_of(first)?,
            "idle_timeout" => config.idle_timeout = number_of(first)?,
            "try_private" => config.try_private = boolean(first)?,
            "notifications" => config.notifications = boolean(first)?,
            "bridge_outgoing_retain" => config.keep_retain = boolean(first)?,
            "bridge_session_expiry_interval" => {
                config.session_expiry = number_of(first)?;
                stanza.session_expiry_set = true;
            }
            "bridge_cafile" => {
                config.tls.get_or_insert_with(Default::default).ca = Some(string(rest)?.into());
                stanza.tls = true;
            }
            "bridge_certfile" => {
                config.tls.get_or_insert_with(Default::default).cert = Some(string(rest)?.into());
                stanza.tls = true;
            }
            "bridge_keyfile" => {
                config.tls.get_or_insert_with(Default::default).key = Some(string(rest)?.into());
                stanza.tls = true;
            }
            "bridge_capath" => {
                config.tls.get_or_insert_with(Default::default);
                stanza.tls = true;
                notes.push(format!(
                    "`bridge_capath {rest}` not mapped: Postbox reads one PEM file; concatenate \
                     the certificates (`cat {rest}/*.crt > ca.pem`) and set `tls.ca`. Until \
                     then the system's trust store is used"
                ));
            }
            "bridge_tls_use_os_certs" => {
                if boolean(first)? {
                    config.tls.get_or_insert_with(Default::default);
                    stanza.tls = true;
                }
            }
            "bridge_insecure" => {
                if boolean(first)? {
                    notes.push(
                        "`bridge_insecure true` not mapped: Mosquitto then skips only the host \
                         name check, Postbox's `tls.insecure` would accept any certificate. \
                         Set `tls.server_name` to the name in the remote's certificate \
                         instead (or `insecure = true` for tests only)"
                            .to_owned(),
                    );
                }
            }
            "bridge_alpn" => {
                config.tls.get_or_insert_with(Default::default).alpn = vec![first.to_owned()];
            }
            _ => return Err("not a bridge option Postbox knows".to_owned()),
        }
        for n in notes {
            self.note(number, n);
        }
        Ok(())
    }

    fn finish(mut self) -> ImportResult {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# [[bridge]] sections imported from {} by `postbox bridge import`.\n\
             # Read the notes it printed (stderr) before use: they list what did not map exactly.",
            self.origin
        );
        if self.stanzas.is_empty() {
            self.notes.push(format!(
                "{}: no `connection` stanza: nothing to import",
                self.origin
            ));
        }
        let stanzas = std::mem::take(&mut self.stanzas);
        for stanza in &stanzas {
            self.stanza_notes(stanza);
            write_bridge(&mut out, self.origin, stanza);
        }
        if !self.outside.is_empty() {
            let options: BTreeSet<&str> = self.outside.iter().map(|(_, o)| o.as_str()).collect();
            let shown: Vec<&str> = options.iter().copied().take(12).collect();
            let more = if options.len() > shown.len() {
                ", ..."
            } else {
                ""
            };
            self.notes.push(format!(
                "{}: {} line(s) that are not bridge options were ignored (lines {}): they \
                 configure the broker ({}{more}); see config/postbox.toml for their \
                 equivalents",
                self.origin,
                self.outside.len(),
                line_list(self.outside.iter().map(|(l, _)| *l)),
                shown.join(", "),
            ));
        }
        ImportResult {
            toml: out,
            notes: self.notes,
        }
    }

    /// Notes about a whole stanza: what is missing, and defaults that differ.
    fn stanza_notes(&mut self, stanza: &Stanza) {
        let c = &stanza.config;
        let line = stanza.line;
        if c.addresses.is_empty() {
            self.note(
                line,
                format!("connection `{}` has no address: add `addresses`", c.name),
            );
        }
        if c.topics.is_empty() {
            self.note(
                line,
                format!(
                    "connection `{}` has no topic line: add a `[[bridge.topic]]`",
                    c.name
                ),
            );
        }
        if c.password.is_some() && c.username.is_none() {
            self.note(
                line,
                format!(
                    "connection `{}`: remote_password without remote_username (Mosquitto \
                     ignores such a password; MQTT 3.1.1 cannot send it): add `username`",
                    c.name
                ),
            );
        }
        if c.client_id.is_none() {
            self.note(
                line,
                format!(
                    "connection `{0}` has no remote_clientid: Mosquitto used `{0}.<hostname>`, \
                     Postbox uses `postbox-bridge-{0}`; set `client_id` to resume the session \
                     the remote holds for the old id",
                    c.name
                ),
            );
        }
        if c.notifications {
            self.note(
                line,
                format!(
                    "connection `{}`: the link state is published on \
                     $SYS/broker/connection/{}/state (the bridge's name; Mosquitto uses the \
                     remote client id)",
                    c.name, c.name
                ),
            );
        }
        if c.topics.iter().any(|t| t.qos == 0) {
            self.note(
                line,
                format!(
                    "connection `{}`: topic rules without a QoS are QoS 0 as in Mosquitto; \
                     Postbox keeps and resends only QoS 1/2 messages across outages, so \
                     raise `qos` where no message may be lost",
                    c.name
                ),
            );
        }
        if c.protocol == BridgeProtocol::V5 && !stanza.session_expiry_set {
            self.note(
                line,
                format!(
                    "connection `{}`: session_expiry = 0 as in Mosquitto (the remote drops the \
                     bridge's subscriptions and queued `in` messages at every disconnect); \
                     Postbox's default is 86400",
                    c.name
                ),
            );
        }
        if c.tls.is_some() && !stanza.tls {
            self.note(
                line,
                format!(
                    "connection `{}`: `bridge_alpn` without a CA option: Mosquitto connects in \
                     plain TCP, so no [bridge.tls] is written",
                    c.name
                ),
            );
        }
    }
}

/// `1-3, 7, 9-10` for the summary note.
fn line_list(lines: impl Iterator<Item = usize>) -> String {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for l in lines {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => ranges.push((l, l)),
        }
    }
    ranges
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
