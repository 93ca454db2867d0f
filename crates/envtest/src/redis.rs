//! A real `redis-server` on a free loopback port, for tests of Redis-backed queues.
//!
//! The Debian package `redis-server` (installed by `make deps`) provides the binary. Redis 7.0 or
//! later is required: the queue scripts of the lab and of the worker library's Redis Streams
//! source carry Redis 7 flags (`#!lua flags=allow-oom`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::Error;
use crate::process::{Supervised, free_port, wait_for_port};

/// A running `redis-server` with no persistence, its files in its own directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    process: Supervised,
}

impl RedisServer {
    /// Starts `redis-server` (from /usr/bin or /usr/local/bin) on a free loopback port, with no
    /// persistence, its files (and `redis.log`) in `dir`.
    pub fn start(dir: &Path) -> Result<Self, Error> {
        Self::start_on(dir, None)
    }

    /// [`RedisServer::start`] listening on `also` as well as on loopback (a test node's bridge
    /// address, where its pods reach the host), with protected mode off for those clients.
    pub fn start_on(dir: &Path, also: Option<std::net::Ipv4Addr>) -> Result<Self, Error> {
        let binary = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                Error::Binaries(
                    "redis-server not found; install the Debian package redis-server (make deps)"
                        .into(),
                )
            })?;
        let version = std::process::Command::new(&binary)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if let Some(major) = server_major_version(&version)
            && major < 7
        {
            return Err(Error::Binaries(format!(
                "Redis 7.0 or later is needed (the queue scripts are flagged allow-oom); found {}",
                version.trim()
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let port = free_port()?;
        let args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            also.map_or_else(|| "127.0.0.1".into(), |ip| format!("127.0.0.1 {ip}")),
            "--protected-mode".into(),
            if also.is_some() { "no" } else { "yes" }.into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--daemonize".into(),
            "no".into(),
            "--loglevel".into(),
            "warning".into(),
        ];
        let process = Supervised::spawn("redis-server", &binary, &args, &dir.join("redis.log"))?;
        let timeout = Duration::from_secs(20);
        if !wait_for_port(port, timeout) {
            return Err(Error::NotReady {
                name: "redis-server".into(),
                timeout,
                log: process.log_tail(20),
            });
        }
        Ok(Self { port, process })
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops the server.
    pub fn stop(&mut self) {
        self.process.stop();
    }
}

/// The major version in `redis-server --version` (`Redis server v=7.0.15 sha=...`).
pub fn server_major_version(version: &str) -> Option<u32> {
    let v = version.split("v=").nth(1)?;
    v.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_version() {
        assert_eq!(
            server_major_version("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0"),
            Some(7)
        );
        assert_eq!(server_major_version("Redis server v=6.0.16 sha=0"), Some(6));
        assert_eq!(server_major_version("something else"), None);
    }
}
