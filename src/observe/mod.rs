//! Observation (I/O): the target through `/scale`, its pods, and the fleet metrics.

pub mod access;
pub mod autoscalers;
pub mod owners;
pub mod pods;
pub mod prometheus;
pub mod promql;
pub mod scope;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use crate::observe::prometheus::{MetricsHub, QueryError};
use crate::observe::promql::{MetricKind, Sample};
use backpressure_core::resolve::{EffectiveMetrics, FieldError};
use backpressure_core::tenancy::FleetQueries;

pub use backpressure_core::decide::FleetMetrics;

/// Why metrics could not be read (as opposed to being unknown). Every message is safe for
/// status and events: addresses appear without credentials, and nothing tells whether an
/// address that was not allowed answers.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// No Prometheus address in the object, its policies or the operator's flags.
    #[error(
        "no Prometheus address: set spec.metrics.prometheus.address or the operator's --prometheus-url"
    )]
    NoAddress,
    /// The address is not on the allowlist: nothing was fetched.
    #[error(
        "{field}: {address} is not an allowed Prometheus address (allowed are the operator's \
         --prometheus-url and --allowed-prometheus-address, and a BackpressurePolicy's \
         metricsAccess.prometheusAddresses); nothing was fetched from it"
    )]
    AddressNotAllowed {
        /// The field that names the address.
        field: &'static str,
        /// The address, without credentials.
        address: String,
    },
    /// The Secret does not consent to being sent to the address.
    #[error(
        "spec.metrics.prometheus.secretRef: Secret {secret} is not sent to {address}: the Secret \
         does not list it in its annotation {annotation}, and the platform does not trust it with \
         credentials; no credentials were sent and nothing was fetched",
        annotation = backpressure_api::v1alpha1::PROMETHEUS_ADDRESSES_ANNOTATION
    )]
    SecretNotAllowed {
        /// The Secret's name.
        secret: String,
        /// The address, without credentials.
        address: String,
    },
    /// The auth Secret could not be read.
    #[error(
        "spec.metrics.prometheus.secretRef: reading Prometheus credentials from Secret {0}: {1}"
    )]
    Secret(String, String),
    /// The operator's credentials file could not be read.
    #[error("reading the operator's Prometheus credentials file {0}: {1}")]
    CredentialsFile(String, std::io::ErrorKind),
    /// Queries in the spec that cannot be run (each names its field).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Rejected(Vec<FieldError>),
    /// A query failed.
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// Reads the fleet metrics of `namespace`/`metrics.workload` from the shared hub at `now_unix`,
/// with `queries` (the overrides and queue presets as
/// [`backpressure_core::tenancy::scoped_queries`] left them). A failed query fails the whole
/// read (the fallback applies), but for the optional failure floor and partition count; NaN,
/// missing and stale values are `None` (the queue kinds are stale after
/// `metrics.queue.stale_after`, the others after `metrics.stale_after`).
pub async fn read_fleet(
    hub: &MetricsHub,
    target: &access::Target,
    namespace: &str,
    metrics: &EffectiveMetrics,
    queries: &FleetQueries,
    now_unix: f64,
    max_age: Duration,
) -> Result<FleetMetrics, MetricsError> {
    let key = (namespace.to_owned(), metrics.workload.clone());
    let mut out = FleetMetrics::default();
    let queries = MetricKind::ALL
        .into_iter()
        .filter_map(|kind| Some((kind, kind.query(queries, metrics.rate_window)?)))
        .map(|(kind, q)| async move {
            let r: Result<Arc<_>, QueryError> = hub
                .get(
                    kind,
                    &target.address,
                    &target.auth,
                    &q,
                    metrics.timeout,
                    max_age,
                )
                .await;
            (kind, r)
        });
    for (kind, result) in futures::future::join_all(queries).await {
        // The failure floor is optional (older workers do not export it), and so is the
        // partition count (no cap while it is unknown): a failed query reads as unknown rather
        // than failing the observation.
        let batch = match (kind, result) {
            (MetricKind::FailureFloor | MetricKind::Partitions, Err(_)) => continue,
            (_, r) => r?,
        };
        let stale_after = if kind.is_queue() {
            metrics.queue.stale_after
        } else {
            metrics.stale_after
        };
        let value = batch
            .get(&key)
            .and_then(|s: &Sample| s.fresh_value(now_unix, stale_after));
        match kind {
            MetricKind::Backoff => out.backoff = value,
            MetricKind::FailureRate => out.failure_rate = value,
            MetricKind::QueueAge => out.queue_age = value,
            MetricKind::QueueDepth => out.queue_depth = value,
            MetricKind::ArrivalRate => out.arrival_rate = value,
            MetricKind::CompletionRate => out.completion_rate = value,
            MetricKind::FailureFloor => out.failure_floor = value,
            MetricKind::Partitions => out.partitions = value,
        }
    }
    Ok(out)
}
