//! Shared by the worker's integration-test binaries.

use backpressure_worker::controller;
use backpressure_worker::metrics::Metrics;
use backpressure_worker::permits::Gate;

/// A gate over the default controller already running at full permits (not a test of the
/// startup ramp), reporting to `metrics`.
pub fn running_gate(metrics: &Metrics) -> Gate {
    let settings = controller::Settings {
        initial_permits: 0,
        ..controller::Settings::default()
    };
    Gate::builder(controller::build(settings, 1))
        .metrics(metrics.clone())
        .build()
}
