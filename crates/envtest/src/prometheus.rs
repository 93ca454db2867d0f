//! A real Prometheus (the Debian `prometheus` package) on loopback with a 1 s scrape interval.
//! Scrape targets come from a `file_sd` file the test rewrites, so a test can add and remove
//! the metric endpoints it serves without restarting Prometheus.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process::{self, Supervised};
use crate::{Error, unique};

/// One scrape target: `host:port` and the labels Prometheus attaches to its series.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    /// `127.0.0.1:<port>`.
    pub address: String,
    /// Target labels, for example `namespace` (Prometheus' kubernetes discovery adds it in a
    /// cluster).
    pub labels: BTreeMap<String, String>,
}

impl ScrapeTarget {
    /// A target at `address` (`127.0.0.1:<port>`) without labels, scraped at `/metrics`.
    pub fn new(address: impl Into<String>) -> Self {
        ScrapeTarget {
            address: address.into(),
            labels: BTreeMap::new(),
        }
    }

    /// Adds a target label.
    pub fn label(mut self, name: &str, value: &str) -> Self {
        self.labels.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Scrapes `path` instead of `/metrics` (the `__metrics_path__` target label).
    pub fn metrics_path(self, path: &str) -> Self {
        self.label("__metrics_path__", path)
    }

    /// Adds the URL parameter `name=value` to the scrape (the `__param_<name>` target label;
    /// one value per name: scrape `?family=a&family=b` as two targets).
    pub fn param(self, name: &str, value: &str) -> Self {
        self.label(&format!("__param_{name}"), value)
    }
}

/// A running (or stopped) Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    dir: PathBuf,
    port: u16,
    binary: PathBuf,
    process: Option<Supervised>,
    listen: std::net::Ipv4Addr,
}

impl Prometheus {
    /// The Prometheus binary: `$BP_PROMETHEUS`, else `prometheus` on the PATH or in /usr/bin.
    pub fn binary() -> Result<PathBuf, Error> {
        if let Some(p) = std::env::var_os("BP_PROMETHEUS") {
            return Ok(PathBuf::from(p));
        }
        for dir in std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .chain(["/usr/bin"])
        {
            let p = Path::new(dir).join("prometheus");
            if p.is_file() {
                return Ok(p);
            }
        }
        Err(Error::Binaries(
            "prometheus not found; install the Debian package `prometheus` (make deps)".into(),
        ))
    }

    /// Starts a Prometheus in a fresh temporary directory and waits until it is ready.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(Self::binary()?, std::net::Ipv4Addr::LOCALHOST, "")
    }

    /// [`Prometheus::start`] with `binary` (e.g. the one `tools/k8s/build.sh` builds with
    /// Kubernetes service discovery), listening on `listen` (a test node's bridge address,
    /// where its pods reach it), with `scrape_configs` (YAML list items, indented as under
    /// `scrape_configs:`) after the file-discovered `test` job.
    pub fn start_with(
        binary: PathBuf,
        listen: std::net::Ipv4Addr,
        scrape_configs: &str,
    ) -> Result<Self, Error> {
        let base = std::env::var_os("BP_ENVTEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("bp-prometheus-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        process::remove_dir_on_exit(&dir)?;
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: test\n  file_sd_configs:\n  - files: ['{}']\n    refresh_interval: 1s\n{scrape_configs}",
            dir.join("targets.json").display()
        );
        std::fs::write(dir.join("prometheus.yml"), config)
            .map_err(|e| Error::io("write prometheus.yml".into(), e))?;
        let mut p = Prometheus {
            port: process::free_port()?,
            binary,
            dir,
            process: None,
            listen,
        };
        p.set_targets(&[])?;
        p.start_again()?;
        Ok(p)
    }

    /// Starts the stopped Prometheus again on the same port and data.
    pub fn start_again(&mut self) -> Result<(), Error> {
        if self.process.as_mut().is_some_and(Supervised::is_running) {
            return Ok(());
        }
        let args = vec![
            format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ),
            format!("--storage.tsdb.path={}", self.dir.join("data").display()),
            format!("--web.listen-address={}:{}", self.listen, self.port),
            "--storage.tsdb.retention.time=2h".into(),
            "--web.enable-lifecycle".into(),
            "--log.level=warn".into(),
        ];
        let proc = Supervised::spawn(
            "prometheus",
            &self.binary,
            &args,
            &self.dir.join("prometheus.log"),
        )?;
        self.process = Some(proc);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.get("/-/ready").is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = self
            .process
            .as_ref()
            .map(|p| p.log_tail(30))
            .unwrap_or_default();
        Err(Error::NotReady {
            name: "prometheus".into(),
            timeout: Duration::from_secs(60),
            log,
        })
    }

    /// Stops Prometheus (the data stays, for [`Prometheus::start_again`]).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop();
        }
    }

    /// The base URL, `http://<listen address>:<port>` (`127.0.0.1` unless started on another).
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.listen, self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Replaces the scrape targets (picked up within about a second).
    pub fn set_targets(&self, targets: &[ScrapeTarget]) -> Result<(), Error> {
        let groups: Vec<serde_json::Value> = targets
            .iter()
            .map(|t| serde_json::json!({"targets": [t.address], "labels": t.labels}))
            .collect();
        let tmp = self.dir.join("targets.json.tmp");
        let text =
            serde_json::to_string_pretty(&groups).map_err(|e| Error::Config(e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| Error::io("write targets".into(), e))?;
        std::fs::rename(&tmp, self.dir.join("targets.json"))
            .map_err(|e| Error::io("rename targets".into(), e))
    }

    /// Runs an instant query and returns the JSON response.
    pub fn query(&self, expr: &str) -> Result<serde_json::Value, Error> {
        let path = format!("/api/v1/query?query={}", urlencode(expr));
        let (code, body) = self.get(&path)?;
        if code != 200 {
            return Err(Error::Config(format!(
                "query {expr:?}: HTTP {code}: {body}"
            )));
        }
        serde_json::from_str(&body).map_err(|e| Error::Config(format!("query {expr:?}: {e}")))
    }

    /// Waits until `expr` returns at least one series.
    pub fn wait_for_series(
        &self,
        expr: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = self.query(expr)
                && v["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
            {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    name: format!("series {expr}"),
                    timeout,
                    log: self
                        .process
                        .as_ref()
                        .map(|p| p.log_tail(20))
                        .unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn get(&self, path: &str) -> Result<(u16, String), Error> {
        let mut s = std::net::TcpStream::connect((self.listen, self.port))
            .map_err(|e| Error::io("connect to prometheus".into(), e))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| Error::io("set timeout".into(), e))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.listen)
            .map_err(|e| Error::io("write request".into(), e))?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)
            .map_err(|e| Error::io("read response".into(), e))?;
        let code = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((code, body))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Percent-encodes `s` for a URL query value (RFC 3986 unreserved characters stay).
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
