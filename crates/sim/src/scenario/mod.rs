//! Scenario files: what is simulated, with its seed and the targets the report checks.
//!
//! A scenario is a YAML document (see `crates/sim/scenarios/`). Durations are Go-style strings
//! (`30s`, `1h30m`, `250ms`), rates are per second. Unknown fields are refused so that a typo
//! cannot silently fall back to a default.

use std::path::Path;
use std::time::Duration;

use backpressure_api::duration::parse_duration;
use backpressure_api::v1alpha1::ProducerMode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A length of time in seconds, written as a Go-style duration string in scenario files.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Dur(pub f64);

impl Dur {
    /// Seconds.
    pub fn secs(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let parsed = parse_duration(&text).map_err(serde::de::Error::custom)?;
        Ok(Dur(parsed.as_secs_f64()))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = Duration::from_secs_f64(self.0.max(0.0));
        s.serialize_str(&backpressure_api::duration::format_duration(d))
    }
}

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not valid YAML, or not the shape of a scenario.
    #[error("parsing {name}: {source}")]
    Parse {
        /// The file or source name.
        name: String,
        /// The cause.
        source: serde_yaml::Error,
    },
    /// A value out of range.
    #[error("scenario {name}: {field}: {reason}")]
    Invalid {
        /// The scenario name.
        name: String,
        /// The offending field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A complete scenario.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    /// Short name (file stem), used in file names of plots.
    pub name: String,
    /// Title in the report.
    pub title: String,
    /// What happens, in words.
    #[serde(default)]
    pub description: String,
    /// Seed of every random stream of the run.
    pub seed: u64,
    /// Simulated length.
    pub duration: Dur,
    /// Simulation step. Arrivals, polls and completions are resolved on this grid.
    #[serde(default = "default_tick")]
    pub tick: Dur,
    /// The producer.
    pub producer: ProducerSpec,
    /// The queue.
    #[serde(default)]
    pub queue: QueueSpec,
    /// Producer control (`spec.producers` of the operator) for our policy; absent: none. The
    /// other policies never control the producers (they have no operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<ProducersSection>,
    /// Each worker pod.
    #[serde(default)]
    pub workers: WorkersSpec,
    /// The replica set.
    pub fleet: FleetSpec,
    /// The shared dependency.
    pub dependency: DependencySpec,
    /// The incident window: from the first failure to the moment the dependency recovers
    /// (failures stop; capacity may still be returning). Window metrics and the drain time use
    /// it.
    #[serde(default)]
    pub incident: Option<Window>,
    /// The window over which goodput is measured; defaults to the incident window, or the
    /// whole run without an incident.
    #[serde(default)]
    pub goodput_window: Option<Window>,
    /// Autoscaler timing.
    #[serde(default)]
    pub autoscaler: AutoscalerSpec,
    /// Targets for our policy that the report checks.
    #[serde(default)]
    pub targets: Vec<Target>,
    /// Where the scenario was loaded from (not part of the file).
    #[serde(skip)]
    pub source: Option<String>,
}

fn default_tick() -> Dur {
    Dur(0.1)
}

/// A time window.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Window {
    /// Start, from the beginning of the run.
    pub start: Dur,
    /// End, from the beginning of the run.
    pub end: Dur,
}

/// Arrival rate over time: a base rate, changed by steps and multiplied by surges. Arrivals are
/// Poisson with that rate.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProducerSpec {
    /// Messages per second at the start.
    pub rate: f64,
    /// At `at`, the base rate becomes `rate`.
    #[serde(default)]
    pub steps: Vec<RateStep>,
    /// During each surge the rate is multiplied by `factor`.
    #[serde(default)]
    pub surges: Vec<Surge>,
}

/// A step change of the arrival rate.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateStep {
    /// When.
    pub at: Dur,
    /// The new base rate (messages per second).
    pub rate: f64,
}

/// A temporary multiplication of the arrival rate.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Surge {
    /// Start.
    pub start: Dur,
    /// Length.
    pub duration: Dur,
    /// Multiplier of the base rate.
    pub factor: f64,
}

/// The queue's redelivery behaviour.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSpec {
    /// A failed message becomes visible again this long after its failure.
    #[serde(default = "default_visibility")]
    pub visibility_timeout: Dur,
    /// After this many failed deliveries a message moves to the DLQ (SQS `maxReceiveCount`).
    #[serde(default = "default_max_receives")]
    pub max_receives: u8,
    /// The most messages the broker stores (a memory or length limit, like Redis `maxmemory`
    /// with `noeviction` or a RabbitMQ `x-max-length` with `reject-publish`): waiting messages
    /// (new or awaiting redelivery) plus delivered ones not yet acknowledged, which the broker
    /// keeps until the ack. A message published while it is full is rejected. Absent:
    /// unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
}

fn default_visibility() -> Dur {
    Dur(30.0)
}
fn default_max_receives() -> u8 {
    5
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            visibility_timeout: default_visibility(),
            max_receives: default_max_receives(),
            capacity: None,
        }
    }
}

/// Producer control as a scenario gives it: the operator's `spec.producers` without the
/// `targetRef` (the simulated producer workload). Our policy resolves it with the operator's
/// `resolve` and decides it with `backpressure_core::producers::decide_producers`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProducersSection {
    /// `Pause` (the default), `Throttle` or `Off`.
    #[serde(default)]
    pub mode: ProducerMode,
    /// Watermarks on the queue depth, in messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<DepthMarks>,
    /// Watermarks on the first-attempt queue age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_age: Option<AgeMarks>,
    /// Shortest time restricted before resuming (the operator's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_dwell: Option<Dur>,
    /// Time of each step of the way back to open (the operator's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_dwell: Option<Dur>,
}

/// Queue-depth watermarks.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DepthMarks {
    /// Restrict the producers while more messages than this wait.
    pub pause_above: u64,
    /// Resume once fewer than this wait.
    pub resume_below: u64,
}

/// Queue-age watermarks.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgeMarks {
    /// Restrict the producers while the oldest message not yet delivered once is older.
    pub pause_above: Dur,
    /// Resume once it is younger.
    pub resume_below: Dur,
}

/// A log-normal distribution given by its mean and log-space standard deviation.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogNormal {
    /// Mean.
    pub mean: Dur,
    /// Standard deviation of the logarithm (0 = constant).
    #[serde(default)]
    pub sigma: f64,
}

/// One worker pod: its controller settings and its own processing time.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkersSpec {
    /// Permits at zero backoff.
    #[serde(default = "default_max_permits")]
    pub max_permits: u32,
    /// Set point of the backpressure controller.
    #[serde(default = "default_set_point")]
    pub set_point: f64,
    /// Reaction size N (default max(20, maxPermits)).
    #[serde(default)]
    pub reaction: Option<u32>,
    /// First probe interval.
    #[serde(default = "default_probe_initial")]
    pub probe_initial: Dur,
    /// Largest probe interval.
    #[serde(default = "default_probe_max")]
    pub probe_max: Dur,
    /// Permits of a freshly started pod's controller, which ramps up from there
    /// (`Settings::initial_permits` of the worker library; 0 starts at `maxPermits`).
    #[serde(default = "default_initial_permits")]
    pub initial_permits: u32,
    /// With a value: the worker library's redelivery backoff (`Settings::redelivery`, applied by
    /// `WorkerLoop`): a failed message is visible again `base · 2^(k-1)` (at most `max`) after
    /// its k-th failed delivery; defaults to the library's default (1 min to 8 min). `null`:
    /// after the queue's visibility timeout every time.
    #[serde(default = "default_redelivery")]
    pub redelivery_backoff: Option<RedeliverySpec>,
    /// Local processing time before the dependency call.
    #[serde(default = "default_processing")]
    pub processing: LogNormal,
}

/// The worker library's `RedeliveryBackoff`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedeliverySpec {
    /// The delay after a failed first delivery.
    pub base: Dur,
    /// The longest delay.
    pub max: Dur,
}

fn default_max_permits() -> u32 {
    backpressure_api::defaults::MAX_PERMITS
}
fn default_set_point() -> f64 {
    backpressure_api::defaults::SET_POINT
}
fn default_probe_initial() -> Dur {
    Dur(backpressure_api::defaults::PROBE_INITIAL.as_secs_f64())
}
fn default_probe_max() -> Dur {
    Dur(backpressure_api::defaults::PROBE_MAX.as_secs_f64())
}
fn default_initial_permits() -> u32 {
    backpressure_worker::controller::DEFAULT_INITIAL_PERMITS
}
fn default_redelivery() -> Option<RedeliverySpec> {
    backpressure_worker::controller::DEFAULT_REDELIVERY.map(|(base, max)| RedeliverySpec {
        base: Dur(base.as_secs_f64()),
        max: Dur(max.as_secs_f64()),
    })
}
fn default_processing() -> LogNormal {
    LogNormal {
        mean: Dur(0.2),
        sigma: 0.5,
    }
}

impl Default for WorkersSpec {
    fn default() -> Self {
        WorkersSpec {
            max_permits: default_max_permits(),
            set_point: default_set_point(),
            reaction: None,
            probe_initial: default_probe_initial(),
            probe_max: default_probe_max(),
            initial_permits: default_initial_permits(),
            redelivery_backoff: default_redelivery(),
            processing: default_processing(),
        }
    }
}

impl WorkersSpec {
    /// The reaction size in force.
    pub fn reaction(&self) -> u32 {
        self.reaction
            .unwrap_or_else(|| backpressure_api::defaults::reaction(self.max_permits))
    }
}

/// The replica set and its bounds.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetSpec {
    /// Replicas at the start (and always, for the static policy).
    pub replicas: u32,
    /// Autoscaler lower bound.
    pub min_replicas: u32,
    /// Autoscaler upper bound.
    pub max_replicas: u32,
    /// A new pod starts polling this long after it is created.
    #[serde(default = "default_startup")]
    pub startup_delay: Dur,
    /// The queue age the autoscalers aim for.
    #[serde(default = "default_target_age")]
    pub target_queue_age: Dur,
    /// `lagCount` of the KEDA lagCount comparator: messages never delivered per pod. Absent:
    /// [`Scenario::lag_count`]'s sizing from the target age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_lag: Option<u64>,
    /// A cold start: the workload is deployed when the run starts. The initial replicas are
    /// created then (ready after `startupDelay`, on their startup ramp like any new pod), the
    /// rate window starts empty and the autoscalers decide from their first sync on what the
    /// metrics hold by then, as after a new deployment, a rollout that restarted every pod, or
    /// an activation. Default (false): the fleet has been running before the start, its
    /// controllers past their ramp and the rate window full.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cold_start: bool,
}

fn default_startup() -> Dur {
    Dur(30.0)
}
fn default_target_age() -> Dur {
    Dur(backpressure_api::defaults::TARGET_QUEUE_AGE.as_secs_f64())
}

/// The dependency every message calls once.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DependencySpec {
    /// Requests per second it can serve, shared by the whole fleet. Requests above it fail
    /// (a token bucket with `burst` seconds of capacity).
    pub capacity: f64,
    /// Token bucket depth in seconds of capacity.
    #[serde(default = "default_burst")]
    pub burst: Dur,
    /// Background failure probability of every call.
    #[serde(default)]
    pub noise: f64,
    /// Latency of a successful call.
    #[serde(default = "default_latency")]
    pub latency: LogNormal,
    /// Latency of a failed call.
    #[serde(default = "default_failure_latency")]
    pub failure_latency: LogNormal,
    /// At `at`, the nominal capacity becomes `capacity`.
    #[serde(default)]
    pub capacity_steps: Vec<CapacityStep>,
    /// Injected outages.
    #[serde(default)]
    pub outages: Vec<Outage>,
}

fn default_burst() -> Dur {
    Dur(1.0)
}
fn default_latency() -> LogNormal {
    LogNormal {
        mean: Dur(0.8),
        sigma: 0.5,
    }
}
fn default_failure_latency() -> LogNormal {
    LogNormal {
        mean: Dur(0.2),
        sigma: 0.3,
    }
}

/// A step change of the dependency's nominal capacity.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapacityStep {
    /// When.
    pub at: Dur,
    /// New capacity in requests per second.
    pub capacity: f64,
}

/// An injected outage.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all_fields = "camelCase", deny_unknown_fields, tag = "kind")]
pub enum Outage {
    /// Every call fails; afterwards capacity returns linearly from 0 over `recovery`.
    #[serde(rename = "hard")]
    Hard {
        /// Start.
        start: Dur,
        /// Length.
        duration: Dur,
        /// Capacity ramp after the outage.
        #[serde(default)]
        recovery: Dur,
    },
    /// A fraction `failure` of calls fails; afterwards capacity returns over `recovery`.
    #[serde(rename = "partial")]
    Partial {
        /// Start.
        start: Dur,
        /// Length.
        duration: Dur,
        /// Failure probability during the outage.
        failure: f64,
        /// Capacity ramp after the outage.
        #[serde(default)]
        recovery: Dur,
    },
    /// Short error spikes of random length and depth, separated by exponential gaps, drawn
    /// from the scenario seed.
    #[serde(rename = "intermittent")]
    Intermittent {
        /// Start of the period with spikes.
        start: Dur,
        /// Length of the period with spikes.
        duration: Dur,
        /// Mean gap between spikes.
        mean_gap: Dur,
        /// Spike length range [min, max].
        length: [Dur; 2],
        /// Spike depth (failure probability) range [min, max].
        depth: [f64; 2],
    },
}

/// Autoscaler and metrics-pipeline timing.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalerSpec {
    /// How often the autoscaler decides (HPA sync period, operator requeue).
    #[serde(default = "default_sync")]
    pub sync: Dur,
    /// How often metrics are scraped; decisions see the last scrape.
    #[serde(default = "default_sync")]
    pub scrape: Dur,
    /// Window of the rate() queries.
    #[serde(default = "default_rate_window")]
    pub rate_window: Dur,
}

fn default_sync() -> Dur {
    Dur(15.0)
}
fn default_rate_window() -> Dur {
    Dur(60.0)
}

impl Default for AutoscalerSpec {
    fn default() -> Self {
        AutoscalerSpec {
            sync: default_sync(),
            scrape: default_sync(),
            rate_window: default_rate_window(),
        }
    }
}

/// A target for our policy, checked by the report.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// The metric.
    pub metric: TargetMetric,
    /// Largest acceptable value.
    #[serde(default)]
    pub max: Option<f64>,
    /// Smallest acceptable value.
    #[serde(default)]
    pub min: Option<f64>,
    /// The target as the issue words it.
    #[serde(default)]
    pub text: String,
    /// The policy whose run the target is about, by key (`crate::policy`); absent: ours
    /// (`bp-ours`). Lets a producer-control scenario state what happens without producer
    /// control (`bp-ours-ungated`) or with the other mode (`bp-ours-throttle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Metrics a target can name.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TargetMetric {
    /// Messages in the DLQ at the end.
    Dlq,
    /// DLQ messages per failed attempt.
    DlqPerFailedAttempt,
    /// Goodput as a fraction of what the dependency could serve.
    Goodput,
    /// Fleet failure rate over the incident window divided by the set point.
    FailureRateOverSetPoint,
    /// Max first-attempt queue age divided by that of greedy workers with KEDA on the queue
    /// age (`greedy-keda`).
    MaxAgeVsKeda,
    /// Replicas added during the incident window.
    ReplicasAddedDuringIncident,
    /// Peak dependency load / capacity in the 10 minutes after recovery.
    PeakLoadAfterRecovery,
    /// Drain time divided by the theoretical minimum.
    DrainRatio,
    /// Seconds the autoscaler held scale-out.
    HeldSeconds,
    /// Fraction of ready pod-time with fewer permits than the maximum.
    ThrottledFraction,
    /// Fraction of the incident window the autoscaler held scale-out.
    HeldFractionOfIncident,
    /// Ramp stages started after recovery.
    RampStages,
    /// Calls rejected for overload / calls over the goodput window, divided by the set point:
    /// the failures the fleet caused with its own load (no scale-out into overload).
    OverloadRateOverSetPoint,
    /// Seconds held per hour of the goodput window (no latching hold).
    HeldSecondsPerHour,
    /// Seconds held after the end of the incident.
    HeldAfterRecovery,
    /// Seconds held per hour of the goodput window while the dependency had headroom (calls
    /// under 90 % of its capacity, no outage): a hold that protects nothing.
    HeldWithHeadroomPerHour,
    /// Seconds held after the end of the incident while the dependency had headroom.
    HeldWithHeadroomAfterRecovery,
    /// Messages completed divided by those completed under backpressure + KEDA queue age
    /// (`bp-keda`: the same workers under an autoscaler that looks at the backlog only).
    CompletedVsBacklogOnly,
    /// DLQ per failed attempt divided by that of greedy + KEDA queue age (`greedy-keda`; 0 when
    /// both are 0).
    DlqPerFailedAttemptVsGreedy,
    /// DLQ messages minus those of backpressure + static (the same workers, no autoscaler).
    DlqVsStatic,
    /// Highest broker queue depth (messages waiting, new or awaiting redelivery) at any tick.
    PeakQueueDepth,
    /// Publishes the broker rejected because it was full (`queue.capacity`).
    BrokerRejected,
    /// Messages lost to broker rejections (rejected and not held by the producer).
    LostToBroker,
    /// Highest producer-side backlog (messages the producer gate has not admitted yet).
    PeakProducerBacklog,
    /// Highest time from a message's demand at the producer to its completion (seconds).
    MaxEndToEndAge,
    /// 99th percentile of that time over completed messages (seconds).
    P99EndToEndAge,
    /// Time after recovery until the broker queue and the producer backlog are both back to
    /// their pre-incident level, divided by the theoretical minimum for that backlog: 1 when
    /// producer control costs no throughput after recovery.
    SystemDrainRatio,
    /// Highest `spec.replicas` over the run (no overshoot: a scale-out sized on a rate the
    /// fleet's own start-up diluted).
    PeakReplicas,
}

impl ProducersSection {
    fn validate(&self) -> Result<(), (&'static str, String)> {
        if let Some(d) = self.queue_depth
            && d.resume_below >= d.pause_above
        {
            return Err((
                "producers.queueDepth.resumeBelow",
                format!(
                    "{} must be below pauseAbove {}",
                    d.resume_below, d.pause_above
                ),
            ));
        }
        if let Some(a) = self.queue_age
            && a.resume_below.0 >= a.pause_above.0
        {
            return Err((
                "producers.queueAge.resumeBelow",
                "must be below pauseAbove".to_owned(),
            ));
        }
        if self.mode != ProducerMode::Off && self.queue_depth.is_none() && self.queue_age.is_none()
        {
            return Err((
                "producers",
                "set queueDepth or queueAge watermarks".to_owned(),
            ));
        }
        if self.resume_dwell.is_some_and(|d| d.0 < 1.0) {
            return Err(("producers.resumeDwell", "must be >= 1s".to_owned()));
        }
        Ok(())
    }
}

impl Scenario {
    /// Parses and validates a scenario from YAML text; `name` is used in messages.
    pub fn from_yaml(text: &str, name: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = serde_yaml::from_str(text).map_err(|source| ScenarioError::Parse {
            name: name.to_owned(),
            source,
        })?;
        s.validate()?;
        Ok(s)
    }

    /// Reads, parses and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let mut s = Scenario::from_yaml(&text, &path.display().to_string())?;
        s.source = Some(path.display().to_string());
        Ok(s)
    }

    /// Loads every `*.yaml` file of a directory, sorted by file name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Scenario>, ScenarioError> {
        let io = |source| ScenarioError::Io {
            path: dir.display().to_string(),
            source,
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        // Numbered files in numeric order (`9-…` before `10-…`), then by name.
        paths.sort_by_key(|p| {
            let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
            let stem = stem.unwrap_or_default();
            let digits: String = stem.chars().take_while(char::is_ascii_digit).collect();
            (digits.parse::<u64>().unwrap_or(u64::MAX), stem)
        });
        paths.iter().map(|p| Scenario::load(p)).collect()
    }

    /// `lagCount` for the KEDA lagCount comparator: `fleet.targetLag`, or what a user would
    /// size from the target age by Little's law: the lag one pod clears in `targetQueueAge` at
    /// full concurrency, `targetQueueAge × maxPermits / (processing + latency)` (mean times),
    /// rounded, at least 1.
    pub fn lag_count(&self) -> i64 {
        if let Some(lag) = self.fleet.target_lag {
            return i64::try_from(lag).unwrap_or(i64::MAX).max(1);
        }
        let service = self.workers.processing.mean.secs() + self.dependency.latency.mean.secs();
        let per_pod = f64::from(self.workers.max_permits) / service.max(1e-3);
        ((self.fleet.target_queue_age.secs() * per_pod).round() as i64).max(1)
    }

    fn invalid(&self, field: &'static str, reason: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            name: self.name.clone(),
            field,
            reason: reason.into(),
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if !pos(self.duration.0) || self.duration.0 > 7.0 * 86400.0 {
            return Err(self.invalid("duration", "must be in (0, 7 days]"));
        }
        if !(0.001..=1.0).contains(&self.tick.0) {
            return Err(self.invalid("tick", "must be between 1ms and 1s"));
        }
        if (1.0 / self.tick.0).fract().abs() > 1e-9 && (1.0 / self.tick.0).fract() < 1.0 - 1e-9 {
            return Err(self.invalid("tick", "must divide one second evenly"));
        }
        let rates =
            std::iter::once(self.producer.rate).chain(self.producer.steps.iter().map(|s| s.rate));
        for r in rates {
            if !(r.is_finite() && r >= 0.0) {
                return Err(self.invalid("producer.rate", "must be >= 0"));
            }
        }
        for s in &self.producer.surges {
            if !(s.factor.is_finite() && s.factor >= 0.0) {
                return Err(self.invalid("producer.surges.factor", "must be >= 0"));
            }
        }
        if self.queue.max_receives == 0 {
            return Err(self.invalid("queue.maxReceives", "must be >= 1"));
        }
        if !pos(self.queue.visibility_timeout.0) {
            return Err(self.invalid("queue.visibilityTimeout", "must be > 0"));
        }
        let w = &self.workers;
        if w.max_permits == 0 || w.max_permits > 10_000 {
            return Err(self.invalid("workers.maxPermits", "must be in 1..=10000"));
        }
        if !(w.set_point > 0.0 && w.set_point < 1.0) {
            return Err(self.invalid("workers.setPoint", "must be in (0, 1)"));
        }
        let f = &self.fleet;
        if f.min_replicas > f.max_replicas || f.max_replicas == 0 || f.max_replicas > 10_000 {
            return Err(self.invalid(
                "fleet",
                "need 0 <= minReplicas <= maxReplicas <= 10000, maxReplicas >= 1",
            ));
        }
        if f.replicas < f.min_replicas || f.replicas > f.max_replicas {
            return Err(self.invalid(
                "fleet.replicas",
                "must be within [minReplicas, maxReplicas]",
            ));
        }
        if !pos(f.target_queue_age.0) {
            return Err(self.invalid("fleet.targetQueueAge", "must be > 0"));
        }
        if f.target_lag == Some(0) {
            return Err(self.invalid("fleet.targetLag", "must be >= 1"));
        }
        let d = &self.dependency;
        let caps = std::iter::once(d.capacity).chain(d.capacity_steps.iter().map(|s| s.capacity));
        for c in caps {
            if !(c.is_finite() && c >= 0.0) {
                return Err(self.invalid("dependency.capacity", "must be >= 0"));
            }
        }
        if !(0.0..1.0).contains(&d.noise) {
            return Err(self.invalid("dependency.noise", "must be in [0, 1)"));
        }
        for o in &d.outages {
            match o {
                Outage::Partial { failure, .. } if !(0.0..=1.0).contains(failure) => {
                    return Err(self.invalid("dependency.outages.failure", "must be in [0, 1]"));
                }
                Outage::Intermittent {
                    mean_gap,
                    length,
                    depth,
                    ..
                } => {
                    if !pos(mean_gap.0) || length[0].0 > length[1].0 || !pos(length[0].0) {
                        return Err(self.invalid(
                            "dependency.outages",
                            "intermittent needs meanGap > 0 and 0 < length[0] <= length[1]",
                        ));
                    }
                    if !(0.0..=1.0).contains(&depth[0])
                        || !(0.0..=1.0).contains(&depth[1])
                        || depth[0] > depth[1]
                    {
                        return Err(
                            self.invalid("dependency.outages.depth", "need 0 <= min <= max <= 1")
                        );
                    }
                }
                _ => {}
            }
        }
        for w in self.incident.iter().chain(self.goodput_window.iter()) {
            if w.start.0 > w.end.0 || w.end.0 > self.duration.0 {
                return Err(self.invalid("incident", "need start <= end <= duration"));
            }
        }
        if self.queue.capacity == Some(0) {
            return Err(self.invalid("queue.capacity", "must be >= 1"));
        }
        if let Some(p) = &self.producers {
            p.validate()
                .map_err(|(field, reason)| self.invalid(field, reason))?;
        }
        for t in &self.targets {
            if let Some(key) = &t.policy {
                let Some(policy) = crate::policy::by_key(key) else {
                    return Err(self.invalid("targets.policy", format!("unknown policy {key}")));
                };
                if !crate::policy::for_scenario(self).contains(&policy) {
                    return Err(self.invalid(
                        "targets.policy",
                        format!("{key} runs only on scenarios with a producers section"),
                    ));
                }
            }
        }
        if !pos(self.autoscaler.sync.0)
            || !pos(self.autoscaler.scrape.0)
            || !pos(self.autoscaler.rate_window.0)
        {
            return Err(self.invalid("autoscaler", "sync, scrape and rateWindow must be > 0"));
        }
        Ok(())
    }

    /// The same scenario with every point of its timeline (duration, steps, surges, outages,
    /// windows) multiplied by `factor`; the system's own constants (latencies, timeouts,
    /// autoscaler periods, startup delay) are kept. Used by `--quick`.
    pub fn compressed(&self, factor: f64) -> Scenario {
        let k = |d: Dur| Dur(d.0 * factor);
        let mut s = self.clone();
        s.duration = k(s.duration);
        for st in &mut s.producer.steps {
            st.at = k(st.at);
        }
        for su in &mut s.producer.surges {
            su.start = k(su.start);
            su.duration = k(su.duration);
        }
        for st in &mut s.dependency.capacity_steps {
            st.at = k(st.at);
        }
        for o in &mut s.dependency.outages {
            match o {
                Outage::Hard {
                    start, duration, ..
                }
                | Outage::Partial {
                    start, duration, ..
                } => {
                    *start = k(*start);
                    *duration = k(*duration);
                }
                Outage::Intermittent {
                    start,
                    duration,
                    mean_gap,
                    ..
                } => {
                    *start = k(*start);
                    *duration = k(*duration);
                    *mean_gap = k(*mean_gap);
                }
            }
        }
        for w in s.incident.iter_mut().chain(s.goodput_window.iter_mut()) {
            w.start = k(w.start);
            w.end = k(w.end);
        }
        s
    }

    /// The goodput window in force.
    pub fn goodput_window(&self) -> Window {
        self.goodput_window.or(self.incident).unwrap_or(Window {
            start: Dur(0.0),
            end: self.duration,
        })
    }
}

#[cfg(test)]
mod tests;
mod timeline;

pub use timeline::{Episode, Timeline};
