// The exposition (crates/worker/src/metrics.rs tests): the wire contract's names, types and
// labels, every series labelled with the workload.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Metrics, metricNames as names } from "../src/index.js";

type Sample = { name: string; labels: Map<string, string>; value: number };

/** The sample lines of the text format. */
function parse(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line.trim() === "") continue;
    const cut = line.lastIndexOf(" ");
    const series = line.slice(0, cut);
    const value = Number(line.slice(cut + 1));
    const brace = series.indexOf("{");
    const name = brace < 0 ? series : series.slice(0, brace);
    const labels = new Map<string, string>();
    if (brace >= 0) {
      for (const m of series.slice(brace + 1, -1).matchAll(/([a-zA-Z_]+)="([^"]*)"/g)) {
        labels.set(m[1] as string, m[2] as string);
      }
    }
    out.push({ name, labels, value });
  }
  return out;
}

/** The `# TYPE` of each family. */
function types(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) out.set(m[1] as string, m[2] as string);
  return out;
}

test("the exposition uses the wire names, types and labels", async () => {
  const m = new Metrics("export-worker");
  m.setBackoff(0.5);
  m.setPermits(8);
  m.setInFlight(3);
  m.recordOutcome("success");
  m.recordOutcome("success");
  m.recordOutcome("dependency_failure");
  m.recordProbe();
  m.setConfig("abc123def456", "SetPoint");
  m.setConfig("0123456789ab", "RatioThrottle");
  const text = await m.encode();
  assert.match(m.contentType, /^application\/openmetrics-text; version=1\.0\.0/);
  assert.ok(text.endsWith("# EOF\n"), text);
  const samples = parse(text);
  assert.deepEqual(
    new Set(samples.map((s) => s.name)),
    new Set([
      names.BACKOFF,
      names.FAILURE_FLOOR,
      names.PERMITS,
      names.IN_FLIGHT,
      names.OUTCOMES_TOTAL,
      names.PROBES_TOTAL,
      names.CONFIG_INFO,
    ]),
  );
  for (const s of samples) {
    assert.equal(s.labels.get(names.LABEL_WORKLOAD), "export-worker", `${s.name}`);
  }
  assert.deepEqual(
    Object.fromEntries(types(text)),
    {
      [names.BACKOFF]: "gauge",
      [names.FAILURE_FLOOR]: "gauge",
      [names.PERMITS]: "gauge",
      [names.IN_FLIGHT]: "gauge",
      backpressure_outcomes: "counter",
      backpressure_probes: "counter",
      [names.CONFIG_INFO]: "gauge",
    },
    text,
  );
  const value = (name: string, extra: [string, string][] = []) =>
    samples
      .filter((s) => s.name === name && extra.every(([k, v]) => s.labels.get(k) === v))
      .map((s) => s.value);
  assert.deepEqual(value(names.BACKOFF), [0.5]);
  assert.deepEqual(value(names.PERMITS), [8]);
  assert.deepEqual(value(names.IN_FLIGHT), [3]);
  assert.deepEqual(value(names.PROBES_TOTAL), [1]);
  const counts: [string, number][] = [
    [names.CLASS_SUCCESS, 2],
    [names.CLASS_DEPENDENCY_FAILURE, 1],
    [names.CLASS_MESSAGE_FAILURE, 0],
  ];
  for (const [cls, n] of counts) {
    assert.deepEqual(value(names.OUTCOMES_TOTAL, [[names.LABEL_CLASS, cls]]), [n], cls);
  }
  const info = samples.filter((s) => s.name === names.CONFIG_INFO);
  assert.equal(info.length, 1, text);
  assert.equal(info[0]?.labels.get(names.LABEL_HASH), "0123456789ab");
  assert.equal(info[0]?.labels.get(names.LABEL_ALGORITHM), "RatioThrottle");
  assert.equal(info[0]?.value, 1);
  for (const s of samples.filter((x) => x.name === names.OUTCOMES_TOTAL)) {
    assert.deepEqual([...s.labels.keys()].sort(), [names.LABEL_CLASS, names.LABEL_WORKLOAD]);
  }
  m.setFailureFloor(null);
  assert.match(await m.encode(), /^backpressure_failure_floor\{workload="export-worker"\} NaN$/m);
  m.setFailureFloor(0.15);
  assert.match(await m.encode(), /^backpressure_failure_floor\{workload="export-worker"\} 0\.15$/m);
});
