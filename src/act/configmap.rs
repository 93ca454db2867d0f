//! The worker configuration rendered into a ConfigMap owned by the WorkerBackpressure: the
//! durable source that pods mount (the worker library hot-reloads the file).

use std::collections::BTreeMap;

use backpressure_api::WorkerBackpressure;
use backpressure_api::wire::{CONFIG_FILE_NAME, WorkerConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::FIELD_MANAGER;

/// Label on every ConfigMap the operator owns (the operator watches only these).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "backpressure-operator";

/// Name of the ConfigMap of `wbp`.
pub fn configmap_name(wbp: &WorkerBackpressure) -> String {
    format!("{}-worker-config", wbp.name_any())
}

/// The ConfigMap the operator wants for `wbp` running `config`.
pub fn desired(
    wbp: &WorkerBackpressure,
    config: &WorkerConfig,
) -> Result<ConfigMap, serde_json::Error> {
    let json = serde_json::to_string_pretty(config)?;
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(wbp)),
            namespace: wbp.namespace(),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                ("backpressure.dev/workload".to_owned(), wbp.name_any()),
            ])),
            annotations: Some(BTreeMap::from([(
                "backpressure.dev/config-hash".to_owned(),
                config.hash.clone(),
            )])),
            owner_references: wbp.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(CONFIG_FILE_NAME.to_owned(), json)])),
        ..Default::default()
    })
}

/// Whether `existing` already carries what `desired` says (so applying would change nothing).
pub fn up_to_date(existing: Option<&ConfigMap>, desired: &ConfigMap) -> bool {
    existing.is_some_and(|e| {
        e.data == desired.data
            && e.metadata.owner_references == desired.metadata.owner_references
            && desired
                .metadata
                .labels
                .iter()
                .flatten()
                .all(|(k, v)| e.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
    })
}

/// Server-side applies the ConfigMap.
pub async fn apply(client: &kube::Client, cm: &ConfigMap) -> Result<(), kube::Error> {
    let ns = cm.metadata.namespace.clone().unwrap_or_default();
    let name = cm.metadata.name.clone().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut body = serde_json::to_value(cm).map_err(kube::Error::SerdeError)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "ConfigMap".into();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
