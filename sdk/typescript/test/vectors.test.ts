// The golden vectors generated from the Rust implementation (conformance/README.md):
// controller.json (every case, every step's expectations) and hash.json. They are read from the
// repository's conformance/vectors/, or from $BP_VECTORS_typescript. A missing file fails.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  Brake,
  type Controller,
  type Mode,
  type Outcome,
  WIRE_VERSION,
  applySettings,
  canonicalContent,
  canonicalJson,
  computeHash,
  controllerFromConfig,
  hex12,
  parseWorkerConfig,
  settingsFromConfig,
} from "../src/index.js";
import type { Plain } from "../src/json.js";

/** sdk/typescript/ (this file runs as build/test/vectors.test.js). */
const SDK_DIR = fileURLToPath(new URL("../../", import.meta.url));

/** Where the vectors are: $BP_VECTORS_typescript, else the repository's conformance/vectors/. */
export function vectorsDir(): string {
  return process.env.BP_VECTORS_typescript ?? path.resolve(SDK_DIR, "../../conformance/vectors");
}

function load(name: string): unknown {
  const file = path.join(vectorsDir(), name);
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    // A missing vectors file is a failure, not a skip.
    throw new Error(`golden vectors ${file} cannot be read (set BP_VECTORS_typescript?): ${e}`);
  }
  return JSON.parse(text);
}

interface Expect {
  backoff: number;
  mode: Mode;
  limit: number;
  permits?: number;
  failureFloor?: number;
  floorEstimate?: number | null;
}

type Step = { t: number; expect: Expect } & (
  | { op: "record"; outcome: Outcome }
  | { op: "permits"; inFlight: number }
  | { op: "releaseUnused"; unused: number }
  | { op: "configure"; config: unknown; unixS: number }
);

interface Case {
  name: string;
  description: string;
  seed: number;
  brakeOffsetNs: number;
  config: unknown;
  steps: Step[];
}

interface ControllerVectors {
  format: string;
  tolerance: number;
  cases: Case[];
}

/** Runs one case; throws naming the case, the step index and the reading that differs. */
function runCase(c: Case, tolerance: number): number {
  const seed = BigInt(c.seed);
  const offset = c.brakeOffsetNs;
  let controller: Controller = controllerFromConfig(
    parseWorkerConfig(JSON.stringify(c.config)),
    seed,
  );
  let brake: Brake | null = null;
  c.steps.forEach((step, i) => {
    const where = `case ${c.name}, step ${i} (t=${step.t}, ${step.op})`;
    const t = step.t;
    let permits: number | undefined;
    switch (step.op) {
      case "record":
        controller.record(t, step.outcome);
        break;
      case "permits":
        permits = controller.permits(t, step.inFlight);
        break;
      case "releaseUnused":
        controller.releaseUnused(t, step.unused);
        break;
      case "configure": {
        const cfg = parseWorkerConfig(JSON.stringify(step.config));
        const settings = settingsFromConfig(cfg);
        const next = cfg.brake === undefined ? null : Brake.fromWire(cfg.brake, t, step.unixS);
        brake = Brake.succeed(brake, next, t, settings.brakeRelease, offset);
        controller = applySettings(controller, t, settings, seed, brake);
        break;
      }
      default:
        assert.fail(`${where}: unknown op ${JSON.stringify((step as { op: unknown }).op)}`);
    }
    const want = step.expect;
    const near = (what: string, got: number, expected: number) =>
      assert.ok(
        Math.abs(got - expected) <= tolerance,
        `${where}: ${what} ${got}, expected ${expected}`,
      );
    near("backoff", controller.backoff(t), want.backoff);
    assert.equal(controller.mode(), want.mode, `${where}: mode`);
    assert.equal(controller.limit(t), want.limit, `${where}: limit`);
    if (want.permits !== undefined) assert.equal(permits, want.permits, `${where}: permits`);
    if (want.failureFloor !== undefined) {
      near("failureFloor", controller.failureFloor(), want.failureFloor);
    }
    if (want.floorEstimate !== undefined) {
      const got = controller.floorEstimate();
      if (want.floorEstimate === null || got === null) {
        assert.equal(got, want.floorEstimate, `${where}: floorEstimate`);
      } else {
        near("floorEstimate", got, want.floorEstimate);
      }
    }
  });
  return c.steps.length;
}

test("controller.json: every case and every step as the Rust controllers", async (t) => {
  const v = load("controller.json") as ControllerVectors;
  assert.equal(v.format, "backpressure.dev/controller-vectors/v1");
  assert.ok(v.cases.length > 0, "no cases");
  const names = new Set<string>();
  let steps = 0;
  for (const c of v.cases) {
    assert.ok(!names.has(c.name), `duplicate case ${c.name}`);
    names.add(c.name);
    await t.test(c.name, () => {
      steps += runCase(c, v.tolerance);
    });
  }
  t.diagnostic(`${v.cases.length} cases, ${steps} steps`);
});

interface HashCase {
  name: string;
  payload: { [key: string]: Plain };
  jcs: string;
  hash: string;
}

test("hash.json: the canonical JSON and content hash of every payload", async (t) => {
  const v = load("hash.json") as { format: string; cases: HashCase[] };
  assert.equal(v.format, "backpressure.dev/hash-vectors/v1");
  assert.ok(v.cases.length > 0, "no cases");
  let worker = 0;
  for (const c of v.cases) {
    await t.test(c.name, () => {
      if (c.payload.version === WIRE_VERSION) {
        // Parsed and validated as a push is (its given hash checked), then hashed.
        const cfg = parseWorkerConfig(JSON.stringify(c.payload));
        assert.equal(canonicalContent(cfg), c.jcs, "canonical JSON");
        assert.equal(computeHash(cfg), c.hash, "hash");
        assert.equal(cfg.hash, c.hash, "the payload carries its hash");
        worker += 1;
      } else {
        // Another document of the contract (the producer state, not in this SDK): the same
        // canonical form and hash, over the document as received.
        const content = canonicalJson({ ...c.payload, hash: "", generation: 0 });
        assert.equal(content, c.jcs, "canonical JSON");
        assert.equal(hex12(content), c.hash, "hash");
      }
    });
  }
  assert.ok(worker > 0, "no worker config case");
});
