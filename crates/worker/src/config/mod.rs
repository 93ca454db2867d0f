//! The config receiver: applies a [`WorkerConfig`] at runtime, without a restart, from a mounted
//! file ([`FileWatcher`]) and from authenticated pushes to the admin port ([`admin`]).
//!
//! [`ConfigState`] is the single place where configuration is applied. It validates the
//! payload ([`WorkerConfig::validate`]), checks it against the worker's own [`Limits`] (values
//! the wire contract allows but that would hurt this worker, and a generation far ahead of its
//! clock), refuses a payload older than the running generation, applies the controller
//! settings and brake to the [`Gate`], and updates the config-info metric. A refused payload
//! leaves the running configuration unchanged.
//!
//! Over-limit values are refused (HTTP 400 naming the field), not clamped: the worker
//! acknowledges the hash of what it runs, and a clamped config would run something other than
//! the hash the operator sent, so the operator would count the pod in sync with a config it
//! does not run. A refusal shows up instead as `ConfigPushFailed` with the field named.
//!
//! The ordering rules (older generation refused, same hash and generation a no-op, applied
//! under one lock so that file and push apply in order) are not specific to the worker
//! config: they live in a private `Versioned` holder that [`ConfigState`] and the producer
//! gate ([`crate::producer::ProducerGate`]) share, and [`FileWatcher`] reloads either through
//! the [`Apply`] trait.

pub mod admin;
#[cfg(feature = "tls")]
pub mod tls;
pub mod token;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::wire::{
    ConfigAck, ConfigError, MAX_GENERATION_LEAD_MS, ProducerConfig, WorkerConfig,
};
use sha2::{Digest, Sha256};

use crate::controller::Settings;
use crate::metrics::Metrics;
use crate::permits::Gate;

/// Why a configuration was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// Malformed or invalid (HTTP 400, or 413 for [`ConfigError::TooLarge`]).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// Older than the running generation (HTTP 409).
    #[error("generation {given} is older than the running generation {running}")]
    Stale {
        /// The generation running.
        running: i64,
        /// The generation offered.
        given: i64,
    },
}

/// The worker's own bounds on a configuration, checked on every update (push or file) on top
/// of the wire contract's ranges. The configuration is tenant input relayed by the operator:
/// these bounds are what this worker can afford whatever the WorkerBackpressure says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest `maxPermits` (messages processed at once). Default 1024; raise it for a worker
    /// that really runs more at once.
    pub max_permits: u32,
    /// Largest `reaction` (the API's own bound, 100000).
    pub max_reaction: u32,
    /// Smallest `probeInitialMs`: a fully backed-off worker probes at most this often.
    /// Default 100 ms.
    pub min_probe_ms: u64,
    /// Largest `probeInitialMs` and `probeMaxMs`: a fully backed-off worker probes at least
    /// this often, so a recovered dependency is noticed. Default 1 h.
    pub max_probe_ms: u64,
    /// How far `generation` (Unix milliseconds, see the wire contract) may be ahead of this
    /// worker's clock. Default [`MAX_GENERATION_LEAD_MS`] (5 minutes).
    pub max_generation_lead_ms: i64,
    /// Largest `ratioWindowMs` and `brakeReleaseMs`. Default 1 h (the API's bound).
    pub max_window_ms: u64,
    /// Largest `redelivery.maxMs` (and `baseMs`). Default 12 h (SQS's largest visibility
    /// timeout; the API's bound).
    pub max_redelivery_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_permits: 1024,
            max_reaction: 100_000,
            min_probe_ms: 100,
            max_probe_ms: 3_600_000,
            max_generation_lead_ms: MAX_GENERATION_LEAD_MS,
            max_window_ms: 3_600_000,
            max_redelivery_ms: 43_200_000,
        }
    }
}

impl Limits {
    /// Checks `cfg` at `now_unix` (seconds); the error names the field.
    pub fn check(&self, cfg: &WorkerConfig, now_unix: i64) -> Result<(), ConfigError> {
        let field = |field: &'static str, reason: String| ConfigError::Field { field, reason };
        if cfg.max_permits > self.max_permits {
            return Err(field(
                "maxPermits",
                format!(
                    "{} exceeds this worker's limit of {}",
                    cfg.max_permits, self.max_permits
                ),
            ));
        }
        if cfg.reaction > self.max_reaction {
            return Err(field(
                "reaction",
                format!(
                    "{} exceeds this worker's limit of {}",
                    cfg.reaction, self.max_reaction
                ),
            ));
        }
        for (name, ms) in [
            ("probeInitialMs", cfg.probe_initial_ms),
            ("probeMaxMs", cfg.probe_max_ms),
        ] {
            if ms < self.min_probe_ms || ms > self.max_probe_ms {
                return Err(field(
                    name,
                    format!(
                        "{ms} ms is outside this worker's range of {} to {} ms",
                        self.min_probe_ms, self.max_probe_ms
                    ),
                ));
            }
        }
        if let Some(p) = cfg.initial_permits
            && p > self.max_permits
        {
            return Err(field(
                "initialPermits",
                format!("{p} exceeds this worker's limit of {}", self.max_permits),
            ));
        }
        for (name, ms) in [
            ("ratioWindowMs", cfg.ratio_window_ms),
            ("brakeReleaseMs", cfg.brake_release_ms),
        ] {
            if let Some(ms) = ms
                && ms > self.max_window_ms
            {
                return Err(field(
                    name,
                    format!(
                        "{ms} ms exceeds this worker's limit of {} ms",
                        self.max_window_ms
                    ),
                ));
            }
        }
        if let Some(r) = &cfg.redelivery
            && r.max_ms.max(r.base_ms) > self.max_redelivery_ms
        {
            return Err(field(
                "redelivery.maxMs",
                format!(
                    "{} ms exceeds this worker's limit of {} ms",
                    r.max_ms.max(r.base_ms),
                    self.max_redelivery_ms
                ),
            ));
        }
        check_generation_lead(cfg.generation, now_unix, self.max_generation_lead_ms)
    }
}

/// Refuses a `generation` more than `max_lead_ms` ahead of `now_unix` (seconds): generations
/// are Unix milliseconds, and one far in the future (`i64::MAX`) would make every later
/// legitimate document stale (409). Shared by the worker config and the producer state.
pub(crate) fn check_generation_lead(
    generation: i64,
    now_unix: i64,
    max_lead_ms: i64,
) -> Result<(), ConfigError> {
    let horizon = now_unix.saturating_mul(1000).saturating_add(max_lead_ms);
    if generation > horizon {
        return Err(ConfigError::Field {
            field: "generation",
            reason: format!(
                "{generation} is more than {} s ahead of this worker's clock ({} ms); generations are Unix milliseconds",
                max_lead_ms / 1000,
                now_unix.saturating_mul(1000)
            ),
        });
    }
    Ok(())
}

/// Where the running configuration came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in or programmatic initial configuration.
    Initial,
    /// The mounted file.
    File,
    /// A push to the admin port.
    Push,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Initial => "initial",
            Origin::File => "file",
            Origin::Push => "push",
        }
    }
}

/// A document of the wire contract ordered by `generation` and named by `hash`: the worker
/// config and the producer state.
pub(crate) trait Document: Clone + Send + 'static {
    /// What the document is, for logs.
    const KIND: &'static str;
    /// Its generation.
    fn generation(&self) -> i64;
    /// Its hash (empty when not given).
    fn hash(&self) -> &str;
    /// The document with its hash computed.
    fn hashed(self) -> Self;
}

impl Document for WorkerConfig {
    const KIND: &'static str = "worker config";
    fn generation(&self) -> i64 {
        self.generation
    }
    fn hash(&self) -> &str {
        &self.hash
    }
    fn hashed(self) -> Self {
        self.with_hash()
    }
}

impl Document for ProducerConfig {
    const KIND: &'static str = "producer state";
    fn generation(&self) -> i64 {
        self.generation
    }
    fn hash(&self) -> &str {
        &self.hash
    }
    fn hashed(self) -> Self {
        self.with_hash()
    }
}

/// `doc` with its hash filled in when it came without one (a given hash was validated).
fn with_hash<D: Document>(doc: D) -> D {
    if doc.hash().is_empty() {
        doc.hashed()
    } else {
        doc
    }
}

struct Running<D> {
    doc: D,
    origin: Origin,
}

/// The running document of one kind and the ordering rules of the wire contract: an older
/// generation is refused, the same generation and hash is a no-op, anything else is installed
/// under the lock (so concurrent file and push updates apply in order).
pub(crate) struct Versioned<D> {
    running: Mutex<Running<D>>,
}

impl<D: Document> Versioned<D> {
    /// Starts from `initial` (already validated), origin [`Origin::Initial`].
    pub(crate) fn new(initial: D) -> Self {
        Versioned {
            running: Mutex::new(Running {
                doc: with_hash(initial),
                origin: Origin::Initial,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running<D>> {
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The running document.
    pub(crate) fn running(&self) -> D {
        self.lock().doc.clone()
    }

    /// The running hash and generation.
    pub(crate) fn ack(&self) -> ConfigAck {
        let r = self.lock();
        ConfigAck {
            hash: r.doc.hash().to_owned(),
            generation: r.doc.generation(),
        }
    }

    /// Where the running document came from.
    pub(crate) fn origin(&self) -> Origin {
        self.lock().origin
    }

    /// Orders `doc` (validated by the caller) against the running one and, when it is new,
    /// calls `install` with it under the lock, then makes it the running one.
    pub(crate) fn apply(
        &self,
        doc: D,
        origin: Origin,
        install: impl FnOnce(&D),
    ) -> Result<ConfigAck, ApplyError> {
        let doc = with_hash(doc);
        let mut running = self.lock();
        let current = running.doc.generation();
        if doc.generation() < current {
            return Err(ApplyError::Stale {
                running: current,
                given: doc.generation(),
            });
        }
        let ack = ConfigAck {
            hash: doc.hash().to_owned(),
            generation: doc.generation(),
        };
        if doc.hash() == running.doc.hash() && doc.generation() == current {
            return Ok(ack);
        }
        install(&doc);
        tracing::info!(
            hash = %ack.hash,
            generation = ack.generation,
            from = origin.as_str(),
            previous = %running.doc.hash(),
            "{} applied",
            D::KIND
        );
        running.doc = doc;
        running.origin = origin;
        Ok(ack)
    }
}

/// Something a document in bytes is applied to: [`ConfigState`] (the worker config) or
/// [`crate::producer::ProducerGate`] (the producer state). The admin server's pushes and the
/// [`FileWatcher`] go through it.
pub trait Apply: Send + Sync {
    /// What the documents are, for logs and error messages ("worker config").
    fn kind(&self) -> &'static str;
    /// Parses, validates and applies a document.
    fn apply_bytes(&self, bytes: &[u8], origin: Origin) -> Result<ConfigAck, ApplyError>;
}

/// The running configuration and where it is applied. Cheap to clone.
#[derive(Clone)]
pub struct ConfigState {
    running: Arc<Versioned<WorkerConfig>>,
    gate: Gate,
    metrics: Option<Metrics>,
    /// Library-side settings (credit, health-check probes) kept across pushes, and the
    /// application's choice for the optional fields a payload leaves out.
    base: Settings,
    limits: Limits,
}

impl fmt::Debug for ConfigState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigState")
            .field("ack", &self.ack())
            .finish_non_exhaustive()
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl ConfigState {
    /// Starts from `initial` (validated; an invalid one is replaced by the default), applying it
    /// to `gate`. The library-side knobs of `gate`'s current settings are kept across updates.
    pub fn new(gate: Gate, initial: WorkerConfig, metrics: Option<Metrics>) -> Self {
        let initial = match initial.validate() {
            Ok(()) => initial,
            Err(e) => {
                tracing::warn!(error = %e, "invalid initial worker config; using the defaults");
                WorkerConfig::default()
            }
        };
        let initial = with_hash(initial);
        let state = ConfigState {
            running: Arc::new(Versioned::new(initial.clone())),
            base: gate.settings(),
            gate,
            metrics,
            limits: Limits::default(),
        };
        state.install(&initial, unix_now());
        state
    }

    /// Checks every later update against `limits` instead of [`Limits::default`]. (The
    /// initial configuration is the application's own and is not checked.)
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits updates are checked against.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The running configuration.
    pub fn running(&self) -> WorkerConfig {
        self.running.running()
    }

    /// The running hash and generation.
    pub fn ack(&self) -> ConfigAck {
        self.running.ack()
    }

    /// The gate the configuration is applied to.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Parses, validates and applies a payload.
    pub fn apply_bytes(&self, bytes: &[u8], origin: Origin) -> Result<ConfigAck, ApplyError> {
        let cfg = WorkerConfig::parse(bytes)?;
        self.apply(cfg, origin)
    }

    /// Validates and applies a configuration (see the module docs).
    pub fn apply(&self, cfg: WorkerConfig, origin: Origin) -> Result<ConfigAck, ApplyError> {
        self.apply_at(cfg, origin, unix_now())
    }

    /// [`ConfigState::apply`] with the current Unix time given (for the brake's expiry and the
    /// generation's lead).
    pub fn apply_at(
        &self,
        cfg: WorkerConfig,
        origin: Origin,
        now_unix: i64,
    ) -> Result<ConfigAck, ApplyError> {
        cfg.validate()?;
        self.limits.check(&cfg, now_unix)?;
        self.running
            .apply(cfg, origin, |cfg| self.install(cfg, now_unix))
    }

    /// Where the running configuration came from.
    pub fn origin(&self) -> Origin {
        self.running.origin()
    }

    fn install(&self, cfg: &WorkerConfig, now_unix: i64) {
        let b = &self.base;
        let from = Settings::from_config(cfg);
        // A field the payload carries wins; one it leaves out keeps the application's setting
        // (the library default unless the application chose otherwise).
        let settings = Settings {
            credit: b.credit,
            health_check_probes: b.health_check_probes,
            ratio_window: pick(cfg.ratio_window_ms, from.ratio_window, b.ratio_window),
            brake_release: pick(cfg.brake_release_ms, from.brake_release, b.brake_release),
            initial_permits: pick(cfg.initial_permits, from.initial_permits, b.initial_permits),
            floor_max: pick(cfg.floor_max, from.floor_max, b.floor_max),
            redelivery: pick(cfg.redelivery, from.redelivery, b.redelivery),
            ..from
        };
        self.gate.apply(settings, cfg.brake.as_ref(), now_unix);
        if let Some(m) = &self.metrics {
            m.set_config(&cfg.hash, cfg.algorithm);
        }
    }
}

/// `from_payload` when the payload sets the field (`given`), else `base`.
fn pick<G, T>(given: Option<G>, from_payload: T, base: T) -> T {
    if given.is_some() { from_payload } else { base }
}

impl Apply for ConfigState {
    fn kind(&self) -> &'static str {
        WorkerConfig::KIND
    }

    fn apply_bytes(&self, bytes: &[u8], origin: Origin) -> Result<ConfigAck, ApplyError> {
        ConfigState::apply_bytes(self, bytes, origin)
    }
}

/// Default interval between checks of the mounted file.
pub const DEFAULT_FILE_POLL: Duration = Duration::from_secs(1);

/// Watches a mounted document file and applies it when its content changes: the worker
/// config (`worker-config.json`) to a [`ConfigState`], or the producer state
/// (`producer-state.json`) to a [`crate::producer::ProducerGate`].
///
/// It polls the file's content through its path (following symlinks), which handles both a
/// file rewritten in place and kubelet's ConfigMap update, where `worker-config.json` is a
/// symlink to `..data/worker-config.json` and `..data` is atomically re-pointed to a new
/// timestamped directory. Reading a small file once a second costs less than a notification
/// backend and cannot miss an event. A missing file is waited for; an invalid file is reported
/// once per content and the running document stays.
#[derive(Debug)]
pub struct FileWatcher<T = ConfigState> {
    state: T,
    path: PathBuf,
    last_digest: Option<[u8; 32]>,
}

/// What one check of the file found.
#[derive(Debug)]
pub enum FileCheck {
    /// Same content as last time (or no file).
    Unchanged,
    /// New content, applied (or already running).
    Applied(ConfigAck),
    /// New content, refused.
    Refused(ApplyError),
    /// The file could not be read.
    Unreadable(std::io::Error),
}

impl<T: Apply> FileWatcher<T> {
    /// A watcher of `path` applying to `state`.
    pub fn new(state: T, path: impl Into<PathBuf>) -> Self {
        FileWatcher {
            state,
            path: path.into(),
            last_digest: None,
        }
    }

    /// The watched path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file once and applies it if its content changed.
    pub async fn check(&mut self) -> FileCheck {
        let bytes = match tokio::fs::read(&self.path).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return FileCheck::Unchanged,
            Err(e) => return FileCheck::Unreadable(e),
        };
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if self.last_digest == Some(digest) {
            return FileCheck::Unchanged;
        }
        self.last_digest = Some(digest);
        match self.state.apply_bytes(&bytes, Origin::File) {
            Ok(ack) => FileCheck::Applied(ack),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, kind = self.state.kind(), "document file refused; keeping the running one");
                FileCheck::Refused(e)
            }
        }
    }

    /// Checks the file every `interval` until `shutdown` resolves.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut unreadable_reported = false;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.check().await {
                FileCheck::Unreadable(e) if !unreadable_reported => {
                    unreadable_reported = true;
                    tracing::warn!(path = %self.path.display(), error = %e, kind = self.state.kind(), "cannot read the document file");
                }
                FileCheck::Unreadable(_) => {}
                _ => unreadable_reported = false,
            }
        }
    }
}

/// The helpers (a fake verifier, in-process requests) are shared with the producer gate's tests.
#[cfg(test)]
pub(crate) mod tests;
