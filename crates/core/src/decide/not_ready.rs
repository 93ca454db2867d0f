//! The not-ready paths: no decision is made, the previous regime, replicas and ramp are kept,
//! and `Ready=False` says why (an invalid spec, an unreadable target).

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::WorkerBackpressureStatus;
use k8s_openapi::jiff::Timestamp;

use super::conditions::{self, Status as CondStatus};
use super::time::truncate;
use super::{DecisionEvent, EventType};
use crate::resolve::ResolveError;

/// Status and events for an object whose configuration does not resolve: `Ready=False` and
/// `Stalled=True` (kstatus: Failed) naming every invalid field; the previous regime, replicas
/// and ramp are kept and nothing is decided. An event is returned only when the message
/// changed.
pub fn invalid_spec(
    previous: Option<&WorkerBackpressureStatus>,
    generation: Option<i64>,
    error: &ResolveError,
    now: Timestamp,
) -> (WorkerBackpressureStatus, Vec<DecisionEvent>) {
    let now = truncate(now);
    let mut status = previous.cloned().unwrap_or_default();
    let prev_conditions = status.conditions.take().unwrap_or_default();
    let message = error.to_string();
    let mut b = conditions::Builder::new(&prev_conditions, now, generation);
    b.set(
        cond::READY,
        CondStatus::False,
        "InvalidSpec",
        message.clone(),
    );
    for t in cond::ALL.iter().skip(1) {
        b.keep(t);
    }
    b.set(
        cond::STALLED,
        CondStatus::True,
        "InvalidSpec",
        message.clone(),
    );
    let new_conditions = b.build();
    let changed =
        conditions::find(&prev_conditions, cond::STALLED).map(|c| &c.message) != Some(&message);
    status.conditions = Some(new_conditions);
    status.observed_generation = generation.or(status.observed_generation);
    let events = if changed {
        vec![DecisionEvent {
            type_: EventType::Warning,
            reason: "InvalidSpec",
            action: "Classify",
            message,
        }]
    } else {
        Vec::new()
    };
    (status, events)
}

/// Status and events for an object whose target cannot be read (missing, no `/scale`, another
/// scope, an unreadable selector): `Ready=False` with `reason` and `message`; the previous
/// regime, replicas and ramp are kept, nothing is decided and nothing is written to any target.
/// Not `Stalled`: the target may appear at any time. An event is returned only when the
/// message changed.
pub fn target_unavailable(
    previous: Option<&WorkerBackpressureStatus>,
    generation: Option<i64>,
    reason: &'static str,
    message: &str,
    now: Timestamp,
) -> (WorkerBackpressureStatus, Vec<DecisionEvent>) {
    let now = truncate(now);
    let mut status = previous.cloned().unwrap_or_default();
    let prev_conditions = status.conditions.take().unwrap_or_default();
    let mut b = conditions::Builder::new(&prev_conditions, now, generation);
    b.set(cond::READY, CondStatus::False, reason, message.to_owned());
    for t in cond::ALL.iter().skip(1) {
        b.keep(t);
    }
    let changed = conditions::find(&prev_conditions, cond::READY)
        .map(|c| (c.reason.as_str(), c.message.as_str()))
        != Some((reason, message));
    status.conditions = Some(b.build());
    status.observed_generation = generation.or(status.observed_generation);
    let events = if changed {
        vec![DecisionEvent {
            type_: EventType::Warning,
            reason,
            action: "Classify",
            message: message.to_owned(),
        }]
    } else {
        Vec::new()
    };
    (status, events)
}
