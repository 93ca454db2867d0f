//! What a run records every sample interval: the queue metrics the lab exposes to Prometheus,
//! the fleet backoff, one sample per run, and the live timeline.

use std::collections::BTreeMap;
use std::path::Path;

use backpressure_api::v1alpha1::WorkerBackpressure;
use backpressure_api::wire::metrics as m;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use super::RunCtx;
use crate::producer::ProducerStats;
use crate::prom;
use crate::queue::Queue;
use crate::record::{BrokerMemory, ConfigSync, KEDA_RUN, Sample};
use crate::scenario::Scenario;
use crate::serve::Exposition;

pub(super) async fn queue_exposition(queues: &[(String, Queue)], workload: &str) -> String {
    let mut e = Exposition::default();
    for (ns, q) in queues {
        let Ok(s) = q.stats().await else { continue };
        let labels = [
            (m::LABEL_NAMESPACE, ns.as_str()),
            (m::LABEL_WORKLOAD, workload),
        ];
        e.sample(
            m::QUEUE_AGE,
            "gauge",
            "Age of the oldest message never delivered.",
            &labels,
            s.oldest_age_secs,
        );
        e.sample(
            m::QUEUE_DEPTH,
            "gauge",
            "Messages waiting (never delivered or waiting for a retry).",
            &labels,
            s.depth() as f64,
        );
        e.sample(
            m::QUEUE_ARRIVALS_TOTAL,
            "counter",
            "Messages that arrived.",
            &labels,
            s.produced as f64,
        );
        e.sample(
            m::QUEUE_COMPLETIONS_TOTAL,
            "counter",
            "Messages acknowledged.",
            &labels,
            s.completed as f64,
        );
        e.sample(
            m::QUEUE_DEAD_LETTERS_TOTAL,
            "counter",
            "Messages moved to the dead-letter stream.",
            &labels,
            s.dead_lettered as f64,
        );
    }
    e.finish()
}

/// Per namespace: the fleet's mean backoff and its failure floor (the mean over the workers
/// that know one, as the operator reads it: `avg(backpressure_failure_floor >= 0)`).
pub(super) async fn fleet_gauges(
    http: &reqwest::Client,
    prom_url: &str,
    workload: &str,
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let backoff = format!(
        "avg by (namespace) ({}{{{}=\"{workload}\"}})",
        m::BACKOFF,
        m::LABEL_WORKLOAD
    );
    let floor = format!(
        "avg by (namespace) ({}{{{}=\"{workload}\"}} >= 0)",
        m::FAILURE_FLOOR,
        m::LABEL_WORKLOAD
    );
    (
        by_namespace(http, prom_url, &backoff).await,
        by_namespace(http, prom_url, &floor).await,
    )
}

async fn by_namespace(http: &reqwest::Client, prom_url: &str, expr: &str) -> BTreeMap<String, f64> {
    prom::query(http, prom_url, expr)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(l, v)| l.get("namespace").map(|ns| (ns.clone(), v)))
        .collect()
}

pub(super) async fn sample(
    client: &kube::Client,
    r: &mut RunCtx,
    t: f64,
    dt: f64,
    workload: &str,
    backoff: Option<f64>,
    failure_floor: Option<f64>,
) -> Sample {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), r.namespace);
    let (replicas, ready) = match deployments.get_opt(workload).await {
        Ok(Some(d)) => (
            d.spec.and_then(|s| s.replicas).unwrap_or(0),
            d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
        ),
        _ => (
            r.record.last().map(|s| s.replicas).unwrap_or(0),
            r.record.last().map(|s| s.ready).unwrap_or(0),
        ),
    };
    let (regime, config, producer_state, producer_sync) = if r.label != KEDA_RUN {
        let wbps: Api<WorkerBackpressure> = Api::namespaced(client.clone(), r.namespace);
        let status = wbps
            .get_opt(workload)
            .await
            .ok()
            .flatten()
            .and_then(|w| w.status);
        let regime = status
            .as_ref()
            .and_then(|s| s.regime)
            .map(|g| g.as_str().to_owned())
            .unwrap_or_else(|| "-".into());
        let producers = status.as_ref().and_then(|s| s.producers.clone());
        let config = status.and_then(|s| s.config).map(|c| ConfigSync {
            in_sync: c.pods_in_sync,
            total: c.pods_total,
        });
        let producer_sync = producers.as_ref().map(|p| ConfigSync {
            in_sync: p.pods_in_sync.unwrap_or(0),
            total: p.pods_total.unwrap_or(0),
        });
        (
            regime,
            config,
            producers.map(|p| p.state.as_str().to_owned()),
            producer_sync,
        )
    } else {
        ("keda".into(), None, None, None)
    };
    let broker = if r.broker {
        r.queue.memory().await.ok().map(|m| BrokerMemory {
            used: m.used,
            peak: m.peak,
        })
    } else {
        None
    };
    let producers = r.producer_stats.as_deref().map(producer_stats);
    let stats = r.queue.stats().await.unwrap_or_default();
    let requests = r.dependency.counters().requests();
    let served = r.dependency.counters().served();
    let load = (requests.saturating_sub(r.last_requests)) as f64 / dt;
    let served_rate = (served.saturating_sub(r.last_served)) as f64 / dt;
    r.last_requests = requests;
    r.last_served = served;
    Sample {
        t,
        regime,
        replicas,
        ready,
        backoff,
        queue_age: stats.oldest_age_secs,
        queue_depth: stats.depth(),
        produced: stats.produced,
        completed: stats.completed,
        dead_lettered: stats.dead_lettered,
        in_stream: stats.in_stream,
        dep_load: load,
        dep_served: served_rate,
        dep_capacity: r.dependency.capacity_now(),
        failed_calls: r.dependency.counters().failed(),
        failure_floor,
        config,
        broker,
        producers,
        producer_state,
        producer_sync,
    }
}

/// The producer pods' counters, summed over the files in `dir` (one per pod; a file being
/// replaced is read on the next sample).
pub(super) fn producer_stats(dir: &Path) -> ProducerStats {
    let all: Vec<ProducerStats> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .filter_map(|p| serde_json::from_slice(&std::fs::read(p).ok()?).ok())
                .collect()
        })
        .unwrap_or_default();
    ProducerStats::sum(&all)
}

/// The live timeline: a progress line, then one line per run.
pub(super) fn timeline(sc: &Scenario, t: f64, runs: &[RunCtx]) -> String {
    let total = sc.duration.secs();
    let frac = (t / total).clamp(0.0, 1.0);
    let width = 30usize;
    let filled = ((frac * width as f64).round() as usize).min(width);
    let bar: String = "#".repeat(filled) + &"-".repeat(width - filled);
    let phase = sc
        .phases
        .iter()
        .rev()
        .find(|p| t >= p.from.secs())
        .map(|p| p.name.as_str())
        .unwrap_or("-");
    let mut out = format!("[{bar}] {t:>4.0}s / {total:.0}s  {phase}");
    for r in runs {
        if let Some(s) = r.record.last() {
            out.push_str(&format!(
                "\n    {:<11} {:<18} replicas {:>2} ready {:>2}  backoff {}  age {:>3.0}s  depth {:>5}  dependency {:>3.0}/{:<3.0} req/s  dlq {:>3}  floor {}",
                r.label,
                s.regime,
                s.replicas,
                s.ready,
                s.backoff
                    .map(|b| format!("{b:.2}"))
                    .unwrap_or_else(|| "  - ".into()),
                s.queue_age,
                s.queue_depth,
                s.dep_load,
                s.dep_capacity,
                s.dead_lettered,
                s.failure_floor
                    .map(|f| format!("{f:.2}"))
                    .unwrap_or_else(|| "-".into())
            ));
            if s.producers.is_some() || s.broker.is_some() {
                let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
                let p = s.producers.as_ref();
                out.push_str(&format!(
                    "\n    {:<11} producers {:<9} gate {:<9} waiting {:>5}  refused by broker {:>4}  broker memory {}",
                    "",
                    s.producer_state.as_deref().unwrap_or("-"),
                    p.map(|p| p.gate.as_str()).unwrap_or("-"),
                    p.map(|p| p.waiting).unwrap_or(0),
                    p.map(|p| p.refused_by_broker).unwrap_or(0),
                    match (s.broker, sc.queue.max_memory) {
                        (Some(b), Some(max)) => format!("{:.2}/{:.2} MiB", mib(b.used), mib(max.0)),
                        (Some(b), None) => format!("{:.2} MiB", mib(b.used)),
                        (None, _) => "-".into(),
                    }
                ));
            }
        }
    }
    out
}
