//! `backpressure-conformance`: writes (or checks) the golden vectors, and checks a running
//! worker against the wire contract (`check`, see `conformance/README.md`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use backpressure_conformance::suite::{self, KubeTokens, ServiceAccountRef, Target};
use backpressure_conformance::vectors;
use clap::{Parser, Subcommand};

/// `conformance/vectors` at the repository root.
const VECTORS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/vectors");

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Golden vectors of the backpressure wire contract, and the conformance suite"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Writes controller.json from the Rust controllers (or, with --check, fails when the
    /// committed file differs from what would be written).
    Vectors {
        /// Output directory (default: conformance/vectors at the repository root).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Write nothing; exit 1 when the file in the directory differs.
        #[arg(long)]
        check: bool,
    },
    /// Checks a running worker from the outside: pushes, authentication, metrics and (with
    /// --vectors) the controller through its conformance hook. Tokens are minted through the
    /// cluster of KUBECONFIG (or the in-cluster ServiceAccount). Exits 1 when a check fails.
    Check {
        /// The worker's admin port, e.g. http://127.0.0.1:9464.
        #[arg(long)]
        worker_url: String,
        /// The worker's namespace.
        #[arg(long)]
        namespace: String,
        /// The worker's workload name.
        #[arg(long)]
        workload: String,
        /// The ServiceAccount (namespace/name) the worker accepts pushes from.
        #[arg(long)]
        operator_service_account: ServiceAccountRef,
        /// A ServiceAccount (namespace/name) the worker must refuse.
        #[arg(long)]
        other_service_account: ServiceAccountRef,
        /// controller.json to replay through the worker's conformance hook.
        #[arg(long)]
        vectors: Option<PathBuf>,
    },
}

fn main() -> Result<ExitCode> {
    // The Kubernetes client speaks TLS with ring (as the operator does).
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse().command {
        Command::Vectors { out, check } => {
            let dir = out.unwrap_or_else(|| PathBuf::from(VECTORS_DIR));
            run_vectors(&dir, check)
        }
        Command::Check {
            worker_url,
            namespace,
            workload,
            operator_service_account,
            other_service_account,
            vectors,
        } => {
            let target = Target {
                base_url: worker_url,
                namespace,
                workload,
            };
            let options = suite::Options {
                controller_vectors: vectors,
                ..suite::Options::default()
            };
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?
                .block_on(async {
                    let client = kube::Client::try_default()
                        .await
                        .context("the suite mints tokens: it needs Kubernetes credentials")?;
                    let tokens =
                        KubeTokens::new(client, operator_service_account, other_service_account);
                    let report = suite::run(&target, &tokens, &options).await?;
                    println!("{report}");
                    Ok(if report.passed() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    })
                })
        }
    }
}

fn run_vectors(dir: &Path, check: bool) -> Result<ExitCode> {
    let text = vectors::render(&vectors::generate())?;
    let path = dir.join(vectors::FILE_NAME);
    if check {
        let state = match std::fs::read_to_string(&path) {
            Ok(committed) if committed == text => {
                println!("{}: up to date", path.display());
                return Ok(ExitCode::SUCCESS);
            }
            Ok(_) => "differs from the generator".to_owned(),
            Err(e) => format!("cannot be read ({e})"),
        };
        eprintln!(
            "{}: {state}; run `cargo run -p backpressure-conformance -- vectors`",
            path.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{}: {} bytes", path.display(), text.len());
    Ok(ExitCode::SUCCESS)
}
