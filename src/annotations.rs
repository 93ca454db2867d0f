//! Annotations an operator (the human kind) sets on a WorkerBackpressure, usually with the
//! `kubectl wbp` plugin, to override the automation for a while without editing the spec
//! that Git owns.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

/// Hold scale-out until this RFC 3339 time, whatever the metrics say (`kubectl wbp hold`).
pub const HOLD_UNTIL: &str = "backpressure.dev/hold-until";
/// `"true"` puts the object in DryRun (`kubectl wbp dry-run on`).
pub const DRY_RUN: &str = "backpressure.dev/dry-run";

/// Overrides read from the annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManualOverrides {
    /// A manual hold in force until this time.
    pub hold_until: Option<Timestamp>,
    /// DryRun requested by annotation.
    pub dry_run: bool,
    /// Annotation values that could not be read, with why.
    pub invalid: Vec<(String, String)>,
}

/// Reads the overrides in force at `now` (an expired hold is ignored).
pub fn read(annotations: Option<&BTreeMap<String, String>>, now: Timestamp) -> ManualOverrides {
    let mut out = ManualOverrides::default();
    let Some(a) = annotations else { return out };
    if let Some(v) = a.get(HOLD_UNTIL) {
        match v.trim().parse::<Timestamp>() {
            Ok(t) if t > now => out.hold_until = Some(t),
            Ok(_) => {}
            Err(e) => out.invalid.push((
                HOLD_UNTIL.to_owned(),
                format!("{v:?} is not an RFC 3339 time: {e}"),
            )),
        }
    }
    if let Some(v) = a.get(DRY_RUN) {
        match v.trim() {
            "true" => out.dry_run = true,
            "false" | "" => {}
            other => out.invalid.push((
                DRY_RUN.to_owned(),
                format!("{other:?} is not \"true\" or \"false\""),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_holds_and_dry_run() {
        let now: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let a = BTreeMap::from([
            (HOLD_UNTIL.to_owned(), "2026-11-30T10:30:00Z".to_owned()),
            (DRY_RUN.to_owned(), "true".to_owned()),
        ]);
        let o = read(Some(&a), now);
        assert_eq!(o.hold_until, Some("2026-11-30T10:30:00Z".parse().unwrap()));
        assert!(o.dry_run);
        let expired = BTreeMap::from([(HOLD_UNTIL.to_owned(), "2026-11-30T09:00:00Z".to_owned())]);
        assert_eq!(read(Some(&expired), now).hold_until, None);
        let bad = BTreeMap::from([
            (HOLD_UNTIL.to_owned(), "soon".to_owned()),
            (DRY_RUN.to_owned(), "yes".to_owned()),
        ]);
        let o = read(Some(&bad), now);
        assert_eq!(o.invalid.len(), 2);
        assert!(!o.dry_run);
    }
}
