import { hostname } from "node:os";
import { sleep, segment } from "./client.js";
import { LeasepoolError, RetryableError, SnoozeError } from "./errors.js";
import { Transport, type ConnectionOptions } from "./transport.js";

/** Why a job's signal was aborted: a 409's code, or one of the worker's own. */
export type AbortReason =
  | "cancelled"
  | "task_done"
  | "unpinned"
  | "lease_lost"
  | "not_found"
  /** No renew succeeded for lease_ms: another worker may have the task. */
  | "lease_expired"
  /** The worker stops: the attempt is given back (`released`). */
  | "shutdown"
  /** A flow step's timeout passed: a failure the handler gives is the step's timeout. */
  | "step_timeout"
  | string;

/** One claimed attempt, as a handler sees it. */
export interface Job {
  readonly key: string;
  readonly kind: string;
  /** The attempt number: the fencing token for whatever the handler writes elsewhere. */
  readonly attempt: number;
  readonly payload: unknown;
  readonly priority: number;
  readonly createdAt: Date;
  /**
   * The W3C trace context the task was published in, if any: the parent
   * of the handler's span.
   */
  readonly traceparent?: string;
  readonly tracestate?: string;
  /**
   * Set on a flow step's task: its flow, step and the flow's shared
   * parameters (the request's and each finished step's result by name);
   * `payload` is then the step's own.
   */
  readonly flowStep?: FlowStep;
  /** How long the lease lasts without a renew. */
  readonly leaseMs: number;
  /** How often the worker renews it. */
  readonly renewMs: number;
  /**
   * Aborted when the attempt is no longer this worker's (the task was
   * cancelled or finished elsewhere, the lease was lost) or when the worker
   * stops; `signal.reason` is the AbortReason code.
   */
  readonly signal: AbortSignal;
  /** Appends a line to the attempt's log; lines ride on the next renew or the finish. */
  log(line: string): void;
}

/** A handler runs one job; its return value (JSON) is the attempt's result. */
export type Handler = (job: Job) => unknown;

export interface WorkerLogger {
  info?(message: string): void;
  warn?(message: string): void;
  error?(message: string): void;
}

export interface WorkerOptions extends ConnectionOptions {
  /** The worker id (a name, as `leasepool worker --id` takes). */
  id: string;
  /** A handler per kind. */
  handlers: Record<string, Handler>;
  /** The kinds to claim (default: the handlers' kinds). */
  kinds?: string[];
  /** Jobs run at once (default 10). */
  concurrency?: number;
  /** How long stop() lets handlers run on before aborting them (default 10000 ms). */
  graceMs?: number;
  /** How long stop() then waits for aborted handlers to return before releasing their attempts anyway (default 2000 ms). */
  abortWaitMs?: number;
  /** A claim's long poll (default 20000 ms, at most 60000). */
  claimWaitMs?: number;
  /** How many times a RetryableError runs the handler again in the same attempt (default 3). */
  localRetries?: number;
  /** The first wait before such a run, doubled each time (default 200 ms). */
  retryBackoffMs?: number;
  /** The host name the registry shows (default the machine's). */
  host?: string;
  /** Where the worker says what happens (default: warnings and errors on stderr). */
  logger?: WorkerLogger;
}

export interface StartOptions {
  /** Stop gracefully on SIGTERM and SIGINT (a second one exits at once). */
  signals?: boolean;
}

/** The most jobs one claim may ask for (the server's bound). */
const MAX_CLAIM = 256;
/** A renew's or finish's log lines held back while no server answers, at most. */
const MAX_PENDING_LOG = 1000;

class Backoff {
  private n = 0;
  constructor(
    private readonly first: number,
    private readonly most: number,
  ) {}
  next(): number {
    const d = Math.min(this.most, this.first * 2 ** this.n);
    this.n = Math.min(this.n + 1, 30);
    // Jitter, so that workers cut off together do not call back together.
    return d / 2 + Math.random() * (d / 2);
  }
  reset(): void {
    this.n = 0;
  }
}

type Outcome =
  | { outcome: "succeeded"; result?: unknown }
  | { outcome: "failed"; error: string }
  | { outcome: "snoozed"; snooze_ms: number }
  | { outcome: "released" };

/** The flow step a job runs (see Job.flowStep). */
export interface FlowStep {
  readonly flow: string;
  readonly step: string;
  /** Set on a step's rollback. */
  readonly undo?: boolean;
  readonly params?: Readonly<Record<string, unknown>>;
  /** The step's timeout: the signal aborts with `step_timeout` once it passes. */
  readonly timeout_ms?: number;
}

/** A claimed attempt and the worker's bookkeeping of it. */
class ActiveJob implements Job {
  readonly key: string;
  readonly kind: string;
  readonly attempt: number;
  readonly payload: unknown;
  readonly priority: number;
  readonly createdAt: Date;
  readonly traceparent?: string;
  readonly tracestate?: string;
  readonly flowStep?: FlowStep;
  leaseMs: number;
  readonly renewMs: number;
  readonly controller = new AbortController();
  /** When the last renew (or the claim) that succeeded was sent, monotonic ms. */
  lastOk: number;
  pending: string[] = [];
  droppedLines = 0;
  /** No longer this worker's: never finished. */
  lost = false;
  /** The worker stops: a failure becomes `released`. */
  stopping = false;
  /** Its outcome is being written (or was): renews stop, nothing else writes. */
  finishing = false;
  renewTimer?: ReturnType<typeof setTimeout>;
  leaseTimer?: ReturnType<typeof setTimeout>;
  renewing = false;
  settled!: Promise<void>;

  constructor(doc: ClaimedJob, sentAt: number) {
    this.key = doc.key;
    this.kind = doc.kind;
    this.attempt = doc.attempt;
    this.payload = doc.payload;
    this.priority = doc.priority ?? 0;
    this.createdAt = new Date(doc.created_at);
    this.traceparent = doc.traceparent || undefined;
    this.tracestate = doc.tracestate || undefined;
    this.flowStep = doc.flow_step || undefined;
    this.leaseMs = doc.lease_ms > 0 ? doc.lease_ms : 4000;
    this.renewMs = doc.renew_ms > 0 ? doc.renew_ms : 1000;
    this.lastOk = sentAt;
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  log(line: string): void {
    if (this.pending.length >= MAX_PENDING_LOG) {
      this.pending.shift();
      this.droppedLines++;
    }
    this.pending.push(String(line));
  }

  takeLog(): string[] {
    const lines = this.pending;
    if (this.droppedLines > 0) lines.unshift(`(${this.droppedLines} log lines dropped while no server answered)`);
    this.pending = [];
    this.droppedLines = 0;
    return lines;
  }

  returnLog(lines: string[]): void {
    this.pending = lines.concat(this.pending).slice(-MAX_PENDING_LOG);
  }

  /** Whether the lease may still be this worker's by the local clock. */
  leaseAhead(now = performance.now()): boolean {
    return now - this.lastOk < this.leaseMs;
  }

  clearTimers(): void {
    if (this.renewTimer !== undefined) clearTimeout(this.renewTimer);
    if (this.leaseTimer !== undefined) clearTimeout(this.leaseTimer);
    this.renewTimer = this.leaseTimer = undefined;
  }
}

interface ClaimedJob {
  key: string;
  kind: string;
  attempt: number;
  payload: unknown;
  priority?: number;
  lease_until: string;
  lease_ms: number;
  renew_ms: number;
  created_at: string;
  traceparent?: string;
  tracestate?: string;
  flow_step?: FlowStep;
}

/**
 * Worker runs tasks as a remote worker of `leasepool serve`: it registers,
 * claims with a long poll, runs the handlers, renews each lease while its
 * handler runs and writes each attempt's outcome (docs/http-api.md,
 * "Remote workers").
 */
export class Worker {
  readonly id: string;
  /** This process's instance: names every renew and finish. */
  readonly instance: string;
  readonly kinds: string[];
  readonly concurrency: number;
  private readonly handlers: Record<string, Handler>;
  private readonly transport: Transport;
  private readonly graceMs: number;
  private readonly abortWaitMs: number;
  private readonly claimWaitMs: number;
  private readonly localRetries: number;
  private readonly retryBackoffMs: number;
  private readonly host: string;
  private readonly logger: Required<WorkerLogger>;
  private readonly path: string;

  private readonly active = new Map<string, ActiveJob>();
  private started = false;
  private stopping = false;
  private closed = false;
  private registered = false;
  private heartbeatMs = 5000;
  private readonly claimAbort = new AbortController();
  private readonly background = new AbortController();
  private wakeHeartbeat?: () => void;
  private registeredWaiters: (() => void)[] = [];
  /** Why the first registration was refused for good (bad input, credentials). */
  private refusal?: LeasepoolError;
  private slotWaiters: (() => void)[] = [];
  private loops: Promise<void>[] = [];
  private stopPromise?: Promise<void>;
  private doneResolve: () => void = () => {};
  /** Resolves once the worker has stopped. */
  readonly done: Promise<void>;
  private signalHandler?: (signal: string) => void;

  constructor(opts: WorkerOptions) {
    if (!opts || typeof opts !== "object") throw new TypeError("Worker: give {url, id, handlers}");
    if (typeof opts.id !== "string" || opts.id === "") throw new TypeError("id: must be a non-empty string");
    if (!opts.handlers || typeof opts.handlers !== "object") throw new TypeError("handlers: give {kind: async (job) => result}");
    for (const [kind, h] of Object.entries(opts.handlers)) {
      if (typeof h !== "function") throw new TypeError(`handlers.${kind}: must be a function`);
    }
    const kinds = opts.kinds ?? Object.keys(opts.handlers);
    if (!Array.isArray(kinds) || kinds.length === 0) throw new TypeError("kinds: give at least one kind (or a handler)");
    kinds.forEach((k, i) => {
      if (typeof k !== "string" || k === "") throw new TypeError(`kinds[${i}]: must be a non-empty string`);
      if (typeof opts.handlers[k] !== "function") throw new TypeError(`kinds[${i}]: no handler for kind ${JSON.stringify(k)}`);
    });
    this.id = opts.id;
    this.kinds = [...kinds];
    this.handlers = { ...opts.handlers };
    this.concurrency = positive("concurrency", opts.concurrency ?? 10, true);
    this.graceMs = positive("graceMs", opts.graceMs ?? 10000);
    this.abortWaitMs = positive("abortWaitMs", opts.abortWaitMs ?? 2000);
    this.claimWaitMs = Math.min(60000, positive("claimWaitMs", opts.claimWaitMs ?? 20000));
    this.localRetries = positive("localRetries", opts.localRetries ?? 3);
    this.retryBackoffMs = positive("retryBackoffMs", opts.retryBackoffMs ?? 200);
    this.transport = new Transport(opts);
    this.host = opts.host ?? hostname();
    const prefix = `leasepool worker ${this.id}:`;
    const stderr = (m: string) => console.error(`${prefix} ${m}`);
    const l: WorkerLogger = opts.logger ?? { warn: stderr, error: stderr };
    const none = () => {};
    this.logger = {
      info: l.info ? (m) => l.info!(m) : none,
      warn: l.warn ? (m) => l.warn!(m) : none,
      error: l.error ? (m) => l.error!(m) : none,
    };
    this.instance = globalThis.crypto.randomUUID();
    this.path = `/api/v1/workers/${segment(this.id)}`;
    this.done = new Promise<void>((resolve) => (this.doneResolve = resolve));
  }

  /** The server URL calls go to now. */
  get url(): string {
    return this.transport.url;
  }

  /** The jobs running now. */
  get running(): Job[] {
    return [...this.active.values()];
  }

  /**
   * Registers (waiting for the server, or for a previous process's
   * registration of the id to lapse) and starts claiming; resolves once
   * registered.
   */
  async start(opts: StartOptions = {}): Promise<void> {
    if (this.started) throw new Error("Worker: already started");
    this.started = true;
    if (opts.signals) {
      let signalled = false;
      this.signalHandler = (signal: string) => {
        if (signalled) {
          this.logger.warn(`${signal} again: exiting at once`);
          process.exit(130);
        }
        signalled = true;
        this.logger.info(`${signal}: stopping`);
        this.stop().catch((err) => this.logger.error(`stop: ${String(err)}`));
      };
      process.on("SIGTERM", this.signalHandler);
      process.on("SIGINT", this.signalHandler);
    }
    this.loops.push(this.heartbeatLoop());
    await this.whenRegistered();
    if (this.refusal) {
      await this.stop();
      throw this.refusal;
    }
    if (this.stopping) return;
    this.loops.push(this.claimLoop());
  }

  /**
   * Stops: claims no more, lets running handlers go on for graceMs, aborts
   * the rest (reason `shutdown`) and gives their attempts back (`released`)
   * so that any worker takes them at once, then unregisters.
   */
  stop(): Promise<void> {
    this.stopPromise ??= this.doStop();
    return this.stopPromise;
  }

  private async doStop(): Promise<void> {
    this.stopping = true;
    this.claimAbort.abort();
    for (const w of this.registeredWaiters.splice(0)) w();
    for (const w of this.slotWaiters.splice(0)) w();
    if (this.started) {
      const deadline = performance.now() + this.graceMs;
      while (this.active.size > 0 && performance.now() < deadline) {
        await settledOrTimeout([...this.active.values()].map((j) => j.settled), deadline - performance.now(), "any");
      }
      const left = [...this.active.values()];
      for (const job of left) {
        if (job.lost || job.finishing) continue;
        job.stopping = true;
        job.controller.abort("shutdown");
      }
      if (left.length > 0) {
        this.logger.info(`${left.length} handlers still running after ${this.graceMs} ms: aborted, their attempts released`);
        await settledOrTimeout(left.map((j) => j.settled), this.abortWaitMs, "all");
        // Handlers that ignore their abort: give the attempts back anyway.
        await Promise.all(
          left.filter((j) => !j.lost && !j.finishing).map((j) => this.finish(j, { outcome: "released" })),
        );
      }
    }
    // No heartbeat may register the worker again after it unregisters.
    this.closed = true;
    this.background.abort();
    this.wakeHeartbeat?.();
    for (const job of this.active.values()) job.clearTimers();
    await Promise.allSettled(this.loops);
    if (this.started && this.registered) {
      try {
        await this.transport.json("DELETE", this.path, { query: { instance: this.instance }, timeoutMs: 5000 });
      } catch (err) {
        this.logger.warn(`unregister: ${errorText(err)}`);
      }
    }
    if (this.signalHandler) {
      process.off("SIGTERM", this.signalHandler);
      process.off("SIGINT", this.signalHandler);
    }
    this.doneResolve();
  }

  // Registration.

  private whenRegistered(): Promise<void> {
    if (this.registered || this.stopping) return Promise.resolve();
    return new Promise((resolve) => this.registeredWaiters.push(resolve));
  }

  /** Registers again now (after a not_registered answer). */
  private reregister(): void {
    this.registered = false;
    this.wakeHeartbeat?.();
  }

  private async heartbeatLoop(): Promise<void> {
    const backoff = new Backoff(100, 2000);
    while (!this.closed) {
      let wait: number;
      try {
        const held = [...this.active.values()].filter((j) => !j.lost).map((j) => ({ key: j.key, attempt: j.attempt }));
        const { body } = await this.transport.json<{ heartbeat_ms?: number; lost?: { key: string; attempt: number; reason?: string }[] }>(
          "PUT",
          this.path,
          {
            body: {
              instance: this.instance,
              kinds: this.kinds,
              concurrency: this.concurrency,
              running: this.active.size,
              host: this.host,
              pid: process.pid,
              held,
            },
            timeoutMs: 10000,
            signal: this.background.signal,
          },
        );
        if (body.heartbeat_ms && body.heartbeat_ms > 0) this.heartbeatMs = body.heartbeat_ms;
        if (!this.registered) {
          this.logger.info(`registered at ${this.transport.url} as instance ${this.instance}`);
          this.registered = true;
          for (const w of this.registeredWaiters.splice(0)) w();
        }
        backoff.reset();
        for (const l of body.lost ?? []) {
          const job = this.active.get(jobKey(l.key, l.attempt));
          if (job) this.lose(job, l.reason || "lease_lost");
        }
        wait = this.heartbeatMs;
      } catch (err) {
        if (this.closed) return;
        if (!this.registered && err instanceof LeasepoolError && [400, 401, 403].includes(err.status)) {
          // Asking again will not mend it: start() rejects with it.
          this.refusal = new LeasepoolError(err.status, `register ${this.id}: ${err.message}`, err.code, err.body);
          for (const w of this.registeredWaiters.splice(0)) w();
          return;
        }
        if (err instanceof LeasepoolError && err.code === "worker_id_taken") {
          this.logger.warn(`${err.message}; waiting for its registration to lapse`);
          wait = Math.max(backoff.next(), 500);
        } else {
          if (!isTransient(err)) this.logger.error(`heartbeat: ${errorText(err)}`);
          wait = backoff.next();
        }
      }
      await new Promise<void>((resolve) => {
        const t = setTimeout(done, wait);
        function done() {
          clearTimeout(t);
          resolve();
        }
        this.wakeHeartbeat = done;
      });
      this.wakeHeartbeat = undefined;
    }
  }

  // Claiming.

  private freeSlot(): Promise<void> {
    if (this.active.size < this.concurrency || this.stopping) return Promise.resolve();
    return new Promise((resolve) => this.slotWaiters.push(resolve));
  }

  private async claimLoop(): Promise<void> {
    const backoff = new Backoff(50, 2000);
    while (!this.stopping) {
      await this.whenRegistered();
      await this.freeSlot();
      // Short handlers free their slots one by one: gather a few before
      // claiming rather than make a call per slot.
      if (this.active.size > 0 && this.active.size > this.concurrency / 2) await sleep(5, this.claimAbort.signal);
      if (this.stopping) break;
      const free = this.concurrency - this.active.size;
      if (free <= 0) continue;
      const sentAt = performance.now();
      let jobs: ClaimedJob[];
      try {
        const { body } = await this.transport.json<{ jobs?: ClaimedJob[] }>("POST", `${this.path}/claim`, {
          body: { instance: this.instance, kinds: this.kinds, max: Math.min(free, MAX_CLAIM), wait_ms: this.claimWaitMs },
          timeoutMs: this.claimWaitMs + 15000,
          signal: this.claimAbort.signal,
        });
        jobs = body.jobs ?? [];
      } catch (err) {
        if (this.stopping) break;
        if (err instanceof LeasepoolError && err.code === "not_registered") {
          this.logger.info(`not registered at ${this.transport.url}: registering again`);
          this.reregister();
          await this.whenRegistered();
          continue;
        }
        if (!isTransient(err)) this.logger.error(`claim: ${errorText(err)}`);
        await sleep(backoff.next(), this.claimAbort.signal);
        continue;
      }
      backoff.reset();
      // The lease began when the server claimed, between the send and now:
      // a long poll claims at its end, just before it answers, so take
      // the send when the answer came fast, else allow the answer a margin.
      const receivedAt = performance.now();
      for (const doc of jobs) {
        const job = new ActiveJob(doc, sentAt);
        job.lastOk = Math.max(sentAt, receivedAt - Math.min(1000, job.leaseMs / 4));
        this.begin(job);
      }
    }
  }

  // Running.

  private begin(job: ActiveJob): void {
    this.active.set(jobKey(job.key, job.attempt), job);
    this.scheduleRenew(job, job.renewMs);
    this.armLease(job);
    job.settled = this.run(job)
      .catch((err) => this.logger.error(`${job.key} attempt ${job.attempt}: ${errorText(err)}`))
      .finally(() => {
        job.clearTimers();
        this.active.delete(jobKey(job.key, job.attempt));
        const w = this.slotWaiters.shift();
        w?.();
      });
  }

  private async run(job: ActiveJob): Promise<void> {
    let outcome: Outcome;
    if (this.stopping) {
      // Claimed as the worker stops: give it back at once.
      job.stopping = true;
      job.controller.abort("shutdown");
      outcome = { outcome: "released" };
    } else {
      // A flow step's timeout, kept as a Go worker's flow middleware
      // keeps it: the handler is aborted, and its failure says why.
      const timeoutMs = job.flowStep?.timeout_ms ?? 0;
      const timer = timeoutMs > 0 ? setTimeout(() => job.controller.abort("step_timeout"), timeoutMs) : undefined;
      try {
        outcome = await this.call(job);
      } finally {
        clearTimeout(timer);
      }
      if (outcome.outcome === "failed" && job.signal.reason === "step_timeout") {
        outcome = { outcome: "failed", error: `step timeout ${timeoutMs} ms: ${outcome.error}` };
      }
    }
    if (job.lost || job.finishing) return;
    if (job.stopping && outcome.outcome !== "succeeded") outcome = { outcome: "released" };
    await this.finish(job, outcome);
  }

  private async call(job: ActiveJob): Promise<Outcome> {
    const handler = this.handlers[job.kind];
    if (!handler) return { outcome: "failed", error: `no handler for kind ${JSON.stringify(job.kind)} in worker ${this.id}` };
    for (let tries = 0; ; ) {
      try {
        const result = await handler(job);
        if (result === undefined) return { outcome: "succeeded" };
        try {
          JSON.stringify(result);
        } catch (err) {
          return { outcome: "failed", error: `result: not JSON: ${errorText(err)}` };
        }
        return { outcome: "succeeded", result };
      } catch (err) {
        if (err instanceof SnoozeError) return { outcome: "snoozed", snooze_ms: err.ms };
        if (err instanceof RetryableError && tries < this.localRetries && !job.signal.aborted) {
          tries++;
          job.log(`retrying after: ${err.message}`);
          await sleep(this.retryBackoffMs * 2 ** (tries - 1), job.signal);
          if (!job.signal.aborted) continue;
        }
        return { outcome: "failed", error: errorText(err) };
      }
    }
  }

  /** The attempt is no longer this worker's: abort its handler, never finish it. */
  private lose(job: ActiveJob, reason: string): void {
    if (job.lost || job.finishing) return;
    job.lost = true;
    job.clearTimers();
    this.logger.info(`${job.key} attempt ${job.attempt} lost (${reason})`);
    job.controller.abort(reason);
  }

  /** No renew succeeded for lease_ms: another worker may run the task already. */
  private expire(job: ActiveJob): void {
    if (job.lost || job.finishing) return;
    this.logger.warn(`${job.key} attempt ${job.attempt}: no renew succeeded for ${job.leaseMs} ms: lease lost`);
    this.lose(job, "lease_expired");
  }

  private armLease(job: ActiveJob): void {
    if (job.leaseTimer !== undefined) clearTimeout(job.leaseTimer);
    const left = job.lastOk + job.leaseMs - performance.now();
    job.leaseTimer = setTimeout(() => {
      job.leaseTimer = undefined;
      if (job.leaseAhead()) return this.armLease(job);
      this.expire(job);
    }, Math.max(0, left));
  }

  private scheduleRenew(job: ActiveJob, ms: number): void {
    if (job.renewTimer !== undefined) clearTimeout(job.renewTimer);
    job.renewTimer = setTimeout(() => {
      job.renewTimer = undefined;
      this.renew(job).catch((err) => this.logger.error(`renew ${job.key}: ${errorText(err)}`));
    }, Math.max(0, ms));
  }

  private async renew(job: ActiveJob): Promise<void> {
    if (job.lost || job.finishing || this.closed) return;
    const sentAt = performance.now();
    // A process frozen past its lease learns it here, before any write.
    if (!job.leaseAhead(sentAt)) {
      this.expire(job);
      return;
    }
    const lines = job.takeLog();
    const body: Record<string, unknown> = { instance: this.instance, attempt: job.attempt };
    if (lines.length > 0) body.log = lines;
    try {
      job.renewing = true;
      const { body: res } = await this.transport.json<{ lease_ms?: number }>("POST", `${this.path}/jobs/${segment(job.key)}/renew`, {
        body,
        timeoutMs: Math.max(1000, Math.min(10000, job.leaseMs / 2)),
        signal: this.background.signal,
      });
      job.lastOk = sentAt;
      if (res.lease_ms && res.lease_ms > 0) job.leaseMs = res.lease_ms;
      if (job.lost || job.finishing) return;
      this.armLease(job);
      this.scheduleRenew(job, sentAt + job.renewMs - performance.now());
    } catch (err) {
      if (this.closed) return;
      if (err instanceof LeasepoolError && err.code === "not_registered") {
        job.returnLog(lines);
        this.reregister();
        if (!job.lost && !job.finishing) this.scheduleRenew(job, 50);
      } else if (err instanceof LeasepoolError && (err.status === 404 || err.status === 409)) {
        this.lose(job, err.status === 404 ? "not_found" : err.code);
      } else {
        // Unreachable or failing: try again soon, the lease runs on.
        job.returnLog(lines);
        if (!isTransient(err)) this.logger.error(`renew ${job.key}: ${errorText(err)}`);
        if (!job.lost && !job.finishing) this.scheduleRenew(job, Math.min(job.renewMs, 500));
      }
    } finally {
      job.renewing = false;
    }
  }

  /** Writes the attempt's outcome, trying again while its lease may still be ahead. */
  private async finish(job: ActiveJob, outcome: Outcome): Promise<void> {
    if (job.finishing || job.lost) return;
    job.finishing = true;
    job.clearTimers();
    let body: Record<string, unknown> = { instance: this.instance, attempt: job.attempt, ...outcome };
    const lines = job.takeLog();
    if (lines.length > 0) body.log = lines;
    const path = `${this.path}/jobs/${segment(job.key)}/finish`;
    const backoff = new Backoff(50, 1000);
    for (;;) {
      if (!job.leaseAhead()) {
        this.logger.warn(`${job.key} attempt ${job.attempt}: lease ended before the ${String(body.outcome)} outcome was written`);
        job.controller.abort("lease_expired");
        return;
      }
      try {
        await this.transport.json("POST", path, { body, timeoutMs: 10000 });
        return;
      } catch (err) {
        if (err instanceof LeasepoolError && err.code === "not_registered") {
          this.reregister();
        } else if (err instanceof LeasepoolError && (err.status === 404 || err.status === 409)) {
          this.logger.warn(`${job.key} attempt ${job.attempt}: ${String(body.outcome)} not recorded: ${err.message}`);
          job.controller.abort(err.status === 404 ? "not_found" : err.code);
          return;
        } else if (err instanceof LeasepoolError && err.status === 400 && body.outcome === "succeeded") {
          // A result the server refuses (too large): fail the attempt
          // with the reason rather than leave the task to its lease.
          body = { instance: this.instance, attempt: job.attempt, outcome: "failed", error: err.message };
          continue;
        } else if (err instanceof LeasepoolError && err.status > 0 && err.status < 500) {
          this.logger.error(`finish ${job.key}: ${err.message}`);
          return;
        } else if (!isTransient(err)) {
          this.logger.error(`finish ${job.key}: ${errorText(err)}`);
        }
      }
      await sleep(backoff.next());
    }
  }
}

/** Waits for any (or all) of ps to settle, or ms, whichever comes first; leaves no timer behind. */
async function settledOrTimeout(ps: Promise<unknown>[], ms: number, mode: "any" | "all"): Promise<void> {
  const ctl = new AbortController();
  const settled = mode === "any" ? Promise.race(ps) : Promise.allSettled(ps);
  try {
    await Promise.race([settled.then(() => {}, () => {}), sleep(Math.max(0, ms), ctl.signal)]);
  } finally {
    ctl.abort();
  }
}

function jobKey(key: string, attempt: number): string {
  return `${attempt}\u0000${key}`;
}

function positive(field: string, v: unknown, atLeastOne = false): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < (atLeastOne ? 1 : 0)) {
    throw new TypeError(`${field}: must be a number ${atLeastOne ? "of at least 1" : "not below 0"}, got ${JSON.stringify(v)}`);
  }
  return atLeastOne ? Math.floor(v) : v;
}

/** An error that a later call may not meet: no answer, or a server error. */
function isTransient(err: unknown): boolean {
  return err instanceof LeasepoolError && (err.status === 0 || err.status >= 500);
}

function errorText(err: unknown): string {
  if (err instanceof Error) return err.message || err.name;
  if (typeof err === "string") return err;
  try {
    return JSON.stringify(err) ?? String(err);
  } catch {
    return String(err);
  }
}
