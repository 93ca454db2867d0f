//! Recording the real HPA's decisions in the comparison run, as a trace the simulator's port
//! of the HPA controller replays step by step (`crates/sim/traces/`,
//! [`backpressure_sim::autoscaler::hpa::trace`]).
//!
//! Per sync of KEDA's HPA the trace needs what the controller read and what it wrote:
//!
//! | field | source |
//! |---|---|
//! | `t`, `desired`, `specReplicas` | the HPA controller's log (`-v=4`): "Successfully rescaled" (`currentReplicas`, `desiredReplicas`) or "Decided not to scale" (`desiredReplicas` = the current replicas) |
//! | `metric` | KEDA's metrics adapter log (debug): the "Receiving metrics" line answering that sync's request (the last one at or before the decision) |
//! | `readyPods`, `statusReplicas` | the lab's own watches of the workload's pods (Running with Ready=True, what the controller counts) and of the Deployment's `status.replicas`, as they were when the metric was served |
//!
//! The watches and the controller's informers see the same API server events a few
//! milliseconds apart; a step is only as exact as that, so a recorded trace is checked by
//! replaying it once before it is committed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::{Value, json};

/// Seconds since the epoch, now.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What the lab saw of the comparison workload: (unix seconds, ready pods) and (unix seconds,
/// `status.replicas`), each appended on change.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    ready: Arc<Mutex<Vec<(f64, i32)>>>,
    status: Arc<Mutex<Vec<(f64, i32)>>>,
}

fn is_ready(p: &Pod) -> bool {
    let Some(st) = p.status.as_ref() else {
        return false;
    };
    st.phase.as_deref() == Some("Running")
        && st
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn push(v: &Mutex<Vec<(f64, i32)>>, n: i32) {
    if let Ok(mut v) = v.lock()
        && v.last().is_none_or(|(_, last)| *last != n)
    {
        v.push((unix_now(), n));
    }
}

fn value_at(v: &Mutex<Vec<(f64, i32)>>, t: f64) -> Option<i32> {
    let v = v.lock().ok()?;
    v.iter().rev().find(|(at, _)| *at <= t).map(|(_, n)| *n)
}

impl Observed {
    /// Watches the pods labelled `app=<workload>` and Deployment `workload` in `namespace`
    /// until the returned tasks are aborted.
    pub fn watch(
        client: kube::Client,
        namespace: &str,
        workload: &str,
    ) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        let me = Self::default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let ready = me.ready.clone();
        let cfg = watcher::Config::default().labels(&format!("app={workload}"));
        let pod_task = tokio::spawn(async move {
            let mut seen: BTreeMap<String, bool> = BTreeMap::new();
            let mut stream = watcher(pods, cfg).boxed();
            let mut init: Option<BTreeMap<String, bool>> = None;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(p)) => {
                        seen.insert(p.metadata.name.clone().unwrap_or_default(), is_ready(&p));
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        seen.remove(&p.metadata.name.clone().unwrap_or_default());
                    }
                    Ok(watcher::Event::Init) => init = Some(BTreeMap::new()),
                    Ok(watcher::Event::InitApply(p)) => {
                        if let Some(i) = init.as_mut() {
                            i.insert(p.metadata.name.clone().unwrap_or_default(), is_ready(&p));
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(i) = init.take() {
                            seen = i;
                        }
                    }
                    Err(_) => continue,
                }
                let n = seen.values().filter(|r| **r).count();
                push(&ready, i32::try_from(n).unwrap_or(i32::MAX));
            }
        });
        let deployments: Api<Deployment> = Api::namespaced(client, namespace);
        let status = me.status.clone();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={workload}"));
        let dep_task = tokio::spawn(async move {
            let mut stream = watcher(deployments, cfg).boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = ev {
                    let n = d.status.and_then(|s| s.replicas).unwrap_or(0);
                    push(&status, n);
                }
            }
        });
        (me, vec![pod_task, dep_task])
    }
}

/// One decision of the HPA controller for one HPA.
#[derive(Clone, Debug, PartialEq)]
struct Decision {
    t: f64,
    current: i32,
    desired: i32,
    /// The replica calculator's result the controller logged before it ("Proposing desired
    /// replicas"), absent for the special cases that skip the metric.
    proposed: Option<i32>,
}

/// The metric the adapter served at `t` (milli-units; `None` if it served an error or nothing).
#[derive(Clone, Debug, PartialEq)]
struct Served {
    t: f64,
    milli: Option<i64>,
}

/// `I1201 21:55:01.123456 ...`: seconds since the epoch (klog has no year: this year, UTC).
fn klog_time(line: &str, year: i32) -> Option<f64> {
    let b = line.as_bytes();
    if b.len() < 21 || !matches!(b[0], b'I' | b'W' | b'E') {
        return None;
    }
    let month: u32 = line.get(1..3)?.parse().ok()?;
    let day: u32 = line.get(3..5)?.parse().ok()?;
    let time = line.get(6..21)?;
    let hms: Vec<&str> = time.split(':').collect();
    let [h, m, s] = hms[..] else { return None };
    let date = k8s_openapi::jiff::civil::date(
        i16::try_from(year).ok()?,
        i8::try_from(month).ok()?,
        i8::try_from(day).ok()?,
    );
    let secs: f64 = s.parse().ok()?;
    let whole = secs.trunc();
    let dt = date.at(
        h.parse().ok()?,
        m.parse().ok()?,
        whole as i8,
        ((secs - whole) * 1e9).round() as i32,
    );
    let ts = dt.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).ok()?;
    Some(ts.timestamp().as_nanosecond() as f64 / 1e9)
}

/// `key=value` or `key="value"` from a structured klog line.
fn klog_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        quoted.split('"').next()
    } else {
        rest.split_whitespace().next()
    }
}

/// The decisions about HPA `namespace/hpa` in the controller's log.
fn decisions(log: &str, namespace: &str, hpa: &str, year: i32) -> Vec<Decision> {
    let key = format!("{namespace}/{hpa}");
    let mut out = Vec::new();
    let mut proposed = None;
    for line in log.lines() {
        let Some(t) = klog_time(line, year) else {
            continue;
        };
        if line.contains("\"Proposing desired replicas\"")
            && klog_field(line, "scaleTarget")
                .is_some_and(|s| s.contains(&format!("/{namespace}/")))
        {
            proposed = klog_field(line, "desiredReplicas").and_then(|v| v.parse().ok());
        } else if line.contains("\"Successfully rescaled\"")
            && klog_field(line, "HPA") == Some(&key)
        {
            if let (Some(c), Some(d)) = (
                klog_field(line, "currentReplicas").and_then(|v| v.parse().ok()),
                klog_field(line, "desiredReplicas").and_then(|v| v.parse().ok()),
            ) {
                out.push(Decision {
                    t,
                    current: c,
                    desired: d,
                    proposed: proposed.take(),
                });
            }
        } else if line.contains("\"Decided not to scale\"")
            && klog_field(line, "scaleTarget")
                .is_some_and(|s| s.contains(&format!("/{namespace}/")))
            && let Some(d) = klog_field(line, "desiredReplicas").and_then(|v| v.parse().ok())
        {
            out.push(Decision {
                t,
                current: d,
                desired: d,
                proposed: proposed.take(),
            });
        }
    }
    out
}

/// A quantity as KEDA serves it (`23.361`, `12500m`, `12`, `1k`) in milli-units (decimals
/// past the third are cut: KEDA rounds to milli-units before serving).
fn quantity_milli(q: &str) -> Option<i64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let (num, scale) = match q.chars().last()? {
        'k' => (&q[..q.len() - 1], 1_000i64),
        'M' => (&q[..q.len() - 1], 1_000_000i64),
        'G' => (&q[..q.len() - 1], 1_000_000_000i64),
        _ => (q, 1i64),
    };
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let int: i64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    if !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
    let milli = int
        .checked_mul(1000)?
        .checked_add(frac3.parse::<i64>().ok()?)?;
    let v = milli.checked_mul(scale)?;
    Some(if neg { -v } else { v })
}

/// The metrics the adapter served for ScaledObject `namespace/name`.
fn served(log: &str, namespace: &str, name: &str) -> Vec<Served> {
    let mut out = Vec::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["msg"] != "Receiving metrics"
            || v["scaledObjectName"] != name
            || v["scaledObjectNamespace"] != namespace
        {
            continue;
        }
        let Some(t) = v["ts"]
            .as_str()
            .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(|ts| ts.as_nanosecond() as f64 / 1e9)
        else {
            continue;
        };
        let milli = v["metrics"]["items"].as_array().and_then(|items| {
            items
                .iter()
                .map(|i| i["value"].as_str().and_then(quantity_milli))
                .sum::<Option<i64>>()
                .filter(|_| !items.is_empty())
        });
        out.push(Served { t, milli });
    }
    out
}

/// What the trace's `hpa` section says (KEDA's HPA for the comparison ScaledObject).
#[derive(Clone, Debug)]
pub struct TraceConfig {
    /// `minReplicaCount`.
    pub min: i32,
    /// `maxReplicaCount`.
    pub max: i32,
    /// `Value` or `AverageValue`.
    pub target_type: &'static str,
    /// The target in milli-units.
    pub target_milli: i64,
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-downscale-stabilization`, seconds.
    pub downscale_secs: f64,
    /// Where it was recorded.
    pub source: String,
    /// What it shows.
    pub description: String,
}

/// Builds the trace (JSON in the simulator's format) from the logs and the watches; `t0` is
/// the unix time the steps count from. Syncs without a served metric before them are left
/// out (none in a run where KEDA answered every request).
#[allow(clippy::too_many_arguments)]
pub fn build(
    cfg: &TraceConfig,
    controller_log: &str,
    adapter_log: &str,
    observed: &Observed,
    namespace: &str,
    hpa: &str,
    scaled_object: &str,
    t0: f64,
) -> Value {
    let year = k8s_openapi::jiff::Zoned::now().year();
    let decisions = decisions(controller_log, namespace, hpa, i32::from(year));
    let served = served(adapter_log, namespace, scaled_object);
    let mut steps = Vec::new();
    let mut prev_t = f64::NEG_INFINITY;
    for d in &decisions {
        let Some(m) = served.iter().rev().find(|s| s.t <= d.t && s.t > prev_t) else {
            continue;
        };
        prev_t = d.t;
        let ready = value_at(&observed.ready, m.t).unwrap_or(0);
        let status = value_at(&observed.status, m.t).unwrap_or(0);
        let mut step = json!({
            "t": ((d.t - t0) * 1e6).round() / 1e6,
            "specReplicas": d.current,
            "statusReplicas": status,
            "readyPods": ready,
            "metric": m.milli,
            "desired": d.desired,
        });
        if let Some(p) = d.proposed {
            step["proposed"] = json!(p);
        }
        steps.push(step);
    }
    json!({
        "source": cfg.source,
        "description": cfg.description,
        "hpa": {
            "minReplicas": cfg.min,
            "maxReplicas": cfg.max,
            "target": {"type": cfg.target_type, "milliValue": cfg.target_milli},
            "behavior": null,
            "tolerance": cfg.tolerance,
            "downscaleStabilizationSeconds": cfg.downscale_secs,
        },
        "initialRecommendations": null,
        "steps": steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_lines_give_time_and_fields() {
        let line = r#"I1201 21:55:01.250000   42 horizontal.go:937] "Successfully rescaled" logger="horizontal-pod-autoscaler-controller" HPA="lab-keda/keda-hpa-comparison" currentReplicas=2 desiredReplicas=4 reason="external metric s0-prometheus(...) above target""#;
        let t = klog_time(line, 2026).unwrap();
        let expect = "2026-12-01T21:55:01.25Z"
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .as_nanosecond() as f64
            / 1e9;
        assert!((t - expect).abs() < 1e-6, "{t} {expect}");
        assert_eq!(
            klog_field(line, "HPA"),
            Some("lab-keda/keda-hpa-comparison")
        );
        assert_eq!(klog_field(line, "currentReplicas"), Some("2"));
        let d = decisions(line, "lab-keda", "keda-hpa-comparison", 2026);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].current, d[0].desired), (2, 4));
        assert!(decisions(line, "other", "keda-hpa-comparison", 2026).is_empty());
    }

    #[test]
    fn not_scaling_is_a_decision_at_the_current_replicas() {
        let line = r#"I1201 21:55:04.000001   42 horizontal.go:953] "Decided not to scale" logger="horizontal-pod-autoscaler-controller" scaleTarget="Deployment/lab-keda/export-worker" desiredReplicas=4 lastScaleTime="2026-12-01 21:55:01 +0000 UTC""#;
        let d = decisions(line, "lab-keda", "keda-hpa-comparison", 2026);
        assert_eq!((d[0].current, d[0].desired), (4, 4));
    }

    #[test]
    fn adapter_lines_give_the_served_value_in_milli_units() {
        let log = r#"{"level":"debug","ts":"2026-12-01T21:55:01.2Z","logger":"keda_metrics_adapter.provider","msg":"Receiving metrics","scaledObjectName":"comparison","scaledObjectNamespace":"lab-keda","metrics":{"metadata":{},"items":[{"metricName":"s0-prometheus","metricLabels":null,"timestamp":"2026-12-01T21:55:01Z","value":"12500m"}]}}
{"level":"debug","ts":"2026-12-01T21:55:04.2Z","logger":"keda_metrics_adapter.provider","msg":"Receiving metrics","scaledObjectName":"comparison","scaledObjectNamespace":"lab-keda","metrics":{"metadata":{},"items":[{"metricName":"s0-prometheus","value":"3"}]}}
{"level":"debug","ts":"2026-12-01T21:55:05.2Z","msg":"Receiving metrics","scaledObjectName":"other","scaledObjectNamespace":"lab-keda","metrics":{"items":[{"value":"9"}]}}"#;
        let s = served(log, "lab-keda", "comparison");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].milli, Some(12500));
        assert_eq!(s[1].milli, Some(3000));
        assert_eq!(quantity_milli("2k"), Some(2_000_000));
        assert_eq!(quantity_milli("23.361"), Some(23_361));
        assert_eq!(quantity_milli("0.059"), Some(59));
        assert_eq!(quantity_milli("0.5"), Some(500));
        assert_eq!(quantity_milli("1.5k"), Some(1_500_000));
        assert_eq!(quantity_milli("x"), None);
    }

    #[test]
    fn steps_pair_each_decision_with_the_metric_served_before_it() {
        let observed = Observed::default();
        push(&observed.ready, 2);
        push(&observed.status, 2);
        let t = |s: &str| {
            s.parse::<k8s_openapi::jiff::Timestamp>()
                .unwrap()
                .as_nanosecond() as f64
                / 1e9
        };
        // The watches saw 2 ready pods "now"; shift them before the logs.
        observed.ready.lock().unwrap()[0].0 = t("2026-12-01T21:55:00Z");
        observed.status.lock().unwrap()[0].0 = t("2026-12-01T21:55:00Z");
        let ctl = r#"I1201 21:55:01.250000   42 horizontal.go:937] "Successfully rescaled" logger="x" HPA="lab-keda/keda-hpa-comparison" currentReplicas=2 desiredReplicas=4 reason="r"
I1201 21:55:02.250000   42 horizontal.go:953] "Decided not to scale" logger="x" scaleTarget="Deployment/lab-keda/export-worker" desiredReplicas=4 lastScaleTime="t""#;
        let ad = r#"{"ts":"2026-12-01T21:55:01.2Z","msg":"Receiving metrics","scaledObjectName":"comparison","scaledObjectNamespace":"lab-keda","metrics":{"items":[{"value":"25"}]}}
{"ts":"2026-12-01T21:55:02.2Z","msg":"Receiving metrics","scaledObjectName":"comparison","scaledObjectNamespace":"lab-keda","metrics":{"items":[{"value":"20"}]}}"#;
        let cfg = TraceConfig {
            min: 2,
            max: 10,
            target_type: "Value",
            target_milli: 10_000,
            tolerance: 0.1,
            downscale_secs: 60.0,
            source: "test".into(),
            description: "test".into(),
        };
        let tr = build(
            &cfg,
            ctl,
            ad,
            &observed,
            "lab-keda",
            "keda-hpa-comparison",
            "comparison",
            t("2026-12-01T21:55:00Z"),
        );
        let steps = tr["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0]["metric"], 25000);
        assert_eq!(steps[0]["desired"], 4);
        assert_eq!(steps[0]["readyPods"], 2);
        assert_eq!(steps[1]["specReplicas"], 4);
        assert_eq!(steps[1]["metric"], 20000);
        assert!((steps[1]["t"].as_f64().unwrap() - 2.25).abs() < 1e-6);
    }
}
