//! Controllers without backoff: `Fixed` (honours the brake) and `Off` (ignores it).

use backpressure_api::v1alpha1::Algorithm;

use super::{Brake, Controller, Mode, Nanos, Outcome, Settings, brake_cap, earliest};

/// Always `maxPermits`, except under the operator's brake. Backoff is 0 (or the brake).
#[derive(Clone, Debug)]
pub struct Fixed {
    settings: Settings,
    brake: Option<Brake>,
}

impl Fixed {
    /// A fixed controller.
    pub fn new(settings: Settings) -> Self {
        Fixed {
            settings: settings.sanitized(),
            brake: None,
        }
    }
}

impl Controller for Fixed {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Fixed
    }

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn record(&mut self, _now: Nanos, _outcome: Outcome) {}

    fn permits(&mut self, now: Nanos, in_flight: u32) -> u32 {
        self.limit(now).saturating_sub(in_flight)
    }

    fn limit(&self, now: Nanos) -> u32 {
        brake_cap(self.brake.as_ref(), self.settings.max_permits, now)
    }

    fn backoff(&self, now: Nanos) -> f64 {
        self.brake
            .as_ref()
            .and_then(|b| b.active(now))
            .unwrap_or(0.0)
    }

    fn mode(&self) -> Mode {
        Mode::Normal
    }

    fn reconfigure(&mut self, _now: Nanos, settings: Settings) {
        self.settings = settings.sanitized();
    }

    fn set_brake(&mut self, brake: Option<Brake>) {
        self.brake = brake;
    }

    fn next_change(&self, now: Nanos) -> Option<Nanos> {
        earliest(
            None,
            self.brake
                .as_ref()
                .and_then(|b| b.next_change(now, self.settings.max_permits)),
        )
    }
}

/// Backpressure switched off: always `maxPermits`, backoff always 0, the brake ignored.
#[derive(Clone, Debug)]
pub struct Off {
    settings: Settings,
}

impl Off {
    /// A pass-through controller.
    pub fn new(settings: Settings) -> Self {
        Off {
            settings: settings.sanitized(),
        }
    }
}

impl Controller for Off {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Off
    }

    fn settings(&self) -> &Settings {
        &self.settings
    }

    fn record(&mut self, _now: Nanos, _outcome: Outcome) {}

    fn permits(&mut self, _now: Nanos, in_flight: u32) -> u32 {
        self.settings.max_permits.saturating_sub(in_flight)
    }

    fn limit(&self, _now: Nanos) -> u32 {
        self.settings.max_permits
    }

    fn backoff(&self, _now: Nanos) -> f64 {
        0.0
    }

    fn mode(&self) -> Mode {
        Mode::Normal
    }

    fn reconfigure(&mut self, _now: Nanos, settings: Settings) {
        self.settings = settings.sanitized();
    }

    fn set_brake(&mut self, _brake: Option<Brake>) {}

    fn next_change(&self, _now: Nanos) -> Option<Nanos> {
        None
    }
}
