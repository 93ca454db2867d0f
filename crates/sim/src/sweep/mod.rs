//! The seed sweep: every scenario's targets measured over a range of seeds, so that a target met
//! on the report's one seed can be told apart from one met on most seeds.
//!
//! Seed `k` of a scenario is the same scenario file with `seed: seed + k`. The seed drives every
//! random stream of a run ([`crate::rng`]): the Poisson arrivals, the latencies, the
//! dependency's failure draws, each pod's controller and the timing, length and depth of the
//! intermittent spikes ([`Timeline::new`](crate::scenario::Timeline::new)). Steps, surges and
//! hard or partial outages are fixed by the file and do not move.
//!
//! Every policy runs on every seed. The targets are about our policy: the value and the
//! verdict of each target come from the report's own [`report::target_value`] and
//! [`report::target_met`]. The other policies are measured with the same metric
//! ([`report::policy_value`]) on the same seeds, so that a target missed on some seeds can be
//! told apart from a scenario in which every policy misses it ([`head_to_head`] and the
//! comparison on the page).

use crate::engine::{SimError, Simulation};
use crate::metrics::{Summary, summarize};
use crate::policy::{BP_OURS, Policy};
use crate::report::{self, PolicyRuns};
use crate::scenario::{Scenario, Target};

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A run failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// Zero seeds asked for.
    #[error("a sweep needs at least one seed")]
    NoSeeds,
    /// A worker thread did not return its run.
    #[error("a run did not finish (worker thread panicked)")]
    Unfinished,
}

/// The scenario `s` with seed `s.seed + k` for `k` in `0..n`: the first is `s` itself.
pub fn seeded(s: &Scenario, n: usize) -> Vec<Scenario> {
    (0..n as u64)
        .map(|k| Scenario {
            seed: s.seed.wrapping_add(k),
            ..s.clone()
        })
        .collect()
}

/// The policies run on `s`: all of [`POLICIES`] (the targets need ours and the policies of
/// [`report::target_policies`], the comparison all of them), plus the variants of ours on a
/// scenario with producer control ([`crate::policy::for_scenario`]); none without targets.
pub fn policies(s: &Scenario) -> Vec<Policy> {
    if s.targets.is_empty() {
        Vec::new()
    } else {
        crate::policy::for_scenario(s)
    }
}

/// One seed of a scenario: the summaries of the policies that ran.
#[derive(Debug, Clone)]
pub struct SeedRun {
    /// The scenario with this seed.
    pub scenario: Scenario,
    /// Summaries, in [`policies`] order.
    pub summaries: Vec<(Policy, Summary)>,
}

impl PolicyRuns for SeedRun {
    fn scenario(&self) -> &Scenario {
        &self.scenario
    }
    fn summary(&self, policy: Policy) -> Option<&Summary> {
        self.summaries
            .iter()
            .find(|(p, _)| *p == policy)
            .map(|(_, s)| s)
    }
}

/// `(seed, value)` in seed order; `None` where the value cannot be measured.
pub type SeedValues = Vec<(u64, Option<f64>)>;

/// One target over the seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSweep {
    /// The target.
    pub target: Target,
    /// `(seed, value)` in seed order; `None` where the value cannot be measured.
    pub values: Vec<(u64, Option<f64>)>,
    /// The same metric for every policy that ran and for which it is defined
    /// ([`report::metric_defined`]), in [`POLICIES`] order, ours included: `(seed, value)` in
    /// seed order.
    pub by_policy: Vec<(Policy, SeedValues)>,
}

/// One scenario over the seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioSweep {
    /// The scenario as its file gives it (the first seed).
    pub scenario: Scenario,
    /// The seeds run, in order.
    pub seeds: Vec<u64>,
    /// The policies run on each seed.
    pub policies: Vec<Policy>,
    /// Its targets, in file order.
    pub targets: Vec<TargetSweep>,
}

/// The whole sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    /// One entry per scenario with targets, in input order.
    pub scenarios: Vec<ScenarioSweep>,
    /// Seeds per scenario.
    pub seeds: usize,
    /// Runs made.
    pub runs: usize,
    /// Simulated events over all runs.
    pub events: u64,
    /// Simulated seconds over all runs.
    pub sim_secs: f64,
}

/// Runs every scenario with `seeds` seeds under the policies its targets need, on `jobs`
/// threads, and evaluates the targets. The result does not depend on `jobs`.
pub fn run(scenarios: &[Scenario], seeds: usize, jobs: usize) -> Result<Sweep, SweepError> {
    if seeds == 0 {
        return Err(SweepError::NoSeeds);
    }
    let plan: Vec<(Vec<Scenario>, Vec<Policy>)> = scenarios
        .iter()
        .map(|s| (seeded(s, seeds), policies(s)))
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let work: Vec<(&Scenario, Policy)> = plan
        .iter()
        .flat_map(|(ss, ps)| ss.iter().flat_map(move |s| ps.iter().map(move |p| (s, *p))))
        .collect();
    let done = report::par_map(&work, jobs, |&(s, p)| {
        let sim = Simulation::new(s, p);
        sim.run().map(|out| {
            let summary = summarize(s, sim.timeline(), &out);
            tracing::info!(scenario = %s.name, seed = s.seed, policy = p.key, "run done");
            (summary, out.events)
        })
    });
    let mut done = done.into_iter();
    let mut sweep = Sweep {
        scenarios: Vec::new(),
        seeds,
        runs: work.len(),
        events: 0,
        sim_secs: work.iter().map(|(s, _)| s.duration.secs()).sum(),
    };
    for (seeded, policies) in plan {
        let mut runs = Vec::new();
        for s in seeded {
            let mut summaries = Vec::new();
            for &p in &policies {
                let (summary, events) = done.next().flatten().ok_or(SweepError::Unfinished)??;
                sweep.events += events;
                summaries.push((p, summary));
            }
            runs.push(SeedRun {
                scenario: s,
                summaries,
            });
        }
        let Some(first) = runs.first() else { continue };
        let scenario = first.scenario.clone();
        let targets = scenario
            .targets
            .iter()
            .map(|t| TargetSweep {
                target: t.clone(),
                values: runs
                    .iter()
                    .map(|r| (r.scenario.seed, report::target_value(r, t)))
                    .collect(),
                by_policy: policies
                    .iter()
                    .filter(|p| report::metric_defined(t.metric, **p))
                    .map(|&p| {
                        let values = runs
                            .iter()
                            .map(|r| (r.scenario.seed, report::policy_value(r, t, p)))
                            .collect();
                        (p, values)
                    })
                    .collect(),
            })
            .collect();
        sweep.scenarios.push(ScenarioSweep {
            seeds: runs.iter().map(|r| r.scenario.seed).collect(),
            scenario,
            policies,
            targets,
        });
    }
    Ok(sweep)
}

/// How far a value is on the wrong side of its target: positive when missed, the larger the
/// worse; negative when met. An unmeasurable value is the worst of all.
pub fn shortfall(target: &Target, value: Option<f64>) -> f64 {
    let Some(v) = value else {
        return f64::INFINITY;
    };
    let above = target.max.map_or(f64::NEG_INFINITY, |m| v - m);
    let below = target.min.map_or(f64::NEG_INFINITY, |m| m - v);
    above.max(below)
}

/// A target over the seeds, in numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregate {
    /// Seeds.
    pub n: usize,
    /// Seeds on which the target is met.
    pub met: usize,
    /// Seeds on which the value could not be measured (counted as not met).
    pub unmeasured: usize,
    /// Median of the measured values (mean of the middle two for an even count).
    pub median: Option<f64>,
    /// The worst seed (largest [`shortfall`]; the first such seed on ties) and its value.
    pub worst: Option<(u64, Option<f64>)>,
}

/// Aggregates one target's `(seed, value)` list.
pub fn aggregate(target: &Target, values: &[(u64, Option<f64>)]) -> Aggregate {
    let met = values
        .iter()
        .filter(|(_, v)| report::target_met(target, *v))
        .count();
    let mut measured: Vec<f64> = values.iter().filter_map(|(_, v)| *v).collect();
    measured.sort_by(f64::total_cmp);
    let median = match measured.len() {
        0 => None,
        n if n % 2 == 1 => Some(measured[n / 2]),
        n => Some((measured[n / 2 - 1] + measured[n / 2]) / 2.0),
    };
    let mut worst: Option<(u64, Option<f64>)> = None;
    for &(seed, v) in values {
        if worst.is_none_or(|(_, w)| shortfall(target, v) > shortfall(target, w)) {
            worst = Some((seed, v));
        }
    }
    Aggregate {
        n: values.len(),
        met,
        unmeasured: values.len() - measured.len(),
        median,
        worst,
    }
}

/// Which way a target's metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Lower is better: the target is an upper bound (`<=`).
    Lower,
    /// Higher is better: the target is a lower bound (`>=`).
    Higher,
}

/// The direction of a target: from its one bound; `None` with both bounds or none.
pub fn better(target: &Target) -> Option<Better> {
    match (target.max, target.min) {
        (Some(_), None) => Some(Better::Lower),
        (None, Some(_)) => Some(Better::Higher),
        _ => None,
    }
}

/// Ours against one other policy, seed by seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadToHead {
    /// Seeds on which both values are measured.
    pub compared: usize,
    /// Of those, seeds on which ours is at least as good (ties included).
    pub at_least_as_good: usize,
    /// Of those, seeds on which both are equal.
    pub ties: usize,
    /// Seeds of ours on which either value is missing: not compared, in neither count.
    pub not_comparable: usize,
}

/// Compares ours with another policy on each of our seeds (the other's value of the same
/// seed; a seed it lacks is not comparable). Values within 1e-12 are equal, as in
/// [`report::target_met`].
pub fn head_to_head(
    better: Better,
    ours: &[(u64, Option<f64>)],
    other: &[(u64, Option<f64>)],
) -> HeadToHead {
    let mut h = HeadToHead {
        compared: 0,
        at_least_as_good: 0,
        ties: 0,
        not_comparable: 0,
    };
    for &(seed, mine) in ours {
        let theirs = other.iter().find(|(s, _)| *s == seed).and_then(|(_, v)| *v);
        let (Some(a), Some(b)) = (mine, theirs) else {
            h.not_comparable += 1;
            continue;
        };
        h.compared += 1;
        if (a - b).abs() <= 1e-12 {
            h.ties += 1;
            h.at_least_as_good += 1;
        } else if match better {
            Better::Lower => a < b,
            Better::Higher => a > b,
        } {
            h.at_least_as_good += 1;
        }
    }
    h
}

/// How the sweep was produced (the only non-deterministic numbers of its page).
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    /// The command line.
    pub command: String,
    /// Wall-clock seconds for all runs.
    pub wall_secs: f64,
    /// Threads used.
    pub jobs: usize,
}

/// The comparators of a target with their medians, best first (by [`better`]); policies
/// without a measured median are left out.
pub(super) fn comparator_medians(t: &TargetSweep) -> Vec<(Policy, f64)> {
    let mut v: Vec<(Policy, f64)> = t
        .by_policy
        .iter()
        .filter(|(p, _)| *p != BP_OURS)
        .filter_map(|(p, values)| aggregate(&t.target, values).median.map(|m| (*p, m)))
        .collect();
    match better(&t.target) {
        Some(Better::Higher) => v.sort_by(|a, b| b.1.total_cmp(&a.1)),
        _ => v.sort_by(|a, b| a.1.total_cmp(&b.1)),
    }
    v
}

mod markdown;
#[cfg(test)]
mod tests;

pub use markdown::markdown;
