"""examples/record_worker.py as the Go end-to-end test runs it: a real
Python process, its record file, and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import unittest
from typing import Any, Dict, List

from support import PYROOT, TempStore, closing, free_port, unique, wait_for

from leasepool import Client, Worker

PROGRAM = os.path.join(PYROOT, "examples", "record_worker.py")


class RecordWorkerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.store = TempStore()
        self.addCleanup(self.store.close)
        self.serve = self.store.serve()
        self.client = closing(self, Client(self.serve.url))
        self.record = os.path.join(self.store.dir, "record.jsonl")

    def start(self, wid: str, kinds: str, *extra: str) -> "subprocess.Popen[str]":
        # The second URL is refused: the worker must still get on with the first.
        dead = f"http://127.0.0.1:{free_port()}"
        stderr = open(os.path.join(self.store.dir, f"{wid}.log"), "w")
        self.addCleanup(stderr.close)
        p = subprocess.Popen(
            [sys.executable, PROGRAM, "--url", f"{self.serve.url},{dead}", "--id", wid, "--kinds", kinds,
             "--concurrency", "4", "--record", self.record, *extra],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd="/",
        )
        assert p.stdout is not None
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)  # a no-op once it has exited
        line = p.stdout.readline()
        if line != "ready\n":
            p.kill()
            p.wait()
            with open(stderr.name) as f:
                self.fail(f"{wid} said {line!r}, not ready: {f.read()[-2000:]}")
        return p

    def lines(self) -> List[Dict[str, Any]]:
        with open(self.record) as f:
            return [json.loads(line) for line in f]

    def test_records_each_job_and_releases_on_sigterm(self) -> None:
        kind = unique("rec")
        wid = unique("rw")
        p = self.start(wid, f"{kind},other", "--grace", "0.3")
        keys = [unique("q") for _ in range(20)]
        self.client.publish_many([{"key": k, "kind": kind} for k in keys])
        long_key = unique("long")
        self.client.publish(long_key, kind, {"ms": 60_000}, worker_timeout=30)
        wait_for(lambda: all(self.client.get(k)["state"] == "succeeded" for k in keys), "the quick tasks", timeout=20, every=0.1)
        wait_for(lambda: any(r["key"] == long_key and r["event"] == "start" for r in self.lines()), "the long task to start")
        for k in keys:
            t = self.client.get(k)
            self.assertEqual(t["workers"][-1]["result"], {"worker": wid})
            mine = [r for r in self.lines() if r["key"] == k]
            self.assertEqual([r["event"] for r in mine], ["start", "end"])
            for r in mine:
                self.assertEqual((r["worker"], r["pid"], r["attempt"]), (wid, p.pid, 1))
                self.assertIsInstance(r["t"], int)
            self.assertLessEqual(mine[0]["t"], mine[1]["t"])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(30), 0)
        events = [r["event"] for r in self.lines() if r["key"] == long_key]
        self.assertEqual(events, ["start", "abort"], "the cancel event fires once the grace has passed")
        t = self.client.get(long_key)
        self.assertEqual((t["state"], t["workers"][-1]["state"] if t["workers"] else t["history"][-1]["state"]), ("pending", "RELEASED"))

    def test_a_frozen_worker_never_records_its_outcome(self) -> None:
        # SIGSTOP past the lease: another worker takes the task and
        # succeeds. Resumed, the frozen worker's handler ends or aborts, and
        # whatever it sends is refused: only the holder's outcome is stored.
        kind, key = unique("frz"), unique("frz")
        p = self.start(unique("rw"), kind)
        self.client.publish(key, kind, {"ms": 2500}, worker_timeout=1, max_unexpected_retries=5)
        wait_for(lambda: any(r["key"] == key and r["event"] == "start" for r in self.lines()), "the handler to start")
        p.send_signal(signal.SIGSTOP)
        try:
            other = Worker(self.serve.url, unique("other"), {kind: lambda job: "holder"})
            other.start()
            self.addCleanup(other.stop, 0)
            wait_for(lambda: self.client.get(key)["state"] == "succeeded", "another worker to take the task over")
            wait_for(lambda: time.time() * 1000 - self.lines()[0]["t"] > 3000, "the frozen handler's time to pass", every=0.1)
        finally:
            p.send_signal(signal.SIGCONT)
        ended = wait_for(lambda: [r["event"] for r in self.lines() if r["key"] == key and r["event"] != "start"],
                         "the resumed handler to end or abort")
        self.assertIn(ended[0], ("end", "abort"))
        t = self.client.get(key)
        outcomes = {(a["worker_id"], a.get("state")) for a in list(t.get("history") or []) + list(t.get("workers") or [])}
        self.assertIn((other.id, "SUCCESS"), outcomes)
        self.assertEqual([a for a in t["workers"] if a.get("result") == {"worker": self.lines()[0]["worker"]}], [],
                         "the frozen worker's result is never stored")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(30), 0)

    def test_bad_flags_exit_2(self) -> None:
        r = subprocess.run([sys.executable, PROGRAM, "--url", self.serve.url, "--id", "x", "--kinds", "k",
                            "--record", self.record, "--concurrency", "many"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--concurrency", r.stderr)
        r = subprocess.run([sys.executable, PROGRAM, "--url", self.serve.url, "--id", "x", "--kinds", "k",
                            "--record", self.record, "--concurrency", "0"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--concurrency: must be at least 1", r.stderr)


if __name__ == "__main__":
    unittest.main()
