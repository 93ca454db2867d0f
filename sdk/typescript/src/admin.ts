/**
 * The admin HTTP server (a port of `crates/worker/src/config/admin.rs`): `PUT`/`GET
 * /v1/config`, `GET /metrics`, `GET /healthz`, on Node's `http`.
 *
 * Answers follow the wire contract: 200 with `{hash, generation}` when a push is applied or
 * already running, 400 for a malformed or invalid payload, 401 without a valid token (missing,
 * not a bearer token, refused by the `TokenVerifier`, wrong audience), 403 for a valid token of
 * an identity that is not allowed, 409 for a payload older than the running generation, 413
 * for a body over 64 KiB, 408 when the body does not arrive in time, 429 (with `Retry-After`)
 * for a source that failed authentication too often, 503 when the token cannot be checked. The
 * token is checked before the body is read. Errors are JSON `{"error": "..."}`.
 *
 * With `conformanceHook`, it also serves `POST /v1/conformance/controller` for a conformance
 * run (see `conformance.ts`); without it, that path is 404.
 */

import http from "node:http";
import type { AddressInfo } from "node:net";

import { ConfigError } from "./config.js";
import { CaseError, HOOK_PATH, MAX_CASE_BYTES, runCaseBody } from "./conformance.js";
import type { Logger } from "./log.js";
import { defaultLogger } from "./log.js";
import type { Metrics } from "./metrics.js";
import type { Clock } from "./permits.js";
import { MonotonicClock } from "./permits.js";
import { type ConfigState, StaleGenerationError } from "./receiver.js";
import { type Identity, type TokenVerifier, VerifyError } from "./token.js";
import { CONFIG_PATH, type ConfigAck, MAX_PAYLOAD_BYTES } from "./wire.js";

/** Path of the liveness endpoint. */
export const HEALTHZ_PATH = "/healthz";
/** Path of the metrics endpoint. */
export const METRICS_PATH = "/metrics";
/** Path of the producer state (not served by this SDK: 404). */
export const PRODUCER_PATH = "/v1/producer";
/** Default time allowed for a request's headers (ms). */
export const DEFAULT_HEADER_TIMEOUT_MS = 5_000;
/** Default time allowed for a request's body (ms). */
export const DEFAULT_BODY_TIMEOUT_MS = 10_000;

/**
 * How many failed authentications a source may make: a bucket of `burst` failures refilled by
 * one every `refillMs`. A source whose bucket is empty gets 429 for every push, before its
 * token is looked at; successful pushes cost nothing.
 */
export interface FailureLimit {
  burst: number;
  refillMs: number;
}

/** The default failure limit: 10 in a row, one forgiven every 2 s. */
export const DEFAULT_FAILURE_LIMIT: Readonly<FailureLimit> = { burst: 10, refillMs: 2_000 };

/** Most sources tracked; beyond it, full buckets are forgotten, then new sources share one. */
const MAX_SOURCES = 4096;
/** The key of requests without a peer address, and of new sources once the map is full. */
const UNKNOWN = "";

interface Bucket {
  credit: number;
  at: number;
}

/** Per-source failed-authentication buckets. */
class Limiter {
  private readonly buckets = new Map<string, Bucket>();

  constructor(
    private readonly limit: FailureLimit,
    private readonly clock: Clock,
  ) {}

  private refilled(b: Bucket, now: number): Bucket {
    const burst = Math.max(this.limit.burst, 1);
    const per = this.limit.refillMs / 1000;
    const gained = per > 0 ? Math.max(now - b.at, 0) / 1e9 / per : burst;
    return { credit: Math.min(b.credit + gained, burst), at: now };
  }

  private key(source: string): string {
    return this.buckets.has(source) || this.buckets.size < MAX_SOURCES ? source : UNKNOWN;
  }

  /** Null when `source` may try to authenticate; otherwise how long until it may (ms). */
  throttled(source: string): number | null {
    const now = this.clock.now();
    const key = this.key(source);
    const old = this.buckets.get(key);
    if (old === undefined) return null;
    const b = this.refilled(old, now);
    this.buckets.set(key, b);
    return b.credit < 1.0 ? this.limit.refillMs * Math.min(Math.max(1.0 - b.credit, 0), 1) : null;
  }

  /** Charges one failed authentication to `source`. */
  failed(source: string): void {
    const now = this.clock.now();
    const burst = Math.max(this.limit.burst, 1);
    if (this.buckets.size >= MAX_SOURCES && !this.buckets.has(source)) {
      for (const [k, b] of this.buckets) {
        if (this.refilled(b, now).credit >= burst) this.buckets.delete(k);
      }
    }
    const key = this.key(source);
    const old = this.buckets.get(key);
    const b = old === undefined ? { credit: burst, at: now } : this.refilled(old, now);
    this.buckets.set(key, { credit: Math.max(b.credit - 1.0, 0.0), at: now });
  }
}

/** A request as the admin endpoint sees it (what Node's `IncomingMessage` provides). */
export interface AdminRequest {
  method: string;
  /** The request target (`/v1/config`, possibly with a query). */
  url: string;
  /** Header values by lower-case name. */
  headers: Record<string, string | string[] | undefined>;
  /** The peer's IP address (requests without one share one failure bucket). */
  remoteAddress?: string | undefined;
  /** The body. */
  body: AsyncIterable<Uint8Array>;
}

/** An answer of the admin endpoint. */
export interface AdminResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The body was not read to its end: the connection must close. */
  close?: boolean;
}

function reply(status: number, contentType: string, body: string): AdminResponse {
  return { status, headers: { "content-type": contentType }, body };
}

function error(status: number, message: string): AdminResponse {
  return reply(status, "application/json", JSON.stringify({ error: message }));
}

function ackReply(ack: ConfigAck): AdminResponse {
  return reply(
    200,
    "application/json",
    JSON.stringify({ hash: ack.hash, generation: ack.generation }),
  );
}

/** The bearer token of `Authorization: Bearer <token>`, if well formed. */
function bearer(headers: AdminRequest["headers"]): string | null {
  let value = headers.authorization;
  if (Array.isArray(value)) value = value[0];
  if (value === undefined || !/^[\x20-\x7e\t]*$/.test(value)) return null;
  const space = value.indexOf(" ");
  if (space < 0) return null;
  const scheme = value.slice(0, space);
  const token = value.slice(space + 1).trim();
  return scheme.toLowerCase() === "bearer" && token !== "" ? token : null;
}

/** Options of an `Admin` endpoint. */
export interface AdminOptions {
  /** Metrics served on `/metrics`. */
  metrics?: Metrics;
  /** Accept pushes whose token this verifier maps to one of `allowed` (no verifier: no pushes). */
  verifier?: TokenVerifier;
  /** Usernames allowed to push (`serviceAccountUsername(ns, name)` of the operator). */
  allowed?: readonly string[];
  /** Time allowed for a request's headers (ms). */
  headerTimeoutMs?: number;
  /** Time allowed for a request's body (ms). */
  bodyTimeoutMs?: number;
  /** The per-source limit on failed authentications. */
  failureLimit?: FailureLimit;
  /** The clock of the failure limit (default: monotonic). */
  clock?: Clock;
  /** Where refusals are reported. */
  logger?: Logger;
  /**
   * Also serve the conformance hook, `POST /v1/conformance/controller`: one golden-vector case
   * run on a fresh controller (`executeCase`), for the conformance suite. For conformance runs
   * only: the hook takes no token (it touches no state of the worker, but it costs CPU), so a
   * production worker leaves it off, the default; the path is then 404.
   */
  conformanceHook?: boolean;
}

class BodyTimeout extends Error {}

/** The admin endpoint of a worker: the running config, metrics and health, and pushes. */
export class Admin {
  private readonly metrics: Metrics | undefined;
  private readonly verifier: TokenVerifier | undefined;
  private readonly allowed: readonly string[];
  readonly headerTimeoutMs: number;
  readonly bodyTimeoutMs: number;
  private readonly limiter: Limiter;
  private readonly logger: Logger;
  /** Whether `POST /v1/conformance/controller` is served. */
  readonly conformanceHook: boolean;

  constructor(
    readonly state: ConfigState,
    options: AdminOptions = {},
  ) {
    this.metrics = options.metrics;
    this.verifier = options.verifier;
    this.allowed = options.allowed ?? [];
    this.headerTimeoutMs = options.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS;
    this.bodyTimeoutMs = options.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS;
    this.limiter = new Limiter(
      options.failureLimit ?? DEFAULT_FAILURE_LIMIT,
      options.clock ?? new MonotonicClock(),
    );
    this.logger = options.logger ?? defaultLogger;
    this.conformanceHook = options.conformanceHook ?? false;
  }

  /** Answers one request. */
  async handle(req: AdminRequest): Promise<AdminResponse> {
    const path = requestPath(req.url);
    const method = req.method.toUpperCase();
    if (method === "GET" && path === HEALTHZ_PATH) return reply(200, "text/plain", "ok\n");
    if (method === "GET" && path === METRICS_PATH) {
      if (this.metrics === undefined) return error(404, "no metrics registered");
      return reply(200, this.metrics.contentType, await this.metrics.encode());
    }
    if (path === PRODUCER_PATH) return error(404, "this pod runs no producer gate");
    if (path === CONFIG_PATH && method === "GET") return ackReply(this.state.ack());
    if (path === CONFIG_PATH && method === "PUT") return this.push(req);
    if (path === HOOK_PATH && method === "POST" && this.conformanceHook) return this.hook(req);
    if (path === CONFIG_PATH || path === HEALTHZ_PATH || path === METRICS_PATH) {
      return error(405, "method not allowed");
    }
    return error(404, "not found");
  }

  private async push(req: AdminRequest): Promise<AdminResponse> {
    const identity = await this.authenticate(req);
    if ("status" in identity) return identity;
    const body = await this.readBody(req, MAX_PAYLOAD_BYTES, (n) =>
      n === undefined
        ? `document exceeds the limit of ${MAX_PAYLOAD_BYTES} bytes`
        : ConfigError.tooLarge(n).message,
    );
    if (!(body instanceof Uint8Array)) return body;
    try {
      const ack = this.state.applyBytes(body, "push");
      this.logger.info("push accepted", {
        user: identity.username,
        hash: ack.hash,
        generation: ack.generation,
      });
      return ackReply(ack);
    } catch (e) {
      if (e instanceof ConfigError) return error(e.kind === "too_large" ? 413 : 400, e.message);
      if (e instanceof StaleGenerationError) return error(409, e.message);
      throw e;
    }
  }

  /**
   * The conformance hook: the case in the body run on a fresh controller; 400 for a body that
   * is not a case, 413 over `MAX_CASE_BYTES`, 408 when the body does not arrive in time.
   */
  private async hook(req: AdminRequest): Promise<AdminResponse> {
    const body = await this.readBody(
      req,
      MAX_CASE_BYTES,
      () => `case exceeds the limit of ${MAX_CASE_BYTES} bytes`,
    );
    if (!(body instanceof Uint8Array)) return body;
    try {
      return reply(200, "application/json", runCaseBody(body));
    } catch (e) {
      if (e instanceof CaseError) return error(400, e.message);
      throw e;
    }
  }

  /**
   * The pusher's identity, or the refusal: the failure limit first (429), then the bearer
   * token (401), the verifier (401, 503) and the allowed identities (403). Every failure but
   * an unavailable verifier is charged to the source.
   */
  private async authenticate(req: AdminRequest): Promise<Identity | AdminResponse> {
    if (this.verifier === undefined) return error(401, "pushes are disabled on this pod");
    const source = req.remoteAddress ?? UNKNOWN;
    const wait = this.limiter.throttled(source);
    if (wait !== null) {
      const r = error(429, "too many failed authentications from this address; retry later");
      r.headers["retry-after"] = String(Math.max(Math.floor(wait / 1000), 1));
      return r;
    }
    const token = bearer(req.headers);
    if (token === null) {
      this.limiter.failed(source);
      return error(401, "missing bearer token");
    }
    let identity: Identity;
    try {
      identity = await this.verifier.verify(token);
    } catch (e) {
      if (e instanceof VerifyError && e.kind === "unavailable") {
        this.logger.warn("push refused: cannot review the token", { error: e.message });
        return error(503, e.message);
      }
      this.limiter.failed(source);
      const message =
        e instanceof VerifyError ? e.message : VerifyError.unauthenticated(String(e)).message;
      this.logger.warn("push refused: unauthenticated", { error: message, source });
      return error(401, message);
    }
    if (!this.allowed.includes(identity.username)) {
      this.limiter.failed(source);
      this.logger.warn("push refused: identity not allowed", { user: identity.username, source });
      return error(403, `${identity.username} may not configure this pod`);
    }
    return identity;
  }

  /**
   * The body, at most `limit` bytes (413, saying `tooLarge(declared size)`, or `tooLarge()`
   * when the size is not declared) within the body timeout (408).
   */
  private async readBody(
    req: AdminRequest,
    limit: number,
    tooLarge: (size?: number) => string,
  ): Promise<Uint8Array | AdminResponse> {
    let declared = req.headers["content-length"];
    if (Array.isArray(declared)) declared = declared[0];
    if (declared !== undefined && /^\d+$/.test(declared.trim())) {
      const n = Number(declared.trim());
      if (n > limit) return { ...error(413, tooLarge(n)), close: true };
    }
    const chunks: Uint8Array[] = [];
    let size = 0;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new BodyTimeout()), this.bodyTimeoutMs);
    });
    const collect = (async () => {
      for await (const chunk of req.body) {
        size += chunk.length;
        if (size > limit) return "too large" as const;
        chunks.push(chunk);
      }
      return "done" as const;
    })();
    try {
      const r = await Promise.race([collect, timeout]);
      if (r === "too large") {
        return { ...error(413, tooLarge()), close: true };
      }
    } catch (e) {
      if (e instanceof BodyTimeout) {
        return { ...error(408, "request body timed out"), close: true };
      }
      return { ...error(400, `reading body: ${e}`), close: true };
    } finally {
      clearTimeout(timer);
      collect.catch(() => {});
    }
    return Buffer.concat(chunks);
  }

  /**
   * Serves on `port` (0: any) of `host` (default all addresses) until the returned server is
   * closed (`close()` stops accepting; connections in progress finish).
   */
  async listen(port: number, host?: string): Promise<AdminServer> {
    const server = http.createServer(
      {
        // Headers must arrive within the header timeout; Node checks this periodically.
        connectionsCheckingInterval: Math.max(50, Math.min(1000, this.headerTimeoutMs / 4)),
        headersTimeout: this.headerTimeoutMs,
        // The body timeout is ours (a JSON 408); Node's own request timeout stays out of it.
        requestTimeout: 0,
      },
      (req, res) => void this.serveRequest(req, res),
    );
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    return new AdminServer(server);
  }

  private async serveRequest(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    let answer: AdminResponse;
    try {
      answer = await this.handle({
        method: req.method ?? "GET",
        url: req.url ?? "/",
        headers: req.headers,
        remoteAddress: req.socket.remoteAddress,
        // Not destroyed when the reading stops early (413): the answer still goes out.
        body: req.iterator({ destroyOnReturn: false }) as AsyncIterable<Uint8Array>,
      });
    } catch (e) {
      this.logger.warn("admin request failed", { error: String(e) });
      answer = error(500, "internal error");
    }
    const headers: Record<string, string | number> = {
      ...answer.headers,
      "content-length": Buffer.byteLength(answer.body),
    };
    if (answer.close === true) headers.connection = "close";
    res.writeHead(answer.status, headers);
    res.end(answer.body, () => {
      if (answer.close === true) req.destroy();
    });
  }
}

/** The path of a request target, without its query (or scheme and authority). */
function requestPath(url: string): string {
  let target = url;
  if (/^https?:\/\//i.test(target)) {
    try {
      target = new URL(target).pathname;
    } catch {
      return target;
    }
  }
  const q = target.search(/[?#]/);
  return q < 0 ? target : target.slice(0, q);
}

/** A running admin server. */
export class AdminServer {
  constructor(readonly server: http.Server) {}

  /** The bound address. */
  address(): AddressInfo {
    return this.server.address() as AddressInfo;
  }

  /** Stops accepting connections; resolves when the last one closed. */
  close(): Promise<void> {
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeIdleConnections();
    });
  }
}
