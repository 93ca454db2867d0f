use std::collections::{BTreeSet, HashSet};

use backpressure_worker::controller::Mode;

use super::*;

#[test]
fn the_rendered_text_is_the_document() {
    let v = generate();
    let text = render(&v).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed, serde_json::to_value(&v).unwrap());
    assert!(text.len() < 2_000_000, "{} bytes", text.len());
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(render(&generate()).unwrap(), render(&generate()).unwrap());
}

#[test]
fn cases_are_well_formed_and_cover_every_mode_op_and_algorithm() {
    let v = generate();
    assert!(
        (25..=40).contains(&v.cases.len()),
        "{} cases",
        v.cases.len()
    );
    let mut names = HashSet::new();
    let mut modes = BTreeSet::new();
    let mut ops = BTreeSet::new();
    let mut algorithms = BTreeSet::new();
    let (mut in_flight, mut null_then_value) = (false, false);
    for c in &v.cases {
        assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
        assert!(c.seed < 1 << 53 && c.config.brake.is_none(), "{}", c.name);
        assert!(!c.steps.is_empty(), "{}", c.name);
        algorithms.insert(format!("{:?}", c.config.algorithm));
        let mut t = 0;
        let mut seen_null = false;
        for s in &c.steps {
            assert!(s.t >= t && s.t < 1 << 53, "{}: t {}", c.name, s.t);
            t = s.t;
            modes.insert(s.expect.mode);
            let b = s.expect.backoff;
            assert!((0.0..=1.0).contains(&b), "{}: backoff {b}", c.name);
            seen_null |= s.expect.floor_estimate.is_none();
            null_then_value |= seen_null && s.expect.floor_estimate.is_some_and(|f| f > 0.0);
            let op = match &s.op {
                Op::Record { .. } => "record",
                Op::Permits { in_flight: n } => {
                    in_flight |= *n > 0;
                    "permits"
                }
                Op::ReleaseUnused { .. } => "releaseUnused",
                Op::Configure { config, .. } => {
                    algorithms.insert(format!("{:?}", config.algorithm));
                    "configure"
                }
            };
            ops.insert(op);
            assert_eq!(s.expect.permits.is_some(), op == "permits", "{}", c.name);
        }
    }
    let all_modes: BTreeSet<_> = [Mode::Normal, Mode::Probing, Mode::SlowStart, Mode::Starting]
        .iter()
        .map(|m| m.as_str())
        .collect();
    assert_eq!(modes, all_modes);
    assert_eq!(ops.len(), 4, "{ops:?}");
    assert_eq!(algorithms.len(), 4, "{algorithms:?}");
    assert!(in_flight, "no permits step with inFlight > 0");
    assert!(
        null_then_value,
        "no floorEstimate going from null to a value"
    );
}
