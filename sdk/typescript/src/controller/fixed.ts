/**
 * Controllers without backoff: `Fixed` (honours the brake) and `Off` (ignores it); a port of
 * `crates/worker/src/controller/fixed.rs`.
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
  sanitized,
} from "./common.js";

/** Behaviour shared by the controllers that never back off on their own. */
abstract class NoBackoff implements Controller {
  abstract readonly algorithm: Algorithm;
  protected cfg: Settings;

  constructor(settings: Settings) {
    this.cfg = sanitized(settings);
  }

  settings(): Settings {
    return this.cfg;
  }

  record(_now: Nanos, _outcome: Outcome): void {}

  releaseUnused(_now: Nanos, _unused: number): void {}

  mode(): Mode {
    return "normal";
  }

  failureFloor(): number {
    return 0.0;
  }

  floorEstimate(): number | null {
    return null;
  }

  reconfigure(_now: Nanos, settings: Settings): void {
    this.cfg = sanitized(settings);
  }

  healthCheckDue(_now: Nanos): boolean {
    return false;
  }

  startFrom(_now: Nanos, _backoff: number): void {}

  recordHealthCheck(_now: Nanos, _healthy: boolean): void {}

  abstract permits(now: Nanos, inFlight: number): number;
  abstract limit(now: Nanos): number;
  abstract backoff(now: Nanos): number;
  abstract setBrake(brake: Brake | null): void;
  abstract nextChange(now: Nanos): Nanos | null;
}

/** Always `maxPermits`, except under the operator's brake. Backoff is 0 (or the brake). */
export class Fixed extends NoBackoff {
  readonly algorithm: Algorithm = "Fixed";
  private brake: Brake | null = null;

  permits(now: Nanos, inFlight: number): number {
    return Math.max(this.limit(now) - inFlight, 0);
  }

  limit(now: Nanos): number {
    return brakeCap(this.brake, this.cfg.maxPermits, now);
  }

  backoff(now: Nanos): number {
    return (this.brake === null ? null : this.brake.active(now)) ?? 0.0;
  }

  setBrake(brake: Brake | null): void {
    this.brake = brake;
  }

  nextChange(now: Nanos): Nanos | null {
    return this.brake === null ? null : this.brake.nextChange(now, this.cfg.maxPermits);
  }
}

/** Backpressure switched off: always `maxPermits`, backoff always 0, the brake ignored. */
export class Off extends NoBackoff {
  readonly algorithm: Algorithm = "Off";

  permits(_now: Nanos, inFlight: number): number {
    return Math.max(this.cfg.maxPermits - inFlight, 0);
  }

  limit(_now: Nanos): number {
    return this.cfg.maxPermits;
  }

  backoff(_now: Nanos): number {
    return 0.0;
  }

  setBrake(_brake: Brake | null): void {}

  nextChange(_now: Nanos): Nanos | null {
    return null;
  }
}
