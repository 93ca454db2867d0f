/**
 * Google SRE client-side adaptive throttling, adapted to a pull worker (a port of
 * `crates/worker/src/controller/ratio.rs`).
 *
 * `backoff = max(0, (requests - K * accepts) / (requests + 1))` over a sliding window of 30
 * bins, with `K = 1/(1 - s)`; each attempt counts with weight `1/(1 - backoff)` (at most
 * `maxPermits`). Fully backed off it probes like SetPoint; a successful probe clears the window
 * and slow-starts from 2 permits.
 */

import type { Algorithm } from "../wire.js";
import {
  type Brake,
  type Controller,
  type Mode,
  type Nanos,
  type Outcome,
  type Settings,
  brakeCap,
  clamp01,
  earliest,
  fmax,
  fmin,
  idiv,
  limitFor,
  sanitized,
} from "./common.js";
import { ProbeSchedule } from "./probe.js";

/** Number of bins of the sliding window. */
const BINS = 30;
/** Padding of the denominator (the SRE book's `+1`). */
const PADDING = 1.0;

interface Bin {
  /** Absolute bin number (time / bin width) this bin holds, to detect stale bins. */
  epoch: number;
  requests: number;
  accepts: number;
}

function emptyBins(): Bin[] {
  return Array.from({ length: BINS }, () => ({ epoch: 0, requests: 0.0, accepts: 0.0 }));
}

/** Client-side throttling from the Google SRE book ("Handling Overload"). */
export class RatioThrottle implements Controller {
  readonly algorithm: Algorithm = "RatioThrottle";
  private cfg: Settings;
  private k = 1.0;
  private binWidth = 1;
  private bins: Bin[] = emptyBins();
  private requests = 0.0;
  private accepts = 0.0;
  private currentEpoch = 0;
  private ownBackoff = 0.0;
  private currentMode: Mode = "normal";
  /** Permits allowed in slow start (grows by one per success). */
  private slowStartLimit = 0;
  private readonly probe: ProbeSchedule;
  private probeArmed = false;
  private brake: Brake | null = null;

  /** A controller with an empty window. `seed` seeds the probe jitter. */
  constructor(settings: Settings, seed: bigint | number) {
    const s = sanitized(settings);
    this.cfg = s;
    this.probe = new ProbeSchedule(s.probeInitial, s.probeMax, seed);
    this.setParams();
  }

  private setParams(): void {
    this.k = 1.0 / (1.0 - this.cfg.setPoint);
    this.binWidth = Math.max(idiv(this.cfg.ratioWindow, BINS), 1);
  }

  /** Moves the window to `now`, dropping bins that fell out of it. */
  private advance(now: Nanos): void {
    const epoch = idiv(now, this.binWidth);
    if (epoch === this.currentEpoch) return;
    this.currentEpoch = epoch;
    const oldest = Math.max(epoch - (BINS - 1), 0);
    let requests = 0.0;
    let accepts = 0.0;
    for (const bin of this.bins) {
      if (bin.epoch < oldest) {
        bin.epoch = 0;
        bin.requests = 0.0;
        bin.accepts = 0.0;
      } else {
        requests += bin.requests;
        accepts += bin.accepts;
      }
    }
    this.requests = requests;
    this.accepts = accepts;
    this.recompute(now);
  }

  private recompute(now: Nanos): void {
    const raw = (this.requests - this.k * this.accepts) / (this.requests + PADDING);
    this.ownBackoff = clamp01(fmax(raw, 0.0));
    if (this.currentMode === "slow_start") return;
    const limit = limitFor(this.cfg.maxPermits, this.ownBackoff);
    if (limit === 0) {
      if (this.currentMode !== "probing") {
        this.currentMode = "probing";
        this.probeArmed = false;
        this.probe.start(now);
      }
    } else if (this.currentMode === "probing") {
      this.currentMode = "normal";
      this.probeArmed = false;
    }
  }

  private clearWindow(): void {
    this.bins = emptyBins();
    this.requests = 0.0;
    this.accepts = 0.0;
    this.ownBackoff = 0.0;
  }

  /** The window's backoff at `now` without moving the window (for read-only queries). */
  private backoffAt(now: Nanos): number {
    const epoch = idiv(now, this.binWidth);
    if (epoch === this.currentEpoch) return this.ownBackoff;
    const oldest = Math.max(epoch - (BINS - 1), 0);
    let requests = 0.0;
    let accepts = 0.0;
    for (const bin of this.bins) {
      if (bin.epoch >= oldest) {
        requests += bin.requests;
        accepts += bin.accepts;
      }
    }
    return clamp01(fmax((requests - this.k * accepts) / (requests + PADDING), 0.0));
  }

  private ownLimit(): number {
    return this.limitWith(this.ownBackoff);
  }

  private limitWith(backoff: number): number {
    const window = limitFor(this.cfg.maxPermits, backoff);
    return this.currentMode === "slow_start" ? Math.min(window, this.slowStartLimit) : window;
  }

  private probeSucceeded(now: Nanos): void {
    this.clearWindow();
    this.probe.reset(now);
    this.currentMode = "slow_start";
    this.slowStartLimit = 2;
    this.endSlowStartIfDone();
  }

  private endSlowStartIfDone(): void {
    if (this.slowStartLimit >= this.cfg.maxPermits) this.currentMode = "normal";
  }

  private add(now: Nanos, outcome: Outcome): void {
    const p = this.cfg.maxPermits;
    const weight =
      this.currentMode === "slow_start" ? 1.0 : fmin(1.0 / fmax(1.0 - this.ownBackoff, 1.0 / p), p);
    const accepted = outcome === "dependency_failure" ? 0.0 : 1.0;
    const bin = this.bins[this.currentEpoch % BINS] as Bin;
    if (bin.epoch !== this.currentEpoch) {
      bin.epoch = this.currentEpoch;
      bin.requests = 0.0;
      bin.accepts = 0.0;
    }
    bin.requests += weight;
    bin.accepts += accepted;
    this.requests += weight;
    this.accepts += accepted;
    this.recompute(now);
  }

  settings(): Settings {
    return this.cfg;
  }

  record(now: Nanos, outcome: Outcome): void {
    this.advance(now);
    if (this.currentMode === "probing" && this.probeArmed) {
      this.probeArmed = false;
      if (outcome === "success") {
        this.probeSucceeded(now);
        return;
      } else if (outcome === "dependency_failure") {
        this.probe.failed(now);
      } else {
        this.probe.allowNow(now);
      }
    }
    if (this.currentMode === "slow_start") {
      if (outcome === "success") {
        this.slowStartLimit += 1;
        this.endSlowStartIfDone();
      } else if (outcome === "dependency_failure") {
        this.currentMode = "normal";
      }
    }
    this.add(now, outcome);
  }

  permits(now: Nanos, inFlight: number): number {
    this.advance(now);
    const cap = brakeCap(this.brake, this.cfg.maxPermits, now);
    if (this.currentMode === "probing") {
      if (cap === 0 || inFlight > 0 || this.cfg.healthCheckProbes || !this.probe.due(now)) {
        return 0;
      }
      this.probeArmed = true;
      return 1;
    }
    return Math.max(Math.min(this.ownLimit(), cap) - inFlight, 0);
  }

  releaseUnused(_now: Nanos, unused: number): void {
    if (unused > 0 && this.currentMode === "probing") this.probeArmed = false;
  }

  limit(now: Nanos): number {
    const cap = brakeCap(this.brake, this.cfg.maxPermits, now);
    return Math.min(this.limitWith(this.backoffAt(now)), cap);
  }

  backoff(now: Nanos): number {
    const own = this.backoffAt(now);
    const min = this.brake === null ? null : this.brake.active(now);
    return min === null ? own : fmax(own, min);
  }

  mode(): Mode {
    return this.currentMode;
  }

  failureFloor(): number {
    return 0.0;
  }

  floorEstimate(): number | null {
    return null;
  }

  reconfigure(now: Nanos, settings: Settings): void {
    const s = sanitized(settings);
    const widthChanged = s.ratioWindow !== this.cfg.ratioWindow;
    this.probe.setBounds(s.probeInitial, s.probeMax);
    this.cfg = s;
    this.setParams();
    if (widthChanged) {
      this.clearWindow();
      this.currentEpoch = idiv(now, this.binWidth);
    }
    this.endSlowStartIfDone();
    this.recompute(now);
  }

  setBrake(brake: Brake | null): void {
    this.brake = brake;
  }

  nextChange(now: Nanos): Nanos | null {
    const probe =
      this.currentMode === "probing" && !this.probe.due(now) ? this.probe.nextAt() : null;
    // The window forgets: the start of the next bin may lower the backoff.
    const nextBin = this.ownBackoff > 0.0 ? (idiv(now, this.binWidth) + 1) * this.binWidth : null;
    const brake = this.brake === null ? null : this.brake.nextChange(now, this.cfg.maxPermits);
    return earliest(earliest(probe, nextBin), brake);
  }

  healthCheckDue(now: Nanos): boolean {
    this.advance(now);
    if (this.cfg.healthCheckProbes && this.currentMode === "probing" && this.probe.due(now)) {
      this.probe.hold(now);
      return true;
    }
    return false;
  }

  startFrom(_now: Nanos, _backoff: number): void {
    // The backoff derives from the window: nothing to carry over.
  }

  recordHealthCheck(now: Nanos, healthy: boolean): void {
    if (this.currentMode !== "probing") return;
    this.advance(now);
    if (healthy) {
      this.probeSucceeded(now);
    } else {
      this.add(now, "dependency_failure");
      this.probe.failed(now);
    }
  }
}
