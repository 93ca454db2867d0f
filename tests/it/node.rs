//! The chart on a real node (`backpressure_envtest::node`: containerd, runc, a CNI bridge, a
//! kubelet, kube-scheduler and kube-proxy): `helm install` of `charts/backpressure-operator`
//! with the operator image `make image` built, workers as a Deployment of the lab-worker image,
//! the operator's config push travelling over the pod network, authenticated by a projected
//! ServiceAccount token that the worker reviews in-cluster, and the fleet read from a Prometheus
//! that discovers the real pods through the API server and scrapes their pod IPs; `kubectl logs`
//! and `kubectl exec` served by the kubelet.
//!
//! Needs root and the images (`make image`, or `make PROFILE=debug image-test`, which
//! `make test` runs first). Where either is missing the test says why and passes, unless
//! `BP_REQUIRE_NODE=1` (CI) makes that a failure.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use backpressure_envtest::node::NODE_IP;
use backpressure_envtest::{Error, NodeCluster, Prometheus, RedisServer};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};

const OPERATOR_NS: &str = "bp-system";
const RELEASE: &str = "bp";
const NS: &str = "shop";
const WORKLOAD: &str = "export";

fn required() -> bool {
    std::env::var("BP_REQUIRE_NODE").as_deref() == Ok("1")
}

fn skip(why: &str) {
    assert!(!required(), "BP_REQUIRE_NODE=1: {why}");
    eprintln!("SKIPPED: {why} (BP_REQUIRE_NODE=1 makes this a failure)");
}

/// The OCI archives of `make image` (`out/images/<name>_<tag>.oci.tar`): the debug build's
/// (`make test` builds those) when present, else the release build's.
fn image_archives() -> Option<(String, PathBuf, PathBuf)> {
    let dir = std::env::var_os("BP_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| backpressure_envtest::repo_root().join("out/images"));
    let version = env!("CARGO_PKG_VERSION");
    [format!("{version}-debug"), version.to_owned()]
        .into_iter()
        .map(|tag| {
            let archive = |name: &str| dir.join(format!("{name}_{tag}.oci.tar"));
            (
                tag.clone(),
                archive("backpressure-operator"),
                archive("backpressure-lab-worker"),
            )
        })
        .find(|(_, op, worker)| op.is_file() && worker.is_file())
}

fn run(cluster: &NodeCluster, program: &Path, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{} {}: {}\n{}\n{}",
        program.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        diagnose(cluster)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the pods of the node are doing, for a failure message: `kubectl get pods -A`, the
/// events, the logs of the operator and worker pods, and the kubelet's last lines.
fn diagnose(cluster: &NodeCluster) -> String {
    let Ok(bin) = backpressure_envtest::bin_dir() else {
        return String::new();
    };
    let kubeconfig = cluster.env().kubeconfig_path().display().to_string();
    let kubectl = |args: &[&str]| {
        Command::new(bin.join("kubectl"))
            .args(["--kubeconfig", &kubeconfig])
            .args(args)
            .output()
            .map(|o| {
                format!(
                    "$ kubectl {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    };
    [
        kubectl(&["get", "pods", "-A", "-o", "wide"]),
        kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"]),
        kubectl(&[
            "logs",
            "-n",
            OPERATOR_NS,
            "-l",
            "app.kubernetes.io/name=backpressure-operator",
            "--tail=30",
            "--prefix",
        ]),
        kubectl(&[
            "logs",
            "-n",
            NS,
            "-l",
            &format!("app={WORKLOAD}"),
            "--tail=20",
            "--prefix",
        ]),
        format!(
            "kubelet log:\n{}",
            backpressure_envtest::process::tail(&cluster.dir().join("kubelet.log"), 30)
        ),
    ]
    .join("\n")
}

/// A dependency that answers every request with 200, on the node's address.
fn serve_dependency() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let listener = std::net::TcpListener::bind((NODE_IP, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 8192];
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                if stream.read(&mut buf).unwrap_or(0) > 0 {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                }
            });
        }
    });
    (port, hits)
}

fn worker_objects(tag: &str, redis_port: u16, dependency_port: u16) -> String {
    let operator_sa =
        format!("system:serviceaccount:{OPERATOR_NS}:{RELEASE}-backpressure-operator");
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {WORKLOAD}
  namespace: {NS}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {WORKLOAD}-initial
  namespace: {NS}
data:
  worker.json: |
    {{"version": "backpressure.dev/worker-config/v1", "generation": 1, "algorithm": "SetPoint",
     "setPoint": 0.05, "reaction": 20, "maxPermits": 4, "probeInitialMs": 1000, "probeMaxMs": 10000}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {WORKLOAD}
  namespace: {NS}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: {WORKLOAD}}}
  template:
    metadata:
      labels: {{app: {WORKLOAD}}}
    spec:
      serviceAccountName: {WORKLOAD}
      terminationGracePeriodSeconds: 5
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
      containers:
      - name: worker
        image: ghcr.io/backpressure-dev/backpressure-lab-worker:{tag}
        imagePullPolicy: Never
        args: [worker, "--listen=$(POD_IP):9464", "--redis=redis://{NODE_IP}:{redis_port}/",
               "--queue={NS}-{WORKLOAD}", "--consumer=$(POD_NAME)",
               "--dependency=http://{NODE_IP}:{dependency_port}", "--workload={WORKLOAD}",
               "--namespace=$(POD_NAMESPACE)", "--processing=5ms", "--visibility-timeout=30s",
               "--max-deliveries=5", "--config=/etc/bp/worker.json",
               "--allowed-identity={operator_sa}"]
        env:
        - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: POD_NAMESPACE, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
        - {{name: RUST_LOG, value: "info,kube_client=off"}}
        ports:
        - {{name: bp-admin, containerPort: 9464}}
        readinessProbe:
          httpGet: {{path: /healthz, port: bp-admin}}
          periodSeconds: 1
        resources:
          limits: {{memory: 64Mi}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL]}}
        volumeMounts:
        - {{name: initial, mountPath: /etc/bp}}
      volumes:
      - name: initial
        configMap: {{name: {WORKLOAD}-initial}}
---
apiVersion: backpressure.dev/v1alpha1
kind: WorkerBackpressure
metadata:
  name: {WORKLOAD}
  namespace: {NS}
spec:
  targetRef: {{apiVersion: apps/v1, kind: Deployment, name: {WORKLOAD}}}
  mode: Active
  worker: {{algorithm: SetPoint, setPoint: 0.05, reaction: 20, maxPermits: 12}}
  scaling: {{minReplicas: 2, maxReplicas: 4}}
"#
    )
}

/// Waits until `ok` holds, or fails with `what` and the node's and the operator's logs.
async fn eventually<F, Fut>(cluster: &NodeCluster, what: &str, secs: u64, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    loop {
        match ok().await {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => last = e,
        }
        if Instant::now() > deadline {
            panic!(
                "{what} within {secs} s; last: {last}\n{}",
                diagnose(cluster)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `ConfigInSync=True` on the WorkerBackpressure: every ready pod runs the rendered config.
/// `ConfigInSync=True` with at least `pods` ready pods counted: with none observed yet the
/// condition is (vacuously) True too, "0 of 0 ready pods".
fn in_sync(wbp: &serde_json::Value, pods: i64) -> bool {
    wbp["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "ConfigInSync" && c["status"] == "True")
        && wbp["status"]["config"]["podsInSync"]
            .as_i64()
            .is_some_and(|n| n >= pods)
}

#[test]
fn the_chart_runs_on_a_real_node_and_pushes_config_over_the_pod_network() {
    let Some((tag, operator_image, worker_image)) = image_archives() else {
        skip("no image archives in out/images (make image)");
        return;
    };
    let cluster = match NodeCluster::start() {
        Ok(c) => c,
        Err(Error::NodeUnavailable(why)) => {
            skip(&why);
            return;
        }
        Err(e) => panic!("the real node did not start: {e}"),
    };
    let started = Instant::now();
    cluster.import_image(&operator_image).unwrap();
    cluster.import_image(&worker_image).unwrap();
    let bin = backpressure_envtest::bin_dir().unwrap();
    let kubeconfig = cluster.env().kubeconfig_path().display().to_string();
    let redis_dir = cluster.env().dir().join("redis");
    let redis = RedisServer::start_on(&redis_dir, Some(NODE_IP)).unwrap();
    let (dependency_port, dependency_hits) = serve_dependency();
    // Prometheus (the one tools/k8s builds, with Kubernetes discovery) on the node's address:
    // it finds the worker pods through the API server and scrapes their pod IPs; the operator
    // pods query it over the bridge.
    let pki = cluster.env().pki();
    let prometheus = Prometheus::start_with(
        bin.join("prometheus"),
        NODE_IP,
        &format!(
            r#"- job_name: workers
  kubernetes_sd_configs:
  - role: pod
    api_server: '{server}'
    tls_config: {{ca_file: '{ca}', cert_file: '{cert}', key_file: '{key}'}}
    namespaces: {{names: ['{NS}']}}
  relabel_configs:
  - {{source_labels: [__meta_kubernetes_pod_container_port_name], action: keep, regex: bp-admin}}
  - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}
  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}
"#,
            server = cluster.env().server_url(),
            ca = pki.ca_file.display(),
            cert = pki.admin_cert_file.display(),
            key = pki.admin_key_file.display(),
        ),
    )
    .unwrap();

    // helm install: the chart's CRDs, RBAC, ServiceAccount, Deployment (2 replicas, leader
    // election, probes), PDB, with the image just built. --wait: the operator pods are Ready.
    let chart = backpressure_envtest::repo_root().join("charts/backpressure-operator");
    let operator_sa = format!("{RELEASE}-backpressure-operator");
    run(
        &cluster,
        &bin.join("helm"),
        &[
            "install",
            RELEASE,
            &chart.display().to_string(),
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            OPERATOR_NS,
            "--create-namespace",
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            "image.pullPolicy=Never",
            "--set",
            &format!("operator.prometheusUrl={}", prometheus.url()),
            "--set",
            &format!("workerTokenReview.subjects[0].namespace={NS}"),
            "--set",
            &format!("workerTokenReview.subjects[0].name={WORKLOAD}"),
            "--wait",
            "--timeout=120s",
        ],
    );
    eprintln!(
        "node: helm install --wait done {:?} after the node was Ready",
        started.elapsed()
    );
    let objects = cluster.env().dir().join("workers.yaml");
    std::fs::write(
        &objects,
        worker_objects(&tag, redis.port(), dependency_port),
    )
    .unwrap();
    run(
        &cluster,
        &bin.join("kubectl"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "-f",
            &objects.display().to_string(),
        ],
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cluster.env().client().unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let operator_pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NS);
        let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
        let wbps = Api::<kube::api::DynamicObject>::namespaced_with(
            client.clone(),
            NS,
            &kube::api::ApiResource {
                group: "backpressure.dev".into(),
                version: "v1alpha1".into(),
                api_version: "backpressure.dev/v1alpha1".into(),
                kind: "WorkerBackpressure".into(),
                plural: "workerbackpressures".into(),
            },
        );
        let ready_workers = || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={WORKLOAD}")))
                .await
                .map_err(|e| e.to_string())?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            Ok::<_, String>(ready)
        };
        eventually(&cluster, "2 worker pods Ready on the node", 120, || async {
            Ok(ready_workers().await?.len() == 2)
        })
        .await;

        // The operator pushed its config to both pods over the pod network: the workers
        // accepted it after a TokenReview of the operator's projected token.
        let status = || async {
            wbps.get(WORKLOAD)
                .await
                .map(|o| serde_json::to_value(o).unwrap_or_default())
                .map_err(|e| e.to_string())
        };
        eventually(
            &cluster,
            "ConfigInSync=True on the WorkerBackpressure",
            120,
            || async {
                let v = status().await?;
                if in_sync(&v, 2) {
                    Ok(true)
                } else {
                    Err(format!("{}", v["status"]))
                }
            },
        )
        .await;

        // The worker's own log, read as a user reads it (kubectl logs: the API server asks the
        // kubelet with its client certificate): the push accepted from the operator's identity.
        let push_logged = |pod: String| {
            let logs = run(
                &cluster,
                &bin.join("kubectl"),
                &["--kubeconfig", &kubeconfig, "logs", "-n", NS, &pod],
            );
            let from = format!("system:serviceaccount:{OPERATOR_NS}:{operator_sa}");
            if logs
                .lines()
                .any(|l| l.contains("push accepted") && l.contains(&from))
            {
                Ok(true)
            } else {
                Err(format!("kubectl logs {pod}:\n{logs}"))
            }
        };
        let worker_pod = ready_workers().await.unwrap().remove(0);
        eventually(
            &cluster,
            "kubectl logs shows the push accepted from the operator",
            30,
            || async { push_logged(worker_pod.clone()) },
        )
        .await;
        // kubectl exec: the API server upgrades to the kubelet's exec stream, and the kubelet
        // runs the command in the container through containerd (the image has no shell: the
        // worker's own binary answers).
        let version = run(
            &cluster,
            &bin.join("kubectl"),
            &[
                "--kubeconfig",
                &kubeconfig,
                "exec",
                "-n",
                NS,
                &worker_pod,
                "--",
                "/usr/local/bin/backpressure-lab",
                "--version",
            ],
        );
        assert_eq!(
            version.trim(),
            format!("backpressure-lab {}", env!("CARGO_PKG_VERSION")),
            "kubectl exec {worker_pod} -- backpressure-lab --version"
        );

        // The operator reads the fleet from Prometheus, which scraped the real pods.
        eventually(
            &cluster,
            "the fleet's backoff from Prometheus in the status",
            120,
            || async {
                let v = status().await?;
                let fleet = &v["status"]["fleet"];
                if fleet["backoff"].is_number() {
                    Ok(true)
                } else {
                    Err(format!(
                        "fleet {fleet}; conditions {}",
                        v["status"]["conditions"]
                    ))
                }
            },
        )
        .await;

        // Messages flow: the workers fetch from Redis on the host and call the dependency.
        let redis_cli = |args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-p", &redis.port().to_string()])
                .args(args)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        redis_cli(&[
            "XGROUP",
            "CREATE",
            &format!("{NS}-{WORKLOAD}:stream"),
            "workers",
            "0",
            "MKSTREAM",
        ]);
        for i in 0..20 {
            redis_cli(&[
                "XADD",
                &format!("{NS}-{WORKLOAD}:stream"),
                "*",
                "body",
                &format!("m{i}"),
            ]);
        }
        eventually(
            &cluster,
            "20 messages completed by the pods",
            60,
            || async {
                let done: u64 = redis_cli(&["GET", &format!("{NS}-{WORKLOAD}:completed")])
                    .parse()
                    .unwrap_or(0);
                Ok(done >= 20)
            },
        )
        .await;
        assert!(dependency_hits.load(std::sync::atomic::Ordering::Relaxed) >= 20);

        // A worker pod killed: its ReplicaSet replaces it, the scheduler places it, and the
        // operator pushes to the new pod (ConfigInSync again, with the new pod counted).
        let before = ready_workers().await.unwrap();
        pods.delete(
            &before[0],
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        eventually(&cluster, "a replacement worker pod Ready", 120, || async {
            let now = ready_workers().await?;
            Ok(now.len() == 2 && !now.contains(&before[0]))
        })
        .await;
        eventually(
            &cluster,
            "ConfigInSync=True after the replacement",
            120,
            || async { Ok(in_sync(&status().await?, 2)) },
        )
        .await;
        let replacement = ready_workers()
            .await
            .unwrap()
            .into_iter()
            .find(|p| !before.contains(p))
            .unwrap();
        eventually(
            &cluster,
            "the replacement's log shows the push accepted",
            60,
            || async { push_logged(replacement.clone()) },
        )
        .await;

        // Leader election across the two operator replicas: the Lease names a running pod;
        // when that pod is deleted, the other one takes the Lease.
        let holder = || async {
            let list = leases
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(
                list.items
                    .iter()
                    .find_map(|l| l.spec.as_ref().and_then(|s| s.holder_identity.clone()))
                    .unwrap_or_default(),
            )
        };
        eventually(&cluster, "a Lease held by an operator pod", 60, || async {
            let h = holder().await?;
            Ok(operator_pods
                .get_opt(&h)
                .await
                .map_err(|e| e.to_string())?
                .is_some())
        })
        .await;
        let leader = holder().await.unwrap();
        operator_pods
            .delete(
                &leader,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        eventually(
            &cluster,
            "the other operator replica takes the Lease",
            120,
            || async {
                let h = holder().await?;
                Ok(!h.is_empty() && h != leader)
            },
        )
        .await;
        let deployments: Api<Deployment> = Api::namespaced(client, OPERATOR_NS);
        assert!(
            deployments.get(&operator_sa).await.is_ok(),
            "the chart's Deployment is named after the release"
        );
    });
    eprintln!(
        "node: the whole test took {:?} after the node was Ready",
        started.elapsed()
    );
}
