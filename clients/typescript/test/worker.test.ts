import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Client, LeasepoolError, RetryableError, SnoozeError, Worker, type Job, type Task, type WorkerOptions } from "../src/index.js";
import { cleanup, startServe, unique, waitFor, type Serve } from "./helpers.js";

let serve: Serve;
let client: Client;
const workers: Worker[] = [];

before(async () => {
  serve = await startServe();
  client = new Client({ url: serve.url });
});
after(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  await serve?.stop();
  cleanup();
});

/** A started worker, stopped when the file's tests end. */
async function startWorker(opts: Omit<WorkerOptions, "url"> & { url?: WorkerOptions["url"] }): Promise<Worker> {
  const w = new Worker({ url: serve.url, logger: {}, ...opts });
  workers.push(w);
  await w.start();
  return w;
}

async function stateOf(key: string, want: string): Promise<Task> {
  return waitFor(`${key} ${want}`, async () => {
    const t = await client.get(key);
    return t.state === want ? t : undefined;
  });
}

/** A promise and its resolve, for a handler the test lets go. */
function gate<T = void>(): { promise: Promise<T>; open: (v: T) => void } {
  let open!: (v: T) => void;
  const promise = new Promise<T>((r) => (open = r));
  return { promise, open };
}

/** Resolves with the signal's reason once it aborts. */
function aborted(signal: AbortSignal): Promise<unknown> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(signal.reason);
    signal.addEventListener("abort", () => resolve(signal.reason), { once: true });
  });
}

test("runs published tasks: results, log lines, the registry", async () => {
  const kind = unique("run");
  const id = unique("w-run");
  let atOnce = 0;
  let most = 0;
  const w = await startWorker({
    id,
    concurrency: 4,
    handlers: {
      [kind]: async (job: Job) => {
        most = Math.max(most, ++atOnce);
        job.log(`doubling ${String((job.payload as { n: number }).n)}`);
        await new Promise((r) => setTimeout(r, 20));
        atOnce--;
        return { double: (job.payload as { n: number }).n * 2, attempt: job.attempt, key: job.key };
      },
    },
  });
  const reg = (await client.workers()).find((r) => r.id === id);
  assert.ok(reg?.live, "registered and live");
  assert.deepEqual(reg.kinds, [kind]);
  assert.equal(reg.instance, w.instance);

  const keys = Array.from({ length: 24 }, (_, i) => `${kind}-${i}`);
  await client.publishMany(keys.map((key, n) => ({ key, kind, payload: { n } })));
  await waitFor("all succeeded", async () => {
    let n = 0;
    for await (const t of client.listAll({ kind, state: "succeeded", limit: 1000 })) if (t) n++;
    return n === keys.length ? true : undefined;
  });
  for (const [n, key] of keys.entries()) {
    const t = await client.get(key);
    const a = (t.workers ?? [])[0];
    assert.equal(a.state, "SUCCESS");
    assert.equal(a.worker_id, id);
    assert.equal(a.instance, w.instance);
    assert.deepEqual(a.result, { double: n * 2, attempt: 1, key });
    assert.deepEqual(a.log?.map((l) => l.msg), [`doubling ${n}`]);
  }
  assert.ok(most <= 4, `at most concurrency handlers at once, saw ${most}`);
  assert.ok(most > 1, `handlers ran side by side, saw ${most}`);

  await w.stop();
  const after = (await client.workers()).find((r) => r.id === id && r.instance === w.instance);
  assert.ok(!after?.live, "unregistered on stop");
});

test("log lines ride on the renews while the handler runs", async () => {
  const kind = unique("logs");
  const key = unique("logs-task");
  const release = gate();
  await startWorker({
    id: unique("w-logs"),
    handlers: {
      [kind]: async (job: Job) => {
        job.log("first");
        job.log("second");
        await release.promise;
        job.log("last");
      },
    },
  });
  await client.publish({ key, kind, pingInterval: 50, workerTimeout: 2000 });
  await waitFor("the renew's log lines stored", async () => {
    const t = await client.get(key);
    const msgs = (t.workers ?? [])[0]?.log?.map((l) => l.msg) ?? [];
    return t.state === "running" && msgs.length === 2 ? msgs : undefined;
  });
  release.open();
  const t = await stateOf(key, "succeeded");
  assert.deepEqual((t.workers ?? [])[0].log?.map((l) => l.msg), ["first", "second", "last"]);
});

test("a cancelled task's handler gets its abort, and nothing is finished", async () => {
  const kind = unique("cancel");
  const key = unique("cancel-task");
  const started = gate<Job>();
  let outcome = "";
  await startWorker({
    id: unique("w-cancel"),
    handlers: {
      [kind]: async (job: Job) => {
        started.open(job);
        await aborted(job.signal);
        outcome = "aborted";
        throw new Error("handler aborted");
      },
    },
  });
  await client.publish({ key, kind, pingInterval: 100, workerTimeout: 2000 });
  const job = await started.promise;
  await client.cancel(key);
  const reason = await aborted(job.signal);
  assert.equal(reason, "cancelled");
  assert.equal(outcome, "aborted");
  const t = await client.get(key);
  assert.equal(t.state, "cancelled");
  const a = (t.workers ?? []).concat(t.history ?? []).find((x) => x.attempt === job.attempt);
  assert.ok(a, "the attempt is in the document");
  assert.equal(a.state, "CANCELLED", "the handler's rejection after its abort is never written");
  assert.notEqual(a.error, "handler aborted");
});

test("a handler that throws: retried by the server, then failed with its message", async () => {
  const kind = unique("throw");
  const key = unique("throw-task");
  const attempts: number[] = [];
  await startWorker({
    id: unique("w-throw"),
    handlers: {
      [kind]: async (job: Job) => {
        attempts.push(job.attempt);
        throw new Error(`boom ${job.attempt}`);
      },
    },
  });
  await client.publish({ key, kind, maxUnexpectedRetries: 1 });
  const t = await stateOf(key, "failed");
  assert.deepEqual(attempts, [1, 2]);
  const errors = (t.workers ?? []).concat(t.history ?? []).map((a) => `${a.attempt}:${a.state}:${a.error}`).sort();
  assert.deepEqual(errors, ["1:FAIL:boom 1", "2:FAIL:boom 2"]);
});

test("RetryableError runs the handler again in the same attempt", async () => {
  const kind = unique("retryable");
  const flaky = unique("flaky");
  const hopeless = unique("hopeless");
  const calls = new Map<string, number>();
  await startWorker({
    id: unique("w-retryable"),
    localRetries: 2,
    retryBackoffMs: 10,
    handlers: {
      [kind]: async (job: Job) => {
        const n = (calls.get(job.key) ?? 0) + 1;
        calls.set(job.key, n);
        if (job.key === hopeless || n < 3) throw new RetryableError(`try ${n} failed`);
        return { tries: n };
      },
    },
  });
  await client.publish({ key: flaky, kind });
  await client.publish({ key: hopeless, kind, maxUnexpectedRetries: 0 });
  const ok = await stateOf(flaky, "succeeded");
  const a = (ok.workers ?? [])[0];
  assert.equal(a.attempt, 1, "one attempt");
  assert.deepEqual(a.result, { tries: 3 });
  assert.deepEqual(a.log?.map((l) => l.msg), ["retrying after: try 1 failed", "retrying after: try 2 failed"]);
  const bad = await stateOf(hopeless, "failed");
  assert.equal(calls.get(hopeless), 3, "the first run and localRetries more");
  assert.equal((bad.workers ?? [])[0].error, "try 3 failed");
});

test("SnoozeError gives the task back to run again later, not as a failure", async () => {
  const kind = unique("snooze");
  const key = unique("snooze-task");
  await startWorker({
    id: unique("w-snooze"),
    handlers: {
      [kind]: async (job: Job) => {
        if (job.attempt === 1) throw new SnoozeError(400);
        return { attempt: job.attempt };
      },
    },
  });
  await client.publish({ key, kind, maxUnexpectedRetries: 0 });
  const t = await stateOf(key, "succeeded");
  const all = (t.workers ?? []).concat(t.history ?? []);
  const first = all.find((a) => a.attempt === 1);
  const second = all.find((a) => a.attempt === 2);
  assert.equal(first?.state, "SNOOZED");
  assert.equal(second?.state, "SUCCESS");
  assert.deepEqual(second?.result, { attempt: 2 });
  const gap = new Date(second!.started_at).getTime() - new Date(first!.ended_at!).getTime();
  assert.ok(gap >= 390, `ran again ${gap} ms after the snooze, want at least 400`);
});

test("stop() lets handlers finish within the grace, aborts and releases the rest", async () => {
  const kind = unique("stop");
  const quick = unique("quick");
  const slow = unique("slow");
  const started = new Map<string, Job>();
  const quickGate = gate();
  const w = await startWorker({
    id: unique("w-stop"),
    graceMs: 300,
    handlers: {
      [kind]: async (job: Job) => {
        started.set(job.key, job);
        if (job.key === quick) {
          await quickGate.promise;
          return { quick: true };
        }
        await aborted(job.signal);
        throw new Error("stopped");
      },
    },
  });
  await client.publish({ key: quick, kind });
  await client.publish({ key: slow, kind });
  await waitFor("both started", () => (started.size === 2 ? true : undefined));
  const stopping = w.stop();
  quickGate.open();
  await stopping;
  assert.equal(started.get(slow)?.signal.reason, "shutdown");
  assert.equal(started.get(quick)?.signal.aborted, false);
  const q = await client.get(quick);
  assert.equal(q.state, "succeeded");
  const s = await client.get(slow);
  assert.equal(s.state, "pending", "released: claimable again at once");
  const a = (s.workers ?? []).concat(s.history ?? []).find((x) => x.attempt === 1);
  assert.equal(a?.state, "RELEASED");
  const reg = (await client.workers()).find((r) => r.instance === w.instance);
  assert.ok(!reg?.live, "unregistered");
  // Released, not failed: another worker runs it as the next attempt.
  await startWorker({ id: unique("w-stop-2"), handlers: { [kind]: async (job: Job) => ({ attempt: job.attempt }) } });
  const done = await stateOf(slow, "succeeded");
  assert.equal(done.max_unexpected_retries, 3);
  assert.ok((done.workers ?? []).some((x) => x.state === "SUCCESS" && x.attempt === 2));
});

test("a finish the server refuses (409) is never recorded", async () => {
  const kind = unique("refused");
  const key = unique("refused-task");
  const started = gate<Job>();
  const release = gate();
  const warnings: string[] = [];
  await startWorker({
    id: unique("w-refused"),
    logger: { warn: (m) => warnings.push(m), info: (m) => warnings.push(m) },
    handlers: {
      [kind]: async (job: Job) => {
        started.open(job);
        await release.promise;
        return { late: true };
      },
    },
  });
  // Renews far apart: the handler returns before a renew could learn of
  // the cancel, so the finish itself meets it.
  await client.publish({ key, kind, pingInterval: "10s", workerTimeout: "40s" });
  const job = await started.promise;
  await client.cancel(key);
  release.open();
  const reason = await aborted(job.signal);
  assert.equal(reason, "cancelled");
  const t = await client.get(key);
  assert.equal(t.state, "cancelled");
  const a = (t.workers ?? []).concat(t.history ?? []).find((x) => x.attempt === job.attempt);
  assert.notEqual(a?.state, "SUCCESS");
  assert.equal(a?.result, undefined, "the refused outcome's result is not stored");
  assert.ok(warnings.some((m) => /not recorded|lost \(cancelled\)/.test(m)), warnings.join("\n"));
});

test("the protocol: a finish after the lease is lost answers 409 lease_lost", async () => {
  const kind = unique("proto");
  const key = unique("proto-task");
  const base = `${serve.url}/api/v1/workers`;
  const call = async (method: string, path: string, body: unknown) => {
    const res = await fetch(base + path, { method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  const reg = await call("PUT", "/p1", { instance: "i1", kinds: [kind], concurrency: 1 });
  assert.equal(reg.status, 200);
  assert.equal(typeof reg.body.heartbeat_ms, "number");
  assert.equal(typeof reg.body.ttl_ms, "number");
  assert.deepEqual(reg.body.lost, []);
  const unregistered = await call("POST", "/p2/claim", { instance: "i2", kinds: [kind], max: 1, wait_ms: 0 });
  assert.equal(unregistered.status, 409);
  assert.equal(unregistered.body.code, "not_registered");

  await client.publish({ key, kind, pingInterval: "100ms", workerTimeout: "500ms" });
  const c1 = await call("POST", "/p1/claim", { instance: "i1", max: 1, wait_ms: 5000 });
  const jobs = c1.body.jobs as { key: string; attempt: number; lease_ms: number; renew_ms: number }[];
  assert.equal(jobs.length, 1);
  assert.equal(jobs[0].key, key);
  assert.equal(jobs[0].lease_ms, 500);
  assert.equal(jobs[0].renew_ms, 100);
  // p2 takes it over once p1's lease ends.
  assert.equal((await call("PUT", "/p2", { instance: "i2", kinds: [kind] })).status, 200);
  const c2 = await call("POST", "/p2/claim", { instance: "i2", max: 1, wait_ms: 5000 });
  const jobs2 = c2.body.jobs as { attempt: number }[];
  assert.equal(jobs2[0]?.attempt, 2, JSON.stringify(c2.body));
  const late = await call("POST", `/p1/jobs/${encodeURIComponent(key)}/finish`, { instance: "i1", attempt: 1, outcome: "succeeded", result: { late: 1 } });
  assert.equal(late.status, 409);
  assert.equal(late.body.code, "lease_lost");
  const renew = await call("POST", `/p1/jobs/${encodeURIComponent(key)}/renew`, { instance: "i1", attempt: 1 });
  assert.equal(renew.status, 409);
  const hb = await call("PUT", "/p1", { instance: "i1", kinds: [kind], held: [{ key, attempt: 1 }] });
  assert.deepEqual(hb.body.lost, [{ key, attempt: 1, reason: "lease_lost" }]);
  const t = await client.get(key);
  assert.ok(!(t.workers ?? []).concat(t.history ?? []).some((a) => a.state === "SUCCESS"), "the late outcome is not recorded");
  const done = await call("POST", `/p2/jobs/${encodeURIComponent(key)}/finish`, { instance: "i2", attempt: 2, outcome: "succeeded" });
  assert.deepEqual(done.body, { state: "succeeded", outcome: "succeeded" });
  await fetch(`${base}/p1?instance=i1`, { method: "DELETE" });
  await fetch(`${base}/p2?instance=i2`, { method: "DELETE" });
});

test("registers again when a claim answers not_registered", async () => {
  const kind = unique("rereg");
  const id = unique("w-rereg");
  const infos: string[] = [];
  const w = await startWorker({ id, claimWaitMs: 200, logger: { info: (m) => infos.push(m) }, handlers: { [kind]: async () => "ok" } });
  const res = await fetch(`${serve.url}/api/v1/workers/${id}?instance=${w.instance}`, { method: "DELETE" });
  assert.equal(res.status, 200);
  await waitFor("registering again", () => (infos.some((m) => /not registered .*registering again/.test(m)) ? true : undefined));
  const key = unique("rereg-task");
  await client.publish({ key, kind });
  const t = await stateOf(key, "succeeded");
  assert.equal((t.workers ?? [])[0].instance, w.instance);
  assert.ok((await client.workers()).some((r) => r.id === id && r.live));
});

test("a serve that dies costs a reconnect to the next URL, no attempt", async () => {
  const dying = await startServe({ db: serve.db });
  const kind = unique("failover");
  const id = unique("w-failover");
  const w = await startWorker({
    id,
    url: [dying.url, serve.url],
    handlers: {
      [kind]: async (job: Job) => {
        const ms = (job.payload as { ms?: number } | null)?.ms ?? 0;
        await new Promise((r) => setTimeout(r, ms));
        return { url: w.url };
      },
    },
  });
  try {
    assert.equal(w.url, dying.url);
    const long = unique("long");
    // Renewed every 100 ms, through the kill.
    await client.publish({ key: long, kind, payload: { ms: 1200 }, pingInterval: 100, workerTimeout: 3000 });
    await stateOf(long, "running");
    await dying.stop("SIGKILL");
    const keys = Array.from({ length: 10 }, (_, i) => `${kind}-${i}`);
    await client.publishMany(keys.map((key) => ({ key, kind })));
    for (const key of [long, ...keys]) {
      const t = await stateOf(key, "succeeded");
      assert.equal(t.attempts, 1, `${key}: one attempt, none lost to the dead serve`);
    }
    assert.equal(w.url, serve.url);
  } finally {
    await dying.stop();
  }
});

test("bad options are refused naming the field", () => {
  assert.throws(() => new Worker({ url: serve.url, id: "", handlers: { a: async () => 1 } }), /^TypeError: id: /);
  assert.throws(() => new Worker({ url: serve.url, id: "x", handlers: { a: async () => 1 }, kinds: ["b"] }), /kinds\[0\]: no handler for kind "b"/);
  assert.throws(() => new Worker({ url: serve.url, id: "x", handlers: { a: async () => 1 }, concurrency: 0 }), /concurrency: /);
  assert.throws(() => new Worker({ url: "", id: "x", handlers: { a: async () => 1 } }), /url: /);
  assert.ok(new LeasepoolError(409, "m", "lease_lost").code === "lease_lost");
});

test("a worker token runs its kinds and reads nothing", async () => {
  const secured = await startServe({ env: { LEASEPOOL_TOKEN: "full", LEASEPOOL_WORKER_TOKEN: "wt", LEASEPOOL_WORKER_KINDS: "allowed" } });
  try {
    const admin = new Client({ url: secured.url, token: "full" });
    const w = new Worker({ url: secured.url, token: "wt", id: unique("w-token"), logger: {}, handlers: { allowed: async () => ({ ok: true }) } });
    workers.push(w);
    await w.start();
    const key = unique("token-task");
    await admin.publish({ key, kind: "allowed" });
    const t = await waitFor("the worker token's task to succeed", async () => {
      const doc = await admin.get(key);
      return doc.state === "succeeded" ? doc : undefined;
    });
    assert.deepEqual((t.workers ?? [])[0].result, { ok: true });
    const asWorker = new Client({ url: secured.url, token: "wt" });
    await assert.rejects(asWorker.list(), (err: unknown) => err instanceof LeasepoolError && err.status === 403);
    const outside = new Worker({ url: secured.url, token: "wt", id: unique("w-outside"), logger: {}, handlers: { other: async () => 1 } });
    await assert.rejects(outside.start(), (err: unknown) => {
      assert.ok(err instanceof LeasepoolError);
      assert.equal(err.status, 403);
      assert.match(err.message, /^register w-outside-.*: kinds\[0\]: "other" is not among this credential's kinds/);
      return true;
    });
    const unauthorized = new Worker({ url: secured.url, token: "wrong", id: unique("w-wrong"), logger: {}, handlers: { allowed: async () => 1 } });
    await assert.rejects(unauthorized.start(), (err: unknown) => err instanceof LeasepoolError && err.status === 401);
    await w.stop();
  } finally {
    await secured.stop();
  }
});
