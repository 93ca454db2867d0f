//! The Kubernetes HorizontalPodAutoscaler controller's decision for one `External` metric,
//! ported from Kubernetes v1.35.4, and KEDA's side of that metric ([`keda`]). The simulator's
//! KEDA comparators ([`Hpa`]) and the lab's comparison run are built from it; recorded traces
//! of a real HPA replay against it ([`trace`]).
//!
//! Upstream: `pkg/controller/podautoscaler/horizontal.go` (this module),
//! `replica_calculator.go` ([`calculator`]), `pkg/apis/autoscaling/v2/defaults.go`
//! ([`behavior`]). Pure: no clock; the caller passes `now` in seconds (converted to integer
//! nanoseconds, so windows and periods compare exactly as `time.Time` does upstream). The
//! sync period (`--horizontal-pod-autoscaler-sync-period`, 15 s) is the caller's: one call of
//! [`HpaController::reconcile`] is one `reconcileAutoscaler`.
//!
//! # One sync (`reconcileAutoscaler`)
//!
//! With `current = scale.spec.replicas`:
//!
//! 1. `recordInitialRecommendation`: the first sync stores `(current, now)` as a
//!    recommendation, so the scale-down stabilization starts from the current size.
//! 2. Special cases, which skip the metric and stabilization (but do record a scale event):
//!    `current == 0 && minReplicas != 0` → scaling disabled, nothing changes;
//!    `current > maxReplicas` → `maxReplicas`; `current < minReplicas` → `minReplicas`.
//! 3. Otherwise the metric's proposal `p` ([`calculator`]; a failed metric is `-1` with an
//!    error and nothing changes). `desired = max(p, 0)`; the reason is "`<metric>` above
//!    target" when `desired > current`, "All metrics below target" when below.
//! 4. Normalization. Without `behavior` (`normalizeDesiredReplicas`, what KEDA creates unless
//!    the ScaledObject sets `advanced.horizontalPodAutoscalerConfig.behavior`):
//!    - `stabilizeRecommendation`: `s = max` of `desired` and every recommendation not older
//!      than the `--horizontal-pod-autoscaler-downscale-stabilization` window (5 min; a
//!      recommendation exactly at the cutoff counts); `desired` replaces the last stale entry
//!      of the list, or is appended;
//!    - `convertDesiredReplicasWithRules`: `s` clamped to
//!      `[minReplicas, min(maxReplicas, max(2 × current, 4))]` (`calculateScaleUpLimit`; no
//!      memory across syncs, no scale-down limit).
//!
//!    With `behavior` (`normalizeDesiredReplicasWithBehaviors`, defaults in [`behavior`]):
//!    - `stabilizeRecommendationWithBehaviors`: `up = min` and `down = max` of `desired` and
//!      the recommendations newer than (strictly after) `now − window` of each direction;
//!      `s = current` raised to `up`, then lowered to `down`; `desired` replaces the last
//!      entry stale for both windows, or is appended;
//!    - `convertDesiredReplicasWithBehaviorRate`: for each policy, the replicas at the start
//!      of its period `start = current − added + removed` (scale events strictly after
//!      `now − periodSeconds`, `getReplicasChangePerPeriod`); `Pods`: `start ± value`;
//!      `Percent`: up `ceil(start × (1 + value/100))`, down `trunc(start × (1 − value/100))`;
//!      `selectPolicy` `Max` takes the largest change, `Min` the smallest, `Disabled` none.
//!      The up limit is at least `current`, the down limit at most `current`; then
//!      `[minReplicas, maxReplicas]`.
//! 5. If `desired != current` the scale is written and (with `behavior`) a scale event
//!    `(|desired − current|, now)` is stored in its direction (`storeScaleEvent`): it replaces
//!    the last entry marked outdated (older than the direction's longest policy period,
//!    `markScaleEventsOutdated`), or is appended.
//!
//! Integer arithmetic is `int32` as upstream (wrapping where Go wraps); float-to-int
//! conversions that Go leaves implementation-defined (out of range, NaN) saturate here.
//! Upstream reads each timestamp with its own `time.Now()`; here one sync has one `now`, so
//! a recommendation or scale event exactly one window or period old compares exactly, where
//! on a real controller sub-second jitter decides.
//!
//! # Not ported
//!
//! Metrics other than one `External` metric (Resource, Pods, Object, several metrics and
//! their max), the selector checks (`validateAndParseSelector`: missing or ambiguous
//! selector), the "no pods returned by selector" error of `getReadyPodsCount` (the port takes
//! the ready count as an input, 0 when no pod is listed), status and condition writes beyond
//! the reasons reported in [`SyncOutput`], events, a failed scale update (the port assumes
//! the write succeeds), and the controller's rate-limited requeue on error.

pub mod behavior;
pub mod calculator;
mod comparator;
pub mod keda;
#[cfg(test)]
mod tests;
pub mod trace;

use serde::{Deserialize, Serialize};

pub use behavior::{
    Behavior, ControllerFlags, Defaulted, PolicyType, Rules, ScalingPolicy, ScalingRules,
    SelectPolicy, Tolerances,
};
pub use comparator::Hpa;

/// An error of the HPA port.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HpaError {
    /// The spec would not pass the API server's validation.
    #[error("invalid HorizontalPodAutoscaler spec: {0}")]
    InvalidSpec(String),
    /// The metric could not be fetched: `computeReplicasForMetrics` returns -1 and the HPA
    /// keeps the current replicas (`FailedComputeMetricsReplicas`).
    #[error(
        "failed to compute desired number of replicas based on listed metrics: invalid metrics \
         (1 invalid out of 1), first error is: failed to get {0} external metric"
    )]
    MetricUnavailable(String),
}

/// `spec.metrics[0].external.target`: the target of the one `External` metric, in
/// milli-units (`Quantity.MilliValue()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum MetricTarget {
    /// `Value`: the metric's total against the target, times the ready pods.
    Value {
        /// `value.MilliValue()`.
        milli_value: i64,
    },
    /// `AverageValue`: the metric divided by the target per pod.
    AverageValue {
        /// `averageValue.MilliValue()`.
        milli_value: i64,
    },
}

impl MetricTarget {
    /// The target in milli-units.
    pub fn milli(self) -> i64 {
        match self {
            MetricTarget::Value { milli_value } | MetricTarget::AverageValue { milli_value } => {
                milli_value
            }
        }
    }
}

/// The HPA object and controller configuration the decision reads.
#[derive(Clone, Debug, PartialEq)]
pub struct HpaSpec {
    /// `spec.minReplicas` (the API defaults it to 1; 0 needs the `HPAScaleToZero` gate).
    pub min_replicas: i32,
    /// `spec.maxReplicas`.
    pub max_replicas: i32,
    /// The external metric's name (for the reason).
    pub metric_name: String,
    /// The metric's target.
    pub target: MetricTarget,
    /// `spec.behavior` as written; `None` takes the legacy path.
    pub behavior: Option<Behavior>,
    /// kube-controller-manager flags.
    pub flags: ControllerFlags,
}

impl HpaSpec {
    /// An HPA on one external metric with the given bounds and target, no `behavior`, the
    /// default flags.
    pub fn new(min_replicas: i32, max_replicas: i32, target: MetricTarget) -> Self {
        HpaSpec {
            min_replicas,
            max_replicas,
            metric_name: "s0-metric".to_owned(),
            target,
            behavior: None,
            flags: ControllerFlags::default(),
        }
    }

    /// With `behavior`.
    pub fn with_behavior(mut self, behavior: Option<Behavior>) -> Self {
        self.behavior = behavior;
        self
    }

    /// With the metric's name.
    pub fn with_metric_name(mut self, name: impl Into<String>) -> Self {
        self.metric_name = name.into();
        self
    }

    /// With the controller flags.
    pub fn with_flags(mut self, flags: ControllerFlags) -> Self {
        self.flags = flags;
        self
    }
}

/// What one sync reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyncInput {
    /// The sync's time, seconds.
    pub now: f64,
    /// `scale.spec.replicas` (the "current replicas").
    pub spec_replicas: i32,
    /// `scale.status.replicas` (pods created, for `AverageValue`).
    pub status_replicas: i32,
    /// Pods of the selector `Running` with `Ready=True` (for `Value`).
    pub ready_pods: i32,
    /// The external metric's value in milli-units, as the metrics API serves it; `None`: the
    /// fetch failed.
    pub metric: Option<i64>,
}

/// What one sync decided.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncOutput {
    /// `scale.spec.replicas` after the sync: what the HPA wrote, or the current replicas when
    /// it did not scale.
    pub desired: i32,
    /// Whether it wrote the scale.
    pub rescaled: bool,
    /// `metricDesiredReplicas`: the metric's raw proposal; `Some(-1)` when the metric failed;
    /// `None` when not computed (the special cases of `current`).
    pub metric_desired: Option<i32>,
    /// `rescaleReason` (empty when nothing changed for lack of a reason).
    pub reason: String,
    /// The reason of the `ScalingActive` condition: `ValidMetricFound`, `ScalingDisabled` or
    /// `FailedGetExternalMetric`; `None` for the min/max special cases (left unchanged
    /// upstream).
    pub scaling_active: Option<&'static str>,
    /// The reason normalization gave the `AbleToScale` condition: `ScaleDownStabilized`,
    /// `ScaleUpStabilized` or `ReadyForNewScale`; `None` when normalization did not run.
    pub stabilization: Option<&'static str>,
    /// The reason of the `ScalingLimited` condition: `DesiredWithinRange`, `ScaleUpLimit`,
    /// `ScaleDownLimit`, `TooManyReplicas` or `TooFewReplicas`; `None` when normalization did
    /// not run.
    pub limited: Option<&'static str>,
    /// The error `reconcileAutoscaler` returns.
    pub error: Option<HpaError>,
}

/// A timestamped recommendation (`timestampedRecommendation`); time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recommendation {
    replicas: i32,
    at: i64,
}

/// A scale event (`timestampedScaleEvent`): `change` is non-negative.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScaleEvent {
    change: i32,
    at: i64,
    outdated: bool,
}

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// Seconds to integer nanoseconds (rounded).
fn nanos(secs: f64) -> i64 {
    (secs * 1e9).round() as i64
}

/// `time.Second * time.Duration(s)`.
fn seconds(s: i32) -> i64 {
    i64::from(s) * NANOS_PER_SECOND
}

/// The HPA controller's state for one HPA (its entries of `recommendations`, `scaleUpEvents`
/// and `scaleDownEvents`) and the decision of one sync.
#[derive(Clone, Debug)]
pub struct HpaController {
    spec: HpaSpec,
    behavior: Option<Defaulted>,
    /// `None`: no entry in the controller's map yet (`recordInitialRecommendation` fills it).
    recommendations: Option<Vec<Recommendation>>,
    up_events: Vec<ScaleEvent>,
    down_events: Vec<ScaleEvent>,
}

/// `NormalizationArg` without the key.
#[derive(Clone, Copy, Debug)]
struct NormalizationArg<'a> {
    up: &'a Rules,
    down: &'a Rules,
    min_replicas: i32,
    max_replicas: i32,
    current_replicas: i32,
    desired_replicas: i32,
}

impl HpaController {
    /// A controller for `spec`, with no history. Fails on a spec the API server would reject:
    /// a target that is not positive, `maxReplicas < 1`, `minReplicas < 0` or above
    /// `maxReplicas`, an invalid `behavior`.
    pub fn new(spec: HpaSpec) -> Result<Self, HpaError> {
        if spec.target.milli() <= 0 {
            return Err(HpaError::InvalidSpec(
                "metrics[0].external.target: must be positive".to_owned(),
            ));
        }
        if spec.max_replicas < 1 {
            return Err(HpaError::InvalidSpec(
                "maxReplicas: must be greater than 0".to_owned(),
            ));
        }
        if spec.min_replicas < 0 || spec.max_replicas < spec.min_replicas {
            return Err(HpaError::InvalidSpec(
                "minReplicas: must be >= 0 and maxReplicas >= minReplicas".to_owned(),
            ));
        }
        if !(spec.flags.tolerance.is_finite() && spec.flags.tolerance >= 0.0) {
            return Err(HpaError::InvalidSpec(
                "--horizontal-pod-autoscaler-tolerance must be >= 0".to_owned(),
            ));
        }
        let behavior = spec
            .behavior
            .as_ref()
            .map(|b| b.defaulted(spec.flags.downscale_stabilization_seconds))
            .transpose()?;
        Ok(HpaController {
            spec,
            behavior,
            recommendations: None,
            up_events: Vec::new(),
            down_events: Vec::new(),
        })
    }

    /// The spec.
    pub fn spec(&self) -> &HpaSpec {
        &self.spec
    }

    /// The behavior the controller uses (defaulted), if `behavior` is set.
    pub fn behavior(&self) -> Option<&Defaulted> {
        self.behavior.as_ref()
    }

    /// Replaces the stored recommendations with `(seconds, replicas)` entries, like a
    /// controller that has been running (the upstream tests' `recommendations`): an empty list
    /// is a present but empty entry, so the next sync records no initial recommendation.
    pub fn set_recommendations(&mut self, recommendations: &[(f64, i32)]) {
        self.recommendations = Some(
            recommendations
                .iter()
                .map(|&(t, replicas)| Recommendation {
                    replicas,
                    at: nanos(t),
                })
                .collect(),
        );
    }

    /// One sync (`reconcileAutoscaler` from reading the scale on).
    pub fn reconcile(&mut self, input: &SyncInput) -> SyncOutput {
        let now = nanos(input.now);
        let current = input.spec_replicas;
        self.record_initial_recommendation(current, now);
        let min_replicas = self.spec.min_replicas;
        let max_replicas = self.spec.max_replicas;

        let mut out = SyncOutput {
            desired: 0,
            rescaled: false,
            metric_desired: None,
            reason: String::new(),
            scaling_active: None,
            stabilization: None,
            limited: None,
            error: None,
        };
        let mut desired: i32 = 0;
        let rescale;
        if current == 0 && min_replicas != 0 {
            // Autoscaling is disabled for this resource.
            rescale = false;
            out.scaling_active = Some("ScalingDisabled");
        } else if current > max_replicas {
            out.reason = "Current number of replicas above Spec.MaxReplicas".to_owned();
            desired = max_replicas;
            rescale = true;
        } else if current < min_replicas {
            out.reason = "Current number of replicas below Spec.MinReplicas".to_owned();
            desired = min_replicas;
            rescale = true;
        } else {
            let Some(metric_desired) = self.compute_replicas_for_metric(input) else {
                out.desired = current;
                out.metric_desired = Some(-1);
                out.scaling_active = Some("FailedGetExternalMetric");
                out.error = Some(HpaError::MetricUnavailable(self.spec.metric_name.clone()));
                return out;
            };
            out.metric_desired = Some(metric_desired);
            out.scaling_active = Some("ValidMetricFound");
            let mut rescale_metric = String::new();
            if metric_desired > desired {
                desired = metric_desired;
                rescale_metric = format!("external metric {}", self.spec.metric_name);
            }
            if desired > current {
                out.reason = format!("{rescale_metric} above target");
            }
            if desired < current {
                out.reason = "All metrics below target".to_owned();
            }
            desired = match self.behavior.take() {
                None => self.normalize_desired_replicas(current, desired, now, &mut out),
                Some(b) => {
                    let d = self.normalize_desired_replicas_with_behaviors(
                        &b, current, desired, now, &mut out,
                    );
                    self.behavior = Some(b);
                    d
                }
            };
            rescale = desired != current;
        }
        if rescale {
            self.store_scale_event(current, desired, now);
            out.rescaled = true;
        } else {
            desired = current;
        }
        out.desired = desired;
        out
    }

    /// `recordInitialRecommendation`.
    fn record_initial_recommendation(&mut self, current: i32, now: i64) {
        if self.recommendations.is_none() {
            self.recommendations = Some(vec![Recommendation {
                replicas: current,
                at: now,
            }]);
        }
    }

    /// `computeReplicasForMetrics` for one external metric (`computeStatusForExternalMetric`):
    /// `None` is the failure (`-1`).
    fn compute_replicas_for_metric(&self, input: &SyncInput) -> Option<i32> {
        let value = input.metric?;
        let tolerances = Tolerances::for_hpa(self.spec.flags.tolerance, self.behavior.as_ref());
        let (replicas, _usage) = match self.spec.target {
            MetricTarget::AverageValue { milli_value } => calculator::external_average_replicas(
                input.status_replicas,
                milli_value,
                &[value],
                tolerances,
            ),
            MetricTarget::Value { milli_value } => calculator::external_value_replicas(
                input.spec_replicas,
                milli_value,
                &[value],
                tolerances,
                input.ready_pods,
            ),
        };
        Some(replicas)
    }

    /// `normalizeDesiredReplicas` (no `behavior`).
    fn normalize_desired_replicas(
        &mut self,
        current: i32,
        prenormalized: i32,
        now: i64,
        out: &mut SyncOutput,
    ) -> i32 {
        let stabilized = self.stabilize_recommendation(prenormalized, now);
        out.stabilization = Some(if stabilized != prenormalized {
            "ScaleDownStabilized"
        } else {
            "ReadyForNewScale"
        });
        let (desired, reason) = convert_desired_replicas_with_rules(
            current,
            stabilized,
            self.spec.min_replicas,
            self.spec.max_replicas,
        );
        out.limited = Some(reason);
        desired
    }

    /// `stabilizeRecommendation`: the max over the recommendations not older than the
    /// downscale window (`!timestamp.Before(cutoff)`), recording `prenormalized`.
    fn stabilize_recommendation(&mut self, prenormalized: i32, now: i64) -> i32 {
        let mut max_recommendation = prenormalized;
        let mut old_sample = None;
        let cutoff = now - nanos(self.spec.flags.downscale_stabilization_seconds);
        let recs = self.recommendations.get_or_insert_with(Vec::new);
        for (i, rec) in recs.iter().enumerate() {
            if rec.at < cutoff {
                old_sample = Some(i);
            } else if rec.replicas > max_recommendation {
                max_recommendation = rec.replicas;
            }
        }
        let new = Recommendation {
            replicas: prenormalized,
            at: now,
        };
        match old_sample {
            Some(i) => recs[i] = new,
            None => recs.push(new),
        }
        max_recommendation
    }

    /// `normalizeDesiredReplicasWithBehaviors`.
    fn normalize_desired_replicas_with_behaviors(
        &mut self,
        behavior: &Defaulted,
        current: i32,
        prenormalized: i32,
        now: i64,
        out: &mut SyncOutput,
    ) -> i32 {
        let mut arg = NormalizationArg {
            up: &behavior.up,
            down: &behavior.down,
            min_replicas: self.spec.min_replicas,
            max_replicas: self.spec.max_replicas,
            current_replicas: current,
            desired_replicas: prenormalized,
        };
        let (stabilized, reason) = self.stabilize_recommendation_with_behaviors(&arg, now);
        arg.desired_replicas = stabilized;
        out.stabilization = Some(if stabilized != prenormalized {
            reason
        } else {
            "ReadyForNewScale"
        });
        let (desired, limited) = self.convert_desired_replicas_with_behavior_rate(&arg, now);
        out.limited = Some(limited);
        desired
    }

    /// `stabilizeRecommendationWithBehaviors`.
    fn stabilize_recommendation_with_behaviors(
        &mut self,
        args: &NormalizationArg<'_>,
        now: i64,
    ) -> (i32, &'static str) {
        let mut old_sample = None;
        let mut up_recommendation = args.desired_replicas;
        let up_cutoff = now - seconds(args.up.window_seconds);
        let mut down_recommendation = args.desired_replicas;
        let down_cutoff = now - seconds(args.down.window_seconds);

        // Calculate the upper and lower stabilization limits.
        let recs = self.recommendations.get_or_insert_with(Vec::new);
        for (i, rec) in recs.iter().enumerate() {
            if rec.at > up_cutoff {
                up_recommendation = rec.replicas.min(up_recommendation);
            }
            if rec.at > down_cutoff {
                down_recommendation = rec.replicas.max(down_recommendation);
            }
            if rec.at < up_cutoff && rec.at < down_cutoff {
                old_sample = Some(i);
            }
        }

        // Bring the recommendation to within the upper and lower limits (stabilize).
        let mut recommendation = args.current_replicas;
        if recommendation < up_recommendation {
            recommendation = up_recommendation;
        }
        if recommendation > down_recommendation {
            recommendation = down_recommendation;
        }

        // Record the unstabilized recommendation.
        let new = Recommendation {
            replicas: args.desired_replicas,
            at: now,
        };
        match old_sample {
            Some(i) => recs[i] = new,
            None => recs.push(new),
        }

        let reason = if args.desired_replicas >= args.current_replicas {
            "ScaleUpStabilized"
        } else {
            "ScaleDownStabilized"
        };
        (recommendation, reason)
    }

    /// `convertDesiredReplicasWithBehaviorRate`.
    fn convert_desired_replicas_with_behavior_rate(
        &self,
        args: &NormalizationArg<'_>,
        now: i64,
    ) -> (i32, &'static str) {
        if args.desired_replicas > args.current_replicas {
            let mut scale_up_limit = calculate_scale_up_limit_with_scaling_rules(
                args.current_replicas,
                &self.up_events,
                &self.down_events,
                args.up,
                now,
            );
            if scale_up_limit < args.current_replicas {
                // We shouldn't scale up further until the scaleUpEvents will be cleaned up.
                scale_up_limit = args.current_replicas;
            }
            let (maximum_allowed, reason) = if args.max_replicas > scale_up_limit {
                (scale_up_limit, "ScaleUpLimit")
            } else {
                (args.max_replicas, "TooManyReplicas")
            };
            if args.desired_replicas > maximum_allowed {
                return (maximum_allowed, reason);
            }
        } else if args.desired_replicas < args.current_replicas {
            let mut scale_down_limit = calculate_scale_down_limit_with_behaviors(
                args.current_replicas,
                &self.up_events,
                &self.down_events,
                args.down,
                now,
            );
            if scale_down_limit > args.current_replicas {
                // We shouldn't scale down further until the scaleDownEvents will be cleaned up.
                scale_down_limit = args.current_replicas;
            }
            let (minimum_allowed, reason) = if args.min_replicas < scale_down_limit {
                (scale_down_limit, "ScaleDownLimit")
            } else {
                (args.min_replicas, "TooFewReplicas")
            };
            if args.desired_replicas < minimum_allowed {
                return (minimum_allowed, reason);
            }
        }
        (args.desired_replicas, "DesiredWithinRange")
    }

    /// `storeScaleEvent`: nothing without `behavior`.
    fn store_scale_event(&mut self, prev_replicas: i32, new_replicas: i32, now: i64) {
        let Some(behavior) = &self.behavior else {
            return;
        };
        let (events, longest, change) = if new_replicas > prev_replicas {
            (
                &mut self.up_events,
                behavior.up.longest_period(),
                new_replicas.wrapping_sub(prev_replicas),
            )
        } else {
            (
                &mut self.down_events,
                behavior.down.longest_period(),
                prev_replicas.wrapping_sub(new_replicas),
            )
        };
        mark_scale_events_outdated(events, longest, now);
        let old_sample = events.iter().rposition(|e| e.outdated);
        let new = ScaleEvent {
            change,
            at: now,
            outdated: false,
        };
        match old_sample {
            Some(i) => events[i] = new,
            None => events.push(new),
        }
    }
}

/// `convertDesiredReplicasWithRules` (no `behavior`).
fn convert_desired_replicas_with_rules(
    current: i32,
    desired: i32,
    hpa_min: i32,
    hpa_max: i32,
) -> (i32, &'static str) {
    let minimum_allowed = hpa_min;
    // Do not scale up too much to prevent incorrect rapid increase of the number of master
    // replicas caused by bogus CPU usage report from heapster/kubelet (like in issue #32304).
    let scale_up_limit = calculate_scale_up_limit(current);
    let (maximum_allowed, condition) = if hpa_max > scale_up_limit {
        (scale_up_limit, "ScaleUpLimit")
    } else {
        (hpa_max, "TooManyReplicas")
    };
    if desired < minimum_allowed {
        (minimum_allowed, "TooFewReplicas")
    } else if desired > maximum_allowed {
        (maximum_allowed, condition)
    } else {
        (desired, "DesiredWithinRange")
    }
}

/// `scaleUpLimitFactor` (upstream's tests set it to 8; the controller uses 2).
const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
/// `scaleUpLimitMinimum`.
const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;

/// `calculateScaleUpLimit`: `int32(max(2 × current, 4))`.
fn calculate_scale_up_limit(current: i32) -> i32 {
    (SCALE_UP_LIMIT_FACTOR * f64::from(current)).max(SCALE_UP_LIMIT_MINIMUM) as i32
}

/// `markScaleEventsOutdated`: events older than the longest period (`Before(cutoff)`).
fn mark_scale_events_outdated(events: &mut [ScaleEvent], longest_period: i32, now: i64) {
    let cutoff = now - seconds(longest_period);
    for e in events.iter_mut() {
        if e.at < cutoff {
            e.outdated = true;
        }
    }
}

/// `getReplicasChangePerPeriod`: the changes strictly after `now − period`.
fn replicas_change_per_period(period_seconds: i32, events: &[ScaleEvent], now: i64) -> i32 {
    let cutoff = now - seconds(period_seconds);
    events
        .iter()
        .filter(|e| e.at > cutoff)
        .fold(0i32, |acc, e| acc.wrapping_add(e.change))
}

/// `calculateScaleUpLimitWithScalingRules`.
fn calculate_scale_up_limit_with_scaling_rules(
    current: i32,
    up_events: &[ScaleEvent],
    down_events: &[ScaleEvent],
    rules: &Rules,
    now: i64,
) -> i32 {
    let (mut result, select): (i32, fn(i32, i32) -> i32) = match rules.select {
        // Scaling is disabled.
        SelectPolicy::Disabled => return current,
        // For scaling up, the lowest change ('min' policy) produces a minimum value.
        SelectPolicy::Min => (i32::MAX, i32::min),
        // Use the default policy otherwise to produce a highest possible change.
        SelectPolicy::Max => (i32::MIN, i32::max),
    };
    for policy in &rules.policies {
        let added = replicas_change_per_period(policy.period_seconds, up_events, now);
        let deleted = replicas_change_per_period(policy.period_seconds, down_events, now);
        let period_start = current.wrapping_sub(added).wrapping_add(deleted);
        let proposed = match policy.kind {
            PolicyType::Pods => period_start.wrapping_add(policy.value),
            // The proposal has to be rounded up because the proposed change might not increase
            // the replica count causing the target to never scale up.
            PolicyType::Percent => {
                (f64::from(period_start) * (1.0 + f64::from(policy.value) / 100.0)).ceil() as i32
            }
        };
        result = select(result, proposed);
    }
    result
}

/// `calculateScaleDownLimitWithBehaviors`.
fn calculate_scale_down_limit_with_behaviors(
    current: i32,
    up_events: &[ScaleEvent],
    down_events: &[ScaleEvent],
    rules: &Rules,
    now: i64,
) -> i32 {
    let (mut result, select): (i32, fn(i32, i32) -> i32) = match rules.select {
        // Scaling is disabled.
        SelectPolicy::Disabled => return current,
        // For scaling down, the lowest change ('min' policy) produces a maximum value.
        SelectPolicy::Min => (i32::MIN, i32::max),
        // Use the default policy otherwise to produce a highest possible change.
        SelectPolicy::Max => (i32::MAX, i32::min),
    };
    for policy in &rules.policies {
        let added = replicas_change_per_period(policy.period_seconds, up_events, now);
        let deleted = replicas_change_per_period(policy.period_seconds, down_events, now);
        let period_start = current.wrapping_sub(added).wrapping_add(deleted);
        let proposed = match policy.kind {
            PolicyType::Pods => period_start.wrapping_sub(policy.value),
            // int32(float64): truncation toward zero.
            PolicyType::Percent => {
                (f64::from(period_start) * (1.0 - f64::from(policy.value) / 100.0)) as i32
            }
        };
        result = select(result, proposed);
    }
    result
}
