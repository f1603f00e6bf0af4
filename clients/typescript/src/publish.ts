import type { Duration, PublishTask } from "./types.js";

/** The API's publish body for t, in the task document's names. */
export function publishBody(t: PublishTask, field = ""): Record<string, unknown> {
  if (t === null || typeof t !== "object") throw new TypeError(`${field || "task"}: must be an object`);
  const at = (name: string) => (field ? `${field}.${name}` : name);
  const known = new Set([
    "key", "kind", "payload", "priority", "runAt", "delay", "specificWorkerIds", "concurrentWorkerCnt",
    "successWorkerCnt", "maxUnexpectedRetries", "pingInterval", "workerTimeout", "lockKeys", "rerun",
    "debounce",
  ]);
  for (const name of Object.keys(t)) {
    if (!known.has(name)) throw new TypeError(`${at(name)}: unknown option (known: ${[...known].join(", ")})`);
  }
  const b: Record<string, unknown> = { key: t.key, kind: t.kind };
  if (t.payload !== undefined) b.payload = t.payload;
  if (t.priority !== undefined) b.priority = integer(at("priority"), t.priority);
  if (t.runAt !== undefined) b.run_at = time(at("runAt"), t.runAt);
  if (t.delay !== undefined) b.delay = duration(at("delay"), t.delay);
  if (t.specificWorkerIds !== undefined) b.specific_worker_ids = strings(at("specificWorkerIds"), t.specificWorkerIds);
  if (t.concurrentWorkerCnt !== undefined) b.concurrent_worker_cnt = integer(at("concurrentWorkerCnt"), t.concurrentWorkerCnt);
  if (t.successWorkerCnt !== undefined) b.success_worker_cnt = integer(at("successWorkerCnt"), t.successWorkerCnt);
  if (t.maxUnexpectedRetries !== undefined) b.max_unexpected_retries = integer(at("maxUnexpectedRetries"), t.maxUnexpectedRetries);
  if (t.pingInterval !== undefined) b.ping_interval = duration(at("pingInterval"), t.pingInterval);
  if (t.workerTimeout !== undefined) b.worker_timeout = duration(at("workerTimeout"), t.workerTimeout);
  if (t.lockKeys !== undefined) b.lock_keys = strings(at("lockKeys"), t.lockKeys);
  if (t.rerun !== undefined) b.rerun = Boolean(t.rerun);
  if (t.debounce !== undefined) b.debounce = duration(at("debounce"), t.debounce);
  return b;
}

function integer(field: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v)) throw new TypeError(`${field}: must be an integer, got ${JSON.stringify(v)}`);
  return v;
}

function strings(field: string, v: unknown): string[] {
  if (!Array.isArray(v) || v.some((s) => typeof s !== "string")) throw new TypeError(`${field}: must be a list of strings`);
  return v;
}

/** A Date or an RFC 3339 string, as the API reads times. */
export function time(field: string, v: unknown): string {
  if (v instanceof Date) {
    if (Number.isNaN(v.getTime())) throw new TypeError(`${field}: invalid Date`);
    return v.toISOString();
  }
  if (typeof v === "string" && v !== "") return v;
  throw new TypeError(`${field}: must be a Date or an RFC 3339 string`);
}

/** Milliseconds become a Go duration string; a string goes as it is. */
export function duration(field: string, v: Duration): string {
  if (typeof v === "number") {
    if (!Number.isFinite(v) || v < 0) throw new TypeError(`${field}: must be a non-negative number of milliseconds, got ${v}`);
    return `${v}ms`;
  }
  if (typeof v === "string" && v !== "") return v;
  throw new TypeError(`${field}: must be milliseconds or a duration string such as "1.5s"`);
}
