//! The scenario's timeline expanded into functions of time, with the spikes drawn from the seed.

use super::{CapacityStep, Outage, RateStep, Scenario, Surge};
use crate::rng::SimRng;

/// The scenario's timeline, expanded: rates, capacities and failure probabilities as functions
/// of time, with the intermittent spikes drawn from the seed.
#[derive(Clone, Debug)]
pub struct Timeline {
    base_rate: f64,
    steps: Vec<RateStep>,
    surges: Vec<Surge>,
    capacity: f64,
    capacity_steps: Vec<CapacityStep>,
    noise: f64,
    /// (start, end, failure probability, recovery length) of every outage and spike.
    episodes: Vec<Episode>,
}

/// One period of failures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Episode {
    /// Start in seconds.
    pub start: f64,
    /// End in seconds.
    pub end: f64,
    /// Failure probability of a call during the episode.
    pub failure: f64,
    /// After `end`, capacity returns linearly from 0 over this many seconds.
    pub recovery: f64,
}

impl Timeline {
    /// Expands a scenario.
    pub fn new(s: &Scenario) -> Timeline {
        let mut steps = s.producer.steps.clone();
        steps.sort_by(|a, b| a.at.0.total_cmp(&b.at.0));
        let mut capacity_steps = s.dependency.capacity_steps.clone();
        capacity_steps.sort_by(|a, b| a.at.0.total_cmp(&b.at.0));
        let mut rng = SimRng::stream(s.seed, "spikes");
        let mut episodes = Vec::new();
        for o in &s.dependency.outages {
            match *o {
                Outage::Hard {
                    start,
                    duration,
                    recovery,
                } => episodes.push(Episode {
                    start: start.0,
                    end: start.0 + duration.0,
                    failure: 1.0,
                    recovery: recovery.0,
                }),
                Outage::Partial {
                    start,
                    duration,
                    failure,
                    recovery,
                } => episodes.push(Episode {
                    start: start.0,
                    end: start.0 + duration.0,
                    failure,
                    recovery: recovery.0,
                }),
                Outage::Intermittent {
                    start,
                    duration,
                    mean_gap,
                    length,
                    depth,
                } => {
                    let end = start.0 + duration.0;
                    let mut t = start.0 + rng.exp(mean_gap.0);
                    while t < end {
                        let len = rng.range(length[0].0, length[1].0);
                        let d = rng.range(depth[0], depth[1]);
                        let e = (t + len).min(end);
                        episodes.push(Episode {
                            start: t,
                            end: e,
                            failure: d,
                            recovery: 0.0,
                        });
                        t = e + rng.exp(mean_gap.0);
                    }
                }
            }
        }
        episodes.sort_by(|a, b| a.start.total_cmp(&b.start));
        Timeline {
            base_rate: s.producer.rate,
            steps,
            surges: s.producer.surges.clone(),
            capacity: s.dependency.capacity,
            capacity_steps,
            noise: s.dependency.noise,
            episodes,
        }
    }

    /// The failure episodes (outages and spikes), sorted by start.
    pub fn episodes(&self) -> &[Episode] {
        &self.episodes
    }

    /// Arrival rate (messages per second) at `t` seconds.
    pub fn arrival_rate(&self, t: f64) -> f64 {
        let mut r = self.base_rate;
        for s in &self.steps {
            if s.at.0 <= t {
                r = s.rate;
            } else {
                break;
            }
        }
        for s in &self.surges {
            if t >= s.start.0 && t < s.start.0 + s.duration.0 {
                r *= s.factor;
            }
        }
        r
    }

    /// Nominal capacity (requests per second) at `t`, before outages.
    pub fn nominal_capacity(&self, t: f64) -> f64 {
        let mut c = self.capacity;
        for s in &self.capacity_steps {
            if s.at.0 <= t {
                c = s.capacity;
            } else {
                break;
            }
        }
        c
    }

    /// Capacity at `t`: nominal, times 0 during a hard outage and the linear return after
    /// an outage with a recovery ramp.
    pub fn capacity(&self, t: f64) -> f64 {
        let mut m: f64 = 1.0;
        for e in &self.episodes {
            if e.start > t {
                break;
            }
            if t < e.end {
                if e.failure >= 1.0 {
                    m = 0.0;
                }
            } else if e.recovery > 0.0 && t < e.end + e.recovery {
                m = m.min((t - e.end) / e.recovery);
            }
        }
        self.nominal_capacity(t) * m
    }

    /// Probability that a call at `t` fails for reasons other than overload (background noise
    /// and outages).
    pub fn failure_probability(&self, t: f64) -> f64 {
        let mut ok = 1.0 - self.noise;
        for e in &self.episodes {
            if e.start > t {
                break;
            }
            if t < e.end {
                ok *= 1.0 - e.failure;
            }
        }
        1.0 - ok
    }

    /// The background noise.
    pub fn noise(&self) -> f64 {
        self.noise
    }
}
