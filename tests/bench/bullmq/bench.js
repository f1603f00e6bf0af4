// BullMQ on Redis, measured the way `leasepool bench` measures leasepool
// (and tests/bench/peerbench measures River and Asynq): publish-to-start
// latency across processes, one worker process's throughput, takeover after
// SIGKILL, worker memory. Default Queue, Worker and job options; the worker
// sets only concurrency, the figure under test.
//
//   node bench.js --url redis://127.0.0.1:PORT/1 --out DIR [--quick] [--pending N] [--takeover-cap S]
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { parseArgs } = require('node:util');
const { Queue } = require('bullmq');

const { values: args } = parseArgs({
  options: {
    url: { type: 'string' },
    out: { type: 'string', default: '.' },
    quick: { type: 'boolean', default: false },
    tasks: { type: 'string', default: '20000' },
    'latency-tasks': { type: 'string', default: '2000' },
    concurrency: { type: 'string', default: '32' },
    runs: { type: 'string', default: '3' },
    pending: { type: 'string', default: '100000' },
    'takeover-cap': { type: 'string', default: '180' },
    'throughput-only': { type: 'boolean', default: false },
  },
});
if (args.quick) Object.assign(args, { tasks: '2000', runs: '1', pending: '10000' });

const QUEUE = 'bench';
const u = new URL(args.url);
const connection = { host: u.hostname, port: Number(u.port), db: Number(u.pathname.slice(1) || 0) };
const now = () => process.hrtime.bigint(); // the workers' clock too
const ms = (ns) => Number(ns) / 1e6;
const sleep = (t) => new Promise((r) => setTimeout(r, t));
const log = (m) => console.error(`[bullmq] ${m}`);

const report = {
  system: 'bullmq',
  store: 'Redis',
  versions: {},
  settings_changed: [],
  latency_tasks: Number(args['latency-tasks']),
  publish_to_start_cross_process_p50_ms: 0,
  publish_to_start_cross_process_p90_ms: 0,
  publish_to_start_cross_process_p99_ms: 0,
  publish_to_start_cross_process_max_ms: 0,
  throughput_tasks: Number(args.tasks),
  concurrency: Number(args.concurrency),
  throughput_runs_per_s: [],
  throughput_worker_process_per_s: 0,
  takeover_after_sigkill_ms: null,
  takeover_cap_ms: Number(args['takeover-cap']) * 1000,
  takeover_note: 'default: lockDuration 30 s, stalledInterval 30 s, maxStalledCount 1',
  latency_note: 'workers wait on Redis with a blocking call (drainDelay default 5 s), woken by a marker on add',
  worker_peak_rss_throughput_bytes: 0,
  worker_rss_idle_bytes: 0,
  pending_tasks: Number(args.pending),
  worker_rss_with_pending_bytes: 0,
};

let round = 0;
function spawnWorker(name, concurrency, record) {
  round++;
  const rec = path.join(args.out, `bullmq-${round}-${name}.rec`);
  fs.rmSync(rec, { force: true });
  const logFd = fs.openSync(path.join(args.out, `bullmq-${round}-${name}.log`), 'w');
  const child = spawn(process.execPath, [path.join(__dirname, 'worker.js'), '--url', args.url, '--queue', QUEUE,
    '--concurrency', String(concurrency), '--record', record ? rec : ''], { stdio: ['ignore', logFd, logFd] });
  fs.closeSync(logFd);
  let exited = false;
  const done = new Promise((r) => child.on('exit', () => { exited = true; r(); }));
  return {
    record: rec,
    pid: child.pid,
    exited: () => exited,
    rss: (field) => procRSS(child.pid, field),
    kill: async () => { child.kill('SIGKILL'); await done; },
    stop: async () => {
      if (exited) return;
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 15000);
      await done;
      clearTimeout(t);
    },
  };
}

function procRSS(pid, field) {
  try {
    const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(new RegExp(`^${field}:\\s*(\\d+) kB`, 'm'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

function readRecord(file) {
  const starts = new Map();
  let ready = false;
  let data = '';
  try { data = fs.readFileSync(file, 'utf8'); } catch { /* not yet */ }
  for (const line of data.split('\n')) {
    const [id, ns] = line.trim().split(' ');
    if (!ns || !/^\d+$/.test(ns)) continue;
    if (id === 'ready') ready = true;
    else if (!starts.has(id)) starts.set(id, BigInt(ns));
  }
  return { starts, ready };
}

async function poll(limitMs, done) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    if (await done()) return true;
    if (Date.now() > deadline) return false;
    await sleep(5);
  }
}

// Nearest rank, as leasepool bench.
function pct(sorted, p) {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.floor((sorted.length * p + 99) / 100) - 1));
  return sorted[i];
}

async function busy(queue) {
  const c = await queue.getJobCounts('wait', 'active', 'prioritized');
  return c.wait + c.active + c.prioritized > 0;
}

async function publishMany(queue, n, delay) {
  for (let done = 0; done < n;) {
    const k = Math.min(1000, n - done);
    const jobs = Array.from({ length: k }, () => ({ name: 'noop', data: {}, opts: delay ? { delay } : undefined }));
    await queue.addBulk(jobs);
    done += k;
  }
}

async function latency(queue) {
  const w = spawnWorker('latency', 8, true);
  try {
    if (!(await poll(30000, () => readRecord(w.record).ready || w.exited()))) throw new Error('worker not ready');
    if (w.exited()) throw new Error('worker exited');
    await sleep(500); // idle
    const n = report.latency_tasks;
    const published = new Map();
    const gap = 2_000_000n;
    let next = now();
    for (let i = 0; i < n; i++) {
      const job = await queue.add('noop', {});
      published.set(String(job.id), now());
      next += gap;
      const wait = Number(next - now()) / 1e6;
      if (wait > 0) await sleep(wait); // setTimeout granularity is 1 ms
    }
    let starts;
    const ok = await poll(60000, () => (starts = readRecord(w.record).starts).size >= n);
    if (!ok) throw new Error(`${starts.size} of ${n} jobs started`);
    const lat = [];
    for (const [id, p] of published) if (starts.has(id)) lat.push(ms(starts.get(id) - p));
    lat.sort((a, b) => a - b);
    report.publish_to_start_cross_process_p50_ms = pct(lat, 50);
    report.publish_to_start_cross_process_p90_ms = pct(lat, 90);
    report.publish_to_start_cross_process_p99_ms = pct(lat, 99);
    report.publish_to_start_cross_process_max_ms = pct(lat, 100);
    fs.writeFileSync(path.join(args.out, 'bullmq.samples.json'), JSON.stringify(lat) + '\n');
  } finally {
    await w.stop();
  }
}

async function throughput(queue) {
  const runs = [];
  for (let run = 0; run < Number(args.runs); run++) {
    const n = report.throughput_tasks;
    log(`throughput run ${run + 1}/${args.runs}: publishing ${n}`);
    await publishMany(queue, n, 0);
    log(`throughput run ${run + 1}/${args.runs}: draining`);
    const start = now();
    const w = spawnWorker('throughput', report.concurrency, false);
    const ok = await poll(300000, async () => !(await busy(queue)));
    const elapsed = now() - start;
    report.worker_peak_rss_throughput_bytes = Math.max(report.worker_peak_rss_throughput_bytes, w.rss('VmHWM'));
    await w.stop();
    if (!ok) throw new Error('throughput: timed out');
    runs.push(n / (Number(elapsed) / 1e9));
  }
  report.throughput_runs_per_s = [...runs];
  runs.sort((a, b) => a - b);
  report.throughput_worker_process_per_s = pct(runs, 50);
}

async function takeover(queue) {
  const job = await queue.add('sleep', {});
  const id = String(job.id);
  const holder = spawnWorker('holder', 1, true);
  let peer;
  try {
    let startedAt;
    if (!(await poll(30000, () => (startedAt = readRecord(holder.record).starts.get(id)) !== undefined))) {
      throw new Error('holder never started the job');
    }
    peer = spawnWorker('peer', 1, true);
    const wait = Number(startedAt + 3_000_000_000n - now()) / 1e6;
    if (wait > 0) await sleep(wait);
    report.worker_rss_idle_bytes = peer.rss('VmRSS');
    const killed = now();
    await holder.kill();
    log(`takeover: holder killed; waiting up to ${args['takeover-cap']} s for the peer`);
    let took;
    if (await poll(report.takeover_cap_ms, () => (took = readRecord(peer.record).starts.get(id)) !== undefined)) {
      report.takeover_after_sigkill_ms = ms(took - killed);
    }
  } finally {
    await holder.stop();
    if (peer) await peer.kill();
    await queue.obliterate({ force: true });
  }
}

async function pendingMemory(queue) {
  const n = report.pending_tasks;
  if (n === 0) return;
  log(`publishing ${n} delayed jobs`);
  await publishMany(queue, n, 3600_000);
  const w = spawnWorker('pending', report.concurrency, false);
  try {
    await sleep(3000);
    report.worker_rss_with_pending_bytes = w.rss('VmHWM');
  } finally {
    await w.stop();
    await queue.obliterate({ force: true });
  }
}

async function main() {
  const queue = new Queue(QUEUE, { connection });
  await queue.waitUntilReady();
  await queue.obliterate({ force: true });
  const { Redis } = require('ioredis');
  const rdb = new Redis(connection);
  const info = await rdb.info('server');
  rdb.disconnect();
  report.versions = {
    bullmq: require('bullmq/package.json').version,
    ioredis: require('ioredis/package.json').version,
    node: process.version,
    Redis: (info.match(/redis_version:(\S+)/) || [])[1],
  };
  let steps = [['latency across processes', latency], ['throughput', throughput],
    ['takeover', takeover], ['memory with pending jobs', pendingMemory]];
  if (args['throughput-only']) steps = steps.slice(1, 2);
  for (const [name, fn] of steps) {
    log(`${name}...`);
    await fn(queue);
  }
  await queue.close();
  fs.writeFileSync(path.join(args.out, 'bullmq.json'), JSON.stringify(report, null, 2) + '\n');
}

main().catch((err) => {
  console.error('bullmq bench:', err);
  process.exit(1);
});
