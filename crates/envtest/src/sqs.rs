//! moto's server (`moto[server]` from PyPI, installed by `tools/sqs/moto.sh` into a venv
//! cached by version outside the repository) as an SQS-compatible endpoint on a free port.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::Error;
use crate::process::{Supervised, free_port};

/// The moto version `tools/sqs/moto.sh` installs by default.
pub const MOTO_VERSION: &str = "5.1.22";

/// The region, account and credentials the server is used with (moto accepts any).
pub const REGION: &str = "us-east-1";
/// moto's default account ID, in every queue URL it answers.
pub const ACCOUNT: &str = "123456789012";
/// An access key ID (moto does not check signatures).
pub const ACCESS_KEY_ID: &str = "AKIDMOTOTEST";
/// Its secret.
pub const SECRET_ACCESS_KEY: &str = "moto-test-secret";

/// `moto_server`: `$BP_MOTO_SERVER` if set, otherwise what `tools/sqs/moto.sh` prints (it
/// installs moto once, about 90 s cold, and is a no-op afterwards).
pub fn moto_server_bin() -> Result<PathBuf, Error> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("BP_MOTO_SERVER") {
            return Ok(PathBuf::from(p));
        }
        let script = crate::repo_root().join("tools/sqs/moto.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .map(|l| PathBuf::from(l.trim()))
            .ok_or_else(|| format!("{} printed nothing", script.display()))
    })
    .clone()
    .map_err(Error::Binaries)
}

/// How many ports [`Moto::start`] tries before it gives up.
const ATTEMPTS: usize = 3;

/// A running moto server. Stopped on drop.
#[derive(Debug)]
pub struct Moto {
    process: Supervised,
    port: u16,
}

impl Moto {
    /// Starts moto on a free port of 127.0.0.1, logging to `dir/moto.log`, and waits until it
    /// listens there. [`free_port`] releases its port before moto binds it, so another process
    /// may take it in between: moto then exits, or a probe would reach the other listener. A
    /// port is taken as moto's only when the listening socket is moto's
    /// ([`Supervised::wait_for_own_port`]), and a lost port is retried on a new one.
    pub fn start(dir: &Path) -> Result<Moto, Error> {
        let bin = moto_server_bin()?;
        let log = dir.join("moto.log");
        let timeout = Duration::from_secs(30);
        for _ in 0..ATTEMPTS {
            let port = free_port()?;
            let mut process = Supervised::spawn(
                "moto",
                &bin,
                &[
                    "-H".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                ],
                &log,
            )?;
            if process.wait_for_own_port(port, timeout) {
                return Ok(Moto { process, port });
            }
            process.stop();
        }
        Err(Error::NotReady {
            name: "moto".into(),
            timeout,
            log: crate::process::tail(&log, 20),
        })
    }

    /// The endpoint URL (`http://127.0.0.1:<port>`), for `AWS_ENDPOINT_URL_SQS`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Stops the server.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}
