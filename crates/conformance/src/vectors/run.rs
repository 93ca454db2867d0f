//! [`Run`]: drives one controller and writes every call down as a step.

use backpressure_api::wire::WorkerConfig;
use backpressure_worker::controller::{
    self, Brake, Controller, Mode, Nanos, Outcome, Settings, SplitMix64,
};

use super::{Case, Expect, Op, Step};

/// The Unix time (seconds) of controller time 0 in every case: `unixS` of a `configure` step
/// at `t` is this plus `t` in whole seconds.
pub const UNIX_EPOCH_OF_T0: i64 = 1_767_225_600;

/// A controller being driven, and the steps so far.
#[derive(Debug)]
pub struct Run {
    case: Case,
    controller: Box<dyn Controller>,
    brake: Option<Brake>,
    t: u64,
    /// Outcome draws of the traffic model (not the controller's generator).
    rng: SplitMix64,
    /// The payload in force (the base of [`Run::reconfigure`]).
    running: WorkerConfig,
    generation: i64,
}

/// How a dependency answers a call, given the calls in flight when it was made (itself
/// included).
pub type Dependency<'a> = &'a mut dyn FnMut(&mut SplitMix64, u32) -> Outcome;

impl Run {
    /// A controller built from `config` (which must carry no brake) with `seed`, starting at
    /// `t`.
    pub fn new(
        name: &str,
        description: &str,
        seed: u64,
        brake_offset: Nanos,
        config: WorkerConfig,
        t: Nanos,
    ) -> Run {
        debug_assert!(
            config.brake.is_none(),
            "{name}: a brake comes with a configure step"
        );
        let config = WorkerConfig {
            generation: 1,
            hash: String::new(),
            ..config
        };
        let controller = controller::from_config(&config, seed);
        Run {
            case: Case {
                name: name.to_owned(),
                description: description.to_owned(),
                seed,
                brake_offset_ns: brake_offset.as_nanos(),
                config: config.clone(),
                steps: Vec::new(),
            },
            controller,
            brake: None,
            t: t.as_nanos(),
            rng: SplitMix64::new(seed ^ 0x0005_EED0_F0C7_C0E5_u64),
            running: config,
            generation: 1,
        }
    }

    /// The case, done.
    pub fn finish(self) -> Case {
        self.case
    }

    /// The current time.
    pub fn now(&self) -> Nanos {
        Nanos(self.t)
    }

    /// Moves the clock to `t` (never backwards).
    pub fn at(&mut self, t: Nanos) -> &mut Self {
        self.t = self.t.max(t.as_nanos());
        self
    }

    /// Moves the clock forward by `d`.
    pub fn after(&mut self, d: Nanos) -> &mut Self {
        self.t += d.as_nanos();
        self
    }

    /// The controller's mode.
    pub fn mode(&self) -> Mode {
        self.controller.mode()
    }

    /// The controller's backoff now.
    pub fn backoff(&self) -> f64 {
        self.controller.backoff(self.now())
    }

    /// The controller's limit now.
    pub fn limit(&self) -> u32 {
        self.controller.limit(self.now())
    }

    /// The controller's failure-floor estimate.
    pub fn floor_estimate(&self) -> Option<f64> {
        self.controller.floor_estimate()
    }

    /// When the controller may grant more without an outcome (not a step).
    pub fn next_change(&self) -> Option<Nanos> {
        self.controller.next_change(self.now())
    }

    /// The traffic model's generator.
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }

    fn push(&mut self, op: Op, permits: Option<u32>) {
        let now = self.now();
        let c = &self.controller;
        let expect = Expect {
            permits,
            backoff: c.backoff(now),
            mode: c.mode().as_str(),
            limit: c.limit(now),
            failure_floor: c.failure_floor(),
            floor_estimate: c.floor_estimate(),
        };
        self.case.steps.push(Step {
            t: self.t,
            op,
            expect,
        });
    }

    /// `record(t, outcome)`.
    pub fn record(&mut self, outcome: Outcome) -> &mut Self {
        self.controller.record(self.now(), outcome);
        self.push(
            Op::Record {
                outcome: outcome.into(),
            },
            None,
        );
        self
    }

    /// `record` `n` times.
    pub fn record_n(&mut self, n: usize, outcome: Outcome) -> &mut Self {
        for _ in 0..n {
            self.record(outcome);
        }
        self
    }

    /// `permits(t, in_flight)`.
    pub fn permits(&mut self, in_flight: u32) -> u32 {
        let p = self.controller.permits(self.now(), in_flight);
        self.push(Op::Permits { in_flight }, Some(p));
        p
    }

    /// `release_unused(t, unused)`.
    pub fn release(&mut self, unused: u32) -> &mut Self {
        self.controller.release_unused(self.now(), unused);
        self.push(Op::ReleaseUnused { unused }, None);
        self
    }

    /// A new payload at `t`, applied as a worker applies it: the brake converted to controller
    /// time, succeeding the old one (lifting gently with this case's offset), then
    /// [`controller::apply_settings`].
    pub fn configure(&mut self, config: WorkerConfig) -> &mut Self {
        self.generation += 1;
        let config = WorkerConfig {
            generation: self.generation,
            hash: String::new(),
            ..config
        };
        let now = self.now();
        let unix_s = Self::unix_at(now);
        let settings = Settings::from_config(&config);
        let new = config
            .brake
            .as_ref()
            .map(|b| Brake::from_wire(b, now, unix_s));
        let offset = Nanos(self.case.brake_offset_ns);
        let brake = Brake::succeed(
            self.brake.as_ref(),
            new,
            now,
            settings.brake_release,
            offset,
        );
        self.brake = brake;
        controller::apply_settings(&mut self.controller, now, settings, self.case.seed, brake);
        self.running = config.clone();
        self.push(
            Op::Configure {
                config: Box::new(config),
                unix_s,
            },
            None,
        );
        self
    }

    /// [`Run::configure`] with the running payload changed by `f`.
    pub fn reconfigure(&mut self, f: impl FnOnce(&mut WorkerConfig)) -> &mut Self {
        let mut cfg = self.running.clone();
        f(&mut cfg);
        self.configure(cfg)
    }

    /// The Unix time (seconds) at controller time `t`.
    pub fn unix_at(t: Nanos) -> i64 {
        UNIX_EPOCH_OF_T0 + i64::try_from(t.as_nanos() / 1_000_000_000).unwrap_or(i64::MAX)
    }

    /// Serves messages as a worker does until `until` (or until `stop` says so after an
    /// event): at each event it asks for permits with what is in flight and starts that many
    /// messages (of which at most `available` per poll arrive; the rest is released), each
    /// answering after a service time of `rtt · U[0.5, 1.5)` with an outcome drawn by `dep` at
    /// its start; with nothing in flight and no permit it sleeps until the controller's next
    /// change (or `idle`, when none is announced).
    pub fn serve(
        &mut self,
        until: Nanos,
        rtt: Nanos,
        available: u32,
        dep: Dependency<'_>,
        mut stop: impl FnMut(&Run) -> bool,
    ) -> &mut Self {
        // (finish time, outcome), in start order.
        let mut pending: Vec<(u64, Outcome)> = Vec::new();
        let idle = Nanos::from_secs(1);
        while self.t < until.as_nanos() {
            let in_flight = u32::try_from(pending.len()).unwrap_or(u32::MAX);
            let granted = self.permits(in_flight);
            let taken = granted.min(available);
            if taken < granted {
                self.release(granted - taken);
            }
            for i in 0..taken {
                let draw = self.rng.next_f64();
                let service = (rtt.as_nanos() as f64 * (0.5 + draw)) as u64;
                let outcome = dep(&mut self.rng, in_flight + i + 1);
                pending.push((self.t + service.max(1), outcome));
            }
            if stop(self) {
                break;
            }
            let first = pending
                .iter()
                .enumerate()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(i, _)| i);
            match first {
                Some(i) => {
                    let (at, outcome) = pending.remove(i);
                    self.at(Nanos(at));
                    self.record(outcome);
                }
                None => {
                    let next = self
                        .next_change()
                        .filter(|n| n.as_nanos() > self.t)
                        .unwrap_or(self.now() + idle);
                    self.at(next);
                }
            }
        }
        // Whatever is still in flight comes back (a worker drains on shutdown).
        pending.sort_by_key(|(at, _)| *at);
        for (at, outcome) in pending {
            self.at(Nanos(at));
            self.record(outcome);
        }
        self
    }
}
