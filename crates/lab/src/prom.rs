//! Prometheus for the lab: discovers the worker pods with `kubernetes_sd_configs` against the
//! local API server (as in a cluster) and scrapes the queue and dependency exporters as static
//! targets.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use backpressure_envtest::{Prometheus, Supervised, process::free_port};

use crate::kubelet::{POD_LABEL, POD_LABEL_VALUE};

/// A Prometheus error.
#[derive(Debug, thiserror::Error)]
#[error("prometheus: {0}")]
pub struct PromError(String);

/// What Prometheus needs to reach the API server.
#[derive(Debug, Clone)]
pub struct ApiAccess<'a> {
    /// `https://127.0.0.1:<port>`.
    pub server: &'a str,
    /// CA file.
    pub ca_file: &'a Path,
    /// Client certificate file.
    pub cert_file: &'a Path,
    /// Client key file.
    pub key_file: &'a Path,
}

/// How Prometheus finds the worker pods.
#[derive(Debug, Clone)]
pub enum Discovery<'a> {
    /// `kubernetes_sd_configs` (role pod) against the API server, as in a cluster.
    Kubernetes(ApiAccess<'a>),
    /// `http_sd_configs` from the lab, which lists the same pods from the API server and
    /// labels them with the same `__meta_kubernetes_*` labels (for Prometheus builds without
    /// Kubernetes discovery, such as Debian's).
    Http(String),
}

/// The configuration file. The relabeling is the same for both kinds of discovery.
pub fn config(discovery: &Discovery<'_>, namespaces: &[&str], static_targets: &[String]) -> String {
    let ns: Vec<String> = namespaces.iter().map(|n| format!("'{n}'")).collect();
    let targets: Vec<String> = static_targets.iter().map(|t| format!("'{t}'")).collect();
    let sd = match discovery {
        Discovery::Kubernetes(api) => format!(
            r#"  kubernetes_sd_configs:
  - role: pod
    api_server: '{server}'
    tls_config: {{ca_file: '{ca}', cert_file: '{cert}', key_file: '{key}'}}
    namespaces: {{names: [{ns}]}}
    selectors:
    - {{role: pod, label: '{label}={value}'}}
"#,
            server = api.server,
            ca = api.ca_file.display(),
            cert = api.cert_file.display(),
            key = api.key_file.display(),
            ns = ns.join(", "),
            label = POD_LABEL,
            value = POD_LABEL_VALUE,
        ),
        Discovery::Http(url) => {
            format!("  http_sd_configs:\n  - url: '{url}'\n    refresh_interval: 1s\n")
        }
    };
    format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
scrape_configs:
- job_name: workers
{sd}  relabel_configs:
  - {{source_labels: [__meta_kubernetes_pod_container_port_name], regex: '{port_name}', action: keep}}
  - {{source_labels: [__meta_kubernetes_pod_phase], regex: Running, action: keep}}
  - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}
  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}
- job_name: lab
  honor_labels: true
  static_configs:
  - targets: [{targets}]
"#,
        port_name = backpressure_api::wire::ADMIN_PORT_NAME,
        targets = targets.join(", "),
    )
}

/// The `http_sd` answer for `pods`: one target per container port, labelled as Prometheus'
/// Kubernetes pod discovery labels it.
pub fn http_sd_targets(pods: &[k8s_openapi::api::core::v1::Pod]) -> serde_json::Value {
    let mut groups = Vec::new();
    for p in pods {
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.to_lowercase())
            .unwrap_or_else(|| "false".into());
        for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
            for port in c.ports.iter().flatten() {
                groups.push(serde_json::json!({
                    "targets": [format!("{ip}:{}", port.container_port)],
                    "labels": {
                        "__meta_kubernetes_namespace": p.metadata.namespace.clone().unwrap_or_default(),
                        "__meta_kubernetes_pod_name": p.metadata.name.clone().unwrap_or_default(),
                        "__meta_kubernetes_pod_ip": ip,
                        "__meta_kubernetes_pod_phase": phase,
                        "__meta_kubernetes_pod_ready": ready,
                        "__meta_kubernetes_pod_container_name": c.name,
                        "__meta_kubernetes_pod_container_port_name": port.name.clone().unwrap_or_default(),
                        "__meta_kubernetes_pod_container_port_number": port.container_port.to_string(),
                    }
                }));
            }
        }
    }
    serde_json::Value::Array(groups)
}

/// The Prometheus binary: `$BP_PROMETHEUS`, else the one `tools/k8s` builds next to the
/// control-plane binaries (with Kubernetes discovery), else the Debian package's.
pub fn binary() -> Result<std::path::PathBuf, PromError> {
    if std::env::var_os("BP_PROMETHEUS").is_none()
        && let Ok(dir) = backpressure_envtest::bin_dir()
        && dir.join("prometheus").is_file()
    {
        return Ok(dir.join("prometheus"));
    }
    Prometheus::binary().map_err(|e| PromError(e.to_string()))
}

/// A running Prometheus.
#[derive(Debug)]
pub struct LabPrometheus {
    ip: std::net::Ipv4Addr,
    port: u16,
    process: Supervised,
}

impl LabPrometheus {
    /// Writes the config into `dir` and starts Prometheus on `ip` (loopback, or a real node's
    /// bridge address where the operator's pods reach it); waits until it is ready.
    pub async fn start(
        dir: &Path,
        config_text: &str,
        ip: std::net::Ipv4Addr,
    ) -> Result<Self, PromError> {
        let e = |e: std::io::Error| PromError(e.to_string());
        std::fs::create_dir_all(dir.join("data")).map_err(e)?;
        std::fs::write(dir.join("prometheus.yml"), config_text).map_err(e)?;
        let port = free_port().map_err(|e| PromError(e.to_string()))?;
        let binary = binary()?;
        let args = vec![
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={ip}:{port}"),
            "--storage.tsdb.retention.time=2h".into(),
            "--log.level=warn".into(),
        ];
        let log = dir.join("prometheus.log");
        let _ = std::fs::remove_file(&log);
        let process = Supervised::spawn("prometheus", &binary, &args, &log)
            .map_err(|e| PromError(e.to_string()))?;
        let mut p = Self { ip, port, process };
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(format!("{}/-/ready", p.url())).send().await
                && r.status().is_success()
            {
                return Ok(p);
            }
            if !p.process.is_running() {
                return Err(PromError(format!(
                    "exited at start:\n{}",
                    p.process.log_tail(20)
                )));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(PromError(format!(
                    "not ready after 60 s:\n{}",
                    p.process.log_tail(20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `http://<ip>:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.ip, self.port)
    }

    /// Stops it.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// An instant query returning (labels, value) per series; NaN values are dropped.
pub async fn query(
    client: &reqwest::Client,
    base: &str,
    expr: &str,
) -> Result<Vec<(BTreeMap<String, String>, f64)>, PromError> {
    let v: serde_json::Value = client
        .get(format!(
            "{base}/api/v1/query?query={}",
            backpressure_envtest::urlencode(expr)
        ))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .map_err(|e| PromError(e.to_string()))?
        .json()
        .await
        .map_err(|e| PromError(e.to_string()))?;
    let mut out = Vec::new();
    for r in v["data"]["result"].as_array().into_iter().flatten() {
        let labels: BTreeMap<String, String> = r["metric"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let value = r["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|x| x.is_finite());
        if let Some(value) = value {
            out.push((labels, value));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keeps_admin_ports_and_labels_namespace() {
        let api = ApiAccess {
            server: "https://127.0.0.1:6443",
            ca_file: Path::new("/ca"),
            cert_file: Path::new("/c"),
            key_file: Path::new("/k"),
        };
        let c = config(
            &Discovery::Kubernetes(api),
            &["a", "b"],
            &["127.0.0.1:1".into()],
        );
        let v: serde_yaml::Value = serde_yaml::from_str(&c).unwrap_or(serde_yaml::Value::Null);
        let jobs = v["scrape_configs"].as_sequence().map(Vec::len);
        assert_eq!(jobs, Some(2), "{c}");
        assert!(c.contains("regex: 'bp-admin', action: keep"));
        assert!(c.contains("target_label: namespace"));
        assert!(c.contains("names: ['a', 'b']"));
        assert_eq!(v["scrape_configs"][1]["honor_labels"].as_bool(), Some(true));
        let h = config(&Discovery::Http("http://127.0.0.1:2/sd".into()), &[], &[]);
        assert!(h.contains("http_sd_configs") && h.contains("target_label: namespace"));
    }

    #[test]
    fn http_sd_labels_like_kubernetes_sd() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w-1", "namespace": "ns"},
            "spec": {"containers": [{"name": "worker", "ports": [{"name": "bp-admin", "containerPort": 9464}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap_or_default();
        let v = http_sd_targets(&[pod]);
        assert_eq!(v[0]["targets"][0], "127.0.0.5:9464");
        assert_eq!(
            v[0]["labels"]["__meta_kubernetes_pod_container_port_name"],
            "bp-admin"
        );
        assert_eq!(v[0]["labels"]["__meta_kubernetes_pod_ready"], "true");
        assert_eq!(http_sd_targets(&[]).as_array().map(Vec::len), Some(0));
    }
}
