//! The producer gate: what a producer pod passes before every send, so that the operator can
//! pause or throttle the workload that feeds a queue (`spec.producers` of a
//! WorkerBackpressure) while the queue is above its high watermark.
//!
//! A [`ProducerGate`] runs one [`ProducerConfig`] (the producer side of the wire contract,
//! [`backpressure_api::wire::ProducerConfig`]), [`GateState::Open`] until the first document
//! arrives. Documents come as for the worker config: pushed to `PUT`
//! [`PRODUCER_PATH`](backpressure_api::wire::PRODUCER_PATH) on the admin server
//! ([`crate::config::admin::Admin::for_producer`] or
//! [`Admin::with_producer`](crate::config::admin::Admin::with_producer), authenticated exactly as
//! `/v1/config`), or read from the mounted file
//! [`PRODUCER_FILE_NAME`](backpressure_api::wire::PRODUCER_FILE_NAME) by a
//! [`FileWatcher`](crate::config::FileWatcher). The ordering rules are the worker config's (the
//! same code): an older generation is refused (409), the same hash and generation is a no-op,
//! a generation far ahead of the clock is refused (400).
//!
//! Two ways to pass the gate:
//!
//! - [`ProducerGate::admit`] waits until the message is admitted. While `Paused` (or throttled to
//!   a rate of 0) it sleeps until the next document arrives (woken by it, never polling); while
//!   `Throttled` it sleeps until the token bucket has a token. Waiting callers are admitted in
//!   the order they started waiting. For producers that can hold their caller (a batch job, a
//!   consumer of an upstream queue: the upstream queue holds the backlog instead).
//! - [`ProducerGate::try_admit`] answers at once: [`Admission::Admitted`] or
//!   [`Admission::RetryAfter`] (the document's `retryAfterMs` while paused, the time until the
//!   next token while throttled). For producers that answer their own clients, for example
//!   with HTTP 429 and a `Retry-After` header.
//!
//! # The lease
//!
//! A `Paused` or `Throttled` document from the operator carries `expiresAtUnix`, renewed while
//! the restriction holds. When it passes without a newer document the gate opens by itself (a
//! warning is logged and the state metric says `Open`): an operator that is gone never leaves
//! its producers paused. A refused caller is never told to wait past the end of the lease.
//!
//! # The gate never drops a message
//!
//! There is no shedding inside the gate: a message is either admitted, or its caller waits, or
//! its caller is told when to try again. A producer that decides to shed (drop, or answer its
//! client with an error instead of a retry-after) does so itself after a
//! [`Admission::RetryAfter`], and owns that loss; the gate's metrics count it as refused, not
//! lost.
//!
//! # Throttled: the token bucket
//!
//! `ratePerSecond` tokens a second, at most `max(ratePerSecond, 1)` held (one second of tokens,
//! and at least one so that a rate below one per second still admits one message every
//! `1 / ratePerSecond` seconds); one token per message. Entering `Throttled` starts the bucket
//! with one token; a new rate while throttled keeps the tokens (refilled at the old rate up to
//! the change, then capped at the new size). Over any interval of `t` seconds the gate admits
//! at most `ratePerSecond · t + max(ratePerSecond, 1)` messages.
//!
//! Time is tokio's ([`tokio::time::Instant`]), so tests run with a paused clock;
//! [`ProducerGate::try_admit_at`] takes the instant explicitly.
//!
//! ```
//! use std::time::Duration;
//!
//! use backpressure_api::wire::{GateState, ProducerConfig};
//! use backpressure_worker::config::Origin;
//! use backpressure_worker::metrics::Metrics;
//! use backpressure_worker::producer::{Admission, ProducerGate};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let gate = ProducerGate::new(Some(Metrics::producer("orders-api")));
//! gate.admit().await; // Open: at once
//! let paused = ProducerConfig {
//!     generation: 1,
//!     state: GateState::Paused,
//!     retry_after_ms: 5000,
//!     ..ProducerConfig::default()
//! }
//! .with_hash();
//! gate.apply(paused, Origin::Push).unwrap();
//! // An HTTP producer answers 429 with Retry-After: 5.
//! assert_eq!(gate.try_admit(), Admission::RetryAfter(Duration::from_secs(5)));
//! # });
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::wire::{
    ConfigAck, GateState, MAX_GENERATION_LEAD_MS, MAX_RETRY_AFTER_MS, ProducerConfig,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{Apply, ApplyError, Document, Origin, Versioned, check_generation_lead};
use crate::metrics::Metrics;

/// The answer of [`ProducerGate::try_admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Send the message.
    Admitted,
    /// Do not send it now; try again after this long (at most
    /// [`MAX_RETRY_AFTER_MS`](backpressure_api::wire::MAX_RETRY_AFTER_MS)). The message is not
    /// dropped by the gate: the caller keeps it, or hands the delay back to its own client.
    RetryAfter(Duration),
}

/// The longest single wait or retry-after the gate hands out (the wire contract's largest
/// `retryAfterMs`): a throttle so slow that its next token is further away is asked again then.
const MAX_WAIT: Duration = Duration::from_millis(MAX_RETRY_AFTER_MS);

/// The admission state derived from the running document.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    state: GateState,
    /// Tokens per second (`Throttled` only; 0 admits nothing).
    rate: f64,
    /// The document's `retryAfterMs`.
    retry_after: Duration,
    /// Tokens held at `at`.
    tokens: f64,
    at: Instant,
    /// When the running restriction's lease ends (`expiresAtUnix`), if it has one.
    expires: Option<Instant>,
}

impl Bucket {
    fn open(now: Instant) -> Self {
        Bucket {
            state: GateState::Open,
            rate: 0.0,
            retry_after: Duration::from_millis(ProducerConfig::default().retry_after_ms),
            tokens: 0.0,
            at: now,
            expires: None,
        }
    }

    /// Opens the gate once the restriction's lease has ended; whether it just did.
    fn lapse(&mut self, now: Instant) -> bool {
        match self.expires {
            Some(end) if now >= end && self.state != GateState::Open => {
                self.state = GateState::Open;
                self.expires = None;
                true
            }
            _ => false,
        }
    }

    /// At most one second of tokens, and at least one.
    fn capacity(&self) -> f64 {
        self.rate.max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        if now <= self.at {
            return;
        }
        if self.state == GateState::Throttled {
            let gained = (now - self.at).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + gained).min(self.capacity());
        }
        self.at = now;
    }

    /// Installs `cfg` at `now`, `now_unix` in Unix seconds (see the module docs for what the
    /// tokens and the lease do).
    fn install(&mut self, cfg: &ProducerConfig, now: Instant, now_unix: i64) {
        self.refill(now);
        self.expires = cfg.expires_at_unix.map(|end| {
            let left = u64::try_from(end.saturating_sub(now_unix)).unwrap_or(0);
            now + Duration::from_secs(left)
        });
        let was_throttled = self.state == GateState::Throttled;
        self.state = cfg.state;
        self.rate = cfg.rate_per_second.unwrap_or(0.0).max(0.0);
        self.retry_after = Duration::from_millis(cfg.retry_after_ms.min(MAX_RETRY_AFTER_MS));
        self.tokens = if was_throttled {
            self.tokens.min(self.capacity())
        } else {
            1.0
        };
        self.at = self.at.max(now);
    }

    /// Takes a token at `now` if the state admits.
    fn take(&mut self, now: Instant) -> Admission {
        self.lapse(now);
        // A refused caller is not told to wait past the end of the lease.
        let until_lapse = |d: Duration| {
            self.expires
                .map_or(d, |end| d.min(end.saturating_duration_since(now)))
                .max(Duration::from_millis(1))
        };
        match self.state {
            GateState::Open => Admission::Admitted,
            GateState::Paused => Admission::RetryAfter(until_lapse(self.retry_after)),
            GateState::Throttled if self.rate <= 0.0 => {
                Admission::RetryAfter(until_lapse(self.retry_after))
            }
            GateState::Throttled => {
                self.refill(now);
                // Float sums of small steps fall a hair short of a whole token.
                if self.tokens >= 1.0 - 1e-9 {
                    self.tokens = (self.tokens - 1.0).max(0.0);
                    Admission::Admitted
                } else {
                    let secs = (1.0 - self.tokens) / self.rate;
                    let wait = Duration::try_from_secs_f64(secs).unwrap_or(MAX_WAIT);
                    // Never zero: a caller sleeping zero would spin.
                    Admission::RetryAfter(wait.clamp(Duration::from_millis(1), MAX_WAIT))
                }
            }
        }
    }

    /// Whether only a new document can admit (nothing refills, no lease ends).
    fn waits_for_a_document(&self) -> bool {
        if self.expires.is_some() {
            return false;
        }
        match self.state {
            GateState::Open => false,
            GateState::Paused => true,
            GateState::Throttled => self.rate <= 0.0,
        }
    }
}

struct Inner {
    doc: Versioned<ProducerConfig>,
    bucket: Mutex<Bucket>,
    /// Counts installed documents; [`ProducerGate::admit`] waits on it while paused.
    changed: watch::Sender<u64>,
    /// Callers of [`ProducerGate::admit`] that could not pass at once queue here (tokio's mutex
    /// is fair), so that only the head sleeps on the bucket or the document and waiters are
    /// admitted in order.
    queue: tokio::sync::Mutex<()>,
    metrics: Option<Metrics>,
}

/// The producer gate (see the module docs). Cheap to clone: clones share the gate.
#[derive(Clone)]
pub struct ProducerGate {
    inner: Arc<Inner>,
}

impl fmt::Debug for ProducerGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = *self.bucket();
        f.debug_struct("ProducerGate")
            .field("ack", &self.ack())
            .field("state", &b.state)
            .field("rate", &b.rate)
            .finish_non_exhaustive()
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl ProducerGate {
    /// An open gate (what a producer runs before any document), exporting to `metrics` if
    /// given (a registry with [`crate::metrics::Parts::PRODUCER`], e.g.
    /// [`Metrics::producer`]).
    pub fn new(metrics: Option<Metrics>) -> Self {
        let initial = ProducerConfig::default();
        if let Some(m) = &metrics {
            m.set_producer_state(initial.state, initial.rate_per_second);
        }
        let (changed, _) = watch::channel(0);
        ProducerGate {
            inner: Arc::new(Inner {
                doc: Versioned::new(initial),
                bucket: Mutex::new(Bucket::open(Instant::now())),
                changed,
                queue: tokio::sync::Mutex::new(()),
                metrics,
            }),
        }
    }

    fn bucket(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.inner
            .bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The running document.
    pub fn running(&self) -> ProducerConfig {
        self.inner.doc.running()
    }

    /// The running hash and generation (what `GET /v1/producer` answers).
    pub fn ack(&self) -> ConfigAck {
        self.inner.doc.ack()
    }

    /// Where the running document came from.
    pub fn origin(&self) -> Origin {
        self.inner.doc.origin()
    }

    /// The state in force: the running document's, or `Open` once its lease has ended.
    pub fn state(&self) -> GateState {
        let mut b = self.bucket();
        self.lapse(&mut b, Instant::now());
        b.state
    }

    /// Parses, validates and applies a document.
    pub fn apply_bytes(&self, bytes: &[u8], origin: Origin) -> Result<ConfigAck, ApplyError> {
        let cfg = ProducerConfig::parse(bytes)?;
        self.apply(cfg, origin)
    }

    /// Validates and applies a document (see the module docs). A refused one changes nothing.
    pub fn apply(&self, cfg: ProducerConfig, origin: Origin) -> Result<ConfigAck, ApplyError> {
        self.apply_at(cfg, origin, unix_now())
    }

    /// [`ProducerGate::apply`] with the current Unix time given (for the generation's lead).
    pub fn apply_at(
        &self,
        cfg: ProducerConfig,
        origin: Origin,
        now_unix: i64,
    ) -> Result<ConfigAck, ApplyError> {
        cfg.validate()?;
        check_generation_lead(cfg.generation, now_unix, MAX_GENERATION_LEAD_MS)?;
        self.inner
            .doc
            .apply(cfg, origin, |cfg| self.install(cfg, now_unix))
    }

    fn install(&self, cfg: &ProducerConfig, now_unix: i64) {
        self.bucket().install(cfg, Instant::now(), now_unix);
        if let Some(m) = &self.inner.metrics {
            m.set_producer_state(cfg.state, cfg.rate_per_second);
        }
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Opens the gate if the restriction's lease ended at `now`, and says so in the metrics.
    fn lapse(&self, b: &mut Bucket, now: Instant) {
        if b.lapse(now) {
            tracing::warn!(
                "producer state lease ended without a newer document from the operator: open"
            );
            if let Some(m) = &self.inner.metrics {
                m.set_producer_state(GateState::Open, None);
            }
        }
    }

    /// Admits a message now or says when to try again, counting either (see the module docs).
    pub fn try_admit(&self) -> Admission {
        self.try_admit_at(Instant::now())
    }

    /// [`ProducerGate::try_admit`] at `now` (an instant before the last one counts as the last
    /// one: the bucket never runs backwards).
    pub fn try_admit_at(&self, now: Instant) -> Admission {
        let (admission, state) = self.take(now);
        self.count(admission, state);
        admission
    }

    fn take(&self, now: Instant) -> (Admission, GateState) {
        let mut b = self.bucket();
        self.lapse(&mut b, now);
        (b.take(now), b.state)
    }

    /// Counts `admission`, a refusal under the `state` it was made in.
    fn count(&self, admission: Admission, state: GateState) {
        if let Some(m) = &self.inner.metrics {
            match admission {
                Admission::Admitted => m.record_producer_admitted(),
                Admission::RetryAfter(_) => m.record_producer_refused(state),
            }
        }
    }

    /// Waits until a message is admitted (see the module docs). A call that has to wait is
    /// counted once as refused (in the state it found), then once as admitted. Cancel-safe:
    /// dropping the future admits nothing and takes no token.
    pub async fn admit(&self) {
        let mut changed = self.inner.changed.subscribe();
        let turn = self.inner.queue.try_lock().ok();
        let (first, state) = {
            let mut b = self.bucket();
            // With callers already waiting, a newcomer passes at once only when the gate is
            // open (that takes no token): a token goes to the first waiter.
            self.lapse(&mut b, Instant::now());
            if turn.is_some() || b.state == GateState::Open {
                (b.take(Instant::now()), b.state)
            } else {
                (Admission::RetryAfter(Duration::ZERO), b.state)
            }
        };
        self.count(first, state);
        if first == Admission::Admitted {
            return;
        }
        let _turn = match turn {
            Some(turn) => turn,
            None => self.inner.queue.lock().await,
        };
        loop {
            // Marked seen before looking, so a document installed after the look wakes us.
            changed.borrow_and_update();
            let (admission, state, waits_for_a_document) = {
                let mut b = self.bucket();
                self.lapse(&mut b, Instant::now());
                (b.take(Instant::now()), b.state, b.waits_for_a_document())
            };
            let wait = match admission {
                Admission::Admitted => {
                    self.count(admission, state);
                    return;
                }
                Admission::RetryAfter(wait) => wait,
            };
            if waits_for_a_document {
                // The sender lives as long as `self`: `changed()` only ends on a document.
                let _ = changed.changed().await;
            } else {
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

impl Apply for ProducerGate {
    fn kind(&self) -> &'static str {
        ProducerConfig::KIND
    }

    fn apply_bytes(&self, bytes: &[u8], origin: Origin) -> Result<ConfigAck, ApplyError> {
        ProducerGate::apply_bytes(self, bytes, origin)
    }
}

#[cfg(test)]
mod tests;
