//! The processes the benchmark runs and measures: Prometheus, the operator, `/proc` statistics.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use backpressure_envtest::Prometheus;
use backpressure_envtest::Supervised;
use backpressure_envtest::TestEnv;

use super::operator;

/// A Prometheus with its own scrape interval, scraping `targets`.
pub(super) fn start_prometheus(
    dir: &Path,
    targets: &[String],
    scrape: u64,
) -> (Supervised, String) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let port = backpressure_envtest::process::free_port().unwrap();
    let list = targets
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let config = format!(
        "global:\n  scrape_interval: {scrape}s\n  scrape_timeout: {}s\n  evaluation_interval: {scrape}s\nscrape_configs:\n- job_name: fleet\n  static_configs:\n  - targets: [{list}]\n",
        scrape.max(2) - 1
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let args = vec![
        format!("--config.file={}", dir.join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", dir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--storage.tsdb.retention.time=2h".into(),
        "--log.level=warn".into(),
    ];
    let p = Supervised::spawn(
        "prometheus",
        &Prometheus::binary().unwrap(),
        &args,
        &dir.join("prometheus.log"),
    )
    .unwrap();
    assert!(
        backpressure_envtest::process::wait_for_port(port, Duration::from_secs(60)),
        "prometheus did not start: {}",
        p.log_tail(20)
    );
    (p, format!("http://127.0.0.1:{port}"))
}

/// The operator binary (release when run by `cargo bench`), as its ServiceAccount.
pub(super) fn start_operator(
    env: &'static TestEnv,
    kubeconfig: &Path,
    prometheus: &str,
    interval: u64,
    extra_env: &[String],
    prefix: &str,
) -> (Supervised, String, u32) {
    let port = backpressure_envtest::process::free_port().unwrap();
    let metrics = format!("127.0.0.1:{port}");
    let bin = env!("CARGO_BIN_EXE_backpressure-operator");
    let mut args: Vec<String> = vec![
        format!("KUBECONFIG={}", kubeconfig.display()),
        "RUST_LOG=info".into(),
    ];
    args.extend(extra_env.iter().cloned());
    args.extend(prefix.split_whitespace().map(str::to_owned));
    args.extend([
        bin.into(),
        "run".into(),
        format!("--prometheus-url={prometheus}"),
        format!("--metrics-bind-address={metrics}"),
        format!("--requeue-interval={interval}s"),
        format!("--namespace={}", operator::OPERATOR_NAMESPACE),
        format!("--service-account={}", operator::OPERATOR_SA),
    ]);
    let log = env.dir().join("operator-bench.log");
    let p = Supervised::spawn("operator", Path::new("/usr/bin/env"), &args, &log).unwrap();
    assert!(
        backpressure_envtest::process::wait_for_port(port, Duration::from_secs(60)),
        "operator did not start: {}",
        p.log_tail(20)
    );
    let pid = find_pid(bin, &metrics).expect("the operator's pid");
    (p, metrics, pid)
}

pub(super) fn find_pid(bin: &str, marker: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.starts_with(bin) && cmd.contains(marker) {
            return Some(pid);
        }
    }
    None
}

/// (RSS bytes, peak RSS bytes, CPU seconds) of `pid`.
pub(super) fn proc_stats(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let cpu = (ticks(11) + ticks(12)) as f64 / clock_ticks();
    (kb("VmRSS:"), kb("VmHWM:"), cpu)
}

pub(super) fn clock_ticks() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok());
    out.unwrap_or(100.0)
}

pub(super) fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read as _;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sum of the samples of `name` whose labels contain every `must` fragment.
pub(super) fn metric_sum(text: &str, name: &str, must: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' '))
        })
        .filter(|l| must.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
