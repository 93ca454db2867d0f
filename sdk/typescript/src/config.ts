/**
 * Parsing, validation and the content hash of a WorkerConfig payload, as `WorkerConfig::parse`
 * and `WorkerConfig::validate` in `crates/api/src/wire.rs` do them: the same shape (unknown
 * fields, duplicates and wrong types refused, integers exact), the same ranges, each error
 * naming the JSON field, the 64 KiB limit, and the hash over RFC 8785 canonical JSON (an empty
 * hash means "not given").
 */

import { createHash } from "node:crypto";

import {
  type JsonValue,
  JsonSyntaxError,
  type Plain,
  canonicalJson,
  parseJsonBytes,
  typeName,
} from "./json.js";
import {
  ALGORITHMS,
  type Algorithm,
  type BrakeConfig,
  MAX_PAYLOAD_BYTES,
  type RedeliveryConfig,
  WIRE_VERSION,
  type WorkerConfig,
  defaultWorkerConfigUnhashed,
  defaults,
} from "./wire.js";

/** Version of the producer's document (named in the version error, as the Rust one does). */
export const PRODUCER_WIRE_VERSION = "backpressure.dev/producer-state/v1";
/** Largest integer a document may carry (2^53 - 1, I-JSON's bound). */
export const MAX_SAFE_INTEGER = Number.MAX_SAFE_INTEGER;

/** What kind of refusal a `ConfigError` is. */
export type ConfigErrorKind = "malformed" | "version" | "field" | "hash" | "too_large";

/** Why a payload was refused (HTTP 400, or 413 for `too_large`). Field errors name the JSON field. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";

  private constructor(
    readonly kind: ConfigErrorKind,
    message: string,
    /** The JSON field (`"brake.minBackoff"`), for `field` errors. */
    readonly field?: string,
  ) {
    super(message);
  }

  /** Not JSON, or not the shape of the document. */
  static malformed(detail: string): ConfigError {
    return new ConfigError("malformed", `malformed document: ${detail}`);
  }

  /** A version this receiver does not speak. */
  static version(version: string): ConfigError {
    return new ConfigError(
      "version",
      `unsupported version ${JSON.stringify(version)}: expected ${JSON.stringify(WIRE_VERSION)} (worker config) or ${JSON.stringify(PRODUCER_WIRE_VERSION)} (producer state)`,
    );
  }

  /** A field out of range. */
  static field(field: string, reason: string): ConfigError {
    return new ConfigError("field", `invalid worker config field ${field}: ${reason}`, field);
  }

  /** The hash does not match the content (the message starts with `hash mismatch`). */
  static hash(given: string, computed: string): ConfigError {
    return new ConfigError(
      "hash",
      `hash mismatch: payload says ${JSON.stringify(given)}, content hashes to ${JSON.stringify(computed)}`,
    );
  }

  /** Larger than `MAX_PAYLOAD_BYTES`. */
  static tooLarge(size: number): ConfigError {
    return new ConfigError(
      "too_large",
      `document of ${size} bytes exceeds the limit of ${MAX_PAYLOAD_BYTES} bytes`,
    );
  }
}

// ---------------------------------------------------------------------------------------------
// The exact form: integers as bigint, as Rust holds them in u32 / u64 / i64.

interface ExactBrake {
  minBackoff: number;
  expiresAtUnix?: bigint;
}

interface ExactRedelivery {
  baseMs: bigint;
  maxMs: bigint;
}

interface ExactConfig {
  version: string;
  generation: bigint;
  hash: string;
  algorithm: Algorithm;
  setPoint: number;
  reaction: bigint;
  maxPermits: bigint;
  probeInitialMs: bigint;
  probeMaxMs: bigint;
  initialPermits?: bigint;
  ratioWindowMs?: bigint;
  brakeReleaseMs?: bigint;
  floorMax?: number;
  redelivery?: ExactRedelivery;
  brake?: ExactBrake;
}

const U32_MAX = 4294967295n;
const U64_MAX = (1n << 64n) - 1n;
const I64_MAX = (1n << 63n) - 1n;
const I64_MIN = -(1n << 63n);

type IntType = "u32" | "u64" | "i64";
const INT_RANGE: Record<IntType, readonly [bigint, bigint]> = {
  u32: [0n, U32_MAX],
  u64: [0n, U64_MAX],
  i64: [I64_MIN, I64_MAX],
};

/** A decoder of one JSON value into a field's type; throws `ConfigError.malformed`. */
type Decode = (v: JsonValue, field: string) => unknown;

function invalidType(v: JsonValue, expected: string, field: string): ConfigError {
  return ConfigError.malformed(`invalid type: ${typeName(v)}, expected ${expected} (${field})`);
}

function int(type: IntType): Decode {
  return (v, field) => {
    if (v.type !== "number" || v.value.kind === "f64") throw invalidType(v, type, field);
    const [lo, hi] = INT_RANGE[type];
    const n = v.value.value;
    if (n < lo || n > hi) {
      throw ConfigError.malformed(`invalid value: integer \`${n}\`, expected ${type} (${field})`);
    }
    return n;
  };
}

const f64: Decode = (v, field) => {
  if (v.type !== "number") throw invalidType(v, "f64", field);
  return v.value.kind === "f64" ? v.value.value : Number(v.value.value);
};

const str: Decode = (v, field) => {
  if (v.type !== "string") throw invalidType(v, "a string", field);
  return v.value;
};

/** A unit-variant enum: `"SetPoint"`, or serde's map form `{"SetPoint": null}`. */
const algorithm: Decode = (v, field) => {
  let name: string;
  if (v.type === "string") {
    name = v.value;
  } else if (
    v.type === "object" &&
    v.value.length === 1 &&
    (v.value[0] as readonly [string, JsonValue])[1].type === "null"
  ) {
    name = (v.value[0] as readonly [string, JsonValue])[0];
  } else {
    throw invalidType(v, "enum Algorithm", field);
  }
  if (!(ALGORITHMS as readonly string[]).includes(name)) {
    throw ConfigError.malformed(
      `unknown variant \`${name}\`, expected one of ${ALGORITHMS.map((a) => `\`${a}\``).join(", ")} (${field})`,
    );
  }
  return name;
};

/** How a missing field is treated: required, `#[serde(default)]`, or an `Option` (absent). */
type Presence = "required" | { default: unknown } | "option";

interface Field {
  name: string;
  decode: Decode;
  presence: Presence;
}

/**
 * A struct as serde derives its deserializer with `deny_unknown_fields`: a map (unknown and
 * duplicate fields refused, missing required ones refused) or a sequence in declaration order.
 * `Option` fields read `null` as absent.
 */
function struct(what: string, fields: readonly Field[]): Decode {
  const decodeMember = (f: Field, v: JsonValue, path: string) =>
    f.presence === "option" && v.type === "null" ? undefined : f.decode(v, path);
  return (v, at) => {
    const prefix = at === "" ? "" : `${at}.`;
    const out: Record<string, unknown> = {};
    if (v.type === "object") {
      const seen = new Set<string>();
      for (const [key, member] of v.value) {
        const f = fields.find((x) => x.name === key);
        if (f === undefined) {
          throw ConfigError.malformed(
            `unknown field \`${key}\`, expected one of ${fields.map((x) => `\`${x.name}\``).join(", ")}${at === "" ? "" : ` (${at})`}`,
          );
        }
        if (seen.has(key)) throw ConfigError.malformed(`duplicate field \`${prefix}${key}\``);
        seen.add(key);
        const decoded = decodeMember(f, member, prefix + key);
        if (decoded !== undefined) out[key] = decoded;
      }
      for (const f of fields) {
        if (seen.has(f.name)) continue;
        if (f.presence === "required") {
          throw ConfigError.malformed(`missing field \`${prefix}${f.name}\``);
        }
        if (f.presence !== "option") out[f.name] = f.presence.default;
      }
      return out;
    }
    if (v.type === "array") {
      fields.forEach((f, i) => {
        const item = v.value[i];
        if (item === undefined) {
          if (f.presence === "required") {
            throw ConfigError.malformed(
              `invalid length ${v.value.length}, expected struct ${what} with ${fields.length} elements`,
            );
          }
          if (f.presence !== "option") out[f.name] = f.presence.default;
          return;
        }
        const decoded = decodeMember(f, item, prefix + f.name);
        if (decoded !== undefined) out[f.name] = decoded;
      });
      if (v.value.length > fields.length) {
        throw ConfigError.malformed(`invalid length ${v.value.length}, expected fewer elements`);
      }
      return out;
    }
    throw invalidType(v, `struct ${what}`, at === "" ? what : at);
  };
}

const redelivery = struct("RedeliveryConfig", [
  { name: "baseMs", decode: int("u64"), presence: "required" },
  { name: "maxMs", decode: int("u64"), presence: "required" },
]);

const brake = struct("BrakeConfig", [
  { name: "minBackoff", decode: f64, presence: "required" },
  { name: "expiresAtUnix", decode: int("i64"), presence: "option" },
]);

const workerConfig = struct("WorkerConfig", [
  { name: "version", decode: str, presence: "required" },
  { name: "generation", decode: int("i64"), presence: "required" },
  { name: "hash", decode: str, presence: { default: "" } },
  { name: "algorithm", decode: algorithm, presence: "required" },
  { name: "setPoint", decode: f64, presence: "required" },
  { name: "reaction", decode: int("u32"), presence: "required" },
  { name: "maxPermits", decode: int("u32"), presence: "required" },
  { name: "probeInitialMs", decode: int("u64"), presence: "required" },
  { name: "probeMaxMs", decode: int("u64"), presence: "required" },
  { name: "initialPermits", decode: int("u32"), presence: "option" },
  { name: "ratioWindowMs", decode: int("u64"), presence: "option" },
  { name: "brakeReleaseMs", decode: int("u64"), presence: "option" },
  { name: "floorMax", decode: f64, presence: "option" },
  { name: "redelivery", decode: redelivery, presence: "option" },
  { name: "brake", decode: brake, presence: "option" },
]);

/** The public form: integers as numbers (exact for every valid payload: they are below 2^53). */
function toPublic(e: ExactConfig): WorkerConfig {
  const cfg: WorkerConfig = {
    version: e.version,
    generation: Number(e.generation),
    hash: e.hash,
    algorithm: e.algorithm,
    setPoint: e.setPoint,
    reaction: Number(e.reaction),
    maxPermits: Number(e.maxPermits),
    probeInitialMs: Number(e.probeInitialMs),
    probeMaxMs: Number(e.probeMaxMs),
  };
  if (e.initialPermits !== undefined) cfg.initialPermits = Number(e.initialPermits);
  if (e.ratioWindowMs !== undefined) cfg.ratioWindowMs = Number(e.ratioWindowMs);
  if (e.brakeReleaseMs !== undefined) cfg.brakeReleaseMs = Number(e.brakeReleaseMs);
  if (e.floorMax !== undefined) cfg.floorMax = e.floorMax;
  if (e.redelivery !== undefined) {
    cfg.redelivery = { baseMs: Number(e.redelivery.baseMs), maxMs: Number(e.redelivery.maxMs) };
  }
  if (e.brake !== undefined) {
    const b: BrakeConfig = { minBackoff: e.brake.minBackoff };
    if (e.brake.expiresAtUnix !== undefined) b.expiresAtUnix = Number(e.brake.expiresAtUnix);
    cfg.brake = b;
  }
  return cfg;
}

/** A programmatic config in the exact form; a number that is not an integer of its type is refused. */
function toExact(cfg: WorkerConfig): ExactConfig {
  const int = (type: IntType, field: string, n: number): bigint => {
    const [lo, hi] = INT_RANGE[type];
    if (!Number.isInteger(n) || BigInt(n) < lo || BigInt(n) > hi) {
      throw ConfigError.field(field, `${n} is not a ${type}`);
    }
    return BigInt(n);
  };
  const e: ExactConfig = {
    version: cfg.version,
    generation: int("i64", "generation", cfg.generation),
    hash: cfg.hash,
    algorithm: cfg.algorithm,
    setPoint: cfg.setPoint,
    reaction: int("u32", "reaction", cfg.reaction),
    maxPermits: int("u32", "maxPermits", cfg.maxPermits),
    probeInitialMs: int("u64", "probeInitialMs", cfg.probeInitialMs),
    probeMaxMs: int("u64", "probeMaxMs", cfg.probeMaxMs),
  };
  if (!(ALGORITHMS as readonly string[]).includes(cfg.algorithm)) {
    throw ConfigError.field("algorithm", `unknown algorithm ${JSON.stringify(cfg.algorithm)}`);
  }
  if (cfg.initialPermits !== undefined) {
    e.initialPermits = int("u32", "initialPermits", cfg.initialPermits);
  }
  if (cfg.ratioWindowMs !== undefined) {
    e.ratioWindowMs = int("u64", "ratioWindowMs", cfg.ratioWindowMs);
  }
  if (cfg.brakeReleaseMs !== undefined) {
    e.brakeReleaseMs = int("u64", "brakeReleaseMs", cfg.brakeReleaseMs);
  }
  if (cfg.floorMax !== undefined) e.floorMax = cfg.floorMax;
  if (cfg.redelivery !== undefined) {
    e.redelivery = {
      baseMs: int("u64", "redelivery.baseMs", cfg.redelivery.baseMs),
      maxMs: int("u64", "redelivery.maxMs", cfg.redelivery.maxMs),
    };
  }
  if (cfg.brake !== undefined) {
    const b: ExactBrake = { minBackoff: cfg.brake.minBackoff };
    if (cfg.brake.expiresAtUnix !== undefined) {
      b.expiresAtUnix = int("i64", "brake.expiresAtUnix", cfg.brake.expiresAtUnix);
    }
    e.brake = b;
  }
  return e;
}

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const abs = (n: bigint) => (n < 0n ? -n : n);

/** `WorkerConfig::validate` on the exact form. */
function validateExact(e: ExactConfig): void {
  if (e.version !== WIRE_VERSION) throw ConfigError.version(e.version);
  const field = ConfigError.field;
  if (!(Number.isFinite(e.setPoint) && e.setPoint > 0.0 && e.setPoint < 1.0)) {
    throw field("setPoint", `${e.setPoint} is not in (0, 1)`);
  }
  if (e.reaction === 0n) throw field("reaction", "must be at least 1");
  if (e.maxPermits === 0n) throw field("maxPermits", "must be at least 1");
  if (e.probeInitialMs === 0n) throw field("probeInitialMs", "must be at least 1");
  if (e.probeMaxMs < e.probeInitialMs) {
    throw field("probeMaxMs", `${e.probeMaxMs} is below probeInitialMs ${e.probeInitialMs}`);
  }
  if (e.generation < 0n) throw field("generation", "must not be negative");
  const safe: [string, bigint | undefined][] = [
    ["generation", abs(e.generation)],
    ["probeInitialMs", e.probeInitialMs],
    ["probeMaxMs", e.probeMaxMs],
    ["ratioWindowMs", e.ratioWindowMs],
    ["brakeReleaseMs", e.brakeReleaseMs],
    ["redelivery.baseMs", e.redelivery?.baseMs],
    ["redelivery.maxMs", e.redelivery?.maxMs],
    [
      "brake.expiresAtUnix",
      e.brake?.expiresAtUnix === undefined ? undefined : abs(e.brake.expiresAtUnix),
    ],
  ];
  for (const [name, v] of safe) {
    if (v !== undefined && v > SAFE) {
      throw field(
        name,
        `${v} is beyond 2^53 - 1, the largest integer every JSON reader holds exactly`,
      );
    }
  }
  if (e.ratioWindowMs === 0n) throw field("ratioWindowMs", "must be at least 1");
  if (e.floorMax !== undefined) {
    const f = e.floorMax;
    if (!(Number.isFinite(f) && f >= 0.0 && f <= defaults.MAX_FLOOR_MAX)) {
      throw field("floorMax", `${f} is not in [0, ${defaults.MAX_FLOOR_MAX}]`);
    }
  }
  if (e.redelivery !== undefined && e.redelivery.maxMs < e.redelivery.baseMs) {
    throw field(
      "redelivery.maxMs",
      `${e.redelivery.maxMs} is below redelivery.baseMs ${e.redelivery.baseMs}`,
    );
  }
  if (e.brake !== undefined) {
    const b = e.brake.minBackoff;
    if (!(Number.isFinite(b) && b >= 0.0 && b <= 1.0)) {
      throw field("brake.minBackoff", `${b} is not in [0, 1]`);
    }
  }
  if (e.hash !== "") {
    const computed = computeHash(toPublic(e));
    if (computed !== e.hash) throw ConfigError.hash(e.hash, computed);
  }
}

/**
 * Parses and validates a payload: size, JSON shape, version, ranges, and (when given) the
 * hash. Throws a `ConfigError`.
 */
export function parseWorkerConfig(bytes: Uint8Array | string): WorkerConfig {
  const data = typeof bytes === "string" ? new TextEncoder().encode(bytes) : bytes;
  if (data.length > MAX_PAYLOAD_BYTES) throw ConfigError.tooLarge(data.length);
  let json: JsonValue;
  try {
    json = parseJsonBytes(data);
  } catch (e) {
    if (e instanceof JsonSyntaxError) throw ConfigError.malformed(e.message);
    throw e;
  }
  return workerConfigFromJson(json);
}

/**
 * Decodes and validates a payload already read as JSON (a document inside another one, such
 * as a conformance case's `config`): the shape, version, ranges and (when given) the hash, as
 * `parseWorkerConfig` without the size limit. Throws a `ConfigError`.
 */
export function workerConfigFromJson(json: JsonValue): WorkerConfig {
  const exact = workerConfig(json, "") as ExactConfig;
  validateExact(exact);
  return toPublic(exact);
}

/** Checks version, ranges and the hash (empty: not given) of a config. Throws a `ConfigError`. */
export function validateWorkerConfig(cfg: WorkerConfig): void {
  validateExact(toExact(cfg));
}

/** The document as the Rust worker serializes it (optional fields left out when absent). */
function serialized(cfg: WorkerConfig): { [key: string]: Plain } {
  const out: { [key: string]: Plain } = {
    version: cfg.version,
    generation: cfg.generation,
    hash: cfg.hash,
    algorithm: cfg.algorithm,
    setPoint: cfg.setPoint,
    reaction: cfg.reaction,
    maxPermits: cfg.maxPermits,
    probeInitialMs: cfg.probeInitialMs,
    probeMaxMs: cfg.probeMaxMs,
  };
  if (cfg.initialPermits !== undefined) out.initialPermits = cfg.initialPermits;
  if (cfg.ratioWindowMs !== undefined) out.ratioWindowMs = cfg.ratioWindowMs;
  if (cfg.brakeReleaseMs !== undefined) out.brakeReleaseMs = cfg.brakeReleaseMs;
  if (cfg.floorMax !== undefined) out.floorMax = cfg.floorMax;
  if (cfg.redelivery !== undefined) {
    const r: RedeliveryConfig = cfg.redelivery;
    out.redelivery = { baseMs: r.baseMs, maxMs: r.maxMs };
  }
  if (cfg.brake !== undefined) {
    const b: { [key: string]: Plain } = { minBackoff: cfg.brake.minBackoff };
    if (cfg.brake.expiresAtUnix !== undefined) b.expiresAtUnix = cfg.brake.expiresAtUnix;
    out.brake = b;
  }
  return out;
}

/** The document as JSON (what the operator sends; optional fields absent when not set). */
export function workerConfigToJson(cfg: WorkerConfig): string {
  return JSON.stringify(serialized(cfg));
}

/**
 * The canonical JSON the hash is computed over: RFC 8785 of the payload with `hash` empty and
 * `generation` zero.
 */
export function canonicalContent(cfg: WorkerConfig): string {
  return canonicalJson(serialized({ ...cfg, hash: "", generation: 0 }));
}

/** The first 12 lowercase hex digits of the SHA-256 of a text. */
export function hex12(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex").slice(0, 12);
}

/** The content hash of a config (see `canonicalContent`). */
export function computeHash(cfg: WorkerConfig): string {
  return hex12(canonicalContent(cfg));
}

/** The config with its hash filled in. */
export function withHash(cfg: WorkerConfig): WorkerConfig {
  return { ...cfg, hash: computeHash(cfg) };
}

/** The built-in defaults of the API as a payload, with its hash. */
export function defaultWorkerConfig(): WorkerConfig {
  return withHash(defaultWorkerConfigUnhashed());
}

/** The effective brake at `nowUnix` (null once expired). */
export function activeBrake(cfg: WorkerConfig, nowUnix: number): number | null {
  const b = cfg.brake;
  if (b === undefined) return null;
  if (b.expiresAtUnix !== undefined && nowUnix >= b.expiresAtUnix) return null;
  return b.minBackoff;
}
