//! One reconcile of a WorkerBackpressure, as named steps:
//!
//! | step | client? | what |
//! |---|---|---|
//! | [`resolve_step`] | no (caches) | spec + matching policies + defaults + annotations → `Effective` |
//! | [`observe_step`] | yes | target `/scale`, its pods (cache), batched fleet metrics |
//! | [`config_step`] | yes | the worker ConfigMap and config pushes → pods in sync |
//! | `decide` | no | [`backpressure_core::decide::decide`]: regime, replicas, ramp, conditions, events |
//! | [`scale_step`] | yes | `/scale`, in Active mode only |
//! | [`guard_step`] | yes | Guard mode: clamp or restore the guarded HPA / ScaledObject ([`act::guard`]) |
//! | [`report_step`] | yes | server-side-applied status (only when it changed), events |
//!
//! A Guard-mode object carries the finalizer [`act::guard::FINALIZER`]: deleting it (or leaving
//! Guard mode) first restores the guarded autoscaler's original settings.
//!
//! A no-op reconcile writes nothing: every write is preceded by a comparison with what is
//! already there.

use std::sync::Arc;
use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    ConfigStatus, GuardClamp, GuardKind, Mode, WorkerBackpressure, WorkerBackpressureStatus,
};
use backpressure_api::wire::WorkerConfig;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource as _, ResourceExt as _};

use crate::act::{self, Note, configmap, guard};
use crate::annotations;
use crate::controller::Context;
use crate::observe::owners::Ownership;
use crate::observe::target::{self, PodInfo, TargetError, TargetState};
use crate::observe::{self, FleetMetrics, MetricsError};
use backpressure_api::FIELD_MANAGER;
use backpressure_core::decide::{self, Observation};
use backpressure_core::resolve::{self, Effective, PolicyInput, ResolveError};

/// Errors that make a reconcile retry sooner. Problems with the object itself (a bad spec, a
/// missing target, metrics down) are not errors: they are reported in status and events.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The object has no namespace (impossible for a namespaced kind).
    #[error("object has no namespace")]
    NoNamespace,
    /// Writing status failed.
    #[error("writing status: {0}")]
    Status(#[source] kube::Error),
    /// Writing `/scale` failed.
    #[error("writing /scale: {0}")]
    Scale(#[source] kube::Error),
    /// Writing the ConfigMap failed.
    #[error("writing the worker ConfigMap: {0}")]
    ConfigMap(#[source] kube::Error),
    /// Rendering failed.
    #[error("rendering: {0}")]
    Render(#[source] serde_json::Error),
    /// Restoring or clamping the guarded autoscaler failed in a way worth retrying soon.
    #[error("guard: {0}")]
    Guard(#[source] guard::GuardError),
    /// Adding or removing the guard finalizer failed.
    #[error("guard finalizer: {0}")]
    Finalizer(#[source] kube::Error),
}

/// Requeue after `base` plus up to 10% derived from the object's UID (stable per object,
/// spreads objects over the interval without a random source).
pub fn jitter(base: Duration, wbp: &WorkerBackpressure) -> Duration {
    let uid = wbp.metadata.uid.as_deref().unwrap_or_default();
    let h = uid
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    let spread = base.as_millis() as u64 / 10;
    base + Duration::from_millis(if spread == 0 { 0 } else { h % spread })
}

/// The reconcile entry point.
pub async fn reconcile(
    wbp: Arc<WorkerBackpressure>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let timer = ctx.metrics.reconcile_timer();
    let ns = wbp.namespace().ok_or(ReconcileError::NoNamespace)?;
    if wbp.metadata.deletion_timestamp.is_some() {
        let action = finalize(&wbp, &ctx, &ns).await?;
        timer.success();
        return Ok(action);
    }
    let now = Timestamp::now();
    let action = match resolve_step(&wbp, &ctx, &ns, now) {
        Err(err) => report_invalid(&wbp, &ctx, &ns, &err, now).await?,
        Ok(effective) => reconcile_effective(&wbp, &ctx, &ns, &effective, now).await?,
    };
    if let (Ok(mut f), Some(uid)) = (ctx.failures.lock(), wbp.metadata.uid.as_deref()) {
        f.remove(uid);
    }
    timer.success();
    Ok(action)
}

/// Step 1 (no client): merge the spec with the matching policies, the defaults and the manual
/// overrides of `kubectl wbp` (annotations).
pub fn resolve_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    now: Timestamp,
) -> Result<Effective, ResolveError> {
    let ns_labels = ctx
        .namespaces
        .state()
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(ns))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    let policies = ctx.policies.state();
    let inputs: Vec<PolicyInput<'_>> = policies
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.as_deref()?;
            let selected =
                resolve::namespace_selector_matches(p.spec.namespace_selector.as_ref(), &ns_labels)
                    .unwrap_or(false);
            selected.then_some(PolicyInput {
                name,
                spec: &p.spec,
            })
        })
        .collect();
    let mut effective = resolve::resolve(&wbp.spec, &inputs, now)?;
    if effective.metrics.address.is_none() {
        effective.metrics.address = ctx.settings.default_prometheus.clone();
    }
    let manual = annotations::read(wbp.metadata.annotations.as_ref(), now);
    effective.manual_hold_until = manual.hold_until;
    if manual.dry_run && !effective.dry_run {
        effective.dry_run = true;
        effective.dry_run_by = Some(format!("annotation {}", annotations::DRY_RUN));
    }
    Ok(effective)
}

/// What observe found.
#[derive(Debug)]
pub struct Observed {
    /// The target, or why it could not be read.
    pub target: Result<TargetState, TargetError>,
    /// Its pods (empty when the target is unreadable).
    pub pods: Vec<PodInfo>,
    /// Fleet metrics, or why they could not be read.
    pub fleet: Result<FleetMetrics, MetricsError>,
}

/// Step 2 (client): the target, its pods and the fleet metrics.
pub async fn observe_step(ctx: &Context, ns: &str, eff: &Effective, now: Timestamp) -> Observed {
    let target = target::read_target(&ctx.client, &ctx.kinds, ns, &eff.target_ref).await;
    let pods = match &target {
        Ok(t) => target::pods_of(&ctx.pods, ns, &t.selector),
        Err(_) => Vec::new(),
    };
    let fleet = async {
        let address = eff
            .metrics
            .address
            .as_deref()
            .ok_or(MetricsError::NoAddress)?;
        let auth = observe::prometheus_auth(&ctx.client, ns, &eff.metrics).await?;
        // One fetch per query per interval, however many objects read it (the batch); the
        // objects whose values a fetch changes are reconciled at once (the hub's announcements).
        let max_age = ctx.settings.requeue_interval;
        let now_unix = now.as_millisecond() as f64 / 1000.0;
        observe::read_fleet(
            &ctx.hub,
            address,
            &auth,
            ns,
            &eff.metrics,
            now_unix,
            max_age,
        )
        .await
    }
    .await;
    Observed {
        target,
        pods,
        fleet,
    }
}

async fn reconcile_effective(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let ownership = ctx.owners.ownership(wbp, &ctx.wbps);
    if !ownership.may_act() {
        return report_conflict(wbp, ctx, ns, &ownership, now).await;
    }
    let observed = observe_step(ctx, ns, eff, now).await;
    let previous = wbp.status.as_ref();
    let target = match observed.target {
        Ok(t) => t,
        Err(e) => return report_target_error(wbp, ctx, ns, &e, now).await,
    };
    let (config, mut notes) = config_step(wbp, ctx, ns, eff, &observed.pods, previous, now).await?;

    let observation = Observation {
        now,
        generation: wbp.metadata.generation,
        current_replicas: target.spec_replicas,
        ready_pods: observed.pods.iter().filter(|p| p.ready).count() as i32,
        fleet: observed.fleet.as_ref().cloned().unwrap_or_default(),
        metrics_error: observed.fleet.as_ref().err().map(ToString::to_string),
        config: Some(config),
    };
    let decision = decide::decide(eff, previous, &observation);
    ctx.metrics.decision(decision.regime, decision.action);
    scale_step(wbp, ctx, ns, eff, &target, &decision).await?;
    notes.extend(decision.events.iter().map(Note::from));
    let hold_until = eff.manual_hold_until.map(|t| t.to_string());
    let clamp = guard::clamp_for(eff, &decision, hold_until.as_deref());
    let requeue_after = decision.requeue_after;
    let mut status = decision.status;
    guard_step(wbp, ctx, ns, eff, clamp, &mut status, &mut notes, now).await?;
    report_step(wbp, ctx, ns, status, previous, &notes).await?;
    Ok(Action::requeue(jitter(
        requeue_after.min(ctx.settings.requeue_interval),
        wbp,
    )))
}

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
                    notes.push(Note {
                        warning: false,
                        reason: "GuardReleased".into(),
                        action: "Guard".into(),
                        message: format!(
                            "{kind:?} {name}: original settings restored (mode is {:?})",
                            eff.mode
                        ),
                    });
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
        notes.push(Note {
            warning: false,
            reason: "GuardReleased".into(),
            action: "Guard".into(),
            message: format!(
                "{:?} {}: original settings restored (spec.guard now names {:?} {})",
                old.kind, old.name, guard_ref.kind, guard_ref.name
            ),
        });
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
            let message = e.to_string();
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

/// The object is being deleted: restore what it clamped, then drop the finalizer.
async fn finalize(
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

/// Step 3 (client): render the worker configuration into the owned ConfigMap and push it to
/// the ready pods. The generation grows whenever the content changes
/// ([`resolve::next_config_generation`]).
pub async fn config_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    pods: &[PodInfo],
    previous: Option<&WorkerBackpressureStatus>,
    now: Timestamp,
) -> Result<(ConfigStatus, Vec<Note>), ReconcileError> {
    let rendered = resolve::render_worker_config(eff, 0).with_hash();
    let generation = resolve::next_config_generation(
        previous
            .and_then(|s| s.config.as_ref())
            .map(|c| (c.hash.as_str(), c.generation.unwrap_or(0))),
        &rendered.hash,
        now,
    );
    let config: WorkerConfig = WorkerConfig {
        generation,
        hash: String::new(),
        ..rendered
    }
    .with_hash();
    let quiet = eff.dry_run || eff.suspend;
    if !quiet {
        let desired = configmap::desired(wbp, &config).map_err(ReconcileError::Render)?;
        let existing = desired
            .metadata
            .name
            .as_deref()
            .and_then(|name| ctx.configmaps.get(&ObjectRef::new(name).within(ns)));
        if !configmap::up_to_date(existing.as_deref(), &desired) {
            configmap::apply(&ctx.client, &desired)
                .await
                .map_err(ReconcileError::ConfigMap)?;
        }
    }
    let token = match ctx.tokens.token(&ctx.client).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot mint the config push token");
            None
        }
    };
    let report = ctx
        .pusher
        .sync(pods, &config, token.as_deref(), &ctx.metrics, quiet)
        .await;
    let mut notes = Vec::new();
    if let Some((pod, why)) = report.failed.first() {
        notes.push(Note {
            warning: true,
            reason: "ConfigPushFailed".into(),
            action: "PushConfig".into(),
            message: format!(
                "config {} reached {} of {} ready pods; push to {pod} failed: {why} (retried with backoff)",
                config.hash, report.in_sync, report.total
            ),
        });
    }
    Ok((
        ConfigStatus {
            hash: config.hash.clone(),
            generation: Some(config.generation),
            pods_in_sync: report.in_sync,
            pods_total: report.total,
        },
        notes,
    ))
}

/// Step 5 (client): write `/scale` when the decision changes the replicas, in Active mode.
/// DryRun, Guard and Suspended never write to the target.
pub async fn scale_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    target: &TargetState,
    decision: &decide::Decision,
) -> Result<(), ReconcileError> {
    if eff.mode != Mode::Active || eff.dry_run {
        return Ok(());
    }
    let Some(to) = decision.scale_to() else {
        return Ok(());
    };
    if to == target.spec_replicas {
        return Ok(());
    }
    target::write_scale(&ctx.client, ns, &target.resource, &eff.target_ref.name, to)
        .await
        .map_err(ReconcileError::Scale)?;
    tracing::info!(
        namespace = ns, name = %wbp.name_any(), from = target.spec_replicas, to,
        action = decision.action.as_str(), reason = %decision.reason, "scaled target"
    );
    Ok(())
}

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

/// The object's spec cannot be resolved: Ready=False and Stalled=True naming every invalid
/// field, a Warning event when the message changes, nothing else.
async fn report_invalid(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    err: &ResolveError,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let (status, events) =
        decide::invalid_spec(wbp.status.as_ref(), wbp.metadata.generation, err, now);
    let notes: Vec<Note> = events.iter().map(Note::from).collect();
    report_step(wbp, ctx, ns, status, wbp.status.as_ref(), &notes).await?;
    Ok(Action::requeue(jitter(ctx.settings.requeue_interval, wbp)))
}

/// Another, older object names the same target and acts on it: report the conflict and touch
/// nothing (no config push, no scale, no guard), so the two never fight over the replicas.
async fn report_conflict(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    ownership: &Ownership,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let message = ownership.message().unwrap_or_default();
    let (status, events) = decide::target_unavailable(
        wbp.status.as_ref(),
        wbp.metadata.generation,
        Ownership::CONFLICT_REASON,
        &message,
        now,
    );
    let notes: Vec<Note> = events.iter().map(Note::from).collect();
    report_step(wbp, ctx, ns, status, wbp.status.as_ref(), &notes).await?;
    Ok(Action::requeue(jitter(ctx.settings.requeue_interval, wbp)))
}

/// The target cannot be read: Ready=False with the reason, a Warning event when it changes,
/// nothing written to any target.
async fn report_target_error(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    err: &TargetError,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let reason = match err {
        TargetError::UnknownKind { .. } => "TargetKindUnknown",
        TargetError::ClusterScoped(_) => "TargetNotNamespaced",
        TargetError::NoScale(_) => "TargetHasNoScale",
        TargetError::NotFound { .. } => "TargetNotFound",
        TargetError::Selector(..) => "TargetSelectorInvalid",
        TargetError::Api(..) => "TargetUnreadable",
    };
    let (status, events) = decide::target_unavailable(
        wbp.status.as_ref(),
        wbp.metadata.generation,
        reason,
        &err.to_string(),
        now,
    );
    let notes: Vec<Note> = events.iter().map(Note::from).collect();
    report_step(wbp, ctx, ns, status, wbp.status.as_ref(), &notes).await?;
    Ok(Action::requeue(jitter(ctx.settings.requeue_interval, wbp)))
}
