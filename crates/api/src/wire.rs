//! The wire contract between the operator and the workers, version [`WIRE_VERSION`]: the
//! [`WorkerConfig`] payload (and the producer's [`ProducerConfig`]), how it is delivered (the
//! mounted file [`CONFIG_FILE_NAME`], `PUT` [`CONFIG_PATH`] on the admin port with a bearer
//! token for [`push_audience`]), the answers ([`ConfigAck`], [`ErrorBody`]), the content hash
//! over RFC 8785 canonical JSON ([`jcs`], [`WorkerConfig::compute_hash`]) and the metric names
//! ([`metrics`]).
//!
//! The normative specification, for workers in any language, is `docs/wire-contract.md`; the
//! JSON Schemas under `docs/wire-contract/` are generated from these types (`make wire`), and
//! [`vectors`] holds the hash test vectors (`conformance/vectors/hash.json`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod jcs;
mod producer;
pub mod schema;
pub mod vectors;
pub use producer::{
    GateState, MAX_RETRY_AFTER_MS, PRODUCER_FILE_NAME, PRODUCER_PATH, PRODUCER_WIRE_VERSION,
    ProducerConfig,
};

use crate::v1alpha1::Algorithm;

/// Version of this contract, carried in every payload.
pub const WIRE_VERSION: &str = "backpressure.dev/worker-config/v1";
/// Prefix of the audience of the ServiceAccount token presented on a push: the audience is
/// [`push_audience`]`(namespace, workload)`, this prefix followed by `/<namespace>/<workload>`.
/// No worker accepts the bare prefix (one token for every worker was the weakness: any pod that
/// received a push could replay it to every other worker).
pub const TOKEN_AUDIENCE: &str = "backpressure.dev";
/// How far (in milliseconds) a pushed `generation` may be ahead of the worker's wall clock.
/// Generations are `max(previous + 1, Unix time in ms)`, so a legitimate one is never far
/// ahead; a generation of `i64::MAX` would make every later legitimate push stale (409).
/// Five minutes leave room for clock skew between the operator's node and the worker's.
pub const MAX_GENERATION_LEAD_MS: i64 = 5 * 60 * 1000;
/// HTTP path of the configuration endpoint on the admin port.
pub const CONFIG_PATH: &str = "/v1/config";
/// Name of the container port the operator pushes to.
pub const ADMIN_PORT_NAME: &str = "bp-admin";
/// Admin port used when the pod declares no port named [`ADMIN_PORT_NAME`].
pub const DEFAULT_ADMIN_PORT: u16 = 9464;
/// Pod annotation that overrides the admin port number.
pub const ADMIN_PORT_ANNOTATION: &str = "backpressure.dev/admin-port";
/// Pod annotation saying how the admin port speaks: `http` (the default) or `https`. With
/// `https` the operator verifies the worker's certificate against its push CA bundle and the
/// name [`admin_server_name`]`(namespace, workload)`, and never falls back to plain HTTP.
pub const ADMIN_SCHEME_ANNOTATION: &str = "backpressure.dev/admin-scheme";

/// The token audience of the workers of `workload` in `namespace` (see [`TOKEN_AUDIENCE`]).
/// Namespace names cannot contain `/`, so the namespace part is unambiguous whatever the
/// workload name holds.
pub fn push_audience(namespace: &str, workload: &str) -> String {
    format!("{TOKEN_AUDIENCE}/{namespace}/{workload}")
}

/// The DNS name a worker's TLS certificate must carry (as a subjectAltName) for the operator
/// to push to it over HTTPS: `<workload>.<namespace>.svc`, the name of a Service named after
/// the workload, which cert-manager can put in a Certificate. The operator connects to the pod
/// IP and verifies this name, so one certificate serves every pod of the workload.
pub fn admin_server_name(namespace: &str, workload: &str) -> String {
    format!("{workload}.{namespace}.svc")
}
/// File name of the configuration inside the operator's ConfigMap.
pub const CONFIG_FILE_NAME: &str = "worker-config.json";
/// Largest payload a worker must accept; larger bodies are refused with 413.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Largest integer a document may carry (2^53 - 1, I-JSON's bound, RFC 7493): every JSON reader
/// holds it exactly (JavaScript's numbers are doubles), and the canonical form of the hash
/// ([`jcs`]) writes every number as a double. A larger `generation`, duration or time is
/// refused (400) naming the field.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Metric names and labels every worker and queue exporter uses.
pub mod metrics {
    /// Label carrying the workload name (the WorkerBackpressure's `spec.metrics.workload`).
    pub const LABEL_WORKLOAD: &str = "workload";
    /// Label carrying the namespace; added by Prometheus service discovery or the exporter.
    pub const LABEL_NAMESPACE: &str = "namespace";
    /// Label of [`OUTCOMES_TOTAL`] naming the outcome class.
    pub const LABEL_CLASS: &str = "class";
    /// Label of [`CONFIG_INFO`] carrying the running config hash.
    pub const LABEL_HASH: &str = "hash";
    /// Label of [`CONFIG_INFO`] carrying the running algorithm.
    pub const LABEL_ALGORITHM: &str = "algorithm";

    /// Gauge: the worker's backoff factor in [0,1].
    pub const BACKOFF: &str = "backpressure_backoff_factor";
    /// Gauge: the worker's failure floor in [0,1]: the share of dependency calls it found to
    /// fail whatever its concurrency, which it does not throttle for (0 when its failures
    /// respond to load; NaN while it has not tested that yet). The operator averages it over
    /// the workers that know (`avg(backpressure_failure_floor >= 0)`) and does not count
    /// failures up to the floor as overload when it holds or defers scale-out, releases a hold
    /// or aborts a ramp.
    pub const FAILURE_FLOOR: &str = "backpressure_failure_floor";
    /// Gauge: permits (allowed concurrency) right now.
    pub const PERMITS: &str = "backpressure_permits";
    /// Gauge: messages being processed.
    pub const IN_FLIGHT: &str = "backpressure_in_flight";
    /// Counter: message outcomes by [`LABEL_CLASS`].
    pub const OUTCOMES_TOTAL: &str = "backpressure_outcomes_total";
    /// Counter: probes sent while fully backed off.
    pub const PROBES_TOTAL: &str = "backpressure_probes_total";
    /// Info gauge (value 1): the running configuration, labelled [`LABEL_HASH`] and
    /// [`LABEL_ALGORITHM`].
    pub const CONFIG_INFO: &str = "backpressure_config_info";

    /// Gauge: the queue age, the age in seconds of the oldest message not yet delivered once
    /// (waiting for its first delivery attempt; redeliveries do not count), 0 when none waits.
    /// The one definition used by the API, the operator, the simulator and the lab.
    pub const QUEUE_AGE: &str = "backpressure_queue_oldest_age_seconds";
    /// Gauge: messages waiting in the queue (not counting in flight).
    pub const QUEUE_DEPTH: &str = "backpressure_queue_depth";
    /// Counter: messages that arrived.
    pub const QUEUE_ARRIVALS_TOTAL: &str = "backpressure_queue_arrivals_total";
    /// Counter: messages acknowledged (completed).
    pub const QUEUE_COMPLETIONS_TOTAL: &str = "backpressure_queue_completions_total";
    /// Counter: messages moved to the dead-letter queue.
    pub const QUEUE_DEAD_LETTERS_TOTAL: &str = "backpressure_queue_dead_letters_total";

    /// Counter (producer pods): messages the producer gate admitted.
    pub const PRODUCER_ADMITTED_TOTAL: &str = "backpressure_producer_admitted_total";
    /// Counter (producer pods): admissions refused by the gate, by [`LABEL_STATE`] (the caller
    /// got a retry-after or waited; the gate never drops a message).
    pub const PRODUCER_REFUSED_TOTAL: &str = "backpressure_producer_refused_total";
    /// Gauge (producer pods): 1 for the gate state running, 0 for the others, by
    /// [`LABEL_STATE`].
    pub const PRODUCER_STATE: &str = "backpressure_producer_state";
    /// Gauge (producer pods): the admitted rate limit in messages per second (NaN when not
    /// throttled).
    pub const PRODUCER_RATE_LIMIT: &str = "backpressure_producer_rate_limit";
    /// Label of the producer metrics naming the gate state.
    pub const LABEL_STATE: &str = "state";

    /// Outcome class: processed successfully.
    pub const CLASS_SUCCESS: &str = "success";
    /// Outcome class: the dependency failed (drives backoff).
    pub const CLASS_DEPENDENCY_FAILURE: &str = "dependency_failure";
    /// Outcome class: the message itself is bad (never drives backoff).
    pub const CLASS_MESSAGE_FAILURE: &str = "message_failure";
    /// Outcome classes, in order.
    pub const CLASSES: [&str; 3] = [
        CLASS_SUCCESS,
        CLASS_DEPENDENCY_FAILURE,
        CLASS_MESSAGE_FAILURE,
    ];
}

/// The configuration document pushed to every worker.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "WorkerConfig")]
pub struct WorkerConfig {
    /// The contract version, always `backpressure.dev/worker-config/v1` ([`WIRE_VERSION`]).
    #[schemars(extend("const" = WIRE_VERSION))]
    pub version: String,
    /// Monotonic generation: the operator keeps it for unchanged content and otherwise sends
    /// the larger of the previous generation + 1 and the Unix time in milliseconds (so it keeps
    /// growing across a recreated object); a worker refuses a payload older than the one it
    /// runs, and one more than 5 minutes ahead of its clock. Not covered by the hash.
    #[schemars(range(min = 0, max = MAX_SAFE_INTEGER))]
    pub generation: i64,
    /// Content hash: 12 lowercase hex digits of the SHA-256 of
    /// the RFC 8785 canonical JSON of the payload with `hash` empty and `generation` 0. Empty
    /// or absent: not given (the receiver computes it).
    #[serde(default)]
    #[schemars(extend("pattern" = schema::HASH_PATTERN))]
    pub hash: String,
    /// The controller algorithm.
    pub algorithm: Algorithm,
    /// Set point: the dependency failure rate the controller treats as background noise, in
    /// (0, 1).
    #[schemars(extend("exclusiveMinimum" = 0, "exclusiveMaximum" = 1))]
    pub set_point: f64,
    /// Reaction size N (>= 1): how many outcomes the controller's step is spread over.
    #[schemars(range(min = 1, max = u32::MAX))]
    pub reaction: u32,
    /// Maximum permits (>= 1): the most messages processed at once.
    #[schemars(range(min = 1, max = u32::MAX))]
    pub max_permits: u32,
    /// First probe interval in milliseconds (>= 1).
    #[schemars(range(min = 1, max = MAX_SAFE_INTEGER))]
    pub probe_initial_ms: u64,
    /// Largest probe interval in milliseconds (>= `probeInitialMs`).
    #[schemars(range(min = 1, max = MAX_SAFE_INTEGER))]
    pub probe_max_ms: u64,
    /// Permits of a freshly started worker's controller, ramping up to `maxPermits` (0 starts
    /// at `maxPermits`). Absent (or null): the schema's `default`. Optional fields are left out when absent so that
    /// the hash of a payload without them stays what it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = u32::MAX), extend("default" = crate::defaults::INITIAL_PERMITS))]
    pub initial_permits: Option<u32>,
    /// `RatioThrottle`'s sliding window in milliseconds (>= 1). Absent (or null): the schema's
    /// `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SAFE_INTEGER), extend("default" = schema::millis(crate::defaults::RATIO_WINDOW)))]
    pub ratio_window_ms: Option<u64>,
    /// How long a full brake takes to lift, in milliseconds (0 lifts in one step). Absent (or
    /// null): the schema's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_SAFE_INTEGER), extend("default" = schema::millis(crate::defaults::BRAKE_RELEASE)))]
    pub brake_release_ms: Option<u64>,
    /// `SetPoint`'s highest learnable failure floor, in [0, 0.9] (0 turns learning off).
    /// Absent (or null): the schema's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::defaults::MAX_FLOOR_MAX), extend("default" = crate::defaults::FLOOR_MAX))]
    pub floor_max: Option<f64>,
    /// The redelivery backoff of a failed message. Absent (or null): the schema's
    /// `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = schema::default_redelivery()))]
    pub redelivery: Option<RedeliveryConfig>,
    /// Emergency brake: a minimum backoff, if set. Absent (or null): no brake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brake: Option<BrakeConfig>,
}

/// The redelivery backoff: a message whose `k`-th delivery failed is visible again
/// `baseMs · 2^(k-1)` (at most `maxMs`) later, instead of after the queue's visibility timeout.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedeliveryConfig {
    /// The delay after a failed first delivery in milliseconds; 0 turns the backoff off (the
    /// visibility timeout decides).
    #[schemars(range(max = MAX_SAFE_INTEGER))]
    pub base_ms: u64,
    /// The longest delay in milliseconds (>= `baseMs`).
    #[schemars(range(max = MAX_SAFE_INTEGER))]
    pub max_ms: u64,
}

/// The brake as the worker sees it. `minBackoff` 1 stops everything, probes included. When it
/// expires or a later payload lowers or removes it, the worker lifts it gradually (the worker
/// library's `Brake`, "Lifting gently": a per-pod random delay, then a linear fall), so a fleet
/// does not return to full permits in the same second.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrakeConfig {
    /// Minimum backoff in [0,1].
    #[schemars(range(min = 0, max = 1))]
    pub min_backoff: f64,
    /// Unix time in seconds at which the brake lifts itself, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -MAX_SAFE_INTEGER, max = MAX_SAFE_INTEGER))]
    pub expires_at_unix: Option<i64>,
}

/// The answer to a successful `PUT` and to `GET` of `/v1/config` ([`CONFIG_PATH`]) and
/// `/v1/producer` ([`PRODUCER_PATH`]): the document now running.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(title = "ConfigAck")]
pub struct ConfigAck {
    /// The hash now running: the one the document carried, or the one the receiver computed
    /// when it carried none.
    #[schemars(extend("pattern" = schema::ACK_HASH_PATTERN))]
    pub hash: String,
    /// The generation now running.
    #[schemars(range(min = 0, max = MAX_SAFE_INTEGER))]
    pub generation: i64,
}

/// The body of every refusal of the admin port (4xx and 5xx): `{"error": "<message>"}`. The
/// message is for people, except that a refusal for a hash that does not match the content
/// starts with `hash mismatch` ([`ConfigError::Hash`]).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[schemars(title = "ErrorBody")]
pub struct ErrorBody {
    /// What was wrong.
    pub error: String,
}

impl ErrorBody {
    /// Whether this is the refusal of a hash that does not match the content (what a worker
    /// that computes the hash another way answers; see [`WorkerConfig::legacy_hash`]).
    pub fn is_hash_mismatch(&self) -> bool {
        self.error.starts_with(HASH_MISMATCH)
    }
}

/// How the message of a refused hash starts ([`ConfigError::Hash`], [`ErrorBody`]).
pub const HASH_MISMATCH: &str = "hash mismatch";

/// Why a document ([`WorkerConfig`] or [`ProducerConfig`]) was refused. Each variant names
/// the offending field. The messages name no document kind: the same errors come back from
/// `PUT` [`CONFIG_PATH`] and `PUT` [`PRODUCER_PATH`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON, or not the shape of the document.
    #[error("malformed document: {0}")]
    Malformed(String),
    /// A version this receiver does not speak.
    #[error(
        "unsupported version {0:?}: expected {WIRE_VERSION:?} (worker config) or {PRODUCER_WIRE_VERSION:?} (producer state)"
    )]
    Version(String),
    /// A field out of range.
    #[error("invalid field {field}: {reason}")]
    Field {
        /// The field name as in the JSON document.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The hash does not match the content. The message starts with [`HASH_MISMATCH`].
    #[error("hash mismatch: payload says {given:?}, content hashes to {computed:?}")]
    Hash {
        /// The hash in the payload.
        given: String,
        /// The hash of the content.
        computed: String,
    },
    /// Larger than [`MAX_PAYLOAD_BYTES`].
    #[error("document of {0} bytes exceeds the limit of {MAX_PAYLOAD_BYTES} bytes")]
    TooLarge(usize),
}

impl WorkerConfig {
    /// Parses and validates a payload: JSON shape, version, ranges, and (when present) hash.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_PAYLOAD_BYTES {
            return Err(ConfigError::TooLarge(bytes.len()));
        }
        let cfg: WorkerConfig = parse_object(bytes, &["brake", "redelivery"])?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks version, ranges and the hash (an empty hash is accepted and means "not given").
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.version != WIRE_VERSION {
            return Err(ConfigError::Version(self.version.clone()));
        }
        let field = |field: &'static str, reason: String| ConfigError::Field { field, reason };
        if !(self.set_point.is_finite() && self.set_point > 0.0 && self.set_point < 1.0) {
            return Err(field(
                "setPoint",
                format!("{} is not in (0, 1)", self.set_point),
            ));
        }
        if self.reaction == 0 {
            return Err(field("reaction", "must be at least 1".into()));
        }
        if self.max_permits == 0 {
            return Err(field("maxPermits", "must be at least 1".into()));
        }
        if self.probe_initial_ms == 0 {
            return Err(field("probeInitialMs", "must be at least 1".into()));
        }
        if self.probe_max_ms < self.probe_initial_ms {
            return Err(field(
                "probeMaxMs",
                format!(
                    "{} is below probeInitialMs {}",
                    self.probe_max_ms, self.probe_initial_ms
                ),
            ));
        }
        if self.generation < 0 {
            return Err(field("generation", "must not be negative".into()));
        }
        let brake_expiry = self.brake.as_ref().and_then(|b| b.expires_at_unix);
        check_safe_integers(&[
            ("generation", Some(self.generation.unsigned_abs())),
            ("probeInitialMs", Some(self.probe_initial_ms)),
            ("probeMaxMs", Some(self.probe_max_ms)),
            ("ratioWindowMs", self.ratio_window_ms),
            ("brakeReleaseMs", self.brake_release_ms),
            ("redelivery.baseMs", self.redelivery.map(|r| r.base_ms)),
            ("redelivery.maxMs", self.redelivery.map(|r| r.max_ms)),
            ("brake.expiresAtUnix", brake_expiry.map(i64::unsigned_abs)),
        ])?;
        if self.ratio_window_ms == Some(0) {
            return Err(field("ratioWindowMs", "must be at least 1".into()));
        }
        if let Some(f) = self.floor_max
            && !(f.is_finite() && (0.0..=crate::defaults::MAX_FLOOR_MAX).contains(&f))
        {
            return Err(field(
                "floorMax",
                format!("{f} is not in [0, {}]", crate::defaults::MAX_FLOOR_MAX),
            ));
        }
        if let Some(r) = &self.redelivery
            && r.max_ms < r.base_ms
        {
            return Err(field(
                "redelivery.maxMs",
                format!("{} is below redelivery.baseMs {}", r.max_ms, r.base_ms),
            ));
        }
        if let Some(b) = &self.brake
            && !(b.min_backoff.is_finite() && (0.0..=1.0).contains(&b.min_backoff))
        {
            return Err(field(
                "brake.minBackoff",
                format!("{} is not in [0, 1]", b.min_backoff),
            ));
        }
        #[allow(deprecated)]
        check_hash(&self.hash, || self.compute_hash(), || self.legacy_hash())
    }

    /// The content hash: the first 12 lowercase hex digits of the SHA-256 of the RFC 8785
    /// canonical JSON ([`jcs`]) of the payload with `hash` empty and `generation` zero (the
    /// hash names the content; the generation only orders deliveries). Optional fields that
    /// are absent are left out.
    pub fn compute_hash(&self) -> String {
        content_hash(&self.hashed_content())
    }

    /// The canonical JSON the hash is computed over ([`WorkerConfig::compute_hash`]).
    pub fn canonical_content(&self) -> String {
        let copy = self.hashed_content();
        jcs::to_string(&copy).unwrap_or_else(|_| format!("{copy:?}"))
    }

    fn hashed_content(&self) -> Self {
        WorkerConfig {
            hash: String::new(),
            generation: 0,
            ..self.clone()
        }
    }

    /// The hash of the same content as workers and operators before the canonical form
    /// computed it: over serde_json's own output (fields in declaration order, floats as
    /// serde_json writes them, `1.0` for 1). Receivers accept a given hash that is either this
    /// one or [`WorkerConfig::compute_hash`], and the operator counts a pod that reports
    /// either as running the content, so that a fleet upgrades in any order
    /// (`docs/wire-contract.md`, "Migration from the legacy hash").
    #[deprecated(
        since = "0.2.0",
        note = "the pre-RFC 8785 hash of 0.1 workers and operators, recognised during rolling upgrades only; removed in 0.3.0"
    )]
    pub fn legacy_hash(&self) -> String {
        legacy_content_hash(&self.hashed_content())
    }

    /// Returns the payload with its hash filled in.
    pub fn with_hash(mut self) -> Self {
        self.hash = self.compute_hash();
        self
    }

    /// The effective brake at `now_unix` (None once expired).
    pub fn active_brake(&self, now_unix: i64) -> Option<f64> {
        let b = self.brake.as_ref()?;
        match b.expires_at_unix {
            Some(t) if now_unix >= t => None,
            _ => Some(b.min_backoff),
        }
    }
}

impl Default for WorkerConfig {
    /// The built-in defaults of the API, as a payload.
    fn default() -> Self {
        use crate::defaults as d;
        WorkerConfig {
            version: WIRE_VERSION.to_owned(),
            generation: 0,
            hash: String::new(),
            algorithm: Algorithm::SetPoint,
            set_point: d::SET_POINT,
            reaction: d::reaction(d::MAX_PERMITS),
            max_permits: d::MAX_PERMITS,
            probe_initial_ms: d::PROBE_INITIAL.as_millis() as u64,
            probe_max_ms: d::PROBE_MAX.as_millis() as u64,
            initial_permits: None,
            ratio_window_ms: None,
            brake_release_ms: None,
            floor_max: None,
            redelivery: None,
            brake: None,
        }
        .with_hash()
    }
}

/// Parses a document that must be a JSON object whose `nested` members are objects (or null)
/// when present. serde would also read a struct from an array (`"brake": [0.5]`), which no
/// other implementation of the contract does; the shape is checked first, then the document
/// is parsed strictly (duplicate members and unknown fields refused).
fn parse_object<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    nested: &[&str],
) -> Result<T, ConfigError> {
    let malformed = |e: serde_json::Error| ConfigError::Malformed(e.to_string());
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(malformed)?;
    let Some(members) = value.as_object() else {
        return Err(ConfigError::Malformed("expected a JSON object".into()));
    };
    for name in nested {
        if let Some(v) = members.get(*name)
            && !(v.is_object() || v.is_null())
        {
            return Err(ConfigError::Malformed(format!(
                "{name}: expected a JSON object or null"
            )));
        }
    }
    serde_json::from_slice(bytes).map_err(malformed)
}

/// Checks a document's `given` hash against its content's (an empty one means "not given"):
/// the canonical hash or, until the legacy hash is removed, the legacy one. The error names
/// the canonical hash.
fn check_hash(
    given: &str,
    computed: impl FnOnce() -> String,
    legacy: impl FnOnce() -> String,
) -> Result<(), ConfigError> {
    if given.is_empty() {
        return Ok(());
    }
    let computed = computed();
    if computed == given || legacy() == given {
        Ok(())
    } else {
        Err(ConfigError::Hash {
            given: given.to_owned(),
            computed,
        })
    }
}

/// Refuses an integer field beyond [`MAX_SAFE_INTEGER`] (magnitudes; absent fields pass).
fn check_safe_integers(fields: &[(&'static str, Option<u64>)]) -> Result<(), ConfigError> {
    for (field, value) in fields {
        if let Some(v) = *value
            && v > MAX_SAFE_INTEGER.unsigned_abs()
        {
            return Err(ConfigError::Field {
                field,
                reason: format!(
                    "{v} is beyond 2^53 - 1, the largest integer every JSON reader holds exactly"
                ),
            });
        }
    }
    Ok(())
}

/// The first 12 hex digits of the SHA-256 of a document's canonical JSON ([`jcs`]; the caller
/// clears what the hash must not cover).
fn content_hash<T: Serialize + std::fmt::Debug>(doc: &T) -> String {
    // A document with a NaN or infinite number has no canonical form (and no JSON one): it
    // fails validation before its hash matters. Fall back to Debug to stay total.
    let text = jcs::to_string(doc).unwrap_or_else(|_| format!("{doc:?}"));
    hex12(&text)
}

/// The legacy hash: as [`content_hash`] over serde_json's output instead of the canonical
/// form (what 0.1 workers and operators compute).
fn legacy_content_hash<T: Serialize + std::fmt::Debug>(doc: &T) -> String {
    let text = serde_json::to_string(doc).unwrap_or_else(|_| format!("{doc:?}"));
    hex12(&text)
}

fn hex12(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(6)
        .fold(String::with_capacity(12), |mut hex, b| {
            use std::fmt::Write as _;
            let _ = write!(hex, "{b:02x}");
            hex
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_fields_are_validated_naming_the_field_and_absent_by_default() {
        let d = WorkerConfig::default();
        let json = serde_json::to_value(&d).unwrap();
        assert!(json.get("initialPermits").is_none() && json.get("redelivery").is_none());
        let bad = |cfg: WorkerConfig| match cfg.validate() {
            Err(ConfigError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            bad(WorkerConfig {
                ratio_window_ms: Some(0),
                ..d.clone()
            }),
            "ratioWindowMs"
        );
        assert_eq!(
            bad(WorkerConfig {
                floor_max: Some(0.95),
                ..d.clone()
            }),
            "floorMax"
        );
        assert_eq!(
            bad(WorkerConfig {
                floor_max: Some(f64::NAN),
                ..d.clone()
            }),
            "floorMax"
        );
        assert_eq!(
            bad(WorkerConfig {
                redelivery: Some(RedeliveryConfig {
                    base_ms: 10,
                    max_ms: 5
                }),
                ..d.clone()
            }),
            "redelivery.maxMs"
        );
        let ok = WorkerConfig {
            initial_permits: Some(0),
            ratio_window_ms: Some(1),
            brake_release_ms: Some(0),
            floor_max: Some(0.0),
            redelivery: Some(RedeliveryConfig {
                base_ms: 0,
                max_ms: 0,
            }),
            ..d
        }
        .with_hash();
        ok.validate().unwrap();
        let bytes = serde_json::to_vec(&ok).unwrap();
        assert_eq!(WorkerConfig::parse(&bytes).unwrap(), ok);
    }

    #[test]
    fn default_round_trips_and_validates() {
        let cfg = WorkerConfig::default();
        let bytes = serde_json::to_vec(&cfg).unwrap();
        assert_eq!(WorkerConfig::parse(&bytes).unwrap(), cfg);
    }

    /// The hash is the first 12 hex digits of the SHA-256 of the canonical JSON, computed here
    /// from the canonical text independently of `compute_hash`.
    #[test]
    fn hash_is_sha256_of_the_canonical_json() {
        let cfg = WorkerConfig {
            generation: 42,
            floor_max: Some(0.0),
            brake: Some(BrakeConfig {
                min_backoff: 1.0,
                expires_at_unix: Some(1_767_229_200),
            }),
            ..WorkerConfig::default()
        }
        .with_hash();
        let text = cfg.canonical_content();
        assert_eq!(
            text,
            "{\"algorithm\":\"SetPoint\",\"brake\":{\"expiresAtUnix\":1767229200,\"minBackoff\":1},\
             \"floorMax\":0,\"generation\":0,\"hash\":\"\",\"maxPermits\":16,\"probeInitialMs\":2000,\
             \"probeMaxMs\":60000,\"reaction\":20,\"setPoint\":0.05,\
             \"version\":\"backpressure.dev/worker-config/v1\"}"
        );
        let digest = Sha256::digest(text.as_bytes());
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(cfg.hash, hex);
        // The legacy hash is over serde_json's own text (declaration order, `1.0`).
        #[allow(deprecated)]
        let legacy = cfg.legacy_hash();
        let legacy_text = serde_json::to_string(&WorkerConfig {
            hash: String::new(),
            generation: 0,
            ..cfg.clone()
        })
        .unwrap();
        assert!(legacy_text.contains("\"minBackoff\":1.0"), "{legacy_text}");
        let digest = Sha256::digest(legacy_text.as_bytes());
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(legacy, hex);
        assert_ne!(legacy, cfg.hash);
    }

    /// A payload carrying the legacy hash of its content is accepted (what a 0.1 operator
    /// sends); one carrying the legacy hash of other content is not.
    #[test]
    #[allow(deprecated)]
    fn the_legacy_hash_is_accepted_during_the_migration() {
        let cfg = WorkerConfig::default();
        let legacy = WorkerConfig {
            hash: cfg.legacy_hash(),
            ..cfg.clone()
        };
        assert_ne!(legacy.hash, cfg.hash);
        let bytes = serde_json::to_vec(&legacy).unwrap();
        assert_eq!(WorkerConfig::parse(&bytes).unwrap(), legacy);
        let other = WorkerConfig {
            max_permits: 8,
            ..legacy.clone()
        };
        match other.validate() {
            Err(e @ ConfigError::Hash { .. }) => {
                assert!(e.to_string().starts_with(HASH_MISMATCH), "{e}");
                // The error names the canonical hash of the content.
                assert!(e.to_string().contains(&other.compute_hash()), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn integers_beyond_2_pow_53_are_refused_naming_the_field() {
        let d = WorkerConfig::default();
        let over = MAX_SAFE_INTEGER as u64 + 1;
        let cases: Vec<(WorkerConfig, &str)> = vec![
            (
                WorkerConfig {
                    generation: MAX_SAFE_INTEGER + 1,
                    ..d.clone()
                },
                "generation",
            ),
            (
                WorkerConfig {
                    probe_max_ms: over,
                    ..d.clone()
                },
                "probeMaxMs",
            ),
            (
                WorkerConfig {
                    redelivery: Some(RedeliveryConfig {
                        base_ms: 0,
                        max_ms: over,
                    }),
                    ..d.clone()
                },
                "redelivery.maxMs",
            ),
            (
                WorkerConfig {
                    brake: Some(BrakeConfig {
                        min_backoff: 0.5,
                        expires_at_unix: Some(-MAX_SAFE_INTEGER - 1),
                    }),
                    ..d.clone()
                },
                "brake.expiresAtUnix",
            ),
        ];
        for (cfg, want) in cases {
            match cfg.validate() {
                Err(ConfigError::Field { field, .. }) => assert_eq!(field, want),
                other => panic!("{want}: {other:?}"),
            }
        }
        WorkerConfig {
            generation: MAX_SAFE_INTEGER,
            probe_max_ms: MAX_SAFE_INTEGER as u64,
            ..d
        }
        .with_hash()
        .validate()
        .unwrap();
    }

    #[test]
    fn hash_changes_with_content() {
        let a = WorkerConfig::default();
        let b = WorkerConfig {
            set_point: 0.1,
            ..a.clone()
        }
        .with_hash();
        assert_ne!(a.hash, b.hash);
        assert_eq!(a.hash.len(), 12);
    }

    #[test]
    fn rejects_with_field_names() {
        let base = WorkerConfig::default();
        let cases: Vec<(WorkerConfig, &str)> = vec![
            (
                WorkerConfig {
                    set_point: 1.5,
                    hash: String::new(),
                    ..base.clone()
                },
                "setPoint",
            ),
            (
                WorkerConfig {
                    set_point: f64::NAN,
                    hash: String::new(),
                    ..base.clone()
                },
                "setPoint",
            ),
            (
                WorkerConfig {
                    reaction: 0,
                    hash: String::new(),
                    ..base.clone()
                },
                "reaction",
            ),
            (
                WorkerConfig {
                    max_permits: 0,
                    hash: String::new(),
                    ..base.clone()
                },
                "maxPermits",
            ),
            (
                WorkerConfig {
                    probe_max_ms: 1,
                    hash: String::new(),
                    ..base.clone()
                },
                "probeMaxMs",
            ),
            (
                WorkerConfig {
                    brake: Some(BrakeConfig {
                        min_backoff: 2.0,
                        expires_at_unix: None,
                    }),
                    hash: String::new(),
                    ..base.clone()
                },
                "brake.minBackoff",
            ),
        ];
        for (cfg, field) in cases {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err} should name {field}");
        }
        let tampered = WorkerConfig {
            set_point: 0.2,
            ..base.clone()
        };
        assert!(matches!(tampered.validate(), Err(ConfigError::Hash { .. })));
        assert!(matches!(
            WorkerConfig::parse(b"{not json"),
            Err(ConfigError::Malformed(_))
        ));
        assert!(matches!(
            WorkerConfig::parse(&vec![b' '; MAX_PAYLOAD_BYTES + 1]),
            Err(ConfigError::TooLarge(_))
        ));
        let mut v = serde_json::to_value(&base).unwrap();
        v["surprise"] = 1.into();
        assert!(matches!(
            WorkerConfig::parse(&serde_json::to_vec(&v).unwrap()),
            Err(ConfigError::Malformed(_))
        ));
    }

    #[test]
    fn brake_expires() {
        let cfg = WorkerConfig {
            brake: Some(BrakeConfig {
                min_backoff: 0.5,
                expires_at_unix: Some(100),
            }),
            ..WorkerConfig::default()
        };
        assert_eq!(cfg.active_brake(99), Some(0.5));
        assert_eq!(cfg.active_brake(100), None);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = WorkerConfig::parse(&bytes);
        }
    }

    /// Hostile payloads (issue 8): a valid document with one field replaced by an arbitrary
    /// JSON value is either accepted as a valid config (and round-trips) or refused with an
    /// error that says what is wrong; never a panic, never an accepted out-of-range value.
    mod hostile {
        use super::*;
        use proptest::prelude::*;
        use serde_json::{Value, json};

        const FIELDS: [&str; 11] = [
            "version",
            "generation",
            "hash",
            "algorithm",
            "setPoint",
            "reaction",
            "maxPermits",
            "probeInitialMs",
            "probeMaxMs",
            "brake",
            "unexpected",
        ];

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<u64>().prop_map(|n| json!(n)),
                any::<f64>().prop_map(|f| json!(f)),
                Just(json!(1e308)),
                Just(json!(-0.0)),
                Just(json!(0.5)),
                Just(json!(u64::MAX)),
                "\\PC{0,20}".prop_map(Value::String),
                Just(json!("SetPoint")),
                Just(json!(WIRE_VERSION)),
            ];
            leaf.prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::btree_map(
                        prop_oneof![
                            Just("minBackoff".to_owned()),
                            Just("expiresAtUnix".to_owned()),
                            "[a-z]{1,8}"
                        ],
                        inner,
                        0..3
                    )
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// A valid config: every field within its documented range.
        fn valid_config() -> impl Strategy<Value = WorkerConfig> {
            (
                0i64..=MAX_SAFE_INTEGER,
                prop_oneof![
                    Just(Algorithm::SetPoint),
                    Just(Algorithm::RatioThrottle),
                    Just(Algorithm::Fixed),
                    Just(Algorithm::Off)
                ],
                1e-6f64..0.999_999,
                1u32..10_000,
                1u32..10_000,
                (1u64..1_000_000, 0u64..1_000_000),
                proptest::option::of((
                    0.0f64..=1.0,
                    proptest::option::of(-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER),
                )),
                (
                    proptest::option::of(0u32..2048),
                    proptest::option::of(1u64..10_000_000),
                    proptest::option::of(0u64..10_000_000),
                    proptest::option::of(0.0f64..=crate::defaults::MAX_FLOOR_MAX),
                    proptest::option::of((0u64..1_000_000, 0u64..1_000_000)),
                ),
            )
                .prop_map(
                    |(
                        generation,
                        algorithm,
                        set_point,
                        reaction,
                        max_permits,
                        (pi, extra),
                        brake,
                        (initial_permits, ratio_window_ms, brake_release_ms, floor_max, redelivery),
                    )| {
                        WorkerConfig {
                            version: WIRE_VERSION.to_owned(),
                            generation,
                            hash: String::new(),
                            algorithm,
                            set_point,
                            reaction,
                            max_permits,
                            probe_initial_ms: pi,
                            probe_max_ms: pi + extra,
                            initial_permits,
                            ratio_window_ms,
                            brake_release_ms,
                            floor_max,
                            redelivery: redelivery.map(|(base_ms, extra)| RedeliveryConfig {
                                base_ms,
                                max_ms: base_ms + extra,
                            }),
                            brake: brake.map(|(min_backoff, expires_at_unix)| BrakeConfig {
                                min_backoff,
                                expires_at_unix,
                            }),
                        }
                        .with_hash()
                    },
                )
        }

        proptest! {
            #[test]
            fn valid_configs_round_trip_and_tampering_is_detected(cfg in valid_config(), bump in 1u32..100) {
                let bytes = serde_json::to_vec(&cfg).unwrap();
                prop_assert!(bytes.len() <= MAX_PAYLOAD_BYTES);
                prop_assert_eq!(&WorkerConfig::parse(&bytes).unwrap(), &cfg);
                // Changing the content without the hash is refused as a hash mismatch.
                let tampered = WorkerConfig { max_permits: cfg.max_permits.saturating_add(bump), ..cfg.clone() };
                let is_hash_mismatch = matches!(tampered.validate(), Err(ConfigError::Hash { .. }));
                prop_assert!(is_hash_mismatch);
                // The generation is not part of the hash: a redelivery with a newer generation
                // keeps its hash.
                let later = WorkerConfig { generation: cfg.generation.saturating_add(1), ..cfg.clone() };
                prop_assert!(later.validate().is_ok());
            }

            #[test]
            fn one_hostile_field_is_accepted_validly_or_refused_clearly(
                field in proptest::sample::select(FIELDS.to_vec()),
                value in json_value(),
                drop_hash in any::<bool>(),
            ) {
                let mut doc = serde_json::to_value(WorkerConfig::default()).unwrap();
                if drop_hash {
                    doc["hash"] = json!("");
                }
                doc[field] = value;
                let bytes = serde_json::to_vec(&doc).unwrap();
                match WorkerConfig::parse(&bytes) {
                    Ok(cfg) => {
                        // Whatever got through is in range, and re-encodes to an equal config.
                        prop_assert!(cfg.validate().is_ok());
                        prop_assert!(cfg.set_point > 0.0 && cfg.set_point < 1.0);
                        prop_assert!(cfg.reaction >= 1 && cfg.max_permits >= 1);
                        prop_assert!(cfg.probe_initial_ms >= 1 && cfg.probe_max_ms >= cfg.probe_initial_ms);
                        prop_assert!(cfg.generation >= 0);
                        if let Some(b) = &cfg.brake {
                            prop_assert!((0.0..=1.0).contains(&b.min_backoff));
                        }
                        let again = WorkerConfig::parse(&serde_json::to_vec(&cfg).unwrap()).unwrap();
                        prop_assert_eq!(again, cfg);
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        prop_assert!(!msg.is_empty());
                        match &e {
                            ConfigError::Field { field: f, .. } => {
                                prop_assert!(f.starts_with(field) || field == "hash" || field == "generation" || *f == "probeMaxMs", "{field}: {msg}");
                            }
                            ConfigError::Malformed(_) => prop_assert!(msg.starts_with("malformed document")),
                            ConfigError::Version(_) => prop_assert_eq!(field, "version"),
                            ConfigError::Hash { .. } => prop_assert!(!drop_hash || field == "hash"),
                            ConfigError::TooLarge(_) => prop_assert!(bytes.len() > MAX_PAYLOAD_BYTES),
                        }
                    }
                }
            }

            #[test]
            fn oversized_documents_are_refused_before_parsing(pad in 0usize..4096) {
                let mut doc = serde_json::to_value(WorkerConfig::default()).unwrap();
                doc["hash"] = json!("x".repeat(MAX_PAYLOAD_BYTES + pad));
                let bytes = serde_json::to_vec(&doc).unwrap();
                prop_assert_eq!(WorkerConfig::parse(&bytes), Err(ConfigError::TooLarge(bytes.len())));
            }
        }
    }
}
