"""Real parts for the tests: `leasepool serve` processes over SQLite on disk,
a TCP proxy that can cut connections, and polling for facts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, List, Optional, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
PYROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PYROOT))
sys.path.insert(0, os.path.join(PYROOT, "src"))

from leasepool import Client, LeasepoolError  # noqa: E402

T = TypeVar("T")

_bin: Optional[str] = None
_bin_lock = threading.Lock()


def leasepool_bin() -> str:
    """The leasepool binary: $LEASEPOOL_BIN, else built once from the repository."""
    global _bin
    with _bin_lock:
        if _bin is None:
            path = os.environ.get("LEASEPOOL_BIN")
            if not path:
                out = tempfile.mkdtemp(prefix="leasepool-bin-")
                path = os.path.join(out, "leasepool")
                subprocess.run(["go", "build", "-o", path, "./cmd/leasepool"], cwd=REPO, check=True)
            _bin = path
        return _bin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(fact: Callable[[], T], what: str, timeout: float = 15.0, every: float = 0.02) -> T:
    """Poll ``fact`` until it answers something true, and answer that."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            v = fact()
            if v:
                return v
        except (LeasepoolError, LookupError, OSError, ValueError) as e:  # a fact not yet readable: poll on
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(every)


class Serve:
    """A `leasepool serve` process on a free loopback port."""

    def __init__(self, db: str, *args: str) -> None:
        self.db = db
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.log_path = db + f".serve-{self.port}.log"

    def start(self) -> "Serve":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [leasepool_bin(), "serve", "--store", "sqlite:" + self.db, "--listen", f"127.0.0.1:{self.port}", *self.args],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        log.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/api/v1/stats", timeout=1) as r:
                    return r.status == 200
            except urllib.error.HTTPError:
                return True  # it answers (401 without the token it wants)
            except OSError:
                return False

        try:
            wait_for(up, f"serve on {self.url}", timeout=20)
        except (RuntimeError, AssertionError) as e:
            self.stop(kill=True)
            raise AssertionError(f"{e}; its log: {self.log_tail()}") from None
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return ""


class TempStore:
    """A temporary directory holding one SQLite store and the logs of its servers."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="leasepool-py-")
        self.db = os.path.join(self.dir, "store.db")
        self.servers: List[Serve] = []

    def serve(self, *args: str) -> Serve:
        s = Serve(self.db, *args)
        self.servers.append(s)
        return s.start()

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        if os.environ.get("LEASEPOOL_KEEP_TMP"):
            print(f"kept {self.dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class Proxy:
    """A TCP proxy to a server that can drop its connections and refuse new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._listener: Optional[socket.socket] = None
        self.accepted = 0
        self.frozen = False
        self.open()

    def open(self) -> None:
        """Accept connections (again)."""
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                c.close()
                continue
            with self._lock:
                self.accepted += 1
                self._conns += [c, u]
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()

    def freeze(self, frozen: bool = True) -> None:
        """Swallow all traffic, as a server that is stopped (SIGSTOP) would:
        connections open, requests get no answer."""
        self.frozen = frozen

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.frozen:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every open connection."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        """Refuse new connections and drop the open ones."""
        if self._listener is not None:
            try:  # wakes the thread blocked in accept, which holds the port
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        self.cut()


def unique(prefix: str) -> str:
    """A name no other test uses."""
    unique.n += 1  # type: ignore[attr-defined]
    return f"{prefix}-{os.getpid()}-{unique.n}"  # type: ignore[attr-defined]


unique.n = 0  # type: ignore[attr-defined]


def attempt_of(task: Any, worker_id: str) -> Optional[dict]:
    """The last attempt of ``worker_id`` in a task document (running or ended)."""
    found = None
    for a in list(task.get("history") or []) + list(task.get("workers") or []):
        if a.get("worker_id") == worker_id:
            found = a
    return found


def closing(test: Any, client: Client) -> Client:
    """``client``, closed when ``test`` ends."""
    test.addCleanup(client.close)
    return client
