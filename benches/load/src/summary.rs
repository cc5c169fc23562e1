//! Folds the JSON lines of a comparison into one table: the median of each metric per case
//! and broker, and the ratio of Postbox to every other broker.
//!
//! Medians, not means: one run disturbed by a neighbour on a shared machine should not move
//! the result. Loss is the exception: the worst run is shown, because any loss at QoS >= 1 is
//! a bug however rare.

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
        skip: &["connections"],
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
        only: &["latency", "connections"],
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

/// The reference broker whose ratios are printed.
pub const REFERENCE: &str = "postbox";

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
    let mut cases: BTreeMap<String, (String, BTreeMap<String, Vec<&Value>>)> = BTreeMap::new();
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

    let mut out = String::new();
    let mut header = format!("{:<18} {:<22}", "case", "metric");
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
        let mut first = true;
        for m in METRICS {
            let scenario = scenario.as_str();
            if (!m.only.is_empty() && !m.only.contains(&scenario)) || m.skip.contains(&scenario) {
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
            let mut line = format!("{name:<18} {:<22}", m.label);
            for v in &values {
                let cell = v.map_or("-".to_string(), |(x, n)| format!("{} ({n})", fmt_num(x)));
                let _ = write!(line, " {cell:>13}");
            }
            let reference = values.first().copied().flatten();
            for (i, _) in others.iter().enumerate() {
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
            let _ = writeln!(out, "{line}  {better}");
        }
    }
    out
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
    }
}
