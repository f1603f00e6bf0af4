import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Client, LeasepoolError, type LeasepoolEvent } from "../src/index.js";
import { cleanup, startServe, unique, waitFor, type Serve } from "./helpers.js";

let serve: Serve;
let client: Client;

before(async () => {
  serve = await startServe();
  client = new Client({ url: serve.url });
});
after(async () => {
  await serve?.stop();
  cleanup();
});

async function rejectsWith(p: Promise<unknown>, status: number, code: string, message: RegExp): Promise<LeasepoolError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof LeasepoolError, `not a LeasepoolError: ${String(err)}`);
    assert.equal(err.status, status, err.message);
    assert.equal(err.code, code, err.message);
    assert.match(err.message, message);
    return err;
  }
  assert.fail(`resolved; want a ${status} ${code}`);
}

test("publish maps every option onto the stored document", async () => {
  const key = unique("opts");
  const runAt = new Date(Date.now() + 3600_000);
  const res = await client.publish({
    key,
    kind: "ts-opts",
    payload: { n: 1, s: "x" },
    priority: 7,
    runAt,
    specificWorkerIds: ["w-a", "w-b"],
    concurrentWorkerCnt: 2,
    successWorkerCnt: 2,
    maxUnexpectedRetries: 5,
    pingInterval: 250,
    workerTimeout: "2s",
    lockKeys: ["db", "disk"],
  });
  assert.equal(res.result, "inserted");
  assert.ok(res.warnings && res.warnings.length > 0, "no live worker runs ts-opts: a warning says so");
  const t = await client.get(key);
  assert.deepEqual(t.payload, { n: 1, s: "x" });
  assert.equal(t.priority, 7);
  assert.equal(new Date(t.run_at).getTime(), runAt.getTime());
  assert.deepEqual(t.specific_worker_ids, ["w-a", "w-b"]);
  assert.equal(t.concurrent_worker_cnt, 2);
  assert.equal(t.success_worker_cnt, 2);
  assert.equal(t.max_unexpected_retries, 5);
  assert.equal(t.ping_interval, "250ms");
  assert.equal(t.worker_timeout, "2s");
  assert.deepEqual(t.lock_keys, ["db", "disk"]);
  assert.equal(t.state, "pending");

  const again = await client.publish({ key, kind: "ts-opts" });
  assert.equal(again.result, "existing");

  const delayed = await client.publish({ key: unique("delay"), kind: "ts-opts", delay: 60_000, maxUnexpectedRetries: 0 });
  const runsIn = new Date(delayed.task.run_at).getTime() - Date.now();
  assert.ok(runsIn > 50_000 && runsIn <= 60_000, `delay 60 s runs in ${runsIn} ms`);
  assert.equal(delayed.task.max_unexpected_retries, 0, "0 retries is stored as none");
  assert.equal(res.task.max_unexpected_retries, 5);
  const dflt = await client.publish({ key: unique("dflt"), kind: "ts-opts" });
  assert.equal(dflt.task.max_unexpected_retries, 3, "absent takes the default");
});

test("publish with debounce replaces a pending task's payload; bad debounce names the field", async () => {
  const key = unique("debounce");
  const first = await client.publish({ key, kind: "ts-debounce", payload: { n: 1 }, debounce: "1m" });
  assert.equal(first.result, "inserted");
  const second = await client.publish({ key, kind: "ts-debounce", payload: { n: 2 }, debounce: 60_000 });
  assert.equal(second.result, "debounced");
  assert.deepEqual((await client.get(key)).payload, { n: 2 });
  assert.ok(new Date(second.task.run_at).getTime() > new Date(first.task.run_at).getTime(), "run_at moved");
  const many = await client.publishMany([
    { key, kind: "ts-debounce", payload: { n: 3 }, debounce: "1m" },
    { key, kind: "ts-debounce", payload: { n: 4 }, debounce: "0s" },
  ]);
  assert.equal(many.debounced, 1);
  assert.equal(many.refused, 1);
  assert.match(many.results[1].error ?? "", /^tasks\[1\]\.debounce: /);
  assert.deepEqual((await client.get(key)).payload, { n: 3 });
  await rejectsWith(client.publish({ key: unique("bad"), kind: "ts", debounce: "-1s" }), 400, "invalid", /^debounce: /);
});

test("publish: strict refuses a kind no worker runs; bad input names the field", async () => {
  await rejectsWith(client.publish({ key: unique("strict"), kind: "nobody-runs-this" }, { strict: true }), 400, "invalid", /kind/);
  await rejectsWith(client.publish({ key: unique("bad"), kind: "ts", pingInterval: 1 }), 400, "invalid", /^ping_interval: /);
  await assert.rejects(client.publish({ key: "k", kind: "ts", priorty: 1 } as never), /priorty: unknown option/);
  await assert.rejects(client.publish({ key: "k", kind: "ts", delay: -5 }), /delay: must be a non-negative/);
});

test("publishMany answers each item's outcome in order, across chunks", async () => {
  const prefix = unique("many");
  const tasks = Array.from({ length: 25 }, (_, i) => ({ key: `${prefix}-${String(i).padStart(2, "0")}`, kind: "ts-many", payload: { i } }));
  tasks[12] = { key: `${prefix}-03`, kind: "ts-many", payload: { i: 12 } }; // a second of key 03
  tasks[17] = { key: `${prefix}-17`, kind: "", payload: { i: 17 } }; // refused
  const res = await client.publishMany(tasks, { chunkSize: 10 });
  assert.equal(res.results.length, 25);
  assert.equal(res.inserted, 23);
  assert.equal(res.existing, 1);
  assert.equal(res.refused, 1);
  assert.equal(res.failed, 0);
  assert.equal(res.results[3].result, "inserted");
  assert.equal(res.results[12].result, "existing");
  assert.equal(res.results[12].key, `${prefix}-03`);
  assert.equal(res.results[17].result, "refused");
  assert.match(res.results[17].error ?? "", /^tasks\[17\]\.kind: /, "the index is the item's in the whole call, not in its chunk");
  assert.equal(res.results[24].key, `${prefix}-24`);
  const stored = await client.get(`${prefix}-24`);
  assert.deepEqual(stored.payload, { i: 24 });
  await rejectsWith(client.get(`${prefix}-17`), 404, "not_found", /not found/);
});

test("publishMany splits past the server's 10,000 tasks per request", async () => {
  const prefix = unique("big");
  const tasks = Array.from({ length: 10001 }, (_, i) => ({ key: `${prefix}-${i}`, kind: "ts-big" }));
  // One request that large is refused whole: the split is needed.
  const raw = await fetch(`${serve.url}/api/v1/tasks/batch`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ tasks: tasks.map((t) => ({ key: `raw-${t.key}`, kind: t.kind })) }),
  });
  assert.equal(raw.status, 413);
  await rejectsWith(client.get(`raw-${prefix}-0`), 404, "not_found", /not found/);
  const res = await client.publishMany(tasks);
  assert.equal(res.inserted, 10001);
  assert.equal(res.results.length, 10001);
  assert.deepEqual(res.results[10000], { key: `${prefix}-10000`, result: "inserted", state: "pending" });
  assert.equal((await client.get(`${prefix}-10000`)).state, "pending");
});

test("list pages with cursors; listAll walks every page once", async () => {
  const prefix = unique("list");
  const keys = Array.from({ length: 7 }, (_, i) => `${prefix}-${i}`);
  // One by one: a batch's items may take their publish sequence in any order.
  for (const key of keys) await client.publish({ key, kind: "ts-list" });
  await client.publish({ key: `${unique("other")}`, kind: "ts-list" });

  const first = await client.list({ keyPrefix: prefix, limit: 3 });
  assert.deepEqual(first.tasks.map((t) => t.key), [keys[6], keys[5], keys[4]]);
  assert.ok(first.nextCursor);
  assert.equal(first.prevCursor, undefined);
  const second = await client.list({ keyPrefix: prefix, limit: 3, cursor: first.nextCursor });
  assert.deepEqual(second.tasks.map((t) => t.key), [keys[3], keys[2], keys[1]]);
  assert.ok(second.prevCursor);
  const back = await client.list({ keyPrefix: prefix, limit: 3, cursor: second.prevCursor });
  assert.deepEqual(back.tasks.map((t) => t.key), first.tasks.map((t) => t.key));

  const walked: string[] = [];
  for await (const t of client.listAll({ keyPrefix: prefix, limit: 2, order: "asc" })) walked.push(t.key);
  assert.deepEqual(walked, keys);
  let pages = 0;
  for await (const p of client.pages({ keyPrefix: prefix, limit: 2 })) {
    pages++;
    assert.ok(p.tasks.length <= 2);
  }
  assert.equal(pages, 4);

  const none = await client.list({ keyPrefix: prefix, state: "running" });
  assert.deepEqual(none.tasks, []);
  await rejectsWith(client.list({ limit: 5000 }), 400, "invalid", /limit/);
});

test("cancel and retry answer the task; a refused one is a 409", async () => {
  const key = unique("cancel");
  await client.publish({ key, kind: "ts-cancel" });
  const cancelled = await client.cancel(key);
  assert.equal(cancelled.state, "cancelled");
  await rejectsWith(client.cancel(key), 409, "conflict", /cancel/);
  const retried = await client.retry(key);
  assert.equal(retried.state, "pending");
  assert.equal((await client.get(key)).state, "pending");
  await rejectsWith(client.cancel(unique("nope")), 404, "not_found", /not found/);
  await rejectsWith(client.get("leasepool:control"), 404, "not_found", /./);
});

test("keys are escaped as one path segment", async () => {
  const key = `${unique("odd")}/a b?c#d%`;
  await client.publish({ key, kind: "ts-odd" });
  const t = await client.get(key);
  assert.equal(t.key, key);
  assert.equal((await client.cancel(key)).key, key);
});

/**
 * Reads it in the background into got, and publishes markers of kind until
 * one arrives: then the stream is surely followed (it starts from now).
 */
async function following(it: AsyncIterator<LeasepoolEvent>, kind: string, got: LeasepoolEvent[]): Promise<{ reading: Promise<void> }> {
  const reading = (async () => {
    for (;;) {
      const r = await it.next();
      if (r.done) return;
      got.push(r.value);
    }
  })();
  reading.catch(() => {});
  const marker = unique("marker");
  let n = 0;
  await waitFor("the stream to follow", async () => {
    if (got.some((e) => e.key.startsWith(marker))) return true;
    await client.publish({ key: `${marker}-${n++}`, kind });
    return undefined;
  });
  // Wrapped: an async function's returned promise would be awaited.
  return { reading };
}

test("events follows the stream with filters, from since", async () => {
  const kind = unique("ev");
  const ctl = new AbortController();
  const got: LeasepoolEvent[] = [];
  const { reading } = await following(client.events({ kind, signal: ctl.signal }), kind, got);
  const k1 = unique("e1");
  await client.publish({ key: k1, kind });
  await client.publish({ key: unique("noise"), kind: unique("other-kind") });
  await client.cancel(k1);
  const k2 = unique("e2");
  await client.publish({ key: k2, kind });
  const mine = await waitFor("three events", () => {
    const m = got.filter((e) => e.key === k1 || e.key === k2);
    return m.length >= 3 ? m : undefined;
  });
  assert.deepEqual(mine.map((e) => `${e.event} ${e.key}`), [`published ${k1}`, `cancelled ${k1}`, `published ${k2}`]);
  assert.ok(got.every((e) => e.kind === kind), "the kind filter keeps the other kind out");
  ctl.abort();
  await reading;

  // since resumes right after an event; type filters.
  const resumed: LeasepoolEvent[] = [];
  for await (const e of client.events({ since: mine[0].token, kind })) {
    resumed.push(e);
    if (resumed.length === 2) break;
  }
  assert.deepEqual(resumed.map((e) => e.token), [mine[1].token, mine[2].token]);
  const typed: LeasepoolEvent[] = [];
  for await (const e of client.events({ since: mine[0].token, kind, type: ["published"] })) {
    typed.push(e);
    break;
  }
  assert.equal(typed[0].key, k2);

  const bad = client.events({ since: "not-a-token!" });
  await rejectsWith(bad.next(), 400, "invalid", /since/);
});

test("events resumes from the last id on another serve when its serve dies", async () => {
  const second = await startServe({ db: serve.db });
  const dying = await startServe({ db: serve.db });
  try {
    const kind = unique("resume");
    const c = new Client({ url: [dying.url, second.url] });
    let reconnects = 0;
    const ctl = new AbortController();
    const got: LeasepoolEvent[] = [];
    const { reading } = await following(c.events({ kind, signal: ctl.signal, onReconnect: () => reconnects++ }), kind, got);
    await dying.stop("SIGKILL");
    const k2 = unique("r2");
    const k3 = unique("r3");
    await client.publish({ key: k2, kind });
    await client.publish({ key: k3, kind });
    await waitFor("r3 on the stream", () => (got.some((e) => e.key === k3) ? true : undefined));
    const tokens = got.map((e) => e.token);
    assert.equal(new Set(tokens).size, tokens.length, "no event twice across the drop");
    assert.deepEqual(got.slice(-2).map((e) => e.key), [k2, k3], "nothing lost across the drop");
    assert.ok(reconnects >= 1);
    assert.equal(c.url, second.url);
    ctl.abort();
    await reading;
  } finally {
    await dying.stop();
    await second.stop();
  }
});

test("a token is sent as a bearer; without it a 401", async () => {
  const secured = await startServe({ env: { LEASEPOOL_TOKEN: "s3cret" } });
  try {
    await rejectsWith(new Client({ url: secured.url }).list(), 401, "unauthorized", /./);
    const page = await new Client({ url: secured.url, token: "s3cret" }).list();
    assert.deepEqual(page.tasks, []);
  } finally {
    await secured.stop();
  }
});

test("an unreachable server is a LeasepoolError with status 0", async () => {
  const gone = await startServe();
  const url = gone.url;
  await gone.stop();
  await rejectsWith(new Client({ url }).list(), 0, "unreachable", /cannot reach/);
  assert.throws(() => new Client({ url: "ftp://x" }), /url: .* must be http or https/);
});
