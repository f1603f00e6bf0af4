import { LeasepoolError } from "./errors.js";

/** Where a client or worker reaches `leasepool serve`, and how. */
export interface ConnectionOptions {
  /**
   * The server's base URL (`http://127.0.0.1:8080`), or several serves over
   * one store: a call that cannot connect moves on to the next one.
   * A comma-separated string is read as a list.
   */
  url: string | string[];
  /** The bearer token (full, read-only or worker token). */
  token?: string;
  /** How long one call may take, in milliseconds (default 30000). */
  timeoutMs?: number;
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  signal?: AbortSignal;
  /** Overrides the transport's timeout; 0 for none. */
  timeoutMs?: number;
  /**
   * Try the next URL when a connection cannot be made: always safe for a
   * request that was never sent; for an idempotent one, on any transport
   * error.
   */
  failover?: "connect" | "any" | "none";
  headers?: Record<string, string>;
}

/** Connection errors that prove the request never reached a server. */
const notSentCodes = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL"]);

export function parseUrls(url: string | string[] | undefined): string[] {
  const list = (Array.isArray(url) ? url : String(url ?? "").split(","))
    .map((u) => u.trim())
    .filter((u) => u !== "");
  if (list.length === 0) throw new TypeError("url: give the server's base URL, as http://127.0.0.1:8080");
  return list.map((u) => {
    let parsed: URL;
    try {
      parsed = new URL(u);
    } catch {
      throw new TypeError(`url: ${JSON.stringify(u)} is not a URL`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`url: ${JSON.stringify(u)} must be http or https`);
    }
    return parsed.href.replace(/\/+$/, "");
  });
}

/** Transport makes the HTTP calls of a Client or Worker. */
export class Transport {
  readonly urls: string[];
  private index = 0;
  private readonly token?: string;
  private readonly timeoutMs: number;

  constructor(opts: ConnectionOptions) {
    this.urls = parseUrls(opts.url);
    if (opts.token !== undefined && typeof opts.token !== "string") throw new TypeError("token: must be a string");
    this.token = opts.token || undefined;
    const t = opts.timeoutMs ?? 30000;
    if (!Number.isFinite(t) || t < 0) throw new TypeError("timeoutMs: must be a non-negative number");
    this.timeoutMs = t;
  }

  /** The URL calls go to now. */
  get url(): string {
    return this.urls[this.index];
  }

  /** Moves on to the next URL (after a connection error). */
  rotate(): void {
    this.index = (this.index + 1) % this.urls.length;
  }

  /** Makes one call and answers its decoded JSON body; errors are LeasepoolErrors. */
  async json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<{ status: number; body: T }> {
    const res = await this.send(method, path, opts);
    const text = await res.text();
    let body: unknown = undefined;
    if (text !== "") {
      try {
        body = JSON.parse(text);
      } catch {
        if (res.ok) throw new LeasepoolError(res.status, `${method} ${path}: the answer is not JSON: ${text.slice(0, 200)}`, "bad_answer");
      }
    }
    if (!res.ok) throw errorOf(res.status, body, text, method, path);
    return { status: res.status, body: body as T };
  }

  /**
   * Sends one call and answers the response, unread, when its status is a
   * success; an error status becomes a LeasepoolError.
   */
  async stream(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const res = await this.send(method, path, opts);
    if (!res.ok) {
      const text = await res.text().catch(() => "");
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch {
        body = undefined;
      }
      throw errorOf(res.status, body, text, method, path);
    }
    return res;
  }

  private async send(method: string, path: string, opts: RequestOptions): Promise<Response> {
    const failover = opts.failover ?? "none";
    let tries = failover === "none" ? 1 : this.urls.length;
    for (;;) {
      const base = this.url;
      try {
        return await this.sendOnce(base, method, path, opts);
      } catch (err) {
        if (!(err instanceof LeasepoolError) || err.status !== 0) throw err;
        // Move on for the next call too, whoever makes it.
        if (this.url === base) this.rotate();
        tries--;
        const notSent = notSentCodes.has(causeCode(err));
        if (tries <= 0 || (failover === "connect" && !notSent)) throw err;
      }
    }
  }

  private async sendOnce(base: string, method: string, path: string, opts: RequestOptions): Promise<Response> {
    const url = new URL(base + path);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v !== undefined && v !== "") url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { Accept: "application/json", ...opts.headers };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let body: string | undefined;
    if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers["Content-Type"] = "application/json";
    }
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const signals: AbortSignal[] = [];
    const timeout = timeoutMs > 0 ? AbortSignal.timeout(timeoutMs) : undefined;
    if (timeout) signals.push(timeout);
    if (opts.signal) signals.push(opts.signal);
    const signal = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : AbortSignal.any(signals);
    try {
      return await fetch(url, { method, headers, body, signal });
    } catch (err) {
      if (opts.signal?.aborted) throw opts.signal.reason ?? err;
      if (timeout?.aborted) {
        throw new LeasepoolError(0, `${method} ${url.pathname} on ${base}: no answer within ${timeoutMs} ms`, "timeout", undefined, { cause: err });
      }
      const cause = (err as { cause?: unknown }).cause;
      const detail = cause instanceof Error ? cause.message : err instanceof Error ? err.message : String(err);
      throw new LeasepoolError(0, `${method} ${url.pathname}: cannot reach ${base}: ${detail}`, "unreachable", undefined, { cause: err });
    }
  }
}

function causeCode(err: LeasepoolError): string {
  let c: unknown = err.cause;
  for (let i = 0; i < 4 && c; i++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string") return code;
    c = (c as { cause?: unknown }).cause;
  }
  return "";
}

function errorOf(status: number, body: unknown, text: string, method: string, path: string): LeasepoolError {
  const b = body && typeof body === "object" ? (body as { error?: unknown; code?: unknown }) : {};
  const message = typeof b.error === "string" ? b.error : text.trim().slice(0, 200) || `${method} ${path}: HTTP ${status}`;
  const code = typeof b.code === "string" ? b.code : undefined;
  return new LeasepoolError(status, message, code, body);
}
