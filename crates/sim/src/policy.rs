//! The policies compared: a kind of worker combined with a kind of autoscaler.

use backpressure_api::v1alpha1::Algorithm;

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
    /// HPA/KEDA-like on queue age.
    KedaLike,
    /// Ours.
    Ours,
}

/// A policy: workers plus autoscaler.
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
}

/// Greedy workers scaled by a KEDA-like autoscaler: today's common setup.
pub const GREEDY_KEDA: Policy = Policy {
    key: "greedy-keda",
    name: "greedy + KEDA-like",
    workers: Workers::Greedy,
    scaler: Scaler::KedaLike,
};
/// Backpressure workers, static replicas.
pub const BP_STATIC: Policy = Policy {
    key: "bp-static",
    name: "backpressure + static",
    workers: Workers::Backpressure,
    scaler: Scaler::Static,
};
/// Backpressure workers scaled by a KEDA-like autoscaler.
pub const BP_KEDA: Policy = Policy {
    key: "bp-keda",
    name: "backpressure + KEDA-like",
    workers: Workers::Backpressure,
    scaler: Scaler::KedaLike,
};
/// Backpressure workers scaled by our operator.
pub const BP_OURS: Policy = Policy {
    key: "bp-ours",
    name: "backpressure + ours",
    workers: Workers::Backpressure,
    scaler: Scaler::Ours,
};

/// The four policies of the benchmark, in report order.
pub const POLICIES: [Policy; 4] = [GREEDY_KEDA, BP_STATIC, BP_KEDA, BP_OURS];

/// Looks a policy up by key.
pub fn by_key(key: &str) -> Option<Policy> {
    POLICIES.iter().copied().find(|p| p.key == key)
}
