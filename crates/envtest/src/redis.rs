//! A real `redis-server` on a free loopback port, for tests of Redis-backed queues.
//!
//! The Debian package `redis-server` (installed by `make deps`) provides the binary. Redis 7.0 or
//! later is required: the queue scripts of the lab and of the worker library's Redis Streams
//! source carry Redis 7 flags (`#!lua flags=allow-oom`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Error;
use crate::process::{Supervised, free_port};

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
        let binary = binary()?;
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
        // `free_port` releases its port before the server binds it, so another process may take
        // it in between: the server then exits, and a probe may reach the other listener. Each
        // attempt waits for a server that answers with this server's own directory, and a lost
        // port is retried on a new one.
        let mut last = None;
        for _ in 0..ATTEMPTS {
            let port = free_port()?;
            let mut process = Supervised::spawn(
                "redis-server",
                &binary,
                &args(port, dir, also),
                &dir.join("redis.log"),
            )?;
            if wait_for_own_server(&mut process, port, dir, Duration::from_secs(20)) {
                return Ok(Self { port, process });
            }
            process.stop();
            last = Some(process.log_tail(20));
        }
        Err(Error::NotReady {
            name: "redis-server".into(),
            timeout: Duration::from_secs(20),
            log: last.unwrap_or_default(),
        })
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

/// The installed `redis-server`.
fn binary() -> Result<PathBuf, Error> {
    ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Binaries(
                "redis-server not found; install the Debian package redis-server (make deps)"
                    .into(),
            )
        })
}

/// How many ports [`RedisServer::start_on`] tries before it gives up.
const ATTEMPTS: usize = 3;

/// The command line of a server on `port` with its files in `dir`.
fn args(port: u16, dir: &Path, also: Option<std::net::Ipv4Addr>) -> Vec<String> {
    vec![
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
    ]
}

/// Waits until the server on `port` answers `CONFIG GET dir` with `dir`: false when `process`
/// exits first (its port was taken) or `timeout` passes.
fn wait_for_own_server(process: &mut Supervised, port: u16, dir: &Path, timeout: Duration) -> bool {
    let want = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !process.is_running() {
            return false;
        }
        if let Some(got) = config_dir(port) {
            return Path::new(&got) == want || Path::new(&got) == dir;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The `dir` a Redis server on `127.0.0.1:port` reports, None when nothing answers it.
fn config_dir(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = crate::process::connect(port)?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$3\r\ndir\r\n")
        .ok()?;
    let mut reply = Vec::new();
    let mut buf = [0_u8; 4096];
    // `*2 $3 dir $N <path>`: five CRLF-terminated lines.
    while reply.iter().filter(|&&b| b == b'\n').count() < 5 {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&reply);
    text.split("\r\n").nth(4).map(str::to_owned)
}

/// The major version in `redis-server --version` (`Redis server v=7.0.15 sha=...`).
pub fn server_major_version(version: &str) -> Option<u32> {
    let v = version.split("v=").nth(1)?;
    v.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server started on a port another server holds exits; the listener there answers with
    /// its own directory and is not taken for the new server (which a bare port probe would do).
    #[test]
    fn a_server_that_lost_its_port_is_not_mistaken_for_the_listener_there() {
        let base = std::env::temp_dir().join(format!("bp-envtest-redis-{}", std::process::id()));
        let mut first = RedisServer::start(&base.join("first")).unwrap();
        let dir = base.join("second");
        std::fs::create_dir_all(&dir).unwrap();
        let mut second = Supervised::spawn(
            "redis-server",
            &binary().unwrap(),
            &args(first.port(), &dir, None),
            &dir.join("redis.log"),
        )
        .unwrap();
        let own = wait_for_own_server(&mut second, first.port(), &dir, Duration::from_secs(10));
        second.stop();
        assert!(!own, "{}", second.log_tail(5));
        let first_dir = base.join("first");
        let port = first.port();
        assert!(wait_for_own_server(
            &mut first.process,
            port,
            &first_dir,
            Duration::from_secs(10)
        ));
        first.stop();
        let _ = std::fs::remove_dir_all(&base);
    }

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
