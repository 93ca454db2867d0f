/**
 * `@backpressure-dev/worker`: worker-side backpressure for queue workers managed by
 * backpressure-operator (a port of the Rust worker library, `crates/worker`).
 */

export * from "./wire.js";
export * from "./controller/index.js";
export * from "./config.js";
export { canonicalJson, type JsonValue, parseJson, type Plain } from "./json.js";
export * from "./metrics.js";
export * from "./permits.js";
export { type Logger, defaultLogger, silentLogger } from "./log.js";
export * from "./token.js";
export * from "./receiver.js";
export * from "./admin.js";
export * from "./conformance.js";
