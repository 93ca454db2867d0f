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

/// The configuration file.
pub fn config(api: &ApiAccess<'_>, namespaces: &[&str], static_targets: &[String]) -> String {
    let ns: Vec<String> = namespaces.iter().map(|n| format!("'{n}'")).collect();
    let targets: Vec<String> = static_targets.iter().map(|t| format!("'{t}'")).collect();
    format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
scrape_configs:
- job_name: workers
  kubernetes_sd_configs:
  - role: pod
    api_server: '{server}'
    tls_config: {{ca_file: '{ca}', cert_file: '{cert}', key_file: '{key}'}}
    namespaces: {{names: [{ns}]}}
    selectors:
    - {{role: pod, label: '{label}={value}'}}
  relabel_configs:
  - {{source_labels: [__meta_kubernetes_pod_container_port_name], regex: '{port_name}', action: keep}}
  - {{source_labels: [__meta_kubernetes_pod_phase], regex: Running, action: keep}}
  - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}
  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}
- job_name: lab
  honor_labels: true
  static_configs:
  - targets: [{targets}]
"#,
        server = api.server,
        ca = api.ca_file.display(),
        cert = api.cert_file.display(),
        key = api.key_file.display(),
        ns = ns.join(", "),
        label = POD_LABEL,
        value = POD_LABEL_VALUE,
        port_name = backpressure_api::wire::ADMIN_PORT_NAME,
        targets = targets.join(", "),
    )
}

/// A running Prometheus.
#[derive(Debug)]
pub struct LabPrometheus {
    port: u16,
    process: Supervised,
}

impl LabPrometheus {
    /// Writes the config into `dir` and starts Prometheus; waits until it is ready.
    pub async fn start(dir: &Path, config_text: &str) -> Result<Self, PromError> {
        let e = |e: std::io::Error| PromError(e.to_string());
        std::fs::create_dir_all(dir.join("data")).map_err(e)?;
        std::fs::write(dir.join("prometheus.yml"), config_text).map_err(e)?;
        let port = free_port().map_err(|e| PromError(e.to_string()))?;
        let binary = Prometheus::binary().map_err(|e| PromError(e.to_string()))?;
        let args = vec![
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--storage.tsdb.retention.time=2h".into(),
            "--log.level=warn".into(),
        ];
        let process = Supervised::spawn("prometheus", &binary, &args, &dir.join("prometheus.log"))
            .map_err(|e| PromError(e.to_string()))?;
        let p = Self { port, process };
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client.get(format!("{}/-/ready", p.url())).send().await
                && r.status().is_success()
            {
                return Ok(p);
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

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
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
        .get(format!("{base}/api/v1/query?query={}", urlencode(expr)))
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

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
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
        let c = config(&api, &["a", "b"], &["127.0.0.1:1".into()]);
        let v: serde_yaml::Value = serde_yaml::from_str(&c).unwrap_or(serde_yaml::Value::Null);
        let jobs = v["scrape_configs"].as_sequence().map(Vec::len);
        assert_eq!(jobs, Some(2), "{c}");
        assert!(c.contains("regex: 'bp-admin', action: keep"));
        assert!(c.contains("target_label: namespace"));
        assert!(c.contains("names: ['a', 'b']"));
        assert_eq!(v["scrape_configs"][1]["honor_labels"].as_bool(), Some(true));
    }
}
