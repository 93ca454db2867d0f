//! `backpressure-lab`: run a scenario with real parts (`demo`), run every scenario and check the
//! end-to-end conditions (`e2e`), or act as one worker or producer process (`worker`,
//! `producer`, started by the lab's kubelet stand-in).

use std::path::PathBuf;

use anyhow::Context as _;
use backpressure_lab::record::{self, KEDA_RUN, OPERATOR, POLYGLOT, Recording};
use backpressure_lab::run::{self, Options, Report};
use backpressure_lab::scenario::{self, KedaTrigger, Scenario};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "backpressure-lab", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one scenario (default: outage-and-recovery) and draw what happened.
    Demo {
        /// Scenario name (see `list`) or path to a scenario file.
        #[arg(long, default_value = "outage-and-recovery")]
        scenario: String,
        /// Output folder (default out/lab/<scenario>-<timestamp>/).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run only the comparison (KEDA), not the operator.
        #[arg(long)]
        no_operator: bool,
        /// The comparison's KEDA trigger instead of the scenario's: `QueueAge` (Prometheus,
        /// metricType Value) or `LagCount` (redis-streams).
        #[arg(long, value_parser = parse_trigger)]
        keda_trigger: Option<KedaTrigger>,
    },
    /// Run every bundled scenario and check the end-to-end conditions; fails if one fails.
    E2e {
        /// Only these scenarios.
        #[arg(long)]
        scenario: Vec<String>,
        /// Output folder (default out/lab/e2e-<timestamp>/).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Re-check and re-plot a recorded run (`recording.json` or its folder).
    Check {
        /// The recording or the output folder holding it.
        recording: PathBuf,
    },
    /// List the bundled scenarios.
    List,
    /// One worker process (started by the kubelet stand-in).
    Worker(Box<backpressure_lab::worker::WorkerArgs>),
    /// One producer process (started by the kubelet stand-in for scenarios with producer pods).
    Producer(Box<backpressure_lab::producer::ProducerArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    backpressure_lab::install_crypto_provider();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    rt.block_on(async move {
        match cli.command {
            Command::Worker(args) => backpressure_lab::worker::run(*args).await,
            Command::Producer(args) => backpressure_lab::producer::run_pod(*args).await,
            Command::Check { recording } => {
                let path = if recording.is_dir() {
                    recording.join("recording.json")
                } else {
                    recording
                };
                let rec: Recording = serde_json::from_slice(
                    &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
                )?;
                let sc = Scenario::load(&rec.scenario)?;
                let checks = record::checks(&sc, &rec);
                let dir = path.parent().unwrap_or(std::path::Path::new("."));
                backpressure_lab::plot::write(&sc, &rec, &dir.join("plot"))?;
                print!("{}", summary_table(&sc, &rec));
                let mut ok = true;
                for c in &checks {
                    ok &= c.passed;
                    println!(
                        "  [{}] {}: {}",
                        if c.passed { "pass" } else { "FAIL" },
                        c.name,
                        c.detail
                    );
                }
                anyhow::ensure!(ok, "some checks failed");
                Ok(())
            }
            Command::List => {
                for name in scenario::bundled() {
                    let s = Scenario::load(&name)?;
                    println!("{name:<22} {:>4.0}s  {}", s.duration.secs(), s.description);
                }
                Ok(())
            }
            Command::Demo {
                scenario,
                out,
                no_operator,
                keda_trigger,
            } => {
                let mut sc = Scenario::load(&scenario)?;
                if let Some(t) = keda_trigger {
                    sc.keda.trigger = t;
                }
                let out = out.unwrap_or_else(|| default_out(&sc.name));
                let report = run_one(sc.clone(), out.clone(), !no_operator).await?;
                finish(&sc, &report, &out)?;
                Ok(())
            }
            Command::E2e { scenario, out } => {
                let names = if scenario.is_empty() {
                    scenario::bundled()
                } else {
                    scenario
                };
                let base = out.unwrap_or_else(|| default_out("e2e"));
                let mut failed = Vec::new();
                for name in names {
                    let sc = Scenario::load(&name)?;
                    let dir = base.join(&sc.name);
                    let report = run_one(sc.clone(), dir.clone(), true).await?;
                    if !finish(&sc, &report, &dir)? {
                        failed.push(sc.name.clone());
                    }
                }
                if failed.is_empty() {
                    println!("e2e: every check passed");
                    Ok(())
                } else {
                    anyhow::bail!("e2e: checks failed in {}", failed.join(", "))
                }
            }
        }
    })
}

fn parse_trigger(s: &str) -> Result<KedaTrigger, String> {
    match s {
        "QueueAge" => Ok(KedaTrigger::QueueAge),
        "LagCount" => Ok(KedaTrigger::LagCount),
        other => Err(format!("{other:?}: expected QueueAge or LagCount")),
    }
}

fn default_out(name: &str) -> PathBuf {
    let stamp = k8s_openapi::jiff::Zoned::now()
        .strftime("%Y%m%d-%H%M%S")
        .to_string();
    backpressure_lab::cluster::repo_root()
        .join("out/lab")
        .join(format!("{name}-{stamp}"))
}

async fn run_one(sc: Scenario, out: PathBuf, with_operator: bool) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    println!(
        "lab: scenario {} ({:.0}s): {}",
        sc.name,
        sc.duration.secs(),
        sc.description
    );
    println!("lab: output in {}", out.display());
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\nlab: interrupted; stopping everything ...");
            let _ = tx.send(true);
        }
    });
    let opts = Options {
        scenario: sc,
        out_dir: out,
        worker_exe: std::env::current_exe()?,
        with_operator,
        build_operator: true,
        timeline: true,
    };
    Ok(run::run(opts, rx).await?)
}

/// Writes the recording, CSVs, plots and prints the summary; returns whether every check passed.
fn finish(sc: &Scenario, report: &Report, out: &std::path::Path) -> anyhow::Result<bool> {
    let rec = &report.recording;
    std::fs::write(out.join("recording.json"), serde_json::to_vec_pretty(rec)?)?;
    for r in &rec.runs {
        std::fs::write(out.join(format!("{}.csv", r.label)), record::to_csv(r))?;
    }
    std::fs::write(
        out.join("checks.json"),
        serde_json::to_vec_pretty(&report.checks)?,
    )?;
    let plot = out.join("plot");
    let plotted = backpressure_lab::plot::write(sc, rec, &plot);
    println!();
    print!("{}", summary_table(sc, rec));
    println!();
    let mut all = true;
    for c in &report.checks {
        all &= c.passed;
        println!(
            "  [{}] {}: {}",
            if c.passed { "pass" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if let Some(why) = &report.operator_skipped {
        println!("\n  no operator run: {why}");
    }
    match plotted {
        Ok(()) => println!(
            "\nplot: {} and {}",
            plot.with_extension("png").display(),
            plot.with_extension("svg").display()
        ),
        Err(e) => println!("\nplot failed: {e}"),
    }
    println!(
        "data: {}/recording.json, per-run CSV, checks.json; logs in {}/logs",
        out.display(),
        out.display()
    );
    println!(
        "wall time: {:.0} s ({:.0} s building the operator, {:.0} s scenario){}",
        rec.wall_secs,
        report.build_secs,
        sc.duration.secs(),
        if report.interrupted {
            " (interrupted)"
        } else {
            ""
        }
    );
    Ok(all && !report.interrupted)
}

/// The scenario's target queue age: the operator run's `scaling.targetQueueAge` (KEDA's
/// threshold in the `QueueAge` comparison).
fn target_age(sc: &Scenario) -> f64 {
    sc.worker_backpressure
        .scaling
        .as_ref()
        .and_then(|s| s.target_queue_age.as_ref())
        .and_then(|d| d.get().ok())
        .map_or(sc.keda.target_queue_age.secs(), |d| d.as_secs_f64())
}

fn summary_table(sc: &Scenario, rec: &Recording) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "comparison: {} (real KEDA {}, HPA controller of kube-controller-manager {})\n",
        sc.keda.trigger.label(),
        backpressure_envtest::KEDA_VERSION,
        backpressure_envtest::KUBERNETES_VERSION
    ));
    s.push_str(&format!(
        "{:<11} {:>9} {:>8} {:>9} {:>9} {:>8} {:>7} {:>8} {:>9} {:>8} {:>9}\n",
        "run",
        "produced",
        "acked",
        "dead-ltr",
        "queued",
        "max rep",
        "max age",
        "max bkf",
        "dep fail%",
        "drained",
        "load/cap"
    ));
    let target = target_age(sc);
    let mut drains = Vec::new();
    // The polyglot run (the operator's workload on the Go worker) after the two compared runs.
    let polyglot = sc.polyglot.as_ref().map(|_| POLYGLOT);
    for label in [OPERATOR, KEDA_RUN].into_iter().chain(polyglot) {
        let Some(r) = rec.run(label) else {
            s.push_str(&format!("{label:<11} (did not run)\n"));
            continue;
        };
        let Some(last) = r.last() else { continue };
        let max_rep = r.samples.iter().map(|x| x.replicas).max().unwrap_or(0);
        let max_age = r.samples.iter().map(|x| x.queue_age).fold(0.0, f64::max);
        let max_bkf = r
            .samples
            .iter()
            .filter_map(|x| x.backoff)
            .fold(0.0, f64::max);
        let (req, ok) = r.samples.windows(2).fold((0.0, 0.0), |(a, b), w| {
            let dt = w[1].t - w[0].t;
            (a + w[1].dep_load * dt, b + w[1].dep_served * dt)
        });
        let fail = if req > 0.0 {
            100.0 * (1.0 - ok / req)
        } else {
            0.0
        };
        let drain = record::drain_secs(sc, r, target);
        if label != POLYGLOT {
            drains.push((label, drain, last.dead_lettered));
        }
        s.push_str(&format!(
            "{:<11} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6.0}s {:>8.2} {:>8.1}% {:>8} {:>9}\n",
            label,
            last.produced,
            last.completed,
            last.dead_lettered,
            last.in_stream,
            max_rep,
            max_age,
            max_bkf,
            fail,
            drain.map_or_else(|| "never".to_owned(), |d| format!("{d:.0}s")),
            record::recovery_load(sc, r).map_or_else(|| "-".to_owned(), |l| format!("{l:.2}x")),
        ));
    }
    if let [(_, op_drain, op_dlq), (_, keda_drain, keda_dlq)] = drains[..] {
        let drain = match (op_drain, keda_drain) {
            (Some(o), Some(k)) if k > 0.0 => {
                let slower = 100.0 * (o - k) / k;
                format!(
                    "drain {o:.0}s vs {k:.0}s ({slower:+.0}%: {})",
                    if slower <= 10.0 { "met" } else { "NOT met" }
                )
            }
            (Some(o), Some(k)) => format!("drain {o:.0}s vs {k:.0}s"),
            (o, k) => format!("drain {o:?} vs {k:?} (not comparable)"),
        };
        s.push_str(&format!(
            "goal (operator vs KEDA): dead letters {op_dlq} vs {keda_dlq} ({}), {drain}; drained = \
             seconds after the outage until the queue age is back at {target:.0}s\n",
            if op_dlq == 0 && keda_dlq > 0 {
                "met"
            } else if op_dlq <= keda_dlq {
                "no worse"
            } else {
                "NOT met"
            }
        ));
    }
    let with_producers: Vec<&record::RunRecord> = [OPERATOR, KEDA_RUN]
        .iter()
        .filter_map(|l| rec.run(l))
        .filter(|r| r.last().is_some_and(|x| x.producers.is_some()))
        .collect();
    if !with_producers.is_empty() {
        s.push_str(&format!(
            "\n{:<10} {:>9} {:>9} {:>9} {:>9} {:>12} {:>16}\n",
            "run", "demand", "written", "refused", "waiting", "max waiting", "peak memory MiB"
        ));
        for r in with_producers {
            let Some(p) = r.last().and_then(|x| x.producers.as_ref()) else {
                continue;
            };
            let max_waiting = r
                .samples
                .iter()
                .filter_map(|x| x.producers.as_ref().map(|p| p.waiting))
                .max()
                .unwrap_or(0);
            let peak = record::peak_memory(r)
                .map(|b| format!("{:.2}", b as f64 / f64::from(1u32 << 20)))
                .unwrap_or_else(|| "-".into());
            s.push_str(&format!(
                "{:<10} {:>9} {:>9} {:>9} {:>9} {:>12} {:>16}\n",
                r.label, p.demand, p.written, p.refused_by_broker, p.waiting, max_waiting, peak
            ));
        }
    }
    s
}
