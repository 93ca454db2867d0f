/**
 * A strict JSON reader that keeps what `JSON.parse` throws away, so that a payload is accepted
 * or refused exactly as the Rust worker's `serde_json` does: integers stay exact (`bigint`) and
 * keep their kind (an unsigned or a negative integer, or a float: `1.0` and `1e3` are floats,
 * `-0` is a float, an integer beyond 64 bits is a float), members keep their order and their
 * duplicates, and a number that overflows a double is an error. RFC 8785 (JCS) canonical JSON
 * of plain values is here too.
 */

/** A JSON number as `serde_json` classifies it. */
export type JsonNumber =
  | { readonly kind: "u64"; readonly value: bigint }
  | { readonly kind: "i64"; readonly value: bigint }
  | { readonly kind: "f64"; readonly value: number };

/** A parsed JSON value. Objects keep their members in order, duplicates included. */
export type JsonValue =
  | { readonly type: "null" }
  | { readonly type: "bool"; readonly value: boolean }
  | { readonly type: "number"; readonly value: JsonNumber }
  | { readonly type: "string"; readonly value: string }
  | { readonly type: "array"; readonly value: readonly JsonValue[] }
  | { readonly type: "object"; readonly value: readonly (readonly [string, JsonValue])[] };

/** Not JSON. */
export class JsonSyntaxError extends Error {
  override readonly name = "JsonSyntaxError";
}

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
/** Nesting deeper than this is refused (`serde_json`'s recursion limit). */
export const MAX_DEPTH = 128;

/** Parses UTF-8 bytes (invalid UTF-8 and a byte-order mark are errors, as in `serde_json`). */
export function parseJsonBytes(bytes: Uint8Array): JsonValue {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    throw new JsonSyntaxError("invalid UTF-8");
  }
  return parseJson(text);
}

/** Parses a JSON text. */
export function parseJson(text: string): JsonValue {
  const p = new Parser(text);
  p.skipWs();
  const v = p.value(0);
  p.skipWs();
  if (p.pos < text.length) p.fail("trailing characters");
  return v;
}

class Parser {
  pos = 0;
  constructor(private readonly s: string) {}

  fail(msg: string): never {
    throw new JsonSyntaxError(`${msg} at character ${this.pos + 1}`);
  }

  skipWs(): void {
    const s = this.s;
    while (this.pos < s.length) {
      const c = s.charCodeAt(this.pos);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) this.pos++;
      else break;
    }
  }

  value(depth: number): JsonValue {
    const c = this.s[this.pos];
    switch (c) {
      case undefined:
        return this.fail("EOF while parsing a value");
      case "{":
        return this.object(depth + 1);
      case "[":
        return this.array(depth + 1);
      case '"':
        return { type: "string", value: this.string() };
      case "t":
        return this.literal("true", { type: "bool", value: true });
      case "f":
        return this.literal("false", { type: "bool", value: false });
      case "n":
        return this.literal("null", { type: "null" });
      default:
        if (c === "-" || (c >= "0" && c <= "9")) return { type: "number", value: this.number() };
        return this.fail("expected value");
    }
  }

  literal(word: string, v: JsonValue): JsonValue {
    if (this.s.startsWith(word, this.pos)) {
      this.pos += word.length;
      return v;
    }
    return this.fail("expected value");
  }

  object(depth: number): JsonValue {
    if (depth > MAX_DEPTH) this.fail("recursion limit exceeded");
    this.pos++; // {
    const members: [string, JsonValue][] = [];
    this.skipWs();
    if (this.s[this.pos] === "}") {
      this.pos++;
      return { type: "object", value: members };
    }
    for (;;) {
      this.skipWs();
      if (this.s[this.pos] !== '"') this.fail("key must be a string");
      const key = this.string();
      this.skipWs();
      if (this.s[this.pos] !== ":") this.fail("expected `:`");
      this.pos++;
      this.skipWs();
      members.push([key, this.value(depth)]);
      this.skipWs();
      const c = this.s[this.pos];
      if (c === ",") {
        this.pos++;
        continue;
      }
      if (c === "}") {
        this.pos++;
        return { type: "object", value: members };
      }
      this.fail("expected `,` or `}`");
    }
  }

  array(depth: number): JsonValue {
    if (depth > MAX_DEPTH) this.fail("recursion limit exceeded");
    this.pos++; // [
    const items: JsonValue[] = [];
    this.skipWs();
    if (this.s[this.pos] === "]") {
      this.pos++;
      return { type: "array", value: items };
    }
    for (;;) {
      this.skipWs();
      items.push(this.value(depth));
      this.skipWs();
      const c = this.s[this.pos];
      if (c === ",") {
        this.pos++;
        continue;
      }
      if (c === "]") {
        this.pos++;
        return { type: "array", value: items };
      }
      this.fail("expected `,` or `]`");
    }
  }

  string(): string {
    const s = this.s;
    this.pos++; // opening quote
    let out = "";
    let start = this.pos;
    for (;;) {
      if (this.pos >= s.length) this.fail("EOF while parsing a string");
      const c = s.charCodeAt(this.pos);
      if (c === 0x22) {
        out += s.slice(start, this.pos);
        this.pos++;
        return out;
      }
      if (c < 0x20) this.fail("control character (\\u0000-\\u001F) found while parsing a string");
      if (c === 0x5c) {
        out += s.slice(start, this.pos);
        this.pos++;
        out += this.escape();
        start = this.pos;
        continue;
      }
      this.pos++;
    }
  }

  hex4(): number {
    const h = this.s.slice(this.pos, this.pos + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) this.fail("invalid escape");
    this.pos += 4;
    return parseInt(h, 16);
  }

  escape(): string {
    const c = this.s[this.pos];
    this.pos++;
    switch (c) {
      case '"':
        return '"';
      case "\\":
        return "\\";
      case "/":
        return "/";
      case "b":
        return "\b";
      case "f":
        return "\f";
      case "n":
        return "\n";
      case "r":
        return "\r";
      case "t":
        return "\t";
      case "u": {
        const u = this.hex4();
        if (u >= 0xdc00 && u <= 0xdfff) this.fail("lone trailing surrogate in hex escape");
        if (u >= 0xd800 && u <= 0xdbff) {
          if (this.s[this.pos] !== "\\" || this.s[this.pos + 1] !== "u") {
            this.fail("lone leading surrogate in hex escape");
          }
          this.pos += 2;
          const lo = this.hex4();
          if (lo < 0xdc00 || lo > 0xdfff) this.fail("lone leading surrogate in hex escape");
          return String.fromCharCode(u, lo);
        }
        return String.fromCharCode(u);
      }
      default:
        return this.fail("invalid escape");
    }
  }

  number(): JsonNumber {
    const s = this.s;
    const start = this.pos;
    const digit = (i: number) => {
      const ch = s.charCodeAt(i);
      return ch >= 0x30 && ch <= 0x39;
    };
    if (s[this.pos] === "-") this.pos++;
    if (s[this.pos] === "0") {
      this.pos++;
      if (digit(this.pos)) this.fail("invalid number");
    } else if (digit(this.pos)) {
      while (digit(this.pos)) this.pos++;
    } else {
      this.fail("invalid number");
    }
    let float = false;
    if (s[this.pos] === ".") {
      float = true;
      this.pos++;
      if (!digit(this.pos)) this.fail("invalid number");
      while (digit(this.pos)) this.pos++;
    }
    if (s[this.pos] === "e" || s[this.pos] === "E") {
      float = true;
      this.pos++;
      if (s[this.pos] === "+" || s[this.pos] === "-") this.pos++;
      if (!digit(this.pos)) this.fail("invalid number");
      while (digit(this.pos)) this.pos++;
    }
    const text = s.slice(start, this.pos);
    if (!float) {
      const big = BigInt(text);
      if (big > 0n || (big === 0n && text[0] !== "-")) {
        if (big <= U64_MAX) return { kind: "u64", value: big };
      } else if (big < 0n && big >= I64_MIN) {
        return { kind: "i64", value: big };
      }
      // -0, or beyond 64 bits: a float, as serde_json reads it.
    }
    const value = Number(text);
    if (!Number.isFinite(value)) this.fail("number out of range");
    return { kind: "f64", value };
  }
}

/** The name of a value's JSON type, for error messages. */
export function typeName(v: JsonValue): string {
  switch (v.type) {
    case "null":
      return "null";
    case "bool":
      return `boolean \`${v.value}\``;
    case "number": {
      const n = v.value;
      if (n.kind === "f64") return `floating point \`${numberText(n.value)}\``;
      return `integer \`${n.value}\``;
    }
    case "string":
      return `string ${JSON.stringify(v.value)}`;
    case "array":
      return "sequence";
    case "object":
      return "map";
  }
}

function numberText(x: number): string {
  return Number.isInteger(x) && Math.abs(x) < 1e16 ? x.toFixed(1) : String(x);
}

/** A plain JSON value for canonicalization. */
export type Plain = null | boolean | number | string | readonly Plain[] | { [key: string]: Plain };

/** NaN or an infinity: no canonical form. */
export class JcsError extends Error {
  override readonly name = "JcsError";
}

/**
 * RFC 8785 (JCS) canonical JSON: members sorted by their names as UTF-16 code units, no
 * whitespace, strings with JSON's minimal escapes, numbers as ECMAScript writes doubles.
 */
export function canonicalJson(v: Plain): string {
  if (v === null) return "null";
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new JcsError(`${v} is not a JSON number`);
    // ECMAScript's Number::toString is JCS's number format (and writes -0 as 0).
    return String(v);
  }
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map((x: Plain) => canonicalJson(x)).join(",")}]`;
  const obj = v as { [key: string]: Plain };
  // The default sort compares UTF-16 code units, as JCS requires.
  const keys = Object.keys(obj).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k] as Plain)}`).join(",")}}`;
}

/** A parsed value as a plain value (integers as the nearest double, as JCS reads them). */
export function toPlain(v: JsonValue): Plain {
  switch (v.type) {
    case "null":
      return null;
    case "bool":
    case "string":
      return v.value;
    case "number":
      return v.value.kind === "f64" ? v.value.value : Number(v.value.value);
    case "array":
      return v.value.map(toPlain);
    case "object": {
      const out: { [key: string]: Plain } = {};
      for (const [k, x] of v.value) {
        // defineProperty: a member named `__proto__` is data, not the prototype.
        Object.defineProperty(out, k, {
          value: toPlain(x),
          enumerable: true,
          writable: true,
          configurable: true,
        });
      }
      return out;
    }
  }
}
