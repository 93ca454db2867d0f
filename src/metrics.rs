//! The operator's own metrics, exactly as listed in `charts/backpressure-operator/METRICS.md`.
//! No label identifies an object: cardinality is fixed however many objects there are.

use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::{Action, Regime};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::act::push::PushRecorder;
use crate::observe::prometheus::QueryRecorder;
use crate::observe::promql::MetricKind;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegimeLabel {
    regime: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    regime: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabel {
    category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabel {
    query: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
enum ReplicaType {
    #[allow(non_camel_case_types)]
    current,
    #[allow(non_camel_case_types)]
    desired,
    #[allow(non_camel_case_types)]
    recommended,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReplicaLabel {
    r#type: ReplicaType,
}

/// Fleet-wide numbers computed from the objects' statuses after a pass.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FleetGauges {
    /// Objects per regime.
    pub per_regime: Vec<(Regime, i64)>,
    /// Objects with ScaleOutHeld=True.
    pub held: i64,
    /// Objects with Ramping=True.
    pub ramping: i64,
    /// Objects with ConfigInSync=False.
    pub config_out_of_sync: i64,
    /// Sums of current, desired, recommended replicas.
    pub replicas: (i64, i64, i64),
}

impl FleetGauges {
    /// Computes the gauges from the objects' statuses.
    pub fn from_objects<'a>(
        objects: impl IntoIterator<Item = &'a backpressure_api::WorkerBackpressure>,
    ) -> Self {
        use backpressure_api::conditions as cond;
        let mut g = FleetGauges {
            per_regime: Regime::ALL.iter().map(|r| (*r, 0)).collect(),
            ..Default::default()
        };
        for w in objects {
            let Some(s) = w.status.as_ref() else { continue };
            if let Some(r) = s.regime
                && let Some(slot) = g.per_regime.iter_mut().find(|(x, _)| *x == r)
            {
                slot.1 += 1;
            }
            let is = |t: &str, v: &str| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == t && c.status == v)
            };
            g.held += i64::from(is(cond::SCALE_OUT_HELD, "True"));
            g.ramping += i64::from(is(cond::RAMPING, "True"));
            g.config_out_of_sync += i64::from(is(cond::CONFIG_IN_SYNC, "False"));
            if let Some(r) = &s.replicas {
                g.replicas.0 += i64::from(r.current);
                g.replicas.1 += i64::from(r.desired);
                g.replicas.2 += i64::from(r.recommended);
            }
        }
        g
    }
}

/// All operator metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    objects: Family<RegimeLabel, Gauge>,
    held: Gauge,
    ramping: Gauge,
    out_of_sync: Gauge,
    replicas: Family<ReplicaLabel, Gauge>,
    decisions: Family<DecisionLabels, Counter>,
    ramp_aborts: Counter,
    reconciles: Family<ResultLabel, Counter>,
    reconcile_errors: Family<CategoryLabel, Counter>,
    reconcile_duration: Histogram,
    query_errors: Family<QueryLabel, Counter>,
    query_duration: Family<QueryLabel, Histogram>,
    pushes: Family<ResultLabel, Counter>,
    leader: Gauge<i64, AtomicI64>,
}

fn query_buckets() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            objects: Family::default(),
            held: Gauge::default(),
            ramping: Gauge::default(),
            out_of_sync: Gauge::default(),
            replicas: Family::default(),
            decisions: Family::default(),
            ramp_aborts: Counter::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            query_errors: Family::default(),
            query_duration: Family::new_with_constructor(query_buckets),
            pushes: Family::default(),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        let p = "backpressure_operator";
        registry.register(
            format!("{p}_objects"),
            "WorkerBackpressure objects per regime",
            m.objects.clone(),
        );
        registry.register(
            format!("{p}_held_objects"),
            "Objects with ScaleOutHeld=True",
            m.held.clone(),
        );
        registry.register(
            format!("{p}_ramping_objects"),
            "Objects with Ramping=True",
            m.ramping.clone(),
        );
        registry.register(
            format!("{p}_config_out_of_sync_objects"),
            "Objects with ConfigInSync=False",
            m.out_of_sync.clone(),
        );
        registry.register(
            format!("{p}_replicas"),
            "Sum of replicas over all objects",
            m.replicas.clone(),
        );
        registry.register(
            format!("{p}_decisions"),
            "Decisions by regime and action",
            m.decisions.clone(),
        );
        registry.register(
            format!("{p}_ramp_aborts"),
            "Ramps aborted back to hold",
            m.ramp_aborts.clone(),
        );
        registry.register(
            format!("{p}_reconciles"),
            "Reconciles finished",
            m.reconciles.clone(),
        );
        registry.register(
            format!("{p}_reconcile_errors"),
            "Failed reconciles by what failed",
            m.reconcile_errors.clone(),
        );
        registry.register(
            format!("{p}_reconcile_duration_seconds"),
            "Duration of one reconcile",
            m.reconcile_duration.clone(),
        );
        registry.register(
            format!("{p}_prometheus_query_errors"),
            "Failed batched Prometheus queries",
            m.query_errors.clone(),
        );
        registry.register(
            format!("{p}_prometheus_query_duration_seconds"),
            "Duration of one batched Prometheus query",
            m.query_duration.clone(),
        );
        registry.register(
            format!("{p}_config_pushes"),
            "Worker config pushes to pods",
            m.pushes.clone(),
        );
        registry.register(
            format!("{p}_leader"),
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        // Export every label value from the start.
        for r in Regime::ALL {
            m.objects
                .get_or_create(&RegimeLabel { regime: r.as_str() })
                .set(0);
        }
        for t in [
            ReplicaType::current,
            ReplicaType::desired,
            ReplicaType::recommended,
        ] {
            m.replicas.get_or_create(&ReplicaLabel { r#type: t }).set(0);
        }
        for result in ["success", "error"] {
            let _ = m.reconciles.get_or_create(&ResultLabel { result });
        }
        for result in ["success", "failure"] {
            let _ = m.pushes.get_or_create(&ResultLabel { result });
        }
        for k in MetricKind::ALL {
            let _ = m
                .query_errors
                .get_or_create(&QueryLabel { query: k.as_str() });
        }
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Starts timing a reconcile; the result is recorded when the timer is dropped (also on
    /// an early return or a panic unwinding through the reconcile).
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
            ok: false,
        }
    }

    /// Exports `backpressure_operator_reconcile_errors_total` with each of `categories` (what
    /// a reconcile error can be, `ReconcileError::CATEGORIES`) at zero, so every label value is
    /// there from the start.
    pub fn export_reconcile_error_categories(&self, categories: &[&'static str]) {
        for &category in categories {
            let _ = self
                .reconcile_errors
                .get_or_create(&CategoryLabel { category });
        }
    }

    /// Counts a decision.
    pub fn decision(&self, regime: Regime, action: Action) {
        self.decisions
            .get_or_create(&DecisionLabels {
                regime: regime.as_str(),
                action: action.as_str(),
            })
            .inc();
        if action == Action::AbortRamp {
            self.ramp_aborts.inc();
        }
    }

    /// Records one batched query.
    pub fn observe_query(&self, kind: MetricKind, took: Duration, ok: bool) {
        let l = QueryLabel {
            query: kind.as_str(),
        };
        self.query_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
        if !ok {
            self.query_errors.get_or_create(&l).inc();
        }
    }

    /// Counts a config push.
    pub fn push(&self, ok: bool) {
        self.pushes
            .get_or_create(&ResultLabel {
                result: if ok { "success" } else { "failure" },
            })
            .inc();
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Sets the fleet gauges (all zero on a replica that is not the leader).
    pub fn set_fleet(&self, g: &FleetGauges) {
        for r in Regime::ALL {
            let n = g
                .per_regime
                .iter()
                .find(|(x, _)| *x == r)
                .map_or(0, |(_, n)| *n);
            self.objects
                .get_or_create(&RegimeLabel { regime: r.as_str() })
                .set(n);
        }
        self.held.set(g.held);
        self.ramping.set(g.ramping);
        self.out_of_sync.set(g.config_out_of_sync);
        self.replicas
            .get_or_create(&ReplicaLabel {
                r#type: ReplicaType::current,
            })
            .set(g.replicas.0);
        self.replicas
            .get_or_create(&ReplicaLabel {
                r#type: ReplicaType::desired,
            })
            .set(g.replicas.1);
        self.replicas
            .get_or_create(&ReplicaLabel {
                r#type: ReplicaType::recommended,
            })
            .set(g.replicas.2);
    }
}

impl QueryRecorder for Metrics {
    fn record_query(&self, kind: MetricKind, took: Duration, ok: bool) {
        self.observe_query(kind, took, ok);
    }
}

impl PushRecorder for Metrics {
    fn record_push(&self, ok: bool) {
        self.push(ok);
    }
}

/// Records a reconcile's duration and result when dropped.
#[derive(Debug)]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
    ok: bool,
}

impl ReconcileTimer<'_> {
    /// Marks the reconcile as successful.
    pub fn success(mut self) {
        self.ok = true;
    }

    /// Marks the reconcile as failed, and counts the failure under `category` (a fixed value
    /// per kind of error: the label's cardinality stays fixed). A timer dropped without either
    /// (a reconcile cancelled at shutdown, or a panic) counts as an error without a category.
    pub fn failure(self, category: &'static str) {
        self.metrics
            .reconcile_errors
            .get_or_create(&CategoryLabel { category })
            .inc();
    }
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .observe(self.start.elapsed().as_secs_f64());
        let result = if self.ok { "success" } else { "error" };
        self.metrics
            .reconciles
            .get_or_create(&ResultLabel { result })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_the_documented_names_without_object_labels() {
        let m = Metrics::default();
        m.decision(Regime::DependencyFailing, Action::HoldScaleOut);
        m.observe_query(MetricKind::Backoff, Duration::from_millis(3), false);
        m.push(true);
        m.reconcile_timer().success();
        m.reconcile_timer().failure("status");
        let text = m.encode();
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/backpressure-operator/METRICS.md"
        ))
        .unwrap_or_default();
        for name in [
            "backpressure_operator_objects{regime=\"Healthy\"} 0",
            "backpressure_operator_held_objects 0",
            "backpressure_operator_ramping_objects 0",
            "backpressure_operator_config_out_of_sync_objects 0",
            "backpressure_operator_replicas{type=\"current\"} 0",
            "backpressure_operator_decisions_total{regime=\"DependencyFailing\",action=\"HoldScaleOut\"} 1",
            "backpressure_operator_ramp_aborts_total 0",
            "backpressure_operator_reconciles_total{result=\"success\"} 1",
            "backpressure_operator_reconciles_total{result=\"error\"} 1",
            "backpressure_operator_reconcile_errors_total{category=\"status\"} 1",
            "backpressure_operator_reconcile_duration_seconds_count 2",
            "backpressure_operator_prometheus_query_errors_total{query=\"backoff\"} 1",
            "backpressure_operator_prometheus_query_duration_seconds_count{query=\"backoff\"} 1",
            "backpressure_operator_config_pushes_total{result=\"success\"} 1",
            "backpressure_operator_leader 0",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
            let metric = name.split(['{', ' ']).next().unwrap_or_default();
            let documented = metric.trim_end_matches("_count").trim_end_matches("_sum");
            assert!(
                doc.contains(documented),
                "{documented} is not in METRICS.md"
            );
        }
        for forbidden in ["namespace=", "name=", "workload="] {
            assert!(
                !text.contains(forbidden),
                "per-object label {forbidden} exported"
            );
        }
    }
}
