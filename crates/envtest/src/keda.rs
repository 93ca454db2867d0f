//! Real KEDA and the real HPA controller on a test control plane.
//!
//! [`TestEnv::start_keda`] installs KEDA's CRDs (from the module KEDA was built from), starts
//! `keda-operator` and `keda-adapter` (KEDA's metrics API server) as processes on loopback, and
//! registers the adapter with the aggregation layer as `v1beta1.external.metrics.k8s.io`:
//!
//! ```text
//!  HPA controller (kube-controller-manager)
//!     │ GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>
//!     ▼
//!  kube-apiserver ──front-proxy client cert──▶ keda-adapter (127.0.0.1:<port>)
//!                                                   │ gRPC, mTLS (keda-certs/)
//!                                                   ▼
//!                                              keda-operator ──▶ the trigger's source
//! ```
//!
//! EndpointSlices refuse loopback addresses, so the APIService names a Service of type
//! `ExternalName` whose name is `127.0.0.1`, on the adapter's port, with this control plane's CA
//! as its `caBundle`. Both KEDA processes need `WATCH_NAMESPACE` (set, empty: every
//! namespace), `POD_NAMESPACE` and `KEDA_CLUSTER_OBJECT_NAMESPACE`.
//!
//! [`TestEnv::start_hpa_controller`] starts a kube-controller-manager running the
//! `horizontalpodautoscaling` controller alone, with its sync period and windows as flags (the
//! lab scales them with its time scale), logging every decision (`-v=4`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{self, Supervised};
use crate::{Error, TestEnv, binary_in};

/// KEDA's version (the wrapper module in `tools/k8s/keda` pins it).
pub const KEDA_VERSION: &str = "v2.21.0";

/// The namespace KEDA runs in (its `POD_NAMESPACE`).
pub const KEDA_NAMESPACE: &str = "keda";

/// The directory holding `keda-operator`, `keda-adapter` and `keda-crds/`: `$BP_K8S_BIN` if it
/// has them, otherwise the output of `tools/k8s/build.sh keda` (which builds KEDA once into the
/// cache, keyed by version, about 15 CPU-minutes cold).
pub fn keda_bin_dir() -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BP_K8S_BIN").map(PathBuf::from)
            && dir.join("keda-operator").is_file()
        {
            return Ok(dir);
        }
        crate::run_build_script(&["keda"])
    })
    .clone()
    .map_err(Error::Binaries)
}

/// The directory of KEDA's CRDs, without building KEDA: `$BP_K8S_BIN/keda-crds` if it exists,
/// otherwise that of `tools/k8s/build.sh`'s output (the CRDs come from a module download).
pub fn keda_crds_dir() -> Result<PathBuf, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("BP_K8S_BIN").map(PathBuf::from)
            && dir.join("keda-crds").is_dir()
        {
            return Ok(dir.join("keda-crds"));
        }
        crate::run_build_script(&[]).map(|dir| dir.join("keda-crds"))
    })
    .clone()
    .map_err(Error::Binaries)
}

/// The HPA controller's flags (`kube-controller-manager --horizontal-pod-autoscaler-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct HpaControllerFlags {
    /// `--horizontal-pod-autoscaler-sync-period` (upstream default 15 s).
    pub sync_period: Duration,
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (default 5 min): the scale-down
    /// window of HPAs without `behavior`, which is every HPA KEDA creates unless the
    /// ScaledObject sets one.
    pub downscale_stabilization: Duration,
    /// `--horizontal-pod-autoscaler-tolerance` (default 0.1).
    pub tolerance: f64,
}

impl Default for HpaControllerFlags {
    fn default() -> Self {
        HpaControllerFlags {
            sync_period: Duration::from_secs(15),
            downscale_stabilization: Duration::from_secs(300),
            tolerance: 0.1,
        }
    }
}

/// A running KEDA.
#[derive(Debug)]
pub struct Keda {
    operator: Supervised,
    adapter: Supervised,
    /// The operator's Prometheus metrics (`http://127.0.0.1:<port>/metrics`).
    pub operator_metrics: String,
}

impl Keda {
    /// The operator's log file.
    pub fn operator_log(&self) -> &Path {
        self.operator.log()
    }

    /// The adapter's log file.
    pub fn adapter_log(&self) -> &Path {
        self.adapter.log()
    }

    /// Stops both processes.
    pub fn stop(&mut self) {
        self.adapter.stop();
        self.operator.stop();
    }
}

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl TestEnv {
    /// Runs kubectl with the admin kubeconfig and `args`; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, Error> {
        let kubectl = binary_in(&crate::bin_dir()?, "kubectl")?;
        let out = std::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .map_err(|e| Error::io(format!("run {}", kubectl.display()), e))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Config(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Starts real KEDA (see the [module](self)) and waits until the external metrics API is
    /// served through the aggregator. Idempotent: a second call returns at once.
    pub fn start_keda(&self) -> Result<(), Error> {
        let mut slot = self
            .keda
            .lock()
            .map_err(|_| Error::Config("KEDA lock poisoned".into()))?;
        if slot.is_some() {
            return Ok(());
        }
        let dir = keda_bin_dir()?;
        // kubectl reads a symlink to a directory as a file: resolve it.
        let crds = dir.join("keda-crds");
        let crds = crds
            .canonicalize()
            .map_err(|e| Error::io(format!("resolve {}", crds.display()), e))?;
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crds.display().to_string(),
        ])?;
        // `kubectl wait` fails at once while a new CRD has no conditions yet: retry.
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=10s",
            "crd/scaledobjects.keda.sh",
            "crd/triggerauthentications.keda.sh",
            "crd/clustertriggerauthentications.keda.sh",
        ]) {
            if Instant::now() >= deadline {
                return Err(e);
            }
            std::thread::sleep(Duration::from_millis(300));
        }

        let adapter_port = process::free_port()?;
        let grpc_port = process::free_port()?;
        let certs = &self.pki.keda_cert_dir;
        let ca = std::fs::read_to_string(&self.pki.ca_file)
            .map_err(|e| Error::io(format!("read {}", self.pki.ca_file.display()), e))?;
        let registration = self.dir.join("keda-apiservice.yaml");
        std::fs::write(&registration, apiservice_yaml(adapter_port, &ca))
            .map_err(|e| Error::io(format!("write {}", registration.display()), e))?;
        self.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &registration.display().to_string(),
        ])?;

        let kubeconfig = self.kubeconfig.display().to_string();
        let env: [(&str, &str); 4] = [
            ("KUBECONFIG", &kubeconfig),
            ("WATCH_NAMESPACE", ""),
            ("POD_NAMESPACE", KEDA_NAMESPACE),
            ("KEDA_CLUSTER_OBJECT_NAMESPACE", KEDA_NAMESPACE),
        ];
        let metrics_port = process::free_port()?;
        let operator = Supervised::spawn_with_env(
            "keda-operator",
            &binary_in(&dir, "keda-operator")?,
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
                format!(
                    "--health-probe-bind-address=127.0.0.1:{}",
                    process::free_port()?
                ),
                format!("--metrics-service-bind-address=127.0.0.1:{grpc_port}"),
                format!("--cert-dir={}", certs.display()),
                format!("--ca-dir={}", certs.display()),
                "--enable-cert-rotation=false".into(),
                "--enable-webhook-patching=false".into(),
                "--enable-apiservice-patching=false".into(),
                "--leader-elect=false".into(),
                "--zap-log-level=info".into(),
            ],
            &env,
            &self.dir.join("keda-operator.log"),
        )?;
        if !process::wait_for_port(grpc_port, Duration::from_secs(60)) {
            return Err(Error::NotReady {
                name: "keda-operator".into(),
                timeout: Duration::from_secs(60),
                log: operator.log_tail(30),
            });
        }
        let adapter = Supervised::spawn_with_env(
            "keda-adapter",
            &binary_in(&dir, "keda-adapter")?,
            &[
                format!("--secure-port={adapter_port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--port={}", process::free_port()?),
                format!("--client-ca-file={}", certs.join("ca.crt").display()),
                format!("--tls-cert-file={}", certs.join("tls.crt").display()),
                format!("--tls-private-key-file={}", certs.join("tls.key").display()),
                format!("--cert-dir={}", certs.display()),
                format!("--metrics-service-address=127.0.0.1:{grpc_port}"),
                format!("--lister-kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                // Debug: one line per metric served ("Receiving metrics", with the values),
                // which the lab pairs with the HPA's syncs to record traces.
                "--zap-log-level=debug".into(),
                "--zap-time-encoding=rfc3339nano".into(),
            ],
            &env,
            &self.dir.join("keda-adapter.log"),
        )?;
        let mut keda = Keda {
            operator,
            adapter,
            operator_metrics: format!("http://127.0.0.1:{metrics_port}/metrics"),
        };
        // Served through the aggregator: the APIService is Available and discovery works.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match self.kubectl(&["get", "--raw", "/apis/external.metrics.k8s.io/v1beta1"]) {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    let log = format!(
                        "{e}\n--- keda-adapter ---\n{}\n--- keda-operator ---\n{}",
                        keda.adapter.log_tail(20),
                        keda.operator.log_tail(20)
                    );
                    keda.stop();
                    return Err(Error::NotReady {
                        name: "KEDA's external metrics API".into(),
                        timeout: Duration::from_secs(90),
                        log,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        *slot = Some(keda);
        Ok(())
    }

    /// KEDA's log files (operator, adapter), once started.
    pub fn keda_logs(&self) -> Option<(PathBuf, PathBuf)> {
        let g = self.keda.lock().ok()?;
        g.as_ref()
            .map(|k| (k.operator_log().to_owned(), k.adapter_log().to_owned()))
    }

    /// Starts a kube-controller-manager running the HPA controller alone, with `flags`, logging
    /// each decision at `-v=4` to `hpa-controller.log` in [`TestEnv::dir`]. Idempotent (the
    /// flags of the first call stay).
    pub fn start_hpa_controller(&self, flags: &HpaControllerFlags) -> Result<(), Error> {
        let mut extra = flags.args();
        extra.push("--v=4".into());
        self.start_kcm_with(
            &self.hpa_controller,
            "hpa-controller",
            "horizontalpodautoscaling",
            &extra,
        )
    }

    /// [`TestEnv::start_controller_manager`] with the HPA controller apart, started by
    /// [`TestEnv::start_hpa_controller`] with `flags` (the lab: its comparison's HPA runs on
    /// the scenario's time scale, and its decisions are logged for traces). Idempotent.
    pub fn start_controller_manager_with_hpa(
        &self,
        flags: &HpaControllerFlags,
    ) -> Result<(), Error> {
        self.start_kcm_and_hpa(crate::WORKLOAD_CONTROLLERS, flags)
    }

    /// [`TestEnv::start_controller_manager_with_nodes`] with the HPA controller apart, as
    /// [`TestEnv::start_controller_manager_with_hpa`]. Idempotent.
    pub fn start_controller_manager_with_nodes_and_hpa(
        &self,
        flags: &HpaControllerFlags,
    ) -> Result<(), Error> {
        self.start_kcm_and_hpa(crate::NODE_CONTROLLERS, flags)
    }

    /// kube-controller-manager with `controllers` but the HPA controller, which runs apart with
    /// `flags`.
    fn start_kcm_and_hpa(
        &self,
        controllers: &str,
        flags: &HpaControllerFlags,
    ) -> Result<(), Error> {
        self.start_kcm_with(
            &self.controller_manager,
            "kube-controller-manager",
            &format!("{controllers},-horizontalpodautoscaling"),
            &[],
        )?;
        self.start_hpa_controller(flags)
    }

    /// The HPA controller's log (`-v=4`: one "Proposing desired replicas" line per sync and
    /// HPA, then "Successfully rescaled" or "Decided not to scale").
    pub fn hpa_controller_log(&self) -> PathBuf {
        self.dir.join("hpa-controller.log")
    }

    /// KEDA's metrics adapter log (debug: one "Receiving metrics" line per metric served).
    pub fn keda_adapter_log(&self) -> PathBuf {
        self.dir.join("keda-adapter.log")
    }
}

impl HpaControllerFlags {
    /// The kube-controller-manager flags.
    pub fn args(&self) -> Vec<String> {
        vec![
            format!(
                "--horizontal-pod-autoscaler-sync-period={}",
                millis(self.sync_period)
            ),
            format!(
                "--horizontal-pod-autoscaler-downscale-stabilization={}",
                millis(self.downscale_stabilization)
            ),
            format!("--horizontal-pod-autoscaler-tolerance={}", self.tolerance),
        ]
    }
}

/// The `keda` namespace, the `ExternalName` Service pointing at the adapter on loopback, and
/// the APIService.
fn apiservice_yaml(port: u16, ca_pem: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: {KEDA_NAMESPACE}
---
apiVersion: v1
kind: Service
metadata:
  name: keda-metrics-apiserver
  namespace: {KEDA_NAMESPACE}
spec:
  type: ExternalName
  externalName: 127.0.0.1
  ports:
  - name: https
    port: {port}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.external.metrics.k8s.io
spec:
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: {ca}
  service:
    name: keda-metrics-apiserver
    namespace: {KEDA_NAMESPACE}
    port: {port}
"
    )
}
