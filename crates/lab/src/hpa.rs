//! The comparison autoscaler: what an HPA (or KEDA) scaling on queue age alone does.
//!
//! `desired = ceil(current × age / target)`, nothing within the tolerance (0.1), at most
//! max(100 %, 4 pods) added per scale-up period, scale-in only to the highest recommendation
//! of the stabilization window, all as the HPA controller computes it
//! (`research/keda_hpa.md`), with the periods scaled by the scenario.

use std::collections::VecDeque;

use crate::scenario::HpaLikeSpec;

/// The HPA-like decision state. Pure: time is passed in (seconds since the run started).
#[derive(Debug, Clone)]
pub struct HpaLike {
    spec: HpaLikeSpec,
    min: i32,
    max: i32,
    recommendations: VecDeque<(f64, i32)>,
    scale_ups: VecDeque<(f64, i32)>,
}

impl HpaLike {
    /// A scaler between `min` and `max` replicas.
    pub fn new(spec: HpaLikeSpec, min: i32, max: i32) -> Self {
        Self {
            spec,
            min: min.max(1),
            max: max.max(min.max(1)),
            recommendations: VecDeque::new(),
            scale_ups: VecDeque::new(),
        }
    }

    /// The replicas to set at `now` given the current replicas and the queue age (None when the
    /// metric is missing: the HPA then keeps the current replicas).
    pub fn decide(&mut self, now: f64, current: i32, age: Option<f64>) -> i32 {
        let Some(age) = age.filter(|a| a.is_finite() && *a >= 0.0) else {
            return current;
        };
        let target = self.spec.target_queue_age.secs();
        let ratio = age / target;
        let current_eff = current.max(1);
        let raw = if (ratio - 1.0).abs() <= self.spec.tolerance {
            current_eff
        } else {
            (f64::from(current_eff) * ratio).ceil() as i32
        };
        let rec = raw.clamp(self.min, self.max);

        // Scale-down stabilization: the highest recommendation of the window.
        let window = self.spec.scale_down_stabilization.secs();
        self.recommendations.push_back((now, rec));
        while self
            .recommendations
            .front()
            .is_some_and(|(t, _)| *t < now - window)
        {
            self.recommendations.pop_front();
        }
        let mut desired = rec;
        if rec < current {
            let highest = self
                .recommendations
                .iter()
                .map(|(_, r)| *r)
                .max()
                .unwrap_or(rec);
            desired = highest.min(current);
        }

        // Scale-up rate limit relative to the replicas at the start of the period.
        if desired > current {
            let period = self.spec.scale_up_period.secs();
            while self
                .scale_ups
                .front()
                .is_some_and(|(t, _)| *t <= now - period)
            {
                self.scale_ups.pop_front();
            }
            let added: i32 = self.scale_ups.iter().map(|(_, n)| *n).sum();
            let start = (current - added).max(1);
            let by_percent = (f64::from(start)
                * (1.0 + f64::from(self.spec.scale_up_percent) / 100.0))
                .ceil() as i32;
            let limit = by_percent.max(start + self.spec.scale_up_pods);
            desired = desired.min(limit).max(current);
            if desired > current {
                self.scale_ups.push_back((now, desired - current));
            }
        }
        desired.clamp(self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::scenario::Dur;
    use std::time::Duration;

    fn spec() -> HpaLikeSpec {
        HpaLikeSpec {
            target_queue_age: Dur(Duration::from_secs(10)),
            sync_period: Dur(Duration::from_secs(3)),
            tolerance: 0.1,
            scale_up_period: Dur(Duration::from_secs(3)),
            scale_up_pods: 4,
            scale_up_percent: 100,
            scale_down_stabilization: Dur(Duration::from_secs(60)),
        }
    }

    #[test]
    fn proportional_with_tolerance() {
        let mut h = HpaLike::new(spec(), 1, 50);
        assert_eq!(h.decide(0.0, 4, Some(10.5)), 4, "within tolerance");
        assert_eq!(h.decide(10.0, 4, Some(15.0)), 6);
        assert_eq!(h.decide(20.0, 4, None), 4, "missing metric keeps replicas");
    }

    #[test]
    fn scale_up_is_rate_limited_per_period() {
        let mut h = HpaLike::new(spec(), 1, 50);
        // Age 10x the target from 2 replicas: at most max(2*2, 2+4) = 6 in one period.
        assert_eq!(h.decide(0.0, 2, Some(100.0)), 6);
        // Same period: no more than the limit relative to the period start.
        assert_eq!(h.decide(1.0, 6, Some(100.0)), 6);
        // Next period: from 6, at most 12.
        assert_eq!(h.decide(3.5, 6, Some(100.0)), 12);
    }

    #[test]
    fn scale_down_waits_for_the_stabilization_window() {
        let mut h = HpaLike::new(spec(), 1, 50);
        assert_eq!(h.decide(0.0, 8, Some(10.0)), 8);
        assert_eq!(h.decide(30.0, 8, Some(0.0)), 8, "highest in window is 8");
        assert_eq!(h.decide(61.0, 8, Some(0.0)), 1, "window passed");
    }

    #[test]
    fn bounds_hold() {
        let mut h = HpaLike::new(spec(), 2, 10);
        assert_eq!(h.decide(0.0, 2, Some(0.0)), 2);
        for i in 0..20 {
            let r = h.decide(f64::from(i) * 4.0, 10, Some(1000.0));
            assert!(r <= 10);
        }
    }
}
