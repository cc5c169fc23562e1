//! Thin handles over the `prometheus` crate's metric types, with the method names the call
//! sites used under the `metrics` facade (`increment`, `absolute`, `set`, `decrement`,
//! `record`) plus `get()`: the figures are readable in-process (`$SYS`, the admin API, tests),
//! which the write-only facade handles were not.
//!
//! Each handle is an `Arc` to the metric's atomics, shared with the registry it was
//! registered in: updating one is an atomic add (a compare-and-swap loop for `f64` gauges),
//! no lock and no allocation.

/// A monotonically increasing integer count (`_total`).
#[derive(Clone, Debug)]
pub struct Counter(pub(super) prometheus::IntCounter);

impl Counter {
    /// A counter registered nowhere: for code paths that need a handle but no exported
    /// series (unit tests of a single component).
    pub fn detached() -> Counter {
        Counter(prometheus::IntCounter::new("detached", "detached").expect("valid name"))
    }

    /// Adds `n`.
    #[inline]
    pub fn increment(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// Raises the counter to `value` (a figure counted elsewhere, copied at scrape time); a
    /// lower value is ignored, so the counter never goes backwards.
    pub fn absolute(&self, value: u64) {
        let current = self.0.get();
        if value > current {
            self.0.inc_by(value - current);
        }
    }

    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// A value that goes up and down (`f64`, as Prometheus samples are).
#[derive(Clone, Debug)]
pub struct Gauge(pub(super) prometheus::Gauge);

impl Gauge {
    /// A gauge registered nowhere: a component built outside a broker (unit tests) still
    /// gets a handle to write to, so it needs no `Option` on its hot path.
    pub fn detached() -> Gauge {
        Gauge(prometheus::Gauge::new("detached", "detached").expect("valid name"))
    }

    /// Adds `v`.
    #[inline]
    pub fn increment(&self, v: f64) {
        self.0.add(v);
    }

    /// Subtracts `v`.
    #[inline]
    pub fn decrement(&self, v: f64) {
        self.0.sub(v);
    }

    /// Sets the value.
    #[inline]
    pub fn set(&self, v: f64) {
        self.0.set(v);
    }

    /// The current value.
    pub fn get(&self) -> f64 {
        self.0.get()
    }
}

/// A distribution of observations in fixed buckets (latencies, in seconds).
#[derive(Clone, Debug)]
pub struct Histogram(pub(super) prometheus::Histogram);

impl Histogram {
    /// Records one observation.
    #[inline]
    pub fn record(&self, v: f64) {
        self.0.observe(v);
    }

    /// Observations recorded so far.
    pub fn count(&self) -> u64 {
        self.0.get_sample_count()
    }

    /// The sum of the observations recorded so far.
    pub fn sum(&self) -> f64 {
        self.0.get_sample_sum()
    }
}

/// Registers metrics in one registry; a name registered twice is a programming error (the
/// names are constants), hence the panics. Owners get one from
/// [`super::Metrics::registrar`] to declare their own group against the broker's registry,
/// so `metrics` needs to know none of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reg<'a>(pub(super) &'a prometheus::Registry);

impl Reg<'_> {
    /// Registers `collector`.
    fn add(self, collector: impl prometheus::core::Collector + 'static) {
        self.0
            .register(Box::new(collector))
            .expect("metric names are unique and valid");
    }

    /// An unlabelled counter.
    pub(crate) fn counter(self, name: &str, help: &str) -> Counter {
        let c = prometheus::IntCounter::new(name, help).expect("valid metric name");
        self.add(c.clone());
        Counter(c)
    }

    /// A labelled counter family; take handles with [`counter_of`].
    pub(super) fn counter_vec(
        self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::IntCounterVec {
        let v = prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), labels)
            .expect("valid metric name");
        self.add(v.clone());
        v
    }

    /// An unlabelled gauge.
    pub(crate) fn gauge(self, name: &str, help: &str) -> Gauge {
        let g = prometheus::Gauge::new(name, help).expect("valid metric name");
        self.add(g.clone());
        Gauge(g)
    }

    /// A labelled gauge family; take handles with [`gauge_of`].
    pub(super) fn gauge_vec(self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        let v = prometheus::GaugeVec::new(prometheus::Opts::new(name, help), labels)
            .expect("valid metric name");
        self.add(v.clone());
        v
    }

    /// An unlabelled histogram with `buckets` (upper bounds, ascending).
    pub(crate) fn histogram(self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let h = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(name, help).buckets(buckets),
        )
        .expect("valid metric name and buckets");
        self.add(h.clone());
        Histogram(h)
    }
}

impl Reg<'_> {
    /// A counter family with one `label`, for an owner's group; take its children at once.
    pub(crate) fn counter_family(self, name: &str, help: &str, label: &str) -> CounterFamily {
        CounterFamily(self.counter_vec(name, help, &[label]))
    }
}

/// A counter family with one label, for an owner's group (`storage`, `guarantees`,
/// `cluster`): wraps the backend's type so owners name no `prometheus` item. Its label's
/// values are all known: [`CounterFamily::counters`] takes every child at registration.
#[derive(Clone, Debug)]
pub(crate) struct CounterFamily(pub(super) prometheus::IntCounterVec);

impl CounterFamily {
    /// One counter per value of `values`, in their order: every series is exported at 0 from
    /// the start, and no label is looked up afterwards (the owner keeps the [`Counter`]s).
    pub(crate) fn counters<const N: usize>(&self, values: [&str; N]) -> [Counter; N] {
        values.map(|value| counter_of(&self.0, &[value]))
    }
}

/// The counter of `family` with these label values (created on first use, then shared).
pub(super) fn counter_of(family: &prometheus::IntCounterVec, values: &[&str]) -> Counter {
    Counter(family.with_label_values(values))
}

/// The gauge of `family` with these label values.
pub(super) fn gauge_of(family: &prometheus::GaugeVec, values: &[&str]) -> Gauge {
    Gauge(family.with_label_values(values))
}
