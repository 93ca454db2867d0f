// The gate (crates/worker/src/permits.rs tests), on the real monotonic clock where the test
// waits, and on a clock the test moves where it only reads the gate at chosen times.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  type Clock,
  Gate,
  type InFlight,
  Metrics,
  type Nanos,
  type Settings,
  SplitMix64,
  buildController,
  defaultSettings,
  defaultWorkerConfigUnhashed,
  fromMillis,
  fromSecs,
  settingsFromConfig,
} from "../src/index.js";
import { silentLogger } from "../src/log.js";

/** A clock that only moves when told (as tokio's paused clock in the Rust tests). */
class SteppedClock implements Clock {
  t: Nanos = fromSecs(1);
  now(): Nanos {
    return this.t;
  }
  advance(ns: Nanos): void {
    this.t += ns;
  }
}

function plainSettings(over: Partial<Settings> = {}): Settings {
  return { ...defaultSettings(), initialPermits: 0, credit: 0.0, ...over };
}

function steady(over: Partial<Settings> = {}): Settings {
  return { ...defaultSettings(), initialPermits: 0, ...over };
}

function backOff(gate: Gate): void {
  for (let i = 0; i < 40; i++) {
    const p = gate.tryAcquire(1);
    assert.ok(p !== null, "permit while backing off");
    const m = p.start();
    p.release();
    m.finish("dependency_failure");
    if (gate.snapshot().mode === "probing") return;
  }
  assert.fail("did not back off");
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

test("grants follow the controller and unused permits return", async () => {
  const gate = new Gate(buildController(plainSettings(), 1));
  const p = await gate.acquire(100);
  assert.equal(p.granted, 16);
  assert.equal(gate.tryAcquire(1), null, "all reserved");
  const a = p.start();
  const b = p.start();
  p.release();
  const s = gate.snapshot();
  assert.deepEqual([s.inFlight, s.reserved], [2, 0]);
  const q = gate.tryAcquire(100);
  assert.equal(q?.granted, 14);
  q?.release();
  a.finish("success");
  b.finish("dependency_failure");
  assert.equal(gate.snapshot().inFlight, 0);
  assert.equal(gate.snapshot().limit, 15);
});

test("a probe permit used by an empty poll is returned", async () => {
  for (const algorithm of ["SetPoint", "RatioThrottle"] as const) {
    const gate = new Gate(
      buildController(
        plainSettings({ algorithm, probeInitial: fromMillis(100), probeMax: fromMillis(400) }),
        7,
      ),
    );
    backOff(gate);
    assert.equal(gate.tryAcquire(1), null);
    for (let i = 0; i < 20; i++) {
      const p = await withTimeout(gate.acquire(10), 2000);
      assert.ok(p.isProbe);
      assert.equal(p.granted, 1);
      p.release(); // the poll came back empty
      const s = gate.snapshot();
      assert.deepEqual([s.reserved, s.inFlight], [0, 0], algorithm);
    }
    const p = await gate.acquire(10);
    const m = p.start();
    p.release();
    m.finish("success");
    assert.ok(gate.snapshot().limit >= 1, algorithm);
  }
});

test("acquire waits for a finished message", async () => {
  const gate = new Gate(buildController(plainSettings({ maxPermits: 1 }), 1));
  const p = await gate.acquire(1);
  const m = p.start();
  p.release();
  let done = false;
  const waiter = gate.acquire(1).then((q) => {
    done = true;
    return q.granted;
  });
  await new Promise((r) => setImmediate(r));
  assert.equal(done, false);
  const started = process.hrtime.bigint();
  m.finish("success");
  assert.equal(await waiter, 1);
  // Woken by the finish, not by the 1 s safety timer.
  assert.ok(process.hrtime.bigint() - started < 200_000_000n);
});

test("acquire can be aborted", async () => {
  const gate = new Gate(buildController(plainSettings({ maxPermits: 1 }), 1));
  const p = await gate.acquire(1);
  const m = p.start();
  p.release();
  const ac = new AbortController();
  const waiting = gate.acquire(1, ac.signal);
  ac.abort(new Error("shutdown"));
  await assert.rejects(waiting, /shutdown/);
  m.finish("success");
});

test("messages beyond the grant are still processed", async () => {
  const gate = new Gate(buildController(plainSettings({ maxPermits: 2 }), 1), {
    logger: silentLogger,
  });
  const p = await gate.acquire(2);
  const started = [p.start(), p.start(), p.start()];
  p.release();
  assert.equal(gate.snapshot().inFlight, 3);
  for (const m of started) m.finish("success");
  const s = gate.snapshot();
  assert.deepEqual([s.inFlight, s.reserved], [0, 0]);
  // Finishing twice, or abandoning after finishing, changes nothing.
  started[0]?.finish("success");
  started[0]?.abandon();
  assert.equal(gate.snapshot().inFlight, 0);
});

test("metrics follow the gate", async () => {
  const metrics = new Metrics("w");
  const gate = new Gate(
    buildController(plainSettings({ probeInitial: fromMillis(50), probeMax: fromMillis(100) }), 1),
    { metrics },
  );
  const p = await gate.acquire(4);
  const m = p.start();
  p.release();
  let text = await metrics.encode();
  assert.ok(text.includes('backpressure_in_flight{workload="w"} 1'), text);
  m.finish("dependency_failure");
  assert.equal(metrics.outcomeCount("dependency_failure"), 1);
  text = await metrics.encode();
  assert.ok(text.includes('backpressure_permits{workload="w"} 15'), text);
  assert.ok(text.includes('backpressure_backoff_factor{workload="w"} 0.05'), text);
  assert.ok(text.includes('backpressure_failure_floor{workload="w"} NaN'), text);
  backOff(gate);
  const q = await withTimeout(gate.acquire(1), 2000);
  assert.ok(q.isProbe);
  q.start().finish("success");
  q.release();
  assert.equal(metrics.probeCount(), 1);
});

test("a health check replaces message probes", async () => {
  let calls = 0;
  let running = false;
  const check = async () => {
    assert.ok(!running, "one check at a time");
    running = true;
    await new Promise((r) => setTimeout(r, 10));
    running = false;
    calls += 1;
    return calls >= 3;
  };
  const gate = new Gate(
    buildController(
      plainSettings({
        healthCheckProbes: true,
        probeInitial: fromMillis(40),
        probeMax: fromMillis(160),
      }),
      1,
    ),
    { healthCheck: check },
  );
  backOff(gate);
  const p = await withTimeout(gate.acquire(10), 5000);
  assert.ok(!p.isProbe, "a normal grant after the healthy check");
  assert.equal(p.granted, 2, "slow start");
  assert.equal(calls, 3);
  p.release();
});

test("apply changes settings and brake at runtime, the brake lifting gently", () => {
  const clock = new SteppedClock();
  // Offset: 0.5 × brakeRelease / 2 = 15 s.
  const gate = new Gate(buildController(steady(), 1), { brakeJitter: 0.5, clock });
  const settings = settingsFromConfig({ ...defaultWorkerConfigUnhashed(), maxPermits: 4 });
  assert.equal(settings.brakeRelease, fromSecs(60));
  const granted = () => {
    const p = gate.tryAcquire(100);
    p?.release();
    return p === null ? 0 : p.granted;
  };
  gate.apply(settings, { minBackoff: 0.5, expiresAtUnix: 1_000 + 30 }, 1_000);
  assert.equal(granted(), 2);
  clock.advance(fromSecs(31));
  assert.equal(granted(), 2);
  clock.advance(fromSecs(29)); // 60 s: level 0.25
  assert.equal(granted(), 3);
  clock.advance(fromSecs(15)); // 75 s: lifted
  assert.equal(granted(), 4);
  const full = { minBackoff: 1.0 };
  gate.apply(settings, full, 1_000);
  assert.equal(granted(), 0, "a full brake stops everything");
  gate.apply(settings, null, 1_000);
  assert.equal(granted(), 0, "removed: still held for the offset");
  clock.advance(fromSecs(30)); // 15 s into the fall: 0.75
  gate.apply(settings, null, 1_000);
  assert.equal(granted(), 1);
  clock.advance(fromSecs(30)); // 0.25
  assert.equal(granted(), 3);
  clock.advance(fromSecs(15));
  assert.equal(granted(), 4);
  const instant = { ...settings, brakeRelease: 0 };
  gate.apply(instant, full, 1_000);
  assert.equal(granted(), 0);
  gate.apply(instant, null, 1_000);
  assert.equal(granted(), 4);
  gate.apply({ ...settings, algorithm: "Off" }, null, 1_000);
  assert.equal(gate.settings().algorithm, "Off");
});

test("a waiting worker wakes up as the brake lifts (real time)", async () => {
  const gate = new Gate(buildController(steady(), 1), { brakeJitter: 0 });
  // Expires 1 s from now, then lifts over 1.6 s: 16 permits, one per 100 ms.
  gate.apply(
    { ...steady(), brakeRelease: fromMillis(1600) },
    { minBackoff: 1.0, expiresAtUnix: 1_001 },
    1_000,
  );
  const start = process.hrtime.bigint();
  const p = await withTimeout(gate.acquire(100), 5000);
  const waitedMs = Number(process.hrtime.bigint() - start) / 1e6;
  assert.ok(waitedMs >= 1090 && waitedMs <= 1600, `${waitedMs} ms`);
  assert.equal(p.granted, 1, "one permit, not sixteen");
  p.release();
});

test("the failure-floor gauge is NaN until the controller has tested for a floor", async () => {
  const metrics = new Metrics("w");
  const clock = new SteppedClock();
  const gate = new Gate(
    buildController({ ...steady(), algorithm: "SetPoint", maxPermits: 16, reaction: 20 }, 7),
    { metrics, clock, seed: 7, brakeJitter: 0 },
  );
  const floorLine = async () =>
    (await metrics.encode()).split("\n").find((l) => l.startsWith("backpressure_failure_floor{"));
  // A fresh gate, before any outcome: untested (NaN), not "tested, none" (0).
  assert.equal(gate.snapshot().failureFloor, null);
  assert.equal(await floorLine(), 'backpressure_failure_floor{workload="w"} NaN');
  // A dependency that fails 15% of calls whatever the load: the controller learns the floor
  // and the gauge shows it (each message takes 1 s; the clock moves 100 ms a tick).
  const rng = new SplitMix64(11);
  const inFlight: [number, InFlight, boolean][] = [];
  for (let tick = 0; tick < 18_000; tick++) {
    clock.t = fromSecs(1) + fromMillis(tick * 100);
    for (let i = inFlight.length - 1; i >= 0; i--) {
      const [due, slot, ok] = inFlight[i] as [number, InFlight, boolean];
      if (due > tick) continue;
      inFlight.splice(i, 1);
      slot.finish(ok ? "success" : "dependency_failure");
    }
    const p = gate.tryAcquire(16);
    if (p === null) continue;
    for (let j = 0; j < p.granted; j++)
      inFlight.push([tick + 10, p.start(), rng.nextF64() >= 0.15]);
    p.release();
  }
  const floor = gate.snapshot().failureFloor;
  assert.ok(floor !== null && floor >= 0.12 && floor <= 0.18, `floor ${floor}`);
  assert.equal(await floorLine(), `backpressure_failure_floor{workload="w"} ${floor}`);
  // A controller that tests for no floor (the ratio throttle) is untested again: NaN at once.
  gate.apply({ ...steady(), algorithm: "RatioThrottle", maxPermits: 16 }, null, 1_700_000_000);
  assert.equal(gate.snapshot().failureFloor, null);
  assert.equal(await floorLine(), 'backpressure_failure_floor{workload="w"} NaN');
});
