//! The set-point integrator with probing and slow start (the default controller).

use backpressure_api::v1alpha1::Algorithm;

use super::probe::ProbeSchedule;
use super::{
    Brake, Controller, Mode, Nanos, Outcome, Settings, brake_cap, clamp01, earliest, limit_for,
};

/// A healthy startup ramp takes about this many round trips (see [`SetPoint#starting-up`]).
const STARTUP_ROUND_TRIPS: f64 = 16.0;

/// How fast the remembered peak of permits decays: one permit per this many nanoseconds.
const PEAK_DECAY_PER_PERMIT: f64 = 3e9;

/// Time constant (ns) of the experiment counts: outcomes older than this weigh `1/e`.
const EXPERIMENT_TAU: f64 = 600e9;
/// Experiments needed before their failure fraction is trusted at all.
const MIN_EXPERIMENTS: f64 = 30.0;
/// Confidence of the test "failures at minimal concurrency exceed the set point": the lower
/// bound `f - Z·sqrt(f(1-f)/n)` must be above the set point.
const Z: f64 = 2.0;
/// Outcomes in the moving average of the failure fraction the floor follows down.
const FLOOR_WINDOW: f64 = 1000.0;
/// A floor is adopted only above this multiple of the set point (and kept down to the set point).
const ADOPT: f64 = 1.5;

/// The set-point integrator (the reasoning: `docs/algorithms.md` §2).
///
/// State: an integrator `x` in `[-credit, 1]`; the backoff factor is `max(0, x)`.
///
/// - a dependency failure moves `x` up by `1/N`, a success down by `s/((1-s)N)`, a message
///   failure not at all. The expected drift per outcome is `(f - s)/((1-s)N)` for a dependency
///   failure fraction `f`, so the only equilibrium between the clamps is `f = s`: under a load
///   dependent overload the long-run failure fraction of attempts converges to the set point;
/// - permits are `floor(maxPermits * (1 - backoff))`;
/// - when that reaches 0 the controller is fully backed off ([`Mode::Probing`]): it grants one
///   message at a time, only with nothing in flight, on an interval that starts at
///   `probe_initial`, doubles after each failed probe up to `probe_max`, and is jittered by
///   `U[0.5, 1)`. An empty poll is not a probe result: the grant is simply available again;
/// - a successful probe sets permits to 2 and enters [`Mode::SlowStart`]: +1 permit per success
///   until `ssthresh = max(2, peak/2)` (the peak of permits before the backoff, decaying one
///   permit per 3 s), or until the first dependency failure; then [`Mode::Normal`].
///
/// The credit below zero ([`Settings::credit`]) absorbs isolated failures after a healthy period
/// so that a failure fraction clearly under the set point never reduces permits.
///
/// # Starting up
///
/// A fresh controller (with `0 < initial_permits < maxPermits`) starts in [`Mode::Starting`]:
/// its permits are capped by a startup window `w` that begins at `initial_permits` and moves by
/// `g/w` per outcome, `+1` for a success and `-(1 - s)/s` for a dependency failure, never below
/// 1, with `g = maxPermits/16`. Since a round trip completes about `w` outcomes, a healthy
/// dependency adds `g` permits per round trip (a linear ramp over about 16 round trips,
/// whatever `maxPermits`), and the window grows exactly when the failure fraction is below the
/// set point and shrinks when it is above: the set-point integrator again, in permits. Startup
/// ends, in [`Mode::Normal`], once the window reaches the integrator's own limit (`maxPermits`
/// while the backoff is 0), or in [`Mode::Probing`] if the integrator backs off fully. The
/// integrator runs as usual meanwhile (with the full credit of a fresh worker), so the backoff
/// factor stays 0 during a healthy startup: starting is not backing off.
///
/// Why linear and not TCP's doubling per round trip: the failures of an overloaded dependency
/// are seen a round trip (or a rate limiter's burst) late; pods started together (a scale-out
/// after an outage) that double their windows each round trip reach `maxPermits` before the
/// first failure comes back. Cost: a healthy pod reaches full permits about 16 round trips after
/// its start.
///
/// # Failures that do not come from load: the failure floor
///
/// Backing off only helps when failures fall as load falls. A dependency that fails a fixed
/// share `f0` of calls whatever the load (a bad shard, a broken flag, one failing region) drives
/// the plain integrator to full backoff for as long as `f0 > s`, and the fleet then serves a
/// fraction of what the dependency could. The controller tells the two apart with the natural
/// experiment it already runs: after a full backoff, its probes and its slow start call the
/// dependency at the lowest concurrency this worker can offer (one message, then 2, 3, ...).
/// Those *experiment* outcomes (in [`Mode::Probing`] and [`Mode::SlowStart`], and in
/// [`Mode::Starting`] while the startup window is at most `max(2, maxPermits/4)`: a fresh pod
/// runs the same experiment in its startup ramp, so pods added to a fleet that has learned a
/// floor learn it too before they throttle) are counted with a time decay of 10 minutes (`n`,
/// and `k` failures among them, `f_exp = k/n`).
///
/// - **Overload** (failures respond to load): at minimal load the failures fall, `f_exp ≤ s`
///   (that is why backing off worked), and nothing changes.
/// - **Load-independent failure**: `f_exp` stays where it was at full concurrency. When the
///   test `f_exp - 2·sqrt(f_exp(1 - f_exp)/n) > s` passes with `n ≥ 30` (failures at minimal
///   concurrency are significantly above the set point) and `f_exp ≤ floorMax`, the worker
///   adopts a *failure floor* `f0 = min(f_exp, f_avg, floorMax)`, where `f_avg` is a moving
///   average of the failure fraction over the last ~1000 outcomes at any concurrency (it lets
///   the floor follow the dependency down as it heals).
/// - **Outage or flapping** (failures correlated in time): probes fail while the dependency is
///   down, so `f_exp` is high (above `floorMax`, 25 % by default), or low when the probes land in
///   the healthy periods; either way no floor, and backing off keeps its value: it moves
///   attempts out of the bad periods.
///
/// With a floor, the set point applies to the failures *on top of* the floor. If a fraction
/// `f0` of calls fails whatever the load and load adds overload failures at rate `g` among the
/// rest, a call fails with probability `f = f0 + (1 - f0)·g`; keeping `g ≤ s` means
/// `f ≤ s_eff = f0 + s·(1 - f0)`, and the integrator runs with `s_eff` in place of `s`
/// (steps `1/N` up and `s_eff/((1 - s_eff)N)` down, equilibrium `f = s_eff`). So the guarantee
/// of the set point is kept for the part of the failures that load causes, and the worker does
/// not throttle for the part it cannot change. The floor ends (back to `s`) when `f_avg` falls to
/// the set point.
///
/// Why only experiment outcomes: a worker's own concurrency hardly moves a dependency it
/// shares with a fleet, so comparing its failures at its own high and low permits in normal
/// operation would see a shared overload as load-independent. Probing and slow start happen
/// after a *full* backoff, which a fleet in a shared overload reaches together (they all see
/// the same failures), so the experiment measures the dependency at the fleet's minimal load.
/// A fleet held at an overload equilibrium never reaches full backoff and gathers no
/// experiments, so a floor cannot ratchet itself up there. The cost of the test: about `n = 30`
/// to a few hundred outcomes at minimal concurrency (a few minutes), during which the worker
/// throttles as before. Why `floorMax`: above it a failure is more likely an outage whose end is
/// worth waiting for (and the DLQ share of a message that fails at rate `f` on each of 5
/// deliveries, `f^5`, is 1 in 1000 at 25 %).
#[derive(Clone, Debug)]
pub struct SetPoint {
    settings: Settings,
    /// Integrator state in `[-credit, 1]`.
    x: f64,
    /// Step up per dependency failure: 1/N.
    up: f64,
    /// Step down per success: s/((1-s)N).
    down: f64,
    mode: Mode,
    probe: ProbeSchedule,
    /// A message probe was granted and no result or release has come back yet.
    probe_armed: bool,
    ssthresh: u32,
    peak: f64,
    peak_at: Option<Nanos>,
    brake: Option<Brake>,
    /// The startup window (in [`Mode::Starting`] only).
    window: f64,
    /// Time-decayed count of experiment outcomes (probing, slow start).
    exp_n: f64,
    /// Time-decayed count of experiment dependency failures.
    exp_fail: f64,
    /// When the experiment counts were last decayed.
    exp_at: Option<Nanos>,
    /// Moving average of the dependency-failure fraction over all outcomes.
    f_avg: f64,
    /// The failure floor in force (0: none); see [`SetPoint#failures-that-do-not-come-from-load-the-failure-floor`].
    floor: f64,
}

impl SetPoint {
    /// A controller at zero backoff, starting up (see [`SetPoint#starting-up`]). `seed` seeds
    /// the probe jitter.
    pub fn new(settings: Settings, seed: u64) -> Self {
        let settings = settings.sanitized();
        let probe = ProbeSchedule::new(settings.probe_initial, settings.probe_max, seed);
        let mut c = SetPoint {
            // Start with the full credit: a fresh worker is assumed healthy.
            x: -settings.credit,
            up: 0.0,
            down: 0.0,
            mode: Mode::Normal,
            probe,
            probe_armed: false,
            ssthresh: 2,
            peak: f64::from(settings.max_permits),
            peak_at: None,
            brake: None,
            window: 0.0,
            exp_n: 0.0,
            exp_fail: 0.0,
            exp_at: None,
            f_avg: 0.0,
            floor: 0.0,
            settings,
        };
        c.set_steps();
        let initial = c.settings.initial_permits;
        if initial > 0 && initial < c.settings.max_permits {
            c.mode = Mode::Starting;
            c.window = f64::from(initial);
        }
        c
    }

    /// The startup window's permits (`maxPermits` once started).
    pub fn startup_window(&self) -> u32 {
        if self.mode == Mode::Starting {
            (self.window.floor() as u32).clamp(1, self.settings.max_permits)
        } else {
            self.settings.max_permits
        }
    }

    #[cfg(test)]
    pub(crate) fn window_f64(&self) -> f64 {
        self.window
    }

    /// Permits before the brake: the integrator's limit, capped by the startup window.
    fn controlled_limit(&self) -> u32 {
        self.own_limit().min(self.startup_window())
    }

    /// One outcome while starting up (see [`SetPoint#starting-up`]).
    fn record_starting(&mut self, now: Nanos, outcome: Outcome) {
        let s = self.effective_set_point();
        let gain = f64::from(self.settings.max_permits) / STARTUP_ROUND_TRIPS / self.window;
        match outcome {
            Outcome::Success => self.window += gain,
            Outcome::DependencyFailure => {
                self.window = (self.window - gain * (1.0 - s) / s).max(1.0);
            }
            Outcome::MessageFailure => return,
        }
        self.integrate(outcome);
        if self.own_limit() == 0 {
            self.enter_probing(now);
        } else {
            self.finish_starting_if_done(now);
        }
    }

    /// Ends startup once the window no longer limits anything.
    fn finish_starting_if_done(&mut self, now: Nanos) {
        if self.mode == Mode::Starting && self.window >= f64::from(self.own_limit()) {
            self.mode = Mode::Normal;
            self.track_peak(now, self.own_limit());
        }
    }

    /// Sets the backoff factor directly (carrying state over from another controller, tests).
    pub fn set_backoff(&mut self, now: Nanos, backoff: f64) {
        self.x = clamp01(backoff);
        self.mode = Mode::Normal;
        self.settle(now);
    }

    /// The integrator state, which may be negative (credit).
    pub fn integrator(&self) -> f64 {
        self.x
    }

    /// The slow-start threshold set when full backoff was last entered.
    pub fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    /// The current probe interval (before jitter).
    pub fn probe_interval(&self) -> Nanos {
        self.probe.interval()
    }

    /// The learned failure floor `f0` (0 when failures respond to load or are below the set
    /// point).
    pub fn failure_floor(&self) -> f64 {
        self.floor
    }

    /// The set point the integrator runs with: `s_eff = f0 + s·(1 - f0)`.
    pub fn effective_set_point(&self) -> f64 {
        let s = self.settings.set_point;
        self.floor + s * (1.0 - self.floor)
    }

    /// Updates the experiment counts, the moving average and the floor with one outcome
    /// recorded in `mode` (before the outcome changes the mode).
    fn learn(&mut self, now: Nanos, mode: Mode, outcome: Outcome) {
        let failed = match outcome {
            Outcome::Success => 0.0,
            Outcome::DependencyFailure => 1.0,
            Outcome::MessageFailure => return,
        };
        self.f_avg += (failed - self.f_avg) / FLOOR_WINDOW;
        if let Some(at) = self.exp_at {
            let decay = (-(now.saturating_sub(at).0 as f64) / EXPERIMENT_TAU).exp();
            self.exp_n *= decay;
            self.exp_fail *= decay;
        }
        self.exp_at = Some(now);
        let starting_low = mode == Mode::Starting
            && self.window <= (f64::from(self.settings.max_permits) / 4.0).max(2.0);
        if matches!(mode, Mode::Probing | Mode::SlowStart) || starting_low {
            self.exp_n += 1.0;
            self.exp_fail += failed;
        }
        let s = self.settings.set_point;
        let max = self.settings.floor_max;
        let f_exp = if self.exp_n > 0.0 {
            self.exp_fail / self.exp_n
        } else {
            0.0
        };
        let significant = self.exp_n >= MIN_EXPERIMENTS
            && f_exp - Z * (f_exp * (1.0 - f_exp) / self.exp_n).sqrt() > s
            && f_exp <= max;
        let candidate = f_exp.min(self.f_avg).min(max);
        // Hysteresis: a floor is adopted only clearly above the set point (`ADOPT × s`), and
        // ends once the failures are back at the set point.
        let floor = if (self.floor > 0.0 && candidate > s) || (significant && candidate > ADOPT * s)
        {
            candidate
        } else {
            0.0
        };
        if floor != self.floor {
            self.floor = floor;
            self.set_steps();
        }
    }

    fn set_steps(&mut self) {
        let s = self.effective_set_point();
        let n = f64::from(self.settings.reaction);
        self.up = 1.0 / n;
        self.down = s / ((1.0 - s) * n);
    }

    fn own_limit(&self) -> u32 {
        limit_for(self.settings.max_permits, self.x)
    }

    fn integrate(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Success => {
                self.x = snap((self.x - self.down).max(-self.settings.credit));
            }
            Outcome::DependencyFailure => self.x = snap((self.x + self.up).min(1.0)),
            Outcome::MessageFailure => {}
        }
    }

    /// Enters or leaves full backoff according to the integrator.
    fn settle(&mut self, now: Nanos) {
        let limit = self.own_limit();
        if limit == 0 {
            if self.mode != Mode::Probing {
                self.enter_probing(now);
            }
        } else if self.mode == Mode::Probing {
            self.mode = Mode::Normal;
            self.probe_armed = false;
        }
        if self.mode == Mode::Normal {
            self.track_peak(now, limit);
        }
    }

    fn enter_probing(&mut self, now: Nanos) {
        self.track_peak(now, 0);
        let half = (self.peak / 2.0).floor() as u32;
        self.ssthresh = half.clamp(2, self.settings.max_permits.max(2));
        self.mode = Mode::Probing;
        self.probe_armed = false;
        self.x = 1.0;
        self.probe.start(now);
    }

    fn track_peak(&mut self, now: Nanos, limit: u32) {
        let elapsed = self.peak_at.map_or(0.0, |t| now.saturating_sub(t).0 as f64);
        let decayed = self.peak - elapsed / PEAK_DECAY_PER_PERMIT;
        self.peak = decayed.max(f64::from(limit));
        self.peak_at = Some(now);
    }

    fn probe_succeeded(&mut self, now: Nanos) {
        let p = f64::from(self.settings.max_permits);
        self.x = self.x.min(1.0 - 2.0 / p).max(0.0);
        self.probe.reset(now);
        self.mode = Mode::SlowStart;
        self.leave_slow_start_if_done(now);
    }

    fn probe_failed(&mut self, now: Nanos) {
        self.x = 1.0;
        self.probe.failed(now);
    }

    fn leave_slow_start_if_done(&mut self, now: Nanos) {
        if self.own_limit() >= self.ssthresh.min(self.settings.max_permits) {
            self.mode = Mode::Normal;
            self.track_peak(now, self.own_limit());
        }
    }
}

impl Controller for SetPoint {
    fn algorithm(&self) -> Algorithm {
        Algorithm::SetPoint
    }

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn record(&mut self, now: Nanos, outcome: Outcome) {
        if self.settings.floor_max > 0.0 {
            self.learn(now, self.mode, outcome);
        }
        match self.mode {
            Mode::Probing if self.probe_armed => {
                self.probe_armed = false;
                match outcome {
                    Outcome::Success => self.probe_succeeded(now),
                    Outcome::DependencyFailure => self.probe_failed(now),
                    // The dependency was not exercised: another probe may go out now.
                    Outcome::MessageFailure => self.probe.allow_now(now),
                }
            }
            Mode::Starting => self.record_starting(now, outcome),
            Mode::SlowStart => match outcome {
                Outcome::Success => {
                    let p = f64::from(self.settings.max_permits);
                    self.x = (self.x - 1.0 / p).max(0.0);
                    self.leave_slow_start_if_done(now);
                }
                Outcome::DependencyFailure => {
                    self.mode = Mode::Normal;
                    self.integrate(outcome);
                    self.settle(now);
                }
                Outcome::MessageFailure => {}
            },
            // Normal, or a late outcome of a message taken before full backoff.
            _ => {
                self.integrate(outcome);
                self.settle(now);
            }
        }
    }

    fn permits(&mut self, now: Nanos, in_flight: u32) -> u32 {
        let cap = brake_cap(self.brake.as_ref(), self.settings.max_permits, now);
        match self.mode {
            Mode::Probing => {
                if cap == 0
                    || in_flight > 0
                    || self.settings.health_check_probes
                    || !self.probe.due(now)
                {
                    0
                } else {
                    // Stateless grant: if the poll comes back empty the grant is simply
                    // available again; `probe_armed` only tells the next outcome it is a probe.
                    self.probe_armed = true;
                    1
                }
            }
            _ => self.controlled_limit().min(cap).saturating_sub(in_flight),
        }
    }

    fn release_unused(&mut self, _now: Nanos, unused: u32) {
        if unused > 0 && self.mode == Mode::Probing {
            self.probe_armed = false;
        }
    }

    fn limit(&self, now: Nanos) -> u32 {
        let cap = brake_cap(self.brake.as_ref(), self.settings.max_permits, now);
        self.controlled_limit().min(cap)
    }

    fn backoff(&self, now: Nanos) -> f64 {
        let own = clamp01(self.x);
        match self.brake.as_ref().and_then(|b| b.active(now)) {
            Some(min) => own.max(min),
            None => own,
        }
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn failure_floor(&self) -> f64 {
        self.floor
    }

    fn floor_estimate(&self) -> Option<f64> {
        if self.floor > 0.0 {
            return Some(self.floor);
        }
        if self.settings.floor_max <= 0.0 || self.exp_n < MIN_EXPERIMENTS {
            return None;
        }
        // No floor, and the experiments say so conclusively: failures at minimal concurrency
        // are clearly under the adoption threshold (they respond to load), or above the
        // highest floor (an outage).
        let f = self.exp_fail / self.exp_n;
        let sigma = (f * (1.0 - f) / self.exp_n).sqrt();
        let under = f + Z * sigma <= ADOPT * self.settings.set_point;
        let outage = f - Z * sigma > self.settings.floor_max;
        (under || outage).then_some(0.0)
    }

    fn reconfigure(&mut self, now: Nanos, settings: Settings) {
        let settings = settings.sanitized();
        self.probe
            .set_bounds(settings.probe_initial, settings.probe_max);
        self.settings = settings;
        self.x = self.x.max(-self.settings.credit);
        self.floor = self.floor.min(self.settings.floor_max);
        if self.floor <= self.settings.set_point {
            self.floor = 0.0;
        }
        self.set_steps();
        self.peak = self.peak.min(f64::from(self.settings.max_permits));
        self.settle(now);
        self.finish_starting_if_done(now);
    }

    fn set_brake(&mut self, brake: Option<Brake>) {
        self.brake = brake;
    }

    fn next_change(&self, now: Nanos) -> Option<Nanos> {
        let probe =
            (self.mode == Mode::Probing && !self.probe.due(now)).then(|| self.probe.next_at());
        let brake = self
            .brake
            .as_ref()
            .and_then(|b| b.next_change(now, self.settings.max_permits));
        earliest(probe, brake)
    }

    fn health_check_due(&mut self, now: Nanos) -> bool {
        if self.settings.health_check_probes && self.mode == Mode::Probing && self.probe.due(now) {
            // Schedule the next check now, so a lost result can never stall probing.
            self.probe.hold(now);
            true
        } else {
            false
        }
    }

    fn start_from(&mut self, now: Nanos, backoff: f64) {
        self.set_backoff(now, backoff);
    }

    fn record_health_check(&mut self, now: Nanos, healthy: bool) {
        if self.mode != Mode::Probing {
            return;
        }
        if healthy {
            self.probe_succeeded(now);
        } else {
            self.probe_failed(now);
        }
    }
}

/// Rounds values within 1e-12 of 0 to exactly 0, so that the sums of steps that should cancel
/// (for example N failures against a credit of one reaction) do cancel despite rounding.
fn snap(x: f64) -> f64 {
    if x.abs() < 1e-12 { 0.0 } else { x }
}
