//! The dependency every message needs: an HTTP service with a capacity in requests per second,
//! failures when overloaded, and a fault schedule from the scenario (outage, partial failure,
//! gradual capacity return).
//!
//! `POST /work` answers 200 after the scenario's latency when admitted; 429 at once when over
//! capacity (a token bucket refilled at the current capacity, with 200 ms of burst); 503 during
//! an outage (capacity 0); 500 for the scheduled fraction of partial failures. `GET /metrics`
//! exports its load and capacity.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::scenario::DependencySpec;
use crate::serve::{Exposition, response, serve};

/// Metric: requests by result.
pub const REQUESTS_TOTAL: &str = "lab_dependency_requests_total";
/// Metric: current capacity in requests per second.
pub const CAPACITY: &str = "lab_dependency_capacity_rps";

/// What the dependency does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Ok,
    /// Over capacity (429).
    Overloaded,
    /// Capacity is zero (503).
    Outage,
    /// A partial failure (500).
    Failed,
}

impl Verdict {
    /// The HTTP status answered.
    pub fn status(self) -> u16 {
        match self {
            Verdict::Ok => 200,
            Verdict::Overloaded => 429,
            Verdict::Outage => 503,
            Verdict::Failed => 500,
        }
    }

    fn index(self) -> usize {
        match self {
            Verdict::Ok => 0,
            Verdict::Overloaded => 1,
            Verdict::Outage => 2,
            Verdict::Failed => 3,
        }
    }

    const ALL: [Verdict; 4] = [
        Verdict::Ok,
        Verdict::Overloaded,
        Verdict::Outage,
        Verdict::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Overloaded => "overloaded",
            Verdict::Outage => "outage",
            Verdict::Failed => "failed",
        }
    }
}

/// A small deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// A uniform float in [0,1).
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The admission model: a token bucket refilled at the scheduled capacity. Pure: time is
/// passed in as seconds since the start of the run.
#[derive(Clone, Debug)]
pub struct Admission {
    tokens: f64,
    last: f64,
    rng: SplitMix,
}

/// Seconds of burst the bucket holds.
pub const BURST_SECS: f64 = 0.2;

impl Admission {
    /// A full bucket at time 0.
    pub fn new(seed: u64) -> Self {
        Self {
            tokens: 1.0,
            last: 0.0,
            rng: SplitMix::new(seed),
        }
    }

    /// Decides one request at `now` given the capacity and partial failure rate in force.
    pub fn admit(&mut self, now: f64, capacity: f64, failure_rate: f64) -> Verdict {
        let dt = (now - self.last).max(0.0);
        self.last = self.last.max(now);
        let burst = (capacity * BURST_SECS).max(1.0);
        self.tokens = (self.tokens + dt * capacity).min(burst);
        if capacity <= 0.0 {
            return Verdict::Outage;
        }
        if failure_rate > 0.0 && self.rng.next_f64() < failure_rate {
            return Verdict::Failed;
        }
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Verdict::Ok
        } else {
            Verdict::Overloaded
        }
    }
}

/// Counters of one dependency.
#[derive(Debug, Default)]
pub struct Counters {
    by_verdict: [AtomicU64; 4],
}

impl Counters {
    /// All requests so far.
    pub fn requests(&self) -> u64 {
        self.by_verdict
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Failed requests so far (any answer but 200).
    pub fn failed(&self) -> u64 {
        self.requests().saturating_sub(self.served())
    }

    /// Served requests so far.
    pub fn served(&self) -> u64 {
        self.by_verdict[0].load(Ordering::Relaxed)
    }
}

/// A running dependency.
#[derive(Debug)]
pub struct Dependency {
    addr: SocketAddr,
    start: Arc<Mutex<Instant>>,
    spec: DependencySpec,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl Dependency {
    /// Starts the service on a free port of `ip` (loopback, or a real node's bridge address
    /// for pods); its schedule's time 0 is `start`. `namespace` labels its metrics.
    pub async fn start(
        spec: DependencySpec,
        seed: u64,
        start: Instant,
        namespace: &str,
        ip: std::net::Ipv4Addr,
    ) -> std::io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let start = Arc::new(Mutex::new(start));
        let st = start.clone();
        let model = Arc::new(Mutex::new(Admission::new(seed)));
        let (c, s, ns) = (counters.clone(), spec.clone(), namespace.to_owned());
        let handler = move |req: hyper::Request<hyper::body::Incoming>| {
            let (counters, spec, model, ns) = (c.clone(), s.clone(), model.clone(), ns.clone());
            let t = st.lock().map(|s| s.elapsed()).unwrap_or_default();
            async move {
                if req.uri().path() == "/metrics" {
                    return response(
                        200,
                        "text/plain; version=0.0.4",
                        exposition(&ns, &counters, spec.capacity.value_at(t)),
                    );
                }
                let capacity = spec.capacity.value_at(t);
                let failure_rate = spec.failure_rate.value_at(t);
                let verdict = match model.lock() {
                    Ok(mut m) => m.admit(t.as_secs_f64(), capacity, failure_rate),
                    Err(_) => Verdict::Failed,
                };
                counters.by_verdict[verdict.index()].fetch_add(1, Ordering::Relaxed);
                match verdict {
                    Verdict::Ok => tokio::time::sleep(spec.latency.0).await,
                    Verdict::Failed => tokio::time::sleep(spec.latency.0 / 2).await,
                    _ => tokio::time::sleep(Duration::from_millis(2)).await,
                }
                response(verdict.status(), "text/plain", verdict.label())
            }
        };
        let (addr, task) = serve(SocketAddr::from((ip, 0)), handler).await?;
        Ok(Self {
            addr,
            start,
            spec,
            counters,
            task,
        })
    }

    /// `http://<ip>:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `<ip>:<port>` (the scrape target).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Time since the schedule's time 0.
    pub fn elapsed(&self) -> Duration {
        self.start.lock().map(|s| s.elapsed()).unwrap_or_default()
    }

    /// Moves the schedule's time 0 (the lab sets it when the scenario starts).
    pub fn set_start(&self, start: Instant) {
        if let Ok(mut s) = self.start.lock() {
            *s = start;
        }
    }

    /// The scheduled capacity now.
    pub fn capacity_now(&self) -> f64 {
        self.spec.capacity.value_at(self.elapsed())
    }
}

impl Drop for Dependency {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn exposition(ns: &str, counters: &Counters, capacity: f64) -> String {
    let mut e = Exposition::default();
    for v in Verdict::ALL {
        e.sample(
            REQUESTS_TOTAL,
            "counter",
            "Requests to the lab dependency by result.",
            &[("namespace", ns), ("result", v.label())],
            counters.by_verdict[v.index()].load(Ordering::Relaxed) as f64,
        );
    }
    e.sample(
        CAPACITY,
        "gauge",
        "Requests per second the lab dependency can serve now.",
        &[("namespace", ns)],
        capacity,
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn admits_at_capacity_and_rejects_beyond() {
        let mut a = Admission::new(1);
        // 200 requests per second for 10 s against a capacity of 50.
        let mut ok = 0;
        for i in 0..2000 {
            if a.admit(f64::from(i) * 0.005, 50.0, 0.0) == Verdict::Ok {
                ok += 1;
            }
        }
        assert!((495..=512).contains(&ok), "{ok}");
    }

    #[test]
    fn under_capacity_everything_is_served() {
        let mut a = Admission::new(1);
        let verdicts: Vec<Verdict> = (0..100)
            .map(|i| a.admit(f64::from(i) * 0.1, 50.0, 0.0))
            .collect();
        assert!(verdicts.iter().all(|v| *v == Verdict::Ok));
    }

    #[test]
    fn outage_and_partial_failure() {
        let mut a = Admission::new(3);
        assert_eq!(a.admit(1.0, 0.0, 0.0), Verdict::Outage);
        let failed = (0..10_000)
            .filter(|i| a.admit(2.0 + f64::from(*i) * 0.01, 1000.0, 0.3) == Verdict::Failed)
            .count();
        assert!((2800..3200).contains(&failed), "{failed}");
    }

    #[test]
    fn same_seed_same_decisions() {
        let run = |seed| {
            let mut a = Admission::new(seed);
            (0..200)
                .map(|i| a.admit(f64::from(i) * 0.01, 30.0, 0.2))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[tokio::test]
    async fn serves_http_with_the_schedule() {
        crate::install_crypto_provider();
        let spec: DependencySpec = serde_yaml::from_str(
            "latency: 1ms\ncapacity:\n- {at: 0s, value: 100}\n- {at: 1h, value: 0}\n",
        )
        .unwrap();
        let dep = Dependency::start(spec, 1, Instant::now(), "ns", std::net::Ipv4Addr::LOCALHOST)
            .await
            .unwrap();
        let client = reqwest::Client::new();
        let r = client
            .post(format!("{}/work", dep.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let m = client
            .get(format!("{}/metrics", dep.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            m.contains(r#"lab_dependency_requests_total{namespace="ns",result="ok"} 1"#),
            "{m}"
        );
        assert!(m.contains(r#"lab_dependency_capacity_rps{namespace="ns"} 100"#));
        assert_eq!(dep.counters().requests(), 1);
    }
}
