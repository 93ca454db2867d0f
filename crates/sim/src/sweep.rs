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
//! told apart from a scenario in which every policy misses it ([`compare`]).

use std::fmt::Write as _;

use crate::engine::{SimError, Simulation};
use crate::metrics::{Summary, summarize};
use crate::policy::{BP_OURS, POLICIES, Policy};
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
/// [`report::target_policies`], the comparison all of them), none without targets.
pub fn policies(s: &Scenario) -> Vec<Policy> {
    if s.targets.is_empty() {
        Vec::new()
    } else {
        POLICIES.to_vec()
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

/// The comparators of a target with their medians, best first (by [`better`]); policies
/// without a measured median are left out.
fn comparator_medians(t: &TargetSweep) -> Vec<(Policy, f64)> {
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

fn fmt_head_to_head(h: &HeadToHead) -> String {
    let mut s = format!("{} of {}", h.at_least_as_good, h.compared);
    if h.ties > 0 {
        let _ = write!(s, " ({} tie{})", h.ties, if h.ties == 1 { "" } else { "s" });
    }
    if h.not_comparable > 0 {
        let _ = write!(s, "; {} not comparable", h.not_comparable);
    }
    s
}

/// The section "Against the other policies, on the same seeds".
fn comparison_markdown(md: &mut String, sweep: &Sweep) {
    let others: Vec<Policy> = POLICIES.into_iter().filter(|p| *p != BP_OURS).collect();
    let _ = writeln!(md, "\n## Against the other policies, on the same seeds\n");
    let _ = writeln!(
        md,
        "The targets are about our policy; the other three policies ran on the same seeds and \
         are measured with the same metric (`report::policy_value`, of which \
         `report::target_value` is our column). Each cell: median / worst (seed) / seeds on \
         which that policy's value would meet our target. \"—\": the metric is a state of our \
         operator (scale-out held, ramp stages) and is not defined for the others.\n"
    );
    let _ = write!(md, "| scenario | target |");
    for p in POLICIES {
        let _ = write!(md, " {} |", p.name);
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|---|{}", "---:|".repeat(POLICIES.len()));
    for s in &sweep.scenarios {
        for t in &s.targets {
            let _ = write!(
                md,
                "| {} | {} |",
                short_title(&s.scenario.title),
                report::target_label(&t.target)
            );
            for p in POLICIES {
                let cell = match t.by_policy.iter().find(|(q, _)| *q == p) {
                    Some((_, values)) => {
                        let a = aggregate(&t.target, values);
                        format!(
                            "{} / {} / {} of {}",
                            report::opt(a.median, |x| fmt_measured(&t.target, x)),
                            a.worst.map_or_else(
                                || "—".to_owned(),
                                |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                            ),
                            a.met,
                            a.n
                        )
                    }
                    None => "—".to_owned(),
                };
                let cell = if p == BP_OURS {
                    format!("**{cell}**")
                } else {
                    cell
                };
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md);
        }
    }
    let _ = writeln!(
        md,
        "\nSeeds on which ours is at least as good as each other policy (ties included): lower \
         is better for a `<=` target, higher for a `>=` target; a seed on which either value is \
         not measurable is not compared.\n"
    );
    let _ = write!(md, "| scenario | target | better |");
    for p in &others {
        let _ = write!(md, " ours vs {} |", p.name);
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|---|---|{}", "---:|".repeat(others.len()));
    for s in &sweep.scenarios {
        for t in &s.targets {
            let dir = better(&t.target);
            let _ = write!(
                md,
                "| {} | {} | {} |",
                short_title(&s.scenario.title),
                report::target_label(&t.target),
                match dir {
                    Some(Better::Lower) => "lower",
                    Some(Better::Higher) => "higher",
                    None => "—",
                }
            );
            for p in &others {
                let cell = match (dir, t.by_policy.iter().find(|(q, _)| q == p)) {
                    (Some(d), Some((_, values))) => {
                        fmt_head_to_head(&head_to_head(d, &t.values, values))
                    }
                    _ => "—".to_owned(),
                };
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md);
        }
    }
    let missed: Vec<(&ScenarioSweep, &TargetSweep)> = sweep
        .scenarios
        .iter()
        .flat_map(|s| s.targets.iter().map(move |t| (s, t)))
        .filter(|(_, t)| {
            let a = aggregate(&t.target, &t.values);
            a.met < a.n
        })
        .collect();
    if missed.is_empty() {
        return;
    }
    let _ = writeln!(md, "\nThe targets missed on at least one seed:\n");
    for (s, t) in missed {
        let ours = aggregate(&t.target, &t.values);
        let mut line = format!(
            "- **{}, {}**: ours has median {} (meets it on {} of {} seeds)",
            short_title(&s.scenario.title),
            report::target_label(&t.target),
            report::opt(ours.median, |x| fmt_measured(&t.target, x)),
            ours.met,
            ours.n
        );
        let medians = comparator_medians(t);
        let describe = |p: Policy, m: f64| {
            let met = t
                .by_policy
                .iter()
                .find(|(q, _)| *q == p)
                .map_or(0, |(_, v)| aggregate(&t.target, v).met);
            format!(
                "{} ({}, meets it on {met} of {})",
                fmt_measured(&t.target, m),
                p.name,
                ours.n
            )
        };
        match (medians.first(), medians.last()) {
            (Some(&(bp, bm)), Some(&(wp, wm))) if bp != wp => {
                let _ = write!(
                    line,
                    "; the best other median is {}, the worst {}",
                    describe(bp, bm),
                    describe(wp, wm)
                );
            }
            (Some(&(bp, bm)), _) => {
                let _ = write!(line, "; the other median is {}", describe(bp, bm));
            }
            _ => line.push_str("; no other policy is measured on it"),
        }
        if let Some(d) = better(&t.target) {
            let counts: Vec<String> = t
                .by_policy
                .iter()
                .filter(|(p, _)| *p != BP_OURS)
                .map(|(p, values)| {
                    let h = head_to_head(d, &t.values, values);
                    format!("{} on {}", p.name, fmt_head_to_head(&h))
                })
                .collect();
            if !counts.is_empty() {
                let _ = write!(
                    line,
                    ". Seed by seed, ours is at least as good as {}",
                    join_and(&counts)
                );
            }
        }
        line.push('.');
        let _ = writeln!(md, "{line}");
    }
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

fn fmt_value(target: &Target, v: Option<f64>) -> String {
    v.map_or_else(|| "not measurable".to_owned(), |x| fmt_measured(target, x))
}

fn fmt_measured(target: &Target, v: f64) -> String {
    report::fmt_target_value_digits(target.metric, v, 3)
}

/// The page `sweep.md`: provenance, one table row per target, and what the numbers say.
pub fn markdown(sweep: &Sweep, prov: &Provenance) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Seed sweep: how robust are the targets?\n");
    let _ = writeln!(
        md,
        "Generated by `{}`. [`report.md`](report.md) checks the targets of our policy \
         (backpressure + ours) on one seed per scenario, the seed in its file. Here every \
         scenario runs with {} seeds, its file's seed `s` to `s + {}`: the seed drives the \
         Poisson arrivals, latencies, the dependency's failure draws, each pod's controller and \
         the timing, length and depth of intermittent error spikes; steps, surges and hard or \
         partial outages stay where the file puts them. All four policies run on every seed: the \
         targets below are about ours (values and verdicts come from the same code as the \
         report's, `report::target_value` and `report::target_met`); the other three are \
         measured with the same metrics in the section [Against the other policies, on the \
         same seeds](#against-the-other-policies-on-the-same-seeds).\n",
        prov.command,
        sweep.seeds,
        sweep.seeds.saturating_sub(1),
    );
    let _ = writeln!(
        md,
        "**Runs:** {} runs, {:.1} simulated hours, {} simulated events in {:.1} s wall on {} \
         thread(s). Everything on this page except this line is a deterministic function of the \
         scenario files and the number of seeds.\n",
        sweep.runs,
        sweep.sim_secs / 3600.0,
        report::count(sweep.events),
        prov.wall_secs,
        prov.jobs,
    );
    let _ = writeln!(
        md,
        "| scenario | seeds | target | met | median | worst (seed) | report's seed |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for s in &sweep.scenarios {
        let seeds = match (s.seeds.first(), s.seeds.last()) {
            (Some(a), Some(b)) if a != b => format!("{a}..{b}"),
            (Some(a), _) => a.to_string(),
            _ => "—".into(),
        };
        for t in &s.targets {
            let a = aggregate(&t.target, &t.values);
            let first = t.values.first().copied();
            let met = if a.met == a.n {
                format!("{} of {}", a.met, a.n)
            } else {
                format!("**{} of {}**", a.met, a.n)
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {}{} | {} | {} | {} |",
                s.scenario.title,
                seeds,
                report::target_label(&t.target),
                met,
                if a.unmeasured > 0 {
                    format!(" ({} not measurable)", a.unmeasured)
                } else {
                    String::new()
                },
                report::opt(a.median, |x| fmt_measured(&t.target, x)),
                a.worst.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                ),
                first.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} ({seed})", fmt_value(&t.target, v))
                ),
            );
            rows.push((s, t, a));
        }
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "## What the numbers say\n");
    let total = rows.len();
    let robust: Vec<_> = rows.iter().filter(|(_, _, a)| a.met == a.n).collect();
    let fragile: Vec<_> = rows.iter().filter(|(_, _, a)| a.met < a.n).collect();
    let met_on_first = rows
        .iter()
        .filter(|(_, t, _)| {
            t.values
                .first()
                .is_some_and(|(_, v)| report::target_met(&t.target, *v))
        })
        .count();
    // Which targets hold on every seed, grouped by scenario: "every target of" the scenarios
    // whose targets all hold, the labels for the others.
    let mut whole = Vec::new();
    let mut partial = Vec::new();
    for s in &sweep.scenarios {
        let held: Vec<_> = robust
            .iter()
            .filter(|(x, _, _)| std::ptr::eq(*x, s))
            .map(|(_, t, _)| report::target_label(&t.target))
            .collect();
        if held.is_empty() {
            continue;
        }
        if held.len() == s.targets.len() {
            whole.push(short_title(&s.scenario.title));
        } else {
            partial.push(format!(
                "{}: {}",
                short_title(&s.scenario.title),
                held.join("; ")
            ));
        }
    }
    let mut held = Vec::new();
    if !whole.is_empty() {
        held.push(format!("every target of {}", join_and(&whole)));
    }
    held.extend(partial);
    let _ = writeln!(
        md,
        "On the report's seeds {met_on_first} of {total} targets are met. Over {} seeds per \
         scenario, **{} of {total} hold on every seed**{}",
        sweep.seeds,
        robust.len(),
        if held.is_empty() {
            ".".to_owned()
        } else {
            format!(" ({}).", held.join("; "))
        }
    );
    if fragile.is_empty() {
        let _ = writeln!(md, "No target is missed on any seed.");
    } else {
        let _ = writeln!(md, "\nMissed on at least one seed ({}):\n", fragile.len());
        for (s, t, a) in &fragile {
            let mut line = format!(
                "- **{}, {}**: met on {} of {} seeds; median {}, worst {}",
                short_title(&s.scenario.title),
                report::target_label(&t.target),
                a.met,
                a.n,
                report::opt(a.median, |x| fmt_measured(&t.target, x)),
                a.worst.map_or_else(
                    || "—".to_owned(),
                    |(seed, v)| format!("{} (seed {seed})", fmt_value(&t.target, v))
                ),
            );
            if let Some(&(seed, v)) = t.values.first() {
                let mine = shortfall(&t.target, v);
                let others = t.values.len() - 1;
                let worse = t
                    .values
                    .iter()
                    .skip(1)
                    .filter(|(_, w)| shortfall(&t.target, *w) > mine)
                    .count();
                let better = t
                    .values
                    .iter()
                    .skip(1)
                    .filter(|(_, w)| shortfall(&t.target, *w) < mine)
                    .count();
                let _ = write!(
                    line,
                    ". The report's seed {seed} measures {}; of the other {others} seeds, \
                     {worse} do worse and {better} better",
                    fmt_value(&t.target, v),
                );
            }
            line.push('.');
            let _ = writeln!(md, "{line}");
        }
    }
    comparison_markdown(&mut md, sweep);
    let _ = writeln!(md, "\n## Every seed\n");
    let _ = writeln!(md, "`seed: value` of our policy; misses in bold.\n");
    let _ = writeln!(md, "| scenario | target | values |");
    let _ = writeln!(md, "|---|---|---|");
    for (s, t, _) in &rows {
        let values = t
            .values
            .iter()
            .map(|&(seed, v)| {
                let text = format!("{seed}: {}", fmt_value(&t.target, v));
                if report::target_met(&t.target, v) {
                    text
                } else {
                    format!("**{text}**")
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            md,
            "| {} | {} | {values} |",
            short_title(&s.scenario.title),
            report::target_label(&t.target)
        );
    }
    md
}

/// "a", "a and b", "a, b and c".
fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// "1. Intermittent outage" -> "scenario 1"; other titles unchanged.
fn short_title(title: &str) -> String {
    match title.split_once(". ") {
        Some((n, _)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
            format!("scenario {n}")
        }
        _ => title.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::policy::{BP_KEDA, BP_STATIC, GREEDY_KEDA};
    use crate::scenario::{TargetMetric, Timeline};

    fn file(name: &str) -> Scenario {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        Scenario::load(&dir.join(name)).unwrap()
    }

    fn target(metric: TargetMetric, max: Option<f64>, min: Option<f64>) -> Target {
        Target {
            metric,
            max,
            min,
            text: String::new(),
        }
    }

    #[test]
    fn seeds_change_the_spikes_and_nothing_else() {
        let s = file("1-intermittent-outage.yaml");
        let seeded = seeded(&s, 5);
        assert_eq!(seeded[0], s);
        let seeds: Vec<u64> = seeded.iter().map(|x| x.seed).collect();
        assert_eq!(seeds, (s.seed..s.seed + 5).collect::<Vec<_>>());
        let episodes: Vec<_> = seeded
            .iter()
            .map(|x| Timeline::new(x).episodes().to_vec())
            .collect();
        for (i, a) in episodes.iter().enumerate() {
            assert!(!a.is_empty());
            for b in &episodes[i + 1..] {
                assert_ne!(a, b, "two seeds gave the same spikes");
            }
        }
        for x in &seeded {
            assert_eq!(
                Scenario {
                    seed: s.seed,
                    ..x.clone()
                },
                s
            );
        }
    }

    #[test]
    fn every_policy_runs_where_there_are_targets() {
        assert_eq!(policies(&file("1-intermittent-outage.yaml")), POLICIES);
        assert_eq!(policies(&file("3-producer-surge.yaml")), POLICIES);
        let mut none = file("1-intermittent-outage.yaml");
        none.targets.clear();
        assert!(policies(&none).is_empty());
    }

    #[test]
    fn aggregates_met_median_and_worst() {
        // At most 1 (like scenario 1's DLQ): 0, 3, 1, 7, 7, unmeasurable.
        let t = target(TargetMetric::Dlq, Some(1.0), None);
        let values = [
            (10, Some(0.0)),
            (11, Some(3.0)),
            (12, Some(1.0)),
            (13, Some(7.0)),
            (14, Some(7.0)),
        ];
        let a = aggregate(&t, &values);
        assert_eq!((a.n, a.met, a.unmeasured), (5, 2, 0));
        assert_eq!(a.median, Some(3.0));
        // Ties: the first worst seed.
        assert_eq!(a.worst, Some((13, Some(7.0))));
        let mut with_none = values.to_vec();
        with_none.push((15, None));
        let a = aggregate(&t, &with_none);
        assert_eq!((a.n, a.met, a.unmeasured), (6, 2, 1));
        assert_eq!(a.median, Some(3.0));
        assert_eq!(a.worst, Some((15, None)));

        // At least 0.8 (scenario 6's held fraction): the worst is the lowest; even count.
        let t = target(TargetMetric::HeldFractionOfIncident, None, Some(0.8));
        let a = aggregate(
            &t,
            &[
                (1, Some(0.9)),
                (2, Some(0.7)),
                (3, Some(1.0)),
                (4, Some(0.8)),
            ],
        );
        assert_eq!((a.n, a.met), (4, 3));
        assert!((a.median.unwrap() - 0.85).abs() < 1e-12);
        assert_eq!(a.worst, Some((2, Some(0.7))));

        // All met: the worst is still the one closest to the bound.
        let a = aggregate(&t, &[(1, Some(0.95)), (2, Some(0.85)), (3, Some(0.99))]);
        assert_eq!(
            (a.met, a.median, a.worst),
            (3, Some(0.95), Some((2, Some(0.85))))
        );
        assert_eq!(aggregate(&t, &[]).worst, None);
    }

    #[test]
    fn the_page_says_which_targets_hold() {
        let base = file("1-intermittent-outage.yaml");
        let t = base.targets[0].clone();
        let sweep = Sweep {
            scenarios: vec![ScenarioSweep {
                scenario: base.clone(),
                seeds: vec![101, 102, 103],
                policies: vec![BP_OURS],
                targets: vec![TargetSweep {
                    target: t,
                    values: vec![(101, Some(1.0)), (102, Some(37.0)), (103, Some(0.0))],
                    by_policy: vec![
                        (
                            GREEDY_KEDA,
                            vec![(101, Some(900.0)), (102, Some(70.0)), (103, Some(1500.0))],
                        ),
                        (
                            BP_STATIC,
                            vec![(101, Some(1.0)), (102, Some(3.0)), (103, None)],
                        ),
                        (
                            BP_OURS,
                            vec![(101, Some(1.0)), (102, Some(37.0)), (103, Some(0.0))],
                        ),
                    ],
                }],
            }],
            seeds: 3,
            runs: 9,
            events: 1,
            sim_secs: 1.0,
        };
        let md = markdown(
            &sweep,
            &Provenance {
                command: "test".into(),
                wall_secs: 1.0,
                jobs: 1,
            },
        );
        assert!(
            md.contains("| **2 of 3** | 1 | 37 (102) | 1 (101) |"),
            "{md}"
        );
        assert!(md.contains("**0 of 1 hold on every seed**."), "{md}");
        assert!(
            md.contains("| scenario 1 | DLQ <= 1 | 101: 1, **102: 37**, 103: 0 |"),
            "{md}"
        );
        assert!(
            md.contains(
                "The report's seed 101 measures 1; of the other 2 seeds, 1 do worse and 1 better"
            ),
            "{md}"
        );
        // The comparison: per policy median / worst / met; "—" where a policy has no values.
        assert!(
            md.contains(
                "| scenario 1 | DLQ <= 1 | 900 / 1500 (103) / 0 of 3 | 2 / not measurable (103) \
                 / 1 of 3 | — | **1 / 37 (102) / 2 of 3** |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| scenario 1 | DLQ <= 1 | lower | 3 of 3 | 1 of 2 (1 tie); 1 not comparable | — |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "- **scenario 1, DLQ <= 1**: ours has median 1 (meets it on 2 of 3 seeds); the \
                 best other median is 2 (backpressure + static, meets it on 1 of 3), the worst \
                 900 (greedy + KEDA-like, meets it on 0 of 3). Seed by seed, ours is at least as \
                 good as greedy + KEDA-like on 3 of 3 and backpressure + static on 1 of 2 (1 \
                 tie); 1 not comparable."
            ),
            "{md}"
        );
    }

    fn summary(dlq: u64, max_age: f64, held: f64) -> Summary {
        Summary {
            produced: 0,
            completed: 0,
            dead_lettered: dlq,
            attempts: 0,
            failed_attempts: 0,
            goodput: None,
            failure_rate: None,
            failure_rate_peak: None,
            max_age,
            p99_wait: 0.0,
            drain: None,
            peak_load_after_recovery: None,
            replica_hours: 0.0,
            max_replicas: 0,
            added_during_incident: 0,
            held_secs: held,
            held_fraction_incident: Some(held / 100.0),
            throttled_fraction: 0.0,
            max_backoff: 0.0,
            ramp_stages: 0,
            ramp_aborts: 0,
        }
    }

    #[test]
    fn every_policy_is_measured_like_ours_except_our_operator_states() {
        let run = SeedRun {
            scenario: file("1-intermittent-outage.yaml"),
            summaries: vec![
                (GREEDY_KEDA, summary(1200, 400.0, 0.0)),
                (BP_STATIC, summary(0, 800.0, 0.0)),
                (BP_OURS, summary(9, 100.0, 50.0)),
            ],
        };
        let dlq = target(TargetMetric::Dlq, Some(1.0), None);
        assert_eq!(report::policy_value(&run, &dlq, GREEDY_KEDA), Some(1200.0));
        assert_eq!(report::policy_value(&run, &dlq, BP_STATIC), Some(0.0));
        assert_eq!(
            report::policy_value(&run, &dlq, BP_KEDA),
            None,
            "did not run"
        );
        assert_eq!(
            report::policy_value(&run, &dlq, BP_OURS),
            report::target_value(&run, &dlq)
        );
        // The relative target: each policy's age over greedy + KEDA-like's.
        let age = target(TargetMetric::MaxAgeVsKeda, Some(1.1), None);
        assert_eq!(report::policy_value(&run, &age, BP_STATIC), Some(2.0));
        assert_eq!(report::policy_value(&run, &age, GREEDY_KEDA), Some(1.0));
        assert_eq!(report::target_value(&run, &age), Some(0.25));
        // Held and ramp stages exist only under our operator.
        for m in [
            TargetMetric::HeldSeconds,
            TargetMetric::HeldFractionOfIncident,
            TargetMetric::RampStages,
        ] {
            let t = target(m, None, Some(0.0));
            assert!(report::policy_value(&run, &t, BP_OURS).is_some());
            assert_eq!(report::policy_value(&run, &t, BP_STATIC), None);
            assert_eq!(report::policy_value(&run, &t, GREEDY_KEDA), None);
        }
    }

    #[test]
    fn direction_comes_from_the_bound() {
        assert_eq!(
            better(&target(TargetMetric::Dlq, Some(1.0), None)),
            Some(Better::Lower)
        );
        assert_eq!(
            better(&target(TargetMetric::Goodput, None, Some(0.95))),
            Some(Better::Higher)
        );
        assert_eq!(
            better(&target(TargetMetric::Goodput, Some(1.0), Some(0.9))),
            None
        );
        assert_eq!(better(&target(TargetMetric::Goodput, None, None)), None);
    }

    #[test]
    fn head_to_head_counts_seeds_at_least_as_good() {
        let ours = [
            (1, Some(1.0)),
            (2, Some(5.0)),
            (3, Some(2.0)),
            (4, Some(0.0)),
        ];
        let other = [
            (1, Some(3.0)),
            (2, Some(4.0)),
            (3, Some(2.0)),
            (4, Some(9.0)),
        ];
        // Lower is better: 1 < 3, 5 > 4, 2 = 2, 0 < 9.
        assert_eq!(
            head_to_head(Better::Lower, &ours, &other),
            HeadToHead {
                compared: 4,
                at_least_as_good: 3,
                ties: 1,
                not_comparable: 0
            }
        );
        // Higher is better: only 5 > 4 and the tie.
        assert_eq!(
            head_to_head(Better::Higher, &ours, &other),
            HeadToHead {
                compared: 4,
                at_least_as_good: 2,
                ties: 1,
                not_comparable: 0
            }
        );
        // Against itself: every seed a tie, whichever the direction.
        for d in [Better::Lower, Better::Higher] {
            let h = head_to_head(d, &ours, &ours);
            assert_eq!((h.compared, h.at_least_as_good, h.ties), (4, 4, 4));
        }
        // Within 1e-12 is a tie, beyond is not.
        let h = head_to_head(Better::Higher, &[(1, Some(1.0))], &[(1, Some(1.0 + 1e-13))]);
        assert_eq!((h.at_least_as_good, h.ties), (1, 1));
        let h = head_to_head(Better::Higher, &[(1, Some(1.0))], &[(1, Some(1.0 + 1e-9))]);
        assert_eq!((h.at_least_as_good, h.ties), (0, 0));
    }

    #[test]
    fn head_to_head_leaves_missing_values_out() {
        // Ours missing on seed 2, the other on seed 3, the other lacks seed 4 altogether; the
        // other's extra seed 9 is not one of ours.
        let ours = [(1, Some(1.0)), (2, None), (3, Some(2.0)), (4, Some(0.0))];
        let other = [(1, Some(3.0)), (2, Some(0.0)), (3, None), (9, Some(100.0))];
        assert_eq!(
            head_to_head(Better::Lower, &ours, &other),
            HeadToHead {
                compared: 1,
                at_least_as_good: 1,
                ties: 0,
                not_comparable: 3
            }
        );
        assert_eq!(
            head_to_head(Better::Higher, &ours, &other),
            HeadToHead {
                compared: 1,
                at_least_as_good: 0,
                ties: 0,
                not_comparable: 3
            }
        );
        assert_eq!(
            head_to_head(Better::Lower, &[], &other),
            HeadToHead {
                compared: 0,
                at_least_as_good: 0,
                ties: 0,
                not_comparable: 0
            }
        );
    }

    #[test]
    fn comparator_medians_are_ordered_best_first() {
        let values = |m: f64| vec![(1, Some(m)), (2, Some(m)), (3, None)];
        let mut t = TargetSweep {
            target: target(TargetMetric::Goodput, None, Some(0.95)),
            values: values(0.9),
            by_policy: vec![
                (GREEDY_KEDA, values(0.5)),
                (BP_STATIC, values(0.99)),
                (BP_KEDA, vec![(1, None), (2, None)]),
                (BP_OURS, values(0.9)),
            ],
        };
        // Higher is better; ours and the policy without a median are left out.
        assert_eq!(
            comparator_medians(&t),
            [(BP_STATIC, 0.99), (GREEDY_KEDA, 0.5)]
        );
        t.target = target(TargetMetric::Goodput, Some(0.95), None);
        assert_eq!(
            comparator_medians(&t),
            [(GREEDY_KEDA, 0.5), (BP_STATIC, 0.99)]
        );
    }

    #[test]
    fn a_short_sweep_is_deterministic_whatever_the_threads() {
        // Scenario 3 compressed to 9 minutes: two policies per seed (ours and the comparator).
        let s = file("3-producer-surge.yaml").compressed(0.05);
        let one = run(std::slice::from_ref(&s), 2, 1).unwrap();
        let two = run(std::slice::from_ref(&s), 2, 2).unwrap();
        assert_eq!(one, two);
        assert_eq!(one.runs, 8);
        let t = &one.scenarios[0].targets[0];
        assert_eq!(t.values.len(), 2);
        // Every policy measured with the same metric; ours is the target's value, and the
        // comparator of the relative target is 1x against itself.
        let by: Vec<Policy> = t.by_policy.iter().map(|(p, _)| *p).collect();
        assert_eq!(by, POLICIES);
        assert_eq!(t.by_policy[3].1, t.values);
        assert!(
            t.by_policy[0]
                .1
                .iter()
                .all(|(_, v)| v.is_some_and(|x| (x - 1.0).abs() < 1e-12)),
            "{t:?}"
        );
        assert!(t.values.iter().all(|(_, v)| v.is_some()), "{t:?}");
        assert_ne!(t.values[0].1, t.values[1].1, "two seeds, the same value");
        assert!(matches!(run(&[s], 0, 1), Err(SweepError::NoSeeds)));
    }
}
