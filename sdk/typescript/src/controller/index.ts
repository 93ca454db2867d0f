/**
 * Backpressure controllers: they turn message outcomes into a backoff factor and a number of
 * permits (a port of `crates/worker/src/controller/`). A controller never reads a clock: every
 * call takes the current time in integer nanoseconds, and the only randomness (probe jitter)
 * comes from a SplitMix64 seeded at construction.
 */

import type { WorkerConfig } from "../wire.js";
import {
  type Brake,
  type Controller,
  type Nanos,
  type Settings,
  sanitized,
  settingsFromConfig,
} from "./common.js";
import { Fixed, Off } from "./fixed.js";
import { RatioThrottle } from "./ratio.js";
import { SetPoint } from "./setPoint.js";

export * from "./common.js";
export { Fixed, Off } from "./fixed.js";
export { RatioThrottle } from "./ratio.js";
export { SetPoint } from "./setPoint.js";

/** Builds the controller named by `settings.algorithm`. `seed` seeds the probe jitter. */
export function buildController(settings: Settings, seed: bigint | number): Controller {
  const s = sanitized(settings);
  switch (s.algorithm) {
    case "SetPoint":
      return new SetPoint(s, seed);
    case "RatioThrottle":
      return new RatioThrottle(s, seed);
    case "Fixed":
      return new Fixed(s);
    case "Off":
      return new Off(s);
  }
}

/** Builds the controller of a wire configuration (without its brake; see `Brake.fromWire`). */
export function controllerFromConfig(cfg: WorkerConfig, seed: bigint | number): Controller {
  return buildController(settingsFromConfig(cfg), seed);
}

/**
 * Applies `settings` to `controller`: reconfigures in place when the algorithm is unchanged,
 * otherwise builds a new controller that starts from the old backoff where the new algorithm
 * can carry it. The brake is carried over. Returns the controller to use from now on.
 */
export function applySettings(
  controller: Controller,
  now: Nanos,
  settings: Settings,
  seed: bigint | number,
  brake: Brake | null,
): Controller {
  const s = sanitized(settings);
  let next = controller;
  if (controller.algorithm === s.algorithm) {
    controller.reconfigure(now, s);
  } else {
    // The old controller's own backoff, without the brake (set again below).
    controller.setBrake(null);
    const previous = controller.backoff(now);
    next = buildController(s, seed);
    next.startFrom(now, previous);
  }
  next.setBrake(brake);
  return next;
}
