//! An HPA/KEDA-like autoscaler on the first-attempt queue age, following the Kubernetes HPA
//! controller with its default `behavior`. This is the repository's one model of what an HPA
//! does: the simulator's `keda-like` policy and the lab's comparison run (`backpressure-lab`,
//! which sets the periods for its time scale) both use it.
//!
//! Upstream, in `kubernetes/kubernetes`:
//!
//! - `pkg/controller/podautoscaler/replica_calculator.go` (`GetExternalMetricReplicas`,
//!   `getUsageRatioReplicaCount`): an External metric with a `Value` target (KEDA's Prometheus
//!   trigger on the age gauge): `desired = ceil(readyPods * age / target)`, skipped when
//!   `|age/target - 1| <= 0.1` (`--horizontal-pod-autoscaler-tolerance`);
//! - `pkg/controller/podautoscaler/horizontal.go` (`stabilizeRecommendationWithBehaviors`):
//!   stabilization, scale-up window 0 s (the lowest recommendation of the window, i.e. the
//!   current one), scale-down window 300 s (the highest recommendation of the last 5 min);
//! - the same file (`calculateScaleUpLimitWithScalingRules`,
//!   `calculateScaleDownLimitWithBehaviors`): rate limits, scale-up `max(+100 %, +4 pods)` per
//!   15 s, scale-down `-100 %` per 15 s, both measured from the replicas at the start of the
//!   period;
//! - clamped to `[minReplicas, maxReplicas]`; a missing metric keeps the current replicas.
//!
//! Other time scales (the lab runs production constants x 0.2) go through [`HpaBehavior`]'s
//! windows and periods; the maths is the same.

use std::collections::VecDeque;

use super::{Autoscaler, Decision, Observation};

/// The HPA `behavior` and controller flags that matter here.
#[derive(Clone, Debug, PartialEq)]
pub struct HpaBehavior {
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// `scaleUp.stabilizationWindowSeconds`.
    pub up_window: f64,
    /// `scaleDown.stabilizationWindowSeconds`.
    pub down_window: f64,
    /// Scale-up policies: (pods, percent) per `up_period` seconds, selectPolicy Max.
    pub up_pods: u32,
    /// Scale-up percent policy.
    pub up_percent: f64,
    /// Scale-up policy period.
    pub up_period: f64,
    /// Scale-down percent policy.
    pub down_percent: f64,
    /// Scale-down policy period.
    pub down_period: f64,
}

impl Default for HpaBehavior {
    fn default() -> Self {
        HpaBehavior {
            tolerance: 0.1,
            up_window: 0.0,
            down_window: 300.0,
            up_pods: 4,
            up_percent: 100.0,
            up_period: 15.0,
            down_percent: 100.0,
            down_period: 15.0,
        }
    }
}

/// The HPA/KEDA-like autoscaler.
#[derive(Clone, Debug)]
pub struct Hpa {
    behavior: HpaBehavior,
    min: u32,
    max: u32,
    target_age: f64,
    /// (time, recommendation) within the stabilization windows.
    recommendations: VecDeque<(f64, u32)>,
    /// (time, +added or -removed) scale events within the policy periods.
    events: VecDeque<(f64, i64)>,
}

impl Hpa {
    /// An HPA with bounds `[min, max]` aiming at `target_age` seconds of queue age.
    pub fn new(behavior: HpaBehavior, min: u32, max: u32, target_age: f64) -> Self {
        Hpa {
            behavior,
            min,
            max: max.max(min),
            target_age,
            recommendations: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    fn change_in_period(&self, now: f64, period: f64, up: bool) -> i64 {
        self.events
            .iter()
            .filter(|(t, d)| t + period > now && ((*d > 0) == up))
            .map(|(_, d)| d.abs())
            .sum()
    }
}

impl Autoscaler for Hpa {
    fn name(&self) -> &'static str {
        "keda-like"
    }

    fn decide(&mut self, obs: &Observation) -> Decision {
        let now = obs.now;
        let current = obs.replicas;
        let Some(age) = obs.queue_age.filter(|a| a.is_finite()) else {
            let mut d = Decision::keep(current);
            d.reason = "queue age unavailable: no scaling".to_owned();
            return d;
        };
        let ratio = age / self.target_age;
        let recommendation = if (ratio - 1.0).abs() <= self.behavior.tolerance {
            current
        } else {
            let r = (ratio * f64::from(obs.ready_pods)).ceil();
            r.clamp(0.0, f64::from(u32::MAX)) as u32
        };

        // Stabilization.
        let keep = self.behavior.up_window.max(self.behavior.down_window);
        while self
            .recommendations
            .front()
            .is_some_and(|(t, _)| t + keep < now)
        {
            self.recommendations.pop_front();
        }
        self.recommendations.push_back((now, recommendation));
        let (mut up_rec, mut down_rec) = (recommendation, recommendation);
        for &(t, r) in &self.recommendations {
            if t + self.behavior.up_window >= now {
                up_rec = up_rec.min(r);
            }
            if t + self.behavior.down_window >= now {
                down_rec = down_rec.max(r);
            }
        }
        let mut stabilized = current;
        if stabilized < up_rec {
            stabilized = up_rec;
        }
        if stabilized > down_rec {
            stabilized = down_rec;
        }

        // Rate limits.
        let keep = self.behavior.up_period.max(self.behavior.down_period);
        while self.events.front().is_some_and(|(t, _)| t + keep <= now) {
            self.events.pop_front();
        }
        let cur = i64::from(current);
        let mut desired = i64::from(stabilized);
        if desired > cur {
            let added = self.change_in_period(now, self.behavior.up_period, true);
            let removed = self.change_in_period(now, self.behavior.up_period, false);
            let start = cur - added + removed;
            let by_pods = start + i64::from(self.behavior.up_pods);
            let by_percent =
                (start as f64 * (1.0 + self.behavior.up_percent / 100.0)).ceil() as i64;
            let limit = by_pods.max(by_percent).max(cur);
            desired = desired.min(limit);
        } else if desired < cur {
            let added = self.change_in_period(now, self.behavior.down_period, true);
            let removed = self.change_in_period(now, self.behavior.down_period, false);
            let start = cur - added + removed;
            let by_percent =
                (start as f64 * (1.0 - self.behavior.down_percent / 100.0)).ceil() as i64;
            let limit = by_percent.min(cur);
            desired = desired.max(limit);
        }
        let desired = desired.clamp(i64::from(self.min), i64::from(self.max)) as u32;
        if desired != current {
            self.events
                .push_back((now, i64::from(desired) - i64::from(current)));
        }
        Decision {
            desired,
            regime: None,
            action: None,
            recommended: Some(recommendation),
            reason: format!(
                "age {age:.1}s / target {:.0}s = {ratio:.2} x {} ready -> {recommendation}",
                self.target_age, obs.ready_pods
            ),
            requeue_after: None,
            producers: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(now: f64, replicas: u32, age: f64) -> Observation {
        Observation {
            now,
            replicas,
            ready_pods: replicas,
            queue_age: Some(age),
            ..Observation::default()
        }
    }

    #[test]
    fn within_tolerance_nothing_happens() {
        let mut h = Hpa::new(HpaBehavior::default(), 1, 100, 60.0);
        assert_eq!(h.decide(&obs(0.0, 10, 65.0)).desired, 10);
        assert_eq!(h.decide(&obs(15.0, 10, 54.5)).desired, 10);
    }

    #[test]
    fn scale_up_is_limited_to_max_of_double_and_four_pods_per_period() {
        let mut h = Hpa::new(HpaBehavior::default(), 1, 100, 60.0);
        // Wants 20x: from 2 replicas at most max(4, 4) = 4.
        assert_eq!(h.decide(&obs(0.0, 2, 1200.0)).desired, 6);
        // Within the same 15 s period nothing more.
        assert_eq!(h.decide(&obs(5.0, 6, 1200.0)).desired, 6);
        // Next period: from 6, doubling (12) beats +4 (10).
        assert_eq!(h.decide(&obs(15.0, 6, 1200.0)).desired, 12);
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window() {
        let mut h = Hpa::new(HpaBehavior::default(), 2, 100, 60.0);
        assert_eq!(h.decide(&obs(0.0, 10, 60.0)).desired, 10);
        for i in 1..20 {
            let t = f64::from(i) * 15.0;
            assert_eq!(h.decide(&obs(t, 10, 0.0)).desired, 10, "t={t}");
        }
        // 300 s after the last recommendation of 10, it drops to min at once (100 %/15 s).
        assert_eq!(h.decide(&obs(315.0, 10, 0.0)).desired, 2);
    }

    #[test]
    fn recommendation_multiplies_ready_pods_not_spec_replicas() {
        let mut h = Hpa::new(HpaBehavior::default(), 1, 100, 60.0);
        // 4 replicas of which 2 are ready, age 3x the target: ceil(3 * 2) = 6, not 12.
        let mut o = obs(0.0, 4, 180.0);
        o.ready_pods = 2;
        let d = h.decide(&o);
        assert_eq!(d.desired, 6);
        assert_eq!(d.recommended, Some(6));
    }

    #[test]
    fn proportional_outside_the_tolerance() {
        let mut h = Hpa::new(HpaBehavior::default(), 1, 100, 10.0);
        assert_eq!(h.decide(&obs(0.0, 4, 10.5)).desired, 4, "within tolerance");
        assert_eq!(h.decide(&obs(10.0, 4, 15.0)).desired, 6, "ceil(1.5 * 4)");
    }

    #[test]
    fn periods_and_windows_come_from_the_behavior() {
        // The lab's time scale: 3 s policy periods, a 60 s scale-down window.
        let behavior = HpaBehavior {
            up_period: 3.0,
            down_period: 3.0,
            down_window: 60.0,
            ..HpaBehavior::default()
        };
        let mut h = Hpa::new(behavior, 1, 50, 10.0);
        // Age 10x the target from 2 replicas: at most max(2 * 2, 2 + 4) = 6 in one period.
        assert_eq!(h.decide(&obs(0.0, 2, 100.0)).desired, 6);
        // Same period: nothing beyond the limit relative to the period start.
        assert_eq!(h.decide(&obs(1.0, 6, 100.0)).desired, 6);
        // Next period: from 6, at most 12.
        assert_eq!(h.decide(&obs(3.5, 6, 100.0)).desired, 12);
        // Scale-down waits for the 60 s window after the last high recommendation.
        assert_eq!(h.decide(&obs(30.0, 12, 0.0)).desired, 12);
        assert_eq!(h.decide(&obs(64.0, 12, 0.0)).desired, 1);
    }

    #[test]
    fn bounds_hold() {
        let mut h = Hpa::new(HpaBehavior::default(), 2, 10, 60.0);
        // Nothing to do: the recommendation (0 pods) is raised to the minimum.
        assert_eq!(h.decide(&obs(0.0, 2, 0.0)).desired, 2);
        for i in 1..20 {
            let d = h.decide(&obs(f64::from(i) * 15.0, 10, 6000.0));
            assert!(d.desired <= 10, "{d:?}");
        }
        // A maximum below the minimum is raised to it.
        let mut h = Hpa::new(HpaBehavior::default(), 3, 1, 60.0);
        assert_eq!(h.decide(&obs(0.0, 3, 6000.0)).desired, 3);
    }

    #[test]
    fn missing_metric_holds() {
        let mut h = Hpa::new(HpaBehavior::default(), 1, 10, 60.0);
        let mut o = obs(0.0, 5, 0.0);
        o.queue_age = None;
        assert_eq!(h.decide(&o).desired, 5);
    }
}
