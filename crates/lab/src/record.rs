//! What a run recorded, and the end-to-end checks computed from it.

use backpressure_api::v1alpha1::Regime;
use serde::{Deserialize, Serialize};

use crate::producer::ProducerStats;
use crate::scenario::Scenario;

/// One sample of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Seconds since the scenario started.
    pub t: f64,
    /// The operator's regime (operator run) or `-`.
    pub regime: String,
    /// Replicas the Deployment asks for.
    pub replicas: i32,
    /// Ready pods.
    pub ready: i32,
    /// Mean backoff of the fleet (from Prometheus), if known.
    pub backoff: Option<f64>,
    /// Age in seconds of the oldest never-delivered message.
    pub queue_age: f64,
    /// Messages waiting (never delivered or waiting for a retry).
    pub queue_depth: u64,
    /// Messages produced so far.
    pub produced: u64,
    /// Messages acknowledged so far.
    pub completed: u64,
    /// Messages dead-lettered so far.
    pub dead_lettered: u64,
    /// Messages still in the stream.
    pub in_stream: u64,
    /// Requests per second the dependency received since the previous sample.
    pub dep_load: f64,
    /// Requests per second it served since the previous sample.
    pub dep_served: f64,
    /// Its scheduled capacity.
    pub dep_capacity: f64,
    /// Dependency calls that failed so far (any answer but 200: partial failure, over capacity,
    /// outage).
    #[serde(default)]
    pub failed_calls: u64,
    /// The fleet's failure floor: the mean of `backpressure_failure_floor` over the workers that
    /// know it (`>= 0`), as the operator reads it; absent while none knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_floor: Option<f64>,
    /// The operator's config sync (operator run): ready pods that confirmed the config, of all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigSync>,
    /// The broker's memory (scenarios with producer pods or a memory limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerMemory>,
    /// The producer pods' counters, summed (scenarios with producer pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<ProducerStats>,
    /// The operator's producer state (`status.producers.state`: Open, Throttled, Paused,
    /// Resuming), operator run with `spec.producers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_state: Option<String>,
    /// Ready producer pods running the operator's producer document, of all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_sync: Option<ConfigSync>,
}

/// The broker's memory at a sample (`INFO memory`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BrokerMemory {
    /// `used_memory` in bytes.
    pub used: u64,
    /// `used_memory_peak`: the highest `used_memory` so far (between samples included).
    pub peak: u64,
}

/// Ready worker pods running the operator's config, from the WorkerBackpressure's status.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfigSync {
    /// Pods that confirmed the current config (their push was authenticated by TokenReview).
    pub in_sync: i32,
    /// Ready pods.
    pub total: i32,
}

/// One run (operator or comparison).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// `operator` or `keda`.
    pub label: String,
    /// Its namespace.
    pub namespace: String,
    /// Samples in time order.
    pub samples: Vec<Sample>,
    /// The configuration rollout at the end of the run, as the operator reports it and as the
    /// pods report it (runs under the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_end: Option<ConfigEnd>,
}

/// The configuration rollout at the end of a run under the operator.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ConfigEnd {
    /// Status of the WorkerBackpressure's `ConfigInSync` condition (`True`, `False`, `Unknown`;
    /// empty when absent), with its reason.
    pub condition: String,
    /// The condition's reason.
    pub reason: String,
    /// `status.config.hash`: the configuration the operator pushed.
    pub pushed_hash: String,
    /// `status.config.generation`: the push's generation (the lab's initial configuration file
    /// has generation 0, so a pod reporting this one applied a push).
    pub pushed_generation: i64,
    /// What each ready pod answers on `GET /v1/config`: pod name, hash and generation (an empty
    /// hash and generation -1 when the pod did not answer).
    pub pod_hashes: Vec<(String, String, i64)>,
}

impl RunRecord {
    /// The last sample.
    pub fn last(&self) -> Option<&Sample> {
        self.samples.last()
    }

    fn in_window(&self, from: f64, to: f64) -> impl Iterator<Item = &Sample> {
        self.samples
            .iter()
            .filter(move |s| s.t >= from && s.t <= to)
    }

    /// Highest replicas in a window.
    pub fn max_replicas(&self, from: f64, to: f64) -> Option<i32> {
        self.in_window(from, to).map(|s| s.replicas).max()
    }

    /// The sample closest before `t` (the first sample if none is).
    pub fn at(&self, t: f64) -> Option<&Sample> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.t <= t)
            .or(self.samples.first())
    }

    /// Seconds of a window the operator spent in `DependencyFailing` (scale-out held).
    pub fn held_secs(&self, from: f64, to: f64) -> f64 {
        self.samples
            .windows(2)
            .filter(|w| {
                w[1].t > from && w[1].t <= to && w[1].regime == Regime::DependencyFailing.as_str()
            })
            .map(|w| w[1].t - w[0].t)
            .sum()
    }

    /// Mean of the fleet failure floor over the samples of a window that report one.
    pub fn mean_failure_floor(&self, from: f64, to: f64) -> Option<f64> {
        let v: Vec<f64> = self
            .in_window(from, to)
            .filter_map(|s| s.failure_floor)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Replicas at the sample closest before `t`.
    pub fn replicas_at(&self, t: f64) -> Option<i32> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.t <= t)
            .or(self.samples.first())
            .map(|s| s.replicas)
    }

    /// Requests / capacity-seconds over the samples of a window that have a backlog (depth > 0)
    /// and a positive capacity, as (load ratio, seconds counted).
    pub fn load_ratio_while_backlogged(&self, from: f64, to: f64) -> (f64, f64) {
        let mut req = 0.0;
        let mut cap = 0.0;
        let mut secs = 0.0;
        let mut prev_t: Option<f64> = None;
        for s in &self.samples {
            let dt = prev_t.map(|p| s.t - p).unwrap_or(0.0);
            prev_t = Some(s.t);
            if s.t < from || s.t > to || s.queue_depth == 0 || s.dep_capacity <= 0.0 {
                continue;
            }
            req += s.dep_load * dt;
            cap += s.dep_capacity * dt;
            secs += dt;
        }
        if cap <= 0.0 {
            (0.0, 0.0)
        } else {
            (req / cap, secs)
        }
    }
}

/// When the backlog of the highlighted phase (the outage) was drained: seconds from the end of
/// the first highlighted phase to the first sample at or after it whose first-attempt queue age
/// is at most `target_age` (the scenario's target, the level both autoscalers aim at). `None`
/// without a highlighted phase or when the run never got there.
pub fn drain_secs(scenario: &Scenario, r: &RunRecord, target_age: f64) -> Option<f64> {
    let end = scenario.phases.iter().find(|p| p.highlight)?.to.secs();
    r.samples
        .iter()
        .find(|s| s.t >= end && s.queue_age <= target_age)
        .map(|s| s.t - end)
}

/// Dependency requests / capacity while backlogged, from the end of the first highlighted phase
/// to the end of the run (the recovery): above 1 the fleet pushed the recovering dependency
/// past what it serves.
pub fn recovery_load(scenario: &Scenario, r: &RunRecord) -> Option<f64> {
    let end = scenario.phases.iter().find(|p| p.highlight)?.to.secs();
    let (ratio, secs) = r.load_ratio_while_backlogged(end, f64::INFINITY);
    (secs > 0.0).then_some(ratio)
}

/// The recording of a scenario: the operator run (if it ran) and the comparison run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Recording {
    /// Scenario name.
    pub scenario: String,
    /// Wall seconds of the whole lab (start to teardown).
    pub wall_secs: f64,
    /// The runs.
    pub runs: Vec<RunRecord>,
}

impl Recording {
    /// The run with that label.
    pub fn run(&self, label: &str) -> Option<&RunRecord> {
        self.runs.iter().find(|r| r.label == label)
    }
}

/// Label of the operator run.
pub const OPERATOR: &str = "operator";
/// Label of the comparison run.
pub const KEDA_RUN: &str = "keda";
/// Label of the polyglot run: the scenario's workload under the same operator, its pods running
/// the Go lab worker (the scenario's `polyglot` section).
pub const POLYGLOT: &str = "operator-go";

/// The result of one check.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The numbers behind it.
    pub detail: String,
}

/// The end-to-end checks of a scenario on a recording. A check that needs the operator run
/// fails when the operator did not run.
pub fn checks(scenario: &Scenario, rec: &Recording) -> Vec<Check> {
    let mut out = Vec::new();
    let op = rec.run(OPERATOR);
    let cmp = rec.run(KEDA_RUN);
    for r in &rec.runs {
        if let Some(s) = r.last() {
            let conserved = s.produced == s.completed + s.dead_lettered + s.in_stream;
            out.push(Check {
                name: format!("{}: no message lost", r.label),
                passed: conserved && s.produced > 0,
                detail: format!(
                    "produced {} = acknowledged {} + dead-lettered {} + still queued {}",
                    s.produced, s.completed, s.dead_lettered, s.in_stream
                ),
            });
            if scenario.producer.pods.is_some() {
                out.push(producer_conservation(r));
            }
        }
    }
    let need = |name: &str, out: &mut Vec<Check>| {
        out.push(Check {
            name: name.to_owned(),
            passed: false,
            detail: "the operator run did not run".into(),
        });
    };
    if let Some(phase) = scenario
        .expect
        .hold_during
        .as_deref()
        .and_then(|p| scenario.phase(p))
    {
        let (from, to) = (phase.from.secs(), phase.to.secs());
        let name = format!("{}: operator holds while KEDA grows", phase.name);
        match (op, cmp) {
            (Some(op), Some(cmp)) => {
                let (o0, omax) = (op.replicas_at(from), op.max_replicas(from, to));
                let (c0, cmax) = (cmp.replicas_at(from), cmp.max_replicas(from, to));
                let held = matches!((o0, omax), (Some(a), Some(b)) if b <= a);
                let grew = matches!((c0, cmax), (Some(a), Some(b)) if b > a);
                out.push(Check {
                    name,
                    passed: held && grew,
                    detail: format!(
                        "operator {} -> max {}, KEDA {} -> max {}",
                        fmt_opt(o0),
                        fmt_opt(omax),
                        fmt_opt(c0),
                        fmt_opt(cmax)
                    ),
                });
            }
            _ => need(&name, &mut out),
        }
    }
    if let Some(phase) = scenario
        .expect
        .fewer_replicas_during
        .as_deref()
        .and_then(|p| scenario.phase(p))
    {
        let (from, to) = (phase.from.secs(), phase.to.secs());
        let name = format!("{}: operator keeps fewer replicas than KEDA", phase.name);
        match (op, cmp) {
            (Some(op), Some(cmp)) => {
                let (o, c) = (op.max_replicas(from, to), cmp.max_replicas(from, to));
                out.push(Check {
                    name,
                    passed: matches!((o, c), (Some(o), Some(c)) if o < c),
                    detail: format!("max replicas: operator {}, KEDA {}", fmt_opt(o), fmt_opt(c)),
                });
            }
            _ => need(&name, &mut out),
        }
    }
    if let Some(lc) = &scenario.expect.load_within_capacity
        && let Some(phase) = scenario.phase(&lc.during)
    {
        let name = format!(
            "{}: dependency load <= {:.2}x capacity while draining",
            phase.name, lc.factor
        );
        match op {
            Some(op) => {
                let (ratio, secs) =
                    op.load_ratio_while_backlogged(phase.from.secs(), phase.to.secs());
                out.push(Check {
                    name,
                    passed: secs > 0.0 && ratio <= lc.factor,
                    detail: format!("load/capacity {ratio:.3} over {secs:.0} s of backlog"),
                });
            }
            None => need(&name, &mut out),
        }
    }
    if let Some(op) = op {
        out.push(config_check(op));
        if scenario
            .worker_backpressure
            .producers
            .as_ref()
            .is_some_and(|p| p.mode != Some(backpressure_api::v1alpha1::ProducerMode::Off))
        {
            out.push(producer_sync_check(op));
        }
    }
    if scenario.expect.broker_within_limit
        && let Some(limit) = scenario.queue.max_memory
    {
        let name = "operator: the broker stays under its memory limit and refuses no write";
        match op {
            Some(op) => out.push(broker_within_limit(op, limit.0, name)),
            None => need(name, &mut out),
        }
        let name = "KEDA (no producer control): the broker hits its memory limit";
        match cmp {
            Some(cmp) => out.push(broker_hits_limit(cmp, limit.0, name)),
            None => out.push(Check {
                name: name.to_owned(),
                passed: false,
                detail: "the comparison did not run".into(),
            }),
        }
    }
    if scenario.expect.producer_backlog_drains {
        let name = "operator: the messages held at the producers are sent after recovery";
        match op {
            Some(op) => out.push(producer_backlog_drains(scenario, op, name)),
            None => need(name, &mut out),
        }
    }
    if scenario.expect.fewer_dead_letters {
        let name = "operator dead-letters fewer messages than KEDA".to_owned();
        match (op.and_then(RunRecord::last), cmp.and_then(RunRecord::last)) {
            (Some(o), Some(c)) => out.push(Check {
                name,
                passed: o.dead_lettered < c.dead_lettered,
                detail: format!("operator {} vs KEDA {}", o.dead_lettered, c.dead_lettered),
            }),
            _ => need(&name, &mut out),
        }
    }
    if let Some(g) = &scenario.expect.goodput
        && let Some(phase) = scenario.phase(&g.during)
    {
        let name = format!(
            "{}: operator goodput >= {:.0} % of what the dependency serves",
            phase.name,
            g.min * 100.0
        );
        let (from, to) = (phase.from.secs(), phase.to.secs());
        match op {
            Some(op) => {
                let gp = goodput(scenario, op, from, to);
                let cmp_gp = cmp.and_then(|c| goodput(scenario, c, from, to));
                let max_rep =
                    |r: Option<&RunRecord>| fmt_opt(r.and_then(|r| r.max_replicas(from, to)));
                out.push(Check {
                    name,
                    passed: gp.is_some_and(|x| x.ratio >= g.min),
                    detail: format!(
                        "operator {} (KEDA {}); held {:.0} s of {:.0} s; max replicas operator {}, KEDA {}; fleet failure floor mean {}",
                        gp.map(|g| g.to_string()).unwrap_or_else(|| "?".into()),
                        cmp_gp.map(|g| g.to_string()).unwrap_or_else(|| "?".into()),
                        op.held_secs(from, to),
                        to - from,
                        max_rep(Some(op)),
                        max_rep(cmp),
                        op.mean_failure_floor(from, to)
                            .map(|f| format!("{f:.3}"))
                            .unwrap_or_else(|| "-".into()),
                    ),
                });
            }
            None => need(&name, &mut out),
        }
    }
    if scenario.expect.dlq_per_failed_call {
        let name = "operator: dead letters per failed call no worse than the comparison (2 sigma)"
            .to_owned();
        match (op.and_then(RunRecord::last), cmp.and_then(RunRecord::last)) {
            (Some(o), Some(c)) => {
                let d = DlqComparison::new(o, c);
                out.push(Check {
                    name,
                    passed: d.passed(),
                    detail: d.to_string(),
                });
            }
            _ => need(&name, &mut out),
        }
    }
    if scenario.expect.scale_out {
        let name = "operator scales out for a genuine backlog".to_owned();
        match op {
            Some(op) => {
                let max = op.max_replicas(0.0, f64::MAX);
                out.push(Check {
                    name,
                    passed: max.is_some_and(|m| m > scenario.workload.initial_replicas),
                    detail: format!(
                        "initial {} -> max {}",
                        scenario.workload.initial_replicas,
                        fmt_opt(max)
                    ),
                });
            }
            None => need(&name, &mut out),
        }
    }
    if scenario.polyglot.is_some() {
        out.extend(polyglot_checks(scenario, rec));
    }
    out
}

/// The checks of the polyglot part (the scenario's `polyglot` section): the operator pushed the
/// configuration hash both fleets' pods report, the Go fleet held its replicas while the
/// dependency failed (the scenario's `holdDuring` phase) and processed messages. Its
/// conservation is the per-run "no message lost" check.
pub fn polyglot_checks(scenario: &Scenario, rec: &Recording) -> Vec<Check> {
    let mut out = Vec::new();
    for label in [OPERATOR, POLYGLOT] {
        let name =
            format!("{label}: pods report the config hash the operator pushed (ConfigInSync)");
        let Some(end) = rec.run(label).and_then(|r| r.config_end.as_ref()) else {
            out.push(Check {
                name,
                passed: false,
                detail: format!("no end-of-run configuration recorded for the {label} run"),
            });
            continue;
        };
        out.push(config_in_sync(name, end));
    }
    let go = rec.run(POLYGLOT);
    if let Some(phase) = scenario
        .expect
        .hold_during
        .as_deref()
        .and_then(|p| scenario.phase(p))
    {
        let (from, to) = (phase.from.secs(), phase.to.secs());
        let (r0, rmax) = (
            go.and_then(|r| r.replicas_at(from)),
            go.and_then(|r| r.max_replicas(from, to)),
        );
        out.push(Check {
            name: format!("{POLYGLOT}: holds its replicas during {}", phase.name),
            passed: matches!((r0, rmax), (Some(a), Some(b)) if b <= a),
            detail: format!("{} -> max {}", fmt_opt(r0), fmt_opt(rmax)),
        });
    }
    let (go_last, rust_last) = (
        go.and_then(RunRecord::last),
        rec.run(OPERATOR).and_then(RunRecord::last),
    );
    out.push(Check {
        name: format!("{POLYGLOT}: processed messages"),
        passed: go_last.is_some_and(|s| s.completed > 0),
        detail: match go_last {
            Some(s) => format!(
                "acknowledged {} of {} produced, dead-lettered {} (the Rust fleet: {} of {}, {})",
                s.completed,
                s.produced,
                s.dead_lettered,
                rust_last.map_or(0, |s| s.completed),
                rust_last.map_or(0, |s| s.produced),
                rust_last.map_or(0, |s| s.dead_lettered),
            ),
            None => "the polyglot run did not run".into(),
        },
    });
    out
}

/// `ConfigInSync` is `True`, at least one pod answered, and every pod reports the pushed hash
/// and the push's generation (not the initial file's 0: the push reached it).
fn config_in_sync(name: String, end: &ConfigEnd) -> Check {
    let pushed = |h: &str, g: i64| {
        !end.pushed_hash.is_empty()
            && h == end.pushed_hash
            && end.pushed_generation > 0
            && g == end.pushed_generation
    };
    let matching = end
        .pod_hashes
        .iter()
        .filter(|(_, h, g)| pushed(h, *g))
        .count();
    let pods = end.pod_hashes.len();
    let or_nothing = |s: &str| {
        if s.is_empty() {
            "nothing".to_owned()
        } else {
            s.to_owned()
        }
    };
    Check {
        name,
        passed: end.condition == "True" && pods > 0 && matching == pods,
        detail: format!(
            "ConfigInSync {} ({}), pushed {} generation {}, {matching}/{pods} pods report it{}",
            if end.condition.is_empty() {
                "absent"
            } else {
                &end.condition
            },
            end.reason,
            or_nothing(&end.pushed_hash),
            end.pushed_generation,
            end.pod_hashes
                .iter()
                .filter(|(_, h, g)| !pushed(h, *g))
                .map(|(p, h, g)| format!(", {p} reports {} generation {g}", or_nothing(h)))
                .collect::<String>()
        ),
    }
}

/// The simulator's goodput (`crates/sim/src/metrics.rs`) of one run over a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Goodput {
    /// Messages acknowledged in the window.
    pub done: u64,
    /// What the dependency could serve there: the smaller of its schedule's capacity × (1 −
    /// failure rate) over the window and the messages there were to serve (the backlog at the
    /// window start plus the arrivals in it).
    pub servable: f64,
    /// `done / servable`.
    pub ratio: f64,
}

impl std::fmt::Display for Goodput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} % ({} of {:.0})",
            self.ratio * 100.0,
            self.done,
            self.servable
        )
    }
}

/// The goodput of `run` over `[from, to]`, as the simulator defines it: acknowledged in the
/// window / `min(Σ capacity(t)·(1 − failure rate(t)), backlog at the start + arrivals)`, the
/// dependency's share from the scenario's schedule (per second, at mid-second), not from the
/// run. The backlog at the start is every message in the stream then (never delivered, in
/// flight or waiting for a retry): those in flight are acknowledged inside the window, so
/// leaving them out (the simulator counts its waiting depth) could take the ratio above 1.
/// Messages dead-lettered or still queued at the end count against it.
pub fn goodput(scenario: &Scenario, run: &RunRecord, from: f64, to: f64) -> Option<Goodput> {
    let (start, end) = (run.at(from)?, run.at(to)?);
    let done = end.completed.saturating_sub(start.completed);
    let arrived = end.produced.saturating_sub(start.produced);
    let dep = &scenario.dependency;
    let secs = (to - from).max(0.0).floor() as u64;
    let by_dependency: f64 = (0..secs)
        .map(|i| {
            let t = std::time::Duration::from_secs_f64(from + i as f64 + 0.5);
            dep.capacity.value_at(t) * (1.0 - dep.failure_rate.value_at(t).min(1.0))
        })
        .sum();
    let servable = by_dependency.min((start.in_stream + arrived) as f64);
    (servable > 0.0).then(|| Goodput {
        done,
        servable,
        ratio: done as f64 / servable,
    })
}

/// Dead letters per failed dependency call of the operator run against the comparison's.
///
/// In a partial failure both fleets lose a message only when all of its deliveries fail, with
/// the same probability per message whatever their concurrency, so both should dead-letter the
/// same share of their failed calls. The counts are small in a run of minutes (tens, not the
/// simulator's hundreds), so the check is a Poisson test rather than a fixed ratio: with
/// `k = failed_op / failed_cmp`, the excess `dlq_op − k·dlq_cmp` must stay within 2 sigma of
/// its noise under a common rate `ρ = (dlq_op + dlq_cmp) / (failed_op + failed_cmp)`:
/// `Var = ρ·failed_op + k²·ρ·failed_cmp = ρ·failed_op·(1 + k)` (at least 1, so that 0 against
/// 0 or 1 against 0 is not a failure).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DlqComparison {
    /// Operator run: dead letters and failed calls.
    pub op: (u64, u64),
    /// Comparison run: dead letters and failed calls.
    pub cmp: (u64, u64),
}

impl DlqComparison {
    /// From the last samples of both runs.
    pub fn new(op: &Sample, cmp: &Sample) -> Self {
        Self {
            op: (op.dead_lettered, op.failed_calls),
            cmp: (cmp.dead_lettered, cmp.failed_calls),
        }
    }

    fn excess_and_sigma(&self) -> Option<(f64, f64)> {
        let (a, fa) = (self.op.0 as f64, self.op.1 as f64);
        let (b, fb) = (self.cmp.0 as f64, self.cmp.1 as f64);
        if fa <= 0.0 || fb <= 0.0 {
            return None;
        }
        let k = fa / fb;
        let rho = (a + b) / (fa + fb);
        Some((a - k * b, (rho * fa * (1.0 + k)).max(1.0).sqrt()))
    }

    /// Within the band (false when a run made no failed call: nothing to compare).
    pub fn passed(&self) -> bool {
        self.excess_and_sigma()
            .is_some_and(|(excess, sigma)| excess <= 2.0 * sigma)
    }
}

impl std::fmt::Display for DlqComparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |(d, n): (u64, u64)| {
            if n == 0 {
                "-".to_owned()
            } else {
                format!("{:.4}", d as f64 / n as f64)
            }
        };
        write!(
            f,
            "operator {} DLQ / {} failed calls = {}, comparison {} / {} = {}",
            self.op.0,
            self.op.1,
            per(self.op),
            self.cmp.0,
            self.cmp.1,
            per(self.cmp)
        )?;
        match self.excess_and_sigma() {
            Some((excess, sigma)) => write!(
                f,
                "; excess over the comparison's rate {excess:.1}, 2 sigma {:.1}",
                2.0 * sigma
            ),
            None => write!(f, "; no failed calls to compare"),
        }
    }
}

fn fmt_opt(v: Option<i32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
}

/// Every message the producers' clients handed them is acknowledged, dead-lettered, still in
/// the queue or still waiting at a producer (refused back to it, by its gate or by the broker,
/// and kept); and what the producers counted as written is what the broker added.
fn producer_conservation(r: &RunRecord) -> Check {
    let name = format!(
        "{}: no message lost from the producers' clients to acknowledgement",
        r.label
    );
    let Some((s, p)) = r.last().and_then(|s| Some((s, s.producers.as_ref()?))) else {
        return Check {
            name,
            passed: false,
            detail: "no producer counters recorded".into(),
        };
    };
    let accounted = s.completed + s.dead_lettered + s.in_stream + p.waiting;
    Check {
        name,
        passed: p.demand > 0 && p.demand == accounted && p.written == s.produced && p.stopped,
        detail: format!(
            "demand {} = acknowledged {} + dead-lettered {} + in the queue {} + waiting at the producers {} ({}); written by the producers {}, added by the broker {}; writes refused by the broker {} (each kept and written again later){}",
            p.demand,
            s.completed,
            s.dead_lettered,
            s.in_stream,
            p.waiting,
            accounted,
            p.written,
            s.produced,
            p.refused_by_broker,
            if p.stopped {
                ""
            } else {
                "; some producer never wrote its final counters"
            }
        ),
    }
}

/// The operator's producer state reaches the producer pods: at the end every ready producer pod
/// runs the current document, and in most samples that report pods. A producer pod accepts a
/// push only after a TokenReview for its own workload's audience.
fn producer_sync_check(op: &RunRecord) -> Check {
    let reported: Vec<ConfigSync> = op
        .samples
        .iter()
        .filter_map(|s| s.producer_sync)
        .filter(|c| c.total > 0)
        .collect();
    let full = reported.iter().filter(|c| c.in_sync == c.total).count();
    let last = reported.last().copied();
    Check {
        name: "operator: its producer state reaches the ready producer pods (authenticated push)"
            .into(),
        passed: !reported.is_empty()
            && full * 2 >= reported.len()
            && last.is_some_and(|c| c.in_sync == c.total),
        detail: match last {
            Some(c) => format!(
                "all ready producer pods in sync in {full} of {} samples; at the end {} of {}",
                reported.len(),
                c.in_sync,
                c.total
            ),
            None => "no sample reported ready producer pods".into(),
        },
    }
}

/// The highest `used_memory` of a run (Redis's own peak, so between samples too).
pub fn peak_memory(r: &RunRecord) -> Option<u64> {
    r.samples
        .iter()
        .filter_map(|s| s.broker.map(|b| b.peak.max(b.used)))
        .max()
}

fn refused_by_broker(r: &RunRecord) -> Option<u64> {
    r.last()?.producers.as_ref().map(|p| p.refused_by_broker)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn broker_within_limit(op: &RunRecord, limit: u64, name: &str) -> Check {
    let (peak, refused) = (peak_memory(op), refused_by_broker(op));
    Check {
        name: name.to_owned(),
        passed: peak.is_some_and(|p| p < limit) && refused == Some(0),
        detail: format!(
            "peak used memory {} of {} ({:.0} %); writes refused {}",
            peak.map(mib).unwrap_or_else(|| "?".into()),
            mib(limit),
            peak.map(|p| 100.0 * p as f64 / limit as f64).unwrap_or(0.0),
            refused.map(|r| r.to_string()).unwrap_or_else(|| "?".into())
        ),
    }
}

fn broker_hits_limit(cmp: &RunRecord, limit: u64, name: &str) -> Check {
    let (peak, refused) = (peak_memory(cmp), refused_by_broker(cmp));
    let first_refusal = cmp
        .samples
        .iter()
        .find(|s| {
            s.producers
                .as_ref()
                .is_some_and(|p| p.refused_by_broker > 0)
        })
        .map(|s| s.t);
    Check {
        name: name.to_owned(),
        passed: refused.is_some_and(|r| r > 0),
        detail: format!(
            "peak used memory {} of {}; writes refused {} (first at {})",
            peak.map(mib).unwrap_or_else(|| "?".into()),
            mib(limit),
            refused.map(|r| r.to_string()).unwrap_or_else(|| "?".into()),
            first_refusal
                .map(|t| format!("{t:.0} s"))
                .unwrap_or_else(|| "-".into())
        ),
    }
}

/// Samples from the largest producer backlog on, the first at which it is back to at most one
/// second of demand: (peak waiting, when, drained at).
pub fn producer_drain(scenario: &Scenario, r: &RunRecord) -> Option<(u64, f64, Option<f64>)> {
    let waiting = |s: &Sample| s.producers.as_ref().map(|p| p.waiting);
    let peak = r
        .samples
        .iter()
        .filter_map(|s| Some((waiting(s)?, s.t)))
        .fold(None, |best: Option<(u64, f64)>, (w, t)| match best {
            Some((bw, _)) if bw >= w => best,
            _ => Some((w, t)),
        })?;
    let drained = r
        .samples
        .iter()
        .filter(|s| s.t > peak.1)
        .find(|s| waiting(s).is_some_and(|w| w <= drain_threshold(scenario, s.t)))
        .map(|s| s.t);
    Some((peak.0, peak.1, drained))
}

fn drain_threshold(scenario: &Scenario, t: f64) -> u64 {
    let rate = scenario
        .producer
        .rate
        .value_at(std::time::Duration::from_secs_f64(t.max(0.0)));
    rate.ceil().max(1.0) as u64
}

fn producer_backlog_drains(scenario: &Scenario, op: &RunRecord, name: &str) -> Check {
    let end = scenario.duration.secs();
    let last = op
        .last()
        .and_then(|s| s.producers.as_ref().map(|p| p.waiting));
    let threshold = drain_threshold(scenario, end);
    let drain = producer_drain(scenario, op);
    Check {
        name: name.to_owned(),
        passed: last.is_some_and(|w| w <= threshold),
        detail: format!(
            "waiting at the producers at the end {} (at most {threshold}: one second of demand); {}",
            last.map(|w| w.to_string()).unwrap_or_else(|| "?".into()),
            match drain {
                Some((peak, at, Some(done))) =>
                    format!("largest backlog {peak} at {at:.0} s, sent by {done:.0} s"),
                Some((peak, at, None)) => {
                    format!("largest backlog {peak} at {at:.0} s, not sent by the end")
                }
                None => "no producer counters".into(),
            }
        ),
    }
}

/// Writes one run as CSV.
pub fn to_csv(run: &RunRecord) -> String {
    // The broker and producer columns only for runs that record them.
    let producers = run
        .samples
        .iter()
        .any(|x| x.producers.is_some() || x.broker.is_some());
    let mut s = String::from(
        "t,regime,replicas,ready,backoff,queue_age,queue_depth,produced,completed,dead_lettered,in_stream,dep_load,dep_served,dep_capacity,failed_calls,failure_floor",
    );
    if producers {
        s.push_str(",broker_used_bytes,broker_peak_bytes,producer_demand,producer_written,producer_refused_by_broker,producer_waiting,producer_gate,producer_state");
    }
    s.push('\n');
    for x in &run.samples {
        s.push_str(&format!(
            "{:.1},{},{},{},{},{:.2},{},{},{},{},{},{:.2},{:.2},{:.2},{},{}",
            x.t,
            x.regime,
            x.replicas,
            x.ready,
            x.backoff.map(|b| format!("{b:.3}")).unwrap_or_default(),
            x.queue_age,
            x.queue_depth,
            x.produced,
            x.completed,
            x.dead_lettered,
            x.in_stream,
            x.dep_load,
            x.dep_served,
            x.dep_capacity,
            x.failed_calls,
            x.failure_floor
                .map(|f| format!("{f:.3}"))
                .unwrap_or_default()
        ));
        if producers {
            let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
            let p = x.producers.as_ref();
            s.push_str(&format!(
                ",{},{},{},{},{},{},{},{}",
                opt(x.broker.map(|b| b.used)),
                opt(x.broker.map(|b| b.peak)),
                opt(p.map(|p| p.demand)),
                opt(p.map(|p| p.written)),
                opt(p.map(|p| p.refused_by_broker)),
                opt(p.map(|p| p.waiting)),
                p.map(|p| p.gate.as_str()).unwrap_or_default(),
                x.producer_state.as_deref().unwrap_or_default()
            ));
        }
        s.push('\n');
    }
    s
}

/// The operator's pushes reach the workers: in at least half of the samples that report
/// ready pods, every one of them runs the current config (pods that just started or a config
/// that just changed are briefly out of sync), and at the end some do. A worker accepts a push
/// only after a TokenReview of the operator's token, so this also proves that path.
fn config_check(op: &RunRecord) -> Check {
    let reported: Vec<ConfigSync> = op
        .samples
        .iter()
        .filter_map(|s| s.config)
        .filter(|c| c.total > 0)
        .collect();
    let full = reported.iter().filter(|c| c.in_sync == c.total).count();
    let last = reported.last().copied();
    Check {
        name: "operator: its config reaches the ready workers (authenticated push)".into(),
        passed: !reported.is_empty()
            && full * 2 >= reported.len()
            && last.is_some_and(|c| c.in_sync > 0),
        detail: match last {
            Some(c) => format!(
                "every ready pod in sync in {full} of {} samples; at the end {} of {}",
                reported.len(),
                c.in_sync,
                c.total
            ),
            None => "the status never reported ready pods".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sample(t: f64, replicas: i32) -> Sample {
        Sample {
            t,
            replicas,
            produced: 10,
            completed: 7,
            dead_lettered: 1,
            in_stream: 2,
            queue_depth: 5,
            dep_load: 50.0,
            dep_capacity: 50.0,
            ..Sample::default()
        }
    }

    fn polyglot_recording(go_replicas: &[i32], go_end: ConfigEnd) -> Recording {
        let in_sync = ConfigEnd {
            condition: "True".into(),
            reason: "AllPodsInSync".into(),
            pushed_hash: "abc123abc123".into(),
            pushed_generation: 7,
            pod_hashes: vec![("a".into(), "abc123abc123".into(), 7)],
        };
        let mut op = run(OPERATOR, &[2; 18]);
        op.config_end = Some(in_sync);
        let mut go = run(POLYGLOT, go_replicas);
        go.config_end = Some(go_end);
        Recording {
            runs: vec![op, go],
            ..Recording::default()
        }
    }

    fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name.contains(name))
            .unwrap_or_else(|| panic!("no check {name:?} in {checks:?}"))
    }

    #[test]
    fn polyglot_checks_need_the_pushed_hash_on_every_pod_a_hold_and_completions() {
        let sc = Scenario::load("outage-and-recovery").unwrap();
        assert!(sc.polyglot.is_some());
        let end = |condition: &str, hashes: &[&str]| ConfigEnd {
            condition: condition.into(),
            reason: "r".into(),
            pushed_hash: "abc123abc123".into(),
            pushed_generation: 7,
            pod_hashes: hashes
                .iter()
                .enumerate()
                .map(|(i, h)| (format!("pod-{i}"), (*h).to_owned(), 7))
                .collect(),
        };
        // Samples every 10 s; the outage is 30..80 s.
        let held = [2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4];
        let good = checks(
            &sc,
            &polyglot_recording(&held, end("True", &["abc123abc123"; 2])),
        );
        for name in [
            "operator: pods report the config hash",
            "operator-go: pods report the config hash",
            "operator-go: holds its replicas during outage",
            "operator-go: processed messages",
            "operator-go: no message lost",
        ] {
            assert!(check(&good, name).passed, "{name}: {good:?}");
        }
        let grew = [2, 2, 2, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4];
        let bad = checks(
            &sc,
            &polyglot_recording(&grew, end("True", &["abc123abc123"])),
        );
        assert!(!check(&bad, "operator-go: holds").passed);
        let stale = checks(
            &sc,
            &polyglot_recording(&held, end("True", &["abc123abc123", "000000000000"])),
        );
        let c = check(&stale, "operator-go: pods report");
        assert!(
            !c.passed && c.detail.contains("pod-1 reports 000000000000"),
            "{c:?}"
        );
        // The pushed hash from the initial file (generation 0), not from a push.
        let mut unpushed = end("True", &["abc123abc123"]);
        unpushed.pod_hashes[0].2 = 0;
        let c = checks(&sc, &polyglot_recording(&held, unpushed));
        assert!(!check(&c, "operator-go: pods report").passed);
        let unsynced = checks(
            &sc,
            &polyglot_recording(&held, end("False", &["abc123abc123"])),
        );
        assert!(!check(&unsynced, "operator-go: pods report").passed);
        let no_pods = checks(&sc, &polyglot_recording(&held, end("True", &[])));
        assert!(!check(&no_pods, "operator-go: pods report").passed);
        // Without the polyglot run every polyglot check fails.
        let mut rec = polyglot_recording(&held, end("True", &["abc123abc123"]));
        rec.runs.retain(|r| r.label != POLYGLOT);
        let missing = checks(&sc, &rec);
        assert!(!check(&missing, "operator-go: pods report").passed);
        assert!(!check(&missing, "operator-go: processed messages").passed);
    }

    fn run(label: &str, replicas: &[i32]) -> RunRecord {
        RunRecord {
            config_end: None,
            label: label.into(),
            namespace: label.into(),
            samples: replicas
                .iter()
                .enumerate()
                .map(|(i, r)| sample(i as f64 * 10.0, *r))
                .collect(),
        }
    }

    fn outage() -> Scenario {
        Scenario::load("outage-and-recovery").unwrap()
    }

    #[test]
    fn hold_check_passes_only_when_operator_holds_and_comparison_grows() {
        let s = outage();
        // Outage is 30..80 s: samples at 30..80 are indices 3..=8.
        let good = Recording {
            scenario: s.name.clone(),
            wall_secs: 0.0,
            runs: vec![
                run(OPERATOR, &[2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 4]),
                run(KEDA_RUN, &[2, 2, 2, 2, 4, 8, 10, 10, 10, 10, 10]),
            ],
        };
        let c = checks(&s, &good);
        let hold = c.iter().find(|c| c.name.contains("holds")).unwrap();
        assert!(hold.passed, "{hold:?}");
        let bad = Recording {
            runs: vec![
                run(OPERATOR, &[2, 2, 2, 2, 3, 2, 2, 2, 2, 3, 4]),
                run(KEDA_RUN, &[2, 2, 2, 2, 4, 8, 10, 10, 10, 10, 10]),
            ],
            ..good.clone()
        };
        assert!(
            !checks(&s, &bad)
                .iter()
                .find(|c| c.name.contains("holds"))
                .unwrap()
                .passed
        );
    }

    #[test]
    fn config_check_needs_pods_mostly_in_sync_and_some_at_the_end() {
        let with = |syncs: &[(i32, i32)]| {
            let mut r = run(OPERATOR, &vec![2; syncs.len()]);
            for (s, (in_sync, total)) in r.samples.iter_mut().zip(syncs) {
                s.config = Some(ConfigSync {
                    in_sync: *in_sync,
                    total: *total,
                });
            }
            config_check(&r)
        };
        assert!(with(&[(0, 2), (2, 2), (2, 2), (2, 3), (3, 3)]).passed);
        // Rejected pushes (a broken TokenReview) leave every pod out of sync.
        assert!(!with(&[(0, 2), (0, 2), (0, 3), (0, 3)]).passed);
        assert!(!with(&[(2, 2), (0, 2), (0, 2), (0, 3), (0, 3)]).passed);
        assert!(!with(&[]).passed);
        assert!(!config_check(&run(OPERATOR, &[2, 2])).passed);
    }

    #[test]
    fn fewer_replicas_check() {
        let s = Scenario::load("quota-overload").unwrap();
        // Overload is 20..100 s: samples at 20..100 are indices 2..=10.
        let rec = |op: &[i32]| Recording {
            runs: vec![
                run(OPERATOR, op),
                run(KEDA_RUN, &[2, 2, 2, 2, 4, 8, 10, 10, 10, 10, 10]),
            ],
            ..Recording::default()
        };
        let find = |r: &Recording| {
            checks(&s, r)
                .into_iter()
                .find(|c| c.name.contains("fewer replicas"))
                .unwrap()
        };
        assert!(find(&rec(&[2, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4])).passed);
        assert!(!find(&rec(&[2, 2, 3, 4, 10, 4, 4, 4, 4, 4, 4])).passed);
    }

    #[test]
    fn conservation_and_missing_operator() {
        let s = outage();
        let mut r = run(KEDA_RUN, &[2, 2]);
        r.samples[1].completed = 6; // one message unaccounted for
        let rec = Recording {
            runs: vec![r],
            ..Recording::default()
        };
        let c = checks(&s, &rec);
        assert!(!c.iter().find(|c| c.name.contains("lost")).unwrap().passed);
        assert!(
            c.iter()
                .filter(|c| c.detail.contains("did not run"))
                .count()
                >= 2
        );
    }

    #[test]
    fn load_ratio_counts_only_backlogged_time_with_capacity() {
        let mut r = run(OPERATOR, &[2, 2, 2, 2]);
        r.samples[1].dep_load = 100.0;
        r.samples[2].queue_depth = 0;
        r.samples[2].dep_load = 1000.0;
        r.samples[3].dep_capacity = 0.0;
        let (ratio, secs) = r.load_ratio_while_backlogged(0.0, 100.0);
        assert_eq!(secs, 10.0);
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn goodput_is_the_simulators_over_the_phase() {
        let s = Scenario::load("partial-failure").unwrap();
        let phase = s.phase("failing").unwrap();
        let (from, to) = (phase.from.secs(), phase.to.secs());
        // 40 messages/s arrive over the window; 100 are in the stream at its start.
        let mk = |t: f64, produced: u64, completed: u64, in_stream: u64| Sample {
            t,
            produced,
            completed,
            in_stream,
            ..Sample::default()
        };
        let arrivals = (40.0 * (to - from)) as u64;
        let r = |completed_in_window: u64| RunRecord {
            config_end: None,
            label: OPERATOR.into(),
            namespace: OPERATOR.into(),
            samples: vec![
                mk(from - 1.0, 300, 200, 100),
                mk(to, 300 + arrivals, 200 + completed_in_window, 0),
                mk(to + 4.0, 300 + arrivals + 160, 200 + arrivals + 260, 0),
            ],
        };
        // The dependency (300/s at 85 %) is not the limit: what there was to serve is.
        let all = goodput(&s, &r(arrivals + 100), from, to).unwrap();
        assert_eq!(all.servable, (arrivals + 100) as f64);
        assert!((all.ratio - 1.0).abs() < 1e-9, "{all:?}");
        let most = goodput(&s, &r((arrivals + 100) * 85 / 100), from, to).unwrap();
        assert!((most.ratio - 0.85).abs() < 1e-3, "{most:?}");
        // The check follows the ratio.
        let rec = |n| Recording {
            runs: vec![r(n)],
            ..Recording::default()
        };
        let find = |rec: &Recording| {
            checks(&s, rec)
                .into_iter()
                .find(|c| c.name.contains("goodput"))
                .unwrap()
        };
        assert!(find(&rec(arrivals + 100)).passed);
        assert!(!find(&rec((arrivals + 100) * 85 / 100)).passed);
    }

    #[test]
    fn dlq_per_failed_call_within_poisson_noise() {
        let d = |op: (u64, u64), cmp: (u64, u64)| DlqComparison { op, cmp };
        // Same rate, fewer failed calls: passes.
        assert!(d((5, 300), (15, 900)).passed());
        // Somewhat more per failed call, inside the noise of counts this small.
        assert!(d((9, 300), (15, 900)).passed());
        // Four times the rate: fails.
        assert!(!d((20, 300), (15, 900)).passed());
        // Nothing against nothing, or one against nothing: noise.
        assert!(d((0, 300), (0, 900)).passed());
        assert!(d((1, 300), (0, 900)).passed());
        // No failed calls in a run: nothing to compare.
        assert!(!d((0, 0), (3, 900)).passed());
    }

    /// A bounded-broker run: producer counters and broker memory in every sample.
    fn producer_run(label: &str, peaks: &[u64], waiting: &[u64], refused: u64) -> RunRecord {
        let mut r = run(label, &vec![2; peaks.len()]);
        let n = r.samples.len();
        for (i, s) in r.samples.iter_mut().enumerate() {
            s.broker = Some(BrokerMemory {
                used: peaks[i],
                peak: peaks[..=i].iter().copied().max().unwrap_or(0),
            });
            // produced 10 = completed 7 + dead-lettered 1 + in the stream 2 (see `sample`).
            s.producers = Some(ProducerStats {
                demand: 10 + waiting[i],
                written: 10,
                refused_by_broker: if i + 1 == n { refused } else { 0 },
                waiting: waiting[i],
                gate: "Open".into(),
                stopped: i + 1 == n,
                ..ProducerStats::default()
            });
            s.producer_sync = Some(ConfigSync {
                in_sync: 2,
                total: 2,
            });
        }
        r
    }

    fn find<'a>(checks: &'a [Check], needle: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name.contains(needle))
            .unwrap_or_else(|| panic!("no check {needle:?} in {checks:?}"))
    }

    #[test]
    fn bounded_broker_checks() {
        let s = Scenario::load("bounded-broker").unwrap();
        let limit = s.queue.max_memory.unwrap().0;
        let mb = 1u64 << 20;
        // 19 samples, 0..180 s; the producers' backlog peaks at 100 s and is gone by 150 s.
        let waiting: Vec<u64> = (0..19u64)
            .map(|i| match i {
                0..=3 => 0,
                4..=10 => (i - 3) * 100,
                11..=14 => (15 - i) * 150,
                _ => 0,
            })
            .collect();
        let calm = vec![2 * mb; 19];
        let full = |i: usize| if i > 8 { limit + mb / 10 } else { 2 * mb };
        let filled: Vec<u64> = (0..19).map(full).collect();
        let rec = |op: RunRecord, cmp: RunRecord| Recording {
            runs: vec![op, cmp],
            ..Recording::default()
        };
        let good = rec(
            producer_run(OPERATOR, &calm, &waiting, 0),
            producer_run(KEDA_RUN, &filled, &[0; 19], 42),
        );
        let c = checks(&s, &good);
        for name in [
            "operator: no message lost from the producers",
            "keda: no message lost from the producers",
            "stays under its memory limit",
            "hits its memory limit",
            "held at the producers are sent",
            "producer state reaches",
        ] {
            let k = find(&c, name);
            assert!(k.passed, "{k:?}");
        }
        assert!(
            find(&c, "held at the producers")
                .detail
                .contains("largest backlog 700 at 100 s, sent by 150 s")
        );

        // The operator's broker at its limit, or a refused write: fails.
        let over = rec(
            producer_run(OPERATOR, &filled, &waiting, 0),
            producer_run(KEDA_RUN, &filled, &[0; 19], 42),
        );
        assert!(!find(&checks(&s, &over), "stays under").passed);
        let refused = rec(
            producer_run(OPERATOR, &calm, &waiting, 3),
            producer_run(KEDA_RUN, &filled, &[0; 19], 42),
        );
        assert!(!find(&checks(&s, &refused), "stays under").passed);
        // The comparison never refused: the scenario shows nothing.
        let easy = rec(
            producer_run(OPERATOR, &calm, &waiting, 0),
            producer_run(KEDA_RUN, &calm, &[0; 19], 0),
        );
        assert!(!find(&checks(&s, &easy), "hits its memory limit").passed);
        // A backlog still at the producers at the end.
        let mut stuck_waiting = waiting.clone();
        stuck_waiting[18] = 300;
        let stuck = rec(
            producer_run(OPERATOR, &calm, &stuck_waiting, 0),
            producer_run(KEDA_RUN, &filled, &[0; 19], 42),
        );
        assert!(!find(&checks(&s, &stuck), "held at the producers").passed);
        // A message missing: demand not accounted for.
        let mut lost = producer_run(OPERATOR, &calm, &waiting, 0);
        if let Some(p) = lost.samples.last_mut().and_then(|x| x.producers.as_mut()) {
            p.demand += 1;
        }
        let lost = rec(lost, producer_run(KEDA_RUN, &filled, &[0; 19], 42));
        assert!(
            !find(
                &checks(&s, &lost),
                "operator: no message lost from the producers"
            )
            .passed
        );
        // Written by the producers but not added by the broker.
        let mut phantom = producer_run(KEDA_RUN, &filled, &[0; 19], 42);
        if let Some(p) = phantom
            .samples
            .last_mut()
            .and_then(|x| x.producers.as_mut())
        {
            p.written += 1;
            p.demand += 1;
        }
        let phantom = rec(producer_run(OPERATOR, &calm, &waiting, 0), phantom);
        assert!(
            !find(
                &checks(&s, &phantom),
                "keda: no message lost from the producers"
            )
            .passed
        );
        // Pushes that never reach the producer pods.
        let mut unsynced = producer_run(OPERATOR, &calm, &waiting, 0);
        for x in &mut unsynced.samples {
            x.producer_sync = Some(ConfigSync {
                in_sync: 0,
                total: 2,
            });
        }
        let unsynced = rec(unsynced, producer_run(KEDA_RUN, &filled, &[0; 19], 42));
        assert!(!find(&checks(&s, &unsynced), "producer state reaches").passed);
        // The CSV gets the producer columns.
        let csv = to_csv(&good.runs[0]);
        assert!(
            csv.lines()
                .next()
                .unwrap()
                .ends_with("producer_gate,producer_state")
        );
        assert_eq!(csv.lines().nth(1).unwrap().split(',').count(), 24);
        assert!(!to_csv(&run(OPERATOR, &[1])).contains("producer"));
    }

    #[test]
    fn csv_has_a_row_per_sample() {
        let r = run(OPERATOR, &[1, 2, 3]);
        assert_eq!(to_csv(&r).lines().count(), 4);
    }
}
