/**
 * Timing of probes while fully backed off: exponentially growing, jittered intervals (a port
 * of `crates/worker/src/controller/probe.rs`).
 */

import { type Nanos, SplitMix64, U64_MAX, addNanos, asUint } from "./common.js";

/**
 * When the next probe may go out. Intervals start at `initial`, double after each failed probe
 * up to `max`, and each wait is the interval times a jitter factor drawn from `U[0.5, 1)`.
 */
export class ProbeSchedule {
  private initial: Nanos;
  private max: Nanos;
  private currentInterval: Nanos;
  private nextAtNs: Nanos = 0;
  private readonly rng: SplitMix64;

  constructor(initial: Nanos, max: Nanos, seed: bigint | number) {
    this.initial = initial;
    this.max = max;
    this.currentInterval = initial;
    this.rng = new SplitMix64(seed);
  }

  /** Entering full backoff: the first probe after a jittered initial interval. */
  start(now: Nanos): void {
    this.currentInterval = this.initial;
    this.schedule(now);
  }

  /** Whether a probe may go out at `now`. */
  due(now: Nanos): boolean {
    return now >= this.nextAtNs;
  }

  /** The time the next probe becomes due. */
  nextAt(): Nanos {
    return this.nextAtNs;
  }

  /** The current (un-jittered) interval. */
  interval(): Nanos {
    return this.currentInterval;
  }

  /** A probe failed: double the interval (up to the maximum) and wait. */
  failed(now: Nanos): void {
    this.currentInterval = Math.min(Math.min(this.currentInterval * 2, U64_MAX), this.max);
    this.schedule(now);
  }

  /** Waits one current interval again without growing it (a health check was started). */
  hold(now: Nanos): void {
    this.schedule(now);
  }

  /** A probe succeeded: allow the next one now and reset the interval. */
  reset(now: Nanos): void {
    this.currentInterval = this.initial;
    this.nextAtNs = now;
  }

  /** Allows the next probe now, keeping the interval. */
  allowNow(now: Nanos): void {
    this.nextAtNs = now;
  }

  /** New bounds at runtime; the current interval is clamped into them. */
  setBounds(initial: Nanos, max: Nanos): void {
    this.initial = initial;
    this.max = max;
    // Rust's `u64::clamp(initial, max)` (max >= initial after sanitizing).
    this.currentInterval = Math.min(Math.max(this.currentInterval, initial), max);
  }

  private schedule(now: Nanos): void {
    const jitter = 0.5 + 0.5 * this.rng.nextF64();
    const wait = asUint(this.currentInterval * jitter, U64_MAX);
    this.nextAtNs = addNanos(now, Math.max(wait, 1));
  }
}
