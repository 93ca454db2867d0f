/**
 * The concurrency gate a worker passes before each poll (a port of
 * `crates/worker/src/permits.rs`), around one controller, with the real monotonic clock.
 *
 * `acquire(max)` waits until the controller allows at least one more message and returns a
 * `PollPermit` for up to that many. A permit is only the right to poll: each message the poll
 * returns is started with `permit.start()`, which always succeeds (a message that has been
 * received is never dropped), and finished with `message.finish(outcome)`. Call
 * `permit.release()` once the poll has returned: the permits it did not use go back, so an
 * empty poll that used a probe grant gives it back instead of leaving the worker at zero.
 *
 * Node runs JavaScript on one thread: every method runs to completion, so the gate's state
 * needs no lock; waiting is done with promises and timers, never by blocking.
 */

import type { BrakeConfig } from "./wire.js";
import {
  Brake,
  type Controller,
  type Mode,
  type Nanos,
  type Outcome,
  type Settings,
  U64_MAX,
  applySettings,
  asUint,
} from "./controller/index.js";
import type { Logger } from "./log.js";
import { defaultLogger } from "./log.js";
import type { Metrics } from "./metrics.js";

/** Upper bound on one wait, so that a missed wake-up can never stall a worker for long (ms). */
const MAX_WAIT_MS = 1000;

/** Monotonic time for controllers, in integer nanoseconds since an epoch. */
export interface Clock {
  now(): Nanos;
}

/** The process's monotonic clock (`process.hrtime`), nanoseconds since the clock was made. */
export class MonotonicClock implements Clock {
  private readonly origin = process.hrtime.bigint();

  now(): Nanos {
    return Number(process.hrtime.bigint() - this.origin);
  }
}

/** A cheap health check that replaces message probes while fully backed off. */
export type HealthCheck = () => Promise<boolean>;

/** A point-in-time view of the gate. */
export interface Snapshot {
  /** Backoff factor in `[0, 1]`. */
  backoff: number;
  /** Allowed concurrency now. */
  limit: number;
  /** Messages being processed. */
  inFlight: number;
  /** Permits handed out for polls that have not returned yet. */
  reserved: number;
  /** Controller mode. */
  mode: Mode;
  /** The failure floor the controller learned: null until it has tested for one. */
  failureFloor: number | null;
}

/** Options of a `Gate`. */
export interface GateOptions {
  /** Metrics to keep up to date. */
  metrics?: Metrics;
  /** Runs this instead of message probes when the controller asks (`healthCheckProbes`). */
  healthCheck?: HealthCheck;
  /** Seed for controllers built when the algorithm changes at runtime. Default 0. */
  seed?: bigint | number;
  /**
   * This pod's share of the brake's lift offset, in `[0, 1)` (the offset is this times
   * `brakeRelease / 2`). Default: random per process, so that pods lift at different moments.
   */
  brakeJitter?: number;
  /** The clock (default: the monotonic clock). */
  clock?: Clock;
  /** Where warnings go. */
  logger?: Logger;
}

/** The shared concurrency gate. */
export class Gate {
  private controller: Controller;
  private inFlight = 0;
  private reserved = 0;
  private brake: Brake | null = null;
  private readonly seed: bigint | number;
  private readonly brakeJitter: number;
  private readonly waiters = new Set<() => void>();
  readonly clock: Clock;
  readonly metrics: Metrics | undefined;
  private readonly healthCheck: HealthCheck | undefined;
  private readonly logger: Logger;

  constructor(controller: Controller, options: GateOptions = {}) {
    this.controller = controller;
    this.metrics = options.metrics;
    this.healthCheck = options.healthCheck;
    this.seed = options.seed ?? 0;
    const jitter = options.brakeJitter ?? Math.random();
    this.brakeJitter = Number.isFinite(jitter) ? Math.min(Math.max(jitter, 0), 1) : 0;
    this.clock = options.clock ?? new MonotonicClock();
    this.logger = options.logger ?? defaultLogger;
    this.publish();
  }

  /** The current state. */
  snapshot(): Snapshot {
    const now = this.clock.now();
    return {
      backoff: this.controller.backoff(now),
      limit: this.controller.limit(now),
      inFlight: this.inFlight,
      reserved: this.reserved,
      mode: this.controller.mode(),
      failureFloor: this.controller.floorEstimate(),
    };
  }

  /** The settings in force. */
  settings(): Settings {
    return this.controller.settings();
  }

  /** Grants up to `max` permits without waiting, if the controller allows any now. */
  tryAcquire(max: number): PollPermit | null {
    const p = this.grant(this.clock.now(), max);
    if (p !== null) this.publish();
    return p;
  }

  private grant(now: Nanos, max: number): PollPermit | null {
    if (max <= 0) return null;
    const busy = this.inFlight + this.reserved;
    const allowed = Math.min(this.controller.permits(now, busy), max);
    if (allowed === 0) return null;
    const probe = this.controller.mode() === "probing";
    this.reserved += allowed;
    return new PollPermit(this, allowed, probe);
  }

  /**
   * Waits until the controller allows at least one message and grants up to `max` (0 is
   * treated as 1). With `signal`, rejects with the signal's reason when it aborts.
   */
  async acquire(max = 1, signal?: AbortSignal): Promise<PollPermit> {
    const want = Math.max(Math.floor(max), 1);
    for (;;) {
      signal?.throwIfAborted();
      const now = this.clock.now();
      const p = this.grant(now, want);
      if (p !== null) {
        this.publish();
        return p;
      }
      if (this.healthCheck !== undefined && this.controller.healthCheckDue(now)) {
        await this.runHealthCheck(this.healthCheck);
        continue;
      }
      const wakeAt = this.controller.nextChange(now);
      const waitMs =
        wakeAt === null ? MAX_WAIT_MS : Math.min(Math.ceil((wakeAt - now) / 1e6), MAX_WAIT_MS);
      await this.sleep(Math.max(waitMs, 1), signal);
    }
  }

  /** Sleeps `ms` or until the gate changes (a message finished, a permit came back, a config). */
  private sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.waiters.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  private async runHealthCheck(check: HealthCheck): Promise<void> {
    this.metrics?.recordProbe();
    let healthy: boolean;
    try {
      healthy = await check();
    } catch (e) {
      this.logger.warn("health check threw; counted as unhealthy", { error: String(e) });
      healthy = false;
    }
    this.logger.debug("backpressure health check", { healthy });
    this.controller.recordHealthCheck(this.clock.now(), healthy);
    this.publish();
  }

  /**
   * Applies new controller settings and brake at runtime: reconfigures (or rebuilds, when the
   * algorithm changes) and lets a lowered or removed brake lift gently over
   * `settings.brakeRelease`. `nowUnix` (seconds) converts the brake's expiry.
   */
  apply(settings: Settings, brake: BrakeConfig | null, nowUnix: number): void {
    const now = this.clock.now();
    const next = brake === null ? null : Brake.fromWire(brake, now, nowUnix);
    const release = settings.brakeRelease;
    // Offset in [0, release / 2): pods lift at different moments.
    const offset = asUint(release * 0.5 * this.brakeJitter, U64_MAX);
    this.brake = Brake.succeed(this.brake, next, now, release, offset);
    this.controller = applySettings(this.controller, now, settings, this.seed, this.brake);
    this.publish();
    this.wake();
  }

  private publish(): void {
    if (this.metrics === undefined) return;
    const s = this.snapshot();
    this.metrics.setBackoff(s.backoff);
    // NaN until tested: a fresh pod must not read as "no floor" (0) and pull the fleet's mean
    // floor down before it has learned anything.
    this.metrics.setFailureFloor(s.failureFloor);
    this.metrics.setPermits(s.limit);
    this.metrics.setInFlight(s.inFlight);
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }

  /** @internal Permits of a poll that were not used. */
  releaseUnused(unused: number): void {
    this.reserved -= unused;
    this.controller.releaseUnused(this.clock.now(), unused);
    this.wake();
  }

  /** @internal A received message starts (`fromGrant`: it used one of the poll's permits). */
  started(fromGrant: boolean, probe: boolean): void {
    if (fromGrant) {
      this.reserved -= 1;
    } else {
      this.logger.warn("source returned more messages than permitted; processing anyway");
    }
    this.inFlight += 1;
    if (this.metrics !== undefined) {
      if (probe) this.metrics.recordProbe();
      this.metrics.setInFlight(this.inFlight);
    }
  }

  /** @internal A message finished, with its outcome (or none: not recorded). */
  finished(outcome: Outcome | null): void {
    const now = this.clock.now();
    this.inFlight -= 1;
    if (outcome !== null) this.controller.record(now, outcome);
    const m = this.metrics;
    if (m !== undefined) {
      if (outcome !== null) m.recordOutcome(outcome);
      m.setBackoff(this.controller.backoff(now));
      m.setFailureFloor(this.controller.floorEstimate());
      m.setPermits(this.controller.limit(now));
      m.setInFlight(this.inFlight);
    }
    this.wake();
  }
}

/** The right to poll for up to `granted` messages. Call `release()` when the poll returned. */
export class PollPermit {
  private remaining: number;

  /** @internal */
  constructor(
    private readonly gate: Gate,
    /** How many messages to poll for. */
    readonly granted: number,
    /** Whether this is a probe (the controller is fully backed off). */
    readonly isProbe: boolean,
  ) {
    this.remaining = granted;
  }

  /**
   * Starts processing one received message. Always succeeds: a message beyond the grant (a
   * source that returned more than asked) is processed too, over the limit.
   */
  start(): InFlight {
    const fromGrant = this.remaining > 0;
    if (fromGrant) this.remaining -= 1;
    this.gate.started(fromGrant, this.isProbe);
    return new InFlight(this.gate);
  }

  /** Gives back the permits no message came back for. Idempotent. */
  release(): void {
    if (this.remaining > 0) {
      const unused = this.remaining;
      this.remaining = 0;
      this.gate.releaseUnused(unused);
    }
  }
}

/** A message being processed. Finish it with its outcome. */
export class InFlight {
  private done = false;

  /** @internal */
  constructor(private readonly gate: Gate) {}

  /** Records the outcome and frees the slot. Later calls do nothing. */
  finish(outcome: Outcome): void {
    if (this.done) return;
    this.done = true;
    this.gate.finished(outcome);
  }

  /** Frees the slot without recording an outcome (the handler crashed). Later calls do nothing. */
  abandon(): void {
    if (this.done) return;
    this.done = true;
    this.gate.finished(null);
  }
}
