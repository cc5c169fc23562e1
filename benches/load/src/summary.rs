//! Folds the JSON lines of a comparison into one table: the median of each metric per case
//! and broker, and the ratio of Postbox to every other broker.
//!
//! Medians, not means: one run disturbed by a neighbour on a shared machine should not move
//! the result. Loss is the exception: the worst run is shown, because any loss at QoS >= 1 is
//! a bug however rare.
//!
//! Cases measured with every broker on its own defaults (`"settings": "defaults"` in the
//! JSON) also show loss as a percentage and duplicates, and get a section of their own that
//! sets Postbox's defaults throughput against its tuned throughput of the same shape, with
//! the flow-control goal (issue 12) read off.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// How a metric is aggregated over repeats and which direction is better.
#[derive(Clone, Copy)]
struct Metric {
    field: &'static str,
    label: &'static str,
    /// Multiply the stored value by this before printing (unit change).
    scale: f64,
    better: Better,
    /// Scenarios it is shown for; empty = every scenario that has it.
    only: &'static [&'static str],
    /// Scenarios it is never shown for (where it is not measured).
    skip: &'static [&'static str],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
    /// Worst run shown; no ratio (loss, generator load).
    WorstIsMax,
}

const METRICS: &[Metric] = &[
    Metric {
        field: "delivered_per_s",
        label: "delivered msg/s",
        scale: 1.0,
        better: Better::Higher,
        only: &[],
        skip: &["connections", "handshakes"],
    },
    Metric {
        field: "duration_s",
        label: "time to all, s",
        scale: 1.0,
        better: Better::Lower,
        only: &["retained"],
        skip: &[],
    },
    Metric {
        field: "store_s",
        label: "retained store, s",
        scale: 1.0,
        better: Better::Lower,
        only: &["retained"],
        skip: &[],
    },
    Metric {
        field: "p50_us",
        label: "latency p50, us",
        scale: 1.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "p99_us",
        label: "latency p99, us",
        scale: 1.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "p999_us",
        label: "latency p999, us",
        scale: 1.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "connect_per_s",
        label: "connects/s",
        scale: 1.0,
        better: Better::Higher,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "rss_per_connection_b",
        label: "RSS per conn, B",
        scale: 1.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "broker_cpu_us_per_msg",
        label: "broker CPU us/msg",
        scale: 1.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "broker_cpu_pct",
        label: "broker CPU %",
        scale: 1.0,
        better: Better::Lower,
        only: &["latency", "connections", "handshakes"],
        skip: &[],
    },
    Metric {
        field: "broker_peak_rss_kib",
        label: "broker peak RSS, MiB",
        scale: 1.0 / 1024.0,
        better: Better::Lower,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "lost",
        label: "lost (worst run)",
        scale: 1.0,
        better: Better::WorstIsMax,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "generator_cpu_pct",
        label: "generator CPU % (max)",
        scale: 1.0,
        better: Better::WorstIsMax,
        only: &[],
        skip: &[],
    },
];

/// Shown after "lost (worst run)" for cases run on each broker's defaults, where loss is the
/// figure measured: as a percentage (runs of any size compare) and duplicates (a broker that
/// sheds load by redelivering would otherwise look lossless).
const DEFAULTS_METRICS: &[Metric] = &[
    Metric {
        field: "lost_pct",
        label: "lost % (worst run)",
        scale: 1.0,
        better: Better::WorstIsMax,
        only: &[],
        skip: &[],
    },
    Metric {
        field: "duplicates",
        label: "duplicates (worst run)",
        scale: 1.0,
        better: Better::WorstIsMax,
        only: &[],
        skip: &[],
    },
];

/// The reference broker whose ratios are printed.
pub const REFERENCE: &str = "postbox";

/// Issue 12's goal for Postbox on its defaults: throughput at least this share of the tuned
/// throughput of the same shape...
pub const GOAL_THROUGHPUT_RATIO: f64 = 0.8;
/// ... and at most this much loss at QoS 0, in percent (QoS >= 1: none at all).
pub const GOAL_QOS0_LOST_PCT: f64 = 1.0;

/// The settings label of a results line (lines from before the field existed are tuned).
fn settings(row: &Value) -> String {
    str_field(row, "settings").unwrap_or_else(|| "tuned".into())
}

/// What makes two cases comparable: the same workload with the same clients, whatever the
/// broker's settings.
#[derive(PartialEq)]
struct Shape {
    scenario: String,
    qos: Option<u64>,
    publishers: Option<u64>,
    subscribers: Option<u64>,
    payload: Option<u64>,
    protocol: Option<u64>,
}

impl Shape {
    fn of(row: &Value) -> Shape {
        let n = |k: &str| row.get(k).and_then(Value::as_u64);
        Shape {
            scenario: str_field(row, "scenario").unwrap_or_default(),
            qos: n("qos"),
            publishers: n("publishers"),
            subscribers: n("subscribers"),
            payload: n("payload"),
            protocol: n("protocol"),
        }
    }
}

/// Reads JSON lines (one report each) from `path`; unreadable lines are skipped with a
/// warning on stderr, so one broken run does not hide the rest.
///
/// # Errors
///
/// When `path` cannot be read.
pub fn load(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) => rows.push(v),
            Err(e) => eprintln!("{}:{}: skipped: {e}", path.display(), n + 1),
        }
    }
    Ok(rows)
}

/// Median of `values` (which must not be empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Renders the comparison table for every case in `rows`.
pub fn render(rows: &[Value]) -> String {
    // case -> (scenario, broker -> rows), keeping first-seen order of cases.
    let mut order: Vec<String> = Vec::new();
    let mut cases: Cases<'_> = BTreeMap::new();
    let mut brokers: Vec<String> = Vec::new();
    for row in rows {
        let (Some(case), Some(broker)) = (str_field(row, "case"), str_field(row, "broker")) else {
            continue;
        };
        let scenario = str_field(row, "scenario").unwrap_or_default();
        if !cases.contains_key(&case) {
            order.push(case.clone());
        }
        if !brokers.contains(&broker) {
            brokers.push(broker.clone());
        }
        cases
            .entry(case)
            .or_insert_with(|| (scenario, BTreeMap::new()))
            .1
            .entry(broker)
            .or_default()
            .push(row);
    }
    brokers.sort_by_key(|b| (b != REFERENCE, b.clone()));
    let others: Vec<&String> = brokers.iter().filter(|b| *b != REFERENCE).collect();

    // 18 wide, as before the defaults set, unless a case name needs more.
    let width = order.iter().map(String::len).max().unwrap_or(0).max(18);
    let mut out = String::new();
    let mut header = format!("{:<width$} {:<22}", "case", "metric");
    for b in &brokers {
        let _ = write!(header, " {:>13}", format!("{b} (n)"));
    }
    for o in &others {
        let _ = write!(header, " {:>12}", format!("P/{}", initial(o)));
    }
    let _ = writeln!(out, "{header}  better");
    let _ = writeln!(out, "{}", "-".repeat(header.len() + 8));
    for case in &order {
        let (scenario, per_broker) = &cases[case];
        let on_defaults = per_broker
            .values()
            .flatten()
            .any(|r| settings(r) == "defaults");
        let mut first = true;
        for m in METRICS {
            let extra: &[Metric] = if on_defaults && m.field == "lost" {
                DEFAULTS_METRICS
            } else {
                &[]
            };
            for m in std::iter::once(m).chain(extra) {
                let scenario = scenario.as_str();
                if (!m.only.is_empty() && !m.only.contains(&scenario)) || m.skip.contains(&scenario)
                {
                    continue;
                }
                let values: Vec<Option<(f64, usize)>> = brokers
                    .iter()
                    .map(|b| aggregate(per_broker.get(b).map(Vec::as_slice), m))
                    .collect();
                if values.iter().all(Option::is_none) {
                    continue;
                }
                let name = if first { case.as_str() } else { "" };
                first = false;
                let _ = writeln!(
                    out,
                    "{}",
                    metric_line(name, width, m, &values, others.len())
                );
            }
        }
    }
    out.push_str(&defaults_vs_tuned(&order, &cases, width));
    out
}

/// One row of the table: the label, each broker's value and Postbox's ratio to each other
/// broker.
fn metric_line(
    name: &str,
    width: usize,
    m: &Metric,
    values: &[Option<(f64, usize)>],
    others: usize,
) -> String {
    let mut line = format!("{name:<width$} {:<22}", m.label);
    for v in values {
        let cell = v.map_or("-".to_string(), |(x, n)| format!("{} ({n})", fmt_num(x)));
        let _ = write!(line, " {cell:>13}");
    }
    let reference = values.first().copied().flatten();
    for i in 0..others {
        let cell = match (m.better, reference, values.get(i + 1).copied().flatten()) {
            (Better::WorstIsMax, _, _) => String::new(),
            (_, Some((p, _)), Some((o, _))) if o != 0.0 => format!("{:.2}x", p / o),
            _ => "-".to_string(),
        };
        let _ = write!(line, " {cell:>12}");
    }
    let better = match m.better {
        Better::Higher => "higher",
        Better::Lower => "lower",
        Better::WorstIsMax => "",
    };
    format!("{line}  {better}")
}

/// Case name -> (scenario, broker -> that broker's runs of the case).
type Cases<'a> = BTreeMap<String, (String, BTreeMap<String, Vec<&'a Value>>)>;

/// The section on Postbox's own defaults: for every defaults case, its median throughput
/// against the tuned case of the same shape (when the results hold one), the worst loss, the
/// median peak RSS, and whether issue 12's goal is met. Empty when no case ran on defaults.
fn defaults_vs_tuned(order: &[String], cases: &Cases<'_>, width: usize) -> String {
    let runs = |case: &str| -> Option<&Vec<&Value>> { cases.get(case)?.1.get(REFERENCE) };
    let is_defaults =
        |case: &str| runs(case).is_some_and(|r| r.iter().any(|r| settings(r) == "defaults"));
    let rate = Metric {
        field: "delivered_per_s",
        ..METRICS[0]
    };
    let mut out = String::new();
    for case in order.iter().filter(|c| is_defaults(c)) {
        let Some(rows) = runs(case) else { continue };
        let shape = Shape::of(rows[0]);
        let tuned = order
            .iter()
            .find(|t| !is_defaults(t) && runs(t).is_some_and(|r| Shape::of(r[0]) == shape));
        let defaults_rate = aggregate(Some(rows), &rate);
        let peak_rss = aggregate(
            Some(rows),
            &Metric {
                field: "broker_peak_rss_kib",
                scale: 1.0 / 1024.0,
                ..METRICS[0]
            },
        );
        let tuned_rate = tuned.and_then(|t| aggregate(runs(t).map(Vec::as_slice), &rate));
        let worst = |field: &'static str| {
            let m = Metric {
                field,
                better: Better::WorstIsMax,
                ..METRICS[0]
            };
            aggregate(Some(rows), &m).map(|(v, _)| v)
        };
        let (lost, lost_pct) = (worst("lost"), worst("lost_pct"));
        let ratio = match (defaults_rate, tuned_rate) {
            (Some((d, _)), Some((t, _))) if t > 0.0 => Some(d / t),
            _ => None,
        };
        let loss_ok = if shape.qos.unwrap_or(0) == 0 {
            lost_pct.is_some_and(|p| p <= GOAL_QOS0_LOST_PCT)
        } else {
            lost == Some(0.0)
        };
        let mut missed = Vec::new();
        if !loss_ok {
            missed.push("loss".to_string());
        }
        if let Some(r) = ratio.filter(|r| *r < GOAL_THROUGHPUT_RATIO) {
            missed.push(format!("throughput {r:.2}x"));
        }
        let mut goal = if missed.is_empty() {
            "met".to_string()
        } else {
            format!("missed: {}", missed.join(", "))
        };
        if tuned.is_none() {
            goal.push_str(" (no tuned run of this shape)");
        }
        let cell = |v: Option<(f64, usize)>| {
            v.map_or("-".into(), |(x, n)| format!("{} ({n})", fmt_num(x)))
        };
        let _ = writeln!(
            out,
            "{case:<width$} {:<14} {:>15} {:>15} {:>7} {:>8} {:>10}  {goal}",
            tuned.map_or("-", String::as_str),
            cell(defaults_rate),
            cell(tuned_rate),
            ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            lost_pct.map_or("-".into(), fmt_num),
            peak_rss.map_or("-".into(), |(v, _)| fmt_num(v)),
        );
    }
    if out.is_empty() {
        return out;
    }
    let header = format!(
        "{:<width$} {:<14} {:>15} {:>15} {:>7} {:>8} {:>10}  goal",
        "case", "tuned case", "defaults msg/s", "tuned msg/s", "D/T", "lost %", "peak MiB"
    );
    format!(
        "\nPostbox on its defaults vs tuned (goal: QoS >= 1 nothing lost, QoS 0 lost <= \
         {GOAL_QOS0_LOST_PCT}%, msg/s >= {GOAL_THROUGHPUT_RATIO}x tuned; lost % is the worst run)\n\
         {header}\n{}\n{out}",
        "-".repeat(header.len() + 8)
    )
}

/// Median (or max) of one metric over a broker's runs of a case, with the run count.
fn aggregate(rows: Option<&[&Value]>, m: &Metric) -> Option<(f64, usize)> {
    let mut values: Vec<f64> = rows?
        .iter()
        .filter_map(|r| r.get(m.field)?.as_f64())
        .map(|v| v * m.scale)
        .collect();
    if values.is_empty() {
        return None;
    }
    let n = values.len();
    let v = match m.better {
        Better::WorstIsMax => values.iter().copied().fold(f64::MIN, f64::max),
        _ => median(&mut values),
    };
    Some((v, n))
}

fn str_field(row: &Value, key: &str) -> Option<String> {
    row.get(key)?.as_str().map(str::to_string)
}

/// First letter, upper-cased: `P/M` for Postbox over Mosquitto.
fn initial(name: &str) -> String {
    name.chars()
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().collect())
}

/// Compact number: no decimals for large values, more for small ones.
fn fmt_num(x: f64) -> String {
    match x.abs() {
        a if a >= 1000.0 => format!("{x:.0}"),
        a if a >= 10.0 => format!("{x:.1}"),
        a if a >= 0.1 || a == 0.0 => format!("{x:.2}"),
        _ => format!("{x:.4}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn renders_ratio_of_medians() {
        let rows: Vec<Value> = [
            r#"{"scenario":"fan-in","case":"fan-in-q0","broker":"postbox","delivered_per_s":200.0,"lost":0}"#,
            r#"{"scenario":"fan-in","case":"fan-in-q0","broker":"postbox","delivered_per_s":400.0,"lost":0}"#,
            r#"{"scenario":"fan-in","case":"fan-in-q0","broker":"postbox","delivered_per_s":300.0,"lost":2}"#,
            r#"{"scenario":"fan-in","case":"fan-in-q0","broker":"mosquitto","delivered_per_s":150.0,"lost":0}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).expect("valid test JSON"))
        .collect();
        let table = render(&rows);
        assert!(table.contains("2.00x"), "{table}");
        assert!(table.contains("2.00 (3)"), "{table}"); // worst loss over 3 runs
                                                        // A tuned-only table is what it was before the defaults set existed.
        assert!(!table.contains("lost %"), "{table}");
        assert!(!table.contains("Postbox on its defaults"), "{table}");
    }

    fn rows(lines: &[&str]) -> Vec<Value> {
        lines
            .iter()
            .map(|l| serde_json::from_str(l).expect("valid test JSON"))
            .collect()
    }

    /// The line of `table` that starts with `case`, in the defaults-vs-tuned section.
    fn verdict<'t>(table: &'t str, case: &str) -> &'t str {
        let section = table
            .split("Postbox on its defaults vs tuned")
            .nth(1)
            .unwrap_or_else(|| panic!("no defaults section in:\n{table}"));
        section
            .lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("no line for {case} in:\n{table}"))
    }

    #[test]
    fn defaults_cases_show_loss_percent_and_the_ratio_to_tuned() {
        // Issue 12's goal: QoS 1 nothing lost, QoS 0 <= 1% lost, >= 0.8x the tuned msg/s of
        // the same shape (same scenario, QoS, publishers, subscribers, payload, protocol).
        let shape =
            r#""scenario":"fan-in","publishers":100,"subscribers":1,"payload":64,"protocol":4"#;
        let table = render(&rows(&[
            // Tuned (no settings field: results from before it existed read as tuned).
            &format!(
                r#"{{{shape},"case":"fan-in-q0","broker":"postbox","qos":0,"delivered_per_s":1000.0,"lost":0}}"#
            ),
            &format!(
                r#"{{{shape},"case":"fan-in-q1","broker":"postbox","qos":1,"delivered_per_s":500.0,"lost":0}}"#
            ),
            // Defaults, QoS 0: 0.5% lost and 0.9x tuned: met.
            &format!(
                r#"{{{shape},"case":"defaults-fan-in-q0","broker":"postbox","settings":"defaults","qos":0,"delivered_per_s":900.0,"lost":5,"lost_pct":0.5,"duplicates":0}}"#
            ),
            &format!(
                r#"{{{shape},"case":"defaults-fan-in-q0","broker":"mosquitto","settings":"defaults","qos":0,"delivered_per_s":300.0,"lost":400,"lost_pct":40.0,"duplicates":0}}"#
            ),
            // Defaults, QoS 1: one message lost and 0.5x tuned: missed on both.
            &format!(
                r#"{{{shape},"case":"defaults-fan-in-q1","broker":"postbox","settings":"defaults","qos":1,"delivered_per_s":250.0,"lost":1,"lost_pct":0.001,"duplicates":2}}"#
            ),
            // Defaults, a shape the tuned set does not have.
            r#"{"scenario":"p2p","publishers":1,"subscribers":1,"payload":64,"protocol":4,"case":"defaults-p2p-q1","broker":"postbox","settings":"defaults","qos":1,"delivered_per_s":100.0,"lost":0,"lost_pct":0.0,"duplicates":0}"#,
        ]));
        assert!(table.contains("lost % (worst run)"), "{table}");
        assert!(table.contains("duplicates (worst run)"), "{table}");
        assert!(
            table.contains("3.00x"),
            "P/M of the defaults msg/s: {table}"
        );
        let q0 = verdict(&table, "defaults-fan-in-q0");
        assert!(q0.contains("fan-in-q0") && q0.contains("0.90x"), "{q0}");
        assert!(q0.ends_with("met"), "{q0}");
        let q1 = verdict(&table, "defaults-fan-in-q1");
        assert!(q1.contains("fan-in-q1") && q1.contains("0.50x"), "{q1}");
        assert!(q1.contains("missed: loss, throughput 0.50x"), "{q1}");
        let p2p = verdict(&table, "defaults-p2p-q1");
        assert!(p2p.contains("met (no tuned run of this shape)"), "{p2p}");
        // The tuned cases get no defaults rows.
        let tuned = table.split("defaults-fan-in-q0").next().unwrap_or_default();
        assert!(!tuned.contains("lost %"), "{tuned}");
    }

    #[test]
    fn qos0_loss_above_one_percent_misses_the_goal() {
        let table = render(&rows(&[
            r#"{"scenario":"p2p","publishers":1,"subscribers":1,"case":"defaults-p2p-q0","broker":"postbox","settings":"defaults","qos":0,"delivered_per_s":100.0,"lost":2,"lost_pct":1.5}"#,
        ]));
        assert!(
            verdict(&table, "defaults-p2p-q0").contains("missed: loss"),
            "{table}"
        );
    }
}
