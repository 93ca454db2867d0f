/**
 * The set-point integrator with probing, slow start, the startup ramp and failure-floor
 * learning (the default controller; a port of `crates/worker/src/controller/set_point.rs`,
 * whose doc comments explain the reasoning). The floating-point operations are in the same
 * order as in Rust so that results match bit for bit (up to `Math.exp` in the floor's decay).
 */

import type { Algorithm } from "../wire.js";
import {
  type Brake,
  type Controller,
  type Mode,
  type Nanos,
  type Outcome,
  type Settings,
  U32_MAX,
  asUint,
  brakeCap,
  clamp01,
  earliest,
  fmax,
  fmin,
  limitFor,
  sanitized,
  subNanos,
} from "./common.js";
import { ProbeSchedule } from "./probe.js";

/** A healthy startup ramp takes about this many round trips. */
const STARTUP_ROUND_TRIPS = 16.0;
/** How fast the remembered peak of permits decays: one permit per this many nanoseconds. */
const PEAK_DECAY_PER_PERMIT = 3e9;
/** Time constant (ns) of the experiment counts: outcomes older than this weigh `1/e`. */
const EXPERIMENT_TAU = 600e9;
/** Experiments needed before their failure fraction is trusted at all. */
const MIN_EXPERIMENTS = 30.0;
/** Confidence of the test "failures at minimal concurrency exceed the set point". */
const Z = 2.0;
/** Outcomes in the moving average of the failure fraction the floor follows down. */
const FLOOR_WINDOW = 1000.0;
/** A floor is adopted only above this multiple of the set point. */
const ADOPT = 1.5;

/** Rounds values within 1e-12 of 0 to exactly 0. */
function snap(x: number): number {
  return Math.abs(x) < 1e-12 ? 0.0 : x;
}

/**
 * The set-point integrator. State: an integrator `x` in `[-credit, 1]`; the backoff factor is
 * `max(0, x)`. A dependency failure moves `x` up by `1/N`, a success down by `s/((1-s)N)`.
 */
export class SetPoint implements Controller {
  readonly algorithm: Algorithm = "SetPoint";
  private cfg: Settings;
  private x: number;
  private up = 0.0;
  private down = 0.0;
  private currentMode: Mode = "normal";
  private readonly probe: ProbeSchedule;
  private probeArmed = false;
  private threshold = 2;
  private peak: number;
  private peakAt: Nanos | null = null;
  private brake: Brake | null = null;
  private window = 0.0;
  private expN = 0.0;
  private expFail = 0.0;
  private expAt: Nanos | null = null;
  private fAvg = 0.0;
  private floor = 0.0;

  /** A controller at zero backoff, starting up. `seed` seeds the probe jitter. */
  constructor(settings: Settings, seed: bigint | number) {
    const s = sanitized(settings);
    this.cfg = s;
    this.probe = new ProbeSchedule(s.probeInitial, s.probeMax, seed);
    // Start with the full credit: a fresh worker is assumed healthy.
    this.x = -s.credit;
    this.peak = s.maxPermits;
    this.setSteps();
    const initial = s.initialPermits;
    if (initial > 0 && initial < s.maxPermits) {
      this.currentMode = "starting";
      this.window = initial;
    }
  }

  /** The startup window's permits (`maxPermits` once started). */
  startupWindow(): number {
    if (this.currentMode === "starting") {
      return Math.min(Math.max(asUint(Math.floor(this.window), U32_MAX), 1), this.cfg.maxPermits);
    }
    return this.cfg.maxPermits;
  }

  /** The startup window as a float (tests). */
  windowValue(): number {
    return this.window;
  }

  /** Sets the backoff factor directly (carrying state over from another controller, tests). */
  setBackoff(now: Nanos, backoff: number): void {
    this.x = clamp01(backoff);
    this.currentMode = "normal";
    this.settle(now);
  }

  /** The integrator state, which may be negative (credit). */
  integrator(): number {
    return this.x;
  }

  /** The slow-start threshold set when full backoff was last entered. */
  ssthresh(): number {
    return this.threshold;
  }

  /** The current probe interval (before jitter). */
  probeInterval(): Nanos {
    return this.probe.interval();
  }

  /** The set point the integrator runs with: `s_eff = f0 + s·(1 - f0)`. */
  effectiveSetPoint(): number {
    const s = this.cfg.setPoint;
    return this.floor + s * (1.0 - this.floor);
  }

  private controlledLimit(): number {
    return Math.min(this.ownLimit(), this.startupWindow());
  }

  private recordStarting(now: Nanos, outcome: Outcome): void {
    const s = this.effectiveSetPoint();
    const gain = this.cfg.maxPermits / STARTUP_ROUND_TRIPS / this.window;
    switch (outcome) {
      case "success":
        this.window += gain;
        break;
      case "dependency_failure":
        this.window = fmax(this.window - (gain * (1.0 - s)) / s, 1.0);
        break;
      case "message_failure":
        return;
    }
    this.integrate(outcome);
    if (this.ownLimit() === 0) {
      this.enterProbing(now);
    } else {
      this.finishStartingIfDone(now);
    }
  }

  private finishStartingIfDone(now: Nanos): void {
    if (this.currentMode === "starting" && this.window >= this.ownLimit()) {
      this.currentMode = "normal";
      this.trackPeak(now, this.ownLimit());
    }
  }

  private learn(now: Nanos, mode: Mode, outcome: Outcome): void {
    let failed: number;
    if (outcome === "success") failed = 0.0;
    else if (outcome === "dependency_failure") failed = 1.0;
    else return;
    this.fAvg += (failed - this.fAvg) / FLOOR_WINDOW;
    if (this.expAt !== null) {
      const decay = Math.exp(-subNanos(now, this.expAt) / EXPERIMENT_TAU);
      this.expN *= decay;
      this.expFail *= decay;
    }
    this.expAt = now;
    const startingLow = mode === "starting" && this.window <= fmax(this.cfg.maxPermits / 4.0, 2.0);
    if (mode === "probing" || mode === "slow_start" || startingLow) {
      this.expN += 1.0;
      this.expFail += failed;
    }
    const s = this.cfg.setPoint;
    const max = this.cfg.floorMax;
    const fExp = this.expN > 0.0 ? this.expFail / this.expN : 0.0;
    const significant =
      this.expN >= MIN_EXPERIMENTS &&
      fExp - Z * Math.sqrt((fExp * (1.0 - fExp)) / this.expN) > s &&
      fExp <= max;
    const candidate = fmin(fmin(fExp, this.fAvg), max);
    // Hysteresis: adopted only clearly above the set point, ends back at the set point.
    const floor =
      (this.floor > 0.0 && candidate > s) || (significant && candidate > ADOPT * s)
        ? candidate
        : 0.0;
    if (floor !== this.floor) {
      this.floor = floor;
      this.setSteps();
    }
  }

  private setSteps(): void {
    const s = this.effectiveSetPoint();
    const n = this.cfg.reaction;
    this.up = 1.0 / n;
    this.down = s / ((1.0 - s) * n);
  }

  private ownLimit(): number {
    return limitFor(this.cfg.maxPermits, this.x);
  }

  private integrate(outcome: Outcome): void {
    if (outcome === "success") {
      this.x = snap(fmax(this.x - this.down, -this.cfg.credit));
    } else if (outcome === "dependency_failure") {
      this.x = snap(fmin(this.x + this.up, 1.0));
    }
  }

  private settle(now: Nanos): void {
    const limit = this.ownLimit();
    if (limit === 0) {
      if (this.currentMode !== "probing") this.enterProbing(now);
    } else if (this.currentMode === "probing") {
      this.currentMode = "normal";
      this.probeArmed = false;
    }
    if (this.currentMode === "normal") this.trackPeak(now, limit);
  }

  private enterProbing(now: Nanos): void {
    this.trackPeak(now, 0);
    const half = asUint(Math.floor(this.peak / 2.0), U32_MAX);
    this.threshold = Math.min(Math.max(half, 2), Math.max(this.cfg.maxPermits, 2));
    this.currentMode = "probing";
    this.probeArmed = false;
    this.x = 1.0;
    this.probe.start(now);
  }

  private trackPeak(now: Nanos, limit: number): void {
    const elapsed = this.peakAt === null ? 0.0 : subNanos(now, this.peakAt);
    const decayed = this.peak - elapsed / PEAK_DECAY_PER_PERMIT;
    this.peak = fmax(decayed, limit);
    this.peakAt = now;
  }

  private probeSucceeded(now: Nanos): void {
    const p = this.cfg.maxPermits;
    this.x = fmax(fmin(this.x, 1.0 - 2.0 / p), 0.0);
    this.probe.reset(now);
    this.currentMode = "slow_start";
    this.leaveSlowStartIfDone(now);
  }

  private probeFailed(now: Nanos): void {
    this.x = 1.0;
    this.probe.failed(now);
  }

  private leaveSlowStartIfDone(now: Nanos): void {
    if (this.ownLimit() >= Math.min(this.threshold, this.cfg.maxPermits)) {
      this.currentMode = "normal";
      this.trackPeak(now, this.ownLimit());
    }
  }

  settings(): Settings {
    return this.cfg;
  }

  record(now: Nanos, outcome: Outcome): void {
    if (this.cfg.floorMax > 0.0) this.learn(now, this.currentMode, outcome);
    if (this.currentMode === "probing" && this.probeArmed) {
      this.probeArmed = false;
      if (outcome === "success") this.probeSucceeded(now);
      else if (outcome === "dependency_failure") this.probeFailed(now);
      // The dependency was not exercised: another probe may go out now.
      else this.probe.allowNow(now);
    } else if (this.currentMode === "starting") {
      this.recordStarting(now, outcome);
    } else if (this.currentMode === "slow_start") {
      if (outcome === "success") {
        const p = this.cfg.maxPermits;
        this.x = fmax(this.x - 1.0 / p, 0.0);
        this.leaveSlowStartIfDone(now);
      } else if (outcome === "dependency_failure") {
        this.currentMode = "normal";
        this.integrate(outcome);
        this.settle(now);
      }
    } else {
      // Normal, or a late outcome of a message taken before full backoff.
      this.integrate(outcome);
      this.settle(now);
    }
  }

  permits(now: Nanos, inFlight: number): number {
    const cap = brakeCap(this.brake, this.cfg.maxPermits, now);
    if (this.currentMode === "probing") {
      if (cap === 0 || inFlight > 0 || this.cfg.healthCheckProbes || !this.probe.due(now)) {
        return 0;
      }
      // Stateless grant: `probeArmed` only tells the next outcome it is a probe.
      this.probeArmed = true;
      return 1;
    }
    return Math.max(Math.min(this.controlledLimit(), cap) - inFlight, 0);
  }

  releaseUnused(_now: Nanos, unused: number): void {
    if (unused > 0 && this.currentMode === "probing") this.probeArmed = false;
  }

  limit(now: Nanos): number {
    const cap = brakeCap(this.brake, this.cfg.maxPermits, now);
    return Math.min(this.controlledLimit(), cap);
  }

  backoff(now: Nanos): number {
    const own = clamp01(this.x);
    const min = this.brake === null ? null : this.brake.active(now);
    return min === null ? own : fmax(own, min);
  }

  mode(): Mode {
    return this.currentMode;
  }

  failureFloor(): number {
    return this.floor;
  }

  floorEstimate(): number | null {
    if (this.floor > 0.0) return this.floor;
    if (this.cfg.floorMax <= 0.0 || this.expN < MIN_EXPERIMENTS) return null;
    const f = this.expFail / this.expN;
    const sigma = Math.sqrt((f * (1.0 - f)) / this.expN);
    const under = f + Z * sigma <= ADOPT * this.cfg.setPoint;
    const outage = f - Z * sigma > this.cfg.floorMax;
    return under || outage ? 0.0 : null;
  }

  reconfigure(now: Nanos, settings: Settings): void {
    const s = sanitized(settings);
    this.probe.setBounds(s.probeInitial, s.probeMax);
    this.cfg = s;
    this.x = fmax(this.x, -s.credit);
    this.floor = fmin(this.floor, s.floorMax);
    if (this.floor <= s.setPoint) this.floor = 0.0;
    this.setSteps();
    this.peak = fmin(this.peak, s.maxPermits);
    this.settle(now);
    this.finishStartingIfDone(now);
  }

  setBrake(brake: Brake | null): void {
    this.brake = brake;
  }

  nextChange(now: Nanos): Nanos | null {
    const probe =
      this.currentMode === "probing" && !this.probe.due(now) ? this.probe.nextAt() : null;
    const brake = this.brake === null ? null : this.brake.nextChange(now, this.cfg.maxPermits);
    return earliest(probe, brake);
  }

  healthCheckDue(now: Nanos): boolean {
    if (this.cfg.healthCheckProbes && this.currentMode === "probing" && this.probe.due(now)) {
      // Schedule the next check now, so a lost result can never stall probing.
      this.probe.hold(now);
      return true;
    }
    return false;
  }

  startFrom(now: Nanos, backoff: number): void {
    this.setBackoff(now, backoff);
  }

  recordHealthCheck(now: Nanos, healthy: boolean): void {
    if (this.currentMode !== "probing") return;
    if (healthy) this.probeSucceeded(now);
    else this.probeFailed(now);
  }
}
