//! `backpressure-sim`: runs scenarios and writes the benchmark report.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use backpressure_sim::metrics::summarize;
use backpressure_sim::{POLICIES, Scenario, Simulation, policy};
use clap::{Parser, Subcommand};

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
    /// Runs one scenario under one or all policies and prints the summaries.
    Run {
        /// The scenario file.
        scenario: PathBuf,
        /// Policy key (greedy-keda, bp-static, bp-keda, bp-ours); all when absent.
        #[arg(long)]
        policy: Option<String>,
        /// Compress the scenario's timeline by this factor (0 < f <= 1).
        #[arg(long)]
        compress: Option<f64>,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            scenario,
            policy,
            compress,
        } => {
            let mut s = Scenario::load(&scenario).context("loading the scenario")?;
            if let Some(f) = compress {
                if !(f > 0.0 && f <= 1.0) {
                    bail!("--compress must be in (0, 1]");
                }
                s = s.compressed(f);
            }
            let policies = match policy {
                Some(k) => vec![policy::by_key(&k).with_context(|| format!("unknown policy {k}"))?],
                None => POLICIES.to_vec(),
            };
            for p in policies {
                let started = Instant::now();
                let sim = Simulation::new(&s, p);
                let out = sim.run()?;
                let wall = started.elapsed().as_secs_f64();
                let sum = summarize(&s, sim.timeline(), &out);
                println!(
                    "== {} / {} ({:.2}s wall, {:.1} M events/s)",
                    s.name,
                    p.name,
                    wall,
                    out.events as f64 / wall / 1e6
                );
                println!("{sum:#?}");
            }
        }
    }
    Ok(())
}
