//! Backpressure controllers: they turn message outcomes into a backoff factor and a number of
//! permits.
//!
//! A [`Controller`] is plain, synchronous, deterministic state. It never reads a clock: every
//! call takes the current time as a [`Nanos`] (a monotonic timestamp since an epoch the caller
//! picks), and the only randomness (probe jitter) comes from a generator seeded at construction.
//! The simulator drives controllers directly; a worker process shares one behind the
//! [`crate::permits::Gate`].
//!
//! Controllers (chosen by [`Algorithm`] in the [`WorkerConfig`]):
//!
//! - [`SetPoint`] (default): the set-point integrator with probing and slow start, starting up
//!   in [`Mode::Starting`] (see [`Settings::initial_permits`]);
//! - [`RatioThrottle`]: Google SRE client-side throttling with `K = 1/(1 - s)`, windowed;
//! - [`Fixed`]: always `maxPermits`, honouring the operator's brake;
//! - [`Off`]: always `maxPermits`, brake ignored.
//!
//! ```
//! use backpressure_api::wire::WorkerConfig;
//! use backpressure_worker::controller::{self, Nanos, Outcome};
//!
//! let mut c = controller::from_config(&WorkerConfig::default(), 7);
//! let now = Nanos::from_secs(1);
//! assert_eq!(c.permits(now, 0), 2); // a fresh controller ramps up from 2 (the startup ramp)
//! for _ in 0..40 {
//!     c.record(now, Outcome::DependencyFailure);
//! }
//! assert_eq!(c.backoff(now), 1.0);
//! assert_eq!(c.permits(now, 0), 0); // fully backed off: only a timed probe gets through
//! ```

mod fixed;
mod probe;
mod ratio;
mod set_point;

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

use backpressure_api::defaults as d;
pub use backpressure_api::v1alpha1::Algorithm;
use backpressure_api::wire::{BrakeConfig, WorkerConfig};

pub use fixed::{Fixed, Off};
pub use ratio::RatioThrottle;
pub use set_point::SetPoint;

/// A monotonic timestamp in nanoseconds since an epoch chosen by the caller (the process start
/// for a worker, zero for a simulation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Nanos {
    /// The epoch.
    pub const ZERO: Nanos = Nanos(0);

    /// `s` seconds after the epoch (or a span of `s` seconds).
    pub const fn from_secs(s: u64) -> Self {
        Nanos(s.saturating_mul(1_000_000_000))
    }

    /// `ms` milliseconds after the epoch (or a span).
    pub const fn from_millis(ms: u64) -> Self {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// A [`Duration`] as nanoseconds, saturating at `u64::MAX`.
    pub fn from_duration(d: Duration) -> Self {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The raw nanosecond count.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// As a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub const fn saturating_sub(self, earlier: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }
}

impl Add<Duration> for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Duration) -> Nanos {
        self + Nanos::from_duration(rhs)
    }
}

impl Sub for Nanos {
    type Output = Nanos;
    /// Saturating: never underflows.
    fn sub(self, rhs: Nanos) -> Nanos {
        self.saturating_sub(rhs)
    }
}

/// The outcome of processing one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Processed successfully.
    Success,
    /// Failed because of a dependency or overload (timeouts, 429/503, throttling, connection
    /// errors). The only outcome that drives backoff up.
    DependencyFailure,
    /// Failed because of the message itself (validation, poison message, a 4xx). Never drives
    /// backoff: the dependency answered.
    MessageFailure,
}

impl Outcome {
    /// All outcomes, in the order of [`backpressure_api::wire::metrics::CLASSES`].
    pub const ALL: [Outcome; 3] = [
        Outcome::Success,
        Outcome::DependencyFailure,
        Outcome::MessageFailure,
    ];

    /// The `class` label value of the wire contract.
    pub const fn class(self) -> &'static str {
        use backpressure_api::wire::metrics as m;
        match self {
            Outcome::Success => m::CLASS_SUCCESS,
            Outcome::DependencyFailure => m::CLASS_DEPENDENCY_FAILURE,
            Outcome::MessageFailure => m::CLASS_MESSAGE_FAILURE,
        }
    }

    /// Index into [`Outcome::ALL`].
    pub const fn index(self) -> usize {
        match self {
            Outcome::Success => 0,
            Outcome::DependencyFailure => 1,
            Outcome::MessageFailure => 2,
        }
    }
}

/// What a controller is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Permits follow the backoff factor.
    Normal,
    /// Fully backed off: one probe at a time on a growing, jittered interval.
    Probing,
    /// A probe succeeded: permits grow by one per success up to the slow-start threshold.
    SlowStart,
    /// A freshly built controller ramps its permits up from [`Settings::initial_permits`]
    /// instead of starting at `maxPermits` (see [`SetPoint`]). Not a backoff: the backoff
    /// factor stays 0 unless the integrator itself rises.
    Starting,
}

impl Mode {
    /// A stable lower-case name (logs, metrics).
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Probing => "probing",
            Mode::SlowStart => "slow_start",
            Mode::Starting => "starting",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operator's emergency brake in controller time: a minimum backoff, optionally until a
/// moment, and how it lifts.
///
/// # Lifting gently
///
/// A brake that ends (its expiry passes, or a push lowers or removes it) does not return the
/// worker to full permits in one step: every pod of the fleet would do so in the same second, the
/// thundering herd that turns a recovering dependency over again. Instead the brake's level
/// falls linearly to the new one, by 1 per [`Settings::brake_release`] (a full brake lifts in
/// `brake_release`, one of 0.5 in half of it), and each pod starts its fall after its own
/// random offset, uniform in `[0, brake_release / 2)` (drawn once per [`crate::permits::Gate`]).
/// Permits follow the level (`floor(maxPermits · (1 − level))`), so a fleet comes back as a
/// ramp spread over up to `1.5 × brake_release` rather than a step; the controller's own
/// backoff still applies on top (a dependency that fails again during the ramp is backed off
/// from as usual). `brake_release` 0 lifts in one step.
///
/// A full brake (`min_backoff` 1) stops everything, probes included: no permit and no probe
/// until it lifts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Brake {
    /// Minimum backoff in `[0, 1]`.
    pub min_backoff: f64,
    /// The brake lifts itself at this time, if set.
    pub until: Option<Nanos>,
    /// How long a full brake takes to lift ([`Settings::brake_release`]); 0 lifts at once.
    pub release: Nanos,
    /// This pod's delay before its level starts to fall.
    pub offset: Nanos,
    /// An earlier, higher level still falling: `(level, from when it falls)`.
    pub lift: Option<(f64, Nanos)>,
}

impl Brake {
    /// Converts the wire brake (whose expiry is Unix seconds) to controller time, given the
    /// current time in both clocks. An expiry already in the past gives a brake that is inactive.
    /// It lifts at once (see [`Brake::succeed`] for a gentle lift).
    pub fn from_wire(brake: &BrakeConfig, now: Nanos, now_unix: i64) -> Brake {
        let until = brake.expires_at_unix.map(|t| {
            let ahead = t.saturating_sub(now_unix);
            if ahead <= 0 {
                now
            } else {
                now + Nanos::from_secs(ahead.unsigned_abs())
            }
        });
        Brake {
            min_backoff: clamp01(brake.min_backoff),
            until,
            ..Brake::default()
        }
    }

    /// The brake that follows `old` when `new` is pushed (`None`: removed) at `now`, lifting
    /// gently over `release` with this pod's `offset` (see [Lifting gently](Brake#lifting-gently)):
    /// if the new level is below the old one, the old level falls to it from `now + offset`; a
    /// fall already under way goes on. `None` when nothing is left to apply.
    pub fn succeed(
        old: Option<&Brake>,
        new: Option<Brake>,
        now: Nanos,
        release: Nanos,
        offset: Nanos,
    ) -> Option<Brake> {
        let mut next = new.unwrap_or_default();
        next.release = release;
        next.offset = offset;
        next.lift = None;
        let new_level = next.steady(now).unwrap_or(0.0);
        if let Some(old) = old {
            let old_level = old.active(now).unwrap_or(0.0);
            if old_level > new_level {
                next.lift = if old.steady(now).unwrap_or(0.0) > new_level {
                    // The old brake itself was in force and now drops.
                    Some((old_level, now + offset))
                } else {
                    // A fall under way (an earlier drop, or the old expiry): it goes on.
                    [old.lift, old.expiry_fall()]
                        .into_iter()
                        .flatten()
                        .max_by(|a, b| old.fall(*a, now).total_cmp(&old.fall(*b, now)))
                };
            }
        }
        let empty = next.min_backoff <= 0.0 && next.until.is_none() && next.lift.is_none();
        (!empty).then_some(next)
    }

    /// The level of the brake itself (without any fall): `min_backoff` until it expires.
    fn steady(&self, now: Nanos) -> Option<f64> {
        match self.until {
            Some(t) if now >= t => None,
            _ => Some(clamp01(self.min_backoff)),
        }
    }

    /// The expired brake's own fall, once its expiry has passed.
    fn expiry_fall(&self) -> Option<(f64, Nanos)> {
        self.until
            .map(|t| (clamp01(self.min_backoff), t + self.offset))
    }

    /// The level of a fall `(from, start)` at `now`.
    fn fall(&self, (from, start): (f64, Nanos), now: Nanos) -> f64 {
        if now < start {
            return from;
        }
        if self.release.0 == 0 {
            return 0.0;
        }
        from - now.saturating_sub(start).as_secs_f64() / self.release.as_secs_f64()
    }

    /// The minimum backoff in force at `now`, if any: the brake's level, or the level of a
    /// brake still lifting.
    pub fn active(&self, now: Nanos) -> Option<f64> {
        let steady = self.steady(now);
        let expired = self
            .until
            .filter(|t| now >= *t)
            .and_then(|_| self.expiry_fall())
            .map(|f| self.fall(f, now));
        let lift = self.lift.map(|f| self.fall(f, now));
        let level = [steady, expired, lift]
            .into_iter()
            .flatten()
            .reduce(f64::max)?;
        (level > 0.0).then(|| clamp01(level))
    }

    /// The next time after `now` at which the permits cap may rise without a new outcome: the
    /// expiry, the start of a fall, or (while falling) when the level has fallen by one permit
    /// of `max_permits`.
    pub fn next_change(&self, now: Nanos, max_permits: u32) -> Option<Nanos> {
        let mut next = self.until.filter(|t| *t > now);
        let falls = [self.lift, self.until.and_then(|_| self.expiry_fall())];
        for (from, start) in falls.into_iter().flatten() {
            if start > now {
                next = earliest(next, Some(start));
            } else if self.fall((from, start), now) > 0.0 && self.release.0 > 0 {
                let step = self.release.0 / u64::from(max_permits.max(1));
                next = earliest(next, Some(now + Nanos(step.max(1_000_000))));
            }
        }
        next
    }
}

/// Knobs of every controller: the [`WorkerConfig`] fields plus library-side settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Which controller.
    pub algorithm: Algorithm,
    /// Set point `s` in (0,1): the dependency-failure fraction treated as background noise.
    pub set_point: f64,
    /// Reaction size `N`: dependency failures that take the backoff from 0 to 1.
    pub reaction: u32,
    /// Maximum permits (concurrency) at zero backoff.
    pub max_permits: u32,
    /// First probe interval once fully backed off.
    pub probe_initial: Nanos,
    /// The probe interval doubles after each failed probe up to this.
    pub probe_max: Nanos,
    /// [`SetPoint`] only: headroom below zero backoff, in units of one reaction (`credit * N`
    /// net dependency failures are absorbed after a healthy period before permits drop). It
    /// keeps the backoff at exactly 0 while the failure fraction stays clearly under the set
    /// point (the threshold of gRPC's retry-throttling token bucket plays the same role).
    /// 0 gives the plain integrator.
    pub credit: f64,
    /// [`SetPoint`] and [`RatioThrottle`]: replace message probes with a health check (see
    /// [`Controller::health_check_due`]); needed for FIFO queues, where a probe would hit the
    /// same head message again and again.
    pub health_check_probes: bool,
    /// [`RatioThrottle`] only: length of the sliding window.
    pub ratio_window: Nanos,
    /// [`SetPoint`] only: the permits of a freshly built controller. It starts in
    /// [`Mode::Starting`] with this many permits and ramps up to `max_permits` over about 16
    /// round trips (slower, or down, while dependency failures exceed the set point; see
    /// [`SetPoint#starting-up`]), so that pods started
    /// together (a scale-out, a rollout) do not all open `max_permits` calls at once against a
    /// dependency that may just be recovering. 0, or at least `max_permits`, starts at
    /// `max_permits`; the default, [`DEFAULT_INITIAL_PERMITS`] (2), is what the simulator
    /// measured.
    ///
    /// ```
    /// use backpressure_worker::controller::{self, Mode, Nanos, Outcome, Settings};
    ///
    /// let mut c = controller::build(Settings { initial_permits: 2, ..Settings::default() }, 7);
    /// let now = Nanos::from_secs(1);
    /// assert_eq!((c.mode(), c.permits(now, 0), c.backoff(now)), (Mode::Starting, 2, 0.0));
    /// for _ in 0..3 {
    ///     c.record(now, Outcome::Success); // about a round trip: one more permit
    /// }
    /// assert_eq!(c.permits(now, 0), 3);
    /// while c.mode() == Mode::Starting {
    ///     c.record(now, Outcome::Success);
    /// }
    /// assert_eq!((c.mode(), c.permits(now, 0), c.backoff(now)), (Mode::Normal, 16, 0.0));
    /// ```
    pub initial_permits: u32,
    /// How long a full brake takes to lift when it expires or is lowered or removed (see
    /// [Lifting gently](Brake#lifting-gently)); each pod starts after its own random offset in
    /// `[0, brake_release / 2)`. 0 lifts in one step.
    pub brake_release: Nanos,
    /// [`SetPoint`] only: the highest failure floor the controller may learn (see
    /// [`SetPoint#failures-that-do-not-come-from-load-the-failure-floor`]): failures at minimal
    /// concurrency above this are treated as an outage and backed off from as usual. 0 turns the
    /// floor off (the plain set-point integrator).
    pub floor_max: f64,
    /// The redelivery backoff `(base, max)` of [`crate::worker_loop::WorkerLoop`]: a message
    /// whose `k`-th delivery failed is visible again `base · 2^(k-1)` (at most `max`) later
    /// (see [`crate::worker_loop::RedeliveryBackoff`]). `None` (or `base` 0 on the wire) nacks
    /// plainly: the queue's visibility timeout decides. Not used by the controllers themselves;
    /// carried here so that the operator's payload reaches the loop.
    pub redelivery: Option<(Nanos, Nanos)>,
}

#[cfg(test)]
impl Settings {
    /// The defaults without the startup ramp (`initial_permits` 0): a controller at full
    /// permits from its first outcome, for the tests that are not about starting up.
    pub(crate) fn steady() -> Self {
        Settings {
            initial_permits: 0,
            ..Settings::default()
        }
    }
}

/// Default [`Settings::brake_release`]: a full brake lifts over a minute (and the fleet over
/// up to 90 s, with the per-pod offsets).
pub const DEFAULT_BRAKE_RELEASE: Nanos = Nanos::from_secs(d::BRAKE_RELEASE.as_secs());
/// Default [`Settings::floor_max`]: at a 25 % failure rate one message in 1000 fails all of 5
/// deliveries, whatever the concurrency.
pub const DEFAULT_FLOOR_MAX: f64 = d::FLOOR_MAX;
/// Default [`Settings::credit`].
pub const DEFAULT_CREDIT: f64 = 1.0;
/// Default [`Settings::ratio_window`] (grpc-go's adaptive throttler uses 30 s).
pub const DEFAULT_RATIO_WINDOW: Nanos = Nanos::from_secs(d::RATIO_WINDOW.as_secs());
/// Default [`Settings::initial_permits`]: 2, like the slow start after a successful probe. What
/// the simulator's workers use, so the defaults are what `docs/sim/report.md` measures.
pub const DEFAULT_INITIAL_PERMITS: u32 = d::INITIAL_PERMITS;
/// The [`Settings::initial_permits`] the simulator measured (the default).
pub const RECOMMENDED_INITIAL_PERMITS: u32 = DEFAULT_INITIAL_PERMITS;
/// Default [`Settings::redelivery`]: 1 min after the first failed delivery, doubling up to
/// 8 min (1, 2, 4, 8 min for `maxReceives` 5), what the simulator's workers use.
pub const DEFAULT_REDELIVERY: Option<(Nanos, Nanos)> = Some((
    Nanos::from_secs(d::REDELIVERY_BASE.as_secs()),
    Nanos::from_secs(d::REDELIVERY_MAX.as_secs()),
));

impl Settings {
    /// The settings of a (validated) wire configuration, with library defaults for the rest.
    /// Out-of-range values are clamped to the nearest valid one.
    pub fn from_config(cfg: &WorkerConfig) -> Self {
        let ms = Nanos::from_millis;
        Settings {
            algorithm: cfg.algorithm,
            set_point: cfg.set_point,
            reaction: cfg.reaction,
            max_permits: cfg.max_permits,
            probe_initial: ms(cfg.probe_initial_ms),
            probe_max: ms(cfg.probe_max_ms),
            credit: DEFAULT_CREDIT,
            health_check_probes: false,
            ratio_window: cfg.ratio_window_ms.map_or(DEFAULT_RATIO_WINDOW, ms),
            initial_permits: cfg.initial_permits.unwrap_or(DEFAULT_INITIAL_PERMITS),
            brake_release: cfg.brake_release_ms.map_or(DEFAULT_BRAKE_RELEASE, ms),
            floor_max: cfg.floor_max.unwrap_or(DEFAULT_FLOOR_MAX),
            redelivery: match &cfg.redelivery {
                None => DEFAULT_REDELIVERY,
                Some(r) if r.base_ms == 0 => None,
                Some(r) => Some((ms(r.base_ms), ms(r.max_ms))),
            },
        }
        .sanitized()
    }

    /// Clamps every field into its valid range (so a controller never divides by zero).
    pub fn sanitized(mut self) -> Self {
        if !(self.set_point.is_finite() && self.set_point > 0.0 && self.set_point < 1.0) {
            self.set_point = if self.set_point >= 1.0 { 0.99 } else { 0.0001 };
        }
        self.set_point = self.set_point.clamp(0.0001, 0.99);
        self.reaction = self.reaction.max(1);
        self.max_permits = self.max_permits.max(1);
        self.probe_initial = Nanos(self.probe_initial.0.max(1));
        self.probe_max = Nanos(self.probe_max.0.max(self.probe_initial.0));
        if !(self.credit.is_finite() && self.credit >= 0.0) {
            self.credit = 0.0;
        }
        self.ratio_window = Nanos(self.ratio_window.0.max(1_000_000));
        self.floor_max = if self.floor_max.is_finite() {
            self.floor_max.clamp(0.0, d::MAX_FLOOR_MAX)
        } else {
            0.0
        };
        self.redelivery = self
            .redelivery
            .filter(|(base, _)| base.0 > 0)
            .map(|(base, max)| (base, Nanos(max.0.max(base.0))));
        self
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_config(&WorkerConfig::default())
    }
}

/// A backpressure controller. Object safe and `Send`; see the module docs.
///
/// The calling protocol of a worker:
/// 1. before each poll, `permits(now, in_flight)` where `in_flight` counts messages being
///    processed *and* permits handed out for polls that have not returned yet;
/// 2. after a poll, `release_unused(now, k)` for the `k` permits the poll did not use (an empty
///    poll is not a probe result);
/// 3. after each processed message, `record(now, outcome)`.
pub trait Controller: Send + fmt::Debug {
    /// The algorithm implemented.
    fn algorithm(&self) -> Algorithm;

    /// The settings in force.
    fn settings(&self) -> &Settings;

    /// Records the outcome of one processed message.
    fn record(&mut self, now: Nanos, outcome: Outcome);

    /// How many more messages may be taken now, given `in_flight` messages being processed or
    /// polled for.
    fn permits(&mut self, now: Nanos, in_flight: u32) -> u32;

    /// Returns `unused` permits of the last grant that no message came back for.
    fn release_unused(&mut self, now: Nanos, unused: u32) {
        let _ = (now, unused);
    }

    /// Total concurrency allowed now (the permits gauge); 0 when fully backed off.
    fn limit(&self, now: Nanos) -> u32;

    /// The backoff factor in `[0, 1]` (including an active brake).
    fn backoff(&self, now: Nanos) -> f64;

    /// The current mode.
    fn mode(&self) -> Mode;

    /// The dependency-failure fraction this controller has found not to respond to its
    /// concurrency and does not throttle for (the `backpressure_failure_floor` gauge); 0 when
    /// its failures respond to load, or for controllers that do not learn one.
    fn failure_floor(&self) -> f64 {
        0.0
    }

    /// What this controller knows about its failure floor (the `backpressure_failure_floor`
    /// gauge; NaN when `None`): the floor in force, `Some(0.0)` once its experiments showed the
    /// failures respond to load (or are an outage's), `None` while it has not tested it (no
    /// full backoff yet, or too few outcomes at minimal concurrency to tell). A fleet averages
    /// only what its pods know: a pod that just started has no evidence either way, and must
    /// not pull the fleet's floor down to 0 while it learns.
    fn floor_estimate(&self) -> Option<f64> {
        None
    }

    /// Applies new settings of the same algorithm, keeping the backoff state.
    fn reconfigure(&mut self, now: Nanos, settings: Settings);

    /// Sets or clears the operator's brake.
    fn set_brake(&mut self, brake: Option<Brake>);

    /// The earliest future time at which [`Controller::permits`] may grant more without a new
    /// outcome (a probe coming due, a brake expiring or lifting), if any. A waiting worker sleeps until then.
    fn next_change(&self, now: Nanos) -> Option<Nanos>;

    /// With [`Settings::health_check_probes`]: whether a health check should run now instead of
    /// a message probe. Returning true schedules the next one; report the result with
    /// [`Controller::record_health_check`].
    fn health_check_due(&mut self, now: Nanos) -> bool {
        let _ = now;
        false
    }

    /// Starts from a backoff carried over from a previous controller (when the algorithm
    /// changes at runtime). Controllers that derive their backoff from a window ignore it.
    fn start_from(&mut self, now: Nanos, backoff: f64) {
        let _ = (now, backoff);
    }

    /// Reports the result of a health check started after [`Controller::health_check_due`].
    fn record_health_check(&mut self, now: Nanos, healthy: bool) {
        let _ = (now, healthy);
    }
}

/// Builds the controller named by `settings.algorithm`. `seed` seeds the probe jitter.
pub fn build(settings: Settings, seed: u64) -> Box<dyn Controller> {
    let settings = settings.sanitized();
    match settings.algorithm {
        Algorithm::SetPoint => Box::new(SetPoint::new(settings, seed)),
        Algorithm::RatioThrottle => Box::new(RatioThrottle::new(settings, seed)),
        Algorithm::Fixed => Box::new(Fixed::new(settings)),
        Algorithm::Off => Box::new(Off::new(settings)),
    }
}

/// Builds the controller of a wire configuration (without its brake; see [`Brake::from_wire`]).
pub fn from_config(cfg: &WorkerConfig, seed: u64) -> Box<dyn Controller> {
    build(Settings::from_config(cfg), seed)
}

/// Applies `settings` to `controller`: reconfigures in place when the algorithm is unchanged,
/// otherwise replaces it with a new controller that starts from the old controller's own
/// backoff (without the brake) where the new algorithm can carry it. `brake` is set on the
/// result.
pub fn apply_settings(
    controller: &mut Box<dyn Controller>,
    now: Nanos,
    settings: Settings,
    seed: u64,
    brake: Option<Brake>,
) {
    let settings = settings.sanitized();
    if controller.algorithm() == settings.algorithm {
        controller.reconfigure(now, settings);
    } else {
        // The old controller's own backoff, without the brake: the new one gets the brake
        // below, and a brake's level carried into its integrator would outlive the brake.
        controller.set_brake(None);
        let previous = controller.backoff(now);
        let mut next = build(settings, seed);
        next.start_from(now, previous);
        *controller = next;
    }
    controller.set_brake(brake);
}

/// Clamps to `[0, 1]`, mapping NaN to 1 (fail safe: a broken computation backs off).
pub(crate) fn clamp01(x: f64) -> f64 {
    if x.is_nan() { 1.0 } else { x.clamp(0.0, 1.0) }
}

/// Permits for a backoff: `floor(max * (1 - b))`, with a small tolerance so that `b = 1 - k/max`
/// gives exactly `k`.
pub(crate) fn limit_for(max_permits: u32, backoff: f64) -> u32 {
    let raw = f64::from(max_permits) * (1.0 - clamp01(backoff)) + 1e-9;
    (raw.floor() as u32).min(max_permits)
}

/// The permits cap of an active brake (`max_permits` without one).
pub(crate) fn brake_cap(brake: Option<&Brake>, max_permits: u32, now: Nanos) -> u32 {
    match brake.and_then(|b| b.active(now)) {
        Some(min) => limit_for(max_permits, min),
        None => max_permits,
    }
}

/// The earliest of two optional times.
pub(crate) fn earliest(a: Option<Nanos>, b: Option<Nanos>) -> Option<Nanos> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// SplitMix64: a tiny, seedable, allocation-free generator for probe jitter (the one the
/// controllers' probe schedule draws from; `docs/wire-contract/controller.md` specifies it for
/// other implementations). Public so that the golden-vector generator
/// (`backpressure-conformance`) can draw its outcome sequences from the same generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose state is `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits: the state grows by `0x9E3779B97F4A7C15` (wrapping) and is
    /// mixed by the SplitMix64 finalizer.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0,1): the top 53 bits of [`SplitMix64::next_u64`] divided by 2^53.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests;
