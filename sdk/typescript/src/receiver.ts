/**
 * The config receiver's core (a port of `crates/worker/src/config/mod.rs`): `ConfigState`
 * applies a WorkerConfig at runtime, from the mounted file (`FileWatcher`) and from pushes to
 * the admin port. It validates the payload, checks it against the worker's own `Limits`
 * (values the wire contract allows but that would hurt this worker, and a generation far ahead
 * of its clock), refuses a payload older than the running generation, applies the controller
 * settings and brake to the `Gate`, and updates the config-info metric. A refused payload
 * leaves the running configuration unchanged. Over-limit values are refused (400 naming the
 * field), never clamped: the worker acknowledges the hash of what it runs.
 */

import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";

import { ConfigError, parseWorkerConfig, validateWorkerConfig, withHash } from "./config.js";
import { type Settings, settingsFromConfig } from "./controller/index.js";
import type { Logger } from "./log.js";
import { defaultLogger } from "./log.js";
import type { Metrics } from "./metrics.js";
import type { Gate } from "./permits.js";
import {
  type ConfigAck,
  MAX_GENERATION_LEAD_MS,
  type WorkerConfig,
  defaultWorkerConfigUnhashed,
} from "./wire.js";

/** Older than the running generation (HTTP 409). */
export class StaleGenerationError extends Error {
  override readonly name = "StaleGenerationError";
  constructor(
    readonly running: number,
    readonly given: number,
  ) {
    super(`generation ${given} is older than the running generation ${running}`);
  }
}

/** Why a configuration was not applied: invalid (400, or 413 when too large) or stale (409). */
export type ApplyError = ConfigError | StaleGenerationError;

/** The worker's own bounds on a configuration, checked on every update (push or file). */
export interface Limits {
  /** Largest `maxPermits` (and `initialPermits`). Default 1024. */
  maxPermits: number;
  /** Largest `reaction`. Default 100000. */
  maxReaction: number;
  /** Smallest `probeInitialMs` and `probeMaxMs`. Default 100 ms. */
  minProbeMs: number;
  /** Largest `probeInitialMs` and `probeMaxMs`. Default 1 h. */
  maxProbeMs: number;
  /** How far `generation` (Unix ms) may be ahead of this worker's clock. Default 5 min. */
  maxGenerationLeadMs: number;
  /** Largest `ratioWindowMs` and `brakeReleaseMs`. Default 1 h. */
  maxWindowMs: number;
  /** Largest `redelivery.maxMs` (and `baseMs`). Default 12 h. */
  maxRedeliveryMs: number;
}

/** The default limits (as the Rust worker's). */
export const DEFAULT_LIMITS: Readonly<Limits> = {
  maxPermits: 1024,
  maxReaction: 100_000,
  minProbeMs: 100,
  maxProbeMs: 3_600_000,
  maxGenerationLeadMs: MAX_GENERATION_LEAD_MS,
  maxWindowMs: 3_600_000,
  maxRedeliveryMs: 43_200_000,
};

/** Checks `cfg` against `limits` at `nowUnix` (seconds); throws a `ConfigError` naming the field. */
export function checkLimits(limits: Limits, cfg: WorkerConfig, nowUnix: number): void {
  const field = ConfigError.field;
  if (cfg.maxPermits > limits.maxPermits) {
    throw field(
      "maxPermits",
      `${cfg.maxPermits} exceeds this worker's limit of ${limits.maxPermits}`,
    );
  }
  if (cfg.reaction > limits.maxReaction) {
    throw field("reaction", `${cfg.reaction} exceeds this worker's limit of ${limits.maxReaction}`);
  }
  for (const [name, ms] of [
    ["probeInitialMs", cfg.probeInitialMs],
    ["probeMaxMs", cfg.probeMaxMs],
  ] as const) {
    if (ms < limits.minProbeMs || ms > limits.maxProbeMs) {
      throw field(
        name,
        `${ms} ms is outside this worker's range of ${limits.minProbeMs} to ${limits.maxProbeMs} ms`,
      );
    }
  }
  if (cfg.initialPermits !== undefined && cfg.initialPermits > limits.maxPermits) {
    throw field(
      "initialPermits",
      `${cfg.initialPermits} exceeds this worker's limit of ${limits.maxPermits}`,
    );
  }
  for (const [name, ms] of [
    ["ratioWindowMs", cfg.ratioWindowMs],
    ["brakeReleaseMs", cfg.brakeReleaseMs],
  ] as const) {
    if (ms !== undefined && ms > limits.maxWindowMs) {
      throw field(name, `${ms} ms exceeds this worker's limit of ${limits.maxWindowMs} ms`);
    }
  }
  if (cfg.redelivery !== undefined) {
    const most = Math.max(cfg.redelivery.maxMs, cfg.redelivery.baseMs);
    if (most > limits.maxRedeliveryMs) {
      throw field(
        "redelivery.maxMs",
        `${most} ms exceeds this worker's limit of ${limits.maxRedeliveryMs} ms`,
      );
    }
  }
  checkGenerationLead(cfg.generation, nowUnix, limits.maxGenerationLeadMs);
}

/** Refuses a `generation` more than `maxLeadMs` ahead of `nowUnix` (seconds). */
export function checkGenerationLead(generation: number, nowUnix: number, maxLeadMs: number): void {
  const horizon = nowUnix * 1000 + maxLeadMs;
  if (generation > horizon) {
    throw ConfigError.field(
      "generation",
      `${generation} is more than ${Math.trunc(maxLeadMs / 1000)} s ahead of this worker's clock (${nowUnix * 1000} ms); generations are Unix milliseconds`,
    );
  }
}

/** Where the running configuration came from. */
export type Origin = "initial" | "file" | "push";

/** Unix time in whole seconds. */
export function unixNow(): number {
  return Math.floor(Date.now() / 1000);
}

/** Options of a `ConfigState`. */
export interface ConfigStateOptions {
  /** Metrics whose config-info series follows the running config. */
  metrics?: Metrics;
  /** The bounds updates are checked against (default `DEFAULT_LIMITS`). */
  limits?: Partial<Limits>;
  /** Where warnings and applied configs are reported. */
  logger?: Logger;
}

/** The running configuration and where it is applied. */
export class ConfigState {
  private doc: WorkerConfig;
  private from: Origin = "initial";
  /** Library-side settings kept across pushes, and the application's optional fields. */
  private readonly base: Settings;
  readonly limits: Readonly<Limits>;
  private readonly metrics: Metrics | undefined;
  private readonly logger: Logger;

  /**
   * Starts from `initial` (validated; an invalid one is replaced by the default), applying it
   * to `gate`. The library-side knobs of the gate's current settings are kept across updates.
   * The initial config is the application's own and is not checked against the limits.
   */
  constructor(
    readonly gate: Gate,
    initial: WorkerConfig,
    options: ConfigStateOptions = {},
  ) {
    this.logger = options.logger ?? defaultLogger;
    this.metrics = options.metrics;
    this.limits = { ...DEFAULT_LIMITS, ...options.limits };
    let first = initial;
    try {
      validateWorkerConfig(initial);
    } catch (e) {
      this.logger.warn("invalid initial worker config; using the defaults", { error: String(e) });
      first = defaultWorkerConfigUnhashed();
    }
    this.doc = first.hash === "" ? withHash(first) : first;
    this.base = gate.settings();
    this.install(this.doc, unixNow());
  }

  /** The running configuration. */
  running(): WorkerConfig {
    return structuredClone(this.doc);
  }

  /** The running hash and generation. */
  ack(): ConfigAck {
    return { hash: this.doc.hash, generation: this.doc.generation };
  }

  /** Where the running configuration came from. */
  origin(): Origin {
    return this.from;
  }

  /** Parses, validates and applies a payload. Throws an `ApplyError`. */
  applyBytes(bytes: Uint8Array | string, origin: Origin): ConfigAck {
    return this.apply(parseWorkerConfig(bytes), origin);
  }

  /** Validates and applies a configuration. Throws an `ApplyError`. */
  apply(cfg: WorkerConfig, origin: Origin): ConfigAck {
    return this.applyAt(cfg, origin, unixNow());
  }

  /** `apply` with the current Unix time (seconds) given. */
  applyAt(cfg: WorkerConfig, origin: Origin, nowUnix: number): ConfigAck {
    validateWorkerConfig(cfg);
    checkLimits(this.limits, cfg, nowUnix);
    const doc = cfg.hash === "" ? withHash(cfg) : structuredClone(cfg);
    const current = this.doc.generation;
    if (doc.generation < current) throw new StaleGenerationError(current, doc.generation);
    const ack = { hash: doc.hash, generation: doc.generation };
    if (doc.hash === this.doc.hash && doc.generation === current) return ack;
    this.install(doc, nowUnix);
    this.logger.info("worker config applied", {
      hash: ack.hash,
      generation: ack.generation,
      from: origin,
      previous: this.doc.hash,
    });
    this.doc = doc;
    this.from = origin;
    return ack;
  }

  private install(cfg: WorkerConfig, nowUnix: number): void {
    const b = this.base;
    const from = settingsFromConfig(cfg);
    // A field the payload carries wins; one it leaves out keeps the application's setting.
    const settings: Settings = {
      ...from,
      credit: b.credit,
      healthCheckProbes: b.healthCheckProbes,
      ratioWindow: cfg.ratioWindowMs !== undefined ? from.ratioWindow : b.ratioWindow,
      brakeRelease: cfg.brakeReleaseMs !== undefined ? from.brakeRelease : b.brakeRelease,
      initialPermits: cfg.initialPermits !== undefined ? from.initialPermits : b.initialPermits,
      floorMax: cfg.floorMax !== undefined ? from.floorMax : b.floorMax,
      redelivery: cfg.redelivery !== undefined ? from.redelivery : b.redelivery,
    };
    this.gate.apply(settings, cfg.brake ?? null, nowUnix);
    this.metrics?.setConfig(cfg.hash, cfg.algorithm);
  }
}

/** Default interval between checks of the mounted file (ms). */
export const DEFAULT_FILE_POLL_MS = 1000;

/** What one check of the file found. */
export type FileCheck =
  | { result: "unchanged" }
  | { result: "applied"; ack: ConfigAck }
  | { result: "refused"; error: ApplyError }
  | { result: "unreadable"; error: Error };

/**
 * Watches the mounted `worker-config.json` and applies it when its content changes. It polls
 * the content through the path (following symlinks), which handles both a file rewritten in
 * place and kubelet's ConfigMap update (an atomic swap of the `..data` symlink). A missing
 * file is waited for; an invalid file is reported once per content and the running config
 * stays.
 */
export class FileWatcher {
  private lastDigest: string | null = null;
  private timer: NodeJS.Timeout | null = null;
  private checking = false;
  private unreadableReported = false;
  private readonly logger: Logger;

  constructor(
    readonly state: ConfigState,
    readonly path: string,
    logger?: Logger,
  ) {
    this.logger = logger ?? defaultLogger;
  }

  /** Reads the file once and applies it if its content changed. */
  async check(): Promise<FileCheck> {
    let bytes: Buffer;
    try {
      bytes = await readFile(this.path);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code === "ENOENT") return { result: "unchanged" };
      return { result: "unreadable", error: err };
    }
    const digest = createHash("sha256").update(bytes).digest("hex");
    if (digest === this.lastDigest) return { result: "unchanged" };
    this.lastDigest = digest;
    try {
      return { result: "applied", ack: this.state.applyBytes(bytes, "file") };
    } catch (e) {
      if (e instanceof ConfigError || e instanceof StaleGenerationError) {
        this.logger.warn("worker config file refused; keeping the running one", {
          path: this.path,
          error: e.message,
        });
        return { result: "refused", error: e };
      }
      throw e;
    }
  }

  /** Checks the file every `intervalMs` until `stop()`. */
  start(intervalMs: number = DEFAULT_FILE_POLL_MS): this {
    this.stop();
    const tick = async () => {
      if (this.checking) return;
      this.checking = true;
      try {
        const r = await this.check();
        if (r.result === "unreadable") {
          if (!this.unreadableReported) {
            this.unreadableReported = true;
            this.logger.warn("cannot read the worker config file", {
              path: this.path,
              error: r.error.message,
            });
          }
        } else {
          this.unreadableReported = false;
        }
      } finally {
        this.checking = false;
      }
    };
    void tick();
    this.timer = setInterval(() => void tick(), intervalMs);
    return this;
  }

  /** Stops watching. */
  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }
}
