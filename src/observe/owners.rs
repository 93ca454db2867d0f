//! Which WorkerBackpressure acts on a target that several of them name.
//!
//! Two objects scaling one Deployment would fight: each would write `/scale` from its own
//! decision. The rule is deterministic and needs no coordination: among the objects of one
//! namespace whose `targetRef` names the same target (API group, kind and name; the version
//! does not matter), the **oldest** (`metadata.creationTimestamp`, then the name) acts; the
//! others report a conflict and leave the target alone. An object being deleted does not count,
//! so the next one takes over when the owner goes away.
//!
//! [`ownership`] is pure: the caller passes the objects it knows. At fleet scale, scanning the
//! whole store on every reconcile costs O(objects²) per interval; [`OwnersIndex`] groups the
//! store by target at most once per `max_age` (one O(objects) pass shared by every reconcile)
//! and answers from the few objects that name the same target.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure_api::WorkerBackpressure;
use kube::ResourceExt as _;
use kube::runtime::reflector::Store;

/// The outcome for one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// No other object names the target.
    Sole,
    /// Others name the target too; this object is the oldest and acts.
    Owner {
        /// The names of the others, sorted.
        others: Vec<String>,
    },
    /// An older object names the same target and acts on it; this one must not.
    Conflict {
        /// The object that acts.
        owner: String,
        /// `Kind/name` of the target.
        target: String,
    },
}

impl Ownership {
    /// The condition reason for a [`Ownership::Conflict`].
    pub const CONFLICT_REASON: &'static str = "TargetConflict";

    /// Whether this object may act on its target.
    pub fn may_act(&self) -> bool {
        !matches!(self, Ownership::Conflict { .. })
    }

    /// A sentence for a condition or an event, or `None` when there is nothing to say.
    pub fn message(&self) -> Option<String> {
        match self {
            Ownership::Sole => None,
            Ownership::Owner { others } => Some(format!(
                "the target is also named by {}; this object is the oldest and the only one that acts",
                others.join(", ")
            )),
            Ownership::Conflict { owner, target } => Some(format!(
                "{target} is also the target of WorkerBackpressure {owner}, which is older and acts on it; \
                 this object makes no change until it targets something else or {owner} is deleted"
            )),
        }
    }
}

/// The API group of an `apiVersion` (`apps/v1` → `apps`, `v1` → the core group).
fn group(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

fn same_target(a: &WorkerBackpressure, b: &WorkerBackpressure) -> bool {
    let (x, y) = (&a.spec.target_ref, &b.spec.target_ref);
    x.name == y.name
        && x.kind == y.kind
        && a.metadata.namespace == b.metadata.namespace
        && group(&x.api_version) == group(&y.api_version)
}

/// The identity of a target: namespace, API group, kind, name.
type TargetKey = (Option<String>, String, String, String);

fn target_key(o: &WorkerBackpressure) -> TargetKey {
    let t = &o.spec.target_ref;
    (
        o.metadata.namespace.clone(),
        group(&t.api_version).to_owned(),
        t.kind.clone(),
        t.name.clone(),
    )
}

/// The objects of the store grouped by the target they name.
type ByTarget = HashMap<TargetKey, Vec<Arc<WorkerBackpressure>>>;

/// The store grouped by target, rebuilt at most once per `max_age`.
#[derive(Debug)]
pub struct OwnersIndex {
    max_age: Duration,
    built: Mutex<Option<(Instant, Arc<ByTarget>)>>,
}

impl OwnersIndex {
    /// An index refreshed from the store when older than `max_age` (a second is plenty: a
    /// conflict appears at most that much later than the object that causes it).
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            built: Mutex::new(None),
        }
    }

    /// The ownership of `me`'s target among the objects of `store`.
    pub fn ownership(
        &self,
        me: &WorkerBackpressure,
        store: &Store<WorkerBackpressure>,
    ) -> Ownership {
        let index = {
            let mut built = match self.built.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            match built.as_ref() {
                Some((at, index)) if at.elapsed() < self.max_age => index.clone(),
                _ => {
                    let mut index = ByTarget::new();
                    for o in store.state() {
                        index.entry(target_key(&o)).or_default().push(o);
                    }
                    let index = Arc::new(index);
                    *built = Some((Instant::now(), index.clone()));
                    index
                }
            }
        };
        match index.get(&target_key(me)) {
            Some(claims) => ownership(me, claims.iter().map(|o| &**o)),
            None => Ownership::Sole,
        }
    }
}

/// Orders claims: older first, then by name.
fn seniority(o: &WorkerBackpressure) -> (i64, i32, String) {
    let created = o
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| (t.0.as_second(), t.0.subsec_nanosecond()))
        .unwrap_or((i64::MAX, i32::MAX));
    (created.0, created.1, o.name_any())
}

/// The ownership of `me`'s target among `all` (which may include `me` itself).
pub fn ownership<'a>(
    me: &WorkerBackpressure,
    all: impl IntoIterator<Item = &'a WorkerBackpressure>,
) -> Ownership {
    let mut rivals: Vec<&WorkerBackpressure> = all
        .into_iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter(|o| o.metadata.name != me.metadata.name && same_target(me, o))
        .collect();
    if rivals.is_empty() {
        return Ownership::Sole;
    }
    rivals.sort_by_key(|o| seniority(o));
    let mine = seniority(me);
    match rivals.first() {
        Some(oldest) if seniority(oldest) < mine => Ownership::Conflict {
            owner: oldest.name_any(),
            target: format!("{}/{}", me.spec.target_ref.kind, me.spec.target_ref.name),
        },
        _ => {
            let mut others: Vec<String> = rivals.iter().map(|o| o.name_any()).collect();
            others.sort();
            Ownership::Owner { others }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn wbp(
        ns: &str,
        name: &str,
        created: i64,
        api_version: &str,
        kind: &str,
        target: &str,
    ) -> WorkerBackpressure {
        let mut o: WorkerBackpressure = serde_json::from_value(serde_json::json!({
            "apiVersion": "backpressure.dev/v1alpha1",
            "kind": "WorkerBackpressure",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"targetRef": {"apiVersion": api_version, "kind": kind, "name": target}},
        }))
        .unwrap();
        o.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        o
    }

    #[test]
    fn the_oldest_acts_and_the_others_report_a_conflict() {
        let a = wbp("n", "a", 200, "apps/v1", "Deployment", "w");
        let b = wbp("n", "b", 100, "apps/v1", "Deployment", "w");
        let c = wbp("n", "c", 300, "apps/v1beta2", "Deployment", "w");
        let all = [a.clone(), b.clone(), c.clone()];
        assert_eq!(
            ownership(&b, &all),
            Ownership::Owner {
                others: vec!["a".into(), "c".into()]
            }
        );
        let conflict = ownership(&a, &all);
        assert_eq!(
            conflict,
            Ownership::Conflict {
                owner: "b".into(),
                target: "Deployment/w".into()
            }
        );
        assert!(!conflict.may_act());
        let msg = conflict.message().unwrap();
        assert!(
            msg.contains("Deployment/w") && msg.contains("WorkerBackpressure b"),
            "{msg}"
        );
        assert_eq!(
            ownership(&c, &all),
            Ownership::Conflict {
                owner: "b".into(),
                target: "Deployment/w".into()
            },
            "the API version does not make it another target"
        );
    }

    #[test]
    fn other_targets_namespaces_and_deleted_objects_do_not_conflict() {
        let a = wbp("n", "a", 200, "apps/v1", "Deployment", "w");
        let other_name = wbp("n", "b", 100, "apps/v1", "Deployment", "x");
        let other_kind = wbp("n", "c", 100, "apps/v1", "StatefulSet", "w");
        let other_group = wbp("n", "d", 100, "example.com/v1", "Deployment", "w");
        let other_ns = wbp("m", "e", 100, "apps/v1", "Deployment", "w");
        let mut deleting = wbp("n", "f", 100, "apps/v1", "Deployment", "w");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(300).unwrap()));
        let all = [
            a.clone(),
            other_name,
            other_kind,
            other_group,
            other_ns,
            deleting,
        ];
        assert_eq!(ownership(&a, &all), Ownership::Sole);
        assert!(ownership(&a, &all).may_act());
        assert_eq!(ownership(&a, &all).message(), None);
    }

    #[test]
    fn equal_ages_are_ordered_by_name_and_agree() {
        let a = wbp("n", "a", 100, "apps/v1", "Deployment", "w");
        let b = wbp("n", "b", 100, "apps/v1", "Deployment", "w");
        let all = [a.clone(), b.clone()];
        assert!(ownership(&a, &all).may_act());
        assert!(!ownership(&b, &all).may_act());
    }

    #[test]
    fn the_index_answers_like_the_scan_and_refreshes() {
        use kube::runtime::reflector::{self, ObjectRef};
        use kube::runtime::watcher::Event;
        let (store, mut writer) = reflector::store::<WorkerBackpressure>();
        let a = wbp("n", "a", 200, "apps/v1", "Deployment", "w");
        let b = wbp("n", "b", 100, "apps/v1", "Deployment", "w");
        writer.apply_watcher_event(&Event::Apply(a.clone()));
        let index = OwnersIndex::new(Duration::from_millis(50));
        assert_eq!(index.ownership(&a, &store), Ownership::Sole);
        writer.apply_watcher_event(&Event::Apply(b.clone()));
        // Within max_age the old grouping answers; after it, the conflict shows.
        assert_eq!(index.ownership(&a, &store), Ownership::Sole);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(index.ownership(&a, &store), ownership(&a, [&a, &b]));
        assert!(!index.ownership(&a, &store).may_act());
        assert!(index.ownership(&b, &store).may_act());
        assert!(store.get(&ObjectRef::from_obj(&a)).is_some());
    }

    proptest::proptest! {
        /// Exactly one object of every group of rivals acts, whatever the ages and names.
        #[test]
        fn exactly_one_acts_per_target(
            objs in proptest::collection::vec((0u8..4, 0i64..5, 0u8..2), 1..12)
        ) {
            let all: Vec<WorkerBackpressure> = objs
                .iter()
                .enumerate()
                .map(|(i, (target, created, ns))| {
                    wbp(&format!("ns{ns}"), &format!("o{i}"), *created, "apps/v1", "Deployment", &format!("t{target}"))
                })
                .collect();
            for t in 0..4u8 {
                for ns in 0..2u8 {
                    let group: Vec<&WorkerBackpressure> = all
                        .iter()
                        .filter(|o| o.spec.target_ref.name == format!("t{t}") && o.namespace().as_deref() == Some(&format!("ns{ns}")))
                        .collect();
                    if group.is_empty() {
                        continue;
                    }
                    let acting = group.iter().filter(|o| ownership(o, &all).may_act()).count();
                    proptest::prop_assert_eq!(acting, 1);
                }
            }
        }
    }
}
