//! The committed `conformance/vectors/controller.json` is what the generator writes, and
//! replaying it from the file alone (as an SDK does) reproduces every reading.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_conformance::vectors::{self, ReplayError};
use serde_json::Value;

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../conformance/vectors/controller.json"
);

fn committed() -> String {
    std::fs::read_to_string(PATH).unwrap_or_default()
}

#[test]
fn committed_controller_vectors_are_up_to_date() {
    let generated = vectors::render(&vectors::generate()).unwrap();
    assert!(
        committed() == generated,
        "{PATH} differs from the generator: run `cargo run -p backpressure-conformance -- vectors` and commit it"
    );
}

#[test]
fn the_committed_vectors_replay_from_the_file_alone() {
    let r = vectors::replay(&committed()).unwrap();
    let v = vectors::generate();
    assert_eq!(r.cases, v.cases.len());
    assert_eq!(
        r.steps,
        v.cases.iter().map(|c| c.steps.len()).sum::<usize>()
    );
}

/// The committed file with one value changed by `edit` (case `case`, step `step`).
fn edited(case: &str, step: usize, edit: impl FnOnce(&mut Value)) -> String {
    let mut doc: Value = serde_json::from_str(&committed()).unwrap();
    let cases = doc["cases"].as_array_mut().unwrap();
    let c = cases.iter_mut().find(|c| c["name"] == case).unwrap();
    edit(&mut c["steps"][step]);
    serde_json::to_string(&doc).unwrap()
}

fn mismatch(text: &str) -> (String, usize, &'static str) {
    match vectors::replay(text) {
        Err(ReplayError::Mismatch(m)) => (m.case, m.step, m.field),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn a_replay_fails_on_any_wrong_reading() {
    let case = "set-point-overload-burst";
    let text = edited(case, 30, |s| {
        let b = s["expect"]["backoff"].as_f64().unwrap();
        s["expect"]["backoff"] = (b + 1e-6).into();
    });
    assert_eq!(mismatch(&text), (case.into(), 30, "backoff"));
    let text = edited(case, 56, |s| s["expect"]["mode"] = "normal".into());
    assert_eq!(mismatch(&text), (case.into(), 56, "mode"));
    let text = edited(case, 0, |s| s["expect"]["permits"] = 15.into());
    assert_eq!(mismatch(&text), (case.into(), 0, "permits"));
    let text = edited(case, 2, |s| s["expect"]["limit"] = 15.into());
    assert_eq!(mismatch(&text), (case.into(), 2, "limit"));
    let case = "set-point-failure-floor-learned";
    let text = edited(case, 0, |s| s["expect"]["floorEstimate"] = 0.into());
    assert_eq!(mismatch(&text), (case.into(), 0, "floorEstimate"));
    // An outcome changed: the readings that follow no longer match.
    let case = "set-point-message-failures";
    let text = edited(case, 1, |s| s["outcome"] = "dependency_failure".into());
    assert_eq!(mismatch(&text).0, case);
    // A brake offset that is not the generator's changes the lift.
    let mut doc: Value = serde_json::from_str(&committed()).unwrap();
    let c = doc["cases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "brake-expiry-gentle-lift")
        .unwrap();
    c["brakeOffsetNs"] = 11_000_000_000u64.into();
    let (case, _, field) = mismatch(&serde_json::to_string(&doc).unwrap());
    assert_eq!(
        (case.as_str(), field),
        ("brake-expiry-gentle-lift", "backoff")
    );
}
