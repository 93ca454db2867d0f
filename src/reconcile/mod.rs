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
//! An object that cannot act this time — its spec does not resolve, its target cannot be
//! read, or an older object acts on the same target — stops after resolve or observe and
//! reports why ([`report_not_ready`]), writing nothing else.
//!
//! A Guard-mode object carries the finalizer [`act::guard::FINALIZER`]: deleting it (or leaving
//! Guard mode) first restores the guarded autoscaler's original settings.
//!
//! A no-op reconcile writes nothing: every write is preceded by a comparison with what is
//! already there.
//!
//! Layout: the steps above are here, the Guard-mode steps in `guard.rs`, the status write and
//! the not-ready path in `report.rs`, and what the reconcile needs from the runtime
//! ([`Context`], [`Settings`]) in `context.rs`. The controller (the watches and background
//! tasks) calls [`reconcile`] and [`error_policy`]; nothing here imports the controller.

mod context;
mod guard;
mod producers;
mod report;

use std::sync::Arc;
use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    ConfigStatus, Mode, WorkerBackpressure, WorkerBackpressureStatus,
};
use backpressure_api::wire::{self, WorkerConfig};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::act::{self, Note, configmap};
use crate::annotations;
use crate::errors;
use crate::observe::owners::Ownership;
use crate::observe::target::{self, PodInfo, TargetError, TargetState};
use crate::observe::{self, FleetMetrics, MetricsError, access};
use backpressure_core::decide::{self, Observation};
use backpressure_core::resolve::{self, Effective, PolicyInput, ResolveError};
use backpressure_core::tenancy::{self, address::redact_text};

pub use context::{Context, Settings};
pub use guard::guard_step;
pub use producers::{ProducerOutcome, producers_step, report_producers};
pub use report::{NotReady, report_not_ready, report_step};

/// Errors that make a reconcile retry sooner. Problems with the object itself (a bad spec, a
/// missing target, metrics down) are not errors: they are reported in status and events.
///
/// Each message names the step that failed; the cause is the [`source`](std::error::Error::source)
/// and is printed once, by whoever prints the chain ([`crate::errors::Chain`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The object has no namespace (impossible for a namespaced kind).
    #[error("object has no namespace")]
    NoNamespace,
    /// Writing status failed.
    #[error("writing status")]
    Status(#[source] kube::Error),
    /// Writing `/scale` failed.
    #[error("writing /scale")]
    Scale(#[source] kube::Error),
    /// Writing the ConfigMap failed.
    #[error("writing the worker ConfigMap")]
    ConfigMap(#[source] kube::Error),
    /// Rendering failed.
    #[error("rendering the worker ConfigMap")]
    Render(#[source] serde_json::Error),
    /// Restoring or clamping the guarded autoscaler failed in a way worth retrying soon.
    #[error("guard")]
    Guard(#[source] act::guard::GuardError),
    /// Adding or removing the guard finalizer failed.
    #[error("guard finalizer")]
    Finalizer(#[source] kube::Error),
}

impl ReconcileError {
    /// Every [`category`](Self::category), for exporting each label value from the start.
    pub const CATEGORIES: [&'static str; 7] = [
        "namespace",
        "status",
        "scale",
        "configmap",
        "render",
        "guard",
        "finalizer",
    ];

    /// What failed, as the `category` label of `backpressure_operator_reconcile_errors_total`:
    /// one fixed value per variant, never anything from the object or the cause.
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::NoNamespace => "namespace",
            ReconcileError::Status(_) => "status",
            ReconcileError::Scale(_) => "scale",
            ReconcileError::ConfigMap(_) => "configmap",
            ReconcileError::Render(_) => "render",
            ReconcileError::Guard(_) => "guard",
            ReconcileError::Finalizer(_) => "finalizer",
        }
    }
}

/// The reconcile entry point: the [steps](self), timed and counted in the operator's metrics.
pub async fn reconcile(
    wbp: Arc<WorkerBackpressure>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let timer = ctx.metrics.reconcile_timer();
    let result = steps(&wbp, &ctx).await;
    match &result {
        Ok(_) => {
            if let (Ok(mut f), Some(uid)) = (ctx.failures.lock(), wbp.metadata.uid.as_deref()) {
                f.remove(uid);
            }
            timer.success();
        }
        Err(e) => timer.failure(e.category()),
    }
    result
}

/// The steps of one reconcile, in order (the table above).
async fn steps(wbp: &WorkerBackpressure, ctx: &Context) -> Result<Action, ReconcileError> {
    let ns = wbp.namespace().ok_or(ReconcileError::NoNamespace)?;
    if wbp.metadata.deletion_timestamp.is_some() {
        return guard::finalize(wbp, ctx, &ns).await;
    }
    let now = Timestamp::now();
    let mut eff = match resolve_step(wbp, ctx, &ns, now) {
        Ok(eff) => eff,
        Err(err) => {
            return report_not_ready(wbp, ctx, &ns, NotReady::InvalidSpec(&err), now).await;
        }
    };
    let ownership = ctx.owners.ownership(wbp, &ctx.wbps);
    if !ownership.may_act() {
        let message = ownership.message().unwrap_or_default();
        let why = NotReady::TargetUnavailable {
            reason: Ownership::CONFLICT_REASON,
            message: &message,
        };
        return report_not_ready(wbp, ctx, &ns, why, now).await;
    }
    let conflict = autoscaler_conflict(ctx, &ns, &mut eff);
    let observed = observe_step(ctx, &ns, &eff, now).await;
    let target = match &observed.target {
        Ok(t) => t,
        Err(e) => {
            let message = errors::with_cause(e);
            let why = NotReady::TargetUnavailable {
                reason: e.reason(),
                message: &message,
            };
            return report_not_ready(wbp, ctx, &ns, why, now).await;
        }
    };
    let previous = wbp.status.as_ref();
    let producers =
        producers_step(ctx, &ns, &eff, observed.fleet.as_ref().ok(), previous, now).await?;
    let producer_doc = producers.as_ref().map(|p| &p.document);
    let (config, not_owned, mut notes) = config_step(
        wbp,
        ctx,
        &ns,
        &eff,
        &observed.pods,
        producer_doc,
        previous,
        now,
    )
    .await?;
    let decision = decide_step(wbp, ctx, &eff, target, &observed, config, now);
    scale_step(wbp, ctx, &ns, &eff, target, &decision).await?;
    notes.extend(decision.events.iter().map(Note::from));
    let hold_until = eff.manual_hold_until.map(|t| t.to_string());
    let clamp = act::guard::clamp_for(&eff, &decision, hold_until.as_deref());
    let requeue_after = decision.requeue_after;
    let mut status = decision.status;
    if let Some(message) = not_owned {
        report_not_owned(&mut status, previous, message, &mut notes, now);
    }
    if let Some(message) = conflict {
        report_conflict(&mut status, previous, message, &mut notes, now);
    }
    guard_step(wbp, ctx, &ns, &eff, clamp, &mut status, &mut notes, now).await?;
    report_producers(&mut status, previous, producers.as_ref(), now);
    if let Some(p) = producers {
        notes.extend(p.notes);
    }
    report_step(wbp, ctx, &ns, status, previous, &notes).await?;
    Ok(Action::requeue(jitter(
        requeue_after.min(ctx.settings.requeue_interval),
        wbp,
    )))
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
        Ok(t) => ctx.pods.pods_of(ns, &t.selector),
        Err(_) => Vec::new(),
    };
    let fleet = async {
        // The tenant's queries scoped to its namespace, then the address and the credentials
        // checked: a query or an address that is refused fetches nothing.
        let queries = tenancy::scoped_queries(&eff.metrics, ns).map_err(MetricsError::Rejected)?;
        let prometheus =
            access::target(&ctx.client, ns, &eff.metrics, &ctx.settings.prometheus).await?;
        // One fetch per query per interval, however many objects read it (the batch); the
        // objects whose values a fetch changes are reconciled at once (the hub's announcements).
        let max_age = ctx.settings.requeue_interval;
        let now_unix = now.as_millisecond() as f64 / 1000.0;
        observe::read_fleet(
            &ctx.hub,
            &prometheus,
            ns,
            &eff.metrics,
            &queries,
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

/// Step 3 (client): render the worker configuration into the owned ConfigMap and push it to
/// the ready pods. The generation grows whenever the content changes
/// ([`resolve::next_config_generation`]). Returns the rollout, the message of a ConfigMap name
/// taken by someone else's ConfigMap ([`configmap::sync`], reported by [`report_not_owned`]),
/// and the events.
// The step's inputs are the reconcile's (object, context, namespace, effective, previous, now)
// plus what it writes: the pods and the producer document.
#[allow(clippy::too_many_arguments)]
pub async fn config_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    pods: &[PodInfo],
    producer: Option<&wire::ProducerConfig>,
    previous: Option<&WorkerBackpressureStatus>,
    now: Timestamp,
) -> Result<(ConfigStatus, Option<String>, Vec<Note>), ReconcileError> {
    // With a fleet failure floor in the last status, the workers run the effective set point
    // `decide` holds against (`decide::worker_set_point`).
    let set_point = decide::worker_set_point(eff, previous);
    let rendered = resolve::render_worker_config(eff, set_point, 0).with_hash();
    // A status written by a 0.1 operator names the content by its legacy hash: the same
    // content keeps its generation across the upgrade.
    #[allow(deprecated)]
    let legacy = rendered.legacy_hash();
    let generation = resolve::next_config_generation(
        previous.and_then(|s| s.config.as_ref()).map(|c| {
            (
                same_content(&c.hash, &legacy, &rendered.hash),
                c.generation.unwrap_or(0),
            )
        }),
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
    let mut not_owned = None;
    if !quiet {
        let desired = configmap::desired(wbp, &config, producer).map_err(ReconcileError::Render)?;
        let existing = desired
            .metadata
            .name
            .as_deref()
            .and_then(|name| ctx.configmaps.get(&ObjectRef::new(name).within(ns)));
        let synced = configmap::sync(&ctx.client, wbp, existing.as_deref(), &desired)
            .await
            .map_err(ReconcileError::ConfigMap)?;
        if let configmap::Synced::NotOwned { name, owner } = synced {
            not_owned = Some(format!(
                "ConfigMap {name} exists and is not this object's ({owner}): the operator leaves \
                 it untouched and writes no worker ConfigMap; delete or rename that ConfigMap, or \
                 rename this object (config pushes to the ready pods go on)"
            ));
        }
    }
    // The token names this target only: workers of another namespace or workload refuse it.
    let audience = wire::push_audience(ns, &eff.metrics.workload);
    let token = || async {
        match ctx.tokens.token(&ctx.client, &audience).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot mint the config push token");
                None
            }
        }
    };
    let doc = act::push::Document::worker(&config).map_err(ReconcileError::Render)?;
    let report = ctx
        .pusher
        .sync(
            pods,
            &doc,
            &wire::admin_server_name(ns, &eff.metrics.workload),
            token,
            &*ctx.metrics,
            // Metrics-only workers (`spec.worker.push: Disabled`) take no pushes.
            quiet || !eff.worker.push,
        )
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
        not_owned,
        notes,
    ))
}

/// The hash a status names `hash`'s content by: `current` when the status carries the legacy
/// (0.1) hash of the same content, else `hash` as it is.
pub(crate) fn same_content<'a>(hash: &'a str, legacy: &str, current: &'a str) -> &'a str {
    if hash == legacy { current } else { hash }
}

/// The condition reason (`Ready` and `ConfigInSync`) and event reason of a worker ConfigMap
/// name taken by a ConfigMap the object does not own.
pub const CONFIGMAP_NOT_OWNED: &str = "ConfigMapNotOwned";

/// The worker ConfigMap's name is taken by a ConfigMap the object does not own (`message`, from
/// [`config_step`]): `ConfigInSync` and `Ready` False with reason [`CONFIGMAP_NOT_OWNED`] (the
/// pods that mount it would read someone else's data; Argo CD: Degraded, kstatus: InProgress),
/// and a Warning event naming the ConfigMap when the message is new. Nothing is retried sooner
/// than the regular requeue: only a person can resolve it.
fn report_not_owned(
    status: &mut WorkerBackpressureStatus,
    previous: Option<&WorkerBackpressureStatus>,
    message: String,
    notes: &mut Vec<Note>,
    now: Timestamp,
) {
    let problem = Problem {
        conditions: &[cond::CONFIG_IN_SYNC, cond::READY],
        reason: CONFIGMAP_NOT_OWNED,
        action: "WriteConfigMap",
        message,
    };
    problem.report(status, previous, notes, now);
}

/// A problem only a person can resolve: its conditions set False with `reason` and `message`,
/// and a Warning event when the first condition did not already say exactly that.
struct Problem<'a> {
    conditions: &'a [&'a str],
    reason: &'static str,
    action: &'static str,
    message: String,
}

impl Problem<'_> {
    fn report(
        self,
        status: &mut WorkerBackpressureStatus,
        previous: Option<&WorkerBackpressureStatus>,
        notes: &mut Vec<Note>,
        now: Timestamp,
    ) {
        let reported = previous
            .and_then(|p| p.conditions.as_deref())
            .and_then(|c| {
                c.iter()
                    .find(|c| Some(&c.type_.as_str()) == self.conditions.first())
            })
            .is_some_and(|c| c.reason == self.reason && c.message == self.message);
        if !reported {
            notes.push(Note {
                warning: true,
                reason: self.reason.into(),
                action: self.action.into(),
                message: self.message.clone(),
            });
        }
        for type_ in self.conditions {
            decide::set_condition(
                status,
                previous,
                type_,
                false,
                self.reason,
                self.message.clone(),
                now,
            );
        }
    }
}

/// The condition reason (`Ready`) and event reason of an `Active` object whose target another
/// autoscaler also scales.
pub const AUTOSCALER_CONFLICT: &str = "AutoscalerConflict";

/// In `Active` mode, the HPAs and ScaledObjects that scale the same workload (from the index
/// the watches keep, no request): if there are any, the object acts as in DryRun (decides and
/// reports, writes nothing to the target, no config push) so that two autoscalers never fight
/// over the replicas, and the message for [`report_conflict`] is returned. `Guard` mode is how
/// to keep such an autoscaler.
fn autoscaler_conflict(ctx: &Context, ns: &str, eff: &mut Effective) -> Option<String> {
    if eff.mode != Mode::Active {
        return None;
    }
    let others = ctx.autoscalers.of(ns, &eff.target_ref);
    if others.is_empty() {
        return None;
    }
    let t = &eff.target_ref;
    if !eff.dry_run {
        eff.dry_run = true;
        eff.dry_run_by = Some(format!("{} scales the same target", others.join(", ")));
    }
    Some(format!(
        "{} also scales {}/{}: the operator writes nothing to it while it does (as in DryRun); \
         keep it under the operator with mode Guard and spec.guard naming it, or delete it",
        others.join(", "),
        t.kind,
        t.name
    ))
}

/// `Ready` False with reason [`AUTOSCALER_CONFLICT`], and a Warning event when the message is
/// new.
fn report_conflict(
    status: &mut WorkerBackpressureStatus,
    previous: Option<&WorkerBackpressureStatus>,
    message: String,
    notes: &mut Vec<Note>,
    now: Timestamp,
) {
    let problem = Problem {
        conditions: &[cond::READY],
        reason: AUTOSCALER_CONFLICT,
        action: "Classify",
        message,
    };
    problem.report(status, previous, notes, now);
}

/// Step 4 (no client): what was observed, as [`decide::decide`] reads it, and its decision
/// (counted in the metrics).
fn decide_step(
    wbp: &WorkerBackpressure,
    ctx: &Context,
    eff: &Effective,
    target: &TargetState,
    observed: &Observed,
    config: ConfigStatus,
    now: Timestamp,
) -> decide::Decision {
    let observation = Observation {
        now,
        generation: wbp.metadata.generation,
        current_replicas: target.spec_replicas,
        ready_pods: observed.pods.iter().filter(|p| p.ready).count() as i32,
        fleet: observed.fleet.as_ref().cloned().unwrap_or_default(),
        // Messages are built without credentials; this is the last guard before status.
        metrics_error: observed
            .fleet
            .as_ref()
            .err()
            .map(|e| redact_text(&e.to_string())),
        config: Some(config),
    };
    let decision = decide::decide(eff, wbp.status.as_ref(), &observation);
    ctx.metrics.decision(decision.regime, decision.action);
    decision
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
    act::scale::write_scale(&ctx.client, ns, &target.resource, &eff.target_ref.name, to)
        .await
        .map_err(ReconcileError::Scale)?;
    tracing::info!(
        namespace = ns, name = %wbp.name_any(), from = target.spec_replicas, to,
        action = decision.action.as_str(), reason = %decision.reason, "scaled target"
    );
    Ok(())
}

/// Retries a failed reconcile with exponential backoff: a third of the interval, doubling per
/// consecutive failure of the same object, at most five minutes.
pub fn error_policy(
    wbp: Arc<WorkerBackpressure>,
    err: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    let uid = wbp.metadata.uid.clone().unwrap_or_default();
    let failures = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(uid).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    let delay = error_backoff(ctx.settings.requeue_interval, failures);
    tracing::warn!(
        name = %wbp.name_any(), namespace = ?wbp.namespace(), error = %errors::Chain(err), failures,
        retry_in = ?delay, "reconcile error"
    );
    Action::requeue(jitter(delay, &wbp))
}

/// The retry delay after `failures` consecutive failures.
pub fn error_backoff(interval: Duration, failures: u32) -> Duration {
    let base = (interval / 3).max(Duration::from_millis(100));
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(Duration::from_secs(300))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_backoff_doubles_up_to_five_minutes() {
        let i = Duration::from_secs(15);
        assert_eq!(error_backoff(i, 1), Duration::from_secs(5));
        assert_eq!(error_backoff(i, 2), Duration::from_secs(10));
        assert_eq!(error_backoff(i, 3), Duration::from_secs(20));
        assert_eq!(error_backoff(i, 10), Duration::from_secs(300));
        assert_eq!(error_backoff(i, u32::MAX), Duration::from_secs(300));
    }

    fn every_error() -> Vec<ReconcileError> {
        let kube = || kube::Error::TlsRequired;
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        let guard = act::guard::GuardError::Api {
            verb: "patching",
            kind: backpressure_api::v1alpha1::GuardKind::HorizontalPodAutoscaler,
            name: "h".into(),
            source: kube(),
        };
        vec![
            ReconcileError::NoNamespace,
            ReconcileError::Status(kube()),
            ReconcileError::Scale(kube()),
            ReconcileError::ConfigMap(kube()),
            ReconcileError::Render(json),
            ReconcileError::Guard(guard),
            ReconcileError::Finalizer(kube()),
        ]
    }

    #[test]
    fn every_error_has_an_exported_category() {
        let errors = every_error();
        let categories: Vec<&str> = errors.iter().map(ReconcileError::category).collect();
        assert_eq!(categories, ReconcileError::CATEGORIES);
    }

    #[test]
    fn messages_do_not_repeat_their_cause() {
        for e in every_error() {
            let Some(cause) = std::error::Error::source(&e) else {
                continue;
            };
            assert!(
                !e.to_string().contains(&cause.to_string()),
                "{e} repeats its cause"
            );
            let chain = errors::Chain(&e).to_string();
            assert_eq!(
                chain.matches("TLS required").count(),
                usize::from(!matches!(e, ReconcileError::Render(_))),
                "{chain}"
            );
        }
        let guard = every_error().swap_remove(5);
        assert_eq!(
            errors::Chain(&guard).to_string(),
            "guard: patching HorizontalPodAutoscaler h: TLS required but no TLS stack selected"
        );
    }

    #[test]
    fn condition_messages_keep_the_cause_after_the_message() {
        let target = TargetError::Api("Deployment/w".into(), kube::Error::TlsRequired);
        assert_eq!(
            errors::with_cause(&target),
            "reading target Deployment/w: TLS required but no TLS stack selected"
        );
        assert_eq!(target.reason(), "TargetUnreadable");
    }
}
