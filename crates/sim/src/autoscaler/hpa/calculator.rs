//! The replica calculator for an `External` metric, ported from
//! `pkg/controller/podautoscaler/replica_calculator.go` (Kubernetes v1.35.4).
//!
//! Metric values and targets are `resource.Quantity` upstream, read as `MilliValue()`: `i64`
//! milli-units here. The external metrics API may return several values for a selector; they
//! are summed (with the overflow guards of each function). KEDA returns one.
//!
//! - `Value` target `T` (`GetExternalMetricReplicas`, then `getUsageRatioReplicaCount`):
//!   `ratio = usage / T` (float64), and with `current = spec.replicas`:
//!   - `current == 0` (scale from zero, `HPAScaleToZero`): `ceil(ratio)`, no tolerance;
//!   - `ratio` within the tolerances: `current`;
//!   - otherwise `ceil(ratio × readyPods)`, `i32::MAX` when that exceeds it. `readyPods` are
//!     the pods of the selector that are `Running` with `Ready=True` (`getReadyPodsCount`);
//!     this port takes the count as an input.
//! - `AverageValue` target `A` (`GetExternalPerPodMetricReplicas`), with
//!   `status = status.replicas`: `ratio = usage / (A × status)`; within the tolerances:
//!   `status`; otherwise `ceil(usage / A)`, `i32::MAX` when that exceeds it. Ready pods play no
//!   part, and `status.replicas` (pods created, ready or not), not `spec.replicas`, is the
//!   "current" count.

use super::behavior::Tolerances;

/// `GetExternalMetricReplicas`: the sum of the values, capped at `i64::MAX` on a positive
/// overflow.
pub fn sum_value_usage(values: &[i64]) -> i64 {
    let mut usage: i64 = 0;
    for &val in values {
        // Cap at MaxInt64 for positive overflow.
        if val > 0 && usage > i64::MAX - val {
            usage = i64::MAX;
            break;
        }
        usage = usage.wrapping_add(val);
    }
    usage
}

/// `GetExternalPerPodMetricReplicas`: the sum of the values, `i64::MAX` once the running sum
/// is negative ("the only way we would ever get here is because of an Int64 overflow" — also,
/// upstream, a negative value).
pub fn sum_average_usage(values: &[i64]) -> i64 {
    let mut usage: i64 = 0;
    for &val in values {
        usage = usage.wrapping_add(val);
        if usage < 0 {
            usage = i64::MAX;
            break;
        }
    }
    usage
}

/// `getUsageRatioReplicaCount`.
pub fn usage_ratio_replica_count(
    current_replicas: i32,
    usage_ratio: f64,
    tolerances: Tolerances,
    ready_pods: i32,
) -> i32 {
    if current_replicas != 0 {
        if tolerances.is_within(usage_ratio) {
            // Return the current replicas if the change would be too small.
            return current_replicas;
        }
        let replica_count_float = usage_ratio * f64::from(ready_pods);
        if replica_count_float > f64::from(i32::MAX) {
            i32::MAX
        } else {
            // Go's int32(float64) for the finite in-range case; `as` saturates below.
            replica_count_float.ceil() as i32
        }
    } else {
        // Scale to zero or n pods depending on usageRatio.
        usage_ratio.ceil() as i32
    }
}

/// `GetExternalMetricReplicas` for the values `values` and a `Value` target of `target_milli`:
/// `(replicas, usage)`.
pub fn external_value_replicas(
    spec_replicas: i32,
    target_milli: i64,
    values: &[i64],
    tolerances: Tolerances,
    ready_pods: i32,
) -> (i32, i64) {
    let usage = sum_value_usage(values);
    let usage_ratio = usage as f64 / target_milli as f64;
    let replicas = usage_ratio_replica_count(spec_replicas, usage_ratio, tolerances, ready_pods);
    (replicas, usage)
}

/// `GetExternalPerPodMetricReplicas` for the values `values` and an `AverageValue` target of
/// `target_per_pod_milli`: `(replicas, usage)` (the total usage, not the per-pod value the
/// status reports).
pub fn external_average_replicas(
    status_replicas: i32,
    target_per_pod_milli: i64,
    values: &[i64],
    tolerances: Tolerances,
) -> (i32, i64) {
    let usage = sum_average_usage(values);
    let mut replica_count = status_replicas;
    let usage_ratio = usage as f64 / (target_per_pod_milli as f64 * f64::from(replica_count));
    if !tolerances.is_within(usage_ratio) {
        // Update the number of replicas if the change is large enough.
        let result = (usage as f64 / target_per_pod_milli as f64).ceil();
        replica_count = if result > f64::from(i32::MAX) {
            i32::MAX
        } else {
            result as i32
        };
    }
    (replica_count, usage)
}

#[cfg(test)]
mod tests {
    //! `replica_calculator_test.go`, the `External` cases. The upstream cases build pods,
    //! all `Running` and `Ready=True` unless `podReadiness` says otherwise; the ready count is
    //! given here directly. `defaultTestingTolerance` is 0.1.
    use super::*;

    const T: Tolerances = Tolerances { down: 0.1, up: 0.1 };

    #[test]
    fn scale_up_cm_external() {
        // TestReplicaCalcScaleUpCMExternal: 1 replica, 8600m against a Value of 4400m.
        assert_eq!(external_value_replicas(1, 4400, &[8600], T, 1), (2, 8600));
    }

    #[test]
    fn scale_up_cm_external_ignores_unready_pods() {
        // TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods: 3 replicas, 1 ready: ceil(8600 /
        // 4400 × 1) = 2 ("would expect 6 if we didn't ignore unready pods").
        assert_eq!(external_value_replicas(3, 4400, &[8600], T, 1), (2, 8600));
    }

    #[test]
    fn scale_up_per_pod_cm_external() {
        // TestReplicaCalcScaleUpPerPodCMExternal: 3 replicas, 8600m / 2150m per pod = 4.
        assert_eq!(external_average_replicas(3, 2150, &[8600], T), (4, 8600));
    }

    #[test]
    fn scale_down_cm_external() {
        // TestReplicaCalcScaleDownCMExternal: 5 replicas, 8600m against 14334m: ceil(0.59998 ×
        // 5) = 3.
        assert_eq!(external_value_replicas(5, 14334, &[8600], T, 5), (3, 8600));
    }

    #[test]
    fn scale_down_per_pod_cm_external() {
        // TestReplicaCalcScaleDownPerPodCMExternal: ceil(8600 / 2867) = 3.
        assert_eq!(external_average_replicas(5, 2867, &[8600], T), (3, 8600));
    }

    #[test]
    fn tolerance_cm_external() {
        // TestReplicaCalcToleranceCMExternal: 8600 / 8888 = 0.968, within 10 %.
        assert_eq!(external_value_replicas(3, 8888, &[8600], T, 3).0, 3);
        // TestReplicaCalcTolerancePerPodCMExternal: 8600 / (2900 × 3) = 0.989.
        assert_eq!(external_average_replicas(3, 2900, &[8600], T).0, 3);
    }

    #[test]
    fn configurable_tolerance_cm_external() {
        // TestReplicaCalcConfigurableToleranceCMExternal: Tolerances{0.1, 0.01}, 8900 / 8800
        // = 1.011 is outside a 1 % scale-up tolerance: ceil(1.011 × 3) = 4.
        let t = Tolerances {
            down: 0.1,
            up: 0.01,
        };
        assert_eq!(external_value_replicas(3, 8800, &[8900], t, 3).0, 4);
        // With the flag's 10 % it would stay.
        assert_eq!(external_value_replicas(3, 8800, &[8900], T, 3).0, 3);
        // TestReplicaCalcConfigurableTolerancePerPodCMExternal: 8600 / (2800 × 3) = 1.024.
        assert_eq!(external_average_replicas(3, 2800, &[8600], t).0, 4);
    }

    #[test]
    fn from_zero_ignores_tolerance_and_ready_pods() {
        // TestScaleUpFromZeroIgnoresToleranceCMObject (an Object metric upstream, through the
        // same getUsageRatioReplicaCount): from 0 replicas, 1000m against a Value of 1.0 is a
        // ratio of exactly 1, within the tolerance, and still gives ceil(1) = 1.
        assert_eq!(external_value_replicas(0, 1000, &[1000], T, 0).0, 1);
        assert_eq!(external_value_replicas(0, 1000, &[1050], T, 0).0, 2);
        assert_eq!(external_value_replicas(0, 1000, &[0], T, 0).0, 0);
    }

    #[test]
    fn overflows() {
        // TestExternalPerPodMetricReplicaOverflow: MaxInt64 against 1m per pod -> MaxInt32.
        assert_eq!(
            external_average_replicas(1, 1, &[i64::MAX], T),
            (i32::MAX, i64::MAX)
        );
        // TestExternalPerPodMetricUsageOverflow: MaxInt64 against MaxInt64 per pod: ratio 1.
        assert_eq!(
            external_average_replicas(1, i64::MAX, &[i64::MAX], T),
            (1, i64::MAX)
        );
        // TestReplicaCalcExternalMetricUsageOverflow: two values whose sum overflows are capped
        // at MaxInt64; against a MaxInt64 target the ratio is 1.
        let half = i64::MAX / 2 + 1;
        assert_eq!(
            external_value_replicas(3, i64::MAX, &[half, half], T, 3),
            (3, i64::MAX)
        );
        // Huge ratio times ready pods: capped at MaxInt32.
        assert_eq!(external_value_replicas(3, 1, &[i64::MAX], T, 3).0, i32::MAX);
    }

    #[test]
    fn average_value_counts_status_replicas_not_ready_pods() {
        // 6 pods exist (status.replicas), 300m per pod wanted, 2400m in total: ratio 2400 /
        // 1800 = 1.33 -> ceil(2400 / 300) = 8, whatever the ready count.
        assert_eq!(external_average_replicas(6, 300, &[2400], T).0, 8);
        // No pod at all: the ratio is +Inf, so ceil(usage / target).
        assert_eq!(external_average_replicas(0, 300, &[2400], T).0, 8);
        // 0/0 is NaN, never within the tolerance: ceil(0) = 0.
        assert_eq!(external_average_replicas(0, 300, &[0], T).0, 0);
    }

    #[test]
    fn a_negative_average_value_metric_reads_as_overflow() {
        // `if usage < 0 { usage = MaxInt64 }` also catches a negative value.
        assert_eq!(sum_average_usage(&[-1000]), i64::MAX);
        assert_eq!(sum_value_usage(&[-1000]), -1000);
    }
}
