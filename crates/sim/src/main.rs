//! `backpressure-sim`: runs scenarios and writes the benchmark report and the seed sweep.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use backpressure_sim::metrics::summarize;
use backpressure_sim::report::{self, Provenance};
use backpressure_sim::{Scenario, Simulation, plot, policy, sweep};
use clap::{Parser, Subcommand};

const SCENARIOS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios");
const DOCS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/sim");
const QUICK_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/sim-quick");

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Simulator and scenario benchmark for backpressure-aware autoscaling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs every scenario under every policy and writes report.md and one SVG per scenario.
    Report {
        /// Directory of scenario files.
        #[arg(long, default_value = SCENARIOS_DIR)]
        scenarios: PathBuf,
        /// Output directory (default: docs/sim, or target/sim-quick with --quick).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only scenarios whose name contains this (repeatable).
        #[arg(long = "scenario")]
        filter: Vec<String>,
        /// Compress every timeline 4x (a smoke run, not the benchmark).
        #[arg(long)]
        quick: bool,
        /// Seeds for the producer-control tables of scenarios with a producers section (the
        /// variants of ours on the file's seed and the next N-1); 0: none.
        #[arg(long, default_value_t = 20)]
        seeds: usize,
        /// Worker threads (default: available parallelism).
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// Runs every scenario with N seeds under every policy and writes sweep.md: how often each
    /// target of our policy is met, and how the other policies do on the same seeds.
    Sweep {
        /// Directory of scenario files.
        #[arg(long, default_value = SCENARIOS_DIR)]
        scenarios: PathBuf,
        /// Seeds per scenario: the file's seed s, s+1, ..., s+N-1.
        #[arg(long, default_value_t = 20)]
        seeds: usize,
        /// Output directory.
        #[arg(long, default_value = DOCS_DIR)]
        out: PathBuf,
        /// Only scenarios whose name contains this (repeatable).
        #[arg(long = "scenario")]
        filter: Vec<String>,
        /// Worker threads (default: available parallelism).
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// Runs one scenario under one or all policies and prints the summaries.
    Run {
        /// The scenario file.
        scenario: PathBuf,
        /// Policy key (greedy-keda, bp-static, bp-keda, bp-ours, greedy-keda-lag; with a
        /// producers section also bp-ours-ungated, bp-ours-throttle); all when absent.
        #[arg(long)]
        policy: Option<String>,
        /// Compress the scenario's timeline by this factor (0 < f <= 1).
        #[arg(long)]
        compress: Option<f64>,
        /// Print every decision of the autoscaler.
        #[arg(long)]
        decisions: bool,
        /// Print the per-second samples from FROM to TO seconds as CSV (`FROM:TO`).
        #[arg(long, value_name = "FROM:TO")]
        samples: Option<String>,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Report {
            scenarios,
            out,
            filter,
            quick,
            seeds,
            jobs,
        } => report_cmd(&scenarios, out, &filter, quick, seeds, jobs),
        Command::Sweep {
            scenarios,
            seeds,
            out,
            filter,
            jobs,
        } => sweep_cmd(&scenarios, seeds, &out, &filter, jobs),
        Command::Run {
            scenario,
            policy,
            compress,
            decisions,
            samples,
        } => run_cmd(&scenario, policy, compress, decisions, samples.as_deref()),
    }
}

/// The scenario files of `dir` whose name contains one of `filter` (all without a filter), with
/// their sources relative to the repository.
fn load_scenarios(dir: &Path, filter: &[String]) -> Result<Vec<Scenario>> {
    let mut scenarios = Scenario::load_dir(dir).context("loading the scenarios")?;
    for s in &mut scenarios {
        if let Some(src) = &s.source {
            let file = Path::new(src)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            s.source = Some(format!("crates/sim/scenarios/{file}"));
        }
    }
    if !filter.is_empty() {
        scenarios.retain(|s| filter.iter().any(|f| s.name.contains(f.as_str())));
    }
    if scenarios.is_empty() {
        bail!("no scenario in {} matches", dir.display());
    }
    Ok(scenarios)
}

fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn sweep_cmd(
    dir: &Path,
    seeds: usize,
    out: &Path,
    filter: &[String],
    jobs: Option<usize>,
) -> Result<()> {
    let scenarios = load_scenarios(dir, filter)?;
    let jobs = jobs.unwrap_or_else(default_jobs);
    let started = Instant::now();
    let result = sweep::run(&scenarios, seeds, jobs)?;
    let wall = started.elapsed().as_secs_f64();
    let mut command = format!("cargo run -p backpressure-sim --release -- sweep --seeds {seeds}");
    for f in filter {
        command.push_str(&format!(" --scenario {f}"));
    }
    let md = sweep::markdown(
        &result,
        &sweep::Provenance {
            command,
            wall_secs: wall,
            jobs,
        },
    );
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join("sweep.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote {}: {} runs in {:.1} s on {} thread(s)",
        path.display(),
        result.runs,
        wall,
        jobs
    );
    Ok(())
}

fn report_cmd(
    dir: &Path,
    out: Option<PathBuf>,
    filter: &[String],
    quick: bool,
    seeds: usize,
    jobs: Option<usize>,
) -> Result<()> {
    let mut scenarios = load_scenarios(dir, filter)?;
    let compressed = quick.then_some(0.25);
    if let Some(f) = compressed {
        scenarios = scenarios.iter().map(|s| s.compressed(f)).collect();
    }
    let out = out.unwrap_or_else(|| PathBuf::from(if quick { QUICK_DIR } else { DOCS_DIR }));
    let jobs = jobs.unwrap_or_else(default_jobs);
    let started = Instant::now();
    let mut results = report::run_all(&scenarios, jobs)?;
    let wall = started.elapsed().as_secs_f64();
    let seeded_at = Instant::now();
    let seed_runs = if seeds > 0 {
        let n = report::add_seeds(&mut results, seeds, jobs)?;
        (n > 0).then(|| (n, seeded_at.elapsed().as_secs_f64()))
    } else {
        None
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    for r in &results {
        let runs: Vec<_> = r.runs.iter().map(|x| x.output.clone()).collect();
        let svg = plot::render(&r.scenario, &runs)?;
        let path = out.join(format!("{}.svg", r.scenario.name));
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut command = "cargo run -p backpressure-sim --release -- report".to_owned();
    if quick {
        command.push_str(" --quick");
    }
    if seeds != 20 {
        command.push_str(&format!(" --seeds {seeds}"));
    }
    for f in filter {
        command.push_str(&format!(" --scenario {f}"));
    }
    let md = report::markdown(
        &results,
        &Provenance {
            command,
            wall_secs: wall,
            jobs,
            compressed,
            seed_runs,
        },
    );
    let path = out.join("report.md");
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wrote {} and {} plots in {:.1} s",
        path.display(),
        results.len(),
        wall
    );
    Ok(())
}

fn run_cmd(
    scenario: &Path,
    policy: Option<String>,
    compress: Option<f64>,
    decisions: bool,
    samples: Option<&str>,
) -> Result<()> {
    let window = match samples {
        Some(w) => {
            let (a, b) = w.split_once(':').context("--samples wants FROM:TO")?;
            Some((a.parse::<usize>()?, b.parse::<usize>()?))
        }
        None => None,
    };
    let mut s = Scenario::load(scenario).context("loading the scenario")?;
    if let Some(f) = compress {
        if !(f > 0.0 && f <= 1.0) {
            bail!("--compress must be in (0, 1]");
        }
        s = s.compressed(f);
    }
    let policies = match policy {
        Some(k) => vec![policy::by_key(&k).with_context(|| format!("unknown policy {k}"))?],
        None => policy::for_scenario(&s),
    };
    for p in policies {
        let started = Instant::now();
        let sim = Simulation::new(&s, p);
        let out = sim.run()?;
        let wall = started.elapsed().as_secs_f64();
        let sum = summarize(&s, sim.timeline(), &out);
        println!(
            "== {} / {} ({:.2} s wall, {:.1} M events/s)",
            s.name,
            p.name,
            wall,
            out.events as f64 / wall / 1e6
        );
        println!("{sum:#?}");
        if let Some((a, b)) = window {
            println!(
                "t,arrivals,attempts,failures,completed,dead_lettered,queue_age,depth,in_flight,desired,ready,pods,backoff,capacity,throttled,regime,demand,broker_rejected,producer_backlog,producer_state"
            );
            for (i, x) in out.samples.iter().enumerate().take(b).skip(a) {
                println!(
                    "{i},{},{},{},{},{},{:.1},{},{},{},{},{},{:.3},{:.1},{},{},{},{},{},{}",
                    x.arrivals,
                    x.attempts,
                    x.failures,
                    x.completed,
                    x.dead_lettered,
                    x.queue_age,
                    x.depth,
                    x.in_flight,
                    x.desired,
                    x.ready,
                    x.pods,
                    x.backoff,
                    x.capacity,
                    x.throttled,
                    x.regime.map_or("", |r| r.as_str()),
                    x.demand,
                    x.broker_rejected,
                    x.producer_backlog,
                    x.producer_state.map_or("", |p| p.as_str())
                );
            }
        }
        if decisions {
            for l in &out.producer_log {
                println!(
                    "{:>8.0}s producers {} {}: {}",
                    l.t,
                    l.state.as_str(),
                    l.rate.map_or(String::new(), |r| format!("{r}/s")),
                    l.message
                );
            }
            for d in &out.decisions {
                println!(
                    "{:>8.0}s {:>3} -> {:>3} {:?} {:?}: {}",
                    d.t,
                    d.from,
                    d.decision.desired,
                    d.decision.regime,
                    d.decision.action,
                    d.decision.reason
                );
            }
        }
    }
    Ok(())
}
