// TokenReviewVerifier against a real kube-apiserver (with etcd), from $BP_K8S_BIN (the
// directory `make k8s-bins` prints). Tokens are minted by the API server for a real
// ServiceAccount with the TokenRequest API. Skipped, saying so, when BP_K8S_BIN is not set:
// the binaries are not in the npm registry.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, test } from "node:test";

import {
  Admin,
  type ApiServer,
  CONFIG_PATH,
  ConfigState,
  Gate,
  TokenReviewVerifier,
  VerifyError,
  buildController,
  defaultSettings,
  defaultWorkerConfig,
  pushAudience,
  serviceAccountUsername,
  withHash,
  workerConfigToJson,
} from "../src/index.js";
import { silentLogger } from "../src/log.js";
import { httpRequest, startExample, stopExample } from "./exampleProcess.js";

const BIN = process.env.BP_K8S_BIN;
const skip = BIN === undefined || BIN === "" ? "BP_K8S_BIN is not set (make k8s-bins)" : false;

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface ControlPlane {
  dir: string;
  processes: ChildProcess[];
  api: ApiServer;
  adminToken: string;
}

let cp: ControlPlane | undefined;

function request(
  method: string,
  urlPath: string,
  body: unknown,
): Promise<{ status: number; json: unknown }> {
  const c = cp as ControlPlane;
  return new Promise((resolve, reject) => {
    const data = body === undefined ? "" : JSON.stringify(body);
    const req = https.request(
      new URL(urlPath, c.api.url),
      {
        method,
        ca: c.api.ca,
        headers: {
          authorization: `Bearer ${c.adminToken}`,
          "content-type": "application/json",
          "content-length": Buffer.byteLength(data),
        },
        timeout: 10_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (x: Buffer) => chunks.push(x));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let json: unknown = text;
          try {
            json = JSON.parse(text);
          } catch {
            // not JSON (readyz)
          }
          resolve({ status: res.statusCode ?? 0, json });
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end(data);
  });
}

const tail = (file: string) => (existsSync(file) ? readFileSync(file, "utf8").slice(-3000) : "");

const exited = (p: ChildProcess) => p.exitCode !== null || p.signalCode !== null;

/** GET `url` over plain HTTP: true on a 200. */
function healthy(url: string): Promise<boolean> {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", () => resolve(false));
  });
}

/**
 * etcd and a kube-apiserver on free ports in `dir`, or an Error saying why not. A port found
 * free can be taken (by another process's outgoing connection) before the child binds it, so
 * the caller starts again on new ports.
 */
async function startControlPlane(
  bin: string,
  dir: string,
  processes: ChildProcess[],
): Promise<ControlPlane> {
  const start = (name: string, args: string[]) => {
    const log = openSync(path.join(dir, `${name}.log`), "w");
    const p = spawn(path.join(bin, name), args, { stdio: ["ignore", log, log] });
    p.on("error", () => {});
    processes.push(p);
    return p;
  };
  const etcdUrl = `http://127.0.0.1:${await freePort()}`;
  const etcd = start("etcd", [
    `--data-dir=${path.join(dir, "etcd")}`,
    `--listen-client-urls=${etcdUrl}`,
    `--advertise-client-urls=${etcdUrl}`,
    `--listen-peer-urls=http://127.0.0.1:${await freePort()}`,
    "--unsafe-no-fsync",
    "--log-level=warn",
  ]);
  for (
    const deadline = Date.now() + 30_000;
    !(await healthy(`${etcdUrl}/health`));
    await sleep(200)
  ) {
    if (exited(etcd) || Date.now() > deadline) {
      throw new Error(
        `etcd not healthy (exit ${etcd.exitCode}):\n${tail(path.join(dir, "etcd.log"))}`,
      );
    }
  }
  const { privateKey, publicKey } = generateKeyPairSync("rsa", {
    modulusLength: 2048,
    privateKeyEncoding: { type: "pkcs8", format: "pem" },
    publicKeyEncoding: { type: "spki", format: "pem" },
  });
  writeFileSync(path.join(dir, "sa.key"), privateKey);
  writeFileSync(path.join(dir, "sa.pub"), publicKey);
  const adminToken = randomBytes(24).toString("hex");
  writeFileSync(path.join(dir, "tokens.csv"), `${adminToken},admin,admin-uid,"system:masters"\n`);
  const port = await freePort();
  const apiserver = start("kube-apiserver", [
    `--etcd-servers=${etcdUrl}`,
    "--bind-address=127.0.0.1",
    "--advertise-address=127.0.0.1",
    `--secure-port=${port}`,
    // A self-signed serving certificate (and its CA) generated into the cert dir.
    `--cert-dir=${path.join(dir, "certs")}`,
    `--token-auth-file=${path.join(dir, "tokens.csv")}`,
    "--authorization-mode=RBAC",
    "--service-cluster-ip-range=10.0.0.0/24",
    `--service-account-issuer=https://127.0.0.1:${port}`,
    `--service-account-key-file=${path.join(dir, "sa.pub")}`,
    `--service-account-signing-key-file=${path.join(dir, "sa.key")}`,
    "--disable-admission-plugins=ServiceAccount",
    "--enable-priority-and-fairness=false",
    "--profiling=false",
  ]);
  const certFile = path.join(dir, "certs", "apiserver.crt");
  cp = {
    dir,
    processes,
    adminToken,
    api: { url: `https://127.0.0.1:${port}`, token: () => adminToken },
  };
  const deadline = Date.now() + 180_000;
  for (;;) {
    if (exited(apiserver) || exited(etcd) || Date.now() > deadline) {
      throw new Error(
        `kube-apiserver not ready (exit ${apiserver.exitCode}, etcd exit ${etcd.exitCode}):\n` +
          `${tail(path.join(dir, "kube-apiserver.log"))}\netcd:\n${tail(path.join(dir, "etcd.log"))}`,
      );
    }
    if (existsSync(certFile)) {
      cp.api.ca = readFileSync(certFile);
      try {
        const r = await request("GET", "/api/v1/namespaces/default", undefined);
        if (r.status === 200) return cp;
      } catch {
        // not listening yet
      }
    }
    await sleep(300);
  }
}

before(async () => {
  if (skip !== false) return;
  const failures: string[] = [];
  for (let attempt = 1; attempt <= 3; attempt++) {
    const dir = mkdtempSync(path.join(tmpdir(), "bp-ts-apiserver-"));
    const processes: ChildProcess[] = [];
    try {
      cp = await startControlPlane(BIN as string, dir, processes);
      return;
    } catch (e) {
      failures.push(`attempt ${attempt}: ${(e as Error).message}`);
      for (const p of processes) p.kill("SIGKILL");
      cp = undefined;
      rmSync(dir, { recursive: true, force: true });
    }
  }
  throw new Error(`no kube-apiserver:\n${failures.join("\n")}`);
});

after(() => {
  if (cp === undefined) return;
  for (const p of cp.processes) p.kill("SIGTERM");
  rmSync(cp.dir, { recursive: true, force: true });
});

/** A token the API server mints for ServiceAccount `name` in `default`, for `audiences`. */
async function mint(name: string, audiences: string[]): Promise<string> {
  const sa = await request("POST", "/api/v1/namespaces/default/serviceaccounts", {
    apiVersion: "v1",
    kind: "ServiceAccount",
    metadata: { name },
  });
  assert.ok(sa.status === 201 || sa.status === 409, JSON.stringify(sa.json));
  const r = await request("POST", `/api/v1/namespaces/default/serviceaccounts/${name}/token`, {
    apiVersion: "authentication.k8s.io/v1",
    kind: "TokenRequest",
    spec: { audiences, expirationSeconds: 600 },
  });
  assert.equal(r.status, 201, JSON.stringify(r.json));
  return (r.json as { status: { token: string } }).status.token;
}

test("a real API server reviews the tokens", { skip }, async () => {
  const c = cp as ControlPlane;
  const audience = pushAudience("shop", "export");
  const verifier = TokenReviewVerifier.forWorkload("shop", "export", { apiServer: c.api });
  const operator = await mint("backpressure-operator", [audience]);
  assert.deepEqual(await verifier.verify(operator), {
    username: serviceAccountUsername("default", "backpressure-operator"),
  });
  const refusal = async (token: string) => {
    try {
      await verifier.verify(token);
    } catch (e) {
      assert.ok(e instanceof VerifyError);
      return e;
    }
    assert.fail("verified");
  };
  // Another target's token: refused locally.
  const other = await mint("backpressure-operator", [pushAudience("shop", "other")]);
  assert.equal((await refusal(other)).kind, "unauthenticated");
  // Our audience, but a forged signature: the API server refuses it.
  const [h, p, s] = operator.split(".") as [string, string, string];
  const forged = `${h}.${p}.${s.slice(0, -4)}AAAA`;
  const e = await refusal(forged);
  assert.equal(e.kind, "unauthenticated", e.message);
  // The worker's own credential refused by the API server: 503, not the pusher's fault.
  const broken = new TokenReviewVerifier(audience, {
    apiServer: { ...c.api, token: () => "not-a-valid-credential" },
  });
  try {
    await broken.verify(operator);
    assert.fail("verified with a bad credential");
  } catch (err) {
    assert.ok(err instanceof VerifyError && err.kind === "unavailable", String(err));
  }
});

test("a push authenticated by the real API server is applied", { skip }, async () => {
  const c = cp as ControlPlane;
  const audience = pushAudience("shop", "export");
  const gate = new Gate(buildController({ ...defaultSettings(), initialPermits: 0 }, 1));
  const state = new ConfigState(gate, defaultWorkerConfig(), { logger: silentLogger });
  const admin = new Admin(state, {
    verifier: new TokenReviewVerifier(audience, { apiServer: c.api }),
    allowed: [serviceAccountUsername("default", "backpressure-operator")],
    logger: silentLogger,
  });
  const body = workerConfigToJson(
    withHash({ ...defaultWorkerConfig(), generation: 3, maxPermits: 5 }),
  );
  const push = (token: string) =>
    admin.handle({
      method: "PUT",
      url: CONFIG_PATH,
      headers: { authorization: `Bearer ${token}` },
      remoteAddress: "127.0.0.1",
      body: (async function* () {
        yield Buffer.from(body);
      })(),
    });
  const intruder = await mint("intruder", [audience]);
  assert.equal((await push(intruder)).status, 403);
  assert.equal(gate.snapshot().limit, 16);
  const r = await push(await mint("backpressure-operator", [audience]));
  assert.equal(r.status, 200, r.body);
  assert.equal(gate.snapshot().limit, 5);
});

test(
  "the example worker, started from the conformance environment, takes pushes reviewed by the API server",
  { skip },
  async () => {
    const c = cp as ControlPlane;
    // The harness's files: the API server's CA and the bearer token the worker reviews with.
    const caFile = path.join(c.dir, "example-ca.crt");
    const tokenFile = path.join(c.dir, "example-token");
    writeFileSync(caFile, c.api.ca as Buffer);
    writeFileSync(tokenFile, `${c.adminToken}\n`);
    const w = await startExample({
      BP_WORKLOAD: "orders",
      BP_NAMESPACE: "team-a",
      BP_ADMIN_ADDR: "127.0.0.1:0",
      BP_ALLOWED_IDENTITIES: `system:serviceaccount:default:somebody-else,${serviceAccountUsername("default", "backpressure-operator")}`,
      BP_CONFORMANCE_HOOK: "true",
      BP_KUBE_API_URL: c.api.url,
      BP_KUBE_CA_FILE: caFile,
      BP_KUBE_TOKEN_FILE: tokenFile,
    });
    try {
      const audience = pushAudience("team-a", "orders");
      const cfg = withHash({ ...defaultWorkerConfig(), generation: 4, maxPermits: 6 });
      const push = (token: string) =>
        httpRequest("PUT", `${w.url}${CONFIG_PATH}`, workerConfigToJson(cfg), {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
        });
      assert.equal((await push(await mint("intruder", [audience]))).status, 403);
      assert.equal(
        (await push(await mint("backpressure-operator", [pushAudience("team-a", "x")]))).status,
        401,
      );
      const ok = await push(await mint("backpressure-operator", [audience]));
      assert.equal(ok.status, 200, ok.body);
      assert.deepEqual(JSON.parse(ok.body), { hash: cfg.hash, generation: 4 });
      const running = await httpRequest("GET", `${w.url}${CONFIG_PATH}`);
      assert.deepEqual(JSON.parse(running.body), { hash: cfg.hash, generation: 4 });
      const metrics = await httpRequest("GET", `${w.url}/metrics`);
      assert.match(metrics.body, new RegExp(`backpressure_config_info\\{.*hash="${cfg.hash}"`));
    } finally {
      assert.deepEqual(await stopExample(w), { code: 0, signal: null }, w.stderr());
    }
  },
);
