//! Which namespaces the operator watches (`--watch-namespaces`), and one watch stream over
//! several namespaces that behaves as a watch of their union.
//!
//! A kube reflector store is fed by one watcher: a relist (`Init`, `InitApply`…, `InitDone`)
//! replaces the whole store, so the streams of several namespaced watchers cannot simply be
//! merged into one store (each namespace's relist would drop the others'). [`watch`] merges
//! them into the events one cluster-wide watcher would give:
//!
//! * until every namespace has listed once, their objects are gathered, then emitted as one
//!   `Init`, `InitApply`…, `InitDone` (the store is ready when all namespaces are);
//! * afterwards, a namespace's relist becomes `Apply` for each object listed and, at its end,
//!   `Delete` for each object of that namespace the consumer still has and the relist did not
//!   list (found with the `known` lister, e.g. a store's objects in that namespace).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event, watcher as watch_one};
use serde::de::DeserializeOwned;

/// The namespaces the operator's namespaced watches cover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WatchScope {
    /// Every namespace (cluster-wide watches).
    #[default]
    All,
    /// Only these namespaces (sorted, without duplicates, never empty).
    Namespaces(Vec<String>),
}

/// Why `--watch-namespaces` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    /// Not a namespace name (RFC 1123 label).
    #[error("--watch-namespaces: {0:?} is not a namespace name (lowercase RFC 1123 label)")]
    Invalid(String),
}

impl WatchScope {
    /// From the flag's comma-separated list; empty means every namespace.
    pub fn parse(list: &str) -> Result<WatchScope, ScopeError> {
        let mut names: Vec<String> = Vec::new();
        for n in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !is_label(n) {
                return Err(ScopeError::Invalid(n.to_owned()));
            }
            names.push(n.to_owned());
        }
        names.sort();
        names.dedup();
        Ok(if names.is_empty() {
            WatchScope::All
        } else {
            WatchScope::Namespaces(names)
        })
    }

    /// Whether objects of `namespace` are watched.
    pub fn covers(&self, namespace: &str) -> bool {
        match self {
            WatchScope::All => true,
            WatchScope::Namespaces(ns) => {
                ns.binary_search_by(|n| n.as_str().cmp(namespace)).is_ok()
            }
        }
    }
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The API of `K` in namespace `ns`, or cluster-wide.
pub fn api<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The objects of a namespace the consumer of a [`watch`] currently has.
pub type Known<K> = Arc<dyn Fn(&str) -> Vec<K> + Send + Sync>;

/// The objects a reflector `store` holds in a namespace (for a scoped watch's relist).
pub fn known_in<K>(store: &Store<K>) -> Known<K>
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let store = store.clone();
    Arc::new(move |ns: &str| {
        store
            .state()
            .iter()
            .filter(|o| o.meta().namespace.as_deref() == Some(ns))
            .map(|o| (**o).clone())
            .collect()
    })
}

/// How long a watch error that repeats unchanged stays at debug level before it is warned again.
const REPEAT_WARNING: Duration = Duration::from_secs(600);

/// Whether a watch error is worth a warning: the first, a different one, or the same one
/// after [`REPEAT_WARNING`].
#[derive(Debug, Default)]
struct RepeatedError {
    last: Option<(String, Instant)>,
}

impl RepeatedError {
    fn warn(&mut self, message: &str, now: Instant) -> bool {
        let warn = match &self.last {
            Some((last, at)) => last != message || now.duration_since(*at) >= REPEAT_WARNING,
            None => true,
        };
        if warn {
            self.last = Some((message.to_owned(), now));
        }
        warn
    }

    fn clear(&mut self) {
        self.last = None;
    }
}

/// A watch of `K` over `scope` (`api_in(None)` is the cluster-wide API, `api_in(Some(ns))` a
/// namespace's), with the events of a single watcher ([module documentation](self)). Each
/// namespace's watcher retries on its own after an error (`default_backoff`); errors are
/// passed on.
pub fn watch<K>(
    scope: &WatchScope,
    api_in: impl Fn(Option<&str>) -> Api<K>,
    config: watcher::Config,
    known: Known<K>,
) -> futures::stream::BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    // A watch that keeps failing (forbidden: a namespace missing from the Roles; KEDA's
    // ScaledObjects where KEDA is not installed) says so, once per error and again every
    // REPEAT_WARNING while it lasts, and at debug level in between.
    let logged = |api: Api<K>| {
        let url = api.resource_url().to_owned();
        let mut repeats = RepeatedError::default();
        watch_one(api, config.clone())
            .default_backoff()
            .inspect(move |r| match r {
                Err(e) => {
                    let message = e.to_string();
                    if repeats.warn(&message, Instant::now()) {
                        tracing::warn!(watch = %url, error = %message, "watch failed; retrying");
                    } else {
                        tracing::debug!(watch = %url, error = %message, "watch failed again; retrying");
                    }
                }
                Ok(_) => repeats.clear(),
            })
    };
    match scope {
        WatchScope::All => logged(api_in(None)).boxed(),
        WatchScope::Namespaces(names) => {
            let streams = names
                .iter()
                .enumerate()
                .map(|(i, ns)| logged(api_in(Some(ns))).map(move |e| (i, e)).boxed());
            merge(names.clone(), futures::stream::select_all(streams), known).boxed()
        }
    }
}

/// The merge of [`watch`], over tagged events (namespace index, event): pure, for the tests.
fn merge<K, S>(
    names: Vec<String>,
    events: S,
    known: Known<K>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + Send + 'static,
    S: Stream<Item = (usize, Result<Event<K>, watcher::Error>)> + Send,
{
    let mut state = Merge::new(names, known);
    events
        .map(move |(i, e)| match e {
            Ok(e) => state.step(i, e).into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        })
        .flat_map(futures::stream::iter)
}

/// The objects of the first lists by (namespace index, name).
type Initial<K> = HashMap<(usize, String), K>;

struct Merge<K> {
    names: Vec<String>,
    known: Known<K>,
    /// Before every namespace listed once: the objects so far by (namespace index, name), and
    /// which namespaces finished their first list.
    initial: Option<(Initial<K>, Vec<bool>)>,
    /// Namespaces relisting after the first list: the names listed so far.
    relisting: HashMap<usize, HashSet<String>>,
}

impl<K: Resource + Clone> Merge<K> {
    fn new(names: Vec<String>, known: Known<K>) -> Self {
        let n = names.len();
        Merge {
            names,
            known,
            initial: Some((HashMap::new(), vec![false; n])),
            relisting: HashMap::new(),
        }
    }

    fn step(&mut self, i: usize, e: Event<K>) -> Vec<Event<K>> {
        if let Some((objects, done)) = self.initial.as_mut() {
            let key = |o: &K| (i, o.meta().name.clone().unwrap_or_default());
            match e {
                Event::Init => {
                    objects.retain(|(j, _), _| *j != i);
                    if let Some(d) = done.get_mut(i) {
                        *d = false;
                    }
                }
                Event::Apply(o) | Event::InitApply(o) => {
                    objects.insert(key(&o), o);
                }
                Event::Delete(o) => {
                    objects.remove(&key(&o));
                }
                Event::InitDone => {
                    if let Some(d) = done.get_mut(i) {
                        *d = true;
                    }
                }
            }
            if !done.iter().all(|d| *d) {
                return Vec::new();
            }
            let (objects, _) = self.initial.take().unwrap_or_default();
            let mut out = Vec::with_capacity(objects.len() + 2);
            out.push(Event::Init);
            out.extend(objects.into_values().map(Event::InitApply));
            out.push(Event::InitDone);
            return out;
        }
        match e {
            Event::Apply(o) => vec![Event::Apply(o)],
            Event::Delete(o) => vec![Event::Delete(o)],
            Event::Init => {
                self.relisting.insert(i, HashSet::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                if let Some(seen) = self.relisting.get_mut(&i) {
                    seen.insert(o.meta().name.clone().unwrap_or_default());
                }
                vec![Event::Apply(o)]
            }
            Event::InitDone => {
                let Some(seen) = self.relisting.remove(&i) else {
                    return Vec::new();
                };
                let Some(ns) = self.names.get(i) else {
                    return Vec::new();
                };
                (self.known)(ns)
                    .into_iter()
                    .filter(|o| !o.meta().name.as_ref().is_some_and(|n| seen.contains(n)))
                    .map(Event::Delete)
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    #[test]
    fn a_repeated_watch_error_is_warned_once_per_message_and_period() {
        let t0 = Instant::now();
        let mut r = RepeatedError::default();
        assert!(r.warn("404 page not found", t0), "the first error");
        assert!(!r.warn("404 page not found", t0 + Duration::from_secs(1)));
        assert!(!r.warn(
            "404 page not found",
            t0 + REPEAT_WARNING - Duration::from_secs(1)
        ));
        assert!(
            r.warn("403 forbidden", t0 + Duration::from_secs(2)),
            "a different error"
        );
        assert!(!r.warn("403 forbidden", t0 + Duration::from_secs(3)));
        assert!(
            r.warn(
                "403 forbidden",
                t0 + Duration::from_secs(2) + REPEAT_WARNING
            ),
            "after the period"
        );
        r.clear();
        assert!(
            r.warn(
                "403 forbidden",
                t0 + Duration::from_secs(2) + REPEAT_WARNING
            ),
            "after a success"
        );
    }

    fn cm(ns: &str, name: &str, v: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns}, "data": {"v": v}}))
        .unwrap()
    }

    #[test]
    fn the_flag_parses_to_a_sorted_list_or_every_namespace() {
        assert_eq!(WatchScope::parse("").unwrap(), WatchScope::All);
        assert_eq!(WatchScope::parse(" , ").unwrap(), WatchScope::All);
        let s = WatchScope::parse("team-b, team-a,team-b").unwrap();
        assert_eq!(
            s,
            WatchScope::Namespaces(vec!["team-a".into(), "team-b".into()])
        );
        assert!(s.covers("team-a") && !s.covers("team-c"));
        assert!(WatchScope::All.covers("anything"));
        for bad in ["Team-A", "a_b", "-a", "a-", "a/b", &"x".repeat(64)] {
            assert_eq!(
                WatchScope::parse(bad),
                Err(ScopeError::Invalid(bad.to_owned())),
                "{bad}"
            );
        }
    }

    /// Feeds tagged events through the merge into a real kube store and returns its contents
    /// as (namespace, name, value), sorted.
    fn run(events: Vec<(usize, Event<ConfigMap>)>) -> (bool, Vec<(String, String, String)>) {
        let (reader, mut writer) = reflector::store::<ConfigMap>();
        let known = known_in(&reader);
        let mut state = Merge::new(vec!["a".into(), "b".into()], known);
        for (i, e) in events {
            for out in state.step(i, e) {
                writer.apply_watcher_event(&out);
            }
        }
        let ready = reader.wait_until_ready().now_or_never().is_some();
        let mut out: Vec<_> = reader
            .state()
            .iter()
            .map(|o| {
                (
                    o.metadata.namespace.clone().unwrap(),
                    o.metadata.name.clone().unwrap(),
                    o.data.as_ref().unwrap()["v"].clone(),
                )
            })
            .collect();
        out.sort();
        (ready, out)
    }

    use futures::FutureExt as _;

    fn t(ns: &str, name: &str, v: &str) -> (String, String, String) {
        (ns.into(), name.into(), v.into())
    }

    #[test]
    fn the_store_is_ready_when_every_namespace_has_listed() {
        let first_a = vec![
            (0, Event::Init),
            (0, Event::InitApply(cm("a", "x", "1"))),
            (0, Event::InitDone),
            (0, Event::Apply(cm("a", "y", "1"))),
        ];
        let (ready, objects) = run(first_a.clone());
        assert!(!ready, "b has not listed yet");
        assert!(objects.is_empty());

        let mut all = first_a;
        all.extend([
            (1, Event::Init),
            (1, Event::InitApply(cm("b", "x", "1"))),
            (1, Event::InitDone),
        ]);
        let (ready, objects) = run(all);
        assert!(ready);
        assert_eq!(
            objects,
            [t("a", "x", "1"), t("a", "y", "1"), t("b", "x", "1")]
        );
    }

    #[test]
    fn a_relist_of_one_namespace_keeps_the_others_and_drops_what_it_lost() {
        let mut events = vec![
            (0, Event::Init),
            (1, Event::Init),
            (0, Event::InitApply(cm("a", "x", "1"))),
            (1, Event::InitApply(cm("b", "x", "1"))),
            (0, Event::InitApply(cm("a", "gone", "1"))),
            (0, Event::InitDone),
            (1, Event::InitDone),
            (1, Event::Apply(cm("b", "y", "1"))),
        ];
        // a's watch restarts: x changed, "gone" was deleted while the watch was down.
        events.extend([
            (0, Event::Init),
            (0, Event::InitApply(cm("a", "x", "2"))),
            (0, Event::InitDone),
        ]);
        let (ready, objects) = run(events.clone());
        assert!(ready);
        assert_eq!(
            objects,
            [t("a", "x", "2"), t("b", "x", "1"), t("b", "y", "1")]
        );
        // Deletes and applies after the relist pass through.
        events.extend([
            (1, Event::Delete(cm("b", "x", "1"))),
            (0, Event::Apply(cm("a", "z", "1"))),
        ]);
        let (_, objects) = run(events);
        assert_eq!(
            objects,
            [t("a", "x", "2"), t("a", "z", "1"), t("b", "y", "1")]
        );
    }

    #[test]
    fn a_namespace_restarting_before_the_first_list_ends_starts_over() {
        let (ready, objects) = run(vec![
            (0, Event::Init),
            (0, Event::InitApply(cm("a", "old", "1"))),
            (0, Event::Init),
            (0, Event::InitApply(cm("a", "new", "1"))),
            (0, Event::InitDone),
            (1, Event::Init),
            (1, Event::InitDone),
        ]);
        assert!(ready);
        assert_eq!(objects, [t("a", "new", "1")]);
    }
}
