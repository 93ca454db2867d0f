//! The operator of this repository as a separate process with its own ServiceAccount.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backpressure_envtest::Supervised;

/// The binary next to the running one (same cargo target dir and profile), built first with
/// `$CARGO` when `build` is set and this process runs under cargo. `$BP_OPERATOR_BIN`
/// overrides.
pub async fn find_binary(build: bool) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("BP_OPERATOR_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        let cwd =
            std::env::current_dir().map_or_else(|e| e.to_string(), |d| d.display().to_string());
        return Err(format!(
            "BP_OPERATOR_BIN={} is not a file (a relative path resolves against {cwd})",
            p.display()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut dir = exe
        .parent()
        .map(Path::to_path_buf)
        .ok_or("no executable directory")?;
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    let candidate = dir.join("backpressure-operator");
    if let Some(cargo) = std::env::var_os("CARGO").filter(|_| build) {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = tokio::process::Command::new(cargo);
        cmd.args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "backpressure-operator",
            "--bin",
            "backpressure-operator",
        ]);
        if release {
            cmd.arg("--release");
        }
        cmd.current_dir(crate::cluster::repo_root())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(900), cmd.output())
            .await
            .map_err(|_| "building the operator timed out".to_owned())?
            .map_err(|e| format!("running cargo: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(8).collect();
            return Err(format!(
                "building the operator failed:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
    }
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(format!("{} not found", candidate.display()))
    }
}

/// Whether the binary has the `run` subcommand the lab drives.
pub async fn check_run_subcommand(bin: &Path) -> Result<(), String> {
    let out = tokio::process::Command::new(bin)
        .args(["run", "--help"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let help = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && help.contains("--prometheus-url") {
        Ok(())
    } else {
        Err("`backpressure-operator run` (with --prometheus-url) is not implemented yet".into())
    }
}

/// Starts `backpressure-operator run` with `KUBECONFIG` set to its ServiceAccount kubeconfig.
pub fn start(
    bin: &Path,
    kubeconfig: &Path,
    prometheus_url: &str,
    metrics_port: u16,
    requeue: &str,
    log: &Path,
) -> Result<Supervised, String> {
    let args = vec![
        format!("KUBECONFIG={}", kubeconfig.display()),
        "RUST_LOG=info".to_owned(),
        bin.display().to_string(),
        "run".into(),
        "--prometheus-url".into(),
        prometheus_url.to_owned(),
        "--metrics-bind-address".into(),
        format!("127.0.0.1:{metrics_port}"),
        "--requeue-interval".into(),
        requeue.to_owned(),
    ];
    Supervised::spawn(
        "backpressure-operator",
        Path::new("/usr/bin/env"),
        &args,
        log,
    )
    .map_err(|e| e.to_string())
}
