// The config receiver (crates/worker/src/config/tests.rs): ConfigState, the limits, the file
// watcher on real files, and the admin endpoint with an injected token verifier, in process
// and over a real TCP connection.

import assert from "node:assert/strict";
import {
  mkdirSync,
  mkdtempSync,
  readlinkSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
  lstatSync,
  openSync,
  writeSync,
  ftruncateSync,
  closeSync,
} from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { test } from "node:test";

import {
  Admin,
  type AdminRequest,
  CONFIG_FILE_NAME,
  CONFIG_PATH,
  type Clock,
  ConfigError,
  ConfigState,
  DEFAULT_LIMITS,
  FileWatcher,
  Gate,
  type Identity,
  MAX_GENERATION_LEAD_MS,
  MAX_PAYLOAD_BYTES,
  Metrics,
  type Nanos,
  type Settings,
  StaleGenerationError,
  type TokenVerifier,
  VerifyError,
  type WorkerConfig,
  buildController,
  defaultSettings,
  defaultWorkerConfig,
  fromSecs,
  unixNow,
  withHash,
  workerConfigToJson,
} from "../src/index.js";
import { silentLogger } from "../src/log.js";

const OPERATOR = "system:serviceaccount:bp-system:backpressure-operator";

function steady(over: Partial<Settings> = {}): Settings {
  return { ...defaultSettings(), initialPermits: 0, ...over };
}

function state(): { state: ConfigState; gate: Gate; metrics: Metrics } {
  const metrics = new Metrics("w");
  const gate = new Gate(buildController(steady(), 1), { metrics });
  const s = new ConfigState(gate, defaultWorkerConfig(), { metrics, logger: silentLogger });
  return { state: s, gate, metrics };
}

function config(generation: number, maxPermits: number, over: Partial<WorkerConfig> = {}) {
  return withHash({ ...defaultWorkerConfig(), generation, maxPermits, hash: "", ...over });
}

function thrown(f: () => unknown): unknown {
  try {
    f();
  } catch (e) {
    return e;
  }
  assert.fail("accepted");
}

test("apply updates the gate and the metrics and refuses stale or invalid configs", async () => {
  const { state: s, gate, metrics } = state();
  assert.equal(s.ack().hash, defaultWorkerConfig().hash);
  const ack = s.apply(config(3, 4), "push");
  assert.equal(ack.generation, 3);
  assert.equal(gate.snapshot().limit, 4);
  const info = (await metrics.encode())
    .split("\n")
    .filter((l) => l.startsWith("backpressure_config_info{"));
  assert.equal(info.length, 1);
  assert.ok(info[0]?.includes(`hash="${ack.hash}"`) && info[0]?.includes('algorithm="SetPoint"'));
  assert.ok(info[0]?.endsWith(" 1"));
  const stale = thrown(() => s.apply(config(2, 8), "push"));
  assert.ok(stale instanceof StaleGenerationError);
  assert.deepEqual([stale.running, stale.given], [3, 2]);
  assert.equal(gate.snapshot().limit, 4);
  const bad = { ...defaultWorkerConfig(), setPoint: 2.0, generation: 9 };
  assert.ok(thrown(() => s.apply(bad, "push")) instanceof ConfigError);
  assert.ok(thrown(() => s.applyBytes("{", "push")) instanceof ConfigError);
  assert.deepEqual(s.ack(), ack);
  assert.equal(s.origin(), "push");
  // The same payload again is accepted and changes nothing.
  assert.deepEqual(s.apply(config(3, 4), "file"), ack);
  assert.equal(s.origin(), "push");
  // Brake and algorithm reach the gate; an empty hash is filled in.
  const braked = {
    ...defaultWorkerConfig(),
    generation: 4,
    algorithm: "Fixed" as const,
    brake: { minBackoff: 0.5 },
    hash: "",
  };
  const a2 = s.apply(braked, "push");
  assert.match(a2.hash, /^[0-9a-f]{12}$/);
  assert.equal(gate.settings().algorithm, "Fixed");
  assert.equal(gate.snapshot().limit, 8);
  assert.equal(gate.snapshot().backoff, 0.5);
});

test("library knobs survive a push", () => {
  const gate = new Gate(buildController(steady({ credit: 0.25, healthCheckProbes: true }), 1));
  const s = new ConfigState(gate, defaultWorkerConfig(), { logger: silentLogger });
  s.apply(config(1, 5), "push");
  const st = gate.settings();
  assert.deepEqual([st.maxPermits, st.credit, st.healthCheckProbes], [5, 0.25, true]);
});

test("an invalid initial config is replaced by the defaults", () => {
  const gate = new Gate(buildController(steady(), 1));
  const s = new ConfigState(
    gate,
    { ...defaultWorkerConfig(), setPoint: 7 },
    { logger: silentLogger },
  );
  assert.deepEqual(s.ack(), { hash: defaultWorkerConfig().hash, generation: 0 });
});

test("generations far ahead of the clock are refused without effect", async () => {
  const now = 1_700_000_000;
  const { state: s, gate } = state();
  const ahead = (generation: number): WorkerConfig => ({
    ...defaultWorkerConfig(),
    generation,
    maxPermits: 3,
    brake: { minBackoff: 1.0 },
    hash: "",
  });
  for (const generation of [
    Number.MAX_SAFE_INTEGER,
    now * 1000 + MAX_GENERATION_LEAD_MS + 1,
    now * 1_000_000,
  ]) {
    const e = thrown(() => s.applyAt(ahead(generation), "push", now));
    assert.ok(e instanceof ConfigError && e.field === "generation", String(e));
    assert.ok(e.message.includes("ahead of this worker's clock"), e.message);
    assert.equal(s.ack().generation, 0);
    assert.equal(gate.snapshot().limit, 16);
    assert.equal(gate.snapshot().backoff, 0.0);
  }
  const ack = s.applyAt(ahead(now * 1000 + MAX_GENERATION_LEAD_MS), "push", now);
  assert.equal(ack.generation, now * 1000 + MAX_GENERATION_LEAD_MS);
  assert.equal(gate.snapshot().backoff, 1.0);
  // Through the admin endpoint: 400, and the running config stays.
  const { admin, gate: g2 } = adminWith();
  const running = admin.state.ack();
  const [status, text] = await call(
    admin,
    "PUT",
    CONFIG_PATH,
    "good",
    workerConfigToJson(ahead(2 ** 52)),
  );
  assert.equal(status, 400, text);
  assert.ok(text.includes("generation"), text);
  assert.deepEqual(admin.state.ack(), running);
  assert.equal(g2.snapshot().limit, 16);
  const next = config(unixNow() * 1000, 5);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "good", workerConfigToJson(next)))[0], 200);
});

test("values over the worker's limits are refused naming the field", async () => {
  const { admin, gate } = adminWith();
  const running = admin.state.ack();
  const l = DEFAULT_LIMITS;
  const cases: [WorkerConfig, string][] = [
    [config(1, l.maxPermits + 1), "maxPermits"],
    [config(1, 4294967295), "maxPermits"],
    [config(1, 1, { reaction: l.maxReaction + 1 }), "reaction"],
    [config(1, 1, { probeInitialMs: 1 }), "probeInitialMs"],
    [config(1, 1, { probeMaxMs: l.maxProbeMs + 1 }), "probeMaxMs"],
    [config(1, 1, { probeInitialMs: 2 ** 52, probeMaxMs: 2 ** 53 - 1 }), "probeInitialMs"],
    [config(1, 8, { initialPermits: 1025 }), "initialPermits"],
    [config(1, 8, { ratioWindowMs: 3_600_001 }), "ratioWindowMs"],
    [config(1, 8, { brakeReleaseMs: 3_600_001 }), "brakeReleaseMs"],
    [config(1, 8, { redelivery: { baseMs: 1, maxMs: 43_200_001 } }), "redelivery.maxMs"],
    [config(1, 8, { floorMax: 0.91 }), "floorMax"],
  ];
  for (const [cfg, field] of cases) {
    const [status, text] = await call(
      admin,
      "PUT",
      CONFIG_PATH,
      "good",
      workerConfigToJson({ ...cfg, hash: "" }),
    );
    assert.equal(status, 400, `${field}: ${text}`);
    assert.ok(text.includes(field), `${text} should name ${field}`);
    assert.deepEqual(admin.state.ack(), running);
    assert.equal(gate.snapshot().limit, 16);
  }
  // The file path is held to the same limits.
  assert.ok(thrown(() => admin.state.apply(config(2, 5000), "file")) instanceof ConfigError);
  // An application that really runs more raises its limit.
  const g = new Gate(buildController(steady(), 1));
  const s = new ConfigState(g, defaultWorkerConfig(), {
    limits: { maxPermits: 5000 },
    logger: silentLogger,
  });
  s.apply(config(2, 5000), "push");
  assert.equal(g.snapshot().limit, 5000);
});

test("optional settings of a payload are applied, absent ones keep the application's", () => {
  const { state: s, gate } = state();
  const before = gate.settings();
  assert.equal(before.initialPermits, 0);
  s.apply(
    config(2, 8, {
      initialPermits: 4,
      ratioWindowMs: 10_000,
      brakeReleaseMs: 0,
      floorMax: 0.1,
      redelivery: { baseMs: 30_000, maxMs: 120_000 },
    }),
    "push",
  );
  let st = gate.settings();
  assert.deepEqual(
    [st.initialPermits, st.ratioWindow, st.brakeRelease, st.floorMax, st.redelivery],
    [4, fromSecs(10), 0, 0.1, [fromSecs(30), fromSecs(120)]],
  );
  s.apply(config(3, 8, { redelivery: { baseMs: 0, maxMs: 0 } }), "push");
  assert.equal(gate.settings().redelivery, null);
  s.apply(config(4, 8), "push");
  st = gate.settings();
  assert.deepEqual(
    [st.initialPermits, st.ratioWindow, st.brakeRelease, st.floorMax, st.redelivery],
    [
      before.initialPermits,
      before.ratioWindow,
      before.brakeRelease,
      before.floorMax,
      before.redelivery,
    ],
  );
});

// --- the file watcher, on real files -------------------------------------------------------

async function waitFor(s: ConfigState, generation: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (s.ack().generation !== generation) {
    if (Date.now() > deadline)
      assert.fail(`generation ${generation} not applied: ${JSON.stringify(s.ack())}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("a file rewritten in place is hot-reloaded", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "bp-ts-"));
  try {
    const file = path.join(dir, CONFIG_FILE_NAME);
    const { state: s, gate } = state();
    const watcher = new FileWatcher(s, file, silentLogger).start(20);
    try {
      await sleep(60);
      assert.equal(s.origin(), "initial", "a missing file is waited for");
      writeFileSync(file, workerConfigToJson(config(1, 3)));
      await waitFor(s, 1);
      assert.equal(gate.snapshot().limit, 3);
      assert.equal(s.origin(), "file");
      // Same inode, rewritten.
      const fd = openSync(file, "r+");
      ftruncateSync(fd, 0);
      writeSync(fd, workerConfigToJson(config(2, 6)), 0);
      closeSync(fd);
      await waitFor(s, 2);
      assert.equal(gate.snapshot().limit, 6);
      writeFileSync(file, '{"version": "nope"}');
      await sleep(150);
      assert.equal(s.ack().generation, 2);
      assert.equal(gate.snapshot().limit, 6);
      writeFileSync(file, workerConfigToJson(config(3, 7)));
      await waitFor(s, 3);
      assert.equal(gate.snapshot().limit, 7);
    } finally {
      watcher.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Writes `cfg` as kubelet updates a ConfigMap volume (a `..data` symlink swapped atomically). */
function kubeletUpdate(dir: string, stamp: string, cfg: WorkerConfig): void {
  const ts = path.join(dir, stamp);
  mkdirSync(ts);
  writeFileSync(path.join(ts, CONFIG_FILE_NAME), workerConfigToJson(cfg));
  let old: string | null = null;
  try {
    old = readlinkSync(path.join(dir, "..data"));
  } catch {
    old = null;
  }
  const tmp = path.join(dir, "..data_tmp");
  symlinkSync(stamp, tmp);
  renameSync(tmp, path.join(dir, "..data"));
  const link = path.join(dir, CONFIG_FILE_NAME);
  try {
    lstatSync(link);
  } catch {
    symlinkSync(`..data/${CONFIG_FILE_NAME}`, link);
  }
  if (old !== null) rmSync(path.join(dir, old), { recursive: true });
}

test("a ConfigMap symlink swap is hot-reloaded", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "bp-ts-"));
  try {
    kubeletUpdate(dir, "..2024_01_01_00_00_00.000000001", config(1, 2));
    const { state: s, gate } = state();
    const watcher = new FileWatcher(s, path.join(dir, CONFIG_FILE_NAME), silentLogger).start(20);
    try {
      await waitFor(s, 1);
      assert.equal(gate.snapshot().limit, 2);
      kubeletUpdate(dir, "..2024_01_01_00_01_00.000000002", config(2, 9));
      await waitFor(s, 2);
      assert.equal(gate.snapshot().limit, 9);
      kubeletUpdate(dir, "..2024_01_01_00_02_00.000000003", config(5, 1));
      await waitFor(s, 5);
      assert.equal(gate.snapshot().limit, 1);
    } finally {
      watcher.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// --- the admin endpoint, with an injected verifier -----------------------------------------

/** A verifier with a fixed token table (the status-code mapping). */
class StaticTokens implements TokenVerifier {
  constructor(private readonly table: Record<string, string | "down">) {}
  async verify(token: string): Promise<Identity> {
    const v = Object.hasOwn(this.table, token) ? this.table[token] : undefined;
    if (v === "down") throw VerifyError.unavailable("down");
    if (v === undefined) throw VerifyError.unauthenticated("unknown token");
    return { username: v };
  }
}

const TOKENS = {
  good: OPERATOR,
  other: "system:serviceaccount:bp-system:someone-else",
  down: "down",
} as const;

function adminWith(
  options: {
    clock?: Clock;
    failureLimit?: { burst: number; refillMs: number };
    timeouts?: number;
  } = {},
): { admin: Admin; gate: Gate } {
  const { state: s, gate, metrics } = state();
  const admin = new Admin(s, {
    metrics,
    verifier: new StaticTokens(TOKENS),
    allowed: [OPERATOR],
    headerTimeoutMs: options.timeouts ?? 300,
    bodyTimeoutMs: options.timeouts ?? 300,
    logger: silentLogger,
    ...(options.clock === undefined ? {} : { clock: options.clock }),
    ...(options.failureLimit === undefined ? {} : { failureLimit: options.failureLimit }),
  });
  return { admin, gate };
}

async function* once(body: string | Uint8Array): AsyncIterable<Uint8Array> {
  yield typeof body === "string" ? Buffer.from(body) : body;
}

async function call(
  admin: Admin,
  method: string,
  url: string,
  token: string | null,
  body: string | Uint8Array = "",
  remoteAddress?: string,
): Promise<[number, string, Record<string, string>]> {
  const headers: AdminRequest["headers"] = {};
  if (token !== null) headers.authorization = `Bearer ${token}`;
  const r = await admin.handle({ method, url, headers, remoteAddress, body: once(body) });
  return [r.status, r.body, r.headers];
}

test("push status codes, and refusals leave the config unchanged", async () => {
  const { admin, gate } = adminWith();
  const running = admin.state.ack();
  const good = workerConfigToJson(config(7, 3));
  const cases: [string | null, string | Uint8Array, number][] = [
    [null, good, 401],
    ["forged", good, 401],
    ["other", good, 403],
    ["down", good, 503],
    ["good", "{not json", 400],
    ["good", workerConfigToJson({ ...defaultWorkerConfig(), reaction: 0, generation: 8 }), 400],
    ["good", workerConfigToJson({ ...config(8, 3), setPoint: 0.3 }), 400],
    ["good", Buffer.alloc(MAX_PAYLOAD_BYTES + 1, 0x20), 413],
  ];
  for (const [token, body, want] of cases) {
    const [status, text] = await call(admin, "PUT", CONFIG_PATH, token, body);
    assert.equal(status, want, `${token}: ${text}`);
    assert.ok(typeof JSON.parse(text).error === "string", text);
    assert.deepEqual(admin.state.ack(), running, "a refused push changed the config");
    assert.equal(gate.snapshot().limit, 16);
  }
  // Malformed authorization headers are missing tokens.
  for (const value of ["good", "Basic good", "Bearer ", "Bearer\tgood"]) {
    const r = await admin.handle({
      method: "PUT",
      url: CONFIG_PATH,
      headers: { authorization: value },
      body: once(good),
    });
    assert.equal(r.status, 401, value);
  }
  const [status, text] = await call(admin, "PUT", CONFIG_PATH, "good", good);
  assert.equal(status, 200, text);
  const ack = JSON.parse(text);
  assert.deepEqual(Object.keys(ack), ["hash", "generation"]);
  assert.equal(ack.generation, 7);
  assert.equal(gate.snapshot().limit, 3);
  // The scheme is case-insensitive; a query does not change the path.
  assert.equal((await call(admin, "PUT", `${CONFIG_PATH}?x=1`, "good", good))[0], 200);
  const [s409, t409] = await call(
    admin,
    "PUT",
    CONFIG_PATH,
    "good",
    workerConfigToJson(config(6, 9)),
  );
  assert.equal(s409, 409, t409);
  const [sGet, tGet] = await call(admin, "GET", CONFIG_PATH, null);
  assert.equal(sGet, 200);
  assert.deepEqual(JSON.parse(tGet), ack);
  const [sMetrics, tMetrics, hMetrics] = await call(admin, "GET", "/metrics", null);
  assert.equal(sMetrics, 200);
  assert.ok(tMetrics.includes(ack.hash), tMetrics);
  assert.match(hMetrics["content-type"] ?? "", /openmetrics/);
  assert.equal((await call(admin, "GET", "/healthz", null))[0], 200);
  assert.equal((await call(admin, "GET", "/nope", null))[0], 404);
  assert.equal((await call(admin, "GET", "/v1/producer", null))[0], 404);
  assert.equal((await call(admin, "POST", CONFIG_PATH, null))[0], 405);
  assert.equal((await call(admin, "DELETE", "/healthz", null))[0], 405);
});

test("pushes are refused without a verifier", async () => {
  const { state: s } = state();
  const admin = new Admin(s, { logger: silentLogger });
  const [status] = await call(
    admin,
    "PUT",
    CONFIG_PATH,
    "anything",
    workerConfigToJson(config(1, 2)),
  );
  assert.equal(status, 401);
  assert.equal(admin.state.ack().generation, 0);
  assert.equal((await call(admin, "GET", "/metrics", null))[0], 404);
});

class SteppedClock implements Clock {
  t: Nanos = fromSecs(1);
  now(): Nanos {
    return this.t;
  }
}

test("failed authentications are rate-limited per source", async () => {
  const clock = new SteppedClock();
  const { admin, gate } = adminWith({ clock, failureLimit: { burst: 3, refillMs: 2000 } });
  const body = (g: number) => workerConfigToJson(config(g, 2));
  const attacker = "10.0.0.66";
  assert.equal((await call(admin, "PUT", CONFIG_PATH, null, body(1), attacker))[0], 401);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "forged", body(1), attacker))[0], 401);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "other", body(1), attacker))[0], 403);
  for (const token of ["forged", null, "good"]) {
    const [status, , headers] = await call(admin, "PUT", CONFIG_PATH, token, body(1), attacker);
    assert.equal(status, 429, String(token));
    assert.equal(headers["retry-after"], "2");
  }
  assert.equal(admin.state.ack().generation, 0);
  // An unavailable verifier is not the client's failure.
  const operator = "10.0.0.7";
  for (let i = 0; i < 5; i++) {
    assert.equal((await call(admin, "PUT", CONFIG_PATH, "down", body(2), operator))[0], 503);
  }
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "good", body(2), operator))[0], 200);
  assert.equal(gate.snapshot().limit, 2);
  for (let g = 3; g < 20; g++) {
    assert.equal((await call(admin, "PUT", CONFIG_PATH, "good", body(g), operator))[0], 200);
  }
  // One failure is forgiven per refill period.
  clock.t += fromSecs(2);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "forged", body(1), attacker))[0], 401);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "forged", body(1), attacker))[0], 429);
  clock.t += fromSecs(2);
  assert.equal((await call(admin, "PUT", CONFIG_PATH, "good", body(30), attacker))[0], 200);
  assert.equal(admin.state.ack().generation, 30);
});

/** Sends raw bytes on a new connection and returns everything until the server closes it. */
function raw(port: number, request: string, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("the server did not close the connection"));
    }, timeoutMs);
    socket.on("data", (c) => chunks.push(c));
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString("utf8"));
    });
    socket.on("error", () => {});
    socket.write(request);
  });
}

test("the server over TCP, with its limits and timeouts", async () => {
  const { admin, gate } = adminWith();
  const server = await admin.listen(0, "127.0.0.1");
  const { port } = server.address();
  try {
    const body = workerConfigToJson(config(2, 5));
    const ok = await raw(
      port,
      `PUT ${CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
    assert.ok(ok.startsWith("HTTP/1.1 200"), ok);
    assert.equal(gate.snapshot().limit, 5);
    // Declared too large: refused before the body is read.
    const big = await raw(
      port,
      `PUT ${CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: ${MAX_PAYLOAD_BYTES + 1}\r\n\r\n`,
    );
    assert.ok(big.startsWith("HTTP/1.1 413"), big);
    // Too large without a declared length (chunked): refused once the limit is crossed.
    const chunk = "x".repeat(MAX_PAYLOAD_BYTES + 10);
    const chunked = await raw(
      port,
      `PUT ${CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nTransfer-Encoding: chunked\r\n\r\n${chunk.length.toString(16)}\r\n${chunk}\r\n`,
    );
    assert.ok(chunked.startsWith("HTTP/1.1 413"), chunked.slice(0, 200));
    // A slow client that never sends its body gets 408 after the body timeout.
    const slow = await raw(
      port,
      `PUT ${CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: 100\r\n\r\n{`,
    );
    assert.ok(slow.startsWith("HTTP/1.1 408"), slow);
    assert.ok(slow.includes('"error"'), slow);
    // A client that never finishes its headers is disconnected.
    await raw(port, "GET /healthz HTTP/1.1\r\nHost: w\r\n");
    assert.equal(admin.state.ack().generation, 2);
    const metrics = await raw(
      port,
      "GET /metrics HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n",
    );
    assert.ok(metrics.startsWith("HTTP/1.1 200"), metrics);
    assert.ok(metrics.includes('backpressure_permits{workload="w"} 5'), metrics);
  } finally {
    await server.close();
  }
});
