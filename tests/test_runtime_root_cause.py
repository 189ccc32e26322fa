"""A rank killed mid-call is named as the failure, not the peer whose collective broke because of it.

When a rank dies, its peers' next communication fails at once and they reply with an error, which can
reach the parent before the dead rank's exit status does (it comes through the forkserver). What the
parent sees first of the death is the rank's pipe closing: readable, at end of file. The pool gives a
rank's error a short grace (`ROOT_CAUSE_GRACE_S`) for a peer's death to show, a longer one
(`PEER_LOST_GRACE_S`) when the error is gloo saying a peer went away, and names the dead one.

CI's busy run once named rank 1's broken all_reduce instead of rank 0's SIGKILL: the old check took a
readable pipe for a reply, so a dead rank (whose pipe reads as end of file) was never named. The race
is not reproducible on demand, so the choice is tested on the pool's own method with real pipes and
stand-in processes, and a real zombie for "the kernel saw it end before the forkserver said so".
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import cloudpickle

from wmdist.runtime import RankFailure
from wmdist.runtime.pool import PEER_LOST_GRACE_S, ROOT_CAUSE_GRACE_S, Pool


class _Proc:
    """A rank process as the pool sees it: exit code, pid, a sentinel that becomes ready when it dies."""

    def __init__(self, exitcode: int | None, pid: int | None = None) -> None:
        self.exitcode, self.pid = exitcode, pid if pid is not None else os.getpid()
        self._read, self._write = os.pipe()
        self.sentinel = self._read

    def status_in(self, seconds: float, code: int) -> None:
        """The forkserver passes the exit status on `seconds` from now."""
        def later() -> None:
            time.sleep(seconds)
            self.exitcode = code
            os.write(self._write, b"x")
        threading.Thread(target=later, daemon=True).start()

    def join(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or 0)
        while self.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)


class _Rank:
    """One rank's pipe, the parent's end read by the pool: silent, a reply, or closed (the rank died)."""

    def __init__(self) -> None:
        self.parent, self.child = multiprocessing.Pipe(duplex=True)

    def reply(self, kind: str = "ok") -> None:
        body = ("error", "Traceback: ValueError: its own", "") if kind == "error" else ("ok", [], {}, 42)
        self.child.send_bytes(cloudpickle.dumps(body))

    def die(self) -> None:
        self.child.close()

    def later(self, seconds: float, action) -> None:
        threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True).start()


def _pool(exitcodes: dict[int, int | None], pids: dict[int, int] | None = None) -> tuple[SimpleNamespace, dict]:
    procs = {r: _Proc(code, (pids or {}).get(r)) for r, code in exitcodes.items()}
    ranks = {r: _Rank() for r in exitcodes}
    pool = SimpleNamespace(_procs=procs, _conns={r: k.parent for r, k in ranks.items()}, _server=None,
                           _last_comm=lambda r: f"send to rank {r - 1}")
    pool._receive = lambda r, starting: Pool._receive(pool, r, starting)
    return pool, ranks


PEER_RESET = RankFailure(1, "raised", "raised an exception:\nRuntimeError: [gloo/transport/tcp/pair.cc:537] Read "
                                      "error [127.0.0.1]:52900: Connection reset by peer. GLHF!", "all_reduce")
OWN_ERROR = RankFailure(1, "raised", "raised an exception:\nValueError: bad shape", "all_reduce")


def test_a_dead_peer_whose_pipe_closed_is_named_before_its_exit_status_arrives():
    """The CI case: rank 2's pipe is at end of file, its SIGKILL status arrives 1 s later; 2 is named."""
    pool, ranks = _pool({1: None, 2: None})
    ranks[2].die()
    pool._procs[2].status_in(1.0, -signal.SIGKILL)
    cause = Pool._root_cause(pool, PEER_RESET, {2})
    assert (cause.rank, cause.reason) == (2, "signal") and "SIGKILL" in str(cause)


def test_a_peer_lost_error_waits_longer_for_the_dead_peer_to_show():
    """Rank 2 dies 1.2 s after rank 1's 'connection reset' arrived: 2 is still named."""
    pool, ranks = _pool({1: None, 2: None})
    ranks[2].later(1.2, ranks[2].die)
    pool._procs[2].status_in(1.5, -signal.SIGKILL)          # the pipe closes first, as it does
    start = time.monotonic()
    cause = Pool._root_cause(pool, PEER_RESET, {2})
    assert (cause.rank, cause.reason) == (2, "signal")
    assert 1.1 < time.monotonic() - start < PEER_LOST_GRACE_S   # it waited for the death, not the whole grace


def test_an_own_error_waits_only_the_short_grace():
    pool, ranks = _pool({1: None, 2: None})
    ranks[2].later(1.5, ranks[2].die)
    assert Pool._root_cause(pool, OWN_ERROR, {2}) is OWN_ERROR    # gave up before the death at 1.5 s
    assert ROOT_CAUSE_GRACE_S < 1.5 < PEER_LOST_GRACE_S           # the short grace, not the peer-lost one


def test_the_raising_rank_stays_named_when_the_peer_replied_or_is_alive():
    for kind in ("ok", "error"):                           # a reply, or its own error: alive, not the cause
        pool, ranks = _pool({1: None, 2: None})
        ranks[2].reply(kind)
        start = time.monotonic()
        assert Pool._root_cause(pool, PEER_RESET, {2}, grace=30.0) is PEER_RESET
        assert time.monotonic() - start < 15.0             # heard from: no wait for the (30 s) grace
    pool, _ = _pool({1: None, 2: None})                     # silent and alive: the error stands after the grace
    assert Pool._root_cause(pool, PEER_RESET, {2}, grace=0.2) is PEER_RESET
    timeout = RankFailure(1, "timeout", "did not finish", "")
    pool, ranks = _pool({1: None, 2: -9})
    ranks[2].die()
    assert Pool._root_cause(pool, timeout, {2}) is timeout  # only errors defer


def test_the_wait_ends_when_the_other_rank_replies_instead_of_dying():
    pool, ranks = _pool({1: None, 2: None})
    ranks[2].later(0.5, lambda: ranks[2].reply("error"))
    start = time.monotonic()
    assert Pool._root_cause(pool, PEER_RESET, {2}, grace=30.0) is PEER_RESET
    assert time.monotonic() - start < 15.0                 # ended by the reply at 0.5 s, not the 30 s grace


def test_a_peer_the_kernel_saw_end_is_named_before_its_exit_status_arrives():
    """The forkserver has not passed the status on (exitcode None) and its pipe is open, but it is a zombie."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) \
                is None:
            time.sleep(0.02)                               # ended, not reaped: a zombie
        pool, _ = _pool({1: None, 2: None}, pids={2: child.pid})
        pool._procs[2].join = lambda timeout=None: None    # its status never arrives
        cause = Pool._root_cause(pool, PEER_RESET, {2}, grace=0.0)
        assert (cause.rank, cause.reason) == (2, "exited") and "exit status did not arrive" in str(cause)
    finally:
        child.wait()
