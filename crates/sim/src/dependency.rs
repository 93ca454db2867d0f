//! The dependency every message calls once: a shared capacity (a token bucket refilled at the
//! capacity in requests per second), background failures and injected outages.
//!
//! Per tick, all calls made in that tick are resolved together: as many as there are whole
//! tokens go through, the rest are rejected (overload: "the fraction above capacity fails").
//! Which calls are rejected is drawn uniformly without replacement, so no worker is favoured
//! by the order in which the fleet is visited. A call that goes through then fails with the
//! outage/noise probability of that moment.

use crate::rng::SimRng;
use crate::scenario::Timeline;

/// The dependency's state.
#[derive(Clone, Debug)]
pub struct Dependency {
    tokens: f64,
    burst_secs: f64,
    capacity: f64,
    failure: f64,
    rng: SimRng,
}

impl Dependency {
    /// A dependency with a full bucket. `burst_secs` is the bucket depth in seconds of capacity.
    pub fn new(burst_secs: f64, rng: SimRng) -> Self {
        Dependency {
            tokens: f64::NAN,
            burst_secs: burst_secs.max(0.0),
            capacity: 0.0,
            failure: 0.0,
            rng,
        }
    }

    /// Starts a tick of length `dt` seconds at `t` seconds: refills the bucket at the capacity
    /// of that moment and fixes the failure probability.
    pub fn begin_tick(&mut self, timeline: &Timeline, t: f64, dt: f64) {
        self.capacity = timeline.capacity(t);
        self.failure = timeline.failure_probability(t);
        // The bucket never holds less than one tick of capacity: a burst of 0 means a strict
        // per-tick limit.
        let depth = (self.capacity * self.burst_secs).max(self.capacity * dt);
        if self.tokens.is_nan() {
            self.tokens = depth;
        }
        self.tokens = (self.tokens + self.capacity * dt).min(depth);
    }

    /// Capacity in requests per second during this tick.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// Resolves the `n` calls of this tick: `outcome(i, ok)` for each call `i` in `0..n`.
    /// Returns the number rejected for overload.
    pub fn resolve(&mut self, n: usize, mut outcome: impl FnMut(usize, bool)) -> usize {
        let allowed = (self.tokens.floor().max(0.0) as usize).min(n);
        self.tokens -= allowed as f64;
        let mut rejects = n - allowed;
        let rejected = rejects;
        let mut remaining = n;
        for i in 0..n {
            let reject = rejects > 0 && self.rng.below(remaining as u64) < rejects as u64;
            remaining -= 1;
            if reject {
                rejects -= 1;
                outcome(i, false);
            } else {
                let ok = !self.rng.bernoulli(self.failure);
                outcome(i, ok);
            }
        }
        rejected
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenario::Scenario;

    fn timeline(extra: &str) -> Timeline {
        let y = format!(
            "name: t\ntitle: T\nseed: 1\nduration: 1h\nproducer: {{rate: 1}}\nfleet: {{replicas: 1, minReplicas: 1, maxReplicas: 1}}\ndependency:\n  capacity: 100\n{extra}"
        );
        Timeline::new(&Scenario::from_yaml(&y, "t").unwrap())
    }

    #[test]
    fn overload_rejects_the_fraction_above_capacity() {
        let tl = timeline("");
        let mut d = Dependency::new(1.0, SimRng::new(1));
        let (mut ok, mut total) = (0usize, 0usize);
        // 200 calls/s offered against 100/s for 100 s (after the initial burst).
        for tick in 0..1000 {
            d.begin_tick(&tl, tick as f64 * 0.1, 0.1);
            d.resolve(20, |_, good| {
                total += 1;
                ok += usize::from(good);
            });
        }
        let served = ok as f64 / 100.0; // seconds of capacity
        assert!((served - 101.0).abs() < 1.5, "{served}");
        assert_eq!(total, 20_000);
    }

    #[test]
    fn below_capacity_only_noise_fails() {
        let tl = timeline("  noise: 0.1\n");
        let mut d = Dependency::new(1.0, SimRng::new(2));
        let mut fails = 0;
        for tick in 0..10_000 {
            d.begin_tick(&tl, tick as f64 * 0.1, 0.1);
            d.resolve(5, |_, good| fails += usize::from(!good));
        }
        let rate = fails as f64 / 50_000.0;
        assert!((rate - 0.1).abs() < 0.01, "{rate}");
    }

    #[test]
    fn hard_outage_fails_everything() {
        let tl = timeline("  outages: [{kind: hard, start: 0s, duration: 1h}]\n");
        let mut d = Dependency::new(1.0, SimRng::new(3));
        d.begin_tick(&tl, 10.0, 0.1);
        let mut any_ok = false;
        d.resolve(50, |_, good| any_ok |= good);
        assert!(!any_ok);
        assert_eq!(d.capacity(), 0.0);
    }
}
