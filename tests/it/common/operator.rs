//! Runs the real operator binary as its own ServiceAccount, with the chart's RBAC.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use backpressure_envtest::{Supervised, TestEnv};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};

/// Namespace the chart is "installed" into.
pub const OPERATOR_NAMESPACE: &str = "bp-system";
/// The chart's ServiceAccount name with release name `backpressure-operator`.
pub const OPERATOR_SA: &str = "backpressure-operator";

/// The operator's user name (in the audit log, and to impersonate it).
pub fn operator_user() -> String {
    format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}")
}

/// The operator's kubeconfig per control plane (by API server URL).
static RBAC: tokio::sync::Mutex<BTreeMap<String, PathBuf>> =
    tokio::sync::Mutex::const_new(BTreeMap::new());

/// Renders the chart's ServiceAccount and RBAC with helm, applies them, and returns a kubeconfig
/// that authenticates as the operator's ServiceAccount with a real token. Once per control
/// plane (the shared one, and the one with KEDA).
pub async fn operator_kubeconfig(env: &'static TestEnv) -> PathBuf {
    let mut done = RBAC.lock().await;
    if let Some(path) = done.get(env.server_url()) {
        return path.clone();
    }
    let path = {
        let client = env.client().unwrap();
        let ns_api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": OPERATOR_NAMESPACE}}))
                .unwrap();
        let _ = ns_api.create(&PostParams::default(), &ns).await;
        // Secrets cluster-wide: the tests' namespaces are made up as they go, and a few read
        // Prometheus credentials through spec.metrics.prometheus.secretRef (the chart's
        // default grants no Secrets at all).
        let objects = render_chart_with(
            &[
                "templates/serviceaccount.yaml",
                "templates/clusterrole.yaml",
                "templates/clusterrolebinding.yaml",
                "templates/role.yaml",
                "templates/rolebinding.yaml",
            ],
            &["rbac.secrets.clusterWide=true"],
        );
        apply_chart_objects(&client, objects).await;
        service_account_kubeconfig(env, &client, OPERATOR_SA, "operator").await
    };
    done.insert(env.server_url().to_owned(), path.clone());
    path
}

/// A kubeconfig `<name>.kubeconfig` that authenticates as ServiceAccount `sa` of
/// [`OPERATOR_NAMESPACE`] with a real token (valid for a day).
pub async fn service_account_kubeconfig(
    env: &TestEnv,
    client: &kube::Client,
    sa: &str,
    name: &str,
) -> PathBuf {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = api
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap();
    env.write_token_kubeconfig(name, &token.status.unwrap().token)
        .unwrap()
}

/// Server-side applies `objects` rendered by [`render_chart`] (namespaced ones in their own
/// namespace, else in [`OPERATOR_NAMESPACE`]) and returns what was applied, for the caller to delete.
pub async fn apply_chart_objects(
    client: &kube::Client,
    objects: Vec<DynamicObject>,
) -> Vec<(kube::discovery::ApiResource, String)> {
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let mut installed = Vec::new();
    for obj in objects {
        let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
        let (ar, caps) = discovery.resolve_gvk(&gvk).unwrap();
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            let ns = obj
                .metadata
                .namespace
                .as_deref()
                .unwrap_or(OPERATOR_NAMESPACE);
            Api::namespaced_with(client.clone(), ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("test-install").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", ar.kind));
        installed.push((ar, name));
    }
    installed
}

/// Renders `templates` of the chart with helm (release `backpressure-operator` in
/// [`OPERATOR_NAMESPACE`]) and returns the objects.
pub fn render_chart(templates: &[&str]) -> Vec<DynamicObject> {
    render_chart_with(templates, &[])
}

/// [`render_chart`] with `--set` values (`key=value` each).
pub fn render_chart_with(templates: &[&str], sets: &[&str]) -> Vec<DynamicObject> {
    render_release(OPERATOR_SA, templates, sets)
}

/// [`render_chart_with`] as release `release` (whose ServiceAccount and ClusterRole are named
/// `<release>-backpressure-operator` unless the release is `backpressure-operator`).
pub fn render_release(release: &str, templates: &[&str], sets: &[&str]) -> Vec<DynamicObject> {
    let helm = backpressure_envtest::bin_dir().unwrap().join("helm");
    let chart = backpressure_envtest::repo_root().join("charts/backpressure-operator");
    let mut cmd = std::process::Command::new(helm);
    cmd.args(["template", release])
        .arg(&chart)
        .args(["--namespace", OPERATOR_NAMESPACE])
        // The admission policies render only for Kubernetes >= 1.30 (helm template assumes
        // 1.20 unless told): the version of the API server the tests run.
        .args(["--kube-version", backpressure_envtest::KUBERNETES_VERSION]);
    for t in templates {
        cmd.args(["-s", t]);
    }
    for v in sets {
        cmd.args(["--set", v]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---")
        .filter_map(|doc| {
            let v: serde_yaml::Value = serde_yaml::from_str(doc).unwrap_or(serde_yaml::Value::Null);
            (!v.is_null()).then(|| serde_yaml::from_value(v).unwrap())
        })
        .collect()
}

/// The Prometheus addresses every test operator allows besides its `--prometheus-url`: the
/// tests' own Prometheus servers, fakes and proxies listen on 127.0.0.1 with random ports. An
/// address the tests want refused listens elsewhere (127.0.0.2).
pub const ALLOWED_IN_TESTS: &str = "--allowed-prometheus-address=http://127.0.0.1:*";

/// A running operator process.
#[derive(Debug)]
pub struct Operator {
    /// The process.
    pub process: Supervised,
    /// Its metrics address.
    pub metrics: String,
}

impl Operator {
    /// Starts the operator binary with `extra` arguments, as the operator's ServiceAccount.
    pub async fn start(env: &'static TestEnv, prometheus_url: &str, extra: &[&str]) -> Operator {
        let kubeconfig = operator_kubeconfig(env).await;
        Self::start_as(env, &kubeconfig, OPERATOR_SA, prometheus_url, extra)
    }

    /// [`start`](Self::start) with another `kubeconfig` and ServiceAccount `sa` (in
    /// [`OPERATOR_NAMESPACE`]).
    pub fn start_as(
        env: &'static TestEnv,
        kubeconfig: &std::path::Path,
        sa: &str,
        prometheus_url: &str,
        extra: &[&str],
    ) -> Operator {
        let port = backpressure_envtest::process::free_port().unwrap();
        let metrics = format!("127.0.0.1:{port}");
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--prometheus-url={prometheus_url}"),
            format!("--metrics-bind-address={metrics}"),
            "--requeue-interval=1s".into(),
            format!("--namespace={OPERATOR_NAMESPACE}"),
            format!("--service-account={sa}"),
            "--log-level=debug".into(),
            ALLOWED_IN_TESTS.into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let log = env
            .dir()
            .join(format!("operator-{}.log", backpressure_envtest::unique()));
        // The kubeconfig reaches the child through a wrapper: Supervised passes no env, so use
        // `env KUBECONFIG=... <binary>`.
        let mut full = vec![
            format!("KUBECONFIG={}", kubeconfig.display()),
            "RUST_LOG=info,backpressure_operator=debug".into(),
        ];
        full.push(env!("CARGO_BIN_EXE_backpressure-operator").into());
        full.extend(args);
        let process = Supervised::spawn(
            "operator",
            std::path::Path::new("/usr/bin/env"),
            &full,
            &log,
        )
        .unwrap();
        assert!(
            backpressure_envtest::process::wait_for_port(port, Duration::from_secs(30)),
            "operator did not serve metrics:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Operator { process, metrics }
    }

    /// The operator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    /// Kills the process (SIGKILL).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// The operator's `/metrics` text.
    pub fn scrape(&self) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}
