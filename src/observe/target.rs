//! The target through its `/scale` subresource, whatever its kind ([`PodInfo`], its pods as
//! the operator sees them, comes from [`super::pods`]).

use std::collections::HashMap;
use std::sync::Mutex;

use backpressure_api::v1alpha1::TargetRef;
use backpressure_core::selector::Selector;
use k8s_openapi::api::autoscaling::v1::Scale;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};

/// Why the target could not be read. Each is reported as a condition, not a crash.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `apiVersion`/`kind` unknown to the API server.
    #[error("target kind {kind} in {api_version} is not served by the API server")]
    UnknownKind {
        /// apiVersion.
        api_version: String,
        /// kind.
        kind: String,
    },
    /// The kind is cluster-scoped; a target must live in the object's namespace.
    #[error(
        "target kind {0} is cluster-scoped; the target must be namespaced, in the object's namespace"
    )]
    ClusterScoped(String),
    /// The kind has no `/scale` subresource.
    #[error("target kind {0} has no /scale subresource")]
    NoScale(String),
    /// The target does not exist.
    #[error("target {kind}/{name} not found in namespace {namespace}")]
    NotFound {
        /// kind.
        kind: String,
        /// name.
        name: String,
        /// namespace.
        namespace: String,
    },
    /// `status.selector` of the scale subresource is missing or malformed.
    #[error("target {0} reports no usable label selector in its /scale status: {1}")]
    Selector(String, String),
    /// Any other API error.
    #[error("reading target {0}")]
    Api(String, #[source] kube::Error),
}

impl TargetError {
    /// The condition and event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            TargetError::UnknownKind { .. } => "TargetKindUnknown",
            TargetError::ClusterScoped(_) => "TargetNotNamespaced",
            TargetError::NoScale(_) => "TargetHasNoScale",
            TargetError::NotFound { .. } => "TargetNotFound",
            TargetError::Selector(..) => "TargetSelectorInvalid",
            TargetError::Api(..) => "TargetUnreadable",
        }
    }
}

/// The target as observed.
#[derive(Debug, Clone)]
pub struct TargetState {
    /// The resource, for writing `/scale` back.
    pub resource: ApiResource,
    /// `spec.replicas` of the scale subresource.
    pub spec_replicas: i32,
    /// `status.replicas` of the scale subresource.
    pub status_replicas: i32,
    /// The parsed pod selector.
    pub selector: Selector,
}

/// Resolves kinds through discovery, caching each answer.
#[derive(Debug, Default)]
pub struct KindCache {
    cache: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

impl KindCache {
    /// The resource of `apiVersion`/`kind`.
    pub async fn resolve(
        &self,
        client: &kube::Client,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities), TargetError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(hit);
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), api_version.to_owned()),
        };
        let gvk = GroupVersionKind {
            group,
            version,
            kind: kind.to_owned(),
        };
        let found = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| match e {
                kube::Error::Discovery(_) => TargetError::UnknownKind {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                },
                kube::Error::Api(ref s) if s.code == 404 => TargetError::UnknownKind {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                },
                other => TargetError::Api(format!("{api_version}/{kind}"), other),
            })?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, found.clone());
        }
        Ok(found)
    }
}

/// Reads the target's `/scale`.
pub async fn read_target(
    client: &kube::Client,
    kinds: &KindCache,
    namespace: &str,
    target: &TargetRef,
) -> Result<TargetState, TargetError> {
    let (resource, caps) = kinds
        .resolve(client, &target.api_version, &target.kind)
        .await?;
    if caps.scope == Scope::Cluster {
        return Err(TargetError::ClusterScoped(target.kind.clone()));
    }
    if !caps
        .subresources
        .iter()
        .any(|(sub, _)| sub.plural == "scale" || sub.plural == format!("{}/scale", resource.plural))
    {
        return Err(TargetError::NoScale(target.kind.clone()));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let scale: Scale = api.get_scale(&target.name).await.map_err(|e| match e {
        kube::Error::Api(ref s) if s.code == 404 => TargetError::NotFound {
            kind: target.kind.clone(),
            name: target.name.clone(),
            namespace: namespace.to_owned(),
        },
        other => TargetError::Api(format!("{}/{}", target.kind, target.name), other),
    })?;
    let id = format!("{}/{}", target.kind, target.name);
    let spec_replicas = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let status = scale.status.unwrap_or_default();
    let selector_text = status.selector.unwrap_or_default();
    if selector_text.is_empty() {
        return Err(TargetError::Selector(id, "empty selector".into()));
    }
    let selector =
        Selector::parse(&selector_text).map_err(|e| TargetError::Selector(id, e.to_string()))?;
    Ok(TargetState {
        resource,
        spec_replicas,
        status_replicas: status.replicas,
        selector,
    })
}

pub use super::pods::PodInfo;
