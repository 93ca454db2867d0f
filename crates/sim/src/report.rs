//! Running the benchmark (every scenario under every policy) and writing the Markdown report.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::engine::{RunOutput, SimError, Simulation};
use crate::metrics::{Summary, summarize};
use crate::policy::{
    self, BP_KEDA, BP_OURS, BP_OURS_UNGATED, BP_STATIC, GREEDY_KEDA, POLICIES, Policy, Scaler,
};
use crate::scenario::{Scenario, Target, TargetMetric, Timeline};

/// One run and its summary.
#[derive(Debug, Clone)]
pub struct Run {
    /// What the run produced.
    pub output: RunOutput,
    /// Its summary.
    pub summary: Summary,
}

/// A scenario with its runs, in [`policy::for_scenario`] order.
#[derive(Debug, Clone)]
pub struct ScenarioResult {
    /// The scenario.
    pub scenario: Scenario,
    /// Runs in [`policy::for_scenario`] order.
    pub runs: Vec<Run>,
    /// With a `producers` section and [`add_seeds`]: the summaries of [`SEED_POLICIES`] on
    /// each seed (the file's seed and the next ones); empty otherwise.
    pub seeds: Vec<(Policy, Vec<Summary>)>,
}

/// The policies run over seeds on a scenario with a `producers` section: ours without producer
/// control, with the file's section, and in mode `Throttle`.
pub const SEED_POLICIES: [Policy; 3] = [BP_OURS_UNGATED, BP_OURS, policy::BP_OURS_THROTTLE];

/// Runs [`SEED_POLICIES`] on `seeds` seeds of every scenario of `results` that has a
/// `producers` section (seed `k` is the file's seed plus `k`, as in the sweep) and keeps their
/// summaries in [`ScenarioResult::seeds`]. Returns the number of runs.
pub fn add_seeds(
    results: &mut [ScenarioResult],
    seeds: usize,
    jobs: usize,
) -> Result<usize, SimError> {
    let work: Vec<(usize, Scenario, Policy)> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.scenario.producers.is_some())
        .flat_map(|(i, r)| {
            crate::sweep::seeded(&r.scenario, seeds)
                .into_iter()
                .flat_map(move |s| SEED_POLICIES.into_iter().map(move |p| (i, s.clone(), p)))
        })
        .collect();
    let done = par_map(&work, jobs, |(_, s, p)| {
        let sim = Simulation::new(s, *p);
        sim.run().map(|out| summarize(s, sim.timeline(), &out))
    });
    for ((i, _, p), summary) in work.iter().zip(done) {
        let summary = summary.ok_or_else(|| {
            SimError::Resolve("a run did not finish (worker thread panicked)".into())
        })??;
        let seeds = &mut results[*i].seeds;
        match seeds.iter_mut().find(|(q, _)| q == p) {
            Some((_, v)) => v.push(summary),
            None => seeds.push((*p, vec![summary])),
        }
    }
    Ok(work.len())
}

/// The summaries a target is evaluated on: a scenario and the runs of some policies on it.
/// [`ScenarioResult`] and the seed sweep (`crate::sweep`) have every policy; a target's value
/// needs only [`target_policies`].
pub trait PolicyRuns {
    /// The scenario that was run.
    fn scenario(&self) -> &Scenario;
    /// The summary of `policy`'s run, if it ran.
    fn summary(&self, policy: Policy) -> Option<&Summary>;
}

impl PolicyRuns for ScenarioResult {
    fn scenario(&self) -> &Scenario {
        &self.scenario
    }
    fn summary(&self, policy: Policy) -> Option<&Summary> {
        self.runs
            .iter()
            .find(|r| r.output.policy == policy)
            .map(|r| &r.summary)
    }
}

/// Maps `f` over `items` on `jobs` threads that take the next item as they finish one. The
/// result is in `items` order, whatever `jobs` is; `None` where `f` did not return.
pub(crate) fn par_map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<Option<R>> {
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(items.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let result = f(item);
                    if let Ok(mut v) = slots.lock() {
                        v[i] = Some(result);
                    }
                }
            });
        }
    });
    slots.into_inner().unwrap_or_default()
}

/// Runs every scenario under every policy of [`policy::for_scenario`] on `jobs` threads.
/// Results do not depend on `jobs`: each run is independent and deterministic.
pub fn run_all(scenarios: &[Scenario], jobs: usize) -> Result<Vec<ScenarioResult>, SimError> {
    let plan: Vec<Vec<Policy>> = scenarios.iter().map(policy::for_scenario).collect();
    let work: Vec<(usize, Policy)> = plan
        .iter()
        .enumerate()
        .flat_map(|(s, ps)| ps.iter().map(move |p| (s, *p)))
        .collect();
    let slots = par_map(&work, jobs, |&(s, p)| {
        let scenario = &scenarios[s];
        let sim = Simulation::new(scenario, p);
        sim.run().map(|output| {
            let summary = summarize(scenario, sim.timeline(), &output);
            tracing::info!(
                scenario = %scenario.name,
                policy = p.key,
                dlq = summary.dead_lettered,
                "run done"
            );
            Run { output, summary }
        })
    });
    let mut runs = slots.into_iter();
    let mut out = Vec::new();
    for (scenario, policies) in scenarios.iter().zip(&plan) {
        let mut v = Vec::new();
        for _ in policies {
            match runs.next().flatten() {
                Some(r) => v.push(r?),
                None => {
                    return Err(SimError::Resolve(
                        "a run did not finish (worker thread panicked)".into(),
                    ));
                }
            }
        }
        out.push(ScenarioResult {
            scenario: scenario.clone(),
            runs: v,
            seeds: Vec::new(),
        });
    }
    Ok(out)
}

/// How the report was produced (the only non-deterministic numbers in it).
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    /// The command line.
    pub command: String,
    /// Wall-clock seconds for all runs.
    pub wall_secs: f64,
    /// Threads used.
    pub jobs: usize,
    /// Whether timelines were compressed (`--quick`).
    pub compressed: Option<f64>,
    /// Runs over seeds for the producer-control tables ([`add_seeds`]) and their wall-clock
    /// seconds (not in `wall_secs`).
    pub seed_runs: Option<(usize, f64)>,
}

fn pct(x: f64) -> String {
    if x == 0.0 {
        "0 %".into()
    } else if x.abs() < 0.001 {
        format!("{:.3} %", 100.0 * x)
    } else {
        format!("{:.1} %", 100.0 * x)
    }
}

pub(crate) fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn secs(x: f64) -> String {
    if x >= 3600.0 {
        format!("{:.2} h", x / 3600.0)
    } else if x >= 60.0 {
        format!("{:.1} min", x / 60.0)
    } else {
        format!("{x:.1} s")
    }
}

pub(crate) fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "—".to_owned(), f)
}

/// The policies whose runs a target's value depends on: ours, and the policy it is compared
/// with for relative targets.
pub fn target_policies(metric: TargetMetric) -> &'static [Policy] {
    match metric {
        TargetMetric::MaxAgeVsKeda | TargetMetric::DlqPerFailedAttemptVsGreedy => {
            &[BP_OURS, GREEDY_KEDA]
        }
        TargetMetric::CompletedVsBacklogOnly => &[BP_OURS, BP_KEDA],
        TargetMetric::DlqVsStatic => &[BP_OURS, BP_STATIC],
        _ => &[BP_OURS],
    }
}

/// The policy a target is about: its `policy` key, ours by default (the scenario's validation
/// refuses unknown keys).
pub fn target_policy(target: &Target) -> Policy {
    target
        .policy
        .as_deref()
        .and_then(policy::by_key)
        .unwrap_or(BP_OURS)
}

/// How a target is named in tables: its text, or its metric; with the policy's name when it
/// is not about ours.
pub fn target_label(target: &Target) -> String {
    let label = if target.text.is_empty() {
        format!("{:?}", target.metric)
    } else {
        target.text.clone()
    };
    match target_policy(target) {
        BP_OURS => label,
        p => format!("{label} ({})", p.name),
    }
}

/// Whether a target's metric means something for `policy`'s run. The regime of our operator
/// (scale-out held, ramp stages) exists only under ours; every other metric is measured the
/// same way for every policy.
pub fn metric_defined(metric: TargetMetric, policy: Policy) -> bool {
    match metric {
        TargetMetric::HeldSeconds
        | TargetMetric::HeldFractionOfIncident
        | TargetMetric::HeldSecondsPerHour
        | TargetMetric::HeldAfterRecovery
        | TargetMetric::HeldWithHeadroomPerHour
        | TargetMetric::HeldWithHeadroomAfterRecovery
        | TargetMetric::RampStages => policy.scaler == Scaler::Ours,
        _ => true,
    }
}

/// The value of a target's metric for the policy it is about ([`target_policy`], ours by
/// default); `None` when it cannot be measured (for example no drain without a backlog, or a
/// needed run is missing).
pub fn target_value(result: &impl PolicyRuns, target: &Target) -> Option<f64> {
    policy_value(result, target, target_policy(target))
}

/// The value of a target's metric for `policy`'s run, measured as for ours
/// ([`target_value`]); `None` when it cannot be measured, when the run is missing or when the
/// metric is not defined for that policy ([`metric_defined`]).
pub fn policy_value(result: &impl PolicyRuns, target: &Target, policy: Policy) -> Option<f64> {
    if !metric_defined(target.metric, policy) {
        return None;
    }
    let run = result.summary(policy)?;
    let set_point = result.scenario().workers.set_point;
    match target.metric {
        TargetMetric::Dlq => Some(run.dead_lettered as f64),
        TargetMetric::DlqPerFailedAttempt => run.dlq_per_failed_attempt(),
        TargetMetric::Goodput => run.goodput,
        TargetMetric::FailureRateOverSetPoint => run.failure_rate.map(|f| f / set_point),
        TargetMetric::MaxAgeVsKeda => {
            let keda = result.summary(GREEDY_KEDA)?;
            (keda.max_age > 0.0).then(|| run.max_age / keda.max_age)
        }
        TargetMetric::ReplicasAddedDuringIncident => Some(f64::from(run.added_during_incident)),
        TargetMetric::PeakLoadAfterRecovery => run.peak_load_after_recovery,
        TargetMetric::DrainRatio => run.drain.and_then(|d| d.ratio()),
        TargetMetric::HeldSeconds => Some(run.held_secs),
        TargetMetric::ThrottledFraction => Some(run.throttled_fraction),
        TargetMetric::HeldFractionOfIncident => run.held_fraction_incident,
        TargetMetric::RampStages => Some(f64::from(run.ramp_stages)),
        TargetMetric::OverloadRateOverSetPoint => run.overload_rate.map(|f| f / set_point),
        TargetMetric::HeldSecondsPerHour => Some(run.held_per_hour),
        TargetMetric::HeldAfterRecovery => run.held_after_recovery,
        TargetMetric::HeldWithHeadroomPerHour => Some(run.held_with_headroom_per_hour),
        TargetMetric::HeldWithHeadroomAfterRecovery => run.held_with_headroom_after_recovery,
        TargetMetric::CompletedVsBacklogOnly => {
            let other = result.summary(BP_KEDA)?;
            (other.completed > 0).then(|| run.completed as f64 / other.completed as f64)
        }
        TargetMetric::DlqPerFailedAttemptVsGreedy => {
            let greedy = result.summary(GREEDY_KEDA)?;
            let (ours, theirs) = (
                run.dlq_per_failed_attempt().unwrap_or(0.0),
                greedy.dlq_per_failed_attempt().unwrap_or(0.0),
            );
            if ours == 0.0 {
                Some(0.0)
            } else {
                (theirs > 0.0).then(|| ours / theirs)
            }
        }
        TargetMetric::DlqVsStatic => {
            let stat = result.summary(BP_STATIC)?;
            Some(run.dead_lettered as f64 - stat.dead_lettered as f64)
        }
        TargetMetric::PeakQueueDepth => Some(run.peak_depth as f64),
        TargetMetric::BrokerRejected => Some(run.broker_rejected as f64),
        TargetMetric::LostToBroker => Some(run.lost_to_broker as f64),
        TargetMetric::PeakProducerBacklog => Some(run.peak_producer_backlog as f64),
        TargetMetric::PeakReplicas => Some(f64::from(run.max_replicas)),
        TargetMetric::MaxEndToEndAge => Some(run.max_end_to_end),
        TargetMetric::P99EndToEndAge => Some(run.p99_end_to_end),
        TargetMetric::SystemDrainRatio => run.system_drain.and_then(|d| d.ratio()),
    }
}

/// The numbers behind a target's value, in words.
pub fn target_detail(result: &impl PolicyRuns, target: &Target) -> String {
    let about = target_policy(target);
    let Some(ours) = result.summary(about) else {
        return format!("no run of {}", about.name);
    };
    match target.metric {
        TargetMetric::Dlq => format!("{} messages in the DLQ", count(ours.dead_lettered)),
        TargetMetric::DlqPerFailedAttempt => format!(
            "{} DLQ messages / {} failed attempts",
            count(ours.dead_lettered),
            count(ours.failed_attempts)
        ),
        TargetMetric::Goodput => "completed / what the dependency could serve in the window".into(),
        TargetMetric::FailureRateOverSetPoint => format!(
            "{} failed calls in the incident window vs set point {}",
            opt(ours.failure_rate, pct),
            pct(result.scenario().workers.set_point)
        ),
        TargetMetric::MaxAgeVsKeda => match result.summary(GREEDY_KEDA) {
            Some(keda) => format!(
                "max first-attempt age {} vs {} for {}",
                secs(ours.max_age),
                secs(keda.max_age),
                GREEDY_KEDA.name
            ),
            None => format!("no run of {}", GREEDY_KEDA.name),
        },
        TargetMetric::ReplicasAddedDuringIncident | TargetMetric::PeakReplicas => format!(
            "replicas {}..{} over the run",
            result.scenario().fleet.replicas,
            ours.max_replicas
        ),
        TargetMetric::PeakLoadAfterRecovery => {
            "highest 30 s calls/capacity in the 10 min after recovery".into()
        }
        TargetMetric::DrainRatio => match ours.drain {
            Some(d) => format!(
                "{} vs {} for a backlog of {}",
                opt(d.secs, secs),
                secs(d.min_secs),
                count(d.backlog.max(0.0) as u64)
            ),
            None => "no backlog at recovery".into(),
        },
        TargetMetric::HeldSeconds => "time in DependencyFailing".into(),
        TargetMetric::ThrottledFraction => format!(
            "ready pod-time with fewer permits than the maximum; max fleet backoff {:.2}",
            ours.max_backoff
        ),
        TargetMetric::HeldFractionOfIncident => {
            format!("{} held in total", secs(ours.held_secs))
        }
        TargetMetric::RampStages => {
            format!("ramp stages after recovery ({} aborted)", ours.ramp_aborts)
        }
        TargetMetric::OverloadRateOverSetPoint => format!(
            "{} of calls rejected for overload vs set point {}",
            opt(ours.overload_rate, pct),
            pct(result.scenario().workers.set_point)
        ),
        TargetMetric::HeldSecondsPerHour => {
            format!("{} held in total", secs(ours.held_secs))
        }
        TargetMetric::HeldAfterRecovery => "time in DependencyFailing after the incident".into(),
        TargetMetric::HeldWithHeadroomPerHour => format!(
            "held while the dependency had headroom (calls < 90 % of capacity, no outage); {} \
             held in total",
            secs(ours.held_secs)
        ),
        TargetMetric::HeldWithHeadroomAfterRecovery => format!(
            "held after the incident while the dependency had headroom; {} held after it in all",
            opt(ours.held_after_recovery, secs)
        ),
        TargetMetric::CompletedVsBacklogOnly => match result.summary(BP_KEDA) {
            Some(other) => format!(
                "{} completed vs {} for {}",
                count(ours.completed),
                count(other.completed),
                BP_KEDA.name
            ),
            None => format!("no run of {}", BP_KEDA.name),
        },
        TargetMetric::DlqPerFailedAttemptVsGreedy => match result.summary(GREEDY_KEDA) {
            Some(g) => format!(
                "{} DLQ / {} failed attempts vs {} / {} for {}",
                count(ours.dead_lettered),
                count(ours.failed_attempts),
                count(g.dead_lettered),
                count(g.failed_attempts),
                GREEDY_KEDA.name
            ),
            None => format!("no run of {}", GREEDY_KEDA.name),
        },
        TargetMetric::DlqVsStatic => match result.summary(BP_STATIC) {
            Some(st) => format!(
                "{} DLQ messages vs {} for {}",
                count(ours.dead_lettered),
                count(st.dead_lettered),
                BP_STATIC.name
            ),
            None => format!("no run of {}", BP_STATIC.name),
        },
        TargetMetric::PeakQueueDepth => format!(
            "broker capacity {}; {} publishes rejected",
            opt(result.scenario().queue.capacity, count),
            count(ours.broker_rejected)
        ),
        TargetMetric::BrokerRejected | TargetMetric::LostToBroker => format!(
            "{} rejected, {} lost, of {} demanded; peak depth {}",
            count(ours.broker_rejected),
            count(ours.lost_to_broker),
            count(ours.demanded),
            count(ours.peak_depth)
        ),
        TargetMetric::PeakProducerBacklog => {
            format!("{} not Open", opt(ours.restricted_secs, secs))
        }
        TargetMetric::MaxEndToEndAge | TargetMetric::P99EndToEndAge => format!(
            "demand to completion: max {}, p99 {}",
            secs(ours.max_end_to_end),
            secs(ours.p99_end_to_end)
        ),
        TargetMetric::SystemDrainRatio => format!(
            "{}; {} lost to the broker",
            drain_detail(ours.system_drain),
            count(ours.lost_to_broker)
        ),
    }
}

fn drain_detail(d: Option<crate::metrics::Drain>) -> String {
    match d {
        Some(d) => format!(
            "{} (min {}) for a backlog of {}",
            opt(d.secs, secs),
            secs(d.min_secs),
            count(d.backlog.max(0.0) as u64)
        ),
        None => "no backlog at recovery".into(),
    }
}

/// Whether a value meets a target.
pub fn target_met(target: &Target, value: Option<f64>) -> bool {
    value.is_some_and(|v| {
        target.max.is_none_or(|m| v <= m + 1e-12) && target.min.is_none_or(|m| v >= m - 1e-12)
    })
}

/// A target's value as the tables show it.
pub fn fmt_target_value(metric: TargetMetric, v: f64) -> String {
    fmt_target_value_digits(metric, v, 2)
}

/// A target's value with `ratio_digits` decimals for ratios (`1.10x`): the sweep shows three,
/// so that a value just above a bound does not print as the bound.
pub fn fmt_target_value_digits(metric: TargetMetric, v: f64, ratio_digits: usize) -> String {
    match metric {
        TargetMetric::Dlq
        | TargetMetric::DlqVsStatic
        | TargetMetric::ReplicasAddedDuringIncident
        | TargetMetric::PeakReplicas
        | TargetMetric::RampStages => {
            format!("{v:.0}")
        }
        TargetMetric::PeakQueueDepth
        | TargetMetric::BrokerRejected
        | TargetMetric::LostToBroker
        | TargetMetric::PeakProducerBacklog => count(v.max(0.0).round() as u64),
        TargetMetric::DlqPerFailedAttempt => {
            if v == 0.0 {
                "0".into()
            } else {
                format!("1 in {:.0}", 1.0 / v)
            }
        }
        TargetMetric::Goodput
        | TargetMetric::ThrottledFraction
        | TargetMetric::HeldFractionOfIncident => pct(v),
        TargetMetric::HeldSeconds
        | TargetMetric::HeldSecondsPerHour
        | TargetMetric::HeldAfterRecovery
        | TargetMetric::HeldWithHeadroomPerHour
        | TargetMetric::HeldWithHeadroomAfterRecovery
        | TargetMetric::MaxEndToEndAge
        | TargetMetric::P99EndToEndAge => secs(v),
        TargetMetric::FailureRateOverSetPoint
        | TargetMetric::OverloadRateOverSetPoint
        | TargetMetric::CompletedVsBacklogOnly
        | TargetMetric::DlqPerFailedAttemptVsGreedy
        | TargetMetric::MaxAgeVsKeda
        | TargetMetric::PeakLoadAfterRecovery
        | TargetMetric::DrainRatio
        | TargetMetric::SystemDrainRatio => format!("{v:.ratio_digits$}x"),
    }
}

/// Writes the Markdown report; the plot of scenario `name` is expected next to it as
/// `name.svg`.
pub fn markdown(results: &[ScenarioResult], prov: &Provenance) -> String {
    let mut md = String::new();
    let events: u64 = results
        .iter()
        .flat_map(|r| r.runs.iter().map(|x| x.output.events))
        .sum();
    let sim_secs: f64 = results
        .iter()
        .map(|r| r.scenario.duration.secs() * r.runs.len() as f64)
        .sum();
    let _ = writeln!(md, "# Simulator benchmark: policies side by side\n");
    let _ = writeln!(
        md,
        "Generated by `{}` from the scenario files in \
         [`crates/sim/scenarios/`](../../crates/sim/scenarios/). Every number below except the \
         timing line is a deterministic function of those files (each has its seed): rerunning \
         gives the same tables.\n",
        prov.command
    );
    if let Some(f) = prov.compressed {
        let _ = writeln!(
            md,
            "**Quick mode: every timeline is compressed by {f}; these are not the benchmark's numbers.**\n"
        );
    }
    let _ = writeln!(
        md,
        "**Speed:** {} runs ({}), {:.1} simulated hours, {} simulated \
         events in {:.1} s wall on {} thread(s): **{:.1} million events/s** ({:.0}× real time). \
         Events are message arrivals, deliveries, completions, pod starts and stops, and \
         autoscaler decisions.{}\n",
        results.iter().map(|r| r.runs.len()).sum::<usize>(),
        shape(results),
        sim_secs / 3600.0,
        count(events),
        prov.wall_secs,
        prov.jobs,
        events as f64 / prov.wall_secs.max(1e-9) / 1e6,
        sim_secs / prov.wall_secs.max(1e-9),
        prov.seed_runs.map_or(String::new(), |(n, wall)| format!(
            " The producer-control tables over seeds: {n} more runs in {wall:.1} s."
        )),
    );
    md.push_str(MODEL_TEXT);

    // Targets first: that is what a reader wants to know.
    let _ = writeln!(md, "## Targets for our policy (backpressure + ours)\n");
    let _ = writeln!(md, "| scenario | target | measured | met | detail |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    let (mut met_n, mut all_n) = (0, 0);
    for r in results {
        for t in &r.scenario.targets {
            let v = target_value(r, t);
            let met = target_met(t, v);
            all_n += 1;
            met_n += usize::from(met);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                r.scenario.title,
                target_label(t),
                opt(v, |x| fmt_target_value(t.metric, x)),
                if met { "met" } else { "**gap**" },
                target_detail(r, t)
            );
        }
    }
    let _ = writeln!(md, "\n{met_n} of {all_n} targets met.\n");
    if prov.compressed.is_none() {
        let _ = writeln!(
            md,
            "These are one seed per scenario; [`sweep.md`](sweep.md) measures the same targets \
             over a range of seeds (`cargo run -p backpressure-sim --release -- sweep`).\n"
        );
    }

    for r in results {
        let s = &r.scenario;
        let _ = writeln!(md, "## {}\n", s.title);
        let _ = writeln!(md, "{}\n", s.description.trim());
        let tl = Timeline::new(s);
        let incident = s.incident.map_or("none".to_owned(), |w| {
            format!("{} – {}", secs(w.start.secs()), secs(w.end.secs()))
        });
        let _ = writeln!(
            md,
            "Scenario file `{}` (seed {}): {} simulated in {} ms ticks. Fleet {}..{} pods \
             (starting at {}, {} s startup), {} permits per pod, set point {}. Producer {} msg/s \
             at the start; dependency {} req/s, {} background failures, calls {} ms (success) / \
             {} ms (failure) plus {} ms of local work; redelivery {}, DLQ after {} \
             deliveries; new pods start with {} permits. Incident window {}; {} failure \
             episodes.\n",
            s.source.as_deref().unwrap_or(&s.name),
            s.seed,
            secs(s.duration.secs()),
            (s.tick.secs() * 1000.0).round(),
            s.fleet.min_replicas,
            s.fleet.max_replicas,
            s.fleet.replicas,
            s.fleet.startup_delay.secs(),
            s.workers.max_permits,
            pct(s.workers.set_point),
            s.producer.rate,
            s.dependency.capacity,
            pct(s.dependency.noise),
            (s.dependency.latency.mean.secs() * 1000.0).round(),
            (s.dependency.failure_latency.mean.secs() * 1000.0).round(),
            (s.workers.processing.mean.secs() * 1000.0).round(),
            match s.workers.redelivery_backoff {
                Some(b) => format!(
                    "{} s × 2^(k−1) after the k-th failure, at most {} s (the workers' \
                     redelivery backoff)",
                    b.base.secs(),
                    b.max.secs()
                ),
                None => format!("{} s after a failure", s.queue.visibility_timeout.secs()),
            },
            s.queue.max_receives,
            if s.workers.initial_permits == 0 {
                format!("{} (no startup ramp)", s.workers.max_permits)
            } else {
                format!("{} (startup ramp)", s.workers.initial_permits)
            },
            incident,
            tl.episodes().len()
        );
        let _ = writeln!(md, "![{}]({}.svg)\n", s.title, s.name);
        let _ = writeln!(
            md,
            "| policy | completed | goodput | failed attempts | DLQ | DLQ per failed attempt | \
             failure rate (peak 5 min) vs set point {} | max first-attempt age | p99 first-attempt wait | \
             drain after recovery / theoretical min | peak load / capacity, 10 min after recovery | replica-hours |",
            pct(s.workers.set_point)
        );
        let _ = writeln!(
            md,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for run in &r.runs {
            let m = &run.summary;
            let drain = match m.drain {
                None => "no backlog".to_owned(),
                Some(d) => match d.secs {
                    Some(x) => format!(
                        "{} / {} ({:.2}x)",
                        secs(x),
                        secs(d.min_secs),
                        d.ratio().unwrap_or(f64::NAN)
                    ),
                    None => format!("not drained / {}", secs(d.min_secs)),
                },
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {:.1} |",
                run.output.policy.name,
                count(m.completed),
                opt(m.goodput, pct),
                count(m.failed_attempts),
                count(m.dead_lettered),
                opt(m.dlq_per_failed_attempt(), |v| if v == 0.0 {
                    "0".into()
                } else {
                    format!("1 in {:.0}", 1.0 / v)
                }),
                opt(m.failure_rate, pct),
                opt(m.failure_rate_peak, pct),
                secs(m.max_age),
                secs(m.p99_wait),
                drain,
                opt(m.peak_load_after_recovery, |v| format!("{v:.2}x")),
                m.replica_hours
            );
        }
        let _ = writeln!(md);
        let _ = writeln!(
            md,
            "| policy | max replicas | replicas added during incident | scale-out held | ramp stages after recovery (aborts) | throttled pod-time | max fleet backoff |"
        );
        let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
        for run in &r.runs {
            let m = &run.summary;
            let regimes = run.output.policy.scaler == Scaler::Ours;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {:.2} |",
                run.output.policy.name,
                m.max_replicas,
                if s.incident.is_some() {
                    m.added_during_incident.to_string()
                } else {
                    "—".into()
                },
                if regimes {
                    format!(
                        "{}{}",
                        secs(m.held_secs),
                        m.held_fraction_incident
                            .map(|f| format!(" ({} of incident)", pct(f)))
                            .unwrap_or_default()
                    )
                } else {
                    "—".into()
                },
                if regimes {
                    format!("{} ({})", m.ramp_stages, m.ramp_aborts)
                } else {
                    "—".into()
                },
                pct(m.throttled_fraction),
                m.max_backoff
            );
        }
        let _ = writeln!(md);
        if s.producers.is_some() || s.queue.capacity.is_some() {
            producer_tables(&mut md, r);
        }
        let demanded = r.runs.first().map_or(0, |x| x.output.demanded);
        let _ = writeln!(
            md,
            "Messages {}: {} (the same arrivals for every policy).\n",
            if s.queue.capacity.is_some() || s.producers.is_some() {
                "demanded by the producers"
            } else {
                "produced"
            },
            count(demanded)
        );
    }
    md
}

/// "11 scenarios × 5 policies", or with producer-control scenarios their variants too.
fn shape(results: &[ScenarioResult]) -> String {
    let more = results
        .iter()
        .filter(|r| r.runs.len() != POLICIES.len())
        .count();
    if more == 0 {
        format!("{} scenarios × {} policies", results.len(), POLICIES.len())
    } else {
        format!(
            "{} scenarios × {} policies, and {} more variants of ours on {} with producer control",
            results.len(),
            POLICIES.len(),
            crate::policy::PRODUCER_VARIANTS.len(),
            more
        )
    }
}

/// How a run controlled its producers, in words.
fn control_words(s: &Scenario, p: Policy) -> String {
    match p.producers_for(s) {
        None => "none".into(),
        Some(section) => format!("{:?}", section.mode),
    }
}

fn drain_cell(d: Option<crate::metrics::Drain>) -> String {
    match d {
        None => "no backlog".to_owned(),
        Some(d) => match d.secs {
            Some(x) => format!(
                "{} / {} ({:.2}x)",
                secs(x),
                secs(d.min_secs),
                d.ratio().unwrap_or(f64::NAN)
            ),
            None => format!("not drained / {}", secs(d.min_secs)),
        },
    }
}

/// The broker and producer tables of a scenario with a bounded broker or producer control: the
/// report's seed, every policy; then, with [`ScenarioResult::seeds`], the variants of ours over
/// the seeds.
fn producer_tables(md: &mut String, r: &ScenarioResult) {
    let s = &r.scenario;
    let _ = writeln!(
        md,
        "Broker and producers (broker capacity {} messages stored{}):\n",
        opt(s.queue.capacity, count),
        match &s.producers {
            Some(p) => format!(
                "; producer control for ours: mode {:?}{}{}, pause dwell {}, resume dwell {}",
                p.mode,
                p.queue_depth.map_or(String::new(), |d| format!(
                    ", depth watermarks pause above {} / resume below {}",
                    count(d.pause_above),
                    count(d.resume_below)
                )),
                p.queue_age.map_or(String::new(), |a| format!(
                    ", age watermarks pause above {} / resume below {}",
                    secs(a.pause_above.secs()),
                    secs(a.resume_below.secs())
                )),
                opt(p.pause_dwell, |d| secs(d.secs())),
                opt(p.resume_dwell, |d| secs(d.secs())),
            ),
            None => String::new(),
        }
    );
    let _ = writeln!(
        md,
        "| policy | producer control | peak queue depth | broker rejections (lost) | peak producer \
         backlog | end-to-end age max / p99 | drain of broker + producers / theoretical min | \
         producers not Open | producer state changes (restrictions) | last reopening after recovery |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in &r.runs {
        let m = &run.summary;
        let p = run.output.policy;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} ({}) | {} | {} / {} | {} | {} | {} | {} |",
            p.name,
            control_words(s, p),
            count(m.peak_depth),
            count(m.broker_rejected),
            count(m.lost_to_broker),
            count(m.peak_producer_backlog),
            secs(m.max_end_to_end),
            secs(m.p99_end_to_end),
            drain_cell(m.system_drain),
            opt(m.restricted_secs, secs),
            if run.output.producer_control {
                format!("{} ({})", m.producer_changes, m.restrictions)
            } else {
                "—".into()
            },
            opt(m.reopened_after, secs),
        );
    }
    let _ = writeln!(md);
    let Some(n) = r.seeds.first().map(|(_, v)| v.len()) else {
        return;
    };
    let _ = writeln!(
        md,
        "Over {n} seeds ({} to {}: the file's seed and the next {}; every random stream moves, \
         the outage does not), the variants of ours. Each cell: median (worst); counts are of \
         seeds.\n",
        s.seed,
        s.seed + n as u64 - 1,
        n - 1
    );
    let bound = s
        .targets
        .iter()
        .find(|t| t.metric == TargetMetric::PeakQueueDepth)
        .and_then(|t| t.max);
    let _ = writeln!(
        md,
        "| policy | producer control | peak queue depth{} | broker rejections: median (max), seeds \
         with any | lost to the broker | peak producer backlog | end-to-end age max | end-to-end \
         age p99 | drain of broker + producers | drain / theoretical min | restrictions | DLQ |",
        bound.map_or(String::new(), |b| format!(", seeds <= {}", count(b as u64)))
    );
    let _ = writeln!(
        md,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (p, v) in &r.seeds {
        let col = |f: &dyn Fn(&Summary) -> Option<f64>| -> (Option<f64>, Option<f64>) {
            let mut x: Vec<f64> = v.iter().filter_map(f).collect();
            x.sort_by(f64::total_cmp);
            (median(&x), x.last().copied())
        };
        let cnt = |x: (Option<f64>, Option<f64>)| {
            format!(
                "{} ({})",
                opt(x.0, |m| count(m.round() as u64)),
                opt(x.1, |m| count(m.round() as u64))
            )
        };
        let dur =
            |x: (Option<f64>, Option<f64>)| format!("{} ({})", opt(x.0, secs), opt(x.1, secs));
        let peak = col(&|m| Some(m.peak_depth as f64));
        let within = bound.map_or(String::new(), |b| {
            format!(
                ", {} of {n}",
                v.iter().filter(|m| m.peak_depth as f64 <= b).count()
            )
        });
        let rejected = col(&|m| Some(m.broker_rejected as f64));
        let drain = col(&|m| m.system_drain.and_then(|d| d.secs));
        let undrained = v
            .iter()
            .filter(|m| m.system_drain.is_some_and(|d| d.secs.is_none()))
            .count();
        let ratio = col(&|m| m.system_drain.and_then(|d| d.ratio()));
        let ratio = format!(
            "{} ({})",
            opt(ratio.0, |x| format!("{x:.2}x")),
            opt(ratio.1, |x| format!("{x:.2}x"))
        );
        let _ = writeln!(
            md,
            "| {} | {} | {}{} | {}, {} | {} | {} | {} | {} | {}{} | {ratio} | {} | {} |",
            p.name,
            control_words(s, *p),
            cnt(peak),
            within,
            cnt(rejected),
            v.iter().filter(|m| m.broker_rejected > 0).count(),
            cnt(col(&|m| Some(m.lost_to_broker as f64))),
            cnt(col(&|m| Some(m.peak_producer_backlog as f64))),
            dur(col(&|m| Some(m.max_end_to_end))),
            dur(col(&|m| Some(m.p99_end_to_end))),
            dur(drain),
            if undrained > 0 {
                format!(", not drained on {undrained}")
            } else {
                String::new()
            },
            cnt(col(&|m| Some(f64::from(m.restrictions)))),
            cnt(col(&|m| Some(m.dead_lettered as f64))),
        );
    }
    let _ = writeln!(md);
}

/// Median of sorted values (mean of the middle two for an even count).
fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

const MODEL_TEXT: &str = "\
## What is simulated

A fixed-step (100 ms) model with exact per-message delivery counts; see the module docs of \
`crates/sim/src/engine.rs` for the step and its error. Per scenario:

- **Producer**: Poisson arrivals at a rate that changes in steps and surges.
- **Producers and a bounded broker** (scenarios 12-14, issue 17): the arrivals are the \
  producers' demand. A broker with a capacity (`queue.capacity`: messages waiting plus \
  delivered and not yet acknowledged) rejects a publish that does not fit. Without producer \
  control the demand is published as it comes and what the broker rejects is lost. With it \
  (ours with the scenario's `producers` section, i.e. the operator's `spec.producers`), every \
  decision of ours also runs the core's `decide_producers` on the same scrape, and the \
  producers' gate follows at once: `Open` lets everything through, `Paused` nothing, \
  `Throttled`/`Resuming` at most the decided rate (a token bucket of one second). What the \
  gate or a full broker holds back waits at the producers, oldest first, and is never \
  dropped; its wait counts in the *end-to-end age* (demand to completion).
- **Queue**: at-least-once; a failed delivery becomes visible again after the delay the worker \
  sets (`ChangeMessageVisibility`: the worker library's redelivery backoff, growing with the \
  receive count; the visibility timeout without it); a message whose last allowed delivery \
  fails goes to the DLQ. Receives take \
  visible redeliveries first (oldest first), then new messages. *First-attempt age* is the age \
  of the oldest message not yet delivered once.
- **Workers**: pods that poll every tick with the permits their own controller grants (the real \
  `SetPoint` controller of `backpressure-worker` for backpressure workers, `Off` for greedy \
  ones; each pod has its own seeded instance), do some local work and one dependency call per \
  message, and start polling a startup delay after they are created. Pods added by an \
  autoscaler start their controller in its startup ramp (`initialPermits`, 2 permits growing \
  to the maximum over ~16 round trips); the initial replicas have been running before the \
  simulation starts.
- **Dependency**: a token bucket at the capacity (requests/s, 1 s burst) shared by the fleet: \
  calls above capacity fail; outages fail calls outright (hard: all; partial/spikes: a \
  fraction), capacity may come back linearly; background failures at a fixed rate; calls take \
  longer when they succeed than when they fail. The numbers are listed per scenario below.
- **Autoscalers**, every 15 s on metrics scraped every 15 s (rates over 60 s): \
  *static* (the initial replicas); *KEDA queue age (Value)*: a KEDA ScaledObject with a \
  Prometheus trigger on the first-attempt age, `metricType: Value`, threshold 60 s \
  (`ceil(ready pods × age / 60 s)`), and *KEDA lagCount*: a Redis Streams trigger on the \
  consumer group's lag (messages never delivered, read from the broker at each HPA sync), \
  `lagCount` per pod (`AverageValue`: `ceil(lag / lagCount)`, sized by Little's law as the lag \
  one pod clears in 60 s at full concurrency unless the scenario sets `fleet.targetLag`); both \
  through the Kubernetes HPA controller's algorithm ported from v1.35.4 with KEDA's defaults \
  (no `behavior`: tolerance 0.1, scale-up at most max(2 × current, 4) per sync, scale-down \
  to the highest recommendation of the last 5 min, `crates/sim/src/autoscaler/hpa/`); *ours*: the operator's real `decide` (`backpressure-core`, `crates/core/src/decide/`) with the \
  default `WorkerBackpressure` settings (hold above backoff 0.2 for 30 s, release below 0.05 for \
  60 s, ramp 25/50/75/100 % with 60 s dwell, abort above 0.2), fed back its own status and \
  called again after the `requeueAfter` it returns.

Columns: *goodput* = messages completed in the incident (or goodput) window / what the \
dependency could serve there (`min(Σ capacity × (1 − failure probability), work available)`); \
*failure rate* = failed calls / calls in the incident window (peak: highest 5-minute value); \
*max first-attempt age* = highest value of the oldest-message gauge; *p99 first-attempt wait* \
= 99th percentile over messages of the wait before the first delivery; *drain* = time from \
recovery (end of the incident) until the depth is back to its pre-incident level, against the \
theoretical minimum `backlog / spare capacity` (integrated over the returning capacity, at most \
maxReplicas × permits / service time); *peak load / capacity* = highest 30-second ratio of calls \
to capacity in the 10 minutes after recovery; *throttled pod-time* = share of ready pod-seconds \
with fewer permits than the maximum, not counting pods in their startup ramp (`Mode::Starting`: \
backoff 0, permits growing); *scale-out held* = time in the `DependencyFailing` regime. With a bounded broker or producer \
control: *peak queue depth* = the most messages waiting at any tick; *broker rejections* = \
publishes refused because the broker was full (*lost*: those nobody kept); *peak producer \
backlog* = the most messages held at the producers; *end-to-end age* = per completed message, \
demand to acknowledgement (max and p99); *drain of broker + producers* = from recovery until \
both the broker depth and the producer backlog are back to their pre-incident level, against \
the theoretical minimum for both backlogs together; *restrictions* = entries into `Paused` or \
`Throttled`.

";
