//! The simulation loop.
//!
//! # Modelling choice: a fixed time step with exact per-message state
//!
//! A per-message event queue would handle ~10^8 events for the benchmark (hundreds of messages
//! per second over many simulated hours, several events per delivery, five policies, a dozen
//! scenarios). Instead, time advances in fixed ticks (`tick`, 100 ms by default) and each tick
//! resolves, in this order:
//!
//! 1. pods whose startup delay has passed become ready;
//! 2. deliveries whose processing ends in this tick complete: the pod's controller records the
//!    outcome, the message is acknowledged, scheduled for redelivery, or dead-lettered;
//! 3. drained terminating pods disappear;
//! 4. Poisson arrivals for the tick join the queue (one bucket per tick). They are the
//!    producers' demand: without producer control it is published as it comes, and what a
//!    bounded broker (`queue.capacity`) rejects is lost; with it (ours with a `producers`
//!    section) it passes the producers' gate ([`crate::producer`]), and what the gate holds or
//!    the broker rejects waits at the producers;
//! 5. every ready pod, in an order rotated each tick, asks its controller for permits and
//!    receives up to that many visible messages (unused permits are released);
//! 6. the dependency resolves all calls of the tick together (token bucket and outage/noise
//!    failures) and each delivery is scheduled to complete after its sampled processing time,
//!    rounded to the nearest tick (at least one);
//! 7. metrics are scraped and the autoscaler decides on their periods; replicas follow, and so
//!    does the producers' gate.
//!
//! Every message keeps its own delivery count (the queue is run-length encoded by arrival tick
//! and by delivery count, in-flight deliveries are individual records in a timing wheel), so
//! the DLQ is exact. The error of the step is in timing only: arrivals are placed at the start
//! of their tick (first-attempt waits are up to one tick longer than in continuous time),
//! polls happen once per tick (a worker with a free permit waits up to one tick, like a
//! polling interval of `tick`), and processing times are rounded to the nearest tick
//! (unbiased on average; at 100 ms and a mean of 1 s the per-delivery error is within ±5 %).
//! `tests/acceptance.rs` checks that halving the tick changes the headline numbers of a short
//! scenario by little.

use backpressure_api::v1alpha1::{Action, ProducerState, Regime};
use backpressure_worker::controller::{self, Controller, Nanos, Outcome, Settings};
use backpressure_worker::worker_loop::RedeliveryBackoff;

use crate::autoscaler::hpa::ControllerFlags;
use crate::autoscaler::{Autoscaler, Decision, Hpa, Observation, Ours, Static};
use crate::dependency::Dependency;
use crate::policy::{Policy, Scaler};
use crate::producer::{Gate, Producers};
use crate::queue::Queue;
use crate::rng::SimRng;
use crate::scenario::{Scenario, Timeline};
use crate::stats::Histogram;

/// Why a run could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The scenario's `WorkerBackpressure` spec does not resolve.
    #[error("the scenario's WorkerBackpressure spec does not resolve: {0}")]
    Resolve(String),
    /// The HPA a KEDA comparator would create is invalid.
    #[error("the KEDA comparator's HorizontalPodAutoscaler is invalid: {0}")]
    Hpa(String),
}

/// One second of the run: counts during the second and gauges at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Messages that arrived.
    pub arrivals: u32,
    /// Dependency calls made (deliveries).
    pub attempts: u32,
    /// Dependency calls that failed.
    pub failures: u32,
    /// Of those, calls rejected because the fleet's calls exceeded the dependency's capacity
    /// (overload, as opposed to outage or background failures).
    pub rejected: u32,
    /// Messages acknowledged.
    pub completed: u32,
    /// Messages dead-lettered.
    pub dead_lettered: u32,
    /// Queue age: seconds since the oldest message not yet delivered once arrived.
    pub queue_age: f32,
    /// Messages waiting (fresh and awaiting redelivery).
    pub depth: u64,
    /// Deliveries being processed.
    pub in_flight: u32,
    /// Replicas wanted (`spec.replicas`).
    pub desired: u32,
    /// Ready pods.
    pub ready: u32,
    /// All pods (starting, ready and terminating), for replica-hours.
    pub pods: u32,
    /// Mean backoff factor of the ready pods.
    pub backoff: f32,
    /// Dependency capacity (requests per second), mean over the second.
    pub capacity: f32,
    /// Ready pods whose permits are below the maximum, not counting pods still in their startup
    /// ramp (`Mode::Starting`).
    pub throttled: u32,
    /// The autoscaler's regime, when it reports one.
    pub regime: Option<Regime>,
    /// Cumulative messages produced.
    pub produced_total: u64,
    /// Cumulative messages acknowledged.
    pub completed_total: u64,
    /// Cumulative messages dead-lettered.
    pub dead_lettered_total: u64,
    /// Messages the producers wanted to send (the scenario's arrivals); `arrivals` counts
    /// those the broker accepted.
    pub demand: u32,
    /// Publishes the broker rejected (full).
    pub broker_rejected: u32,
    /// Messages waiting at the producers at the end of the second.
    pub producer_backlog: u64,
    /// The producers' state at the end of the second (runs with producer control).
    pub producer_state: Option<ProducerState>,
}

/// A decision of the autoscaler that changed something or reported an action.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionLog {
    /// Seconds since the start.
    pub t: f64,
    /// Replicas before.
    pub from: u32,
    /// The decision.
    pub decision: Decision,
}

/// A change of the producer state (runs with producer control).
#[derive(Clone, Debug, PartialEq)]
pub struct ProducerLog {
    /// Seconds since the start.
    pub t: f64,
    /// The new state.
    pub state: ProducerState,
    /// The allowed rate (Throttled, Resuming).
    pub rate: Option<f64>,
    /// The event's message.
    pub message: String,
}

/// Everything a run produces.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutput {
    /// The policy.
    pub policy: Policy,
    /// The autoscaler's name.
    pub autoscaler: &'static str,
    /// One sample per simulated second.
    pub samples: Vec<Sample>,
    /// Decisions that reported an action other than `None` or changed replicas.
    pub decisions: Vec<DecisionLog>,
    /// Messages produced.
    pub produced: u64,
    /// Messages acknowledged.
    pub completed: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Deliveries (dependency calls).
    pub attempts: u64,
    /// Failed deliveries.
    pub failed_attempts: u64,
    /// Messages still waiting at the end.
    pub queued_at_end: u64,
    /// Deliveries in flight at the end.
    pub in_flight_at_end: u64,
    /// First-attempt wait of every delivered message, in ticks.
    pub first_wait: Histogram,
    /// Seconds per tick.
    pub tick: f64,
    /// Messages the producers wanted to send.
    pub demanded: u64,
    /// Publishes the broker rejected because it was full.
    pub broker_rejected: u64,
    /// Messages lost to those rejections: all of them without producer control, none with it
    /// (the producers keep what the broker refuses).
    pub lost_to_broker: u64,
    /// Whether the producers ran with producer control (a gate and a backlog).
    pub producer_control: bool,
    /// Highest queue depth at any tick (after the tick's arrivals).
    pub peak_depth: u64,
    /// Highest number of messages the broker stored at any tick: waiting plus delivered and
    /// not acknowledged (what `queue.capacity` limits), after the tick's arrivals.
    pub peak_stored: u64,
    /// Highest producer backlog at any tick.
    pub peak_producer_backlog: u64,
    /// Messages still waiting at the producers at the end.
    pub producer_backlog_at_end: u64,
    /// Time from demand to acknowledgement of every completed message, in ticks.
    pub end_to_end: Histogram,
    /// Every change of the producer state.
    pub producer_log: Vec<ProducerLog>,
    /// Simulated events: arrivals, deliveries, completions, pod starts and stops, decisions.
    pub events: u64,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    pod: u32,
    deliveries: u8,
    ok: bool,
    /// Demand time (tick).
    born: u64,
}

#[derive(Debug)]
struct Pod {
    controller: Box<dyn Controller>,
    in_flight: u32,
    ready_at: u64,
    terminating: bool,
}

/// The replica set.
#[derive(Debug, Default)]
struct Fleet {
    pods: Vec<Pod>,
    free: Vec<u32>,
    /// Live pods in creation order.
    order: Vec<u32>,
    created: u64,
}

impl Fleet {
    fn active(&self) -> u32 {
        self.order
            .iter()
            .filter(|&&i| !self.pods[i as usize].terminating)
            .count() as u32
    }

    fn ready(&self, tick: u64) -> u32 {
        self.order
            .iter()
            .filter(|&&i| {
                let p = &self.pods[i as usize];
                !p.terminating && p.ready_at <= tick
            })
            .count() as u32
    }
}

/// The simulation of one scenario under one policy.
#[derive(Debug)]
pub struct Simulation<'a> {
    scenario: &'a Scenario,
    policy: Policy,
    timeline: Timeline,
}

impl<'a> Simulation<'a> {
    /// Prepares a run.
    pub fn new(scenario: &'a Scenario, policy: Policy) -> Self {
        Simulation {
            scenario,
            policy,
            timeline: Timeline::new(scenario),
        }
    }

    /// The expanded timeline.
    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    fn autoscaler(&self) -> Result<Box<dyn Autoscaler>, SimError> {
        let f = &self.scenario.fleet;
        Ok(match self.policy.scaler {
            Scaler::Static => Box::new(Static),
            Scaler::KedaQueueAge => Box::new(
                Hpa::keda_queue_age(
                    f.min_replicas,
                    f.max_replicas,
                    f.target_queue_age.secs(),
                    None,
                    ControllerFlags::default(),
                )
                .map_err(|e| SimError::Hpa(e.to_string()))?,
            ),
            Scaler::KedaLagCount => Box::new(
                Hpa::keda_lag_count(
                    f.min_replicas,
                    f.max_replicas,
                    self.scenario.lag_count(),
                    None,
                    ControllerFlags::default(),
                )
                .map_err(|e| SimError::Hpa(e.to_string()))?,
            ),
            Scaler::Ours => Box::new(
                Ours::new(
                    self.scenario,
                    self.policy.producers_for(self.scenario).as_ref(),
                )
                .map_err(|e| SimError::Resolve(e.to_string()))?,
            ),
        })
    }

    fn settings(&self) -> Settings {
        let w = &self.scenario.workers;
        Settings {
            algorithm: self.policy.workers.algorithm(),
            set_point: w.set_point,
            reaction: w.reaction(),
            max_permits: w.max_permits,
            probe_initial: Nanos::from_duration(std::time::Duration::from_secs_f64(
                w.probe_initial.secs(),
            )),
            probe_max: Nanos::from_duration(std::time::Duration::from_secs_f64(w.probe_max.secs())),
            initial_permits: w.initial_permits,
            ..Settings::default()
        }
    }

    /// Runs the scenario to its end.
    pub fn run(&self) -> Result<RunOutput, SimError> {
        let s = self.scenario;
        let dt = s.tick.secs();
        let dt_ns = (dt * 1e9).round() as u64;
        let ticks_per_sec = (1.0 / dt).round() as u64;
        let total_ticks = (s.duration.secs() / dt).round() as u64;
        let to_ticks = |secs: f64| ((secs / dt).round() as u64).max(1);
        let startup = (s.fleet.startup_delay.secs() / dt).round() as u64;
        let vt = s.queue.visibility_timeout.secs();
        // Processing is capped below the visibility timeout: no duplicate deliveries.
        let max_latency_ticks = to_ticks(vt).saturating_sub(1).max(1);
        let wheel_len = (max_latency_ticks + 2) as usize;
        let scrape_every = to_ticks(s.autoscaler.scrape.secs());
        let sync_every = to_ticks(s.autoscaler.sync.secs());
        let rate_window = (s.autoscaler.rate_window.secs().round() as usize).max(1);
        // Decisions fall between scrapes (on a whole second: the operator truncates `now`),
        // starting once a full rate window of metrics exists (the fleet is taken to have been
        // running before the simulation starts; a half-filled window would understate the
        // completion rate against arrivals).
        let sync_offset = ((sync_every / 2) / ticks_per_sec) * ticks_per_sec;
        // A cold start decides from the first sync, on a window still filling.
        let warm_up = if s.fleet.cold_start {
            0
        } else {
            (rate_window as u64 * ticks_per_sec).div_ceil(scrape_every) * scrape_every
        };
        let mut next_decision = warm_up + sync_offset.max(1);
        let settings = self.settings();
        let max_permits = settings.max_permits;
        let processing = s.workers.processing;
        let (lat, flat) = (s.dependency.latency, s.dependency.failure_latency);

        let mut arrivals_rng = SimRng::stream(s.seed, "arrivals");
        let mut latency_rng = SimRng::stream(s.seed, "latency");
        let mut dep = Dependency::new(
            s.dependency.burst.secs(),
            SimRng::stream(s.seed, "dependency"),
        );
        let retry_delays: Vec<u64> = match s.workers.redelivery_backoff {
            Some(spec) => {
                let backoff = RedeliveryBackoff {
                    base: std::time::Duration::from_secs_f64(spec.base.secs()),
                    max: std::time::Duration::from_secs_f64(spec.max.secs()),
                };
                (1..=u32::from(s.queue.max_receives))
                    .map(|k| to_ticks(backoff.delay(k).as_secs_f64()))
                    .collect()
            }
            None => vec![to_ticks(vt)],
        };
        let mut queue = Queue::with_delays(retry_delays, s.queue.max_receives)
            .with_born_grain(ticks_per_sec)
            .with_capacity(s.queue.capacity);
        let mut producers = self.policy.producers_for(s).map(|_| Producers::new());
        let mut producer_log = Vec::new();
        let mut producer_state = ProducerState::Open;
        let (mut peak_depth, mut peak_stored, mut peak_producer_backlog) = (0u64, 0u64, 0u64);
        let mut rejected_before = 0u64;
        let mut autoscaler = self.autoscaler()?;
        let mut fleet = Fleet::default();
        let mut wheel: Vec<Vec<InFlight>> = vec![Vec::new(); wheel_len];
        let mut spare: Vec<InFlight> = Vec::new();
        let mut polled: Vec<(u32, u8, u64)> = Vec::new();

        // The initial replicas have been running before the simulation starts (like the warm-up
        // of the autoscaler's rate window): their controllers are past their startup ramp. Not
        // so on a cold start (`fleet.coldStart`).
        let established = Settings {
            initial_permits: 0,
            ..settings.clone()
        };
        // The set point the workers run: the scenario's, or the one the operator pushes
        // (`Decision::worker_set_point`); a new pod starts with the one in force.
        let mut set_point = settings.set_point;
        let new_pod = |fleet: &mut Fleet, ready_at: u64, set_point: f64| {
            let seed = SimRng::derive_seed(s.seed, "controller", fleet.created);
            let settings = if ready_at == 0 {
                &established
            } else {
                &settings
            };
            fleet.created += 1;
            let pod = Pod {
                controller: controller::build(
                    Settings {
                        set_point,
                        ..settings.clone()
                    },
                    seed,
                ),
                in_flight: 0,
                ready_at,
                terminating: false,
            };
            let slot = if let Some(i) = fleet.free.pop() {
                fleet.pods[i as usize] = pod;
                i
            } else {
                fleet.pods.push(pod);
                (fleet.pods.len() - 1) as u32
            };
            fleet.order.push(slot);
        };
        // A cold start's replicas are new pods (a `ready_at` after 0: the startup ramp).
        let initial_ready_at = if s.fleet.cold_start {
            startup.max(1)
        } else {
            0
        };
        for _ in 0..s.fleet.replicas {
            new_pod(&mut fleet, initial_ready_at, set_point);
        }
        let mut desired = s.fleet.replicas;
        let mut regime: Option<Regime> = None;

        let mut samples: Vec<Sample> =
            Vec::with_capacity((total_ticks / ticks_per_sec) as usize + 1);
        let mut sec = Sample::default();
        let mut capacity_sum = 0.0;
        let mut in_flight_total: u64 = 0;
        let mut attempts: u64 = 0;
        let mut failed_attempts: u64 = 0;
        let mut events: u64 = 0;
        let mut decisions = Vec::new();
        let mut last_scrape = Observation::default();

        for tick in 0..total_ticks {
            let t = tick as f64 * dt;
            let now = Nanos(tick * dt_ns);

            // 2. Completions.
            let slot = (tick % wheel_len as u64) as usize;
            std::mem::swap(&mut wheel[slot], &mut spare);
            for d in spare.drain(..) {
                let pod = &mut fleet.pods[d.pod as usize];
                pod.in_flight -= 1;
                in_flight_total -= 1;
                events += 1;
                if d.ok {
                    pod.controller.record(now, Outcome::Success);
                    queue.ack(tick, d.born);
                    sec.completed += 1;
                } else {
                    pod.controller.record(now, Outcome::DependencyFailure);
                    if queue.nack(tick, d.deliveries, d.born) {
                        sec.dead_lettered += 1;
                    }
                }
            }

            // 3. Drained terminating pods go away.
            if fleet.order.iter().any(|&i| {
                let p = &fleet.pods[i as usize];
                p.terminating && p.in_flight == 0
            }) {
                let Fleet {
                    pods, free, order, ..
                } = &mut fleet;
                order.retain(|&i| {
                    let p = &pods[i as usize];
                    if p.terminating && p.in_flight == 0 {
                        free.push(i);
                        events += 1;
                        false
                    } else {
                        true
                    }
                });
            }

            // 4. Arrivals: the producers' demand, published directly or through their gate.
            let n = arrivals_rng.poisson(self.timeline.arrival_rate(t) * dt);
            let accepted = match producers.as_mut() {
                None => queue.publish(tick, tick, n, in_flight_total),
                Some(p) => {
                    p.demand(tick, n);
                    p.send(dt, |born, m| queue.publish(tick, born, m, in_flight_total))
                }
            };
            sec.demand += n as u32;
            sec.arrivals += accepted as u32;
            events += n;
            peak_depth = peak_depth.max(queue.depth());
            peak_stored = peak_stored.max(queue.depth() + in_flight_total);
            if let Some(p) = &producers {
                peak_producer_backlog = peak_producer_backlog.max(p.backlog());
            }

            // 5. Polls.
            dep.begin_tick(&self.timeline, t, dt);
            capacity_sum += dep.capacity();
            polled.clear();
            let live = fleet.order.len();
            if live > 0 && queue.has_visible(tick) {
                let start = (tick % live as u64) as usize;
                for j in 0..live {
                    let idx = fleet.order[(start + j) % live];
                    let pod = &mut fleet.pods[idx as usize];
                    if pod.terminating || pod.ready_at > tick {
                        continue;
                    }
                    let k = pod.controller.permits(now, pod.in_flight);
                    if k == 0 {
                        continue;
                    }
                    let got =
                        queue.receive(tick, u64::from(k), |c, born| polled.push((idx, c, born)));
                    let got = got as u32;
                    if got < k {
                        pod.controller.release_unused(now, k - got);
                    }
                    pod.in_flight += got;
                    if !queue.has_visible(tick) {
                        break;
                    }
                }
            }

            // 6. The dependency answers this tick's calls.
            {
                let polled = &polled;
                let wheel = &mut wheel;
                let sec = &mut sec;
                let rng = &mut latency_rng;
                let rejected = dep.resolve(polled.len(), |i, ok| {
                    let (pod, deliveries, born) = polled[i];
                    let secs = rng.lognormal(processing.mean.secs(), processing.sigma)
                        + if ok {
                            rng.lognormal(lat.mean.secs(), lat.sigma)
                        } else {
                            rng.lognormal(flat.mean.secs(), flat.sigma)
                        };
                    let ticks = ((secs / dt).round() as u64).clamp(1, max_latency_ticks);
                    let at = ((tick + ticks) % wheel_len as u64) as usize;
                    wheel[at].push(InFlight {
                        pod,
                        deliveries,
                        ok,
                        born,
                    });
                    sec.attempts += 1;
                    if !ok {
                        sec.failures += 1;
                    }
                });
                sec.rejected += rejected as u32;
            }
            let n_polled = polled.len() as u64;
            in_flight_total += n_polled;
            attempts += n_polled;
            events += n_polled;

            // 7. Metrics scrape and autoscaler.
            if tick % scrape_every == 0 {
                last_scrape = self.scrape(&fleet, &queue, &samples, tick, now, dt, rate_window);
            }
            if tick == next_decision {
                let mut obs = last_scrape.clone();
                obs.now = t;
                obs.replicas = desired;
                obs.ready_pods = fleet.ready(tick);
                obs.status_replicas = fleet.active();
                // KEDA reads a stream's lag from the broker when the HPA asks, not from a scrape.
                obs.undelivered = Some(queue.undelivered());
                let decision = autoscaler.decide(&obs);
                events += 1;
                next_decision = tick
                    + match decision.requeue_after {
                        Some(secs) if secs.is_finite() && secs > 0.0 => {
                            ((secs / dt).ceil() as u64).max(1)
                        }
                        _ => sync_every,
                    };
                if decision.regime.is_some() {
                    regime = decision.regime;
                }
                // The config push: every pod, at once (the operator pushes to all ready pods
                // in one reconcile; the sim has no push latency).
                if let Some(sp) = decision.worker_set_point
                    && sp != set_point
                {
                    set_point = sp;
                    for &i in &fleet.order {
                        let c = &mut fleet.pods[i as usize].controller;
                        let current = c.settings().clone();
                        c.reconfigure(
                            now,
                            Settings {
                                set_point,
                                ..current
                            },
                        );
                    }
                }
                if let (Some(p), Some(g)) = (producers.as_mut(), decision.producers.as_ref()) {
                    p.set_gate(Gate::from_state(g.state, g.rate));
                    producer_state = g.state;
                    if let Some(message) = &g.event {
                        producer_log.push(ProducerLog {
                            t,
                            state: g.state,
                            rate: g.rate,
                            message: message.clone(),
                        });
                    }
                }
                let target = decision.desired;
                if target != desired || decision.action.is_some_and(|a| a != Action::None) {
                    decisions.push(DecisionLog {
                        t,
                        from: desired,
                        decision,
                    });
                }
                if target != desired {
                    // Scale: add pods, or terminate the newest (not-ready first).
                    let active = fleet.active();
                    if target > active {
                        for _ in active..target {
                            new_pod(&mut fleet, tick + startup, set_point);
                            events += 1;
                        }
                    } else {
                        let mut excess = active - target;
                        for pass in 0..2 {
                            for j in (0..fleet.order.len()).rev() {
                                if excess == 0 {
                                    break;
                                }
                                let i = fleet.order[j] as usize;
                                let p = &mut fleet.pods[i];
                                let not_ready = p.ready_at > tick;
                                if !p.terminating && (pass == 1 || not_ready) {
                                    p.terminating = true;
                                    excess -= 1;
                                }
                            }
                        }
                    }
                    desired = target;
                }
            }

            // Per-second sample.
            if (tick + 1) % ticks_per_sec == 0 {
                let mut ready = 0u32;
                let mut backoff = 0.0;
                let mut throttled = 0u32;
                for &i in &fleet.order {
                    let p = &fleet.pods[i as usize];
                    if p.terminating || p.ready_at > tick {
                        continue;
                    }
                    ready += 1;
                    backoff += p.controller.backoff(now);
                    // A pod ramping up after its start is not throttled (its backoff is 0 and it
                    // is not reacting to failures); a pod below maxPermits otherwise is.
                    if p.controller.limit(now) < max_permits
                        && p.controller.mode() != controller::Mode::Starting
                    {
                        throttled += 1;
                    }
                }
                sec.queue_age = (queue.oldest_first_attempt_age(tick) as f64 * dt) as f32;
                sec.depth = queue.depth();
                sec.in_flight = in_flight_total as u32;
                sec.desired = desired;
                sec.ready = ready;
                sec.pods = fleet.order.len() as u32;
                sec.backoff = if ready > 0 {
                    (backoff / f64::from(ready)) as f32
                } else {
                    0.0
                };
                sec.capacity = (capacity_sum / ticks_per_sec as f64) as f32;
                sec.throttled = throttled;
                sec.regime = regime;
                sec.produced_total = queue.produced;
                sec.completed_total = queue.completed;
                sec.dead_lettered_total = queue.dead_lettered;
                sec.broker_rejected = (queue.rejected - rejected_before) as u32;
                rejected_before = queue.rejected;
                if let Some(p) = &producers {
                    sec.producer_backlog = p.backlog();
                    sec.producer_state = Some(producer_state);
                }
                failed_attempts += u64::from(sec.failures);
                samples.push(sec);
                sec = Sample::default();
                capacity_sum = 0.0;
            }
        }
        failed_attempts += u64::from(sec.failures);

        Ok(RunOutput {
            policy: self.policy,
            autoscaler: autoscaler.name(),
            samples,
            decisions,
            produced: queue.produced,
            completed: queue.completed,
            dead_lettered: queue.dead_lettered,
            attempts,
            failed_attempts,
            queued_at_end: queue.depth(),
            in_flight_at_end: in_flight_total,
            first_wait: queue.first_wait.clone(),
            tick: dt,
            events,
            demanded: producers
                .as_ref()
                .map_or(queue.produced + queue.rejected, |p| p.demanded),
            broker_rejected: queue.rejected,
            lost_to_broker: if producers.is_some() {
                0
            } else {
                queue.rejected
            },
            producer_control: producers.is_some(),
            peak_depth,
            peak_stored,
            peak_producer_backlog,
            producer_backlog_at_end: producers.as_ref().map_or(0, Producers::backlog),
            end_to_end: queue.end_to_end.clone(),
            producer_log,
        })
    }

    /// What Prometheus holds at `tick`: gauges now, rates over the last `window` seconds.
    #[allow(clippy::too_many_arguments)]
    fn scrape(
        &self,
        fleet: &Fleet,
        queue: &Queue,
        samples: &[Sample],
        tick: u64,
        now: Nanos,
        dt: f64,
        window: usize,
    ) -> Observation {
        let mut ready = 0u32;
        let mut backoff = 0.0;
        let (mut floor, mut knowing) = (0.0, 0u32);
        for &i in &fleet.order {
            let p = &fleet.pods[i as usize];
            if !p.terminating && p.ready_at <= tick {
                ready += 1;
                backoff += p.controller.backoff(now);
                if let Some(f) = p.controller.floor_estimate() {
                    floor += f;
                    knowing += 1;
                }
            }
        }
        let from = samples.len().saturating_sub(window);
        let recent = &samples[from..];
        let secs = recent.len() as f64;
        let sum =
            |f: fn(&Sample) -> u32| -> f64 { recent.iter().map(|x| f64::from(f(x))).sum::<f64>() };
        let (arr, comp, att, fail) = (
            sum(|x| x.arrivals),
            sum(|x| x.completed),
            sum(|x| x.attempts),
            sum(|x| x.failures),
        );
        let rate = |x: f64| (secs > 0.0).then(|| x / secs);
        Observation {
            now: tick as f64 * dt,
            replicas: 0,
            ready_pods: ready,
            status_replicas: fleet.active(),
            backoff: (ready > 0).then(|| backoff / f64::from(ready)),
            failure_rate: (att > 0.0).then(|| fail / att),
            queue_age: Some(queue.oldest_first_attempt_age(tick) as f64 * dt),
            queue_depth: Some(queue.depth() as f64),
            arrival_rate: rate(arr),
            completion_rate: rate(comp),
            failure_floor: (knowing > 0).then(|| floor / f64::from(knowing)),
            sampled_at: tick as f64 * dt,
            undelivered: Some(queue.undelivered()),
            scrape_failed: false,
        }
    }
}
