//! What the criterion benches (`codec`, `routing`, `topic_tree`) share. Each bench is a crate
//! of its own and includes this file as `#[macro_use] mod common;`.

use std::time::Duration;

use criterion::Criterion;

/// The criterion settings of every bench here: short by default because the development
/// machine is shared (override on the command line), with `sample_size` samples.
pub(crate) fn short_config(sample_size: usize) -> Criterion {
    Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

/// The bench's `main`: its `targets` run under [`short_config`] with `sample_size` samples. A
/// macro because criterion's own `criterion_group!`/`criterion_main!` are (they define the
/// functions `main` calls).
macro_rules! short_benches {
    ($sample_size:expr; $($target:path),+ $(,)?) => {
        criterion::criterion_group! {
            name = benches;
            config = common::short_config($sample_size);
            targets = $($target),+
        }
        criterion::criterion_main!(benches);
    };
}
