"""Keep-alive JSON over HTTP to one server of a list.

Each thread keeps its own ``http.client`` connection per server, so a
worker's claim loop, renewer and handler threads never wait on each
other's sockets and a connection is reused for thousands of calls. A
connection error moves every thread to the next server of the list: any
``serve`` over the store answers any call.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import LeasepoolError, UnavailableError

USER_AGENT = "leasepool-python/0.1"

# Errors that a reused keep-alive connection gives when the server closed it
# while it was idle: the request never reached the server, so it is sent
# again once on a fresh connection before the server counts as unreachable.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

Query = Mapping[str, Union[str, int, float, bool, None]]


@dataclass(frozen=True)
class Base:
    """One server: where to connect and the path prefix of its API."""

    url: str
    https: bool
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "Base":
        u = urllib.parse.urlsplit(url.strip())
        if u.scheme not in ("http", "https"):
            raise ValueError(f"url: {url!r} is not an http:// or https:// URL")
        if not u.hostname:
            raise ValueError(f"url: {url!r} names no host")
        https = u.scheme == "https"
        port = u.port or (443 if https else 80)
        return cls(url=url.strip(), https=https, host=u.hostname, port=port, prefix=u.path.rstrip("/"))


def split_urls(url: Union[str, Sequence[str]]) -> List[str]:
    """The servers named by ``url``: a list, or one string of comma-separated URLs."""
    items = [url] if isinstance(url, str) else list(url)
    urls = [u.strip() for item in items for u in item.split(",") if u.strip()]
    if not urls:
        raise ValueError("url: no server URL given")
    return urls


class Transport:
    """Sends JSON requests to the first server of ``urls`` that answers."""

    def __init__(self, url: Union[str, Sequence[str]], token: Optional[str] = None, timeout: float = 30.0) -> None:
        self.bases = [Base.parse(u) for u in split_urls(url)]
        self.token = token
        self.timeout = timeout
        self._index = 0
        self._index_lock = threading.Lock()
        self._local = threading.local()
        # Every connection of every thread, for close_all; and how many
        # times they were all closed, for streams to see they should end.
        self._all: "weakref.WeakSet[http.client.HTTPConnection]" = weakref.WeakSet()
        self.closings = 0

    @property
    def url(self) -> str:
        """The server the next request goes to."""
        return self.bases[self._index].url

    def _rotate(self, failed: int) -> None:
        # Only the first thread to see a server fail moves everyone on; the
        # others then find the new index already set.
        with self._index_lock:
            if self._index == failed:
                self._index = (failed + 1) % len(self.bases)

    def _conns(self) -> Dict[Base, http.client.HTTPConnection]:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = {}
            self._local.conns = conns
        return conns

    def _new_conn(self, base: Base, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if base.https:
            conn = http.client.HTTPSConnection(base.host, base.port, timeout=timeout)
        else:
            conn = http.client.HTTPConnection(base.host, base.port, timeout=timeout)
        with self._index_lock:
            self._all.add(conn)
        return conn

    def headers(self, body: bool) -> Dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body:
            h["Content-Type"] = "application/json"
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    @staticmethod
    def target(base: Base, path: str, query: Optional[Query]) -> str:
        target = base.prefix + path
        if query:
            items = [(k, _query_value(v)) for k, v in query.items() if v is not None]
            if items:
                target += "?" + urllib.parse.urlencode(items)
        return target

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Query] = None,
        timeout: Optional[float] = None,
        on_connection: Optional[Callable[[http.client.HTTPConnection], None]] = None,
        abort: Optional[threading.Event] = None,
        extra_headers: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """Send one request and answer its decoded JSON body.

        ``body`` is encoded as JSON, unless it is bytes (JSON already).

        Raises LeasepoolError for an answer of status 400 or more, and
        UnavailableError when no server of the list answered.
        ``on_connection`` receives the connection before the request is
        sent, so that another thread may close it to end a long poll; it
        sets ``abort`` first, so that the closed connection is not taken
        for a failed server.
        """
        headers = self.headers(body is not None)
        if extra_headers:
            headers.update(extra_headers)
        if body is None or isinstance(body, bytes):
            payload = body
        else:
            payload = encode_json(body)
        t = self.timeout if timeout is None else timeout
        errors: List[str] = []
        start = self._index
        for n in range(len(self.bases)):
            i = (start + n) % len(self.bases)
            base = self.bases[i]
            for fresh_try in (False, True):
                if abort is not None and abort.is_set():
                    raise UnavailableError("interrupted")
                conns = self._conns()
                conn = conns.get(base)
                reused = conn is not None and conn.sock is not None
                if conn is None:
                    conn = self._new_conn(base, t)
                    conns[base] = conn
                conn.timeout = t
                if conn.sock is not None:
                    conn.sock.settimeout(t)
                if on_connection is not None:
                    on_connection(conn)
                try:
                    conn.request(method, self.target(base, path, query), body=payload, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    if abort is not None and abort.is_set():
                        conn.close()
                        conns.pop(base, None)
                        raise UnavailableError("interrupted") from e
                    if not isinstance(e, _STALE):
                        conn.close()
                        conns.pop(base, None)
                        errors.append(f"{base.url}: {_describe(e)}")
                        break
                    conn.close()
                    conns.pop(base, None)
                    if reused and not fresh_try:
                        continue
                    errors.append(f"{base.url}: {_describe(e)}")
                    break
                return _decode(resp.status, resp.reason, data)
            self._rotate(i)
        raise UnavailableError("no server answered: " + "; ".join(errors))

    def open_stream(
        self, path: str, query: Optional[Query], headers: Mapping[str, str], timeout: float
    ) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Open a long-lived response (an event stream) on a connection of its own."""
        errors: List[str] = []
        start = self._index
        for n in range(len(self.bases)):
            i = (start + n) % len(self.bases)
            base = self.bases[i]
            conn = self._new_conn(base, timeout)
            try:
                h = self.headers(False)
                h.update(headers)
                conn.request("GET", self.target(base, path, query), headers=h)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                errors.append(f"{base.url}: {_describe(e)}")
                self._rotate(i)
                continue
            if resp.status >= 400:
                data = resp.read()
                conn.close()
                _decode(resp.status, resp.reason, data)  # raises
            return conn, resp
        raise UnavailableError("no server answered: " + "; ".join(errors))

    def close(self) -> None:
        """Close this thread's connections."""
        for conn in self._conns().values():
            conn.close()
        self._conns().clear()

    def close_all(self) -> None:
        """End the connections of every thread, streams' too; a later
        request opens a new one. Another thread's connection is shut, not
        closed under it: that thread sees it end and closes it."""
        with self._index_lock:
            conns = list(self._all)
            self.closings += 1
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:  # wakes a thread blocked reading it
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.close()


def encode_json(v: Any) -> bytes:
    """``v`` as compact JSON in UTF-8 rather than \\u escapes, since the
    server bounds sizes in bytes; escaped after all if it holds a lone
    surrogate, which UTF-8 cannot carry."""
    try:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(v, separators=(",", ":")).encode()


def _query_value(v: Union[str, int, float, bool]) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _describe(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    return str(e) or type(e).__name__


def _decode(status: int, reason: str, data: bytes) -> Any:
    obj: Any = None
    if data:
        try:
            obj = json.loads(data)
        except ValueError:
            obj = None
    if status >= 400:
        message = reason or "error"
        code = None
        if isinstance(obj, dict):
            message = str(obj.get("error") or message)
            c = obj.get("code")
            code = str(c) if c is not None else None
        elif data:
            message = data.decode("utf-8", "replace").strip().splitlines()[0][:500]
        raise LeasepoolError(status, message, code)
    if obj is None and data:
        raise LeasepoolError(status, "the server answered something that is not JSON", "bad_response")
    return obj
