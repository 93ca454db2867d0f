//! Helpers shared by the operator's integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

/// Applies the committed CRDs (crds/*.yaml) with server-side apply and waits until each is
/// Established. Safe to call from every test.
pub async fn install_crds(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = backpressure_envtest::repo_root().join("crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let name = crd.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("envtest").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", path.display()));
            names.push(name);
        }
    }
    for name in names {
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established within 30s"))
        .unwrap();
    }
    // Discovery of a new group can lag the Established condition by a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

pub mod badpods;
pub mod fakeprom;
pub mod fleet;
pub mod operator;
pub mod pods;
pub mod scene;
