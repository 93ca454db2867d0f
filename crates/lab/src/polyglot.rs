//! The lab's workers in other languages than Rust (the scenario's `polyglot` section): where
//! their program is and how the kubelet stand-in starts one for a pod.
//!
//! The Go worker (`crates/lab/workers/go/`) is built on the Go SDK as an adopter would build it
//! and runs the same Lua scripts as the Rust worker (`crates/lab/lua/`, passed as `--scripts`).

use std::path::{Path, PathBuf};

use crate::scenario::WorkerLanguage;

/// Environment variable naming a built Go lab worker (the Makefile sets it from
/// `tools/lab-worker-go/build.sh`).
pub const GO_WORKER_ENV: &str = "BP_LAB_GO_WORKER";

/// The directory of the queue's Lua scripts, shared by every lab worker.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lua")
}

/// The program of the worker in `language`: `$BP_LAB_GO_WORKER`, else what
/// `tools/lab-worker-go/build.sh` builds (a no-op when its cache is warm).
pub async fn worker_program(language: WorkerLanguage) -> Result<PathBuf, String> {
    match language {
        WorkerLanguage::Go => {
            if let Some(p) = std::env::var_os(GO_WORKER_ENV) {
                let p = PathBuf::from(p);
                return if p.is_file() {
                    Ok(p)
                } else {
                    Err(format!("{GO_WORKER_ENV}={} is not a file", p.display()))
                };
            }
            let script = crate::cluster::repo_root().join("tools/lab-worker-go/build.sh");
            let out = tokio::process::Command::new(&script)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit())
                .output()
                .await
                .map_err(|e| format!("{}: {e}", script.display()))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            match stdout.lines().last().map(PathBuf::from) {
                Some(p) if out.status.success() && p.is_file() => Ok(p),
                _ => Err(format!(
                    "{} failed ({}); set {GO_WORKER_ENV} to a built lab-worker-go",
                    script.display(),
                    out.status
                )),
            }
        }
    }
}

/// What the Go worker needs to review push tokens (the Go SDK's `APIServerConfig`: the API
/// server, its CA and the pod's ServiceAccount token file) and whom to accept pushes from.
#[derive(Clone, Debug)]
pub struct TokenReviewAccess {
    /// API server URL.
    pub api_url: String,
    /// Its CA bundle (PEM).
    pub ca_file: PathBuf,
    /// The worker pods' ServiceAccount token.
    pub token_file: PathBuf,
    /// The operator's identity.
    pub allowed_identity: String,
}

/// Arguments of the Go worker for a pod (the flags of the Rust `backpressure-lab worker`, plus
/// `--scripts` and the TokenReview access).
#[derive(Clone, Debug)]
pub struct GoWorkerArgs<'a> {
    /// `<pod ip>:<admin port>`.
    pub listen: String,
    /// Redis URL.
    pub redis: &'a str,
    /// Queue key prefix.
    pub queue: &'a str,
    /// The pod name.
    pub consumer: &'a str,
    /// Dependency base URL.
    pub dependency: &'a str,
    /// Workload label.
    pub workload: &'a str,
    /// The pod's namespace.
    pub namespace: &'a str,
    /// Local work per message (`150ms`).
    pub processing: &'a str,
    /// Visibility timeout (`4s`).
    pub visibility_timeout: &'a str,
    /// Deliveries before dead-lettering.
    pub max_deliveries: &'a str,
    /// Initial worker configuration file.
    pub config: &'a Path,
    /// The run's seed (the worker mixes in its pod's name).
    pub seed: u64,
    /// The queue's Lua scripts (`crates/lab/lua` on the host, or where the image keeps them).
    pub scripts: &'a Path,
    /// Push authentication (none: the worker accepts no push).
    pub auth: Option<&'a TokenReviewAccess>,
}

impl GoWorkerArgs<'_> {
    /// The command line.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            ("--listen", self.listen.clone()),
            ("--redis", self.redis.to_owned()),
            ("--queue", self.queue.to_owned()),
            ("--consumer", self.consumer.to_owned()),
            ("--dependency", self.dependency.to_owned()),
            ("--workload", self.workload.to_owned()),
            ("--namespace", self.namespace.to_owned()),
            ("--processing", self.processing.to_owned()),
            ("--visibility-timeout", self.visibility_timeout.to_owned()),
            ("--max-deliveries", self.max_deliveries.to_owned()),
            ("--config", self.config.display().to_string()),
            ("--seed", self.seed.to_string()),
            ("--scripts", self.scripts.display().to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect();
        if let Some(a) = self.auth {
            args.extend([
                "--kube-api-url".into(),
                a.api_url.clone(),
                "--kube-ca-file".into(),
                a.ca_file.display().to_string(),
                "--kube-token-file".into(),
                a.token_file.display().to_string(),
                "--allowed-identity".into(),
                a.allowed_identity.clone(),
            ]);
        }
        args
    }
}
