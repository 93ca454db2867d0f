//! The KEDA comparators: a ScaledObject with one trigger, as KEDA's metrics adapter serves it
//! ([`super::keda`]) to the HPA KEDA creates ([`super::HpaController`]), behind the
//! simulator's [`Autoscaler`] trait.
//!
//! - **KEDA queue age (Value)**: a Prometheus trigger on the first-attempt queue age gauge,
//!   `metricType: Value`, `threshold` = the target age, `ignoreNullValues` true (the default):
//!   `desired = ceil(readyPods × age / target)` outside the tolerance. The age comes from the
//!   last scrape ([`Observation::queue_age`]); a failed query
//!   ([`Observation::scrape_failed`]) is an error, an absent series (`None`) is an empty result.
//! - **KEDA lagCount**: a Redis Streams trigger with `lagCount` (AverageValue, KEDA's default
//!   type): `desired = ceil(lag / lagCount)` outside the tolerance, where the lag is read from
//!   the broker at the HPA's request ([`Observation::undelivered`]: messages never delivered to
//!   the consumer group; redeliveries waiting in the pending list are not lag) and "current"
//!   is `status.replicas` ([`Observation::status_replicas`]).
//!
//! Both without `fallback` and with `behavior` unset (KEDA's defaults: the legacy path with
//! the 5-minute downscale stabilization and the `max(2 × current, 4)` scale-up cap) unless
//! given. `minReplicas` is raised to 1 as KEDA's `GetHPAMinReplicas` does.
//!
//! With `minReplicaCount` 0 KEDA's own scale loop does what the HPA cannot (an HPA does nothing
//! while its target has 0 replicas): it scales the target 0 → 1 when the trigger is active
//! (its value above `activationThreshold`, 0 by default: any queue age, any lag), and back to 0
//! once the trigger has been inactive for `cooldownPeriod` (300 s by default). The simulator
//! checks at every HPA sync rather than KEDA's `pollingInterval` (30 s).

use super::keda::{
    self, Fallback, KedaTarget, MetricSource, PromResponse, ScalerError, TargetType,
};
use super::{Behavior, ControllerFlags, HpaController, HpaError, HpaSpec, SyncInput};
use crate::autoscaler::{Autoscaler, Decision, Observation};

/// Which trigger.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Trigger {
    /// Prometheus on the queue age.
    QueueAge { ignore_null_values: bool },
    /// Redis Streams `lagCount`.
    Lag,
}

/// A KEDA ScaledObject with one trigger and the HPA it creates.
#[derive(Clone, Debug)]
pub struct Hpa {
    name: &'static str,
    trigger: Trigger,
    source: MetricSource,
    controller: HpaController,
    /// `minReplicaCount` as written (0: KEDA activates and idles the target).
    min_replica_count: u32,
    /// When the trigger was last active.
    last_active: Option<f64>,
}

/// KEDA's default `cooldownPeriod`: inactive this long, a `minReplicaCount: 0` target goes to 0.
pub const COOLDOWN_PERIOD: f64 = 300.0;

fn to_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Hpa {
    /// The name of the queue-age comparator.
    pub const QUEUE_AGE: &'static str = "KEDA queue age (Value)";
    /// The name of the lag comparator.
    pub const LAG_COUNT: &'static str = "KEDA lagCount";

    /// **KEDA queue age (Value)**: `minReplicaCount` `min`, `maxReplicaCount` `max`, a
    /// Prometheus trigger with `threshold` `target_age` seconds, `metricType: Value`.
    pub fn keda_queue_age(
        min: u32,
        max: u32,
        target_age: f64,
        behavior: Option<Behavior>,
        flags: ControllerFlags,
    ) -> Result<Self, HpaError> {
        let target = KedaTarget::from_threshold(TargetType::Value, target_age);
        Self::build(
            Self::QUEUE_AGE,
            Trigger::QueueAge {
                ignore_null_values: true,
            },
            target,
            "s0-prometheus",
            (min, max),
            behavior,
            flags,
        )
    }

    /// **KEDA lagCount**: a Redis Streams trigger with `lagCount: lag_count` (AverageValue).
    pub fn keda_lag_count(
        min: u32,
        max: u32,
        lag_count: i64,
        behavior: Option<Behavior>,
        flags: ControllerFlags,
    ) -> Result<Self, HpaError> {
        let target = KedaTarget::from_count(TargetType::AverageValue, lag_count);
        Self::build(
            Self::LAG_COUNT,
            Trigger::Lag,
            target,
            "s0-redis-streams-jobs",
            (min, max),
            behavior,
            flags,
        )
    }

    fn build(
        name: &'static str,
        trigger: Trigger,
        target: KedaTarget,
        metric_name: &str,
        (min, max): (u32, u32),
        behavior: Option<Behavior>,
        flags: ControllerFlags,
    ) -> Result<Self, HpaError> {
        // GetHPAMinReplicas: minReplicaCount if above 0, else 1.
        let min_count = min;
        let min = to_i32(min).max(1);
        let spec = HpaSpec::new(min, to_i32(max), target.hpa_target())
            .with_behavior(behavior)
            .with_metric_name(metric_name)
            .with_flags(flags);
        Ok(Hpa {
            name,
            trigger,
            source: MetricSource::new(target, None),
            controller: HpaController::new(spec)?,
            min_replica_count: min_count,
            last_active: None,
        })
    }

    /// With the ScaledObject's `fallback`.
    pub fn with_fallback(mut self, fallback: Option<Fallback>) -> Self {
        self.source = MetricSource::new(self.source.target(), fallback);
        self
    }

    /// With `ignoreNullValues` (the Prometheus trigger; no effect on the lag trigger).
    pub fn with_ignore_null_values(mut self, ignore: bool) -> Self {
        if let Trigger::QueueAge { .. } = self.trigger {
            self.trigger = Trigger::QueueAge {
                ignore_null_values: ignore,
            };
        }
        self
    }

    /// The HPA controller.
    pub fn controller(&self) -> &HpaController {
        &self.controller
    }

    /// The trigger's metric source.
    pub fn source(&self) -> &MetricSource {
        &self.source
    }

    /// The trigger's raw value and a description of it.
    fn raw(&self, obs: &Observation) -> (Result<f64, ScalerError>, String) {
        match self.trigger {
            Trigger::QueueAge { ignore_null_values } => {
                let response = if obs.scrape_failed {
                    PromResponse::Failed("the Prometheus query failed".to_owned())
                } else {
                    obs.queue_age
                        .map_or(PromResponse::Empty, PromResponse::Value)
                };
                let what = match &response {
                    PromResponse::Value(v) => format!("queue age {v:.1}s"),
                    PromResponse::Empty => "queue age: no series".to_owned(),
                    PromResponse::Failed(_) => "queue age: query failed".to_owned(),
                };
                (keda::prometheus_value(&response, ignore_null_values), what)
            }
            Trigger::Lag => match obs.undelivered {
                Some(lag) => (Ok(lag as f64), format!("lag {lag}")),
                None => (
                    Err(ScalerError::Query("XINFO GROUPS failed".to_owned())),
                    "lag: XINFO GROUPS failed".to_owned(),
                ),
            },
        }
    }
}

impl Autoscaler for Hpa {
    fn name(&self) -> &'static str {
        self.name
    }

    fn decide(&mut self, obs: &Observation) -> Decision {
        let spec_replicas = to_i32(obs.replicas);
        let ready_pods = to_i32(obs.ready_pods);
        let (raw, what) = self.raw(obs);
        // KEDA's scale loop (activationThreshold 0): active on any positive value.
        let active = raw.as_ref().is_ok_and(|v| *v > 0.0);
        if active {
            self.last_active = Some(obs.now);
        }
        if self.min_replica_count == 0 {
            let idle = |to: u32, why: &str| Decision {
                desired: to,
                regime: None,
                action: None,
                recommended: Some(to),
                reason: format!("{what}: {why}"),
                requeue_after: None,
                producers: None,
                worker_set_point: None,
            };
            if spec_replicas == 0 {
                return if active {
                    idle(1, "trigger active, KEDA activates the target 0 -> 1")
                } else {
                    idle(0, "trigger inactive, the target stays at 0")
                };
            }
            if !active
                && self
                    .last_active
                    .is_none_or(|t| obs.now - t >= COOLDOWN_PERIOD)
            {
                return idle(
                    0,
                    "inactive for the cooldown period, KEDA scales the target to 0",
                );
            }
        }
        let served = self.source.serve(raw, spec_replicas, ready_pods);
        let input = SyncInput {
            now: obs.now,
            spec_replicas,
            status_replicas: to_i32(obs.status_replicas),
            ready_pods,
            metric: served.as_ref().ok().map(|s| s.milli),
        };
        let out = self.controller.reconcile(&input);
        let served = match &served {
            Ok(s) if s.fallback => format!("fallback {}m", s.milli),
            Ok(s) => format!("{}m", s.milli),
            Err(e) => format!("error: {e}"),
        };
        let mut reason = format!(
            "{what} ({served}), {} ready, {} created -> metric {}",
            obs.ready_pods,
            obs.status_replicas,
            out.metric_desired
                .map_or_else(|| "not computed".to_owned(), |m| m.to_string())
        );
        if !out.reason.is_empty() {
            reason.push_str(&format!("; {}", out.reason));
        }
        if let Some(l) = out.limited.filter(|l| *l != "DesiredWithinRange") {
            reason.push_str(&format!(" [{l}]"));
        }
        if out.stabilization.is_some_and(|s| s.ends_with("Stabilized")) {
            reason.push_str(" [stabilized]");
        }
        Decision {
            desired: u32::try_from(out.desired).unwrap_or(0),
            regime: None,
            action: None,
            recommended: out.metric_desired.and_then(|m| u32::try_from(m).ok()),
            reason,
            requeue_after: None,
            producers: None,
            worker_set_point: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn obs(now: f64, replicas: u32, age: f64) -> Observation {
        Observation {
            now,
            replicas,
            ready_pods: replicas,
            status_replicas: replicas,
            queue_age: Some(age),
            ..Observation::default()
        }
    }

    fn queue_age(min: u32, max: u32, target: f64) -> Hpa {
        Hpa::keda_queue_age(min, max, target, None, ControllerFlags::default()).unwrap()
    }

    #[test]
    fn value_target_multiplies_ready_pods() {
        let mut h = queue_age(1, 100, 60.0);
        // 4 replicas of which 2 ready, age 3x the target: ceil(3 x 2) = 6, not 12.
        let mut o = obs(0.0, 4, 180.0);
        o.ready_pods = 2;
        let d = h.decide(&o);
        assert_eq!(d.recommended, Some(6));
        assert_eq!(d.desired, 6);
    }

    /// `minReplicaCount: 0`: 0 → 1 on an active trigger (the HPA then sizes it), back to 0
    /// after the cooldown period of inactivity, never while active.
    #[test]
    fn min_replica_count_zero_activates_and_idles_the_target() {
        let mut h = queue_age(0, 100, 60.0);
        assert_eq!(h.decide(&obs(0.0, 0, 0.0)).desired, 0);
        assert_eq!(h.decide(&obs(15.0, 0, 5.0)).desired, 1);
        // The HPA: ceil(1 × 300 / 60) = 5, at most max(2 × 1, 4) = 4 per sync.
        assert_eq!(h.decide(&obs(30.0, 1, 300.0)).desired, 4);
        let d = h.decide(&obs(45.0, 4, 0.0));
        assert!(d.desired > 0, "inactive within the cooldown: {}", d.reason);
        let d = h.decide(&obs(30.0 + COOLDOWN_PERIOD, 4, 0.0));
        assert_eq!(d.desired, 0, "{}", d.reason);
        // With minReplicaCount 1 the HPA alone: no activation needed, never 0.
        let mut one = queue_age(1, 100, 60.0);
        assert!(one.decide(&obs(1000.0, 5, 0.0)).desired > 0);
    }

    #[test]
    fn legacy_scale_up_cap_is_per_sync() {
        // No behavior: max(2 x current, 4) at every sync, with no memory of the previous one.
        let mut h = queue_age(1, 100, 60.0);
        assert_eq!(h.decide(&obs(0.0, 2, 1200.0)).desired, 4);
        assert_eq!(h.decide(&obs(15.0, 4, 1200.0)).desired, 8);
        assert_eq!(h.decide(&obs(30.0, 8, 1200.0)).desired, 16);
    }

    #[test]
    fn legacy_scale_down_waits_five_minutes_from_the_highest_recommendation() {
        let mut h = queue_age(2, 100, 60.0);
        assert_eq!(h.decide(&obs(0.0, 10, 60.0)).desired, 10);
        for i in 1..=20 {
            let t = f64::from(i) * 15.0;
            assert_eq!(h.decide(&obs(t, 10, 0.0)).desired, 10, "t={t}");
        }
        // At 315 s the recommendations of 10 (0 s) are older than 300 s: no scale-down limit.
        assert_eq!(h.decide(&obs(315.0, 10, 0.0)).desired, 2);
    }

    #[test]
    fn empty_prometheus_result_is_zero_and_a_failed_query_holds() {
        let mut h = queue_age(1, 10, 60.0);
        let mut o = obs(0.0, 5, 0.0);
        o.scrape_failed = true;
        let d = h.decide(&o);
        assert_eq!((d.desired, d.recommended), (5, None));
        // No series: ignoreNullValues reads 0, the recommendation is 0 (min 1 after the
        // stabilization window).
        let mut o = obs(15.0, 5, 0.0);
        o.queue_age = None;
        assert_eq!(h.decide(&o).recommended, Some(0));
        // Without ignoreNullValues, no series is an error: no scaling.
        let mut h = queue_age(1, 10, 60.0).with_ignore_null_values(false);
        assert_eq!(h.decide(&o).recommended, None);
    }

    #[test]
    fn lag_count_is_average_value_on_status_replicas() {
        let mut h = Hpa::keda_lag_count(1, 50, 100, None, ControllerFlags::default()).unwrap();
        // 1000 undelivered, 100 per pod: 10, whatever the ready pods.
        let mut o = obs(0.0, 4, 0.0);
        o.ready_pods = 0;
        o.undelivered = Some(1000);
        let d = h.decide(&o);
        assert_eq!(d.recommended, Some(10));
        assert_eq!(d.desired, 8, "legacy cap max(2 x 4, 4)");
        assert_eq!(h.name(), Hpa::LAG_COUNT);
        // No lag reading: the metric fails, nothing changes.
        o.undelivered = None;
        o.now = 15.0;
        o.replicas = 8;
        assert_eq!(h.decide(&o).desired, 8);
    }

    #[test]
    fn keda_min_replicas_is_at_least_one() {
        let h = Hpa::keda_lag_count(0, 5, 10, None, ControllerFlags::default()).unwrap();
        assert_eq!(h.controller().spec().min_replicas, 1);
        assert!(Hpa::keda_lag_count(3, 2, 10, None, ControllerFlags::default()).is_err());
    }
}
