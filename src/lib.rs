//! backpressure-operator: reconciles `WorkerBackpressure` objects.
//!
//! Where things are, in layers; each imports only the layers below it (`tools/import-graph.sh`
//! prints the import graph of these modules and fails on a cycle):
//! - the runtime: [`run`] (here), [`controller`] (watches, triggers, leader gating, background
//!   tasks), [`leader`], [`admin`], [`telemetry`], [`cli`];
//! - [`reconcile`]: one reconcile as named steps, and what it needs from the runtime
//!   ([`reconcile::Context`]);
//! - [`metrics`]: the operator's metrics registry (observe and act record into it through the
//!   small traits they define, without depending on it);
//! - [`observe`] (reads) and [`act`] (writes), the I/O around the decision;
//!   [`policy_status`]: what each BackpressurePolicy applies to, in its status;
//!   [`annotations`]: the manual overrides of `kubectl wbp`; [`plugin`]: that plugin's views;
//! - `backpressure_core` (its own crate, no client): `resolve`, the precedence of spec,
//!   policies and defaults, and `decide`, the pure decision shared with the simulator;
//! - `backpressure_api`: the CRD types, the wire contract and the field manager.

pub mod act;
pub mod admin;
pub mod annotations;
pub mod cli;
pub mod controller;
pub mod errors;
pub mod leader;
pub mod metrics;
pub mod observe;
pub mod plugin;
pub mod policy_status;
pub mod probe;
pub mod reconcile;
pub mod telemetry;

use std::sync::Arc;

use anyhow::Context as _;

/// Runs the operator with `args` until SIGTERM or Ctrl-C (or lost leadership, an error).
pub async fn run(args: cli::RunArgs) -> anyhow::Result<()> {
    telemetry::init(args.log_format, &args.log_level);
    // One TLS provider for every client in the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client")?;
    let metrics = Arc::new(metrics::Metrics::default());
    let health = Arc::new(admin::Health::default());
    let (bound, server) = admin::serve(args.metrics_bind_address, metrics.clone(), health.clone())
        .await
        .with_context(|| format!("binding {}", args.metrics_bind_address))?;
    tokio::spawn(server);
    tracing::info!(metrics = %bound, "serving /metrics, /healthz, /readyz");

    let identity = identity(
        &client,
        args.namespace.as_deref(),
        args.service_account.as_deref(),
    )
    .await;
    let instance = args
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("backpressure-operator-{}", std::process::id()));

    let leader = if args.leader_elect {
        let namespace = args
            .namespace
            .clone()
            .or_else(|| identity.as_ref().map(|i| i.namespace.clone()))
            .context("--namespace is required for leader election when it cannot be inferred")?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let cfg = leader::LeaseConfig {
            namespace,
            name: args.lease_name.clone(),
            identity: instance.clone(),
            duration: args.lease_duration,
        };
        tokio::spawn(leader::run(client.clone(), cfg, tx));
        Some(rx)
    } else {
        None
    };

    let prometheus = observe::access::PrometheusAccess::new(
        args.prometheus_url.as_deref(),
        args.allowed_prometheus_addresses.clone(),
        args.prometheus_bearer_token_file.clone(),
        args.prometheus_basic_auth_file.clone(),
    );
    if matches!(
        prometheus.default_auth,
        observe::access::DefaultAuth::FromUrl(_)
    ) {
        tracing::warn!(
            prometheus = prometheus.default_address.as_deref().unwrap_or_default(),
            "--prometheus-url carries credentials: they are used but never shown; prefer \
             --prometheus-bearer-token-file or --prometheus-basic-auth-file"
        );
    }
    let settings = reconcile::Settings {
        prometheus: Arc::new(prometheus),
        requeue_interval: args.requeue_interval,
    };
    let options = controller::RunOptions {
        settings,
        identity,
        push_token_renew: args.push_token_renew,
        push_tls: match &args.push_ca_file {
            Some(path) => Some(act::push::push_tls_config(path).map_err(anyhow::Error::msg)?),
            None => None,
        },
        reporter_instance: instance,
        metrics,
        health,
        concurrency: args.concurrency,
        leader,
        scope: args.watch_namespaces.clone(),
    };
    controller::run(client, options, shutdown_signal())
        .await
        .map_err(anyhow::Error::from)
}

/// The operator's own ServiceAccount: `--namespace` + `--service-account`, or learned from a
/// SelfSubjectReview.
async fn identity(
    client: &kube::Client,
    namespace: Option<&str>,
    sa: Option<&str>,
) -> Option<act::push::Identity> {
    if let (Some(ns), Some(name)) = (namespace, sa)
        && !ns.is_empty()
        && !name.is_empty()
    {
        return Some(act::push::Identity {
            namespace: ns.into(),
            name: name.into(),
        });
    }
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = SelfSubjectReview::default();
    match api.create(&kube::api::PostParams::default(), &review).await {
        Ok(r) => {
            let user = r
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .unwrap_or_default();
            let parsed = user
                .strip_prefix("system:serviceaccount:")
                .and_then(|rest| rest.split_once(':'));
            match parsed {
                Some((ns, name)) => Some(act::push::Identity {
                    namespace: ns.into(),
                    name: name.into(),
                }),
                None => {
                    tracing::warn!(%user, "not running as a ServiceAccount: config pushes carry no token");
                    None
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "SelfSubjectReview failed: config pushes carry no token");
            None
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
    tracing::info!("shutting down");
}
