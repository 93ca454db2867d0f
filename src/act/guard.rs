//! Guard mode: clamp the scale-out of an existing autoscaler instead of scaling the target.
//!
//! | clamp ([`clamp_for`]) | HorizontalPodAutoscaler (autoscaling/v2) | KEDA ScaledObject (keda.sh/v1alpha1) |
//! |---|---|---|
//! | [`Clamp::Hold`]: no scale-out (failure rate above the set point, manual hold; held or hold pending with `hold.allowScaleIn`) | `spec.behavior.scaleUp.selectPolicy: Disabled` | annotation `autoscaling.keda.sh/paused-scale-out: "true"` |
//! | [`Clamp::Freeze`]: no scale-out, no scale-in (held, hold pending) | also `spec.behavior.scaleDown.selectPolicy: Disabled` | also annotation `autoscaling.keda.sh/paused-scale-in: "true"` |
//! | [`Clamp::Ceiling`]: ramp stage k | `spec.maxReplicas` = the stage's replicas | `spec.maxReplicaCount` = the stage's replicas |
//! | [`Clamp::Free`]: anything else, DryRun, another mode, deletion | the original settings | the original settings |
//!
//! Both APIs can stop each direction on its own: `selectPolicy: Disabled` per direction is
//! part of the HPA's `behavior` (KEDA's two annotations set exactly that on the HPA it
//! manages, and also stop its scale to and from zero). Raising `minReplicas` to the current
//! replicas would also stop scale-in, but it changes what the autoscaler reports as its
//! bounds and is lost if the replicas change under it; the policies are the documented switch.
//!
//! Before the first clamp, the original values of exactly the fields Guard mode touches are
//! recorded on the autoscaler itself, in the annotation [`ORIGINAL_ANNOTATION`], as the JSON
//! merge patch that restores them (`null` for a field that was absent) together with the name
//! of the WorkerBackpressure that owns the clamp. A restarted operator therefore restores the
//! original values, never its own clamp. Restoring applies that patch and removes the
//! annotation, so the autoscaler's spec and annotations are exactly what they were.
//!
//! Every write is a JSON merge patch touching only those fields (field manager
//! [`backpressure_api::FIELD_MANAGER`]), with the `resourceVersion` read as a precondition, and is made
//! only when it changes something. Nothing here scales the target.
//!
//! The clamp a decision asks for ([`clamp_for`]) is computed in [`backpressure_core::guard`]; this
//! module maps it onto the autoscaler.

use backpressure_api::v1alpha1::{GuardClamp, GuardKind, GuardStatus, WorkerBackpressure};
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use backpressure_api::FIELD_MANAGER;
pub use backpressure_core::guard::{Clamp, ClampPlan, clamp_for};

/// Annotation on a guarded HPA or ScaledObject holding the original values of the clamped
/// fields (see the module documentation).
pub const ORIGINAL_ANNOTATION: &str = "backpressure.dev/original";
/// Finalizer on a Guard-mode WorkerBackpressure: its deletion waits until the guarded
/// autoscaler has its original settings back.
pub const FINALIZER: &str = "backpressure.dev/guard";
/// KEDA's annotation that disables scale-out of a ScaledObject (KEDA >= 2.18).
pub const KEDA_PAUSED_SCALE_OUT: &str = "autoscaling.keda.sh/paused-scale-out";
/// KEDA's annotation that disables scale-in of a ScaledObject (KEDA >= 2.18).
pub const KEDA_PAUSED_SCALE_IN: &str = "autoscaling.keda.sh/paused-scale-in";
/// KEDA's default `maxReplicaCount` when the field is absent.
pub const KEDA_DEFAULT_MAX_REPLICA_COUNT: i64 = 100;

/// The record kept in [`ORIGINAL_ANNOTATION`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Original {
    /// Name of the WorkerBackpressure that owns the clamp (same namespace).
    pub owner: String,
    /// The JSON merge patch that restores the original values.
    pub restore: Value,
}

/// What to do to the autoscaler.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// It already looks as wanted.
    Unchanged,
    /// Apply this JSON merge patch.
    Patch(Value),
}

/// Why the autoscaler could not be guarded.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The autoscaler does not exist (or its API is not served).
    #[error("{kind:?} {name} not found{hint}")]
    NotFound {
        /// Its kind.
        kind: GuardKind,
        /// Its name.
        name: String,
        /// A hint about the cause.
        hint: &'static str,
    },
    /// Another WorkerBackpressure clamps it.
    #[error(
        "{kind:?} {name} is already clamped by WorkerBackpressure {owner} (annotation {ORIGINAL_ANNOTATION})"
    )]
    Conflict {
        /// Its kind.
        kind: GuardKind,
        /// Its name.
        name: String,
        /// The other WorkerBackpressure.
        owner: String,
    },
    /// The annotation does not hold a record this operator wrote.
    #[error("annotation {ORIGINAL_ANNOTATION} on {kind:?} {name} is unreadable: {why}")]
    BadRecord {
        /// Its kind.
        kind: GuardKind,
        /// Its name.
        name: String,
        /// The parse error.
        why: String,
    },
    /// Reading or patching failed.
    #[error("{verb} {kind:?} {name}")]
    Api {
        /// `reading` or `patching`.
        verb: &'static str,
        /// Its kind.
        kind: GuardKind,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl GuardError {
    /// Whether the patch lost a race with another writer (HTTP 409): worth retrying at once.
    pub fn is_conflict(&self) -> bool {
        matches!(self, GuardError::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// The condition and event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            GuardError::NotFound { .. } => "GuardTargetNotFound",
            GuardError::Conflict { .. } => "GuardConflict",
            GuardError::BadRecord { .. } => "GuardRecordInvalid",
            GuardError::Api { .. } => "GuardPatchFailed",
        }
    }
}

/// The API resource of a guarded kind (defined with the watches of every autoscaler).
pub use crate::observe::autoscalers::api_resource;

/// Reads the fields Guard mode may touch, as the merge patch that would restore them.
pub fn capture(kind: GuardKind, obj: &Value) -> Value {
    match kind {
        GuardKind::HorizontalPodAutoscaler => {
            let spec = &obj["spec"];
            let behavior = match spec.get("behavior") {
                None | Some(Value::Null) => Value::Null,
                Some(b) => json!({
                    "scaleUp": capture_rules(b.get("scaleUp")),
                    "scaleDown": capture_rules(b.get("scaleDown")),
                }),
            };
            json!({"spec": {
                "maxReplicas": spec.get("maxReplicas").cloned().unwrap_or(Value::Null),
                "behavior": behavior,
            }})
        }
        GuardKind::ScaledObject => {
            let annotations = &obj["metadata"]["annotations"];
            let keep = |key: &str| annotations.get(key).cloned().unwrap_or(Value::Null);
            json!({
                "metadata": {"annotations": {
                    KEDA_PAUSED_SCALE_OUT: keep(KEDA_PAUSED_SCALE_OUT),
                    KEDA_PAUSED_SCALE_IN: keep(KEDA_PAUSED_SCALE_IN),
                }},
                "spec": {
                    "maxReplicaCount": obj["spec"].get("maxReplicaCount").cloned().unwrap_or(Value::Null),
                },
            })
        }
    }
}

/// The restore patch of one HPA scaling-rules block (`behavior.scaleUp` or `scaleDown`): only
/// its `selectPolicy`, or `null` when the block was absent.
fn capture_rules(rules: Option<&Value>) -> Value {
    match rules {
        None | Some(Value::Null) => Value::Null,
        Some(r) => json!({"selectPolicy": r.get("selectPolicy").cloned().unwrap_or(Value::Null)}),
    }
}

/// Completes a record written before Guard mode could stop scale-in: it does not say what the
/// scale-in fields were, and the operator that wrote it never changed them, so their current
/// values are the originals. Returns whether the record changed.
fn complete_record(kind: GuardKind, restore: &mut Value, obj: &Value) -> bool {
    match kind {
        GuardKind::HorizontalPodAutoscaler => {
            let Some(behavior) = restore["spec"]
                .get_mut("behavior")
                .and_then(Value::as_object_mut)
            else {
                // `behavior: null` restores by removing the whole block, scale-in included.
                return false;
            };
            if behavior.contains_key("scaleDown") {
                return false;
            }
            let current = obj["spec"].get("behavior").and_then(|b| b.get("scaleDown"));
            behavior.insert("scaleDown".into(), capture_rules(current));
            true
        }
        GuardKind::ScaledObject => {
            let Some(annotations) = restore
                .get_mut("metadata")
                .and_then(|m| m.get_mut("annotations"))
                .and_then(Value::as_object_mut)
            else {
                return false;
            };
            if annotations.contains_key(KEDA_PAUSED_SCALE_IN) {
                return false;
            }
            let current = obj["metadata"]["annotations"]
                .get(KEDA_PAUSED_SCALE_IN)
                .cloned()
                .unwrap_or(Value::Null);
            annotations.insert(KEDA_PAUSED_SCALE_IN.into(), current);
            true
        }
    }
}

/// The values Guard mode wants: the original values (`restore`) with the clamp laid over.
fn clamped(kind: GuardKind, restore: &Value, obj: &Value, clamp: Clamp) -> Value {
    let mut want = restore.clone();
    match (kind, clamp) {
        (_, Clamp::Free) => {}
        (GuardKind::HorizontalPodAutoscaler, Clamp::Hold) => {
            // Scale-in as it was: said explicitly, since a `Freeze` before may have disabled
            // it and a merge patch that does not name a field leaves it. An absent policy is
            // the API's default, `Max` (also what the API server fills in for it).
            let down = restore["spec"]["behavior"]["scaleDown"]["selectPolicy"]
                .as_str()
                .unwrap_or("Max")
                .to_owned();
            merge_patch(
                &mut want,
                &json!({"spec": {"behavior": {
                    "scaleUp": {"selectPolicy": "Disabled"},
                    "scaleDown": {"selectPolicy": down},
                }}}),
            );
        }
        (GuardKind::HorizontalPodAutoscaler, Clamp::Freeze) => {
            merge_patch(
                &mut want,
                &json!({"spec": {"behavior": {
                    "scaleUp": {"selectPolicy": "Disabled"},
                    "scaleDown": {"selectPolicy": "Disabled"},
                }}}),
            );
        }
        (GuardKind::HorizontalPodAutoscaler, Clamp::Ceiling(n)) => {
            let original = restore["spec"]["maxReplicas"].as_i64().unwrap_or(i64::MAX);
            let min = obj["spec"]["minReplicas"].as_i64().unwrap_or(1).max(1);
            let ceiling = i64::from(n).max(min).min(original.max(min));
            set_path(&mut want, &["spec", "maxReplicas"], json!(ceiling));
        }
        (GuardKind::ScaledObject, Clamp::Hold) => {
            set_path(
                &mut want,
                &["metadata", "annotations", KEDA_PAUSED_SCALE_OUT],
                json!("true"),
            );
        }
        (GuardKind::ScaledObject, Clamp::Freeze) => {
            for key in [KEDA_PAUSED_SCALE_OUT, KEDA_PAUSED_SCALE_IN] {
                set_path(&mut want, &["metadata", "annotations", key], json!("true"));
            }
        }
        (GuardKind::ScaledObject, Clamp::Ceiling(n)) => {
            let original = restore["spec"]["maxReplicaCount"]
                .as_i64()
                .unwrap_or(KEDA_DEFAULT_MAX_REPLICA_COUNT);
            let min = obj["spec"]["minReplicaCount"].as_i64().unwrap_or(0).max(1);
            let ceiling = i64::from(n).max(min).min(original.max(min));
            set_path(&mut want, &["spec", "maxReplicaCount"], json!(ceiling));
        }
    }
    want
}

/// The replica ceiling `want` sets, if the clamp is a ceiling.
fn ceiling_of(kind: GuardKind, want: &Value) -> Option<i32> {
    let v = match kind {
        GuardKind::HorizontalPodAutoscaler => &want["spec"]["maxReplicas"],
        GuardKind::ScaledObject => &want["spec"]["maxReplicaCount"],
    };
    v.as_i64().and_then(|n| i32::try_from(n).ok())
}

/// Decides the patch that brings the autoscaler `obj` (its JSON) to `clamp` on behalf of the
/// WorkerBackpressure `owner`. Pure.
pub fn plan(
    kind: GuardKind,
    name: &str,
    obj: &Value,
    owner: &str,
    clamp: Clamp,
) -> Result<Plan, GuardError> {
    let record = obj["metadata"]["annotations"]
        .get(ORIGINAL_ANNOTATION)
        .and_then(Value::as_str);
    let original = match record {
        Some(text) => {
            let mut o: Original =
                serde_json::from_str(text).map_err(|e| GuardError::BadRecord {
                    kind,
                    name: name.to_owned(),
                    why: e.to_string(),
                })?;
            if !o.restore.is_object() {
                return Err(GuardError::BadRecord {
                    kind,
                    name: name.to_owned(),
                    why: "restore is not an object".into(),
                });
            }
            if o.owner != owner {
                return Err(GuardError::Conflict {
                    kind,
                    name: name.to_owned(),
                    owner: o.owner,
                });
            }
            let text = if complete_record(kind, &mut o.restore, obj) {
                serde_json::to_string(&o).map_err(|e| GuardError::BadRecord {
                    kind,
                    name: name.to_owned(),
                    why: e.to_string(),
                })?
            } else {
                text.to_owned()
            };
            Some((o, text))
        }
        None => None,
    };
    let mut patch = match (&original, clamp) {
        (None, Clamp::Free) => return Ok(Plan::Unchanged),
        (Some((o, _)), Clamp::Free) => {
            let mut p = o.restore.clone();
            set_path(
                &mut p,
                &["metadata", "annotations", ORIGINAL_ANNOTATION],
                Value::Null,
            );
            // `annotations: {}` left by removing the last key would be stored as an empty map;
            // the API server drops it, so the result equals the original either way.
            p
        }
        (Some((o, text)), c) => {
            let mut p = clamped(kind, &o.restore, obj, c);
            set_path(
                &mut p,
                &["metadata", "annotations", ORIGINAL_ANNOTATION],
                json!(text),
            );
            p
        }
        (None, c) => {
            let restore = capture(kind, obj);
            let record = Original {
                owner: owner.to_owned(),
                restore: restore.clone(),
            };
            let text = serde_json::to_string(&record).map_err(|e| GuardError::BadRecord {
                kind,
                name: name.to_owned(),
                why: e.to_string(),
            })?;
            let mut p = clamped(kind, &restore, obj, c);
            set_path(
                &mut p,
                &["metadata", "annotations", ORIGINAL_ANNOTATION],
                json!(text),
            );
            p
        }
    };
    let mut after = obj.clone();
    merge_patch(&mut after, &patch);
    if normalized(after) == normalized(obj.clone()) {
        return Ok(Plan::Unchanged);
    }
    if let Some(rv) = obj["metadata"].get("resourceVersion") {
        set_path(&mut patch, &["metadata", "resourceVersion"], rv.clone());
    }
    Ok(Plan::Patch(patch))
}

/// Drops empty `metadata.annotations` (the API server stores no empty map).
fn normalized(mut v: Value) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut)
        && meta
            .get("annotations")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
    {
        meta.remove("annotations");
    }
    v
}

/// Sets `path` in `v` to `value` (`null` included, as a merge patch needs), turning anything
/// on the way that is not an object into one.
fn set_path(v: &mut Value, path: &[&str], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        *v = value;
        return;
    };
    let mut cur = v;
    for key in parents {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(m) = cur else { return };
        cur = m.entry((*key).to_owned()).or_insert(Value::Null);
    }
    if !cur.is_object() {
        *cur = Value::Object(Map::new());
    }
    if let Value::Object(m) = cur {
        m.insert((*last).to_owned(), value);
    }
}

/// Applies a JSON merge patch (RFC 7386) to `target`.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The outcome of [`sync`].
#[derive(Debug, Clone, PartialEq)]
pub struct Synced {
    /// Whether the autoscaler was patched.
    pub changed: bool,
    /// What status says about it.
    pub status: GuardStatus,
}

/// Brings the autoscaler `kind`/`name` in `ns` to `clamp` for the WorkerBackpressure `owner`.
/// A missing autoscaler is an error unless `clamp` is [`Clamp::Free`] (then there is nothing to
/// restore).
pub async fn sync(
    client: &kube::Client,
    ns: &str,
    kind: GuardKind,
    name: &str,
    owner: &str,
    clamp: Clamp,
) -> Result<Synced, GuardError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &api_resource(kind));
    let free = GuardStatus {
        kind,
        name: name.to_owned(),
        clamp: GuardClamp::None,
        max_replicas: None,
    };
    let obj = match api.get(name).await {
        Ok(o) => o,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            if clamp == Clamp::Free {
                return Ok(Synced {
                    changed: false,
                    status: free,
                });
            }
            return Err(GuardError::NotFound {
                kind,
                name: name.to_owned(),
                hint: match kind {
                    GuardKind::HorizontalPodAutoscaler => "",
                    GuardKind::ScaledObject => " (is KEDA's ScaledObject CRD installed?)",
                },
            });
        }
        Err(source) => {
            return Err(GuardError::Api {
                verb: "reading",
                kind,
                name: name.to_owned(),
                source,
            });
        }
    };
    let json = serde_json::to_value(&obj).unwrap_or(Value::Null);
    let planned = plan(kind, name, &json, owner, clamp)?;
    let status = match clamp {
        Clamp::Free => free,
        Clamp::Hold => GuardStatus {
            clamp: GuardClamp::ScaleOutDisabled,
            ..free
        },
        Clamp::Freeze => GuardStatus {
            clamp: GuardClamp::ScalingDisabled,
            ..free
        },
        Clamp::Ceiling(_) => {
            let mut want = json.clone();
            if let Plan::Patch(p) = &planned {
                merge_patch(&mut want, p);
            }
            GuardStatus {
                clamp: GuardClamp::MaxReplicas,
                max_replicas: ceiling_of(kind, &want),
                ..free
            }
        }
    };
    let Plan::Patch(patch) = planned else {
        return Ok(Synced {
            changed: false,
            status,
        });
    };
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| GuardError::Api {
            verb: "patching",
            kind,
            name: name.to_owned(),
            source,
        })?;
    tracing::info!(namespace = ns, kind = ?kind, name, owner, clamp = ?clamp, "guarded autoscaler patched");
    Ok(Synced {
        changed: true,
        status,
    })
}

/// Restores the original settings of `kind`/`name` if `owner` clamped it. Nothing to do (and
/// `Ok(false)`) when the autoscaler is gone, carries no record, or another WorkerBackpressure
/// owns the clamp.
pub async fn release(
    client: &kube::Client,
    ns: &str,
    kind: GuardKind,
    name: &str,
    owner: &str,
) -> Result<bool, GuardError> {
    match sync(client, ns, kind, name, owner, Clamp::Free).await {
        Ok(s) => Ok(s.changed),
        Err(GuardError::Conflict { .. } | GuardError::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The autoscalers `wbp` may have clamped: `spec.guard` and the one named in `status.guard`.
pub fn guarded_refs(wbp: &WorkerBackpressure) -> Vec<(GuardKind, String)> {
    let mut out: Vec<(GuardKind, String)> = Vec::new();
    let spec = wbp.spec.guard.as_ref().map(|g| (g.kind, g.name.clone()));
    let status = wbp
        .status
        .as_ref()
        .and_then(|s| s.guard.as_ref())
        .map(|g| (g.kind, g.name.clone()));
    for r in [status, spec].into_iter().flatten() {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// Whether `wbp` carries the guard finalizer.
pub fn has_finalizer(wbp: &WorkerBackpressure) -> bool {
    wbp.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds or removes the guard finalizer (a merge patch of `metadata.finalizers` with the
/// object's `resourceVersion` as a precondition). No request when nothing changes.
pub async fn set_finalizer(
    client: &kube::Client,
    wbp: &WorkerBackpressure,
    present: bool,
) -> Result<(), kube::Error> {
    if has_finalizer(wbp) == present {
        return Ok(());
    }
    let mut list: Vec<String> = wbp
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        list.push(FINALIZER.to_owned());
    }
    let api: Api<WorkerBackpressure> =
        Api::namespaced(client.clone(), &wbp.namespace().unwrap_or_default());
    let patch = json!({"metadata": {
        "finalizers": list,
        "resourceVersion": wbp.resource_version(),
    }});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(&wbp.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn hpa(behavior: Option<Value>, annotations: Value) -> Value {
        let mut spec = json!({
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
            "minReplicas": 2,
            "maxReplicas": 10,
        });
        if let Some(b) = behavior {
            spec["behavior"] = b;
        }
        json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "h", "resourceVersion": "7", "annotations": annotations},
            "spec": spec,
        })
    }

    fn apply(obj: &Value, plan: Plan) -> Value {
        let mut out = obj.clone();
        if let Plan::Patch(mut p) = plan {
            // The API server consumes the precondition.
            p["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
            merge_patch(&mut out, &p);
        }
        normalized(out)
    }

    const HPA: GuardKind = GuardKind::HorizontalPodAutoscaler;
    const SO: GuardKind = GuardKind::ScaledObject;

    #[test]
    fn hpa_without_behavior_round_trips_through_hold_ceiling_and_free() {
        let original = hpa(None, json!({"team": "a"}));
        let held = apply(
            &original,
            plan(HPA, "h", &original, "w", Clamp::Hold).unwrap(),
        );
        assert_eq!(
            held["spec"]["behavior"]["scaleUp"]["selectPolicy"],
            "Disabled"
        );
        assert_eq!(held["spec"]["maxReplicas"], 10);
        assert_eq!(held["metadata"]["annotations"]["team"], "a");
        let record: Original = serde_json::from_str(
            held["metadata"]["annotations"][ORIGINAL_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(record.owner, "w");
        assert_eq!(
            record.restore,
            json!({"spec": {"maxReplicas": 10, "behavior": null}})
        );
        // Held again: nothing to do.
        assert_eq!(
            plan(HPA, "h", &held, "w", Clamp::Hold).unwrap(),
            Plan::Unchanged
        );

        let ramp = apply(
            &held,
            plan(HPA, "h", &held, "w", Clamp::Ceiling(6)).unwrap(),
        );
        assert_eq!(ramp["spec"]["maxReplicas"], 6);
        assert!(ramp["spec"].get("behavior").is_none(), "{ramp}");
        // The ceiling never goes below minReplicas nor above the original maxReplicas.
        let low = apply(
            &ramp,
            plan(HPA, "h", &ramp, "w", Clamp::Ceiling(1)).unwrap(),
        );
        assert_eq!(low["spec"]["maxReplicas"], 2);
        let high = apply(
            &ramp,
            plan(HPA, "h", &ramp, "w", Clamp::Ceiling(40)).unwrap(),
        );
        assert_eq!(high["spec"]["maxReplicas"], 10);

        let free = apply(&high, plan(HPA, "h", &high, "w", Clamp::Free).unwrap());
        assert_eq!(free, normalized(original.clone()));
        assert_eq!(
            plan(HPA, "h", &free, "w", Clamp::Free).unwrap(),
            Plan::Unchanged
        );
    }

    #[test]
    fn hpa_with_behavior_keeps_everything_but_the_select_policy() {
        let behavior = json!({
            "scaleUp": {"selectPolicy": "Min", "stabilizationWindowSeconds": 30,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            "scaleDown": {"selectPolicy": "Max", "stabilizationWindowSeconds": 300,
                          "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
        });
        let original = hpa(Some(behavior), json!(null));
        let held = apply(
            &original,
            plan(HPA, "h", &original, "w", Clamp::Hold).unwrap(),
        );
        assert_eq!(
            held["spec"]["behavior"]["scaleUp"]["selectPolicy"],
            "Disabled"
        );
        assert_eq!(
            held["spec"]["behavior"]["scaleUp"]["policies"],
            original["spec"]["behavior"]["scaleUp"]["policies"]
        );
        let free = apply(&held, plan(HPA, "h", &held, "w", Clamp::Free).unwrap());
        let mut expected = original.clone();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(free, expected);
    }

    #[test]
    fn hpa_freeze_disables_both_directions_and_restores_exactly() {
        let behavior = json!({
            "scaleUp": {"selectPolicy": "Min", "stabilizationWindowSeconds": 30,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}]},
            "scaleDown": {"selectPolicy": "Max", "stabilizationWindowSeconds": 300,
                          "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
        });
        for original in [
            hpa(None, json!({"team": "a"})),
            hpa(Some(behavior), json!({})),
        ] {
            let frozen = apply(
                &original,
                plan(HPA, "h", &original, "w", Clamp::Freeze).unwrap(),
            );
            assert_eq!(
                frozen["spec"]["behavior"]["scaleUp"]["selectPolicy"],
                "Disabled"
            );
            assert_eq!(
                frozen["spec"]["behavior"]["scaleDown"]["selectPolicy"],
                "Disabled"
            );
            assert_eq!(
                frozen["spec"]["behavior"]["scaleDown"].get("policies"),
                original["spec"]["behavior"]["scaleDown"].get("policies")
            );
            assert_eq!(frozen["spec"]["maxReplicas"], 10);
            // Freeze → Hold gives scale-in back, with its original select policy (the API's
            // default, Max, when there was none).
            let held = apply(&frozen, plan(HPA, "h", &frozen, "w", Clamp::Hold).unwrap());
            assert_eq!(
                held["spec"]["behavior"]["scaleUp"]["selectPolicy"],
                "Disabled"
            );
            assert_eq!(
                held["spec"]["behavior"]["scaleDown"]["selectPolicy"],
                original["spec"]["behavior"]["scaleDown"]
                    .get("selectPolicy")
                    .cloned()
                    .unwrap_or(json!("Max")),
                "{held}"
            );
            let refrozen = apply(&held, plan(HPA, "h", &held, "w", Clamp::Freeze).unwrap());
            let free = apply(
                &refrozen,
                plan(HPA, "h", &refrozen, "w", Clamp::Free).unwrap(),
            );
            assert_eq!(free, normalized(original.clone()));
        }
    }

    #[test]
    fn a_record_from_before_the_scale_in_clamp_is_completed_from_the_object() {
        // Written by an operator that recorded only scaleUp (and never touched scaleDown).
        let behavior = json!({
            "scaleUp": {"selectPolicy": "Disabled"},
            "scaleDown": {"selectPolicy": "Min", "stabilizationWindowSeconds": 60},
        });
        let old = Original {
            owner: "w".into(),
            restore: json!({"spec": {"maxReplicas": 10,
                                     "behavior": {"scaleUp": {"selectPolicy": "Max"}}}}),
        };
        let held = hpa(
            Some(behavior),
            json!({ORIGINAL_ANNOTATION: serde_json::to_string(&old).unwrap()}),
        );
        let frozen = apply(&held, plan(HPA, "h", &held, "w", Clamp::Freeze).unwrap());
        assert_eq!(
            frozen["spec"]["behavior"]["scaleDown"]["selectPolicy"],
            "Disabled"
        );
        let record: Original = serde_json::from_str(
            frozen["metadata"]["annotations"][ORIGINAL_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            record.restore["spec"]["behavior"]["scaleDown"],
            json!({"selectPolicy": "Min"})
        );
        let free = apply(&frozen, plan(HPA, "h", &frozen, "w", Clamp::Free).unwrap());
        assert_eq!(free["spec"]["behavior"]["scaleUp"]["selectPolicy"], "Max");
        assert_eq!(free["spec"]["behavior"]["scaleDown"]["selectPolicy"], "Min");
        assert!(free["metadata"].get("annotations").is_none(), "{free}");

        // The same for a ScaledObject record without the scale-in annotation.
        let old = Original {
            owner: "w".into(),
            restore: json!({"metadata": {"annotations": {KEDA_PAUSED_SCALE_OUT: null}},
                            "spec": {"maxReplicaCount": 12}}),
        };
        let held = scaled_object(
            Some(12),
            json!({KEDA_PAUSED_SCALE_OUT: "true",
                   ORIGINAL_ANNOTATION: serde_json::to_string(&old).unwrap()}),
        );
        let frozen = apply(&held, plan(SO, "so", &held, "w", Clamp::Freeze).unwrap());
        assert_eq!(
            frozen["metadata"]["annotations"][KEDA_PAUSED_SCALE_IN],
            "true"
        );
        let free = apply(&frozen, plan(SO, "so", &frozen, "w", Clamp::Free).unwrap());
        assert!(free["metadata"].get("annotations").is_none(), "{free}");
    }

    #[test]
    fn a_restarted_operator_restores_the_recorded_values_not_its_own_clamp() {
        let original = hpa(None, json!({}));
        let held = apply(
            &original,
            plan(HPA, "h", &original, "w", Clamp::Hold).unwrap(),
        );
        // A fresh process knows nothing but the object: the record is on it.
        let free = apply(&held, plan(HPA, "h", &held, "w", Clamp::Free).unwrap());
        assert!(free["spec"].get("behavior").is_none());
        assert!(free["metadata"].get("annotations").is_none(), "{free}");
    }

    #[test]
    fn another_owner_is_a_conflict_and_a_bad_record_an_error() {
        let original = hpa(None, json!({}));
        let held = apply(
            &original,
            plan(HPA, "h", &original, "w", Clamp::Hold).unwrap(),
        );
        let err = plan(HPA, "h", &held, "other", Clamp::Free).unwrap_err();
        assert_eq!(err.reason(), "GuardConflict");
        assert!(err.to_string().contains("WorkerBackpressure w"), "{err}");
        let bad = hpa(None, json!({ORIGINAL_ANNOTATION: "{not json"}));
        assert_eq!(
            plan(HPA, "h", &bad, "w", Clamp::Hold).unwrap_err().reason(),
            "GuardRecordInvalid"
        );
    }

    #[test]
    fn the_patch_carries_the_resource_version_and_only_guarded_fields() {
        let original = hpa(None, json!({}));
        let Plan::Patch(p) = plan(HPA, "h", &original, "w", Clamp::Hold).unwrap() else {
            panic!("expected a patch");
        };
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        let spec_keys: Vec<&String> = p["spec"].as_object().unwrap().keys().collect();
        assert_eq!(spec_keys, ["behavior", "maxReplicas"]);
    }

    fn scaled_object(max: Option<i64>, annotations: Value) -> Value {
        let mut spec = json!({
            "scaleTargetRef": {"name": "w"},
            "minReplicaCount": 1,
            "triggers": [{"type": "prometheus", "metadata": {"query": "q", "threshold": "5"}}],
        });
        if let Some(m) = max {
            spec["maxReplicaCount"] = json!(m);
        }
        json!({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "so", "resourceVersion": "3", "annotations": annotations},
            "spec": spec,
        })
    }

    #[test]
    fn scaled_object_round_trips_through_pause_ceiling_and_free() {
        for (max, annotations) in [
            (Some(12), json!({"keep": "me"})),
            (None, json!({})),
            (Some(5), json!({KEDA_PAUSED_SCALE_OUT: "false"})),
            (Some(5), json!({KEDA_PAUSED_SCALE_IN: "true"})),
        ] {
            let original = scaled_object(max, annotations);
            let frozen = apply(
                &original,
                plan(SO, "so", &original, "w", Clamp::Freeze).unwrap(),
            );
            for key in [KEDA_PAUSED_SCALE_OUT, KEDA_PAUSED_SCALE_IN] {
                assert_eq!(frozen["metadata"]["annotations"][key], "true");
            }
            let unfrozen = apply(&frozen, plan(SO, "so", &frozen, "w", Clamp::Free).unwrap());
            assert_eq!(unfrozen, normalized(original.clone()), "max {max:?}");
            let held = apply(
                &original,
                plan(SO, "so", &original, "w", Clamp::Hold).unwrap(),
            );
            assert_eq!(
                held["metadata"]["annotations"][KEDA_PAUSED_SCALE_OUT],
                "true"
            );
            assert_eq!(
                held["spec"].get("maxReplicaCount"),
                original["spec"].get("maxReplicaCount")
            );
            let ramp = apply(
                &held,
                plan(SO, "so", &held, "w", Clamp::Ceiling(4)).unwrap(),
            );
            assert_eq!(ramp["spec"]["maxReplicaCount"], max.unwrap_or(100).min(4));
            assert_eq!(
                ramp["metadata"]["annotations"].get(KEDA_PAUSED_SCALE_OUT),
                original["metadata"]["annotations"].get(KEDA_PAUSED_SCALE_OUT)
            );
            let free = apply(&ramp, plan(SO, "so", &ramp, "w", Clamp::Free).unwrap());
            assert_eq!(free, normalized(original.clone()), "max {max:?}");
        }
    }
}
