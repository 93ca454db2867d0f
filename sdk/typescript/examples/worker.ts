// The SDK's example worker, runnable (`node build/examples/worker.js` after the build): an
// in-memory queue, a simulated dependency with an optional capacity limit, the worker loop,
// the admin server (`/metrics`, `/healthz`, `GET`/`PUT /v1/config`, and the conformance hook
// when asked) and an optional hot-reloaded config file. It takes the environment of
// conformance/README.md, "Starting a worker for a conformance run", as the Rust example worker
// and every SDK's do, or flags of the same names; it serves until SIGTERM or SIGINT (or
// BP_DURATION seconds, when not 0) and then stops cleanly: no new messages, the ones in
// flight finish, the admin port closes, exit status 0.

import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import {
  Admin,
  type AdminServer,
  type ApiServer,
  ConfigState,
  DEFAULT_ADMIN_PORT,
  FileWatcher,
  Gate,
  type Logger,
  Metrics,
  type Outcome,
  SERVICE_ACCOUNT_DIR,
  TokenReviewVerifier,
  controllerFromConfig,
  defaultWorkerConfig,
  inClusterApiServer,
  inClusterNamespace,
} from "@backpressure-dev/worker";

/** A queue client: receive up to `max` messages (waiting a little when there are none). */
export interface Queue<M> {
  receive(max: number, signal: AbortSignal): Promise<M[]>;
  ack(message: M): Promise<void>;
  nack(message: M): Promise<void>;
}

/**
 * The worker loop (the README's example): poll for as many messages as the gate permits,
 * handle each, record its outcome. Runs until `signal` aborts, then waits for the messages in
 * flight.
 */
export async function work<M>(
  gate: Gate,
  queue: Queue<M>,
  handle: (m: M) => Promise<Outcome>,
  signal: AbortSignal,
): Promise<void> {
  const running = new Set<Promise<void>>();
  while (!signal.aborted) {
    const permit = await gate.acquire(10, signal).catch((e: unknown) => {
      if (signal.aborted) return null;
      throw e;
    });
    if (permit === null) break;
    const messages = await queue.receive(permit.granted, signal);
    const started = messages.map((m) => ({ m, slot: permit.start() }));
    permit.release(); // the permits the poll did not use go back
    for (const { m, slot } of started) {
      const done: Promise<void> = handle(m)
        .then(
          async (outcome) => {
            slot.finish(outcome); // "success" | "dependency_failure" | "message_failure"
            await (outcome === "success" ? queue.ack(m) : queue.nack(m));
          },
          async () => {
            slot.abandon(); // the handler threw: free the slot, record nothing
            await queue.nack(m);
          },
        )
        .finally(() => running.delete(done));
      running.add(done);
    }
  }
  await Promise.allSettled(running);
}

/** An in-memory queue: redelivery after a nack, dead letters after `maxAttempts`. */
export class MemoryQueue implements Queue<number> {
  private readonly ready: number[] = [];
  private readonly attempts = new Map<number, number>();
  private readonly waiters = new Set<() => void>();
  acked = 0;
  deadLetters = 0;

  constructor(
    private readonly maxAttempts = 5,
    private readonly redeliveryMs = 200,
  ) {}

  get depth(): number {
    return this.ready.length;
  }

  push(id: number): void {
    this.ready.push(id);
    for (const w of [...this.waiters]) w();
  }

  async receive(max: number, signal: AbortSignal): Promise<number[]> {
    if (this.ready.length === 0 && !signal.aborted) {
      // Wait for a message, at most 200 ms, so that the loop looks at the gate again.
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.waiters.delete(done);
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, 200);
        this.waiters.add(done);
        signal.addEventListener("abort", done, { once: true });
      });
    }
    return this.ready.splice(0, max);
  }

  async ack(id: number): Promise<void> {
    this.attempts.delete(id);
    this.acked += 1;
  }

  async nack(id: number): Promise<void> {
    const n = (this.attempts.get(id) ?? 0) + 1;
    if (n >= this.maxAttempts) {
      this.attempts.delete(id);
      this.deadLetters += 1;
      return;
    }
    this.attempts.set(id, n);
    setTimeout(() => this.push(id), this.redeliveryMs).unref();
  }
}

/** A simulated dependency: `workMs` per call; beyond `capacity` concurrent calls, failures. */
export function dependency(workMs: number, capacity: number): (m: number) => Promise<Outcome> {
  let busy = 0;
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  return async () => {
    busy += 1;
    try {
      if (capacity > 0 && busy > capacity) {
        await sleep(workMs / 4);
        return "dependency_failure";
      }
      await sleep(workMs);
      return "success";
    } finally {
      busy -= 1;
    }
  };
}

/** How the example runs (from the environment, or flags of the same meaning). */
export interface ExampleOptions {
  /** `BP_WORKLOAD`, `--workload`: the `workload` label and half of the token audience. */
  workload: string;
  /** `BP_NAMESPACE`, `--namespace` (default: the pod's namespace, else `default`). */
  namespace: string;
  /** `BP_ADMIN_ADDR`, `--admin-addr`: `host:port` of the admin port. */
  adminHost: string;
  adminPort: number;
  /** `BP_ALLOWED_IDENTITIES` (comma-separated), `--allowed-identity`: who may push. */
  allowedIdentities: string[];
  /** `BP_CONFORMANCE_HOOK` (`true`/`1`), `--conformance-hook`: serve the hook. */
  conformanceHook: boolean;
  /** `BP_KUBE_API_URL`, `--kube-api-url`: the API server for TokenReview (else in-cluster). */
  kubeApiUrl: string | undefined;
  /** `BP_KUBE_CA_FILE`, `--kube-ca-file`: its CA bundle (default: Node's CAs). */
  kubeCaFile: string | undefined;
  /** `BP_KUBE_TOKEN_FILE`, `--kube-token-file`: the bearer token to call it with. */
  kubeTokenFile: string | undefined;
  /** `BP_CONFIG_FILE`, `--config-file`: a mounted `worker-config.json` to hot-reload. */
  configFile: string | undefined;
  /** `BP_DURATION`, `--duration`: stop after this many seconds (0: until SIGTERM/SIGINT). */
  durationS: number;
  /** `BP_SEED`, `--seed`: the controller's seed. */
  seed: number;
  /** `BP_MESSAGES`, `--messages`: messages on the queue at start. */
  messages: number;
  /** `BP_RATE`, `--rate`: further messages per second (0: none). */
  rate: number;
  /** `BP_WORK_MS`, `--work-ms`: processing time of one message. */
  workMs: number;
  /** `BP_CAPACITY`, `--capacity`: concurrent calls the dependency serves (0: unlimited). */
  capacity: number;
}

/** A bad option: the example exits with status 2. */
export class UsageError extends Error {}

const USAGE = `usage: node build/examples/worker.js [options]
  --workload NAME            BP_WORKLOAD (default example-worker)
  --namespace NS             BP_NAMESPACE (default: the pod's namespace, else default)
  --admin-addr HOST:PORT     BP_ADMIN_ADDR (default 127.0.0.1:${DEFAULT_ADMIN_PORT})
  --allowed-identity USER    BP_ALLOWED_IDENTITIES, comma-separated (none: pushes are refused)
  --conformance-hook         BP_CONFORMANCE_HOOK=true|1 (conformance runs only)
  --kube-api-url URL         BP_KUBE_API_URL (TokenReview outside a pod; in-cluster otherwise)
  --kube-ca-file FILE        BP_KUBE_CA_FILE
  --kube-token-file FILE     BP_KUBE_TOKEN_FILE
  --config-file FILE         BP_CONFIG_FILE (a mounted worker-config.json, hot-reloaded)
  --duration SECONDS         BP_DURATION (default 0: until SIGTERM/SIGINT)
  --seed N                   BP_SEED (default 1)
  --messages N               BP_MESSAGES (default 1000)
  --rate PER_SECOND          BP_RATE (default 0)
  --work-ms MS               BP_WORK_MS (default 50)
  --capacity N               BP_CAPACITY (default 0: unlimited)`;

const FLAGS = {
  workload: { type: "string" },
  namespace: { type: "string" },
  "admin-addr": { type: "string" },
  "allowed-identity": { type: "string", multiple: true },
  "conformance-hook": { type: "boolean" },
  "kube-api-url": { type: "string" },
  "kube-ca-file": { type: "string" },
  "kube-token-file": { type: "string" },
  "config-file": { type: "string" },
  duration: { type: "string" },
  seed: { type: "string" },
  messages: { type: "string" },
  rate: { type: "string" },
  "work-ms": { type: "string" },
  capacity: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

function flags(argv: readonly string[]) {
  return parseArgs({ args: [...argv], options: FLAGS, strict: true, allowPositionals: false })
    .values;
}

/** `host:port`, `[v6]:port`; the port in [0, 65535] (0: any free port). */
export function parseAddr(addr: string): [string, number] {
  const cut = addr.lastIndexOf(":");
  const port = addr.slice(cut + 1);
  let host = addr.slice(0, Math.max(cut, 0));
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  if (cut <= 0 || !/^\d{1,5}$/.test(port) || Number(port) > 65535 || host === "") {
    throw new UsageError(`admin address ${JSON.stringify(addr)} is not host:port`);
  }
  return [host, Number(port)];
}

/** `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off`/empty (any case). */
function parseBool(name: string, value: string): boolean {
  const v = value.trim().toLowerCase();
  if (["true", "1", "yes", "on"].includes(v)) return true;
  if (["false", "0", "no", "off", ""].includes(v)) return false;
  throw new UsageError(`${name}=${JSON.stringify(value)} is not true/1 or false/0`);
}

function parseNumber(name: string, value: string, integer: boolean): number {
  const n = Number(value.trim());
  if (
    value.trim() === "" ||
    !Number.isFinite(n) ||
    n < 0 ||
    (integer && !Number.isSafeInteger(n))
  ) {
    throw new UsageError(
      `${name}=${JSON.stringify(value)} is not a non-negative ${integer ? "integer" : "number"}`,
    );
  }
  return n;
}

/** The example's options from its arguments and environment; a flag wins over its variable. */
export function parseOptions(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
  podNamespace: () => string | undefined = () => undefined,
): ExampleOptions {
  let values: ReturnType<typeof flags>;
  try {
    values = flags(argv);
  } catch (e) {
    throw new UsageError(`${e instanceof Error ? e.message : String(e)}\n${USAGE}`);
  }
  if (values.help === true) throw new UsageError(USAGE);
  const get = (flag: keyof typeof FLAGS, variable: string): [string, string] | undefined => {
    const v = values[flag];
    if (typeof v === "string") return [`--${flag}`, v];
    const e = env[variable];
    return e === undefined ? undefined : [variable, e];
  };
  const num = (flag: keyof typeof FLAGS, variable: string, dflt: number, integer = true) => {
    const v = get(flag, variable);
    return v === undefined ? dflt : parseNumber(v[0], v[1], integer);
  };
  const str = (flag: keyof typeof FLAGS, variable: string) => {
    const v = get(flag, variable)?.[1];
    return v === undefined || v === "" ? undefined : v;
  };
  const identities =
    values["allowed-identity"] ??
    (env.BP_ALLOWED_IDENTITIES === undefined ? [] : [env.BP_ALLOWED_IDENTITIES]);
  const hook =
    values["conformance-hook"] === true ||
    (env.BP_CONFORMANCE_HOOK !== undefined &&
      parseBool("BP_CONFORMANCE_HOOK", env.BP_CONFORMANCE_HOOK));
  const [adminHost, adminPort] = parseAddr(
    str("admin-addr", "BP_ADMIN_ADDR") ?? `127.0.0.1:${DEFAULT_ADMIN_PORT}`,
  );
  const options: ExampleOptions = {
    workload: str("workload", "BP_WORKLOAD") ?? "example-worker",
    namespace: str("namespace", "BP_NAMESPACE") ?? podNamespace() ?? "default",
    adminHost,
    adminPort,
    allowedIdentities: identities
      .flatMap((s) => s.split(","))
      .map((s) => s.trim())
      .filter((s) => s !== ""),
    conformanceHook: hook,
    kubeApiUrl: str("kube-api-url", "BP_KUBE_API_URL"),
    kubeCaFile: str("kube-ca-file", "BP_KUBE_CA_FILE"),
    kubeTokenFile: str("kube-token-file", "BP_KUBE_TOKEN_FILE"),
    configFile: str("config-file", "BP_CONFIG_FILE"),
    durationS: num("duration", "BP_DURATION", 0, false),
    seed: num("seed", "BP_SEED", 1),
    messages: num("messages", "BP_MESSAGES", 1000),
    rate: num("rate", "BP_RATE", 0, false),
    workMs: num("work-ms", "BP_WORK_MS", 50, false),
    capacity: num("capacity", "BP_CAPACITY", 0),
  };
  if (
    options.kubeApiUrl === undefined &&
    (options.kubeCaFile !== undefined || options.kubeTokenFile !== undefined)
  ) {
    throw new UsageError("BP_KUBE_CA_FILE and BP_KUBE_TOKEN_FILE need BP_KUBE_API_URL");
  }
  if (options.kubeApiUrl !== undefined && options.kubeTokenFile === undefined) {
    throw new UsageError(
      "BP_KUBE_API_URL needs BP_KUBE_TOKEN_FILE (the bearer token for TokenReview)",
    );
  }
  return options;
}

/** The API server for TokenReview: the explicit one, else the pod's. */
function apiServer(o: ExampleOptions): ApiServer {
  if (o.kubeApiUrl === undefined) return inClusterApiServer();
  const tokenFile = o.kubeTokenFile as string;
  const server: ApiServer = {
    url: o.kubeApiUrl,
    // Read for every review: a projected token rotates.
    token: () => readFileSync(tokenFile, "utf8").trim(),
  };
  if (o.kubeCaFile !== undefined) server.ca = readFileSync(o.kubeCaFile);
  return server;
}

/** JSON lines on stderr. */
const logger: Logger = {
  debug() {},
  info(message, fields) {
    console.error(JSON.stringify({ level: "info", message, ...fields }));
  },
  warn(message, fields) {
    console.error(JSON.stringify({ level: "warn", message, ...fields }));
  },
};

function podNamespace(): string | undefined {
  try {
    return inClusterNamespace(SERVICE_ACCOUNT_DIR);
  } catch {
    return undefined;
  }
}

/** Runs the example until SIGTERM/SIGINT (or the duration); resolves when it has stopped. */
export async function main(o: ExampleOptions): Promise<void> {
  const metrics = new Metrics(o.workload);
  const config = defaultWorkerConfig();
  const gate = new Gate(controllerFromConfig(config, o.seed), { metrics, seed: o.seed, logger });
  const state = new ConfigState(gate, config, { metrics, logger });
  const verifier =
    o.allowedIdentities.length === 0
      ? undefined
      : TokenReviewVerifier.forWorkload(o.namespace, o.workload, { apiServer: apiServer(o) });
  if (verifier !== undefined) {
    logger.info("config pushes enabled", {
      audience: verifier.audience,
      allowed: o.allowedIdentities,
    });
  }
  if (o.conformanceHook) logger.warn("conformance hook enabled: for conformance runs only");
  const admin = new Admin(state, {
    metrics,
    ...(verifier === undefined ? {} : { verifier }),
    allowed: o.allowedIdentities,
    conformanceHook: o.conformanceHook,
    logger,
  });
  const server: AdminServer = await admin.listen(o.adminPort, o.adminHost);
  const bound = server.address();
  logger.info("admin server listening", {
    addr: `${bound.address}:${bound.port}`,
    workload: o.workload,
  });
  const watcher =
    o.configFile === undefined ? null : new FileWatcher(state, o.configFile, logger).start();

  const stop = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    logger.info("stopping", { signal });
    stop.abort();
  };
  process.once("SIGTERM", onSignal);
  process.once("SIGINT", onSignal);
  const timers: NodeJS.Timeout[] = [];
  if (o.durationS > 0) timers.push(setTimeout(() => stop.abort(), o.durationS * 1000));

  const queue = new MemoryQueue();
  for (let i = 0; i < o.messages; i++) queue.push(i);
  if (o.rate > 0) {
    let next = o.messages;
    timers.push(setInterval(() => queue.push(next++), 1000 / o.rate));
  }
  timers.push(
    setInterval(() => {
      const s = gate.snapshot();
      logger.info("status", {
        backoff: Number(s.backoff.toFixed(3)),
        permits: s.limit,
        inFlight: s.inFlight,
        mode: s.mode,
        depth: queue.depth,
        acked: queue.acked,
        deadLetters: queue.deadLetters,
        config: state.ack().hash,
      });
    }, 10_000),
  );

  await work(gate, queue, dependency(o.workMs, o.capacity), stop.signal);
  for (const t of timers) clearTimeout(t);
  watcher?.stop();
  // Requests in progress get 5 s to finish; then their connections are closed.
  const closing = setTimeout(() => server.server.closeAllConnections(), 5_000);
  await server.close();
  clearTimeout(closing);
  process.off("SIGTERM", onSignal);
  process.off("SIGINT", onSignal);
  logger.info("stopped", { acked: queue.acked, deadLetters: queue.deadLetters });
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  let options: ExampleOptions;
  try {
    options = parseOptions(process.argv.slice(2), process.env, podNamespace);
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    console.error(e.message);
    process.exit(2);
  }
  main(options).then(
    () => process.exit(0),
    (e: unknown) => {
      logger.warn("example worker failed", { error: String(e) });
      process.exit(1);
    },
  );
}
