//! A real Kubernetes control plane and a real Prometheus for tests, on loopback; and a real
//! node joined to a control plane on a local bridge ([`node`], [`NodeCluster`]).
//!
//! [`TestEnv::shared`] starts etcd and kube-apiserver once per test binary (built from the Go
//! module proxy by `tools/k8s/build.sh`, see `make k8s-bins`), with generated certificates and
//! RBAC authorization on, and hands out admin or impersonating [`kube::Client`]s and fresh
//! namespaces. kube-controller-manager starts on demand ([`TestEnv::start_controller_manager`]).
//! [`Prometheus`] runs the Debian `prometheus` binary with a 1 s scrape interval.
//!
//! Every process runs under a watchdog that stops it when the test binary exits, whether the
//! tests passed, panicked or were killed; the temporary directory is removed after that.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let env = backpressure_envtest::TestEnv::shared();
//! let client = env.client()?;
//! let ns = env.namespace("demo").await?;
//! # let _ = (client, ns); Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::AuthInfo;

mod keda;
pub mod node;
mod pki;
pub mod process;
mod prometheus;
mod rabbitmq;
pub mod redis;
pub mod sqs;

pub use keda::{
    HpaControllerFlags, KEDA_NAMESPACE, KEDA_VERSION, Keda, keda_bin_dir, keda_crds_dir,
};
pub use node::NodeCluster;
pub use pki::{Issued, Pki};
pub use process::Supervised;
pub use prometheus::{Prometheus, ScrapeTarget, urlencode};
pub use rabbitmq::RabbitMq;
pub use redis::RedisServer;

/// Kubernetes version the harness runs (the wrapper module in tools/k8s pins it).
pub const KUBERNETES_VERSION: &str = "v1.35.4";

/// Why the environment could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("generating certificates: {0}")]
    Pki(String),
    /// The control-plane binaries are missing and could not be built.
    #[error("control-plane binaries: {0}")]
    Binaries(String),
    /// A server did not become ready in time.
    #[error("{name} did not become ready within {timeout:?}; last log lines:\n{log}")]
    NotReady {
        /// Which server.
        name: String,
        /// How long we waited.
        timeout: Duration,
        /// The tail of its log.
        log: String,
    },
    /// A kube client error.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// A kube client configuration error.
    #[error("kube config: {0}")]
    Config(String),
    /// A real node cannot run on this machine (not root, no writable cgroups, a package
    /// missing): the reason, for a caller that falls back to the kubelet stand-in.
    #[error("no real node on this machine: {0}")]
    NodeUnavailable(String),
}

impl Error {
    pub(crate) fn io(what: String, source: std::io::Error) -> Self {
        Error::Io { what, source }
    }
}

/// The repository root (this crate lives in `crates/envtest`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding kube-apiserver, kube-controller-manager, kubectl, etcd and helm:
/// `$BP_K8S_BIN` if set, otherwise the output of `tools/k8s/build.sh` (which builds them once
/// into a cache outside the repository and is a no-op afterwards).
pub fn bin_dir() -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BP_K8S_BIN") {
            return Ok(PathBuf::from(dir));
        }
        run_build_script(&[])
    })
    .clone()
    .map_err(Error::Binaries)
}

/// Runs `tools/k8s/build.sh args...` and returns the directory it prints on its last line.
pub(crate) fn run_build_script(args: &[&str]) -> Result<PathBuf, String> {
    let script = repo_root().join("tools/k8s/build.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| format!("{} printed no directory", script.display()))
}

fn binary(name: &str) -> Result<PathBuf, Error> {
    binary_in(&bin_dir()?, name)
}

pub(crate) fn binary_in(dir: &Path, name: &str) -> Result<PathBuf, Error> {
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::Binaries(format!(
            "{} is missing; run `make k8s-bins`",
            p.display()
        )))
    }
}

/// The controllers [`TestEnv::start_controller_manager`] runs: all but those that need nodes,
/// clouds or volumes.
pub(crate) const WORKLOAD_CONTROLLERS: &str = "*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service-lb-controller,-route,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-ttl";

/// The controllers [`TestEnv::start_controller_manager_with_nodes`] runs.
pub(crate) const NODE_CONTROLLERS: &str = "*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-ttl";

/// A running etcd + kube-apiserver (and optionally kube-controller-manager).
#[derive(Debug)]
pub struct TestEnv {
    dir: PathBuf,
    server: String,
    pki: Pki,
    kubeconfig: PathBuf,
    etcd: Mutex<Supervised>,
    apiserver: Mutex<Supervised>,
    controller_manager: Mutex<Option<Supervised>>,
    garbage_collector: Mutex<Option<Supervised>>,
    hpa_controller: Mutex<Option<Supervised>>,
    keda: Mutex<Option<Keda>>,
    address: Option<std::net::Ipv4Addr>,
}

static SHARED: OnceLock<TestEnv> = OnceLock::new();

impl TestEnv {
    /// The control plane of this test binary, started on first use. Panics with the server's
    /// log if it cannot start: every test that needs it would fail anyway.
    #[allow(clippy::expect_used)]
    pub fn shared() -> &'static TestEnv {
        SHARED.get_or_init(|| {
            // Start from a plain thread: the caller may be inside a tokio runtime.
            std::thread::spawn(TestEnv::start)
                .join()
                .expect("control plane start thread panicked")
                .unwrap_or_else(|e| panic!("cannot start the test control plane: {e}"))
        })
    }

    /// Starts a new, private control plane (most tests use [`TestEnv::shared`]).
    ///
    /// A port found free can be taken (often by another process's outgoing connection, whose
    /// ephemeral ports share the range) before etcd or the API server binds it; a control
    /// plane that does not become ready is therefore started again on new ports, three
    /// attempts in all. The last attempt's error is returned.
    pub fn start() -> Result<TestEnv, Error> {
        Self::start_on(None)
    }

    /// [`TestEnv::start`] listening on `address` instead of loopback (`None`: loopback), the
    /// address a real node's pods reach through the `kubernetes` Service. With an address the
    /// API server also authorizes kubelets (`Node,RBAC`, `NodeRestriction`) and reaches them
    /// with its own client certificate at their InternalIP.
    pub fn start_on(address: Option<std::net::Ipv4Addr>) -> Result<TestEnv, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(address) {
                Err(e @ Error::NotReady { .. }) if attempt < 3 => {
                    tracing::warn!(attempt, error = %e, "control plane not ready; starting again");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(address: Option<std::net::Ipv4Addr>) -> Result<TestEnv, Error> {
        let base = std::env::var_os("BP_ENVTEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("bp-envtest-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        process::remove_dir_on_exit(&dir)?;
        let pki = match address {
            Some(ip) => {
                let pki = Pki::generate_with(&dir, &[std::net::IpAddr::V4(ip)])?;
                pki.issue(
                    &dir,
                    "apiserver-kubelet-client",
                    "kube-apiserver-kubelet-client",
                    &["system:masters"],
                    &[],
                    &[],
                )?;
                pki
            }
            None => Pki::generate(&dir)?,
        };

        let etcd_port = process::free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_data = dir.join("etcd");
        let etcd = Supervised::spawn(
            "etcd",
            &binary("etcd")?,
            &[
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!(
                    "--listen-peer-urls=http://127.0.0.1:{}",
                    process::free_port()?
                ),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
                "--quota-backend-bytes=8589934592".into(),
            ],
            &dir.join("etcd.log"),
        )?;
        if !process::wait_for_port(etcd_port, Duration::from_secs(30)) {
            return Err(Error::NotReady {
                name: "etcd".into(),
                timeout: Duration::from_secs(30),
                log: etcd.log_tail(30),
            });
        }

        let port = process::free_port()?;
        let host = address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        let server = format!("https://{host}:{port}");
        let apiserver = Supervised::spawn(
            "kube-apiserver",
            &binary("kube-apiserver")?,
            &apiserver_args(&dir, &pki, port, &etcd_url, address),
            &dir.join("kube-apiserver.log"),
        )?;
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, admin_kubeconfig(&server, &pki))
            .map_err(|e| Error::io(format!("write {}", kubeconfig.display()), e))?;
        let env = TestEnv {
            dir,
            server,
            pki,
            kubeconfig,
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(apiserver),
            controller_manager: Mutex::new(None),
            garbage_collector: Mutex::new(None),
            hpa_controller: Mutex::new(None),
            keda: Mutex::new(None),
            address,
        };
        env.wait_ready(Duration::from_secs(120))?;
        Ok(env)
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let ready = poll_blocking(timeout, Duration::from_millis(200), || async {
            let Ok(client) = self.client() else {
                return false;
            };
            let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
                return false;
            };
            if client.request_text(req).await.is_err() {
                return false;
            }
            let ns: Api<Namespace> = Api::all(client);
            ns.get_opt("default").await.ok().flatten().is_some()
        })?;
        if ready {
            Ok(())
        } else {
            let log = self
                .apiserver
                .lock()
                .map(|a| a.log_tail(40))
                .unwrap_or_default();
            Err(Error::NotReady {
                name: "kube-apiserver".into(),
                timeout,
                log,
            })
        }
    }

    /// The API server URL (`https://127.0.0.1:<port>`).
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The temporary directory of this control plane.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An admin kubeconfig file (certificates embedded), for kubectl and subprocesses.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The certificates.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// An admin (`system:masters`) client configuration.
    pub fn config(&self) -> Result<kube::Config, Error> {
        let uri: http::Uri = self
            .server
            .parse()
            .map_err(|e| Error::Config(format!("{e}")))?;
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(vec![pem_to_der(&self.pki.ca_pem)?]);
        config.default_namespace = "default".into();
        config.auth_info = AuthInfo {
            client_certificate_data: Some(b64(&self.pki.admin_cert_pem)),
            client_key_data: Some(b64(&self.pki.admin_key_pem).into()),
            ..AuthInfo::default()
        };
        config.read_timeout = Some(Duration::from_secs(60));
        Ok(config)
    }

    /// An admin client. Call it inside the tokio runtime that will use it.
    pub fn client(&self) -> Result<kube::Client, Error> {
        Ok(kube::Client::try_from(self.config()?)?)
    }

    /// A client that impersonates `user` (with `groups`), for example
    /// `system:serviceaccount:backpressure-system:backpressure-operator`: requests are
    /// authorized exactly as for that identity.
    pub fn client_as(&self, user: &str, groups: &[&str]) -> Result<kube::Client, Error> {
        let mut config = self.config()?;
        config.auth_info.impersonate = Some(user.to_owned());
        if !groups.is_empty() {
            config.auth_info.impersonate_groups =
                Some(groups.iter().map(|g| (*g).to_owned()).collect());
        }
        Ok(kube::Client::try_from(config)?)
    }

    /// A client that authenticates with a bearer token (for example a ServiceAccount token
    /// from a TokenRequest), exercising real authentication.
    pub fn client_with_token(&self, token: &str) -> Result<kube::Client, Error> {
        let uri: http::Uri = self
            .server
            .parse()
            .map_err(|e| Error::Config(format!("{e}")))?;
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(vec![pem_to_der(&self.pki.ca_pem)?]);
        config.auth_info = AuthInfo {
            token: Some(token.to_owned().into()),
            ..AuthInfo::default()
        };
        Ok(kube::Client::try_from(config)?)
    }

    /// Writes a kubeconfig that authenticates with `token` (for a subprocess running as a
    /// ServiceAccount) and returns its path.
    pub fn write_token_kubeconfig(&self, name: &str, token: &str) -> Result<PathBuf, Error> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: envtest\n    user: {name}\n    namespace: default\ncurrent-context: {name}\n",
            self.server,
            b64(&self.pki.ca_pem)
        );
        std::fs::write(&path, text)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        Ok(path)
    }

    /// Creates a namespace named `<prefix>-<unique>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, Error> {
        let name = format!("{}-{}", prefix.to_lowercase(), unique());
        let api: Api<Namespace> = Api::all(self.client()?);
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    /// Starts kube-controller-manager (Deployments → ReplicaSets → Pods, garbage collection,
    /// namespace deletion). Idempotent.
    pub fn start_controller_manager(&self) -> Result<(), Error> {
        self.start_kcm(
            &self.controller_manager,
            "kube-controller-manager",
            WORKLOAD_CONTROLLERS,
        )
    }

    /// Starts kube-controller-manager with the node lifecycle controller as well (it lifts a
    /// new node's `not-ready` taint), for a control plane with a real node. Idempotent.
    pub fn start_controller_manager_with_nodes(&self) -> Result<(), Error> {
        self.start_kcm(
            &self.controller_manager,
            "kube-controller-manager",
            NODE_CONTROLLERS,
        )
    }

    /// Starts a kube-controller-manager running the garbage collector only (objects whose
    /// owners are gone are deleted, as in a real cluster), without the workload controllers
    /// that would turn Deployments into Pods under tests that bring their own fake pods.
    /// Idempotent.
    pub fn start_garbage_collector(&self) -> Result<(), Error> {
        self.start_kcm(
            &self.garbage_collector,
            "kube-controller-manager-gc",
            "garbagecollector",
        )
    }

    fn start_kcm(
        &self,
        slot: &Mutex<Option<Supervised>>,
        name: &str,
        controllers: &str,
    ) -> Result<(), Error> {
        self.start_kcm_with(slot, name, controllers, &[])
    }

    fn start_kcm_with(
        &self,
        slot: &Mutex<Option<Supervised>>,
        name: &str,
        controllers: &str,
        extra: &[String],
    ) -> Result<(), Error> {
        let mut guard = slot
            .lock()
            .map_err(|_| Error::Config(format!("{name} lock poisoned")))?;
        if guard.is_some() {
            return Ok(());
        }
        let port = process::free_port()?;
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--authentication-kubeconfig={}", self.kubeconfig.display()),
            format!("--authorization-kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            format!("--root-ca-file={}", self.pki.ca_file.display()),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_key_file.display()
            ),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--controllers={controllers}"),
            "--concurrent-deployment-syncs=5".into(),
            "--concurrent-replicaset-syncs=5".into(),
            "--v=1".into(),
        ];
        args.extend_from_slice(extra);
        let kcm = Supervised::spawn(
            name,
            &binary("kube-controller-manager")?,
            &args,
            &self.dir.join(format!("{name}.log")),
        )?;
        if !process::wait_for_port(port, Duration::from_secs(60)) {
            return Err(Error::NotReady {
                name: name.into(),
                timeout: Duration::from_secs(60),
                log: kcm.log_tail(30),
            });
        }
        *guard = Some(kcm);
        Ok(())
    }

    /// Restarts kube-apiserver on the same port and etcd data (for fault tests) and waits
    /// until it is ready again.
    pub fn restart_apiserver(&self, down_for: Duration) -> Result<(), Error> {
        let port: u16 = self
            .server
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| Error::Config(format!("no port in {}", self.server)))?;
        let etcd_url = {
            let args = std::fs::read_to_string(self.dir.join("etcd-url")).ok();
            args.unwrap_or_default()
        };
        let mut api = self
            .apiserver
            .lock()
            .map_err(|_| Error::Config("apiserver lock poisoned".into()))?;
        api.stop();
        std::thread::sleep(down_for);
        *api = Supervised::spawn(
            "kube-apiserver",
            &binary("kube-apiserver")?,
            &apiserver_args(&self.dir, &self.pki, port, &etcd_url, self.address),
            &self.dir.join("kube-apiserver.log"),
        )?;
        drop(api);
        self.wait_ready(Duration::from_secs(120))
    }

    /// Write requests (create, update, patch, delete, deletecollection) recorded in the audit
    /// log, oldest first. Each is the audit event as JSON (`user.username`, `verb`,
    /// `objectRef`, `requestURI`, `responseStatus.code`, `stageTimestamp`).
    pub fn audit_writes(&self) -> Vec<serde_json::Value> {
        self.audit_events()
            .into_iter()
            .filter(|e| e["stage"] == "ResponseComplete")
            .filter(|e| {
                matches!(
                    e["verb"].as_str(),
                    Some("create" | "update" | "patch" | "delete" | "deletecollection")
                )
            })
            .collect()
    }

    /// Every request of ServiceAccount `username` (`system:serviceaccount:ns:sa`) recorded so
    /// far, reads included (get, list, watch): one event per request (a watch is recorded when
    /// its response starts, before it ends), oldest first. The audit policy records every verb
    /// of ServiceAccounts and only the writes of other users.
    pub fn audit_requests_by(&self, username: &str) -> Vec<serde_json::Value> {
        let mut seen = std::collections::HashSet::new();
        self.audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == username)
            .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
            .collect()
    }

    fn audit_events(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .collect()
    }

    /// Write requests made by `username` (e.g. `system:serviceaccount:ns:sa`) so far.
    pub fn audit_writes_by(&self, username: &str) -> Vec<serde_json::Value> {
        self.audit_writes()
            .into_iter()
            .filter(|e| e["user"]["username"] == username)
            .collect()
    }

    /// Stops every process of this control plane now.
    pub fn stop(&self) {
        if let Ok(mut g) = self.keda.lock()
            && let Some(k) = g.as_mut()
        {
            k.stop();
        }
        for slot in [
            &self.controller_manager,
            &self.garbage_collector,
            &self.hpa_controller,
        ] {
            if let Ok(mut g) = slot.lock()
                && let Some(k) = g.as_mut()
            {
                k.stop();
            }
        }
        if let Ok(mut a) = self.apiserver.lock() {
            a.stop();
        }
        if let Ok(mut e) = self.etcd.lock() {
            e.stop();
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Audit policy: every mutating request at Metadata level (tests count writes), and every
/// request of a ServiceAccount (the operator's RBAC test compares what it uses with what its
/// ClusterRole grants); nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: Metadata
  userGroups: [system:serviceaccounts]
- level: None
";

fn apiserver_args(
    dir: &Path,
    pki: &Pki,
    port: u16,
    etcd_url: &str,
    address: Option<std::net::Ipv4Addr>,
) -> Vec<String> {
    let host = address.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
    // Remember the etcd URL for restarts.
    let _ = std::fs::write(dir.join("etcd-url"), etcd_url);
    let _ = std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY);
    let mut args: Vec<String> = vec![
        format!(
            "--audit-policy-file={}",
            dir.join("audit-policy.yaml").display()
        ),
        format!("--audit-log-path={}", dir.join("audit.log").display()),
        "--audit-log-format=json".into(),
        "--audit-log-mode=blocking".into(),
        format!("--etcd-servers={etcd_url}"),
        format!("--bind-address={host}"),
        format!("--advertise-address={host}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", dir.join("certs").display()),
        format!("--tls-cert-file={}", pki.server_cert_file.display()),
        format!("--tls-private-key-file={}", pki.server_key_file.display()),
        format!("--client-ca-file={}", pki.ca_file.display()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        format!("--service-account-issuer=https://{host}:{port}"),
        format!("--service-account-key-file={}", pki.sa_pub_file.display()),
        format!(
            "--service-account-signing-key-file={}",
            pki.sa_key_file.display()
        ),
        // The aggregation layer (KEDA's metrics adapter serves external.metrics.k8s.io).
        format!(
            "--requestheader-client-ca-file={}",
            pki.front_proxy_ca_file.display()
        ),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!(
            "--proxy-client-cert-file={}",
            pki.front_proxy_client_cert_file.display()
        ),
        format!(
            "--proxy-client-key-file={}",
            pki.front_proxy_client_key_file.display()
        ),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        "--max-requests-inflight=2000".into(),
        "--max-mutating-requests-inflight=1000".into(),
        "--profiling=false".into(),
        "--v=0".into(),
    ];
    if address.is_some() {
        // A real node: kubelets authenticate as system:node:<name> and are authorized by the
        // Node authorizer; pods get ServiceAccount tokens (the ServiceAccount admission plugin).
        args.extend([
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!(
                "--kubelet-client-certificate={}",
                dir.join("apiserver-kubelet-client.crt").display()
            ),
            format!(
                "--kubelet-client-key={}",
                dir.join("apiserver-kubelet-client.key").display()
            ),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ]);
    } else {
        args.extend([
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
        ]);
    }
    args
}

fn admin_kubeconfig(server: &str, pki: &Pki) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: admin\n    namespace: default\ncurrent-context: envtest\n",
        b64(&pki.ca_pem),
        b64(&pki.admin_cert_pem),
        b64(&pki.admin_key_pem)
    )
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>, Error> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| Error::Config(format!("CA PEM: {e}")))
}

/// Polls `check` every `interval` on a runtime of its own until it is true (true) or `timeout`
/// passes (false). Blocks: call it outside an async runtime.
pub(crate) fn poll_blocking<F, Fut>(
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<bool, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("build a runtime".into(), e))?;
    Ok(rt.block_on(async {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if check().await {
                return true;
            }
            tokio::time::sleep(interval).await;
        }
        false
    }))
}

/// A short unique suffix (time and a counter; unique within and across test binaries).
pub fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    format!(
        "{:x}{n:x}",
        (t as u64 ^ u64::from(std::process::id()) << 40) & 0xff_ffff_ffff
    )
}
