#!/usr/bin/env node
// A worker that records what it does, for end-to-end tests.
//
//   node record-worker.js --url URL[,URL2] --id ID --kinds k1,k2 \
//       --concurrency N --record FILE [--token T] [--grace-ms MS]
//
// For every job it appends one JSON line per event to FILE, each with one
// write to a file opened O_APPEND, so that processes sharing FILE never
// interleave lines: "start" when the handler starts, "end" right before it
// returns, "abort" when the job's signal fires while it runs. The handler
// waits payload.ms milliseconds (default 0), rejecting if the signal fires,
// and returns {"worker": ID}. Prints "ready" once registered; stops
// gracefully on SIGTERM or SIGINT.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { Worker } = require(path.join(__dirname, "..", "dist", "index.js"));

function usage(message) {
  process.stderr.write(
    `record-worker: ${message}\n` +
      "usage: node record-worker.js --url URL[,URL2] --id ID --kinds k1,k2 --concurrency N --record FILE [--token T] [--grace-ms MS]\n",
  );
  process.exit(2);
}

function parseArgs(argv) {
  const known = new Set(["url", "id", "kinds", "concurrency", "record", "token", "grace-ms"]);
  const args = {};
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m || !known.has(m[1])) usage(`unknown argument ${JSON.stringify(argv[i])}`);
    let value = m[2];
    if (value === undefined) {
      if (i + 1 >= argv.length) usage(`--${m[1]}: needs a value`);
      value = argv[++i];
    }
    args[m[1]] = value;
  }
  for (const name of ["url", "id", "kinds", "record"]) {
    if (!args[name]) usage(`--${name}: required`);
  }
  return args;
}

const args = parseArgs(process.argv.slice(2));
const kinds = args.kinds.split(",").filter((k) => k !== "");
if (kinds.length === 0) usage("--kinds: give at least one kind");
const concurrency = args.concurrency === undefined ? 10 : Number(args.concurrency);
if (!Number.isInteger(concurrency) || concurrency < 1) usage("--concurrency: must be a whole number of at least 1");
const graceMs = args["grace-ms"] === undefined ? undefined : Number(args["grace-ms"]);
if (graceMs !== undefined && !(graceMs >= 0)) usage("--grace-ms: must be a number of milliseconds");

const fd = fs.openSync(args.record, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o644);

function record(event, job) {
  const line = { event, key: job.key, attempt: job.attempt, worker: args.id, pid: process.pid, t: Date.now() };
  // One write per line on an O_APPEND descriptor: lines of processes that
  // share the file never interleave.
  fs.appendFileSync(fd, JSON.stringify(line) + "\n");
}

async function handle(job) {
  record("start", job);
  const ms = job.payload && typeof job.payload === "object" && Number(job.payload.ms) > 0 ? Number(job.payload.ms) : 0;
  await new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      record("abort", job);
      reject(new Error(`aborted: ${String(job.signal.reason)}`));
    };
    const timer = setTimeout(() => {
      job.signal.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    if (job.signal.aborted) return onAbort();
    job.signal.addEventListener("abort", onAbort, { once: true });
  });
  record("end", job);
  return { worker: args.id };
}

const handlers = Object.fromEntries(kinds.map((k) => [k, handle]));
const worker = new Worker({
  url: args.url,
  token: args.token,
  id: args.id,
  kinds,
  concurrency,
  handlers,
  ...(graceMs === undefined ? {} : { graceMs }),
});

worker
  .start({ signals: true })
  .then(() => {
    process.stdout.write("ready\n");
    return worker.done;
  })
  .then(() => {
    fs.closeSync(fd);
  })
  .catch((err) => {
    process.stderr.write(`record-worker: ${err && err.stack ? err.stack : String(err)}\n`);
    process.exit(1);
  });
