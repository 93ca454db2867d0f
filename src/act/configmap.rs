//! The worker configuration rendered into a ConfigMap owned by the WorkerBackpressure: the
//! durable source that pods mount (the worker library hot-reloads the file). The operator
//! creates it, or updates the one the object owns; it never adopts a ConfigMap of the same name
//! that someone else created ([`sync`]).

use std::collections::BTreeMap;

use backpressure_api::WorkerBackpressure;
use backpressure_api::wire::{CONFIG_FILE_NAME, PRODUCER_FILE_NAME, ProducerConfig, WorkerConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};

use backpressure_api::FIELD_MANAGER;

/// Label on every ConfigMap the operator owns (the operator watches only these).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "backpressure-operator";

/// Name of the ConfigMap of `wbp`.
pub fn configmap_name(wbp: &WorkerBackpressure) -> String {
    format!("{}-worker-config", wbp.name_any())
}

/// The ConfigMap the operator wants for `wbp` running `config`, and, with `spec.producers`, the
/// producer state for producer pods that read it from a file.
///
/// The files carry the documents with an empty `hash` ("not given": every receiver computes it
/// itself), so that a worker that computes the legacy (0.1) hash reads them as well as a
/// current one, including one that takes no pushes and reads only the file
/// (`docs/wire-contract.md`, "Migration from the legacy hash"). The hash is in the annotation
/// `backpressure.dev/config-hash`, and in the status.
pub fn desired(
    wbp: &WorkerBackpressure,
    config: &WorkerConfig,
    producer: Option<&ProducerConfig>,
) -> Result<ConfigMap, serde_json::Error> {
    let json = serde_json::to_string_pretty(&WorkerConfig {
        hash: String::new(),
        ..config.clone()
    })?;
    let mut data = BTreeMap::from([(CONFIG_FILE_NAME.to_owned(), json)]);
    if let Some(p) = producer {
        let unhashed = ProducerConfig {
            hash: String::new(),
            ..p.clone()
        };
        data.insert(
            PRODUCER_FILE_NAME.to_owned(),
            serde_json::to_string_pretty(&unhashed)?,
        );
    }
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
        data: Some(data),
        ..Default::default()
    })
}

/// Annotation that exists only in the operator's cache of its ConfigMaps, never in the API: a
/// digest of the data, which the cache does not keep ([`for_cache`]).
pub const CACHED_DATA_DIGEST: &str = "backpressure.dev/cached-data-digest";

/// What the operator caches of one of its ConfigMaps: the labels and owner references that
/// [`up_to_date`] compares, and a digest of `data` and `binaryData` in place of them (the
/// rendered configuration is most of a ConfigMap's bytes; at 10,000 objects the cache is
/// resident, docs/scale.md).
pub fn for_cache(cm: &mut ConfigMap) {
    let digest = data_digest(cm);
    cm.data = None;
    cm.binary_data = None;
    cm.metadata.managed_fields = None;
    cm.metadata.annotations = Some(BTreeMap::from([(CACHED_DATA_DIGEST.to_owned(), digest)]));
}

/// SHA-256 of `data` and `binaryData` (each key and value length-prefixed, in key order).
fn data_digest(cm: &ConfigMap) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    for (k, v) in cm.data.iter().flatten() {
        field(b"d");
        field(k.as_bytes());
        field(v.as_bytes());
    }
    for (k, v) in cm.binary_data.iter().flatten() {
        field(b"b");
        field(k.as_bytes());
        field(&v.0);
    }
    h.finalize()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Whether `existing` (a cached ConfigMap, [`for_cache`], or a whole one) already carries what
/// `desired` says (so applying would change nothing): the same data, owner references and
/// labels.
pub fn up_to_date(existing: Option<&ConfigMap>, desired: &ConfigMap) -> bool {
    existing.is_some_and(|e| {
        let existing_digest = match e
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CACHED_DATA_DIGEST))
        {
            Some(d) if e.data.is_none() && e.binary_data.is_none() => d.clone(),
            _ => data_digest(e),
        };
        existing_digest == data_digest(desired)
            && e.metadata.owner_references == desired.metadata.owner_references
            && desired
                .metadata
                .labels
                .iter()
                .flatten()
                .all(|(k, v)| e.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
    })
}

/// Whether `cm` is `wbp`'s: it carries a controller owner reference with `wbp`'s UID. The name
/// alone proves nothing: `<name>-worker-config` may be anyone's ConfigMap (a tenant picks the
/// object's name), and the operator must never take over one it did not create.
pub fn owned_by(cm: &ConfigMap, wbp: &WorkerBackpressure) -> bool {
    let Some(uid) = wbp.metadata.uid.as_deref() else {
        return false;
    };
    cm.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// What [`sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The ConfigMap is the object's and already as wanted: nothing written.
    Unchanged,
    /// The ConfigMap was created, or the object's own ConfigMap updated.
    Written,
    /// A ConfigMap of that name exists and is not the object's: left untouched.
    NotOwned {
        /// Its name.
        name: String,
        /// Who owns it, in words (for the condition and the event).
        owner: String,
    },
}

/// Brings the object's ConfigMap to `desired`, never touching one the object does not own
/// ([`owned_by`]):
///
/// - `cached` (the operator's watch of labelled ConfigMaps) holds it: the object's and up to
///   date → nothing; the object's → applied; anyone else's → [`Synced::NotOwned`], no request;
/// - not cached (new, or a ConfigMap without the operator's label): read it; absent → created
///   (POST, so an existing one is never overwritten: a race ends in 409, retried); the
///   object's (the cache lags behind a create) → applied when out of date; anyone else's →
///   [`Synced::NotOwned`].
///
/// An update of the object's own ConfigMap is a forced server-side apply carrying the UID read,
/// so a ConfigMap deleted and re-created by someone else in between is not taken over either
/// (`metadata.uid` is immutable: 422, retried with the next reconcile). No resourceVersion
/// precondition: the cache lags behind the operator's own writes, and re-applying the object's
/// own ConfigMap is idempotent.
pub async fn sync(
    client: &kube::Client,
    wbp: &WorkerBackpressure,
    cached: Option<&ConfigMap>,
    desired: &ConfigMap,
) -> Result<Synced, kube::Error> {
    let ns = desired.metadata.namespace.clone().unwrap_or_default();
    let name = desired.metadata.name.clone().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let live = match cached {
        Some(c) => {
            if !owned_by(c, wbp) {
                return Ok(not_owned(c, name));
            }
            if up_to_date(Some(c), desired) {
                return Ok(Synced::Unchanged);
            }
            c.clone()
        }
        None => match api.get_opt(&name).await? {
            None => {
                api.create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.to_owned()),
                        ..Default::default()
                    },
                    desired,
                )
                .await?;
                return Ok(Synced::Written);
            }
            Some(live) if !owned_by(&live, wbp) => return Ok(not_owned(&live, name)),
            Some(live) if up_to_date(Some(&live), desired) => return Ok(Synced::Unchanged),
            Some(live) => live,
        },
    };
    let mut body = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "ConfigMap".into();
    body["metadata"]["uid"] = live.metadata.uid.clone().into();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(Synced::Written)
}

/// The [`Synced::NotOwned`] of `cm`.
fn not_owned(cm: &ConfigMap, name: String) -> Synced {
    let controller = cm
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let owner = match controller {
        Some(o) => format!("its controller is {} {} (UID {})", o.kind, o.name, o.uid),
        None => "it has no controller owner reference".to_owned(),
    };
    Synced::NotOwned { name, owner }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn wbp() -> WorkerBackpressure {
        let mut w = WorkerBackpressure::new("w", Default::default());
        w.metadata.namespace = Some("ns".into());
        w.metadata.uid = Some("u1".into());
        w
    }

    /// Configs that differ by content (`a`, `b`, ...).
    fn config(tag: &str) -> WorkerConfig {
        WorkerConfig {
            max_permits: tag.bytes().map(u32::from).sum(),
            ..Default::default()
        }
        .with_hash()
    }

    /// The files carry the documents without their hash, which every receiver computes the
    /// same way as the document's own (0.1 workers their legacy hash).
    #[test]
    fn the_files_leave_the_hash_to_the_receiver() {
        let cfg = config("a");
        let producer = ProducerConfig {
            state: backpressure_api::wire::GateState::Paused,
            ..ProducerConfig::default()
        }
        .with_hash();
        let cm = desired(&wbp(), &cfg, Some(&producer)).unwrap();
        let data = cm.data.unwrap();
        let file = WorkerConfig::parse(data[CONFIG_FILE_NAME].as_bytes()).unwrap();
        assert_eq!(file.hash, "");
        assert_eq!(file.compute_hash(), cfg.hash);
        assert_eq!(file.generation, cfg.generation);
        let p = ProducerConfig::parse(data[PRODUCER_FILE_NAME].as_bytes()).unwrap();
        assert_eq!(
            (p.hash.as_str(), p.compute_hash()),
            ("", producer.hash.clone())
        );
        assert_eq!(
            cm.metadata.annotations.unwrap()["backpressure.dev/config-hash"],
            cfg.hash
        );
    }

    fn cached(cm: &ConfigMap) -> ConfigMap {
        let mut c = cm.clone();
        for_cache(&mut c);
        c
    }

    #[test]
    fn cached_form_keeps_a_digest_instead_of_the_data() {
        let desired = desired(&wbp(), &config("a"), None).unwrap();
        let c = cached(&desired);
        assert_eq!(c.data, None);
        assert_eq!(c.metadata.managed_fields, None);
        assert_eq!(c.metadata.labels, desired.metadata.labels);
        assert_eq!(
            c.metadata.annotations.as_ref().map(|a| a.len()),
            Some(1),
            "only the digest annotation is cached"
        );
        assert!(up_to_date(Some(&c), &desired));
        assert!(
            up_to_date(Some(&desired), &desired),
            "a whole ConfigMap compares too"
        );
        assert!(!up_to_date(None, &desired));
    }

    #[test]
    fn any_difference_in_data_labels_or_owner_is_out_of_date() {
        let want = desired(&wbp(), &config("a"), None).unwrap();
        let other = desired(&wbp(), &config("b"), None).unwrap();
        assert!(!up_to_date(Some(&cached(&other)), &want));

        let mut edited = want.clone();
        if let Some(d) = edited.data.as_mut() {
            d.insert("extra".into(), String::new());
        }
        assert!(!up_to_date(Some(&cached(&edited)), &want));

        let mut binary = want.clone();
        binary.binary_data = Some(BTreeMap::from([("k".into(), ByteString(vec![1]))]));
        assert!(!up_to_date(Some(&cached(&binary)), &want));

        let mut relabelled = want.clone();
        if let Some(l) = relabelled.metadata.labels.as_mut() {
            l.insert(MANAGED_BY_LABEL.into(), "someone-else".into());
        }
        assert!(!up_to_date(Some(&cached(&relabelled)), &want));

        let mut orphan = want.clone();
        orphan.metadata.owner_references = None;
        assert!(!up_to_date(Some(&cached(&orphan)), &want));

        // Keys and values are delimited: moving bytes between them is a change.
        let mut a = want.clone();
        a.data = Some(BTreeMap::from([("ab".into(), "c".into())]));
        let mut b = want.clone();
        b.data = Some(BTreeMap::from([("a".into(), "bc".into())]));
        assert!(!up_to_date(Some(&cached(&a)), &b));
    }

    #[test]
    fn only_a_controller_owner_reference_with_the_objects_uid_is_ownership() {
        let w = wbp();
        let ours = desired(&w, &config("a"), None).unwrap();
        assert!(owned_by(&ours, &w));

        let mut foreign = ours.clone();
        foreign.metadata.owner_references = None;
        assert!(!owned_by(&foreign, &w), "same name, no ownerRef");
        assert_eq!(
            not_owned(&foreign, "w-worker-config".into()),
            Synced::NotOwned {
                name: "w-worker-config".into(),
                owner: "it has no controller owner reference".into()
            }
        );

        let mut earlier = w.clone();
        earlier.metadata.uid = Some("u0".into());
        let previous_incarnation = desired(&earlier, &config("a"), None).unwrap();
        assert!(
            !owned_by(&previous_incarnation, &w),
            "an object of the same name that was deleted and re-created"
        );

        let mut not_controller = ours.clone();
        for o in not_controller
            .metadata
            .owner_references
            .iter_mut()
            .flatten()
        {
            o.controller = Some(false);
        }
        assert!(!owned_by(&not_controller, &w));

        let mut no_uid = w.clone();
        no_uid.metadata.uid = None;
        assert!(!owned_by(&ours, &no_uid));
    }
}
