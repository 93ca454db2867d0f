//! The lab's control plane: etcd + kube-apiserver + kube-controller-manager (from the envtest
//! harness), the CRDs, the operator's RBAC from the Helm chart, and the objects of a run.
//!
//! Where a real node can start ([`backpressure_envtest::NodeCluster`]: root, writable cgroups,
//! containerd, the node's binaries and the images of `make image`), the pods run there as
//! containers and the operator is installed with `helm install`; otherwise on the kubelet
//! stand-in ([`crate::kubelet`]), and the lab says which and why ([`NodeChoice`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use backpressure_api::v1alpha1::{WorkerBackpressure, WorkerBackpressureSpec};
use backpressure_envtest::{HpaControllerFlags, NodeCluster, TestEnv};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

use crate::kubelet::{POD_LABEL, POD_LABEL_VALUE, PRODUCER_LABEL_VALUE};

/// Namespace of the operator (as the chart installs it).
pub const OPERATOR_NAMESPACE: &str = "backpressure-system";
/// Helm release name (the chart then names everything `backpressure-operator`).
pub const RELEASE: &str = "backpressure-operator";

/// A cluster error.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The harness failed.
    #[error("control plane: {0}")]
    Env(#[from] backpressure_envtest::Error),
    /// The API server refused something.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// A tool (kubectl, helm) failed.
    #[error("{0}")]
    Tool(String),
}

/// The running control plane.
#[derive(Debug)]
pub struct Cluster {
    plane: Plane,
    bin: PathBuf,
}

/// Where the pods run.
#[derive(Debug)]
enum Plane {
    /// A control plane without nodes: the lab's kubelet stand-in runs the pods as processes.
    StandIn(Box<TestEnv>),
    /// A control plane with a real node (containerd, kubelet, kube-proxy).
    Node(Box<NodeCluster>),
}

/// Whether to run on a real node: `BP_LAB_NODE` (`0`: never; `1`: required; unset: when it
/// can start), and `BP_REQUIRE_NODE=1` (CI as root) makes it required as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChoice {
    /// The stand-in.
    Never,
    /// A real node where it can start, else the stand-in.
    WhenAvailable,
    /// A real node, or fail.
    Required,
}

impl NodeChoice {
    /// From the environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        Self::from_vars(
            var("BP_LAB_NODE").as_deref(),
            var("BP_REQUIRE_NODE").as_deref(),
        )
    }

    /// From the values of `BP_LAB_NODE` and `BP_REQUIRE_NODE`.
    pub fn from_vars(lab_node: Option<&str>, require_node: Option<&str>) -> Self {
        match lab_node.unwrap_or_default() {
            "0" | "false" | "off" => Self::Never,
            "1" | "true" | "on" => Self::Required,
            _ if require_node == Some("1") => Self::Required,
            _ => Self::WhenAvailable,
        }
    }
}

/// The repository root (canonical).
pub fn repo_root() -> PathBuf {
    let root = backpressure_envtest::repo_root();
    root.canonicalize().unwrap_or(root)
}

impl Cluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager and installs the CRDs.
    pub async fn start() -> Result<Self, ClusterError> {
        Self::start_with(None).await
    }

    /// [`Cluster::start`] with KEDA, and the HPA controller running with `hpa`.
    pub async fn start_with_keda(hpa: &HpaControllerFlags) -> Result<Self, ClusterError> {
        Self::start_with(Some(hpa.clone())).await
    }

    /// [`Cluster::start_with_keda`] on a real node ([`NodeCluster::start_with`]), KEDA's
    /// processes on the host. The CRDs are left to the chart (`helm install`).
    pub async fn start_node_with_keda(hpa: &HpaControllerFlags) -> Result<Self, ClusterError> {
        let hpa = hpa.clone();
        let node = tokio::task::spawn_blocking(move || -> Result<NodeCluster, ClusterError> {
            let node = NodeCluster::start_with(Some(&hpa))?;
            node.env().start_keda()?;
            Ok(node)
        })
        .await
        .map_err(|e| ClusterError::Tool(format!("node start: {e}")))??;
        let bin = backpressure_envtest::bin_dir()?;
        Ok(Self {
            plane: Plane::Node(Box::new(node)),
            bin,
        })
    }

    async fn start_with(hpa: Option<HpaControllerFlags>) -> Result<Self, ClusterError> {
        let env = tokio::task::spawn_blocking(move || -> Result<TestEnv, ClusterError> {
            let env = TestEnv::start()?;
            match hpa {
                Some(hpa) => {
                    env.start_controller_manager_with_hpa(&hpa)?;
                    env.start_keda()?;
                }
                None => env.start_controller_manager()?,
            }
            Ok(env)
        })
        .await
        .map_err(|e| ClusterError::Tool(format!("control plane start: {e}")))??;
        let bin = backpressure_envtest::bin_dir()?;
        let c = Self {
            plane: Plane::StandIn(Box::new(env)),
            bin,
        };
        c.kubectl(
            &[
                "apply",
                "--server-side",
                "-k",
                &repo_root().join("crds").display().to_string(),
            ],
            None,
        )
        .await?;
        c.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/workerbackpressures.backpressure.dev",
            ],
            None,
        )
        .await?;
        Ok(c)
    }

    /// The harness.
    pub fn env(&self) -> &TestEnv {
        match &self.plane {
            Plane::StandIn(env) => env,
            Plane::Node(node) => node.env(),
        }
    }

    /// The real node, when the pods run on one.
    pub fn node(&self) -> Option<&NodeCluster> {
        match &self.plane {
            Plane::StandIn(_) => None,
            Plane::Node(node) => Some(node),
        }
    }

    /// An admin client (create it inside the runtime that uses it).
    pub fn client(&self) -> Result<kube::Client, ClusterError> {
        Ok(self.env().client()?)
    }

    /// The admin kubeconfig (for `kubectl get wbp -A -w`).
    pub fn kubeconfig(&self) -> &Path {
        self.env().kubeconfig_path()
    }

    /// The directory of the Go-built tools.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Runs kubectl with the admin kubeconfig, feeding `stdin` if given; returns stdout.
    pub async fn kubectl(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, ClusterError> {
        let mut cmd = tokio::process::Command::new(self.bin.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig().display()))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        run_tool(cmd, "kubectl", args, stdin).await
    }

    /// Runs helm (the built one) with `args`, for at most `timeout`; returns stdout.
    async fn helm(&self, args: &[String], timeout: Duration) -> Result<String, ClusterError> {
        let mut cmd = tokio::process::Command::new(self.bin.join("helm"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_tool_for(cmd, "helm", &refs, None, timeout).await
    }

    /// Creates a namespace (idempotent).
    pub async fn namespace(&self, name: &str) -> Result<(), ClusterError> {
        let api: Api<Namespace> = Api::all(self.client()?);
        if api.get_opt(name).await?.is_none() {
            let ns = Namespace {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &ns).await?;
        }
        Ok(())
    }

    /// Creates the worker Deployment of a run (its pods run on the stand-in).
    pub async fn create_workload(
        &self,
        namespace: &str,
        name: &str,
        replicas: i32,
    ) -> Result<(), ClusterError> {
        self.create_deployment(namespace, name, replicas, POD_LABEL_VALUE, None)
            .await
    }

    /// Creates the producer Deployment of a run (its pods run `backpressure-lab producer`).
    pub async fn create_producers(
        &self,
        namespace: &str,
        name: &str,
        replicas: i32,
    ) -> Result<(), ClusterError> {
        self.create_deployment(namespace, name, replicas, PRODUCER_LABEL_VALUE, None)
            .await
    }

    /// A Deployment whose pods are labelled `role` ([`POD_LABEL`]), with the admin port named
    /// as the operator looks for it. Without `pod_spec` the stand-in runs them (the container
    /// names no real image); with one (a real node: [`crate::pods`]) that is the pods' spec.
    pub async fn create_deployment(
        &self,
        namespace: &str,
        name: &str,
        replicas: i32,
        role: &str,
        pod_spec: Option<serde_json::Value>,
    ) -> Result<(), ClusterError> {
        let api: Api<Deployment> = Api::namespaced(self.client()?, namespace);
        let port = backpressure_api::wire::DEFAULT_ADMIN_PORT;
        let spec = pod_spec.unwrap_or_else(|| {
            serde_json::json!({
                "terminationGracePeriodSeconds": 10,
                "containers": [{
                    "name": role,
                    "image": format!("backpressure-lab/{role}"),
                    "ports": [{"name": backpressure_api::wire::ADMIN_PORT_NAME, "containerPort": port}]
                }]
            })
        });
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "strategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": {"app": name, POD_LABEL: role}},
                    "spec": spec
                }
            }
        }))
        .map_err(|e| ClusterError::Tool(format!("deployment manifest: {e}")))?;
        api.create(&PostParams::default(), &d).await?;
        Ok(())
    }

    /// `helm install` of the chart into [`OPERATOR_NAMESPACE`] (its CRDs, RBAC with the
    /// TokenReview binding for `worker_subjects`, ServiceAccount, Deployment with leader
    /// election and probes, PDB) with the operator image `tag` (imported into the node,
    /// `imagePullPolicy: Never`), `prometheus_url` and the operator's `extra_args`; waits until
    /// the replicas are Ready. Returns the operator's identity
    /// (`system:serviceaccount:<namespace>:<name>`).
    pub async fn helm_install_operator(
        &self,
        tag: &str,
        prometheus_url: &str,
        worker_subjects: &[(&str, &str)],
        extra_args: &[&str],
    ) -> Result<String, ClusterError> {
        let chart = repo_root().join("charts/backpressure-operator");
        let mut args: Vec<String> = vec![
            "install".into(),
            RELEASE.into(),
            chart.display().to_string(),
            format!("--kubeconfig={}", self.kubeconfig().display()),
            "--namespace".into(),
            OPERATOR_NAMESPACE.into(),
            "--create-namespace".into(),
            "--set".into(),
            format!("image.tag={tag}"),
            "--set".into(),
            "image.pullPolicy=Never".into(),
            "--set".into(),
            format!("operator.prometheusUrl={prometheus_url}"),
            "--wait".into(),
            "--timeout=180s".into(),
        ];
        for (i, (ns, sa)) in worker_subjects.iter().enumerate() {
            args.push("--set".into());
            args.push(format!(
                "workerTokenReview.subjects[{i}].name={sa},workerTokenReview.subjects[{i}].namespace={ns}"
            ));
        }
        for (i, a) in extra_args.iter().enumerate() {
            args.push("--set-string".into());
            args.push(format!("operator.extraArgs[{i}]={a}"));
        }
        self.helm(&args, Duration::from_secs(240)).await?;
        // The chart names the ServiceAccount after the release (`<release>` when the release
        // name holds the chart's).
        let rendered = self
            .kubectl(
                &[
                    "get",
                    "serviceaccounts",
                    "-n",
                    OPERATOR_NAMESPACE,
                    "-l",
                    "app.kubernetes.io/name=backpressure-operator",
                    "-o",
                    "jsonpath={.items[0].metadata.name}",
                ],
                None,
            )
            .await?;
        let sa = rendered.trim();
        if sa.is_empty() {
            return Err(ClusterError::Tool(
                "helm install: the chart created no ServiceAccount".into(),
            ));
        }
        Ok(format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{sa}"))
    }

    /// Creates the WorkerBackpressure of the operator run.
    pub async fn create_worker_backpressure(
        &self,
        namespace: &str,
        name: &str,
        spec: &WorkerBackpressureSpec,
    ) -> Result<(), ClusterError> {
        let api: Api<WorkerBackpressure> = Api::namespaced(self.client()?, namespace);
        let wbp = WorkerBackpressure::new(name, spec.clone());
        api.create(&PostParams::default(), &wbp).await?;
        Ok(())
    }

    /// Renders the chart with the built helm, applies its ServiceAccount and RBAC objects (the
    /// worker TokenReview binding for `worker_subjects` included), and returns the operator's
    /// ServiceAccount name.
    pub async fn install_operator_rbac(
        &self,
        worker_subjects: &[(&str, &str)],
    ) -> Result<String, ClusterError> {
        self.namespace(OPERATOR_NAMESPACE).await?;
        let chart = repo_root().join("charts/backpressure-operator");
        let mut args: Vec<String> = vec![
            "template".into(),
            RELEASE.into(),
            chart.display().to_string(),
            "--namespace".into(),
            OPERATOR_NAMESPACE.into(),
        ];
        for (i, (ns, sa)) in worker_subjects.iter().enumerate() {
            args.push("--set".into());
            args.push(format!(
                "workerTokenReview.subjects[{i}].name={sa},workerTokenReview.subjects[{i}].namespace={ns}"
            ));
        }
        let rendered = self.helm(&args, Duration::from_secs(120)).await?;
        let (docs, sa) = rbac_documents(&rendered)?;
        self.kubectl(&["apply", "-f", "-"], Some(&docs)).await?;
        Ok(sa)
    }

    /// Mints a token for a ServiceAccount (TokenRequest) and writes a kubeconfig using it.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        sa: &str,
        file_name: &str,
    ) -> Result<PathBuf, ClusterError> {
        let token = self
            .kubectl(
                &["create", "token", sa, "-n", namespace, "--duration=4h"],
                None,
            )
            .await?;
        Ok(self.env().write_token_kubeconfig(file_name, token.trim())?)
    }

    /// Mints a token for a ServiceAccount (TokenRequest) and writes it to `path` (what a pod's
    /// projected token file holds).
    pub async fn service_account_token_file(
        &self,
        namespace: &str,
        sa: &str,
        path: &Path,
    ) -> Result<(), ClusterError> {
        let token = self
            .kubectl(
                &["create", "token", sa, "-n", namespace, "--duration=4h"],
                None,
            )
            .await?;
        std::fs::write(path, token.trim())
            .map_err(|e| ClusterError::Tool(format!("write {}: {e}", path.display())))?;
        Ok(())
    }

    /// Creates a ServiceAccount (idempotent).
    pub async fn service_account(&self, namespace: &str, name: &str) -> Result<(), ClusterError> {
        let yaml = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        );
        self.kubectl(&["apply", "-f", "-"], Some(&yaml)).await?;
        Ok(())
    }

    /// Stops the control plane (and the node, restoring the host).
    pub fn stop(&mut self) {
        match &mut self.plane {
            Plane::StandIn(env) => env.stop(),
            Plane::Node(node) => node.stop(),
        }
    }
}

async fn run_tool(
    cmd: tokio::process::Command,
    tool: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ClusterError> {
    run_tool_for(cmd, tool, args, stdin, Duration::from_secs(120)).await
}

async fn run_tool_for(
    mut cmd: tokio::process::Command,
    tool: &str,
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<String, ClusterError> {
    use tokio::io::AsyncWriteExt;
    let mut child = cmd
        .spawn()
        .map_err(|e| ClusterError::Tool(format!("{tool}: {e}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .await
            .map_err(|e| ClusterError::Tool(format!("{tool} stdin: {e}")))?;
        drop(pipe);
    }
    let out = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| ClusterError::Tool(format!("{tool} {} timed out", args.join(" "))))?
        .map_err(|e| ClusterError::Tool(format!("{tool}: {e}")))?;
    if !out.status.success() {
        return Err(ClusterError::Tool(format!(
            "{tool} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Keeps the ServiceAccount and RBAC documents of a rendered chart; returns them (as a
/// multi-document YAML) and the ServiceAccount's name.
pub fn rbac_documents(rendered: &str) -> Result<(String, String), ClusterError> {
    const KINDS: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let mut kept = Vec::new();
    let mut sa = None;
    for doc in serde_yaml::Deserializer::from_str(rendered) {
        let v = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| ClusterError::Tool(format!("chart YAML: {e}")))?;
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        if !KINDS.contains(&kind) {
            continue;
        }
        if kind == "ServiceAccount" {
            sa = v
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(|n| n.as_str())
                .map(str::to_owned);
        }
        kept.push(
            serde_yaml::to_string(&v)
                .map_err(|e| ClusterError::Tool(format!("chart YAML: {e}")))?,
        );
    }
    let sa = sa.ok_or_else(|| ClusterError::Tool("the chart rendered no ServiceAccount".into()))?;
    Ok((kept.join("---\n"), sa))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_node_is_used_when_available_asked_for_or_required_by_ci() {
        use NodeChoice::*;
        assert_eq!(NodeChoice::from_vars(None, None), WhenAvailable);
        assert_eq!(NodeChoice::from_vars(Some(""), None), WhenAvailable);
        assert_eq!(NodeChoice::from_vars(Some("0"), None), Never);
        assert_eq!(NodeChoice::from_vars(Some("1"), None), Required);
        assert_eq!(NodeChoice::from_vars(None, Some("1")), Required);
        // Asking for the stand-in wins over CI's requirement of the node's own tests.
        assert_eq!(NodeChoice::from_vars(Some("0"), Some("1")), Never);
        assert_eq!(NodeChoice::from_vars(None, Some("0")), WhenAvailable);
    }

    #[test]
    fn keeps_only_rbac_and_names_the_service_account() {
        let rendered = "---\n# Source: x\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: op\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: op\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: r\n";
        let (docs, sa) = rbac_documents(rendered).unwrap();
        assert_eq!(sa, "op");
        assert!(docs.contains("ClusterRole"));
        assert!(!docs.contains("Deployment"));
        assert!(rbac_documents("kind: Deployment\n").is_err());
    }
}
