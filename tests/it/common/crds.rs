//! CustomResourceDefinitions: the committed ones (`crds/*.yaml`) and test fixtures
//! (`tests/fixtures/`), server-side applied and waited for until Established.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

/// Applies the committed CRDs (crds/*.yaml). Safe to call from every test.
pub async fn install_crds(client: &kube::Client) {
    let dir = backpressure_envtest::repo_root().join("crds");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    install(client, &files).await;
}

/// Applies KEDA's real ScaledObject CRD (from KEDA's module, which `tools/k8s/build.sh` caches
/// beside the binaries).
pub async fn install_keda_scaledobject_crd(client: &kube::Client) {
    let dir = backpressure_envtest::keda_crds_dir().unwrap();
    install(client, &[dir.join("keda.sh_scaledobjects.yaml")]).await;
}

/// Server-side applies each CRD file and waits until each is Established.
async fn install(client: &kube::Client, files: &[PathBuf]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for path in files {
        let crd = read(path);
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

fn read(path: &Path) -> CustomResourceDefinition {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
