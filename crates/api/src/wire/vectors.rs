//! Hash test vectors: documents of the wire contract with their canonical JSON and content
//! hash, for every implementation to check its hash against (`conformance/vectors/hash.json`,
//! written by `make wire`; a test fails when the committed file is not what
//! [`hash_vectors_json`] writes).
//!
//! The cases cover the default payload, every optional field, the numbers whose JSON spelling
//! differs between serializers (`1.0`, `0.0`, `1e-7`, `0.1`), the largest integers, a brake with
//! an expiry, and the producer document. `payload` is the document as a worker receives it,
//! its `hash` filled in (and for some a non-zero `generation`, which the hash leaves out);
//! `jcs` is the canonical JSON the hash is computed over; `hash` the content hash.

use std::path::Path;

use serde::Serialize;

use super::{
    BrakeConfig, GateState, MAX_SAFE_INTEGER, ProducerConfig, RedeliveryConfig, WorkerConfig,
};
use crate::v1alpha1::Algorithm;

/// The `format` of the hash vector file.
pub const HASH_VECTORS_FORMAT: &str = "backpressure.dev/hash-vectors/v1";
/// Where the hash vectors are committed, relative to the repository root.
pub const HASH_VECTORS_FILE: &str = "conformance/vectors/hash.json";

/// A document of the contract, serialized as the operator sends it (fields in declaration
/// order, whole floats as `1.0`): a receiver must not depend on the spelling.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Payload {
    /// A worker config (`version` [`super::WIRE_VERSION`]).
    Worker(WorkerConfig),
    /// A producer state (`version` [`super::PRODUCER_WIRE_VERSION`]).
    Producer(ProducerConfig),
}

/// One document and the hash every implementation must compute for it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct HashCase {
    /// What the case exercises, unique in the file.
    pub name: String,
    /// The document as received, with its `hash` set.
    pub payload: Payload,
    /// The RFC 8785 canonical JSON of the payload with `hash` empty and `generation` zero.
    pub jcs: String,
    /// The content hash: the first 12 hex digits of the SHA-256 of `jcs`.
    pub hash: String,
}

fn worker_case(name: &str, cfg: WorkerConfig) -> HashCase {
    let cfg = cfg.with_hash();
    HashCase {
        name: name.to_owned(),
        jcs: cfg.canonical_content(),
        hash: cfg.hash.clone(),
        payload: Payload::Worker(cfg),
    }
}

fn producer_case(name: &str, doc: ProducerConfig) -> HashCase {
    let doc = doc.with_hash();
    HashCase {
        name: name.to_owned(),
        jcs: doc.canonical_content(),
        hash: doc.hash.clone(),
        payload: Payload::Producer(doc),
    }
}

/// The hash cases, in a stable order. Every payload is valid.
pub fn hash_cases() -> Vec<HashCase> {
    let d = WorkerConfig::default();
    let every_optional = WorkerConfig {
        generation: 1_767_225_600_000,
        initial_permits: Some(4),
        ratio_window_ms: Some(30_000),
        brake_release_ms: Some(60_000),
        floor_max: Some(0.25),
        redelivery: Some(RedeliveryConfig {
            base_ms: 60_000,
            max_ms: 480_000,
        }),
        brake: Some(BrakeConfig {
            min_backoff: 0.5,
            expires_at_unix: Some(1_767_229_200),
        }),
        ..d.clone()
    };
    vec![
        worker_case("worker-default", d.clone()),
        worker_case(
            "worker-generation-is-not-hashed",
            WorkerConfig {
                generation: 1_767_225_600_000,
                ..d.clone()
            },
        ),
        worker_case("worker-every-optional-field", every_optional),
        worker_case(
            "worker-whole-floats-are-integers",
            // serde_json writes 1.0 and 0.0; the canonical form writes 1 and 0.
            WorkerConfig {
                floor_max: Some(0.0),
                brake: Some(BrakeConfig {
                    min_backoff: 1.0,
                    expires_at_unix: None,
                }),
                ..d.clone()
            },
        ),
        worker_case(
            "worker-small-set-point-exponent",
            WorkerConfig {
                set_point: 1e-7,
                ..d.clone()
            },
        ),
        worker_case(
            "worker-decimal-fractions",
            WorkerConfig {
                algorithm: Algorithm::RatioThrottle,
                set_point: 0.1,
                floor_max: Some(0.9),
                brake: Some(BrakeConfig {
                    min_backoff: 0.3,
                    expires_at_unix: None,
                }),
                ..d.clone()
            },
        ),
        worker_case(
            "worker-set-point-many-digits",
            WorkerConfig {
                set_point: 0.123_456_789_012_345_68,
                ..d.clone()
            },
        ),
        worker_case(
            "worker-brake-with-expiry",
            WorkerConfig {
                brake: Some(BrakeConfig {
                    min_backoff: 0.75,
                    expires_at_unix: Some(1_767_229_200),
                }),
                ..d.clone()
            },
        ),
        worker_case(
            "worker-fixed-largest-integers",
            WorkerConfig {
                algorithm: Algorithm::Fixed,
                reaction: u32::MAX,
                max_permits: u32::MAX,
                probe_initial_ms: 1,
                probe_max_ms: MAX_SAFE_INTEGER.unsigned_abs(),
                initial_permits: Some(0),
                redelivery: Some(RedeliveryConfig {
                    base_ms: 0,
                    max_ms: MAX_SAFE_INTEGER.unsigned_abs(),
                }),
                brake: Some(BrakeConfig {
                    min_backoff: 0.0,
                    expires_at_unix: Some(-MAX_SAFE_INTEGER),
                }),
                ..d.clone()
            },
        ),
        worker_case(
            "worker-off",
            WorkerConfig {
                algorithm: Algorithm::Off,
                max_permits: 64,
                reaction: 64,
                ..d
            },
        ),
        producer_case("producer-default", ProducerConfig::default()),
        producer_case(
            "producer-throttled-with-lease",
            ProducerConfig {
                generation: 1_767_225_600_000,
                state: GateState::Throttled,
                rate_per_second: Some(2.5),
                retry_after_ms: 1000,
                expires_at_unix: Some(1_767_225_660),
                ..ProducerConfig::default()
            },
        ),
        producer_case(
            "producer-paused-whole-rate",
            ProducerConfig {
                state: GateState::Paused,
                rate_per_second: Some(0.0),
                retry_after_ms: 3_600_000,
                expires_at_unix: Some(1_767_225_660),
                ..ProducerConfig::default()
            },
        ),
    ]
}

/// The hash vector file: `{"format": ..., "cases": [...]}` as pretty JSON with a final
/// newline.
pub fn hash_vectors_json() -> Result<String, serde_json::Error> {
    #[derive(Serialize)]
    struct File {
        format: &'static str,
        cases: Vec<HashCase>,
    }
    let mut text = serde_json::to_string_pretty(&File {
        format: HASH_VECTORS_FORMAT,
        cases: hash_cases(),
    })?;
    text.push('\n');
    Ok(text)
}

/// Writes [`hash_vectors_json`] to `path`, creating its directory.
pub fn write_hash_vectors(path: &Path) -> std::io::Result<()> {
    let text = hash_vectors_json().map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}
