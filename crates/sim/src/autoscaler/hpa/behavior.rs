//! `spec.behavior` of an `autoscaling/v2` HorizontalPodAutoscaler, its defaults and the
//! controller flags that fill what it leaves unset.
//!
//! Upstream (`kubernetes/kubernetes` v1.35.4):
//!
//! - the types: `staging/src/k8s.io/api/autoscaling/v2/types.go` (`HorizontalPodAutoscalerBehavior`,
//!   `HPAScalingRules`, `HPAScalingPolicy`, `ScalingPolicySelect`);
//! - the defaults: `pkg/apis/autoscaling/v2/defaults.go`
//!   (`SetDefaults_HorizontalPodAutoscalerBehavior`, `GenerateHPAScaleUpRules`,
//!   `GenerateHPAScaleDownRules`, `copyHPAScalingRules`). Once `behavior` is set (even `{}`),
//!   every direction is filled field by field: an unset `selectPolicy`, `policies`,
//!   `stabilizationWindowSeconds` or `tolerance` takes the default, a set one is kept whole
//!   (`policies` is replaced, not merged):
//!
//!   | | scaleUp | scaleDown |
//!   |---|---|---|
//!   | `stabilizationWindowSeconds` | 0 | unset, then the controller flag `--horizontal-pod-autoscaler-downscale-stabilization` (default 5 min), truncated to whole seconds (`maybeInitScaleDownStabilizationWindow` in `horizontal.go`) |
//!   | `selectPolicy` | `Max` | `Max` |
//!   | `policies` | `Pods` 4 per 15 s, `Percent` 100 per 15 s | `Percent` 100 per 15 s |
//!   | `tolerance` | unset: the controller flag | unset: the controller flag |
//!
//! - the tolerances: `horizontal.go` `tolerancesForHpa`: the flag `--horizontal-pod-autoscaler-tolerance`
//!   (default 0.1) for both directions, each replaced by its direction's `tolerance` when the
//!   `HPAConfigurableTolerance` feature gate is on (beta, on by default since 1.35; this port
//!   assumes it on).
//! - validation: `pkg/apis/autoscaling/validation/validation.go` (`validateScalingRules`,
//!   `validateScalingPolicy`): windows `0..=3600` s, periods `1..=1800` s, values `> 0`, at least
//!   one policy, tolerance `>= 0`.
//!
//! Without `behavior` the controller takes another path altogether (see the parent module).

use serde::{Deserialize, Serialize};

use super::HpaError;

/// `HPAScalingPolicyType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum PolicyType {
    /// `Pods`: at most `value` pods per period.
    Pods,
    /// `Percent`: at most `value` % of the replicas at the start of the period.
    Percent,
}

/// `HPAScalingPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingPolicy {
    /// `type`.
    #[serde(rename = "type")]
    pub kind: PolicyType,
    /// `value` (pods or percent).
    pub value: i32,
    /// `periodSeconds`.
    pub period_seconds: i32,
}

impl ScalingPolicy {
    /// A `Pods` policy.
    pub const fn pods(value: i32, period_seconds: i32) -> Self {
        ScalingPolicy {
            kind: PolicyType::Pods,
            value,
            period_seconds,
        }
    }

    /// A `Percent` policy.
    pub const fn percent(value: i32, period_seconds: i32) -> Self {
        ScalingPolicy {
            kind: PolicyType::Percent,
            value,
            period_seconds,
        }
    }
}

/// `ScalingPolicySelect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum SelectPolicy {
    /// `Max`: the policy allowing the largest change.
    Max,
    /// `Min`: the policy allowing the smallest change.
    Min,
    /// `Disabled`: no change in this direction.
    Disabled,
}

/// `HPAScalingRules` as written in the object: every field optional.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingRules {
    /// `stabilizationWindowSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stabilization_window_seconds: Option<i32>,
    /// `selectPolicy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicy>,
    /// `policies`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<ScalingPolicy>>,
    /// `tolerance` (a `resource.Quantity` upstream, read with `AsApproximateFloat64`; a number
    /// here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
}

/// `HorizontalPodAutoscalerBehavior` as written in the object.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Behavior {
    /// `scaleUp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// `scaleDown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
}

/// One direction's rules after defaulting: what the controller reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// `stabilizationWindowSeconds`.
    pub window_seconds: i32,
    /// `selectPolicy`.
    pub select: SelectPolicy,
    /// `policies` (never empty once validated).
    pub policies: Vec<ScalingPolicy>,
    /// `tolerance`, if set (otherwise the controller flag applies).
    pub tolerance: Option<f64>,
}

impl Rules {
    /// `getLongestPolicyPeriod` (`horizontal.go`): 0 without policies.
    pub fn longest_period(&self) -> i32 {
        self.policies
            .iter()
            .map(|p| p.period_seconds)
            .fold(0, i32::max)
    }
}

/// The behavior after defaulting.
#[derive(Clone, Debug, PartialEq)]
pub struct Defaulted {
    /// `scaleUp`.
    pub up: Rules,
    /// `scaleDown`.
    pub down: Rules,
}

/// The `autoscaling/v2` default scale-up rules (`defaultHPAScaleUpRules`).
pub fn default_scale_up() -> ScalingRules {
    ScalingRules {
        stabilization_window_seconds: Some(0),
        select_policy: Some(SelectPolicy::Max),
        policies: Some(vec![
            ScalingPolicy::pods(4, 15),
            ScalingPolicy::percent(100, 15),
        ]),
        tolerance: None,
    }
}

/// The `autoscaling/v2` default scale-down rules (`defaultHPAScaleDownRules`): no window (the
/// controller flag fills it).
pub fn default_scale_down() -> ScalingRules {
    ScalingRules {
        stabilization_window_seconds: None,
        select_policy: Some(SelectPolicy::Max),
        policies: Some(vec![ScalingPolicy::percent(100, 15)]),
        tolerance: None,
    }
}

/// `copyHPAScalingRules`: every field set in `from` replaces the one of `to`.
fn copy_rules(from: Option<&ScalingRules>, mut to: ScalingRules) -> ScalingRules {
    let Some(from) = from else {
        return to;
    };
    if from.select_policy.is_some() {
        to.select_policy = from.select_policy;
    }
    if from.stabilization_window_seconds.is_some() {
        to.stabilization_window_seconds = from.stabilization_window_seconds;
    }
    if from.policies.is_some() {
        to.policies.clone_from(&from.policies);
    }
    if from.tolerance.is_some() {
        to.tolerance = from.tolerance;
    }
    to
}

impl Behavior {
    /// `behavior: {}` with the given scale-up and scale-down rules.
    pub fn new(scale_up: Option<ScalingRules>, scale_down: Option<ScalingRules>) -> Self {
        Behavior {
            scale_up,
            scale_down,
        }
    }

    /// The rules the controller uses: `SetDefaults_HorizontalPodAutoscalerBehavior` (API
    /// defaulting), then `maybeInitScaleDownStabilizationWindow` with the controller's
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (`downscale_window_seconds`,
    /// truncated to whole seconds like `int32(d.Seconds())`). Fails on what the API server's
    /// validation would reject.
    pub fn defaulted(&self, downscale_window_seconds: f64) -> Result<Defaulted, HpaError> {
        let up = copy_rules(self.scale_up.as_ref(), default_scale_up());
        let down = copy_rules(self.scale_down.as_ref(), default_scale_down());
        let finish = |r: ScalingRules, which: &'static str| -> Result<Rules, HpaError> {
            let rules = Rules {
                // `(int32)(a.downscaleStabilisationWindow.Seconds())`: truncation.
                window_seconds: r
                    .stabilization_window_seconds
                    .unwrap_or(downscale_window_seconds as i32),
                select: r.select_policy.unwrap_or(SelectPolicy::Max),
                policies: r.policies.unwrap_or_default(),
                tolerance: r.tolerance,
            };
            validate(&rules, which)?;
            Ok(rules)
        };
        Ok(Defaulted {
            up: finish(up, "scaleUp")?,
            down: finish(down, "scaleDown")?,
        })
    }
}

/// `validateScalingRules` and `validateScalingPolicy`.
fn validate(r: &Rules, which: &'static str) -> Result<(), HpaError> {
    let bad = |what: String| Err(HpaError::InvalidSpec(format!("behavior.{which}.{what}")));
    if !(0..=3600).contains(&r.window_seconds) {
        return bad(format!(
            "stabilizationWindowSeconds: {} is not within 0..=3600",
            r.window_seconds
        ));
    }
    if r.policies.is_empty() {
        return bad("policies: must specify at least one Policy".to_owned());
    }
    for (i, p) in r.policies.iter().enumerate() {
        if p.value <= 0 {
            return bad(format!("policies[{i}].value: must be greater than zero"));
        }
        if !(1..=1800).contains(&p.period_seconds) {
            return bad(format!(
                "policies[{i}].periodSeconds: {} is not within 1..=1800",
                p.period_seconds
            ));
        }
    }
    if r.tolerance.is_some_and(|t| !(t >= 0.0 && t.is_finite())) {
        return bad("tolerance: must be a number >= 0".to_owned());
    }
    Ok(())
}

/// `--horizontal-pod-autoscaler-*` flags of kube-controller-manager that the decision reads
/// (`pkg/controller/podautoscaler/config/v1alpha1/defaults.go`). The sync period
/// (`--horizontal-pod-autoscaler-sync-period`, 15 s) is the caller's: it decides when to call
/// [`super::HpaController::reconcile`].
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerFlags {
    /// `--horizontal-pod-autoscaler-tolerance` (0.1).
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-downscale-stabilization`, seconds (300).
    pub downscale_stabilization_seconds: f64,
}

impl Default for ControllerFlags {
    fn default() -> Self {
        ControllerFlags {
            tolerance: 0.1,
            downscale_stabilization_seconds: 300.0,
        }
    }
}

/// `Tolerances` (`replica_calculator.go`): the usage ratio within `[1 - down, 1 + up]` changes
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerances {
    /// `scaleDown`.
    pub down: f64,
    /// `scaleUp`.
    pub up: f64,
}

impl Tolerances {
    /// Both directions the same.
    pub fn both(t: f64) -> Self {
        Tolerances { down: t, up: t }
    }

    /// `isWithin`: `(1 - down) <= ratio && ratio <= (1 + up)` (false for NaN).
    pub fn is_within(self, usage_ratio: f64) -> bool {
        (1.0 - self.down) <= usage_ratio && usage_ratio <= (1.0 + self.up)
    }

    /// `tolerancesForHpa` (`horizontal.go`): the flag, replaced per direction by the
    /// behavior's `tolerance` when set.
    pub fn for_hpa(flag: f64, behavior: Option<&Defaulted>) -> Self {
        let mut t = Tolerances::both(flag);
        if let Some(b) = behavior {
            if let Some(d) = b.down.tolerance {
                t.down = d;
            }
            if let Some(u) = b.up.tolerance {
                t.up = u;
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn empty_behavior_gets_the_v2_defaults_and_the_flag_window() {
        let d = Behavior::default().defaulted(300.0).unwrap();
        assert_eq!(
            d.up,
            Rules {
                window_seconds: 0,
                select: SelectPolicy::Max,
                policies: vec![ScalingPolicy::pods(4, 15), ScalingPolicy::percent(100, 15)],
                tolerance: None,
            }
        );
        assert_eq!(
            d.down,
            Rules {
                window_seconds: 300,
                select: SelectPolicy::Max,
                policies: vec![ScalingPolicy::percent(100, 15)],
                tolerance: None,
            }
        );
        // The flag is truncated to whole seconds.
        assert_eq!(
            Behavior::default()
                .defaulted(59.9)
                .unwrap()
                .down
                .window_seconds,
            59
        );
    }

    #[test]
    fn partial_rules_keep_what_is_set_and_replace_policies_whole() {
        // What defaults_test.go TestGenerateScaleUpRules / TestGenerateScaleDownRules check, on
        // a case of our own: a set field wins, an unset one is defaulted, a policy list
        // replaces the default list.
        let b = Behavior::new(
            Some(ScalingRules {
                policies: Some(vec![ScalingPolicy::pods(1, 60)]),
                ..ScalingRules::default()
            }),
            Some(ScalingRules {
                stabilization_window_seconds: Some(60),
                select_policy: Some(SelectPolicy::Min),
                tolerance: Some(0.05),
                ..ScalingRules::default()
            }),
        );
        let d = b.defaulted(300.0).unwrap();
        assert_eq!(d.up.policies, vec![ScalingPolicy::pods(1, 60)]);
        assert_eq!(d.up.window_seconds, 0);
        assert_eq!(d.up.select, SelectPolicy::Max);
        assert_eq!(d.down.window_seconds, 60);
        assert_eq!(d.down.select, SelectPolicy::Min);
        assert_eq!(d.down.policies, vec![ScalingPolicy::percent(100, 15)]);
        let t = Tolerances::for_hpa(0.1, Some(&d));
        assert_eq!(
            t,
            Tolerances {
                down: 0.05,
                up: 0.1
            }
        );
    }

    #[test]
    fn validation_rejects_what_the_api_server_rejects() {
        let with = |r: ScalingRules| Behavior::new(Some(r), None).defaulted(300.0);
        assert!(
            with(ScalingRules {
                policies: Some(vec![]),
                ..ScalingRules::default()
            })
            .is_err()
        );
        assert!(
            with(ScalingRules {
                policies: Some(vec![ScalingPolicy::pods(0, 15)]),
                ..ScalingRules::default()
            })
            .is_err()
        );
        assert!(
            with(ScalingRules {
                policies: Some(vec![ScalingPolicy::pods(1, 1801)]),
                ..ScalingRules::default()
            })
            .is_err()
        );
        assert!(
            with(ScalingRules {
                stabilization_window_seconds: Some(3601),
                ..ScalingRules::default()
            })
            .is_err()
        );
        assert!(
            with(ScalingRules {
                tolerance: Some(-0.1),
                ..ScalingRules::default()
            })
            .is_err()
        );
    }

    #[test]
    fn tolerance_bounds_are_inclusive() {
        // `isWithin` compares with `<=` on both sides: the ratio exactly at 1 ± tolerance is
        // within.
        let t = Tolerances {
            down: 0.25,
            up: 0.5,
        };
        assert!(t.is_within(0.75));
        assert!(t.is_within(1.5));
        assert!(!t.is_within(0.7499));
        assert!(!t.is_within(1.5001));
        assert!(!t.is_within(f64::NAN));
    }

    #[test]
    fn behavior_json_is_the_kubernetes_shape() {
        let b: Behavior = serde_json::from_str(
            r#"{"scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
               "scaleDown": {"selectPolicy": "Disabled"}}"#,
        )
        .unwrap();
        assert_eq!(
            b.scale_up.unwrap().policies.unwrap(),
            vec![ScalingPolicy::pods(4, 15)]
        );
        assert_eq!(
            b.scale_down.unwrap().select_policy,
            Some(SelectPolicy::Disabled)
        );
    }
}
