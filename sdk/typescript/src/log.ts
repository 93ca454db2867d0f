/** Where the SDK reports what happens. */
export interface Logger {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
}

/** The default logger: warnings to the console (as JSON fields), nothing else. */
export const defaultLogger: Logger = {
  debug() {},
  info() {},
  warn(message, fields) {
    console.warn(
      `backpressure: ${message}${fields === undefined ? "" : ` ${JSON.stringify(fields)}`}`,
    );
  },
};

/** A logger that drops everything (tests). */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {} };
