//! The real node: it starts, runs a pod from a locally imported image on the bridge network,
//! and leaves the host as it found it. Needs root (see `backpressure_envtest::node`): where the
//! node cannot run, the test says why and passes, unless `BP_REQUIRE_NODE=1` (CI) makes that a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use backpressure_envtest::node::{BRIDGE, NODE_NAME};
use backpressure_envtest::{Error, NodeCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

/// One node per machine: the tests of this binary take turns (each compares the host before and
/// after).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn start() -> Option<NodeCluster> {
    match NodeCluster::start() {
        Ok(c) => Some(c),
        Err(Error::NodeUnavailable(why))
            if std::env::var("BP_REQUIRE_NODE").as_deref() != Ok("1") =>
        {
            eprintln!("SKIPPED: {why} (BP_REQUIRE_NODE=1 makes this a failure)");
            None
        }
        Err(e) => panic!("the real node did not start: {e}"),
    }
}

/// What the node changes on the host, as seen from outside.
#[derive(Debug, PartialEq)]
struct Host {
    bridge: bool,
    iptables_lines: usize,
    cgroup: bool,
    /// Which of the fixed paths the kubelet and containerd use exist.
    fixed_paths: Vec<bool>,
    /// Links in /var/log/containers into the node's directory, and CNI results of its network.
    leftovers: usize,
}

fn host_snapshot() -> Host {
    let bridge = std::process::Command::new("ip")
        .args(["link", "show", BRIDGE])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let mut iptables_lines = 0;
    for t in ["filter", "nat", "mangle"] {
        let out = std::process::Command::new("iptables-save")
            .args(["-t", t])
            .output()
            .unwrap();
        iptables_lines += String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("KUBE-") || l.contains("backpressure-envtest-node"))
            .count();
    }
    let cgroup = std::path::Path::new("/sys/fs/cgroup/memory/bp-envtest-node").exists()
        || std::path::Path::new("/sys/fs/cgroup/bp-envtest-node").exists();
    let fixed_paths = [
        "/var/lib/kubelet",
        "/run/containerd",
        "/var/log/containers",
        "/var/log/pods",
    ]
    .iter()
    .map(|p| std::path::Path::new(p).exists())
    .collect();
    let links = std::fs::read_dir("/var/log/containers")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.starts_with("/var/lib/backpressure-envtest/"))
        })
        .count();
    let results = std::fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("bp-node-"))
        .count();
    Host {
        bridge,
        iptables_lines,
        cgroup,
        fixed_paths,
        leftovers: links + results,
    }
}

#[test]
fn a_pod_runs_on_the_real_node_and_the_host_is_restored() {
    let _serial = serial();
    let before = host_snapshot();
    let Some(cluster) = start() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.env().client().unwrap();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sandbox"},
            "spec": {
                "containers": [{
                    "name": "pause",
                    "image": format!("localhost/backpressure-pause:node-k8s-{}", backpressure_envtest::KUBERNETES_VERSION.trim_start_matches('v')),
                    "imagePullPolicy": "Never",
                    "resources": {"limits": {"memory": "16Mi"}},
                }],
                "terminationGracePeriodSeconds": 1,
            }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let ip = loop {
            let p = pods.get("sandbox").await.unwrap();
            let status = p.status.unwrap_or_default();
            if status.phase.as_deref() == Some("Running") {
                break status.pod_ip.unwrap_or_default();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the pod is not Running: {status:?}\nkubelet log:\n{}",
                backpressure_envtest::process::tail(&cluster.dir().join("kubelet.log"), 40)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        assert!(ip.starts_with("10.213.0."), "pod IP {ip} is not on the bridge");
        let p = pods.get("sandbox").await.unwrap();
        assert_eq!(p.spec.unwrap().node_name.as_deref(), Some(NODE_NAME), "scheduled to the node");
        pods.delete("sandbox", &DeleteParams::default()).await.unwrap();
    });
    assert!(
        host_snapshot().bridge,
        "the bridge exists while the node runs"
    );
    drop(cluster);
    assert_eq!(
        host_snapshot(),
        before,
        "the host is restored (bridge, iptables, cgroups, fixed paths, links)"
    );
}

/// Run by [`a_crashed_test_process_leaves_the_host_restored`] in a child process: starts a
/// node with a pod, says so, and waits to be killed.
#[test]
fn crash_child() {
    if std::env::var("BP_NODE_CRASH_CHILD").as_deref() != Ok("1") {
        return;
    }
    let cluster = NodeCluster::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(cluster.env().client().unwrap(), "default");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left-behind"},
            "spec": {"containers": [{
                "name": "pause", "imagePullPolicy": "Never",
                "image": format!("localhost/backpressure-pause:node-k8s-{}", backpressure_envtest::KUBERNETES_VERSION.trim_start_matches('v')),
            }]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        loop {
            let phase = pods.get("left-behind").await.unwrap().status.and_then(|s| s.phase);
            if phase.as_deref() == Some("Running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    println!("NODE-RUNNING");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_crashed_test_process_leaves_the_host_restored() {
    if std::env::var("BP_NODE_CRASH_CHILD").as_deref() == Ok("1") {
        return;
    }
    let _serial = serial();
    // Preflight through a start that the child repeats: skip where no node can run.
    let Some(probe) = start() else { return };
    drop(probe);
    let before = host_snapshot();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("BP_NODE_CRASH_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !line.contains("NODE-RUNNING") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(
            n > 0 && std::time::Instant::now() < deadline,
            "the child did not start a node"
        );
    }
    assert!(host_snapshot().bridge, "the child's bridge exists");
    let shims = || {
        std::process::Command::new("pgrep")
            .args(["-f", "/var/lib/backpressure-envtest/node/"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0)
    };
    assert!(shims() > 0, "the child's containerd and its shim run");
    // A crash: no destructor runs.
    child.kill().unwrap();
    child.wait().unwrap();
    // The janitor removes the node's directory last (after the bridge, iptables and cgroups
    // this snapshot sees): wait for all of it, or a slow `rm -rf` of the images fails the test.
    let dir_exists = || std::path::Path::new("/var/lib/backpressure-envtest/node").exists();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while (host_snapshot() != before || shims() > 0 || dir_exists())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        host_snapshot(),
        before,
        "the janitor restored the host (bridge, iptables, cgroups, fixed paths, links)"
    );
    assert_eq!(shims(), 0, "no process of the node is left");
    assert!(!dir_exists(), "the node's directory is removed");
}
