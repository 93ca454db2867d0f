//! Table-driven tests of every regime transition, through the closed loop in
//! [`super::fixtures::World`] (status round-tripped through JSON between steps).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod floor;
mod hold_ramp;
mod modes;
mod normal;
mod status;
mod unavailable;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{Action, ConfigStatus, Regime, WorkerBackpressureStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::fixtures::{Queue, World, at, effective};
use super::*;
use crate::resolve::{Effective, Fallback, ResolveError};

/// One step of a scenario: advance `dt` seconds with this backoff and queue, then expect.
#[derive(Debug, Clone, Copy)]
struct Step {
    dt: i64,
    backoff: Option<f64>,
    queue: Queue,
    regime: Regime,
    desired: i32,
    action: Action,
}

const fn step(
    dt: i64,
    backoff: f64,
    queue: Queue,
    regime: Regime,
    desired: i32,
    action: Action,
) -> Step {
    Step {
        dt,
        backoff: Some(backoff),
        queue,
        regime,
        desired,
        action,
    }
}

fn run(name: &str, world: &mut World, steps: &[Step]) -> Vec<Decision> {
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        world.backoff = s.backoff;
        world.queue = s.queue;
        let d = world.step(s.dt);
        let ctx = format!(
            "{name} step {i} (t={}): {:?} {} → {} {:?}: {}",
            world.t, d.regime, d.current_replicas, d.desired_replicas, d.action, d.reason
        );
        assert_eq!(d.regime, s.regime, "{ctx}");
        assert_eq!(d.desired_replicas, s.desired, "{ctx}");
        assert_eq!(d.action, s.action, "{ctx}");
        out.push(d);
    }
    out
}

fn condition<'s>(status: &'s WorkerBackpressureStatus, type_: &str) -> &'s Condition {
    status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn defaults() -> Effective {
    effective(|_| {})
}

use Action::{AbortRamp, Fallback as Fb, HoldScaleOut, RampStage, ScaleIn, ScaleOut};
use Queue::{Backlog, Idle, Steady};
use Regime::{Backlogged, DependencyFailing, Healthy, MetricsUnavailable, Recovering};

/// Holds at 8 replicas with the backlog: 30 s above the hold threshold.
const INTO_HOLD: [Step; 3] = [
    step(0, 0.31, Backlog, Backlogged, 8, Action::None),
    step(15, 0.31, Backlog, Backlogged, 8, Action::None),
    step(15, 0.31, Backlog, DependencyFailing, 8, HoldScaleOut),
];

/// From the hold, release after 60 s below 0.05 and ramp 8 → 14 in 25/50/75/100% stages.
const RELEASE_AND_RAMP: [Step; 6] = [
    step(15, 0.03, Backlog, DependencyFailing, 8, Action::None),
    step(30, 0.03, Backlog, DependencyFailing, 8, Action::None),
    step(30, 0.03, Backlog, Recovering, 10, RampStage),
    step(30, 0.03, Backlog, Recovering, 10, Action::None),
    step(30, 0.03, Backlog, Recovering, 11, RampStage),
    step(60, 0.03, Backlog, Recovering, 13, RampStage),
];

/// Steps 15 s at a time until the hold is released: within `release.for` plus a requeue.
fn first_release(w: &mut World) -> Decision {
    for _ in 0..8 {
        let d = w.step(15);
        if d.regime != Regime::DependencyFailing {
            return d;
        }
    }
    panic!(
        "not released within release.for plus a requeue: {:?}",
        w.status
    );
}
