//! `kubectl wbp`: the fleet at a glance, the reasons behind decisions, and manual overrides.
//!
//! ```text
//! kubectl wbp status [-n NS | -A] [-o table|json]
//! kubectl wbp explain NAME [-n NS] [-o table|json]
//! kubectl wbp hold NAME --for 30m [-n NS]
//! kubectl wbp release NAME [-n NS]
//! kubectl wbp dry-run on|off (NAME | -l SELECTOR) [-n NS]
//! ```

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use backpressure_api::WorkerBackpressure;
use backpressure_operator::annotations;
use backpressure_operator::plugin::{self, Output};
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-wbp",
    version,
    about = "Inspect and steer WorkerBackpressure objects"
)]
struct Cli {
    /// Namespace (default: the kubeconfig's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// All namespaces (status only).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A table of every WorkerBackpressure: regime, replicas, backoff, queue age, since.
    Status,
    /// The last decision of one object with its reasons, conditions and recent events.
    Explain {
        /// The WorkerBackpressure.
        name: String,
    },
    /// Hold scale-out for a while, whatever the metrics say.
    Hold {
        /// The WorkerBackpressure.
        name: String,
        /// How long (e.g. 30m).
        #[arg(long = "for", value_parser = parse_duration)]
        for_: Duration,
    },
    /// Lift a manual hold.
    Release {
        /// The WorkerBackpressure.
        name: String,
    },
    /// Switch DryRun on or off by annotation, for one object or a label selector.
    DryRun {
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// The WorkerBackpressure (or use -l).
        name: Option<String>,
        /// Label selector.
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    backpressure_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the cluster (check KUBECONFIG)")?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let namespaced: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &ns);
    let now = Timestamp::now();
    match cli.command {
        Command::Status => {
            let api = if cli.all_namespaces {
                Api::all(client.clone())
            } else {
                namespaced
            };
            let list = api.list(&ListParams::default()).await?;
            print!(
                "{}",
                plugin::status_table(&list.items, cli.output, now, terminal_width())?
            );
        }
        Command::Explain { name } => {
            let wbp = namespaced
                .get(&name)
                .await
                .with_context(|| format!("WorkerBackpressure {ns}/{name}"))?;
            let events = plugin::events_for(&client, &ns, &name)
                .await
                .unwrap_or_default();
            print!("{}", plugin::explain(&wbp, &events, cli.output, now)?);
        }
        Command::Hold { name, for_ } => {
            let until = Timestamp::from_second(now.as_second() + for_.as_secs() as i64)
                .context("duration too long")?;
            annotate(
                &namespaced,
                &name,
                annotations::HOLD_UNTIL,
                Some(until.to_string()),
            )
            .await?;
            println!("workerbackpressure/{name} held until {until}");
        }
        Command::Release { name } => {
            annotate(&namespaced, &name, annotations::HOLD_UNTIL, None).await?;
            println!("workerbackpressure/{name} released");
        }
        Command::DryRun {
            state,
            name,
            selector,
        } => {
            let value = (state == "on").then(|| "true".to_owned());
            let names: Vec<String> = match (name, selector) {
                (Some(n), None) => vec![n],
                (None, Some(sel)) => namespaced
                    .list(&ListParams::default().labels(&sel))
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|w| w.metadata.name)
                    .collect(),
                _ => bail!("give a NAME or a label selector (-l), not both"),
            };
            for n in &names {
                annotate(&namespaced, n, annotations::DRY_RUN, value.clone()).await?;
                println!("workerbackpressure/{n} dry-run {state}");
            }
            if names.is_empty() {
                println!("no WorkerBackpressure matched");
            }
        }
    }
    Ok(())
}

/// Sets or removes one annotation with a merge patch (never touches fields Git owns).
async fn annotate(
    api: &Api<WorkerBackpressure>,
    name: &str,
    key: &str,
    value: Option<String>,
) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    let params = PatchParams {
        field_manager: Some(plugin::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating workerbackpressure/{name}"))?;
    Ok(())
}

/// Width to lay the table out for: `$COLUMNS` if set, else the terminal's width when stdout
/// is a terminal, else unlimited (piped output is never truncated, as with kubectl).
fn terminal_width() -> usize {
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .filter(|c: &usize| *c > 0)
    {
        return c;
    }
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return usize::MAX;
    }
    rustix::termios::tcgetwinsize(&stdout)
        .ok()
        .map(|w| usize::from(w.ws_col))
        .filter(|c| *c > 0)
        .unwrap_or(120)
}
