import * as http from "node:http";
import * as https from "node:https";
import { LeasepoolError } from "./errors.js";

/**
 * An answer whose status is known and whose body is still to read: text()
 * for a JSON answer, or chunks() for a stream.
 */
export interface HttpAnswer {
  status: number;
  ok: boolean;
  text(): Promise<string>;
  chunks(): AsyncIterable<Uint8Array>;
  /** Drops the rest of the body and the connection under it. */
  cancel(): void;
}

// Keep-alive connections shared by every client and worker of the process:
// node:http costs a third of fetch's time per call, which a worker that
// finishes each job with a call feels. Free sockets are closed well before
// serve's idle timeout (120 s), so that a call never meets one the server is
// closing.
const httpAgent = new http.Agent({ keepAlive: true, timeout: 30000 });
const httpsAgent = new https.Agent({ keepAlive: true, timeout: 30000 });

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
    opts = { ...opts };
    const res = await this.send(method, path, opts);
    let text: string;
    try {
      text = await res.text();
    } catch (err) {
      throw this.failure(err, this.url, method, path, opts);
    }
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
  async stream(method: string, path: string, opts: RequestOptions = {}): Promise<HttpAnswer> {
    opts = { ...opts };
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

  private async send(method: string, path: string, opts: RequestOptions): Promise<HttpAnswer> {
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

  private sendOnce(base: string, method: string, path: string, opts: RequestOptions): Promise<HttpAnswer> {
    const url = new URL(base + path);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v !== undefined && v !== "") url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string | number> = { Accept: "application/json", ...opts.headers };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let body: string | undefined;
    if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers["Content-Type"] = "application/json";
      headers["Content-Length"] = new TextEncoder().encode(body).length;
    }
    const signal = this.signalFor(opts);
    return new Promise<HttpAnswer>((resolve, reject) => {
      const onAnswer = (res: http.IncomingMessage) => {
        const status = res.statusCode ?? 0;
        resolve({
          status,
          ok: status >= 200 && status < 300,
          text: async () => {
            const decoder = new TextDecoder();
            let out = "";
            for await (const chunk of res) out += decoder.decode(chunk, { stream: true });
            return out + decoder.decode();
          },
          chunks: () => res,
          cancel: () => res.destroy(),
        });
      };
      let req: http.ClientRequest;
      try {
        req =
          url.protocol === "https:"
            ? https.request(url, { method, headers, agent: httpsAgent, signal }, onAnswer)
            : http.request(url, { method, headers, agent: httpAgent, signal }, onAnswer);
      } catch (err) {
        reject(this.failure(err, base, method, url.pathname, opts));
        return;
      }
      req.on("error", (err) => reject(this.failure(err, base, method, url.pathname, opts)));
      req.end(body);
    });
  }

  /** The caller's signal and the call's timeout as one signal; the timeout's kept for failure(). */
  private signalFor(opts: RequestOptions & { timeoutSignal?: AbortSignal }): AbortSignal | undefined {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const signals: AbortSignal[] = [];
    if (timeoutMs > 0) {
      opts.timeoutSignal = AbortSignal.timeout(timeoutMs);
      signals.push(opts.timeoutSignal);
    }
    if (opts.signal) signals.push(opts.signal);
    return signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : AbortSignal.any(signals);
  }

  /** A transport error as the caller should see it: the caller's abort as it is, else a LeasepoolError with status 0. */
  private failure(err: unknown, base: string, method: string, path: string, opts: RequestOptions & { timeoutSignal?: AbortSignal }): unknown {
    if (err instanceof LeasepoolError) return err;
    if (opts.signal?.aborted) return opts.signal.reason ?? err;
    if (opts.timeoutSignal?.aborted) {
      const ms = opts.timeoutMs ?? this.timeoutMs;
      return new LeasepoolError(0, `${method} ${path} on ${base}: no answer within ${ms} ms`, "timeout", undefined, { cause: err });
    }
    const detail = err instanceof Error ? err.message : String(err);
    return new LeasepoolError(0, `${method} ${path}: cannot reach ${base}: ${detail}`, "unreachable", undefined, { cause: err });
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
