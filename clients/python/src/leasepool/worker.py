"""A remote worker: runs tasks of its kinds in this process over HTTP.

Threads, each with its own keep-alive connection: one registers and
heartbeats, one claims with the long poll while slots are free, one
renews the running attempts' leases, one cancels those whose lease may be
ending, ``concurrency`` run the handlers, and one finisher writes their
outcomes many at a time, claiming more tasks in the same call.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import urllib.parse
import uuid
from datetime import datetime
from types import FrameType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import Transport, encode_json
from .client import _Backoff
from .errors import LeasepoolError, UnavailableError
from .types import JSONObject

log = logging.getLogger("leasepool.worker")

# Cancel reasons that are not a server's 409 code.
SHUTDOWN = "shutdown"  # the worker stops: the attempt is released
STEP_TIMEOUT = "step_timeout"  # a flow step's timeout passed: a failure says so
LEASE_EXPIRED = "lease_expired"  # no renew succeeded for 9/10 of lease_ms

# Bounds of the protocol: a claim's max and its wait, and the attempts a
# heartbeat may name.
MAX_CLAIM = 256
MAX_HELD = 4096
MAX_CLAIM_WAIT_MS = 60_000
# The share of a lease a job counts on without a successful renew.
LEASE_SHARE = 0.9
# The most outcomes one finish call carries, and about the most bytes
# (the server reads at most 8 MiB).
MAX_FINISH_MANY = 256
MAX_FINISH_BYTES = 4 << 20
# How long a claim waits for more of the busy slots to free up, once one has.
CLAIM_GATHER = 0.005
# The server keeps an attempt's latest 20 log lines, of at most 256 bytes,
# and takes at most 20 per renew or finish, in a body of at most 64 KiB:
# a job keeps its latest 20 unsent lines, cut as the server cuts them.
MAX_LOG_LINES = 20
MAX_LOG_LINE_BYTES = 256
# A failed attempt keeps at most 8 KiB of error.
MAX_ERROR_BYTES = 8 << 10


class Snooze(Exception):
    """Raise from a handler to run the task again ``seconds`` later, not counted as a failure."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds}s")
        self.seconds = seconds


class Retryable(Exception):
    """Raise from a handler for a transient error: the worker runs the handler
    again a few times, with a growing wait, before failing the attempt."""


class Job:
    """One attempt at a task, as a handler sees it.

    ``attempt`` is the fencing token: pass it to whatever the handler writes
    elsewhere. ``cancelled`` is set when the handler must stop: the task was
    cancelled or finished elsewhere, the lease was lost, or the worker stops
    (``cancel_reason`` says which: a server code such as ``cancelled`` or
    ``lease_lost``, ``lease_expired``, or ``shutdown``).
    """

    def __init__(self, worker_id: str, doc: Mapping[str, Any], claimed_at: float) -> None:
        self.worker_id = worker_id
        self.key: str = doc["key"]
        self.kind: str = doc["kind"]
        self.attempt: int = int(doc["attempt"])
        self.payload: Any = doc.get("payload")
        self.priority: int = int(doc.get("priority") or 0)
        self.created_at: Optional[str] = doc.get("created_at")
        # The W3C trace context the task was published in (None if none):
        # give it to your tracer as the parent of the handler's span.
        self.traceparent: Optional[str] = doc.get("traceparent") or None
        self.tracestate: Optional[str] = doc.get("tracestate") or None
        # Set on a flow step's task: {"flow", "step", "undo"?, "params"?}
        # (params: the flow's request and each finished step's result by
        # name); payload is then the step's own.
        self.flow_step: Optional[Mapping[str, Any]] = doc.get("flow_step") or None
        self.lease_ms: int = int(doc.get("lease_ms") or 15_000)
        self.renew_ms: int = int(doc.get("renew_ms") or 5_000)
        self.doc: Mapping[str, Any] = doc
        self.cancelled = threading.Event()
        self.cancel_reason: Optional[str] = None
        self._lock = threading.Lock()
        self._log: List[str] = []
        # Monotonic time a lease was last known good: when the claim or the
        # last successful renew was sent, so that the lease surely lasts
        # lease_ms from there.
        self._last_ok = claimed_at
        self._next_renew = claimed_at + self.renew_ms / 1000
        # The attempt's outcome is ours to write until abandoned, and is
        # written once: by the handler's thread, or by a stop that gave up
        # waiting for it.
        self._abandoned = False
        self._finishing = False

    def __repr__(self) -> str:
        return f"Job(key={self.key!r}, kind={self.kind!r}, attempt={self.attempt})"

    def log(self, line: str) -> None:
        """Append a line to the attempt's log; it is sent with the next renew (or the finish)."""
        line = _cut(str(line), MAX_LOG_LINE_BYTES)
        with self._lock:
            self._log.append(line)
            if len(self._log) > MAX_LOG_LINES:
                del self._log[0]

    def _take_log(self) -> List[str]:
        with self._lock:
            lines, self._log = self._log, []
            return lines

    def _return_log(self, lines: List[str]) -> None:
        with self._lock:
            self._log[:0] = lines
            del self._log[:-MAX_LOG_LINES]

    def _cancel(self, reason: str, abandon: bool) -> None:
        with self._lock:
            if abandon:
                self._abandoned = True
            if self.cancel_reason is None:
                self.cancel_reason = reason
        self.cancelled.set()

    def _begin_finish(self) -> bool:
        """Take the right to write the outcome; False when abandoned or taken already."""
        with self._lock:
            if self._abandoned or self._finishing:
                return False
            self._finishing = True
            return True

    @property
    def _held(self) -> bool:
        with self._lock:
            return not self._abandoned


Handler = Callable[[Job], Any]


class Worker:
    """Runs the tasks of ``handlers``' kinds: ``{kind: fn(job)}``.

    A handler's return value is the task's result (JSON, at most 16 KiB);
    an exception fails the attempt with its message (retried by the server
    while the task's ``max_unexpected_retries`` allow); ``Snooze(seconds)``
    runs it again later; ``Retryable`` is retried here first
    (``retries`` times, waiting ``retry_backoff`` seconds, doubled each
    time). A handler whose ``job.cancelled`` fires must stop: its outcome
    is not written, unless the worker stops (``shutdown``), when a handler
    that raises gives the attempt back (``released``).

    On SIGTERM handlers may run on for ``grace`` seconds (4, as a Go
    worker's default) before they are cancelled.

    ``url`` is one server or several (a list, or comma-separated): a
    connection error moves on to the next. ``run()`` blocks until SIGTERM
    or SIGINT; ``start()`` and ``stop()`` embed the worker in a program.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str]],
        id: str,
        handlers: Mapping[str, Handler],
        concurrency: int = 10,
        token: Optional[str] = None,
        grace: float = 4.0,
        *,
        claim_wait: float = 20.0,
        retries: int = 3,
        retry_backoff: float = 0.2,
        abort_wait: float = 2.0,
        host: Optional[str] = None,
    ) -> None:
        if not id:
            raise ValueError("id: must not be empty")
        if not handlers:
            raise ValueError("handlers: give at least one kind")
        if not 1 <= concurrency <= MAX_HELD:
            raise ValueError(f"concurrency: must be 1 to {MAX_HELD}, got {concurrency}")
        if grace < 0:
            raise ValueError(f"grace: must not be negative, got {grace}")
        if not 0 <= claim_wait * 1000 <= MAX_CLAIM_WAIT_MS:
            raise ValueError(f"claim_wait: must be 0 to 60 seconds, got {claim_wait}")
        self.id = id
        self.handlers: Dict[str, Handler] = dict(handlers)
        self.kinds = sorted(self.handlers)
        self.concurrency = concurrency
        self.grace = grace
        self.claim_wait = claim_wait
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.abort_wait = abort_wait
        self.host = host or socket.gethostname()
        self.instance = uuid.uuid4().hex
        self._http = Transport(url, token)
        self._path = "/api/v1/workers/" + urllib.parse.quote(id, safe="")

        self._lock = threading.Lock()
        self._slots = threading.Condition(self._lock)  # notified when a job leaves _active
        self._active: Dict[Tuple[str, int], Job] = {}
        # Outcomes waiting for the finisher, and how many it is sending.
        self._outcomes: List[Tuple[Job, JSONObject]] = []
        self._in_flight = 0
        # Slots a claim in flight may fill.
        self._reserved = 0
        # The server takes many outcomes in one call (not before leasepool
        # had POST /workers/{id}/finish).
        self._finish_many = True
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._threads: List[threading.Thread] = []

        self._registered = threading.Event()
        self._register_now = threading.Event()
        self._heartbeat_s = 5.0
        self._stop_claiming = threading.Event()
        self._claim_abort = threading.Event()
        self._background_abort = threading.Event()
        # The connection each background thread's call in flight uses.
        self._conns: Dict[str, Any] = {}
        self._renew_wake = threading.Event()
        self._watch_wake = threading.Event()
        self._stop_background = threading.Event()
        self._stop_requested = threading.Event()
        self._hurry = threading.Event()
        self._stopped = threading.Event()
        self._started = False
        self._stopping = False

    # Life cycle.

    @property
    def url(self) -> str:
        """The server the worker talks to now."""
        return self._http.url

    def running(self) -> List[Job]:
        """The attempts held now."""
        with self._lock:
            return list(self._active.values())

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Wait until the worker is registered; False when ``timeout`` passed first."""
        return self._registered.wait(timeout)

    def start(self) -> None:
        """Start the worker's threads and return; it registers and claims in the background."""
        with self._lock:
            if self._started:
                raise RuntimeError("worker: started already")
            self._started = True
        self._spawn("heartbeat", self._heartbeat_loop)
        self._spawn("renew", self._renew_loop)
        self._spawn("watch", self._watch_loop)
        self._spawn("finisher", self._finisher_loop)
        for i in range(self.concurrency):
            self._spawn(f"handler-{i}", self._handler_loop)
        self._spawn("claim", self._claim_loop)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=f"leasepool-{self.id}-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully (a second signal skips the grace)."""
        main = threading.current_thread() is threading.main_thread()
        previous: Dict[int, Any] = {}
        if main:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            while not self._stop_requested.wait(1.0):
                pass
            self.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._stop_requested.is_set():
            self._hurry.set()
        self._stop_requested.set()

    def request_stop(self) -> None:
        """Ask ``run()`` to stop, as a signal does; returns at once."""
        self._stop_requested.set()

    def stop(self, grace: Optional[float] = None) -> None:
        """Stop gracefully and return when stopped.

        Stops claiming, lets running handlers finish for ``grace`` seconds
        (the worker's by default), cancels the rest (reason ``shutdown``)
        and finishes their attempts ``released`` so that any worker takes
        them at once, then unregisters.
        """
        with self._lock:
            already, started = self._stopping, self._started
            self._stopping = True
        if already:
            self._stopped.wait()
            return
        if not started:
            self._stopped.set()
            return
        self._stop_requested.set()
        grace = self.grace if grace is None else grace
        self._end_claims()

        deadline = time.monotonic() + grace
        self._wait_idle(deadline)
        for job in self.running():
            job._cancel(SHUTDOWN, abandon=False)
        self._wait_idle(time.monotonic() + self.abort_wait)
        # Handlers that ignore their cancel event: give their attempts back
        # now rather than hold the tasks until their leases end.
        for job in self.running():
            if job._begin_finish():
                self._submit(job, {"outcome": "released"})
            elif not job._held:
                self._forget(job)  # lost already: nothing to write
        # What remains is outcomes on their way to the server.
        self._wait_idle(time.monotonic() + 10.0)

        self._stop_background.set()
        with self._slots:
            self._slots.notify_all()
        finisher = next((t for t in self._threads if t.name.endswith("-finisher")), None)
        if finisher is not None:
            finisher.join(10.0)
        self._renew_wake.set()
        self._watch_wake.set()
        self._register_now.set()
        for _ in range(self.concurrency):
            self._queue.put(None)
        self._background_abort.set()
        for role in ("heartbeat", "renew", "watch"):
            self._interrupt(role)
        try:
            self._http.request("DELETE", self._path, query={"instance": self.instance}, timeout=5.0)
        except LeasepoolError as e:
            log.warning("leasepool worker %s: unregister: %s (the registration lapses by itself)", self.id, e)
        self._registered.clear()
        self._http.close_all()
        self._stopped.set()

    def _wait_idle(self, deadline: float) -> None:
        with self._slots:
            while self._active and not self._hurry.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._slots.wait(min(left, 0.2))

    def _end_claims(self) -> None:
        """Stop claiming and end a long poll in flight."""
        self._stop_claiming.set()
        self._claim_abort.set()
        self._interrupt("claim")

    def _interrupt(self, role: str) -> None:
        """Wait for the thread of ``role`` to end, closing its connection
        under it so that a call it waits on (a long poll, or any call to a
        frozen server) ends now."""
        thread = next((t for t in self._threads if t.name.endswith("-" + role)), None)
        deadline = time.monotonic() + 5.0
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            sock = getattr(self._conns.get(role), "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            thread.join(0.05)

    def _remember(self, role: str) -> Callable[[Any], None]:
        def remember(conn: Any) -> None:
            self._conns[role] = conn
        return remember

    # Registration.

    def _heartbeat_body(self) -> JSONObject:
        jobs = self.running()
        return {
            "instance": self.instance, "kinds": self.kinds, "concurrency": self.concurrency,
            "running": len(jobs), "host": self.host, "pid": os.getpid(),
            "held": [{"key": j.key, "attempt": j.attempt} for j in jobs if j._held],
        }

    def _heartbeat_loop(self) -> None:
        backoff = _Backoff(first=0.1, most=2.0)
        while not self._stop_background.is_set():
            self._register_now.clear()  # before the call: a later request is kept
            try:
                res = self._http.request("PUT", self._path, self._heartbeat_body(), timeout=10.0,
                                         on_connection=self._remember("heartbeat"), abort=self._background_abort)
                self._heartbeat_s = max(0.05, int(res.get("heartbeat_ms") or 5000) / 1000)
                if not self._registered.is_set():
                    log.info("leasepool worker %s: registered at %s as instance %s", self.id, self._http.url, self.instance)
                self._registered.set()
                backoff.reset()
                for lost in res.get("lost") or []:
                    self._lose(str(lost.get("key")), int(lost.get("attempt") or 0), str(lost.get("reason") or "lost"))
                wait = self._heartbeat_s
            except LeasepoolError as e:
                if e.code == "worker_id_taken":
                    log.warning("leasepool worker %s: %s; waiting for it to lapse", self.id, e.message)
                elif not isinstance(e, UnavailableError):
                    log.error("leasepool worker %s: heartbeat: %s", self.id, e)
                wait = backoff.delay() if self._registered.is_set() or isinstance(e, UnavailableError) else max(backoff.delay(), 0.5)
            self._register_now.wait(wait)
        self._http.close()

    def _reregister(self) -> None:
        self._registered.clear()
        self._register_now.set()

    def _lose(self, key: str, attempt: int, reason: str) -> None:
        with self._lock:
            job = self._active.get((key, attempt))
        if job is not None:
            log.info("leasepool worker %s: %s attempt %d lost (%s)", self.id, key, attempt, reason)
            job._cancel(reason, abandon=True)

    # Claiming.

    def _claim_loop(self) -> None:
        """Long-poll for tasks while slots are free and no outcome is on its
        way: the finisher claims with the outcomes it sends."""
        backoff = _Backoff(first=0.05, most=2.0)
        while not self._stop_claiming.is_set():
            if not self._registered.wait(0.2):
                continue
            with self._slots:
                while self._claim_blocked() and not self._stop_claiming.is_set():
                    self._slots.wait(0.5)
                # Short handlers free their slots one by one: gather a few
                # before claiming rather than make a call per slot.
                gather = time.monotonic() + CLAIM_GATHER
                while 0 < self._busy() > self.concurrency // 2 and not self._stop_claiming.is_set():
                    left = gather - time.monotonic()
                    if left <= 0:
                        break
                    self._slots.wait(left)
                free = min(MAX_CLAIM, self.concurrency - self._busy())
                if free <= 0 or self._stop_claiming.is_set():
                    continue
                self._reserved += free
            try:
                body = {"instance": self.instance, "kinds": self.kinds, "max": free, "wait_ms": int(self.claim_wait * 1000)}
                sent = time.monotonic()
                try:
                    res = self._http.request(
                        "POST", self._path + "/claim", body, timeout=self.claim_wait + 15.0,
                        on_connection=self._remember("claim"), abort=self._claim_abort,
                    )
                except LeasepoolError as e:
                    if self._stop_claiming.is_set():
                        break
                    if e.code == "not_registered":
                        log.info("leasepool worker %s: not registered at %s: registering again", self.id, self._http.url)
                        self._reregister()
                        continue
                    if not isinstance(e, UnavailableError):
                        log.error("leasepool worker %s: claim: %s", self.id, e)
                    else:
                        log.debug("leasepool worker %s: claim: %s", self.id, e)
                    backoff.sleep(self._stop_claiming)
                    continue
                backoff.reset()
                self._accept(res.get("jobs") or [], sent)
            finally:
                with self._slots:
                    self._reserved -= free
                    self._slots.notify_all()
        self._http.close()

    def _busy(self) -> int:
        """Slots taken: jobs held, and slots a claim in flight may fill. Under _lock."""
        return len(self._active) + self._reserved

    def _claim_blocked(self) -> bool:
        """No slot is free, or the finisher will claim them. Under _lock."""
        if self._busy() >= self.concurrency:
            return True
        return self._finish_many and bool(self._outcomes or self._in_flight)

    def _accept(self, docs: List[Mapping[str, Any]], sent: float) -> None:
        """Take on the jobs a claim answered, sent at ``sent``."""
        received, now_wall = time.monotonic(), time.time()
        for doc in docs:
            job = Job(self.id, doc, _lease_start(doc, sent, received, now_wall))
            if received - sent > job.lease_ms / 10_000:
                # The start is an estimate within a long call: a renew now
                # makes it exact.
                job._next_renew = received
            with self._lock:
                self._active[(job.key, job.attempt)] = job
            if self._stop_claiming.is_set():
                # Claimed as the worker stops: give it back at once.
                job._cancel(SHUTDOWN, abandon=False)
            self._queue.put(job)
        if docs:
            self._renew_wake.set()
            self._watch_wake.set()

    # Renewing.

    def _renew_loop(self) -> None:
        while not self._stop_background.is_set():
            # Cleared before looking, so that a claim's wake-up that comes
            # while this pass runs is kept for the wait below.
            self._renew_wake.clear()
            wake = time.monotonic() + 1.0
            for job in self.running():
                with job._lock:
                    if job._abandoned or job._finishing:
                        continue
                if time.monotonic() >= job._next_renew:
                    self._renew(job)
                wake = min(wake, job._next_renew)
            self._renew_wake.wait(max(0.005, wake - time.monotonic()))
        self._http.close()

    def _watch_loop(self) -> None:
        """Cancel each job whose lease may be ending: no renew succeeded for
        9/10 of lease_ms. A thread of its own, so that a renew stuck on a
        frozen server never delays it."""
        while not self._stop_background.is_set():
            self._watch_wake.clear()
            now = time.monotonic()
            wake = now + 1.0
            for job in self.running():
                with job._lock:
                    if job._abandoned or job._finishing:
                        continue
                # A tenth of the lease early, as a Go worker: the handler
                # stops before another worker can start.
                deadline = job._last_ok + LEASE_SHARE * job.lease_ms / 1000
                if now >= deadline:
                    log.warning("leasepool worker %s: %s attempt %d: no renew succeeded for %d ms: lease lost",
                                self.id, job.key, job.attempt, round(LEASE_SHARE * job.lease_ms))
                    job._cancel(LEASE_EXPIRED, abandon=True)
                    continue
                wake = min(wake, deadline)
            self._watch_wake.wait(max(0.001, wake - time.monotonic()))

    def _renew(self, job: Job) -> None:
        lines = job._take_log()
        body: JSONObject = {"instance": self.instance, "attempt": job.attempt}
        if lines:
            body["log"] = lines
        sent = time.monotonic()
        try:
            res = self._http.request("POST", self._path + "/jobs/" + urllib.parse.quote(job.key, safe="") + "/renew",
                                     body, timeout=max(1.0, min(10.0, job.lease_ms / 2000)),
                                     on_connection=self._remember("renew"), abort=self._background_abort)
        except LeasepoolError as e:
            if e.code == "not_registered":
                job._return_log(lines)
                self._reregister()
                job._next_renew = time.monotonic() + 0.05
            elif e.status in (404, 409):
                job._cancel(e.code or ("not_found" if e.status == 404 else "lease_lost"), abandon=True)
            else:
                # Unreachable or failing: try again soon, the lease runs on.
                job._return_log(lines)
                job._next_renew = time.monotonic() + min(job.renew_ms / 1000, 0.5)
                if not isinstance(e, UnavailableError):
                    log.error("leasepool worker %s: renew %s: %s", self.id, job.key, e)
            return
        job._last_ok = sent
        if isinstance(res, dict) and res.get("lease_ms"):
            job.lease_ms = int(res["lease_ms"])
        job._next_renew = sent + job.renew_ms / 1000

    # Running.

    def _handler_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            submitted = False
            try:
                submitted = self._run(job)
            except BaseException:  # never lose a handler thread
                log.exception("leasepool worker %s: %s", self.id, job)
            finally:
                if not submitted:
                    self._forget(job)
        self._http.close()

    def _forget(self, job: Job) -> None:
        with self._slots:
            self._active.pop((job.key, job.attempt), None)
            self._slots.notify_all()

    def _run(self, job: Job) -> bool:
        """Run the job's handler; True when its outcome was handed to the finisher."""
        if job.cancelled.is_set():
            if job.cancel_reason == SHUTDOWN and job._begin_finish():
                self._submit(job, {"outcome": "released"})
                return True
            return False
        # A flow step's timeout, kept as a Go worker's flow middleware
        # keeps it: the handler is cancelled, and its failure says why.
        timeout_ms = int((job.flow_step or {}).get("timeout_ms") or 0)
        timer = None
        if timeout_ms > 0:
            timer = threading.Timer(timeout_ms / 1000, job._cancel, (STEP_TIMEOUT, False))
            timer.daemon = True
            timer.start()
        try:
            outcome = self._call(job)
        finally:
            if timer is not None:
                timer.cancel()
        if outcome["outcome"] == "failed" and job.cancel_reason == STEP_TIMEOUT:
            outcome["error"] = f"step timeout {timeout_ms} ms: {outcome['error']}"
        if job.cancelled.is_set() and job.cancel_reason == SHUTDOWN and outcome["outcome"] != "succeeded":
            outcome = {"outcome": "released"}
        if not job._begin_finish():
            return False  # the lease is lost, or a stop released it: nothing to write
        self._submit(job, outcome)
        return True

    def _call(self, job: Job) -> JSONObject:
        handler = self.handlers.get(job.kind)
        if handler is None:
            return {"outcome": "failed", "error": f"no handler for kind {job.kind!r} in worker {self.id}"}
        tries = 0
        while True:
            try:
                result = handler(job)
            except Snooze as s:
                return {"outcome": "snoozed", "snooze_ms": max(0, round(s.seconds * 1000))}
            except Retryable as e:
                tries += 1
                wait = self.retry_backoff * 2 ** (tries - 1)
                if tries > self.retries or job.cancelled.wait(wait):
                    return {"outcome": "failed", "error": _message(e)}
                job.log(f"retrying after: {_message(e)}")
                continue
            except BaseException as e:
                return {"outcome": "failed", "error": _message(e)}
            out: JSONObject = {"outcome": "succeeded"}
            if result is not None:
                try:
                    json.dumps(result)
                except (TypeError, ValueError) as e:
                    return {"outcome": "failed", "error": f"result: not JSON: {e}"}
                out["result"] = result
            return out

    # Finishing.

    def _submit(self, job: Job, outcome: JSONObject) -> None:
        """Hand an attempt's outcome to the finisher; the job is held until it is written."""
        body: JSONObject = {"key": job.key, "attempt": job.attempt}
        body.update(outcome)
        lines = job._take_log()
        if lines:
            body["log"] = lines
        with self._slots:
            self._outcomes.append((job, body))
            self._slots.notify_all()

    def _finisher_loop(self) -> None:
        """Send the outcomes handlers leave, as many as are waiting in one
        call (the store commits them together), claiming as many tasks as
        they free in the same round trip."""
        backoff = _Backoff(first=0.05, most=1.0)
        while True:
            with self._slots:
                while not self._outcomes and not self._stop_background.is_set():
                    self._slots.wait(0.5)
                if not self._outcomes:
                    break
                batch: List[Tuple[Job, JSONObject]] = []
                size = 0
                while self._outcomes and len(batch) < MAX_FINISH_MANY:
                    n = len(encode_json(self._outcomes[0][1]))
                    if batch and size + n > MAX_FINISH_BYTES:
                        break
                    batch.append(self._outcomes.pop(0))
                    size += n
                self._in_flight += len(batch)
                claim = 0
                if self._finish_many and not self._stop_claiming.is_set() and self._registered.is_set():
                    # The outcomes are written before the claim: their slots count as free.
                    claim = max(0, min(MAX_CLAIM, self.concurrency - self._busy() + len(batch)))
                    self._reserved += claim
            try:
                again = self._send_outcomes(batch, claim)
            finally:
                with self._slots:
                    self._reserved -= claim
                    self._in_flight -= len(batch)
                    self._slots.notify_all()
            if again:
                with self._slots:
                    self._outcomes[:0] = again
                time.sleep(backoff.delay())
            else:
                backoff.reset()
        self._http.close()

    def _send_outcomes(self, batch: List[Tuple[Job, JSONObject]], claim: int) -> List[Tuple[Job, JSONObject]]:
        """Write a batch of outcomes (and claim ``claim`` tasks); answer those to send again."""
        if not self._finish_many:
            for job, body in batch:
                self._finish_one(job, body)
            return []
        call: JSONObject = {"instance": self.instance, "outcomes": [body for _, body in batch]}
        if claim:
            call["claim"] = {"kinds": self.kinds, "max": claim, "wait_ms": 0}
        sent = time.monotonic()
        try:
            res = self._http.request("POST", self._path + "/finish", call, timeout=30.0)
        except LeasepoolError as e:
            if e.status in (404, 405) and not e.code:
                log.info("leasepool worker %s: %s has no finish-many: finishing one by one", self.id, self._http.url)
                self._finish_many = False
                for job, body in batch:
                    self._finish_one(job, body)
                return []
            if e.status and e.status < 500 and not e.code:
                # The call as a whole is refused: each outcome on its own
                # gets its own answer.
                for job, body in batch:
                    self._finish_one(job, body)
                return []
            again = []
            for job, body in batch:
                retry = self._after_refusal(job, body, e.status, e.code, e.message)
                if retry is None:
                    self._forget(job)
                else:
                    again.append((job, retry))
            return again
        results = res.get("results") or []
        again = []
        for i, (job, body) in enumerate(batch):
            r: JSONObject = results[i] if i < len(results) else {"status": 500, "error": "no answer for this outcome"}
            status = int(r.get("status") or 0)
            if not status:
                self._forget(job)
                continue
            retry = self._after_refusal(job, body, status, r.get("code"), str(r.get("error") or ""))
            if retry is None:
                self._forget(job)
            else:
                again.append((job, retry))
        self._accept(res.get("jobs") or [], sent)
        refused = res.get("claim_error")
        if isinstance(refused, dict):
            if refused.get("code") == "not_registered":
                self._reregister()
            else:
                log.error("leasepool worker %s: claim: %s", self.id, refused.get("error"))
        return again

    def _finish_one(self, job: Job, body: JSONObject) -> None:
        """Write one outcome with its own call, retrying while its lease may last."""
        path = self._path + "/jobs/" + urllib.parse.quote(job.key, safe="") + "/finish"
        backoff = _Backoff(first=0.05, most=1.0)
        try:
            while True:
                call = {k: v for k, v in body.items() if k != "key"}
                call["instance"] = self.instance
                try:
                    self._http.request("POST", path, call, timeout=10.0)
                    return
                except LeasepoolError as e:
                    retry = self._after_refusal(job, body, e.status, e.code, e.message)
                    if retry is None:
                        return
                    if retry is not body:  # another outcome: send it at once
                        body = retry
                        continue
                time.sleep(backoff.delay())
        finally:
            self._forget(job)

    def _after_refusal(self, job: Job, body: JSONObject, status: int, code: Optional[str], message: str) -> Optional[JSONObject]:
        """What to send after an outcome was refused or not answered: the
        same body again, another one, or None when there is nothing more to do."""
        what = f"leasepool worker {self.id}: {job.key} attempt {job.attempt}: {body['outcome']}"
        if code == "not_registered":
            self._reregister()
        elif status in (403, 404, 409):
            log.warning("%s not recorded: %s", what, message)
            return None
        elif status == 400 and body["outcome"] != "failed":
            # An outcome the server refuses (a result too large, a snooze
            # too long): fail the attempt with the reason rather than hold
            # the task until its lease ends.
            return {"key": job.key, "attempt": job.attempt, "outcome": "failed",
                    "error": _cut(f"{body['outcome']}: refused: {message}", MAX_ERROR_BYTES)}
        elif status and status < 500:
            log.error("%s refused: %s", what, message)
            return None
        if time.monotonic() - job._last_ok > job.lease_ms / 1000:
            log.warning("%s: the lease ended before the outcome reached a server: %s", what, message)
            return None
        return body


def _lease_start(doc: Mapping[str, Any], sent: float, received: float, now_wall: float) -> float:
    """When a claimed lease started, in monotonic time: between the claim's
    sending and its answer, which a long poll keeps far apart. The server's
    lease_until read on the local clock places it; a clock that disagrees
    is bounded by that window."""
    lease_until = _epoch(doc.get("lease_until"))
    if lease_until is None:
        return sent
    lease_s = int(doc.get("lease_ms") or 15_000) / 1000
    estimate = received - (lease_s - (lease_until - now_wall))
    return min(max(estimate, sent), received)


def _epoch(s: Any) -> Optional[float]:
    """An RFC 3339 time (nanoseconds allowed) as seconds since the epoch."""
    if not isinstance(s, str) or not s:
        return None
    head, _, rest = s.partition(".")
    frac, zone = rest, ""
    for i, c in enumerate(rest):
        if not c.isdigit():
            frac, zone = rest[:i], rest[i:]
            break
    if not rest:  # no fraction: the zone follows the seconds
        head, zone = s[:19], s[19:]
    zone = "+00:00" if zone in ("Z", "z") else zone
    try:
        t = datetime.fromisoformat(head + zone)
    except ValueError:
        return None
    return t.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _message(e: BaseException) -> str:
    return _cut(str(e) or type(e).__name__, MAX_ERROR_BYTES)


def _cut(s: str, limit: int) -> str:
    """``s`` in at most ``limit`` bytes of UTF-8, ending with "…" when cut."""
    b = s.encode("utf-8", "replace")
    if len(b) <= limit:
        return s
    return b[: limit - 3].decode("utf-8", "ignore") + "\u2026"
