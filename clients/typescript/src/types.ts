/** A JSON value, as payloads and results are. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A duration: milliseconds, or a Go duration string ("1.5s", "10m"). */
export type Duration = number | string;

/** A task's state. */
export type TaskState = "pending" | "running" | "succeeded" | "failed" | "cancelled";

/** One publish: only key and kind are required. */
export interface PublishTask {
  key: string;
  kind: string;
  payload?: unknown;
  /** Higher runs first (default 0). */
  priority?: number;
  /** Run no earlier than this (a Date or an RFC 3339 string). */
  runAt?: Date | string;
  /** Run this much later; give runAt or delay, not both. */
  delay?: Duration;
  /** Only these worker ids may run it. */
  specificWorkerIds?: string[];
  /** How many workers may run it at once (default 1). */
  concurrentWorkerCnt?: number;
  /** How many successes finish it (default 1). */
  successWorkerCnt?: number;
  /** Failed or expired attempts tolerated before it fails (absent: 3; 0: none). */
  maxUnexpectedRetries?: number;
  /** How often a worker renews its lease (the job's renew_ms). */
  pingInterval?: Duration;
  /** How long a lease lasts without a renew (the job's lease_ms). */
  workerTimeout?: Duration;
  /** Resources held exclusively while it runs. */
  lockKeys?: string[];
  /** Run a finished task of this key again. */
  rerun?: boolean;
  /**
   * Run this long after the key's latest publish: publishing the key again
   * while its task is pending and never claimed replaces its payload and
   * moves its run time ("debounced"); a claimed task is left alone.
   * Positive, at most 24h.
   */
  debounce?: Duration;
}

/** One log line of an attempt. */
export interface LogLine {
  at: string;
  msg: string;
}

/** One attempt in a task document. */
export interface Attempt {
  worker_id: string;
  instance?: string;
  state: "RUNNING" | "SUCCESS" | "FAIL" | "EXPIRED" | "RELEASED" | "SNOOZED" | "UNPINNED" | "CANCELLED" | string;
  attempt: number;
  lease_until: string;
  started_at: string;
  ended_at?: string;
  error?: string;
  result?: Json;
  log?: LogLine[];
  log_dropped?: number;
  output_dropped?: boolean;
  claim_version?: number;
}

/** The task document, in the server's names (docs/tasks.md). */
export interface Task {
  key: string;
  kind: string;
  payload?: Json;
  priority: number;
  run_at: string;
  seq: number;
  specific_worker_ids?: string[];
  concurrent_worker_cnt: number;
  success_worker_cnt: number;
  max_unexpected_retries: number;
  ping_interval: string;
  worker_timeout: string;
  lock_keys?: string[];
  workers: Attempt[] | null;
  attempts: number;
  history?: Attempt[];
  history_dropped?: number;
  cancelled?: boolean;
  state: TaskState;
  next_claim_at: string;
  version: number;
  created_at: string;
  updated_at: string;
  [field: string]: unknown;
}

export type PublishResultKind = "inserted" | "existing" | "rerun" | "debounced";

export interface PublishResult {
  result: PublishResultKind;
  task: Task;
  /** Present when no live worker runs the task's kind. */
  warnings?: string[];
}

/** One item's outcome in a batch publish. */
export interface BatchItemResult {
  key?: string;
  result: "inserted" | "existing" | "rerun" | "debounced" | "refused" | "failed";
  state?: TaskState;
  /** Why it was refused (`tasks[i].field: reason`, i its index in the whole call) or failed. */
  error?: string;
}

export interface PublishManyResult {
  /** Every item's outcome, in the order given. */
  results: BatchItemResult[];
  inserted: number;
  existing: number;
  rerun: number;
  debounced: number;
  refused: number;
  failed: number;
  warnings?: string[];
}

export interface ListFilter {
  state?: TaskState;
  kind?: string;
  keyPrefix?: string;
  /** A worker id in the task's worker list. */
  worker?: string;
  /** A substring of the payload's compact JSON. */
  text?: string;
  createdAfter?: Date | string;
  createdBefore?: Date | string;
  updatedAfter?: Date | string;
  updatedBefore?: Date | string;
  /** "desc" (newest first, the default) or "asc". */
  order?: "asc" | "desc";
  /** Tasks per page, 1–1000 (default 50). */
  limit?: number;
}

export interface ListOptions extends ListFilter {
  /** A page's nextCursor or prevCursor, with the same filters. */
  cursor?: string;
  signal?: AbortSignal;
}

export interface TaskPage {
  tasks: Task[];
  /** Absent on the last page. */
  nextCursor?: string;
  /** Absent on the first page. */
  prevCursor?: string;
}

/** A task lifecycle or rollout event, as `leasepool events --json` prints it. */
export interface LeasepoolEvent {
  /** published, claimed, expired, succeeded, failed, retried, released, snoozed, unpinned, cancelled, reset, logged, rollout.… */
  event: string;
  key: string;
  kind: string;
  rollout?: string;
  wave?: number;
  seq?: number;
  attempt?: number;
  worker?: string;
  instance?: string;
  by?: string;
  error?: string;
  message?: string;
  until?: string;
  state: string;
  at: string;
  version: number;
  /** Resumes a stream right after this event (`since`). */
  token: string;
  [field: string]: unknown;
}

export interface EventsOptions {
  /** Resume after this token (an event's `token`); absent: from now. */
  since?: string;
  /** Keep events of these kinds. */
  kind?: string | string[];
  /** Keep events of this task. */
  key?: string;
  /** Keep events of these types (`published`, `succeeded`, …). */
  type?: string | string[];
  /** Keep one rollout's events. */
  rollout?: string;
  /** Ends the iteration. */
  signal?: AbortSignal;
  /** Reconnect when nothing (not even a heartbeat) came for this long (default 45000 ms). */
  idleTimeoutMs?: number;
  /** The longest wait between two reconnects (default 5000 ms). */
  maxBackoffMs?: number;
  /** Called when the stream reconnects after a drop, with the error that ended it. */
  onReconnect?: (err: unknown) => void;
}

export interface WorkerRecord {
  id: string;
  instance: string;
  host: string;
  pid: number;
  started_at: string;
  kinds?: string[];
  concurrency: number;
  running: number;
  heartbeat: string;
  until: string;
  live: boolean;
}
