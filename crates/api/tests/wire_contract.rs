//! The generated files of the wire contract against the types: the committed JSON Schemas
//! (`docs/wire-contract/`) and hash vectors (`conformance/vectors/hash.json`) must be what
//! `make wire` writes now, and the schemas must agree with the Rust receiver on what is a
//! valid document.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use backpressure_api::wire::{
    self, ConfigAck, ConfigError, ErrorBody, ProducerConfig, WorkerConfig, schema, vectors,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make wire`", path.display()))
}

#[test]
fn committed_schemas_match_the_types() {
    for (name, text) in schema::generated().expect("render the schemas") {
        let path = root().join(schema::DIR).join(name);
        assert!(
            read(&path) == text,
            "{} differs from the schema generated from crates/api; run `make wire` and commit",
            path.display()
        );
    }
}

#[test]
fn committed_hash_vectors_match_the_implementation() {
    let path = root().join(vectors::HASH_VECTORS_FILE);
    let text = vectors::hash_vectors_json().expect("render the vectors");
    assert!(
        read(&path) == text,
        "{} differs from what crates/api computes; run `make wire` and commit",
        path.display()
    );
}

/// Every case read back from the committed file as a receiver reads it: the payload parses
/// and validates, its hash is the case's, and the case's canonical text hashes to it.
#[test]
fn hash_vectors_read_back() {
    let file: Value = serde_json::from_str(&read(&root().join(vectors::HASH_VECTORS_FILE)))
        .expect("the vectors are JSON");
    assert_eq!(file["format"], vectors::HASH_VECTORS_FORMAT);
    let cases = file["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    let mut names = std::collections::BTreeSet::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        assert!(names.insert(name.to_owned()), "duplicate case {name}");
        let payload = serde_json::to_vec(&case["payload"]).expect("payload");
        let (hash, canonical) = if case["payload"]["version"] == wire::WIRE_VERSION {
            let cfg = WorkerConfig::parse(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
            (cfg.compute_hash(), cfg.canonical_content())
        } else {
            let doc = ProducerConfig::parse(&payload).unwrap_or_else(|e| panic!("{name}: {e}"));
            (doc.compute_hash(), doc.canonical_content())
        };
        assert_eq!(case["hash"], hash, "{name}");
        assert_eq!(case["payload"]["hash"], hash, "{name}");
        assert_eq!(case["jcs"], canonical, "{name}");
        // The canonical text is itself the payload with `hash` empty and `generation` 0.
        let mut expected: Value = case["payload"].clone();
        expected["hash"] = json!("");
        expected["generation"] = json!(0);
        assert_eq!(
            wire::jcs::canonicalize(&expected).expect("canonical form"),
            canonical,
            "{name}"
        );
    }
}

/// The code block after `<!-- hash-example:NAME -->` in docs/wire-contract.md.
fn example_block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- hash-example:{name} -->");
    let after = &doc[doc.find(&marker).unwrap_or_else(|| panic!("no {marker}")) + marker.len()..];
    let open = after.find("```").expect("a code block after the marker");
    let body = &after[open..];
    let start = body.find('\n').expect("a fence line") + 1;
    let end = body[start..].find("```").expect("a closing fence") + start;
    body[start..end].trim_end().to_owned()
}

/// The worked example of the spec, recomputed: the payload's canonical text and hash are the
/// ones the document shows, and the payload carries that hash.
#[test]
fn the_worked_example_of_the_spec_is_right() {
    let doc = read(&root().join("docs/wire-contract.md"));
    let payload = example_block(&doc, "payload");
    let cfg = WorkerConfig::parse(payload.as_bytes()).expect("the example payload is valid");
    assert!(
        cfg.generation > 0 && payload.contains("1.0"),
        "the example shows what it should"
    );
    assert_eq!(cfg.canonical_content(), example_block(&doc, "jcs"));
    assert_eq!(cfg.compute_hash(), example_block(&doc, "hash"));
    assert_eq!(cfg.hash, cfg.compute_hash());
    let full = format!("{:x}", sha2_digest(&cfg.canonical_content()));
    assert!(
        doc.contains(&full),
        "the full SHA-256 {full} is in the spec"
    );
}

fn sha2_digest(text: &str) -> impl std::fmt::LowerHex {
    struct Hex(Vec<u8>);
    impl std::fmt::LowerHex for Hex {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
        }
    }
    use sha2::Digest as _;
    Hex(sha2::Sha256::digest(text.as_bytes()).to_vec())
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::draft202012::new(schema).expect("a valid draft 2020-12 schema")
}

fn full_payload() -> WorkerConfig {
    WorkerConfig {
        generation: 1_767_225_600_000,
        initial_permits: Some(4),
        ratio_window_ms: Some(30_000),
        brake_release_ms: Some(0),
        floor_max: Some(0.9),
        redelivery: Some(wire::RedeliveryConfig {
            base_ms: 1,
            max_ms: 2,
        }),
        brake: Some(wire::BrakeConfig {
            min_backoff: 1.0,
            expires_at_unix: Some(1_767_229_200),
        }),
        ..WorkerConfig::default()
    }
    .with_hash()
}

#[test]
fn documents_the_receiver_accepts_are_valid_by_the_schemas() {
    let worker = validator(&schema::worker_config());
    for cfg in [WorkerConfig::default(), full_payload()] {
        let doc = serde_json::to_value(&cfg).unwrap();
        assert!(worker.is_valid(&doc), "{doc}");
        // Optional fields set to null are absent to the receiver, and to the schema.
        let mut nulls = doc.clone();
        nulls["hash"] = json!("");
        for f in [
            "initialPermits",
            "ratioWindowMs",
            "brakeReleaseMs",
            "floorMax",
            "redelivery",
            "brake",
        ] {
            nulls[f] = Value::Null;
        }
        let read = WorkerConfig::parse(&serde_json::to_vec(&nulls).unwrap()).unwrap();
        assert_eq!(read.brake, None);
        assert_eq!(read.compute_hash(), WorkerConfig::default().compute_hash());
        assert!(worker.is_valid(&nulls));
    }
    for case in vectors::hash_cases() {
        let doc = serde_json::to_value(&case.payload).unwrap();
        let schema = match case.payload {
            vectors::Payload::Worker(_) => schema::worker_config(),
            vectors::Payload::Producer(_) => schema::producer_config(),
        };
        assert!(validator(&schema).is_valid(&doc), "{}: {doc}", case.name);
    }
    let producer = validator(&schema::producer_config());
    assert!(producer.is_valid(&serde_json::to_value(ProducerConfig::default()).unwrap()));
    let ack = validator(&schema::config_ack());
    let running = ConfigAck {
        hash: WorkerConfig::default().hash,
        generation: 7,
    };
    assert!(ack.is_valid(&serde_json::to_value(&running).unwrap()));
    assert!(!ack.is_valid(&json!({"hash": "", "generation": 7})));
    let error = validator(&schema::error_body());
    let body = ErrorBody {
        error: ConfigError::TooLarge(70_000).to_string(),
    };
    assert!(error.is_valid(&serde_json::to_value(&body).unwrap()));
    assert!(!error.is_valid(&json!({"message": "x"})));
}

#[test]
fn unknown_fields_are_refused_by_both() {
    let worker = validator(&schema::worker_config());
    let mut doc = serde_json::to_value(full_payload()).unwrap();
    doc["surprise"] = json!(1);
    assert!(!worker.is_valid(&doc));
    assert!(matches!(
        WorkerConfig::parse(&serde_json::to_vec(&doc).unwrap()),
        Err(ConfigError::Malformed(_))
    ));
    let mut nested = serde_json::to_value(full_payload()).unwrap();
    nested["brake"]["surprise"] = json!(true);
    assert!(!worker.is_valid(&nested));
    assert!(WorkerConfig::parse(&serde_json::to_vec(&nested).unwrap()).is_err());
    let producer = validator(&schema::producer_config());
    let mut p = serde_json::to_value(ProducerConfig::default()).unwrap();
    p["surprise"] = json!("x");
    assert!(!producer.is_valid(&p));
    assert!(ProducerConfig::parse(&serde_json::to_vec(&p).unwrap()).is_err());
    // A Throttled document without its rate: refused by both.
    let mut throttled = serde_json::to_value(ProducerConfig::default()).unwrap();
    throttled["state"] = json!("Throttled");
    throttled["hash"] = json!("");
    assert!(!producer.is_valid(&throttled));
    assert!(ProducerConfig::parse(&serde_json::to_vec(&throttled).unwrap()).is_err());
}

/// Whether the receiver's refusal is one JSON Schema cannot express: a rule between fields,
/// a hash that does not match the content, or a whole number written as a float (`1.0` for an
/// integer field: JSON Schema sees the value, the receiver the spelling).
fn beyond_the_schema(err: &ConfigError, value: &Value) -> bool {
    match err {
        ConfigError::Hash { .. } => true,
        ConfigError::Field { field, .. } => {
            matches!(*field, "probeMaxMs" | "redelivery.maxMs")
        }
        ConfigError::Malformed(_) => has_whole_float(value),
        _ => false,
    }
}

fn has_whole_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64() && n.as_f64().is_some_and(|f| f.fract() == 0.0),
        Value::Array(items) => items.iter().any(has_whole_float),
        Value::Object(map) => map.values().any(has_whole_float),
        _ => false,
    }
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (0i64..100_000).prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        (-1.0f64..2.0).prop_map(|f| json!(f)),
        Just(json!(wire::MAX_SAFE_INTEGER)),
        Just(json!(wire::MAX_SAFE_INTEGER + 1)),
        Just(json!(u32::MAX)),
        Just(json!(u64::from(u32::MAX) + 1)),
        Just(json!(0.9)),
        Just(json!(1.0)),
        Just(json!(0)),
        "\\PC{0,14}".prop_map(Value::String),
        "[0-9a-f]{12}".prop_map(Value::String),
        prop_oneof![
            Just("SetPoint"),
            Just("RatioThrottle"),
            Just("Fixed"),
            Just("Off"),
            Just("Open"),
            Just("Throttled"),
            Just("Paused"),
            Just(wire::WIRE_VERSION),
            Just(wire::PRODUCER_WIRE_VERSION),
        ]
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("minBackoff".to_owned()),
                    Just("expiresAtUnix".to_owned()),
                    Just("baseMs".to_owned()),
                    Just("maxMs".to_owned()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const WORKER_FIELDS: [&str; 16] = [
    "version",
    "generation",
    "hash",
    "algorithm",
    "setPoint",
    "reaction",
    "maxPermits",
    "probeInitialMs",
    "probeMaxMs",
    "initialPermits",
    "ratioWindowMs",
    "brakeReleaseMs",
    "floorMax",
    "redelivery",
    "brake",
    "unexpected",
];

const PRODUCER_FIELDS: [&str; 8] = [
    "version",
    "generation",
    "hash",
    "state",
    "ratePerSecond",
    "retryAfterMs",
    "expiresAtUnix",
    "unexpected",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// One field of a valid document (hash not given) replaced by an arbitrary JSON value, or
    /// removed: the schema and the receiver agree, except for what the schema cannot say.
    #[test]
    fn schema_and_receiver_agree_on_worker_configs(
        field in proptest::sample::select(WORKER_FIELDS.to_vec()),
        value in proptest::option::of(json_value()),
    ) {
        let mut doc = serde_json::to_value(full_payload()).unwrap();
        doc["hash"] = json!("");
        match value {
            Some(v) => doc[field] = v,
            None => { doc.as_object_mut().unwrap().remove(field); }
        }
        let by_schema = validator(&schema::worker_config()).is_valid(&doc);
        let by_receiver = WorkerConfig::parse(&serde_json::to_vec(&doc).unwrap());
        match &by_receiver {
            Ok(_) => prop_assert!(by_schema, "the receiver accepts what the schema refuses: {doc}"),
            Err(e) if by_schema => prop_assert!(
                beyond_the_schema(e, &doc),
                "the schema accepts what the receiver refuses ({e}): {doc}"
            ),
            Err(_) => {}
        }
    }

    #[test]
    fn schema_and_receiver_agree_on_producer_states(
        field in proptest::sample::select(PRODUCER_FIELDS.to_vec()),
        value in proptest::option::of(json_value()),
        throttled in any::<bool>(),
    ) {
        let base = ProducerConfig {
            state: if throttled { wire::GateState::Throttled } else { wire::GateState::Paused },
            rate_per_second: Some(2.5),
            expires_at_unix: Some(1_767_225_660),
            ..ProducerConfig::default()
        };
        let mut doc = serde_json::to_value(base).unwrap();
        doc["hash"] = json!("");
        match value {
            Some(v) => doc[field] = v,
            None => { doc.as_object_mut().unwrap().remove(field); }
        }
        let by_schema = validator(&schema::producer_config()).is_valid(&doc);
        let by_receiver = ProducerConfig::parse(&serde_json::to_vec(&doc).unwrap());
        match &by_receiver {
            Ok(_) => prop_assert!(by_schema, "the receiver accepts what the schema refuses: {doc}"),
            Err(e) if by_schema => prop_assert!(
                beyond_the_schema(e, &doc),
                "the schema accepts what the receiver refuses ({e}): {doc}"
            ),
            Err(_) => {}
        }
    }
}
