//! The async concurrency gate a worker passes before each poll.
//!
//! A [`Gate`] shares one [`Controller`] between the poll loop and the tasks processing
//! messages. [`Gate::acquire`] waits (on tokio primitives: a [`Notify`] and a timer) until the
//! controller allows at least one more message and returns a [`PollPermit`] for up to that
//! many. A permit is only the right to poll: each message the poll returns is started with
//! [`PollPermit::start`], which always succeeds, even past the grant (a message that has been
//! received is never dropped), and finished with [`InFlight::finish`], which records its
//! outcome. Permits the poll did not use go back when the [`PollPermit`] is dropped, so an
//! empty poll that used a probe grant gives it back instead of leaving the worker at zero.
//!
//! ```
//! use backpressure_worker::controller::{self, Outcome};
//! use backpressure_worker::permits::Gate;
//! use backpressure_api::wire::WorkerConfig;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let gate = Gate::new(controller::from_config(&WorkerConfig::default(), 1));
//! let mut permit = gate.acquire(10).await; // poll for up to permit.granted() messages
//! assert_eq!(permit.granted(), 2); // a fresh worker ramps up from 2 permits (startup ramp)
//! let message = permit.start(); // one message came back
//! drop(permit); // the other permit goes back
//! message.finish(Outcome::Success);
//! assert_eq!(gate.snapshot().in_flight, 0);
//! # });
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use backpressure_api::wire::BrakeConfig;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::controller::{self, Brake, Controller, Mode, Nanos, Outcome, Settings};
use crate::metrics::Metrics;

/// Upper bound on one wait, so that a missed wake-up can never stall a worker for long.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// A cheap health check that replaces message probes while fully backed off (see
/// [`Settings::health_check_probes`]).
pub trait HealthCheck: Send + Sync {
    /// Whether the dependency looks healthy.
    fn check(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>>;
}

/// Monotonic time for controllers: nanoseconds since the gate was created, from tokio's clock
/// (so tests with a paused clock are deterministic).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Time since the epoch.
    pub fn now(&self) -> Nanos {
        Nanos::from_duration(self.origin.elapsed())
    }

    /// The tokio instant of a controller time.
    pub fn instant(&self, t: Nanos) -> Instant {
        self.origin + t.as_duration()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A point-in-time view of the gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Snapshot {
    /// Backoff factor in `[0, 1]`.
    pub backoff: f64,
    /// Allowed concurrency now.
    pub limit: u32,
    /// Messages being processed.
    pub in_flight: u32,
    /// Permits handed out for polls that have not returned yet.
    pub reserved: u32,
    /// Controller mode.
    pub mode: Mode,
    /// The failure floor the controller learned: `None` until it has tested for one (see
    /// [`Controller::floor_estimate`]).
    pub failure_floor: Option<f64>,
}

struct State {
    controller: Box<dyn Controller>,
    in_flight: u32,
    reserved: u32,
    /// Tasks waiting in `acquire`; notifications are skipped when there are none.
    waiting: u32,
    seed: u64,
    brake: Option<Brake>,
    /// This pod's share of the brake's lift offset, in `[0, 1)` (see [`Brake#lifting-gently`]).
    brake_jitter: f64,
}

struct Inner {
    state: Mutex<State>,
    changed: Notify,
    clock: Clock,
    metrics: Option<Metrics>,
    health_check: Option<Arc<dyn HealthCheck>>,
}

/// The shared concurrency gate. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate around `controller`, without metrics or health check.
    pub fn new(controller: Box<dyn Controller>) -> Self {
        GateBuilder::new(controller).build()
    }

    /// A builder for a gate with metrics and/or a health check.
    pub fn builder(controller: Box<dyn Controller>) -> GateBuilder {
        GateBuilder::new(controller)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind; keep going.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The gate's clock.
    pub fn clock(&self) -> Clock {
        self.inner.clock
    }

    /// The current state.
    pub fn snapshot(&self) -> Snapshot {
        let now = self.inner.clock.now();
        let st = self.lock();
        Snapshot {
            backoff: st.controller.backoff(now),
            limit: st.controller.limit(now),
            in_flight: st.in_flight,
            reserved: st.reserved,
            mode: st.controller.mode(),
            failure_floor: st.controller.floor_estimate(),
        }
    }

    /// Grants up to `max` permits without waiting, if the controller allows any now.
    pub fn try_acquire(&self, max: u32) -> Option<PollPermit> {
        let now = self.inner.clock.now();
        let mut st = self.lock();
        self.grant(&mut st, now, max)
    }

    fn grant(&self, st: &mut State, now: Nanos, max: u32) -> Option<PollPermit> {
        if max == 0 {
            return None;
        }
        let busy = st.in_flight + st.reserved;
        let allowed = st.controller.permits(now, busy).min(max);
        if allowed == 0 {
            return None;
        }
        let probe = st.controller.mode() == Mode::Probing;
        st.reserved += allowed;
        Some(PollPermit {
            gate: self.clone(),
            remaining: allowed,
            granted: allowed,
            probe,
        })
    }

    /// Waits until the controller allows at least one message and grants up to `max`.
    /// `max` of 0 is treated as 1.
    pub async fn acquire(&self, max: u32) -> PollPermit {
        let max = max.max(1);
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = self.inner.clock.now();
            let (wake_at, health_check) = {
                let mut st = self.lock();
                if let Some(p) = self.grant(&mut st, now, max) {
                    drop(st);
                    self.publish();
                    return p;
                }
                let hc = self.inner.health_check.is_some() && st.controller.health_check_due(now);
                st.waiting += 1;
                (st.controller.next_change(now), hc)
            };
            if health_check {
                self.run_health_check().await;
            } else {
                let deadline = wake_at
                    .map(|t| self.inner.clock.instant(t))
                    .unwrap_or_else(|| Instant::now() + MAX_WAIT)
                    .min(Instant::now() + MAX_WAIT);
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
            self.lock().waiting -= 1;
        }
    }

    async fn run_health_check(&self) {
        let Some(hc) = self.inner.health_check.clone() else {
            return;
        };
        if let Some(m) = &self.inner.metrics {
            m.record_probe();
        }
        let healthy = hc.check().await;
        tracing::debug!(healthy, "backpressure health check");
        let now = self.inner.clock.now();
        self.lock().controller.record_health_check(now, healthy);
        self.publish();
    }

    /// Applies new controller settings and brake at runtime (see
    /// [`controller::apply_settings`]). `now_unix` converts the brake's expiry. A brake that
    /// is lowered or removed lifts gently over `settings.brake_release`, as one that expires
    /// (see [`Brake#lifting-gently`]).
    pub fn apply(&self, settings: Settings, brake: Option<&BrakeConfig>, now_unix: i64) {
        let now = self.inner.clock.now();
        {
            let mut st = self.lock();
            let new = brake.map(|b| Brake::from_wire(b, now, now_unix));
            let release = settings.brake_release;
            // Offset in [0, release / 2): pods lift at different moments.
            let offset = Nanos((release.0 as f64 * 0.5 * st.brake_jitter) as u64);
            let brake = Brake::succeed(st.brake.as_ref(), new, now, release, offset);
            st.brake = brake;
            let seed = st.seed;
            controller::apply_settings(&mut st.controller, now, settings, seed, brake);
        }
        self.publish();
        self.wake();
    }

    /// The settings in force.
    pub fn settings(&self) -> Settings {
        self.lock().controller.settings().clone()
    }

    /// Updates the gauges.
    fn publish(&self) {
        if let Some(m) = &self.inner.metrics {
            let snap = self.snapshot();
            m.set_backoff(snap.backoff);
            // NaN until tested: a fresh pod must not read as "no floor" (0) and pull the
            // fleet's mean floor down before it has learned anything.
            m.set_failure_floor(snap.failure_floor);
            m.set_permits(snap.limit);
            m.set_in_flight(snap.in_flight);
        }
    }

    fn wake(&self) {
        self.inner.changed.notify_waiters();
    }

    fn release(&self, unused: u32) {
        let now = self.inner.clock.now();
        let waiting = {
            let mut st = self.lock();
            st.reserved -= unused;
            st.controller.release_unused(now, unused);
            st.waiting
        };
        if waiting > 0 {
            self.wake();
        }
    }

    fn finish(&self, outcome: Option<Outcome>) {
        let now = self.inner.clock.now();
        let (waiting, backoff, floor, limit, in_flight) = {
            let mut st = self.lock();
            st.in_flight -= 1;
            if let Some(o) = outcome {
                st.controller.record(now, o);
            }
            (
                st.waiting,
                st.controller.backoff(now),
                st.controller.floor_estimate(),
                st.controller.limit(now),
                st.in_flight,
            )
        };
        if let Some(m) = &self.inner.metrics {
            if let Some(o) = outcome {
                m.record_outcome(o);
            }
            m.set_backoff(backoff);
            m.set_failure_floor(floor);
            m.set_permits(limit);
            m.set_in_flight(in_flight);
        }
        if waiting > 0 {
            self.wake();
        }
    }
}

/// A number in `[0, 1)` that differs between processes: std's per-process random hash keys
/// (no dependency on a random number crate), mixed with `seed`.
fn process_random_share(seed: u64) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seed);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Builds a [`Gate`].
pub struct GateBuilder {
    controller: Box<dyn Controller>,
    metrics: Option<Metrics>,
    health_check: Option<Arc<dyn HealthCheck>>,
    seed: u64,
    brake_jitter: Option<f64>,
}

impl fmt::Debug for GateBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateBuilder")
            .field("controller", &self.controller)
            .field("metrics", &self.metrics.is_some())
            .field("health_check", &self.health_check.is_some())
            .finish()
    }
}

impl GateBuilder {
    fn new(controller: Box<dyn Controller>) -> Self {
        GateBuilder {
            controller,
            metrics: None,
            health_check: None,
            seed: 0,
            brake_jitter: None,
        }
    }

    /// Updates these metrics.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs this health check instead of message probes when the controller asks for one.
    pub fn health_check(mut self, check: Arc<dyn HealthCheck>) -> Self {
        self.health_check = Some(check);
        self
    }

    /// Seed for controllers created when the algorithm changes at runtime.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// This pod's share of the brake's lift offset, in `[0, 1)` (the offset is this times
    /// `brake_release / 2`; see [`Brake#lifting-gently`]). By default it is random per process
    /// (mixed with [`GateBuilder::seed`]), so that pods started with the same seed still lift
    /// at different moments; set it for a deterministic test.
    pub fn brake_jitter(mut self, share: f64) -> Self {
        self.brake_jitter = Some(if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            0.0
        });
        self
    }

    /// The gate.
    pub fn build(self) -> Gate {
        let brake_jitter = self
            .brake_jitter
            .unwrap_or_else(|| process_random_share(self.seed));
        let gate = Gate {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    controller: self.controller,
                    in_flight: 0,
                    reserved: 0,
                    waiting: 0,
                    seed: self.seed,
                    brake: None,
                    brake_jitter,
                }),
                changed: Notify::new(),
                clock: Clock::new(),
                metrics: self.metrics,
                health_check: self.health_check,
            }),
        };
        gate.publish();
        gate
    }
}

/// The right to poll for up to [`PollPermit::granted`] messages. Unused permits go back when it
/// is dropped.
#[must_use = "poll with the permit, then start each received message"]
pub struct PollPermit {
    gate: Gate,
    remaining: u32,
    granted: u32,
    probe: bool,
}

impl fmt::Debug for PollPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PollPermit")
            .field("granted", &self.granted)
            .field("remaining", &self.remaining)
            .field("probe", &self.probe)
            .finish()
    }
}

impl PollPermit {
    /// How many messages to poll for.
    pub fn granted(&self) -> u32 {
        self.granted
    }

    /// Whether this is a probe (the controller is fully backed off).
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Starts processing one received message. Always succeeds: a message beyond the grant
    /// (a source that returned more than asked) is processed too, over the limit.
    pub fn start(&mut self) -> InFlight {
        let in_flight = {
            let mut st = self.gate.lock();
            if self.remaining > 0 {
                self.remaining -= 1;
                st.reserved -= 1;
            } else {
                tracing::warn!("source returned more messages than permitted; processing anyway");
            }
            st.in_flight += 1;
            st.in_flight
        };
        if let Some(m) = &self.gate.inner.metrics {
            if self.probe {
                m.record_probe();
            }
            m.set_in_flight(in_flight);
        }
        InFlight {
            gate: Some(self.gate.clone()),
        }
    }
}

impl Drop for PollPermit {
    fn drop(&mut self) {
        if self.remaining > 0 {
            self.gate.release(self.remaining);
            self.remaining = 0;
        }
    }
}

/// A message being processed. Finish it with its outcome.
#[must_use = "finish the message with its outcome"]
pub struct InFlight {
    gate: Option<Gate>,
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl InFlight {
    /// Records the outcome and frees the slot.
    pub fn finish(mut self, outcome: Outcome) {
        if let Some(gate) = self.gate.take() {
            gate.finish(Some(outcome));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            // Dropped without an outcome (a panic in the handler): free the slot, record nothing.
            tracing::warn!("message finished without an outcome; not recorded");
            gate.finish(None);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use backpressure_api::wire::WorkerConfig;

    use super::*;
    use crate::controller::Algorithm;

    fn plain_settings() -> Settings {
        Settings {
            credit: 0.0,
            ..Settings::steady()
        }
    }

    fn back_off(gate: &Gate) {
        for _ in 0..40 {
            let mut p = gate.try_acquire(1).expect("permit while backing off");
            let m = p.start();
            drop(p);
            m.finish(Outcome::DependencyFailure);
            if gate.snapshot().mode == Mode::Probing {
                return;
            }
        }
        panic!("did not back off: {gate:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn grants_follow_the_controller_and_unused_permits_return() {
        let gate = Gate::new(controller::build(plain_settings(), 1));
        let mut p = gate.acquire(100).await;
        assert_eq!(p.granted(), 16);
        assert!(gate.try_acquire(1).is_none(), "all reserved");
        let a = p.start();
        let b = p.start();
        drop(p);
        let s = gate.snapshot();
        assert_eq!((s.in_flight, s.reserved), (2, 0));
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 14);
        a.finish(Outcome::Success);
        b.finish(Outcome::DependencyFailure);
        assert_eq!(gate.snapshot().in_flight, 0);
        assert_eq!(gate.snapshot().limit, 15);
    }

    /// Regression test: fully backed off, a probe permit used by a poll that comes back empty
    /// is returned, so the worker gets the next probe instead of staying at zero permits.
    #[tokio::test(start_paused = true)]
    async fn probe_permit_used_by_an_empty_poll_is_returned() {
        for algorithm in [Algorithm::SetPoint, Algorithm::RatioThrottle] {
            let gate = Gate::new(controller::build(
                Settings {
                    algorithm,
                    ..plain_settings()
                },
                7,
            ));
            back_off(&gate);
            assert!(gate.try_acquire(1).is_none());
            for _ in 0..20 {
                let p = tokio::time::timeout(Duration::from_secs(5), gate.acquire(10))
                    .await
                    .expect("a probe permit within the probe interval");
                assert!(p.is_probe());
                assert_eq!(p.granted(), 1);
                drop(p); // the poll came back empty
                let s = gate.snapshot();
                assert_eq!((s.reserved, s.in_flight), (0, 0), "{algorithm:?}");
            }
            // A message finally arrives and succeeds: the gate leaves full backoff.
            let mut p = gate.acquire(10).await;
            let m = p.start();
            drop(p);
            m.finish(Outcome::Success);
            assert!(gate.snapshot().limit >= 1, "{algorithm:?} {gate:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_a_finished_message() {
        let gate = Gate::new(controller::build(
            Settings {
                max_permits: 1,
                ..plain_settings()
            },
            1,
        ));
        let mut p = gate.acquire(1).await;
        let m = p.start();
        drop(p);
        let g2 = gate.clone();
        let waiter = tokio::spawn(async move { g2.acquire(1).await.granted() });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        m.finish(Outcome::Success);
        assert_eq!(waiter.await.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn messages_beyond_the_grant_are_still_processed() {
        let gate = Gate::new(controller::build(
            Settings {
                max_permits: 2,
                ..plain_settings()
            },
            1,
        ));
        let mut p = gate.acquire(2).await;
        let started: Vec<_> = (0..3).map(|_| p.start()).collect();
        drop(p);
        assert_eq!(gate.snapshot().in_flight, 3);
        for m in started {
            m.finish(Outcome::Success);
        }
        let s = gate.snapshot();
        assert_eq!((s.in_flight, s.reserved), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_follow_the_gate() {
        let metrics = Metrics::new("w");
        let gate = Gate::builder(controller::build(plain_settings(), 1))
            .metrics(metrics.clone())
            .build();
        // A fresh gate has not tested for a floor: NaN, not 0 ("tested, none").
        let text = metrics.encode();
        assert!(
            text.contains(r#"backpressure_failure_floor{workload="w"} NaN"#),
            "{text}"
        );
        let mut p = gate.acquire(4).await;
        let m = p.start();
        drop(p);
        let text = metrics.encode();
        assert!(
            text.contains(r#"backpressure_in_flight{workload="w"} 1"#),
            "{text}"
        );
        m.finish(Outcome::DependencyFailure);
        assert_eq!(metrics.outcome_count(Outcome::DependencyFailure), 1);
        let text = metrics.encode();
        assert!(
            text.contains(r#"backpressure_permits{workload="w"} 15"#),
            "{text}"
        );
        assert!(
            text.contains(r#"backpressure_backoff_factor{workload="w"} 0.05"#),
            "{text}"
        );
        back_off(&gate);
        let mut p = gate.acquire(1).await;
        assert!(p.is_probe());
        p.start().finish(Outcome::Success);
        assert_eq!(metrics.probe_count(), 1);
    }

    struct Check {
        healthy_after: u32,
        calls: AtomicU32,
        running: AtomicBool,
    }

    impl HealthCheck for Check {
        fn check(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
            Box::pin(async move {
                assert!(!self.running.swap(true, Ordering::SeqCst));
                tokio::time::sleep(Duration::from_millis(10)).await;
                self.running.store(false, Ordering::SeqCst);
                self.calls.fetch_add(1, Ordering::SeqCst) + 1 >= self.healthy_after
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn health_check_replaces_message_probes() {
        let check = Arc::new(Check {
            healthy_after: 3,
            calls: AtomicU32::new(0),
            running: AtomicBool::new(false),
        });
        let gate = Gate::builder(controller::build(
            Settings {
                health_check_probes: true,
                ..plain_settings()
            },
            1,
        ))
        .health_check(check.clone())
        .build();
        back_off(&gate);
        let p = tokio::time::timeout(Duration::from_secs(600), gate.acquire(10))
            .await
            .unwrap();
        assert!(!p.is_probe(), "a normal grant after the healthy check");
        assert_eq!(p.granted(), 2, "slow start");
        assert_eq!(check.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn apply_changes_settings_and_brake_at_runtime() {
        // Offset: 0.5 × brake_release / 2 = 15 s.
        let gate = Gate::builder(controller::build(Settings::steady(), 1))
            .brake_jitter(0.5)
            .build();
        let cfg = WorkerConfig {
            max_permits: 4,
            ..WorkerConfig::default()
        };
        let settings = Settings::from_config(&cfg);
        assert_eq!(settings.brake_release, Nanos::from_secs(60));
        gate.apply(
            settings.clone(),
            Some(&BrakeConfig {
                min_backoff: 0.5,
                expires_at_unix: Some(1_000 + 30),
            }),
            1_000,
        );
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 2);
        // Expired at 30 s: this pod holds the level for its offset, then it falls by 1 per
        // minute (0.5 → 0 in 30 s): 2, 3, then 4 permits, not 2 → 4 in one step.
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 2);
        tokio::time::advance(Duration::from_secs(29)).await; // 60 s: level 0.25
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 3);
        tokio::time::advance(Duration::from_secs(15)).await; // 75 s: lifted
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 4);

        // A full brake pushed, then removed: it lifts gently too.
        let full = BrakeConfig {
            min_backoff: 1.0,
            expires_at_unix: None,
        };
        gate.apply(settings.clone(), Some(&full), 1_000);
        assert!(
            gate.try_acquire(100).is_none(),
            "a full brake stops everything"
        );
        gate.apply(settings.clone(), None, 1_000);
        assert!(
            gate.try_acquire(100).is_none(),
            "removed: still held for the offset"
        );
        // The same (empty) configuration pushed again does not restart the lift.
        tokio::time::advance(Duration::from_secs(30)).await; // 15 s into the fall: 0.75
        gate.apply(settings.clone(), None, 1_000);
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 1);
        tokio::time::advance(Duration::from_secs(30)).await; // 0.25
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 3);
        tokio::time::advance(Duration::from_secs(15)).await;
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 4);

        // brake_release 0: the old behaviour, one step.
        let instant = Settings {
            brake_release: Nanos::ZERO,
            ..settings.clone()
        };
        gate.apply(instant.clone(), Some(&full), 1_000);
        assert!(gate.try_acquire(100).is_none());
        gate.apply(instant, None, 1_000);
        assert_eq!(gate.try_acquire(100).unwrap().granted(), 4);

        gate.apply(
            Settings {
                algorithm: Algorithm::Off,
                ..settings
            },
            None,
            1_000,
        );
        assert_eq!(gate.settings().algorithm, Algorithm::Off);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_up_as_the_brake_lifts() {
        let gate = Gate::builder(controller::build(Settings::steady(), 1))
            .brake_jitter(0.0)
            .build();
        let settings = Settings::steady();
        let full = BrakeConfig {
            min_backoff: 1.0,
            expires_at_unix: Some(1_000 + 10),
        };
        gate.apply(settings, Some(&full), 1_000);
        let start = Instant::now();
        let p = tokio::time::timeout(Duration::from_secs(120), gate.acquire(100))
            .await
            .unwrap();
        // 16 permits, lifting over 60 s from 10 s: the first permit after 10 + 60/16 s.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(13_700) && waited <= Duration::from_secs(15),
            "{waited:?}"
        );
        assert_eq!(p.granted(), 1, "one permit, not sixteen");
    }
}
