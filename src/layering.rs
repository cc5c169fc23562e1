//! The layering rule, checked (issue 36): ARCHITECTURE's "must not" becomes a test instead
//! of a hope. It holds the lower layers ([`LOWER_LAYERS`]: `metrics` and `codec` leaves,
//! `config` and `logging` on them, `storage` on codec, config and metrics): no file of such a
//! module (`src/<module>.rs`, `src/<module>/**`) names a module of the crate it may not
//! import, by a `crate::` path or by a `super::` chain that climbs out of it. Comments and
//! doc links count too: a doc link is a dependency rustdoc resolves, and the rule is easier
//! to keep when it has no exceptions. Above them every top-level module has its place in one
//! stack ([`STACK`]) and imports only modules below it: no import cycle between top-level
//! modules, and a new edge that would close one fails here.

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
fn reaches_outside(
    module: &str,
    allowed: &[&str],
    text: &str,
    depth: usize,
) -> Vec<(usize, String)> {
    let allowed: Vec<String> = std::iter::once(module)
        .chain(allowed.iter().copied())
        .map(|m| format!("crate::{m}"))
        .collect();
    // Inline modules (`mod tests {`) sit one level deeper for the rest of the file: test
    // modules come last, so their closing braces are not tracked (lenient, never strict).
    let mut inline = 0;
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if (code.starts_with("mod ") || code.starts_with("pub(crate) mod "))
            && code.trim_end().ends_with('{')
        {
            inline += 1;
        }
        let climb_out = "super::".repeat(depth + inline + 1);
        let crate_path_out = line.match_indices("crate::").any(|(at, _)| {
            let rest = &line[at..];
            let inside = allowed.iter().any(|a| {
                rest.starts_with(a.as_str())
                    && !rest[a.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
            });
            !inside
        });
        if crate_path_out || line.contains(&climb_out) {
            found.push((number + 1, line.trim().to_owned()));
        }
    }
    found
}

/// The lower layers, as the map in `docs/ARCHITECTURE.md` draws them: each may import only
/// the modules named here (none: a leaf), so every layer above can import it without closing
/// a cycle. `metrics` is the registry every owner declares its own group against; `codec`
/// the wire types and topic rules every layer speaks; `config` the settings; `storage` the
/// durable log, which records the broker's state without knowing the broker.
const LOWER_LAYERS: &[(&str, &[&str])] = &[
    ("metrics", &[]),
    ("codec", &[]),
    ("config", &["codec"]),
    ("logging", &["config"]),
    ("storage", &["codec", "config", "metrics"]),
];

/// Every top-level module of the crate, bottom first: each may import only those before it.
/// The core (`broker`) sits on what it is given (`auth` decisions, `guarantees`, `storage`);
/// `cluster` plugs into it; `connection` drives sessions; `transport` accepts sockets and
/// hands them to connections; `bridge`, `admin` and `server` are the outer layers.
const STACK: &[&str] = &[
    "metrics",
    "codec",
    "config",
    "logging",
    "storage",
    "reload",
    "auth",
    "guarantees",
    "broker",
    "cluster",
    "connection",
    "transport",
    "bridge",
    "admin",
    "server",
];

/// Every top-level module imports only the modules below it in [`STACK`], and every
/// top-level module of `src/` has its place there.
#[test]
fn every_module_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules: Vec<String> = std::fs::read_dir(&src)
        .expect("src/")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let name = name.strip_suffix(".rs").map_or(name.clone(), str::to_owned);
            let file = e.path().is_file();
            (!file || e.path().extension().is_some_and(|x| x == "rs")).then_some(name)
        })
        .filter(|m| !["lib", "main", "layering"].contains(&m.as_str()))
        .collect();
    modules.sort();
    modules.dedup();
    let mut stacked: Vec<String> = STACK.iter().map(|m| (*m).to_owned()).collect();
    stacked.sort();
    assert_eq!(
        modules, stacked,
        "every module of src/ has its place in STACK"
    );
    let mut violations = Vec::new();
    for (at, module) in STACK.iter().enumerate() {
        for (path, depth) in module_files(module) {
            let text = std::fs::read_to_string(&path).expect("a source file of the crate");
            for (line, code) in reaches_outside(module, &STACK[..at], &text, depth) {
                violations.push(format!("{}:{line}: {code}", path.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "these lines import a module above their own in the layering stack:\n{}",
        violations.join("\n")
    );
}

/// Every lower layer imports only what [`LOWER_LAYERS`] allows it.
#[test]
fn the_lower_layers_import_only_what_the_map_allows() {
    let mut violations = Vec::new();
    for (module, allowed) in LOWER_LAYERS {
        let files = module_files(module);
        assert!(!files.is_empty(), "{module}'s files not found");
        for (path, depth) in files {
            let text = std::fs::read_to_string(&path).expect("a source file of the crate");
            for (line, code) in reaches_outside(module, allowed, &text, depth) {
                violations.push(format!("{}:{line}: {code}", path.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "these lines import what docs/ARCHITECTURE.md's layering forbids:\n{}",
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
    let found: Vec<usize> = reaches_outside("metrics", &[], outside, 1)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(found, [1, 2, 3, 4]);
    let inside = "use crate::metrics::names;\nuse super::handles::Counter;\nuse std::sync::Arc;\n";
    assert!(reaches_outside("metrics", &[], inside, 1).is_empty());
    // What a layer may import is inside; a name that merely starts like it is not.
    let config = "use crate::codec::topic;\nuse crate::codecs::X;\nuse crate::storage::Op;\n";
    let found: Vec<usize> = reaches_outside("config", &["codec"], config, 1)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(found, [2, 3]);
    // Inside an inline `mod tests`, one more `super::` is still the module.
    let tests =
        "mod tests {\n    use super::super::Config;\n    use super::super::super::broker;\n";
    let found: Vec<usize> = reaches_outside("config", &[], tests, 1)
        .into_iter()
        .map(|(line, _)| line)
        .collect();
    assert_eq!(found, [3]);
    // At the module's own root, one `super::` is already outside.
    assert_eq!(
        reaches_outside("metrics", &[], "use super::broker;", 0).len(),
        1
    );
}

/// The "Repository layout" of `docs/development.md` (the README's until issue 37) names every
/// entry of `src/`, so the layout a newcomer reads is the tree (issue 36: it had left out
/// `cluster/`, `guarantees/`, `reload/`).
#[test]
fn the_documented_layout_names_every_entry_of_src() {
    let page = include_str!("../docs/development.md");
    let layout = page
        .split("## Repository layout")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/development.md has a Repository layout section");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let shown = if entry.path().is_dir() {
            format!("`src/{name}/`")
        } else {
            format!("`src/{name}`")
        };
        if !layout.contains(&shown) {
            missing.push(shown);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/development.md's layout leaves out {missing:?}"
    );
}
