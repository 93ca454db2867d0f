//! The Guard-mode steps of a reconcile: bring the guarded HorizontalPodAutoscaler or
//! ScaledObject to the clamp the decision asks for ([`guard_step`]), and give it its original
//! settings back when the object leaves Guard mode or is deleted ([`finalize`]). The patches
//! themselves are in [`crate::act::guard`].

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    GuardClamp, GuardKind, Mode, WorkerBackpressure, WorkerBackpressureStatus,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;

use super::{Context, ReconcileError};
use crate::act::{Note, guard};
use crate::errors;
use backpressure_core::decide;
use backpressure_core::resolve::Effective;

/// Step 5b (client), Guard mode: bring the guarded autoscaler to the clamp the decision asks
/// for (`clamp`; `None` leaves it as it is), record it in `status.guard` and the
/// `GuardApplied` condition, and keep the finalizer on. In any other mode: restore whatever
/// this object clamped and drop the finalizer.
#[allow(clippy::too_many_arguments)]
pub async fn guard_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    clamp: Option<guard::ClampPlan>,
    status: &mut WorkerBackpressureStatus,
    notes: &mut Vec<Note>,
    now: Timestamp,
) -> Result<(), ReconcileError> {
    let owner = wbp.name_any();
    let previous = wbp.status.as_ref();
    let prev_guard = previous.and_then(|s| s.guard.clone());
    let guard_ref = eff.guard.as_ref().filter(|_| eff.mode == Mode::Guard);
    let Some(guard_ref) = guard_ref else {
        if guard::has_finalizer(wbp) || prev_guard.is_some() {
            for (kind, name) in guard::guarded_refs(wbp) {
                if guard::release(&ctx.client, ns, kind, &name, &owner)
                    .await
                    .map_err(ReconcileError::Guard)?
                {
                    notes.push(released(kind, &name, &format!("mode is {:?}", eff.mode)));
                }
            }
            guard::set_finalizer(&ctx.client, wbp, false)
                .await
                .map_err(ReconcileError::Finalizer)?;
        }
        status.guard = None;
        return Ok(());
    };
    guard::set_finalizer(&ctx.client, wbp, true)
        .await
        .map_err(ReconcileError::Finalizer)?;
    // The guard moved to another autoscaler: give the old one its settings back first.
    if let Some(old) = &prev_guard
        && (old.kind, old.name.as_str()) != (guard_ref.kind, guard_ref.name.as_str())
        && guard::release(&ctx.client, ns, old.kind, &old.name, &owner)
            .await
            .map_err(ReconcileError::Guard)?
    {
        let why = format!(
            "spec.guard now names {:?} {}",
            guard_ref.kind, guard_ref.name
        );
        notes.push(released(old.kind, &old.name, &why));
    }
    let Some(plan) = clamp else {
        // Suspended: the autoscaler is left as it is; status and condition stay as they were.
        return Ok(());
    };
    let (kind, name) = (guard_ref.kind, guard_ref.name.as_str());
    match guard::sync(&ctx.client, ns, kind, name, &owner, plan.clamp).await {
        Ok(synced) => {
            let (reason, what) = match (synced.status.clamp, kind) {
                (GuardClamp::None, _) => ("NotClamped", "runs with its original settings".into()),
                (GuardClamp::ScaleOutDisabled, GuardKind::HorizontalPodAutoscaler) => (
                    "ScaleOutDisabled",
                    "has behavior.scaleUp.selectPolicy Disabled".to_owned(),
                ),
                (GuardClamp::ScaleOutDisabled, GuardKind::ScaledObject) => (
                    "ScaleOutDisabled",
                    format!("has annotation {}: \"true\"", guard::KEDA_PAUSED_SCALE_OUT),
                ),
                (GuardClamp::ScalingDisabled, GuardKind::HorizontalPodAutoscaler) => (
                    "ScalingDisabled",
                    "has behavior.scaleUp.selectPolicy and behavior.scaleDown.selectPolicy \
                     Disabled"
                        .to_owned(),
                ),
                (GuardClamp::ScalingDisabled, GuardKind::ScaledObject) => (
                    "ScalingDisabled",
                    format!(
                        "has annotations {} and {}: \"true\"",
                        guard::KEDA_PAUSED_SCALE_OUT,
                        guard::KEDA_PAUSED_SCALE_IN
                    ),
                ),
                (GuardClamp::MaxReplicas, GuardKind::HorizontalPodAutoscaler) => (
                    "MaxReplicasClamped",
                    format!(
                        "has maxReplicas {}",
                        synced.status.max_replicas.unwrap_or_default()
                    ),
                ),
                (GuardClamp::MaxReplicas, GuardKind::ScaledObject) => (
                    "MaxReplicasClamped",
                    format!(
                        "has maxReplicaCount {}",
                        synced.status.max_replicas.unwrap_or_default()
                    ),
                ),
            };
            let message = format!("{kind:?} {name} {what}: {}", plan.why);
            if synced.changed {
                notes.push(Note {
                    warning: false,
                    reason: if synced.status.clamp == GuardClamp::None {
                        "GuardReleased".into()
                    } else {
                        "GuardClamped".into()
                    },
                    action: "Guard".into(),
                    message: message.clone(),
                });
            }
            status.guard = Some(synced.status);
            decide::set_condition(
                status,
                previous,
                cond::GUARD_APPLIED,
                true,
                reason,
                message,
                now,
            );
        }
        // Someone changed the autoscaler between the read and the patch: read again soon.
        Err(e) if e.is_conflict() => return Err(ReconcileError::Guard(e)),
        Err(e) => {
            let message = errors::with_cause(&e);
            let unchanged = previous
                .and_then(|p| p.conditions.as_deref())
                .and_then(|c| c.iter().find(|c| c.type_ == cond::GUARD_APPLIED))
                .is_some_and(|c| c.status == "False" && c.message == message);
            if !unchanged {
                notes.push(Note {
                    warning: true,
                    reason: e.reason().into(),
                    action: "Guard".into(),
                    message: message.clone(),
                });
            }
            // In Guard mode the autoscaler is how the decision takes effect: without it the
            // object is not doing its job, so Ready says so too (kstatus: InProgress).
            decide::set_condition(
                status,
                previous,
                cond::READY,
                false,
                e.reason(),
                format!("Guard mode cannot act: {message}"),
                now,
            );
            decide::set_condition(
                status,
                previous,
                cond::GUARD_APPLIED,
                false,
                e.reason(),
                message,
                now,
            );
        }
    }
    Ok(())
}

/// The event of a guarded autoscaler given its original settings back, and why.
fn released(kind: GuardKind, name: &str, why: &str) -> Note {
    Note {
        warning: false,
        reason: "GuardReleased".into(),
        action: "Guard".into(),
        message: format!("{kind:?} {name}: original settings restored ({why})"),
    }
}

/// The object is being deleted: restore what it clamped, then drop the finalizer.
pub(super) async fn finalize(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
) -> Result<Action, ReconcileError> {
    if !guard::has_finalizer(wbp) {
        return Ok(Action::await_change());
    }
    let owner = wbp.name_any();
    for (kind, name) in guard::guarded_refs(wbp) {
        guard::release(&ctx.client, ns, kind, &name, &owner)
            .await
            .map_err(ReconcileError::Guard)?;
    }
    guard::set_finalizer(&ctx.client, wbp, false)
        .await
        .map_err(ReconcileError::Finalizer)?;
    tracing::info!(namespace = ns, name = %owner, "guarded autoscaler restored; finalizer removed");
    Ok(Action::await_change())
}
