//! The harness itself: the control plane answers with the pinned version, RBAC is on, and
//! Prometheus scrapes a target the test serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use backpressure_envtest::{Prometheus, ScrapeTarget, TestEnv};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

#[tokio::test]
async fn control_plane_reports_its_version_and_enforces_rbac() {
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        version.git_version,
        backpressure_envtest::KUBERNETES_VERSION
    );

    let ns = env.namespace("harness").await.unwrap();
    // An identity without any binding is forbidden: RBAC authorization is on.
    let nobody = env.client_as("nobody", &[]).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(nobody, &ns);
    let err = api
        .create(&PostParams::default(), &ConfigMap::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
}

#[test]
fn prometheus_scrapes_a_served_target() {
    // A tiny exposition endpoint on loopback.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let body = "# TYPE harness_up gauge\nharness_up{workload=\"w\"} 42\n";
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let prom = Prometheus::start().unwrap();
    prom.set_targets(&[ScrapeTarget {
        address: addr.to_string(),
        labels: BTreeMap::from([("namespace".to_owned(), "ns1".to_owned())]),
    }])
    .unwrap();
    let v = prom
        .wait_for_series(
            "harness_up{namespace=\"ns1\",workload=\"w\"}",
            Duration::from_secs(30),
        )
        .unwrap();
    assert_eq!(v["data"]["result"][0]["value"][1], "42");
}
