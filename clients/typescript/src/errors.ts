/**
 * LeasepoolError is every failure of a call: an HTTP error answer (status
 * and the server's one-line message), or a server that could not be
 * reached (status 0, code "unreachable").
 */
export class LeasepoolError extends Error {
  /** The HTTP status, or 0 when no answer came. */
  readonly status: number;
  /**
   * The server's `code` when it gave one (`not_registered`, `lease_lost`,
   * `cancelled`, `task_done`, `unpinned`, `worker_id_taken`,
   * `history_lost`), else one derived from the status: `invalid` (400),
   * `unauthorized` (401), `forbidden` (403), `not_found` (404),
   * `method_not_allowed` (405), `conflict` (409), `too_large` (413),
   * `misdirected` (421), `server_error` (5xx), `http_NNN` otherwise, and
   * `unreachable` when no answer came.
   */
  readonly code: string;
  /** The decoded error body, when there was one. */
  readonly body?: unknown;

  constructor(status: number, message: string, code?: string, body?: unknown, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "LeasepoolError";
    this.status = status;
    this.code = code ?? codeOfStatus(status);
    if (body !== undefined) this.body = body;
  }
}

function codeOfStatus(status: number): string {
  switch (status) {
    case 0:
      return "unreachable";
    case 400:
      return "invalid";
    case 401:
      return "unauthorized";
    case 403:
      return "forbidden";
    case 404:
      return "not_found";
    case 405:
      return "method_not_allowed";
    case 409:
      return "conflict";
    case 413:
      return "too_large";
    case 421:
      return "misdirected";
  }
  return status >= 500 ? "server_error" : `http_${status}`;
}

/**
 * Thrown by a handler, SnoozeError gives its task back to run again `ms`
 * milliseconds later; it does not count as a failure.
 */
export class SnoozeError extends Error {
  readonly ms: number;
  constructor(ms: number, message?: string) {
    super(message ?? `snoozed for ${ms} ms`);
    this.name = "SnoozeError";
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`SnoozeError: ms must be a non-negative number, got ${ms}`);
    this.ms = Math.round(ms);
  }
}

/**
 * Thrown by a handler, RetryableError runs the handler again in the same
 * attempt (with backoff, up to the worker's `localRetries`) before the
 * attempt fails with its message.
 */
export class RetryableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "RetryableError";
  }
}
