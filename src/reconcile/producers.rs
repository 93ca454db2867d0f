//! Producer control ([`backpressure_core::producers`]): read the producer workload's pods,
//! decide the producer state from the same fleet metrics as the worker decision, render the
//! document and push it to the ready producer pods, with a token whose audience names the
//! producer workload only ([`wire::push_audience`]). The document also goes into the object's
//! ConfigMap (written by the config step) for producers that read it from a file.
//!
//! DryRun decides and reports, and pushes nothing. `spec.suspend` (and `mode: Off`) opens the
//! producers: nothing may leave a producer paused without a controller watching over it.

use backpressure_api::v1alpha1::{ProducerMode, ProducerStatus, WorkerBackpressureStatus};
use backpressure_api::wire::{self, ProducerConfig};
use k8s_openapi::jiff::Timestamp;

use crate::act::Note;
use crate::act::push::Document;
use crate::errors;
use crate::observe::target;
use backpressure_core::decide::{self, FleetMetrics};
use backpressure_core::producers;
use backpressure_core::resolve::{self, Effective, EffectiveProducers};

use super::{Context, ReconcileError};

/// What the producer step decided and did, for the config step (the document for the
/// ConfigMap) and for the status.
#[derive(Debug)]
pub struct ProducerOutcome {
    /// The new `status.producers`.
    pub status: ProducerStatus,
    /// The document the producer pods should run.
    pub document: ProducerConfig,
    /// Events.
    pub notes: Vec<Note>,
    /// Why the producer pods cannot be reached (the producer workload unreadable), for the
    /// condition's message.
    pub problem: Option<String>,
}

/// Decides and pushes the producer state, when the object has `spec.producers`.
pub async fn producers_step(
    ctx: &Context,
    ns: &str,
    eff: &Effective,
    fleet: Option<&FleetMetrics>,
    previous: Option<&WorkerBackpressureStatus>,
    now: Timestamp,
) -> Result<Option<ProducerOutcome>, ReconcileError> {
    let Some(spec) = eff.producers.as_ref() else {
        return Ok(None);
    };
    let mut notes = Vec::new();
    let open;
    let spec: &EffectiveProducers = if eff.suspend {
        open = EffectiveProducers {
            mode: ProducerMode::Off,
            ..spec.clone()
        };
        &open
    } else {
        spec
    };
    let prev = previous.and_then(|p| p.producers.as_ref());
    let unknown = FleetMetrics::default();
    let decision = producers::decide_producers(spec, prev, fleet.unwrap_or(&unknown), now);
    notes.extend(decision.event.iter().map(Note::from));
    let mut status = decision.status;

    // The producer pods: the workload's `/scale` selector, as for the worker target.
    let mut problem = None;
    let (pods, workload) = match &spec.target_ref {
        Some(t) => {
            let pods = match target::read_target(&ctx.client, &ctx.kinds, ns, t).await {
                Ok(state) => ctx.pods.pods_of(ns, &state.selector),
                Err(e) => {
                    let message = format!("producer workload: {}", errors::with_cause(&e));
                    let reported = previous
                        .and_then(|p| p.conditions.as_deref())
                        .and_then(|c| c.iter().find(|c| c.type_ == producers::CONDITION))
                        .is_some_and(|c| c.message.ends_with(&message));
                    if !reported {
                        notes.push(Note {
                            warning: true,
                            reason: e.reason().into(),
                            action: "PushProducerState".into(),
                            message: message.clone(),
                        });
                    }
                    problem = Some(message);
                    Vec::new()
                }
            };
            (pods, Some(t.name.clone()))
        }
        None => (Vec::new(), None),
    };
    let ready = pods.iter().filter(|p| p.ready).count() as i32;
    let rendered = producers::render_producer_config(spec, &status, ready, now);
    // A status written by a 0.1 operator names the content by its legacy hash.
    #[allow(deprecated)]
    let legacy = rendered.legacy_hash();
    let generation = resolve::next_config_generation(
        prev.and_then(|p| {
            let hash = super::same_content(p.hash.as_deref()?, &legacy, &rendered.hash);
            Some((hash, p.generation.unwrap_or(0)))
        }),
        &rendered.hash,
        now,
    );
    let document = ProducerConfig {
        generation,
        hash: String::new(),
        ..rendered
    }
    .with_hash();
    let report = match (&workload, Document::producer(&document)) {
        (Some(workload), Ok(doc)) => {
            // The token names the producer workload only: workers and other producers refuse it.
            let audience = wire::push_audience(ns, workload);
            let token = || async {
                match ctx.tokens.token(&ctx.client, &audience).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot mint the producer push token");
                        None
                    }
                }
            };
            ctx.pusher
                .sync(
                    &pods,
                    &doc,
                    &wire::admin_server_name(ns, workload),
                    token,
                    &*ctx.metrics,
                    eff.dry_run,
                )
                .await
        }
        (_, Err(e)) => return Err(ReconcileError::Render(e)),
        (None, _) => Default::default(),
    };
    if let Some((pod, why)) = report.failed.first() {
        notes.push(Note {
            warning: true,
            reason: "ProducerPushFailed".into(),
            action: "PushProducerState".into(),
            message: format!(
                "producer state {} ({}) reached {} of {} ready producer pods; push to {pod} failed: {why} (retried with backoff)",
                status.state.as_str(),
                document.hash,
                report.in_sync,
                report.total
            ),
        });
    }
    status.hash = Some(document.hash.clone());
    status.generation = Some(document.generation);
    status.pods_in_sync = Some(report.in_sync);
    status.pods_total = Some(report.total);
    Ok(Some(ProducerOutcome {
        status,
        document,
        notes,
        problem,
    }))
}

/// Puts the producer outcome into the status: `status.producers` and the `ProducersThrottled`
/// condition (absent without `spec.producers`).
pub fn report_producers(
    status: &mut WorkerBackpressureStatus,
    previous: Option<&WorkerBackpressureStatus>,
    outcome: Option<&ProducerOutcome>,
    now: Timestamp,
) {
    match outcome {
        Some(o) => {
            status.producers = Some(o.status.clone());
            let (value, reason, mut message) = producers::condition(&o.status);
            if let Some(p) = &o.problem {
                message = format!("{message}; {p}");
            }
            decide::set_condition(
                status,
                previous,
                producers::CONDITION,
                value,
                reason,
                message,
                now,
            );
        }
        None => {
            status.producers = None;
            if let Some(c) = status.conditions.as_mut() {
                c.retain(|c| c.type_ != producers::CONDITION);
            }
        }
    }
}
