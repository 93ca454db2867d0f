//! Observation (I/O): the target through `/scale`, its pods, and the fleet metrics.

pub mod owners;
pub mod prometheus;
pub mod promql;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::observe::prometheus::{MetricsHub, PromAuth, QueryError};
use crate::observe::promql::{MetricKind, Sample};
use backpressure_core::resolve::EffectiveMetrics;

pub use backpressure_core::decide::FleetMetrics;

/// Why metrics could not be read (as opposed to being unknown).
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// No Prometheus address in the object, its policies or the operator's flags.
    #[error(
        "no Prometheus address: set spec.metrics.prometheus.address or the operator's --prometheus-url"
    )]
    NoAddress,
    /// The auth Secret could not be read.
    #[error("reading Prometheus credentials from Secret {0}: {1}")]
    Secret(String, String),
    /// A query failed.
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// Reads the auth Secret named by `secretRef` (keys `token`, or `username` and `password`).
pub async fn prometheus_auth(
    client: &kube::Client,
    namespace: &str,
    metrics: &EffectiveMetrics,
) -> Result<PromAuth, MetricsError> {
    let Some(secret_ref) = &metrics.secret_ref else {
        return Ok(PromAuth::None);
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api
        .get(&secret_ref.name)
        .await
        .map_err(|e| MetricsError::Secret(secret_ref.name.clone(), e.to_string()))?;
    let data = secret.data.unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
    };
    if let Some(token) = get("token") {
        return Ok(PromAuth::Bearer(token));
    }
    match (get("username"), get("password")) {
        (Some(username), Some(password)) => Ok(PromAuth::Basic { username, password }),
        _ => Err(MetricsError::Secret(
            secret_ref.name.clone(),
            "expected key `token`, or keys `username` and `password`".into(),
        )),
    }
}

/// Reads the fleet metrics of `namespace`/`metrics.workload` from the shared hub at `now_unix`.
/// A failed query fails the whole read (the fallback applies); NaN, missing and stale values
/// are `None`.
pub async fn read_fleet(
    hub: &MetricsHub,
    address: &str,
    auth: &PromAuth,
    namespace: &str,
    metrics: &EffectiveMetrics,
    now_unix: f64,
    max_age: Duration,
) -> Result<FleetMetrics, MetricsError> {
    let key = (namespace.to_owned(), metrics.workload.clone());
    let mut out = FleetMetrics::default();
    let queries = MetricKind::ALL.map(|kind| {
        let q = kind.query(Some(&metrics.queries), metrics.rate_window);
        async move {
            let r: Result<Arc<_>, QueryError> = hub
                .get(kind, address, auth, &q, metrics.timeout, max_age)
                .await;
            (kind, r)
        }
    });
    for (kind, result) in futures::future::join_all(queries).await {
        // The failure floor is optional (older workers do not export it): a failed query
        // reads as no floor rather than failing the observation.
        let batch = match (kind, result) {
            (MetricKind::FailureFloor, Err(_)) => continue,
            (_, r) => r?,
        };
        let value = batch
            .get(&key)
            .and_then(|s: &Sample| s.fresh_value(now_unix, metrics.stale_after));
        match kind {
            MetricKind::Backoff => out.backoff = value,
            MetricKind::FailureRate => out.failure_rate = value,
            MetricKind::QueueAge => out.queue_age = value,
            MetricKind::QueueDepth => out.queue_depth = value,
            MetricKind::ArrivalRate => out.arrival_rate = value,
            MetricKind::CompletionRate => out.completion_rate = value,
            MetricKind::FailureFloor => out.failure_floor = value,
        }
    }
    Ok(out)
}
