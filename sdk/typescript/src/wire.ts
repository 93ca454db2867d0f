/**
 * The wire contract between the operator and the workers (a port of `crates/api/src/wire.rs`
 * and `crates/api/src/defaults.rs`): names, limits, the payload's types and the built-in
 * defaults. Parsing and validation live in `config.ts`.
 */

/** Version of this contract, carried in every payload. */
export const WIRE_VERSION = "backpressure.dev/worker-config/v1";
/** Prefix of the audience of the ServiceAccount token presented on a push (see {@link pushAudience}). */
export const TOKEN_AUDIENCE = "backpressure.dev";
/** How far (in milliseconds) a pushed `generation` may be ahead of the worker's wall clock. */
export const MAX_GENERATION_LEAD_MS = 5 * 60 * 1000;
/** HTTP path of the configuration endpoint on the admin port. */
export const CONFIG_PATH = "/v1/config";
/** Name of the container port the operator pushes to. */
export const ADMIN_PORT_NAME = "bp-admin";
/** Admin port used when the pod declares no port named {@link ADMIN_PORT_NAME}. */
export const DEFAULT_ADMIN_PORT = 9464;
/** File name of the configuration inside the operator's ConfigMap. */
export const CONFIG_FILE_NAME = "worker-config.json";
/** Largest payload a worker must accept; larger bodies are refused with 413. */
export const MAX_PAYLOAD_BYTES = 64 * 1024;

/**
 * The token audience of the workers of `workload` in `namespace`:
 * `backpressure.dev/<namespace>/<workload>`.
 */
export function pushAudience(namespace: string, workload: string): string {
  return `${TOKEN_AUDIENCE}/${namespace}/${workload}`;
}

/** Metric names and labels every worker uses (`wire::metrics`). */
export const metricNames = {
  LABEL_WORKLOAD: "workload",
  LABEL_NAMESPACE: "namespace",
  LABEL_CLASS: "class",
  LABEL_HASH: "hash",
  LABEL_ALGORITHM: "algorithm",
  BACKOFF: "backpressure_backoff_factor",
  FAILURE_FLOOR: "backpressure_failure_floor",
  PERMITS: "backpressure_permits",
  IN_FLIGHT: "backpressure_in_flight",
  OUTCOMES_TOTAL: "backpressure_outcomes_total",
  PROBES_TOTAL: "backpressure_probes_total",
  CONFIG_INFO: "backpressure_config_info",
  CLASS_SUCCESS: "success",
  CLASS_DEPENDENCY_FAILURE: "dependency_failure",
  CLASS_MESSAGE_FAILURE: "message_failure",
} as const;

/** The controller algorithms, spelled as in the CRD and the payload. */
export type Algorithm = "SetPoint" | "RatioThrottle" | "Fixed" | "Off";
/** Every algorithm. */
export const ALGORITHMS: readonly Algorithm[] = ["SetPoint", "RatioThrottle", "Fixed", "Off"];

/** The brake as the worker sees it. `minBackoff` 1 stops everything, probes included. */
export interface BrakeConfig {
  /** Minimum backoff in [0,1]. */
  minBackoff: number;
  /** Unix time in seconds at which the brake lifts itself, if any. */
  expiresAtUnix?: number;
}

/** The redelivery backoff of a failed message. */
export interface RedeliveryConfig {
  /** Delay after a failed first delivery in milliseconds; 0 turns the backoff off. */
  baseMs: number;
  /** Longest delay in milliseconds (>= `baseMs`). */
  maxMs: number;
}

/** The configuration document pushed to every worker. Optional fields are absent, never `undefined`. */
export interface WorkerConfig {
  version: string;
  generation: number;
  hash: string;
  algorithm: Algorithm;
  setPoint: number;
  reaction: number;
  maxPermits: number;
  probeInitialMs: number;
  probeMaxMs: number;
  initialPermits?: number;
  ratioWindowMs?: number;
  brakeReleaseMs?: number;
  floorMax?: number;
  redelivery?: RedeliveryConfig;
  brake?: BrakeConfig;
}

/** The worker's answer to a push, and to `GET /v1/config`. */
export interface ConfigAck {
  hash: string;
  generation: number;
}

/** Built-in defaults (`crates/api/src/defaults.rs`). */
export const defaults = {
  SET_POINT: 0.05,
  MIN_SET_POINT: 1e-4,
  MAX_PERMITS: 16,
  MIN_REACTION: 20,
  PROBE_INITIAL_MS: 2_000,
  PROBE_MAX_MS: 60_000,
  INITIAL_PERMITS: 2,
  RATIO_WINDOW_MS: 30_000,
  BRAKE_RELEASE_MS: 60_000,
  FLOOR_MAX: 0.25,
  MAX_FLOOR_MAX: 0.9,
  REDELIVERY_BASE_MS: 60_000,
  REDELIVERY_MAX_MS: 480_000,
  /** Default reaction size for a given maximum of permits: max(20, maxPermits). */
  reaction(maxPermits: number): number {
    return maxPermits > 20 ? maxPermits : 20;
  },
} as const;

/** The built-in defaults of the API as a payload, without its hash (see `defaultWorkerConfig`). */
export function defaultWorkerConfigUnhashed(): WorkerConfig {
  return {
    version: WIRE_VERSION,
    generation: 0,
    hash: "",
    algorithm: "SetPoint",
    setPoint: defaults.SET_POINT,
    reaction: defaults.reaction(defaults.MAX_PERMITS),
    maxPermits: defaults.MAX_PERMITS,
    probeInitialMs: defaults.PROBE_INITIAL_MS,
    probeMaxMs: defaults.PROBE_MAX_MS,
  };
}
