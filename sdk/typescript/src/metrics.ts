/**
 * Prometheus metrics of the wire contract with prom-client (a port of
 * `crates/worker/src/metrics.rs`): the `backpressure_*` names, types and labels, every series
 * labelled with the workload name, served as OpenMetrics text like the Rust worker.
 */

import { Counter, Gauge, type OpenMetricsContentType, Registry } from "prom-client";

import type { Outcome } from "./controller/index.js";
import { OUTCOMES } from "./controller/index.js";
import { type Algorithm, metricNames as names } from "./wire.js";

/** The worker's metrics and the registry that exposes them. */
export class Metrics {
  /** The registry (to add the application's own metrics; they get the workload label too). */
  readonly registry: Registry<OpenMetricsContentType>;
  private readonly backoff: Gauge;
  private readonly failureFloor: Gauge;
  private readonly permits: Gauge;
  private readonly inFlight: Gauge;
  private readonly outcomes: Counter<"class">;
  private readonly probes: Counter;
  private readonly configInfo: Gauge<"hash" | "algorithm">;
  private readonly counts = new Map<Outcome, number>();
  private probesCounted = 0;

  /** A worker's metrics for `workload` in a registry of their own. */
  constructor(workload: string) {
    this.registry = new Registry<OpenMetricsContentType>();
    this.registry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
    this.registry.setDefaultLabels({ [names.LABEL_WORKLOAD]: workload });
    const registers = [this.registry];
    this.backoff = new Gauge({
      name: names.BACKOFF,
      help: "Backoff factor of the worker's backpressure controller, in [0,1]",
      registers,
    });
    this.failureFloor = new Gauge({
      name: names.FAILURE_FLOOR,
      help: "Share of dependency calls the worker found to fail whatever its concurrency, in [0,1]",
      registers,
    });
    this.permits = new Gauge({
      name: names.PERMITS,
      help: "Messages the worker may process at once right now",
      registers,
    });
    this.inFlight = new Gauge({
      name: names.IN_FLIGHT,
      help: "Messages being processed",
      registers,
    });
    this.outcomes = new Counter({
      name: names.OUTCOMES_TOTAL,
      help: "Message outcomes by class",
      labelNames: [names.LABEL_CLASS],
      registers,
    });
    this.probes = new Counter({
      name: names.PROBES_TOTAL,
      help: "Probes sent while fully backed off",
      registers,
    });
    this.configInfo = new Gauge({
      name: names.CONFIG_INFO,
      help: "The running worker configuration (value 1)",
      labelNames: [names.LABEL_HASH, names.LABEL_ALGORITHM],
      registers,
    });
    // Every series exists from the start, as in the Rust worker.
    for (const o of OUTCOMES) {
      this.outcomes.inc({ class: o }, 0);
      this.counts.set(o, 0);
    }
    this.backoff.set(0);
    this.failureFloor.set(0);
    this.permits.set(0);
    this.inFlight.set(0);
  }

  /** Sets the backoff gauge. */
  setBackoff(backoff: number): void {
    this.backoff.set(backoff);
  }

  /** Sets the failure-floor gauge: NaN while the controller does not know its floor. */
  setFailureFloor(floor: number | null): void {
    this.failureFloor.set(floor ?? NaN);
  }

  /** Sets the permits gauge. */
  setPermits(permits: number): void {
    this.permits.set(permits);
  }

  /** Sets the in-flight gauge. */
  setInFlight(inFlight: number): void {
    this.inFlight.set(inFlight);
  }

  /** Counts one outcome. */
  recordOutcome(outcome: Outcome): void {
    this.outcomes.inc({ class: outcome });
    this.counts.set(outcome, (this.counts.get(outcome) ?? 0) + 1);
  }

  /** Counts one probe. */
  recordProbe(): void {
    this.probes.inc();
    this.probesCounted += 1;
  }

  /** Replaces the config info series with the running hash and algorithm. */
  setConfig(hash: string, algorithm: Algorithm): void {
    this.configInfo.reset();
    this.configInfo.set({ hash, algorithm }, 1);
  }

  /** The outcome count of a class so far. */
  outcomeCount(outcome: Outcome): number {
    return this.counts.get(outcome) ?? 0;
  }

  /** Probes counted so far. */
  probeCount(): number {
    return this.probesCounted;
  }

  /** The content type of `encode`'s text. */
  get contentType(): string {
    return this.registry.contentType;
  }

  /** The OpenMetrics text exposition. */
  async encode(): Promise<string> {
    const text = await this.registry.metrics();
    // prom-client writes NaN as `Nan`; the exposition formats spell it `NaN`.
    return text.replace(/ Nan$/gm, " NaN");
  }
}
