//! The backpressure-operator binary.

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = backpressure_operator::cli::Cli::parse();
    match cli.command {
        Some(backpressure_operator::cli::Command::Crd) => {
            for (_, yaml) in backpressure_api::crd::generated()? {
                print!("---\n{yaml}");
            }
            Ok(())
        }
        Some(backpressure_operator::cli::Command::Probe(args)) => {
            let body =
                backpressure_operator::probe::probe(&args.url, args.wait, args.interval).await?;
            println!("ready: {} answered 200 {}", args.url, body.trim());
            Ok(())
        }
        Some(backpressure_operator::cli::Command::Run(args)) => {
            backpressure_operator::run(*args).await
        }
        None => backpressure_operator::run(cli.run).await,
    }
}
