// WorkerConfig parsing, validation and hashing (the Rust tests of crates/api/src/wire.rs, and
// the cases where serde_json and JSON.parse disagree).

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  ConfigError,
  MAX_PAYLOAD_BYTES,
  WIRE_VERSION,
  type WorkerConfig,
  activeBrake,
  canonicalContent,
  computeHash,
  defaultWorkerConfig,
  defaultWorkerConfigUnhashed,
  parseWorkerConfig,
  validateWorkerConfig,
  withHash,
  workerConfigToJson,
} from "../src/index.js";
import { SplitMix64 } from "../src/controller/index.js";

function refusal(f: () => unknown): ConfigError {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof ConfigError, `not a ConfigError: ${e}`);
    return e;
  }
  assert.fail("accepted");
}

const base = (): WorkerConfig => defaultWorkerConfig();
const unhashed = (over: Partial<WorkerConfig>): WorkerConfig => ({ ...base(), hash: "", ...over });
const text = (o: unknown) => JSON.stringify(o);

test("the default config round-trips and validates", () => {
  const cfg = defaultWorkerConfig();
  assert.equal(cfg.hash.length, 12);
  assert.match(cfg.hash, /^[0-9a-f]{12}$/);
  assert.deepEqual(parseWorkerConfig(workerConfigToJson(cfg)), cfg);
  const json = JSON.parse(workerConfigToJson(cfg));
  assert.ok(!("initialPermits" in json) && !("redelivery" in json));
});

test("the hash changes with the content, not with the generation", () => {
  const a = defaultWorkerConfig();
  const b = withHash({ ...a, setPoint: 0.1 });
  assert.notEqual(a.hash, b.hash);
  assert.equal(withHash({ ...a, generation: 1_767_225_600_000 }).hash, a.hash);
  validateWorkerConfig({ ...a, generation: 42 });
});

test("the canonical content is RFC 8785 of the payload with hash empty and generation 0", () => {
  const cfg = withHash({
    ...defaultWorkerConfigUnhashed(),
    generation: 5,
    floorMax: 0.0,
    brake: { minBackoff: 1.0, expiresAtUnix: 1_767_229_200 },
    setPoint: 1e-7,
  });
  assert.equal(
    canonicalContent(cfg),
    '{"algorithm":"SetPoint","brake":{"expiresAtUnix":1767229200,"minBackoff":1},' +
      '"floorMax":0,"generation":0,"hash":"","maxPermits":16,"probeInitialMs":2000,' +
      '"probeMaxMs":60000,"reaction":20,"setPoint":1e-7,"version":"' +
      WIRE_VERSION +
      '"}',
  );
  // A payload written with 1.0 (serde_json's spelling) hashes as one written with 1.
  const spelled = workerConfigToJson(cfg).replace('"minBackoff":1', '"minBackoff":1.0');
  assert.ok(spelled.includes("1.0"));
  assert.equal(parseWorkerConfig(spelled).hash, cfg.hash);
});

test("refusals name the field", () => {
  const cases: [WorkerConfig, string][] = [
    [unhashed({ setPoint: 1.5 }), "setPoint"],
    [unhashed({ setPoint: NaN }), "setPoint"],
    [unhashed({ setPoint: 0 }), "setPoint"],
    [unhashed({ reaction: 0 }), "reaction"],
    [unhashed({ maxPermits: 0 }), "maxPermits"],
    [unhashed({ probeInitialMs: 0, probeMaxMs: 0 }), "probeInitialMs"],
    [unhashed({ probeMaxMs: 1 }), "probeMaxMs"],
    [unhashed({ generation: -1 }), "generation"],
    [unhashed({ ratioWindowMs: 0 }), "ratioWindowMs"],
    [unhashed({ floorMax: 0.95 }), "floorMax"],
    [unhashed({ floorMax: NaN }), "floorMax"],
    [unhashed({ redelivery: { baseMs: 10, maxMs: 5 } }), "redelivery.maxMs"],
    [unhashed({ brake: { minBackoff: 2.0 } }), "brake.minBackoff"],
    [unhashed({ brake: { minBackoff: -0.5 } }), "brake.minBackoff"],
    [unhashed({ generation: 2 ** 53 }), "generation"],
    [unhashed({ probeMaxMs: 2 ** 53 }), "probeMaxMs"],
    [unhashed({ brakeReleaseMs: 2 ** 60 }), "brakeReleaseMs"],
    [unhashed({ redelivery: { baseMs: 1, maxMs: 2 ** 54 } }), "redelivery.maxMs"],
    [unhashed({ brake: { minBackoff: 0.5, expiresAtUnix: -(2 ** 53) } }), "brake.expiresAtUnix"],
  ];
  for (const [cfg, field] of cases) {
    const e = refusal(() => validateWorkerConfig(cfg));
    assert.equal(e.kind, "field", e.message);
    assert.equal(e.field, field, e.message);
    assert.ok(e.message.includes(field), `${e.message} should name ${field}`);
    // The same through the parser (NaN is not JSON: written as a string it is malformed).
    if (!Number.isNaN(cfg.setPoint) && !Number.isNaN(cfg.floorMax ?? 0)) {
      const p = refusal(() => parseWorkerConfig(workerConfigToJson(cfg)));
      assert.equal(p.field, field, p.message);
    }
  }
  const ok = withHash({
    ...defaultWorkerConfigUnhashed(),
    initialPermits: 0,
    ratioWindowMs: 1,
    brakeReleaseMs: 0,
    floorMax: 0.0,
    redelivery: { baseMs: 0, maxMs: 0 },
    generation: Number.MAX_SAFE_INTEGER,
    probeMaxMs: Number.MAX_SAFE_INTEGER,
    brake: { minBackoff: 1, expiresAtUnix: -Number.MAX_SAFE_INTEGER },
  });
  validateWorkerConfig(ok);
  assert.deepEqual(parseWorkerConfig(workerConfigToJson(ok)), ok);
});

test("a tampered hash, the version, the size and the shape are refused", () => {
  const tampered = { ...base(), setPoint: 0.2 };
  const e = refusal(() => validateWorkerConfig(tampered));
  assert.equal(e.kind, "hash");
  assert.ok(e.message.startsWith("hash mismatch"));
  assert.equal(refusal(() => parseWorkerConfig(workerConfigToJson(tampered))).kind, "hash");
  assert.equal(
    refusal(() => parseWorkerConfig(text({ ...base(), version: "v0" }))).kind,
    "version",
  );
  assert.equal(refusal(() => parseWorkerConfig("{not json")).kind, "malformed");
  assert.equal(
    refusal(() => parseWorkerConfig(" ".repeat(MAX_PAYLOAD_BYTES + 1))).kind,
    "too_large",
  );
  // Exactly the limit is not too large (but not JSON either).
  assert.equal(refusal(() => parseWorkerConfig(" ".repeat(MAX_PAYLOAD_BYTES))).kind, "malformed");
  // The limit counts bytes, not characters.
  const wide = text({ ...base(), hash: "é".repeat(MAX_PAYLOAD_BYTES / 2) });
  assert.equal(refusal(() => parseWorkerConfig(wide)).kind, "too_large");
  assert.equal(
    refusal(() => parseWorkerConfig(text({ ...base(), surprise: 1 }))).kind,
    "malformed",
  );
});

test("the shape is serde_json's: types, integers, duplicates, nulls", () => {
  const doc = (over: Record<string, unknown>) => text({ ...base(), hash: "", ...over });
  const malformed: [string, string][] = [
    [doc({ reaction: 20.0 }).replace('"reaction":20', '"reaction":20.0'), "float for u32"],
    [doc({}).replace('"reaction":20', '"reaction":2e1'), "exponent for u32"],
    [doc({}).replace('"reaction":20', '"reaction":-0'), "-0 for u32"],
    [doc({ reaction: -1 }), "negative u32"],
    [doc({ reaction: 4294967296 }), "u32 overflow"],
    [doc({ generation: 1.5 }), "float generation"],
    [doc({}).replace('"generation":0', '"generation":9223372036854775808'), "i64 overflow"],
    [doc({}).replace('"probeMaxMs":60000', '"probeMaxMs":18446744073709551616'), "u64 overflow"],
    [doc({}).replace('"setPoint":0.05', '"setPoint":1e400'), "float overflow"],
    [doc({ setPoint: "0.05" }), "string for f64"],
    [doc({ hash: null }), "null hash"],
    [doc({ version: null }), "null version"],
    [doc({ algorithm: "Adaptive" }), "unknown algorithm"],
    [doc({ algorithm: "setPoint" }), "algorithm is case-sensitive"],
    [doc({ brake: { minBackoff: 0.5, extra: true } }), "unknown brake field"],
    [doc({ brake: {} }), "brake without minBackoff"],
    [doc({ redelivery: { baseMs: 1 } }), "redelivery without maxMs"],
    [doc({}).replace("{", '{"setPoint":0.05,'), "duplicate field"],
    [doc({}).replace('"reaction":20', '"reaction":20,"reaction":20'), "duplicate reaction"],
    [
      (() => {
        const o: Record<string, unknown> = { ...base() };
        delete o.probeMaxMs;
        return text(o);
      })(),
      "missing field",
    ],
    ["\ufeff" + doc({}), "byte-order mark"],
    [doc({}) + "x", "trailing characters"],
    ["[", "unterminated"],
    ["null", "not an object"],
    ['"' + WIRE_VERSION + '"', "a string"],
    [doc({ hash: "\ud800" }).replace("\\ud800", "\\ud800x"), "lone surrogate"],
    [doc({}).replace('"hash":""', '"hash":"\u0001"'), "raw control character"],
    ["[".repeat(200) + "]".repeat(200), "too deep"],
  ];
  for (const [payload, what] of malformed) {
    const e = refusal(() => parseWorkerConfig(payload));
    assert.equal(e.kind, "malformed", `${what}: ${e.message}`);
    assert.ok(e.message.startsWith("malformed document"), e.message);
  }
  // What serde_json accepts and JSON.parse-based readers might not.
  const accepted: [string, (c: WorkerConfig) => void][] = [
    [
      doc({ initialPermits: null, brake: null, redelivery: null }),
      (c) => {
        assert.ok(!("initialPermits" in c) && !("brake" in c) && !("redelivery" in c));
      },
    ],
    [
      doc({ brake: { minBackoff: 1, expiresAtUnix: null } }),
      (c) => {
        assert.deepEqual(c.brake, { minBackoff: 1 });
      },
    ],
    [doc({}).replace('"setPoint":0.05', '"setPoint":5e-2'), (c) => assert.equal(c.setPoint, 0.05)],
    [doc({ floorMax: 0 }), (c) => assert.equal(c.floorMax, 0)],
    [
      doc({ algorithm: { RatioThrottle: null } }),
      (c) => assert.equal(c.algorithm, "RatioThrottle"),
    ],
    [
      (() => {
        const o: Record<string, unknown> = { ...base() };
        delete o.hash;
        return text(o);
      })(),
      (c) => assert.equal(c.hash, ""),
    ],
    [`  \n${doc({})}\r\n\t`, (c) => assert.equal(c.maxPermits, 16)],
    // serde's sequence form of a struct: the fields in declaration order.
    [
      text([WIRE_VERSION, 3, "", "Fixed", 0.1, 5, 4, 100, 200]),
      (c) => {
        assert.deepEqual(
          [c.generation, c.algorithm, c.maxPermits, c.probeMaxMs],
          [3, "Fixed", 4, 200],
        );
      },
    ],
  ];
  for (const [payload, check] of accepted) check(parseWorkerConfig(payload));
  // The empty or absent hash is filled in by the receiver, not by the parser.
  assert.equal(parseWorkerConfig(doc({})).hash, "");
});

test("the brake is active until it expires", () => {
  const cfg = { ...base(), brake: { minBackoff: 0.5, expiresAtUnix: 100 } };
  assert.equal(activeBrake(cfg, 99), 0.5);
  assert.equal(activeBrake(cfg, 100), null);
  assert.equal(activeBrake(base(), 0), null);
});

/** A valid config drawn from `rng`: every field within its documented range. */
function randomConfig(rng: SplitMix64): WorkerConfig {
  const u = () => rng.nextF64();
  const int = (lo: number, hi: number) => lo + Math.floor(u() * (hi - lo));
  const maybe = <T>(f: () => T): T | undefined => (u() < 0.5 ? f() : undefined);
  const algorithms = ["SetPoint", "RatioThrottle", "Fixed", "Off"] as const;
  const pi = int(1, 1_000_000);
  const cfg: WorkerConfig = {
    version: WIRE_VERSION,
    generation: int(0, Number.MAX_SAFE_INTEGER),
    hash: "",
    algorithm: algorithms[int(0, 4)] as WorkerConfig["algorithm"],
    setPoint: 1e-6 + u() * 0.999,
    reaction: int(1, 10_000),
    maxPermits: int(1, 10_000),
    probeInitialMs: pi,
    probeMaxMs: pi + int(0, 1_000_000),
  };
  const ip = maybe(() => int(0, 2048));
  if (ip !== undefined) cfg.initialPermits = ip;
  const rw = maybe(() => int(1, 10_000_000));
  if (rw !== undefined) cfg.ratioWindowMs = rw;
  const br = maybe(() => int(0, 10_000_000));
  if (br !== undefined) cfg.brakeReleaseMs = br;
  const fm = maybe(() => u() * 0.9);
  if (fm !== undefined) cfg.floorMax = fm;
  const rd = maybe(() => int(0, 1_000_000));
  if (rd !== undefined) cfg.redelivery = { baseMs: rd, maxMs: rd + int(0, 1_000_000) };
  const bk = maybe(() => u());
  if (bk !== undefined) {
    cfg.brake = { minBackoff: bk };
    const ex = maybe(() => int(-2_000_000_000, 2_000_000_000));
    if (ex !== undefined) cfg.brake.expiresAtUnix = ex;
  }
  return withHash(cfg);
}

test("valid configs round-trip and tampering is detected (seeded)", () => {
  const rng = new SplitMix64(0xb0c0ffee);
  for (let i = 0; i < 500; i++) {
    const cfg = randomConfig(rng);
    const bytes = workerConfigToJson(cfg);
    assert.ok(bytes.length <= MAX_PAYLOAD_BYTES);
    assert.deepEqual(parseWorkerConfig(bytes), cfg);
    const tampered = { ...cfg, maxPermits: cfg.maxPermits + 1 + Math.floor(rng.nextF64() * 99) };
    assert.equal(refusal(() => validateWorkerConfig(tampered)).kind, "hash");
    validateWorkerConfig({ ...cfg, generation: cfg.generation + 1 });
    assert.equal(computeHash(cfg), cfg.hash);
  }
});

test("one hostile field is accepted validly or refused clearly (seeded)", () => {
  const rng = new SplitMix64(0x5eed);
  const fields = [
    "version",
    "generation",
    "hash",
    "algorithm",
    "setPoint",
    "reaction",
    "maxPermits",
    "probeInitialMs",
    "probeMaxMs",
    "brake",
    "unexpected",
  ];
  const leaves: unknown[] = [
    null,
    true,
    false,
    -1,
    0,
    1,
    2 ** 53,
    0.5,
    -0.5,
    1e308,
    1.5,
    "",
    "SetPoint",
    WIRE_VERSION,
    "x",
    [],
    {},
    [1, 2],
    { minBackoff: 0.5 },
    { minBackoff: 0.5, expiresAtUnix: 1 },
    { minBackoff: 7 },
    { a: 1 },
  ];
  const rawNumbers = ["18446744073709551615", "-0", "1.0", "1e3", "-9223372036854775809"];
  for (let i = 0; i < 2000; i++) {
    const field = fields[Math.floor(rng.nextF64() * fields.length)] as string;
    const dropHash = rng.nextF64() < 0.5;
    const doc: Record<string, unknown> = { ...base() };
    if (dropHash) doc.hash = "";
    let payload: string;
    if (rng.nextF64() < 0.2) {
      const raw = rawNumbers[Math.floor(rng.nextF64() * rawNumbers.length)] as string;
      doc[field] = "@@RAW@@";
      payload = text(doc).replace('"@@RAW@@"', raw);
    } else {
      doc[field] = leaves[Math.floor(rng.nextF64() * leaves.length)];
      payload = text(doc);
    }
    let cfg: WorkerConfig;
    try {
      cfg = parseWorkerConfig(payload);
    } catch (e) {
      assert.ok(e instanceof ConfigError, `${payload}: ${e}`);
      assert.ok(e.message.length > 0);
      if (e.kind === "field") {
        assert.ok(
          (e.field ?? "").startsWith(field) ||
            field === "hash" ||
            field === "generation" ||
            e.field === "probeMaxMs",
          `${field}: ${e.message}`,
        );
      }
      if (e.kind === "version") assert.equal(field, "version");
      if (e.kind === "hash") assert.ok(!dropHash || field === "hash", `${field}: ${e.message}`);
      continue;
    }
    validateWorkerConfig(cfg);
    assert.ok(cfg.setPoint > 0 && cfg.setPoint < 1);
    assert.ok(cfg.reaction >= 1 && cfg.maxPermits >= 1);
    assert.ok(cfg.probeInitialMs >= 1 && cfg.probeMaxMs >= cfg.probeInitialMs);
    assert.ok(cfg.generation >= 0);
    if (cfg.brake) assert.ok(cfg.brake.minBackoff >= 0 && cfg.brake.minBackoff <= 1);
    assert.deepEqual(parseWorkerConfig(workerConfigToJson(cfg)), cfg);
  }
});
