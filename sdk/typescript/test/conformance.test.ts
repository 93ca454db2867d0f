// The conformance executor (crates/worker/src/conformance.rs tests) and the hook through the
// admin handler (crates/worker/src/config/admin.rs): off by default (404), one case on a fresh
// controller (200), 400 for what is not a case, 413 over 16 MiB.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Admin,
  type AdminRequest,
  CaseError,
  ConfigState,
  Gate,
  HOOK_PATH,
  MAX_CASE_BYTES,
  Metrics,
  buildController,
  defaultSettings,
  defaultWorkerConfig,
  executeCase,
  parseCase,
  workerConfigToJson,
} from "../src/index.js";
import { silentLogger } from "../src/log.js";

const CONFIG = workerConfigToJson(defaultWorkerConfig());

/** A case of the vectors' format with these steps (JSON texts); `expect`s may be in them. */
function caseText(steps: readonly string[], config = CONFIG): string {
  return `{"name": "n", "description": "d", "seed": 7, "brakeOffsetNs": 0, "config": ${config}, "steps": [${steps.join(",")}]}`;
}

const T = 1_000_000_000;

/** The Rust executor's test: a fresh controller starts at 2 permits; 40 dependency failures back it off fully. */
function docExample(): string[] {
  const steps = [`{"t": ${T}, "op": "permits", "inFlight": 0, "expect": {}}`];
  for (let i = 0; i < 40; i++) {
    steps.push(`{"t": ${T}, "op": "record", "outcome": "dependency_failure"}`);
  }
  steps.push(`{"t": ${T}, "op": "permits", "inFlight": 0}`);
  return steps;
}

function thrown(f: () => unknown): CaseError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof CaseError, `not a CaseError: ${e}`);
    return e;
  }
  assert.fail("accepted");
}

test("a case runs on a fresh controller, step by step", () => {
  const obs = executeCase(parseCase(caseText(docExample())));
  assert.equal(obs.length, 42);
  assert.equal(obs[0]?.permits, 2);
  assert.equal(obs[0]?.mode, "starting");
  assert.equal(obs[0]?.floorEstimate, null);
  assert.equal(obs[1]?.permits, undefined);
  assert.equal(obs[41]?.backoff, 1.0);
  assert.equal(obs[41]?.permits, 0);
  assert.equal(obs[41]?.limit, 0);
  // The same case again gives the same readings: nothing is shared between runs.
  assert.deepEqual(executeCase(parseCase(caseText(docExample()))), obs);
});

test("a configure step applies the payload, its brake and a new algorithm", () => {
  const braked = workerConfigToJson({
    ...defaultWorkerConfig(),
    hash: "",
    algorithm: "Fixed",
    brake: { minBackoff: 0.5 },
  });
  const obs = executeCase(
    parseCase(
      caseText([
        `{"t": ${T}, "op": "record", "outcome": "success"}`,
        `{"t": ${T}, "op": "configure", "config": ${braked}, "unixS": 1700000000}`,
        `{"t": ${T}, "op": "permits", "inFlight": 1}`,
      ]),
    ),
  );
  assert.equal(obs[1]?.backoff, 0.5);
  assert.equal(obs[1]?.mode, "normal");
  assert.equal(obs[1]?.limit, defaultWorkerConfig().maxPermits / 2);
  assert.equal(obs[2]?.permits, defaultWorkerConfig().maxPermits / 2 - 1);
});

test("what is not a case is refused with the reason", () => {
  const backwards = thrown(() =>
    executeCase(
      parseCase(
        caseText([
          `{"t": 2, "op": "record", "outcome": "success"}`,
          `{"t": 1, "op": "record", "outcome": "success"}`,
        ]),
      ),
    ),
  );
  assert.equal(backwards.kind, "time_backwards");
  assert.match(backwards.message, /steps\[1\]/);
  const missing = thrown(() =>
    parseCase(`{"seed": 1, "brakeOffsetNs": 0, "config": {}, "steps": []}`),
  );
  assert.equal(missing.kind, "malformed");
  const explode = thrown(() => parseCase(caseText([`{"t": 1, "op": "explode"}`])));
  assert.match(explode.message, /explode/);
  const invalid = thrown(() =>
    parseCase(
      caseText(
        [],
        CONFIG.replace(/"setPoint":[^,]+/, '"setPoint":2.0').replace(/"hash":"[^"]*"/, '"hash":""'),
      ),
    ),
  );
  assert.equal(invalid.kind, "config");
  assert.match(invalid.message, /setPoint/);
  const stepConfig = thrown(() =>
    parseCase(caseText([`{"t": 1, "op": "configure", "config": {"version": "v0"}, "unixS": 0}`])),
  );
  assert.match(stepConfig.message, /steps\[0\]\.config/);
  // Integers are exact: no `1.0`, nothing negative, no time the SDK cannot hold exactly.
  for (const step of [
    `{"t": 1.0, "op": "record", "outcome": "success"}`,
    `{"t": -1, "op": "record", "outcome": "success"}`,
    `{"t": 9007199254740992, "op": "record", "outcome": "success"}`,
    `{"t": 1, "op": "permits", "inFlight": 4294967296}`,
    `{"t": 1, "op": "record", "outcome": "overload"}`,
    `{"t": 1, "op": "record"}`,
  ]) {
    assert.equal(thrown(() => parseCase(caseText([step]))).kind, "malformed", step);
  }
  assert.equal(thrown(() => parseCase("{")).kind, "malformed");
  assert.equal(thrown(() => parseCase("[]")).kind, "malformed");
  // A seed is a u64.
  assert.equal(
    parseCase(caseText([]).replace('"seed": 7', '"seed": 18446744073709551615')).seed,
    2n ** 64n - 1n,
  );
  assert.equal(
    thrown(() => parseCase(caseText([]).replace('"seed": 7', '"seed": -7'))).kind,
    "malformed",
  );
});

async function* once(body: string | Uint8Array): AsyncIterable<Uint8Array> {
  yield typeof body === "string" ? Buffer.from(body) : body;
}

function serving(conformanceHook?: boolean): { admin: Admin; gate: Gate } {
  const metrics = new Metrics("w");
  const gate = new Gate(buildController({ ...defaultSettings(), initialPermits: 0 }, 1), {
    metrics,
  });
  const state = new ConfigState(gate, defaultWorkerConfig(), { metrics, logger: silentLogger });
  const options = conformanceHook === undefined ? {} : { conformanceHook };
  return { admin: new Admin(state, { metrics, logger: silentLogger, ...options }), gate };
}

async function post(
  admin: Admin,
  body: string | Uint8Array | AsyncIterable<Uint8Array>,
  headers: AdminRequest["headers"] = {},
  method = "POST",
) {
  const it = typeof body === "string" || body instanceof Uint8Array ? once(body) : body;
  return admin.handle({ method, url: HOOK_PATH, headers, body: it });
}

test("the hook is off by default: 404", async () => {
  for (const { admin } of [serving(), serving(false)]) {
    assert.equal(admin.conformanceHook, false);
    const r = await post(admin, caseText(docExample()));
    assert.equal(r.status, 404, r.body);
    assert.ok("error" in JSON.parse(r.body));
  }
});

test("the hook runs a case on a fresh controller and leaves the serving one alone", async () => {
  const { admin, gate } = serving(true);
  const before = gate.snapshot();
  const body = caseText(docExample());
  for (let run = 0; run < 2; run++) {
    const r = await post(admin, body);
    assert.equal(r.status, 200, r.body);
    assert.equal(r.headers["content-type"], "application/json");
    const answer = JSON.parse(r.body);
    assert.deepEqual(Object.keys(answer), ["observations"]);
    assert.deepEqual(answer.observations, JSON.parse(JSON.stringify(executeCase(parseCase(body)))));
    assert.equal(answer.observations.length, 42);
    // `permits` only on permits steps; floorEstimate written as null while unknown.
    assert.deepEqual(Object.keys(answer.observations[0]).sort(), [
      "backoff",
      "failureFloor",
      "floorEstimate",
      "limit",
      "mode",
      "permits",
    ]);
    assert.equal("permits" in answer.observations[1], false);
    assert.equal(answer.observations[1].floorEstimate, null);
    assert.equal(answer.observations[41].backoff, 1);
  }
  assert.deepEqual(gate.snapshot(), before, "the serving controller is untouched");
  // Other methods on the path are not the hook.
  assert.equal((await post(admin, "", {}, "GET")).status, 404);
});

test("the hook answers 400 for a body that is not a case", async () => {
  const { admin } = serving(true);
  const bodies: [string, RegExp][] = [
    ["{", /malformed case/],
    ["not json", /malformed case/],
    [caseText([`{"t": 1, "op": "explode"}`]), /explode/],
    [
      caseText(
        [],
        CONFIG.replace(/"maxPermits":\d+/, '"maxPermits":0').replace(/"hash":"[^"]*"/, '"hash":""'),
      ),
      /maxPermits/,
    ],
    [
      caseText([
        `{"t": 5, "op": "record", "outcome": "success"}`,
        `{"t": 4, "op": "permits", "inFlight": 0}`,
      ]),
      /back in time/,
    ],
  ];
  for (const [body, reason] of bodies) {
    const r = await post(admin, body);
    assert.equal(r.status, 400, body);
    const e = JSON.parse(r.body);
    assert.deepEqual(Object.keys(e), ["error"]);
    assert.match(e.error, reason);
  }
});

test("the hook answers 413 above 16 MiB, declared or not", async () => {
  const { admin } = serving(true);
  const declared = await post(admin, "{}", { "content-length": String(MAX_CASE_BYTES + 1) });
  assert.equal(declared.status, 413);
  assert.match(JSON.parse(declared.body).error, /16777216/);
  assert.equal(declared.close, true);
  const chunk = new Uint8Array(1024 * 1024).fill(0x20);
  async function* stream(): AsyncIterable<Uint8Array> {
    for (let i = 0; i <= 16; i++) yield chunk;
  }
  const streamed = await post(admin, stream());
  assert.equal(streamed.status, 413, streamed.body);
  // Exactly at the limit is read (and is then not a case: whitespace only).
  async function* atLimit(): AsyncIterable<Uint8Array> {
    for (let i = 0; i < 16; i++) yield chunk;
  }
  assert.equal((await post(admin, atLimit())).status, 400);
});
