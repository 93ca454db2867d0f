//! The chart's values schema (`charts/backpressure-operator/values.schema.json`): `helm
//! install`/`template` with a wrong type, a value outside its enum or an unknown key (a typo)
//! fails before anything is installed, with an error naming the key; the defaults and every
//! documented key pass. The CRD upgrade path: `helm upgrade` from the previous chart version
//! (taken from git) leaves this version's CRDs on a real API server, and `helm uninstall` keeps
//! them. The optional NetworkPolicy, rendered and accepted by the API server. Admission policies
//! gated on the Kubernetes version. The `helm test` Pod and the `probe` subcommand it runs.

use std::process::Command;
use std::time::Duration;

use backpressure_envtest::{TestEnv, bin_dir, repo_root};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::crds::install_crds;
use crate::common::serial;

/// `helm template` of the chart with `sets` for the test API server's Kubernetes version:
/// Ok(stdout) or Err(stderr).
fn template(sets: &[&str]) -> Result<String, String> {
    template_for(backpressure_envtest::KUBERNETES_VERSION, sets)
}

/// `helm template` of the chart with `sets` for Kubernetes `kube_version`.
fn template_for(kube_version: &str, sets: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(bin_dir().unwrap().join("helm"));
    cmd.args(["template", "bp"])
        .arg(repo_root().join("charts/backpressure-operator"))
        .args(["--namespace", "bp-system"])
        .args(["--kube-version", kube_version]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn invalid_values_fail_with_a_schema_error_naming_the_key() {
    let cases = [
        ("replicaCount=two", "/replicaCount"),
        ("operator.logFormat=xml", "/operator/logFormat"),
        ("operator.logLevel=verbose", "/operator/logLevel"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("metrics.port=70000", "/metrics/port"),
        (
            "admission.allowedModes={Active,Yolo}",
            "/admission/allowedModes/1",
        ),
        ("admission.maxSetPoint=1.5", "/admission/maxSetPoint"),
        ("leaderElection.enabled=maybe", "/leaderElection/enabled"),
        ("image.digest=latest", "/image/digest"),
        // Typos: unknown keys at any level.
        ("operatr.logFormat=json", "'operatr'"),
        ("rbac.secret.clusterWide=true", "'secret'"),
        ("podDisruptionBudget.minAvaliable=1", "'minAvaliable'"),
    ];
    let mut failures = Vec::new();
    for (set, key) in cases {
        match template(&[set]) {
            Ok(_) => failures.push(format!("{set}: accepted")),
            Err(e) if e.contains("values don't meet the specifications") && e.contains(key) => {}
            Err(e) => failures.push(format!("{set}: the error does not name {key}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The defaults, and values the docs and tests use, pass.
    for sets in [
        &[][..],
        &["podDisruptionBudget.minAvailable=50%"],
        &[
            "admission.scope.enabled=true",
            "rbac.secrets.clusterWide=true",
        ],
        &["prometheusRule.enabled=true", "serviceMonitor.enabled=true"],
        &["podAnnotations.team=payments", "nodeSelector.pool=system"],
        &["workerTokenReview.subjects[0].name=w,workerTokenReview.subjects[0].namespace=shop"],
    ] {
        if let Err(e) = template(sets) {
            panic!("{sets:?} refused: {e}");
        }
    }
}

#[test]
fn the_image_can_be_pinned_by_digest_and_extra_volumes_mounted() {
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let out = template(&[
        "image.repository=registry.example/bp",
        &format!("image.digest={digest}"),
        "image.tag=ignored",
        "extraVolumes[0].name=prom-ca",
        "extraVolumes[0].configMap.name=prometheus-ca",
        "extraVolumeMounts[0].name=prom-ca",
        "extraVolumeMounts[0].mountPath=/etc/prometheus-ca",
    ])
    .unwrap();
    let deployment: serde_yaml::Value = out
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"].as_str(),
        Some(format!("registry.example/bp@{digest}").as_str())
    );
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "prom-ca" && m["mountPath"] == "/etc/prometheus-ca"),
        "{mounts:?}"
    );
    let volumes = pod["volumes"].as_sequence().unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == "prom-ca" && v["configMap"]["name"] == "prometheus-ca"),
        "{volumes:?}"
    );
    // Without a digest: the tag.
    let out = template(&["image.repository=registry.example/bp", "image.tag=1.2.3"]).unwrap();
    assert!(
        out.contains("image: \"registry.example/bp:1.2.3\""),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------------
// CRD upgrade path: install the previous chart version, `helm upgrade` to this one, the CRDs on
// the server are this version's.

const CHART_DIR: &str = "charts/backpressure-operator";
const CRD_NAMES: [&str; 2] = [
    "workerbackpressures.backpressure.dev",
    "backpressurepolicies.backpressure.dev",
];

/// `git` in the repository: Ok(stdout) or Err(stderr).
fn git(args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(args)
        .output()
        .map_err(|e| format!("git {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The `version:` line of a Chart.yaml.
fn chart_version(chart_yaml: &str) -> Option<String> {
    chart_yaml
        .lines()
        .find_map(|l| l.strip_prefix("version:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
}

/// The commit holding the previous chart version, and that version: the parent of the commit
/// that introduced the working tree's version, or HEAD when that version is not committed yet.
/// Err says why there is none (no git, a shallow clone, a single version in the history).
fn previous_chart_commit() -> Result<(String, String), String> {
    let current = chart_version(
        &std::fs::read_to_string(repo_root().join(CHART_DIR).join("Chart.yaml"))
            .map_err(|e| e.to_string())?,
    )
    .ok_or("no version in Chart.yaml")?;
    let chart_yaml = format!("{CHART_DIR}/Chart.yaml");
    let at = |commit: &str| {
        git(&["show", &format!("{commit}:{chart_yaml}")])
            .ok()
            .and_then(|t| chart_version(&t))
    };
    let commits = git(&["log", "--format=%H", "--", &chart_yaml])?;
    let mut introduced = None;
    for c in commits.lines() {
        match at(c) {
            Some(v) if v == current => introduced = Some(c.to_owned()),
            Some(v) => {
                let commit = match &introduced {
                    None => git(&["rev-parse", "HEAD"])?.trim().to_owned(),
                    Some(i) => git(&["rev-parse", &format!("{i}^")])?.trim().to_owned(),
                };
                return Ok((commit, v));
            }
            None => break,
        }
    }
    Err(format!(
        "no chart version other than {current} in this checkout's history (a shallow clone?)"
    ))
}

/// `helm` against the test API server: Ok(stdout) or Err(stderr).
fn helm(kubeconfig: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin_dir().unwrap().join("helm"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Deletes the CRDs (and with them every object of their kinds) and waits until they are gone.
async fn delete_crds(api: &Api<CustomResourceDefinition>) {
    for name in CRD_NAMES {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("delete CRD {name}: {e}"),
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for name in CRD_NAMES {
        while api.get_opt(name).await.unwrap().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "CRD {name} not deleted within 60s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Where two JSON values first differ (a JSON pointer) and the two values there.
fn first_difference(at: &str, a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            first_difference(
                &format!("{at}/{k}"),
                &x.get(k).cloned().unwrap_or(Value::Null),
                &y.get(k).cloned().unwrap_or(Value::Null),
            )
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(&format!("{at}/{i}"), p, q)),
        _ => (a != b).then(|| (at.to_owned(), a.clone(), b.clone())),
    }
}

#[tokio::test]
async fn helm_upgrade_from_the_previous_chart_version_upgrades_the_crds() {
    let (commit, previous) = match previous_chart_commit() {
        Ok(p) => p,
        Err(why) => {
            eprintln!(
                "SKIPPED helm_upgrade_from_the_previous_chart_version_upgrades_the_crds: {why}; \
                 the test needs a clone with history"
            );
            return;
        }
    };
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    let kubeconfig = env.kubeconfig_path();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let (release, ns) = ("bp-upgrade", "bp-upgrade");
    let _ = helm(
        kubeconfig,
        &["uninstall", release, "-n", ns, "--ignore-not-found"],
    );

    // The previous version from git, installed on a cluster without the CRDs (as a first
    // install would find it).
    let tmp = tempfile::tempdir().unwrap();
    let archive = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["archive", "--format=tar", &commit, CHART_DIR])
        .output()
        .unwrap();
    assert!(archive.status.success(), "git archive {commit}");
    let mut tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(tmp.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &archive.stdout).unwrap();
    assert!(tar.wait().unwrap().success(), "tar -x");
    let old_chart = tmp.path().join(CHART_DIR);
    delete_crds(&crds).await;
    helm(
        kubeconfig,
        &[
            "install",
            release,
            old_chart.to_str().unwrap(),
            "-n",
            ns,
            "--create-namespace",
        ],
    )
    .unwrap_or_else(|e| panic!("helm install of chart {previous} (commit {commit}): {e}"));
    for name in CRD_NAMES {
        assert!(
            crds.get_opt(name).await.unwrap().is_some(),
            "chart {previous} did not install CRD {name}"
        );
    }
    // Whatever the previous version's schemas were, the server's now differ from this
    // version's: the upgrade must write them.
    for name in CRD_NAMES {
        let stale = json!([{"op": "add",
            "path": "/spec/versions/0/schema/openAPIV3Schema/description",
            "value": format!("as installed by chart {previous}")}]);
        crds.patch(
            name,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(stale).unwrap()),
        )
        .await
        .unwrap();
    }

    // The upgrade. CRDs a chart installed from crds/ carry no release ownership, so the first
    // upgrade to a chart that renders them from templates adopts them (--take-ownership, as the
    // README says); without it Helm refuses, naming the CRD.
    let new_chart = repo_root().join(CHART_DIR);
    let upgrade = |extra: &[&str]| {
        let mut args = vec!["upgrade", release, new_chart.to_str().unwrap(), "-n", ns];
        args.extend_from_slice(extra);
        helm(kubeconfig, &args)
    };
    if old_chart.join("crds").is_dir() {
        let refused = upgrade(&[]).expect_err("upgrade without --take-ownership");
        assert!(
            refused.contains("CustomResourceDefinition") && refused.contains("ownership"),
            "{refused}"
        );
        upgrade(&["--take-ownership"]).unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    } else {
        upgrade(&[]).unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    }

    // The server's CRDs are this version's files, annotated keep and owned by the release.
    for entry in std::fs::read_dir(new_chart.join("files/crds")).unwrap() {
        let path = entry.unwrap().path();
        let file: CustomResourceDefinition =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = file.metadata.name.clone().unwrap();
        let live = crds.get(&name).await.unwrap();
        let (live_versions, file_versions) = (
            serde_json::to_value(&live.spec.versions).unwrap(),
            serde_json::to_value(&file.spec.versions).unwrap(),
        );
        assert!(
            live.spec.versions == file.spec.versions,
            "{name}: the server's versions differ from {} after the upgrade: {:?}",
            path.display(),
            first_difference("", &live_versions, &file_versions)
        );
        let annotations = live.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get("helm.sh/resource-policy")
                .map(String::as_str),
            Some("keep"),
            "{name}"
        );
        assert_eq!(
            annotations
                .get("meta.helm.sh/release-name")
                .map(String::as_str),
            Some(release),
            "{name}"
        );
    }

    // Uninstall keeps the CRDs (and so every object of their kinds).
    helm(kubeconfig, &["uninstall", release, "-n", ns]).unwrap();
    for name in CRD_NAMES {
        let live = crds.get_opt(name).await.unwrap();
        assert!(
            live.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
            "helm uninstall deleted CRD {name}"
        );
    }

    // A fresh install of this version on a cluster without the CRDs creates them with the
    // rest of the release (no --take-ownership needed), and they become Established.
    delete_crds(&crds).await;
    helm(
        kubeconfig,
        &["install", release, new_chart.to_str().unwrap(), "-n", ns],
    )
    .unwrap_or_else(|e| panic!("helm install of this chart: {e}"));
    for name in CRD_NAMES {
        tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(
                crds.clone(),
                name,
                kube::runtime::wait::conditions::is_crd_established(),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established within 30s after helm install"))
        .unwrap();
    }
    helm(kubeconfig, &["uninstall", release, "-n", ns]).unwrap();

    // Leave the CRDs as the other tests install them, without a release's ownership.
    delete_crds(&crds).await;
    install_crds(&client).await;
}

// ---------------------------------------------------------------------------------------------
// NetworkPolicy: off by default; when enabled it selects the operator pods, admits the
// metrics/health port from the configured peers, and lets out DNS, the API server, Prometheus
// and the workers' admin port; the real API server accepts it as rendered.

/// The objects of kind `kind` in a `helm template` output.
fn of_kind<T: serde::de::DeserializeOwned>(rendered: &str, kind: &str) -> Vec<T> {
    rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_yaml::from_value(d).unwrap())
        .collect()
}

/// The TCP ports of a NetworkPolicy port list.
fn tcp_ports(ports: Option<&Vec<NetworkPolicyPort>>) -> Vec<i32> {
    ports
        .into_iter()
        .flatten()
        .filter(|p| p.protocol.as_deref() == Some("TCP"))
        .filter_map(|p| match &p.port {
            Some(IntOrString::Int(n)) => Some(*n),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_network_policy_admits_prometheus_and_lets_out_the_api_server_prometheus_and_workers() {
    let off = template(&[]).unwrap();
    assert!(
        of_kind::<NetworkPolicy>(&off, "NetworkPolicy").is_empty(),
        "a NetworkPolicy rendered by default"
    );

    let out = template(&[
        "networkPolicy.enabled=true",
        "metrics.port=8443",
        "networkPolicy.ingress.from[0].namespaceSelector.matchLabels.team=observability",
        "networkPolicy.egress.apiServer.cidrs[0]=10.96.0.1/32",
        "networkPolicy.egress.apiServer.ports={6443}",
        "networkPolicy.egress.prometheus.ports={9091}",
        "networkPolicy.egress.workers.ports={9464,9555}",
    ])
    .unwrap();
    let mut policies: Vec<NetworkPolicy> = of_kind(&out, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "{out}");
    let policy = policies.remove(0);
    let deployment: &Deployment = &of_kind(&out, "Deployment")[0];
    let spec = policy.spec.clone().unwrap();

    // It selects exactly the operator's pods.
    let pod_labels = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selector = spec.pod_selector.clone().unwrap().match_labels.unwrap();
    assert!(
        selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "selector {selector:?} does not match the pod labels {pod_labels:?}"
    );
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned(), "Egress".to_owned()][..])
    );

    // Ingress: the metrics port, from the configured peers only.
    let ingress = spec.ingress.as_ref().unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    assert_eq!(tcp_ports(ingress[0].ports.as_ref()), vec![8443]);
    let from = ingress[0].from.as_ref().unwrap();
    assert_eq!(
        from[0]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["team"],
        "observability"
    );

    // ... and from the `helm test` Pod, whose labels the rendered test Pod carries.
    let test_pod: &Pod = &of_kind(&out, "Pod")[0];
    let test_labels = test_pod.metadata.labels.clone().unwrap();
    assert!(
        from.iter().any(|peer| peer
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .is_some_and(|m| m.iter().all(|(k, v)| test_labels.get(k) == Some(v)))),
        "the helm test Pod cannot reach /readyz: {from:?}"
    );

    // Egress: DNS, the API server's address and port, Prometheus and both admin ports.
    let egress = spec.egress.as_ref().unwrap();
    let allows = |port: i32| {
        egress
            .iter()
            .filter(move |r| tcp_ports(r.ports.as_ref()).contains(&port))
    };
    assert_eq!(allows(53).count(), 1, "DNS: {egress:?}");
    let api = allows(6443).next().expect("an API server rule");
    assert_eq!(
        api.to.as_ref().unwrap()[0].ip_block.as_ref().unwrap().cidr,
        "10.96.0.1/32"
    );
    assert_eq!(allows(443).count(), 0, "443 was replaced by 6443");
    let prometheus = allows(9091).next().expect("a Prometheus rule");
    assert!(prometheus.to.as_ref().is_some_and(|t| !t.is_empty()));
    assert!(
        allows(9464).next().is_some() && allows(9555).next().is_some(),
        "{egress:?}"
    );

    // The real API server accepts it as rendered.
    let _serial = serial().await;
    let env = TestEnv::shared();
    let ns = env.namespace("chart-np").await.unwrap();
    let api: Api<NetworkPolicy> = Api::namespaced(env.client().unwrap(), &ns);
    let mut object = policy.clone();
    object.metadata.namespace = None;
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("the API server refused the NetworkPolicy: {e}"));
    assert_eq!(created.spec.as_ref().map(|s| &s.egress), Some(&spec.egress));
    assert_eq!(
        created.spec.as_ref().map(|s| &s.ingress),
        Some(&spec.ingress)
    );
}

// ---------------------------------------------------------------------------------------------
// Admission policies gated on the cluster's version: ValidatingAdmissionPolicy v1 needs 1.30.

/// (kind, name) of every object in a `helm template` output.
fn kinds_and_names(rendered: &str) -> std::collections::BTreeSet<(String, String)> {
    rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .filter_map(|d| {
            Some((
                d["kind"].as_str()?.to_owned(),
                d["metadata"]["name"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn admission_policies_render_only_for_kubernetes_1_30_and_newer() {
    let sets = ["admission.scope.enabled=true"];
    let is_admission = |kind: &str| kind.starts_with("ValidatingAdmissionPolicy");
    let old = kinds_and_names(&template_for("1.29.9", &sets).unwrap());
    let mut with_policies = None;
    for version in ["1.30.0", "v1.35.4"] {
        let new = kinds_and_names(&template_for(version, &sets).unwrap());
        let policies = new
            .iter()
            .filter(|(k, _)| k == "ValidatingAdmissionPolicy")
            .count();
        let bindings = new
            .iter()
            .filter(|(k, _)| k == "ValidatingAdmissionPolicyBinding")
            .count();
        // limits, policy-limits, target-scope, guard-scope; one binding each.
        assert_eq!((policies, bindings), (4, 4), "{version}: {new:?}");
        if let Some(previous) = &with_policies {
            assert_eq!(previous, &new, "1.30 and {version} render differently");
        }
        with_policies = Some(new);
    }
    let with_policies = with_policies.unwrap();
    assert!(
        old.iter().all(|(k, _)| !is_admission(k)),
        "1.29: admission objects rendered: {old:?}"
    );
    let rest: std::collections::BTreeSet<_> = with_policies
        .into_iter()
        .filter(|(k, _)| !is_admission(k))
        .collect();
    assert_eq!(old, rest, "1.29 must render everything but the policies");
}

/// NOTES.txt as `helm install` would print it on Kubernetes `kube_version` (helm template does
/// not render NOTES.txt: a copy of the chart gets a ConfigMap template that includes it).
fn notes_for(kube_version: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg(repo_root().join(CHART_DIR))
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(status.success(), "cp -r {CHART_DIR}");
    let chart = tmp.path().join("backpressure-operator");
    std::fs::write(
        chart.join("templates/notes-probe.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: \
         {{ include \"backpressure-operator/templates/NOTES.txt\" . | quote }}\n",
    )
    .unwrap();
    let out = Command::new(bin_dir().unwrap().join("helm"))
        .args(["template", "bp"])
        .arg(&chart)
        .args(["--kube-version", kube_version])
        .args(["--show-only", "templates/notes-probe.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cm: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    cm["data"]["notes"].as_str().unwrap().to_owned()
}

#[test]
fn the_install_notes_say_when_the_admission_policies_were_left_out() {
    let old = notes_for("1.29.9");
    assert!(
        old.contains("Admission policies NOT installed: this cluster is Kubernetes v1.29.9"),
        "{old}"
    );
    assert!(!old.contains("Admission limits"), "{old}");
    let new = notes_for(backpressure_envtest::KUBERNETES_VERSION);
    assert!(!new.contains("NOT installed"), "{new}");
    assert!(new.contains("Admission limits"), "{new}");
}

// ---------------------------------------------------------------------------------------------
// `helm test`: a hook Pod running the operator image's `probe` against the metrics Service's
// /readyz. It cannot run here (no node): rendered, cross-checked with the Service and the
// Deployment, and created with a server-side dry run; `probe` itself against a real HTTP server.

#[tokio::test]
async fn the_helm_test_pod_probes_the_metrics_service_readyz_with_the_operator_image() {
    assert!(
        of_kind::<Pod>(&template(&["helmTest.enabled=false"]).unwrap(), "Pod").is_empty(),
        "helmTest.enabled=false still renders a test Pod"
    );
    let out = template(&["metrics.port=8443", "helmTest.wait=90s"]).unwrap();
    let pods: Vec<Pod> = of_kind(&out, "Pod");
    assert_eq!(pods.len(), 1, "{out}");
    let pod = &pods[0];
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("helm.sh/hook").map(String::as_str),
        Some("test")
    );
    let service: &Service = &of_kind(&out, "Service")[0];
    let deployment: &Deployment = &of_kind(&out, "Deployment")[0];

    // Not one of the operator's pods: the Service must not send traffic to it.
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let selector = service.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(
        !selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "the Service selects the test Pod: {labels:?}"
    );

    // The operator image, and the Service's name, namespace and port.
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let container = &spec.containers[0];
    let operator = &deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(container.image, operator.image);
    let port = service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port;
    let url = format!(
        "--url=http://{}.{}.svc:{port}/readyz",
        service.metadata.name.as_deref().unwrap(),
        service.metadata.namespace.as_deref().unwrap()
    );
    let args = container.args.clone().unwrap_or_default();
    assert_eq!(args, vec!["probe".to_owned(), url, "--wait=90s".to_owned()]);

    // The real API server accepts it (server-side dry run: no node would run it).
    let _serial = serial().await;
    let env = TestEnv::shared();
    let ns = env.namespace("chart-test").await.unwrap();
    let api: Api<Pod> = Api::namespaced(env.client().unwrap(), &ns);
    let mut object = pod.clone();
    object.metadata.namespace = None;
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &object,
    )
    .await
    .unwrap_or_else(|e| panic!("the API server refused the test Pod: {e}"));
}

/// A real HTTP server on 127.0.0.1 answering `statuses` in turn (the last one forever);
/// returns its /readyz URL.
async fn http_answering(statuses: &'static [u16]) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/readyz", listener.local_addr().unwrap());
    tokio::spawn(async move {
        for i in 0.. {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let status = statuses[i.min(statuses.len() - 1)];
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            let body = if status == 200 {
                "ok\n"
            } else {
                "informers not synced\n"
            };
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, reply.as_bytes()).await;
        }
    });
    url
}

#[tokio::test]
async fn probe_waits_for_200_and_fails_naming_the_last_answer() {
    let bin = env!("CARGO_BIN_EXE_backpressure-operator");
    let probe = |url: String| {
        tokio::process::Command::new(bin)
            .args(["probe", "--url", &url, "--wait=3s", "--interval=100ms"])
            .env("RUST_BACKTRACE", "0")
            .output()
    };
    // Not ready twice, then ready: exit 0.
    let out = probe(http_answering(&[503, 503, 200]).await).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("answered 200 ok"), "{stdout}");
    // Never ready: exit 1 after the wait, naming the status and body.
    let started = std::time::Instant::now();
    let out = probe(http_answering(&[503]).await).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("503") && stderr.contains("informers not synced"),
        "{stderr}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2), "gave up early");
}
