//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) on the stable toolchain, through
//! the same functions the cargo-fuzz targets call (`fuzz/checks/mod.rs`), so every input the
//! fuzzer kept (and every crash it found, once fixed) is checked by plain `cargo test`, without
//! cargo-fuzz or nightly. A finding is a panic in a check: this test names the file.

#[path = "../../fuzz/checks/mod.rs"]
mod checks;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Every file of every target's corpus goes through its check; all failures are listed at once.
#[test]
fn corpus_replays_without_findings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut failures = Vec::new();
    let mut replayed = 0usize;
    for (target, check) in checks::TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.expect("listing the corpus").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(
            !files.is_empty(),
            "{} holds no corpus: run cargo fuzz cmin (fuzz/README.md)",
            dir.display()
        );
        for file in files {
            let data = std::fs::read(&file).expect("reading a corpus file");
            if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                failures.push(file.display().to_string());
            }
            replayed += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {replayed} corpus files fail their check: {failures:#?}",
        failures.len()
    );
}
