//! Timing of probes while fully backed off: exponentially growing, jittered intervals.

use super::{Nanos, SplitMix64};

/// When the next probe may go out. Intervals start at `initial`, double after each failed probe
/// up to `max`, and each wait is the interval times a jitter factor drawn from `U[0.5, 1)` so that
/// a fleet of workers does not probe in lockstep.
#[derive(Clone, Debug)]
pub(crate) struct ProbeSchedule {
    initial: Nanos,
    max: Nanos,
    interval: Nanos,
    next_at: Nanos,
    rng: SplitMix64,
}

impl ProbeSchedule {
    pub(crate) fn new(initial: Nanos, max: Nanos, seed: u64) -> Self {
        ProbeSchedule {
            initial,
            max,
            interval: initial,
            next_at: Nanos::ZERO,
            rng: SplitMix64::new(seed),
        }
    }

    /// Entering full backoff: the first probe after a jittered initial interval.
    pub(crate) fn start(&mut self, now: Nanos) {
        self.interval = self.initial;
        self.schedule(now);
    }

    /// Whether a probe may go out at `now`.
    pub(crate) fn due(&self, now: Nanos) -> bool {
        now >= self.next_at
    }

    /// The time the next probe becomes due.
    pub(crate) fn next_at(&self) -> Nanos {
        self.next_at
    }

    /// The current (un-jittered) interval.
    pub(crate) fn interval(&self) -> Nanos {
        self.interval
    }

    /// A probe failed: double the interval (up to the maximum) and wait.
    pub(crate) fn failed(&mut self, now: Nanos) {
        self.interval = Nanos(self.interval.0.saturating_mul(2).min(self.max.0));
        self.schedule(now);
    }

    /// Waits one current interval again without growing it (a health check was started).
    pub(crate) fn hold(&mut self, now: Nanos) {
        self.schedule(now);
    }

    /// A probe succeeded or said nothing about the dependency: allow the next one now and reset
    /// the interval.
    pub(crate) fn reset(&mut self, now: Nanos) {
        self.interval = self.initial;
        self.next_at = now;
    }

    /// Allows the next probe now, keeping the interval (the last probe said nothing about the
    /// dependency).
    pub(crate) fn allow_now(&mut self, now: Nanos) {
        self.next_at = now;
    }

    /// New bounds at runtime; the current interval is clamped into them.
    pub(crate) fn set_bounds(&mut self, initial: Nanos, max: Nanos) {
        self.initial = initial;
        self.max = max;
        self.interval = Nanos(self.interval.0.clamp(initial.0, max.0));
    }

    fn schedule(&mut self, now: Nanos) {
        let jitter = 0.5 + 0.5 * self.rng.next_f64();
        let wait = (self.interval.0 as f64 * jitter) as u64;
        self.next_at = now + Nanos(wait.max(1));
    }
}
