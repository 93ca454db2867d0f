//! "Ours": the operator's real decision code.
//!
//! Each decision calls `backpressure_core::decide::decide` exactly as the operator's
//! reconcile loop does: the effective configuration comes from
//! `backpressure_core::resolve::resolve` of a `WorkerBackpressureSpec` built from the
//! scenario (no policies), the observation carries the simulated time as a `jiff::Timestamp`
//! (a fixed epoch plus the simulated seconds), and the status returned by one decision is the
//! `previous` status of the next. The next decision is due after the returned `requeueAfter`
//! (the operator adds jitter; the simulator does not).
//!
//! With a `producers` section (issue 17) every decision also calls
//! `backpressure_core::producers::decide_producers` on the same fleet metrics and `now`, with
//! the previous `status.producers` as its memory, as the operator's reconcile does; the
//! decided state and rate go to the simulated producers' gate at once (the operator's push).

use std::time::Duration;

use backpressure_api::duration::Duration as ApiDuration;
use backpressure_api::v1alpha1::{
    AgeWatermarks, DepthWatermarks, ProbeSpec, ProducersSpec, RedeliverySpec, ScalingSpec,
    TargetRef, WorkerBackpressureSpec, WorkerBackpressureStatus, WorkerSpec,
};
use backpressure_core::decide::{self, FleetMetrics};
use backpressure_core::producers::decide_producers;
use backpressure_core::resolve::{self, Effective, ResolveError};
use k8s_openapi::jiff::Timestamp;

use super::{Autoscaler, Decision, Observation, ProducerGate};
use crate::scenario::{ProducersSection, Scenario};

/// The simulation's epoch in the operator's time: 2026-01-01T00:00:00Z.
pub const EPOCH_UNIX_SECONDS: i64 = 1_767_225_600;

/// Simulated seconds as the operator's `now`.
pub fn to_timestamp(secs: f64) -> Timestamp {
    let ms = EPOCH_UNIX_SECONDS * 1000 + (secs * 1000.0).round() as i64;
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The operator's `spec.producers` for a scenario's `producers` section, naming the simulated
/// producer workload.
pub fn producers_spec(p: &ProducersSection) -> ProducersSpec {
    let dur = |secs: f64| ApiDuration::from_std(Duration::from_secs_f64(secs.max(0.0)));
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    ProducersSpec {
        target_ref: Some(TargetRef {
            api_version: "apps/v1".to_owned(),
            kind: "Deployment".to_owned(),
            name: "sim-producer".to_owned(),
        }),
        mode: Some(p.mode),
        queue_depth: p.queue_depth.map(|d| DepthWatermarks {
            pause_above: count(d.pause_above),
            resume_below: count(d.resume_below),
        }),
        queue_age: p.queue_age.map(|a| AgeWatermarks {
            pause_above: dur(a.pause_above.secs()),
            resume_below: dur(a.resume_below.secs()),
        }),
        pause_dwell: p.pause_dwell.map(|d| dur(d.secs())),
        resume_dwell: p.resume_dwell.map(|d| dur(d.secs())),
    }
}

/// The `WorkerBackpressure` spec a platform team would write for the scenario's workload:
/// the scenario's worker settings and replica bounds, `producers` as given (the policy decides
/// whether and how the scenario's section applies), everything else at the defaults.
pub fn spec_for(s: &Scenario, producers: Option<&ProducersSection>) -> WorkerBackpressureSpec {
    let w = &s.workers;
    let dur = |secs: f64| Some(ApiDuration::from_std(Duration::from_secs_f64(secs)));
    WorkerBackpressureSpec {
        target_ref: TargetRef {
            api_version: "apps/v1".to_owned(),
            kind: "Deployment".to_owned(),
            name: "sim-worker".to_owned(),
        },
        mode: None,
        suspend: None,
        guard: None,
        queue: None,
        worker: Some(WorkerSpec {
            algorithm: None,
            set_point: Some(w.set_point),
            reaction: Some(w.reaction()),
            max_permits: Some(w.max_permits),
            probe: Some(ProbeSpec {
                initial_interval: dur(w.probe_initial.secs()),
                max_interval: dur(w.probe_max.secs()),
            }),
            initial_permits: Some(w.initial_permits),
            redelivery: Some(match w.redelivery_backoff {
                Some(b) => RedeliverySpec {
                    base: dur(b.base.secs()),
                    max: dur(b.max.secs()),
                },
                None => RedeliverySpec {
                    base: dur(0.0),
                    max: None,
                },
            }),
            ..WorkerSpec::default()
        }),
        metrics: None,
        producers: producers.map(producers_spec),
        scaling: Some(ScalingSpec {
            min_replicas: i32::try_from(s.fleet.min_replicas).ok(),
            max_replicas: i32::try_from(s.fleet.max_replicas).ok(),
            target_queue_age: dur(s.fleet.target_queue_age.secs()),
            ..ScalingSpec::default()
        }),
    }
}

/// Our autoscaler: the operator's `decide`, fed back its own status.
#[derive(Debug)]
pub struct Ours {
    effective: Effective,
    status: Option<WorkerBackpressureStatus>,
}

impl Ours {
    /// Resolves the scenario's spec (as the operator would, with no policies), with producer
    /// control when `producers` is given.
    pub fn new(
        scenario: &Scenario,
        producers: Option<&ProducersSection>,
    ) -> Result<Self, ResolveError> {
        let effective = resolve::resolve(&spec_for(scenario, producers), &[], to_timestamp(0.0))?;
        Ok(Ours {
            effective,
            status: None,
        })
    }

    /// The status after the last decision.
    pub fn status(&self) -> Option<&WorkerBackpressureStatus> {
        self.status.as_ref()
    }
}

fn to_u32(n: i32) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(0)
}

impl Autoscaler for Ours {
    fn name(&self) -> &'static str {
        "ours (operator decide)"
    }

    fn decide(&mut self, obs: &Observation) -> Decision {
        let observation = decide::Observation {
            now: to_timestamp(obs.now),
            generation: Some(1),
            current_replicas: i32::try_from(obs.replicas).unwrap_or(i32::MAX),
            ready_pods: i32::try_from(obs.ready_pods).unwrap_or(i32::MAX),
            fleet: FleetMetrics {
                backoff: obs.backoff,
                failure_rate: obs.failure_rate,
                queue_age: obs.queue_age,
                queue_depth: obs.queue_depth,
                arrival_rate: obs.arrival_rate,
                completion_rate: obs.completion_rate,
                failure_floor: obs.failure_floor,
                partitions: None,
            },
            metrics_error: None,
            config: None,
        };
        // The operator's config step runs before `decide`, on the last status.
        let worker_set_point = decide::worker_set_point(&self.effective, self.status.as_ref());
        let d = decide::decide(&self.effective, self.status.as_ref(), &observation);
        let desired = d.scale_to().map_or(obs.replicas, to_u32);
        let mut status = d.status;
        let producers = self.effective.producers.as_ref().map(|eff| {
            let previous = self.status.as_ref().and_then(|s| s.producers.as_ref());
            let p = decide_producers(eff, previous, &observation.fleet, observation.now);
            let gate = ProducerGate {
                state: p.status.state,
                rate: p.status.rate,
                event: p.event.map(|e| e.message),
            };
            status.producers = Some(p.status);
            gate
        });
        let out = Decision {
            desired,
            regime: Some(d.regime),
            action: Some(d.action),
            recommended: Some(to_u32(d.recommended_replicas)),
            reason: d.reason,
            requeue_after: Some(d.requeue_after.as_secs_f64()),
            producers,
            worker_set_point: Some(worker_set_point),
        };
        self.status = Some(status);
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use backpressure_api::v1alpha1::Regime;

    const YAML: &str = "name: t\ntitle: T\nseed: 1\nduration: 1h\nproducer: {rate: 100}\nfleet: {replicas: 8, minReplicas: 8, maxReplicas: 40}\ndependency: {capacity: 200}\n";

    fn obs(now: f64, replicas: u32, backoff: f64, age: f64, depth: f64) -> Observation {
        Observation {
            now,
            replicas,
            ready_pods: replicas,
            backoff: Some(backoff),
            // A fleet backs off from failures: a quarter of the backoff, as in the core's
            // fixtures (a backoff alone, with no failures, is not evidence of failure).
            failure_rate: Some(backoff / 4.0),
            queue_age: Some(age),
            queue_depth: Some(depth),
            arrival_rate: Some(100.0),
            completion_rate: Some(10.0 * f64::from(replicas)),
            failure_floor: None,
            sampled_at: now,
            ..Observation::default()
        }
    }

    #[test]
    fn time_conversion_is_exact_to_the_millisecond() {
        assert_eq!(to_timestamp(0.0).as_second(), EPOCH_UNIX_SECONDS);
        assert_eq!(
            to_timestamp(3600.25).as_millisecond(),
            EPOCH_UNIX_SECONDS * 1000 + 3_600_250
        );
    }

    #[test]
    fn backlog_scales_out_and_failing_dependency_holds() {
        let s = Scenario::from_yaml(YAML, "t").unwrap();
        let mut o = Ours::new(&s, None).unwrap();
        let d = o.decide(&obs(15.0, 8, 0.0, 300.0, 30_000.0));
        assert_eq!(d.regime, Some(Regime::Backlogged), "{}", d.reason);
        assert!(d.desired > 8, "{d:?}");
        let mut o = Ours::new(&s, None).unwrap();
        let mut t = 15.0;
        let mut last = None;
        for _ in 0..6 {
            let d = o.decide(&obs(t, 8, 0.9, 300.0, 30_000.0));
            assert!(d.desired <= 8, "t={t}: {d:?}");
            last = Some(d);
            t += 15.0;
        }
        assert_eq!(last.unwrap().regime, Some(Regime::DependencyFailing));
        assert!(o.status().is_some());
    }
}
