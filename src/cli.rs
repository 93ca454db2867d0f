//! Command-line arguments, each with an environment variable default.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::observe::scope::WatchScope;

/// backpressure-operator: backpressure-aware autoscaling for queue workers.
#[derive(Debug, Parser)]
#[command(
    name = "backpressure-operator",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Operator settings for `run` (also accepted without the subcommand).
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator (the default).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
    /// GET a URL (the operator's /readyz) until it answers 200; exit 1 if it does not within
    /// --wait. The chart's `helm test` Pod runs this.
    Probe(ProbeArgs),
}

/// Settings of `probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL, e.g. http://backpressure-operator-metrics.backpressure-system.svc:8080/readyz.
    #[arg(long)]
    pub url: String,
    /// How long to keep trying.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Pause between attempts.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of the running operator.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Prometheus used by objects that set no `spec.metrics.prometheus.address`. Credentials
    /// in the URL (`http://user:pass@host`) work but are better given as a file
    /// (`--prometheus-bearer-token-file`, `--prometheus-basic-auth-file`); they are never shown.
    #[arg(long, env = "BP_PROMETHEUS_URL")]
    pub prometheus_url: Option<String>,

    /// A Prometheus (scheme, host and port) that objects may name in
    /// `spec.metrics.prometheus.address`, besides `--prometheus-url`; repeatable. The platform
    /// runs it: the Secret an object names in `secretRef` may be sent there.
    #[arg(
        long = "allowed-prometheus-address",
        env = "BP_ALLOWED_PROMETHEUS_ADDRESSES",
        value_delimiter = ','
    )]
    pub allowed_prometheus_addresses: Vec<String>,

    /// A file holding the bearer token for `--prometheus-url` (read again every 30 s, so a
    /// mounted Secret can rotate).
    #[arg(
        long,
        env = "BP_PROMETHEUS_BEARER_TOKEN_FILE",
        conflicts_with = "prometheus_basic_auth_file"
    )]
    pub prometheus_bearer_token_file: Option<std::path::PathBuf>,

    /// A file holding `username:password` for `--prometheus-url` (read again every 30 s).
    #[arg(long, env = "BP_PROMETHEUS_BASIC_AUTH_FILE")]
    pub prometheus_basic_auth_file: Option<std::path::PathBuf>,

    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "BP_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,

    /// Interval between reconciles of an object (jittered by up to 10%).
    #[arg(long, env = "BP_REQUEUE_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub requeue_interval: Duration,

    /// Reconciles running at once.
    #[arg(long, env = "BP_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,

    /// Take part in leader election through a coordination.k8s.io Lease; only the leader acts.
    #[arg(long, env = "BP_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// Name of the leader Lease (in `--namespace`).
    #[arg(long, env = "BP_LEASE_NAME", default_value = "backpressure-operator")]
    pub lease_name: String,

    /// Lease duration: a standby takes over this long after the leader stops renewing.
    #[arg(long, env = "BP_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The operator's own namespace (the Lease and its ServiceAccount live there).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// This replica's identity in the Lease and in events (default: the hostname).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,

    /// The operator's ServiceAccount (in `--namespace`), whose tokens (one per target, audience
    /// backpressure.dev/<namespace>/<workload>) authenticate config pushes. Default: learned
    /// from a SelfSubjectReview.
    #[arg(long, env = "SERVICE_ACCOUNT_NAME")]
    pub service_account: Option<String>,

    /// PEM bundle of the CA(s) that issue the workers' admin certificates. Pods annotated
    /// `backpressure.dev/admin-scheme: https` are pushed to over TLS, verified against these
    /// roots and the name `<workload>.<namespace>.svc`; without this flag they are not pushed to.
    #[arg(long, env = "BP_PUSH_CA_FILE")]
    pub push_ca_file: Option<std::path::PathBuf>,

    /// Age at which a push token is replaced (at most 5m, the default). Hidden: tests shorten it
    /// to see a rotation.
    #[arg(long, env = "BP_PUSH_TOKEN_RENEW", default_value = "5m", value_parser = parse_duration, hide = true)]
    pub push_token_renew: Duration,

    /// Namespaces whose WorkerBackpressures, targets, pods, ConfigMaps and autoscalers the
    /// operator watches, comma-separated (default: every namespace). With a list, the operator
    /// needs those rights only in a Role per listed namespace (chart value `watchNamespaces`);
    /// BackpressurePolicies and Namespaces are still watched cluster-wide.
    #[arg(long, env = "BP_WATCH_NAMESPACES", default_value = "", value_parser = parse_scope)]
    pub watch_namespaces: WatchScope,

    /// Log filter when `RUST_LOG` is unset (error, warn, info, debug, trace).
    #[arg(long, env = "BP_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "BP_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

fn parse_scope(s: &str) -> Result<WatchScope, String> {
    WatchScope::parse(s).map_err(|e| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    backpressure_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_and_flags() {
        let cli = Cli::try_parse_from(["backpressure-operator"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run.requeue_interval, Duration::from_secs(15));
        let cli = Cli::try_parse_from([
            "backpressure-operator",
            "run",
            "--requeue-interval",
            "2s",
            "--prometheus-url",
            "http://127.0.0.1:9090",
        ])
        .unwrap();
        let Some(Command::Run(run)) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(run.requeue_interval, Duration::from_secs(2));
        let cli = Cli::try_parse_from([
            "backpressure-operator",
            "--leader-elect=true",
            "--lease-name=l",
        ])
        .unwrap();
        assert!(cli.run.leader_elect);
        assert_eq!(cli.run.lease_name, "l");
        assert!(
            Cli::try_parse_from(["backpressure-operator", "--requeue-interval", "soon"]).is_err()
        );
    }

    #[test]
    fn parses_probe_as_the_helm_test_pod_runs_it() {
        let cli = Cli::try_parse_from([
            "backpressure-operator",
            "probe",
            "--url=http://op-metrics.ns.svc:8080/readyz",
            "--wait=90s",
        ])
        .unwrap();
        let Some(Command::Probe(probe)) = cli.command else {
            panic!("probe expected")
        };
        assert_eq!(probe.url, "http://op-metrics.ns.svc:8080/readyz");
        assert_eq!(probe.wait, Duration::from_secs(90));
        assert_eq!(probe.interval, Duration::from_secs(2));
        assert!(Cli::try_parse_from(["backpressure-operator", "probe"]).is_err());
    }
}
