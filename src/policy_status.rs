//! `BackpressurePolicy` status: the WorkerBackpressure objects each policy applies to, whether
//! its emergency brake is in force, and a `Ready` condition (kstatus reads it with
//! `observedGeneration`).
//!
//! [`desired`] computes a policy's status from the operator's caches (pure, `now` passed in);
//! [`run`] recomputes every policy's status every few seconds and writes it with server-side
//! apply (field manager [`backpressure_api::FIELD_MANAGER`]) only when it differs from what is stored. The
//! brake's `expiresAt` is honoured to within that interval.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    BackpressurePolicy, BackpressurePolicyStatus, WorkerBackpressure,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

use backpressure_api::FIELD_MANAGER;
use backpressure_core::resolve::{brake_active, namespace_selector_matches};

use crate::observe::scope::{self, WatchScope};

/// Namespace name → its labels.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// The status `policy` should have, given the namespace of every WorkerBackpressure and the
/// namespaces' labels, at `now`. `lastTransitionTime` of `Ready` is kept from the stored status while its status
/// value is unchanged.
pub fn desired<'a>(
    policy: &BackpressurePolicy,
    object_namespaces: impl IntoIterator<Item = &'a str>,
    namespaces: &NamespaceLabels,
    now: Timestamp,
) -> BackpressurePolicyStatus {
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let empty = BTreeMap::new();
    let selector = policy.spec.namespace_selector.as_ref();
    let mut matched = 0i32;
    let mut selector_error = None;
    for ns in object_namespaces {
        let labels = namespaces.get(ns).unwrap_or(&empty);
        match namespace_selector_matches(selector, labels) {
            Ok(true) => matched = matched.saturating_add(1),
            Ok(false) => {}
            Err(e) => {
                selector_error = Some(e.to_string());
                break;
            }
        }
    }
    // An invalid selector is invalid whatever the namespaces are.
    if selector_error.is_none()
        && let Err(e) = namespace_selector_matches(selector, &empty)
    {
        selector_error = Some(e.to_string());
    }
    let brake = policy.spec.brake.as_ref();
    let brake_on = brake.map(|b| brake_active(b, now));

    let (ready, reason, message) = match &selector_error {
        Some(e) => {
            matched = 0;
            (
                false,
                "InvalidSelector",
                format!("spec.namespaceSelector selects nothing: {e}"),
            )
        }
        None => {
            let mut m = format!(
                "applies to {matched} WorkerBackpressure object{}",
                if matched == 1 { "" } else { "s" }
            );
            if policy.spec.dry_run == Some(true) {
                m.push_str("; all of them in DryRun");
            }
            match (brake, brake_on) {
                (Some(b), Some(true)) => {
                    m.push_str(&format!(
                        "; emergency brake minBackoff {} in force",
                        b.min_backoff
                    ));
                    if let Some(t) = &b.expires_at {
                        m.push_str(&format!(" until {}", t.0));
                    }
                    if let Some(r) = b.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()) {
                        m.push_str(&format!(": {r}"));
                    }
                }
                (Some(b), Some(false)) => {
                    if let Some(t) = &b.expires_at {
                        m.push_str(&format!("; emergency brake expired at {}", t.0));
                    }
                }
                _ => {}
            }
            (true, "Applied", m)
        }
    };
    let status_value = if ready { "True" } else { "False" };
    let previous = policy
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == cond::READY));
    let last_transition_time = previous
        .filter(|c| c.status == status_value)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    BackpressurePolicyStatus {
        observed_generation: policy.metadata.generation,
        matched_objects: Some(matched),
        brake_active: Some(brake_on.unwrap_or(false)),
        conditions: Some(vec![Condition {
            type_: cond::READY.to_owned(),
            status: status_value.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: policy.metadata.generation,
            last_transition_time,
        }]),
    }
}

/// Namespace labels from the namespace cache.
pub fn namespace_labels(namespaces: &Store<PartialObjectMeta<Namespace>>) -> NamespaceLabels {
    namespaces
        .state()
        .iter()
        .filter_map(|n| {
            Some((
                n.metadata.name.clone()?,
                n.metadata.labels.clone().unwrap_or_default(),
            ))
        })
        .collect()
}

/// Keeps every policy's status up to date until the task is dropped: once `caches` turns true
/// (the policy and namespace caches have their first list) and its own metadata-only cache of
/// WorkerBackpressure objects has its first list, every `interval` computes each status and
/// applies the ones that changed.
pub async fn run(
    client: kube::Client,
    scope: WatchScope,
    policies: Store<BackpressurePolicy>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    mut caches: tokio::sync::watch::Receiver<bool>,
    interval: Duration,
) {
    // Only the namespaces of the objects matter: a metadata watch of its own (the
    // controller's store has a single readiness waiter, the controller).
    let (objects, writer) = reflector::store::<PartialObjectMeta<WorkerBackpressure>>();
    let stream = reflector::reflector(
        writer,
        scope::watch(
            &scope,
            |ns| scope::api::<PartialObjectMeta<WorkerBackpressure>>(&client, ns),
            watcher::Config::default(),
            scope::known_in(&objects),
        )
        // Keep only the key and the namespace: with their managedFields these objects took
        // ~15 kB each in memory (150 MiB at 10,000 objects, docs/scale.md).
        .modify(|o: &mut PartialObjectMeta<WorkerBackpressure>| {
            let m = std::mem::take(&mut o.metadata);
            o.metadata = kube::api::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                ..Default::default()
            };
        }),
    );
    let driver = tokio::spawn(stream.for_each(|_| async {}));
    let _abort = AbortOnDrop(driver);
    if caches.wait_for(|ready| *ready).await.is_err() || objects.wait_until_ready().await.is_err() {
        return;
    }
    let api: Api<BackpressurePolicy> = Api::all(client);
    // What was last written per policy UID, with the resourceVersion the cache had then: the
    // cache may lag our own write by a moment, which must not cause a second write.
    let mut written: HashMap<String, (BackpressurePolicyStatus, Option<String>)> = HashMap::new();
    loop {
        let now = Timestamp::now();
        let labels = namespace_labels(&namespaces);
        let object_namespaces: Vec<String> = objects
            .state()
            .iter()
            .filter_map(|o| o.metadata.namespace.clone())
            .collect();
        let all = policies.state();
        for p in &all {
            let want = desired(
                p,
                object_namespaces.iter().map(String::as_str),
                &labels,
                now,
            );
            if p.status.as_ref() == Some(&want) {
                continue;
            }
            let uid = p.uid().unwrap_or_default();
            if written
                .get(&uid)
                .is_some_and(|(s, rv)| *s == want && *rv == p.resource_version())
            {
                continue;
            }
            let patch = serde_json::json!({
                "apiVersion": "backpressure.dev/v1alpha1",
                "kind": "BackpressurePolicy",
                "status": want,
            });
            match api
                .patch_status(
                    &p.name_any(),
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::debug!(policy = %p.name_any(), matched = ?want.matched_objects, brake = ?want.brake_active, "policy status written");
                    written.insert(uid, (want, p.resource_version()));
                }
                Err(e) => {
                    tracing::warn!(policy = %p.name_any(), error = %e, "cannot write policy status");
                }
            }
        }
        let live: std::collections::HashSet<String> = all.iter().filter_map(|p| p.uid()).collect();
        written.retain(|uid, _| live.contains(uid));
        tokio::time::sleep(interval).await;
    }
}

/// Aborts the task when dropped (the metadata watch ends with [`run`]).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use backpressure_api::v1alpha1::{BackpressurePolicySpec, Brake};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use serde_json::json;

    use super::*;
    use backpressure_core::decide::fixtures::wbp;

    fn policy(spec: serde_json::Value) -> BackpressurePolicy {
        let mut p = BackpressurePolicy::new(
            "p",
            serde_json::from_value::<BackpressurePolicySpec>(spec).unwrap(),
        );
        p.metadata.generation = Some(3);
        p
    }

    fn namespaces_of(objects: &[WorkerBackpressure]) -> Vec<&str> {
        objects
            .iter()
            .filter_map(|o| o.metadata.namespace.as_deref())
            .collect()
    }

    fn labels() -> NamespaceLabels {
        BTreeMap::from([
            (
                "a".into(),
                BTreeMap::from([("tier".into(), "batch".into())]),
            ),
            (
                "b".into(),
                BTreeMap::from([("tier".into(), "batch".into())]),
            ),
            ("c".into(), BTreeMap::new()),
        ])
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn counts_objects_in_selected_namespaces() {
        let objects = [wbp("a", "x"), wbp("a", "y"), wbp("b", "z"), wbp("c", "q")];
        let p = policy(json!({"namespaceSelector": {"matchLabels": {"tier": "batch"}}}));
        let s = desired(&p, namespaces_of(&objects), &labels(), t(0));
        assert_eq!(s.matched_objects, Some(3));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.brake_active, Some(false));
        let ready = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Applied")
        );
        assert_eq!(ready.message, "applies to 3 WorkerBackpressure objects");
        // No selector selects everything.
        let all = desired(&policy(json!({})), namespaces_of(&objects), &labels(), t(0));
        assert_eq!(all.matched_objects, Some(4));
    }

    #[test]
    fn brake_is_active_until_it_expires_and_the_transition_time_is_stable() {
        let mut p = policy(json!({}));
        p.spec.brake = Some(Brake {
            min_backoff: 0.8,
            expires_at: Some(Time(t(60))),
            reason: Some("INC-1234: halve intake".into()),
        });
        let objects = [wbp("a", "x")];
        let on = desired(&p, namespaces_of(&objects), &labels(), t(0));
        assert_eq!(on.brake_active, Some(true));
        let msg = &on.conditions.as_ref().unwrap()[0].message;
        assert!(
            msg.contains("emergency brake minBackoff 0.8 in force until"),
            "{msg}"
        );
        assert!(msg.ends_with(": INC-1234: halve intake"), "{msg}");
        p.status = Some(on.clone());
        // Same world later: identical status (nothing to write).
        assert_eq!(desired(&p, namespaces_of(&objects), &labels(), t(30)), on);
        let off = desired(&p, namespaces_of(&objects), &labels(), t(60));
        assert_eq!(off.brake_active, Some(false));
        let ready = &off.conditions.as_ref().unwrap()[0];
        assert!(ready.message.contains("expired at"), "{}", ready.message);
        assert_eq!(ready.last_transition_time, Time(t(0)), "still Ready=True");
    }

    #[test]
    fn an_invalid_selector_is_not_ready() {
        let mut p = policy(json!({}));
        p.spec.namespace_selector = Some(
            serde_json::from_value::<LabelSelector>(json!({
                "matchExpressions": [{"key": "tier", "operator": "Bogus", "values": ["x"]}]
            }))
            .unwrap(),
        );
        let s = desired(&p, ["a"], &labels(), t(0));
        let ready = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSelector")
        );
        assert_eq!(s.matched_objects, Some(0));
        // Even with no object at all.
        let s = desired(&p, std::iter::empty(), &labels(), t(0));
        assert_eq!(s.conditions.as_ref().unwrap()[0].status, "False");
    }
}
