//! Acting (I/O, idempotent): the target's `/scale`, the worker ConfigMap, config pushes, the
//! guarded HPA or ScaledObject in Guard mode, and events. Nothing is written when nothing changed.

pub mod configmap;
pub mod events;
pub mod guard;
pub mod push;
pub mod scale;

use events::{EventSpec, Recorder};

/// One event to publish about a WorkerBackpressure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning (something needs attention) or Normal.
    pub warning: bool,
    /// CamelCase reason, e.g. `HoldScaleOut`.
    pub reason: String,
    /// What was done (`events.k8s.io/v1` action).
    pub action: String,
    /// The explanation, in words and numbers.
    pub message: String,
}

impl From<&backpressure_core::decide::DecisionEvent> for Note {
    fn from(e: &backpressure_core::decide::DecisionEvent) -> Self {
        Note {
            warning: e.type_ == backpressure_core::decide::EventType::Warning,
            reason: e.reason.to_owned(),
            action: e.action.to_owned(),
            message: e.message.clone(),
        }
    }
}

/// Publishes `notes` on `reference`; failures are logged, never fatal.
pub async fn publish(
    recorder: &Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    notes: &[Note],
) {
    for n in notes {
        let note: String = n.message.chars().take(1024).collect();
        let ev = EventSpec {
            warning: n.warning,
            reason: &n.reason,
            action: &n.action,
            note: Some(&note),
        };
        if let Err(e) = recorder.publish(&ev, reference).await {
            tracing::warn!(error = %e, reason = %n.reason, "could not publish event");
        }
    }
}
