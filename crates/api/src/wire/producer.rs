//! The producer side of the wire contract, version [`PRODUCER_WIRE_VERSION`].
//!
//! A producer pod (one of the pods of a WorkerBackpressure's `spec.producers.targetRef`)
//! receives a [`ProducerConfig`] exactly as a worker receives its config: `PUT`
//! [`PRODUCER_PATH`] on its admin port with `Authorization: Bearer <token>`, the token's
//! audience [`super::push_audience`]`(namespace, producerWorkload)` (the producer workload's own
//! audience, so a token presented to a worker is worthless at a producer and the other way
//! round), or the file [`PRODUCER_FILE_NAME`] in the operator's ConfigMap. The answers are the
//! worker config's: 200 with a [`super::ConfigAck`], 400 invalid (naming the field, including
//! a `generation` more than [`super::MAX_GENERATION_LEAD_MS`] ahead of the producer's clock),
//! 401, 403, 409 older generation, 413 too large, 429 too many failed authentications. `GET`
//! [`PRODUCER_PATH`] returns the running ack. A pod that is not a producer answers 404 on
//! [`PRODUCER_PATH`] (and a producer that is not a worker 404 on [`super::CONFIG_PATH`]).
//!
//! A `Paused` or `Throttled` document carries a lease (`expiresAtUnix`): once it has passed
//! without a newer document, the producer runs `Open`, so a producer is never left restricted by
//! an operator that is gone.
//!
//! The producer honours the document with a gate in front of every send (the worker library's
//! `ProducerGate`): `Open` admits everything, `Throttled` admits at most `ratePerSecond` per
//! second (a token bucket holding at most one second of tokens, and at least one token, so
//! that a rate below one per second still admits one message every `1 / ratePerSecond`
//! seconds; `ratePerSecond` 0 admits nothing, like `Paused`), `Paused` admits nothing. A
//! message not admitted is never dropped by the gate: the caller waits, or gets a retry-after
//! (`retryAfterMs` while paused or throttled to 0, the time until the next token while
//! throttled) to hand back to its own client. Before its first document a producer runs
//! [`ProducerConfig::default`]: `Open`.
//!
//! The normative specification is `docs/wire-contract.md` ("The producer document").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, MAX_SAFE_INTEGER, schema};

/// Version of the producer document.
pub const PRODUCER_WIRE_VERSION: &str = "backpressure.dev/producer-state/v1";
/// HTTP path of the producer state endpoint on the admin port.
pub const PRODUCER_PATH: &str = "/v1/producer";
/// File name of the producer state inside the operator's ConfigMap.
pub const PRODUCER_FILE_NAME: &str = "producer-state.json";
/// Largest `retryAfterMs` a producer accepts (one hour).
pub const MAX_RETRY_AFTER_MS: u64 = 3_600_000;

/// What the gate does, as pushed to producer pods.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GateState {
    /// Admit everything.
    #[default]
    Open,
    /// Admit at most `ratePerSecond`.
    Throttled,
    /// Admit nothing.
    Paused,
}

impl GateState {
    /// All states, in declaration order (metrics export every label value).
    pub const ALL: [GateState; 3] = [GateState::Open, GateState::Throttled, GateState::Paused];

    /// The name as written on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            GateState::Open => "Open",
            GateState::Throttled => "Throttled",
            GateState::Paused => "Paused",
        }
    }
}

/// The producer state document.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "ProducerConfig")]
// A `Throttled` document needs `ratePerSecond` (the one rule between fields JSON Schema says).
#[schemars(extend(
    "if" = {"properties": {"state": {"const": "Throttled"}}, "required": ["state"]},
    "then" = {"required": ["ratePerSecond"], "properties": {"ratePerSecond": {"type": "number"}}}
))]
pub struct ProducerConfig {
    /// The document version, always `backpressure.dev/producer-state/v1`.
    #[schemars(extend("const" = PRODUCER_WIRE_VERSION))]
    pub version: String,
    /// Monotonic generation, as for the worker config.
    #[schemars(range(min = 0, max = MAX_SAFE_INTEGER))]
    pub generation: i64,
    /// Content hash (the worker config's scheme: `generation` zero and `hash` empty). Empty or
    /// absent: not given.
    #[serde(default)]
    #[schemars(extend("pattern" = schema::HASH_PATTERN))]
    pub hash: String,
    /// The gate state.
    pub state: GateState,
    /// `Throttled` only: messages per second this pod may send (the producer workload's rate
    /// shared among its ready pods), finite and ≥ 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rate_per_second: Option<f64>,
    /// How long a caller refused while `Paused` should wait before trying again, in
    /// milliseconds, at least 1 and at most 3600000 (one hour, [`MAX_RETRY_AFTER_MS`]).
    #[schemars(range(min = 1, max = MAX_RETRY_AFTER_MS))]
    pub retry_after_ms: u64,
    /// The lease of a restriction: Unix time in seconds after which the producer runs `Open`
    /// unless a newer document arrives first. The operator sends one with every `Paused` or
    /// `Throttled` document and renews it while the restriction holds, so producers are never
    /// left paused by an operator that is gone. Absent: no end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_SAFE_INTEGER))]
    pub expires_at_unix: Option<i64>,
}

impl Default for ProducerConfig {
    /// Open, which is also what a producer runs before any document arrives.
    fn default() -> Self {
        ProducerConfig {
            version: PRODUCER_WIRE_VERSION.to_owned(),
            generation: 0,
            hash: String::new(),
            state: GateState::Open,
            rate_per_second: None,
            retry_after_ms: 1000,
            expires_at_unix: None,
        }
        .with_hash()
    }
}

impl ProducerConfig {
    /// Parses and validates a document: JSON shape, version, ranges, and (when present) hash.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > super::MAX_PAYLOAD_BYTES {
            return Err(ConfigError::TooLarge(bytes.len()));
        }
        let cfg: ProducerConfig = super::parse_object(bytes, &[])?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks version, ranges and the hash (an empty hash means "not given").
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.version != PRODUCER_WIRE_VERSION {
            return Err(ConfigError::Version(self.version.clone()));
        }
        let field = |field: &'static str, reason: String| ConfigError::Field { field, reason };
        if self.generation < 0 {
            return Err(field("generation", "must not be negative".into()));
        }
        super::check_safe_integers(&[
            ("generation", Some(self.generation.unsigned_abs())),
            ("expiresAtUnix", self.expires_at_unix.map(i64::unsigned_abs)),
        ])?;
        match (self.state, self.rate_per_second) {
            (GateState::Throttled, None) => {
                return Err(field(
                    "ratePerSecond",
                    "is required when state is Throttled".into(),
                ));
            }
            (_, Some(r)) if !(r.is_finite() && r >= 0.0) => {
                return Err(field("ratePerSecond", format!("{r} is not finite and ≥ 0")));
            }
            _ => {}
        }
        if self.expires_at_unix.is_some_and(|t| t < 0) {
            return Err(field("expiresAtUnix", "must not be negative".into()));
        }
        if !(1..=MAX_RETRY_AFTER_MS).contains(&self.retry_after_ms) {
            return Err(field(
                "retryAfterMs",
                format!(
                    "{} is not in [1, {MAX_RETRY_AFTER_MS}]",
                    self.retry_after_ms
                ),
            ));
        }
        #[allow(deprecated)]
        super::check_hash(&self.hash, || self.compute_hash(), || self.legacy_hash())
    }

    /// The content hash: as [`super::WorkerConfig::compute_hash`] (RFC 8785 canonical JSON
    /// with `hash` empty and `generation` zero).
    pub fn compute_hash(&self) -> String {
        super::content_hash(&self.hashed_content())
    }

    /// The canonical JSON the hash is computed over.
    pub fn canonical_content(&self) -> String {
        let copy = self.hashed_content();
        super::jcs::to_string(&copy).unwrap_or_else(|_| format!("{copy:?}"))
    }

    fn hashed_content(&self) -> Self {
        ProducerConfig {
            hash: String::new(),
            generation: 0,
            ..self.clone()
        }
    }

    /// The hash 0.1 producers and operators computed: as
    /// [`super::WorkerConfig::legacy_hash`].
    #[deprecated(
        since = "0.2.0",
        note = "the pre-RFC 8785 hash of 0.1 producers and operators, recognised during rolling upgrades only; removed in 0.3.0"
    )]
    pub fn legacy_hash(&self) -> String {
        super::legacy_content_hash(&self.hashed_content())
    }

    /// Returns the document with its hash filled in.
    pub fn with_hash(mut self) -> Self {
        self.hash = self.compute_hash();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(cfg: &ProducerConfig) -> &'static str {
        match cfg.validate() {
            Err(ConfigError::Field { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_throttle_needs_a_finite_rate_and_every_refusal_names_its_field() {
        let d = ProducerConfig::default();
        assert_eq!(d.validate(), Ok(()));
        let throttled = ProducerConfig {
            state: GateState::Throttled,
            hash: String::new(),
            ..d.clone()
        };
        assert_eq!(field(&throttled), "ratePerSecond");
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            let c = ProducerConfig {
                rate_per_second: Some(bad),
                ..throttled.clone()
            };
            assert_eq!(field(&c), "ratePerSecond");
        }
        let negative = ProducerConfig {
            expires_at_unix: Some(-1),
            hash: String::new(),
            ..d.clone()
        };
        assert_eq!(field(&negative), "expiresAtUnix");
        for retry_after_ms in [0, MAX_RETRY_AFTER_MS + 1] {
            let c = ProducerConfig {
                retry_after_ms,
                hash: String::new(),
                ..d.clone()
            };
            assert_eq!(field(&c), "retryAfterMs");
        }
        let ok = ProducerConfig {
            rate_per_second: Some(2.5),
            ..throttled
        }
        .with_hash();
        assert_eq!(
            ProducerConfig::parse(&serde_json::to_vec(&ok).unwrap()),
            Ok(ok)
        );
    }

    #[test]
    fn the_hash_names_the_content_not_the_generation() {
        let a = ProducerConfig {
            generation: 5,
            ..ProducerConfig::default()
        }
        .with_hash();
        assert_eq!(a.hash, ProducerConfig::default().hash);
        let paused = ProducerConfig {
            state: GateState::Paused,
            ..ProducerConfig::default()
        }
        .with_hash();
        assert_ne!(paused.hash, a.hash);
        let tampered = ProducerConfig {
            state: GateState::Open,
            ..paused
        };
        assert!(matches!(tampered.validate(), Err(ConfigError::Hash { .. })));
    }

    #[test]
    fn unknown_fields_and_other_versions_are_refused() {
        let mut v = serde_json::to_value(ProducerConfig::default()).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(matches!(
            ProducerConfig::parse(&serde_json::to_vec(&v).unwrap()),
            Err(ConfigError::Malformed(_))
        ));
        let other = ProducerConfig {
            version: "backpressure.dev/producer-state/v2".into(),
            ..ProducerConfig::default()
        };
        assert!(matches!(other.validate(), Err(ConfigError::Version(_))));
    }
}
