//! JSON Schemas (draft 2020-12) of the documents of the wire contract, generated from the types
//! and committed under `docs/wire-contract/` (`make wire`; a test fails when the committed
//! files are not what [`generated`] writes).
//!
//! A schema says what one document may look like on its own. The rules between fields that
//! JSON Schema cannot say (`probeMaxMs` >= `probeInitialMs`, `redelivery.maxMs` >=
//! `redelivery.baseMs`, the hash matching the content, the generation's order and lead) are in
//! `docs/wire-contract.md`, and receivers check them too.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

use super::{ConfigAck, ErrorBody, ProducerConfig, WorkerConfig};

/// A document's `hash`: empty (not given) or 12 lowercase hex digits.
pub const HASH_PATTERN: &str = "^([0-9a-f]{12})?$";
/// An acknowledgement's `hash`: 12 lowercase hex digits.
pub const ACK_HASH_PATTERN: &str = "^[0-9a-f]{12}$";

/// The directory of the committed schemas, relative to the repository root.
pub const DIR: &str = "docs/wire-contract";

fn schema_for<T: JsonSchema>(file: &str) -> Value {
    let mut schema = SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    readable_descriptions(&mut schema);
    let mut schema = sorted(schema);
    if let Value::Object(map) = &mut schema {
        // Where the committed file comes from and what specifies it.
        map.insert(
            "$comment".to_owned(),
            format!(
                "Generated from crates/api by `make wire` as {DIR}/{file}; do not edit. The specification is docs/wire-contract.md."
            )
            .into(),
        );
    }
    schema
}

/// The schema of [`WorkerConfig`].
pub fn worker_config() -> Value {
    schema_for::<WorkerConfig>("worker-config.schema.json")
}

/// The schema of [`ConfigAck`].
pub fn config_ack() -> Value {
    schema_for::<ConfigAck>("config-ack.schema.json")
}

/// The schema of [`ErrorBody`].
pub fn error_body() -> Value {
    schema_for::<ErrorBody>("error.schema.json")
}

/// The schema of [`ProducerConfig`].
pub fn producer_config() -> Value {
    schema_for::<ProducerConfig>("producer-state.schema.json")
}

/// File name and text (pretty JSON, with a final newline) of every schema, in a stable order.
pub fn generated() -> Result<Vec<(&'static str, String)>, serde_json::Error> {
    let mut out = Vec::new();
    for (name, schema) in [
        ("worker-config.schema.json", worker_config()),
        ("config-ack.schema.json", config_ack()),
        ("error.schema.json", error_body()),
        ("producer-state.schema.json", producer_config()),
    ] {
        let mut text = serde_json::to_string_pretty(&schema)?;
        text.push('\n');
        out.push((name, text));
    }
    Ok(out)
}

/// A default duration in milliseconds, as the schema's `default` of a `...Ms` field.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `default` of `redelivery`.
pub(crate) fn default_redelivery() -> super::RedeliveryConfig {
    super::RedeliveryConfig {
        base_ms: millis(crate::defaults::REDELIVERY_BASE),
        max_ms: millis(crate::defaults::REDELIVERY_MAX),
    }
}

/// The doc comments the descriptions come from, for readers of other languages: one line per
/// paragraph, and a Rust link (`` [`a::b::C`] ``) as plain code (`` `C` ``).
fn readable_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    Value::String(text) if key == "description" => {
                        *text = readable(text);
                    }
                    other => readable_descriptions(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(readable_descriptions),
        _ => {}
    }
}

fn readable(doc: &str) -> String {
    let joined = doc
        .split("\n\n")
        .map(|paragraph| paragraph.split('\n').collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut out = String::with_capacity(joined.len());
    let mut rest = joined.as_str();
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("`]") {
            Some(end) => {
                let path = &after[..end];
                let name = path.rsplit("::").next().unwrap_or(path);
                out.push('`');
                out.push_str(name);
                out.push('`');
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("[`");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `value` with every object's members in name order, whatever the map type of serde_json (so
/// the committed files do not depend on a feature some dependency turns on).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(String, Value)> = map.into_iter().collect();
            members.sort_by(|(a, _), (b, _)| a.cmp(b));
            Value::Object(members.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}
