//! Replays a `controller.json` against the Rust controllers, reading only the file (what an
//! SDK's test runner does, here with the Rust implementation under test): the check that the
//! file and `conformance/README.md` say enough to reproduce every step.

use backpressure_worker::conformance;
use serde_json::Value;

use super::{FORMAT, TOLERANCE};

/// What a replay checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// Cases replayed.
    pub cases: usize,
    /// Steps replayed.
    pub steps: usize,
}

/// A reading that differs from the file's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{case} step {step} ({op} at t={t}): {field} expected {expected}, got {got}")]
pub struct Mismatch {
    /// The case name.
    pub case: String,
    /// The step index.
    pub step: usize,
    /// The step's op.
    pub op: String,
    /// The step's time.
    pub t: u64,
    /// The reading.
    pub field: &'static str,
    /// The file's value.
    pub expected: String,
    /// The controller's value.
    pub got: String,
}

/// Why a replay failed: the file is not in the format, or a reading differs.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Not JSON.
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A field is missing or of the wrong type.
    #[error("{at}: {what}")]
    Format {
        /// Where (case name and step index).
        at: String,
        /// What is wrong.
        what: String,
    },
    /// The controller's reading differs from the expected one.
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
}

fn format_err(at: impl Into<String>, what: impl Into<String>) -> ReplayError {
    ReplayError::Format {
        at: at.into(),
        what: what.into(),
    }
}

fn u64_of(v: &Value, key: &str, at: &str) -> Result<u64, ReplayError> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format_err(at, format!("{key}: not an unsigned integer")))
}

fn f64_of(v: &Value, key: &str, at: &str) -> Result<f64, ReplayError> {
    v.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format_err(at, format!("{key}: not a number")))
}

fn str_of<'v>(v: &'v Value, key: &str, at: &str) -> Result<&'v str, ReplayError> {
    v.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format_err(at, format!("{key}: not a string")))
}

/// Replays every case of `text` (a `controller.json`).
pub fn replay(text: &str) -> Result<Replayed, ReplayError> {
    let doc: Value = serde_json::from_str(text)?;
    if doc.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(format_err("format", format!("not {FORMAT}")));
    }
    let tolerance = f64_of(&doc, "tolerance", "tolerance")?;
    if tolerance > TOLERANCE {
        return Err(format_err(
            "tolerance",
            format!("{tolerance} is looser than {TOLERANCE}"),
        ));
    }
    let cases = doc
        .get("cases")
        .and_then(Value::as_array)
        .ok_or_else(|| format_err("cases", "not an array"))?;
    let mut steps = 0;
    for case in cases {
        steps += replay_case(case, tolerance)?;
    }
    Ok(Replayed {
        cases: cases.len(),
        steps,
    })
}

fn replay_case(case: &Value, tolerance: f64) -> Result<usize, ReplayError> {
    let name = str_of(case, "name", "case")?.to_owned();
    // The run is the worker library's conformance executor, the one its hook serves.
    let parsed: conformance::Case =
        serde_json::from_value(case.clone()).map_err(|e| format_err(&name, e.to_string()))?;
    let observed = conformance::execute(&parsed)
        .map_err(|e| format_err(&name, e.to_string()))?
        .observations;
    let steps = case
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| format_err(&name, "steps: not an array"))?;
    for (i, (step, got)) in steps.iter().zip(&observed).enumerate() {
        let at = format!("{name} step {i}");
        let t = u64_of(step, "t", &at)?;
        let op = str_of(step, "op", &at)?;
        let expect = step
            .get("expect")
            .ok_or_else(|| format_err(&at, "expect missing"))?;
        let mismatch = |field: &'static str, expected: String, got: String| {
            ReplayError::Mismatch(Box::new(Mismatch {
                case: name.clone(),
                step: i,
                op: op.to_owned(),
                t,
                field,
                expected,
                got,
            }))
        };
        let close = |a: f64, b: f64| (a - b).abs() <= tolerance;
        if let Some(got) = got.permits {
            let want = u64_of(expect, "permits", &at)?;
            if want != u64::from(got) {
                return Err(mismatch("permits", want.to_string(), got.to_string()));
            }
        } else if expect.get("permits").is_some() {
            return Err(format_err(
                at,
                "permits expected on a step that is not permits",
            ));
        }
        let want = f64_of(expect, "backoff", &at)?;
        if !close(want, got.backoff) {
            return Err(mismatch(
                "backoff",
                want.to_string(),
                got.backoff.to_string(),
            ));
        }
        let want = str_of(expect, "mode", &at)?;
        if want != got.mode {
            return Err(mismatch("mode", want.to_owned(), got.mode.to_owned()));
        }
        let want = u64_of(expect, "limit", &at)?;
        if want != u64::from(got.limit) {
            return Err(mismatch("limit", want.to_string(), got.limit.to_string()));
        }
        let want = f64_of(expect, "failureFloor", &at)?;
        if !close(want, got.failure_floor) {
            return Err(mismatch(
                "failureFloor",
                want.to_string(),
                got.failure_floor.to_string(),
            ));
        }
        let want = expect
            .get("floorEstimate")
            .ok_or_else(|| format_err(&at, "floorEstimate missing"))?
            .as_f64();
        let same = match (want, got.floor_estimate) {
            (None, None) => true,
            (Some(a), Some(b)) => close(a, b),
            _ => false,
        };
        if !same {
            return Err(mismatch(
                "floorEstimate",
                format!("{want:?}"),
                format!("{:?}", got.floor_estimate),
            ));
        }
    }
    Ok(steps.len())
}
