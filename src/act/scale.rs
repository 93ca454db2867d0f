//! The target's `/scale`: the only write to the target, in Active mode.

use kube::api::{Api, ApiResource, DynamicObject};

/// Sets `spec.replicas` through `/scale`.
pub async fn write_scale(
    client: &kube::Client,
    namespace: &str,
    resource: &ApiResource,
    name: &str,
    replicas: i32,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let patch = serde_json::json!({"spec": {"replicas": replicas}});
    // A dedicated field manager: `spec.replicas` shows as owned by the operator, and GitOps
    // tools can tell its writes from theirs.
    let params = kube::api::PatchParams {
        field_manager: Some(backpressure_api::FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_scale(name, &params, &kube::api::Patch::Merge(&patch))
        .await
        .map(|_| ())
}
