//! Every trace in `crates/sim/traces/` replays against the HPA port without a mismatch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use backpressure_sim::autoscaler::hpa::trace::{self, ReplayError};

const TRACES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");

#[test]
fn every_committed_trace_replays() {
    let files = trace::files(Path::new(TRACES)).unwrap();
    assert!(files.len() >= 3, "traces: {files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let t = trace::load(path).unwrap();
        assert!(!t.steps.is_empty(), "{}: no steps", path.display());
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with("upstream-testcase-") {
            assert!(
                t.source.starts_with("hand-written from "),
                "{name}: a hand-written trace must say so in its source"
            );
        }
        if let Err(e) = trace::replay(&t) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_wrong_expectation_is_reported_at_its_step() {
    for path in trace::files(Path::new(TRACES)).unwrap() {
        let good = trace::load(&path).unwrap();
        for k in 0..good.steps.len() {
            let mut bad = good.clone();
            bad.steps[k].desired += 1;
            match trace::replay(&bad) {
                Err(ReplayError::Mismatch(m)) => {
                    assert_eq!(m.step, k, "{}", path.display());
                    assert_eq!(m.expected, good.steps[k].desired + 1);
                    assert_eq!(m.got.desired, good.steps[k].desired);
                    assert!(m.to_string().starts_with(&format!("step {k} ")));
                }
                other => panic!("{} step {k}: {other:?}", path.display()),
            }
        }
    }
}

#[test]
fn an_invalid_configuration_is_an_error_not_a_mismatch() {
    let path = trace::files(Path::new(TRACES)).unwrap().remove(0);
    let mut t = trace::load(&path).unwrap();
    t.hpa.max_replicas = 0;
    assert!(matches!(trace::replay(&t), Err(ReplayError::Spec(_))));
}

#[test]
fn a_recorded_trace_of_the_real_hpa_is_committed_and_checks_its_proposals() {
    let recorded: Vec<_> = trace::files(Path::new(TRACES))
        .unwrap()
        .into_iter()
        .map(|p| trace::load(&p).unwrap())
        .filter(|t| t.source.starts_with("recorded by backpressure-lab"))
        .collect();
    assert!(
        !recorded.is_empty(),
        "no trace recorded from the real HPA controller"
    );
    for good in recorded {
        let k = good
            .steps
            .iter()
            .position(|s| s.proposed.is_some_and(|p| p > 2))
            .expect("a recorded trace where the controller proposed a scale-out");
        let mut bad = good.clone();
        bad.steps[k].proposed = bad.steps[k].proposed.map(|p| p + 1);
        match trace::replay(&bad) {
            Err(ReplayError::Proposal { step, .. }) => assert_eq!(step, k),
            other => panic!("step {k}: {other:?}"),
        }
    }
}
