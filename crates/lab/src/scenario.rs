//! Scenario files: what the producer sends, what the dependency can take and when it fails, how
//! the workload and both autoscalers are configured, and what the end-to-end checks expect.
//!
//! Scenarios live in `crates/lab/scenarios/*.yaml`. Every time in a scenario is lab (wall) time:
//! the constants of a production setup are scaled by `timeScale` (documented in each file), the
//! logic is not.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backpressure_api::duration::{format_duration, parse_duration};
use backpressure_api::v1alpha1::{Algorithm, ProducerMode, TargetRef, WorkerBackpressureSpec};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No scenario of that name.
    #[error("no scenario named {0:?} (known: {1})")]
    Unknown(String, String),
}

/// A duration written Go-style in the file (`150ms`, `30s`, `2m`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl Dur {
    /// Seconds as a float.
    pub fn secs(self) -> f64 {
        self.0.as_secs_f64()
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

/// One point of a piecewise schedule: from `at`, the value moves to `value`, linearly over
/// `rampOver` (a step when absent).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Point {
    /// When the change starts.
    pub at: Dur,
    /// The value reached.
    pub value: f64,
    /// How long the linear change takes.
    #[serde(default)]
    pub ramp_over: Dur,
}

/// A value over time: a list of [`Point`]s sorted by `at`. Before the first point the value is
/// the first point's value.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(transparent)]
pub struct Schedule(pub Vec<Point>);

impl Schedule {
    /// A constant schedule.
    pub fn constant(value: f64) -> Self {
        Schedule(vec![Point {
            at: Dur::default(),
            value,
            ramp_over: Dur::default(),
        }])
    }

    /// The value at `t` since the start of the run. A ramp starts from the value the schedule
    /// had when it began (also when an earlier ramp was still running).
    pub fn value_at(&self, t: Duration) -> f64 {
        Self::eval(&self.0, t)
    }

    fn eval(points: &[Point], t: Duration) -> f64 {
        let Some(first) = points.first() else {
            return 0.0;
        };
        // The last point that has started.
        let Some(i) = points.iter().rposition(|p| p.at.0 <= t) else {
            return first.value;
        };
        let p = &points[i];
        let over = p.ramp_over.secs();
        let into = (t - p.at.0).as_secs_f64();
        if over > 0.0 && into < over {
            let start = if i == 0 {
                p.value
            } else {
                Self::eval(&points[..i], p.at.0)
            };
            start + (p.value - start) * (into / over)
        } else {
            p.value
        }
    }

    fn check(&self, what: &str) -> Result<(), String> {
        if self.0.is_empty() {
            return Err(format!("{what}: needs at least one point"));
        }
        if self.0.windows(2).any(|w| w[1].at < w[0].at) {
            return Err(format!("{what}: points must be sorted by `at`"));
        }
        if self.0.iter().any(|p| !p.value.is_finite() || p.value < 0.0) {
            return Err(format!("{what}: values must be finite and not negative"));
        }
        Ok(())
    }
}

/// The workload: the Deployment the autoscalers scale and what each worker does.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Deployment name, also the `workload` label of every series.
    pub name: String,
    /// Replicas at the start of the run.
    pub initial_replicas: i32,
    /// Time from a pod's creation to Ready (image pull, start, readiness): what scale-out costs.
    pub pod_startup_delay: Dur,
    /// Local work per message besides the dependency call.
    pub processing: Dur,
}

/// The queue (Redis stream with a consumer group).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSpec {
    /// A message not acknowledged within this time is delivered again.
    pub visibility_timeout: Dur,
    /// A message delivered this many times without success goes to the dead-letter stream.
    pub max_deliveries: u32,
    /// The broker's memory limit (`8mb`, `512kb`, bytes): Redis `maxmemory` with the
    /// `noeviction` policy, so that writes beyond it are refused (`OOM`), as a bounded broker
    /// refuses publishers. Absent: no limit. Needs `producer.pods` (the in-process producer does
    /// not handle refusals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<Bytes>,
}

/// A size in bytes, written as Redis writes it: `8mb` (MiB), `512kb` (KiB), `1gb`, or a number
/// of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl Bytes {
    /// Parses `8mb`, `512kb`, `1gb`, `4096b` or `4096` (units are powers of 1024, case
    /// insensitive).
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim().to_ascii_lowercase();
        let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = &t[digits.len()..];
        let n: u64 = digits
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not a size like 8mb"))?;
        let factor: u64 = match unit {
            "" | "b" => 1,
            "kb" | "k" => 1 << 10,
            "mb" | "m" => 1 << 20,
            "gb" | "g" => 1 << 30,
            other => return Err(format!("{text:?}: unknown unit {other:?} (b, kb, mb, gb)")),
        };
        n.checked_mul(factor)
            .map(Bytes)
            .ok_or_else(|| format!("{text:?} is too large"))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(n) => Ok(Bytes(n)),
            Raw::Text(t) => Bytes::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

/// The producer.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProducerSpec {
    /// Messages per second over time (the demand: what the producer's own clients hand it).
    pub rate: Schedule,
    /// Run the producer as pods of its own Deployment, each with a `ProducerGate` the operator
    /// can pause (in both runs; only the operator run has an operator to push to them). Absent:
    /// the lab's in-process producer writes the schedule straight into the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<ProducerPods>,
}

/// The producer as pods (`backpressure-lab producer`, started by the kubelet stand-in).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProducerPods {
    /// Deployment name (the `producers.targetRef` of the operator run's WorkerBackpressure, and
    /// the audience of the push tokens its pods accept).
    pub name: String,
    /// Pods; each produces `rate / replicas`.
    pub replicas: u32,
    /// Size of each message body in bytes (what the broker's memory holds per message).
    #[serde(default = "default_message_bytes")]
    pub message_bytes: u32,
    /// How long a producer waits before it writes again a message the broker refused (`OOM`).
    #[serde(default = "default_broker_retry_after")]
    pub broker_retry_after: Dur,
}

fn default_message_bytes() -> u32 {
    64
}

fn default_broker_retry_after() -> Dur {
    Dur(Duration::from_secs(1))
}

/// The dependency every message needs.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DependencySpec {
    /// Time to serve one request.
    pub latency: Dur,
    /// Requests per second it can serve over time; 0 is an outage (every request fails).
    pub capacity: Schedule,
    /// Fraction of requests that fail regardless of load (partial failure), over time.
    #[serde(default = "zero_schedule")]
    pub failure_rate: Schedule,
}

fn zero_schedule() -> Schedule {
    Schedule::constant(0.0)
}

/// The comparison autoscaler: real KEDA (its operator and metrics adapter) and the real HPA
/// controller in kube-controller-manager, scaling the comparison run's workload on its queue
/// alone.
///
/// KEDA creates an HPA without `behavior` (the ScaledObject sets none), so the HPA runs its
/// older code path: per sync at most `max(2 × current, 4)` replicas, scale-down held by the
/// controller's downscale stabilization window. The scenario's time scale reaches the HPA
/// through the controller's flags ([`KedaSpec::sync_period`],
/// [`KedaSpec::downscale_stabilization`]).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KedaSpec {
    /// The ScaledObject's trigger.
    #[serde(default)]
    pub trigger: KedaTrigger,
    /// `QueueAge`: the Prometheus trigger's threshold (`metricType: Value`) on the first-attempt
    /// queue age.
    pub target_queue_age: Dur,
    /// `LagCount`: the redis-streams trigger's `lagCount` (messages not yet delivered to the
    /// consumer group per replica, `AverageValue`).
    #[serde(default = "default_lag_count")]
    pub lag_count: u32,
    /// `--horizontal-pod-autoscaler-sync-period` (15 s upstream, scaled).
    pub sync_period: Dur,
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (300 s upstream, scaled).
    pub downscale_stabilization: Dur,
    /// `--horizontal-pod-autoscaler-tolerance` (0.1 upstream).
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// The algorithm of the comparison run's workers; absent: the operator run's workers'
    /// configuration (`workerBackpressure.worker`). `Off` makes it the simulator's greedy
    /// fleet: every pod at `maxPermits` whatever the dependency answers.
    #[serde(default)]
    pub workers: Option<Algorithm>,
}

/// What the comparison run's ScaledObject scales on.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub enum KedaTrigger {
    /// A Prometheus trigger on the first-attempt queue age with `metricType: Value` (what the
    /// operator's own sizing reads).
    #[default]
    QueueAge,
    /// The redis-streams trigger with `lagCount` (XINFO GROUPS lag, Redis ≥ 7): what a KEDA
    /// user on Redis Streams writes first.
    LagCount,
}

impl KedaTrigger {
    /// The name in reports.
    pub fn label(self) -> &'static str {
        match self {
            KedaTrigger::QueueAge => "KEDA queue age (Value)",
            KedaTrigger::LagCount => "KEDA lagCount",
        }
    }
}

fn default_lag_count() -> u32 {
    20
}

fn default_tolerance() -> f64 {
    0.1
}

/// A named window of the run (for the checks and the plot).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Phase {
    /// Name, for example `outage`.
    pub name: String,
    /// Start.
    pub from: Dur,
    /// End.
    pub to: Dur,
    /// Shade this window in the plot (the outage, the surge...).
    #[serde(default)]
    pub highlight: bool,
}

/// What the end-to-end run asserts from the recorded data.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expectations {
    /// In this phase the operator's replicas do not grow while the comparison's do.
    #[serde(default)]
    pub hold_during: Option<String>,
    /// In this phase the dependency load of the operator run stays within `factor` × capacity
    /// while there is a backlog.
    #[serde(default)]
    pub load_within_capacity: Option<LoadCheck>,
    /// In this phase the operator's highest replica count stays below the comparison's.
    #[serde(default)]
    pub fewer_replicas_during: Option<String>,
    /// The operator run dead-letters fewer messages than the comparison.
    #[serde(default)]
    pub fewer_dead_letters: bool,
    /// The operator scales out (above the initial replicas).
    #[serde(default)]
    pub scale_out: bool,
    /// In this phase the operator run completes at least `min` of what the dependency could
    /// serve (the simulator's goodput, `crates/sim/src/metrics.rs`).
    #[serde(default)]
    pub goodput: Option<GoodputCheck>,
    /// The operator run's dead letters per failed dependency call are no worse than the
    /// comparison's, within the Poisson noise of the two counts (2 sigma).
    #[serde(default)]
    pub dlq_per_failed_call: bool,
    /// With `queue.maxMemory`: the operator run's broker never reaches its memory limit and
    /// refuses no write, while the comparison's (the same producers without control) does.
    #[serde(default)]
    pub broker_within_limit: bool,
    /// With producer pods: the messages waiting at the operator run's producers fall back to at
    /// most one second of demand before the end (the pause is lifted and its backlog sent).
    #[serde(default)]
    pub producer_backlog_drains: bool,
}

/// Goodput check parameters.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GoodputCheck {
    /// The phase (the goodput window).
    pub during: String,
    /// Smallest allowed goodput, in [0, 1].
    pub min: f64,
}

/// Load check parameters.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadCheck {
    /// The phase.
    pub during: String,
    /// Largest allowed load / capacity.
    pub factor: f64,
}

/// A scenario file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Short name (the file name without `.yaml`).
    pub name: String,
    /// One paragraph: what happens and what to look for.
    pub description: String,
    /// Wall seconds of the lab per second of the production setup it models (informative: the
    /// durations below are already scaled).
    pub time_scale: f64,
    /// Length of the run.
    pub duration: Dur,
    /// Seed of the producer's and the dependency's randomness (same in both runs).
    pub seed: u64,
    /// Named windows.
    #[serde(default)]
    pub phases: Vec<Phase>,
    /// The workload.
    pub workload: Workload,
    /// The queue.
    pub queue: QueueSpec,
    /// The producer.
    pub producer: ProducerSpec,
    /// The dependency.
    pub dependency: DependencySpec,
    /// The comparison autoscaler: real KEDA.
    pub keda: KedaSpec,
    /// The WorkerBackpressure object of the operator run (`targetRef` is the workload).
    pub worker_backpressure: WorkerBackpressureSpec,
    /// What the end-to-end run checks.
    #[serde(default)]
    pub expect: Expectations,
    /// A second fleet under the same operator whose pods run a worker in another language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polyglot: Option<PolyglotSpec>,
}

/// The polyglot part of a scenario: beside the operator run, a third run (namespace
/// `lab-operator-go`) with the same workload, WorkerBackpressure, producer schedule, queue and
/// dependency specification, its own queue and dependency, under the same operator; the kubelet
/// stand-in starts its pods with the lab's worker in another language
/// (`crates/lab/workers/<language>/`). Its checks: the operator pushed the configuration hash
/// the pods of both fleets report, the fleet held during `expect.holdDuring`, processed
/// messages, and lost none.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolyglotSpec {
    /// The worker's language.
    pub language: WorkerLanguage,
}

/// A language the lab has a worker in besides Rust.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WorkerLanguage {
    /// `crates/lab/workers/go/`, on the Go SDK (built by `tools/lab-worker-go/build.sh`).
    Go,
}

/// The directory of the bundled scenarios.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// The bundled scenario names, sorted.
pub fn bundled() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(scenarios_dir())
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| {
                    let p = e.path();
                    (p.extension().is_some_and(|x| x == "yaml"))
                        .then(|| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                        .flatten()
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

impl Scenario {
    /// Loads a scenario by bundled name or by path.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        let as_path = Path::new(name_or_path);
        let path = if as_path.extension().is_some_and(|x| x == "yaml") || as_path.is_file() {
            as_path.to_owned()
        } else {
            let p = scenarios_dir().join(format!("{name_or_path}.yaml"));
            if !p.is_file() {
                return Err(ScenarioError::Unknown(
                    name_or_path.to_owned(),
                    bundled().join(", "),
                ));
            }
            p
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ScenarioError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| ScenarioError::Parse { path, reason })
    }

    /// Parses and checks a scenario document.
    pub fn parse(text: &str) -> Result<Self, String> {
        let s: Scenario = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), String> {
        self.producer.rate.check("producer.rate")?;
        self.dependency.capacity.check("dependency.capacity")?;
        self.dependency
            .failure_rate
            .check("dependency.failureRate")?;
        if self.dependency.failure_rate.0.iter().any(|p| p.value > 1.0) {
            return Err("dependency.failureRate: values must be at most 1".into());
        }
        if self.queue.max_deliveries == 0 {
            return Err("queue.maxDeliveries must be at least 1".into());
        }
        if self.queue.visibility_timeout.0.is_zero() {
            return Err("queue.visibilityTimeout must be positive".into());
        }
        if self.workload.initial_replicas < 1 {
            return Err("workload.initialReplicas must be at least 1".into());
        }
        if self.duration.0.is_zero() {
            return Err("duration must be positive".into());
        }
        if self.keda.sync_period.0.is_zero() || self.keda.target_queue_age.0.is_zero() {
            return Err("keda.syncPeriod and keda.targetQueueAge must be positive".into());
        }
        if self.keda.lag_count == 0 {
            return Err("keda.lagCount must be at least 1".into());
        }
        if !(self.keda.tolerance.is_finite() && self.keda.tolerance >= 0.0) {
            return Err("keda.tolerance must be a number of at least 0".into());
        }
        if let Some(pods) = &self.producer.pods {
            if pods.replicas == 0 {
                return Err("producer.pods.replicas must be at least 1".into());
            }
            if pods.name.is_empty() || pods.name == self.workload.name {
                return Err(format!(
                    "producer.pods.name {:?} must name a Deployment other than the workload",
                    pods.name
                ));
            }
            if pods.broker_retry_after.0.is_zero() {
                return Err("producer.pods.brokerRetryAfter must be positive".into());
            }
        }
        if self.queue.max_memory.is_some() && self.producer.pods.is_none() {
            return Err(
                "queue.maxMemory needs producer.pods (the in-process producer does not handle a broker's refusals)"
                    .into(),
            );
        }
        if let Some(p) = &self.worker_backpressure.producers {
            match (&self.producer.pods, &p.target_ref) {
                (None, _) if p.mode != Some(ProducerMode::Off) => {
                    return Err(
                        "workerBackpressure.producers needs producer.pods (pods to pause)".into(),
                    );
                }
                (Some(pods), Some(t)) if t.name != pods.name => {
                    return Err(format!(
                        "workerBackpressure.producers.targetRef.name {:?} must name producer.pods.name {:?}",
                        t.name, pods.name
                    ));
                }
                _ => {}
            }
        }
        if self.expect.broker_within_limit && self.queue.max_memory.is_none() {
            return Err("expect.brokerWithinLimit needs queue.maxMemory".into());
        }
        if self.expect.producer_backlog_drains && self.producer.pods.is_none() {
            return Err("expect.producerBacklogDrains needs producer.pods".into());
        }
        if self.worker_backpressure.target_ref.name != self.workload.name {
            return Err(format!(
                "workerBackpressure.targetRef.name {:?} must name the workload {:?}",
                self.worker_backpressure.target_ref.name, self.workload.name
            ));
        }
        for p in &self.phases {
            if p.to < p.from {
                return Err(format!("phase {}: `to` before `from`", p.name));
            }
        }
        if let Some(g) = &self.expect.goodput
            && !(0.0..=1.0).contains(&g.min)
        {
            return Err("expect.goodput.min must be in [0, 1]".into());
        }
        let phase_names: Vec<&str> = self.phases.iter().map(|p| p.name.as_str()).collect();
        for name in self
            .expect
            .hold_during
            .iter()
            .chain(self.expect.fewer_replicas_during.iter())
            .chain(self.expect.load_within_capacity.iter().map(|l| &l.during))
            .chain(self.expect.goodput.iter().map(|g| &g.during))
        {
            if !phase_names.contains(&name.as_str()) {
                return Err(format!("expect names an unknown phase {name:?}"));
            }
        }
        Ok(())
    }

    /// The phase of that name.
    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// The WorkerBackpressure of the operator run: the file's, with `producers.targetRef` naming
    /// the producer Deployment when the file leaves it out.
    pub fn worker_backpressure_spec(&self) -> WorkerBackpressureSpec {
        let mut spec = self.worker_backpressure.clone();
        if let (Some(p), Some(pods)) = (spec.producers.as_mut(), &self.producer.pods)
            && p.target_ref.is_none()
        {
            p.target_ref = Some(TargetRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                name: pods.name.clone(),
            });
        }
        spec
    }

    /// Replica bounds of the workload (from the WorkerBackpressure, with the API defaults).
    pub fn replica_bounds(&self) -> (i32, i32) {
        use backpressure_api::defaults as d;
        let s = self.worker_backpressure.scaling.as_ref();
        (
            s.and_then(|s| s.min_replicas).unwrap_or(d::MIN_REPLICAS),
            s.and_then(|s| s.max_replicas).unwrap_or(d::MAX_REPLICAS),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn p(at: u64, value: f64, ramp: u64) -> Point {
        Point {
            at: Dur(Duration::from_secs(at)),
            value,
            ramp_over: Dur(Duration::from_secs(ramp)),
        }
    }

    #[test]
    fn schedule_steps_and_ramps() {
        let s = Schedule(vec![p(0, 50.0, 0), p(10, 0.0, 0), p(20, 40.0, 10)]);
        let at = |secs: f64| s.value_at(Duration::from_secs_f64(secs));
        assert_eq!(at(0.0), 50.0);
        assert_eq!(at(9.9), 50.0);
        assert_eq!(at(10.0), 0.0);
        assert_eq!(at(19.0), 0.0);
        assert!((at(25.0) - 20.0).abs() < 1e-9);
        assert!((at(29.0) - 36.0).abs() < 1e-9);
        assert_eq!(at(30.0), 40.0);
        assert_eq!(at(1000.0), 40.0);
    }

    #[test]
    fn ramp_starts_from_the_value_reached() {
        // A ramp that starts while an earlier ramp is still running starts from where it got.
        let s = Schedule(vec![p(0, 0.0, 0), p(0, 100.0, 10), p(5, 0.0, 5)]);
        let v = s.value_at(Duration::from_secs_f64(7.5));
        assert!((v - 25.0).abs() < 1e-9, "{v}");
    }

    #[test]
    fn keda_section_is_checked_naming_the_field() {
        let sc = Scenario::load("outage-and-recovery").unwrap();
        assert_eq!(sc.keda.trigger, KedaTrigger::QueueAge);
        assert_eq!(sc.keda.sync_period.0, Duration::from_secs(3));
        let bad = |from: &str, to: &str| {
            let text = std::fs::read_to_string(scenarios_dir().join("outage-and-recovery.yaml"))
                .unwrap()
                .replace(from, to);
            Scenario::parse(&text).unwrap_err()
        };
        assert!(bad("syncPeriod: 3s", "syncPeriod: 0s").contains("syncPeriod"));
        assert!(bad("syncPeriod: 3s", "syncPeriod: 3s\n  tolerance: -0.1").contains("tolerance"));
        assert!(bad("syncPeriod: 3s", "syncPeriod: 3s\n  lagCount: 0").contains("lagCount"));
        assert!(!bad("syncPeriod: 3s", "syncPeriod: 3s\n  trigger: Cpu").is_empty());
    }

    #[test]
    fn bundled_scenarios_parse_and_are_consistent() {
        let names = bundled();
        for want in [
            "outage-and-recovery",
            "producer-surge",
            "quota-overload",
            "partial-failure",
            "bounded-broker",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        for name in names {
            let s = Scenario::load(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, name);
            let (min, max) = s.replica_bounds();
            assert!(min <= s.workload.initial_replicas && s.workload.initial_replicas <= max);
            for ph in &s.phases {
                assert!(
                    ph.to <= s.duration,
                    "{name}: phase {} ends after the run",
                    ph.name
                );
            }
        }
    }

    #[test]
    fn sizes_are_written_as_redis_writes_them() {
        assert_eq!(Bytes::parse("4mb"), Ok(Bytes(4 << 20)));
        assert_eq!(Bytes::parse("512KB"), Ok(Bytes(512 << 10)));
        assert_eq!(Bytes::parse("1gb"), Ok(Bytes(1 << 30)));
        assert_eq!(Bytes::parse("4096"), Ok(Bytes(4096)));
        assert_eq!(Bytes::parse("10b"), Ok(Bytes(10)));
        assert!(Bytes::parse("4 parsecs").is_err());
        assert!(Bytes::parse("mb").is_err());
        assert!(Bytes::parse("99999999999gb").is_err());
    }

    #[test]
    fn producer_pods_and_the_bounded_broker() {
        let sc = Scenario::load("bounded-broker").unwrap();
        let pods = sc.producer.pods.as_ref().unwrap();
        assert_eq!(sc.queue.max_memory, Some(Bytes(4 << 20)));
        // The lab points the WorkerBackpressure's producers at the producer Deployment.
        let spec = sc.worker_backpressure_spec();
        let target = spec.producers.unwrap().target_ref.unwrap();
        assert_eq!(
            (target.kind.as_str(), target.name.as_str()),
            ("Deployment", pods.name.as_str())
        );
        assert!(
            sc.worker_backpressure
                .producers
                .unwrap()
                .target_ref
                .is_none()
        );
        // The other scenarios keep their in-process producer and unbounded broker.
        let outage = Scenario::load("outage-and-recovery").unwrap();
        assert!(outage.producer.pods.is_none() && outage.queue.max_memory.is_none());
        assert_eq!(
            outage.worker_backpressure_spec(),
            outage.worker_backpressure
        );

        let text = std::fs::read_to_string(scenarios_dir().join("bounded-broker.yaml")).unwrap();
        let bad = |from: &str, to: &str| {
            assert!(text.contains(from), "{from}");
            Scenario::parse(&text.replace(from, to)).unwrap_err()
        };
        let no_pods = bad(
            "  pods:\n    name: orders-api\n    replicas: 2\n    messageBytes: 8000\n    brokerRetryAfter: 1s\n",
            "",
        );
        assert!(no_pods.contains("producer.pods"), "{no_pods}");
        assert!(bad("name: orders-api", "name: export-worker").contains("producer.pods.name"));
        assert!(bad("replicas: 2", "replicas: 0").contains("replicas"));
        assert!(bad("maxMemory: 4mb", "maxMemory: 4 parsecs").contains("parsecs"));
        let wrong_target = bad(
            "    mode: Pause\n",
            "    mode: Pause\n    targetRef: {apiVersion: apps/v1, kind: Deployment, name: other}\n",
        );
        assert!(wrong_target.contains("targetRef.name"), "{wrong_target}");
        assert!(bad("  maxMemory: 4mb\n", "").contains("brokerWithinLimit"));
    }

    #[test]
    fn rejects_bad_files_with_reasons() {
        let good = std::fs::read_to_string(scenarios_dir().join("producer-surge.yaml")).unwrap();
        assert!(Scenario::parse(&good).is_ok());
        let bad = good.replace("maxDeliveries: ", "maxDeliveries: 0 #");
        assert!(Scenario::parse(&bad).unwrap_err().contains("maxDeliveries"));
        let unknown = format!("{good}\nsurprise: 1\n");
        assert!(Scenario::parse(&unknown).unwrap_err().contains("surprise"));
    }
}
