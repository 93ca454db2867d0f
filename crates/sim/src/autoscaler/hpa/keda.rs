//! KEDA's side of the metric the HPA reads: what KEDA's metrics adapter serves for a trigger,
//! ported from KEDA v2.21.0 (`github.com/kedacore/keda/v2`).
//!
//! - The HPA KEDA creates (`controllers/keda/hpa.go`): one `External` metric per trigger,
//!   target type `AverageValue` unless the trigger sets `metricType`
//!   (`pkg/scalers/scaler.go` `GetMetricTargetType`); `minReplicas` = `minReplicaCount` if
//!   above 0, else 1 (`GetHPAMinReplicas`); `behavior` unset unless the ScaledObject sets
//!   `advanced.horizontalPodAutoscalerConfig.behavior`.
//! - Values and targets in milli-units (`GenerateMetricInMili`, `GetMetricTargetMili`:
//!   `quantityFromFloat64`): NaN, ±Inf and negative values become 0, others are formatted with
//!   `%.3f` (round half to even on the binary value) and parsed, so `milli = round(v × 1000)`.
//!   An integer target (`GetMetricTarget`, e.g. `lagCount`) is `NewQuantity(n)`: `n × 1000`.
//! - The Prometheus trigger (`pkg/scalers/prometheus_scaler.go` `ExecutePromQuery`) with
//!   `ignoreNullValues` (default `true`): an empty result, an empty value list, NaN or ±Inf
//!   read as 0; with `false` they are errors. A failed query is an error either way.
//! - The Redis Streams trigger with `lagCount` (`pkg/scalers/redis_streams_scaler.go`): the
//!   metric is the consumer group's `lag` from `XINFO GROUPS` (Redis 7+): entries of the stream
//!   never delivered to the group. Entries delivered and not acknowledged (the pending list,
//!   where failed messages wait to be claimed again) are not lag. The target is `lagCount`.
//! - `fallback` (`pkg/fallback/fallback.go` `GetMetricsWithFallback`, `doFallback`): with
//!   `fallback {failureThreshold, replicas, behavior}`, every failed fetch of the metric
//!   increments `status.health[metric].numberOfFailures`, every successful one resets it to 0.
//!   Once `numberOfFailures > failureThreshold`, the adapter serves, instead of an error,
//!   `int64(target × 1000 × r)` milli-units, with `r` = `replicas` (`static`, the default),
//!   `spec.replicas` (`currentReplicas`), or the larger (`currentReplicasIfHigher`) or smaller
//!   (`currentReplicasIfLower`) of the two; for a `Value` target `r` is first divided by the
//!   ready pods (no ready pod: the fallback fails and the HPA gets an error). The HPA then
//!   computes `r` replicas (`AverageValue`: `ceil(target × r / target)`; `Value`:
//!   `ceil(r / ready × ready)`, up to float rounding). Without `fallback` an error reaches the
//!   HPA, which keeps the current replicas.
//!
//! Not ported: `scalingModifiers` (formulas, its fallback behavior), `useCachedMetrics`, the
//! activation thresholds and KEDA's own scaling between 0 and 1 replica (`minReplicaCount: 0`),
//! and the failures counted by KEDA's polling loop (`pollingInterval`, 30 s), which fetches
//! the metric too: here one fetch is one HPA sync, so on a real cluster the fallback starts
//! after fewer HPA syncs than `failureThreshold + 1`.

use serde::{Deserialize, Serialize};

use super::MetricTarget;

/// Why a trigger produced no value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ScalerError {
    /// The query failed (unreachable, HTTP error, unparsable answer).
    #[error("error executing the query: {0}")]
    Query(String),
    /// Prometheus returned no series (`ignoreNullValues: false`).
    #[error("prometheus metrics 'prometheus' target may be lost, the result is empty")]
    Empty,
    /// Prometheus returned NaN or ±Inf (`ignoreNullValues: false`).
    #[error("prometheus query returns {0}")]
    NotFinite(f64),
}

/// What the metrics adapter answers the HPA with instead of a value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum KedaError {
    /// The trigger failed and no fallback applies (yet).
    #[error(transparent)]
    Scaler(#[from] ScalerError),
    /// The fallback could not be computed (a `Value` target with no ready pod).
    #[error("error performing fallback")]
    Fallback,
}

/// The answer of a Prometheus instant query, as the trigger sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum PromResponse {
    /// One series with this value (possibly NaN or ±Inf).
    Value(f64),
    /// No series (`result: []`) or an empty value list.
    Empty,
    /// The query failed.
    Failed(String),
}

/// `ExecutePromQuery`: the value, with `ignoreNullValues` turning an empty result, NaN and ±Inf
/// into 0.
pub fn prometheus_value(
    response: &PromResponse,
    ignore_null_values: bool,
) -> Result<f64, ScalerError> {
    match *response {
        PromResponse::Failed(ref e) => Err(ScalerError::Query(e.clone())),
        PromResponse::Empty if ignore_null_values => Ok(0.0),
        PromResponse::Empty => Err(ScalerError::Empty),
        PromResponse::Value(v) if !v.is_finite() => {
            if ignore_null_values {
                Ok(0.0)
            } else {
                Err(ScalerError::NotFinite(v))
            }
        }
        PromResponse::Value(v) => Ok(v),
    }
}

/// `GenerateMetricInMili` / `quantityFromFloat64`, read back with `MilliValue()`: NaN, ±Inf
/// and negative values are 0; otherwise `v` formatted with three decimals (round half to
/// even, as Go's `%.3f`), in milli-units, capped at `i64::MAX`.
pub fn milli_from_f64(v: f64) -> i64 {
    if v.is_nan() || v.is_infinite() || v < 0.0 {
        return 0;
    }
    let s = format!("{v:.3}");
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    digits
        .parse::<i128>()
        .map_or(i64::MAX, |m| i64::try_from(m).unwrap_or(i64::MAX))
}

/// The metric target type of a trigger (`metricType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum TargetType {
    /// `AverageValue`, every KEDA trigger's default.
    #[default]
    AverageValue,
    /// `Value`.
    Value,
}

/// A trigger's target as KEDA writes it into the HPA, with the two readings of the quantity
/// that matter: `MilliValue()` (the HPA) and `AsApproximateFloat64()` (the fallback).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KedaTarget {
    /// The target type.
    pub kind: TargetType,
    /// `MilliValue()`.
    pub milli: i64,
    /// `AsApproximateFloat64()`.
    pub approx: f64,
}

impl KedaTarget {
    /// `GetMetricTargetMili(kind, threshold)` (the Prometheus trigger's `threshold`): the
    /// quantity parsed from `%.3f`, i.e. `milli × 10^-3` as a float.
    pub fn from_threshold(kind: TargetType, threshold: f64) -> Self {
        let milli = milli_from_f64(threshold);
        KedaTarget {
            kind,
            milli,
            approx: milli as f64 * 1e-3,
        }
    }

    /// `GetMetricTarget(kind, n)` (an integer target such as `lagCount`): `NewQuantity(n)`.
    pub fn from_count(kind: TargetType, n: i64) -> Self {
        KedaTarget {
            kind,
            milli: n.saturating_mul(1000),
            approx: n as f64,
        }
    }

    /// The HPA's `spec.metrics[0].external.target`.
    pub fn hpa_target(self) -> MetricTarget {
        match self.kind {
            TargetType::AverageValue => MetricTarget::AverageValue {
                milli_value: self.milli,
            },
            TargetType::Value => MetricTarget::Value {
                milli_value: self.milli,
            },
        }
    }
}

/// `fallback.behavior`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FallbackBehavior {
    /// `static` (the default): `fallback.replicas`.
    #[default]
    Static,
    /// `currentReplicas`: the target's `spec.replicas`.
    CurrentReplicas,
    /// `currentReplicasIfHigher`: the larger of the two.
    CurrentReplicasIfHigher,
    /// `currentReplicasIfLower`: the smaller of the two.
    CurrentReplicasIfLower,
}

/// A ScaledObject's `spec.fallback`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fallback {
    /// `failureThreshold`.
    pub failure_threshold: i32,
    /// `replicas`.
    pub replicas: i32,
    /// `behavior`.
    #[serde(default)]
    pub behavior: FallbackBehavior,
}

impl Fallback {
    /// `HasValidFallback` (without scaling modifiers): both numbers non-negative.
    pub fn is_valid(&self) -> bool {
        self.failure_threshold >= 0 && self.replicas >= 0
    }
}

/// What the adapter served for one request of the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The value, milli-units.
    pub milli: i64,
    /// Whether it is the fallback's.
    pub fallback: bool,
}

/// One trigger's metric as KEDA's metrics adapter serves it: the value, or the fallback after
/// enough consecutive failures.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricSource {
    target: KedaTarget,
    fallback: Option<Fallback>,
    /// `status.health[metric].numberOfFailures`.
    failures: i32,
}

impl MetricSource {
    /// A trigger with `target` and an optional `fallback`.
    pub fn new(target: KedaTarget, fallback: Option<Fallback>) -> Self {
        MetricSource {
            target,
            fallback,
            failures: 0,
        }
    }

    /// The target.
    pub fn target(&self) -> KedaTarget {
        self.target
    }

    /// `status.health[metric].numberOfFailures`.
    pub fn failures(&self) -> i32 {
        self.failures
    }

    /// One request of the metric (`GetMetricsWithFallback`): `raw` is the trigger's value or
    /// error, `spec_replicas` the target's `spec.replicas`, `ready_pods` its pods `Running`
    /// with `Ready=True`.
    pub fn serve(
        &mut self,
        raw: Result<f64, ScalerError>,
        spec_replicas: i32,
        ready_pods: i32,
    ) -> Result<Served, KedaError> {
        // Health is only tracked with a valid fallback.
        let fallback = self.fallback.filter(Fallback::is_valid);
        let error = match raw {
            Ok(v) => {
                if fallback.is_some() {
                    self.failures = 0;
                }
                return Ok(Served {
                    milli: milli_from_f64(v),
                    fallback: false,
                });
            }
            Err(e) => e,
        };
        let Some(fallback) = fallback else {
            return Err(error.into());
        };
        self.failures = self.failures.saturating_add(1);
        if self.failures <= fallback.failure_threshold {
            return Err(error.into());
        }
        self.do_fallback(fallback, spec_replicas, ready_pods)
            .map(|milli| Served {
                milli,
                fallback: true,
            })
            .ok_or(KedaError::Fallback)
    }

    /// `doFallback`.
    fn do_fallback(
        &self,
        fallback: Fallback,
        current_replicas: i32,
        ready_pods: i32,
    ) -> Option<i64> {
        let fallback_replicas = i64::from(fallback.replicas);
        let current = i64::from(current_replicas);
        let mut replicas = match fallback.behavior {
            FallbackBehavior::Static => fallback_replicas as f64,
            FallbackBehavior::CurrentReplicas => current as f64,
            FallbackBehavior::CurrentReplicasIfHigher => current.max(fallback_replicas) as f64,
            FallbackBehavior::CurrentReplicasIfLower => current.min(fallback_replicas) as f64,
        };
        // If the metric type is Value, divide by the ready replicas.
        if self.target.kind == TargetType::Value {
            if ready_pods == 0 {
                return None;
            }
            replicas /= f64::from(ready_pods);
        }
        // int64(normalisationValue * 1000 * replicas): truncation (saturating here).
        Some((self.target.approx * 1000.0 * replicas) as i64)
    }
}

#[cfg(test)]
mod tests {
    //! Cases of KEDA's `pkg/fallback/fallback_test.go` and `pkg/scalers/prometheus_scaler_test.go`
    //! (`testPromQueryResult`), rewritten against this port.
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn failing() -> Result<f64, ScalerError> {
        Err(ScalerError::Query("connection refused".to_owned()))
    }

    #[test]
    fn milli_values_round_like_go_percent_3f() {
        assert_eq!(milli_from_f64(0.0), 0);
        assert_eq!(milli_from_f64(60.0), 60_000);
        assert_eq!(milli_from_f64(12.3456), 12_346);
        // Binary ties round half to even, as Go's strconv does.
        assert_eq!(milli_from_f64(0.0625), 62);
        assert_eq!(milli_from_f64(0.1875), 188);
        // NaN, Inf and negatives are 0 (quantityFromFloat64).
        assert_eq!(milli_from_f64(f64::NAN), 0);
        assert_eq!(milli_from_f64(f64::INFINITY), 0);
        assert_eq!(milli_from_f64(-3.0), 0);
        assert_eq!(milli_from_f64(1e300), i64::MAX);
    }

    #[test]
    fn ignore_null_values_reads_empty_and_non_finite_as_zero() {
        // testPromQueryResult: "no values", "value is empty list", "+Inf", "-Inf", "NaN" give
        // 0 with ignoreNullValues and an error with "... but shouldn't ignore".
        for r in [
            PromResponse::Empty,
            PromResponse::Value(f64::NAN),
            PromResponse::Value(f64::INFINITY),
            PromResponse::Value(f64::NEG_INFINITY),
        ] {
            assert_eq!(prometheus_value(&r, true), Ok(0.0), "{r:?}");
            assert!(prometheus_value(&r, false).is_err(), "{r:?}");
        }
        // "valid value".
        assert_eq!(prometheus_value(&PromResponse::Value(2.0), true), Ok(2.0));
        // "error status response": an error either way.
        assert!(prometheus_value(&PromResponse::Failed("503".into()), true).is_err());
    }

    #[test]
    fn targets() {
        let t = KedaTarget::from_threshold(TargetType::Value, 60.0);
        assert_eq!(
            t.hpa_target(),
            MetricTarget::Value {
                milli_value: 60_000
            }
        );
        assert_eq!(t.approx, 60.0);
        let t = KedaTarget::from_count(TargetType::default(), 5);
        assert_eq!(
            t.hpa_target(),
            MetricTarget::AverageValue { milli_value: 5_000 }
        );
    }

    #[test]
    fn without_fallback_errors_reach_the_hpa() {
        // "should propagate the error when fallback is disabled", "should not reset the health
        // status when fallback is not enabled".
        let mut s = MetricSource::new(KedaTarget::from_count(TargetType::AverageValue, 10), None);
        for _ in 0..10 {
            assert!(s.serve(failing(), 3, 3).is_err());
        }
        assert_eq!(s.failures(), 0, "health is not tracked without a fallback");
        assert_eq!(
            s.serve(Ok(25.0), 3, 3),
            Ok(Served {
                milli: 25_000,
                fallback: false
            })
        );
    }

    /// fallback_test.go's setup: `fallback {failureThreshold: 3, replicas: 10}`, an
    /// `AverageValue` target of 10 (`createMetricSpec(10)`), 3 failures so far.
    fn upstream_source(behavior: FallbackBehavior) -> MetricSource {
        let fb = Fallback {
            failure_threshold: 3,
            replicas: 10,
            behavior,
        };
        let mut s = MetricSource::new(
            KedaTarget::from_count(TargetType::AverageValue, 10),
            Some(fb),
        );
        for _ in 0..3 {
            assert!(s.serve(failing(), 1, 1).is_err());
        }
        s
    }

    #[test]
    fn fallback_beyond_the_threshold_average_value() {
        // "should return a normalised metric when number of failures are beyond threshold":
        // the 4th failure serves 10 x 10 = 100 and leaves numberOfFailures at 4.
        let mut s = upstream_source(FallbackBehavior::Static);
        assert_eq!(s.failures(), 3);
        assert_eq!(
            s.serve(failing(), 5, 5),
            Ok(Served {
                milli: 100_000,
                fallback: true
            })
        );
        assert_eq!(s.failures(), 4);
        // "should reset the health status when scaler metrics are available": a success resets
        // the count, so the next failure is an error again.
        assert_eq!(s.serve(Ok(7.0), 2, 2).unwrap().milli, 7_000);
        assert_eq!(s.failures(), 0);
        assert!(s.serve(failing(), 2, 2).is_err());
    }

    #[test]
    fn fallback_behaviors_pick_the_replicas() {
        // "should use fallback replicas when current replicas is lower when behavior is
        // 'currentReplicasIfHigher'" (current 4 -> 100), "should use current replicas when
        // behavior is 'currentReplicas'" (current 6 -> 60), "should ignore current replicas
        // when behavior is 'static'" (current 15 -> 100).
        let served = |behavior, current| {
            upstream_source(behavior)
                .serve(failing(), current, current)
                .unwrap()
                .milli
        };
        assert_eq!(
            served(FallbackBehavior::CurrentReplicasIfHigher, 4),
            100_000
        );
        assert_eq!(served(FallbackBehavior::CurrentReplicas, 6), 60_000);
        assert_eq!(served(FallbackBehavior::Static, 15), 100_000);
        // The two not covered upstream, by the same code.
        assert_eq!(
            served(FallbackBehavior::CurrentReplicasIfHigher, 12),
            120_000
        );
        assert_eq!(served(FallbackBehavior::CurrentReplicasIfLower, 4), 40_000);
        assert_eq!(
            served(FallbackBehavior::CurrentReplicasIfLower, 12),
            100_000
        );
    }

    #[test]
    fn fallback_value_target_divides_by_ready_pods() {
        // doFallback: for a Value target, replicas / readyReplicas; none ready -> error.
        let fb = Fallback {
            failure_threshold: 0,
            replicas: 6,
            behavior: FallbackBehavior::Static,
        };
        let mut s = MetricSource::new(
            KedaTarget::from_threshold(TargetType::Value, 60.0),
            Some(fb),
        );
        // 60 x 1000 x 6 / 4 = 90000m.
        assert_eq!(s.serve(failing(), 4, 4).unwrap().milli, 90_000);
        assert_eq!(s.serve(failing(), 4, 0), Err(KedaError::Fallback));
        // 60 x 1000 x (6 / 7), truncated.
        assert_eq!(
            s.serve(failing(), 7, 7).unwrap().milli,
            (60.0 * 1000.0 * (6.0 / 7.0)) as i64
        );
    }

    #[test]
    fn an_invalid_fallback_is_no_fallback() {
        let fb = Fallback {
            failure_threshold: -1,
            replicas: 5,
            behavior: FallbackBehavior::Static,
        };
        let mut s = MetricSource::new(
            KedaTarget::from_count(TargetType::AverageValue, 1),
            Some(fb),
        );
        for _ in 0..5 {
            assert!(s.serve(failing(), 1, 1).is_err());
        }
        assert_eq!(s.failures(), 0);
    }
}
