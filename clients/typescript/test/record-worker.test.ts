import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Client, Worker, type Job, type Task } from "../src/index.js";
import { cleanup, startServe, tempDir, unique, waitFor, type Serve } from "./helpers.js";

// The example runs from dist/, which scripts/test builds first.
const program = resolve(__dirname, "..", "..", "examples", "record-worker.js");

let serve: Serve;
let client: Client;
const procs: ChildProcess[] = [];
const workers: Worker[] = [];

before(async () => {
  serve = await startServe();
  client = new Client({ url: serve.url });
});
after(async () => {
  for (const p of procs) {
    if (p.exitCode === null && p.signalCode === null) {
      p.kill("SIGCONT");
      p.kill("SIGKILL");
    }
  }
  await Promise.all(workers.map((w) => w.stop()));
  await serve?.stop();
  cleanup();
});

interface Record {
  event: "start" | "end" | "abort";
  key: string;
  attempt: number;
  worker: string;
  pid: number;
  t: number;
}

function records(file: string): Record[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Record);
}

interface Running {
  proc: ChildProcess;
  stdout(): string;
  stderr(): string;
  exited: Promise<number | null>;
}

async function startRecordWorker(args: string[]): Promise<Running> {
  const proc = spawn(process.execPath, [program, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  procs.push(proc);
  let out = "";
  let err = "";
  proc.stdout.on("data", (c) => (out += c.toString()));
  proc.stderr.on("data", (c) => (err += c.toString()));
  const exited = new Promise<number | null>((r) => proc.once("exit", (code) => r(code)));
  await waitFor(`ready from record-worker\n${err}`, () => {
    if (proc.exitCode !== null) throw new Error(`record-worker exited ${proc.exitCode}: ${err}`);
    return out.split("\n").includes("ready") ? true : undefined;
  });
  return { proc, stdout: () => out, stderr: () => err, exited };
}

async function stateOf(key: string, want: string): Promise<Task> {
  return waitFor(`${key} ${want}`, async () => {
    const t = await client.get(key);
    return t.state === want ? t : undefined;
  });
}

test("record-worker records each job's start and end, and stops on SIGTERM", async () => {
  const file = join(tempDir(), "records.jsonl");
  const kind = unique("rec");
  const id = unique("rw");
  const rw = await startRecordWorker(["--url", serve.url, "--id", id, "--kinds", `${kind},other`, "--concurrency", "3", "--record", file, "--grace-ms", "100"]);
  const keys = Array.from({ length: 6 }, (_, i) => `${kind}-${i}`);
  await client.publishMany(keys.map((key) => ({ key, kind, payload: { ms: 30 } })));
  for (const key of keys) {
    const t = await stateOf(key, "succeeded");
    assert.deepEqual((t.workers ?? [])[0].result, { worker: id });
  }
  const recs = records(file);
  for (const key of keys) {
    const mine = recs.filter((r) => r.key === key);
    assert.deepEqual(mine.map((r) => r.event), ["start", "end"], key);
    for (const r of mine) {
      assert.equal(r.attempt, 1);
      assert.equal(r.worker, id);
      assert.equal(r.pid, rw.proc.pid);
    }
    assert.ok(mine[1].t - mine[0].t >= 29, `${key} slept its payload's ms`);
  }

  const long = unique("rec-long");
  await client.publish({ key: long, kind, payload: { ms: 60000 } });
  await waitFor("the long job's start", () => (records(file).some((r) => r.key === long && r.event === "start") ? true : undefined));
  rw.proc.kill("SIGTERM");
  assert.equal(await rw.exited, 0, rw.stderr());
  const last = records(file).filter((r) => r.key === long);
  assert.deepEqual(last.map((r) => r.event), ["start", "abort"]);
  const t = await client.get(long);
  assert.equal(t.state, "pending");
  assert.equal((t.workers ?? []).concat(t.history ?? []).find((a) => a.attempt === 1)?.state, "RELEASED");
});

test("on SIGTERM a running handler finishes within the grace, and the process exits then", async () => {
  const file = join(tempDir(), "records.jsonl");
  const id = unique("graceful");
  const kind = unique("graceful-kind");
  const key = unique("graceful-task");
  const rw = await startRecordWorker(["--url", serve.url, "--id", id, "--kinds", kind, "--record", file]);
  assert.ok((await client.workers()).some((r) => r.id === id && r.live));
  await client.publish({ key, kind, payload: { ms: 300 } });
  await waitFor("the start", () => (records(file).some((r) => r.key === key && r.event === "start") ? true : undefined));
  const t0 = Date.now();
  rw.proc.kill("SIGTERM");
  assert.equal(await rw.exited, 0, rw.stderr());
  const took = Date.now() - t0;
  // The default grace is 10 s: a timer of it left behind would hold the process.
  assert.ok(took < 5000, `exited ${took} ms after SIGTERM`);
  assert.deepEqual(records(file).map((r) => r.event), ["start", "end"]);
  assert.equal((await client.get(key)).state, "succeeded");
  assert.ok(!(await client.workers()).some((r) => r.id === id && r.live), "unregistered");
});

test("record-worker refuses a bad command line naming the flag", async () => {
  const proc = spawn(process.execPath, [program, "--url", serve.url, "--id", "x", "--kinds", "k", "--concurrency", "0", "--record", "/dev/null"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let err = "";
  proc.stderr.on("data", (c) => (err += c.toString()));
  const code = await new Promise<number | null>((r) => proc.once("exit", (c) => r(c)));
  assert.equal(code, 2);
  assert.match(err, /--concurrency: /);
});

test("a frozen worker's handler is aborted on resume and its outcome never recorded", async () => {
  const file = join(tempDir(), "records.jsonl");
  const kind = unique("freeze");
  const key = unique("freeze-task");
  const frozenId = unique("frozen");
  const rw = await startRecordWorker(["--url", serve.url, "--id", frozenId, "--kinds", kind, "--concurrency", "1", "--record", file]);
  await client.publish({ key, kind, payload: { ms: 30000 }, pingInterval: 100, workerTimeout: 1500 });
  await waitFor("the frozen worker's start", () => (records(file).some((r) => r.key === key && r.event === "start") ? true : undefined));
  rw.proc.kill("SIGSTOP");
  // Another worker takes the task over once the lease ends, and finishes it.
  const other = new Worker({ url: serve.url, id: unique("taker"), logger: {}, handlers: { [kind]: async (job: Job) => ({ taker: job.attempt }) } });
  workers.push(other);
  await other.start();
  const t = await stateOf(key, "succeeded");
  rw.proc.kill("SIGCONT");
  const abort = await waitFor("the frozen handler's abort", () => records(file).find((r) => r.key === key && r.attempt === 1 && r.event === "abort"));
  assert.equal(abort.worker, frozenId);
  const all = (t.workers ?? []).concat(t.history ?? []);
  assert.equal(all.find((a) => a.state === "SUCCESS")?.attempt, 2);
  assert.deepEqual(all.find((a) => a.state === "SUCCESS")?.result, { taker: 2 });
  // The frozen worker writes nothing for attempt 1 once resumed.
  rw.proc.kill("SIGTERM");
  assert.equal(await rw.exited, 0, rw.stderr());
  const after = await client.get(key);
  assert.equal(after.version, t.version, "no write after the takeover's finish");
  assert.match(rw.stderr(), /no renew succeeded for 1500 ms: lease lost/);
});
