"""The tasks API: publish, read, list, cancel, retry and follow events."""

from __future__ import annotations

import http.client
import json
import random
import re
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Generator, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from ._http import Transport, encode_json
from .errors import LeasepoolError, UnavailableError
from .types import BatchItem, BatchResult, Event, JSONObject, PublishResult, Task, TaskPage

# A duration: seconds (int or float), a timedelta, or a Go duration string ("1.5s").
Duration = Union[int, float, timedelta, str]
# A time: a datetime (naive ones are UTC) or an RFC 3339 string.
Time = Union[datetime, str]

# The batch endpoint's bounds: items per request and bytes of body.
MAX_BATCH_TASKS = 10_000
MAX_BATCH_BYTES = 32 << 20
# Room left in a batch body for the envelope and a margin.
_BATCH_BODY_BUDGET = MAX_BATCH_BYTES - (64 << 10)

_LIST_FILTERS = (
    "state", "kind", "key_prefix", "worker", "text",
    "created_after", "created_before", "updated_after", "updated_before", "order",
)

_TASK_FIELDS = (
    "key", "kind", "payload", "priority", "run_at", "delay", "specific_worker_ids",
    "concurrent_worker_cnt", "success_worker_cnt", "max_unexpected_retries",
    "ping_interval", "worker_timeout", "lock_keys", "rerun", "debounce",
)


def go_duration(d: Duration, field: str = "duration") -> str:
    """``d`` as a Go duration string, exact to the nanosecond."""
    if isinstance(d, str):
        return d
    if isinstance(d, timedelta):
        ns = (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1_000
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        ns = round(d * 1_000_000_000)
    else:
        raise TypeError(f"{field}: {d!r} is not seconds, a timedelta or a duration string")
    if ns % 1_000_000 == 0:
        return f"{ns // 1_000_000}ms"
    return f"{ns}ns"


def rfc3339(t: Time, field: str = "time") -> str:
    """``t`` as RFC 3339; a naive datetime is taken as UTC."""
    if isinstance(t, str):
        return t
    if isinstance(t, datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        return t.isoformat()
    raise TypeError(f"{field}: {t!r} is not a datetime or an RFC 3339 string")


def task_body(
    key: str,
    kind: str,
    payload: Any = None,
    *,
    priority: Optional[int] = None,
    run_at: Optional[Time] = None,
    delay: Optional[Duration] = None,
    specific_worker_ids: Optional[Sequence[str]] = None,
    concurrent_worker_cnt: Optional[int] = None,
    success_worker_cnt: Optional[int] = None,
    max_unexpected_retries: Optional[int] = None,
    ping_interval: Optional[Duration] = None,
    worker_timeout: Optional[Duration] = None,
    lock_keys: Optional[Sequence[str]] = None,
    rerun: bool = False,
    debounce: Optional[Duration] = None,
) -> JSONObject:
    """The JSON body of one publish; options left at None are not sent (the server's defaults)."""
    body: JSONObject = {"key": key, "kind": kind}
    if payload is not None:
        body["payload"] = payload
    if priority is not None:
        body["priority"] = priority
    if run_at is not None:
        body["run_at"] = rfc3339(run_at, "run_at")
    if delay is not None:
        body["delay"] = go_duration(delay, "delay")
    if specific_worker_ids is not None:
        body["specific_worker_ids"] = list(specific_worker_ids)
    if concurrent_worker_cnt is not None:
        body["concurrent_worker_cnt"] = concurrent_worker_cnt
    if success_worker_cnt is not None:
        body["success_worker_cnt"] = success_worker_cnt
    if max_unexpected_retries is not None:
        body["max_unexpected_retries"] = max_unexpected_retries
    if ping_interval is not None:
        body["ping_interval"] = go_duration(ping_interval, "ping_interval")
    if worker_timeout is not None:
        body["worker_timeout"] = go_duration(worker_timeout, "worker_timeout")
    if lock_keys is not None:
        body["lock_keys"] = list(lock_keys)
    if rerun:
        body["rerun"] = True
    if debounce is not None:
        body["debounce"] = go_duration(debounce, "debounce")
    return body


def _item_body(i: int, item: Mapping[str, Any]) -> JSONObject:
    unknown = [k for k in item if k not in _TASK_FIELDS]
    if unknown:
        raise ValueError(f"tasks[{i}].{unknown[0]}: unknown field (known: {', '.join(_TASK_FIELDS)})")
    for field in ("key", "kind"):
        if field not in item:
            raise ValueError(f"tasks[{i}].{field}: missing")
    return task_body(**item)


_ITEM_INDEX = re.compile(r"^tasks\[(\d+)\]")


class Client:
    """A client of ``leasepool serve``'s API.

    ``url`` is the server's base URL (``http://127.0.0.1:8080``), or several
    (a list, or comma-separated): a connection error moves on to the next.
    The client may be shared by threads; each keeps its own keep-alive
    connection.
    """

    def __init__(self, url: Union[str, Sequence[str]], token: Optional[str] = None, timeout: float = 30.0) -> None:
        self._http = Transport(url, token, timeout)

    @property
    def url(self) -> str:
        return self._http.url

    def close(self) -> None:
        """Close every connection of the client, and end its event streams.
        A later call opens a new connection."""
        self._http.close_all()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: Any = None, query: Optional[Mapping[str, Any]] = None) -> Any:
        """Call any route of the API (``path`` from ``/api/v1/...``) and answer its JSON."""
        return self._http.request(method, path, body, query)

    # Publishing.

    def publish(
        self,
        key: str,
        kind: str,
        payload: Any = None,
        *,
        priority: Optional[int] = None,
        run_at: Optional[Time] = None,
        delay: Optional[Duration] = None,
        specific_worker_ids: Optional[Sequence[str]] = None,
        concurrent_worker_cnt: Optional[int] = None,
        success_worker_cnt: Optional[int] = None,
        max_unexpected_retries: Optional[int] = None,
        ping_interval: Optional[Duration] = None,
        worker_timeout: Optional[Duration] = None,
        lock_keys: Optional[Sequence[str]] = None,
        rerun: bool = False,
        debounce: Optional[Duration] = None,
        strict: bool = False,
        traceparent: Optional[str] = None,
        tracestate: Optional[str] = None,
    ) -> PublishResult:
        """Publish one task, idempotently by ``key``.

        Answers ``{"result": "inserted"|"existing"|"rerun"|"debounced", "task": {...}}``
        with ``warnings`` when no live worker runs ``kind`` (``strict``
        refuses such a kind instead: LeasepoolError 400 naming ``kind``).
        Durations are seconds, timedeltas or Go strings ("1.5s");
        ``max_unexpected_retries`` None is the server's default (3), 0 none.
        ``debounce`` runs the task that long after the key's latest publish:
        publishing the key again while its task is pending and never claimed
        replaces its payload and moves its run time (``debounced``); a
        claimed task is left alone (``existing``).
        ``traceparent`` (and ``tracestate``), a W3C trace context, is the
        span the task's attempts continue (sent as the headers of that name).
        """
        body = task_body(
            key, kind, payload, priority=priority, run_at=run_at, delay=delay,
            specific_worker_ids=specific_worker_ids, concurrent_worker_cnt=concurrent_worker_cnt,
            success_worker_cnt=success_worker_cnt, max_unexpected_retries=max_unexpected_retries,
            ping_interval=ping_interval, worker_timeout=worker_timeout, lock_keys=lock_keys, rerun=rerun,
            debounce=debounce,
        )
        res: PublishResult = self._http.request("POST", "/api/v1/tasks", body, {"strict": True} if strict else None,
                                                extra_headers=_trace_headers(traceparent, tracestate))
        return res

    def publish_many(
        self, tasks: Iterable[Mapping[str, Any]], *, strict: bool = False,
        traceparent: Optional[str] = None, tracestate: Optional[str] = None,
    ) -> BatchResult:
        """Publish many tasks through the batch endpoint, at most 10,000 per request.

        Each item is a mapping of ``publish``'s arguments (``key``, ``kind``,
        ``payload``, ``delay``, ...). Answers every item's outcome in order
        (``results``; an error's ``tasks[i]`` counts from the start of
        ``tasks``) and the counts of each outcome. A refused item never
        stops the others; on UnavailableError the chunks before were
        written and publishing all again is safe.
        """
        trace = _trace_headers(traceparent, tracestate)
        total: BatchResult = {"results": [], "inserted": 0, "existing": 0, "rerun": 0, "debounced": 0, "refused": 0,
                              "failed": 0, "warnings": []}
        chunk: List[bytes] = []
        size = 0
        offset = 0
        for i, item in enumerate(tasks):
            enc = encode_json(_item_body(i, item))
            if chunk and (len(chunk) >= MAX_BATCH_TASKS or size + len(enc) + 1 > _BATCH_BODY_BUDGET):
                self._send_batch(chunk, offset, strict, total, trace)
                offset += len(chunk)
                chunk, size = [], 0
            chunk.append(enc)
            size += len(enc) + 1
        if chunk:
            self._send_batch(chunk, offset, strict, total, trace)
        return total

    def _send_batch(
        self, items: List[bytes], offset: int, strict: bool, total: BatchResult, trace: Optional[Dict[str, str]],
    ) -> None:
        # The items are encoded already (to measure them): bytes go as they are.
        body = b'{"tasks":[' + b",".join(items) + b"]}"
        res = self._http.request("POST", "/api/v1/tasks/batch", body, {"strict": True} if strict else None,
                                 extra_headers=trace)
        for r in res.get("results", []):
            item: BatchItem = r
            err = item.get("error")
            if err and offset:
                item["error"] = _ITEM_INDEX.sub(lambda m: f"tasks[{int(m.group(1)) + offset}]", err, count=1)
            total["results"].append(item)
        for n in ("inserted", "existing", "rerun", "debounced", "refused", "failed"):
            total[n] += int(res.get(n, 0))
        for w in res.get("warnings") or []:
            if w not in total["warnings"]:
                total["warnings"].append(w)

    # Reading.

    def get(self, key: str) -> Task:
        """The task document of ``key`` (LeasepoolError 404 when there is none)."""
        t: Task = self._http.request("GET", "/api/v1/tasks/" + _seg(key))
        return t

    def list(
        self,
        *,
        state: Optional[str] = None,
        kind: Optional[str] = None,
        key_prefix: Optional[str] = None,
        worker: Optional[str] = None,
        text: Optional[str] = None,
        created_after: Optional[Time] = None,
        created_before: Optional[Time] = None,
        updated_after: Optional[Time] = None,
        updated_before: Optional[Time] = None,
        order: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> TaskPage:
        """One page of tasks (newest first unless ``order="asc"``).

        Pass ``next_cursor`` (or ``prev_cursor``) back as ``cursor`` with the
        same filters to go on; ``iter_tasks`` walks every page.
        """
        q: Dict[str, Any] = {
            "state": state, "kind": kind, "key_prefix": key_prefix, "worker": worker, "text": text,
            "created_after": _opt_time(created_after, "created_after"),
            "created_before": _opt_time(created_before, "created_before"),
            "updated_after": _opt_time(updated_after, "updated_after"),
            "updated_before": _opt_time(updated_before, "updated_before"),
            "order": order, "limit": limit, "cursor": cursor,
        }
        page: TaskPage = self._http.request("GET", "/api/v1/tasks", query=q)
        return page

    def iter_tasks(self, *, page_size: int = 1000, **filters: Any) -> Generator[Task, None, None]:
        """Every task matching ``filters`` (``list``'s), page after page.

        A walk sees every task that existed when it started exactly once,
        whatever is published meanwhile.
        """
        unknown = [k for k in filters if k not in _LIST_FILTERS]
        if unknown:
            raise TypeError(f"{unknown[0]}: not a filter of the task list (known: {', '.join(_LIST_FILTERS)})")
        cursor: Optional[str] = None
        while True:
            page = self.list(limit=page_size, cursor=cursor, **filters)
            yield from page["tasks"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # Changing.

    def cancel(self, key: str) -> Task:
        """Cancel a task; its running handlers are told at their next renew. 409 when finished."""
        t: Task = self._http.request("POST", "/api/v1/tasks/" + _seg(key) + "/cancel")
        return t

    def retry(self, key: str) -> Task:
        """Run a finished task again. 409 when it is not finished."""
        t: Task = self._http.request("POST", "/api/v1/tasks/" + _seg(key) + "/retry")
        return t

    # The rest of the read API.

    def workers(self) -> List[JSONObject]:
        """The worker registry, each with ``live``."""
        res = self._http.request("GET", "/api/v1/workers")
        if isinstance(res, dict):
            return list(res.get("workers", []))
        return list(res)

    def stats(self) -> JSONObject:
        """Tasks per state and kind, and the workers."""
        res: JSONObject = self._http.request("GET", "/api/v1/stats")
        return res

    # Events.

    def events(
        self,
        *,
        since: Optional[str] = None,
        kind: Union[str, Sequence[str], None] = None,
        key: Optional[str] = None,
        type: Union[str, Sequence[str], None] = None,
        rollout: Optional[str] = None,
        reconnect: bool = True,
        read_timeout: float = 45.0,
    ) -> Generator[Event, None, None]:
        """Follow the event stream: each event once, in order, from ``since`` (a token) or from now.

        A dropped connection (or a server gone quiet past ``read_timeout``;
        it sends a heartbeat every 15 s) is opened again from the last id
        seen, so no event is lost or repeated; ``reconnect=False`` raises
        instead. When the store has no history from that id the stream ends
        with LeasepoolError(410, code ``history_lost``): list the tasks again
        and follow from now. Close the generator, or the client, to close
        the connection.
        """
        q: Dict[str, Any] = {"kind": _csv(kind), "key": key, "type": _csv(type), "rollout": rollout}
        last = since
        backoff = _Backoff()
        closings = self._http.closings
        while True:
            conn: Optional[http.client.HTTPConnection] = None
            try:
                try:
                    conn, resp = self._http.open_stream("/api/v1/events", dict(q, since=last), {"Accept": "text/event-stream"}, read_timeout)
                    for field, value in _sse_messages(resp):
                        if field == "id":
                            last = value
                            backoff.reset()
                        elif field == "error":
                            raise _stream_error(value)
                        else:
                            ev: Event = json.loads(value)
                            yield ev
                    raise ConnectionResetError("the server ended the stream")
                except (OSError, http.client.HTTPException, UnavailableError) as e:
                    if self._http.closings != closings:
                        return  # the client was closed
                    if not reconnect:
                        if isinstance(e, UnavailableError):
                            raise
                        raise UnavailableError(f"event stream: {e}") from e
            finally:
                if conn is not None:
                    conn.close()
            backoff.sleep()


def _seg(key: str) -> str:
    return urllib.parse.quote(key, safe="")


def _csv(v: Union[str, Sequence[str], None]) -> Optional[str]:
    if v is None or isinstance(v, str):
        return v
    return ",".join(v)


def _opt_time(t: Optional[Time], field: str) -> Optional[str]:
    return None if t is None else rfc3339(t, field)


def _stream_error(data: str) -> LeasepoolError:
    try:
        obj = json.loads(data)
        code = str(obj.get("error", "stream_error"))
    except (ValueError, AttributeError):
        code = "stream_error"
    if code == "history_lost":
        return LeasepoolError(410, "events: the store no longer has history from this position: list the tasks again and follow from now", code)
    return LeasepoolError(500, f"events: {data}", code)


def _sse_messages(resp: http.client.HTTPResponse) -> Iterator["tuple[str, str]"]:
    """The stream's messages as ("id", token), ("data", json) or ("error", json).

    An ``id:`` alone (the position the stream starts from) is reported too,
    so that a drop before any event resumes from there.
    """
    event = ""
    data: List[str] = []
    ident: Optional[str] = None
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if event == "error":
                yield "error", "\n".join(data)
            elif data:
                yield "data", "\n".join(data)
            if ident is not None:
                yield "id", ident
            event, data, ident = "", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "id":
            ident = value
        elif name == "event":
            event = value


class _Backoff:
    """Growing, jittered waits between reconnects."""

    def __init__(self, first: float = 0.05, most: float = 5.0) -> None:
        self.first, self.most, self.next = first, most, first

    def reset(self) -> None:
        self.next = self.first

    def delay(self) -> float:
        d = self.next * (0.5 + random.random() / 2)
        self.next = min(self.most, self.next * 2)
        return d

    def sleep(self, stop: Optional[threading.Event] = None) -> None:
        d = self.delay()
        if stop is None:
            time.sleep(d)
        else:
            stop.wait(d)


def _trace_headers(traceparent: Optional[str], tracestate: Optional[str]) -> Optional[Dict[str, str]]:
    """The W3C trace context headers of a publish, if any."""
    h: Dict[str, str] = {}
    if traceparent:
        h["traceparent"] = traceparent
    if tracestate:
        h["tracestate"] = tracestate
    return h or None
