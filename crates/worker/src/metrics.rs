//! Prometheus metrics of the wire contract ([`backpressure_api::wire::metrics`]), every series
//! labelled with the workload name.
//!
//! ```
//! use backpressure_worker::metrics::Metrics;
//!
//! let metrics = Metrics::new("export-worker");
//! metrics.set_backoff(0.25);
//! let text = metrics.encode();
//! assert!(text.contains(r#"backpressure_backoff_factor{workload="export-worker"} 0.25"#));
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use backpressure_api::wire::metrics as names;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::controller::{Algorithm, Outcome};

type ClassLabels = [(&'static str, &'static str); 1];
type ConfigLabels = [(&'static str, String); 2];

/// The worker's metrics and the registry that exposes them. Cheap to clone (shared atomics).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    backoff: Gauge<f64, AtomicU64>,
    failure_floor: Gauge<f64, AtomicU64>,
    permits: Gauge,
    in_flight: Gauge,
    outcomes: [Counter; 3],
    probes: Counter,
    config_info: Family<ConfigLabels, Gauge>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("backoff", &self.backoff.get())
            .field("permits", &self.permits.get())
            .field("in_flight", &self.in_flight.get())
            .finish_non_exhaustive()
    }
}

/// prometheus-client appends `_total` to counter names itself.
fn counter_name(full: &'static str) -> &'static str {
    full.strip_suffix("_total").unwrap_or(full)
}

impl Metrics {
    /// Metrics for `workload` in a registry of their own.
    pub fn new(workload: &str) -> Self {
        Self::with_registry(workload, |_| {})
    }

    /// Metrics for `workload`; `extra` may register further metrics of the application in the
    /// same registry (they get the workload label too).
    pub fn with_registry(workload: &str, extra: impl FnOnce(&mut Registry)) -> Self {
        let labels = [(
            Cow::Borrowed(names::LABEL_WORKLOAD),
            Cow::Owned(workload.to_owned()),
        )];
        let mut registry = Registry::with_labels(labels.into_iter());
        let backoff = Gauge::<f64, AtomicU64>::default();
        let failure_floor = Gauge::<f64, AtomicU64>::default();
        let permits = Gauge::default();
        let in_flight = Gauge::default();
        let outcome_family = Family::<ClassLabels, Counter>::default();
        let probes = Counter::default();
        let config_info = Family::<ConfigLabels, Gauge>::default();
        registry.register(
            names::BACKOFF,
            "Backoff factor of the worker's backpressure controller, in [0,1]",
            backoff.clone(),
        );
        registry.register(
            names::FAILURE_FLOOR,
            "Share of dependency calls the worker found to fail whatever its concurrency, in [0,1]",
            failure_floor.clone(),
        );
        registry.register(
            names::PERMITS,
            "Messages the worker may process at once right now",
            permits.clone(),
        );
        registry.register(
            names::IN_FLIGHT,
            "Messages being processed",
            in_flight.clone(),
        );
        registry.register(
            counter_name(names::OUTCOMES_TOTAL),
            "Message outcomes by class",
            outcome_family.clone(),
        );
        registry.register(
            counter_name(names::PROBES_TOTAL),
            "Probes sent while fully backed off",
            probes.clone(),
        );
        registry.register(
            names::CONFIG_INFO,
            "The running worker configuration (value 1)",
            config_info.clone(),
        );
        extra(&mut registry);
        let outcomes = Outcome::ALL.map(|o| {
            outcome_family
                .get_or_create(&[(names::LABEL_CLASS, o.class())])
                .clone()
        });
        Metrics {
            registry: Arc::new(registry),
            backoff,
            failure_floor,
            permits,
            in_flight,
            outcomes,
            probes,
            config_info,
        }
    }

    /// Sets the backoff gauge.
    pub fn set_backoff(&self, backoff: f64) {
        self.backoff.set(backoff);
    }

    /// Sets the failure-floor gauge: NaN while the controller does not know its floor (see
    /// [`crate::controller::Controller::floor_estimate`]).
    pub fn set_failure_floor(&self, floor: Option<f64>) {
        self.failure_floor.set(floor.unwrap_or(f64::NAN));
    }

    /// Sets the permits gauge.
    pub fn set_permits(&self, permits: u32) {
        self.permits.set(i64::from(permits));
    }

    /// Sets the in-flight gauge.
    pub fn set_in_flight(&self, in_flight: u32) {
        self.in_flight.set(i64::from(in_flight));
    }

    /// Counts one outcome.
    pub fn record_outcome(&self, outcome: Outcome) {
        self.outcomes[outcome.index()].inc();
    }

    /// Counts one probe.
    pub fn record_probe(&self) {
        self.probes.inc();
    }

    /// Replaces the config info series with the running hash and algorithm.
    pub fn set_config(&self, hash: &str, algorithm: Algorithm) {
        self.config_info.clear();
        self.config_info
            .get_or_create(&[
                (names::LABEL_HASH, hash.to_owned()),
                (names::LABEL_ALGORITHM, algorithm_name(algorithm).to_owned()),
            ])
            .set(1);
    }

    /// The outcome count of a class so far.
    pub fn outcome_count(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome.index()].get()
    }

    /// Probes counted so far.
    pub fn probe_count(&self) -> u64 {
        self.probes.get()
    }

    /// The registry (to expose it elsewhere).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The algorithm's name as in the CRD (`SetPoint`, `RatioThrottle`, `Fixed`, `Off`).
pub fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SetPoint => "SetPoint",
        Algorithm::RatioThrottle => "RatioThrottle",
        Algorithm::Fixed => "Fixed",
        Algorithm::Off => "Off",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// One sample line of the text format: name, labels, value.
    fn parse(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("sample has a value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}').expect("closing brace")),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("label k=v");
                map.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
            out.push((name.to_owned(), map, value.parse().expect("numeric value")));
        }
        out
    }

    #[test]
    fn exposition_uses_the_wire_names_and_labels() {
        let m = Metrics::new("export-worker");
        m.set_backoff(0.5);
        m.set_permits(8);
        m.set_in_flight(3);
        m.record_outcome(Outcome::Success);
        m.record_outcome(Outcome::Success);
        m.record_outcome(Outcome::DependencyFailure);
        m.record_probe();
        m.set_config("abc123def456", Algorithm::SetPoint);
        m.set_config("0123456789ab", Algorithm::RatioThrottle);
        let text = m.encode();
        let samples = parse(&text);

        let names_seen: BTreeSet<&str> = samples.iter().map(|(n, _, _)| n.as_str()).collect();
        let expected: BTreeSet<&str> = [
            names::BACKOFF,
            names::FAILURE_FLOOR,
            names::PERMITS,
            names::IN_FLIGHT,
            names::OUTCOMES_TOTAL,
            names::PROBES_TOTAL,
            names::CONFIG_INFO,
        ]
        .into_iter()
        .collect();
        assert_eq!(names_seen, expected, "{text}");
        for (name, labels, _) in &samples {
            assert_eq!(
                labels.get(names::LABEL_WORKLOAD).map(String::as_str),
                Some("export-worker"),
                "{name} lacks the workload label"
            );
        }
        let value = |name: &str, extra: &[(&str, &str)]| -> Vec<f64> {
            samples
                .iter()
                .filter(|(n, l, _)| {
                    n == name
                        && extra
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|(_, _, v)| *v)
                .collect()
        };
        assert_eq!(value(names::BACKOFF, &[]), vec![0.5]);
        assert_eq!(value(names::PERMITS, &[]), vec![8.0]);
        assert_eq!(value(names::IN_FLIGHT, &[]), vec![3.0]);
        assert_eq!(value(names::PROBES_TOTAL, &[]), vec![1.0]);
        for (class, count) in names::CLASSES.iter().zip([2.0, 1.0, 0.0]) {
            assert_eq!(
                value(names::OUTCOMES_TOTAL, &[(names::LABEL_CLASS, class)]),
                vec![count],
                "class {class}"
            );
        }
        // Only the running config is reported, with both labels.
        let info: Vec<_> = samples
            .iter()
            .filter(|(n, _, _)| n == names::CONFIG_INFO)
            .collect();
        assert_eq!(info.len(), 1, "{text}");
        assert_eq!(info[0].1[names::LABEL_HASH], "0123456789ab");
        assert_eq!(info[0].1[names::LABEL_ALGORITHM], "RatioThrottle");
        assert_eq!(info[0].2, 1.0);
        // Every outcome series carries exactly workload + class.
        for (n, labels, _) in &samples {
            if n == names::OUTCOMES_TOTAL {
                let keys: Vec<&str> = labels.keys().map(String::as_str).collect();
                let mut want = vec![names::LABEL_CLASS, names::LABEL_WORKLOAD];
                want.sort_unstable();
                assert_eq!(keys, want);
            }
        }
    }

    #[test]
    fn extra_metrics_share_the_registry_and_label() {
        let m = Metrics::with_registry("w", |r| {
            r.register("app_things", "things", Counter::<u64>::default());
        });
        assert!(m.encode().contains(r#"app_things_total{workload="w"} 0"#));
    }
}
