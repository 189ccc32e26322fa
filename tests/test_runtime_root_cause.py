"""A rank killed mid-call is named as the failure, not the peer whose collective broke because of it.

When a rank dies, its peers' next communication fails at once and they reply with an error, which can
reach the parent a moment before the dead rank's exit does. The pool gives a rank's error a short
grace (`ROOT_CAUSE_GRACE_S`) for a peer's death to show, and names the dead one. The race is not
reproducible on demand (a peer's broken receive is usually slower than the death), so the choice is
tested on the pool's own method with stand-in processes.
"""
from __future__ import annotations

import signal
from types import SimpleNamespace

from wmdist.runtime import RankFailure
from wmdist.runtime.pool import Pool


class _Proc:
    def __init__(self, exitcode: int | None) -> None:
        self.exitcode, self.sentinel = exitcode, None

    def join(self, timeout: float | None = None) -> None:
        pass


class _Conn:
    def __init__(self, has_reply: bool) -> None:
        self.has_reply = has_reply

    def poll(self) -> bool:
        return self.has_reply


def _pool(exitcodes: dict[int, int | None], replies: set[int] = frozenset()) -> SimpleNamespace:
    procs = {r: _Proc(code) for r, code in exitcodes.items()}
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
