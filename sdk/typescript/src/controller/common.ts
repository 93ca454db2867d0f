/**
 * The pieces every controller shares (a port of `crates/worker/src/controller/mod.rs`): time in
 * integer nanoseconds, outcomes, modes, the operator's brake, the settings, SplitMix64 and the
 * permit arithmetic.
 *
 * Time is a plain `number` of nanoseconds since an epoch the caller picks (monotonic). Rust
 * holds it in a `u64` with saturating arithmetic; a `number` is exact below 2^53 ns (104 days),
 * and the helpers below saturate at 2^64 like Rust where it matters.
 */

import type { Algorithm, BrakeConfig, WorkerConfig } from "../wire.js";
import { defaultWorkerConfigUnhashed, defaults } from "../wire.js";

/** A monotonic timestamp (or a span) in integer nanoseconds. */
export type Nanos = number;

/** 2^64, standing for `u64::MAX` (saturation bound). */
export const U64_MAX = 18446744073709551615;
/** 2^32 - 1. */
export const U32_MAX = 4294967295;

/** `s` seconds as nanoseconds (saturating). */
export function fromSecs(s: number): Nanos {
  return Math.min(s * 1_000_000_000, U64_MAX);
}

/** `ms` milliseconds as nanoseconds (saturating). */
export function fromMillis(ms: number): Nanos {
  return Math.min(ms * 1_000_000, U64_MAX);
}

/** `a + b`, saturating at `u64::MAX`. */
export function addNanos(a: Nanos, b: Nanos): Nanos {
  return Math.min(a + b, U64_MAX);
}

/** `a - b`, or zero if `b` is later. */
export function subNanos(a: Nanos, b: Nanos): Nanos {
  return a > b ? a - b : 0;
}

/** Seconds as a float, as Rust's `Nanos::as_secs_f64` (`ns as f64 / 1e9`). */
export function asSecsF64(ns: Nanos): number {
  return ns / 1e9;
}

/** Integer division of non-negative integers (`u64 / u64`); exact for dividends below 2^53. */
export function idiv(a: number, b: number): number {
  return Math.floor(a / b);
}

/** Rust's `f64 as u64` / `as u32`: truncation toward zero, saturating, NaN to 0. */
export function asUint(x: number, max: number): number {
  if (Number.isNaN(x) || x <= 0) return 0;
  return Math.min(Math.trunc(x), max);
}

/** Rust's `f64::max`: NaN is ignored unless both are NaN. */
export function fmax(a: number, b: number): number {
  if (Number.isNaN(a)) return b;
  if (Number.isNaN(b)) return a;
  return a >= b ? a : b;
}

/** Rust's `f64::min`: NaN is ignored unless both are NaN. */
export function fmin(a: number, b: number): number {
  if (Number.isNaN(a)) return b;
  if (Number.isNaN(b)) return a;
  return a <= b ? a : b;
}

/** Rust's `f64::clamp` (for finite bounds). */
export function fclamp(x: number, lo: number, hi: number): number {
  if (x < lo) return lo;
  if (x > hi) return hi;
  return x;
}

/** The outcome of processing one message; the values are the wire contract's `class` labels. */
export type Outcome = "success" | "dependency_failure" | "message_failure";
/** All outcomes, in the order of the wire contract's classes. */
export const OUTCOMES: readonly Outcome[] = ["success", "dependency_failure", "message_failure"];

/**
 * What a controller is doing:
 * - `normal`: permits follow the backoff factor;
 * - `probing`: fully backed off, one probe at a time on a growing, jittered interval;
 * - `slow_start`: a probe succeeded, permits grow by one per success up to the threshold;
 * - `starting`: a freshly built controller ramps its permits up from `initialPermits`.
 */
export type Mode = "normal" | "probing" | "slow_start" | "starting";

/** Clamps to `[0, 1]`, mapping NaN to 1 (fail safe: a broken computation backs off). */
export function clamp01(x: number): number {
  return Number.isNaN(x) ? 1.0 : fclamp(x, 0.0, 1.0);
}

/**
 * Permits for a backoff: `floor(max * (1 - b))`, with a small tolerance so that `b = 1 - k/max`
 * gives exactly `k`.
 */
export function limitFor(maxPermits: number, backoff: number): number {
  const raw = maxPermits * (1.0 - clamp01(backoff)) + 1e-9;
  return Math.min(asUint(Math.floor(raw), U32_MAX), maxPermits);
}

/** The earliest of two optional times. */
export function earliest(a: Nanos | null, b: Nanos | null): Nanos | null {
  if (a !== null && b !== null) return Math.min(a, b);
  return a ?? b;
}

/** A fall of an earlier brake level: `[level, from when it falls]`. */
export type Fall = readonly [number, Nanos];

/**
 * The operator's emergency brake in controller time: a minimum backoff, optionally until a
 * moment, and how it lifts (see the Rust docs, "Lifting gently": a brake that ends falls
 * linearly by 1 per `release`, after this pod's `offset`). Immutable.
 */
export class Brake {
  /** Minimum backoff in `[0, 1]`. */
  readonly minBackoff: number;
  /** The brake lifts itself at this time, if set. */
  readonly until: Nanos | null;
  /** How long a full brake takes to lift; 0 lifts at once. */
  readonly release: Nanos;
  /** This pod's delay before its level starts to fall. */
  readonly offset: Nanos;
  /** An earlier, higher level still falling. */
  readonly lift: Fall | null;

  constructor(fields: {
    minBackoff?: number;
    until?: Nanos | null;
    release?: Nanos;
    offset?: Nanos;
    lift?: Fall | null;
  }) {
    this.minBackoff = fields.minBackoff ?? 0;
    this.until = fields.until ?? null;
    this.release = fields.release ?? 0;
    this.offset = fields.offset ?? 0;
    this.lift = fields.lift ?? null;
  }

  /**
   * Converts the wire brake (whose expiry is Unix seconds) to controller time, given the
   * current time in both clocks. An expiry already in the past gives an inactive brake.
   */
  static fromWire(brake: BrakeConfig, now: Nanos, nowUnix: number): Brake {
    let until: Nanos | null = null;
    if (brake.expiresAtUnix !== undefined) {
      const ahead = brake.expiresAtUnix - nowUnix;
      until = ahead <= 0 ? now : addNanos(now, fromSecs(ahead));
    }
    return new Brake({ minBackoff: clamp01(brake.minBackoff), until });
  }

  /**
   * The brake that follows `old` when `next` is pushed (`null`: removed) at `now`, lifting
   * gently over `release` with this pod's `offset`. `null` when nothing is left to apply.
   */
  static succeed(
    old: Brake | null,
    next: Brake | null,
    now: Nanos,
    release: Nanos,
    offset: Nanos,
  ): Brake | null {
    const base = next ?? new Brake({});
    let lift: Fall | null = null;
    const candidate = new Brake({
      minBackoff: base.minBackoff,
      until: base.until,
      release,
      offset,
    });
    const newLevel = candidate.steady(now) ?? 0.0;
    if (old !== null) {
      const oldLevel = old.active(now) ?? 0.0;
      if (oldLevel > newLevel) {
        if ((old.steady(now) ?? 0.0) > newLevel) {
          // The old brake itself was in force and now drops.
          lift = [oldLevel, addNanos(now, offset)];
        } else {
          // A fall under way (an earlier drop, or the old expiry): it goes on. Rust's
          // `max_by` keeps the last of equal elements.
          for (const f of [old.lift, old.expiryFall()]) {
            if (f === null) continue;
            if (lift === null || old.fall(f, now) >= old.fall(lift, now)) lift = f;
          }
        }
      }
    }
    const result = new Brake({
      minBackoff: base.minBackoff,
      until: base.until,
      release,
      offset,
      lift,
    });
    const empty = result.minBackoff <= 0.0 && result.until === null && result.lift === null;
    return empty ? null : result;
  }

  /** The level of the brake itself (without any fall): `minBackoff` until it expires. */
  private steady(now: Nanos): number | null {
    if (this.until !== null && now >= this.until) return null;
    return clamp01(this.minBackoff);
  }

  /** The expired brake's own fall, once its expiry has passed. */
  private expiryFall(): Fall | null {
    return this.until === null
      ? null
      : [clamp01(this.minBackoff), addNanos(this.until, this.offset)];
  }

  /** The level of a fall `[from, start]` at `now`. */
  private fall(f: Fall, now: Nanos): number {
    const [from, start] = f;
    if (now < start) return from;
    if (this.release === 0) return 0.0;
    return from - asSecsF64(subNanos(now, start)) / asSecsF64(this.release);
  }

  /** The minimum backoff in force at `now`, if any: the brake's level, or a level still lifting. */
  active(now: Nanos): number | null {
    const levels: number[] = [];
    const steady = this.steady(now);
    if (steady !== null) levels.push(steady);
    if (this.until !== null && now >= this.until) {
      const f = this.expiryFall();
      if (f !== null) levels.push(this.fall(f, now));
    }
    if (this.lift !== null) levels.push(this.fall(this.lift, now));
    if (levels.length === 0) return null;
    let level = levels[0] as number;
    for (const l of levels.slice(1)) level = fmax(level, l);
    return level > 0.0 ? clamp01(level) : null;
  }

  /**
   * The next time after `now` at which the permits cap may rise without a new outcome: the
   * expiry, the start of a fall, or (while falling) when the level has fallen by one permit.
   */
  nextChange(now: Nanos, maxPermits: number): Nanos | null {
    let next: Nanos | null = this.until !== null && this.until > now ? this.until : null;
    const falls = [this.lift, this.until !== null ? this.expiryFall() : null];
    for (const f of falls) {
      if (f === null) continue;
      const start = f[1];
      if (start > now) {
        next = earliest(next, start);
      } else if (this.fall(f, now) > 0.0 && this.release > 0) {
        const step = idiv(this.release, Math.max(maxPermits, 1));
        next = earliest(next, addNanos(now, Math.max(step, 1_000_000)));
      }
    }
    return next;
  }
}

/** The permits cap of an active brake (`maxPermits` without one). */
export function brakeCap(brake: Brake | null, maxPermits: number, now: Nanos): number {
  const min = brake === null ? null : brake.active(now);
  return min === null ? maxPermits : limitFor(maxPermits, min);
}

/** Default `Settings.brakeRelease`: a full brake lifts over a minute. */
export const DEFAULT_BRAKE_RELEASE: Nanos = fromMillis(defaults.BRAKE_RELEASE_MS);
/** Default `Settings.floorMax`. */
export const DEFAULT_FLOOR_MAX = defaults.FLOOR_MAX;
/** Default `Settings.credit`. */
export const DEFAULT_CREDIT = 1.0;
/** Default `Settings.ratioWindow` (grpc-go's adaptive throttler uses 30 s). */
export const DEFAULT_RATIO_WINDOW: Nanos = fromMillis(defaults.RATIO_WINDOW_MS);
/** Default `Settings.initialPermits`: 2, what the simulator measured. */
export const DEFAULT_INITIAL_PERMITS = defaults.INITIAL_PERMITS;
/** Default `Settings.redelivery`: 1 min doubling up to 8 min. */
export const DEFAULT_REDELIVERY: readonly [Nanos, Nanos] = [
  fromMillis(defaults.REDELIVERY_BASE_MS),
  fromMillis(defaults.REDELIVERY_MAX_MS),
];

/** Knobs of every controller: the WorkerConfig fields plus library-side settings. */
export interface Settings {
  /** Which controller. */
  algorithm: Algorithm;
  /** Set point `s` in (0,1): the dependency-failure fraction treated as background noise. */
  setPoint: number;
  /** Reaction size `N`: dependency failures that take the backoff from 0 to 1. */
  reaction: number;
  /** Maximum permits (concurrency) at zero backoff. */
  maxPermits: number;
  /** First probe interval once fully backed off (ns). */
  probeInitial: Nanos;
  /** The probe interval doubles after each failed probe up to this (ns). */
  probeMax: Nanos;
  /** SetPoint only: headroom below zero backoff, in units of one reaction. 0: plain integrator. */
  credit: number;
  /** SetPoint and RatioThrottle: replace message probes with a health check. */
  healthCheckProbes: boolean;
  /** RatioThrottle only: length of the sliding window (ns). */
  ratioWindow: Nanos;
  /** SetPoint only: the permits of a freshly built controller (0 or >= maxPermits: no ramp). */
  initialPermits: number;
  /** How long a full brake takes to lift (ns); 0 lifts in one step. */
  brakeRelease: Nanos;
  /** SetPoint only: the highest failure floor the controller may learn (0: off). */
  floorMax: number;
  /** The redelivery backoff `[base, max]` (ns), or null (the queue's visibility timeout decides). */
  redelivery: readonly [Nanos, Nanos] | null;
}

/** Clamps every field into its valid range (so a controller never divides by zero). Returns a copy. */
export function sanitized(settings: Settings): Settings {
  const s = { ...settings };
  if (!(Number.isFinite(s.setPoint) && s.setPoint > 0.0 && s.setPoint < 1.0)) {
    s.setPoint = s.setPoint >= 1.0 ? 0.99 : 0.0001;
  }
  s.setPoint = fclamp(s.setPoint, 0.0001, 0.99);
  s.reaction = Math.max(s.reaction, 1);
  s.maxPermits = Math.max(s.maxPermits, 1);
  s.probeInitial = Math.max(s.probeInitial, 1);
  s.probeMax = Math.max(s.probeMax, s.probeInitial);
  if (!(Number.isFinite(s.credit) && s.credit >= 0.0)) s.credit = 0.0;
  s.ratioWindow = Math.max(s.ratioWindow, 1_000_000);
  s.floorMax = Number.isFinite(s.floorMax) ? fclamp(s.floorMax, 0.0, defaults.MAX_FLOOR_MAX) : 0.0;
  if (s.redelivery !== null) {
    const [base, max] = s.redelivery;
    s.redelivery = base > 0 ? [base, Math.max(max, base)] : null;
  }
  return s;
}

/**
 * The settings of a (validated) wire configuration, with library defaults for the rest.
 * Out-of-range values are clamped to the nearest valid one.
 */
export function settingsFromConfig(cfg: WorkerConfig): Settings {
  let redelivery: readonly [Nanos, Nanos] | null;
  if (cfg.redelivery === undefined) redelivery = DEFAULT_REDELIVERY;
  else if (cfg.redelivery.baseMs === 0) redelivery = null;
  else redelivery = [fromMillis(cfg.redelivery.baseMs), fromMillis(cfg.redelivery.maxMs)];
  return sanitized({
    algorithm: cfg.algorithm,
    setPoint: cfg.setPoint,
    reaction: cfg.reaction,
    maxPermits: cfg.maxPermits,
    probeInitial: fromMillis(cfg.probeInitialMs),
    probeMax: fromMillis(cfg.probeMaxMs),
    credit: DEFAULT_CREDIT,
    healthCheckProbes: false,
    ratioWindow:
      cfg.ratioWindowMs === undefined ? DEFAULT_RATIO_WINDOW : fromMillis(cfg.ratioWindowMs),
    initialPermits: cfg.initialPermits ?? DEFAULT_INITIAL_PERMITS,
    brakeRelease:
      cfg.brakeReleaseMs === undefined ? DEFAULT_BRAKE_RELEASE : fromMillis(cfg.brakeReleaseMs),
    floorMax: cfg.floorMax ?? DEFAULT_FLOOR_MAX,
    redelivery,
  });
}

/** The default settings: those of the default payload. */
export function defaultSettings(): Settings {
  return settingsFromConfig(defaultWorkerConfigUnhashed());
}

const MASK64 = (1n << 64n) - 1n;

/** SplitMix64: a tiny, seedable generator for probe jitter (bit-exact with the Rust one). */
export class SplitMix64 {
  private state: bigint;

  constructor(seed: bigint | number) {
    this.state = BigInt(seed) & MASK64;
  }

  /** The next 64-bit output. */
  nextU64(): bigint {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
    return z ^ (z >> 31n);
  }

  /** Uniform in [0,1). */
  nextF64(): number {
    return Number(this.nextU64() >> 11n) / 9007199254740992;
  }
}

/**
 * A backpressure controller: plain synchronous, deterministic state that never reads a clock.
 *
 * The calling protocol of a worker:
 * 1. before each poll, `permits(now, inFlight)` where `inFlight` counts messages being
 *    processed *and* permits handed out for polls that have not returned yet;
 * 2. after a poll, `releaseUnused(now, k)` for the `k` permits the poll did not use;
 * 3. after each processed message, `record(now, outcome)`.
 */
export interface Controller {
  /** The algorithm implemented. */
  readonly algorithm: Algorithm;
  /** The settings in force. */
  settings(): Settings;
  /** Records the outcome of one processed message. */
  record(now: Nanos, outcome: Outcome): void;
  /** How many more messages may be taken now, given `inFlight` being processed or polled for. */
  permits(now: Nanos, inFlight: number): number;
  /** Returns `unused` permits of the last grant that no message came back for. */
  releaseUnused(now: Nanos, unused: number): void;
  /** Total concurrency allowed now (the permits gauge); 0 when fully backed off. */
  limit(now: Nanos): number;
  /** The backoff factor in `[0, 1]` (including an active brake). */
  backoff(now: Nanos): number;
  /** The current mode. */
  mode(): Mode;
  /** The failure floor in force (0 when none or not learned). */
  failureFloor(): number;
  /** What this controller knows about its failure floor; null while it has not tested it. */
  floorEstimate(): number | null;
  /** Applies new settings of the same algorithm, keeping the backoff state. */
  reconfigure(now: Nanos, settings: Settings): void;
  /** Sets or clears the operator's brake. */
  setBrake(brake: Brake | null): void;
  /** The earliest future time at which `permits` may grant more without a new outcome. */
  nextChange(now: Nanos): Nanos | null;
  /** With `healthCheckProbes`: whether a health check should run now (schedules the next). */
  healthCheckDue(now: Nanos): boolean;
  /** Starts from a backoff carried over from a previous controller (algorithm change). */
  startFrom(now: Nanos, backoff: number): void;
  /** Reports the result of a health check started after `healthCheckDue`. */
  recordHealthCheck(now: Nanos, healthy: boolean): void;
}
