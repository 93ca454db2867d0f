/**
 * Authentication of configuration pushes: a bearer token checked by a `TokenVerifier` (a port
 * of `crates/worker/src/config/token.rs`).
 *
 * The real verifier, `TokenReviewVerifier`, asks the Kubernetes API server with a TokenReview
 * for this worker's own audience, `backpressure.dev/<namespace>/<workload>`, over plain HTTPS
 * (Node's `https`, no Kubernetes client library). Before a review it checks the token locally
 * (`checkJwt`: shape, `exp`, our audience; not the signature), answers from a short cache of
 * positive reviews, and refuses a token the API server refused in the last 30 s
 * (`NegativeCache`); caches are keyed by the token's SHA-256. Tokens are never logged. The
 * worker's ServiceAccount needs `create` on `tokenreviews.authentication.k8s.io` (the
 * `system:auth-delegator` ClusterRole).
 */

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import https from "node:https";

import type { Clock } from "./permits.js";
import { MonotonicClock } from "./permits.js";
import { type JsonValue, parseJsonBytes, toPlain } from "./json.js";
import { pushAudience } from "./wire.js";

/** Who a token belongs to. */
export interface Identity {
  /** The authenticated username, for a ServiceAccount `system:serviceaccount:<ns>:<name>`. */
  username: string;
}

/** Why a token was not accepted: `unauthenticated` (HTTP 401) or `unavailable` (HTTP 503). */
export class VerifyError extends Error {
  override readonly name = "VerifyError";

  private constructor(
    readonly kind: "unauthenticated" | "unavailable",
    message: string,
  ) {
    super(message);
  }

  /** The token is not valid (or not for our audience). */
  static unauthenticated(reason: string): VerifyError {
    return new VerifyError("unauthenticated", `token not authenticated: ${reason}`);
  }

  /** The token could not be checked (API server unreachable). */
  static unavailable(reason: string): VerifyError {
    return new VerifyError("unavailable", `token review unavailable: ${reason}`);
  }
}

/** Checks a bearer token: resolves to its identity, or rejects with a `VerifyError`. */
export interface TokenVerifier {
  verify(token: string): Promise<Identity>;
}

/** The username of a ServiceAccount. */
export function serviceAccountUsername(namespace: string, name: string): string {
  return `system:serviceaccount:${namespace}:${name}`;
}

/** The SHA-256 of a token (hex): the key of the caches, so no token is kept in memory. */
export function tokenKey(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

/** Longest token looked at; a ServiceAccount token is about 1 KiB. */
export const MAX_TOKEN_BYTES = 16 * 1024;

/** Strict unpadded base64url, as Rust's `URL_SAFE_NO_PAD` decoder (canonical trailing bits). */
function base64UrlDecode(part: string): Uint8Array | null {
  const s = part.replace(/=+$/, "");
  if (!/^[A-Za-z0-9_-]*$/.test(s) || s.length % 4 === 1) return null;
  const bytes = Buffer.from(s, "base64url");
  if (bytes.toString("base64url") !== s) return null;
  return bytes;
}

/**
 * The local check of a token before any TokenReview: a JWT (three base64url parts, the first
 * two JSON objects) whose `exp` is after `nowUnix` and whose `aud` (a string or a list)
 * contains `audience`. The signature is NOT checked (the TokenReview is the authority).
 * Returns null when it passes, else the reason (never the token).
 */
export function checkJwt(token: string, audience: string, nowUnix: number): string | null {
  if (Buffer.byteLength(token, "utf8") > MAX_TOKEN_BYTES) {
    return `token longer than ${MAX_TOKEN_BYTES} bytes`;
  }
  const parts = token.split(".");
  if (parts.length !== 3) return "not a JWT (expected three dot-separated parts)";
  const [header, payload, signature] = parts as [string, string, string];
  if (signature === "") return "not a JWT (empty signature)";
  const json = (part: string, name: string): { [k: string]: unknown } | string => {
    const bytes = base64UrlDecode(part);
    if (bytes === null) return `not a JWT (${name} is not base64url)`;
    let value: JsonValue;
    try {
      value = parseJsonBytes(bytes);
    } catch {
      return `not a JWT (${name} is not JSON)`;
    }
    if (value.type !== "object") return `not a JWT (${name} is not a JSON object)`;
    return toPlain(value) as { [k: string]: unknown };
  };
  const h = json(header, "header");
  if (typeof h === "string") return h;
  const claims = json(payload, "payload");
  if (typeof claims === "string") return claims;
  const exp = Object.hasOwn(claims, "exp") ? claims.exp : undefined;
  if (typeof exp !== "number") return "token has no exp claim";
  if (!(exp > nowUnix)) return "token expired";
  const aud = Object.hasOwn(claims, "aud") ? claims.aud : undefined;
  const ours =
    typeof aud === "string" ? aud === audience : Array.isArray(aud) && aud.includes(audience);
  if (!ours) return `token is not for audience ${JSON.stringify(audience)}`;
  return null;
}

/** Default time a refused token is refused without asking the API server again (ms). */
export const DEFAULT_NEGATIVE_TTL_MS = 30_000;
/** Most tokens remembered as refused. */
export const NEGATIVE_CACHE_MAX = 1024;
/** Default time a positive review is cached (ms). */
export const DEFAULT_CACHE_TTL_MS = 60_000;
/** Most cached reviews; beyond it, expired entries are dropped, then all. */
const CACHE_MAX = 256;

/** Token hashes the API server refused recently, with a bounded size. */
export class NegativeCache {
  private readonly entries = new Map<string, number>();
  private readonly max: number;

  constructor(
    private readonly ttlMs: number,
    max: number,
    private readonly clock: Clock = new MonotonicClock(),
  ) {
    this.max = Math.max(max, 1);
  }

  /** Whether `key` was refused less than the TTL ago. */
  contains(key: string): boolean {
    const until = this.entries.get(key);
    return until !== undefined && this.clock.now() < until;
  }

  /** Remembers that `key` was refused. */
  insert(key: string): void {
    if (this.ttlMs <= 0) return;
    const now = this.clock.now();
    if (this.entries.size >= this.max && !this.entries.has(key)) {
      for (const [k, until] of this.entries) if (until <= now) this.entries.delete(k);
      while (this.entries.size >= this.max) {
        let oldest: string | undefined;
        let oldestUntil = Infinity;
        for (const [k, until] of this.entries) {
          if (until < oldestUntil) {
            oldest = k;
            oldestUntil = until;
          }
        }
        if (oldest === undefined) break;
        this.entries.delete(oldest);
      }
    }
    this.entries.set(key, now + this.ttlMs * 1e6);
  }

  /** Entries held (expired ones included until pruned). */
  get size(): number {
    return this.entries.size;
  }
}

/** Where and how to reach the API server. */
export interface ApiServer {
  /** Base URL, e.g. `https://10.96.0.1:443`. */
  url: string;
  /** PEM CA bundle to verify the API server with (default: Node's CAs). */
  ca?: string | Buffer;
  /** The bearer token of this worker's ServiceAccount, read anew for every review. */
  token: () => string;
}

/** The service-account files of a pod. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/**
 * The in-cluster API server: `KUBERNETES_SERVICE_HOST`/`_PORT`, and the pod's service-account
 * CA and token (the projected token rotates; it is read again for every review). Throws when
 * not in a cluster.
 */
export function inClusterApiServer(dir: string = SERVICE_ACCOUNT_DIR): ApiServer {
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT ?? "443";
  if (host === undefined || host === "") {
    throw new Error("not in a cluster: KUBERNETES_SERVICE_HOST is not set");
  }
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return {
    url: `https://${hostPart}:${port}`,
    ca: readFileSync(`${dir}/ca.crt`),
    token: () => readFileSync(`${dir}/token`, "utf8").trim(),
  };
}

/** The pod's namespace from its service-account files. */
export function inClusterNamespace(dir: string = SERVICE_ACCOUNT_DIR): string {
  return readFileSync(`${dir}/namespace`, "utf8").trim();
}

/** Options of a `TokenReviewVerifier`. */
export interface TokenReviewOptions {
  /** The API server (default: in-cluster). */
  apiServer?: ApiServer;
  /** How long a positive review is cached (ms; 0 disables). Default 60 s. */
  cacheTtlMs?: number;
  /** How long a refused token is refused without a review (ms; 0 disables). Default 30 s. */
  negativeTtlMs?: number;
  /** Timeout of one review (ms). Default 10 s. */
  timeoutMs?: number;
  /** The clock of the caches (default: monotonic). */
  clock?: Clock;
  /** Unix seconds now, for `exp` (default: the system clock). */
  unixNow?: () => number;
}

/** Verifies tokens with a Kubernetes TokenReview, for one audience. */
export class TokenReviewVerifier implements TokenVerifier {
  private readonly apiServer: ApiServer;
  private readonly cacheTtlMs: number;
  private readonly timeoutMs: number;
  private readonly cache = new Map<string, [Identity, number]>();
  private readonly refused: NegativeCache;
  private readonly clock: Clock;
  private readonly unixNow: () => number;

  /** A verifier of the audience `backpressure.dev/<namespace>/<workload>`. */
  static forWorkload(
    namespace: string,
    workload: string,
    options: TokenReviewOptions = {},
  ): TokenReviewVerifier {
    return new TokenReviewVerifier(pushAudience(namespace, workload), options);
  }

  /** A verifier for an explicit audience. */
  constructor(
    readonly audience: string,
    options: TokenReviewOptions = {},
  ) {
    this.apiServer = options.apiServer ?? inClusterApiServer();
    this.cacheTtlMs = options.cacheTtlMs ?? DEFAULT_CACHE_TTL_MS;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.clock = options.clock ?? new MonotonicClock();
    this.refused = new NegativeCache(
      options.negativeTtlMs ?? DEFAULT_NEGATIVE_TTL_MS,
      NEGATIVE_CACHE_MAX,
      this.clock,
    );
    this.unixNow = options.unixNow ?? (() => Math.floor(Date.now() / 1000));
  }

  async verify(token: string): Promise<Identity> {
    // First, so that a cached token stops working at its `exp`, not up to a TTL later.
    const local = checkJwt(token, this.audience, this.unixNow());
    if (local !== null) throw VerifyError.unauthenticated(local);
    const key = tokenKey(token);
    const hit = this.cache.get(key);
    if (hit !== undefined && this.clock.now() < hit[1]) return { ...hit[0] };
    if (this.refused.contains(key)) {
      throw VerifyError.unauthenticated("token refused by the API server within the last seconds");
    }
    try {
      const id = await this.ask(token);
      this.remember(key, id);
      return id;
    } catch (e) {
      if (e instanceof VerifyError && e.kind === "unauthenticated") this.refused.insert(key);
      throw e;
    }
  }

  private remember(key: string, id: Identity): void {
    if (this.cacheTtlMs <= 0) return;
    const now = this.clock.now();
    if (this.cache.size >= CACHE_MAX) {
      for (const [k, [, until]] of this.cache) if (until <= now) this.cache.delete(k);
      if (this.cache.size >= CACHE_MAX) this.cache.clear();
    }
    this.cache.set(key, [{ ...id }, now + this.cacheTtlMs * 1e6]);
  }

  /** POSTs the TokenReview and reads its status. */
  private async ask(token: string): Promise<Identity> {
    const review = {
      apiVersion: "authentication.k8s.io/v1",
      kind: "TokenReview",
      spec: { token, audiences: [this.audience] },
    };
    let credential: string;
    try {
      credential = this.apiServer.token();
    } catch (e) {
      throw VerifyError.unavailable(`reading this worker's service-account token: ${e}`);
    }
    const { status, body } = await this.post(
      "/apis/authentication.k8s.io/v1/tokenreviews",
      JSON.stringify(review),
      credential,
    );
    if (status < 200 || status >= 300) {
      throw VerifyError.unavailable(`the API server answered ${status} to the TokenReview`);
    }
    let result: {
      status?: {
        authenticated?: boolean;
        error?: string;
        audiences?: string[];
        user?: { username?: string };
      };
    };
    try {
      result = JSON.parse(body) as typeof result;
    } catch {
      throw VerifyError.unavailable("the TokenReview answer is not JSON");
    }
    const s = result.status ?? {};
    if (s.authenticated !== true) {
      throw VerifyError.unauthenticated(
        typeof s.error === "string" && s.error !== "" ? s.error : "not authenticated",
      );
    }
    // The API server returns the audiences the token is valid for among those asked.
    if (!Array.isArray(s.audiences) || !s.audiences.includes(this.audience)) {
      throw VerifyError.unauthenticated(
        `token is not for audience ${JSON.stringify(this.audience)}`,
      );
    }
    const username = s.user?.username;
    if (typeof username !== "string" || username === "") {
      throw VerifyError.unauthenticated("review names no user");
    }
    return { username };
  }

  private post(
    path: string,
    body: string,
    credential: string,
  ): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      let url: URL;
      try {
        url = new URL(path, this.apiServer.url);
      } catch (e) {
        reject(VerifyError.unavailable(`bad API server URL: ${e}`));
        return;
      }
      const options: https.RequestOptions = {
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json",
          authorization: `Bearer ${credential}`,
          "content-length": Buffer.byteLength(body),
        },
        timeout: this.timeoutMs,
      };
      if (this.apiServer.ca !== undefined) options.ca = this.apiServer.ca;
      const req = https.request(url, options, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (c: Buffer) => {
          size += c.length;
          if (size > 1 << 20) {
            req.destroy(new Error("TokenReview answer larger than 1 MiB"));
            return;
          }
          chunks.push(c);
        });
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }),
        );
        res.on("error", (e) => reject(VerifyError.unavailable(e.message)));
      });
      req.on("timeout", () => req.destroy(new Error("TokenReview timed out")));
      req.on("error", (e) => reject(VerifyError.unavailable(e.message)));
      req.end(body);
    });
  }
}
