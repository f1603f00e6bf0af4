"""A Python client of leasepool, the lease-based task queue.

``Client`` publishes tasks and reads them through ``leasepool serve``'s
HTTP API; ``Worker`` runs tasks of its kinds in this process, speaking the
remote worker protocol. Standard library only.
"""

from .client import Client, Duration, Time, go_duration, rfc3339, task_body
from .errors import LeasepoolError, UnavailableError
from .types import Attempt, BatchItem, BatchResult, Event, PublishResult, Task, TaskPage
from .worker import LEASE_EXPIRED, SHUTDOWN, Handler, Job, Retryable, Snooze, Worker

__all__ = [
    "Attempt", "BatchItem", "Handler", "Job", "LEASE_EXPIRED", "Retryable", "SHUTDOWN", "Snooze", "Worker", "BatchResult", "Client", "Duration", "Event", "LeasepoolError",
    "PublishResult", "Task", "TaskPage", "Time", "UnavailableError", "go_duration", "rfc3339", "task_body",
]
__version__ = "0.1.0"
