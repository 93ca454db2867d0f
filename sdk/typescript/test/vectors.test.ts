// The golden vectors generated from the Rust implementation (conformance/README.md):
// controller.json (every case, every step's expectations) and hash.json. They are read from the
// repository's conformance/vectors/, or from $BP_VECTORS_typescript. A missing file fails.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  type Mode,
  type Observation,
  WIRE_VERSION,
  canonicalContent,
  canonicalJson,
  computeHash,
  executeCase,
  hex12,
  parseCase,
  parseWorkerConfig,
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

/** A case as the file has it; the executor reads the rest (seed, config, the steps' calls). */
interface Case {
  name: string;
  steps: { t: number; op: string; expect: Expect }[];
}

interface ControllerVectors {
  format: string;
  tolerance: number;
  cases: Case[];
}

/**
 * Runs one case through the SDK's conformance executor (the hook's), sent as the suite sends
 * it: the case's JSON as it is in the file. Throws naming the case, the step index and the
 * reading that differs.
 */
function runCase(c: Case, tolerance: number): number {
  const observations: Observation[] = executeCase(parseCase(JSON.stringify(c)));
  assert.equal(observations.length, c.steps.length, `case ${c.name}: one reading per step`);
  c.steps.forEach((step, i) => {
    const where = `case ${c.name}, step ${i} (t=${step.t}, ${step.op})`;
    const got = observations[i] as Observation;
    const want = step.expect;
    const near = (what: string, value: number, expected: number) =>
      assert.ok(
        Math.abs(value - expected) <= tolerance,
        `${where}: ${what} ${value}, expected ${expected}`,
      );
    near("backoff", got.backoff, want.backoff);
    assert.equal(got.mode, want.mode, `${where}: mode`);
    assert.equal(got.limit, want.limit, `${where}: limit`);
    assert.equal(got.permits, want.permits, `${where}: permits`);
    if (want.failureFloor !== undefined) {
      near("failureFloor", got.failureFloor, want.failureFloor);
    }
    if (want.floorEstimate !== undefined) {
      if (want.floorEstimate === null || got.floorEstimate === null) {
        assert.equal(got.floorEstimate, want.floorEstimate, `${where}: floorEstimate`);
      } else {
        near("floorEstimate", got.floorEstimate, want.floorEstimate);
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
