"""Warm pools are one machine's budget: a process starting ranks asks the others to close their idle ones.

A learner who opens chapter after chapter has one Jupyter kernel per chapter,
each with its own warm pools and forkserver (hundreds of MB), though only the
notebook in use runs anything. So every process that keeps warm pools listens
on a Unix socket in a per-user directory, and a process about to start a pool
first asks every other listener to close the pools it is not using right now.
The asked process closes them itself (its own `WarmPools.close_idle`, which
never touches a pool in the middle of a call) and answers how many ranks it
closed; when it next needs them, it starts them again and says why.

The same listening thread closes this process's pools once they have been idle
for `idle_seconds` (`WMDIST_POOL_IDLE_S`, default 600), so a kernel left open
overnight gives its ranks back too.

Who are neighbours: the processes that carry the same `WMDIST_NEIGHBOURHOOD`.
The course's kernels get it from their zygote (the Jupyter server's pid, so all
kernels of one server, and the commands a cell starts), and a test or script
can set it. A process without it (a plain script, a test run) keeps its pools
as before: nobody closes them from outside, and nothing listens.
"""
from __future__ import annotations

import contextlib
import glob
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Callable

IDLE_VARIABLE = "WMDIST_POOL_IDLE_S"
DEFAULT_IDLE_S = 600.0
ASK_TIMEOUT_S = 10.0          # closing a pool waits for its ranks to exit: well under a second each, more under load


def idle_seconds_from_env() -> float:
    """`WMDIST_POOL_IDLE_S` as a positive number of seconds (default 600); a bad value is refused by name."""
    raw = os.environ.get(IDLE_VARIABLE, "")
    if not raw:
        return DEFAULT_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{IDLE_VARIABLE} must be a positive, finite number of seconds, got {raw!r}")
    return value


NEIGHBOURHOOD_VARIABLE = "WMDIST_NEIGHBOURHOOD"


def neighbourhood() -> str | None:
    """This process's neighbourhood (`WMDIST_NEIGHBOURHOOD`), or None: then it neither listens nor asks."""
    name = os.environ.get(NEIGHBOURHOOD_VARIABLE, "")
    return name if name and name.replace("-", "").replace("_", "").isalnum() else None


def directory(name: str) -> str:
    """The directory of the neighbourhood's listening sockets, one per process with warm pools (mode 0700)."""
    path = os.path.join(tempfile.gettempdir(), f"wmdist-pools-{os.getuid()}", name)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Neighbours:
    """This process's listener, and the asking of the others.

    `close_idle(older_than=...)` is called with None when another process asks
    (close everything not in use) or with `idle_seconds()` by the idle timer;
    it returns the number of ranks it closed.
    """

    def __init__(self, close_idle: Callable[..., int], *, idle_seconds: float | None = None):
        self._close_idle = close_idle
        self._idle_seconds = idle_seconds     # None: `WMDIST_POOL_IDLE_S`, read by the first call, not at import
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._pid = -1
        self.path = ""

    def idle_seconds(self) -> float:
        """How long a pool may stay idle; a bad `WMDIST_POOL_IDLE_S` is refused here (by the first `wmdist.run`),
        so that it fails that call by name and leaves `import wmdist.runtime` (and a kernel's preloading) working."""
        if self._idle_seconds is None:
            self._idle_seconds = idle_seconds_from_env()
        return self._idle_seconds

    @staticmethod
    def _path(name: str) -> str:
        return os.path.join(directory(name), f"{os.getpid()}.sock")

    def listen(self) -> None:
        """Start listening, in a neighbourhood only (once per process; again after a fork, which keeps no threads)."""
        name = neighbourhood()
        if name is None:
            return
        with self._lock:
            if self._listener is not None and self._pid == os.getpid():
                return
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.path = self._path(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            try:
                listener.bind(self.path)          # a path too long for a Unix socket (a deep TMPDIR, a long name):
            except OSError as exc:                # this process then keeps its pools as if it had no neighbours
                listener.close()
                print(f"wmdist: not sharing warm ranks with the neighbourhood {name!r}: cannot listen at "
                      f"{self.path} ({exc})", file=sys.stderr)
                return
            listener.listen(8)
            listener.settimeout(min(30.0, self.idle_seconds() / 4))
            self._listener, self._pid = listener, os.getpid()
        threading.Thread(target=self._serve, args=(listener,), name="wmdist-neighbours", daemon=True).start()

    def close(self) -> None:
        """Stop listening and remove this process's socket."""
        with self._lock:
            listener, self._listener = self._listener, None
            if listener is not None and self._pid == os.getpid():
                listener.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)

    def _serve(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                with contextlib.suppress(Exception):
                    self._close_idle(older_than=self.idle_seconds())
                continue
            except OSError:
                return                                   # closed
            with conn, contextlib.suppress(Exception):
                conn.settimeout(ASK_TIMEOUT_S)
                if conn.recv(64).startswith(b"close-idle"):
                    conn.sendall(f"{self._close_idle(older_than=None)}\n".encode())

    def ask_others(self, *, within: float = ASK_TIMEOUT_S) -> int:
        """Ask every other listening neighbour to close its idle pools, for at most `within` seconds in all (the
        asking call's timeout); return the ranks they closed."""
        deadline = time.monotonic() + within
        name = neighbourhood()
        if name is None:
            return 0
        closed = 0
        for path in glob.glob(os.path.join(directory(name), "*.sock")):
            try:
                pid = int(os.path.basename(path).split(".")[0])
            except ValueError:
                continue
            if pid == os.getpid():
                continue
            if not _alive(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)                      # its owner was killed before it could remove it
                continue
            left = min(deadline - time.monotonic(), ASK_TIMEOUT_S)
            if left <= 0:
                break                                    # out of the call's time: start without their memory
            closed += _ask(path, within=left)
        return closed


def _ask(path: str, *, within: float) -> int:
    deadline = time.monotonic() + within
    with contextlib.suppress(OSError, ValueError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(within)
        sock.connect(path)
        sock.sendall(b"close-idle\n")
        answer = b""
        while not answer.endswith(b"\n") and time.monotonic() < deadline:
            chunk = sock.recv(64)
            if not chunk:
                break
            answer += chunk
        return int(answer.strip() or 0)
    return 0
