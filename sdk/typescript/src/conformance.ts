/**
 * The conformance executor (a port of `crates/worker/src/conformance.rs`): one case of the
 * golden controller vectors (`conformance/vectors/controller.json`, format in
 * `conformance/README.md`) run on a fresh controller, with the readings after every step.
 *
 * It is the only implementation of the case semantics in this SDK: the admin server's
 * conformance hook (`POST /v1/conformance/controller`, see `AdminOptions.conformanceHook`)
 * answers with it, and the golden-vector test runs every case of the file through it. The
 * controller that serves messages is never touched: each case builds its own from its `config`
 * and `seed`, and the case's times are the only clock.
 */

import { ConfigError, validateWorkerConfig, workerConfigFromJson } from "./config.js";
import {
  Brake,
  type Controller,
  type Mode,
  type Nanos,
  type Outcome,
  OUTCOMES,
  applySettings,
  controllerFromConfig,
  settingsFromConfig,
} from "./controller/index.js";
import { type JsonValue, JsonSyntaxError, parseJsonBytes, typeName } from "./json.js";
import type { WorkerConfig } from "./wire.js";

/** The hook's path on the admin port. */
export const HOOK_PATH = "/v1/conformance/controller";
/** Most steps one case may have. */
export const MAX_STEPS = 1_000_000;
/** Largest request body the hook reads (a case of the committed vectors is far smaller). */
export const MAX_CASE_BYTES = 16 * 1024 * 1024;

/** One call at controller time `t` (integer nanoseconds). */
export type CaseStep = { t: Nanos } & (
  | { op: "record"; outcome: Outcome }
  | { op: "permits"; inFlight: number }
  | { op: "releaseUnused"; unused: number }
  | { op: "configure"; config: WorkerConfig; unixS: number }
);

/** One case. The fields the executor does not need (`name`, `description`, `expect`) are not kept. */
export interface ControllerCase {
  /** The seed of the controller's SplitMix64 generator (a u64). */
  seed: bigint;
  /** This worker's brake-lift offset in nanoseconds, used for every `configure`. */
  brakeOffsetNs: Nanos;
  /** The payload the controller is built from. */
  config: WorkerConfig;
  /** The calls, in non-decreasing `t`. */
  steps: CaseStep[];
}

/** The readings after one step (the fields of a step's `expect`). */
export interface Observation {
  /** What `permits` returned (only after a `permits` step). */
  permits?: number;
  backoff: number;
  mode: Mode;
  limit: number;
  failureFloor: number;
  /** Null while the controller has not tested for a floor. */
  floorEstimate: number | null;
}

/** What kind of refusal a `CaseError` is. */
export type CaseErrorKind = "malformed" | "config" | "time_backwards" | "too_many_steps";

/** Why a case cannot run (the hook answers 400 with its message). */
export class CaseError extends Error {
  override readonly name = "CaseError";

  private constructor(
    readonly kind: CaseErrorKind,
    message: string,
  ) {
    super(message);
  }

  /** Not a case. */
  static malformed(detail: string): CaseError {
    return new CaseError("malformed", `malformed case: ${detail}`);
  }

  /** A payload of the case is not valid (`at`: `config` or `steps[i].config`). */
  static config(at: string, reason: string): CaseError {
    return new CaseError("config", `invalid config in ${at}: ${reason}`);
  }

  /** Step `index` goes back in time. */
  static timeBackwards(index: number): CaseError {
    return new CaseError("time_backwards", `steps[${index}]: t goes back in time`);
  }

  /** More than `MAX_STEPS` steps. */
  static tooManySteps(n: number): CaseError {
    return new CaseError("too_many_steps", `${n} steps exceed the limit of ${MAX_STEPS}`);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding. A case is read as serde reads the Rust `Case`: unknown members are ignored (so a
// case of the file is sent as it is), known ones are required, typed exactly (an integer is
// not `1.0`) and not duplicated.

type Members = Map<string, JsonValue>;

function members(v: JsonValue, at: string, known: readonly string[]): Members {
  if (v.type !== "object")
    throw CaseError.malformed(`${at}: invalid type: ${typeName(v)}, expected a map`);
  const out: Members = new Map();
  for (const [k, x] of v.value) {
    if (!known.includes(k)) continue;
    if (out.has(k)) throw CaseError.malformed(`${at}: duplicate field \`${k}\``);
    out.set(k, x);
  }
  return out;
}

function member(m: Members, name: string, at: string): JsonValue {
  const v = m.get(name);
  if (v === undefined) throw CaseError.malformed(`${at}: missing field \`${name}\``);
  return v;
}

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const U32_MAX = 4294967295n;
const U64_MAX = (1n << 64n) - 1n;

/** An integer in `[lo, hi]`, exactly (a float such as `1.0` is refused). */
function integer(v: JsonValue, at: string, lo: bigint, hi: bigint, what: string): bigint {
  if (v.type !== "number" || v.value.kind === "f64") {
    throw CaseError.malformed(`${at}: invalid type: ${typeName(v)}, expected ${what}`);
  }
  const n = v.value.value;
  if (n < lo || n > hi) {
    throw CaseError.malformed(`${at}: invalid value: integer \`${n}\`, expected ${what}`);
  }
  return n;
}

/**
 * A time or span in nanoseconds: a u64 the SDK holds exactly, that is at most 2^53 - 1 (the
 * vectors keep every time below 2^53 so that every JSON reader holds it).
 */
function nanos(v: JsonValue, at: string): Nanos {
  return Number(integer(v, at, 0n, SAFE, "an integer in [0, 2^53 - 1]"));
}

function config(v: JsonValue, at: string): WorkerConfig {
  try {
    return workerConfigFromJson(v);
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    if (e.kind === "malformed") throw CaseError.malformed(`${at}: ${e.message}`);
    throw CaseError.config(at, e.message);
  }
}

const STEP_FIELDS = ["t", "op", "outcome", "inFlight", "unused", "config", "unixS"] as const;

function step(v: JsonValue, i: number): CaseStep {
  const at = `steps[${i}]`;
  const m = members(v, at, STEP_FIELDS);
  const t = nanos(member(m, "t", at), `${at}.t`);
  const op = member(m, "op", at);
  if (op.type !== "string") {
    throw CaseError.malformed(`${at}.op: invalid type: ${typeName(op)}, expected a string`);
  }
  switch (op.value) {
    case "record": {
      const o = member(m, "outcome", at);
      if (o.type !== "string" || !(OUTCOMES as readonly string[]).includes(o.value)) {
        throw CaseError.malformed(
          `${at}.outcome: ${o.type === "string" ? `unknown variant \`${o.value}\`` : `invalid type: ${typeName(o)}`}, expected one of ${OUTCOMES.map((x) => `\`${x}\``).join(", ")}`,
        );
      }
      return { t, op: "record", outcome: o.value as Outcome };
    }
    case "permits": {
      const n = integer(member(m, "inFlight", at), `${at}.inFlight`, 0n, U32_MAX, "u32");
      return { t, op: "permits", inFlight: Number(n) };
    }
    case "releaseUnused": {
      const n = integer(member(m, "unused", at), `${at}.unused`, 0n, U32_MAX, "u32");
      return { t, op: "releaseUnused", unused: Number(n) };
    }
    case "configure": {
      const unixS = integer(
        member(m, "unixS", at),
        `${at}.unixS`,
        -SAFE,
        SAFE,
        "an integer in [-(2^53 - 1), 2^53 - 1]",
      );
      const cfg = config(member(m, "config", at), `${at}.config`);
      return { t, op: "configure", config: cfg, unixS: Number(unixS) };
    }
    default:
      throw CaseError.malformed(
        `${at}.op: unknown variant \`${op.value}\`, expected one of \`record\`, \`permits\`, \`releaseUnused\`, \`configure\``,
      );
  }
}

/** Decodes a case already read as JSON. Throws a `CaseError`. */
export function caseFromJson(v: JsonValue): ControllerCase {
  const m = members(v, "case", ["seed", "brakeOffsetNs", "config", "steps"]);
  const seed = integer(member(m, "seed", "case"), "seed", 0n, U64_MAX, "u64");
  const brakeOffsetNs = nanos(member(m, "brakeOffsetNs", "case"), "brakeOffsetNs");
  const cfg = config(member(m, "config", "case"), "config");
  const steps = member(m, "steps", "case");
  if (steps.type !== "array") {
    throw CaseError.malformed(`steps: invalid type: ${typeName(steps)}, expected a sequence`);
  }
  if (steps.value.length > MAX_STEPS) throw CaseError.tooManySteps(steps.value.length);
  return { seed, brakeOffsetNs, config: cfg, steps: steps.value.map(step) };
}

/** Parses a case from a request body (UTF-8 JSON). Throws a `CaseError`. */
export function parseCase(bytes: Uint8Array | string): ControllerCase {
  const data = typeof bytes === "string" ? new TextEncoder().encode(bytes) : bytes;
  let json: JsonValue;
  try {
    json = parseJsonBytes(data);
  } catch (e) {
    if (e instanceof JsonSyntaxError) throw CaseError.malformed(e.message);
    throw e;
  }
  return caseFromJson(json);
}

// ---------------------------------------------------------------------------------------------
// Execution.

function validated(cfg: WorkerConfig, at: string): WorkerConfig {
  try {
    validateWorkerConfig(cfg);
  } catch (e) {
    if (e instanceof ConfigError) throw CaseError.config(at, e.message);
    throw e;
  }
  return cfg;
}

function observe(c: Controller, t: Nanos, permits: number | undefined): Observation {
  const o: Observation = {
    backoff: c.backoff(t),
    mode: c.mode(),
    limit: c.limit(t),
    failureFloor: c.failureFloor(),
    floorEstimate: c.floorEstimate(),
  };
  // `permits` first, as the Rust worker writes it; only after a `permits` step.
  return permits === undefined ? o : { permits, ...o };
}

/**
 * Runs `c` on a fresh controller built from its `config` and `seed` and returns the readings
 * after every step. Throws a `CaseError` (no readings) for an invalid config, a step going
 * back in time or too many steps.
 */
export function executeCase(c: ControllerCase): Observation[] {
  if (c.steps.length > MAX_STEPS) throw CaseError.tooManySteps(c.steps.length);
  const offset = c.brakeOffsetNs;
  let controller = controllerFromConfig(validated(c.config, "config"), c.seed);
  let brake: Brake | null = null;
  let last = 0;
  const observations: Observation[] = [];
  c.steps.forEach((s, i) => {
    if (s.t < last) throw CaseError.timeBackwards(i);
    last = s.t;
    const t = s.t;
    let permits: number | undefined;
    switch (s.op) {
      case "record":
        controller.record(t, s.outcome);
        break;
      case "permits":
        permits = controller.permits(t, s.inFlight);
        break;
      case "releaseUnused":
        controller.releaseUnused(t, s.unused);
        break;
      case "configure": {
        // conformance/README.md, `configure`: settings, the new brake at (t, unixS), its
        // succession over the previous one, then reconfigure or replace the controller.
        const cfg = validated(s.config, `steps[${i}].config`);
        const settings = settingsFromConfig(cfg);
        const next = cfg.brake === undefined ? null : Brake.fromWire(cfg.brake, t, s.unixS);
        brake = Brake.succeed(brake, next, t, settings.brakeRelease, offset);
        controller = applySettings(controller, t, settings, c.seed, brake);
        break;
      }
    }
    observations.push(observe(controller, t, permits));
  });
  return observations;
}

/** The hook's work: a request body to its 200 answer's JSON. Throws a `CaseError`. */
export function runCaseBody(body: Uint8Array | string): string {
  return JSON.stringify({ observations: executeCase(parseCase(body)) });
}
