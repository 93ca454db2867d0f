//! A real RabbitMQ broker (the Debian `rabbitmq-server` package) on loopback, started as a plain
//! process (not a system service) with its own directories, ports, Erlang cookie and `epmd`, and
//! the `rabbitmq_prometheus` plugin enabled from a private enabled-plugins file (offline: the
//! plugin ships with the package).
//!
//! ```no_run
//! # fn example() -> Result<(), backpressure_envtest::Error> {
//! let broker = backpressure_envtest::RabbitMq::start()?;
//! let uri = broker.amqp_uri(); // amqp://guest:guest@127.0.0.1:<port>/%2f
//! let metrics = broker.prometheus_address(); // 127.0.0.1:<port>, /metrics and /metrics/detailed
//! # let _ = (uri, metrics); Ok(()) }
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process::{self, Supervised};
use crate::{Error, unique};

/// How long the broker may take to open its ports (it takes 10-20 s on 2 busy cores).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running (or stopped) RabbitMQ node.
#[derive(Debug)]
pub struct RabbitMq {
    dir: PathBuf,
    node: String,
    amqp_port: u16,
    prometheus_port: u16,
    dist_port: u16,
    epmd_port: u16,
    server_binary: PathBuf,
    epmd: Option<Supervised>,
    server: Option<Supervised>,
    start_time: Duration,
}

impl RabbitMq {
    /// The `rabbitmq-server` script: `$BP_RABBITMQ_SERVER`, else the Debian package's
    /// `/usr/lib/rabbitmq/bin/rabbitmq-server` (not `/usr/sbin/rabbitmq-server`, which switches
    /// to the `rabbitmq` user and its system directories).
    pub fn server_binary() -> Result<PathBuf, Error> {
        if let Some(p) = std::env::var_os("BP_RABBITMQ_SERVER") {
            return Ok(PathBuf::from(p));
        }
        let p = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        if p.is_file() {
            return Ok(p);
        }
        Err(Error::Binaries(
            "rabbitmq-server not found; install the Debian package `rabbitmq-server` (make deps)"
                .into(),
        ))
    }

    /// True when the broker can be started here (the package is installed and `epmd` is on the
    /// PATH).
    pub fn available() -> bool {
        Self::server_binary().is_ok() && epmd_binary().is_some()
    }

    /// Starts a broker in a fresh temporary directory and waits until its AMQP and Prometheus
    /// ports accept connections.
    pub fn start() -> Result<Self, Error> {
        let base = std::env::var_os("BP_ENVTEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let id = format!("{}-{}", std::process::id(), unique());
        let dir = base.join(format!("bp-rabbitmq-{id}"));
        for d in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(dir.join(d))
                .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        }
        process::remove_dir_on_exit(&dir)?;
        let cookie = dir.join("home/.erlang.cookie");
        std::fs::write(&cookie, format!("bp{}", id.replace('-', "x")))
            .map_err(|e| Error::io("write .erlang.cookie".into(), e))?;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))
            .map_err(|e| Error::io("chmod .erlang.cookie".into(), e))?;
        std::fs::write(dir.join("enabled_plugins"), "[rabbitmq_prometheus].\n")
            .map_err(|e| Error::io("write enabled_plugins".into(), e))?;
        let mut r = RabbitMq {
            node: format!("bp{}@localhost", id.replace('-', "x")),
            amqp_port: process::free_port()?,
            prometheus_port: process::free_port()?,
            dist_port: process::free_port()?,
            epmd_port: process::free_port()?,
            server_binary: Self::server_binary()?,
            dir,
            epmd: None,
            server: None,
            start_time: Duration::ZERO,
        };
        let config = format!(
            "listeners.tcp.default = 127.0.0.1:{}\nprometheus.tcp.port = {}\nprometheus.tcp.ip = 127.0.0.1\nloopback_users = none\n",
            r.amqp_port, r.prometheus_port
        );
        std::fs::write(r.dir.join("rabbitmq.conf"), config)
            .map_err(|e| Error::io("write rabbitmq.conf".into(), e))?;
        r.start_again()?;
        Ok(r)
    }

    /// Starts the stopped broker again on the same ports and data (queues declared durable and
    /// their persistent messages survive).
    pub fn start_again(&mut self) -> Result<(), Error> {
        if self.server.as_mut().is_some_and(Supervised::is_running) {
            return Ok(());
        }
        let started = Instant::now();
        if !self.epmd.as_mut().is_some_and(Supervised::is_running) {
            let epmd = epmd_binary().ok_or_else(|| {
                Error::Binaries("epmd not found (it comes with rabbitmq-server's Erlang)".into())
            })?;
            // A private epmd (not the shared daemon on 4369), stopped with the test.
            self.epmd = Some(Supervised::spawn(
                "epmd",
                &epmd,
                &["-port".into(), self.epmd_port.to_string()],
                &self.dir.join("epmd.log"),
            )?);
            let owned = self
                .epmd
                .as_mut()
                .is_some_and(|e| e.wait_for_own_port(self.epmd_port, Duration::from_secs(10)));
            if !owned {
                return Err(Error::NotReady {
                    name: "epmd".into(),
                    timeout: Duration::from_secs(10),
                    log: process::tail(&self.dir.join("epmd.log"), 10),
                });
            }
        }
        let d = |p: &str| self.dir.join(p).display().to_string();
        let (amqp, dist, epmd) = (
            self.amqp_port.to_string(),
            self.dist_port.to_string(),
            self.epmd_port.to_string(),
        );
        let (home, mnesia, log, plugins, config, pid) = (
            d("home"),
            d("mnesia"),
            d("log"),
            d("enabled_plugins"),
            d("rabbitmq.conf"),
            d("rabbitmq.pid"),
        );
        let env = [
            ("HOME", home.as_str()),
            ("ERL_EPMD_PORT", epmd.as_str()),
            ("RABBITMQ_NODENAME", self.node.as_str()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1"),
            ("RABBITMQ_NODE_PORT", amqp.as_str()),
            ("RABBITMQ_DIST_PORT", dist.as_str()),
            ("RABBITMQ_MNESIA_BASE", mnesia.as_str()),
            ("RABBITMQ_LOG_BASE", log.as_str()),
            ("RABBITMQ_LOGS", "-"),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", plugins.as_str()),
            ("RABBITMQ_CONFIG_FILE", config.as_str()),
            ("RABBITMQ_PID_FILE", pid.as_str()),
        ];
        self.server = Some(Supervised::spawn_with_env(
            "rabbitmq-server",
            &self.server_binary,
            &[],
            &env,
            &self.dir.join("rabbitmq.log"),
        )?);
        let deadline = Instant::now() + START_TIMEOUT;
        for port in [self.amqp_port, self.prometheus_port] {
            let left = deadline.saturating_duration_since(Instant::now());
            // The listener must be this broker's (its script's Erlang VM), not another
            // process that took the port after it was picked.
            let owned = self
                .server
                .as_mut()
                .is_some_and(|s| s.wait_for_own_port(port, left));
            if !owned {
                let log = self.log_tail(30);
                self.stop();
                return Err(Error::NotReady {
                    name: "rabbitmq-server".into(),
                    timeout: START_TIMEOUT,
                    log,
                });
            }
        }
        self.start_time = started.elapsed();
        tracing::info!(node = %self.node, took = ?self.start_time, "rabbitmq-server ready");
        Ok(())
    }

    /// Stops the broker (SIGTERM; the data stays, for [`RabbitMq::start_again`]).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.server.take() {
            p.stop();
        }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default vhost `/`).
    pub fn amqp_uri(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// The AMQP port.
    pub fn amqp_port(&self) -> u16 {
        self.amqp_port
    }

    /// `127.0.0.1:<port>` of the Prometheus plugin (`/metrics`, `/metrics/detailed`,
    /// `/metrics/per-object`).
    pub fn prometheus_address(&self) -> String {
        format!("127.0.0.1:{}", self.prometheus_port)
    }

    /// The Erlang node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How long the last start took until both ports accepted connections.
    pub fn start_time(&self) -> Duration {
        self.start_time
    }

    /// The last `lines` lines of the broker's log.
    pub fn log_tail(&self, lines: usize) -> String {
        process::tail(&self.dir.join("rabbitmq.log"), lines)
    }

    /// Runs `rabbitmqctl <args>` against this node (same cookie and epmd) and returns its
    /// output; for example `close_all_connections "test"` to cut every client off.
    pub fn rabbitmqctl(&self, args: &[&str]) -> Result<String, Error> {
        let ctl = self
            .server_binary
            .parent()
            .map(|d| d.join("rabbitmqctl"))
            .ok_or_else(|| Error::Binaries("rabbitmqctl not found".into()))?;
        let out = std::process::Command::new(&ctl)
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .env("HOME", self.dir.join("home"))
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| Error::io(format!("run {}", ctl.display()), e))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(Error::Config(format!("rabbitmqctl {args:?}: {text}")))
        }
    }

    /// The broker's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RabbitMq {
    fn drop(&mut self) {
        self.stop();
        if let Some(mut p) = self.epmd.take() {
            p.stop();
        }
    }
}

fn epmd_binary() -> Option<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin", "/usr/lib/erlang/bin"])
        .map(|d| Path::new(d).join("epmd"))
        .find(|p| p.is_file())
}
