"""The Worker against a real `leasepool serve` over SQLite: every fact is
read back from the stored tasks through the Client."""

from __future__ import annotations

import threading
import time
import unittest
import urllib.parse
from datetime import datetime, timezone
from typing import Any, Dict, List

from support import Proxy, TempStore, attempt_of, closing, unique, wait_for

from leasepool import LEASE_EXPIRED, SHUTDOWN, Client, Job, LeasepoolError, Retryable, Snooze, Worker

store: TempStore
client: Client
url: str


def setUpModule() -> None:
    global store, client, url
    store = TempStore()
    try:
        url = store.serve().url
    except BaseException:
        store.close()
        raise
    client = Client(url)


def tearDownModule() -> None:
    client.close()
    store.close()


def parse_time(s: str) -> datetime:
    head, _, frac = s.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + frac[:6] if frac else "")).replace(tzinfo=timezone.utc)


def state(key: str) -> str:
    return str(client.get(key)["state"])


def states(keys: List[str], want: str) -> bool:
    return all(state(k) == want for k in keys)


class WorkerTest(unittest.TestCase):
    def worker(self, handlers: Dict[str, Any], **kw: Any) -> Worker:
        w = Worker(kw.pop("url", url), kw.pop("id", unique("w")), handlers, **kw)
        w.start()
        self.addCleanup(w.stop, 0)
        self.assertTrue(w.wait_ready(10), "the worker registers")
        return w

    def record_calls(self, w: Worker) -> List[str]:
        """Record the method and path of every call the worker makes (still made)."""
        calls: List[str] = []
        real = w._http.request

        def request(method: str, path: str, *args: Any, **kw: Any) -> Any:
            calls.append(f"{method} {path}")
            return real(method, path, *args, **kw)

        w._http.request = request  # type: ignore[method-assign]
        return calls

    def test_runs_tasks_and_records_results_and_logs(self) -> None:
        kind = unique("sq")
        seen: List[int] = []

        def square(job: Job) -> Dict[str, int]:
            seen.append(job.attempt)
            job.log(f"squaring {job.payload['n']}")
            return {"sq": job.payload["n"] ** 2}

        w = self.worker({kind: square}, concurrency=8)
        calls = self.record_calls(w)
        keys = [unique("t") for _ in range(300)]
        res = client.publish_many([{"key": k, "kind": kind, "payload": {"n": i}} for i, k in enumerate(keys)])
        self.assertEqual(res["inserted"], 300)
        self.assertEqual(res["warnings"], [], "the registered remote worker runs the kind")
        wait_for(lambda: client.stats()["by_state"].get("succeeded", 0) >= 300 and states(keys, "succeeded"),
                 "300 tasks succeeded", timeout=30, every=0.2)
        for i in (0, 150, 299):
            t = client.get(keys[i])
            a = attempt_of(t, w.id)
            assert a is not None
            self.assertEqual(a["result"], {"sq": i * i})
            self.assertEqual(a["instance"], w.instance)
            self.assertEqual([line["msg"] for line in a.get("log", [])], [f"squaring {i}"])
        self.assertEqual(len(seen), 300, "each task ran once")
        finishes = [c for c in calls if c.endswith("/finish")]
        self.assertFalse([c for c in finishes if "/jobs/" in c], "outcomes go in finish-many calls")
        self.assertLess(len(finishes), 300, "several outcomes per call")
        live = [r for r in client.workers() if r.get("id") == w.id]
        self.assertTrue(live and live[0].get("live"), live)

    def test_renews_carry_log_lines_while_the_handler_runs(self) -> None:
        kind, key = unique("long"), unique("long")
        release = threading.Event()

        def slow(job: Job) -> str:
            job.log("first")
            release.wait(20)
            return "ok"

        w = self.worker({kind: slow})
        client.publish(key, kind, ping_interval=0.1, worker_timeout=2)
        # Renewed past several lease lengths, and its log line arrived by a renew.
        wait_for(lambda: [line["msg"] for line in (attempt_of(client.get(key), w.id) or {}).get("log", [])] == ["first"],
                 "the log line to ride on a renew")
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 4.5, "two and a half lease lengths", every=0.1)
        self.assertEqual(state(key), "running", "renews keep the lease")
        release.set()
        wait_for(lambda: state(key) == "succeeded", "the task to succeed")
        self.assertEqual(client.get(key)["attempts"], 1)

    def test_many_long_log_lines_keep_the_lease(self) -> None:
        # The server takes at most 20 lines of 256 bytes per call: the
        # worker sends the latest 20, cut, and its renews still succeed.
        kind, key = unique("logs"), unique("logs")
        renewed = threading.Event()

        def chatty(job: Job) -> str:
            for i in range(50):
                job.log(f"{i:02d} " + "é" * 1000)
            renewed.wait(20)
            job.log("last")
            return "said"

        w = self.worker({kind: chatty})
        calls = self.record_calls(w)
        client.publish(key, kind, ping_interval=0.1, worker_timeout=2, max_unexpected_retries=0)
        wait_for(lambda: len([c for c in calls if c.endswith(f"/jobs/{key}/renew")]) >= 5, f"several renews {calls[-5:]} {client.get(key)}")
        self.assertEqual(state(key), "running", "the renews succeed")
        renewed.set()
        wait_for(lambda: state(key) == "succeeded", "the task to succeed")
        a = attempt_of(client.get(key), w.id)
        assert a is not None
        lines = [line["msg"] for line in a.get("log", [])]
        self.assertEqual(len(lines), 20)
        self.assertEqual(lines[-1], "last")
        self.assertTrue(lines[0].startswith("31 "), lines[0][:10])
        self.assertTrue(all(len(x.encode()) <= 256 for x in lines))

    def test_outcomes_the_server_refuses_fail_the_attempt(self) -> None:
        kind = unique("big")
        big_result, big_error = unique("big-result"), unique("big-error")

        def big(job: Job) -> str:
            if job.key == big_error:
                raise ValueError("e" * 100_000)
            return "r" * 20_000  # over the 16 KiB a result may hold

        w = self.worker({kind: big})
        client.publish(big_result, kind, max_unexpected_retries=0)
        client.publish(big_error, kind, max_unexpected_retries=0)
        wait_for(lambda: state(big_result) == "failed" and state(big_error) == "failed", "both to fail")
        err = (attempt_of(client.get(big_result), w.id) or {}).get("error", "")
        self.assertTrue(err.startswith("succeeded: refused: result:"), err)
        err = (attempt_of(client.get(big_error), w.id) or {}).get("error", "")
        self.assertTrue(err.startswith("eeee") and len(err.encode()) <= 8 << 10, len(err))

    def test_a_job_from_a_long_poll_keeps_its_lease(self) -> None:
        # The claim waits well past the lease length before the task comes:
        # the lease starts when the task is claimed, not when the poll began.
        kind, key = unique("lp"), unique("lp")
        reasons: List[str] = []

        def holds(job: Job) -> str:
            if job.cancelled.wait(3.0):  # one and a half lease lengths, renewed
                reasons.append(str(job.cancel_reason))
            return "kept"

        w = self.worker({kind: holds})
        calls = self.record_calls(w)
        wait_for(lambda: w._conns.get("claim") is not None, "the long poll to start")
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 2.5, "a poll longer than the lease", every=0.1)
        client.publish(key, kind, worker_timeout=2, ping_interval=0.2)
        wait_for(lambda: state(key) == "succeeded", "the task to succeed")
        self.assertEqual(reasons, [])
        self.assertEqual(client.get(key)["attempts"], 1)
        self.assertTrue([c for c in calls if c.endswith(f"/jobs/{key}/renew")])

    def test_cancel_sets_the_cancel_event_and_nothing_is_finished(self) -> None:
        kind, key = unique("cx"), unique("cx")
        started, returned = threading.Event(), threading.Event()
        reasons: List[str] = []

        def waits(job: Job) -> str:
            started.set()
            job.cancelled.wait(20)
            reasons.append(str(job.cancel_reason))
            returned.set()
            return "finished anyway"

        w = self.worker({kind: waits})
        calls = self.record_calls(w)
        client.publish(key, kind, ping_interval=0.05, worker_timeout=5)
        self.assertTrue(started.wait(10))
        client.cancel(key)
        self.assertTrue(returned.wait(10), "the handler's cancel event fires")
        self.assertEqual(reasons, ["cancelled"])
        wait_for(lambda: not w.running(), "the worker to forget the job")
        t = client.get(key)
        self.assertEqual(t["state"], "cancelled")
        a = attempt_of(t, w.id)
        assert a is not None
        self.assertNotIn("result", a, "a cancelled attempt's outcome is never written")
        self.assertFalse([c for c in calls if c.endswith("/finish")], "nor sent")
        self.assertTrue([c for c in calls if c.endswith(f"/jobs/{key}/renew")], "the cancel came by a renew's 409")

    def test_a_heartbeat_reports_lost_attempts(self) -> None:
        # Renews are 20 s apart: the cancel reaches the handler through the
        # heartbeat's lost list, which names the held attempt.
        kind, key = unique("hb"), unique("hb")
        started, reasons = threading.Event(), []

        def waits(job: Job) -> None:
            started.set()
            job.cancelled.wait(30)
            reasons.append(job.cancel_reason)

        w = self.worker({kind: waits})
        calls = self.record_calls(w)
        client.publish(key, kind, ping_interval=20, worker_timeout=60)
        self.assertTrue(started.wait(10))
        client.cancel(key)
        wait_for(lambda: reasons, "the heartbeat to report the attempt lost")
        self.assertEqual(reasons, ["cancelled"])
        self.assertFalse([c for c in calls if "/renew" in c or c.endswith("/finish")], calls)
        self.assertTrue([c for c in calls if c.startswith("PUT ")], "heartbeats were sent")

    def test_a_raising_handler_is_retried_then_failed(self) -> None:
        kind, key = unique("boom"), unique("boom")
        attempts: List[int] = []

        def boom(job: Job) -> None:
            attempts.append(job.attempt)
            raise ValueError(f"boom {job.attempt}")

        self.worker({kind: boom})
        client.publish(key, kind, max_unexpected_retries=1)
        wait_for(lambda: state(key) == "failed", "the task to fail for good", timeout=20)
        t = client.get(key)
        self.assertEqual(attempts, [1, 2], "one retry, as max_unexpected_retries allows")
        errors = [a.get("error") for a in list(t.get("history") or []) + list(t.get("workers") or [])]
        self.assertIn("boom 2", errors)

    def test_retryable_is_retried_locally(self) -> None:
        kind, ok_key, bad_key = unique("rt"), unique("rt-ok"), unique("rt-bad")
        calls: Dict[str, int] = {}

        def flaky(job: Job) -> str:
            calls[job.key] = calls.get(job.key, 0) + 1
            if job.key == bad_key or calls[job.key] < 3:
                raise Retryable(f"try {calls[job.key]}")
            return "third time"

        w = self.worker({kind: flaky}, retries=2, retry_backoff=0.02)
        client.publish(ok_key, kind, max_unexpected_retries=0)
        client.publish(bad_key, kind, max_unexpected_retries=0)
        wait_for(lambda: state(ok_key) == "succeeded" and state(bad_key) == "failed", "both to end")
        self.assertEqual(calls, {ok_key: 3, bad_key: 3})
        self.assertEqual(client.get(ok_key)["attempts"], 1, "retried in the same attempt")
        bad = attempt_of(client.get(bad_key), w.id)
        assert bad is not None
        self.assertEqual(bad.get("error"), "try 3")

    def test_snooze_runs_the_task_again_later(self) -> None:
        kind, key = unique("sn"), unique("sn")
        runs: List[float] = []

        def sleepy(job: Job) -> str:
            runs.append(time.monotonic())
            if len(runs) == 1:
                raise Snooze(0.5)
            return "awake"

        self.worker({kind: sleepy})
        client.publish(key, kind, max_unexpected_retries=0)
        wait_for(lambda: state(key) == "succeeded", "the snoozed task to succeed")
        self.assertEqual(len(runs), 2)
        self.assertGreaterEqual(runs[1] - runs[0], 0.45, "run again after the snooze")
        states_ = [a.get("state") for a in client.get(key).get("history") or []]
        self.assertIn("SNOOZED", states_, "a snooze is no failure")

    def test_stop_releases_running_jobs_and_unregisters(self) -> None:
        kind, slow_key, quick_key = unique("st"), unique("st-slow"), unique("st-quick")
        started: Dict[str, threading.Event] = {slow_key: threading.Event(), quick_key: threading.Event()}
        reasons: List[str] = []
        quick_go = threading.Event()

        def handler(job: Job) -> str:
            started[job.key].set()
            if job.key == quick_key:
                quick_go.wait(10)
                return "quick"
            if job.cancelled.wait(30):
                reasons.append(str(job.cancel_reason))
                raise RuntimeError("stopped")
            return "slow"

        w = Worker(url, unique("w"), {kind: handler}, concurrency=4, grace=1.0)
        w.start()
        self.assertTrue(w.wait_ready(10))
        client.publish(slow_key, kind, ping_interval=0.1, worker_timeout=30)
        client.publish(quick_key, kind, ping_interval=0.1, worker_timeout=30)
        self.assertTrue(started[slow_key].wait(10) and started[quick_key].wait(10))
        stopper = threading.Thread(target=w.stop)
        stopper.start()
        quick_go.set()  # finishes within the grace: recorded as a success
        stopper.join(15)
        self.assertFalse(stopper.is_alive())
        self.assertEqual(reasons, [SHUTDOWN])
        self.assertEqual(state(quick_key), "succeeded")
        slow = client.get(slow_key)
        self.assertEqual(slow["state"], "pending", "released, not failed")
        a = attempt_of(slow, w.id)
        assert a is not None
        self.assertEqual(a["state"], "RELEASED")
        self.assertFalse([r for r in client.workers() if r.get("id") == w.id and r.get("live")], "unregistered")
        # Released: another worker takes it at once, well before its 30 s lease.
        self.worker({kind: lambda job: "second"})
        wait_for(lambda: state(slow_key) == "succeeded", "another worker to run the released task")

    def test_registers_again_when_not_registered(self) -> None:
        kind = unique("rr")
        w = self.worker({kind: lambda job: "ok"})
        client.request("DELETE", "/api/v1/workers/" + urllib.parse.quote(w.id, safe=""), query={"instance": w.instance})
        key = unique("rr")
        client.publish(key, kind)
        wait_for(lambda: state(key) == "succeeded", "a task published after the registration was deleted", timeout=20)
        self.assertTrue([r for r in client.workers() if r.get("id") == w.id and r.get("live")])

    def test_a_lost_lease_cancels_the_job_and_the_other_worker_wins(self) -> None:
        # Worker A reaches serve through a proxy that then refuses it: its
        # renews fail, its lease ends, and B takes the task over. A's
        # handler is cancelled (lease_expired) and A writes nothing.
        kind, key = unique("ll"), unique("ll")
        proxy = Proxy(store.servers[0].port)
        self.addCleanup(proxy.close)
        a_started, a_cancelled = threading.Event(), threading.Event()
        a_reason: List[str] = []

        def a_handler(job: Job) -> str:
            a_started.set()
            job.cancelled.wait(30)
            a_reason.append(str(job.cancel_reason))
            a_cancelled.set()
            return "from A"

        a = self.worker({kind: a_handler}, url=proxy.url)
        calls = self.record_calls(a)
        client.publish(key, kind, ping_interval=0.1, worker_timeout=1, max_unexpected_retries=5)
        self.assertTrue(a_started.wait(10))
        proxy.close()
        self.assertTrue(a_cancelled.wait(10), "A's handler is cancelled once no renew succeeded for lease_ms")
        self.assertEqual(a_reason, [LEASE_EXPIRED])
        b = self.worker({kind: lambda job: "from B"})
        wait_for(lambda: state(key) == "succeeded", "B to take the task over")
        proxy.open()
        wait_for(lambda: not a.running(), "A to drop the job")
        t = client.get(key)
        results = [x.get("result") for x in list(t.get("history") or []) + list(t.get("workers") or [])]
        self.assertIn("from B", results)
        self.assertNotIn("from A", results)
        self.assertFalse([c for c in calls if c.endswith("/finish")], "A never sends its outcome")
        self.assertEqual(attempt_of(t, b.id)["state"], "SUCCESS")  # type: ignore[index]


    def test_a_frozen_server_cancels_the_job_before_its_lease_ends(self) -> None:
        # Renews hang on a server that answers nothing. The handler must be
        # told to stop before the lease the server recorded ends, when
        # another worker may take the task.
        kind, key = unique("fz"), unique("fz")
        proxy = Proxy(store.servers[0].port)
        self.addCleanup(proxy.close)
        started, cancelled_at = threading.Event(), []

        def held(job: Job) -> None:
            started.set()
            job.cancelled.wait(30)
            cancelled_at.append(datetime.now(timezone.utc))
            raise RuntimeError(str(job.cancel_reason))

        w = self.worker({kind: held}, url=proxy.url)
        calls = self.record_calls(w)
        client.publish(key, kind, ping_interval=0.1, worker_timeout=5, max_unexpected_retries=5)
        self.assertTrue(started.wait(10))
        wait_for(lambda: len([c for c in calls if c.endswith("/renew")]) >= 3, "a few renews")
        proxy.freeze()
        wait_for(lambda: cancelled_at, "the cancel event", timeout=10)
        a = attempt_of(client.get(key), w.id)
        assert a is not None
        lease_until = parse_time(a["lease_until"])
        self.assertLess(cancelled_at[0], lease_until, "told to stop before the recorded lease ends")
        self.assertEqual(a["state"], "RUNNING", "and nothing was written for it")
        proxy.freeze(False)


class ProtocolTest(unittest.TestCase):
    """The server's side of the contract that the Worker relies on."""

    def test_a_finish_after_the_lease_is_lost_is_refused_and_not_recorded(self) -> None:
        kind, key = unique("fence"), unique("fence")
        w1, w2 = unique("p1"), unique("p2")
        for wid in (w1, w2):
            client.request("PUT", f"/api/v1/workers/{wid}", {"instance": "i-" + wid, "kinds": [kind], "concurrency": 1})
        client.publish(key, kind, ping_interval=0.02, worker_timeout=0.2, max_unexpected_retries=5)
        jobs = client.request("POST", f"/api/v1/workers/{w1}/claim", {"instance": "i-" + w1, "max": 1, "wait_ms": 5000})["jobs"]
        self.assertEqual([(j["key"], j["attempt"], j["lease_ms"], j["renew_ms"]) for j in jobs], [(key, 1, 200, 20)])
        # w1 never renews: once its lease ends, w2's claim takes the task.
        taken = wait_for(lambda: client.request("POST", f"/api/v1/workers/{w2}/claim",
                                                {"instance": "i-" + w2, "max": 1, "wait_ms": 1000})["jobs"], "w2's claim")
        self.assertEqual(taken[0]["key"], key)
        second = taken[0]["attempt"]
        self.assertGreater(second, 1, "a new attempt number fences the old one")
        for verb, body in (("renew", {}), ("finish", {"outcome": "succeeded", "result": "stale"})):
            with self.assertRaises(LeasepoolError) as cm:
                client.request("POST", f"/api/v1/workers/{w1}/jobs/{key}/{verb}", {"instance": "i-" + w1, "attempt": 1, **body})
            self.assertEqual((cm.exception.status, cm.exception.code), (409, "lease_lost"), verb)
        res = client.request("POST", f"/api/v1/workers/{w2}/jobs/{key}/finish",
                             {"instance": "i-" + w2, "attempt": second, "outcome": "succeeded", "result": "fresh"})
        self.assertEqual(res, {"state": "succeeded", "outcome": "succeeded"})
        t = client.get(key)
        results = [x.get("result") for x in list(t.get("history") or []) + list(t.get("workers") or [])]
        self.assertIn("fresh", results)
        self.assertNotIn("stale", results)

    def test_claim_unregistered_is_409_not_registered(self) -> None:
        with self.assertRaises(LeasepoolError) as cm:
            client.request("POST", f"/api/v1/workers/{unique('ghost')}/claim", {"instance": "x", "kinds": ["k"], "wait_ms": 0})
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "not_registered"))


class CredentialTest(unittest.TestCase):
    def test_a_worker_token_runs_tasks_and_reads_nothing(self) -> None:
        s = TempStore()
        self.addCleanup(s.close)
        srv = s.serve("--token", "full-secret", "--worker-token", "worker-secret")
        kind, key = unique("auth"), unique("auth")
        with self.assertRaises(LeasepoolError) as cm:
            closing(self, Client(srv.url)).publish(key, kind)
        self.assertEqual(cm.exception.status, 401)
        admin = closing(self, Client(srv.url, token="full-secret"))
        admin.publish(key, kind)
        w = Worker(srv.url, unique("w"), {kind: lambda job: "authorized"}, token="worker-secret")
        w.start()
        self.addCleanup(w.stop, 0)
        wait_for(lambda: admin.get(key)["state"] == "succeeded", "the task run with the worker token")
        with self.assertRaises(LeasepoolError) as cm:
            closing(self, Client(srv.url, token="worker-secret")).get(key)
        self.assertEqual(cm.exception.status, 403)


class FailoverTest(unittest.TestCase):
    def test_a_serve_that_dies_costs_only_a_reconnect(self) -> None:
        # Two servers over one store; the worker knows both. Killing the one
        # it talks to mid-run moves it to the other; every task succeeds.
        other = store.serve()
        kind = unique("fo")
        w = Worker([other.url, url], unique("w"), {kind: lambda job: job.payload}, concurrency=4)
        w.start()
        self.addCleanup(w.stop, 0)
        self.assertTrue(w.wait_ready(10))
        self.assertEqual(w.url, other.url)
        keys = [unique("fo") for _ in range(40)]
        client.publish_many([{"key": k, "kind": kind, "payload": i} for i, k in enumerate(keys[:20])])
        wait_for(lambda: states(keys[:20], "succeeded"), "the first half through the first server")
        other.stop(kill=True)
        client.publish_many([{"key": k, "kind": kind, "payload": i} for i, k in enumerate(keys[20:], 20)])
        wait_for(lambda: states(keys, "succeeded"), "the second half through the other server", timeout=20)
        self.assertEqual(w.url, url)
        t = client.get(keys[-1])
        self.assertEqual(t["attempts"], 1)


    def test_a_restarted_serve_keeps_the_running_job(self) -> None:
        # The only server goes away and comes back on the same address: the
        # worker reconnects, renews the lease it still holds and finishes.
        s = TempStore()
        self.addCleanup(s.close)
        srv = s.serve()
        admin = closing(self, Client(srv.url))
        kind, key, later = unique("rs"), unique("rs"), unique("rs-later")
        started, go = threading.Event(), threading.Event()

        def handler(job: Job) -> str:
            if job.key == key:
                started.set()
                go.wait(30)
                if job.cancelled.is_set():
                    raise RuntimeError(str(job.cancel_reason))
            return f"attempt {job.attempt}"

        w = Worker(srv.url, unique("w"), {kind: handler})
        w.start()
        self.addCleanup(w.stop, 0)
        admin.publish(key, kind, ping_interval=0.1, worker_timeout=15)
        self.assertTrue(started.wait(10))
        srv.stop()
        srv.start()
        admin.publish(later, kind)
        wait_for(lambda: admin.get(later)["state"] == "succeeded", "a task published after the restart", timeout=20)
        go.set()
        wait_for(lambda: admin.get(key)["state"] == "succeeded", "the job that ran across the restart")
        t = admin.get(key)
        self.assertEqual(t["attempts"], 1, "no second attempt: the lease was kept")
        self.assertEqual(attempt_of(t, w.id)["result"], "attempt 1")  # type: ignore[index]


if __name__ == "__main__":
    unittest.main()
