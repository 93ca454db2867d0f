//! `backpressure-conformance`: writes (or checks) the golden vectors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use backpressure_conformance::vectors;
use clap::{Parser, Subcommand};

/// `conformance/vectors` at the repository root.
const VECTORS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conformance/vectors");

#[derive(Parser, Debug)]
#[command(version, about = "Golden vectors of the backpressure wire contract")]
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
}

fn main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Vectors { out, check } => {
            let dir = out.unwrap_or_else(|| PathBuf::from(VECTORS_DIR));
            run_vectors(&dir, check)
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
