//! The target through its `/scale` subresource, whatever its kind, and its pods.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use backpressure_api::v1alpha1::TargetRef;
use backpressure_api::wire;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::Pod;
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
    let selector = Selector::parse(&selector_text).map_err(|e| TargetError::Selector(id, e))?;
    Ok(TargetState {
        resource,
        spec_replicas,
        status_replicas: status.replicas,
        selector,
    })
}

/// One requirement of a label selector in its string form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector in the string form of `/scale` `status.selector`
/// (`app=web,tier in (a,b),!canary`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses the string form. An empty selector is refused by the caller (it selects all).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            // One requirement runs to the next comma outside parentheses.
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let part = rest[..end].trim();
            rest = rest.get(end + 1..).unwrap_or("").trim();
            reqs.push(parse_requirement(part)?);
        }
        Ok(Selector(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// A label key: `[prefix/]name` of letters, digits, `-`, `_` and `.` (the API server checks the
/// exact DNS rules; this only refuses what cannot be a key, with a message that says so).
fn label_key(part: &str, key: &str) -> Result<String, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err(format!("empty label key in {part:?}"));
    }
    let ok = key.len() <= 317
        && key.matches('/').count() <= 1
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if !ok {
        return Err(format!("invalid label key {key:?} in {part:?}"));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or up to 63 letters, digits, `-`, `_` and `.`.
fn label_value(part: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(format!("invalid label value {value:?} in {part:?}"));
    }
    Ok(value.to_owned())
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if part.is_empty() {
        return Err("empty requirement".into());
    }
    if let Some(k) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(label_key(part, k)?));
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotEq(
            label_key(part, k)?,
            label_value(part, v)?,
        ));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(Requirement::Eq(label_key(part, k)?, label_value(part, v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(Requirement::Eq(label_key(part, k)?, label_value(part, v)?));
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let key = label_key(part, words[0])?;
        let rest = words[1].trim();
        let (op, set) = if let Some(s) = rest.strip_prefix("notin") {
            ("notin", s)
        } else if let Some(s) = rest.strip_prefix("in") {
            ("in", s)
        } else {
            return Err(format!("unknown operator in {part:?}"));
        };
        let set = set.trim();
        let inner = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("expected (values) in {part:?}"))?;
        let values: Vec<String> = inner
            .split(',')
            .map(|v| label_value(part, v))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("empty value set in {part:?}"));
        }
        return Ok(if op == "in" {
            Requirement::In(key, values)
        } else {
            Requirement::NotIn(key, values)
        });
    }
    Ok(Requirement::Exists(label_key(part, part)?))
}

/// A pod of the target as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Ready condition is True and the pod is not being deleted.
    pub ready: bool,
    /// Pod IP.
    pub ip: Option<String>,
    /// Admin port: the container port named `bp-admin`, the annotation, or the default.
    pub admin_port: u16,
}

impl PodInfo {
    /// Reads the fields the operator needs from a Pod.
    pub fn from_pod(pod: &Pod) -> Option<PodInfo> {
        let name = pod.metadata.name.clone()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let ready = pod.metadata.deletion_timestamp.is_none()
            && status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let ip = status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty());
        let named = pod.spec.as_ref().and_then(|s| {
            s.containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find_map(|p| {
                    (p.name.as_deref() == Some(wire::ADMIN_PORT_NAME)).then_some(p.container_port)
                })
        });
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(wire::ADMIN_PORT_ANNOTATION))
            .and_then(|v| v.parse::<u16>().ok());
        let admin_port = annotated
            .or_else(|| named.and_then(|p| u16::try_from(p).ok()))
            .unwrap_or(wire::DEFAULT_ADMIN_PORT);
        Some(PodInfo {
            name,
            uid,
            ready,
            ip,
            admin_port,
        })
    }
}

/// The pods of `namespace` matching `selector`, from the shared pod store.
pub fn pods_of(
    store: &kube::runtime::reflector::Store<Pod>,
    namespace: &str,
    selector: &Selector,
) -> Vec<PodInfo> {
    let mut pods: Vec<PodInfo> = store
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
        .filter_map(|p| PodInfo::from_pod(p))
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    pods
}

/// Shared handle type for the pod store.
pub type PodStore = Arc<kube::runtime::reflector::Store<Pod>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn parses_and_matches_selectors() {
        let s = Selector::parse("app=web,tier in (a, b),!canary,env!=prod,track").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a"), ("track", "x")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c"), ("track", "x")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("canary", "1"),
            ("track", "x")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("env", "prod"),
            ("track", "x")
        ])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "a")])));
        let n = Selector::parse("tier notin (x)").unwrap();
        assert!(n.matches(&labels(&[])));
        assert!(!n.matches(&labels(&[("tier", "x")])));
        assert!(Selector::parse("tier in x").is_err());
        assert!(Selector::parse("a=b,,c=d").is_err());
    }

    #[test]
    fn hostile_selectors_are_refused_with_the_offending_part() {
        for (text, says) in [
            ("=b", "empty label key"),
            ("!", "empty label key"),
            ("a b=c", "invalid label key"),
            ("a=b c", "invalid label value"),
            ("a in ()", "empty value set"),
            ("a in (b", "expected (values)"),
            (")a=b", "invalid label key"),
            ("a in (x y)", "invalid label value"),
            ("a exists", "unknown operator"),
        ] {
            let err = Selector::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z][a-z0-9]{0,5}",
                "[a-z]{1,4}\\.io/[a-z]{1,5}",
                Just("app".to_owned()),
                Just("tier".to_owned()),
            ]
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9]{1,4}",
                Just("web".to_owned()),
                Just("a".to_owned())
            ]
        }

        fn requirement() -> impl Strategy<Value = Requirement> {
            prop_oneof![
                (key(), value()).prop_map(|(k, v)| Requirement::Eq(k, v)),
                (key(), value()).prop_map(|(k, v)| Requirement::NotEq(k, v)),
                (key(), proptest::collection::vec(value(), 1..4))
                    .prop_map(|(k, v)| Requirement::In(k, v)),
                (key(), proptest::collection::vec(value(), 1..4))
                    .prop_map(|(k, v)| Requirement::NotIn(k, v)),
                key().prop_map(Requirement::Exists),
                key().prop_map(Requirement::NotExists),
            ]
        }

        /// The string form the API server writes into `/scale` `status.selector`.
        fn render(r: &Requirement) -> String {
            match r {
                Requirement::Eq(k, v) => format!("{k}={v}"),
                Requirement::NotEq(k, v) => format!("{k}!={v}"),
                Requirement::In(k, vs) => format!("{k} in ({})", vs.join(",")),
                Requirement::NotIn(k, vs) => format!("{k} notin ({})", vs.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
            }
        }

        /// The meaning of each requirement, written independently of `Selector::matches`.
        fn holds(r: &Requirement, labels: &BTreeMap<String, String>) -> bool {
            match r {
                Requirement::Eq(k, v) => labels.get(k).map(String::as_str) == Some(v.as_str()),
                Requirement::NotEq(k, v) => labels.get(k).map(String::as_str) != Some(v.as_str()),
                Requirement::In(k, vs) => labels.get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                Requirement::NotIn(k, vs) => {
                    !labels.get(k).is_some_and(|x| vs.iter().any(|v| v == x))
                }
                Requirement::Exists(k) => labels.contains_key(k),
                Requirement::NotExists(k) => !labels.contains_key(k),
            }
        }

        proptest! {
            #[test]
            fn selector_parser_never_panics(s in "\\PC{0,60}") {
                let _ = Selector::parse(&s);
            }

            #[test]
            fn selector_parser_never_panics_on_selector_like_text(s in "[a-z!=(), .a-z/-]{0,40}") {
                match Selector::parse(&s) {
                    Ok(sel) => prop_assert!(!sel.0.is_empty() || s.trim().is_empty()),
                    Err(e) => prop_assert!(!e.is_empty()),
                }
            }

            #[test]
            fn rendered_selectors_parse_back_and_match_like_the_api_server(
                reqs in proptest::collection::vec(requirement(), 1..5),
                labels in proptest::collection::btree_map(key(), value(), 0..5),
                spaces in any::<bool>(),
            ) {
                let sep = if spaces { ", " } else { "," };
                let text = reqs.iter().map(render).collect::<Vec<_>>().join(sep);
                let parsed = Selector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
                prop_assert_eq!(&parsed.0, &reqs, "{}", text);
                let want = reqs.iter().all(|r| holds(r, &labels));
                prop_assert_eq!(parsed.matches(&labels), want);
            }
        }
    }
}
