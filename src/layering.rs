//! The layering rule, checked (issue 36): ARCHITECTURE's "must not" becomes a test instead
//! of a hope. For now it holds one row: `metrics` is a leaf, so no file of it (`src/metrics.rs`,
//! `src/metrics/**`) names another module of the crate, by a `crate::` path or by a
//! `super::` chain that climbs out of it. Comments and doc links count too: a doc link is a
//! dependency rustdoc resolves, and the rule is easier to keep when it has no exceptions.
//! Other rows (codec, storage) can be added as their pieces land.

use std::path::{Path, PathBuf};

/// Every `.rs` file of top-level module `module`: `src/<module>.rs` (or its `mod.rs`) and
/// everything under `src/<module>/`, each with how deep it sits below the module (how many
/// `super::` reach the module itself from inside it).
fn module_files(module: &str) -> Vec<(PathBuf, usize)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let root = src.join(format!("{module}.rs"));
    if root.is_file() {
        files.push((root, 0));
    }
    let mut dirs = vec![(src.join(module), 1)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push((path, depth + 1));
            } else if path.extension().is_some_and(|e| e == "rs") {
                // A `mod.rs` is its directory's module: one level less deep.
                let is_mod = path.file_name().is_some_and(|n| n == "mod.rs");
                files.push((path, if is_mod { depth - 1 } else { depth }));
            }
        }
    }
    files.sort();
    files
}

/// The lines of `text` (a file `depth` levels below `module`) that reach outside `module`:
/// a `crate::` path to anything but `crate::<module>`, or `depth + 1` chained `super::`.
fn reaches_outside(module: &str, text: &str, depth: usize) -> Vec<(usize, String)> {
    let allowed = format!("crate::{module}");
    let climb_out = "super::".repeat(depth + 1);
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let crate_path_out = line.match_indices("crate::").any(|(at, _)| {
            let rest = &line[at..];
            let inside = rest.starts_with(&allowed)
                && !rest[allowed.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
            !inside
        });
        if crate_path_out || line.contains(&climb_out) {
            found.push((number + 1, line.trim().to_owned()));
        }
    }
    found
}

/// `metrics` is a leaf: it names nothing of the crate but itself, so every owner
/// (`storage`, `guarantees`, `cluster`, …) can import it without closing a cycle.
#[test]
fn metrics_imports_nothing_of_the_crate() {
    let files = module_files("metrics");
    assert!(files.len() > 3, "metrics' files not found: {files:?}");
    let mut violations = Vec::new();
    for (path, depth) in files {
        let text = std::fs::read_to_string(&path).expect("a source file of the crate");
        for (line, code) in reaches_outside("metrics", &text, depth) {
            violations.push(format!("{}:{line}: {code}", path.display()));
        }
    }
    assert!(
        violations.is_empty(),
        "metrics must be a leaf (docs/ARCHITECTURE.md); these lines reach outside it:\n{}",
        violations.join("\n")
    );
}

/// The detector itself: what it must catch and what it must let through.
#[test]
fn the_detector_tells_inside_from_outside() {
    let outside = "use crate::storage::StoreStats;\n\
                   use crate::{metrics, storage};\n\
                   use crate::metrics_extra::X;\n\
                   use super::super::broker::Broker;\n";
    let found: Vec<usize> = reaches_outside("metrics", outside, 1)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(found, [1, 2, 3, 4]);
    let inside = "use crate::metrics::names;\nuse super::handles::Counter;\nuse std::sync::Arc;\n";
    assert!(reaches_outside("metrics", inside, 1).is_empty());
    // At the module's own root, one `super::` is already outside.
    assert_eq!(reaches_outside("metrics", "use super::broker;", 0).len(), 1);
}
