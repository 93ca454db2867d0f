//! A fake worker fleet's metrics, served on loopback for a real Prometheus to scrape: the
//! workers' backoff and outcome counters and the queue exporter's gauges and counters, with the
//! wire contract's names. Tests turn the knobs; counters grow at the configured rates.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use backpressure_api::wire::metrics as m;
use backpressure_envtest::{Prometheus, ScrapeTarget};

/// What the fleet reports right now.
#[derive(Debug, Clone)]
pub struct FleetKnobs {
    /// Backoff factor of every worker.
    pub backoff: f64,
    /// Dependency failures per attempt.
    pub failure_rate: f64,
    /// Attempts per second, fleet-wide.
    pub attempt_rate: f64,
    /// Oldest first-attempt age, seconds.
    pub queue_age: f64,
    /// Queue depth.
    pub queue_depth: f64,
    /// Arrivals per second.
    pub arrival_rate: f64,
    /// Completions per second.
    pub completion_rate: f64,
    /// Serve HTTP 500 instead of metrics (a broken exporter).
    pub broken: bool,
    /// Serve every sample with an explicit timestamp (now). Prometheus leaves such series out
    /// of its staleness tracking, so a series frozen later keeps being returned.
    pub explicit_timestamps: bool,
    /// Serve every sample with this explicit timestamp (milliseconds since the epoch) and stop
    /// the counters: an exporter stuck on old values. With `explicit_timestamps` set from the
    /// start, Prometheus keeps returning the old samples (no staleness marker) until its
    /// lookback window ends.
    pub frozen_at_ms: Option<i64>,
    /// Each pod's `backpressure_failure_floor` (`None`: NaN, not tested yet); empty exports
    /// no series (a worker from before the floor).
    pub failure_floors: Vec<Option<f64>>,
}

impl Default for FleetKnobs {
    fn default() -> Self {
        Self {
            backoff: 0.0,
            failure_rate: 0.0,
            attempt_rate: 10.0,
            queue_age: 1.0,
            queue_depth: 0.0,
            arrival_rate: 10.0,
            completion_rate: 10.0,
            broken: false,
            explicit_timestamps: false,
            frozen_at_ms: None,
            failure_floors: Vec::new(),
        }
    }
}

/// Queue age at the target (10 s), no backoff: the sizing keeps the current replicas.
pub fn steady(k: &mut FleetKnobs) {
    k.backoff = 0.0;
    k.failure_rate = 0.0;
    k.queue_age = 10.0;
    k.queue_depth = 0.0;
    k.arrival_rate = 10.0;
    k.completion_rate = 10.0;
}

/// Queue age ten times the target, no backoff: scale out.
pub fn backlog(k: &mut FleetKnobs) {
    k.backoff = 0.0;
    k.failure_rate = 0.0;
    k.queue_age = 100.0;
    k.queue_depth = 1000.0;
    k.arrival_rate = 100.0;
    k.completion_rate = 20.0;
}

/// The dependency fails (backoff 0.6, 40 % failures) while the queue grows: hold.
pub fn failing(k: &mut FleetKnobs) {
    k.backoff = 0.6;
    k.failure_rate = 0.4;
    k.queue_age = 200.0;
    k.queue_depth = 2000.0;
    k.arrival_rate = 100.0;
    k.completion_rate = 10.0;
}

/// The dependency is back (no backoff, no failures) and the workers catch up; the queue knobs
/// stay as they were.
pub fn recovered(k: &mut FleetKnobs) {
    k.backoff = 0.0;
    k.failure_rate = 0.0;
    k.completion_rate = 40.0;
}

#[derive(Debug)]
struct State {
    knobs: FleetKnobs,
    // Counter values integrated over time at the knob rates.
    last: Instant,
    successes: f64,
    failures: f64,
    arrivals: f64,
    completions: f64,
}

/// The fake fleet of one workload.
#[derive(Debug, Clone)]
pub struct FakeFleet {
    state: Arc<Mutex<State>>,
    /// `127.0.0.1:<port>` of the exposition endpoint.
    pub address: String,
    /// The namespace Prometheus attaches.
    pub namespace: String,
}

impl FakeFleet {
    /// Starts serving `workload` in `namespace` with default knobs.
    pub fn start(namespace: &str, workload: &str, pods: usize) -> FakeFleet {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State {
            knobs: FleetKnobs::default(),
            last: Instant::now(),
            successes: 0.0,
            failures: 0.0,
            arrivals: 0.0,
            completions: 0.0,
        }));
        let s2 = state.clone();
        let wl = workload.to_owned();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 2048];
                let _ = conn.read(&mut buf);
                let (code, body) = render(&s2, &wl, pods);
                let _ = write!(
                    conn,
                    "HTTP/1.0 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        FakeFleet {
            state,
            address,
            namespace: namespace.to_owned(),
        }
    }

    /// Changes the knobs.
    pub fn set(&self, f: impl FnOnce(&mut FleetKnobs)) {
        let mut s = self.state.lock().unwrap();
        advance(&mut s);
        f(&mut s.knobs);
    }

    /// Starts a real Prometheus that scrapes this fleet.
    pub fn prometheus(&self) -> Prometheus {
        let prom = Prometheus::start().unwrap();
        prom.set_targets(&[self.target()]).unwrap();
        prom
    }

    /// The Prometheus target for this fleet.
    pub fn target(&self) -> ScrapeTarget {
        ScrapeTarget {
            address: self.address.clone(),
            labels: BTreeMap::from([(m::LABEL_NAMESPACE.to_owned(), self.namespace.clone())]),
        }
    }
}

fn advance(s: &mut State) {
    let dt = s.last.elapsed().as_secs_f64();
    s.last = Instant::now();
    if s.knobs.frozen_at_ms.is_some() {
        return;
    }
    let k = &s.knobs;
    s.failures += k.attempt_rate * k.failure_rate * dt;
    s.successes += k.attempt_rate * (1.0 - k.failure_rate) * dt;
    s.arrivals += k.arrival_rate * dt;
    s.completions += k.completion_rate * dt;
}

fn render(state: &Mutex<State>, workload: &str, pods: usize) -> (&'static str, String) {
    let mut s = state.lock().unwrap();
    advance(&mut s);
    if s.knobs.broken {
        return ("500 Internal Server Error", "broken\n".into());
    }
    let mut out = String::new();
    let w = format!("{}=\"{workload}\"", m::LABEL_WORKLOAD);
    out.push_str(&format!("# TYPE {} gauge\n", m::BACKOFF));
    for p in 0..pods {
        out.push_str(&format!(
            "{}{{{w},pod=\"p{p}\"}} {}\n",
            m::BACKOFF,
            s.knobs.backoff
        ));
    }
    if !s.knobs.failure_floors.is_empty() {
        out.push_str(&format!("# TYPE {} gauge\n", m::FAILURE_FLOOR));
        for (p, f) in s.knobs.failure_floors.iter().enumerate() {
            let v = f.map_or_else(|| "NaN".to_owned(), |f| f.to_string());
            out.push_str(&format!("{}{{{w},pod=\"p{p}\"}} {v}\n", m::FAILURE_FLOOR));
        }
    }
    out.push_str(&format!("# TYPE {} counter\n", m::OUTCOMES_TOTAL));
    out.push_str(&format!(
        "{}{{{w},class=\"{}\"}} {}\n",
        m::OUTCOMES_TOTAL,
        m::CLASS_SUCCESS,
        s.successes
    ));
    out.push_str(&format!(
        "{}{{{w},class=\"{}\"}} {}\n",
        m::OUTCOMES_TOTAL,
        m::CLASS_DEPENDENCY_FAILURE,
        s.failures
    ));
    out.push_str(&format!(
        "# TYPE {} gauge\n{}{{{w}}} {}\n",
        m::QUEUE_AGE,
        m::QUEUE_AGE,
        s.knobs.queue_age
    ));
    out.push_str(&format!(
        "# TYPE {} gauge\n{}{{{w}}} {}\n",
        m::QUEUE_DEPTH,
        m::QUEUE_DEPTH,
        s.knobs.queue_depth
    ));
    out.push_str(&format!(
        "# TYPE {} counter\n{}{{{w}}} {}\n",
        m::QUEUE_ARRIVALS_TOTAL,
        m::QUEUE_ARRIVALS_TOTAL,
        s.arrivals
    ));
    out.push_str(&format!(
        "# TYPE {} counter\n{}{{{w}}} {}\n",
        m::QUEUE_COMPLETIONS_TOTAL,
        m::QUEUE_COMPLETIONS_TOTAL,
        s.completions
    ));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let stamp = s
        .knobs
        .frozen_at_ms
        .or(s.knobs.explicit_timestamps.then_some(now_ms));
    if let Some(ts) = stamp {
        out = out
            .lines()
            .map(|l| {
                if l.starts_with('#') {
                    format!("{l}\n")
                } else {
                    format!("{l} {ts}\n")
                }
            })
            .collect();
    }
    ("200 OK", out)
}
