//! The comparison run's autoscaler: the simulator's KEDA queue-age comparator (the HPA
//! algorithm, ported) driving `/scale`.

use std::time::Duration;

use backpressure_api::wire::metrics as m;
use backpressure_sim::autoscaler::{Autoscaler as _, Hpa, Observation};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;

use super::HPA_RUN_NS;
use crate::prom;

/// The comparison scaler: every `period`, the KEDA queue-age comparator on the queue age from
/// Prometheus (a failed query is a failed metric fetch, no series an empty result), the
/// Deployment's `spec.replicas`, `status.replicas` and ready pods (`status.readyReplicas`, the
/// count the HPA's replica calculator multiplies for a `Value` target), with the lab's time in
/// seconds; writes `/scale` when the replicas change.
pub(super) async fn hpa_loop(
    client: kube::Client,
    http: reqwest::Client,
    prom_url: String,
    workload: String,
    mut scaler: Hpa,
    t0: Instant,
    period: Duration,
) {
    let api: Api<Deployment> = Api::namespaced(client, HPA_RUN_NS);
    let expr = format!(
        "max({}{{{}=\"{HPA_RUN_NS}\",{}=\"{workload}\"}})",
        m::QUEUE_AGE,
        m::LABEL_NAMESPACE,
        m::LABEL_WORKLOAD
    );
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let answer = prom::query(&http, &prom_url, &expr).await;
        let scrape_failed = answer.is_err();
        let age = answer.ok().and_then(|v| v.first().map(|(_, v)| *v));
        let Ok(deployment) = api.get(&workload).await else {
            continue;
        };
        let now = t0.elapsed().as_secs_f64();
        let status = deployment.status.as_ref();
        let obs = Observation {
            now,
            replicas: count(deployment.spec.and_then(|s| s.replicas)),
            ready_pods: count(status.and_then(|s| s.ready_replicas)),
            status_replicas: count(status.and_then(|s| s.replicas)),
            queue_age: age,
            scrape_failed,
            sampled_at: now,
            ..Observation::default()
        };
        let decision = scaler.decide(&obs);
        tracing::debug!(t = now, desired = decision.desired, reason = %decision.reason, "queue-age scaler");
        if decision.desired != obs.replicas {
            let patch = serde_json::json!({"spec": {"replicas": decision.desired}});
            if let Err(e) = api
                .patch_scale(&workload, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(error = %e, "queue-age scaler: scale failed");
            }
        }
    }
}
