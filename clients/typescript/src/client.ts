import { LeasepoolError } from "./errors.js";
import { publishBody, time } from "./publish.js";
import { SseParser } from "./sse.js";
import { Transport, type ConnectionOptions } from "./transport.js";
import type {
  BatchItemResult,
  EventsOptions,
  LeasepoolEvent,
  ListFilter,
  ListOptions,
  PublishManyResult,
  PublishResult,
  PublishTask,
  Task,
  TaskPage,
  WorkerRecord,
} from "./types.js";

export type ClientOptions = ConnectionOptions;

/** The most tasks one batch request may hold. */
export const MAX_BATCH_TASKS = 10000;
/** The largest batch body the server reads, in bytes. */
export const MAX_BATCH_BYTES = 32 << 20;

export interface PublishOptions {
  /** Refuse a task whose kind no live worker runs (400 naming kind). */
  strict?: boolean;
  signal?: AbortSignal;
  /**
   * The W3C trace context (`traceparent`, and `tracestate`) the task's
   * attempts continue: the caller's span. Sent as the headers of that name.
   */
  traceparent?: string;
  tracestate?: string;
}

/** The trace context headers of a publish, if any. */
function traceHeaders(opts: PublishOptions): Record<string, string> | undefined {
  const h: Record<string, string> = {};
  if (opts.traceparent) h.traceparent = opts.traceparent;
  if (opts.tracestate) h.tracestate = opts.tracestate;
  return Object.keys(h).length > 0 ? h : undefined;
}

export interface PublishManyOptions extends PublishOptions {
  /** Items per request, at most 10,000 (the server's bound). */
  chunkSize?: number;
}

/** Client calls the tasks API of `leasepool serve`. */
export class Client {
  private readonly transport: Transport;

  constructor(opts: ClientOptions) {
    if (!opts || typeof opts !== "object") throw new TypeError("Client: give {url, token?}");
    this.transport = new Transport(opts);
  }

  /** The base URL calls go to now. */
  get url(): string {
    return this.transport.url;
  }

  /** Publishes one task, idempotently by key. */
  async publish(task: PublishTask, opts: PublishOptions = {}): Promise<PublishResult> {
    const body = publishBody(task);
    const { body: res } = await this.transport.json<PublishResult>("POST", "/api/v1/tasks", {
      body,
      headers: traceHeaders(opts),
      query: { strict: opts.strict ? "true" : undefined },
      signal: opts.signal,
      failover: "connect",
    });
    return res;
  }

  /**
   * Publishes many tasks with the batch endpoint, in requests of at most
   * 10,000 tasks and 32 MiB, and answers every item's outcome in the order
   * given. A refused item never stops the others; its error names the
   * field as `tasks[i].field`, i its index in `tasks`.
   */
  async publishMany(tasks: PublishTask[], opts: PublishManyOptions = {}): Promise<PublishManyResult> {
    if (!Array.isArray(tasks)) throw new TypeError("tasks: must be a list");
    const chunkSize = opts.chunkSize ?? MAX_BATCH_TASKS;
    if (!Number.isSafeInteger(chunkSize) || chunkSize < 1 || chunkSize > MAX_BATCH_TASKS) {
      throw new TypeError(`chunkSize: must be 1–${MAX_BATCH_TASKS}`);
    }
    const bodies = tasks.map((t, i) => publishBody(t, `tasks[${i}]`));
    const out: PublishManyResult = { results: [], inserted: 0, existing: 0, rerun: 0, debounced: 0, refused: 0, failed: 0 };
    const warnings = new Set<string>();
    const enc = new TextEncoder();
    // Room for {"tasks":[…]} and the commas.
    const budget = MAX_BATCH_BYTES - 1024;
    let start = 0;
    while (start < bodies.length) {
      let end = start;
      let bytes = 0;
      while (end < bodies.length && end - start < chunkSize) {
        const n = enc.encode(JSON.stringify(bodies[end])).length + 1;
        if (end > start && bytes + n > budget) break;
        bytes += n;
        end++;
      }
      const { body: res } = await this.transport.json<PublishManyResult>("POST", "/api/v1/tasks/batch", {
        body: { tasks: bodies.slice(start, end) },
        headers: traceHeaders(opts),
        query: { strict: opts.strict ? "true" : undefined },
        signal: opts.signal,
        failover: "connect",
        timeoutMs: 0,
      });
      const offset = start;
      for (const r of res.results) out.results.push(reindex(r, offset));
      out.inserted += res.inserted;
      out.existing += res.existing;
      out.rerun += res.rerun;
      out.debounced += res.debounced ?? 0;
      out.refused += res.refused;
      out.failed += res.failed;
      for (const w of res.warnings ?? []) warnings.add(reindexText(w, offset));
      start = end;
    }
    if (warnings.size > 0) out.warnings = [...warnings];
    return out;
  }

  /** The task document of key (a LeasepoolError with status 404 if none). */
  async get(key: string, opts: { signal?: AbortSignal } = {}): Promise<Task> {
    const { body } = await this.transport.json<Task>("GET", `/api/v1/tasks/${segment(key)}`, { signal: opts.signal, failover: "any" });
    return body;
  }

  /** One page of tasks, newest first unless order is "asc". */
  async list(opts: ListOptions = {}): Promise<TaskPage> {
    const { body } = await this.transport.json<{ tasks: Task[] | null; next_cursor?: string; prev_cursor?: string }>("GET", "/api/v1/tasks", {
      query: { ...listQuery(opts), cursor: opts.cursor },
      signal: opts.signal,
      failover: "any",
    });
    const page: TaskPage = { tasks: body.tasks ?? [] };
    if (body.next_cursor) page.nextCursor = body.next_cursor;
    if (body.prev_cursor) page.prevCursor = body.prev_cursor;
    return page;
  }

  /** Every page of tasks that match, following nextCursor. */
  async *pages(opts: ListOptions = {}): AsyncGenerator<TaskPage, void, undefined> {
    let cursor = opts.cursor;
    for (;;) {
      const page = await this.list({ ...opts, cursor });
      yield page;
      if (!page.nextCursor) return;
      cursor = page.nextCursor;
    }
  }

  /**
   * Every task that matches, page after page; each task that existed when
   * the walk began is seen exactly once.
   */
  async *listAll(opts: ListOptions = {}): AsyncGenerator<Task, void, undefined> {
    for await (const page of this.pages(opts)) yield* page.tasks;
  }

  /** Cancels a task; its running handlers are aborted. Answers the task. */
  async cancel(key: string, opts: { signal?: AbortSignal } = {}): Promise<Task> {
    const { body } = await this.transport.json<Task>("POST", `/api/v1/tasks/${segment(key)}/cancel`, { signal: opts.signal, failover: "connect" });
    return body;
  }

  /** Runs a finished task again. Answers the task. */
  async retry(key: string, opts: { signal?: AbortSignal } = {}): Promise<Task> {
    const { body } = await this.transport.json<Task>("POST", `/api/v1/tasks/${segment(key)}/retry`, { signal: opts.signal, failover: "connect" });
    return body;
  }

  /** The worker registry, each record with whether it is live. */
  async workers(opts: { signal?: AbortSignal } = {}): Promise<WorkerRecord[]> {
    const { body } = await this.transport.json<WorkerRecord[] | null>("GET", "/api/v1/workers", { signal: opts.signal, failover: "any" });
    return body ?? [];
  }

  /** Tasks per state and kind, and the worker counts. */
  async stats(opts: { signal?: AbortSignal } = {}): Promise<Record<string, unknown>> {
    const { body } = await this.transport.json<Record<string, unknown>>("GET", "/api/v1/stats", { signal: opts.signal, failover: "any" });
    return body;
  }

  /**
   * Follows the event stream: every event once, in order. A dropped
   * connection (or a serve that dies, with several URLs: the next one) is
   * resumed from the last event's token, so nothing is lost or repeated.
   * Ends when opts.signal aborts or the loop breaks; throws a
   * LeasepoolError for an error answer (a bad filter, 401) or when the
   * server lost the history (code `history_lost`: list the tasks again and
   * follow from now).
   */
  async *events(opts: EventsOptions = {}): AsyncGenerator<LeasepoolEvent, void, undefined> {
    const idleMs = opts.idleTimeoutMs ?? 45000;
    const maxBackoff = opts.maxBackoffMs ?? 5000;
    const join = (v: string | string[] | undefined) => (Array.isArray(v) ? v.join(",") : v);
    let since = opts.since ?? "";
    let backoff = 100;
    const outer = opts.signal;
    while (!outer?.aborted) {
      const ctl = new AbortController();
      const onOuter = () => ctl.abort(outer?.reason);
      outer?.addEventListener("abort", onOuter, { once: true });
      let idle: ReturnType<typeof setTimeout> | undefined;
      const arm = () => {
        if (idle !== undefined) clearTimeout(idle);
        if (idleMs > 0) idle = setTimeout(() => ctl.abort(new LeasepoolError(0, `events: nothing for ${idleMs} ms`, "timeout")), idleMs);
      };
      let dropped: unknown;
      try {
        arm();
        const res = await this.transport.stream("GET", "/api/v1/events", {
          query: { since: since || undefined, kind: join(opts.kind), key: opts.key, type: join(opts.type), rollout: opts.rollout },
          headers: { Accept: "text/event-stream" },
          signal: ctl.signal,
          timeoutMs: 0,
          failover: "any",
        });
        const parser = new SseParser(since);
        const decoder = new TextDecoder();
        try {
          for await (const value of res.chunks()) {
            arm();
            backoff = 100;
            for (const msg of parser.push(decoder.decode(value, { stream: true }))) {
              if (msg.event === "error") {
                let detail: { error?: string; code?: string } = {};
                try {
                  detail = JSON.parse(msg.data);
                } catch {
                  detail = { error: msg.data };
                }
                const code = detail.code ?? detail.error ?? "stream_error";
                throw new LeasepoolError(res.status, `events: the stream ended: ${detail.error ?? msg.data}`, code, detail);
              }
              if (msg.hasId) since = msg.lastId;
              if (!msg.hasData) continue;
              yield JSON.parse(msg.data) as LeasepoolEvent;
            }
          }
        } finally {
          res.cancel();
        }
        dropped = new LeasepoolError(0, "events: the server closed the stream", "unreachable");
      } catch (err) {
        if (outer?.aborted) return;
        // An error answer (bad filter, credentials) or a lost history will
        // not mend by itself; a dropped connection or a 5xx may.
        if (err instanceof LeasepoolError && err.status >= 200 && err.status < 500) throw err;
        dropped = err;
      } finally {
        if (idle !== undefined) clearTimeout(idle);
        outer?.removeEventListener("abort", onOuter);
        ctl.abort();
      }
      opts.onReconnect?.(dropped);
      await sleep(backoff, outer);
      backoff = Math.min(backoff * 2, maxBackoff);
    }
  }
}

/** A key escaped as one path segment. */
export function segment(key: string): string {
  if (typeof key !== "string" || key === "") throw new TypeError("key: must be a non-empty string");
  return encodeURIComponent(key);
}

function listQuery(f: ListFilter): Record<string, string | number | undefined> {
  return {
    state: f.state,
    kind: f.kind,
    key_prefix: f.keyPrefix,
    worker: f.worker,
    text: f.text,
    created_after: f.createdAfter === undefined ? undefined : time("createdAfter", f.createdAfter),
    created_before: f.createdBefore === undefined ? undefined : time("createdBefore", f.createdBefore),
    updated_after: f.updatedAfter === undefined ? undefined : time("updatedAfter", f.updatedAfter),
    updated_before: f.updatedBefore === undefined ? undefined : time("updatedBefore", f.updatedBefore),
    order: f.order,
    limit: f.limit,
  };
}

function reindex(r: BatchItemResult, offset: number): BatchItemResult {
  if (offset === 0 || r.error === undefined) return r;
  return { ...r, error: reindexText(r.error, offset) };
}

/** Makes `tasks[i]` in a chunk's message name the item's index in the whole call. */
function reindexText(s: string, offset: number): string {
  if (offset === 0) return s;
  return s.replace(/tasks\[(\d+)\]/g, (_, i: string) => `tasks[${Number(i) + offset}]`);
}

/** Waits ms, or less when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
