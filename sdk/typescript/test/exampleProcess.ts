// Starting the example worker (build/examples/worker.js) as its own process, as the
// conformance harness does: environment only, no arguments.

import { type ChildProcess, spawn } from "node:child_process";
import http from "node:http";
import { fileURLToPath } from "node:url";

/** The compiled example (this file runs as build/test/exampleProcess.js). */
export const EXAMPLE = fileURLToPath(new URL("../examples/worker.js", import.meta.url));

export interface RunningExample {
  child: ChildProcess;
  /** `http://host:port` of its admin port. */
  url: string;
  /** Its stderr so far. */
  stderr(): string;
  /** Resolves with the exit code (null when killed by a signal) and signal. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Starts the example with `env` (and PATH only: nothing of the test's environment, no
 * in-cluster variables) and waits for its "admin server listening" line.
 */
export function startExample(
  env: Record<string, string>,
  timeoutMs = 10_000,
): Promise<RunningExample> {
  const child = spawn(process.execPath, [EXAMPLE], {
    env: { PATH: process.env.PATH ?? "", ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let err = "";
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the example did not listen within ${timeoutMs} ms:\n${err}`));
    }, timeoutMs);
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      err += chunk;
      for (const line of err.split("\n")) {
        let entry: { message?: string; addr?: string };
        try {
          entry = JSON.parse(line);
        } catch {
          continue;
        }
        if (entry.message === "admin server listening" && entry.addr !== undefined) {
          clearTimeout(timer);
          resolve({ child, url: `http://${entry.addr}`, stderr: () => err, exited });
          return;
        }
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`the example exited (${code ?? signal}) before listening:\n${err}`));
    });
  });
}

/** Sends `signal` and waits for the exit (at most `timeoutMs`, then SIGKILL and a throw). */
export async function stopExample(
  r: RunningExample,
  signal: NodeJS.Signals = "SIGTERM",
  timeoutMs = 10_000,
): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  r.child.kill(signal);
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      r.child.kill("SIGKILL");
      reject(
        new Error(`the example did not exit within ${timeoutMs} ms of ${signal}:\n${r.stderr()}`),
      );
    }, timeoutMs);
  });
  try {
    return await Promise.race([r.exited, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** One HTTP request; resolves with the status and the body. */
export function httpRequest(
  method: string,
  url: string,
  body?: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, headers, agent: false, timeout: 10_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }),
      );
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end(body);
  });
}
