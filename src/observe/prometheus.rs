//! Batched Prometheus reads shared by every reconcile.
//!
//! [`MetricsHub::get`] returns the result of one query on one Prometheus, fetching it at most
//! once per `max_age` however many objects ask: the first reconcile of an interval runs the
//! query, the others wait for it and reuse the result. So the number of queries per interval
//! is the number of distinct (Prometheus, query) pairs — the six metric kinds when every object
//! uses the defaults — independent of the number of objects.
//!
//! A cached answer may be up to an interval old, and an object waits up to an interval for its
//! next reconcile: together almost two. So each fresh answer is compared with the one it
//! replaces, and the workloads whose value changed are announced ([`MetricsHub::subscribe`]);
//! the controller reconciles their objects at once. A change then reaches the decision within
//! one scrape plus one interval, while the queries stay at one per metric kind per interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use backpressure_core::tenancy::address::{redact, redact_text};

use crate::observe::promql::{BatchResult, MetricKind, fold_series};

/// `(namespace, workload)` pairs whose value changed in a fresh answer.
pub type Changed = Arc<Vec<(String, String)>>;

/// Announcements kept for a slow subscriber; one that falls further behind misses some, and
/// its objects are reconciled at their regular requeue instead.
const CHANGES_BUFFER: usize = 256;

/// Where the hub records each query it runs: its kind, how long it took and whether it
/// succeeded. The operator's metrics registry implements it; observe does not depend on the
/// registry (which sits above it and names the metric kinds).
pub trait QueryRecorder: Send + Sync + std::fmt::Debug {
    /// Records one batched query.
    fn record_query(&self, kind: MetricKind, took: Duration, ok: bool);
}

/// Credentials for a Prometheus, read from the object's `secretRef`.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub enum PromAuth {
    /// No credentials.
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// HTTP basic authentication.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
}

impl std::fmt::Debug for PromAuth {
    // Never print secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromAuth::None => f.write_str("None"),
            PromAuth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            PromAuth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
        }
    }
}

/// Why a batched query failed (a NaN or empty result is not a failure: it is "unknown").
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueryError {
    /// The address is not a URL.
    #[error("invalid Prometheus address {address:?}: {reason}")]
    Address {
        /// The address.
        address: String,
        /// Why.
        reason: String,
    },
    /// Connection, timeout, HTTP or PromQL error.
    #[error("query {kind} on {address} failed: {reason}")]
    Query {
        /// The metric kind.
        kind: &'static str,
        /// The Prometheus.
        address: String,
        /// Why.
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    address: String,
    auth: PromAuth,
    query: String,
}

#[derive(Debug, Default)]
struct Slot {
    fetched: Option<(Instant, Result<Arc<BatchResult>, QueryError>)>,
}

/// The shared query cache.
#[derive(Debug)]
pub struct MetricsHub {
    http: reqwest::Client,
    slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Slot>>>>,
    recorder: Arc<dyn QueryRecorder>,
    changes: broadcast::Sender<Changed>,
}

impl MetricsHub {
    /// A hub whose HTTP client has `connect_timeout`; every query it runs is recorded in
    /// `recorder`.
    pub fn new(recorder: Arc<dyn QueryRecorder>) -> Result<Self, reqwest::Error> {
        // No redirects: an allowed address must not hand the query (and its credentials) on
        // to one that is not; Prometheus does not redirect its query API.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(3))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?;
        Ok(Self {
            http,
            slots: Mutex::new(HashMap::new()),
            recorder,
            changes: broadcast::channel(CHANGES_BUFFER).0,
        })
    }

    /// The workloads whose value changed, one announcement per fresh answer that differs from
    /// the one before it (the first answer of a query is not announced: every object is being
    /// reconciled then anyway).
    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changes.subscribe()
    }

    /// The result of `query` on `address`, at most `max_age` old. `timeout` bounds the query.
    pub async fn get(
        &self,
        kind: MetricKind,
        address: &str,
        auth: &PromAuth,
        query: &str,
        timeout: Duration,
        max_age: Duration,
    ) -> Result<Arc<BatchResult>, QueryError> {
        let key = Key {
            address: address.to_owned(),
            auth: auth.clone(),
            query: query.to_owned(),
        };
        let slot = {
            let mut slots = match self.slots.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            slots.entry(key).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some((at, result)) = &slot.fetched
            && at.elapsed() < max_age
        {
            return result.clone();
        }
        let started = Instant::now();
        let result = self
            .fetch(kind, address, auth, query, timeout)
            .await
            .map(Arc::new);
        self.recorder
            .record_query(kind, started.elapsed(), result.is_ok());
        if let Some((_, previous)) = &slot.fetched {
            let changed = changed_workloads(previous, &result);
            if !changed.is_empty() {
                // No subscriber (tests, the benchmark's tools) is not an error.
                let _ = self.changes.send(Arc::new(changed));
            }
        }
        slot.fetched = Some((Instant::now(), result.clone()));
        result
    }

    async fn fetch(
        &self,
        kind: MetricKind,
        address: &str,
        auth: &PromAuth,
        query: &str,
        timeout: Duration,
    ) -> Result<BatchResult, QueryError> {
        // HTTP client errors quote the URL: credentials are taken out of every message.
        let err = |reason: String| QueryError::Query {
            kind: kind.as_str(),
            address: redact(address),
            reason: redact_text(&reason),
        };
        let client =
            prometheus_http_query::Client::from(self.http.clone(), address).map_err(|e| {
                QueryError::Address {
                    address: redact(address),
                    reason: redact_text(&e.to_string()),
                }
            })?;
        let mut req = client.query(query).timeout(timeout.as_millis() as i64);
        match auth {
            PromAuth::None => {}
            PromAuth::Bearer(token) => {
                let v = http::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| err("the bearer token is not a valid header value".into()))?;
                req = req.header(http::header::AUTHORIZATION, v);
            }
            PromAuth::Basic { username, password } => {
                use base64::Engine as _;
                let enc = base64::engine::general_purpose::STANDARD
                    .encode(format!("{username}:{password}"));
                let v = http::HeaderValue::from_str(&format!("Basic {enc}")).map_err(|_| {
                    err("the basic credentials are not a valid header value".into())
                })?;
                req = req.header(http::header::AUTHORIZATION, v);
            }
        }
        let response = tokio::time::timeout(timeout, req.get())
            .await
            .map_err(|_| err(format!("timed out after {timeout:?}")))?
            .map_err(|e| err(e.to_string()))?;
        match response.data() {
            prometheus_http_query::response::Data::Vector(v) => Ok(fold_series(
                v.iter().map(|s| (s.metric(), s.sample().value())),
            )),
            prometheus_http_query::response::Data::Scalar(_)
            | prometheus_http_query::response::Data::Matrix(_) => Err(err(
                "the query must return an instant vector grouped by namespace and workload".into(),
            )),
        }
    }
}

/// The workloads whose answer differs between `previous` and `next`: a value that changed,
/// appeared or went away (NaN equals NaN; the sample timestamps, which move with every scrape,
/// do not count). A query that starts or stops failing changes every workload it answered for.
pub fn changed_workloads(
    previous: &Result<Arc<BatchResult>, QueryError>,
    next: &Result<Arc<BatchResult>, QueryError>,
) -> Vec<(String, String)> {
    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
    let mut out: Vec<(String, String)> = match (previous, next) {
        (Err(_), Err(_)) => Vec::new(),
        (Ok(old), Err(_)) => old.keys().cloned().collect(),
        (Err(_), Ok(new)) => new.keys().cloned().collect(),
        (Ok(old), Ok(new)) => new
            .iter()
            .filter(|(k, n)| old.get(*k).is_none_or(|o| !same(o.value, n.value)))
            .map(|(k, _)| k.clone())
            .chain(old.keys().filter(|k| !new.contains_key(*k)).cloned())
            .collect(),
    };
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::promql::Sample;

    fn batch(entries: &[(&str, f64, f64)]) -> Result<Arc<BatchResult>, QueryError> {
        Ok(Arc::new(
            entries
                .iter()
                .map(|(wl, value, at)| {
                    (
                        ("ns".to_owned(), (*wl).to_owned()),
                        Sample {
                            value: *value,
                            sampled_at: Some(*at),
                        },
                    )
                })
                .collect(),
        ))
    }

    fn failed() -> Result<Arc<BatchResult>, QueryError> {
        Err(QueryError::Query {
            kind: "backoff",
            address: "http://p".into(),
            reason: "timed out".into(),
        })
    }

    fn names(v: Vec<(String, String)>) -> Vec<String> {
        v.into_iter().map(|(_, w)| w).collect()
    }

    #[test]
    fn only_values_that_moved_appeared_or_vanished_are_changes() {
        let old = batch(&[
            ("a", 0.0, 1.0),
            ("b", 0.5, 1.0),
            ("c", f64::NAN, 1.0),
            ("d", 1.0, 1.0),
        ]);
        // a: same value, newer sample; b: moved; c: still NaN; d: gone; e: new.
        let new = batch(&[
            ("a", 0.0, 6.0),
            ("b", 0.6, 6.0),
            ("c", f64::NAN, 6.0),
            ("e", 2.0, 6.0),
        ]);
        assert_eq!(names(changed_workloads(&old, &new)), ["b", "d", "e"]);
        assert!(changed_workloads(&new, &new).is_empty());
    }

    #[test]
    fn a_query_that_starts_or_stops_failing_changes_all_it_answered() {
        let ok = batch(&[("a", 0.0, 1.0), ("b", 0.5, 1.0)]);
        assert_eq!(names(changed_workloads(&ok, &failed())), ["a", "b"]);
        assert_eq!(names(changed_workloads(&failed(), &ok)), ["a", "b"]);
        assert!(changed_workloads(&failed(), &failed()).is_empty());
    }
}
