//! The observability kit in the chart: the PrometheusRule alerts and the Grafana dashboard.
//!
//! - `helm template` renders the dashboard ConfigMap, the PrometheusRule, the
//!   ValidatingAdmissionPolicies and their bindings; the API server accepts them (server-side
//!   dry run against the real kube-apiserver, except the PrometheusRule whose CRD is not there).
//! - `promtool check rules` (Debian package `prometheus`) accepts the rendered alert groups, and
//!   `promtool test rules` checks that the four alerts of the issue (held too long, metrics
//!   unavailable, config out of sync, ramp aborted repeatedly) and the others fire when they
//!   should and not before.
//! - Every metric name the alerts and the dashboard query is exported: by the operator (the
//!   names of its real registry, `backpressure_operator::metrics::Metrics`), by the workers (the
//!   worker library's registry), or by the queue exporter (the wire contract's queue names);
//!   and METRICS.md documents each of them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use backpressure_api::wire::metrics as wire;
use backpressure_envtest::{TestEnv, bin_dir, repo_root};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::{Value, json};

use crate::common::serial;

const CHART: &str = "charts/backpressure-operator";
const DASHBOARD: &str = "charts/backpressure-operator/dashboards/backpressure-operator.json";
const METRICS_MD: &str = "charts/backpressure-operator/METRICS.md";

/// `helm template` of the chart with `sets`, as JSON documents.
fn helm_template(sets: &[&str]) -> Vec<Value> {
    let helm = bin_dir().unwrap().join("helm");
    let mut cmd = Command::new(&helm);
    cmd.args(["template", "bp"])
        .arg(repo_root().join(CHART))
        .args(["--namespace", "bp-system"])
        .args(["--kube-version", backpressure_envtest::KUBERNETES_VERSION]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    assert!(
        out.status.success(),
        "helm template {sets:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---")
        .filter_map(|doc| {
            let v: serde_yaml::Value = serde_yaml::from_str(doc).unwrap();
            (!v.is_null()).then(|| serde_json::to_value(v).unwrap())
        })
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "promtool not found on PATH: install the Debian package `prometheus` (`make deps` does)"
        )
    })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The rendered PrometheusRule (with every optional alert on).
fn rendered_rule() -> Value {
    let docs = helm_template(&["prometheusRule.enabled=true", "serviceMonitor.enabled=true"]);
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule expected");
    rules[0].clone()
}

/// Every alert and recording rule expression of a PrometheusRule, with its name.
fn rule_exprs(rule: &Value) -> Vec<(String, String)> {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap();
            (name.to_owned(), r["expr"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bp-observability-{}-{}-{name}",
        std::process::id(),
        backpressure_envtest::unique()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_yaml(path: &Path, v: &Value) {
    std::fs::write(path, serde_yaml::to_string(v).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// helm template: the kinds

#[test]
fn helm_renders_the_dashboard_alerts_and_admission_policies() {
    let docs = helm_template(&["prometheusRule.enabled=true"]);
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "ConfigMap",
        "PrometheusRule",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(kind), "no {kind} rendered; kinds: {kinds:?}");
    }

    // The dashboard ConfigMap carries the dashboard file verbatim, labelled for the sidecar.
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap())
            .unwrap();
    let dash = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["backpressure-operator.json"].is_string())
        .expect("a ConfigMap with backpressure-operator.json");
    assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
    let embedded: Value =
        serde_json::from_str(dash["data"]["backpressure-operator.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        embedded, file,
        "the ConfigMap's dashboard differs from the file"
    );

    // Every binding refers to a rendered policy, and every policy has a binding.
    let policies: BTreeSet<&str> = of_kind(&docs, "ValidatingAdmissionPolicy")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    let bound: BTreeSet<&str> = of_kind(&docs, "ValidatingAdmissionPolicyBinding")
        .iter()
        .map(|b| b["spec"]["policyName"].as_str().unwrap())
        .collect();
    assert_eq!(policies, bound, "policies and bindings do not pair up");
    for b in of_kind(&docs, "ValidatingAdmissionPolicyBinding") {
        assert_eq!(
            b["spec"]["validationActions"],
            json!(["Deny"]),
            "default action"
        );
    }

    // The toggles remove what they govern.
    let off = helm_template(&["dashboard.enabled=false", "admission.enabled=false"]);
    for kind in [
        "PrometheusRule",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(of_kind(&off, kind).is_empty(), "{kind} rendered while off");
    }
    assert!(
        !of_kind(&off, "ConfigMap")
            .iter()
            .any(|c| c["data"]["backpressure-operator.json"].is_string()),
        "dashboard rendered while off"
    );
}

#[tokio::test]
async fn the_api_server_accepts_the_rendered_dashboard_and_admission_objects() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    let docs = helm_template(&["prometheusRule.enabled=true"]);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bp-system"}});
    namespaces
        .patch(
            "bp-system",
            &PatchParams::apply("observability-test"),
            &Patch::Apply(&ns),
        )
        .await
        .unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut checked = Vec::new();
    for doc in docs.iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("ConfigMap" | "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding")
        )
    }) {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the API server does not serve {gvk:?}"));
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap(),
                &ar,
            )
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = obj.metadata.name.clone().unwrap();
        let mut params = PatchParams::apply("observability-test").force();
        params.dry_run = true;
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("{} {name} rejected: {e}", gvk.kind));
        checked.push(format!("{}/{name}", gvk.kind));
    }
    assert!(checked.len() >= 5, "{checked:?}");
}

// ---------------------------------------------------------------------------------------------
// promtool

#[test]
fn promtool_accepts_the_rendered_alert_rules() {
    let rule = rendered_rule();
    let dir = temp_dir("check");
    let file = dir.join("rules.yaml");
    write_yaml(&file, &json!({"groups": rule["spec"]["groups"]}));
    let out = run(Command::new(promtool()).args(["check", "rules"]).arg(&file));
    let alerts = rule_exprs(&rule).len();
    assert!(
        out.contains(&format!("SUCCESS: {alerts} rules found")),
        "promtool did not check {alerts} rules:\n{out}"
    );

    // And it rejects a broken expression: the check can fail.
    let mut broken = rule["spec"]["groups"].clone();
    broken[0]["rules"][0]["expr"] = json!("max(backpressure_operator_held_objects > ");
    let bad = dir.join("broken.yaml");
    write_yaml(&bad, &json!({"groups": broken}));
    let status = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&bad)
        .output()
        .unwrap()
        .status;
    assert!(!status.success(), "promtool accepted a broken expression");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_kustomize_copy_of_the_rules_matches_the_chart() {
    // config/prometheus/rule.yaml is generated from the template (config/generate.sh); the
    // alerts promtool checked above must be the ones kustomize users get.
    let helm = bin_dir().unwrap().join("helm");
    let out = run(Command::new(&helm)
        .args(["template", "backpressure-operator"])
        .arg(repo_root().join(CHART))
        .args(["--namespace", "backpressure-system"])
        .args(["--set", "prometheusRule.enabled=true"])
        .args(["--set", "serviceMonitor.enabled=true"])
        .args(["--show-only", "templates/prometheusrule.yaml"]));
    let rendered: Value =
        serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&out).unwrap()).unwrap();
    let copy: Value = serde_json::to_value(
        serde_yaml::from_str::<serde_yaml::Value>(
            &std::fs::read_to_string(repo_root().join("config/prometheus/rule.yaml")).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        copy["spec"], rendered["spec"],
        "config/prometheus/rule.yaml is stale: run config/generate.sh"
    );
}

#[test]
fn promtool_accepts_every_dashboard_query() {
    // Wrap each dashboard query into a recording rule, with Grafana's variables substituted,
    // so promtool parses it as PromQL.
    let dash = dashboard();
    let mut rules = Vec::new();
    for (i, (title, expr)) in dashboard_queries(&dash).iter().enumerate() {
        if expr.starts_with("label_values(") {
            continue; // A Grafana template function, not PromQL; its metric is checked below.
        }
        let promql = expr
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$namespace", ".*")
            .replace("$workload", ".*");
        assert!(!promql.contains('$'), "unknown variable in {title}: {expr}");
        rules.push(json!({"record": format!("dashboard:query_{i}"), "expr": promql}));
    }
    assert!(rules.len() >= 20, "only {} dashboard queries", rules.len());
    let dir = temp_dir("dashboard");
    let file = dir.join("dashboard-rules.yaml");
    write_yaml(
        &file,
        &json!({"groups": [{"name": "dashboard", "rules": rules}]}),
    );
    run(Command::new(promtool()).args(["check", "rules"]).arg(&file));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The alert groups with annotations removed (promtool's unit tests compare annotations
/// verbatim; their templates are checked by `promtool check rules` above).
fn rules_without_annotations(rule: &Value) -> Value {
    let mut groups = rule["spec"]["groups"].clone();
    for g in groups.as_array_mut().unwrap() {
        for r in g["rules"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("annotations");
        }
    }
    json!({ "groups": groups })
}

#[test]
fn the_alerts_fire_when_they_should_and_not_before() {
    let rule = rendered_rule();
    let dir = temp_dir("unit");
    write_yaml(&dir.join("rules.yaml"), &rules_without_annotations(&rule));
    let warning = json!({"severity": "warning"});
    let critical = json!({"severity": "critical"});
    // Two operator replicas: the leader exports the object gauges, the standby exports 0.
    let tests = json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "held longer than heldFor (30m)",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_held_objects{instance=\"leader\"}", "values": "0 1x60"},
                    {"series": "backpressure_operator_held_objects{instance=\"standby\"}", "values": "0x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "BackpressureScaleOutHeldTooLong", "exp_alerts": []},
                    {"eval_time": "35m", "alertname": "BackpressureScaleOutHeldTooLong", "exp_alerts": [{"exp_labels": warning}]},
                ],
            },
            {
                "name": "a short hold does not alert",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_held_objects{instance=\"leader\"}", "values": "0 1x20 0x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "50m", "alertname": "BackpressureScaleOutHeldTooLong", "exp_alerts": []},
                ],
            },
            {
                "name": "metrics unavailable for more than 10m",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_objects{instance=\"leader\",regime=\"MetricsUnavailable\"}", "values": "0 1x30"},
                    {"series": "backpressure_operator_objects{instance=\"leader\",regime=\"Healthy\"}", "values": "5x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "8m", "alertname": "BackpressureMetricsUnavailable", "exp_alerts": []},
                    {"eval_time": "15m", "alertname": "BackpressureMetricsUnavailable", "exp_alerts": [{"exp_labels": warning}]},
                ],
            },
            {
                "name": "config out of sync for more than 15m",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_config_out_of_sync_objects{instance=\"leader\"}", "values": "0 2x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "BackpressureConfigOutOfSync", "exp_alerts": []},
                    {"eval_time": "20m", "alertname": "BackpressureConfigOutOfSync", "exp_alerts": [{"exp_labels": warning}]},
                ],
            },
            {
                "name": "three ramp aborts within an hour",
                "interval": "1m",
                "input_series": [
                    // Aborts at 10m, 21m and 32m.
                    {"series": "backpressure_operator_ramp_aborts_total{instance=\"leader\"}", "values": "0x9 1x10 2x10 3x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "BackpressureRampAbortedRepeatedly", "exp_alerts": []},
                    {"eval_time": "35m", "alertname": "BackpressureRampAbortedRepeatedly", "exp_alerts": [{"exp_labels": warning}]},
                    // More than an hour after the first abort the window holds only two.
                    {"eval_time": "75m", "alertname": "BackpressureRampAbortedRepeatedly", "exp_alerts": []},
                ],
            },
            {
                "name": "a workload backed off for 30m",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_backoff_factor{namespace=\"shop\",workload=\"export\",pod=\"a\"}", "values": "0.5x60"},
                    {"series": "backpressure_backoff_factor{namespace=\"shop\",workload=\"export\",pod=\"b\"}", "values": "0.1x60"},
                    {"series": "backpressure_backoff_factor{namespace=\"shop\",workload=\"mail\",pod=\"c\"}", "values": "0.1x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "BackpressureWorkloadBackedOff", "exp_alerts": []},
                    {"eval_time": "40m", "alertname": "BackpressureWorkloadBackedOff", "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "namespace": "shop", "workload": "export"}}
                    ]},
                ],
            },
            {
                "name": "no leader for 5m",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_leader{instance=\"a\"}", "values": "1x10 0x20"},
                    {"series": "backpressure_operator_leader{instance=\"b\"}", "values": "0x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "BackpressureOperatorNoLeader", "exp_alerts": []},
                    {"eval_time": "20m", "alertname": "BackpressureOperatorNoLeader", "exp_alerts": [{"exp_labels": critical}]},
                ],
            },
            {
                "name": "query errors and reconcile errors",
                "interval": "1m",
                "input_series": [
                    {"series": "backpressure_operator_prometheus_query_errors_total{instance=\"leader\",query=\"backoff\"}", "values": "0+6x40"},
                    {"series": "backpressure_operator_prometheus_query_errors_total{instance=\"leader\",query=\"queueAge\"}", "values": "0x40"},
                    {"series": "backpressure_operator_reconciles_total{instance=\"leader\",result=\"success\"}", "values": "0+60x40"},
                    {"series": "backpressure_operator_reconciles_total{instance=\"leader\",result=\"error\"}", "values": "0+30x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "BackpressurePrometheusQueryErrors", "exp_alerts": [
                        {"exp_labels": {"severity": "warning", "query": "backoff"}}
                    ]},
                    {"eval_time": "30m", "alertname": "BackpressureReconcileErrors", "exp_alerts": [{"exp_labels": warning}]},
                ],
            },
        ],
    });
    write_yaml(&dir.join("tests.yaml"), &tests);
    let out = run(Command::new(promtool())
        .current_dir(&dir)
        .args(["test", "rules", "tests.yaml"]));
    assert!(out.contains("SUCCESS"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Metric names

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).unwrap()
}

/// Every query of the dashboard: panel targets (nested rows included) and template variables.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], out);
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((p["title"].as_str().unwrap_or("?").to_owned(), e.to_owned()));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        if v["type"] == "query"
            && let Some(q) = q
        {
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

/// The `backpressure_*` metric names a PromQL expression reads: identifiers outside string
/// literals and outside label matchers, not Grafana variables (`$name`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let mut depth_braces = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' => {
                depth_braces += 1;
                i += 1;
            }
            '}' => {
                depth_braces -= 1;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let variable = start > 0 && chars[start - 1] == '$';
                if depth_braces == 0 && !variable && word.starts_with("backpressure_") {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn metric_name_parser_reads_promql() {
    let got = metric_names(
        r#"sum by (query) (rate(backpressure_operator_prometheus_query_errors_total{query!="backpressure_fake"}[5m])) / max(backpressure_backoff_factor{namespace=~"$namespace"}) and on() backpressure_x:recorded > $backpressure_var"#,
    );
    let want: BTreeSet<String> = [
        "backpressure_operator_prometheus_query_errors_total",
        "backpressure_backoff_factor",
        "backpressure_x:recorded",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
}

/// Series names a text exposition serves: from `# TYPE` lines (with the suffixes each type
/// adds) and from the sample lines.
fn exposed_names(exposition: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let series: Vec<String> = match kind {
                "counter" => vec![format!("{}_total", name.trim_end_matches("_total"))],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                "summary" => vec![name.into(), format!("{name}_sum"), format!("{name}_count")],
                "info" => vec![format!("{name}_info")],
                _ => vec![name.into()],
            };
            for s in series {
                out.insert(s, name.to_owned());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let base = name.clone();
            out.entry(name).or_insert(base);
        }
    }
    out
}

/// The operator's `/metrics` text after one of everything it counts (a family without samples
/// is not in the exposition at all).
fn operator_exposition() -> String {
    use backpressure_api::v1alpha1::{Action, Regime};
    use backpressure_operator::observe::promql::MetricKind;
    let m = backpressure_operator::metrics::Metrics::default();
    m.reconcile_timer().success();
    m.decision(Regime::DependencyFailing, Action::HoldScaleOut);
    m.decision(Regime::DependencyFailing, Action::AbortRamp);
    for kind in MetricKind::ALL {
        m.observe_query(kind, std::time::Duration::from_millis(20), true);
    }
    m.push(true);
    m.set_leader(true);
    m.encode()
}

/// What exports each name: `operator`, `worker` or `queue exporter`, and the family name.
fn exported() -> BTreeMap<String, (&'static str, String)> {
    let mut out = BTreeMap::new();
    for (series, family) in exposed_names(&operator_exposition()) {
        out.insert(series, ("operator", family));
    }
    let worker = backpressure_worker::metrics::Metrics::new("w").encode();
    for (series, family) in exposed_names(&worker) {
        out.insert(series, ("worker", family));
    }
    // The queue exporter (not a library of this workspace) serves the wire contract's names.
    for name in [
        wire::QUEUE_AGE,
        wire::QUEUE_DEPTH,
        wire::QUEUE_ARRIVALS_TOTAL,
        wire::QUEUE_COMPLETIONS_TOTAL,
        wire::QUEUE_DEAD_LETTERS_TOTAL,
    ] {
        out.insert(name.to_owned(), ("queue exporter", name.to_owned()));
    }
    out
}

#[test]
fn every_metric_the_alerts_and_dashboard_read_is_exported_and_documented() {
    let exported = exported();
    // The exposition parsing itself found the operator's and the worker's families.
    assert!(
        exported.contains_key("backpressure_operator_reconcile_duration_seconds_bucket"),
        "{exported:?}"
    );
    assert!(exported.contains_key(wire::BACKOFF), "{exported:?}");
    assert!(exported.contains_key(wire::OUTCOMES_TOTAL), "{exported:?}");

    let metrics_md = std::fs::read_to_string(repo_root().join(METRICS_MD)).unwrap();
    let mut used: Vec<(String, String)> = Vec::new();
    for (alert, expr) in rule_exprs(&rendered_rule()) {
        used.extend(
            metric_names(&expr)
                .into_iter()
                .map(|n| (n, format!("alert {alert}"))),
        );
    }
    for (title, expr) in dashboard_queries(&dashboard()) {
        used.extend(
            metric_names(&expr)
                .into_iter()
                .map(|n| (n, format!("dashboard panel {title:?}"))),
        );
    }
    assert!(used.len() >= 30, "only {} metric uses found", used.len());

    let mut problems = Vec::new();
    for (name, place) in &used {
        match exported.get(name) {
            None => problems.push(format!("{place} reads {name}, which nothing exports")),
            Some((_, family)) => {
                let documented = [name.as_str(), family.as_str()]
                    .iter()
                    .any(|n| metrics_md.contains(&format!("`{n}`")));
                if !documented {
                    problems.push(format!(
                        "{place} reads {name} (family {family}), not in METRICS.md"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The issue's dashboard content: fleet backoff, regime over time, held and ramping counts,
    // replicas vs recommended, queue age.
    let read: BTreeSet<&str> = used.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        wire::BACKOFF,
        "backpressure_operator_objects",
        "backpressure_operator_held_objects",
        "backpressure_operator_ramping_objects",
        "backpressure_operator_replicas",
        wire::QUEUE_AGE,
    ] {
        assert!(
            read.contains(name),
            "neither dashboard nor alerts read {name}"
        );
    }
}

#[test]
fn metrics_md_documents_every_operator_metric() {
    let metrics_md = std::fs::read_to_string(repo_root().join(METRICS_MD)).unwrap();
    let operator = operator_exposition();
    let mut missing = Vec::new();
    for line in operator.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        let public = if kind == "counter" {
            format!("{}_total", name.trim_end_matches("_total"))
        } else {
            name.to_owned()
        };
        // The table row: | `name` | type | ...
        let row = metrics_md
            .lines()
            .find(|l| l.starts_with(&format!("| `{public}` |")));
        match row {
            None => missing.push(format!("{public} ({kind}) has no row in METRICS.md")),
            Some(r) if !r.contains(&format!("| {kind} |")) => {
                missing.push(format!("{public}: METRICS.md row does not say {kind}: {r}"));
            }
            Some(_) => {}
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
