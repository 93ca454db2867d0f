//! Prometheus metrics of the wire contract ([`backpressure_api::wire::metrics`]), every series
//! labelled with the workload name.
//!
//! A registry exposes the worker's metrics, the producer gate's
//! ([`crate::producer::ProducerGate`]) or both ([`Parts`]): a producer-only pod does not export
//! permits and backoff it does not have, and a worker does not export a gate it does not run.
//! Every family has a fixed set of series (the producer ones one per [`GateState::ALL`]).
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

use backpressure_api::wire::GateState;
use backpressure_api::wire::metrics as names;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::controller::{Algorithm, Outcome};

type ClassLabels = [(&'static str, &'static str); 1];
type ConfigLabels = [(&'static str, String); 2];
type StateLabels = [(&'static str, &'static str); 1];

/// Which metric families a registry exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    /// The worker's: backoff, failure floor, permits, in flight, outcomes, probes, config info.
    pub worker: bool,
    /// The producer gate's: admitted, refused, state, rate limit.
    pub producer: bool,
}

impl Parts {
    /// A worker pod.
    pub const WORKER: Parts = Parts {
        worker: true,
        producer: false,
    };
    /// A producer pod that processes no messages.
    pub const PRODUCER: Parts = Parts {
        worker: false,
        producer: true,
    };
    /// A pod that is both (a pipeline stage: a worker of one queue, a producer of the next).
    pub const BOTH: Parts = Parts {
        worker: true,
        producer: true,
    };
}

/// The index of `state` in [`GateState::ALL`].
fn state_index(state: GateState) -> usize {
    match state {
        GateState::Open => 0,
        GateState::Throttled => 1,
        GateState::Paused => 2,
    }
}

/// The producer gate's series.
#[derive(Clone)]
struct ProducerSeries {
    admitted: Counter,
    refused: [Counter; 3],
    state: [Gauge; 3],
    rate_limit: Gauge<f64, AtomicU64>,
}

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
    producer: ProducerSeries,
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
    /// A worker's metrics for `workload` in a registry of their own.
    pub fn new(workload: &str) -> Self {
        Self::with_registry(workload, |_| {})
    }

    /// A producer pod's metrics (the producer gate's only) for `workload`, the producer
    /// workload's name.
    pub fn producer(workload: &str) -> Self {
        Self::with_parts(workload, Parts::PRODUCER, |_| {})
    }

    /// A worker's metrics for `workload`; `extra` may register further metrics of the
    /// application in the same registry (they get the workload label too).
    pub fn with_registry(workload: &str, extra: impl FnOnce(&mut Registry)) -> Self {
        Self::with_parts(workload, Parts::WORKER, extra)
    }

    /// The `parts` for `workload`, and `extra` metrics of the application (see
    /// [`Metrics::with_registry`]). The setters of a part not exposed still work; their series
    /// are just not exported.
    pub fn with_parts(workload: &str, parts: Parts, extra: impl FnOnce(&mut Registry)) -> Self {
        let labels = [(
            Cow::Borrowed(names::LABEL_WORKLOAD),
            Cow::Owned(workload.to_owned()),
        )];
        let mut registry = Registry::with_labels(labels.into_iter());
        // Each labelled series is created once, here, and kept: the families' sets of series
        // are fixed whatever happens later.
        let outcome_family = Family::<ClassLabels, Counter>::default();
        let refused_family = Family::<StateLabels, Counter>::default();
        let state_family = Family::<StateLabels, Gauge>::default();
        let by_state = |s: GateState| [(names::LABEL_STATE, s.as_str())];
        let mut metrics = Metrics {
            registry: Arc::new(Registry::default()),
            backoff: Gauge::default(),
            failure_floor: Gauge::default(),
            permits: Gauge::default(),
            in_flight: Gauge::default(),
            outcomes: Outcome::ALL.map(|o| {
                outcome_family
                    .get_or_create(&[(names::LABEL_CLASS, o.class())])
                    .clone()
            }),
            probes: Counter::default(),
            config_info: Family::default(),
            producer: ProducerSeries {
                admitted: Counter::default(),
                refused: GateState::ALL.map(|s| refused_family.get_or_create(&by_state(s)).clone()),
                state: GateState::ALL.map(|s| state_family.get_or_create(&by_state(s)).clone()),
                rate_limit: Gauge::default(),
            },
        };
        metrics.set_producer_state(GateState::Open, None);
        if parts.worker {
            metrics.register_worker(&mut registry, outcome_family);
        }
        if parts.producer {
            metrics.register_producer(&mut registry, refused_family, state_family);
        }
        extra(&mut registry);
        metrics.registry = Arc::new(registry);
        metrics
    }

    fn register_worker(&self, registry: &mut Registry, outcomes: Family<ClassLabels, Counter>) {
        registry.register(
            names::BACKOFF,
            "Backoff factor of the worker's backpressure controller, in [0,1]",
            self.backoff.clone(),
        );
        registry.register(
            names::FAILURE_FLOOR,
            "Share of dependency calls the worker found to fail whatever its concurrency, in [0,1]",
            self.failure_floor.clone(),
        );
        registry.register(
            names::PERMITS,
            "Messages the worker may process at once right now",
            self.permits.clone(),
        );
        registry.register(
            names::IN_FLIGHT,
            "Messages being processed",
            self.in_flight.clone(),
        );
        registry.register(
            counter_name(names::OUTCOMES_TOTAL),
            "Message outcomes by class",
            outcomes,
        );
        registry.register(
            counter_name(names::PROBES_TOTAL),
            "Probes sent while fully backed off",
            self.probes.clone(),
        );
        registry.register(
            names::CONFIG_INFO,
            "The running worker configuration (value 1)",
            self.config_info.clone(),
        );
    }

    fn register_producer(
        &self,
        registry: &mut Registry,
        refused: Family<StateLabels, Counter>,
        state: Family<StateLabels, Gauge>,
    ) {
        registry.register(
            counter_name(names::PRODUCER_ADMITTED_TOTAL),
            "Messages the producer gate admitted",
            self.producer.admitted.clone(),
        );
        registry.register(
            counter_name(names::PRODUCER_REFUSED_TOTAL),
            "Admissions the producer gate refused (the caller waited or got a retry-after; nothing is dropped), by gate state",
            refused,
        );
        registry.register(
            names::PRODUCER_STATE,
            "The producer gate's state: 1 for the state running, 0 for the others",
            state,
        );
        registry.register(
            names::PRODUCER_RATE_LIMIT,
            "Messages per second the producer gate admits while throttled (NaN otherwise)",
            self.producer.rate_limit.clone(),
        );
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

    /// Counts one message the producer gate admitted.
    pub fn record_producer_admitted(&self) {
        self.producer.admitted.inc();
    }

    /// Counts one admission the producer gate refused while in `state`.
    pub fn record_producer_refused(&self, state: GateState) {
        self.producer.refused[state_index(state)].inc();
    }

    /// Sets the producer gate's state gauges (1 for `state`, 0 for the others) and its rate
    /// limit (NaN unless throttled).
    pub fn set_producer_state(&self, state: GateState, rate_per_second: Option<f64>) {
        for s in GateState::ALL {
            self.producer.state[state_index(s)].set(i64::from(s == state));
        }
        let rate = match (state, rate_per_second) {
            (GateState::Throttled, Some(r)) => r,
            _ => f64::NAN,
        };
        self.producer.rate_limit.set(rate);
    }

    /// Messages the producer gate admitted so far.
    pub fn producer_admitted_count(&self) -> u64 {
        self.producer.admitted.get()
    }

    /// Admissions the producer gate refused in `state` so far.
    pub fn producer_refused_count(&self, state: GateState) -> u64 {
        self.producer.refused[state_index(state)].get()
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

    #[tokio::test]
    async fn the_producer_gate_exports_fixed_series_with_the_wire_names_and_labels() {
        use backpressure_api::wire::ProducerConfig;

        use crate::config::Origin;
        use crate::producer::{Admission, ProducerGate};

        let m = Metrics::producer("orders-api");
        let gate = ProducerGate::new(Some(m.clone()));
        let samples = parse(&m.encode());
        let names_seen: BTreeSet<&str> = samples.iter().map(|(n, _, _)| n.as_str()).collect();
        let expected: BTreeSet<&str> = [
            names::PRODUCER_ADMITTED_TOTAL,
            names::PRODUCER_REFUSED_TOTAL,
            names::PRODUCER_STATE,
            names::PRODUCER_RATE_LIMIT,
        ]
        .into_iter()
        .collect();
        assert_eq!(
            names_seen, expected,
            "a producer pod exports no worker metrics"
        );
        // Every series from the start: one per state for the labelled families.
        let series = |samples: &[(String, BTreeMap<String, String>, f64)], name: &str| {
            samples
                .iter()
                .filter(|(n, _, _)| n == name)
                .map(|(_, l, v)| (l.get(names::LABEL_STATE).cloned().unwrap_or_default(), *v))
                .collect::<BTreeMap<String, f64>>()
        };
        let all_states = |values: &[f64; 3]| {
            GateState::ALL
                .iter()
                .zip(values)
                .map(|(s, v)| (s.as_str().to_owned(), *v))
                .collect::<BTreeMap<String, f64>>()
        };
        assert_eq!(
            series(&samples, names::PRODUCER_STATE),
            all_states(&[1.0, 0.0, 0.0])
        );
        assert_eq!(
            series(&samples, names::PRODUCER_REFUSED_TOTAL),
            all_states(&[0.0; 3])
        );
        assert!(series(&samples, names::PRODUCER_RATE_LIMIT)[""].is_nan());
        for (name, labels, _) in &samples {
            assert_eq!(
                labels.get(names::LABEL_WORKLOAD).map(String::as_str),
                Some("orders-api"),
                "{name} lacks the workload label"
            );
            let keys: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
            let labelled = name == names::PRODUCER_STATE || name == names::PRODUCER_REFUSED_TOTAL;
            let want: BTreeSet<&str> = if labelled {
                [names::LABEL_WORKLOAD, names::LABEL_STATE].into()
            } else {
                [names::LABEL_WORKLOAD].into()
            };
            assert_eq!(keys, want, "{name}");
        }

        assert_eq!(gate.try_admit(), Admission::Admitted);
        let throttled = ProducerConfig {
            generation: 1,
            state: GateState::Throttled,
            rate_per_second: Some(2.5),
            ..ProducerConfig::default()
        }
        .with_hash();
        gate.apply(throttled, Origin::Push).unwrap();
        assert_eq!(gate.try_admit(), Admission::Admitted);
        assert!(matches!(gate.try_admit(), Admission::RetryAfter(_)));
        let samples = parse(&m.encode());
        assert_eq!(
            series(&samples, names::PRODUCER_STATE),
            all_states(&[0.0, 1.0, 0.0])
        );
        assert_eq!(
            series(&samples, names::PRODUCER_REFUSED_TOTAL),
            all_states(&[0.0, 1.0, 0.0])
        );
        assert_eq!(series(&samples, names::PRODUCER_RATE_LIMIT)[""], 2.5);
        assert_eq!(series(&samples, names::PRODUCER_ADMITTED_TOTAL)[""], 2.0);

        let paused = ProducerConfig {
            generation: 2,
            state: GateState::Paused,
            ..ProducerConfig::default()
        }
        .with_hash();
        gate.apply(paused, Origin::Push).unwrap();
        assert!(matches!(gate.try_admit(), Admission::RetryAfter(_)));
        let samples = parse(&m.encode());
        assert_eq!(
            series(&samples, names::PRODUCER_STATE),
            all_states(&[0.0, 0.0, 1.0])
        );
        assert_eq!(
            series(&samples, names::PRODUCER_REFUSED_TOTAL),
            all_states(&[0.0, 1.0, 1.0])
        );
        assert!(series(&samples, names::PRODUCER_RATE_LIMIT)[""].is_nan());

        // A pod that is both exports both, the worker's unchanged.
        let both = Metrics::with_parts("stage-2", Parts::BOTH, |_| {});
        let samples = parse(&both.encode());
        let seen: BTreeSet<&str> = samples.iter().map(|(n, _, _)| n.as_str()).collect();
        assert!(
            seen.contains(names::PERMITS) && seen.contains(names::PRODUCER_STATE),
            "{seen:?}"
        );
        assert_eq!(
            samples
                .iter()
                .filter(|(n, _, _)| n == names::PRODUCER_STATE)
                .count(),
            GateState::ALL.len()
        );
    }

    #[test]
    fn extra_metrics_share_the_registry_and_label() {
        let m = Metrics::with_registry("w", |r| {
            r.register("app_things", "things", Counter::<u64>::default());
        });
        assert!(m.encode().contains(r#"app_things_total{workload="w"} 0"#));
    }
}
