#!/usr/bin/env python3
"""A worker that records what it does, for end-to-end tests.

    python3 record_worker.py --url URL[,URL2] --id ID --kinds k1,k2 \
        --concurrency N --record FILE [--token T] [--grace SECONDS]

For every job it appends one JSON line per event to FILE, each with one
write to a file opened O_APPEND so that processes sharing FILE never
interleave lines: "start" when the handler starts, "end" right before it
returns, "abort" when the job's cancel event fires. The handler waits
payload["ms"] milliseconds (default 0) on the cancel event, raising if it
fires, and returns {"worker": ID}. Prints "ready" once registered; stops
gracefully on SIGTERM.
"""

import argparse
import json
import os
import sys
import threading
import time
from typing import Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from leasepool import Job, Worker  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server URL, or several comma-separated")
    p.add_argument("--id", required=True, help="worker id")
    p.add_argument("--kinds", required=True, help="comma-separated kinds to run")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--record", required=True, help="file to append the events to")
    p.add_argument("--token", default=None)
    p.add_argument("--grace", type=float, default=None,
                   help="seconds handlers may run on after SIGTERM before they are cancelled (default: the worker's)")
    args = p.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds:
        p.error("--kinds: give at least one kind")
    if args.concurrency < 1:
        p.error(f"--concurrency: must be at least 1, got {args.concurrency}")
    if args.grace is not None and args.grace < 0:
        p.error(f"--grace: must not be negative, got {args.grace}")

    fd = os.open(args.record, os.O_APPEND | os.O_WRONLY | os.O_CREAT, 0o644)
    pid = os.getpid()

    def record(event: str, job: Job) -> None:
        line = {"event": event, "key": job.key, "attempt": job.attempt, "worker": args.id,
                "pid": pid, "t": int(time.time() * 1000)}
        os.write(fd, (json.dumps(line) + "\n").encode())

    def handle(job: Job) -> Dict[str, str]:
        record("start", job)
        ms = 0
        if isinstance(job.payload, dict):
            ms = job.payload.get("ms") or 0
        if job.cancelled.wait(ms / 1000):
            record("abort", job)
            raise RuntimeError(f"cancelled: {job.cancel_reason}")
        record("end", job)
        return {"worker": args.id}

    options = {} if args.grace is None else {"grace": args.grace}
    worker = Worker(args.url, args.id, {k: handle for k in kinds}, concurrency=args.concurrency, token=args.token, **options)

    def announce() -> None:
        if worker.wait_ready():
            print("ready", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    worker.run()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
