//! Publishing `events.k8s.io/v1` Events about WorkerBackpressures, with a compact cache.
//!
//! The events are those of kube's `Recorder` (same names, fields and series): the first
//! occurrence of an event (object, type, reason, action) is created; a repeat within six minutes
//! patches that event's `series` (count and last time). kube's `Recorder` keeps every published
//! event whole for those six minutes (about 3 kB each, 30 MiB after a cold start of 10,000
//! objects) and walks the whole cache on every publish; this one keeps what a repeat needs
//! (the event's name, time, note and count) and expires entries at most every
//! [`GC_EVERY`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backpressure_core::tenancy::address::redact_text;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// How long a published event is remembered: a repeat within this time extends its series.
/// kube's `Recorder` and client-go use the same.
const CACHE_TTL: SignedDuration = SignedDuration::from_mins(6);

/// How often expired entries are dropped.
const GC_EVERY: Duration = Duration::from_secs(30);

/// One event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec<'a> {
    /// Warning rather than Normal.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: &'a str,
    /// What was done.
    pub action: &'a str,
    /// The explanation.
    pub note: Option<&'a str>,
}

/// What the cache identifies an event by: the object (UID, else namespace and name), the type,
/// the reason and the action (as kube's `Recorder`: not the note).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key(Box<str>);

impl Key {
    fn new(ev: &EventSpec<'_>, regarding: &ObjectReference) -> Key {
        let object = regarding.uid.as_deref().map_or_else(
            || {
                format!(
                    "{}/{}/{}",
                    regarding.kind.as_deref().unwrap_or_default(),
                    regarding.namespace.as_deref().unwrap_or_default(),
                    regarding.name.as_deref().unwrap_or_default()
                )
            },
            str::to_owned,
        );
        let kind = if ev.warning { 'W' } else { 'N' };
        Key(format!("{object}\0{kind}\0{}\0{}", ev.reason, ev.action).into_boxed_str())
    }
}

/// What a repeat needs of a published event.
#[derive(Debug, Clone)]
struct Published {
    name: Box<str>,
    event_time: Timestamp,
    note: Option<Box<str>>,
    count: i32,
    last_observed: Timestamp,
}

#[derive(Debug)]
struct Cache {
    entries: HashMap<Key, Published>,
    last_gc: Instant,
}

/// Publishes events as one controller instance.
pub struct Recorder {
    client: kube::Client,
    controller: String,
    instance: String,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `controller` (instance `instance`).
    pub fn new(client: kube::Client, controller: String, instance: String) -> Self {
        Recorder {
            client,
            controller,
            instance,
            cache: Mutex::new(Cache {
                entries: HashMap::new(),
                last_gc: Instant::now(),
            }),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        match self.cache.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Creates the event, or extends the series of the same event published less than six
    /// minutes ago.
    pub async fn publish(
        &self,
        ev: &EventSpec<'_>,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key::new(ev, regarding);
        let previous = {
            let mut cache = self.cache();
            if cache.last_gc.elapsed() >= GC_EVERY {
                cache
                    .entries
                    .retain(|_, p| p.last_observed + CACHE_TTL > now);
                cache.entries.shrink_to_fit();
                cache.last_gc = Instant::now();
            }
            cache
                .entries
                .get(&key)
                .filter(|p| p.last_observed + CACHE_TTL > now)
                .cloned()
        };
        let published = match previous {
            Some(p) => Published {
                count: p.count.saturating_add(1),
                last_observed: now,
                ..p
            },
            None => Published {
                name: format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )
                .into_boxed_str(),
                event_time: now,
                // The last guard: no URL credentials in an Event, whatever built the note.
                note: ev.note.map(|n| redact_text(n).into()),
                count: 1,
                last_observed: now,
            },
        };
        let event = self.event(ev, regarding, &published);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        if published.count > 1 {
            api.patch(
                &published.name,
                &PatchParams::default(),
                &Patch::Merge(&event),
            )
            .await?;
        } else {
            api.create(&PostParams::default(), &event).await?;
        }
        self.cache().entries.insert(key, published);
        Ok(())
    }

    /// The Event object, as kube's `Recorder` writes it.
    fn event(&self, ev: &EventSpec<'_>, regarding: &ObjectReference, p: &Published) -> K8sEvent {
        K8sEvent {
            action: Some(ev.action.to_owned()),
            reason: Some(ev.reason.to_owned()),
            event_time: Some(MicroTime(p.event_time)),
            regarding: Some(regarding.clone()),
            note: p.note.as_deref().map(str::to_owned),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(p.name.to_string()),
                ..Default::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            series: (p.count > 1).then_some(EventSeries {
                count: p.count,
                last_observed_time: MicroTime(p.last_observed),
            }),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_owned()),
            deprecated_count: None,
            deprecated_first_timestamp: None,
            deprecated_last_timestamp: None,
            deprecated_source: None,
            related: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(uid: Option<&str>, name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("WorkerBackpressure".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: uid.map(Into::into),
            ..Default::default()
        }
    }

    fn spec<'a>(reason: &'a str, note: &'a str) -> EventSpec<'a> {
        EventSpec {
            warning: false,
            reason,
            action: "Scale",
            note: Some(note),
        }
    }

    #[test]
    fn key_is_object_type_reason_action_not_note() {
        let a = object(Some("u1"), "a");
        assert_eq!(
            Key::new(&spec("ScaledOut", "x"), &a),
            Key::new(&spec("ScaledOut", "y"), &a)
        );
        assert_ne!(
            Key::new(&spec("ScaledOut", "x"), &a),
            Key::new(&spec("ScaledIn", "x"), &a)
        );
        let warning = EventSpec {
            warning: true,
            ..spec("ScaledOut", "x")
        };
        assert_ne!(
            Key::new(&spec("ScaledOut", "x"), &a),
            Key::new(&warning, &a)
        );
        assert_ne!(
            Key::new(&spec("ScaledOut", "x"), &a),
            Key::new(&spec("ScaledOut", "x"), &object(Some("u2"), "a"))
        );
        // Without a UID the object is told apart by its name.
        assert_ne!(
            Key::new(&spec("ScaledOut", "x"), &object(None, "a")),
            Key::new(&spec("ScaledOut", "x"), &object(None, "b"))
        );
    }
}
