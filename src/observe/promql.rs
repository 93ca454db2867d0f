//! The fleet metric kinds, their default PromQL, and how a batched result is read.
//!
//! Every query returns one series per workload, labelled `namespace` and `workload`, for *all*
//! workloads at once: the operator runs each distinct query once per interval per Prometheus and
//! picks each object's series from the result. Every query also returns, in the same response,
//! the timestamps of the samples its values come from (`bp_sample="timestamp"`): the default
//! queries the newest sample of their one metric per workload, the overrides and the queue
//! presets those of every selector they read ([`backpressure_core::freshness`]). A value older
//! than `staleAfter`, or with no timestamp, is unknown rather than trusted.

use std::collections::HashMap;
use std::time::Duration;

use backpressure_api::duration::format_duration;
use backpressure_api::wire::metrics as m;
use backpressure_core::tenancy::FleetQueries;

pub use backpressure_core::freshness::{SAMPLE_LABEL, SAMPLE_TIMESTAMP};

/// The fleet metrics the operator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetricKind {
    /// Mean backoff factor of the fleet.
    Backoff,
    /// Dependency failures per attempt.
    FailureRate,
    /// Age of the oldest first-attempt message.
    QueueAge,
    /// Messages waiting.
    QueueDepth,
    /// Arrivals per second.
    ArrivalRate,
    /// Completions per second.
    CompletionRate,
    /// Mean failure floor of the fleet (`backpressure_failure_floor`): optional, workers that
    /// do not export it read as no floor.
    FailureFloor,
    /// The most consumers that can work at once (Kafka partitions): only from a queue preset,
    /// optional (unknown means no cap).
    Partitions,
}

impl MetricKind {
    /// Every kind, in a fixed order.
    pub const ALL: [MetricKind; 8] = [
        MetricKind::Backoff,
        MetricKind::FailureRate,
        MetricKind::QueueAge,
        MetricKind::QueueDepth,
        MetricKind::ArrivalRate,
        MetricKind::CompletionRate,
        MetricKind::FailureFloor,
        MetricKind::Partitions,
    ];

    /// The field name in `spec.metrics.queries`, also the `query` label of the operator's own
    /// metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Backoff => "backoff",
            MetricKind::FailureRate => "failureRate",
            MetricKind::QueueAge => "queueAge",
            MetricKind::QueueDepth => "queueDepth",
            MetricKind::ArrivalRate => "arrivalRate",
            MetricKind::CompletionRate => "completionRate",
            MetricKind::FailureFloor => "failureFloor",
            MetricKind::Partitions => "partitions",
        }
    }

    /// Whether the kind describes the queue (its samples may be as old as
    /// `spec.queue.staleAfter`) rather than the workers.
    pub fn is_queue(self) -> bool {
        matches!(
            self,
            MetricKind::QueueAge
                | MetricKind::QueueDepth
                | MetricKind::ArrivalRate
                | MetricKind::CompletionRate
                | MetricKind::Partitions
        )
    }

    /// The query for this kind: the object's (an override or a queue preset, as
    /// [`backpressure_core::tenancy::scoped_queries`] left it) if it has one, else the default;
    /// `None` for a kind without a default the object does not ask for.
    pub fn query(self, queries: &FleetQueries, rate_window: Duration) -> Option<String> {
        let o = &queries.queries;
        let own = match self {
            MetricKind::Backoff => o.backoff.clone(),
            MetricKind::FailureRate => o.failure_rate.clone(),
            MetricKind::QueueAge => o.queue_age.clone(),
            MetricKind::QueueDepth => o.queue_depth.clone(),
            MetricKind::ArrivalRate => o.arrival_rate.clone(),
            MetricKind::CompletionRate => o.completion_rate.clone(),
            // Not overridable: it is the worker library's own gauge.
            MetricKind::FailureFloor => None,
            MetricKind::Partitions => return queries.partitions.clone(),
        };
        own.or_else(|| self.default_query(rate_window))
    }

    /// The default query, built from the wire contract's metric names; none for
    /// [`MetricKind::Partitions`], which only a queue preset asks for.
    pub fn default_query(self, rate_window: Duration) -> Option<String> {
        let w = format_duration(rate_window);
        let by = format!("by ({}, {})", m::LABEL_NAMESPACE, m::LABEL_WORKLOAD);
        let (value, underlying) = match self {
            MetricKind::Backoff => (format!("avg {by} ({})", m::BACKOFF), m::BACKOFF),
            MetricKind::FailureRate => (
                format!(
                    "sum {by} (rate({o}{{{c}=\"{f}\"}}[{w}])) / sum {by} (rate({o}{{{c}=~\"{s}|{f}\"}}[{w}]))",
                    o = m::OUTCOMES_TOTAL,
                    c = m::LABEL_CLASS,
                    f = m::CLASS_DEPENDENCY_FAILURE,
                    s = m::CLASS_SUCCESS,
                ),
                m::OUTCOMES_TOTAL,
            ),
            MetricKind::QueueAge => (format!("max {by} ({})", m::QUEUE_AGE), m::QUEUE_AGE),
            MetricKind::QueueDepth => (format!("sum {by} ({})", m::QUEUE_DEPTH), m::QUEUE_DEPTH),
            MetricKind::ArrivalRate => (
                format!("sum {by} (rate({}[{w}]))", m::QUEUE_ARRIVALS_TOTAL),
                m::QUEUE_ARRIVALS_TOTAL,
            ),
            MetricKind::CompletionRate => (
                format!("sum {by} (rate({}[{w}]))", m::QUEUE_COMPLETIONS_TOTAL),
                m::QUEUE_COMPLETIONS_TOTAL,
            ),
            MetricKind::Partitions => return None,
            MetricKind::FailureFloor => {
                // `>= 0` drops the NaN of workers that do not know their floor yet.
                (
                    format!("avg {by} ({} >= 0)", m::FAILURE_FLOOR),
                    m::FAILURE_FLOOR,
                )
            }
        };
        Some(format!(
            "({value}) or label_replace(max {by} (timestamp({underlying})), \"{SAMPLE_LABEL}\", \"{SAMPLE_TIMESTAMP}\", \"\", \"\")"
        ))
    }
}

/// One workload's value from a batched query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The value (may be NaN; [`Sample::fresh_value`] filters).
    pub value: f64,
    /// Unix seconds of the oldest timestamp series that applies to the value; `None` when the
    /// answer dates it with none.
    pub sampled_at: Option<f64>,
}

impl Sample {
    /// The value if it is a finite number and not older than `stale_after` at `now_unix`;
    /// otherwise unknown. A value without a timestamp is unknown (every query the operator
    /// runs returns them), and so is one whose timestamp is not a finite number (a finite
    /// timestamp ahead of `now_unix`, clock skew, is fresh).
    pub fn fresh_value(&self, now_unix: f64, stale_after: Duration) -> Option<f64> {
        if !self.value.is_finite() {
            return None;
        }
        let t = self.sampled_at?;
        // Written so that NaN (from either side) counts as stale.
        let fresh = t.is_finite() && now_unix - t <= stale_after.as_secs_f64();
        fresh.then_some(self.value)
    }
}

/// `(namespace, workload)` → sample.
pub type BatchResult = HashMap<(String, String), Sample>;

/// Folds the series of one query response into per-workload samples. Value series without
/// both labels are ignored.
///
/// Timestamp series (see [`SAMPLE_LABEL`]) apply by the labels they carry: one with
/// `namespace` and `workload` to that workload, one with only `namespace` to every workload of
/// the namespace, one with neither to every workload of the answer (and one with only
/// `workload` to that workload in every namespace). A value is dated by the oldest that
/// applies (NaN, an unknown age, before any number), so staleness is never hidden.
///
/// A workload with more than one value series (a query override that does not aggregate
/// `by (namespace, workload)`, say one series per pod) is ambiguous: its value is NaN, which
/// [`Sample::fresh_value`] reads as unknown, rather than whichever series came last.
pub fn fold_series<'a>(
    series: impl IntoIterator<Item = (&'a HashMap<String, String>, f64)>,
) -> BatchResult {
    let mut out: BatchResult = HashMap::new();
    let mut stamps: HashMap<(Option<String>, Option<String>), f64> = HashMap::new();
    for (labels, value) in series {
        let ns = labels.get(m::LABEL_NAMESPACE);
        let wl = labels.get(m::LABEL_WORKLOAD);
        if labels
            .get(SAMPLE_LABEL)
            .is_some_and(|v| v == SAMPLE_TIMESTAMP)
        {
            stamps
                .entry((ns.cloned(), wl.cloned()))
                .and_modify(|t| *t = older(*t, value))
                .or_insert(value);
            continue;
        }
        let (Some(ns), Some(wl)) = (ns, wl) else {
            continue;
        };
        out.entry((ns.clone(), wl.clone()))
            .and_modify(|s| s.value = f64::NAN)
            .or_insert(Sample {
                value,
                sampled_at: None,
            });
    }
    for ((ns, wl), sample) in &mut out {
        for ((s_ns, s_wl), t) in &stamps {
            let applies =
                s_ns.as_ref().is_none_or(|x| x == ns) && s_wl.as_ref().is_none_or(|x| x == wl);
            if applies {
                sample.sampled_at = Some(sample.sampled_at.map_or(*t, |old| older(old, *t)));
            }
        }
    }
    out
}

/// The older of two sample timestamps; NaN (an unknown age) wins.
fn older(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn default_queries_use_the_wire_names_and_group_by_workload() {
        for kind in MetricKind::ALL {
            let Some(q) = kind.default_query(Duration::from_secs(60)) else {
                assert_eq!(kind, MetricKind::Partitions);
                continue;
            };
            assert!(q.contains("by (namespace, workload)"), "{q}");
            assert!(q.contains(SAMPLE_LABEL), "{q}");
        }
        let q = MetricKind::FailureRate
            .default_query(Duration::from_secs(30))
            .unwrap_or_default();
        assert!(
            q.contains("backpressure_outcomes_total{class=\"dependency_failure\"}[30s]"),
            "{q}"
        );
    }

    #[test]
    fn overrides_win() {
        let o = FleetQueries {
            queries: backpressure_api::v1alpha1::QueryOverrides {
                queue_age: Some("my_age".into()),
                ..Default::default()
            },
            partitions: None,
        };
        assert_eq!(
            MetricKind::QueueAge.query(&o, Duration::from_secs(60)),
            Some("my_age".to_owned())
        );
        assert!(
            MetricKind::Backoff
                .query(&o, Duration::from_secs(60))
                .is_some_and(|q| q.contains("backpressure_backoff_factor"))
        );
        assert_eq!(
            MetricKind::Partitions.query(&o, Duration::from_secs(60)),
            None,
            "no preset, no partitions query"
        );
    }

    #[test]
    fn fold_attaches_timestamps_and_skips_unlabelled_series() {
        let a = labels(&[("namespace", "n"), ("workload", "w")]);
        let a_ts = labels(&[
            ("namespace", "n"),
            ("workload", "w"),
            (SAMPLE_LABEL, "timestamp"),
        ]);
        let no_wl = labels(&[("namespace", "n")]);
        let r = fold_series([(&a, 0.3), (&a_ts, 1000.0), (&no_wl, 9.0)]);
        assert_eq!(r.len(), 1);
        let s = r[&("n".to_owned(), "w".to_owned())];
        assert_eq!(s.value, 0.3);
        assert_eq!(s.sampled_at, Some(1000.0));
        assert_eq!(s.fresh_value(1030.0, Duration::from_secs(60)), Some(0.3));
        assert_eq!(
            s.fresh_value(1061.0, Duration::from_secs(60)),
            None,
            "stale"
        );
        let nan = Sample {
            value: f64::NAN,
            sampled_at: None,
        };
        assert_eq!(
            nan.fresh_value(0.0, Duration::from_secs(60)),
            None,
            "NaN is unknown, never zero"
        );
    }

    #[test]
    fn ambiguous_and_hostile_series_are_unknown_never_zero() {
        let p0 = labels(&[("namespace", "n"), ("workload", "w"), ("pod", "a")]);
        let p1 = labels(&[("namespace", "n"), ("workload", "w"), ("pod", "b")]);
        let r = fold_series([(&p0, 0.0), (&p1, 0.9)]);
        let s = r[&("n".to_owned(), "w".to_owned())];
        assert_eq!(
            s.fresh_value(0.0, Duration::from_secs(60)),
            None,
            "two series for one workload are ambiguous"
        );
        let v = labels(&[("namespace", "n"), ("workload", "w")]);
        let ts = labels(&[
            ("namespace", "n"),
            ("workload", "w"),
            (SAMPLE_LABEL, "timestamp"),
        ]);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let r = fold_series([(&v, 0.5), (&ts, bad)]);
            let s = r[&("n".to_owned(), "w".to_owned())];
            assert_eq!(
                s.fresh_value(1000.0, Duration::from_secs(60)),
                None,
                "timestamp {bad}: the age is unknowable"
            );
        }
        // Two timestamps: the oldest decides.
        let r = fold_series([(&v, 0.5), (&ts, 990.0), (&ts, 900.0)]);
        let s = r[&("n".to_owned(), "w".to_owned())];
        assert_eq!(s.sampled_at, Some(900.0));
        assert_eq!(s.fresh_value(1000.0, Duration::from_secs(60)), None);
    }

    #[test]
    fn a_value_is_dated_by_every_timestamp_that_applies_and_unknown_without_one() {
        let stamp = |pairs: &[(&str, &str)]| {
            let mut l = labels(pairs);
            l.insert(SAMPLE_LABEL.to_owned(), SAMPLE_TIMESTAMP.to_owned());
            l
        };
        let a = labels(&[("namespace", "n"), ("workload", "a")]);
        let b = labels(&[("namespace", "n"), ("workload", "b")]);
        let c = labels(&[("namespace", "other"), ("workload", "c")]);
        let d = labels(&[("namespace", "n"), ("workload", "d")]);
        let a_ts = stamp(&[("namespace", "n"), ("workload", "a")]);
        let b_ts = stamp(&[("namespace", "n"), ("workload", "b")]);
        let ns_ts = stamp(&[("namespace", "n")]);
        let query_ts = stamp(&[("bp_scope", "query")]);
        let r = fold_series([
            (&a, 1.0),
            (&b, 2.0),
            (&c, 3.0),
            (&d, 4.0),
            (&a_ts, 990.0),
            (&b_ts, 900.0),
            (&ns_ts, 980.0),
            (&query_ts, 995.0),
        ]);
        let at = |w: &str, n: &str| r[&(n.to_owned(), w.to_owned())].sampled_at;
        // Its own, its namespace's and the query's: the oldest.
        assert_eq!(at("a", "n"), Some(980.0));
        assert_eq!(at("b", "n"), Some(900.0));
        assert_eq!(
            at("d", "n"),
            Some(980.0),
            "no own timestamp: the namespace's"
        );
        assert_eq!(
            at("c", "other"),
            Some(995.0),
            "another namespace: the query's only"
        );
        let fresh = |w: &str, n: &str| {
            r[&(n.to_owned(), w.to_owned())].fresh_value(1000.0, Duration::from_secs(30))
        };
        assert_eq!(fresh("a", "n"), Some(1.0));
        assert_eq!(fresh("b", "n"), None, "100 s old");
        // Without any timestamp the value is unknown, however plausible.
        let r = fold_series([(&a, 1.0), (&b_ts, 999.0)]);
        let s = r[&("n".to_owned(), "a".to_owned())];
        assert_eq!(s.sampled_at, None);
        assert_eq!(s.fresh_value(1000.0, Duration::from_secs(60)), None);
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// Label sets drawn from a small alphabet so that keys collide often.
        fn series() -> impl Strategy<Value = Vec<(HashMap<String, String>, f64)>> {
            let name = prop_oneof![Just("a"), Just("b"), Just(""), Just("ns-é"), Just("x y")];
            let labels = (
                proptest::option::of(name.clone()),
                proptest::option::of(name),
                prop_oneof![
                    3 => Just(None),
                    2 => Just(Some(SAMPLE_TIMESTAMP)),
                    1 => Just(Some("other")),
                ],
                proptest::option::of("[a-z]{1,3}"),
            )
                .prop_map(|(ns, wl, sample, extra)| {
                    let mut l = HashMap::new();
                    if let Some(ns) = ns {
                        l.insert(m::LABEL_NAMESPACE.to_owned(), ns.to_owned());
                    }
                    if let Some(wl) = wl {
                        l.insert(m::LABEL_WORKLOAD.to_owned(), wl.to_owned());
                    }
                    if let Some(s) = sample {
                        l.insert(SAMPLE_LABEL.to_owned(), s.to_owned());
                    }
                    if let Some(e) = extra {
                        l.insert("pod".to_owned(), e);
                    }
                    l
                });
            let value = prop_oneof![
                4 => -1e6f64..1e12,
                1 => Just(f64::NAN),
                1 => Just(f64::INFINITY),
                1 => Just(f64::NEG_INFINITY),
                1 => Just(0.0),
                1 => any::<f64>(),
            ];
            proptest::collection::vec((labels, value), 0..24)
        }

        fn is_stamp(l: &HashMap<String, String>) -> bool {
            l.get(SAMPLE_LABEL).is_some_and(|v| v == SAMPLE_TIMESTAMP)
        }

        fn key(l: &HashMap<String, String>) -> Option<(String, String)> {
            Some((
                l.get(m::LABEL_NAMESPACE)?.clone(),
                l.get(m::LABEL_WORKLOAD)?.clone(),
            ))
        }

        /// Whether the timestamp series `l` dates the value of `k`.
        fn applies(l: &HashMap<String, String>, k: &(String, String)) -> bool {
            l.get(m::LABEL_NAMESPACE).is_none_or(|n| *n == k.0)
                && l.get(m::LABEL_WORKLOAD).is_none_or(|w| *w == k.1)
        }

        proptest! {
            #[test]
            fn fold_keeps_exactly_the_labelled_value_series(input in series()) {
                let out = fold_series(input.iter().map(|(l, v)| (l, *v)));
                for (k, sample) in &out {
                    let values: Vec<f64> = input
                        .iter()
                        .filter(|(l, _)| !is_stamp(l) && key(l).as_ref() == Some(k))
                        .map(|(_, v)| *v)
                        .collect();
                    prop_assert!(!values.is_empty(), "{k:?} has no value series");
                    if values.len() == 1 {
                        prop_assert!(sample.value.to_bits() == values[0].to_bits());
                    } else {
                        prop_assert!(sample.value.is_nan(), "ambiguous {k:?} must be unknown");
                    }
                    let stamps: Vec<f64> = input
                        .iter()
                        .filter(|(l, _)| is_stamp(l) && applies(l, k))
                        .map(|(_, v)| *v)
                        .collect();
                    match sample.sampled_at {
                        None => prop_assert!(stamps.is_empty()),
                        Some(t) => {
                            prop_assert!(!stamps.is_empty());
                            if t.is_nan() {
                                prop_assert!(stamps.iter().any(|s| s.is_nan()));
                            } else {
                                prop_assert!(stamps.iter().all(|s| !s.is_nan() && *s >= t));
                            }
                        }
                    }
                }
                for (l, _) in &input {
                    if let Some(k) = key(l) && !is_stamp(l) {
                        prop_assert!(out.contains_key(&k));
                    }
                }
            }

            #[test]
            fn fresh_values_are_finite_and_not_stale(
                input in series(),
                now in 0.0f64..2e9,
                stale in 0u64..600,
            ) {
                let stale_after = Duration::from_secs(stale);
                let out = fold_series(input.iter().map(|(l, v)| (l, *v)));
                for sample in out.values() {
                    if let Some(v) = sample.fresh_value(now, stale_after) {
                        prop_assert!(v.is_finite());
                        prop_assert_eq!(v.to_bits(), sample.value.to_bits());
                        let t = sample.sampled_at;
                        prop_assert!(t.is_some_and(|t| t.is_finite() && now - t <= stale as f64));
                    }
                }
            }
        }
    }
}
