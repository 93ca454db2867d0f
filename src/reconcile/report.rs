//! The last step of a reconcile, [`report_step`], and the short path of an object that cannot
//! act this time, [`report_not_ready`].

use backpressure_api::FIELD_MANAGER;
use backpressure_api::v1alpha1::{WorkerBackpressure, WorkerBackpressureStatus};
use backpressure_core::decide;
use backpressure_core::resolve::ResolveError;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource as _, ResourceExt as _};

use super::{Context, ReconcileError, jitter};
use crate::act::{self, Note};

/// Step 6 (client): write the status when it changed, then publish the events.
pub async fn report_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    status: WorkerBackpressureStatus,
    previous: Option<&WorkerBackpressureStatus>,
    notes: &[Note],
) -> Result<(), ReconcileError> {
    if decide::status_changed(previous, &status) {
        let api: Api<WorkerBackpressure> = Api::namespaced(ctx.client.clone(), ns);
        let patch = serde_json::json!({
            "apiVersion": "backpressure.dev/v1alpha1",
            "kind": "WorkerBackpressure",
            "status": status,
        });
        api.patch_status(
            &wbp.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(ReconcileError::Status)?;
    }
    act::publish(&ctx.recorder, &wbp.object_ref(&()), notes).await;
    Ok(())
}

/// Why an object cannot act this time.
#[derive(Debug, Clone, Copy)]
pub enum NotReady<'a> {
    /// The spec cannot be resolved: Ready=False and Stalled=True name every invalid field.
    InvalidSpec(&'a ResolveError),
    /// The target cannot be read, or another, older object names the same target and acts on
    /// it: Ready=False with `reason` and `message`.
    TargetUnavailable {
        /// The condition and event reason.
        reason: &'static str,
        /// What is wrong, in words.
        message: &'a str,
    },
}

/// The object cannot act (`why`): write the not-ready status and a Warning event when the
/// message changes, and touch nothing else — no config push, no scale, no guard, so two
/// objects naming one target never fight over its replicas. Requeued at the regular interval.
pub async fn report_not_ready(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    why: NotReady<'_>,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let previous = wbp.status.as_ref();
    let generation = wbp.metadata.generation;
    let (status, events) = match why {
        NotReady::InvalidSpec(err) => decide::invalid_spec(previous, generation, err, now),
        NotReady::TargetUnavailable { reason, message } => {
            decide::target_unavailable(previous, generation, reason, message, now)
        }
    };
    let notes: Vec<Note> = events.iter().map(Note::from).collect();
    report_step(wbp, ctx, ns, status, previous, &notes).await?;
    Ok(Action::requeue(jitter(ctx.settings.requeue_interval, wbp)))
}
