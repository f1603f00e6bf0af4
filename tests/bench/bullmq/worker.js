// A BullMQ worker process for bench.js, default Worker options but
// concurrency: appends "JOBID NS" to --record at each job start, NS from
// process.hrtime (CLOCK_MONOTONIC, one clock for every process of the host).
'use strict';
const fs = require('node:fs');
const { Worker } = require('bullmq');
const { parseArgs } = require('node:util');

const { values: args } = parseArgs({
  options: {
    url: { type: 'string' },
    queue: { type: 'string', default: 'bench' },
    concurrency: { type: 'string', default: '8' },
    record: { type: 'string', default: '' },
  },
});

const fd = args.record ? fs.openSync(args.record, 'a') : null;
function mark(id) {
  if (fd !== null) fs.writeSync(fd, `${id} ${process.hrtime.bigint()}\n`);
}

const u = new URL(args.url);
const connection = { host: u.hostname, port: Number(u.port), db: Number(u.pathname.slice(1) || 0) };

async function main() {
  const worker = new Worker(
    args.queue,
    async (job) => {
      mark(job.id);
      if (job.name === 'sleep') await new Promise((r) => setTimeout(r, 3600_000));
    },
    { connection, concurrency: Number(args.concurrency) },
  );
  worker.on('error', (err) => console.error('worker error:', err.message));
  await worker.waitUntilReady();
  mark('ready');
  const stop = async () => {
    await worker.close(true);
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
