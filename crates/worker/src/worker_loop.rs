//! A worker loop for the common case: poll a [`Source`] with the permits the [`Gate`] allows,
//! process each message with a [`Handler`], record its outcome, ack or nack it.
//!
//! Every message a poll returns is processed and finished, also during shutdown: shutdown stops
//! new polls (a poll in progress is not cancelled) and waits for the messages in flight.
//! A successful message is acked; a failed one (dependency or message failure) is nacked so the
//! queue redelivers it and, after its maximum attempts, dead-letters it.
//!
//! # Redelivery backoff
//!
//! By default the loop follows the redelivery backoff of the gate's settings
//! ([`crate::controller::Settings::redelivery`]: the operator's `spec.worker.redelivery`, 1 min
//! doubling to 8 min unless set, what `docs/sim/report.md` measures);
//! [`WorkerLoop::redelivery_backoff`] and [`WorkerLoop::no_redelivery_backoff`] fix it instead.
//! With a backoff, a message that failed on its `k`-th receive is
//! nacked with a delay of `base · 2^(k-1)` (capped at `max`) through [`Source::nack_after`]
//! (SQS: `ChangeMessageVisibility` to the delay instead of waiting out the visibility timeout),
//! when the source reports the receive count ([`Source::receive_count`]; SQS:
//! `ApproximateReceiveCount`). Without it, a message's `maxReceives` deliveries all fall within
//! `(maxReceives - 1) ×` the visibility timeout, and one dependency incident longer than that
//! can dead-letter messages however little the worker sends; with `base` = the visibility
//! timeout and 5 receives, the deliveries spread over `1 + 2 + 4 + 8 = 15` timeouts instead of
//! 4. The cost: a message that fails for a reason of its own reaches the DLQ later.
//!
//! [`MemorySource`] is an in-memory queue with redelivery and a dead-letter list, for examples
//! and tests.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::controller::Outcome;
use crate::permits::Gate;

/// Where messages come from.
pub trait Source: Send + Sync + 'static {
    /// A received message (with whatever the source needs to ack it).
    type Message: Send + 'static;
    /// A source error (the queue itself failing; never counted as a dependency failure).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Receives up to `max` messages; may wait a bounded time and return none.
    ///
    /// `max` is the worker's free permits (never a fixed batch), so a source that returns at
    /// most `max` and buffers nothing ahead keeps the messages a worker holds unacknowledged
    /// within its permits, and a held worker (no permits) fetches nothing: the backlog stays in
    /// the broker. Ask the broker for exactly `max`: Redis Streams `XREADGROUP COUNT max`, SQS
    /// `MaxNumberOfMessages = min(max, 10)`, RabbitMQ `basic.get` or a `basic.qos` prefetch no
    /// larger than the permits, not a client-side prefetch buffer.
    fn poll(
        &self,
        max: u32,
    ) -> impl Future<Output = Result<Vec<Self::Message>, Self::Error>> + Send;

    /// The message was processed: remove it from the queue.
    fn ack(&self, message: Self::Message) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The message failed: make it available again (or dead-letter it).
    fn nack(&self, message: Self::Message) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// How many times `message` has been received, this delivery included (1 on the first), if
    /// the source knows (SQS: `ApproximateReceiveCount`). Needed for
    /// [`WorkerLoop::redelivery_backoff`]; the default knows nothing.
    fn receive_count(&self, message: &Self::Message) -> Option<u32> {
        let _ = message;
        None
    }

    /// The message failed: make it available again no earlier than `delay` from now (SQS:
    /// `ChangeMessageVisibility(VisibilityTimeout = delay)`), or dead-letter it. The default
    /// ignores the delay and calls [`Source::nack`].
    fn nack_after(
        &self,
        message: Self::Message,
        delay: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = delay;
        self.nack(message)
    }
}

/// A redelivery delay growing with the receive count: `base · 2^(receives - 1)`, at most `max`.
/// See the [module docs](self#redelivery-backoff).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedeliveryBackoff {
    /// The delay after a failed first delivery (typically the queue's visibility timeout).
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl RedeliveryBackoff {
    /// The delay before the next delivery of a message whose `receives`-th delivery failed
    /// (`receives` of 0 is treated as 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use backpressure_worker::worker_loop::RedeliveryBackoff;
    ///
    /// let b = RedeliveryBackoff { base: Duration::from_secs(30), max: Duration::from_secs(240) };
    /// let delays: Vec<u64> = (1..=6).map(|k| b.delay(k).as_secs()).collect();
    /// assert_eq!(delays, [30, 60, 120, 240, 240, 240]);
    /// ```
    pub fn delay(&self, receives: u32) -> Duration {
        let doublings = receives.max(1) - 1;
        let factor = 1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX);
        self.base
            .saturating_mul(factor)
            .min(self.max.max(self.base))
    }
}

/// Processes one message.
pub trait Handler<M>: Send + Sync + 'static {
    /// Processes `message` and classifies the result.
    fn handle(&self, message: &M) -> impl Future<Output = Outcome> + Send;
}

/// Counters of a finished [`WorkerLoop::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Polls made.
    pub polls: u64,
    /// Polls that returned nothing.
    pub empty_polls: u64,
    /// Polls that failed.
    pub poll_errors: u64,
    /// Messages received.
    pub received: u64,
    /// Outcomes by [`Outcome::index`].
    pub outcomes: [u64; 3],
    /// Acks or nacks that failed.
    pub settle_errors: u64,
}

#[derive(Default)]
struct Counters {
    outcomes: [AtomicU64; 3],
    settle_errors: AtomicU64,
}

/// The loop. See the module docs.
pub struct WorkerLoop<S, H> {
    source: Arc<S>,
    handler: Arc<H>,
    gate: Gate,
    max_batch: u32,
    poll_error_pause: Duration,
    redelivery: Redelivery,
}

/// Where the loop's redelivery backoff comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Redelivery {
    /// The gate's settings in force at each poll (pushed by the operator).
    FromSettings,
    /// Fixed by the application (`None`: nack plainly).
    Fixed(Option<RedeliveryBackoff>),
}

impl<S, H> fmt::Debug for WorkerLoop<S, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerLoop")
            .field("gate", &self.gate)
            .field("max_batch", &self.max_batch)
            .field("redelivery", &self.redelivery)
            .finish_non_exhaustive()
    }
}

impl<S, H> WorkerLoop<S, H>
where
    S: Source,
    H: Handler<S::Message>,
{
    /// A loop polling `source` for at most 10 messages at a time.
    pub fn new(source: Arc<S>, handler: Arc<H>, gate: Gate) -> Self {
        WorkerLoop {
            source,
            handler,
            gate,
            max_batch: 10,
            poll_error_pause: Duration::from_secs(1),
            redelivery: Redelivery::FromSettings,
        }
    }

    /// Nacks failed messages with a delay growing with their receive count (see the
    /// [module docs](self#redelivery-backoff)). Messages whose receive count the source does
    /// not know are nacked plainly.
    /// Overrides the redelivery backoff of the gate's settings (which the operator's payload
    /// may change).
    pub fn redelivery_backoff(mut self, backoff: RedeliveryBackoff) -> Self {
        self.redelivery = Redelivery::Fixed(Some(backoff));
        self
    }

    /// Nacks failed messages plainly (the queue's visibility timeout decides when they come
    /// back), whatever the gate's settings say.
    pub fn no_redelivery_backoff(mut self) -> Self {
        self.redelivery = Redelivery::Fixed(None);
        self
    }

    /// The redelivery backoff in force now.
    fn current_redelivery(&self) -> Option<RedeliveryBackoff> {
        match self.redelivery {
            Redelivery::Fixed(b) => b,
            Redelivery::FromSettings => {
                self.gate
                    .settings()
                    .redelivery
                    .map(|(base, max)| RedeliveryBackoff {
                        base: base.as_duration(),
                        max: max.as_duration(),
                    })
            }
        }
    }

    /// The most messages asked for in one poll (at least 1).
    pub fn max_batch(mut self, n: u32) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// The pause after a failed poll.
    pub fn poll_error_pause(mut self, pause: Duration) -> Self {
        self.poll_error_pause = pause;
        self
    }

    /// Runs until `shutdown` resolves, then waits for the messages in flight.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> LoopStats {
        tokio::pin!(shutdown);
        let counters = Arc::new(Counters::default());
        let mut stats = LoopStats::default();
        let mut tasks = JoinSet::new();
        loop {
            let mut permit = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                p = self.gate.acquire(self.max_batch) => p,
            };
            stats.polls += 1;
            let messages = match self.source.poll(permit.granted()).await {
                Ok(m) => m,
                Err(e) => {
                    stats.poll_errors += 1;
                    drop(permit);
                    tracing::warn!(error = %e, "poll failed");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        _ = tokio::time::sleep(self.poll_error_pause) => continue,
                    }
                }
            };
            if messages.is_empty() {
                stats.empty_polls += 1;
            }
            stats.received += messages.len() as u64;
            let redelivery = if messages.is_empty() {
                None
            } else {
                self.current_redelivery()
            };
            for message in messages {
                let slot = permit.start();
                let source = self.source.clone();
                let handler = self.handler.clone();
                let counters = counters.clone();
                tasks.spawn(async move {
                    let outcome = handler.handle(&message).await;
                    let delay = redelivery
                        .zip(source.receive_count(&message))
                        .map(|(b, k)| b.delay(k));
                    let settled = match (outcome, delay) {
                        (Outcome::Success, _) => source.ack(message).await,
                        (_, Some(delay)) => source.nack_after(message, delay).await,
                        (_, None) => source.nack(message).await,
                    };
                    if let Err(e) = settled {
                        counters.settle_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "ack/nack failed");
                    }
                    counters.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
                    slot.finish(outcome);
                });
            }
            // Unused permits (an empty or short poll) go back here.
            drop(permit);
            while let Some(done) = tasks.try_join_next() {
                if let Err(e) = done {
                    tracing::error!(error = %e, "message task failed");
                }
            }
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                tracing::error!(error = %e, "message task failed");
            }
        }
        for (i, c) in counters.outcomes.iter().enumerate() {
            stats.outcomes[i] = c.load(Ordering::Relaxed);
        }
        stats.settle_errors = counters.settle_errors.load(Ordering::Relaxed);
        stats
    }
}

/// A message of a [`MemorySource`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<M> {
    /// The payload.
    pub body: M,
    /// 1 on the first delivery.
    pub attempt: u32,
}

/// [`MemorySource`] never fails.
#[derive(Debug, thiserror::Error)]
#[error("in-memory source error")]
pub struct MemoryError;

/// An in-memory queue: FIFO, redelivery on nack (at once, or after the delay of
/// [`Source::nack_after`], measured on tokio's clock), dead-letter after `max_attempts`.
pub struct MemorySource<M> {
    queue: Mutex<VecDeque<Delivery<M>>>,
    /// Nacked with a delay: visible again at the instant, in nack order.
    delayed: Mutex<Vec<(tokio::time::Instant, Delivery<M>)>>,
    dead: Mutex<Vec<Delivery<M>>>,
    arrived: Notify,
    max_attempts: u32,
    poll_wait: Duration,
    acked: AtomicU64,
    in_flight: AtomicU64,
}

impl<M: Send + 'static> fmt::Debug for MemorySource<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("depth", &self.depth())
            .field("acked", &self.acked())
            .field("dead_letters", &self.dead_letter_count())
            .finish_non_exhaustive()
    }
}

impl<M: Send + 'static> MemorySource<M> {
    /// An empty queue that dead-letters a message after `max_attempts` failed deliveries and
    /// whose polls wait up to `poll_wait` for a message.
    pub fn new(max_attempts: u32, poll_wait: Duration) -> Self {
        MemorySource {
            queue: Mutex::new(VecDeque::new()),
            delayed: Mutex::new(Vec::new()),
            dead: Mutex::new(Vec::new()),
            arrived: Notify::new(),
            max_attempts: max_attempts.max(1),
            poll_wait,
            acked: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Delivery<M>>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues a message.
    pub fn push(&self, body: M) {
        self.queue().push_back(Delivery { body, attempt: 0 });
        self.arrived.notify_one();
    }

    fn delayed(&self) -> std::sync::MutexGuard<'_, Vec<(tokio::time::Instant, Delivery<M>)>> {
        self.delayed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Messages waiting (visible, or nacked with a delay that has not passed).
    pub fn depth(&self) -> usize {
        self.queue().len() + self.delayed().len()
    }

    /// Messages received and not yet acked or nacked.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Messages acked.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Messages dead-lettered.
    pub fn dead_letter_count(&self) -> usize {
        self.dead.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn take(&self, max: u32) -> Vec<Delivery<M>> {
        let now = tokio::time::Instant::now();
        let due: Vec<Delivery<M>> = {
            let mut delayed = self.delayed();
            let (due, later): (Vec<_>, Vec<_>) = delayed.drain(..).partition(|(at, _)| *at <= now);
            *delayed = later;
            due.into_iter().map(|(_, d)| d).collect()
        };
        let mut q = self.queue();
        // Redeliveries that came due join the queue's tail, like an immediate nack would.
        q.extend(due);
        let n = q.len().min(max as usize);
        let out: Vec<_> = q
            .drain(..n)
            .map(|mut d| {
                d.attempt += 1;
                d
            })
            .collect();
        self.in_flight
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }
}

impl<M: Send + 'static> Source for MemorySource<M> {
    type Message = Delivery<M>;
    type Error = MemoryError;

    async fn poll(&self, max: u32) -> Result<Vec<Delivery<M>>, MemoryError> {
        let got = self.take(max);
        if !got.is_empty() || self.poll_wait.is_zero() {
            return Ok(got);
        }
        let _ = tokio::time::timeout(self.poll_wait, self.arrived.notified()).await;
        Ok(self.take(max))
    }

    async fn ack(&self, _message: Delivery<M>) -> Result<(), MemoryError> {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.acked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn nack(&self, message: Delivery<M>) -> Result<(), MemoryError> {
        self.nack_after(message, Duration::ZERO).await
    }

    fn receive_count(&self, message: &Delivery<M>) -> Option<u32> {
        Some(message.attempt)
    }

    async fn nack_after(&self, message: Delivery<M>, delay: Duration) -> Result<(), MemoryError> {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if message.attempt >= self.max_attempts {
            self.dead
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(message);
        } else if delay.is_zero() {
            self.queue().push_back(message);
            self.arrived.notify_one();
        } else {
            let at = tokio::time::Instant::now() + delay;
            self.delayed().push((at, message));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::controller::{self, Mode, Nanos, Settings};

    /// A dependency that fails while `down` is set, with a small processing time.
    struct Dependency {
        down: std::sync::atomic::AtomicBool,
        concurrent: AtomicU32,
        peak: AtomicU32,
    }

    impl Handler<Delivery<u32>> for Dependency {
        async fn handle(&self, message: &Delivery<u32>) -> Outcome {
            let now = self.concurrent.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.concurrent.fetch_sub(1, Ordering::SeqCst);
            if message.body % 50 == 7 {
                Outcome::MessageFailure
            } else if self.down.load(Ordering::SeqCst) {
                Outcome::DependencyFailure
            } else {
                Outcome::Success
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn processes_everything_backs_off_in_an_outage_and_loses_nothing() {
        let source = Arc::new(MemorySource::new(5, Duration::from_millis(100)));
        let total = 2_000u32;
        for i in 0..total {
            source.push(i);
        }
        let dep = Arc::new(Dependency {
            down: true.into(),
            concurrent: AtomicU32::new(0),
            peak: AtomicU32::new(0),
        });
        let gate = Gate::new(controller::build(Settings::steady(), 3));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let worker = WorkerLoop::new(source.clone(), dep.clone(), gate.clone())
            .max_batch(4)
            .no_redelivery_backoff();
        let run = tokio::spawn(worker.run(async move {
            let _ = stop_rx.await;
        }));
        // An outage: the worker backs off fully and only probes.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(gate.snapshot().mode, Mode::Probing);
        assert!(dep.peak.load(Ordering::SeqCst) <= 16);
        let dead_during_outage = source.dead_letter_count();
        // Recovery: everything left is processed.
        dep.down.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(600), async {
            while source.depth() > 0 || source.in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("drained after recovery");
        stop_tx.send(()).unwrap();
        let stats = run.await.unwrap();
        let dead = source.dead_letter_count() as u64;
        assert_eq!(
            source.acked() + dead,
            u64::from(total),
            "every message acked or dead-lettered"
        );
        // Only poison messages (every 50th) reach the DLQ, plus any probe casualties.
        let poison = (0..total).filter(|i| i % 50 == 7).count() as u64;
        assert!(
            dead >= poison && dead <= poison + dead_during_outage as u64 + 2,
            "{dead}"
        );
        assert_eq!(stats.received, stats.outcomes.iter().sum::<u64>());
        assert_eq!(gate.snapshot().in_flight, 0);
        assert_eq!(gate.snapshot().limit, 16, "back to full permits");
        // During the outage a handful of failures, not thousands.
        assert!(stats.outcomes[1] < 200, "{stats:?}");
    }

    /// Fails every delivery and records when each one started.
    struct AlwaysFails(Mutex<Vec<(u32, tokio::time::Instant)>>);

    impl Handler<Delivery<u32>> for AlwaysFails {
        async fn handle(&self, message: &Delivery<u32>) -> Outcome {
            self.0
                .lock()
                .unwrap()
                .push((message.attempt, tokio::time::Instant::now()));
            Outcome::MessageFailure
        }
    }

    #[tokio::test(start_paused = true)]
    async fn redelivery_backoff_spreads_the_receives_of_a_failing_message() {
        let source = Arc::new(MemorySource::new(5, Duration::from_millis(10)));
        source.push(1);
        let handler = Arc::new(AlwaysFails(Mutex::new(Vec::new())));
        let gate = Gate::new(controller::build(Settings::steady(), 3));
        let backoff = RedeliveryBackoff {
            base: Duration::from_secs(30),
            max: Duration::from_secs(100),
        };
        let worker =
            WorkerLoop::new(source.clone(), handler.clone(), gate).redelivery_backoff(backoff);
        worker
            .run(tokio::time::sleep(Duration::from_secs(600)))
            .await;
        let seen = handler.0.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        // Gaps of 30, 60, 100 (capped), 100 s, each at most a poll wait and a tick late.
        for (i, want) in [30u64, 60, 100, 100].into_iter().enumerate() {
            let gap = seen[i + 1].1 - seen[i].1;
            assert!(
                gap >= Duration::from_secs(want) && gap < Duration::from_secs(want + 1),
                "gap {i}: {gap:?}"
            );
        }
        assert_eq!(source.dead_letter_count(), 1);
        assert_eq!(source.depth(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn by_default_the_loop_follows_the_redelivery_backoff_of_the_settings() {
        assert_eq!(
            Settings::default().redelivery,
            Some((Nanos::from_secs(60), Nanos::from_secs(480))),
            "the default is what docs/sim/report.md measures"
        );
        let source = Arc::new(MemorySource::new(4, Duration::from_millis(10)));
        source.push(1);
        let handler = Arc::new(AlwaysFails(Mutex::new(Vec::new())));
        // As a pushed payload's `redelivery: {baseMs: 20000, maxMs: 50000}` sets it.
        let cfg = backpressure_api::wire::WorkerConfig {
            redelivery: Some(backpressure_api::wire::RedeliveryConfig {
                base_ms: 20_000,
                max_ms: 50_000,
            }),
            ..Default::default()
        };
        let gate = Gate::new(controller::build(
            Settings {
                initial_permits: 0,
                ..Settings::from_config(&cfg)
            },
            3,
        ));
        let worker = WorkerLoop::new(source.clone(), handler.clone(), gate);
        worker
            .run(tokio::time::sleep(Duration::from_secs(600)))
            .await;
        let seen = handler.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 4);
        for (i, want) in [20u64, 40, 50].into_iter().enumerate() {
            let gap = seen[i + 1].1 - seen[i].1;
            assert!(
                gap >= Duration::from_secs(want) && gap < Duration::from_secs(want + 1),
                "gap {i}: {gap:?}"
            );
        }
        assert_eq!(source.dead_letter_count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_redelivery_backoff_a_failed_message_is_back_at_once() {
        let source = Arc::new(MemorySource::new(3, Duration::from_millis(10)));
        source.push(1);
        let handler = Arc::new(AlwaysFails(Mutex::new(Vec::new())));
        let gate = Gate::new(controller::build(Settings::steady(), 3));
        let worker = WorkerLoop::new(source.clone(), handler.clone(), gate).no_redelivery_backoff();
        worker.run(tokio::time::sleep(Duration::from_secs(1))).await;
        let seen = handler.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        assert!(seen[2].1 - seen[0].1 < Duration::from_secs(1));
        assert_eq!(source.dead_letter_count(), 1);
    }

    /// A [`MemorySource`] that counts what it has handed out and not had back.
    struct Tracking {
        inner: MemorySource<u32>,
        outstanding: AtomicU32,
        peak: AtomicU32,
        largest_ask: AtomicU32,
        polls: AtomicU32,
    }

    impl Source for Tracking {
        type Message = Delivery<u32>;
        type Error = MemoryError;

        async fn poll(&self, max: u32) -> Result<Vec<Delivery<u32>>, MemoryError> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            self.largest_ask.fetch_max(max, Ordering::SeqCst);
            let got = self.inner.poll(max).await?;
            let n = got.len() as u32;
            let now = self.outstanding.fetch_add(n, Ordering::SeqCst) + n;
            self.peak.fetch_max(now, Ordering::SeqCst);
            Ok(got)
        }

        async fn ack(&self, message: Delivery<u32>) -> Result<(), MemoryError> {
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
            self.inner.ack(message).await
        }

        async fn nack(&self, message: Delivery<u32>) -> Result<(), MemoryError> {
            self.outstanding.fetch_sub(1, Ordering::SeqCst);
            self.inner.nack(message).await
        }
    }

    struct Slow;

    impl Handler<Delivery<u32>> for Slow {
        async fn handle(&self, _message: &Delivery<u32>) -> Outcome {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Outcome::Success
        }
    }

    /// Issue 17, item 4: the loop asks its source for the free permits, not a fixed batch, so a
    /// worker never holds more unacknowledged messages than its permits (Redis `COUNT`, SQS
    /// `MaxNumberOfMessages`), and a held worker (brake at 1) polls nothing: the backlog stays
    /// in the queue, not in the worker's memory.
    #[tokio::test(start_paused = true)]
    async fn a_worker_never_holds_more_unacknowledged_messages_than_its_permits() {
        let source = Arc::new(Tracking {
            inner: MemorySource::new(5, Duration::from_millis(10)),
            outstanding: AtomicU32::new(0),
            peak: AtomicU32::new(0),
            largest_ask: AtomicU32::new(0),
            polls: AtomicU32::new(0),
        });
        for i in 0..1000 {
            source.inner.push(i);
        }
        let settings = Settings {
            algorithm: controller::Algorithm::Fixed,
            max_permits: 4,
            ..Settings::steady()
        };
        let gate = Gate::new(controller::build(settings.clone(), 1));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let worker = WorkerLoop::new(source.clone(), Arc::new(Slow), gate.clone()).max_batch(100);
        let run = tokio::spawn(worker.run(async move {
            let _ = stop_rx.await;
        }));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(source.peak.load(Ordering::SeqCst), 4);
        assert_eq!(
            source.largest_ask.load(Ordering::SeqCst),
            4,
            "asked for a batch, not the permits"
        );
        // Held: the brake takes every permit; what is in flight finishes and nothing more is
        // fetched.
        let brake = backpressure_api::wire::BrakeConfig {
            min_backoff: 1.0,
            expires_at_unix: None,
        };
        gate.apply(settings, Some(&brake), 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(source.outstanding.load(Ordering::SeqCst), 0);
        let (polls, depth) = (source.polls.load(Ordering::SeqCst), source.inner.depth());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            source.polls.load(Ordering::SeqCst),
            polls,
            "a held worker polled"
        );
        assert_eq!(source.inner.depth(), depth);
        assert!(depth > 900, "{depth}");
        stop_tx.send(()).unwrap();
        run.await.unwrap();
        assert_eq!(source.peak.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_messages_in_flight() {
        let source = Arc::new(MemorySource::new(5, Duration::from_millis(10)));
        for i in 0..8 {
            source.push(i);
        }
        let dep = Arc::new(Dependency {
            down: false.into(),
            concurrent: AtomicU32::new(0),
            peak: AtomicU32::new(0),
        });
        let gate = Gate::new(controller::build(Settings::steady(), 3));
        let worker = WorkerLoop::new(source.clone(), dep, gate.clone());
        let stats = worker
            .run(tokio::time::sleep(Duration::from_millis(1)))
            .await;
        // Everything received was finished: acked, or nacked back into the queue.
        assert_eq!(stats.received, stats.outcomes.iter().sum::<u64>());
        assert_eq!(
            source.acked() + source.depth() as u64 + source.dead_letter_count() as u64,
            8
        );
        assert!(stats.received >= 1);
        assert_eq!(source.in_flight(), 0);
        assert_eq!(gate.snapshot().in_flight, 0);
    }
}
