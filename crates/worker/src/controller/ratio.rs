//! Google SRE client-side adaptive throttling, adapted to a pull worker.

use backpressure_api::v1alpha1::Algorithm;

use super::probe::ProbeSchedule;
use super::{
    Brake, Controller, Mode, Nanos, Outcome, Settings, brake_cap, clamp01, earliest, limit_for,
};

/// Number of bins of the sliding window.
const BINS: usize = 30;
/// Padding of the denominator (the SRE book's `+1`).
const PADDING: f64 = 1.0;

#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    /// Absolute bin number (time / bin width) this bin holds, to detect stale bins.
    epoch: u64,
    requests: f64,
    accepts: f64,
}

/// Client-side throttling from the Google SRE book ("Handling Overload"):
/// `backoff = max(0, (requests - K * accepts) / (requests + 1))` over a sliding window, with
/// `K = 1/(1 - s)` so that throttling starts when the dependency-failure fraction exceeds the set
/// point `s`.
///
/// In the book, `requests` counts every request the application wanted to send, including the
/// ones rejected locally. A pull worker has no such request stream, so each attempt is counted
/// with weight `1/(1 - backoff)` (at most `maxPermits`): the demand it stands for while a
/// fraction `1 - backoff` of the demand is admitted. With that accounting the fixed point of a
/// capacity-limited dependency is a failure fraction of exactly `s`. `accepts` counts attempts
/// the dependency did not fail (message failures included).
///
/// When permits reach 0 the controller probes exactly like [`super::SetPoint`] (one message at a
/// time on a growing, jittered interval). With `K` close to 1 the window alone would recover
/// very slowly (the admitted fraction grows by a factor `K` per window), so a successful probe
/// clears the window and starts a slow start: 2 permits, +1 per success, up to `maxPermits` or
/// the first dependency failure, with attempts counted at weight 1 meanwhile.
#[derive(Clone, Debug)]
pub struct RatioThrottle {
    settings: Settings,
    k: f64,
    bin_width: u64,
    bins: [Bin; BINS],
    requests: f64,
    accepts: f64,
    current_epoch: u64,
    backoff: f64,
    mode: Mode,
    /// Permits allowed in slow start (grows by one per success).
    slow_start_limit: u32,
    probe: ProbeSchedule,
    probe_armed: bool,
    brake: Option<Brake>,
}

impl RatioThrottle {
    /// A controller with an empty window. `seed` seeds the probe jitter.
    pub fn new(settings: Settings, seed: u64) -> Self {
        let settings = settings.sanitized();
        let probe = ProbeSchedule::new(settings.probe_initial, settings.probe_max, seed);
        let mut c = RatioThrottle {
            k: 1.0,
            bin_width: 1,
            bins: [Bin::default(); BINS],
            requests: 0.0,
            accepts: 0.0,
            current_epoch: 0,
            backoff: 0.0,
            mode: Mode::Normal,
            slow_start_limit: 0,
            probe,
            probe_armed: false,
            brake: None,
            settings,
        };
        c.set_params();
        c
    }

    fn set_params(&mut self) {
        self.k = 1.0 / (1.0 - self.settings.set_point);
        self.bin_width = (self.settings.ratio_window.0 / BINS as u64).max(1);
    }

    /// Moves the window to `now`, dropping bins that fell out of it.
    fn advance(&mut self, now: Nanos) {
        let epoch = now.0 / self.bin_width;
        if epoch == self.current_epoch {
            return;
        }
        self.current_epoch = epoch;
        let oldest = epoch.saturating_sub(BINS as u64 - 1);
        let mut requests = 0.0;
        let mut accepts = 0.0;
        for bin in &mut self.bins {
            if bin.epoch < oldest {
                *bin = Bin {
                    epoch: 0,
                    requests: 0.0,
                    accepts: 0.0,
                };
            } else {
                requests += bin.requests;
                accepts += bin.accepts;
            }
        }
        self.requests = requests;
        self.accepts = accepts;
        self.recompute(now);
    }

    fn recompute(&mut self, now: Nanos) {
        let raw = (self.requests - self.k * self.accepts) / (self.requests + PADDING);
        self.backoff = clamp01(raw.max(0.0));
        if self.mode == Mode::SlowStart {
            return;
        }
        let limit = limit_for(self.settings.max_permits, self.backoff);
        if limit == 0 {
            if self.mode != Mode::Probing {
                self.mode = Mode::Probing;
                self.probe_armed = false;
                self.probe.start(now);
            }
        } else if self.mode == Mode::Probing {
            self.mode = Mode::Normal;
            self.probe_armed = false;
        }
    }

    fn clear_window(&mut self) {
        self.bins = [Bin::default(); BINS];
        self.requests = 0.0;
        self.accepts = 0.0;
        self.backoff = 0.0;
    }

    /// The window's backoff at `now` without moving the window (for read-only queries).
    fn backoff_at(&self, now: Nanos) -> f64 {
        let epoch = now.0 / self.bin_width;
        if epoch == self.current_epoch {
            return self.backoff;
        }
        let oldest = epoch.saturating_sub(BINS as u64 - 1);
        let (mut requests, mut accepts) = (0.0, 0.0);
        for bin in self.bins.iter().filter(|b| b.epoch >= oldest) {
            requests += bin.requests;
            accepts += bin.accepts;
        }
        clamp01(((requests - self.k * accepts) / (requests + PADDING)).max(0.0))
    }

    fn own_limit(&self) -> u32 {
        self.limit_with(self.backoff)
    }

    fn limit_with(&self, backoff: f64) -> u32 {
        let window = limit_for(self.settings.max_permits, backoff);
        if self.mode == Mode::SlowStart {
            window.min(self.slow_start_limit)
        } else {
            window
        }
    }

    fn probe_succeeded(&mut self, now: Nanos) {
        self.clear_window();
        self.probe.reset(now);
        self.mode = Mode::SlowStart;
        self.slow_start_limit = 2;
        self.end_slow_start_if_done();
    }

    fn end_slow_start_if_done(&mut self) {
        if self.slow_start_limit >= self.settings.max_permits {
            self.mode = Mode::Normal;
        }
    }

    fn add(&mut self, now: Nanos, outcome: Outcome) {
        let p = f64::from(self.settings.max_permits);
        let weight = if self.mode == Mode::SlowStart {
            1.0
        } else {
            (1.0 / (1.0 - self.backoff).max(1.0 / p)).min(p)
        };
        let accepted = if outcome == Outcome::DependencyFailure {
            0.0
        } else {
            1.0
        };
        let idx = (self.current_epoch % BINS as u64) as usize;
        let bin = &mut self.bins[idx];
        if bin.epoch != self.current_epoch {
            *bin = Bin {
                epoch: self.current_epoch,
                requests: 0.0,
                accepts: 0.0,
            };
        }
        bin.requests += weight;
        bin.accepts += accepted;
        self.requests += weight;
        self.accepts += accepted;
        self.recompute(now);
    }
}

impl Controller for RatioThrottle {
    fn algorithm(&self) -> Algorithm {
        Algorithm::RatioThrottle
    }

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn record(&mut self, now: Nanos, outcome: Outcome) {
        self.advance(now);
        if self.mode == Mode::Probing && self.probe_armed {
            self.probe_armed = false;
            match outcome {
                Outcome::Success => return self.probe_succeeded(now),
                Outcome::DependencyFailure => self.probe.failed(now),
                Outcome::MessageFailure => self.probe.allow_now(now),
            }
        }
        if self.mode == Mode::SlowStart {
            match outcome {
                Outcome::Success => {
                    self.slow_start_limit += 1;
                    self.end_slow_start_if_done();
                }
                Outcome::DependencyFailure => self.mode = Mode::Normal,
                Outcome::MessageFailure => {}
            }
        }
        self.add(now, outcome);
    }

    fn permits(&mut self, now: Nanos, in_flight: u32) -> u32 {
        self.advance(now);
        let cap = brake_cap(self.brake.as_ref(), self.settings.max_permits, now);
        if self.mode == Mode::Probing {
            if cap == 0
                || in_flight > 0
                || self.settings.health_check_probes
                || !self.probe.due(now)
            {
                return 0;
            }
            self.probe_armed = true;
            return 1;
        }
        self.own_limit().min(cap).saturating_sub(in_flight)
    }

    fn release_unused(&mut self, _now: Nanos, unused: u32) {
        if unused > 0 && self.mode == Mode::Probing {
            self.probe_armed = false;
        }
    }

    fn limit(&self, now: Nanos) -> u32 {
        let cap = brake_cap(self.brake.as_ref(), self.settings.max_permits, now);
        self.limit_with(self.backoff_at(now)).min(cap)
    }

    fn backoff(&self, now: Nanos) -> f64 {
        let own = self.backoff_at(now);
        match self.brake.as_ref().and_then(|b| b.active(now)) {
            Some(min) => own.max(min),
            None => own,
        }
    }

    fn mode(&self) -> Mode {
        self.mode
    }

    fn reconfigure(&mut self, now: Nanos, settings: Settings) {
        let settings = settings.sanitized();
        let width_changed = settings.ratio_window != self.settings.ratio_window;
        self.probe
            .set_bounds(settings.probe_initial, settings.probe_max);
        self.settings = settings;
        self.set_params();
        if width_changed {
            self.clear_window();
            self.current_epoch = now.0 / self.bin_width;
        }
        self.end_slow_start_if_done();
        self.recompute(now);
    }

    fn set_brake(&mut self, brake: Option<Brake>) {
        self.brake = brake;
    }

    fn next_change(&self, now: Nanos) -> Option<Nanos> {
        let probe =
            (self.mode == Mode::Probing && !self.probe.due(now)).then(|| self.probe.next_at());
        // The window forgets: the start of the next bin may lower the backoff.
        let next_bin = Some(Nanos(
            (now.0 / self.bin_width + 1).saturating_mul(self.bin_width),
        ))
        .filter(|_| self.backoff > 0.0);
        let brake = self
            .brake
            .as_ref()
            .and_then(|b| b.next_change(now, self.settings.max_permits));
        earliest(earliest(probe, next_bin), brake)
    }

    fn health_check_due(&mut self, now: Nanos) -> bool {
        self.advance(now);
        if self.settings.health_check_probes && self.mode == Mode::Probing && self.probe.due(now) {
            self.probe.hold(now);
            true
        } else {
            false
        }
    }

    fn record_health_check(&mut self, now: Nanos, healthy: bool) {
        if self.mode != Mode::Probing {
            return;
        }
        self.advance(now);
        if healthy {
            self.probe_succeeded(now);
        } else {
            self.add(now, Outcome::DependencyFailure);
            self.probe.failed(now);
        }
    }
}
