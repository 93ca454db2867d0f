// Token checks (crates/worker/src/config/token/tests.rs): the local JWT check, the negative
// cache, and the TokenReview verifier's paths that need no API server.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  type Clock,
  MAX_TOKEN_BYTES,
  NegativeCache,
  TokenReviewVerifier,
  VerifyError,
  checkJwt,
  fromSecs,
  pushAudience,
  serviceAccountUsername,
  tokenKey,
} from "../src/index.js";

const AUD = "backpressure.dev/shop/export";
const NOW = 1_700_000_000;

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");

/** A JWT-shaped token with `claims` (unsigned: the signature part is filler). */
function jwt(claims: unknown): string {
  return `${b64({ alg: "RS256", kid: "k" })}.${b64(claims)}.c2lnbmF0dXJl`;
}

test("the local check accepts our audience and refuses everything else with a reason", () => {
  assert.equal(checkJwt(jwt({ aud: [AUD], exp: NOW + 600 }), AUD, NOW), null);
  assert.equal(checkJwt(jwt({ aud: AUD, exp: NOW + 1 }), AUD, NOW), null);
  assert.equal(checkJwt(jwt({ aud: ["x", AUD], exp: NOW + 600.5 }), AUD, NOW), null);
  const payload = b64({ aud: [AUD], exp: NOW + 600 });
  const cases: [string, string][] = [
    ["not-a-jwt", "three"],
    [`a.${payload}`, "three"],
    [`a.${payload}.s.d`, "three"],
    [`${payload}.${payload}.`, "empty signature"],
    [`!!!.${payload}.s`, "header is not base64url"],
    [`${b64({ a: 1 }).slice(0, -1)}Z.${payload}.s`, "header is not base64url"],
    [`${b64([1])}.${payload}.s`, "header is not a JSON object"],
    [`${payload}.bm90IGpzb24.s`, "payload is not JSON"],
    [jwt({ aud: [AUD] }), "no exp"],
    [jwt({ aud: [AUD], exp: "soon" }), "no exp"],
    [jwt({ aud: [AUD], exp: NOW }), "expired"],
    [jwt({ aud: [AUD], exp: NOW - 3600 }), "expired"],
    [jwt({ exp: NOW + 600 }), "audience"],
    [jwt({ aud: ["backpressure.dev"], exp: NOW + 600 }), "audience"],
    [jwt({ aud: ["backpressure.dev/other/export"], exp: NOW + 600 }), "audience"],
    [jwt({ aud: ["backpressure.dev/shop/export-2"], exp: NOW + 600 }), "audience"],
    [jwt({ aud: [7], exp: NOW + 600 }), "audience"],
    ["a".repeat(MAX_TOKEN_BYTES + 1), "longer"],
  ];
  for (const [token, why] of cases) {
    const err = checkJwt(token, AUD, NOW);
    assert.ok(err !== null && err.includes(why), `${err} should say ${why}`);
    assert.ok(!err.includes(token), "the error repeats the token");
  }
});

test("audiences, usernames and cache keys", () => {
  assert.equal(pushAudience("shop", "export"), AUD);
  assert.equal(serviceAccountUsername("bp-system", "op"), "system:serviceaccount:bp-system:op");
  assert.match(tokenKey("t"), /^[0-9a-f]{64}$/);
  assert.notEqual(tokenKey("t"), tokenKey("u"));
});

class SteppedClock implements Clock {
  t = fromSecs(1);
  now(): number {
    return this.t;
  }
}

test("the negative cache forgets after its TTL and stays bounded", () => {
  const clock = new SteppedClock();
  const cache = new NegativeCache(30_000, 3, clock);
  cache.insert("a");
  assert.ok(cache.contains("a"));
  clock.t += fromSecs(29);
  assert.ok(cache.contains("a"));
  clock.t += fromSecs(1);
  assert.ok(!cache.contains("a"));
  for (const k of ["b", "c", "d", "e"]) {
    cache.insert(k);
    clock.t += fromSecs(1);
  }
  assert.ok(cache.size <= 3, `${cache.size}`);
  assert.ok(!cache.contains("b"), "the oldest went first");
  assert.ok(cache.contains("e"));
  const off = new NegativeCache(0, 3, clock);
  off.insert("a");
  assert.ok(!off.contains("a"));
});

test("the verifier refuses locally before asking, and a dead API server is 503", async () => {
  // Port 1 on the loopback: nothing listens, the connection is refused for real.
  const verifier = TokenReviewVerifier.forWorkload("shop", "export", {
    apiServer: { url: "https://127.0.0.1:1", token: () => "worker-token" },
    unixNow: () => NOW,
    timeoutMs: 2000,
  });
  assert.equal(verifier.audience, AUD);
  const refused = async (token: string) => {
    try {
      await verifier.verify(token);
    } catch (e) {
      assert.ok(e instanceof VerifyError);
      return e;
    }
    assert.fail("verified");
  };
  const local = await refused(jwt({ aud: ["backpressure.dev/other/export"], exp: NOW + 60 }));
  assert.equal(local.kind, "unauthenticated");
  const down = await refused(jwt({ aud: [AUD], exp: NOW + 60 }));
  assert.equal(down.kind, "unavailable", down.message);
  // An unavailable review is not remembered as a refusal.
  assert.equal((await refused(jwt({ aud: [AUD], exp: NOW + 60 }))).kind, "unavailable");
  // Without an API server configured and outside a cluster, construction says so.
  const saved = process.env.KUBERNETES_SERVICE_HOST;
  delete process.env.KUBERNETES_SERVICE_HOST;
  try {
    assert.throws(() => new TokenReviewVerifier(AUD), /not in a cluster/);
  } finally {
    if (saved !== undefined) process.env.KUBERNETES_SERVICE_HOST = saved;
  }
});
