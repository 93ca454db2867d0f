//! A real Kubernetes node on this machine: containerd + runc + a CNI bridge + kubelet +
//! kube-scheduler + kube-proxy, joined to a [`TestEnv`] that listens on the bridge.
//!
//! ```text
//!   host                                        pods (10.213.0.0/24, one netns each)
//!   ──────────────────────────────────────      ─────────────────────────────────────
//!   kube-apiserver  https://10.213.0.1:<p>  ◄── kubernetes Service 10.0.0.1:443 (kube-proxy DNAT)
//!   etcd, kube-controller-manager, scheduler     projected ServiceAccount tokens
//!   kubelet ── CRI ──► containerd ── runc        pod IPs on bridge bpn0 (10.213.0.1 = node IP)
//!   tests, Prometheus, Redis ◄─────────────────► pod IPs, directly over the bridge
//! ```
//!
//! The recipe (configs, errors met, host state) is measured in the project's research note on
//! a real node. What this module adds is the lifecycle:
//!
//! - **Preflight** ([`NodeCluster::start`]): root, writable cgroups, the Debian binaries
//!   (`containerd`, `runc`, `iptables`, `ip`, the CNI plugins) and the node binaries
//!   (`tools/k8s/build.sh node`). What is missing is an [`Error::NodeUnavailable`] naming it,
//!   so that a caller can fall back to the kubelet stand-in and say which one runs.
//! - **One node per machine** at a time: a lock file is held for the node's life (kube-proxy's
//!   `KUBE-*` chains are per host).
//! - **Host state restored, also after a crash**: everything the node changes on the host is
//!   undone by one teardown script written before the change (processes in the node's cgroups
//!   and containerd's shims killed, mounts under its directories unmounted deepest first, the
//!   bridge and its veths deleted, `KUBE-*` chains and the harness's own rules removed, the
//!   recorded sysctls restored, cgroups removed depth first, directories removed). It runs
//!   when the node is dropped; a janitor in its own process group runs it when the test
//!   process dies without dropping it; the next start runs any script left behind.
//! - **Traffic stays on the machine**: the bridge is a local subnet, and forwarding from it to
//!   any other interface is dropped.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::Api;

use crate::{Error, HpaControllerFlags, Supervised, TestEnv, process, run_build_script};

/// The node's name (its `kubernetes.io/hostname`).
pub const NODE_NAME: &str = "bp-node";
/// The bridge the pods are attached to; its address is the node IP and the API server's.
pub const BRIDGE: &str = "bpn0";
/// The bridge's address.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// The pod subnet on the bridge.
pub const POD_CIDR: &str = "10.213.0.0/24";
/// The Service range of the API server (the `kubernetes` Service is its first address).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The cgroup (in every hierarchy) the kubelet puts its pods under.
const CGROUP_ROOT: &str = "bp-envtest-node";
/// Where the node keeps its state (containerd's root and state, the kubelet's root dir): not
/// under the temporary directory, whose janitor must not walk into live mounts.
const BASE: &str = "/var/lib/backpressure-envtest";
/// The comment on the harness's own iptables rules.
const RULE_COMMENT: &str = "backpressure-envtest-node";
/// The Debian binaries the node runs.
/// How many times the kubelet is restarted when it exits on its own (systemd restarts a real
/// node's kubelet; 1.35.4 has been seen to die at start-up on a concurrent map access).
const KUBELET_RESTARTS: u32 = 3;
const RUNC: &str = "/usr/sbin/runc";
const CNI_BIN: &str = "/usr/lib/cni";

/// A control plane with one real node, started together: see the module documentation.
#[derive(Debug)]
pub struct NodeCluster {
    env: TestEnv,
    dir: PathBuf,
    containerd_socket: PathBuf,
    processes: Vec<Supervised>,
    teardown: PathBuf,
    _lock: std::fs::File,
}

impl NodeCluster {
    /// Starts the control plane on the bridge address and the node, and waits until the node
    /// is Ready and the `default` ServiceAccount exists (pods can be created). Blocks; call it
    /// outside an async runtime or from `spawn_blocking`.
    pub fn start() -> Result<NodeCluster, Error> {
        Self::start_with(None)
    }

    /// [`NodeCluster::start`] with the HPA controller apart, run with `hpa` (the lab's
    /// comparison: its HPA syncs on the scenario's time scale and logs its decisions), as
    /// [`TestEnv::start_controller_manager_with_hpa`] does on a control plane without a node.
    pub fn start_with(hpa: Option<&HpaControllerFlags>) -> Result<NodeCluster, Error> {
        let bin = preflight()?;
        let base = Path::new(BASE);
        std::fs::create_dir_all(base)
            .map_err(|e| Error::io(format!("create {}", base.display()), e))?;
        let lock = lock(&base.join("node.lock"))?;
        // Whatever a node before left behind (its process died before its teardown ran).
        for stale in stale_teardowns(base) {
            tracing::warn!(script = %stale.display(), "a previous test node was not torn down; tearing it down");
            run_teardown(&stale);
        }
        let dir = base.join("node");
        let teardown = base.join(format!("node.teardown.{}", std::process::id()));
        let host = HostState::record();
        std::fs::write(&teardown, teardown_script(&dir, &host))
            .map_err(|e| Error::io(format!("write {}", teardown.display()), e))?;
        spawn_janitor(&base.join("node.lock"), &teardown)?;
        // From here on every failure runs the teardown (the guard's drop).
        let guard = TeardownGuard(Some(teardown.clone()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        setup_network()?;
        setup_cgroups()?;

        let env = TestEnv::start_on(Some(NODE_IP))?;
        match hpa {
            Some(flags) => env.start_controller_manager_with_nodes_and_hpa(flags)?,
            None => env.start_controller_manager_with_nodes()?,
        }
        let mut processes = Vec::new();

        // containerd, with the pause image imported for the pod sandboxes.
        let containerd_socket = dir.join("containerd.sock");
        let config = dir.join("containerd.toml");
        std::fs::write(
            &config,
            containerd_config(&dir, &containerd_socket, &pause_ref()),
        )
        .map_err(|e| Error::io(format!("write {}", config.display()), e))?;
        std::fs::create_dir_all(dir.join("cni"))
            .map_err(|e| Error::io("create the CNI config dir".into(), e))?;
        std::fs::write(dir.join("cni/10-bp.conflist"), cni_config())
            .map_err(|e| Error::io("write the CNI config".into(), e))?;
        let containerd = Supervised::spawn(
            "containerd",
            Path::new(&which("containerd")?),
            &[format!("--config={}", config.display())],
            &dir.join("containerd.log"),
        )?;
        let up = wait_until(Duration::from_secs(30), || containerd_socket.exists());
        processes.push(containerd);
        if !up {
            return Err(not_ready("containerd", 30, &dir.join("containerd.log")));
        }
        let mut cluster = NodeCluster {
            env,
            dir: dir.clone(),
            containerd_socket,
            processes,
            teardown: teardown.clone(),
            _lock: lock,
        };
        cluster.import_image(&bin.join("pause.oci.tar"))?;

        // kubelet, with a node client certificate (system:node:<name> in system:nodes).
        let pki = cluster.env.pki().clone();
        let node_cert = pki.issue(
            &dir,
            "kubelet-client",
            &format!("system:node:{NODE_NAME}"),
            &["system:nodes"],
            &[],
            &[],
        )?;
        let kubelet_kubeconfig = dir.join("kubelet.kubeconfig");
        std::fs::write(
            &kubelet_kubeconfig,
            cert_kubeconfig(
                cluster.env.server_url(),
                &pki.ca_file,
                &node_cert.cert_file,
                &node_cert.key_file,
            ),
        )
        .map_err(|e| Error::io("write the kubelet kubeconfig".into(), e))?;
        let kubelet_config = dir.join("kubelet.yaml");
        std::fs::write(
            &kubelet_config,
            kubelet_config_yaml(
                &dir,
                &cluster.containerd_socket,
                &pki.ca_file,
                process::free_port()?,
                process::free_port()?,
            ),
        )
        .map_err(|e| Error::io("write the kubelet config".into(), e))?;
        let kubelet = Supervised::spawn_restarting(
            "kubelet",
            &bin.join("kubelet"),
            &[
                format!("--config={}", kubelet_config.display()),
                format!("--kubeconfig={}", kubelet_kubeconfig.display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={NODE_IP}"),
                "--v=1".into(),
            ],
            &dir.join("kubelet.log"),
            KUBELET_RESTARTS,
        )?;
        cluster.processes.push(kubelet);

        let admin = cluster.env.kubeconfig_path().to_owned();
        let scheduler = Supervised::spawn(
            "kube-scheduler",
            &bin.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", admin.display()),
                format!("--authentication-kubeconfig={}", admin.display()),
                format!("--authorization-kubeconfig={}", admin.display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", process::free_port()?),
                "--v=1".into(),
            ],
            &dir.join("kube-scheduler.log"),
        )?;
        cluster.processes.push(scheduler);

        let proxy_config = dir.join("kube-proxy.yaml");
        std::fs::write(
            &proxy_config,
            kube_proxy_config_yaml(&admin, process::free_port()?, process::free_port()?),
        )
        .map_err(|e| Error::io("write the kube-proxy config".into(), e))?;
        let proxy = Supervised::spawn(
            "kube-proxy",
            &bin.join("kube-proxy"),
            &[
                format!("--config={}", proxy_config.display()),
                "--v=1".into(),
            ],
            &dir.join("kube-proxy.log"),
        )?;
        cluster.processes.push(proxy);

        cluster.wait_ready(Duration::from_secs(120))?;
        std::mem::forget(guard);
        Ok(cluster)
    }

    /// The control plane (its API server listens on [`NODE_IP`]).
    pub fn env(&self) -> &TestEnv {
        &self.env
    }

    /// The node's directory (logs of containerd, kubelet, kube-scheduler, kube-proxy).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Imports an OCI archive (`podman save --format oci-archive`) into the node's image
    /// store; pods use it with `imagePullPolicy: Never`.
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        let out = Command::new(which("ctr")?)
            .arg(format!("--address={}", self.containerd_socket.display()))
            .args(["--namespace=k8s.io", "images", "import", "--no-unpack"])
            .arg(archive)
            .output()
            .map_err(|e| Error::io("run ctr images import".into(), e))?;
        if !out.status.success() {
            return Err(Error::Config(format!(
                "ctr images import {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        // Ready, with its `not-ready` taint lifted by the node lifecycle controller, and the
        // `default` ServiceAccount there (pods can be created).
        let ready = crate::poll_blocking(timeout, Duration::from_millis(250), || async {
            let Ok(client) = self.env.client() else {
                return false;
            };
            let nodes: Api<Node> = Api::all(client.clone());
            let sas: Api<ServiceAccount> = Api::namespaced(client, "default");
            let node = nodes.get_opt(NODE_NAME).await.ok().flatten();
            let node_ready = node.as_ref().is_some_and(|n| {
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let tainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| !t.is_empty());
                ready && !tainted
            });
            node_ready && sas.get_opt("default").await.ok().flatten().is_some()
        })?;
        if ready {
            Ok(())
        } else {
            Err(not_ready(
                "the node (kubelet)",
                timeout.as_secs(),
                &self.dir.join("kubelet.log"),
            ))
        }
    }

    /// Stops every process and restores the host.
    pub fn stop(&mut self) {
        for p in self.processes.iter_mut().rev() {
            p.stop();
        }
        self.processes.clear();
        self.env.stop();
        if self.teardown.exists() {
            run_teardown(&self.teardown);
        }
    }
}

impl Drop for NodeCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the teardown script when a start fails half-way.
struct TeardownGuard(Option<PathBuf>);

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if let Some(script) = self.0.take() {
            run_teardown(&script);
        }
    }
}

/// The reference of the pause image `tools/k8s/build.sh node` builds.
fn pause_ref() -> String {
    format!(
        "localhost/backpressure-pause:node-k8s-{}",
        crate::KUBERNETES_VERSION.trim_start_matches('v')
    )
}

/// Checks what the node needs and returns the directory of its binaries, or says what is
/// missing ([`Error::NodeUnavailable`]).
fn preflight() -> Result<PathBuf, Error> {
    let unavailable = |why: String| Error::NodeUnavailable(why);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root {
        return Err(unavailable("not running as root".into()));
    }
    if cgroup_hierarchies().is_empty() {
        return Err(unavailable(
            "no cgroup hierarchy under /sys/fs/cgroup".into(),
        ));
    }
    let probe = Path::new("/sys/fs/cgroup").join(
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            "bp-envtest-probe"
        } else {
            "memory/bp-envtest-probe"
        },
    );
    if let Err(e) = std::fs::create_dir(&probe)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        return Err(unavailable(format!(
            "cgroups are not writable ({}: {e})",
            probe.display()
        )));
    }
    let _ = std::fs::remove_dir(&probe);
    for tool in ["containerd", "ctr", "iptables", "iptables-save", "ip"] {
        which(tool).map_err(|_| {
            unavailable(format!(
                "{tool} is not installed (apt-get install containerd iptables iproute2)"
            ))
        })?;
    }
    if !Path::new(RUNC).is_file() {
        return Err(unavailable(format!(
            "{RUNC} is missing (apt-get install runc)"
        )));
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new(CNI_BIN).join(plugin).is_file() {
            return Err(unavailable(format!(
                "{CNI_BIN}/{plugin} is missing (apt-get install containernetworking-plugins)"
            )));
        }
    }
    let has_node = |d: &Path| {
        ["kubelet", "kube-scheduler", "kube-proxy", "pause.oci.tar"]
            .iter()
            .all(|b| d.join(b).exists())
    };
    if let Ok(dir) = crate::bin_dir()
        && has_node(&dir)
    {
        return Ok(dir);
    }
    let dir = run_build_script(&["node"]).map_err(Error::Binaries)?;
    if has_node(&dir) {
        Ok(dir)
    } else {
        Err(Error::Binaries(format!(
            "{} has no kubelet, kube-scheduler, kube-proxy or pause image after `tools/k8s/build.sh node`",
            dir.display()
        )))
    }
}

fn which(tool: &str) -> Result<String, Error> {
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
    {
        let p = Path::new(dir).join(tool);
        if p.is_file() {
            return Ok(p.display().to_string());
        }
    }
    Err(Error::NodeUnavailable(format!("{tool} is not installed")))
}

/// Takes the machine's node lock, waiting up to 20 minutes for another test's node.
fn lock(path: &Path) -> Result<std::fs::File, Error> {
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let deadline = Instant::now() + Duration::from_secs(20 * 60);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::NodeUnavailable(format!(
                    "{} is held by another test's node",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io(format!("lock {}", path.display()), e));
            }
        }
    }
}

fn stale_teardowns(base: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("node.teardown."))
        })
        .collect();
    found.sort();
    found
}

fn run_teardown(script: &Path) {
    let out = Command::new("bash").arg(script).output();
    match out {
        Ok(o) if o.status.success() => {
            let _ = std::fs::remove_file(script);
        }
        Ok(o) => tracing::warn!(
            script = %script.display(),
            stderr = %String::from_utf8_lossy(&o.stderr),
            "node teardown failed"
        ),
        Err(e) => {
            tracing::warn!(script = %script.display(), error = %e, "node teardown did not run")
        }
    }
}

/// Runs the teardown script once the test process is gone, unless it has run (and removed
/// itself) before; in its own process group, under the node lock.
fn spawn_janitor(lock: &Path, teardown: &Path) -> Result<(), Error> {
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
sleep 1
exec flock "$2" sh -c '[ ! -f "$1" ] || { bash "$1" && rm -f "$1"; }' teardown "$3""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("node-janitor")
        .arg(std::process::id().to_string())
        .arg(lock)
        .arg(teardown)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io("spawn the node janitor".into(), e))?;
    Ok(())
}

/// Sysctls the node changes (the bridge plugin, the kubelet, kube-proxy) with their values
/// before it started.
#[derive(Debug)]
struct HostState {
    sysctls: Vec<(String, String)>,
    /// Directories the kubelet and containerd create at fixed paths whatever their root dirs
    /// (the device-plugin socket dir, the shim sockets, the container log links) that did not
    /// exist before: the teardown removes them.
    absent: Vec<&'static str>,
}

/// The fixed paths the node may create (see [`HostState::absent`]).
const FIXED_PATHS: [&str; 4] = [
    "/var/lib/kubelet",
    "/run/containerd",
    "/var/log/containers",
    "/var/log/pods",
];

impl HostState {
    fn record() -> Self {
        let keys = [
            "net/ipv4/ip_forward",
            "net/bridge/bridge-nf-call-iptables",
            "net/ipv4/conf/all/route_localnet",
            "kernel/panic",
            "kernel/panic_on_oops",
            "vm/overcommit_memory",
            "vm/panic_on_oom",
            "kernel/keys/root_maxkeys",
            "kernel/keys/root_maxbytes",
        ];
        let sysctls = keys
            .iter()
            .filter_map(|k| {
                std::fs::read_to_string(Path::new("/proc/sys").join(k))
                    .ok()
                    .map(|v| ((*k).to_owned(), v.trim().to_owned()))
            })
            .collect();
        let absent = FIXED_PATHS
            .into_iter()
            .filter(|p| !Path::new(p).exists())
            .collect();
        HostState { sysctls, absent }
    }
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    dirs.sort();
    dirs
}

/// The script that restores the host: idempotent, each step tolerant of what is already gone.
fn teardown_script(dir: &Path, host: &HostState) -> String {
    let dir = dir.display();
    let mut s = String::from(
        "#!/usr/bin/env bash\n# Restores the host after a backpressure-envtest node (written before the node started).\nset -u\n",
    );
    // Processes: the pods' (in the node's cgroups), then containerd's shims and anything else
    // started with the node's directory on its command line.
    let _ = writeln!(
        s,
        "for h in /sys/fs/cgroup /sys/fs/cgroup/*; do\n  [ -d \"$h/{CGROUP_ROOT}\" ] || continue\n  find \"$h/{CGROUP_ROOT}\" -name cgroup.procs -exec cat {{}} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null\ndone"
    );
    let _ = writeln!(s, "pkill -KILL -f -- '{dir}/' 2>/dev/null\nsleep 0.5");
    // Mounts under the node's directory, deepest first.
    let _ = writeln!(
        s,
        "awk -v d='{dir}' '$5 == d || index($5, d \"/\") == 1 {{ print length($5), $5 }}' /proc/self/mountinfo | sort -rn | cut -d' ' -f2- | while read -r m; do umount -l \"$m\" 2>/dev/null; done"
    );
    // The bridge, its veths, and the network namespaces containerd left.
    let _ = writeln!(
        s,
        "for v in $(ip -o link show master {BRIDGE} 2>/dev/null | awk -F': ' '{{print $2}}' | cut -d@ -f1); do ip link del \"$v\" 2>/dev/null; done\nip link del {BRIDGE} 2>/dev/null"
    );
    // iptables: the KUBE-* chains and rules (kubelet, kube-proxy) and the harness's rules.
    let _ = writeln!(
        s,
        "for t in filter nat mangle; do\n  if iptables-save -t \"$t\" 2>/dev/null | grep -q -e KUBE- -e '{RULE_COMMENT}'; then\n    iptables-save -t \"$t\" | grep -v -e KUBE- -e '{RULE_COMMENT}' | iptables-restore -T \"$t\"\n  fi\ndone"
    );
    for (key, value) in &host.sysctls {
        let _ = writeln!(s, "echo '{value}' > /proc/sys/{key} 2>/dev/null");
    }
    // cgroups, depth first.
    let _ = writeln!(
        s,
        "for h in /sys/fs/cgroup /sys/fs/cgroup/*; do\n  [ -d \"$h/{CGROUP_ROOT}\" ] || continue\n  find \"$h/{CGROUP_ROOT}\" -depth -type d -exec rmdir {{}} + 2>/dev/null\ndone"
    );
    // What the kubelet and containerd write at fixed paths: the links to the node's container
    // logs, the CNI result cache of its network, and the fixed directories it created.
    let _ = writeln!(
        s,
        "find /var/log/containers -maxdepth 1 -lname '{dir}/*' -delete 2>/dev/null\nrm -f /var/lib/cni/results/bp-node-* 2>/dev/null"
    );
    for path in &host.absent {
        let _ = writeln!(s, "rm -rf '{path}'");
    }
    let _ = writeln!(s, "rm -rf '{dir}'\nexit 0");
    s
}

fn run(cmd: &str, args: &[&str]) -> Result<(), Error> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| Error::io(format!("run {cmd}"), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn setup_network() -> Result<(), Error> {
    // Under the node lock a bridge of this name is a node's that left no teardown script
    // (killed before it wrote one): remove it.
    if run("ip", &["link", "show", BRIDGE]).is_ok() {
        tracing::warn!(
            bridge = BRIDGE,
            "a previous test node's bridge is still there; deleting it"
        );
        run("ip", &["link", "del", BRIDGE])?;
    }
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run(
        "ip",
        &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
    )?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    // Pods talk to the node and to each other, never past the machine.
    run(
        "iptables",
        &[
            "-I",
            "FORWARD",
            "-i",
            BRIDGE,
            "!",
            "-o",
            BRIDGE,
            "-m",
            "comment",
            "--comment",
            RULE_COMMENT,
            "-j",
            "DROP",
        ],
    )?;
    Ok(())
}

fn setup_cgroups() -> Result<(), Error> {
    for h in cgroup_hierarchies() {
        let d = h.join(CGROUP_ROOT);
        std::fs::create_dir_all(&d).map_err(|e| Error::io(format!("create {}", d.display()), e))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(h.join(f))
                && d.join(f).exists()
            {
                std::fs::write(d.join(f), v.trim())
                    .map_err(|e| Error::io(format!("write {}", d.join(f).display()), e))?;
            }
        }
    }
    Ok(())
}

fn wait_until(timeout: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn not_ready(name: &str, secs: u64, log: &Path) -> Error {
    Error::NotReady {
        name: name.into(),
        timeout: Duration::from_secs(secs),
        log: process::tail(log, 40),
    }
}

fn containerd_config(dir: &Path, socket: &Path, pause: &str) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{RUNC}"
        Root = "{d}/runc"
"#,
        socket = socket.display()
    )
}

fn cni_config() -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "bp-node",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": "{POD_CIDR}", "gateway": "{NODE_IP}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}],
        "dataDir": "{BASE}/node/cni-ipam"
      }}
    }},
    {{ "type": "loopback" }}
  ]
}}
"#
    )
}

fn cert_kubeconfig(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: node\n  context:\n    cluster: envtest\n    user: node\ncurrent-context: node\n",
        ca.display(),
        cert.display(),
        key.display()
    )
}

fn kubelet_config_yaml(dir: &Path, socket: &Path, ca: &Path, port: u16, healthz: u16) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
maxPods: 110
podLogsDir: {logs}
"#,
        logs = dir.join("pod-logs").display(),
        socket = socket.display(),
        ca = ca.display()
    )
}

fn kube_proxy_config_yaml(kubeconfig: &Path, healthz: u16, metrics: u16) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: {POD_CIDR}
hostnameOverride: {NODE_NAME}
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
nodePortAddresses: ["{NODE_IP}/32"]
clientConnection:
  kubeconfig: {kubeconfig}
conntrack:
  maxPerCore: 0
  min: 0
"#,
        kubeconfig = kubeconfig.display()
    )
}
