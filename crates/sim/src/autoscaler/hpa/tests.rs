//! Test cases of `pkg/controller/podautoscaler/horizontal_test.go` (Kubernetes v1.35.4), ported
//! case by case where the upstream test drives the functions ported here, and translated to
//! an `External` metric where it drives the whole controller with another metric type (said
//! so in each test). Upstream sets `scaleUpLimitFactor = 8` for its tests; the cases below
//! either do not reach the legacy scale-up cap or use the production factor 2 through
//! `calculate_scale_up_limit`, as `TestConvertDesiredReplicasWithRules` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

/// The tests' `time.Now()`, seconds.
const NOW: f64 = 10_000.0;

/// `time.Now().Add(-secs)` in nanoseconds.
fn ago(secs: f64) -> i64 {
    nanos(NOW - secs)
}

fn value(milli: i64) -> MetricTarget {
    MetricTarget::Value { milli_value: milli }
}

fn average(milli: i64) -> MetricTarget {
    MetricTarget::AverageValue { milli_value: milli }
}

fn hpa(min: i32, max: i32, target: MetricTarget, behavior: Option<Behavior>) -> HpaController {
    HpaController::new(HpaSpec::new(min, max, target).with_behavior(behavior)).unwrap()
}

/// A sync at [`NOW`] with every pod created ready.
fn sync(spec: i32, status: i32, metric: Option<i64>) -> SyncInput {
    SyncInput {
        now: NOW,
        spec_replicas: spec,
        status_replicas: status,
        ready_pods: status,
        metric,
    }
}

/// `generateScalingRules(pods, podsPeriod, percent, percentPeriod, stabilizationWindow)`.
fn generate_scaling_rules(
    pods: i32,
    pods_period: i32,
    percent: i32,
    percent_period: i32,
    window: i32,
) -> ScalingRules {
    let mut policies = Vec::new();
    if pods != 0 {
        policies.push(ScalingPolicy::pods(pods, pods_period));
    }
    if percent != 0 {
        policies.push(ScalingPolicy::percent(percent, percent_period));
    }
    ScalingRules {
        stabilization_window_seconds: Some(window),
        select_policy: Some(SelectPolicy::Max),
        policies: Some(policies),
        tolerance: None,
    }
}

/// `generateEventsUniformDistribution(rawEvents, periodSeconds)`: event `i` at
/// `now - (period - segment × (i + 1) + segment / 2)` seconds (the Duration conversion
/// truncates, all whole numbers in the cases).
fn generate_events_uniform_distribution(raw: &[i32], period: i32) -> Vec<ScaleEvent> {
    let segment = f64::from(period) / raw.len() as f64;
    raw.iter()
        .enumerate()
        .map(|(idx, &change)| {
            let boundary =
                (f64::from(period) - segment * (idx as f64 + 1.0) + segment / 2.0).trunc();
            ScaleEvent {
                change,
                at: ago(boundary),
                outdated: false,
            }
        })
        .collect()
}

fn recs(list: &[(i32, f64)]) -> Vec<Recommendation> {
    list.iter()
        .map(|&(replicas, secs_ago)| Recommendation {
            replicas,
            at: ago(secs_ago),
        })
        .collect()
}

// ---- External-metric syncs (the testCase-driven tests) ----

#[test]
fn scale_up_cm_external() {
    // TestScaleUpCMExternal: min 2, max 6, 3 replicas, Value 6666m, 8600m -> 4.
    let mut h = hpa(2, 6, value(6666), None);
    let out = h.reconcile(&sync(3, 3, Some(8600)));
    assert_eq!(out.desired, 4);
    assert!(out.rescaled);
    assert_eq!(out.reason, "external metric s0-metric above target");
}

#[test]
fn scale_up_per_pod_cm_external() {
    // TestScaleUpPerPodCMExternal: AverageValue 2222m, 8600m -> 4.
    let mut h = hpa(2, 6, average(2222), None);
    assert_eq!(h.reconcile(&sync(3, 3, Some(8600))).desired, 4);
}

#[test]
fn scale_down_cm_external() {
    // TestScaleDownCMExternal: 5 replicas, Value 14400m, 8600m, recommendations [] -> 3.
    let mut h = hpa(2, 6, value(14400), None);
    h.set_recommendations(&[]);
    let out = h.reconcile(&sync(5, 5, Some(8600)));
    assert_eq!(out.desired, 3);
    assert_eq!(out.reason, "All metrics below target");
}

#[test]
fn scale_down_to_zero_cm_external() {
    // TestScaleDownToZeroCMExternal: minReplicas 0, metric 0 -> 0.
    let mut h = hpa(0, 6, value(14400), None);
    h.set_recommendations(&[]);
    assert_eq!(h.reconcile(&sync(5, 5, Some(0))).desired, 0);
}

#[test]
fn scale_down_per_pod_cm_external() {
    // TestScaleDownPerPodCMExternal: AverageValue 3000m, 8600m -> 3.
    let mut h = hpa(2, 6, average(3000), None);
    h.set_recommendations(&[]);
    assert_eq!(h.reconcile(&sync(5, 5, Some(8600))).desired, 3);
}

#[test]
fn tolerance_cm_external() {
    // TestToleranceCMExternal: Value 8666m, 4 replicas, 8600m: ratio 0.99 -> 4,
    // ReadyForNewScale.
    let mut h = hpa(2, 6, value(8666), None);
    let out = h.reconcile(&sync(4, 4, Some(8600)));
    assert_eq!((out.desired, out.rescaled), (4, false));
    assert_eq!(out.stabilization, Some("ReadyForNewScale"));
    assert_eq!(out.reason, "", "no rescale reason when nothing changes");
    // TestTolerancePerPodCMExternal: AverageValue 2200m -> 4.
    let mut h = hpa(2, 6, average(2200), None);
    assert_eq!(h.reconcile(&sync(4, 4, Some(8600))).desired, 4);
}

#[test]
fn configurable_tolerance_from_behavior() {
    // TestConfigurableTolerance's idea on an External metric: behavior.scaleUp.tolerance
    // replaces the flag for scale-up only. 8900 / 8800 = 1.011: outside 1 %, within 10 %.
    let behavior = Behavior::new(
        Some(ScalingRules {
            tolerance: Some(0.01),
            ..ScalingRules::default()
        }),
        None,
    );
    let mut h = hpa(1, 10, value(8800), Some(behavior));
    assert_eq!(h.reconcile(&sync(3, 3, Some(8900))).desired, 4);
    let mut h = hpa(1, 10, value(8800), None);
    assert_eq!(h.reconcile(&sync(3, 3, Some(8900))).desired, 3);
}

#[test]
fn zero_too_few_too_many_replicas() {
    // TestZeroReplicas: min 3, max 5, spec 0 -> 0, ScalingDisabled.
    let mut h = hpa(3, 5, value(1000), None);
    let out = h.reconcile(&sync(0, 0, Some(100_000)));
    assert_eq!((out.desired, out.rescaled), (0, false));
    assert_eq!(out.scaling_active, Some("ScalingDisabled"));
    assert_eq!(out.metric_desired, None);
    // TestTooFewReplicas: spec 2 -> 3, whatever the metric.
    let out = hpa(3, 5, value(1000), None).reconcile(&sync(2, 2, Some(0)));
    assert_eq!(out.desired, 3);
    assert_eq!(
        out.reason,
        "Current number of replicas below Spec.MinReplicas"
    );
    // TestTooManyReplicas: spec 10 -> 5, whatever the metric.
    let out = hpa(3, 5, value(1000), None).reconcile(&sync(10, 10, Some(1_000_000)));
    assert_eq!(out.desired, 5);
    assert_eq!(
        out.reason,
        "Current number of replicas above Spec.MaxReplicas"
    );
    // Both skip the metric: a failed fetch changes nothing.
    assert_eq!(
        hpa(3, 5, value(1000), None)
            .reconcile(&sync(10, 10, None))
            .desired,
        5
    );
}

#[test]
fn zero_min_replicas_scales_from_zero() {
    // TestScaleUpFromZeroCMObject's branch (HPAScaleToZero) on an External metric: with
    // minReplicas 0 and 0 replicas the metric is read, ceil(ratio) without tolerance.
    let mut h = hpa(0, 6, value(1000), None);
    let out = h.reconcile(&sync(0, 0, Some(2500)));
    assert_eq!(out.desired, 3);
}

#[test]
fn a_negative_proposal_counts_as_zero() {
    // reconcileAutoscaler starts from desiredReplicas = 0 and takes the metric's proposal only
    // if larger: a negative metric (ceil(-5 x 3) = -15) is recorded and normalized as 0.
    let mut h = hpa(1, 10, value(1000), None);
    h.set_recommendations(&[]);
    let out = h.reconcile(&sync(3, 3, Some(-5000)));
    assert_eq!(out.metric_desired, Some(-15));
    assert_eq!(out.desired, 1);
    assert_eq!(out.reason, "All metrics below target");
    let stored: Vec<i32> = h
        .recommendations
        .iter()
        .flatten()
        .map(|r| r.replicas)
        .collect();
    assert_eq!(stored, vec![0]);
}

#[test]
fn failed_external_metric_keeps_the_replicas() {
    // TestConditionFailedGetMetrics, "FailedGetExternalMetric": min 1, max 100, 3 replicas,
    // Value 300m, the external metrics API fails -> 3, ScalingActive False.
    let mut h = hpa(1, 100, value(300), None);
    let out = h.reconcile(&sync(3, 3, None));
    assert_eq!((out.desired, out.rescaled), (3, false));
    assert_eq!(out.metric_desired, Some(-1));
    assert_eq!(out.scaling_active, Some("FailedGetExternalMetric"));
    assert!(matches!(out.error, Some(HpaError::MetricUnavailable(_))));
    // Only the initial recommendation was recorded: a failed sync stores none.
    assert_eq!(h.recommendations.as_ref().map(Vec::len), Some(1));
}

#[test]
fn scale_down_stabilize_initial_size() {
    // TestScaleDownStabilizeInitialSize (a CPU metric upstream; the same shape with an
    // External one): no stored recommendation, 5 replicas, the metric wants 3: the initial
    // recommendation (5) holds the scale-down, ScaleDownStabilized.
    let mut h = hpa(2, 6, value(1000), None);
    let out = h.reconcile(&sync(5, 5, Some(600)));
    assert_eq!(out.metric_desired, Some(3));
    assert_eq!(out.desired, 5);
    assert_eq!(out.stabilization, Some("ScaleDownStabilized"));
}

#[test]
fn stabilize_downscale() {
    // TestStabilizeDownscale (CPU upstream): recommendations {10, -10 min}, {4, -1 min}, 4
    // replicas, the metric wants less: 4 (the 10 is older than the 5-minute window).
    let mut h = hpa(1, 5, value(1000), None);
    h.set_recommendations(&[(NOW - 600.0, 10), (NOW - 60.0, 4)]);
    let out = h.reconcile(&sync(4, 4, Some(500)));
    assert_eq!(out.metric_desired, Some(2));
    assert_eq!(out.desired, 4);
    assert_eq!(out.stabilization, Some("ScaleDownStabilized"));
}

#[test]
fn upscale_cap() {
    // TestUpscaleCap (CPU ratio 20 upstream; here an External Value metric at 20x the
    // target): scaleUp Percent 700 per 60 s: 3 -> 24, ScaleUpLimit.
    let behavior = Behavior::new(Some(generate_scaling_rules(0, 0, 700, 60, 0)), None);
    let mut h = hpa(1, 100, value(1000), Some(behavior.clone()));
    let out = h.reconcile(&sync(3, 3, Some(20_000)));
    assert_eq!(out.metric_desired, Some(60));
    assert_eq!((out.desired, out.limited), (24, Some("ScaleUpLimit")));
    // TestUpscaleCapGreaterThanMaxReplicas: maxReplicas 20 -> 20, TooManyReplicas.
    let mut h = hpa(1, 20, value(1000), Some(behavior));
    let out = h.reconcile(&sync(3, 3, Some(20_000)));
    assert_eq!((out.desired, out.limited), (20, Some("TooManyReplicas")));
}

#[test]
fn scale_down_with_scaling_rules() {
    // TestScaleDownWithScalingRules (CPU upstream): behavior set (scaleUp rules only), so
    // the behavior path with the default scale-down rules; recommendations [] -> 5 to 3.
    let behavior = Behavior::new(Some(generate_scaling_rules(0, 0, 100, 15, 30)), None);
    let mut h = hpa(2, 6, value(1000), Some(behavior));
    h.set_recommendations(&[]);
    assert_eq!(h.reconcile(&sync(5, 5, Some(600))).desired, 3);
}

#[test]
fn legacy_scale_up_cap_at_the_production_factor() {
    // No behavior: max(2 x 3, 4) = 6, ScaleUpLimit (upstream's tests run with factor 8).
    let mut h = hpa(1, 100, value(1000), None);
    let out = h.reconcile(&sync(3, 3, Some(20_000)));
    assert_eq!((out.desired, out.limited), (6, Some("ScaleUpLimit")));
}

#[test]
fn average_value_within_tolerance_proposes_status_replicas() {
    // Follows from GetExternalPerPodMetricReplicas (no upstream test for External): within
    // the tolerance the proposal is status.replicas, not spec.replicas, so during a rollout
    // with surge (spec 4, status 5) the HPA scales to 5. (TestMoreReplicasThanSpecNoScale
    // checks the opposite for a CPU metric, whose calculator starts from spec.replicas.)
    // 5400m against 1000m per pod: 5400 / (1000 x 5) = 1.08 is within the tolerance (5);
    // against spec.replicas it would be 1.35 and ceil(5.4) = 6.
    let mut h = hpa(1, 8, average(1000), None);
    let out = h.reconcile(&sync(4, 5, Some(5400)));
    assert_eq!(out.metric_desired, Some(5));
    assert_eq!(out.desired, 5);
}

// ---- convertDesiredReplicasWithRules, calculate*Limit* ----

#[test]
fn convert_desired_replicas_with_rules_cases() {
    // TestConvertDesiredReplicasWithRules.
    let cases = [
        (5, 7, 3, 8, 7, "DesiredWithinRange"),
        (3, 1, 2, 8, 2, "TooFewReplicas"),
        (1, 0, 0, 10, 0, "DesiredWithinRange"),
        (20, 1000, 1, 10, 10, "TooManyReplicas"),
        (
            3,
            1000,
            1,
            2000,
            calculate_scale_up_limit(3),
            "ScaleUpLimit",
        ),
    ];
    for (current, desired, min, max, expected, condition) in cases {
        assert_eq!(
            convert_desired_replicas_with_rules(current, desired, min, max),
            (expected, condition),
            "{current} {desired} {min} {max}"
        );
    }
    assert_eq!(calculate_scale_up_limit(3), 6);
    assert_eq!(calculate_scale_up_limit(1), 4);
}

fn min_rules() -> Rules {
    Rules {
        window_seconds: 300,
        select: SelectPolicy::Min,
        policies: vec![ScalingPolicy::pods(2, 60), ScalingPolicy::percent(50, 60)],
        tolerance: None,
    }
}

#[test]
fn calculate_scale_up_limit_with_scaling_rules_min() {
    // TestCalculateScaleUpLimitWithScalingRules: selectPolicy Min, Pods 2 and Percent 50 per
    // 60 s, from 1: min(3, ceil(1.5)) = 2.
    assert_eq!(
        calculate_scale_up_limit_with_scaling_rules(1, &[], &[], &min_rules(), nanos(NOW)),
        2
    );
}

#[test]
fn calculate_scale_down_limit_with_behaviors_min() {
    // TestCalculateScaleDownLimitWithBehaviors: from 5: max(3, trunc(2.5)) = 3.
    assert_eq!(
        calculate_scale_down_limit_with_behaviors(5, &[], &[], &min_rules(), nanos(NOW)),
        3
    );
}

#[test]
fn percent_rounds_up_when_scaling_up_and_truncates_when_scaling_down() {
    // calculateScaleUpLimitWithScalingRules uses math.Ceil, calculateScaleDownLimitWithBehaviors
    // int32() (truncation): from 5 at 50 %, up to ceil(7.5) = 8, down to trunc(2.5) = 2.
    let rules = Rules {
        select: SelectPolicy::Max,
        policies: vec![ScalingPolicy::percent(50, 60)],
        ..min_rules()
    };
    let now = nanos(NOW);
    assert_eq!(
        calculate_scale_up_limit_with_scaling_rules(5, &[], &[], &rules, now),
        8
    );
    assert_eq!(
        calculate_scale_down_limit_with_behaviors(5, &[], &[], &rules, now),
        2
    );
}

#[test]
fn disabled_select_policy_allows_no_change() {
    let rules = Rules {
        select: SelectPolicy::Disabled,
        ..min_rules()
    };
    let now = nanos(NOW);
    assert_eq!(
        calculate_scale_up_limit_with_scaling_rules(7, &[], &[], &rules, now),
        7
    );
    assert_eq!(
        calculate_scale_down_limit_with_behaviors(7, &[], &[], &rules, now),
        7
    );
}

// ---- TestScalingWithRules (convertDesiredReplicasWithBehaviorRate) ----

struct RulesCase {
    name: &'static str,
    up_events: Vec<ScaleEvent>,
    down_events: Vec<ScaleEvent>,
    min: i32,
    max: i32,
    up: Option<ScalingRules>,
    down: Option<ScalingRules>,
    current: i32,
    desired: i32,
    expected: i32,
    condition: &'static str,
}

fn case(
    name: &'static str,
    (min, max): (i32, i32),
    (up, down): (Option<ScalingRules>, Option<ScalingRules>),
    (current, desired): (i32, i32),
    (expected, condition): (i32, &'static str),
) -> RulesCase {
    RulesCase {
        name,
        up_events: Vec::new(),
        down_events: Vec::new(),
        min,
        max,
        up,
        down,
        current,
        desired,
        expected,
        condition,
    }
}

fn with_events(mut c: RulesCase, up: &[i32], down: &[i32]) -> RulesCase {
    if !up.is_empty() {
        c.up_events = generate_events_uniform_distribution(up, 120);
    }
    if !down.is_empty() {
        c.down_events = generate_events_uniform_distribution(down, 120);
    }
    c
}

#[test]
fn scaling_with_rules() {
    let g = generate_scaling_rules;
    #[rustfmt::skip]
    let cases = vec![
        case("prenormalized desired replicas within range", (3, 8), (None, None), (5, 7), (7, "DesiredWithinRange")),
        case("prenormalized desired replicas < minReplicas", (2, 8), (None, None), (3, 1), (2, "TooFewReplicas")),
        case("prenormalized desired replicas within range when minReplicas is 0", (0, 10), (None, None), (1, 0), (0, "DesiredWithinRange")),
        case("maxReplicas is the limit because maxReplicas < scaleUpLimit", (1, 10), (None, None), (20, 1000), (10, "TooManyReplicas")),
        case("desired replica count is more than the maximum replica count", (100, 150), (None, None), (100, 1000), (150, "TooManyReplicas")),
        case("scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies", (1, 2000), (Some(g(0, 0, 1, 60, 0)), None), (3, 1000), (4, "ScaleUpLimit")),
        // Skipped upstream (testThis), and passing here.
        case("scaleDownLimit is the limit because scaleDownLimit > minReplicas with user defined policies", (3, 2000), (None, Some(g(20, 60, 0, 0, 0))), (1000, 3), (980, "ScaleDownLimit")),
        case("scaleUp with default behavior", (1, 1000), (None, None), (10, 50), (20, "ScaleUpLimit")),
        case("scaleUp with pods policy larger than percent policy", (1, 1000), (Some(g(100, 60, 100, 60, 0)), None), (10, 500), (110, "ScaleUpLimit")),
        case("scaleUp with percent policy larger than pods policy", (1, 1000), (Some(g(2, 60, 100, 60, 0)), None), (10, 500), (20, "ScaleUpLimit")),
        case("scaleUp with spec MaxReplicas limitation with large pod policy", (1, 1000), (Some(g(100, 60, 0, 0, 0)), None), (10, 50), (50, "DesiredWithinRange")),
        case("scaleUp with spec MaxReplicas limitation with large percent policy", (1, 1000), (Some(g(10000, 60, 0, 0, 0)), None), (10, 50), (50, "DesiredWithinRange")),
        case("scaleUp with pod policy limitation", (1, 1000), (Some(g(30, 60, 0, 0, 0)), None), (10, 50), (40, "ScaleUpLimit")),
        case("scaleUp with percent policy limitation", (1, 1000), (Some(g(0, 0, 200, 60, 0)), None), (10, 50), (30, "ScaleUpLimit")),
        case("scaleDown with percent policy larger than pod policy", (1, 1000), (None, Some(g(20, 60, 1, 60, 300))), (100, 2), (80, "ScaleDownLimit")),
        case("scaleDown with pod policy larger than percent policy", (1, 1000), (None, Some(g(2, 60, 1, 60, 300))), (100, 2), (98, "ScaleDownLimit")),
        case("scaleDown with spec MinReplicas=nil limitation with large pod policy", (1, 1000), (None, Some(g(100, 60, 0, 0, 300))), (10, 0), (1, "TooFewReplicas")),
        case("scaleDown with spec MinReplicas limitation with large pod policy", (1, 1000), (None, Some(g(100, 60, 0, 0, 300))), (10, 0), (1, "TooFewReplicas")),
        case("scaleDown with spec MinReplicas limitation with large percent policy", (5, 1000), (None, Some(g(0, 0, 100, 60, 300))), (10, 2), (5, "TooFewReplicas")),
        case("scaleDown with pod policy limitation", (1, 1000), (None, Some(g(5, 60, 0, 0, 300))), (10, 2), (5, "ScaleDownLimit")),
        case("scaleDown with percent policy limitation", (1, 1000), (None, Some(g(0, 0, 50, 60, 300))), (10, 5), (5, "DesiredWithinRange")),
        with_events(case("scaleUp with spec MaxReplicas limitation with large pod policy and events", (1, 200), (Some(g(300, 60, 0, 0, 0)), None), (100, 500), (200, "TooManyReplicas")), &[1, 5, 9], &[]),
        with_events(case("scaleUp with spec MaxReplicas limitation with large percent policy and events", (1, 200), (Some(g(0, 0, 10000, 60, 0)), None), (100, 500), (200, "TooManyReplicas")), &[1, 5, 9], &[]),
        with_events(case("scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up events", (1, 1000), (Some(g(5, 120, 0, 0, 0)), None), (100, 500), (100, "ScaleUpLimit")), &[1, 5, 9], &[]),
        with_events(case("scaleUp with pod policy and previous scale up events", (1, 1000), (Some(g(150, 120, 0, 0, 0)), None), (100, 500), (235, "ScaleUpLimit")), &[1, 5, 9], &[]),
        with_events(case("scaleUp with percent policy and previous scale up events", (1, 1000), (Some(g(0, 0, 200, 120, 0)), None), (100, 500), (255, "ScaleUpLimit")), &[1, 5, 9], &[]),
        with_events(case("scaleUp with percent policy and previous scale up and down events", (1, 1000), (Some(g(0, 0, 300, 300, 0)), None), (6, 24), (16, "ScaleUpLimit")), &[4], &[2]),
        with_events(case("scaleDown with default policy and previous events", (1, 1000), (None, None), (10, 5), (5, "DesiredWithinRange")), &[], &[1, 5, 9]),
        with_events(case("scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events", (1, 1000), (None, Some(g(115, 120, 0, 0, 300))), (100, 0), (1, "TooFewReplicas")), &[], &[1, 5, 9]),
        with_events(case("scaleDown with spec MinReplicas limitation with large pod policy and previous events", (5, 1000), (None, Some(g(130, 120, 0, 0, 300))), (100, 0), (5, "TooFewReplicas")), &[], &[1, 5, 9]),
        with_events(case("scaleDown with spec MinReplicas limitation with large percent policy and previous events", (5, 1000), (None, Some(g(0, 0, 100, 120, 300))), (100, 2), (5, "TooFewReplicas")), &[], &[1, 5, 9]),
        with_events(case("scaleDown with pod policy limitation and previous events", (1, 1000), (None, Some(g(5, 120, 0, 0, 300))), (100, 2), (100, "ScaleDownLimit")), &[], &[1, 5, 9]),
        with_events(case("scaleDown with percent policy limitation and previous events", (1, 1000), (None, Some(g(0, 0, 50, 120, 300))), (100, 0), (56, "ScaleDownLimit")), &[], &[2, 4, 6]),
        with_events(case("scaleDown with percent policy and previous scale up and down events", (1, 1000), (None, Some(g(0, 0, 50, 180, 0))), (10, 1), (6, "ScaleDownLimit")), &[2], &[4]),
        with_events(case("scaleDown with previous events preventing further scale down", (1, 1000), (None, Some(g(0, 0, 10, 120, 300))), (100, 0), (100, "ScaleDownLimit")), &[], &[10, 10, 10]),
        with_events(case("scaleDown with with previous events still allowing more scale down", (1, 1000), (None, Some(g(0, 0, 1000, 120, 300))), (10, 5), (5, "DesiredWithinRange")), &[], &[10, 10, 10]),
        with_events(case("check 'outdated' flag for events for one behavior for up", (1, 1000), (Some(g(1000, 60, 0, 0, 0)), None), (100, 200), (200, "DesiredWithinRange")), &[8, 12, 9, 11], &[]),
        with_events(case("check that events were not marked 'outdated' for two different policies in the behavior for up", (1, 1000), (Some(g(1000, 120, 100, 60, 0)), None), (100, 200), (200, "DesiredWithinRange")), &[8, 12, 9, 11], &[]),
        with_events(case("check that events were marked 'outdated' for two different policies in the behavior for up", (1, 1000), (Some(g(1000, 30, 100, 60, 0)), None), (100, 200), (200, "DesiredWithinRange")), &[8, 12, 9, 11], &[]),
        with_events(case("check 'outdated' flag for events for one behavior for down", (1, 1000), (None, Some(g(1000, 60, 0, 0, 300))), (100, 5), (5, "DesiredWithinRange")), &[], &[8, 12, 9, 11]),
        with_events(case("check that events were not marked 'outdated' for two different policies in the behavior for down", (1, 1000), (None, Some(g(1000, 120, 100, 60, 300))), (100, 5), (5, "DesiredWithinRange")), &[], &[8, 12, 9, 11]),
        with_events(case("check that events were marked 'outdated' for two different policies in the behavior for down", (1, 1000), (None, Some(g(1000, 30, 100, 60, 300))), (100, 5), (5, "DesiredWithinRange")), &[], &[8, 12, 9, 11]),
    ];
    for c in cases {
        let mut h = hpa(c.min, c.max, value(1000), Some(Behavior::new(c.up, c.down)));
        h.up_events = c.up_events;
        h.down_events = c.down_events;
        let b = h.behavior.clone().unwrap();
        let arg = NormalizationArg {
            up: &b.up,
            down: &b.down,
            min_replicas: c.min,
            max_replicas: c.max,
            current_replicas: c.current,
            desired_replicas: c.desired,
        };
        assert_eq!(
            h.convert_desired_replicas_with_behavior_rate(&arg, nanos(NOW)),
            (c.expected, c.condition),
            "{}",
            c.name
        );
    }
}

// ---- TestStoreScaleEvents ----

/// (name, previous events, new events (change, outdated), rules, expected change in 60 s)
type StoreCase = (
    &'static str,
    Vec<ScaleEvent>,
    Vec<(i32, bool)>,
    Option<ScalingRules>,
    i32,
);

#[test]
fn store_scale_events() {
    type Ev = (i32, f64, bool);
    let ev = |list: &[Ev]| -> Vec<ScaleEvent> {
        list.iter()
            .map(|&(change, secs_ago, outdated)| ScaleEvent {
                change,
                at: ago(secs_ago),
                outdated,
            })
            .collect()
    };
    let cases: Vec<StoreCase> = vec![
        (
            "empty entries with default behavior",
            vec![],
            vec![],
            None,
            0,
        ),
        (
            "empty entries with two-policy-behavior",
            vec![],
            vec![(5, false)],
            Some(generate_scaling_rules(10, 60, 100, 60, 0)),
            0,
        ),
        (
            "one outdated entry to be kept untouched without behavior",
            ev(&[(7, 61.0, false)]),
            vec![(7, false)],
            None,
            0,
        ),
        (
            "one outdated entry to be replaced with behavior",
            ev(&[(7, 61.0, false)]),
            vec![(5, false)],
            Some(generate_scaling_rules(10, 60, 100, 60, 0)),
            0,
        ),
        (
            "one actual entry to be not touched with behavior",
            ev(&[(7, 58.0, false)]),
            vec![(7, false), (5, false)],
            Some(generate_scaling_rules(10, 60, 100, 60, 0)),
            7,
        ),
        (
            "two entries, one of them to be replaced",
            ev(&[(7, 61.0, false), (6, 59.0, false)]),
            vec![(5, false), (6, false)],
            Some(generate_scaling_rules(10, 60, 0, 0, 0)),
            6,
        ),
        (
            "replace one entry, use policies with different periods",
            ev(&[
                (8, 29.0, false),
                (6, 59.0, false),
                (7, 61.0, false),
                (9, 61.0, false),
            ]),
            vec![(8, false), (6, false), (7, true), (5, false)],
            Some(generate_scaling_rules(10, 60, 100, 30, 0)),
            14,
        ),
        (
            // Not upstream: `Before(cutoff)` is strict, an event exactly one longest period
            // old is not outdated (nor counted in that period, `After(cutoff)`).
            "an entry exactly one period old is kept",
            ev(&[(7, 60.0, false)]),
            vec![(7, false), (5, false)],
            Some(generate_scaling_rules(10, 60, 0, 0, 0)),
            0,
        ),
        (
            "two entries, both actual",
            ev(&[(7, 58.0, false), (6, 59.0, false)]),
            vec![(7, false), (6, false), (5, false)],
            Some(generate_scaling_rules(10, 120, 100, 30, 0)),
            13,
        ),
    ];
    let now = nanos(NOW);
    for (name, prev, expected, rules, change) in cases {
        for up in [true, false] {
            let behavior = rules.clone().map(|r| {
                if up {
                    Behavior::new(Some(r), None)
                } else {
                    Behavior::new(None, Some(r))
                }
            });
            let mut h = hpa(1, 100, value(1000), behavior);
            let events = |h: &HpaController| {
                if up {
                    h.up_events.clone()
                } else {
                    h.down_events.clone()
                }
            };
            if up {
                h.up_events = prev.clone();
            } else {
                h.down_events = prev.clone();
            }
            assert_eq!(
                replicas_change_per_period(60, &events(&h), now),
                change,
                "{name} (up {up})"
            );
            let new = if up { 15 } else { 5 };
            h.store_scale_event(10, new, now);
            let got: Vec<(i32, bool)> = events(&h).iter().map(|e| (e.change, e.outdated)).collect();
            assert_eq!(got, expected, "{name} (up {up})");
        }
    }
}

// ---- TestNormalizeDesiredReplicas (stabilizeRecommendation) ----

#[test]
fn normalize_desired_replicas() {
    // (name, recommendations (replicas, seconds ago), prenormalized, expected, log length)
    type Case = (&'static str, Vec<(i32, f64)>, i32, i32, usize);
    let cases: Vec<Case> = vec![
        ("empty log", vec![], 5, 5, 1),
        ("stabilize", vec![(4, 120.0), (5, 60.0)], 3, 5, 3),
        ("no stabilize", vec![(1, 120.0), (2, 60.0)], 3, 3, 3),
        (
            "no stabilize - old recommendations",
            vec![(10, 600.0), (9, 540.0)],
            3,
            3,
            2,
        ),
        (
            "stabilize - old recommendations",
            vec![(10, 600.0), (4, 60.0), (5, 120.0), (9, 540.0)],
            3,
            5,
            4,
        ),
    ];
    for (name, list, prenormalized, expected, log_length) in cases {
        let mut h = hpa(1, 100, value(1000), None);
        h.recommendations = Some(recs(&list));
        assert_eq!(
            h.stabilize_recommendation(prenormalized, nanos(NOW)),
            expected,
            "{name}"
        );
        assert_eq!(
            h.recommendations.as_ref().map(Vec::len),
            Some(log_length),
            "{name}"
        );
    }
}

#[test]
fn legacy_window_includes_a_recommendation_exactly_at_the_cutoff() {
    // `rec.timestamp.Before(cutoff)` is strict: exactly 300 s old still counts.
    let mut h = hpa(1, 100, value(1000), None);
    h.recommendations = Some(recs(&[(9, 300.0)]));
    assert_eq!(h.stabilize_recommendation(3, nanos(NOW)), 9);
    h.recommendations = Some(recs(&[(9, 300.001)]));
    assert_eq!(h.stabilize_recommendation(3, nanos(NOW)), 3);
}

// ---- TestNormalizeDesiredReplicasWithBehavior (stabilizeRecommendationWithBehaviors) ----

#[test]
fn normalize_desired_replicas_with_behavior() {
    type Case = (
        &'static str,
        Vec<(i32, f64)>,
        i32,
        i32,
        i32,
        Option<Vec<i32>>,
        i32,
        i32,
    );
    // (name, recommendations, current, prenormalized, expected, stored, up window, down window)
    let cases: Vec<Case> = vec![
        (
            "empty recommendations for scaling down",
            vec![],
            100,
            5,
            5,
            Some(vec![5]),
            0,
            0,
        ),
        (
            "simple scale down stabilization",
            vec![(4, 120.0), (5, 60.0)],
            100,
            3,
            5,
            Some(vec![4, 5, 3]),
            0,
            180,
        ),
        (
            "simple scale up stabilization",
            vec![(4, 120.0), (5, 60.0)],
            1,
            7,
            4,
            Some(vec![4, 5, 7]),
            300,
            0,
        ),
        (
            "no scale down stabilization",
            vec![(1, 120.0), (2, 60.0)],
            100,
            3,
            3,
            Some(vec![1, 2, 3]),
            300,
            0,
        ),
        (
            "no scale up stabilization",
            vec![(4, 120.0), (5, 60.0)],
            1,
            3,
            3,
            Some(vec![4, 5, 3]),
            0,
            300,
        ),
        (
            "no scale down stabilization, reuse recommendation element",
            vec![(10, 600.0), (9, 540.0)],
            100,
            3,
            3,
            Some(vec![10, 3]),
            0,
            0,
        ),
        (
            "no scale up stabilization, reuse recommendation element",
            vec![(10, 600.0), (9, 540.0)],
            1,
            100,
            100,
            Some(vec![10, 100]),
            0,
            0,
        ),
        (
            "scale down stabilization, reuse one of obsolete recommendation element",
            vec![(10, 600.0), (4, 60.0), (5, 120.0), (9, 540.0)],
            100,
            3,
            5,
            Some(vec![10, 4, 5, 3]),
            0,
            180,
        ),
        (
            "scale up stabilization, reuse one of obsolete recommendation element",
            vec![(10, 6000.0), (6, 60.0), (5, 120.0), (9, 180.0)],
            1,
            100,
            5,
            Some(vec![100, 6, 5, 9]),
            300,
            0,
        ),
        (
            "scale up and down stabilization, do not scale up when prenormalized rec goes down",
            vec![(2, 6000.0), (3, 180.0)],
            2,
            1,
            2,
            None,
            300,
            300,
        ),
        (
            "scale up and down stabilization, do not scale down when prenormalized rec goes up",
            vec![(2, 6000.0), (1, 180.0)],
            2,
            3,
            2,
            None,
            300,
            300,
        ),
    ];
    for (name, list, current, prenormalized, expected, stored, up_window, down_window) in cases {
        let rules = |w| Rules {
            window_seconds: w,
            select: SelectPolicy::Max,
            policies: vec![],
            tolerance: None,
        };
        let (up, down) = (rules(up_window), rules(down_window));
        let mut h = hpa(1, 1000, value(1000), None);
        h.recommendations = Some(recs(&list));
        let arg = NormalizationArg {
            up: &up,
            down: &down,
            min_replicas: 1,
            max_replicas: 1000,
            current_replicas: current,
            desired_replicas: prenormalized,
        };
        let (got, _) = h.stabilize_recommendation_with_behaviors(&arg, nanos(NOW));
        assert_eq!(got, expected, "{name}");
        if let Some(stored) = stored {
            let values: Vec<i32> = h
                .recommendations
                .as_ref()
                .unwrap()
                .iter()
                .map(|r| r.replicas)
                .collect();
            assert_eq!(values, stored, "{name}");
        }
    }
}

// ---- Across syncs: what the single-sync upstream tests do not show ----

#[test]
fn behavior_periods_count_the_events_of_earlier_syncs() {
    // Follows from storeScaleEvent and getReplicasChangePerPeriod: scale-up Percent 700 per
    // 60 s. 3 -> 24 at t; 30 s later the period still starts at 3 (limit 24); 60 s later the
    // event is exactly one period old, no longer counted (`After(cutoff)` is strict): from 24
    // at most 192, capped by maxReplicas.
    let behavior = Behavior::new(Some(generate_scaling_rules(0, 0, 700, 60, 0)), None);
    let mut h = hpa(1, 100, value(1000), Some(behavior));
    let at = |t: f64, replicas: i32| SyncInput {
        now: t,
        spec_replicas: replicas,
        status_replicas: replicas,
        ready_pods: replicas,
        metric: Some(20_000),
    };
    assert_eq!(h.reconcile(&at(0.0, 3)).desired, 24);
    assert_eq!(h.up_events.len(), 1);
    let out = h.reconcile(&at(30.0, 24));
    assert_eq!((out.desired, out.limited), (24, Some("ScaleUpLimit")));
    assert_eq!(h.reconcile(&at(60.0, 24)).desired, 100);
}

#[test]
fn min_max_corrections_record_scale_events_with_behavior() {
    // storeScaleEvent runs for every rescale, the special cases included.
    let mut h = hpa(3, 5, value(1000), Some(Behavior::default()));
    assert_eq!(h.reconcile(&sync(1, 1, None)).desired, 3);
    assert_eq!(
        h.up_events.iter().map(|e| e.change).collect::<Vec<_>>(),
        vec![2]
    );
    // Without behavior nothing is stored.
    let mut h = hpa(3, 5, value(1000), None);
    h.reconcile(&sync(1, 1, None));
    assert!(h.up_events.is_empty());
}

#[test]
fn invalid_specs_are_rejected() {
    let new = |spec: HpaSpec| HpaController::new(spec).is_err();
    assert!(new(HpaSpec::new(1, 10, value(0))));
    assert!(new(HpaSpec::new(1, 0, value(1000))));
    assert!(new(HpaSpec::new(5, 4, value(1000))));
    assert!(new(HpaSpec::new(-1, 4, value(1000))));
    assert!(!new(HpaSpec::new(0, 4, value(1000))));
}
