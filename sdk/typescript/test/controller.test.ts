// The Rust controller unit tests (crates/worker/src/controller/tests/mod.rs), ported scenario
// by scenario.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Brake,
  type Controller,
  type Nanos,
  type Settings,
  RatioThrottle,
  SetPoint,
  SplitMix64,
  applySettings,
  buildController,
  controllerFromConfig,
  defaultSettings,
  defaultWorkerConfigUnhashed,
  fromMillis,
  fromSecs,
  limitFor,
  settingsFromConfig,
} from "../src/index.js";

/** The defaults without the startup ramp (Rust's `Settings::steady()`). */
function steady(over: Partial<Settings> = {}): Settings {
  return { ...defaultSettings(), initialPermits: 0, ...over };
}

function settings(maxPermits: number, setPoint: number, reaction: number): Settings {
  return steady({ algorithm: "SetPoint", setPoint, reaction, maxPermits });
}

function plain(maxPermits: number, setPoint: number, reaction: number): SetPoint {
  return new SetPoint({ ...settings(maxPermits, setPoint, reaction), credit: 0.0 }, 1);
}

const T0: Nanos = fromSecs(100);

function close(a: number, b: number, eps: number, msg?: string): void {
  assert.ok(Math.abs(a - b) < eps, msg ?? `${a} vs ${b}`);
}

function backOffFully(c: Controller, now: Nanos): void {
  for (let i = 0; i < 10_000; i++) {
    if (c.mode() === "probing") return;
    c.record(now, "dependency_failure");
  }
  assert.fail("never backed off fully");
}

/** The first time at or after `from` when a probe is granted (with nothing in flight). */
function nextProbeTime(c: Controller, from: Nanos): Nanos {
  let t = from;
  for (let i = 0; i < 10_000; i++) {
    if (c.permits(t, 0) === 1) return t;
    t = Math.max(c.nextChange(t) ?? t + fromMillis(10), t + 1);
  }
  assert.fail(`no probe granted after ${from}`);
}

function starting(maxPermits: number, initialPermits: number): SetPoint {
  return new SetPoint({ ...settings(maxPermits, 0.05, 20), initialPermits }, 1);
}

test("startup ramps one permit per round trip without backoff and keeps the credit", () => {
  const c = starting(16, 2);
  assert.equal(c.mode(), "starting");
  assert.deepEqual([c.permits(T0, 0), c.limit(T0), c.backoff(T0)], [2, 2, 0]);
  assert.equal(c.permits(T0, 2), 0, "in-flight messages count against the window");
  let successes = 0;
  let last = 2;
  while (c.mode() === "starting") {
    c.record(T0, "success");
    successes += 1;
    const limit = c.limit(T0);
    assert.ok(limit === last || limit === last + 1, `${last} -> ${limit}`);
    assert.equal(c.backoff(T0), 0);
    last = limit;
  }
  assert.ok(successes >= 120 && successes <= 135, `${successes} successes`);
  assert.deepEqual([c.mode(), c.limit(T0), c.backoff(T0)], ["normal", 16, 0]);
  for (let i = 0; i < 20; i++) c.record(T0, "dependency_failure");
  assert.equal(c.limit(T0), 16);
  c.record(T0, "dependency_failure");
  assert.equal(c.limit(T0), 15);
});

test("startup ramp is scaled to maxPermits", () => {
  const c = starting(160, 20);
  for (let i = 0; i < 20; i++) c.record(T0, "success");
  const l = c.limit(T0);
  assert.ok(l >= 27 && l <= 29, `${l}`);
});

test("startup window shrinks above the set point and never below one", () => {
  const c = starting(16, 2);
  while (c.limit(T0) < 10) c.record(T0, "success");
  const w = c.windowValue();
  c.record(T0, "dependency_failure");
  close(c.windowValue(), w - 19.0 / w, 1e-9);
  assert.equal(c.mode(), "starting");
  c.record(T0, "message_failure");
  close(c.windowValue(), w - 19.0 / w, 1e-9);
  for (let i = 0; i < 50; i++) {
    for (let j = 0; j < 9; j++) c.record(T0, "success");
    c.record(T0, "dependency_failure");
    assert.equal(c.mode(), "starting");
  }
  assert.ok(c.limit(T0) <= 2, `${c.limit(T0)}`);
  for (let i = 0; i < 40; i++) {
    c.record(T0, "dependency_failure");
    if (c.mode() === "starting") assert.equal(c.startupWindow(), 1);
  }
});

test("an outage during startup ends it in probing", () => {
  const c = starting(16, 2);
  for (let i = 0; i < 38; i++) {
    c.record(T0, "dependency_failure");
    const expected = i < 37 ? "starting" : "normal";
    assert.deepEqual([c.mode(), c.limit(T0)], [expected, 1], `after ${i + 1} failures`);
  }
  c.record(T0, "dependency_failure");
  assert.deepEqual([c.mode(), c.backoff(T0), c.limit(T0)], ["probing", 1, 0]);
});

test("startup ends when the integrator limits more than the window", () => {
  const c = starting(16, 2);
  for (let i = 0; i < 6; i++) c.record(T0, "success");
  for (let i = 0; i < 36; i++) c.record(T0, "dependency_failure");
  const own = limitFor(16, c.integrator());
  assert.ok(own < 16 && own > 1, `own limit ${own}`);
  while (c.mode() === "starting") c.record(T0, "success");
  assert.equal(c.mode(), "normal");
  assert.equal(c.limit(T0), limitFor(16, c.integrator()));
  assert.ok(c.backoff(T0) > 0);
});

test("startup is on by default and ends on carry-over or a smaller max", () => {
  assert.equal(new SetPoint(defaultSettings(), 1).mode(), "starting");
  assert.equal(new SetPoint(steady(), 1).mode(), "normal");
  assert.equal(starting(16, 16).mode(), "normal");
  assert.equal(starting(16, 0).mode(), "normal");
  let c = starting(16, 2);
  c.startFrom(T0, 0.25);
  assert.deepEqual([c.mode(), c.limit(T0)], ["normal", 12]);
  c = starting(16, 2);
  for (let i = 0; i < 3; i++) c.record(T0, "success");
  c.reconfigure(T0, { ...settings(3, 0.05, 20), initialPermits: 2 });
  assert.deepEqual([c.mode(), c.limit(T0)], ["normal", 3]);
});

test("integrator steps are 1/N and s/((1-s)N)", () => {
  let c = plain(16, 0.05, 20);
  c.record(T0, "dependency_failure");
  close(c.backoff(T0), 1.0 / 20.0, 1e-12);
  c.record(T0, "success");
  close(c.backoff(T0), 1.0 / 20.0 - 0.05 / (0.95 * 20.0), 1e-12);
  c = plain(16, 0.05, 20);
  c.record(T0, "dependency_failure");
  for (let i = 0; i < 19; i++) c.record(T0, "success");
  assert.ok(c.backoff(T0) < 1e-9);
  c = plain(16, 0.05, 20);
  c.record(T0, "dependency_failure");
  assert.equal(c.permits(T0, 0), 15);
  assert.equal(c.permits(T0, 10), 5);
  assert.equal(c.permits(T0, 20), 0);
});

test("message failures never drive backoff", () => {
  for (const algorithm of ["SetPoint", "RatioThrottle"] as const) {
    const c = buildController(steady({ algorithm }), 3);
    for (let i = 0; i < 10_000; i++) c.record(T0 + fromMillis(i), "message_failure");
    const end = T0 + fromSecs(10);
    assert.equal(c.backoff(end), 0, algorithm);
    assert.equal(c.permits(end, 0), 16, algorithm);
  }
});

test("credit absorbs one reaction of failures then backs off", () => {
  const c = new SetPoint(settings(16, 0.05, 20), 1);
  assert.equal(c.integrator(), -1.0, "starts with full credit");
  for (let i = 0; i < 20; i++) c.record(T0, "dependency_failure");
  assert.equal(c.backoff(T0), 0);
  assert.equal(c.permits(T0, 0), 16);
  c.record(T0, "dependency_failure");
  assert.ok(c.backoff(T0) > 0);
  assert.equal(c.permits(T0, 0), 15);
  for (let i = 0; i < 19; i++) c.record(T0, "dependency_failure");
  assert.equal(c.mode(), "probing");
  assert.equal(c.backoff(T0), 1.0);
});

test("probing grants one message on a doubling jittered interval", () => {
  const c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  assert.equal(c.permits(T0, 0), 0, "the first probe waits an interval");
  const due = c.nextChange(T0);
  assert.ok(due !== null);
  const wait = due - T0;
  assert.ok(wait >= fromSecs(1) && wait < fromSecs(2), `${wait}`);
  assert.equal(c.permits(due, 1), 0, "never with something in flight");
  assert.equal(c.permits(due, 0), 1);
  let now = due;
  const intervals: [number, number][] = [];
  for (let i = 0; i < 8; i++) {
    c.record(now, "dependency_failure");
    const next = c.nextChange(now);
    assert.ok(next !== null);
    intervals.push([c.probeInterval(), next - now]);
    now = next;
    assert.equal(c.permits(now, 0), 1);
  }
  const expected = [4, 8, 16, 32, 60, 60, 60, 60];
  intervals.forEach(([interval, w], i) => {
    assert.equal(interval, fromSecs(expected[i] as number));
    assert.ok(w >= interval / 2 && w < interval, `${w} vs ${interval}`);
  });
  const waits = intervals.slice(4).map(([, w]) => w);
  assert.ok(
    waits.some((w, i) => i > 0 && w !== waits[i - 1]),
    `jittered: ${waits.join(",")}`,
  );
});

test("successful probe slow-starts to half the peak", () => {
  const c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  assert.equal(c.ssthresh(), 8, "peak 16 / 2");
  const t = nextProbeTime(c, T0);
  assert.equal(c.permits(t, 0), 1);
  c.record(t, "success");
  assert.equal(c.mode(), "slow_start");
  assert.equal(c.limit(t), 2);
  assert.equal(c.probeInterval(), fromSecs(2), "reset after success");
  const limits = [c.limit(t)];
  while (c.mode() === "slow_start") {
    c.record(t, "success");
    limits.push(c.limit(t));
  }
  assert.deepEqual(limits, [2, 3, 4, 5, 6, 7, 8]);
  assert.equal(c.mode(), "normal");
});

test("slow start ends at the first dependency failure", () => {
  const c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  const t = nextProbeTime(c, T0);
  c.permits(t, 0);
  c.record(t, "success");
  c.record(t, "success");
  assert.equal(c.limit(t), 3);
  c.record(t, "dependency_failure");
  assert.equal(c.mode(), "normal");
  assert.equal(c.limit(t), 2);
});

test("the peak decays so a long outage restarts low", () => {
  let c = plain(16, 0.05, 20);
  let now = T0;
  c.record(now, "success");
  c.setBackoff(now, 0.75);
  assert.equal(c.limit(now), 4);
  now = now + fromSecs(60);
  backOffFully(c, now);
  assert.equal(c.ssthresh(), 2);
  c = plain(16, 0.05, 20);
  c.record(T0, "success");
  c.setBackoff(T0, 0.75);
  backOffFully(c, T0 + fromSecs(1));
  assert.equal(c.ssthresh(), 7);
});

test("late outcomes in probing are not probe results", () => {
  const c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  const interval = c.probeInterval();
  for (let i = 0; i < 10; i++) c.record(T0, "dependency_failure");
  assert.equal(c.probeInterval(), interval);
  c.record(T0, "success");
  assert.equal(c.mode(), "probing", "one late success is not a probe result");
});

test("a message-failure probe allows another probe at once", () => {
  const c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  const t = nextProbeTime(c, T0);
  c.record(t, "message_failure");
  assert.equal(c.mode(), "probing");
  assert.equal(c.permits(t, 0), 1);
});

test("health check replaces message probes", () => {
  const c = new SetPoint({ ...settings(16, 0.05, 20), healthCheckProbes: true, credit: 0.0 }, 9);
  backOffFully(c, T0);
  let now = T0;
  let checks = 0;
  for (let i = 0; i < 1000; i++) {
    assert.equal(c.permits(now, 0), 0, "no message probes");
    if (c.healthCheckDue(now)) {
      checks += 1;
      assert.ok(!c.healthCheckDue(now), "one check at a time");
      c.recordHealthCheck(now, checks >= 3);
      if (c.mode() !== "probing") break;
    }
    const next = c.nextChange(now);
    assert.ok(next !== null);
    now = next;
  }
  assert.equal(checks, 3);
  assert.equal(c.mode(), "slow_start");
  assert.equal(c.permits(now, 0), 2);
});

test("the brake is a minimum backoff until it expires", () => {
  let c = buildController(steady(), 1);
  const until = T0 + fromSecs(30);
  c.setBrake(new Brake({ minBackoff: 0.5, until }));
  assert.equal(c.backoff(T0), 0.5);
  assert.equal(c.permits(T0, 0), 8);
  assert.equal(c.nextChange(T0), until);
  assert.equal(c.backoff(until), 0.0);
  assert.equal(c.permits(until, 0), 16);
  c = plain(16, 0.05, 20);
  backOffFully(c, T0);
  c.setBrake(new Brake({ minBackoff: 1.0 }));
  assert.equal(c.permits(T0 + fromSecs(3600), 0), 0);
  const fixed = buildController(steady({ algorithm: "Fixed" }), 1);
  const off = buildController(steady({ algorithm: "Off" }), 1);
  for (const k of [fixed, off]) {
    k.setBrake(new Brake({ minBackoff: 0.75 }));
    for (let i = 0; i < 100; i++) k.record(T0, "dependency_failure");
  }
  assert.equal(fixed.permits(T0, 0), 4);
  assert.equal(fixed.backoff(T0), 0.75);
  assert.equal(off.permits(T0, 0), 16);
  assert.equal(off.backoff(T0), 0.0);
});

function secs(s: number): Nanos {
  return T0 + fromSecs(s);
}

function lifting(minBackoff: number, until: Nanos | null, offset: number): Brake {
  const b = Brake.succeed(
    null,
    new Brake({ minBackoff, until }),
    T0,
    fromSecs(60),
    fromSecs(offset),
  );
  assert.ok(b !== null);
  return b;
}

test("an expiring brake lifts gently after this pod's offset", () => {
  const c = buildController(steady(), 1);
  c.setBrake(lifting(1.0, secs(10), 20));
  const permits = (t: number) => c.permits(secs(t), 0);
  assert.equal(permits(0), 0);
  assert.equal(permits(10), 0);
  assert.equal(permits(29), 0);
  assert.equal(c.nextChange(secs(29)), secs(30));
  assert.equal(permits(45), 4, "a quarter of the way");
  close(c.backoff(secs(45)), 0.75, 1e-9);
  assert.equal(c.nextChange(secs(45)), secs(45) + fromMillis(3750));
  assert.equal(permits(60), 8);
  assert.equal(permits(90), 16);
  assert.equal(c.backoff(secs(90)), 0.0);
  assert.equal(c.nextChange(secs(90)), null);
  const other = buildController(steady(), 1);
  other.setBrake(lifting(1.0, secs(10), 5));
  assert.equal(other.permits(secs(30), 0), 4);
  assert.equal(c.permits(secs(30), 0), 0);
});

test("a removed or lowered brake falls to the new level", () => {
  const release = fromSecs(60);
  const offset = fromSecs(6);
  const full = lifting(1.0, null, 6);
  const half = new Brake({ minBackoff: 0.5 });
  const lowered = Brake.succeed(full, half, T0, release, offset);
  assert.ok(lowered !== null);
  assert.equal(lowered.active(secs(5)), 1.0);
  close(lowered.active(secs(21)) ?? NaN, 0.75, 1e-9);
  assert.equal(lowered.active(secs(40)), 0.5);
  const again = Brake.succeed(lowered, half, secs(21), release, offset);
  assert.ok(again !== null);
  close(again.active(secs(21)) ?? NaN, 0.75, 1e-9);
  close(again.active(secs(27)) ?? NaN, 0.65, 1e-9);
  const removed = Brake.succeed(again, null, secs(40), release, offset);
  assert.ok(removed !== null);
  assert.equal(removed.active(secs(46)), 0.5);
  close(removed.active(secs(61)) ?? NaN, 0.25, 1e-9);
  assert.equal(removed.active(secs(76)), null);
  assert.equal(Brake.succeed(removed, null, secs(80), release, offset), null);
  const expired = lifting(0.5, secs(1), 0);
  assert.equal(Brake.succeed(expired, null, secs(100), release, offset), null);
  const mid = Brake.succeed(expired, null, secs(16), release, offset);
  assert.ok(mid !== null);
  close(mid.active(secs(16)) ?? NaN, 0.25, 1e-9);
  const step = Brake.succeed(full, null, T0, 0, 0);
  assert.equal(step === null ? null : step.active(T0), null);
});

test("Brake.fromWire converts the Unix expiry", () => {
  const now = fromSecs(50);
  const b = Brake.fromWire({ minBackoff: 0.3, expiresAtUnix: 1_000_010 }, now, 1_000_000);
  assert.equal(b.until, fromSecs(60));
  assert.equal(b.active(fromSecs(59)), 0.3);
  assert.equal(b.active(fromSecs(60)), null);
  const expired = Brake.fromWire({ minBackoff: 0.3, expiresAtUnix: 999_000 }, now, 1_000_000);
  assert.equal(expired.active(now), null);
});

test("reconfigure keeps state and an algorithm change carries the backoff", () => {
  let c = buildController(steady({ credit: 0.0 }), 1);
  for (let i = 0; i < 10; i++) c.record(T0, "dependency_failure");
  const b = c.backoff(T0);
  close(b, 0.5, 1e-9);
  c = applySettings(c, T0, steady({ maxPermits: 32 }), 1, null);
  assert.equal(c.backoff(T0), b);
  assert.equal(c.permits(T0, 0), 16);
  c = applySettings(c, T0, steady({ algorithm: "Fixed" }), 1, null);
  assert.equal(c.algorithm, "Fixed");
  assert.equal(c.backoff(T0), 0.0);
  let c2 = buildController(steady({ algorithm: "Fixed" }), 1);
  c2.setBrake(new Brake({ minBackoff: 0.25 }));
  c2 = applySettings(c2, T0, steady(), 1, new Brake({ minBackoff: 0.25 }));
  assert.equal(c2.algorithm, "SetPoint");
  assert.equal(c2.backoff(T0), 0.25, "carried from Fixed under brake");
});

test("same seed, same probe schedule", () => {
  const schedule = (seed: number) => {
    const c = new SetPoint(steady({ credit: 0.0 }), seed);
    backOffFully(c, T0);
    let now = T0;
    const out: number[] = [];
    for (let i = 0; i < 6; i++) {
      now = nextProbeTime(c, now);
      out.push(now);
      c.record(now, "dependency_failure");
    }
    return out;
  };
  assert.deepEqual(schedule(42), schedule(42));
  assert.notDeepEqual(schedule(42), schedule(43));
});

test("from config uses the wire knobs", () => {
  const c = controllerFromConfig(
    {
      ...defaultWorkerConfigUnhashed(),
      algorithm: "RatioThrottle",
      maxPermits: 7,
      probeInitialMs: 500,
      probeMaxMs: 4000,
    },
    1,
  );
  assert.equal(c.algorithm, "RatioThrottle");
  assert.equal(c.settings().maxPermits, 7);
  assert.equal(c.settings().probeInitial, fromMillis(500));
  assert.equal(c.settings().probeMax, fromSecs(4));
  assert.equal(c.limit(T0), 7);
});

test("settings from config: optional fields, defaults and sanitizing", () => {
  const d = settingsFromConfig(defaultWorkerConfigUnhashed());
  assert.deepEqual(
    [d.initialPermits, d.ratioWindow, d.brakeRelease, d.floorMax, d.redelivery],
    [2, fromSecs(30), fromSecs(60), 0.25, [fromSecs(60), fromSecs(480)]],
  );
  const s = settingsFromConfig({
    ...defaultWorkerConfigUnhashed(),
    initialPermits: 4,
    ratioWindowMs: 10_000,
    brakeReleaseMs: 0,
    floorMax: 0.1,
    redelivery: { baseMs: 30_000, maxMs: 120_000 },
  });
  assert.deepEqual(
    [s.initialPermits, s.ratioWindow, s.brakeRelease, s.floorMax, s.redelivery],
    [4, fromSecs(10), 0, 0.1, [fromSecs(30), fromSecs(120)]],
  );
  const off = settingsFromConfig({
    ...defaultWorkerConfigUnhashed(),
    redelivery: { baseMs: 0, maxMs: 0 },
  });
  assert.equal(off.redelivery, null);
  const wild = buildController(
    steady({ setPoint: 1.5, reaction: 0, maxPermits: 0, probeInitial: 0, probeMax: 0 }),
    1,
  ).settings();
  assert.deepEqual(
    [wild.setPoint, wild.reaction, wild.maxPermits, wild.probeInitial, wild.probeMax],
    [0.99, 1, 1, 1, 1],
  );
  assert.equal(buildController(steady({ setPoint: NaN }), 1).settings().setPoint, 0.0001);
  assert.equal(buildController(steady({ floorMax: 5 }), 1).settings().floorMax, 0.9);
  assert.equal(buildController(steady({ ratioWindow: 5 }), 1).settings().ratioWindow, 1_000_000);
});

test("ratio throttle backs off, probes and forgets after the window", () => {
  const c = new RatioThrottle(steady(), 5);
  let now = T0;
  for (let i = 0; i < 200; i++) {
    c.record(now, "dependency_failure");
    now = now + fromMillis(5);
  }
  assert.equal(c.mode(), "probing");
  assert.equal(c.limit(now), 0);
  const end = now + fromSecs(60);
  while (now < end) {
    const k = c.permits(now, 0);
    for (let i = 0; i < k; i++) c.record(now, "success");
    now = Math.min(c.nextChange(now) ?? now + fromMillis(100), now + fromMillis(100));
  }
  assert.equal(c.mode(), "normal");
  assert.equal(c.limit(now), 16);
});

test("SplitMix64 matches the reference sequence", () => {
  // Reference values of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
  const r = new SplitMix64(0);
  assert.equal(r.nextU64(), 0xe220a8397b1dcdafn);
  assert.equal(r.nextU64(), 0x6e789e6aa1b965f4n);
  assert.equal(r.nextU64(), 0x06c45d188009454fn);
  const f = new SplitMix64(7).nextF64();
  assert.ok(f >= 0 && f < 1);
});

/**
 * Drives one SetPoint for `secs` seconds of 100 ms ticks: messages take 1 s, and each fails
 * with `fail(limit at its start, t)` drawn from a seeded generator (the Rust test's `drive`).
 */
function drive(
  secsTotal: number,
  tail: number,
  fail: (limit: number, t: number) => number,
): [SetPoint, number, number] {
  const c = new SetPoint(settings(16, 0.05, 20), 7);
  const rng = new SplitMix64(11);
  const inFlight: [number, boolean][] = [];
  let att = 0;
  let fails = 0;
  let permitSum = 0;
  let samples = 0;
  for (let tick = 0; tick < secsTotal * 10; tick++) {
    const now = fromMillis(tick * 100);
    let i = 0;
    while (i < inFlight.length) {
      const entry = inFlight[i] as [number, boolean];
      if (entry[0] <= tick) {
        // swap_remove
        const last = inFlight.pop() as [number, boolean];
        if (i < inFlight.length) inFlight[i] = last;
        const ok = entry[1];
        c.record(now, ok ? "success" : "dependency_failure");
        if (tick >= (secsTotal - tail) * 10) {
          att += 1;
          fails += ok ? 0 : 1;
        }
      } else {
        i += 1;
      }
    }
    const limit = c.limit(now);
    const k = c.permits(now, inFlight.length);
    for (let j = 0; j < k; j++) {
      const ok = rng.nextF64() >= fail(Math.max(limit, 1), Math.floor(tick / 10));
      inFlight.push([tick + 10, ok]);
    }
    if (tick >= (secsTotal - tail) * 10) {
      permitSum += c.limit(now);
      samples += 1;
    }
  }
  return [c, fails / Math.max(att, 1), permitSum / Math.max(samples, 1)];
}

test("load-independent failures learn a floor and stop throttling", () => {
  const [c, f, permits] = drive(1800, 600, () => 0.15);
  assert.ok(c.failureFloor() >= 0.12 && c.failureFloor() <= 0.18, `floor ${c.failureFloor()}`);
  assert.ok(permits >= 14.0, `mean permits ${permits}`);
  assert.ok(f >= 0.12 && f <= 0.18, `failure fraction ${f}`);
  assert.equal(new SetPoint({ ...settings(16, 0.05, 20), floorMax: 0 }, 7).failureFloor(), 0);
});

test("overload learns no floor and keeps the set point", () => {
  const [c, f] = drive(1800, 900, (limit) => Math.max(1.0 - 6.0 / limit, 0.0) + 0.005);
  assert.equal(c.failureFloor(), 0.0);
  assert.ok(f <= 0.06, `failure fraction ${f}`);
});

test("outages and flapping learn no floor", () => {
  const [c, , permits] = drive(1800, 600, (_, t) => (t >= 60 ? 1.0 : 0.0));
  assert.equal(c.failureFloor(), 0.0);
  assert.ok(permits < 1.0, `mean permits ${permits}`);
  const [c2] = drive(3600, 600, (_, t) => (Math.floor(t / 60) % 2 === 1 ? 1.0 : 0.005));
  assert.equal(c2.failureFloor(), 0.0);
});

test("the floor ends when the dependency heals", () => {
  const [c, f, permits] = drive(3600, 300, (_, t) => (t < 1800 ? 0.15 : 0.005));
  assert.equal(c.failureFloor(), 0.0);
  assert.ok(f < 0.02 && permits >= 15.0, `${f} ${permits}`);
});

test("the floor estimate is unknown until tested", () => {
  assert.equal(new SetPoint(settings(16, 0.05, 20), 7).floorEstimate(), null);
  let [c] = drive(600, 60, () => 0.005);
  assert.equal(c.floorEstimate(), null, "a healthy pod never ran an experiment");
  [c] = drive(1800, 600, () => 0.15);
  const f0 = c.floorEstimate();
  assert.ok(f0 !== null && f0 >= 0.12 && f0 <= 0.18, `floor ${f0}`);
  [c] = drive(1800, 900, (limit) => Math.max(1.0 - 6.0 / limit, 0.0) + 0.005);
  assert.equal(c.floorEstimate() ?? 0.0, 0.0, "overload: no floor");
  [c] = drive(1800, 600, (_, t) => (t >= 60 ? 1.0 : 0.0));
  assert.equal(c.floorEstimate() ?? 0.0, 0.0, "outage: no floor");
  [c] = drive(900, 60, (limit) => (limit > 1 ? 0.9 : 0.0));
  assert.equal(c.floorEstimate(), 0.0);
});
