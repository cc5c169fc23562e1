//! A bridge's topic rules: which filters it subscribes to on each side, and how a topic name
//! changes as a message crosses.
//!
//! Mosquitto's grammar: a rule `pattern direction qos local_prefix remote_prefix` subscribes
//! locally to `local_prefix + pattern` (out) and remotely to `remote_prefix + pattern` (in); a
//! message going out loses `local_prefix` and gains `remote_prefix`, one coming in the
//! reverse. Where several rules match a topic, the first in file order names it.

use crate::codec::topic::matching::matches;
use crate::codec::QoS;
use crate::config::{Direction, TopicRule};

/// One rule with its filters spelled out.
#[derive(Debug, Clone)]
struct Rule {
    direction: Direction,
    qos: QoS,
    local_prefix: String,
    remote_prefix: String,
    local_filter: String,
    remote_filter: String,
}

/// The compiled rules of one bridge.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    rules: Vec<Rule>,
}

impl Rules {
    /// Compiles the configured rules (validated by the config: filters are valid, QoS ≤ 2).
    pub(crate) fn new(config: &[TopicRule]) -> Rules {
        let rules = config
            .iter()
            .map(|r| Rule {
                direction: r.direction,
                qos: QoS::from_u8(r.qos).unwrap_or(QoS::AtLeastOnce),
                local_prefix: r.local_prefix.clone(),
                remote_prefix: r.remote_prefix.clone(),
                local_filter: format!("{}{}", r.local_prefix, r.pattern),
                remote_filter: format!("{}{}", r.remote_prefix, r.pattern),
            })
            .collect();
        Rules { rules }
    }

    /// The local subscriptions the `out` rules need, each filter once with the highest QoS
    /// any rule asks for it.
    pub(crate) fn local_subscriptions(&self) -> Vec<(String, QoS)> {
        self.filters_of(|r| r.direction.is_out().then_some(&r.local_filter))
    }

    /// The remote subscriptions the `in` rules need, each filter once with the highest QoS.
    pub(crate) fn remote_subscriptions(&self) -> Vec<(String, QoS)> {
        self.filters_of(|r| r.direction.is_in().then_some(&r.remote_filter))
    }

    /// The filter `pick` names of each rule it names one of, merged ([`merged`]).
    fn filters_of<'a>(
        &'a self,
        pick: impl Fn(&'a Rule) -> Option<&'a String>,
    ) -> Vec<(String, QoS)> {
        merged(
            self.rules
                .iter()
                .filter_map(|r| pick(r).map(|filter| (filter, r.qos))),
        )
    }

    /// The remote name of a local topic, by the first `out` rule whose local filter matches;
    /// `None` when no rule does (the subscription outlived its rule).
    pub(crate) fn outgoing(&self, local_topic: &str) -> Option<String> {
        self.renamed(local_topic, true)
    }

    /// The local name of a remote topic, by the first `in` rule whose remote filter matches;
    /// `None` when no rule does (the remote sent what the bridge did not subscribe to).
    pub(crate) fn incoming(&self, remote_topic: &str) -> Option<String> {
        self.renamed(remote_topic, false)
    }

    /// `topic` renamed by the first rule of its direction (`out`: local to remote) whose
    /// filter on the topic's side matches it.
    fn renamed(&self, topic: &str, out: bool) -> Option<String> {
        self.rules
            .iter()
            .filter_map(|r| match out {
                true if r.direction.is_out() => {
                    Some((&r.local_filter, &r.local_prefix, &r.remote_prefix))
                }
                false if r.direction.is_in() => {
                    Some((&r.remote_filter, &r.remote_prefix, &r.local_prefix))
                }
                _ => None,
            })
            .find(|(filter, _, _)| matches(filter, topic))
            .and_then(|(_, from, to)| swap_prefix(topic, from, to))
    }
}

/// `topic` without `from` and with `to` in front; `None` if it does not start with `from`
/// or nothing is left (an empty topic name is not allowed, MQTT-4.7.3-1).
fn swap_prefix(topic: &str, from: &str, to: &str) -> Option<String> {
    let rest = topic.strip_prefix(from)?;
    let name = format!("{to}{rest}");
    (!name.is_empty()).then_some(name)
}

fn merged<'a>(filters: impl Iterator<Item = (&'a String, QoS)>) -> Vec<(String, QoS)> {
    let mut out: Vec<(String, QoS)> = Vec::new();
    for (filter, qos) in filters {
        match out.iter_mut().find(|(f, _)| f == filter) {
            Some((_, q)) => *q = (*q).max(qos),
            None => out.push((filter.clone(), qos)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pattern: &str, direction: Direction, qos: u8, local: &str, remote: &str) -> TopicRule {
        TopicRule {
            pattern: pattern.into(),
            direction,
            qos,
            local_prefix: local.into(),
            remote_prefix: remote.into(),
        }
    }

    #[test]
    fn prefixes_are_swapped_both_ways() {
        let rules = Rules::new(&[
            rule("sensors/#", Direction::Out, 1, "", "site1/"),
            rule("commands/#", Direction::In, 1, "", ""),
            rule("#", Direction::Both, 2, "local/", "remote/"),
        ]);
        assert_eq!(
            rules.outgoing("sensors/a/temp").as_deref(),
            Some("site1/sensors/a/temp")
        );
        assert_eq!(rules.outgoing("local/x").as_deref(), Some("remote/x"));
        assert_eq!(rules.outgoing("commands/x"), None);
        assert_eq!(rules.incoming("commands/x").as_deref(), Some("commands/x"));
        assert_eq!(rules.incoming("remote/y/z").as_deref(), Some("local/y/z"));
        assert_eq!(rules.incoming("site1/sensors/a"), None);
        assert_eq!(
            rules.local_subscriptions(),
            vec![
                ("sensors/#".to_owned(), QoS::AtLeastOnce),
                ("local/#".to_owned(), QoS::ExactlyOnce)
            ]
        );
        assert_eq!(
            rules.remote_subscriptions(),
            vec![
                ("commands/#".to_owned(), QoS::AtLeastOnce),
                ("remote/#".to_owned(), QoS::ExactlyOnce)
            ]
        );
    }

    #[test]
    fn the_same_filter_is_subscribed_once_with_the_highest_qos() {
        let rules = Rules::new(&[
            rule("a/#", Direction::Out, 0, "", ""),
            rule("a/#", Direction::Both, 2, "", ""),
        ]);
        assert_eq!(
            rules.local_subscriptions(),
            vec![("a/#".to_owned(), QoS::ExactlyOnce)]
        );
    }

    #[test]
    fn an_empty_result_is_not_a_topic() {
        let rules = Rules::new(&[rule("x", Direction::In, 1, "", "x")]);
        // remote filter "xx"; a topic "xx" loses "x" → "x"
        assert_eq!(rules.incoming("xx").as_deref(), Some("x"));
        assert_eq!(swap_prefix("p/", "p/", ""), None);
    }
}
