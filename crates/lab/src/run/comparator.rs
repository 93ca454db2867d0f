//! The comparison run's autoscaler: real KEDA. The lab creates one ScaledObject for the
//! comparison workload; KEDA creates the HPA, its metrics adapter serves the trigger's value
//! through the aggregation layer, and the HPA controller in kube-controller-manager writes
//! `/scale`. Nothing in the lab computes the comparison's replicas.

use backpressure_api::wire::metrics as m;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::KEDA_RUN_NS;
use crate::queue::GROUP;
use crate::scenario::{KedaTrigger, Scenario};

/// The ScaledObject's name (KEDA names its HPA `keda-hpa-<name>`).
pub(super) const SCALED_OBJECT: &str = "comparison";

/// Where the comparison's trigger reads from.
pub(super) struct Sources<'a> {
    /// Prometheus (`QueueAge`).
    pub prometheus: &'a str,
    /// The comparison run's Redis (`redis://127.0.0.1:<port>`, `LagCount`).
    pub redis_url: &'a str,
    /// The comparison run's stream key (`LagCount`).
    pub stream: &'a str,
}

/// The ScaledObject of the comparison run, as a KEDA user would write it: the trigger of
/// `sc.keda`, the operator run's replica bounds, no `advanced` section (so KEDA's HPA runs
/// without `behavior`, with the controller's defaults scaled by the flags).
pub(super) fn scaled_object(sc: &Scenario, workload: &str, src: &Sources<'_>) -> Value {
    let (min, max) = sc.replica_bounds();
    let trigger = match sc.keda.trigger {
        KedaTrigger::QueueAge => json!({
            "type": "prometheus",
            "metricType": "Value",
            "metadata": {
                "serverAddress": src.prometheus,
                "query": format!(
                    "max({}{{{}=\"{KEDA_RUN_NS}\",{}=\"{workload}\"}})",
                    m::QUEUE_AGE,
                    m::LABEL_NAMESPACE,
                    m::LABEL_WORKLOAD
                ),
                "threshold": format!("{}", sc.keda.target_queue_age.secs()),
            },
        }),
        KedaTrigger::LagCount => {
            let address = src
                .redis_url
                .trim_start_matches("redis://")
                .trim_end_matches('/');
            json!({
                "type": "redis-streams",
                "metadata": {
                    "address": address,
                    "stream": src.stream,
                    "consumerGroup": GROUP,
                    "lagCount": sc.keda.lag_count.to_string(),
                },
            })
        }
    };
    json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": SCALED_OBJECT, "namespace": KEDA_RUN_NS},
        "spec": {
            "scaleTargetRef": {"name": workload},
            "minReplicaCount": min.max(1),
            "maxReplicaCount": max,
            "pollingInterval": 1,
            "triggers": [trigger],
        },
    })
}

/// Creates the comparison's ScaledObject.
pub(super) async fn start(
    client: &kube::Client,
    sc: &Scenario,
    workload: &str,
    src: &Sources<'_>,
) -> Result<(), kube::Error> {
    let ar = kube::discovery::ApiResource {
        group: "keda.sh".into(),
        version: "v1alpha1".into(),
        api_version: "keda.sh/v1alpha1".into(),
        kind: "ScaledObject".into(),
        plural: "scaledobjects".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), KEDA_RUN_NS, &ar);
    let obj: DynamicObject = serde_json::from_value(scaled_object(sc, workload, src))
        .map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

/// The real HPA's decisions in this run as a trace for the simulator's port (see
/// [`crate::hpa_trace`]).
pub(super) fn trace(
    sc: &Scenario,
    env: &backpressure_envtest::TestEnv,
    observed: &crate::hpa_trace::Observed,
    t0_unix: f64,
) -> Value {
    let (min, max) = sc.replica_bounds();
    let (target_type, target_milli) = match sc.keda.trigger {
        KedaTrigger::QueueAge => (
            "Value",
            (sc.keda.target_queue_age.secs() * 1000.0).round() as i64,
        ),
        KedaTrigger::LagCount => ("AverageValue", i64::from(sc.keda.lag_count) * 1000),
    };
    let cfg = crate::hpa_trace::TraceConfig {
        min: min.max(1),
        max,
        target_type,
        target_milli,
        tolerance: sc.keda.tolerance,
        downscale_secs: sc.keda.downscale_stabilization.secs(),
        source: format!(
            "recorded by backpressure-lab ({}, {}): kube-controller-manager {} HPA controller, KEDA {}",
            sc.name,
            sc.keda.trigger.label(),
            backpressure_envtest::KUBERNETES_VERSION,
            backpressure_envtest::KEDA_VERSION
        ),
        description: format!(
            "The HPA KEDA created for the lab's comparison run of scenario {}: every sync of \
             the HPA controller (sync period {}s), the metric KEDA's adapter served for it, the \
             pods the lab saw ready, and the replicas the controller left.",
            sc.name,
            sc.keda.sync_period.secs()
        ),
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    crate::hpa_trace::build(
        &cfg,
        &read(env.hpa_controller_log()),
        &read(env.keda_adapter_log()),
        observed,
        KEDA_RUN_NS,
        &format!("keda-hpa-{SCALED_OBJECT}"),
        SCALED_OBJECT,
        t0_unix,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> Sources<'static> {
        Sources {
            prometheus: "http://127.0.0.1:9090",
            redis_url: "redis://127.0.0.1:6400",
            stream: "lab-keda:stream",
        }
    }

    #[test]
    fn queue_age_is_a_prometheus_value_trigger_at_the_target_age() {
        let sc = Scenario::load("outage-and-recovery").unwrap();
        let so = scaled_object(&sc, "export-worker", &src());
        let t = &so["spec"]["triggers"][0];
        assert_eq!(t["type"], "prometheus");
        assert_eq!(t["metricType"], "Value");
        assert_eq!(t["metadata"]["threshold"], "10");
        assert!(
            t["metadata"]["query"]
                .as_str()
                .unwrap()
                .contains("namespace=\"lab-keda\",workload=\"export-worker\""),
            "{t}"
        );
        assert_eq!(so["spec"]["minReplicaCount"], 2);
        assert_eq!(so["spec"]["maxReplicaCount"], 10);
        assert!(so["spec"].get("advanced").is_none(), "KEDA's defaults");
    }

    #[test]
    fn lag_count_reads_the_comparison_stream_and_group() {
        let mut sc = Scenario::load("outage-and-recovery").unwrap();
        sc.keda.trigger = KedaTrigger::LagCount;
        sc.keda.lag_count = 30;
        let so = scaled_object(&sc, "export-worker", &src());
        let t = &so["spec"]["triggers"][0];
        assert_eq!(t["type"], "redis-streams");
        assert_eq!(t["metadata"]["address"], "127.0.0.1:6400");
        assert_eq!(t["metadata"]["stream"], "lab-keda:stream");
        assert_eq!(t["metadata"]["consumerGroup"], GROUP);
        assert_eq!(t["metadata"]["lagCount"], "30");
        assert!(
            t.get("metricType").is_none(),
            "AverageValue, KEDA's default"
        );
    }
}
