//! The controller checks: every golden vector replayed through the worker's conformance hook.
//!
//! `POST /v1/conformance/controller` takes one case of `conformance/vectors/controller.json`
//! (its `expect` fields are ignored) and answers `{"observations": [...]}`, one object per step
//! with the fields a step's `expect` may have (`backoff`, `mode`, `limit`, `permits`,
//! `failureFloor`, `floorEstimate`), computed by a fresh controller of the worker's own
//! implementation, never the one serving messages. A worker serves it only when started for a
//! conformance run (`docs/wire-contract.md`); one that does not answers 404 and fails here.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Map, Value};

use super::checks::{Ctx, answer};
use super::{Report, SuiteError};

/// The hook's path on the admin port.
pub const HOOK_PATH: &str = "/v1/conformance/controller";

pub(crate) async fn run(ctx: &Ctx<'_>, path: &Path, report: &mut Report) -> Result<(), SuiteError> {
    let bad = |reason: String| SuiteError::Vectors {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let tolerance = doc
        .get("tolerance")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("no numeric \"tolerance\"".into()))?;
    let cases = doc
        .get("cases")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"cases\" array".into()))?;
    for case in cases {
        let name = case
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("a case without a \"name\"".into()))?;
        report.record(
            format!("controller-vector/{name}"),
            replay(ctx, case, tolerance).await,
        );
    }
    Ok(())
}

/// Replays one case and compares every step's observation with its `expect`.
async fn replay(ctx: &Ctx<'_>, case: &Value, tolerance: f64) -> Result<(), String> {
    let expects: Vec<&Map<String, Value>> = case
        .get("steps")
        .and_then(Value::as_array)
        .ok_or("the case has no steps")?
        .iter()
        .map(|s| {
            s.get("expect")
                .and_then(Value::as_object)
                .ok_or("a step has no expect")
        })
        .collect::<Result<_, _>>()?;
    let resp = ctx
        .http
        .post(ctx.target.url(HOOK_PATH))
        .json(case)
        .send()
        .await
        .map_err(|e| format!("POST {HOOK_PATH}: {e}"))?;
    let a = answer(resp).await?;
    if a.status != StatusCode::OK {
        return Err(format!(
            "POST {HOOK_PATH} answered {}: {}",
            a.status,
            a.body.chars().take(200).collect::<String>()
        ));
    }
    let got: Value =
        serde_json::from_str(&a.body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let observations = got
        .get("observations")
        .and_then(Value::as_array)
        .ok_or("the answer has no \"observations\" array")?;
    if observations.len() != expects.len() {
        return Err(format!(
            "{} observations for {} steps",
            observations.len(),
            expects.len()
        ));
    }
    for (i, (want, got)) in expects.iter().zip(observations).enumerate() {
        compare(want, got, tolerance).map_err(|why| format!("step {i}: {why}"))?;
    }
    Ok(())
}

/// Every field of `want` in `got`: numbers named `backoff`, `failureFloor` or `floorEstimate`
/// within `tolerance`, everything else equal.
pub(crate) fn compare(
    want: &Map<String, Value>,
    got: &Value,
    tolerance: f64,
) -> Result<(), String> {
    for (field, w) in want {
        let g = got
            .get(field)
            .ok_or_else(|| format!("no {field:?} in {got}"))?;
        let approximate = matches!(field.as_str(), "backoff" | "failureFloor" | "floorEstimate");
        let same = match (w.as_f64(), g.as_f64()) {
            (Some(a), Some(b)) if approximate => (a - b).abs() <= tolerance,
            _ => w == g || (w.is_number() && g.is_number() && w.as_f64() == g.as_f64()),
        };
        if !same {
            return Err(format!("{field} is {g}, expected {w}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn backoff_compares_within_the_tolerance_and_the_rest_exactly() {
        let want = json!({"backoff": 0.25, "mode": "normal", "limit": 7, "floorEstimate": null});
        let want = want.as_object().unwrap();
        compare(want, &json!({"backoff": 0.25 + 1e-12, "mode": "normal", "limit": 7, "floorEstimate": null, "extra": 1}), 1e-9).unwrap();
        compare(
            want,
            &json!({"backoff": 0.25, "mode": "normal", "limit": 7.0, "floorEstimate": null}),
            1e-9,
        )
        .unwrap();
        for (bad, field) in [
            (
                json!({"backoff": 0.2501, "mode": "normal", "limit": 7, "floorEstimate": null}),
                "backoff",
            ),
            (
                json!({"backoff": 0.25, "mode": "probing", "limit": 7, "floorEstimate": null}),
                "mode",
            ),
            (
                json!({"backoff": 0.25, "mode": "normal", "limit": 6, "floorEstimate": null}),
                "limit",
            ),
            (
                json!({"backoff": 0.25, "mode": "normal", "limit": 7, "floorEstimate": 0.1}),
                "floorEstimate",
            ),
            (
                json!({"backoff": 0.25, "mode": "normal", "limit": 7}),
                "floorEstimate",
            ),
        ] {
            let err = compare(want, &bad, 1e-9).unwrap_err();
            assert!(err.contains(field), "{err}");
        }
    }
}
