//! The conformance hook's executor: one golden-vector case (`conformance/vectors/controller.json`,
//! format in `conformance/README.md`) run on a fresh controller, with the readings after every
//! step.
//!
//! The admin server answers `POST` [`HOOK_PATH`] with it when the worker was started for a
//! conformance run ([`crate::config::admin::Admin::with_conformance_hook`]); the conformance
//! suite compares the readings with the vectors' `expect`. Every implementation of the contract
//! (the SDKs under `sdk/`) serves the same hook with its own controller. The controller that
//! serves messages is never touched: each request builds its own from the case's `config` and
//! `seed`, and the case's times are the only clock.

use backpressure_api::wire::WorkerConfig;
use serde::{Deserialize, Serialize};

use crate::controller::{self, Brake, Controller, Nanos, Outcome, Settings};

/// The hook's path on the admin port.
pub const HOOK_PATH: &str = "/v1/conformance/controller";

/// Most steps one request may run.
pub const MAX_STEPS: usize = 1_000_000;

/// Largest request body the hook reads (a case of the committed vectors is far smaller).
pub const MAX_CASE_BYTES: usize = 16 * 1024 * 1024;

/// One case. Fields the executor does not need (`name`, `description`, each step's `expect`)
/// are ignored, so a case of the vectors file is sent as it is.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    /// The seed of the controller's generator.
    pub seed: u64,
    /// This worker's brake-lift offset in nanoseconds.
    pub brake_offset_ns: u64,
    /// The payload the controller is built from.
    pub config: WorkerConfig,
    /// The calls, in non-decreasing `t`.
    pub steps: Vec<Step>,
}

/// One call at controller time `t` (nanoseconds).
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    /// Controller time in nanoseconds.
    pub t: u64,
    /// The call.
    #[serde(flatten)]
    pub op: Op,
}

/// The calls (`op` in the file; the vectors generator writes them with the same type).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Op {
    /// `record(t, outcome)`.
    Record {
        /// The outcome's wire class.
        outcome: OutcomeClass,
    },
    /// `permits(t, inFlight)`.
    Permits {
        /// Messages in flight.
        #[serde(rename = "inFlight")]
        in_flight: u32,
    },
    /// `release_unused(t, unused)`.
    ReleaseUnused {
        /// Permits granted and not used.
        unused: u32,
    },
    /// A new payload: its brake succeeds the old one, then the settings apply.
    Configure {
        /// The payload.
        config: Box<WorkerConfig>,
        /// The Unix time in seconds at `t`.
        #[serde(rename = "unixS")]
        unix_s: i64,
    },
}

/// An outcome by its wire class name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// `success`.
    Success,
    /// `dependency_failure`.
    DependencyFailure,
    /// `message_failure`.
    MessageFailure,
}

impl From<Outcome> for OutcomeClass {
    fn from(o: Outcome) -> OutcomeClass {
        match o {
            Outcome::Success => OutcomeClass::Success,
            Outcome::DependencyFailure => OutcomeClass::DependencyFailure,
            Outcome::MessageFailure => OutcomeClass::MessageFailure,
        }
    }
}

impl From<OutcomeClass> for Outcome {
    fn from(c: OutcomeClass) -> Outcome {
        match c {
            OutcomeClass::Success => Outcome::Success,
            OutcomeClass::DependencyFailure => Outcome::DependencyFailure,
            OutcomeClass::MessageFailure => Outcome::MessageFailure,
        }
    }
}

/// The readings after one step (the fields of a step's `expect`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// What `permits` returned (only after a `permits` step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// `backoff(t)`.
    pub backoff: f64,
    /// `mode()`.
    pub mode: &'static str,
    /// `limit(t)`.
    pub limit: u32,
    /// `failure_floor()`.
    pub failure_floor: f64,
    /// `floor_estimate()`.
    pub floor_estimate: Option<f64>,
}

/// The hook's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observations {
    /// One per step.
    pub observations: Vec<Observation>,
}

/// Why a case cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CaseError {
    /// Not a case.
    #[error("malformed case: {0}")]
    Malformed(String),
    /// A payload of the case is not valid.
    #[error("invalid config in {at}: {reason}")]
    Config {
        /// `config` or `steps[i].config`.
        at: String,
        /// Why.
        reason: String,
    },
    /// Steps going back in time.
    #[error("steps[{0}]: t goes back in time")]
    TimeBackwards(usize),
    /// More than [`MAX_STEPS`].
    #[error("{0} steps exceed the limit of {MAX_STEPS}")]
    TooManySteps(usize),
}

/// Parses a case from a request body.
pub fn parse(bytes: &[u8]) -> Result<Case, CaseError> {
    serde_json::from_slice(bytes).map_err(|e| CaseError::Malformed(e.to_string()))
}

/// Runs `case` on a fresh controller and returns the readings after every step.
pub fn execute(case: &Case) -> Result<Observations, CaseError> {
    if case.steps.len() > MAX_STEPS {
        return Err(CaseError::TooManySteps(case.steps.len()));
    }
    let invalid = |at: String, e: backpressure_api::wire::ConfigError| CaseError::Config {
        at,
        reason: e.to_string(),
    };
    case.config
        .validate()
        .map_err(|e| invalid("config".into(), e))?;
    let offset = Nanos(case.brake_offset_ns);
    let mut c: Box<dyn Controller> = controller::from_config(&case.config, case.seed);
    let mut brake: Option<Brake> = None;
    let mut last = 0;
    let mut observations = Vec::with_capacity(case.steps.len());
    for (i, step) in case.steps.iter().enumerate() {
        if step.t < last {
            return Err(CaseError::TimeBackwards(i));
        }
        last = step.t;
        let now = Nanos(step.t);
        let mut permits = None;
        match &step.op {
            Op::Record { outcome } => c.record(now, (*outcome).into()),
            Op::Permits { in_flight } => permits = Some(c.permits(now, *in_flight)),
            Op::ReleaseUnused { unused } => c.release_unused(now, *unused),
            Op::Configure { config, unix_s } => {
                config
                    .validate()
                    .map_err(|e| invalid(format!("steps[{i}].config"), e))?;
                let settings = Settings::from_config(config);
                let new = config
                    .brake
                    .as_ref()
                    .map(|b| Brake::from_wire(b, now, *unix_s));
                brake = Brake::succeed(brake.as_ref(), new, now, settings.brake_release, offset);
                controller::apply_settings(&mut c, now, settings, case.seed, brake);
            }
        }
        observations.push(Observation {
            permits,
            backoff: c.backoff(now),
            mode: c.mode().as_str(),
            limit: c.limit(now),
            failure_floor: c.failure_floor(),
            floor_estimate: c.floor_estimate(),
        });
    }
    Ok(Observations { observations })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(steps: &str) -> Case {
        let config = serde_json::to_string(&WorkerConfig::default()).unwrap();
        parse(
            format!(r#"{{"name": "n", "seed": 7, "brakeOffsetNs": 0, "config": {config}, "steps": {steps}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn a_case_runs_on_a_fresh_controller_step_by_step() {
        // The library's own doc example: a fresh controller starts at 2 permits and 40
        // dependency failures back it off fully.
        let mut steps =
            vec![r#"{"t": 1000000000, "op": "permits", "inFlight": 0, "expect": {}}"#.to_owned()];
        steps.extend((0..40).map(|_| {
            r#"{"t": 1000000000, "op": "record", "outcome": "dependency_failure"}"#.to_owned()
        }));
        steps.push(r#"{"t": 1000000000, "op": "permits", "inFlight": 0}"#.to_owned());
        let out = execute(&case(&format!("[{}]", steps.join(",")))).unwrap();
        let obs = &out.observations;
        assert_eq!(obs.len(), 42);
        assert_eq!(obs[0].permits, Some(2));
        assert_eq!(obs[0].mode, "starting");
        assert_eq!(obs[1].permits, None);
        assert_eq!(obs[41].backoff, 1.0);
        assert_eq!(obs[41].permits, Some(0));
        let json = serde_json::to_value(&out).unwrap();
        assert!(json["observations"][1].get("permits").is_none());
        assert!(json["observations"][1]["floorEstimate"].is_null());
    }

    #[test]
    fn bad_cases_are_refused_with_the_reason() {
        assert!(matches!(
            execute(&case(
                r#"[{"t": 2, "op": "record", "outcome": "success"}, {"t": 1, "op": "record", "outcome": "success"}]"#
            )),
            Err(CaseError::TimeBackwards(1))
        ));
        let err =
            parse(br#"{"seed": 1, "brakeOffsetNs": 0, "config": {}, "steps": []}"#).unwrap_err();
        assert!(matches!(err, CaseError::Malformed(_)), "{err}");
        let mut c = case("[]");
        c.config.set_point = 2.0;
        c.config.hash.clear();
        assert!(matches!(execute(&c), Err(CaseError::Config { .. })));
        let err = parse(
            format!(
                r#"{{"seed": 1, "brakeOffsetNs": 0, "config": {}, "steps": [{{"t": 1, "op": "explode"}}]}}"#,
                serde_json::to_string(&WorkerConfig::default()).unwrap()
            )
            .as_bytes(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("explode"), "{err}");
    }
}
