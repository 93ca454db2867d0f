//! End-to-end scenarios with real processes (minutes each): `make e2e` runs them with
//! `cargo test -p backpressure-lab --test e2e -- --ignored --test-threads=1`.
//!
//! Each test runs a bundled scenario through the operator and the KEDA side by side
//! and asserts the scenario's checks from the recorded data (see `record::checks`): the
//! operator holds during an outage while the KEDA grows, the dependency load stays
//! within 1.1x its capacity while the backlog drains, the operator dead-letters less, the
//! operator scales out for a genuine surge, and no message is lost in either run; under a
//! load-independent partial failure the operator completes >= 90 % of what the dependency
//! serves and dead-letters no more per failed call than a greedy fleet; with a Redis limited in
//! memory and producer pods, the operator's broker stays under its limit (producers paused
//! above the watermark) while the comparison's refuses writes, and no message is lost from the
//! producers' clients to acknowledgement. `outage-and-recovery` also runs the operator's workload
//! on the Go lab worker beside the Rust one (its `polyglot` section): both fleets' pods report
//! the configuration the operator pushed, and the Go fleet holds during the outage, processes
//! messages and loses none.
//!
//! The operator binary is built with `$CARGO` in the same profile first (or taken from
//! `BP_OPERATOR_BIN`); without it every operator check fails with "did not run".
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use backpressure_lab::record::Recording;
use backpressure_lab::run::{self, Options};
use backpressure_lab::scenario::Scenario;

/// One lab at a time, also when the harness runs tests in parallel.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn scenario(name: &str) {
    let _guard = ONE_AT_A_TIME.lock().await;
    backpressure_lab::install_crypto_provider();
    let sc = Scenario::load(name).unwrap();
    let out = backpressure_lab::cluster::repo_root()
        .join("out/lab/e2e-test")
        .join(name);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let report = run::run(
        Options {
            scenario: sc.clone(),
            out_dir: out.clone(),
            worker_exe: env!("CARGO_BIN_EXE_backpressure-lab").into(),
            with_operator: true,
            build_operator: true,
            timeline: true,
        },
        rx,
    )
    .await
    .unwrap();
    std::fs::write(
        out.join("recording.json"),
        serde_json::to_vec_pretty(&report.recording).unwrap(),
    )
    .unwrap();
    let _ = backpressure_lab::plot::write(&sc, &report.recording, &out.join("plot"));
    let mut failed = Vec::new();
    for c in &report.checks {
        println!(
            "[{}] {}: {}",
            if c.passed { "pass" } else { "FAIL" },
            c.name,
            c.detail
        );
        if !c.passed {
            failed.push(c.name.clone());
        }
    }
    assert!(!report.checks.is_empty(), "no checks ran");
    every_worker_pod_left_its_log(&sc, &report.recording, &out);
    assert!(
        failed.is_empty(),
        "{name}: failed checks {failed:?} (data and plot in {})",
        out.display()
    );
}

/// Each run has a log of at least as many worker pods as were ever Ready at once, also when
/// pods were scaled in before the end (on a real node the kubelet drops a deleted pod's log:
/// the lab follows every pod's from its start, as the stand-in keeps its processes' files).
fn every_worker_pod_left_its_log(sc: &Scenario, recording: &Recording, out: &Path) {
    let names: Vec<String> = std::fs::read_dir(out.join("logs/workers"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for run in &recording.runs {
        let peak = run.samples.iter().map(|s| s.ready).max().unwrap_or(0);
        let prefix = format!("{}-{}-", run.namespace, sc.workload.name);
        let logs = names.iter().filter(|n| n.starts_with(&prefix)).count();
        assert!(
            logs >= usize::try_from(peak).unwrap(),
            "{}: {logs} worker logs for a peak of {peak} Ready pods ({names:?})",
            run.label
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: several minutes with real processes; make e2e"]
async fn outage_and_recovery() {
    scenario("outage-and-recovery").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: several minutes with real processes; make e2e"]
async fn producer_surge() {
    scenario("producer-surge").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: several minutes with real processes; make e2e"]
async fn quota_overload() {
    scenario("quota-overload").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: several minutes with real processes; make e2e (alone: make e2e-partial-failure)"]
async fn partial_failure() {
    scenario("partial-failure").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "e2e: several minutes with real processes; make e2e"]
async fn bounded_broker() {
    scenario("bounded-broker").await;
}
