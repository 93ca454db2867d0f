//! Replays a `controller.json` against the Rust controllers, reading only the file (what an
//! SDK's test runner does, here with the Rust implementation under test): the check that the
//! file and `conformance/README.md` say enough to reproduce every step.

use backpressure_api::wire::WorkerConfig;
use backpressure_worker::controller::{self, Brake, Controller, Nanos, Outcome, Settings};
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

fn config_of(v: &Value, at: &str) -> Result<WorkerConfig, ReplayError> {
    let cfg = v
        .get("config")
        .ok_or_else(|| format_err(at, "config missing"))?;
    let bytes = serde_json::to_vec(cfg)?;
    WorkerConfig::parse(&bytes).map_err(|e| format_err(at, format!("config: {e}")))
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
    let seed = u64_of(case, "seed", &name)?;
    let offset = Nanos(u64_of(case, "brakeOffsetNs", &name)?);
    let config = config_of(case, &name)?;
    let mut c: Box<dyn Controller> = controller::from_config(&config, seed);
    let mut brake: Option<Brake> = None;
    let steps = case
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| format_err(&name, "steps: not an array"))?;
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{name} step {i}");
        let t = u64_of(step, "t", &at)?;
        let now = Nanos(t);
        let op = str_of(step, "op", &at)?;
        let mut permits = None;
        match op {
            "record" => {
                let outcome = match str_of(step, "outcome", &at)? {
                    "success" => Outcome::Success,
                    "dependency_failure" => Outcome::DependencyFailure,
                    "message_failure" => Outcome::MessageFailure,
                    other => return Err(format_err(at, format!("outcome {other:?}"))),
                };
                c.record(now, outcome);
            }
            "permits" => {
                let in_flight = u32::try_from(u64_of(step, "inFlight", &at)?)
                    .map_err(|e| format_err(&at, e.to_string()))?;
                permits = Some(c.permits(now, in_flight));
            }
            "releaseUnused" => {
                let unused = u32::try_from(u64_of(step, "unused", &at)?)
                    .map_err(|e| format_err(&at, e.to_string()))?;
                c.release_unused(now, unused);
            }
            "configure" => {
                let cfg = config_of(step, &at)?;
                let unix_s = step
                    .get("unixS")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| format_err(&at, "unixS: not an integer"))?;
                let settings = Settings::from_config(&cfg);
                let new = cfg.brake.as_ref().map(|b| Brake::from_wire(b, now, unix_s));
                brake = Brake::succeed(brake.as_ref(), new, now, settings.brake_release, offset);
                controller::apply_settings(&mut c, now, settings, seed, brake);
            }
            other => return Err(format_err(at, format!("op {other:?}"))),
        }
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
        if let Some(got) = permits {
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
        let got = c.backoff(now);
        if !close(want, got) {
            return Err(mismatch("backoff", want.to_string(), got.to_string()));
        }
        let want = str_of(expect, "mode", &at)?;
        let got = c.mode().as_str();
        if want != got {
            return Err(mismatch("mode", want.to_owned(), got.to_owned()));
        }
        let want = u64_of(expect, "limit", &at)?;
        let got = c.limit(now);
        if want != u64::from(got) {
            return Err(mismatch("limit", want.to_string(), got.to_string()));
        }
        let want = f64_of(expect, "failureFloor", &at)?;
        let got = c.failure_floor();
        if !close(want, got) {
            return Err(mismatch("failureFloor", want.to_string(), got.to_string()));
        }
        let want = expect
            .get("floorEstimate")
            .ok_or_else(|| format_err(&at, "floorEstimate missing"))?
            .as_f64();
        let got = c.floor_estimate();
        let same = match (want, got) {
            (None, None) => true,
            (Some(a), Some(b)) => close(a, b),
            _ => false,
        };
        if !same {
            return Err(mismatch(
                "floorEstimate",
                format!("{want:?}"),
                format!("{got:?}"),
            ));
        }
    }
    Ok(steps.len())
}
