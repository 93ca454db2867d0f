//! The lab's pods on a real node: the images `make image` built (imported into the node's
//! containerd) and the pod spec each Deployment's pods run, made from the same [`Launch`] the
//! kubelet stand-in runs as a process. The per-pod values come from the downward API:
//! `$(POD_NAME)` and `$(POD_IP)` in the arguments are expanded by the kubelet.
//!
//! Files the pods share with the lab (the initial worker configuration, the producers'
//! counters) live in one directory of the node ([`share_dir`]), mounted into every lab pod at
//! the same path, so that the paths in the arguments mean the same thing inside and outside.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{AsyncBufReadExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use kube::runtime::watcher;
use tokio::task::JoinHandle;

use crate::kubelet::Launch;

/// What the downward API's pod name expands from in a lab pod's arguments.
pub const POD_NAME: &str = "$(POD_NAME)";
/// What the downward API's pod IP expands from in a lab pod's arguments.
pub const POD_IP: &str = "$(POD_IP)";
/// Where the Go lab worker's image keeps the queue's Lua scripts.
pub const GO_SCRIPTS_DIR: &str = "/usr/share/backpressure-lab/lua";
/// A pod's ServiceAccount token and the cluster's CA, as the kubelet mounts them.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The registry part of the images' references (`make image`'s default `REGISTRY`).
const DEFAULT_REGISTRY: &str = "ghcr.io/backpressure-dev";

/// The images of a run, as OCI archives and references.
#[derive(Debug, Clone)]
pub struct Images {
    /// Their tag (`<version>` or `<version>-debug`).
    pub tag: String,
    registry: String,
    /// Archives to import: operator, lab worker, and the Go lab worker if needed.
    pub archives: Vec<PathBuf>,
}

impl Images {
    /// The archives `make image` saved in `out/images` (or `$BP_IMAGES_DIR`), with the tag
    /// `$BP_LAB_IMAGE_TAG`, else the newest of `<version>` and `<version>-debug`;
    /// `go_worker`: the Go lab worker's image is needed too. Errs naming what is missing.
    pub fn find(go_worker: bool) -> Result<Self, String> {
        let dir = std::env::var_os("BP_IMAGES_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::cluster::repo_root().join("out/images"));
        let registry =
            std::env::var("BP_LAB_IMAGE_REGISTRY").unwrap_or_else(|_| DEFAULT_REGISTRY.to_owned());
        let version = env!("CARGO_PKG_VERSION");
        let mut names = vec!["backpressure-operator", "backpressure-lab-worker"];
        if go_worker {
            names.push("backpressure-lab-worker-go");
        }
        let archives = |tag: &str| -> Vec<PathBuf> {
            names
                .iter()
                .map(|n| dir.join(format!("{n}_{tag}.oci.tar")))
                .collect()
        };
        let tag = match std::env::var("BP_LAB_IMAGE_TAG") {
            Ok(tag) if !tag.is_empty() => tag,
            _ => {
                let newest = |tag: &str| {
                    archives(tag)
                        .iter()
                        .map(|a| std::fs::metadata(a).and_then(|m| m.modified()).ok())
                        .collect::<Option<Vec<_>>>()
                        .and_then(|times| times.into_iter().min())
                };
                let (debug, release) = (format!("{version}-debug"), version.to_owned());
                match (newest(&debug), newest(&release)) {
                    (Some(d), Some(r)) if r > d => release,
                    (Some(_), _) => debug,
                    (None, _) => release,
                }
            }
        };
        let archives = archives(&tag);
        let missing: Vec<String> = archives
            .iter()
            .filter(|a| !a.is_file())
            .map(|a| a.display().to_string())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "no image archive {} (make image)",
                missing.join(", ")
            ));
        }
        Ok(Self {
            tag,
            registry,
            archives,
        })
    }

    /// The reference of image `name` (`<registry>/<name>:<tag>`).
    pub fn reference(&self, name: &str) -> String {
        format!("{}/{name}:{}", self.registry, self.tag)
    }
}

/// The directory of the node that the lab's pods share with the lab (removed with the node).
pub fn share_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("lab")
}

/// Creates the shared directory, readable by the pods' non-root user, and returns it.
pub fn create_share(node_dir: &Path) -> std::io::Result<PathBuf> {
    let dir = share_dir(node_dir);
    std::fs::create_dir_all(&dir)?;
    set_mode(&dir, 0o755)?;
    Ok(dir)
}

/// A directory the pods' non-root user writes into (the producers' counters).
pub fn create_writable(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    set_mode(dir, 0o1777)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The pod spec of a lab Deployment on a real node: one container of `image` running the
/// launch's arguments (the image's entrypoint is the program), the pod's name, IP and
/// namespace from the downward API, the admin port named as the operator looks for it, Ready
/// once that port accepts connections but not before `startup_delay` (the scenario's pod
/// startup time, as the stand-in reports it), the shared directory mounted at its own path,
/// non-root with a read-only root filesystem.
pub fn pod_spec(
    role: &str,
    launch: &Launch,
    image: &str,
    share: &Path,
    startup_delay: Duration,
) -> serde_json::Value {
    let port = launch.ready_port;
    let field = |name: &str, path: &str| serde_json::json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let share = share.display().to_string();
    serde_json::json!({
        "terminationGracePeriodSeconds": 10,
        "enableServiceLinks": false,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
        "containers": [{
            "name": role,
            "image": image,
            "imagePullPolicy": "Never",
            "args": launch.args,
            "env": [
                field("POD_NAME", "metadata.name"),
                field("POD_IP", "status.podIP"),
                field("POD_NAMESPACE", "metadata.namespace"),
            ],
            "ports": [{"name": backpressure_api::wire::ADMIN_PORT_NAME, "containerPort": port}],
            "readinessProbe": {
                "tcpSocket": {"port": port},
                "initialDelaySeconds": startup_delay.as_secs_f64().ceil() as i64,
                "periodSeconds": 1,
                "failureThreshold": 3,
            },
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [{"name": "lab", "mountPath": share}],
        }],
        "volumes": [{"name": "lab", "hostPath": {"path": share, "type": "Directory"}}],
    })
}

/// The container instance of a lab pod whose log can be read: its restart count once its
/// (single) container has started, running or already ended.
fn started_instance(pod: &Pod) -> Option<i32> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let state = status.state.as_ref()?;
    (state.running.is_some() || state.terminated.is_some()).then_some(status.restart_count)
}

/// Follows the log of every pod of `namespace` into `dir/<namespace>-<pod>.log` from the moment
/// its container starts until it ends, until the returned task is aborted. The kubelet drops a
/// deleted pod's log, so on a real node this is how the log of a pod the ReplicaSet scaled in
/// (and every pod's last lines after SIGTERM) is kept, as the stand-in keeps its processes'.
/// A restarted container is followed again, its lines appended after a header.
pub fn follow_logs(client: kube::Client, namespace: &str, dir: &Path) -> JoinHandle<()> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let (namespace, dir) = (namespace.to_owned(), dir.to_path_buf());
    tokio::spawn(async move {
        let mut followed: BTreeSet<(String, i32)> = BTreeSet::new();
        let mut stream = watcher(pods.clone(), watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(namespace = %namespace, error = %e, "lab: pod watch");
                    continue;
                }
            };
            let (Some(name), Some(instance)) = (pod.metadata.name.clone(), started_instance(&pod))
            else {
                continue;
            };
            if !followed.insert((name.clone(), instance)) {
                continue;
            }
            let path = dir.join(format!("{namespace}-{name}.log"));
            tokio::spawn(follow_one(pods.clone(), name, instance, path));
        }
    })
}

/// Appends the log of one container instance to `path` until the container ends.
async fn follow_one(pods: Api<Pod>, name: String, instance: i32, path: PathBuf) {
    let open = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    let mut file = match open {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "lab: cannot write a pod's log");
            return;
        }
    };
    if instance > 0 {
        let _ = writeln!(file, "==> container restart {instance}");
    }
    let params = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let mut lines = match pods.log_stream(&name, &params).await {
        Ok(reader) => Box::pin(reader).lines(),
        Err(e) => {
            let _ = writeln!(file, "(no log: {e})");
            return;
        }
    };
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => {
                let _ = writeln!(file, "{line}");
            }
            // How the kubelet ends the stream of a container that stopped, as well.
            Err(e) => {
                tracing::debug!(pod = %name, error = %e, "lab: pod log stream ended");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_pod_spec_runs_the_launch_with_downward_api_values_and_the_shared_dir() {
        let launch = Launch {
            program: "/x/backpressure-lab".into(),
            args: vec![
                "worker".into(),
                "--listen".into(),
                format!("{POD_IP}:9464"),
                "--consumer".into(),
                POD_NAME.into(),
                "--config".into(),
                "/var/lib/n/lab/worker-config-operator.json".into(),
            ],
            log: "/x/w.log".into(),
            ready_port: 9464,
        };
        let spec = pod_spec(
            "worker",
            &launch,
            "r/backpressure-lab-worker:1",
            Path::new("/var/lib/n/lab"),
            Duration::from_millis(2500),
        );
        let c = &spec["containers"][0];
        assert_eq!(c["args"][2], "$(POD_IP):9464");
        assert_eq!(c["args"][4], "$(POD_NAME)");
        assert_eq!(c["image"], "r/backpressure-lab-worker:1");
        assert_eq!(c["readinessProbe"]["initialDelaySeconds"], 3);
        assert_eq!(
            c["ports"][0]["name"],
            backpressure_api::wire::ADMIN_PORT_NAME
        );
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/var/lib/n/lab");
        assert_eq!(spec["volumes"][0]["hostPath"]["path"], "/var/lib/n/lab");
        let env: Vec<&str> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(env, ["POD_NAME", "POD_IP", "POD_NAMESPACE"]);
        // It is a valid pod spec.
        let _: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(spec).unwrap();
    }

    #[test]
    fn a_pod_log_is_followed_once_per_started_container_instance() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "w-1"},
                "status": status,
            }))
            .unwrap()
        };
        let container = |restarts: i32, state: serde_json::Value| {
            serde_json::json!({"containerStatuses": [{
                "name": "worker", "image": "i", "imageID": "", "ready": false,
                "restartCount": restarts, "state": state,
            }]})
        };
        assert_eq!(started_instance(&pod(serde_json::json!({}))), None);
        let waiting = container(
            0,
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}}),
        );
        assert_eq!(started_instance(&pod(waiting)), None);
        let running = container(0, serde_json::json!({"running": {}}));
        assert_eq!(started_instance(&pod(running)), Some(0));
        let ended = container(2, serde_json::json!({"terminated": {"exitCode": 0}}));
        assert_eq!(started_instance(&pod(ended)), Some(2));
    }
}
