"""The errors the client raises."""

from __future__ import annotations

from typing import Optional


class LeasepoolError(Exception):
    """An answer of the server that is not a success, or no answer at all.

    ``status`` is the HTTP status (0 when no server answered), ``message``
    the server's one-line ``error`` and ``code`` its machine-readable
    ``code`` when it gave one (``lease_lost``, ``not_registered``, ...).
    """

    def __init__(self, status: int, message: str, code: Optional[str] = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.code = code


class UnavailableError(LeasepoolError):
    """No server of the list answered: connection refused, reset or timed out.

    Nothing is known of the request's effect; every call of the API is safe
    to repeat (publishes are idempotent by key, a lease is fenced by its
    attempt number).
    """

    def __init__(self, message: str) -> None:
        super().__init__(0, message, "unavailable")
