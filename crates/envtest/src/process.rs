//! Child processes that never outlive the test binary.
//!
//! Each server runs under a small `sh` watchdog that polls the test process and stops the server
//! when the test process is gone, also after a panic, an abort or a SIGKILL, when no destructor
//! runs. Stopping on purpose sends SIGTERM to the watchdog, which forwards it and waits.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// The watchdog: `$1` is the test process, `$2` how many times the server is restarted when it
/// exits on its own (0 for most; systemd's `Restart=always` for a node's kubelet), 1 s apart,
/// each restart written to the log. A stop (TERM) or a kill (USR1) ends the server without a
/// restart.
const WATCHDOG: &str = r#"
watch=$1; max=$2; shift 2
"$@" &
child=$!
stop() {
  kill -TERM "$child" 2>/dev/null
  i=0
  while kill -0 "$child" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL "$child" 2>/dev/null
  wait "$child" 2>/dev/null
  exit 0
}
trap stop TERM INT
trap 'kill -KILL "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 0' USR1
restarts=0
while kill -0 "$watch" 2>/dev/null; do
  if ! kill -0 "$child" 2>/dev/null; then
    wait "$child"; rc=$?
    [ "$restarts" -ge "$max" ] && break
    restarts=$((restarts+1))
    echo "watchdog: $1 exited with status $rc; restart $restarts of $max in 1 s" >&2
    sleep 1
    "$@" &
    child=$!
  fi
  sleep 0.3
done
stop
"#;

/// A supervised server process with its log file.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    watchdog: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program args...` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Self, Error> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    /// [`Supervised::spawn`] for a server that its host would restart when it exits on its
    /// own (a node's kubelet under systemd): restarted up to `max_restarts` times. A start-up
    /// crash of the server itself (the kubelet 1.35 can die on a concurrent map access while
    /// it registers its node) then costs a restart, not the test.
    pub fn spawn_restarting(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        max_restarts: u32,
    ) -> Result<Self, Error> {
        Self::spawn_script(name, max_restarts, program, args, &[], log)
    }

    /// [`Supervised::spawn`] with extra environment variables (set even when empty).
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Self, Error> {
        Self::spawn_script(name, 0, program, args, env, log)
    }

    /// Runs the program under [`WATCHDOG`], restarted up to `max_restarts` times.
    fn spawn_script(
        name: &str,
        max_restarts: u32,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Self, Error> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("open log {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("open log {}", log.display()), e))?;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(std::process::id().to_string())
            .arg(max_restarts.to_string())
            .arg(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::io(format!("spawn {}", program.display()), e))?;
        Ok(Self {
            name: name.to_owned(),
            watchdog,
            log: log.to_owned(),
        })
    }

    /// The log file of the process.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// True while the watchdog (and so the server) runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.watchdog.try_wait(), Ok(None))
    }

    /// Waits until this server listens on `127.0.0.1:port`: something accepts connections
    /// there ([`connect`]) *and* the listening socket belongs to this server's process tree
    /// ([`listener_owned_by`]). False when the server exits first, `timeout` passes, or
    /// another process holds the port: [`free_port`] releases its port before the server binds
    /// it, and a bare probe would then take the other listener for this server.
    pub fn wait_for_own_port(&mut self, port: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.is_running() {
                return false;
            }
            if connect(port).is_some() {
                let root = self.watchdog.id();
                if listener_owned_by(port, root) {
                    return true;
                }
                // The scan of /proc can race the server's fork and exec: look once more.
                std::thread::sleep(Duration::from_millis(200));
                return listener_owned_by(port, root);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Kills the server with SIGKILL (a crash: no graceful shutdown) and waits for it.
    pub fn kill(&mut self) {
        if !self.is_running() {
            return;
        }
        let pid = self.watchdog.id().to_string();
        let _ = Command::new("kill").args(["-USR1", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && self.is_running() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.is_running() {
            let _ = self.watchdog.kill();
            let _ = self.watchdog.wait();
        }
    }

    /// Stops the server (SIGTERM, then SIGKILL after 10 s) and waits for it.
    pub fn stop(&mut self) {
        if !self.is_running() {
            return;
        }
        let pid = self.watchdog.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::warn!(name = %self.name, "watchdog did not stop; killing it");
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes `dir` once the test process is gone (a destructor may never run for a static).
/// The janitor runs in its own process group, so that a runner which kills the test's group
/// when a test fails (as CI does) does not take the clean-up with it.
pub fn remove_dir_on_exit(dir: &Path) -> Result<(), Error> {
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; sleep 12; rm -rf "$2""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("janitor")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io("spawn janitor".into(), e))?;
    Ok(())
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller binds it right after).
pub fn free_port() -> Result<u16, Error> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("bind a free port".into(), e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("read a free port".into(), e))
}

/// A connection to a listener on `127.0.0.1:port`, None when nothing accepts it.
///
/// A connection whose local port is `port` itself is not a listener: polling a port of the
/// ephemeral range while nothing listens can make the kernel pick that same port as the source,
/// and TCP's simultaneous open then connects the socket to itself.
pub fn connect(port: u16) -> Option<std::net::TcpStream> {
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    (s.local_addr().ok()?.port() != port).then_some(s)
}

/// Whether the socket listening on TCP `port` (any local address) is open in process `root` or
/// one of its descendants, read from Linux's `/proc`: the listening socket's inode in
/// `/proc/net/tcp{,6}`, and a `socket:[inode]` descriptor in `/proc/<pid>/fd`.
pub fn listener_owned_by(port: u16, root: u32) -> bool {
    let inodes = listening_inodes(port);
    !inodes.is_empty()
        && descendants(root)
            .into_iter()
            .any(|pid| holds_socket(pid, &inodes))
}

/// The inodes of the sockets in state LISTEN on `port`.
fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // `sl local_address rem_address st ... inode`: the address as hex `ADDR:PORT`, state
        // 0A is LISTEN, the inode is the tenth field.
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local = f[1].rsplit_once(':').map(|(_, p)| p);
            if local.and_then(|p| u16::from_str_radix(p, 16).ok()) != Some(port) {
                continue;
            }
            if let Ok(inode) = f[9].parse::<u64>()
                && inode != 0
            {
                out.push(inode);
            }
        }
    }
    out
}

/// `root` and every process below it.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while let Some(&p) = tree.get(i) {
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// Whether process `pid` has one of the sockets `inodes` open.
fn holds_socket(pid: u32, inodes: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .ok()
            .and_then(|l| {
                let l = l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
                l.parse::<u64>().ok()
            })
            .is_some_and(|i| inodes.contains(&i))
    })
}

/// Waits until something accepts TCP connections on `127.0.0.1:port` ([`connect`]).
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if connect(port).is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_exit(p: &mut Supervised, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !p.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn count(log: &Path, needle: &str) -> usize {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }

    #[test]
    fn a_server_that_exits_on_its_own_is_restarted_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("crash.log");
        let args = ["-c".to_owned(), "echo started; exit 2".to_owned()];
        let mut p =
            Supervised::spawn_restarting("crash", Path::new("/bin/sh"), &args, &log, 2).unwrap();
        assert!(wait_exit(&mut p, Duration::from_secs(15)));
        assert_eq!(count(&log, "started"), 3, "{}", tail(&log, 20));
        assert_eq!(count(&log, "exited with status 2"), 2, "{}", tail(&log, 20));
    }

    /// A server that never binds its port while another process listens there: the bare probe
    /// takes the other listener for it, the ownership check does not.
    #[test]
    fn another_process_on_the_port_is_not_taken_for_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = other.local_addr().unwrap().port();
        let args = ["-c".to_owned(), "exec sleep 60".to_owned()];
        let mut p =
            Supervised::spawn("idle", Path::new("/bin/sh"), &args, &dir.path().join("l")).unwrap();
        assert!(wait_for_port(port, Duration::from_secs(5)));
        assert!(!p.wait_for_own_port(port, Duration::from_secs(5)));
        assert!(p.is_running());
    }

    /// A server that listens on its port, from a child process (as `rabbitmq-server`'s script
    /// starts the Erlang VM), is found as the owner.
    #[test]
    fn a_server_listening_from_a_child_process_owns_its_port() {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port().unwrap();
        let py = format!(
            "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\n\
             s.listen()\ntime.sleep(60)"
        );
        let args = [
            "-c".to_owned(),
            format!("/usr/bin/python3 -c \"{py}\"; true"),
        ];
        let mut p = Supervised::spawn(
            "listener",
            Path::new("/bin/sh"),
            &args,
            &dir.path().join("l"),
        )
        .unwrap();
        assert!(
            p.wait_for_own_port(port, Duration::from_secs(15)),
            "{}",
            p.log_tail(10)
        );
    }

    #[test]
    fn a_stopped_server_is_not_restarted() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let args = ["-c".to_owned(), "echo started; exec sleep 60".to_owned()];
        let mut p =
            Supervised::spawn_restarting("server", Path::new("/bin/sh"), &args, &log, 5).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while count(&log, "started") == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        p.stop();
        assert!(!p.is_running());
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(count(&log, "started"), 1, "{}", tail(&log, 20));
        assert_eq!(count(&log, "restart"), 0, "{}", tail(&log, 20));
    }
}
