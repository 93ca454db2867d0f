//! The precedence layers (the object's spec, then each matching policy's defaults) and the
//! [`Resolver`] that picks each field from the first layer that has it, else the built-in
//! default, collecting every error on the way.

use std::time::Duration;

use backpressure_api::duration::{Duration as ApiDuration, MAX_SPEC_DURATION};
use backpressure_api::v1alpha1::{
    MetricsSpec, Mode, ProducersSpec, QueryOverrides, QueueExporter, ScalingSpec,
    WorkerBackpressureSpec, WorkerSpec,
};

use super::{FieldError, PolicyInput, QuerySource};

/// Where a layer's values come from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Source<'a> {
    Object,
    Policy(&'a str),
}

impl Source<'_> {
    pub(super) fn field(self, path: &str) -> String {
        match self {
            Source::Object => format!("spec.{path}"),
            Source::Policy(name) => format!("{POLICY_PREFIX}{name}: spec.defaults.{path}"),
        }
    }
}

/// One layer of the precedence: the object's spec or one policy's defaults.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layer<'a> {
    pub(super) source: Source<'a>,
    pub(super) mode: Option<Mode>,
    pub(super) worker: Option<&'a WorkerSpec>,
    pub(super) metrics: Option<&'a MetricsSpec>,
    pub(super) scaling: Option<&'a ScalingSpec>,
    pub(super) producers: Option<&'a ProducersSpec>,
    /// `spec.queue.exporter` or `spec.defaults.queue.exporter`.
    pub(super) queue_exporter: Option<&'a QueueExporter>,
    /// `spec.queue.staleAfter` or `spec.defaults.queue.staleAfter`.
    pub(super) queue_stale_after: Option<&'a ApiDuration>,
}

/// A resolved value and where it came from (for error messages).
#[derive(Debug, Clone)]
pub(super) struct Picked<T> {
    pub(super) value: T,
    pub(super) from: String,
}

impl<T> Picked<T> {
    /// Whether the value comes from a policy's defaults (platform input), as [`Source::field`]
    /// names it.
    pub(super) fn is_from_policy(&self) -> bool {
        self.from.starts_with(POLICY_PREFIX)
    }
}

impl<T> Picked<T> {
    /// The value when some layer set it, `None` when it is the built-in default.
    pub(super) fn set(self) -> Option<T> {
        (!self.from.starts_with(DEFAULT_PREFIX)).then_some(self.value)
    }
}

const POLICY_PREFIX: &str = "BackpressurePolicy ";
const DEFAULT_PREFIX: &str = "built-in default of ";

/// Picks values through the layers and collects the errors found.
pub(super) struct Resolver<'a> {
    pub(super) layers: Vec<Layer<'a>>,
    pub(super) errors: Vec<FieldError>,
}

impl<'a> Resolver<'a> {
    /// The layers of `spec` and of the `policies` (in precedence order) that have defaults.
    pub(super) fn new(spec: &'a WorkerBackpressureSpec, policies: &[PolicyInput<'a>]) -> Self {
        let mut layers = vec![Layer {
            source: Source::Object,
            mode: spec.mode,
            worker: spec.worker.as_ref(),
            metrics: spec.metrics.as_ref(),
            scaling: spec.scaling.as_ref(),
            producers: spec.producers.as_ref(),
            queue_exporter: spec.queue.as_ref().and_then(|q| q.exporter.as_ref()),
            queue_stale_after: spec.queue.as_ref().and_then(|q| q.stale_after.as_ref()),
        }];
        for p in policies {
            if let Some(defaults) = &p.spec.defaults {
                layers.push(Layer {
                    source: Source::Policy(p.name),
                    mode: defaults.mode,
                    worker: defaults.worker.as_ref(),
                    metrics: defaults.metrics.as_ref(),
                    scaling: defaults.scaling.as_ref(),
                    producers: defaults.producers.as_ref(),
                    queue_exporter: defaults.queue.as_ref().and_then(|q| q.exporter.as_ref()),
                    queue_stale_after: defaults.queue.as_ref().and_then(|q| q.stale_after.as_ref()),
                });
            }
        }
        Resolver {
            layers,
            errors: Vec::new(),
        }
    }

    /// The first layer that has the field, else the built-in default.
    pub(super) fn value<T>(
        &self,
        path: &str,
        get: impl Fn(&Layer<'a>) -> Option<T>,
        default: T,
    ) -> Picked<T> {
        for layer in &self.layers {
            if let Some(value) = get(layer) {
                return Picked {
                    value,
                    from: layer.source.field(path),
                };
            }
        }
        Picked {
            value: default,
            from: format!("{DEFAULT_PREFIX}spec.{path}"),
        }
    }

    /// Like [`Resolver::value`] for durations; an unparsable duration, or one longer than
    /// [`MAX_SPEC_DURATION`], is an error (and the default stands in so that resolution can go
    /// on and report every problem).
    pub(super) fn duration(
        &mut self,
        path: &str,
        get: impl Fn(&Layer<'a>) -> Option<&'a ApiDuration>,
        default: Duration,
    ) -> Picked<Duration> {
        for layer in &self.layers {
            if let Some(text) = get(layer) {
                let from = layer.source.field(path);
                return match text.get() {
                    Ok(value) if value > MAX_SPEC_DURATION => {
                        self.errors.push(FieldError {
                            field: from.clone(),
                            message: format!("duration {text} is longer than the maximum of 24h"),
                        });
                        Picked {
                            value: default,
                            from,
                        }
                    }
                    Ok(value) => Picked { value, from },
                    Err(e) => {
                        self.errors.push(FieldError {
                            field: from.clone(),
                            message: e.to_string(),
                        });
                        Picked {
                            value: default,
                            from,
                        }
                    }
                };
            }
        }
        Picked {
            value: default,
            from: format!("{DEFAULT_PREFIX}spec.{path}"),
        }
    }

    /// A PromQL override: the first layer with a non-blank query and where it came from, else
    /// none (the default query of the wire contract).
    pub(super) fn query(
        &self,
        path: &str,
        get: fn(&QueryOverrides) -> Option<&String>,
    ) -> Option<(String, QuerySource)> {
        self.layers.iter().find_map(|l| {
            let q = get(l.metrics?.queries.as_ref()?).filter(|q| !q.trim().is_empty())?;
            Some((
                q.clone(),
                QuerySource {
                    field: l.source.field(path),
                    tenant: matches!(l.source, Source::Object),
                },
            ))
        })
    }

    pub(super) fn error(&mut self, field: &str, message: String) {
        self.errors.push(FieldError {
            field: field.to_owned(),
            message,
        });
    }
}
