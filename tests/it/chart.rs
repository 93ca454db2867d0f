//! The chart's values schema (`charts/backpressure-operator/values.schema.json`): `helm
//! install`/`template` with a wrong type, a value outside its enum or an unknown key (a typo)
//! fails before anything is installed, with an error naming the key; the defaults and every
//! documented key pass.

use std::process::Command;

use backpressure_envtest::{bin_dir, repo_root};

/// `helm template` of the chart with `sets`: Ok(stdout) or Err(stderr).
fn template(sets: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(bin_dir().unwrap().join("helm"));
    cmd.args(["template", "bp"])
        .arg(repo_root().join("charts/backpressure-operator"))
        .args(["--namespace", "bp-system"]);
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
