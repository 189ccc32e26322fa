"""A rank killed mid-call is named as the failure, not the peer whose collective broke because of it.

When a rank dies, its peers' next communication fails at once and they reply with an error, which can
reach the parent a moment before the dead rank's exit does. The pool gives a rank's error a short
grace (`ROOT_CAUSE_GRACE_S`) for a peer's death to show, and a longer one (`PEER_LOST_GRACE_S`) when
the error is gloo saying a peer went away, and names the dead one. The race is not reproducible on
demand (a peer's broken receive is usually slower than the death; CI's busy run once saw the killed
rank's status arrive later than 0.5 s), so the choice is tested on the pool's own method with
stand-in processes, and a real zombie for "the kernel saw it end before the forkserver said so".
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from wmdist.runtime import RankFailure
from wmdist.runtime.pool import Pool


class _Proc:
    """A rank process as the pool sees it: exit code, pid, and a sentinel that becomes ready when it dies."""

    def __init__(self, exitcode: int | None, pid: int | None = None) -> None:
        self.exitcode, self.pid = exitcode, pid if pid is not None else os.getpid()
        self._read, self._write = os.pipe()
        self.sentinel = self._read

    def die_in(self, seconds: float, code: int) -> None:
        def later() -> None:
            time.sleep(seconds)
            self.exitcode = code
            os.write(self._write, b"x")
        threading.Thread(target=later, daemon=True).start()

    def join(self, timeout: float | None = None) -> None:
        pass


class _Conn:
    """A rank's pipe as the pool sees it: whether a reply is waiting, and a file descriptor to wait on."""

    def __init__(self, has_reply: bool) -> None:
        self.has_reply = has_reply
        self._read, self._write = os.pipe()

    def reply_in(self, seconds: float) -> None:
        def later() -> None:
            time.sleep(seconds)
            self.has_reply = True
            os.write(self._write, b"x")
        threading.Thread(target=later, daemon=True).start()

    def fileno(self) -> int:
        return self._read

    def poll(self) -> bool:
        return self.has_reply


def _pool(exitcodes: dict[int, int | None], replies: set[int] = frozenset(), pids: dict[int, int] = {}) \
        -> SimpleNamespace:
    procs = {r: _Proc(code, pids.get(r)) for r, code in exitcodes.items()}
    conns = {r: _Conn(r in replies) for r in exitcodes}
    return SimpleNamespace(_procs=procs, _conns=conns, _last_comm=lambda r: f"send to rank {r - 1}", _server=None)


RAISED = RankFailure(1, "raised", "raised an exception:\nRuntimeError: Connection closed by peer", "recv from rank 2")


def test_a_peer_that_died_without_replying_is_named_instead_of_the_rank_that_raised():
    cause = Pool._root_cause(_pool({1: None, 2: -signal.SIGKILL}), RAISED, {2}, grace=0.0)
    assert (cause.rank, cause.reason) == (2, "signal") and "SIGKILL" in str(cause)


def test_the_raising_rank_stays_named_when_no_peer_died_or_the_dead_one_replied_first():
    assert Pool._root_cause(_pool({1: None, 2: None}), RAISED, {2}, grace=0.0) is RAISED     # 2 alive: 1's own error
    assert Pool._root_cause(_pool({2: -9}, replies={2}), RAISED, {2}, grace=0.0) is RAISED   # 2's reply is waiting
    timeout = RankFailure(1, "timeout", "did not finish", "")
    assert Pool._root_cause(_pool({2: -9}), timeout, {2}, grace=0.0) is timeout              # only errors defer


PEER_RESET = RankFailure(1, "raised", "raised an exception:\nRuntimeError: [gloo/transport/tcp/pair.cc:537] Read "
                                      "error [127.0.0.1]:52900: Connection reset by peer. GLHF!", "all_reduce")
OWN_ERROR = RankFailure(1, "raised", "raised an exception:\nValueError: bad shape", "all_reduce")


def test_a_peer_lost_error_waits_longer_for_the_dead_peer_to_show():
    """Rank 2's death reaches the parent 1.5 s after rank 1's 'connection reset': 2 is still named."""
    pool = _pool({1: None, 2: None})
    pool._procs[2].die_in(1.5, -signal.SIGKILL)
    start = time.monotonic()
    cause = Pool._root_cause(pool, PEER_RESET, {2})
    assert (cause.rank, cause.reason) == (2, "signal") and "SIGKILL" in str(cause)
    assert 1.4 < time.monotonic() - start < 5.0            # it waited for the death, and no longer


def test_the_wait_ends_when_the_other_rank_replies_instead_of_dying():
    """A peer that is alive and answers (its own error, say) ends the wait: nobody died, the error stands."""
    pool = _pool({1: None, 2: None})
    pool._conns[2].reply_in(0.5)
    start = time.monotonic()
    assert Pool._root_cause(pool, PEER_RESET, {2}) is PEER_RESET
    assert time.monotonic() - start < 5.0                  # not the whole 10 s grace


def test_an_own_error_waits_only_the_short_grace():
    pool = _pool({1: None, 2: None})
    pool._procs[2].die_in(1.5, -signal.SIGKILL)
    start = time.monotonic()
    assert Pool._root_cause(pool, OWN_ERROR, {2}) is OWN_ERROR
    assert time.monotonic() - start < 1.4


def test_a_peer_the_kernel_saw_end_is_named_before_its_exit_status_arrives():
    """The forkserver has not passed the status on (exitcode None), but the process is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) \
                is None:
            time.sleep(0.02)                               # ended, not reaped: a zombie
        pool = _pool({1: None, 2: None}, pids={2: child.pid})
        cause = Pool._root_cause(pool, PEER_RESET, {2}, grace=0.0)
        assert (cause.rank, cause.reason) == (2, "exited") and "exit status did not arrive" in str(cause)
    finally:
        child.wait()
