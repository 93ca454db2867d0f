// The example worker (examples/worker.ts): its options from the environment of
// conformance/README.md ("Starting a worker for a conformance run") and from flags, and the
// compiled example run as its own process with no arguments: it serves the admin port (the
// hook only when asked), keeps serving, and exits 0 on SIGTERM and SIGINT.

import assert from "node:assert/strict";
import { test } from "node:test";

import { type ExampleOptions, UsageError, parseOptions } from "../examples/worker.js";
import {
  CONFIG_PATH,
  HOOK_PATH,
  defaultWorkerConfig,
  executeCase,
  parseCase,
  workerConfigToJson,
} from "../src/index.js";
import { httpRequest, startExample, stopExample } from "./exampleProcess.js";

test("the options come from the conformance environment", () => {
  const o = parseOptions([], {
    BP_WORKLOAD: "orders",
    BP_NAMESPACE: "team-a",
    BP_ADMIN_ADDR: "0.0.0.0:9555",
    BP_ALLOWED_IDENTITIES: "system:serviceaccount:bp-system:backpressure-operator, a,,b ",
    BP_CONFORMANCE_HOOK: "1",
    BP_KUBE_API_URL: "https://127.0.0.1:6443",
    BP_KUBE_CA_FILE: "/tmp/ca.crt",
    BP_KUBE_TOKEN_FILE: "/tmp/token",
    BP_DURATION: "0",
    BP_SEED: "9",
  });
  const want: ExampleOptions = {
    workload: "orders",
    namespace: "team-a",
    adminHost: "0.0.0.0",
    adminPort: 9555,
    allowedIdentities: ["system:serviceaccount:bp-system:backpressure-operator", "a", "b"],
    conformanceHook: true,
    kubeApiUrl: "https://127.0.0.1:6443",
    kubeCaFile: "/tmp/ca.crt",
    kubeTokenFile: "/tmp/token",
    configFile: undefined,
    durationS: 0,
    seed: 9,
    messages: 1000,
    rate: 0,
    workMs: 50,
    capacity: 0,
  };
  assert.deepEqual(o, want);
});

test("defaults, the pod's namespace, and flags over variables", () => {
  const d = parseOptions([], {}, () => "pod-ns");
  assert.equal(d.workload, "example-worker");
  assert.equal(d.namespace, "pod-ns");
  assert.deepEqual([d.adminHost, d.adminPort], ["127.0.0.1", 9464]);
  assert.deepEqual(d.allowedIdentities, []);
  assert.equal(d.conformanceHook, false);
  assert.equal(d.durationS, 0, "runs until a signal");
  assert.equal(parseOptions([], {}).namespace, "default");
  const f = parseOptions(
    [
      "--workload=w2",
      "--conformance-hook",
      "--allowed-identity",
      "x",
      "--allowed-identity",
      "y,z",
      "--admin-addr",
      "[::1]:0",
      "--duration",
      "2.5",
    ],
    { BP_WORKLOAD: "w1", BP_ALLOWED_IDENTITIES: "ignored", BP_ADMIN_ADDR: "127.0.0.1:1" },
  );
  assert.equal(f.workload, "w2");
  assert.equal(f.conformanceHook, true);
  assert.deepEqual(f.allowedIdentities, ["x", "y", "z"]);
  assert.deepEqual([f.adminHost, f.adminPort], ["::1", 0]);
  assert.equal(f.durationS, 2.5);
  for (const [value, on] of [
    ["true", true],
    ["TRUE", true],
    ["1", true],
    ["false", false],
    ["0", false],
    ["", false],
  ] as const) {
    assert.equal(parseOptions([], { BP_CONFORMANCE_HOOK: value }).conformanceHook, on, value);
  }
});

test("bad options are usage errors naming what is wrong", () => {
  const bad: [string[], Record<string, string>, RegExp][] = [
    [[], { BP_CONFORMANCE_HOOK: "maybe" }, /BP_CONFORMANCE_HOOK/],
    [[], { BP_ADMIN_ADDR: "9464" }, /host:port/],
    [[], { BP_ADMIN_ADDR: "127.0.0.1:" }, /host:port/],
    [[], { BP_ADMIN_ADDR: "127.0.0.1:70000" }, /host:port/],
    [[], { BP_DURATION: "-1" }, /BP_DURATION/],
    [[], { BP_SEED: "1.5" }, /BP_SEED/],
    [["--duration", "soon"], {}, /--duration/],
    [[], { BP_KUBE_CA_FILE: "/ca" }, /BP_KUBE_API_URL/],
    [[], { BP_KUBE_API_URL: "https://h:6443" }, /BP_KUBE_TOKEN_FILE/],
    [["--no-such-flag"], {}, /no-such-flag/],
    [["positional"], {}, /positional/],
  ];
  for (const [argv, env, reason] of bad) {
    assert.throws(
      () => parseOptions(argv, env),
      (e: unknown) => e instanceof UsageError && reason.test(e.message),
      `${argv} ${JSON.stringify(env)}`,
    );
  }
});

/** A small case of the vectors' format (its `expect`s are ignored by the hook). */
function smallCase(): string {
  const t = 1_000_000_000;
  const steps = [`{"t": ${t}, "op": "permits", "inFlight": 0, "expect": {"permits": 2}}`];
  for (let i = 0; i < 5; i++) steps.push(`{"t": ${t + i}, "op": "record", "outcome": "success"}`);
  steps.push(`{"t": ${t + 10}, "op": "releaseUnused", "unused": 1}`);
  steps.push(`{"t": ${t + 20}, "op": "permits", "inFlight": 1}`);
  return `{"name": "small", "seed": 3, "brakeOffsetNs": 0, "config": ${workerConfigToJson(defaultWorkerConfig())}, "steps": [${steps.join(",")}]}`;
}

test("the example runs from the environment alone, serves the hook, and exits 0 on SIGTERM", async () => {
  const w = await startExample({
    BP_WORKLOAD: "orders",
    BP_NAMESPACE: "team-a",
    BP_ADMIN_ADDR: "127.0.0.1:0",
    BP_CONFORMANCE_HOOK: "true",
  });
  try {
    assert.equal((await httpRequest("GET", `${w.url}/healthz`)).status, 200);
    const metrics = await httpRequest("GET", `${w.url}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(metrics.body, /^backpressure_backoff_factor\{workload="orders"\} /m);
    const body = smallCase();
    const hook = await httpRequest("POST", `${w.url}${HOOK_PATH}`, body, {
      "content-type": "application/json",
    });
    assert.equal(hook.status, 200, hook.body);
    assert.deepEqual(JSON.parse(hook.body), {
      observations: JSON.parse(JSON.stringify(executeCase(parseCase(body)))),
    });
    assert.equal((await httpRequest("POST", `${w.url}${HOOK_PATH}`, "{")).status, 400);
    // No identities: pushes are refused, the running config stays.
    const push = await httpRequest("PUT", `${w.url}${CONFIG_PATH}`, "{}", {
      authorization: "Bearer x",
    });
    assert.equal(push.status, 401);
    const running = JSON.parse((await httpRequest("GET", `${w.url}${CONFIG_PATH}`)).body);
    assert.equal(running.hash, defaultWorkerConfig().hash);
    // It keeps serving (the queue drains; the worker waits for more).
    await new Promise((r) => setTimeout(r, 300));
    assert.equal((await httpRequest("GET", `${w.url}/healthz`)).status, 200);
  } finally {
    const exit = await stopExample(w, "SIGTERM");
    assert.deepEqual(exit, { code: 0, signal: null }, w.stderr());
  }
  assert.match(w.stderr(), /"message":"stopped"/);
});

test("without BP_CONFORMANCE_HOOK the hook is 404; SIGINT stops it too", async () => {
  const w = await startExample({ BP_ADMIN_ADDR: "127.0.0.1:0", BP_CONFORMANCE_HOOK: "0" });
  try {
    const r = await httpRequest("POST", `${w.url}${HOOK_PATH}`, smallCase());
    assert.equal(r.status, 404, r.body);
    assert.match((await httpRequest("GET", `${w.url}/metrics`)).body, /workload="example-worker"/);
  } finally {
    assert.deepEqual(await stopExample(w, "SIGINT"), { code: 0, signal: null }, w.stderr());
  }
});

test("BP_DURATION stops it by itself; a bad environment exits 2", async () => {
  const started = Date.now();
  const w = await startExample({ BP_ADMIN_ADDR: "127.0.0.1:0", BP_DURATION: "0.5" });
  assert.deepEqual(await w.exited, { code: 0, signal: null }, w.stderr());
  assert.ok(Date.now() - started < 8_000);
  await assert.rejects(
    startExample({ BP_ADMIN_ADDR: "nowhere" }),
    (e: Error) => /exited \(2\)/.test(e.message) && /host:port/.test(e.message),
  );
});
