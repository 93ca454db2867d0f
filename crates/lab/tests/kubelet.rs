//! The kubelet stand-in and the lab worker against real components: etcd, kube-apiserver,
//! kube-controller-manager, redis-server, the lab's dependency and real worker processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backpressure_api::wire::{CONFIG_PATH, WorkerConfig};
use backpressure_lab::cluster::Cluster;
use backpressure_lab::dependency::Dependency;
use backpressure_lab::kubelet::{Kubelet, Launch};
use backpressure_lab::queue::{Queue, RedisServer};
use backpressure_lab::scenario::DependencySpec;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use tokio::time::Instant;

async fn ready_pods(api: &Api<Pod>) -> Vec<(String, String)> {
    api.list(&ListParams::default().labels("app=w"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|p| {
            (
                p.metadata.name.unwrap(),
                p.status.and_then(|s| s.pod_ip).unwrap_or_default(),
            )
        })
        .collect()
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn all_pods(api: &Api<Pod>) -> usize {
    api.list(&ListParams::default().labels("app=w"))
        .await
        .unwrap()
        .items
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_become_worker_processes_that_consume_and_accept_only_the_operator() {
    backpressure_lab::install_crypto_provider();
    let dir = tempdir();
    let mut cluster = Cluster::start().await.unwrap();
    let client = cluster.client().unwrap();
    let ns = "kubelet-test";
    cluster.namespace(ns).await.unwrap();
    cluster.service_account(ns, "operator").await.unwrap();
    cluster.service_account(ns, "intruder").await.unwrap();

    let mut redis = RedisServer::start(&dir.join("redis")).unwrap();
    let queue = Queue::connect(&redis.url(), ns, Duration::from_secs(2), 3)
        .await
        .unwrap();
    queue.create().await.unwrap();
    let spec: DependencySpec =
        serde_yaml::from_str("latency: 5ms\ncapacity:\n- {at: 0s, value: 1000}\n").unwrap();
    let dep = Dependency::start(spec, 1, Instant::now(), ns, std::net::Ipv4Addr::LOCALHOST)
        .await
        .unwrap();

    let cfg_path = dir.join("cfg.json");
    std::fs::write(
        &cfg_path,
        serde_json::to_vec(&WorkerConfig::default()).unwrap(),
    )
    .unwrap();
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_backpressure-lab"));
    let (redis_url, dep_url) = (redis.url(), dep.url());
    let kubeconfig = cluster.kubeconfig().to_path_buf();
    let logs = dir.clone();
    let launcher: backpressure_lab::kubelet::Launcher = Arc::new(move |ns, pod, _role, ip| {
        if ns == "crashy" {
            // A worker that exits at once: the stand-in restarts it, as a kubelet would.
            return Some(Launch {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), "sleep 0.2; exit 1".into()],
                log: logs.join(format!("{pod}.log")),
                ready_port: 9464,
            });
        }
        Some(Launch {
            program: exe.clone(),
            args: [
                "worker",
                "--listen",
                &format!("{ip}:9464"),
                "--redis",
                &redis_url,
                "--queue",
                ns,
                "--consumer",
                pod,
                "--dependency",
                &dep_url,
                "--workload",
                "w",
                "--namespace",
                ns,
                "--processing",
                "1ms",
                "--visibility-timeout",
                "2s",
                "--max-deliveries",
                "3",
                "--config",
                &cfg_path.display().to_string(),
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--allowed-identity",
                "system:serviceaccount:kubelet-test:operator",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
            log: logs.join(format!("{pod}.log")),
            ready_port: 9464,
        })
    });
    let kubelet = Kubelet::start(
        client.clone(),
        "test-node",
        Duration::from_millis(500),
        launcher,
    )
    .await
    .unwrap();

    cluster.create_workload(ns, "w", 2).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for("2 ready pods", Duration::from_secs(60), || async {
        ready_pods(&pods).await.len() == 2
    })
    .await;
    let ips: BTreeSet<String> = ready_pods(&pods).await.into_iter().map(|p| p.1).collect();
    // Lowest free addresses of 127.0.0.N (another lab on the machine may hold some).
    assert_eq!(ips.len(), 2);
    assert!(ips.iter().all(|ip| ip.starts_with("127.0.0.")), "{ips:?}");
    let (first, second) = {
        let mut v: Vec<&String> = ips.iter().collect();
        v.sort_by_key(|ip| ip.rsplit('.').next().and_then(|n| n.parse::<u8>().ok()));
        (v[0].clone(), v[1].clone())
    };
    assert_eq!(kubelet.running(), 2);

    // The workers consume.
    queue
        .produce(&(0..200).map(|i| format!("m{i}")).collect::<Vec<_>>())
        .await
        .unwrap();
    wait_for("200 completions", Duration::from_secs(30), || async {
        queue.stats().await.unwrap().completed == 200
    })
    .await;
    let http = reqwest::Client::new();
    let metrics = http
        .get(format!("http://{first}:9464/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("backpressure_outcomes_total"), "{metrics}");

    // Config pushes: only the allowed ServiceAccount's token with the right audience.
    let pushed = WorkerConfig {
        generation: 3,
        max_permits: 7,
        ..WorkerConfig::default()
    }
    .with_hash();
    let put = |token: String| {
        let http = http.clone();
        let second = second.clone();
        let body = serde_json::to_vec(&pushed).unwrap();
        async move {
            http.put(format!("http://{second}:9464{CONFIG_PATH}"))
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let token = |sa: &'static str| {
        let cluster = &cluster;
        async move {
            cluster
                .kubectl(
                    &[
                        "create",
                        "token",
                        sa,
                        "-n",
                        ns,
                        "--audience",
                        &backpressure_api::wire::push_audience(ns, "w"),
                    ],
                    None,
                )
                .await
                .unwrap()
                .trim()
                .to_owned()
        }
    };
    assert_eq!(put(token("intruder").await).await, 403);
    assert_eq!(put("not-a-token".into()).await, 401);
    assert_eq!(put(token("operator").await).await, 200);
    let running = http
        .get(format!("http://{second}:9464{CONFIG_PATH}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(running.contains(&pushed.hash), "{running}");

    // Scale in: one pod is deleted gracefully and its process stops; scale out reuses the IP.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    wait_for("1 pod and 1 process", Duration::from_secs(60), || async {
        all_pods(&pods).await == 1 && kubelet.running() == 1
    })
    .await;
    let left: BTreeSet<String> = ready_pods(&pods).await.into_iter().map(|p| p.1).collect();
    let freed: Vec<&String> = ips.difference(&left).collect();
    assert_eq!(freed.len(), 1);
    deployments
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    wait_for("2 ready pods again", Duration::from_secs(60), || async {
        ready_pods(&pods).await.len() == 2
    })
    .await;
    let again: BTreeSet<String> = ready_pods(&pods).await.into_iter().map(|p| p.1).collect();
    assert_eq!(again, ips, "the freed address is reused");

    // A process that exits on its own is restarted.
    cluster.namespace("crashy").await.unwrap();
    cluster.create_workload("crashy", "w", 1).await.unwrap();
    wait_for(
        "restarts of a crashing worker",
        Duration::from_secs(30),
        || async { kubelet.restarts() >= 2 },
    )
    .await;

    kubelet.shutdown().await;
    redis.stop();
    cluster.stop();
    assert!(
        std::net::TcpStream::connect(format!("{first}:9464")).is_err(),
        "worker processes are gone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("bp-lab-kubelet-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
