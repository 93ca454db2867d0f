//! The policies compared: a kind of worker combined with a kind of autoscaler.

use backpressure_api::v1alpha1::{Algorithm, ProducerMode};

use crate::scenario::{ProducersSection, Scenario};

/// How each worker pod limits its own concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workers {
    /// Greedy: always `maxPermits` (the `Off` controller).
    Greedy,
    /// The default backpressure controller (`SetPoint`).
    Backpressure,
}

impl Workers {
    /// The worker library's algorithm.
    pub fn algorithm(self) -> Algorithm {
        match self {
            Workers::Greedy => Algorithm::Off,
            Workers::Backpressure => Algorithm::SetPoint,
        }
    }
}

/// Which autoscaler sets the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaler {
    /// None: the scenario's initial replicas throughout.
    Static,
    /// KEDA with a Prometheus trigger on the first-attempt queue age, `metricType: Value`
    /// (the HPA algorithm ported from Kubernetes, [`crate::autoscaler::hpa`]).
    KedaQueueAge,
    /// KEDA with a Redis Streams trigger on the consumer group's lag (`lagCount`,
    /// `AverageValue`).
    KedaLagCount,
    /// Ours.
    Ours,
}

/// Whether our operator also controls the producers (`spec.producers`, issue 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProducerControl {
    /// No producer control, whatever the scenario says: the producers publish their demand as
    /// it comes, and lose what the broker rejects.
    None,
    /// The scenario's `producers` section as written (none without one).
    Scenario,
    /// The scenario's `producers` section with this mode (none without one).
    Mode(ProducerMode),
}

/// A policy: workers plus autoscaler (plus, for ours, producer control).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Stable key (file names, CLI).
    pub key: &'static str,
    /// Name in the report.
    pub name: &'static str,
    /// The workers.
    pub workers: Workers,
    /// The autoscaler.
    pub scaler: Scaler,
    /// Producer control; only our operator has any.
    pub producers: ProducerControl,
}

impl Policy {
    /// The producer control this policy runs on `s`: `None` without a `producers` section, for
    /// a policy without our operator, and for [`ProducerControl::None`].
    pub fn producers_for(&self, s: &Scenario) -> Option<ProducersSection> {
        if self.scaler != Scaler::Ours {
            return None;
        }
        let section = s.producers.clone()?;
        match self.producers {
            ProducerControl::None => None,
            ProducerControl::Scenario => Some(section),
            ProducerControl::Mode(mode) => Some(ProducersSection { mode, ..section }),
        }
    }
}

/// Greedy workers scaled by KEDA on the queue age: today's common setup.
pub const GREEDY_KEDA: Policy = Policy {
    key: "greedy-keda",
    name: "greedy + KEDA queue age (Value)",
    workers: Workers::Greedy,
    scaler: Scaler::KedaQueueAge,
    producers: ProducerControl::None,
};
/// Backpressure workers, static replicas.
pub const BP_STATIC: Policy = Policy {
    key: "bp-static",
    name: "backpressure + static",
    workers: Workers::Backpressure,
    scaler: Scaler::Static,
    producers: ProducerControl::None,
};
/// Backpressure workers scaled by KEDA on the queue age.
pub const BP_KEDA: Policy = Policy {
    key: "bp-keda",
    name: "backpressure + KEDA queue age (Value)",
    workers: Workers::Backpressure,
    scaler: Scaler::KedaQueueAge,
    producers: ProducerControl::None,
};
/// Backpressure workers scaled by our operator, which also controls the producers as the
/// scenario's `producers` section says (if it has one).
pub const BP_OURS: Policy = Policy {
    key: "bp-ours",
    name: "backpressure + ours",
    workers: Workers::Backpressure,
    scaler: Scaler::Ours,
    producers: ProducerControl::Scenario,
};
/// Ours without producer control, on a scenario that has a `producers` section: what the
/// section changes.
pub const BP_OURS_UNGATED: Policy = Policy {
    key: "bp-ours-ungated",
    name: "backpressure + ours, no producer control",
    workers: Workers::Backpressure,
    scaler: Scaler::Ours,
    producers: ProducerControl::None,
};
/// Ours with the scenario's `producers` section in mode `Throttle`.
pub const BP_OURS_THROTTLE: Policy = Policy {
    key: "bp-ours-throttle",
    name: "backpressure + ours, producers Throttle",
    workers: Workers::Backpressure,
    scaler: Scaler::Ours,
    producers: ProducerControl::Mode(ProducerMode::Throttle),
};

/// Greedy workers scaled by KEDA on the broker's lag (a Redis Streams consumer group's
/// undelivered messages, `lagCount` per pod).
pub const GREEDY_KEDA_LAG: Policy = Policy {
    key: "greedy-keda-lag",
    name: "greedy + KEDA lagCount",
    workers: Workers::Greedy,
    scaler: Scaler::KedaLagCount,
    producers: ProducerControl::None,
};

/// The five policies of the benchmark, in report order.
pub const POLICIES: [Policy; 5] = [GREEDY_KEDA, BP_STATIC, BP_KEDA, BP_OURS, GREEDY_KEDA_LAG];

/// The variants of ours that also run on a scenario with a `producers` section (after
/// [`POLICIES`]): without producer control, and in mode `Throttle` (the scenario files give
/// `Pause`, which [`BP_OURS`] runs).
pub const PRODUCER_VARIANTS: [Policy; 2] = [BP_OURS_UNGATED, BP_OURS_THROTTLE];

/// The policies run on `s`: [`POLICIES`], and [`PRODUCER_VARIANTS`] when it has a `producers`
/// section. Scenarios without one run exactly the policies of [`POLICIES`].
pub fn for_scenario(s: &Scenario) -> Vec<Policy> {
    let mut v = POLICIES.to_vec();
    if s.producers.is_some() {
        v.extend(PRODUCER_VARIANTS);
    }
    v
}

/// Looks a policy up by key.
pub fn by_key(key: &str) -> Option<Policy> {
    POLICIES
        .iter()
        .chain(PRODUCER_VARIANTS.iter())
        .copied()
        .find(|p| p.key == key)
}
