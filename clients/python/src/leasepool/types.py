"""The documents the API answers, as the server spells them.

They are TypedDicts: plain dicts decoded from JSON, typed for a checker.
Times are RFC 3339 strings and durations Go duration strings ("1.5s"),
as stored; a field the server adds later is simply there too.
"""

from __future__ import annotations

from typing import Any, Dict, List, TypedDict


class LogLine(TypedDict, total=False):
    at: str
    msg: str


class Attempt(TypedDict, total=False):
    """One worker's attempt at a task: running in ``workers``, ended in ``history``."""

    worker_id: str
    instance: str
    state: str
    attempt: int
    lease_until: str
    started_at: str
    ended_at: str
    error: str
    result: Any
    log: List[LogLine]


class Task(TypedDict, total=False):
    """The task document (``GET /api/v1/tasks/{key}``)."""

    key: str
    kind: str
    payload: Any
    priority: int
    run_at: str
    seq: int
    specific_worker_ids: List[str]
    concurrent_worker_cnt: int
    success_worker_cnt: int
    max_unexpected_retries: int
    ping_interval: str
    worker_timeout: str
    lock_keys: List[str]
    workers: List[Attempt]
    attempts: int
    history: List[Attempt]
    cancelled: bool
    state: str
    next_claim_at: str
    version: int
    created_at: str
    updated_at: str


class _PublishResult(TypedDict):
    result: str
    task: Task


class PublishResult(_PublishResult, total=False):
    """What a publish did: ``inserted``, ``existing``, ``rerun`` or ``debounced``, and the task as stored.

    ``warnings`` names a kind no live worker runs.
    """

    warnings: List[str]


class BatchItem(TypedDict, total=False):
    """One item's outcome in a batch publish.

    ``result`` is ``inserted``, ``existing``, ``rerun``, ``debounced`` (with ``state``),
    ``refused`` (``error`` names the field as ``tasks[i].field: reason``,
    ``i`` counting from the start of the whole list) or ``failed`` (a store
    error: publish it again, which is idempotent).
    """

    key: str
    result: str
    state: str
    error: str


class BatchResult(TypedDict):
    """Every item's outcome in order, and the counts of each outcome."""

    results: List[BatchItem]
    inserted: int
    existing: int
    rerun: int
    debounced: int
    refused: int
    failed: int
    warnings: List[str]


class _TaskPage(TypedDict):
    tasks: List[Task]


class TaskPage(_TaskPage, total=False):
    """One page of the task list; a cursor is absent when nothing lies that way."""

    next_cursor: str
    prev_cursor: str


class Event(TypedDict, total=False):
    """One lifecycle event of a task (or a rollout); ``token`` resumes right after it."""

    event: str
    key: str
    kind: str
    rollout: str
    wave: int
    seq: int
    attempt: int
    worker: str
    instance: str
    by: str
    error: str
    message: str
    until: str
    state: str
    at: str
    version: int
    token: str


JSONObject = Dict[str, Any]
