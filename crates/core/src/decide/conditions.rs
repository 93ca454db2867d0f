//! Building `status.conditions` with Kubernetes semantics: `lastTransitionTime` changes only
//! when a condition's status changes, so an unchanged world writes identical conditions.

use backpressure_api::conditions as cond;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition status values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    pub(super) fn from_bool(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Collects conditions in the order of [`cond::ALL`] (plus `Stalled` last when set).
pub(super) struct Builder<'a> {
    prev: &'a [Condition],
    now: Timestamp,
    generation: Option<i64>,
    out: Vec<Condition>,
}

impl<'a> Builder<'a> {
    pub(super) fn new(prev: &'a [Condition], now: Timestamp, generation: Option<i64>) -> Self {
        Builder {
            prev,
            now,
            generation,
            out: Vec::new(),
        }
    }

    /// Sets a condition, keeping the previous transition time when the status is unchanged.
    pub(super) fn set(&mut self, type_: &str, status: Status, reason: &str, message: String) {
        let status = status.as_str();
        let last_transition_time = find(self.prev, type_)
            .filter(|c| c.status == status)
            .map_or(Time(self.now), |c| c.last_transition_time.clone());
        self.out.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: self.generation,
            last_transition_time,
        });
    }

    /// Copies the previous condition of this type unchanged, if there is one.
    pub(super) fn keep(&mut self, type_: &str) -> bool {
        match find(self.prev, type_) {
            Some(c) => {
                self.out.push(c.clone());
                true
            }
            None => false,
        }
    }

    pub(super) fn build(mut self) -> Vec<Condition> {
        self.out.sort_by_key(|c| rank(&c.type_));
        self.out
    }
}

/// Position of a condition type in the written order ([`cond::ALL`], others last).
pub(super) fn rank(type_: &str) -> usize {
    cond::ALL
        .iter()
        .position(|a| *a == type_)
        .unwrap_or(cond::ALL.len())
}

/// The condition of `type_` in `conditions`.
pub(super) fn find<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is `True`.
pub(super) fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}
